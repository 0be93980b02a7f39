"""The main job end to end on real RM-Bench data: a real `rmserve serve` (vLLM CPU build),
`rmserve eval` / `rmserve run` as a user types them, the prefix cache and the error contract
over HTTP, and a server killed mid-evaluation.

All tests here start real engines (marked slow; they run in CI). One server is shared by the
module; the kill test and the `rmserve run` test start their own, as a user would.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import msgspec
import pytest
from rmserve.pipelines.launch import ServerProcess, free_loopback_port
from testkit.shared_data import shared_data_dir

from rmserve.datasets import load_rmbench
from rmserve.schema import ScoreRecord, ScoreResponse

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

MAX_MODEL_LEN = 4096
BLOCK_SIZE = 32
SERVE_OPTIONS = [
    "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--block-size", str(BLOCK_SIZE),
    "--kv-cache-memory-bytes", str(1 << 30), "--enforce-eager",
]
RMSERVE = [sys.executable, "-m", "rmserve.cli"]


def _serve(model: Path, log: Path, port: int | None = None) -> ServerProcess:
    port = port or free_loopback_port()
    argv = [*RMSERVE, "serve", str(model), "--host", "127.0.0.1", "--port", str(port), *SERVE_OPTIONS]
    return ServerProcess(argv, url=f"http://127.0.0.1:{port}", log_path=log, startup_timeout_s=600, stop_grace_s=30)


def _post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _scored_requests(url: str) -> float:
    """Successful POST /v1/score requests so far, read from the server's /metrics."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("rmserve_requests_total{") and 'endpoint="/v1/score"' in line and 'status="200"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def _records(path: Path) -> list[ScoreRecord]:
    return [msgspec.json.decode(line, type=ScoreRecord) for line in path.read_bytes().splitlines() if line.strip()]


def _eval(url: str, out: Path, *extra: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [*RMSERVE, "eval", "--server", url, "--bench", "rm-bench", "--data", str(RMBENCH), "--out", str(out), "--quiet", *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    if check:
        assert res.returncode == 0, res.stderr[-3000:]
    return res


RMBENCH = shared_data_dir() / "rm-bench"


@pytest.fixture(scope="module")
def live_server(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("live-server") / "server.log"
    with _serve(demo_model_dir, log) as server:
        server.wait_ready()
        yield server.url


@pytest.fixture(scope="module")
def full_eval(live_server: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """One uninterrupted `rmserve eval` of all 798 groups (the reference for other tests)."""
    out = tmp_path_factory.mktemp("full-eval")
    return out, _eval(live_server, out)


def test_eval_scores_all_real_groups_and_marks_math_missing(full_eval):
    out, res = full_eval
    records = _records(out / "scores.jsonl")
    assert len(records) == 798
    assert len({r.key for r in records}) == 798
    per_domain = {d: sum(r.domain == d for r in records) for d in ("chat", "code", "safety-refuse", "safety-response")}
    assert per_domain == {"chat": 129, "code": 228, "safety-refuse": 284, "safety-response": 157}
    assert all(len(r.rewards) == 6 and all(x is not None and math.isfinite(x) for x in r.rewards) for r in records)
    # Table on stdout: leaderboard columns, math shown as missing, the overall marked partial.
    assert "| Chat | Math | Code | Safety | Easy | Normal | Hard | Avg |" in res.stdout
    assert "math" in res.stdout.lower() and "partial" in res.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["partial"] is True and "math" in results["missing"]
    for name in ("results.json", "table.md", "heatmap-chat.png", "heatmap-code.png", "heatmap-safety.png"):
        assert (out / name).stat().st_size > 0


def test_eval_figures_match_an_independent_recount(full_eval):
    """The chat figures in results.json equal a plain-Python recount from the score file."""
    out, _ = full_eval
    chat = [r.rewards for r in _records(out / "scores.jsonl") if r.domain == "chat"]
    wins = [[sum(g[i] > g[3 + j] for g in chat) / len(chat) for j in range(3)] for i in range(3)]
    hard = (wins[0][1] + wins[0][2] + wins[1][2]) / 3
    normal = (wins[0][0] + wins[1][1] + wins[2][2]) / 3
    easy = (wins[1][0] + wins[2][0] + wins[2][1]) / 3
    results = json.loads((out / "results.json").read_text())
    text = json.dumps(results)
    for value in (hard, normal, easy):
        assert any(abs(float(x) - value) < 1e-12 for x in re.findall(r"-?\d+\.\d+(?:e-?\d+)?", text)), value


def test_rerun_with_same_out_sends_no_scoring_request(live_server, full_eval):
    out, _ = full_eval
    before_bytes = (out / "scores.jsonl").read_bytes()
    before = _scored_requests(live_server)
    res = _eval(live_server, out)
    assert _scored_requests(live_server) == before
    assert (out / "scores.jsonl").read_bytes() == before_bytes
    assert "| Chat |" in res.stdout


def test_http_rewards_match_a_transformers_forward_pass(live_server, demo_model_dir):
    """Rewards over HTTP = AutoModelForSequenceClassification on apply_chat_template ids."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(demo_model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(demo_model_dir, torch_dtype=torch.float32).eval()
    groups = [g for g in load_rmbench(RMBENCH).groups if g.domain == "chat"][:3]
    body = {"groups": [{"id": g.id, "prompt": g.messages[-1].content, "responses": list(g.responses)} for g in groups]}
    status, reply = _post(f"{live_server}/v1/score", json.dumps(body).encode())
    assert status == 200, reply
    decoded = msgspec.json.decode(json.dumps(reply), type=ScoreResponse)
    for g, result in zip(groups, decoded.results):
        for k, response in enumerate(g.responses):
            ids = tok.apply_chat_template(
                [{"role": "user", "content": g.messages[-1].content}, {"role": "assistant", "content": response}],
                tokenize=True,
            )
            ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
            assert ids[0] == tok.bos_token_id and ids[1] != tok.bos_token_id  # exactly one BOS
            assert result.num_tokens[k] == len(ids)
            with torch.no_grad():
                expected = model(torch.tensor([ids])).logits[0, 0].item()
            # fp32 on both sides; vLLM's kernels differ from eager PyTorch by ~1e-7 here.
            assert abs(result.rewards[k] - expected) < 1e-4


def test_prefix_cache_through_http(live_server):
    nonce = uuid.uuid4().hex
    prompt = f"[{nonce}] " + " ".join(f"Step {i}: explain the reward of a response in plain words." for i in range(30))
    responses = [f"Answer number {k}: " + "fine " * (5 + k) for k in range(6)]
    status, reply = _post(f"{live_server}/v1/score", json.dumps({"groups": [{"id": "g", "prompt": prompt, "responses": responses}]}).encode())
    assert status == 200, reply
    (result,) = reply["results"]
    assert min(result["num_tokens"]) > 3 * BLOCK_SIZE  # the shared prompt spans more than two blocks
    assert all(c > 0 for c in result["num_cached_tokens"][1:]), result["num_cached_tokens"]
    assert all(c % BLOCK_SIZE == 0 for c in result["num_cached_tokens"])


VALID = json.dumps({"groups": [{"id": "ok", "prompt": "Say hi.", "responses": ["hi", "hello"]}]}).encode()


@pytest.mark.parametrize(
    "body, status, error_type, needle",
    [
        (b'{"groups": [', 400, "invalid_request", "JSON"),
        (json.dumps({"groups": [{"id": "a", "prompt": "p"}]}).encode(), 400, "invalid_request", "responses"),
        (json.dumps({"groups": [{"id": "a", "prompt": "p", "responses": []}]}).encode(), 400, "invalid_request", "responses"),
        (json.dumps({"model": "no-such-model", "groups": [{"id": "a", "prompt": "p", "responses": ["r"]}]}).encode(), 404, "model_not_found", "no-such-model"),
        (b'{"groups": [], "pad": "' + b"x" * (33 << 20) + b'"}', 413, "body_too_large", "bytes"),
    ],
    ids=["malformed-json", "missing-field", "empty-responses", "unknown-model", "oversized-body"],
)
def test_bad_input_gets_documented_error_and_server_keeps_serving(live_server, body, status, error_type, needle):
    got_status, reply = _post(f"{live_server}/v1/score", body)
    assert got_status == status, reply
    assert reply["error"]["type"] == error_type
    assert needle.lower() in reply["error"]["message"].lower()
    ok_status, ok = _post(f"{live_server}/v1/score", VALID)
    assert ok_status == 200 and len(ok["results"][0]["rewards"]) == 2


def test_an_over_length_response_is_answered_per_response_and_its_group_scored(live_server):
    body = json.dumps({"groups": [{"id": "long", "prompt": "p", "responses": ["ok", "word " * 6000]}]}).encode()
    status, reply = _post(f"{live_server}/v1/score", body)
    assert status == 200, reply
    (result,) = reply["results"]
    assert isinstance(result["rewards"][0], float) and result["rewards"][1] is None
    assert result["errors"][0] is None
    n = result["num_tokens"][1]
    assert n > MAX_MODEL_LEN
    assert result["errors"][1] == {
        "type": "sequence_too_long",
        "message": f"{n:,} tokens (chat template included), over max_model_len={MAX_MODEL_LEN:,}",
    }


def test_empty_response_string_is_scored(live_server):
    body = json.dumps({"groups": [{"id": "e", "prompt": "Say something.", "responses": ["", "something"]}]}).encode()
    status, reply = _post(f"{live_server}/v1/score", body)
    assert status == 200, reply
    rewards = reply["results"][0]["rewards"]
    assert len(rewards) == 2 and all(math.isfinite(r) for r in rewards)


def test_server_killed_mid_eval_then_rerun_completes_exactly_once(demo_model_dir, tmp_path, full_eval):
    reference = {r.key: r.rewards for r in _records(full_eval[0] / "scores.jsonl") if r.domain == "chat"}
    out = tmp_path / "killed"
    port = free_loopback_port()
    server = _serve(demo_model_dir, tmp_path / "server-1.log", port)
    with server:
        server.wait_ready()
        cmd = [*RMSERVE, "eval", "--server", server.url, "--bench", "rm-bench", "--data", str(RMBENCH),
               "--out", str(out), "--only", "chat", "--quiet", "--max-inflight-groups", "4"]
        client = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        scores = out / "scores.jsonl"
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if scores.exists() and scores.read_bytes().count(b"\n") >= 20:
                break
            assert client.poll() is None, client.communicate()
            time.sleep(0.2)
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait()
        scored_before_kill = scores.read_bytes().count(b"\n")
        _, stderr = client.communicate(timeout=300)
    assert 20 <= scored_before_kill < 129
    assert client.returncode != 0, "the client cannot finish while the server is dead"
    # Restart the server and run the same eval again: it scores exactly the rest.
    with _serve(demo_model_dir, tmp_path / "server-2.log", port) as restarted:
        restarted.wait_ready()
        _eval(restarted.url, out, "--only", "chat", "--max-inflight-groups", "4")
    records = _records(out / "scores.jsonl")
    assert len(records) == len({r.key for r in records}) == 129
    # Same model, same token ids: the rewards equal the uninterrupted run's.
    for r in records:
        assert r.key in reference
        assert max(abs(a - b) for a, b in zip(r.rewards, reference[r.key])) < 1e-5


def test_run_main_job_starts_server_scores_and_stops(demo_model_dir, tmp_path, full_eval):
    """`rmserve run` as in the README, on all 798 groups; a second run sends nothing."""
    out = tmp_path / "run"
    cmd = [*RMSERVE, "run", str(demo_model_dir), "--bench", "rm-bench", "--data", str(RMBENCH), "--out", str(out),
           "--quiet", *SERVE_OPTIONS]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    first_done = time.time()
    assert first.returncode == 0, first.stderr[-3000:]
    assert "| Chat | Math | Code | Safety |" in first.stdout
    records = _records(out / "scores.jsonl")
    assert len({r.key for r in records}) == len(records) == 798
    reference = {r.key: r.rewards for r in _records(full_eval[0] / "scores.jsonl")}
    assert max(max(abs(a - b) for a, b in zip(r.rewards, reference[r.key])) for r in records) < 1e-5
    before = (out / "scores.jsonl").read_bytes()
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    assert second.returncode == 0, second.stderr[-3000:]
    # A finished run is answered from its score file: no server is started.
    assert "already holds every group for this checkpoint" in second.stderr and "no server started" in second.stderr
    assert not (out / "server.log").exists() or (out / "server.log").stat().st_mtime <= first_done
    assert (out / "scores.jsonl").read_bytes() == before
    assert second.stdout.split("groups from")[1] == first.stdout.split("groups from")[1]
