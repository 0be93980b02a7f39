"""Two models in one real server: ``rmserve serve --model a=DIR --model b=DIR`` (vLLM CPU
build, two engines in one process, a users file), scored by ``rmserve eval --model``.

Independent checks: each model's rewards over HTTP equal an
``AutoModelForSequenceClassification`` forward pass of that model's own folder (the two demo
models have different random weights, so a request routed to the wrong engine cannot pass),
each fingerprint is :func:`rmserve.fingerprint.model_fingerprint` of its folder, and the
figures of ``rmserve eval --model b`` come from b's fingerprint only.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import msgspec
import pytest
from rmserve.pipelines.launch import ServerProcess, free_loopback_port
from testkit.shared_data import shared_data_dir

from rmserve.datasets import load_rmbench
from rmserve.fingerprint import model_fingerprint
from rmserve.schema import ScoreRecord, ScoreResponse

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

RMSERVE = [sys.executable, "-m", "rmserve.cli"]
RMBENCH = shared_data_dir() / "rm-bench"
SERVE_OPTIONS = ["--dtype", "float32", "--max-model-len", "4096", "--block-size", "32", "--enforce-eager",
                 "--kv-cache-memory-bytes", str(1 << 30)]


def _request(url: str, token: str, body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def second_model_dir(tmp_path_factory: pytest.TempPathFactory, rmbench_dir: Path) -> Path:
    from rmserve.demo_model import DemoModelConfig, build_demo_model

    out = tmp_path_factory.mktemp("demo-model-b") / "model"
    build_demo_model(out, rmbench_dir, DemoModelConfig(seed=3, max_len=4096))
    return out


@pytest.fixture(scope="module")
def node(demo_model_dir: Path, second_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("node")
    users = folder / "users.jsonl"
    tokens = {}
    for name in ("alice", "bob"):
        res = subprocess.run([*RMSERVE, "users", "add", name, "--users-file", str(users)],
                             capture_output=True, text=True, check=True)
        tokens[name] = res.stdout.strip().splitlines()[-1].split()[-1]
        (folder / f"{name}.token").write_text(tokens[name] + "\n")
    port = free_loopback_port()
    argv = [*RMSERVE, "serve", "--model", f"a={demo_model_dir}", "--model", f"b={second_model_dir}",
            "--users-file", str(users), "--port", str(port), *SERVE_OPTIONS]
    with ServerProcess(argv, url=f"http://127.0.0.1:{port}", log_path=folder / "server.log",
                       startup_timeout_s=900, stop_grace_s=30) as server:
        server.wait_ready()
        yield server.url, tokens, folder


def _fingerprint(folder: Path) -> str:
    """The fingerprint of ``folder`` scored with its tokenizer's own template in float32."""
    from transformers import AutoTokenizer

    return model_fingerprint(folder, AutoTokenizer.from_pretrained(folder).chat_template, "float32")


def test_models_lists_both_with_their_own_fingerprints(node, demo_model_dir, second_model_dir):
    url, tokens, _ = node
    status, body = _request(f"{url}/v1/models", tokens["bob"])
    assert status == 200, body
    assert [(m["name"], m["fingerprint"]) for m in body["models"]] == [
        ("a", _fingerprint(demo_model_dir)), ("b", _fingerprint(second_model_dir))]
    assert _fingerprint(demo_model_dir) != _fingerprint(second_model_dir)


def test_each_model_scores_as_a_transformers_forward_pass_of_its_folder(node, demo_model_dir, second_model_dir):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    url, tokens, _ = node
    group = next(g for g in load_rmbench(RMBENCH).groups if g.domain == "chat")
    prompt = group.messages[-1].content
    for name, folder in (("a", demo_model_dir), ("b", second_model_dir)):
        body = {"model": name, "groups": [{"id": group.id, "prompt": prompt, "responses": list(group.responses)}]}
        status, reply = _request(f"{url}/v1/score", tokens["alice"], body)
        assert status == 200, reply
        result = msgspec.json.decode(json.dumps(reply), type=ScoreResponse).results[0]
        tok = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForSequenceClassification.from_pretrained(folder, torch_dtype=torch.float32).eval()
        for k, response in enumerate(group.responses):
            ids = tok.apply_chat_template([{"role": "user", "content": prompt}, {"role": "assistant", "content": response}],
                                          tokenize=True)
            ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
            with torch.no_grad():
                expected = model(torch.tensor([ids])).logits[0, 0].item()
            assert abs(result.rewards[k] - expected) < 1e-4, (name, k)


def test_a_request_naming_no_model_is_refused_with_the_served_names(node):
    url, tokens, _ = node
    status, body = _request(f"{url}/v1/score", tokens["alice"], {"groups": [{"id": "g", "prompt": "hi", "responses": ["yo"]}]})
    assert status == 400 and body["error"]["field"] == "model"
    assert "'a', 'b'" in body["error"]["message"]


def test_two_users_evaluate_different_models_of_one_server(node, tmp_path):
    url, tokens, folder = node
    procs = {
        name: subprocess.Popen(
            [*RMSERVE, "eval", "--server", url, "--bench", "rm-bench", "--data", str(RMBENCH), "--only", "chat",
             "--model", model, "--token-file", str(folder / f"{name}.token"), "--out", str(tmp_path / name), "--quiet"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name, model in (("alice", "a"), ("bob", "b"))
    }
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=1500)
        assert proc.returncode == 0, err[-3000:]
    fingerprints = {}
    for name in procs:
        records = [msgspec.json.decode(line, type=ScoreRecord)
                   for line in (tmp_path / name / "scores.jsonl").read_bytes().splitlines() if line.strip()]
        assert len(records) == 129  # every chat group of the release
        fingerprints[name] = {r.fingerprint for r in records}
    _, listing = _request(f"{url}/v1/models", tokens["alice"])
    by_name = {m["name"]: m["fingerprint"] for m in listing["models"]}
    assert fingerprints == {"alice": {by_name["a"]}, "bob": {by_name["b"]}}
