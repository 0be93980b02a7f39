"""benchmarks/fair_share.py runs end to end with its stand-in engine on a small data file and
writes its results (structure only: its figures are timings, recorded under benchmarks/results)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.servers import write_rmbench_data

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "fair_share.py"


def test_fair_share_benchmark_runs_with_the_fake_engine(tmp_path):
    data = write_rmbench_data(tmp_path / "rm.jsonl", n_chat=6, n_code=4)
    out = tmp_path / "out"
    cmd = [sys.executable, str(SCRIPT), "--fake", "--fake-tokens-per-s", "1000000", "--data", str(data),
           "--b-groups", "3", "--a-in-flight", "4", "--b-in-flight", "2", "--idle-repeats", "1",
           "--warmup-groups", "2", "--b-delay-s", "0", "--caps", "fifo,2,2b2,2-rfifo", "--out", str(out), "--tag", "t"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=SCRIPT.parents[1])
    assert done.returncode == 0, done.stdout + done.stderr
    [result_file] = out.glob("*-fair-share-t.json")
    result = json.loads(result_file.read_text())
    assert (result["a_groups"], result["b_groups"]) == (10, 3)
    assert [(r["scenario"], r["engine_concurrency_groups"], r["interactive_boost"], r["render_fair"])
            for r in result["rows"]] == [
        ("no fair share", None, None, False),
        ("fair share, cap 2", 2, 1.0, True),
        ("fair share, cap 2, interactive boost 2", 2, 2.0, True),
        ("fair share, cap 2, render threads in arrival order", 2, 1.0, False),
    ]
    # every group of A and B scored in each scenario: A's 10 groups, B's first 3 chat groups
    a_tokens = {r["a_tokens"] for r in result["rows"]}
    b_tokens = {r["b_tokens"] for r in result["rows"]}
    assert len(a_tokens) == 1 and len(b_tokens) == 1  # the same work in every scenario
    md = result_file.with_suffix(".md").read_text()
    assert "| no fair share |" in md and "| fair share, cap 2, interactive boost 2 |" in md
    assert "| fair share, cap 2, render threads in arrival order |" in md


def test_caps_entries_parse_and_bad_ones_are_named():
    import fair_share  # benchmarks/ is on the tests' path (pyproject)
    assert fair_share.parse_cap("fifo") == (fair_share.FIFO_CAP, 1.0, False)
    assert fair_share.parse_cap(" 64 ") == (64, 1.0, True)
    assert fair_share.parse_cap("16b2") == (16, 2.0, True)
    assert fair_share.parse_cap("64-rfifo") == (64, 1.0, False)
    assert fair_share.parse_cap("8b1.5-rfifo") == (8, 1.5, False)
    for bad in ("64-fifo", "x", "0", "-rfifo"):
        with pytest.raises(ValueError, match=f"'{bad}' is not 'fifo', CAP"):
            fair_share.parse_cap(bad)
