"""``rmserve eval`` end to end: the server's real app over the fake engine, real RM-Bench data."""

from __future__ import annotations

import json
import socket
import time

import pytest
from rmserve.client.score_file import read_scores
from typer.testing import CliRunner

from rmserve.cli import app

runner = CliRunner()

# Group counts of the RM-Bench release files (the data README), math absent locally.
RMBENCH_COUNTS = {"chat": 129, "code": 228, "safety-refuse": 284, "safety-response": 157}


def _eval(url, data, out, *extra):
    args = ["eval", "--server", url, "--bench", "rm-bench", "--data", str(data), "--out", str(out), "--quiet", *extra]
    return runner.invoke(app, args)


def test_eval_rmbench_end_to_end_then_resume(scoring_server, rmbench_dir, tmp_path):
    url, scored_groups = scoring_server
    out = tmp_path / "run"
    first = _eval(url, rmbench_dir, out, "--max-inflight-groups", "16", "--resamples", "200")
    assert first.exit_code == 0, first.output
    records = read_scores(out / "scores.jsonl").records
    keys = {str(r.key) for r in records}
    assert len(records) == len(keys) == sum(RMBENCH_COUNTS.values()) == 798
    assert {d: sum(r.domain == d for r in records) for d in RMBENCH_COUNTS} == RMBENCH_COUNTS
    assert scored_groups() == 798
    results = json.loads((out / "results.json").read_text())
    assert results["n_groups"] == 798
    assert "math" in results["missing"]
    assert (out / "table.md").is_file()
    assert sorted(p.name for p in out.glob("heatmap-*.png"))  # the metrics stage drew them
    assert "Math" in first.stdout and "math" in first.stdout  # table column + missing note
    assert "not in the data" in first.stderr and "math" in first.stderr

    second = _eval(url, rmbench_dir, out, "--resamples", "200", "--json")
    assert second.exit_code == 0, second.output
    assert scored_groups() == 798  # nothing sent again
    assert json.loads(second.stdout) == results
    assert "resumed: 798 groups" in second.stderr


def test_eval_fingerprint_mismatch_is_one_line_exit_1(scoring_server, small_rmbench, tmp_path):
    url, _ = scoring_server
    out = tmp_path / "run"
    out.mkdir()
    (out / "scores.jsonl").write_text(
        '{"benchmark":"rm-bench","domain":"chat","id":"0","num_chosen":3,"rewards":[1,1,1,0,0,0],'
        '"model":"old-rm","fingerprint":"fp-old"}\n'
    )
    result = _eval(url, small_rmbench, out, "--resamples", "0")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: fingerprint_mismatch:")
    assert "--overwrite" in result.stderr
    again = _eval(url, small_rmbench, out, "--resamples", "0", "--overwrite")
    assert again.exit_code == 0, again.output


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--bench", "mmlu"], "'mmlu' is not one of"),
        (["--max-inflight-groups", "0"], "Invalid value for '--max-inflight-groups': must be an integer in [1, 4096], got 0"),
        (["--server", "localhost:8000"], "Invalid value for '--server': URL must be http(s)://host[:port]"),
        (["--data", "/nonexistent/rm-bench"], "'--data'"),
    ],
)
def test_eval_bad_input_exits_2(small_rmbench, tmp_path, args, words):
    base = {"--server": "http://127.0.0.1:9", "--bench": "rm-bench", "--data": str(small_rmbench), "--out": str(tmp_path / "o")}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    argv = ["eval", *[x for pair in base.items() for x in pair], "--quiet"]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert words in " ".join(result.output.split())


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_eval_refused_connection_fails_within_seconds_naming_the_address(small_rmbench, tmp_path):
    port = _closed_port()
    out = tmp_path / "o"
    args = ["eval", "--server", f"http://127.0.0.1:{port}", "--bench", "rm-bench", "--data", str(small_rmbench),
            "--out", str(out)]  # default --wait-ready-s 600, not quiet
    started = time.monotonic()
    result = runner.invoke(app, args)
    elapsed_s = time.monotonic() - started
    assert result.exit_code == 1
    assert elapsed_s < 10, f"a refused connection took {elapsed_s:.1f} s to fail"
    # The quick retries lasted about CONNECT_GRACE_S (4 s), not the 600 s of --wait-ready-s.
    assert elapsed_s >= 3.5
    lines = result.stderr.strip().splitlines()
    # Not a terminal: the status is a full line when the wait starts (repeated every 15 s, so
    # once in a 4 s wait), then the error line.
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith(f"waiting for http://127.0.0.1:{port}/health: connection refused, retrying for ")
    assert lines[1].startswith(f"error: connection_failed: nothing answers at http://127.0.0.1:{port}/health: connection refused")
    assert "--wait-for-server" in lines[1]
    assert "engine_not_ready" not in result.stderr and "resume" not in result.stderr
    assert not out.exists()  # no output folder, no empty scores.jsonl


def test_eval_wait_for_server_waits_to_the_ready_timeout(small_rmbench, tmp_path):
    port = _closed_port()
    result = _eval(f"http://127.0.0.1:{port}", small_rmbench, tmp_path / "o", "--wait-for-server", "--wait-ready-s", "1")
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: connection_failed: nothing answers at http://127.0.0.1:{port}/health: "
                                    "connection refused (retried for 1.")
    assert "--wait-for-server" not in result.stderr  # already given


def test_run_bad_engine_exits_2(small_rmbench, tmp_path):
    result = runner.invoke(
        app, ["run", "some/rm", "--bench", "rm-bench", "--data", str(small_rmbench), "--out", str(tmp_path), "--engine", "tpu"]
    )
    assert result.exit_code == 2
    assert "'tpu' is not one of 'vllm', 'hf'" in " ".join(result.output.split())
    assert not (tmp_path / "server.log").exists()  # nothing was started
