"""``rmserve sweep`` over real server apps with reloadable fake engines (no model, no torch).

Each fake checkpoint carries a reward offset in its ``config.json``; after a load every
reward is ``fake_reward(ids) + offset`` with ids from the fake chat template (``fakes.py``),
so every stored reward and every figure can be worked out without the server.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from rmserve.client.score_store import ScoreStore
from rmserve.pipelines.sweep import SweepConfig, checkpoint_step, order_checkpoints, sweep_async
from testkit import fakes
from testkit.servers import ThreadedServer, write_rmbench_data
from typer.testing import CliRunner

from rmserve import errors
from rmserve.cli import app as cli_app
from rmserve.schema import ModelInfo


TOKEN = "sweep-token"
BIG = 1_000_000
OFFSETS = {3: 0.0, 20: 10.0, 100: 5.0}  # step -> reward offset of that fake checkpoint


class CountingEngine(fakes.ReloadableFakeEngine):
    """Counts loads; optionally reports a skewed fingerprint or fails some scoring calls."""

    def __init__(self, *args, skew_fingerprint: bool = False, fail_calls: range = range(0), **kwargs):
        super().__init__(*args, **kwargs)
        self.skew_fingerprint = skew_fingerprint
        self.fail_calls = fail_calls
        self.n_score_calls = 0

    async def reload_weights(self, path):
        info = await super().reload_weights(path)
        if self.skew_fingerprint:
            self.model = ModelInfo(name=info.name, max_model_len=info.max_model_len, dtype=info.dtype,
                                   fingerprint="skewed-" + info.fingerprint, engine=info.engine)
        return self.model

    async def score_group(self, token_ids, request_id):
        self.n_score_calls += 1
        if self.n_score_calls - 1 in self.fail_calls:
            raise errors.EngineNotReady("the engine is restarting (test)")
        return await super().score_group(token_ids, request_id)


def start_server(root, engine):
    from rmserve.server.app import ServerConfig, create_app

    def make_app():
        config = ServerConfig(port=0, admin_token=TOKEN, checkpoint_roots=(str(root),), retry_after_s=1)
        return create_app(config, engine, fakes.FakeRenderer(max_model_len=BIG))

    return ThreadedServer(make_app)


@pytest.fixture
def checkpoints(tmp_path):
    """A root with a start-up checkpoint and three sweep checkpoints (steps 100, 20, 3)."""
    root = tmp_path / "run"
    start = fakes.write_fake_checkpoint(root / "init", -1.0)
    folders = [fakes.write_fake_checkpoint(root / f"step-{s}", off) for s, off in OFFSETS.items()]
    return root, start, folders


def engine_on(start, **kwargs):
    model = ModelInfo(name="fake-rm", max_model_len=BIG, dtype="float32", fingerprint="fp-init", engine="fake")
    return CountingEngine(model=model, checkpoint_dir=str(start), **kwargs)


def config(servers, folders, tmp_path, data, **kwargs):
    kwargs.setdefault("resamples", 50)
    kwargs.setdefault("quiet", True)
    kwargs.setdefault("server_wait_s", 30.0)
    return SweepConfig(servers=tuple(servers), checkpoints=tuple(folders), data=(("rm-bench", str(data)),),
                       out_dir=tmp_path / "out", store=tmp_path / "store.sqlite", admin_token=TOKEN, **kwargs)


def expected_reward(group, k: int, offset: float) -> float:
    messages = [(m.role, m.content) for m in group.messages]
    return fakes.fake_reward(fakes.fake_ids(messages, group.responses[k])) + offset


def check_store(tmp_path, data, runs):
    """Every stored reward equals fake_reward + the checkpoint's offset."""
    from rmserve.datasets import load_benchmark

    groups = load_benchmark("rm-bench", str(data)).groups
    with ScoreStore(tmp_path / "store.sqlite") as db:
        for run in runs:
            offset = OFFSETS[run.checkpoint.step]
            records = {r.key: r for r in db.records(run.fingerprint, benchmark="rm-bench")}
            assert set(records) == {g.key for g in groups}
            for g in groups:
                assert records[g.key].rewards == pytest.approx([expected_reward(g, k, offset) for k in range(6)])


def test_checkpoint_steps_and_order(tmp_path):
    assert [checkpoint_step(n) for n in ("step-1000", "checkpoint-500", "global_step200", "run3-step-40")] == [
        1000, 500, 200, 40]
    folders = [tmp_path / n for n in ("step-100", "step-20", "step-3")]
    for f in folders:
        f.mkdir()
    assert [c.step for c in order_checkpoints(folders)] == [3, 20, 100]
    (tmp_path / "ckpt-020").mkdir()
    with pytest.raises(ValueError, match="both have step 20"):
        order_checkpoints([*folders, tmp_path / "ckpt-020"])
    (tmp_path / "final").mkdir()
    with pytest.raises(ValueError, match="no number"):
        order_checkpoints([tmp_path / "final"])


async def test_two_servers_share_the_groups_and_rerun_scores_nothing(checkpoints, tmp_path):
    root, start, folders = checkpoints
    data = write_rmbench_data(tmp_path / "rmb.jsonl", n_chat=12, n_code=8)
    engines = [engine_on(start), engine_on(start)]
    with start_server(root, engines[0]) as one, start_server(root, engines[1]) as two:
        result = await sweep_async(config([one.url, two.url], folders, tmp_path, data, max_in_flight=4))
        assert [r.checkpoint.step for r in result.runs] == [3, 20, 100]
        assert all(r.n_scored == 20 and r.loaded for r in result.runs)
        for run in result.runs:
            # Least-outstanding dispatch fills both windows (4 each) before either frees a slot, so
            # each server scores at least 4 of 20 whatever the timing; the 30 % share under equal
            # engines is checked with real servers in tests/test_sweep_end_to_end.py.
            assert min(run.per_server.values()) >= 4, run.per_server
        assert [len(e.reloads) for e in engines] == [3, 3]
        calls = [e.n_score_calls for e in engines]
        assert sum(calls) == 60
        check_store(tmp_path, data, result.runs)

        rerun = await sweep_async(config([one.url, two.url], folders, tmp_path, data))
        assert [e.n_score_calls for e in engines] == calls  # nothing scored twice
        assert [len(e.reloads) for e in engines] == [3, 3]  # stored checkpoints are not loaded again
        assert all(r.n_stored == 20 and not r.loaded for r in rerun.runs)

    out = tmp_path / "out"
    rows = list(csv.DictReader((out / "sweep.csv").read_text().splitlines()))
    assert [r["step"] for r in rows] == ["3", "20", "100"]
    # Chat: chosen longer than rejected by ≥ 88 characters of 'c' (99) vs 'r' (114) … the fake
    # reward is sum(ids) % 1000 / 100, so compute the expected figure from the stored rewards.
    document = json.loads((out / "sweep.json").read_text())
    assert document["groups_scored"] == 0 and document["groups_from_store"] == 60
    assert {c["name"] for c in document["checkpoints"]} == {"step-3", "step-20", "step-100"}
    # An offset added to every reward of a checkpoint changes no comparison: the figures of all
    # three checkpoints are equal, so the best is the earliest step and the margin is exactly 0.
    scores = {float(r["rm-bench:overall.score"]) for r in rows}
    assert len(scores) == 1
    best = document["best"]["rm-bench"]
    assert best["checkpoint"] == "step-3" and best["runner_up"] == "step-20"
    assert best["difference"] == 0.0 and best["interval"] == [0.0, 0.0]
    summary = (out / "summary.md").read_text()
    assert "Best checkpoint: **step-3**" in summary and "not resolved" in summary
    assert (out / "rm-bench_overall-score.png").stat().st_size > 1000
    for name in ("step-3", "step-20", "step-100"):
        assert (out / "checkpoints" / name / "rm-bench.scores.jsonl").read_text().count("\n") == 20


async def test_server_with_another_fingerprint_is_refused(checkpoints, tmp_path, capsys):
    root, start, folders = checkpoints
    data = write_rmbench_data(tmp_path / "rmb.jsonl", n_chat=4, n_code=2)
    good, skewed = engine_on(start), engine_on(start, skew_fingerprint=True)
    with start_server(root, good) as one, start_server(root, skewed) as two:
        result = await sweep_async(config([one.url, two.url], folders[:1], tmp_path, data))
    assert len(result.refused) == 1
    message = result.refused[0]
    assert two.url in message and "skewed-" in message and "not accepted" in message
    assert skewed.n_score_calls == 0 and good.n_score_calls == 6
    assert "refused" in capsys.readouterr().err
    check_store(tmp_path, data, result.runs)


async def test_failing_server_is_taken_out_and_rejoins_after_a_reload(checkpoints, tmp_path):
    root, start, folders = checkpoints
    data = write_rmbench_data(tmp_path / "rmb.jsonl", n_chat=8, n_code=4)
    # Calls 5–9 fail with 503 (more than the client's two attempts per request).
    engine = engine_on(start, fail_calls=range(5, 10))
    with start_server(root, engine) as one:
        result = await sweep_async(config([one.url], folders[:2], tmp_path, data, max_in_flight=2))
    assert [r.n_scored for r in result.runs] == [12, 12]
    # The first checkpoint was loaded again after the failures (once per failure noticed while
    # no recovery was running: how many depends on timing), the second once.
    names = [p.rsplit("/", 1)[-1] for p in engine.reloads]
    assert names[-1] == "step-20" and names.count("step-20") == 1
    assert names.count("step-3") >= 2 and set(names) == {"step-3", "step-20"}
    check_store(tmp_path, data, result.runs)


async def test_load_without_token_fails_clearly_and_keeps_nothing_half_done(checkpoints, tmp_path):
    root, start, folders = checkpoints
    data = write_rmbench_data(tmp_path / "rmb.jsonl", n_chat=2, n_code=0)
    engine = engine_on(start)
    with start_server(root, engine) as one:
        cfg = config([one.url], folders[:1], tmp_path, data)
        cfg = SweepConfig(**{**cfg.__dict__, "admin_token": "wrong"})
        with pytest.raises(errors.Unauthorized):
            await sweep_async(cfg)
    assert engine.n_score_calls == 0 and engine.reloads == []


def test_cli_sweep_expands_globs_and_prints_the_summary(checkpoints, tmp_path):
    root, start, _ = checkpoints
    data = write_rmbench_data(tmp_path / "rmb.jsonl", n_chat=3, n_code=2)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    engine = engine_on(start)
    with start_server(root, engine) as one:
        result = CliRunner().invoke(cli_app, [
            "sweep", "--server", one.url, "--checkpoints", str(root / "step-*"), "--bench", "rm-bench",
            "--data", str(data), "--out", str(tmp_path / "out"), "--store", str(tmp_path / "s.sqlite"),
            "--admin-token-file", str(token_file), "--resamples", "20", "--quiet",
        ])
    assert result.exit_code == 0, result.output
    assert "# Checkpoint sweep" in result.stdout and "Best checkpoint" in result.stdout
    assert len(engine.reloads) == 3


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--bench", "rm-bench,rewardbench2", "--data", "x"], "BENCH=PATH"),
        (["--bench", "rm-bench", "--data", "rewardbench2=x"], "does not ask for"),
        (["--bench", "mmlu", "--data", "x"], "mmlu"),
    ],
)
def test_cli_sweep_bad_options_exit_2(checkpoints, tmp_path, args, words):
    root, _, _ = checkpoints
    result = CliRunner().invoke(cli_app, [
        "sweep", "--server", "http://127.0.0.1:9", "--checkpoints", str(root / "step-*"), "--out",
        str(tmp_path / "o"), "--store", str(tmp_path / "s.sqlite"), *args,
    ])
    assert result.exit_code == 2
    assert words in result.output
