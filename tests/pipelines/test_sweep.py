"""``rmserve sweep`` over real server apps with reloadable fake engines (no model, no torch).

Each fake checkpoint carries a reward offset in its ``config.json``; after a load every
reward is ``fake_reward(ids) + offset`` with ids from the fake chat template (``fakes.py``),
so every stored reward and every figure can be worked out without the server.
"""

from __future__ import annotations

import asyncio
import csv
import json
import logging
import math
import re
import socket
import time
from pathlib import Path

import msgspec
import pytest
from rmserve.client.score_store import ScoreStore
from rmserve.server.engines.protocol import SequenceScore
from rmserve.pipelines.sweep import SweepConfig, SweepTally, checkpoint_step, order_checkpoints, sweep_async
from testkit import fakes
from testkit.servers import ThreadedServer, write_rmbench_data
from typer.testing import CliRunner

from rmserve import errors
from rmserve.cli import app as cli_app
from rmserve.schema import GroupKey, ModelInfo


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
        info = (await super().reload_weights(path)).info
        if self.skew_fingerprint:
            self.model = ModelInfo(name=info.name, max_model_len=info.max_model_len, dtype=info.dtype,
                                   fingerprint="skewed-" + info.fingerprint, engine=info.engine)
        return self.loaded()

    async def score_group(self, token_ids, request_id, *, answer_starts=None, priority=0):
        self.n_score_calls += 1
        if self.n_score_calls - 1 in self.fail_calls:
            raise errors.EngineNotReady("the engine is restarting (test)")
        return await super().score_group(token_ids, request_id)


def start_server(root, engine):
    from rmserve.server.http.app import ServerConfig, create_app

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
        first, again = SweepTally(), SweepTally()
        result = await sweep_async(config([one.url, two.url], folders, tmp_path, data, max_in_flight=4), tally=first)
        assert first.groups_kept == 3 * 20  # every group this sweep stored
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

        rerun = await sweep_async(config([one.url, two.url], folders, tmp_path, data), tally=again)
        assert again.groups_kept == 3 * 20  # found stored
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


class TemplateOverrideEngine(CountingEngine):
    """What a server started with ``--chat-template TEMPLATE`` reports: the template's digest in
    its info (``chat_template_override``) and, after each load, the folder's fingerprint over
    that template instead of its own."""

    TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}"

    def __init__(self, *args, **kwargs):
        from rmserve.fingerprint import chat_template_digest

        super().__init__(*args, **kwargs)
        self.model = msgspec.structs.replace(self.model, chat_template_override=chat_template_digest(self.TEMPLATE))

    async def reload_weights(self, path):
        from rmserve.fingerprint import model_fingerprint

        await super().reload_weights(path)
        self.model = msgspec.structs.replace(self.model, fingerprint=model_fingerprint(path, self.TEMPLATE))
        return self.loaded()


async def test_a_sweep_under_another_chat_template_is_not_answered_with_the_other_s_scores(checkpoints, tmp_path):
    """The store's checkpoint memos are keyed by the template the servers were started with:
    the same folders swept on servers with --chat-template are loaded and scored under their
    own fingerprints (not answered with the plain servers' stored scores), and the other way
    round; each sweep run again finds its own."""
    root, start, folders = checkpoints
    data = write_rmbench_data(tmp_path / "rmb.jsonl", n_chat=4, n_code=2)

    async def sweep_on(engine):
        with start_server(root, engine) as server:
            result = await sweep_async(config([server.url], folders, tmp_path, data))
        return [(r.loaded, r.n_scored, r.n_stored) for r in result.runs], [r.fingerprint for r in result.runs]

    plain_runs, plain_fps = await sweep_on(engine_on(start))
    assert plain_runs == [(True, 6, 0)] * 3
    override = TemplateOverrideEngine(model=engine_on(start).model, checkpoint_dir=str(start))
    override_runs, override_fps = await sweep_on(override)
    assert override_runs == [(True, 6, 0)] * 3 and len(override.reloads) == 3
    assert override_fps == [fakes_fingerprint(f, TemplateOverrideEngine.TEMPLATE) for f in sorted_folders(folders)]
    assert set(override_fps).isdisjoint(plain_fps)
    again = TemplateOverrideEngine(model=engine_on(start).model, checkpoint_dir=str(start))
    assert await sweep_on(again) == ([(False, 0, 6)] * 3, override_fps) and again.reloads == []
    plain_again = engine_on(start)
    assert await sweep_on(plain_again) == ([(False, 0, 6)] * 3, plain_fps) and plain_again.reloads == []


def fakes_fingerprint(folder, template):
    from rmserve.fingerprint import model_fingerprint

    return model_fingerprint(folder, template)


def sorted_folders(folders):
    return [c.path for c in order_checkpoints(folders)]


async def test_server_with_another_fingerprint_is_refused(checkpoints, tmp_path, capsys, caplog):
    root, start, folders = checkpoints
    data = write_rmbench_data(tmp_path / "rmb.jsonl", n_chat=4, n_code=2)
    good, skewed = engine_on(start), engine_on(start, skew_fingerprint=True)
    with caplog.at_level(logging.ERROR, logger="rmserve.sweep"):
        with start_server(root, good) as one, start_server(root, skewed) as two:
            result = await sweep_async(config([one.url, two.url], folders[:1], tmp_path, data))
    assert len(result.refused) == 1
    message = result.refused[0]
    assert two.url in message and "skewed-" in message and "not accepted" in message
    assert skewed.n_score_calls == 0 and good.n_score_calls == 6
    # The refusal is logged once; the library prints nothing (the CLI prints result.refused).
    assert [r.getMessage() for r in caplog.records if r.name == "rmserve.sweep"] == [f"refused: {message}"]
    assert "refused" not in capsys.readouterr().err
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


def test_cli_sweep_prints_a_refused_server_on_stderr(checkpoints, tmp_path):
    root, start, _ = checkpoints
    data = write_rmbench_data(tmp_path / "rmb.jsonl", n_chat=2, n_code=1)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    good, skewed = engine_on(start), engine_on(start, skew_fingerprint=True)
    with start_server(root, good) as one, start_server(root, skewed) as two:
        result = CliRunner().invoke(cli_app, [
            "sweep", "--server", one.url, "--server", two.url, "--checkpoints", str(root / "step-3"),
            "--bench", "rm-bench", "--data", str(data), "--out", str(tmp_path / "out"),
            "--store", str(tmp_path / "s.sqlite"), "--admin-token-file", str(token_file), "--resamples", "20",
            "--quiet",
        ])
    assert result.exit_code == 0, result.output
    refused = [line for line in result.stderr.splitlines() if line.startswith("refused: ")]
    assert len(refused) == 1, result.stderr
    assert f"server {two.url} reports fingerprint skewed-" in refused[0] and "not accepted" in refused[0]
    assert "## Refused servers" in result.stdout  # the summary lists it too
    assert not any(line.startswith("refused: ") for line in result.stdout.splitlines())
    assert skewed.n_score_calls == 0 and good.n_score_calls == 3


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


# --- the order in which one wait's tasks are handled ------------------------------------------
#
# A recovery task and a failed scoring request can finish in the same wait, and asyncio.wait
# returns them as a set, in no defined order. The tests below drive the sweep's scheduler with
# scripted servers (no HTTP, no timing) and a wait that returns both together in a chosen order;
# the outcome must not depend on it.

FP = "fp-step-3"
REWARDS = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0)


class ScriptedServer:
    """Stands in for the RewardClient of one server.

    ``script`` says what each scoring request does, in the order they arrive (the last entry
    repeats): ``"ok"`` answers with ``REWARDS`` under ``FP``; ``"fail"`` raises a retryable 503
    at once; ``"invalid"`` raises a 400 (not retryable) at once; ``"fail-after-poll"`` raises it once a recovery has polled this server, so that the
    failure and that recovery finish in the same wait. ``comes_back``: whether a poll succeeds.
    """

    def __init__(self, script: list[str], *, comes_back: bool = True):
        self.script = script
        self.comes_back = comes_back
        self.polled = asyncio.Event()
        self.polls = 0
        self.loads: list[str] = []
        self.requests: list[str] = []
        self.cache_groups = 0  # RewardClient's counts of replies from the server's result cache
        self.cache_tokens = 0

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info):
        return None

    async def wait_until_ready(self, timeout_s, poll_interval_s=1.0, wait_for_server=False):
        self.polls += 1
        self.polled.set()
        if not self.comes_back:
            raise errors.ConnectionFailed("not ready (scripted)")

    async def load_checkpoint(self, name, path, *, admin_token, timeout_s):
        self.loads.append(name)
        return ModelInfo(name=name, max_model_len=BIG, dtype="float32", fingerprint=FP, engine="scripted")

    async def score(self, groups, *, truncation=None, fingerprint=None):
        from rmserve.schema import GroupResult, ScoreResponse

        (group,) = groups
        assert fingerprint == FP  # every request is pinned to the checkpoint just loaded
        step = self.script[min(len(self.requests), len(self.script) - 1)]
        self.requests.append(group.id)
        if step == "invalid":
            raise errors.InvalidRequest("refused (scripted)", field="messages")
        if step == "fail-after-poll":
            await self.polled.wait()
        if step != "ok":
            raise errors.EngineNotReady("the engine is restarting (scripted)")
        result = GroupResult(id=group.id, rewards=REWARDS, num_tokens=(7,) * 6, num_cached_tokens=(0,) * 6)
        return ScoreResponse(model="step-3", fingerprint=FP, results=(result,))


def ordered_wait(state, recovery_first: bool, handed: list[list[str]], *, always: bool = False):
    """A wait for the sweep's scheduler: while a recovery is among the waiters (or ``always``)
    it waits for all of them and returns them in one batch, recovery last or first, failed
    requests before scored ones; each such batch is written to ``handed`` ("failed", "scored",
    "recovery")."""
    async def wait(waiters):
        recovering = {s.recovery for s in state.servers if s.recovery is not None}
        if not always and not recovering & set(waiters):
            done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            return done
        await asyncio.wait(waiters)  # all of them; every scripted step finishes without a timer
        requests = sorted((t for t in waiters if t not in recovering), key=lambda t: t.exception() is None)
        recoveries = [t for t in waiters if t in recovering]
        batch = recoveries + requests if recovery_first else requests + recoveries
        handed.append(["recovery" if t in recovering else "failed" if t.exception() else "scored" for t in batch])
        return batch

    return wait


async def run_scripted(tmp_path, monkeypatch, clients, *, recovery_first, n_chat, always=False, raises=None):
    """Score ``n_chat`` RM-Bench groups of checkpoint step-3 over ``clients`` (all serving FP)
    with :func:`ordered_wait`; ``raises``: the error the scoring must end with."""
    from rmserve.datasets import load_benchmark
    from rmserve.pipelines import sweep as sweep_module

    data = write_rmbench_data(tmp_path / "rmb.jsonl", n_chat=n_chat, n_code=0)
    dataset = load_benchmark("rm-bench", str(data))
    urls = [f"http://127.0.0.1:{9 + i}" for i in range(len(clients))]
    folder = tmp_path / "step-3"
    cfg = config(urls, [folder], tmp_path, data, max_in_flight=2)
    handed: list[list[str]] = []
    with ScoreStore(tmp_path / "store.sqlite") as db:
        state = sweep_module._Sweep(cfg, db, {"rm-bench": dataset})
        for server, client in zip(state.servers, clients, strict=True):
            server.client = client
            server.serving = FP
        monkeypatch.setattr(sweep_module, "_wait_first", ordered_wait(state, recovery_first, handed, always=always))
        async with state:
            score = state._score(sweep_module.Checkpoint(3, folder), FP, list(dataset.groups))
            if raises is None:
                per_server = (await score).per_server
            else:
                with pytest.raises(raises):
                    await score
                per_server = None
            leftover = [s.recovery for s in state.servers]
        stored = {r.key: r.rewards for r in db.records(FP, benchmark="rm-bench")}
    return state, per_server, leftover, handed, stored, {g.key for g in dataset.groups}


@pytest.mark.parametrize("recovery_first", [False, True], ids=["failure-handled-first", "recovery-handled-first"])
async def test_recovery_and_failure_in_one_wait_any_order(tmp_path, monkeypatch, recovery_first):
    # Group 0's request fails at once (recovery 1 starts); group 1's request fails only once
    # recovery 1 has polled the server, so both finish in the same wait. That late failure
    # means the server failed again: a second recovery loads the checkpoint again, whichever
    # of the two is handled first, and then both groups are scored.
    server = ScriptedServer(["fail", "fail-after-poll", "ok"])
    state, per_server, leftover, handed, stored, keys = await run_scripted(
        tmp_path, monkeypatch, [server], recovery_first=recovery_first, n_chat=2)
    assert handed[0] == (["recovery", "failed"] if recovery_first else ["failed", "recovery"])
    assert server.loads == ["step-3", "step-3"]
    assert server.polls == 2
    assert sorted(server.requests) == ["0", "0", "1", "1"]
    assert per_server == {"http://127.0.0.1:9": 2}
    assert leftover == [None] and state.refused == []
    assert set(stored) == keys and all(rewards == REWARDS for rewards in stored.values())


@pytest.mark.parametrize("recovery_first", [False, True], ids=["failure-handled-first", "recovery-handled-first"])
async def test_server_that_never_comes_back_is_refused_once_in_any_order(tmp_path, monkeypatch, recovery_first):
    # Two servers, two groups each. Server A's first request fails at once (recovery 1 starts and
    # finds A down); its second fails in the same wait. A is refused, never polled again and
    # never loaded; B scores all four groups.
    down = ScriptedServer(["fail", "fail-after-poll", "fail"], comes_back=False)
    up = ScriptedServer(["ok"])
    state, per_server, leftover, handed, stored, keys = await run_scripted(
        tmp_path, monkeypatch, [down, up], recovery_first=recovery_first, n_chat=4)
    assert handed[0][0 if recovery_first else -1] == "recovery" and "failed" in handed[0]
    assert down.polls == 1 and down.loads == [] and len(down.requests) == 2
    assert per_server == {"http://127.0.0.1:9": 0, "http://127.0.0.1:10": 4}
    assert len(state.refused) == 1 and state.refused[0].startswith("http://127.0.0.1:9 did not come back within 30 s")
    assert leftover == [None, None]
    assert set(stored) == keys and all(rewards == REWARDS for rewards in stored.values())


async def test_a_fatal_error_is_raised_after_the_records_of_the_same_wait_are_stored(tmp_path, monkeypatch):
    # Group 0's request is refused (400, ends the sweep) and group 1's is answered; both finish
    # in one wait and the refusal is handled first. Group 1's record is stored all the same, as
    # it is when the answer is handled first.
    server = ScriptedServer(["invalid", "ok"])
    state, _, leftover, handed, stored, keys = await run_scripted(
        tmp_path, monkeypatch, [server], recovery_first=False, n_chat=2, always=True, raises=errors.InvalidRequest)
    assert handed == [["failed", "scored"]]
    assert server.requests == ["0", "1"]
    assert [str(k) for k in stored] == ["rm-bench/chat/1"]
    assert list(stored.values()) == [REWARDS]
    assert leftover == [None] and state.refused == []


def unscored_note(tmp_path, checkpoint: str, reasons: str) -> str:
    """The sweep's note for 1 of 3 RM-Bench groups of ``checkpoint`` not scored for ``reasons``."""
    export = tmp_path / "out" / "checkpoints" / checkpoint / "rm-bench.scores.jsonl"
    return (f"{checkpoint} rm-bench: 1 of 3 groups not scored ({reasons}): counted as losses, as the official code "
            f"counts them; see {export}")


class NaNOnStep20(CountingEngine):
    """Gives NaN for every sequence of chat group 1 (its prompt is "chat 1") once step-20 is loaded."""

    async def score_group(self, token_ids, request_id, *, answer_starts=None, priority=0):
        scores = await super().score_group(token_ids, request_id)
        prompt_ids = [ord(c) for c in "chat 1"]
        step20 = str(self.checkpoint_dir).endswith("step-20")
        return [
            SequenceScore(math.nan, s.num_cached_tokens)
            if step20 and any(ids[i:i + 6] == prompt_ids for i in range(len(ids))) else s
            for ids, s in zip(token_ids, scores, strict=True)
        ]


async def test_groups_that_cannot_be_scored_are_stored_named_and_counted(checkpoints, tmp_path):
    root, start, folders = checkpoints
    data = write_rmbench_data(tmp_path / "rmb.jsonl", n_chat=3, n_code=0)
    with start_server(root, NaNOnStep20(model=engine_on(start).model, checkpoint_dir=str(start))) as one:
        result = await sweep_async(config([one.url], folders, tmp_path, data))
    assert [(r.checkpoint.step, r.n_unscored) for r in result.runs] == [(3, 0), (20, 1), (100, 0)]
    assert unscored_note(tmp_path, "step-20", "1 non-finite reward") in result.notes
    with ScoreStore(tmp_path / "store.sqlite") as db:
        (record,) = db.records(result.runs[1].fingerprint, keys=[GroupKey("rm-bench", "chat", "1")])
    assert record.rewards == (None,) * 6 and {e.type for e in record.errors} == {"non_finite_reward"}
    # The figures count the NaN group as lost (every comparison with NaN is false): the chat
    # score of step-20 is the official mean over the nine style pairs of the three groups.
    from rmserve.datasets import load_benchmark

    groups = load_benchmark("rm-bench", str(data)).groups
    wins = 0
    for g in groups:
        r = [math.nan] * 6 if g.id == "1" else [expected_reward(g, k, OFFSETS[20]) for k in range(6)]
        wins += sum(r[i] > r[3 + j] for i in range(3) for j in range(3))
    rows = list(csv.DictReader((tmp_path / "out" / "sweep.csv").read_text().splitlines()))
    assert float(rows[1]["rm-bench:chat.score"]) == pytest.approx(wins / (9 * len(groups)))


@pytest.fixture
def budget_users(tmp_path):
    """A users file whose admin ``root`` may send 150 prompt tokens a minute; returns (path, token)."""
    from rmserve.server.sharing.auth import add_user

    path = tmp_path / "users.jsonl"
    token, _ = add_user(path, "root", role="admin", tokens_per_minute=150)
    return path, token


def test_a_group_alone_over_the_users_token_budget_is_stored_unscored_and_the_sweep_goes_on(
    checkpoints, tmp_path, budget_users
):
    from testkit.servers import OVER_BUDGET_ROWS, write_jsonl

    from rmserve.server.http.app import ServerConfig, create_app

    root, start, folders = checkpoints
    users, token = budget_users
    data = write_jsonl(tmp_path / "rmb.jsonl", OVER_BUDGET_ROWS)  # groups of 60, 363 and 60 tokens
    server_config = ServerConfig(port=0, users_file=str(users), checkpoint_roots=(str(root),), retry_after_s=1)
    engine = engine_on(start)

    def make_app():
        return create_app(server_config, engine, fakes.FakeRenderer(max_model_len=BIG))

    step3 = next(f for f in folders if f.name == "step-3")
    with ThreadedServer(make_app) as server:
        sweep_config = SweepConfig(servers=(server.url,), checkpoints=(step3,), data=(("rm-bench", str(data)),),
                                   out_dir=tmp_path / "out", store=tmp_path / "store.sqlite", admin_token=token,
                                   token=token, resamples=50, quiet=True)
        result = asyncio.run(sweep_async(sweep_config))
    (run,) = result.runs
    assert (run.n_scored, run.n_unscored) == (3, 1)
    assert engine.n_score_calls == 2  # the group over the budget never reached the engine
    assert unscored_note(tmp_path, "step-3", "1 over the user's token budget") in result.notes
    with ScoreStore(tmp_path / "store.sqlite") as db:
        (record,) = db.records(run.fingerprint, keys=[GroupKey("rm-bench", "chat", "1")])
    assert record.rewards == (None,) * 6 and record.model == "step-3"
    assert {e.message for e in record.errors} == {
        "the request holds 363 prompt tokens, more than user 'root''s whole budget of 150 tokens per minute "
        "(tokens_per_minute of the users file), so it can never be admitted; send fewer groups per request (a "
        "group that alone holds more cannot be scored under this budget), or ask an admin for a larger "
        "tokens_per_minute"
    }


def cli_sweep_on_a_server(root, start, data, tmp_path, checkpoints: str, out: str, *more: str):
    """``rmserve sweep`` (quiet, store ``tmp_path/s.sqlite``, 20 resamples) of ``root/checkpoints``
    on one fake server started on ``start``; the CliRunner result."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    with start_server(root, engine_on(start)) as one:
        return CliRunner().invoke(cli_app, [
            "sweep", "--server", one.url, "--checkpoints", str(root / checkpoints), "--bench", "rm-bench",
            "--data", str(data), "--out", str(tmp_path / out), "--store", str(tmp_path / "s.sqlite"),
            "--admin-token-file", str(token_file), "--resamples", "20", "--quiet", *more,
        ])


def test_cli_sweep_only_names_the_other_domains_as_excluded(checkpoints, tmp_path):
    root, start, _ = checkpoints
    data = write_rmbench_data(tmp_path / "rmb.jsonl", n_chat=3, n_code=2)
    result = cli_sweep_on_a_server(root, start, data, tmp_path, "step-3", "out", "--only", "CHAT")
    assert result.exit_code == 0, result.output
    assert (
        "**Partial**: code, math, safety-refuse, safety-response excluded by --only; the overall figures average "
        "the domains/subsets present."
    ) in result.stdout
    assert "not in the data" not in result.output


def test_cli_sweep_with_nothing_listening_fails_in_seconds_and_keeps_nothing(checkpoints, tmp_path):
    root, _, _ = checkpoints
    data = write_rmbench_data(tmp_path / "rmb.jsonl", n_chat=2, n_code=0)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = tmp_path / "s.sqlite"
    started = time.monotonic()
    result = CliRunner().invoke(cli_app, [
        "sweep", "--server", f"http://127.0.0.1:{port}", "--checkpoints", str(root / "step-*"), "--bench", "rm-bench",
        "--data", str(data), "--out", str(tmp_path / "out"), "--store", str(store), "--wait-ready-s", "1",
    ])
    elapsed_s = time.monotonic() - started
    assert result.exit_code == 1
    assert elapsed_s < 10, f"took {elapsed_s:.1f} s"
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith(f"waiting for http://127.0.0.1:{port}/health: connection refused, retrying for ")
    assert lines[-1].startswith(f"error: connection_failed: nothing answers at http://127.0.0.1:{port}/health: connection refused")
    assert "resume" not in result.stderr  # nothing was scored: no resume hint
    assert not store.exists() and not (tmp_path / "out").exists()



def test_a_checkpoint_s_line_and_the_summary_count_rates_over_the_engine_s_groups_only():
    from rmserve.pipelines.sweep import Checkpoint, CheckpointRun, summary_line

    scored = CheckpointRun(Checkpoint(20, Path("/r/step-20")), "fp-20", "step-20", 60, 60, 0, loaded=True,
                           per_server={"http://a": 40, "http://b": 20}, n_from_cache=20, scoring_s=12.0)
    stored = CheckpointRun(Checkpoint(3, Path("/r/step-3")), "fp-3", "step-3", 60, 0, 60, loaded=False)
    assert scored.line() == (  # 40 engine groups in 12 s; the 20 cached ones are named, not counted
        "step-20 (step 20, fingerprint fp-20): 60 scored (http://a 40, http://b 20), 0 from the store; 40 by the "
        "engine in 12 s (3.3 groups/s), 20 from the servers' result cache"
    )
    assert stored.line() == "step-3 (step 3, fingerprint fp-3): 0 scored, 60 from the store"
    assert summary_line([stored, scored]) == (
        "sweep: 60 groups scored over 2 checkpoints, 60 from the store; 40 by the engine in 12 s (3.3 groups/s), "
        "20 from the servers' result cache"
    )
    assert summary_line([stored]) == "sweep: 0 groups scored over 1 checkpoint, 60 from the store"


async def test_a_sweep_answered_from_the_servers_result_cache_says_so_and_leaves_it_out_of_its_rates(
    checkpoints, tmp_path, capsys
):
    from rmserve.pipelines.sweep import summary_line

    root, start, folders = checkpoints
    step3 = [f for f in folders if f.name == "step-3"]
    data = write_rmbench_data(tmp_path / "rmb.jsonl", n_chat=3, n_code=2)
    engine = engine_on(start)
    with start_server(root, engine) as one:
        first = await sweep_async(config([one.url], step3, tmp_path, data))
        calls = engine.n_score_calls
        capsys.readouterr()
        # Another store: the checkpoint is loaded and its 5 groups sent again; the server's result
        # cache (same fingerprint, same tokens) answers them without engine work.
        (tmp_path / "again").mkdir()
        again = await sweep_async(config([one.url], step3, tmp_path / "again", data, quiet=False))
    (run,) = again.runs
    assert engine.n_score_calls == calls
    assert (first.runs[0].n_from_cache, first.runs[0].n_engine) == (0, 5)
    assert (run.n_scored, run.n_from_cache, run.n_engine, run.fingerprint) == (5, 5, 0, first.runs[0].fingerprint)
    assert run.line() == (
        f"step-3 (step 3, fingerprint {run.fingerprint}): 5 scored ({one.url} 5), 0 from the store; none by the "
        "engine, 5 from the servers' result cache"
    )
    assert summary_line(again.runs) == (
        "sweep: 5 groups scored over 1 checkpoint, 0 from the store; none by the engine, "
        "5 from the servers' result cache"
    )
    progress = [line for line in capsys.readouterr().err.splitlines() if line.startswith("step-3: ")]
    assert progress and all(re.fullmatch(
        r"step-3: 5/5 groups, none by the engine, done in \d+ s, 5 from the result cache, 0 tok/s "
        r"\(engine work only\)", line) for line in progress[-1:]), progress
    assert again.document["groups_from_result_cache"] == 5 and first.document["groups_from_result_cache"] == 0


async def test_spread_by_checkpoints_loads_each_checkpoint_on_one_server(checkpoints, tmp_path):
    root, start, folders = checkpoints
    data = write_rmbench_data(tmp_path / "rmb.jsonl", n_chat=12, n_code=8)
    engines = [engine_on(start), engine_on(start)]
    with start_server(root, engines[0]) as one, start_server(root, engines[1]) as two:
        result = await sweep_async(config([one.url, two.url], folders, tmp_path, data, max_in_flight=4,
                                          spread="checkpoints"))
        assert [r.checkpoint.step for r in result.runs] == [3, 20, 100]
        # One load per checkpoint over both servers (three swaps, not six), each run on one server.
        assert sum(len(e.reloads) for e in engines) == 3 and all(e.reloads for e in engines)
        assert all(len([n for n in r.per_server.values() if n]) == 1 and r.n_scored == 20 for r in result.runs)
        assert sum(e.n_score_calls for e in engines) == 60
        check_store(tmp_path, data, result.runs)
        document = json.loads((tmp_path / "out" / "sweep.json").read_text())
        assert document["spread"] == "checkpoints" and document["servers_lost"] == []
        assert sum(document["groups_scored_per_server"].values()) == 60


async def test_spread_a_lost_server_s_checkpoint_moves_and_nothing_is_scored_twice(checkpoints, tmp_path):
    """Server two is stopped once its engine has scored 5 groups of the checkpoint it holds; the
    watch reports it lost (no restart). Its checkpoint is finished by server one, which scores only
    the groups not stored: the per-server counts add up to the groups, once each."""
    root, start, folders = checkpoints
    data = write_rmbench_data(tmp_path / "rmb.jsonl", n_chat=12, n_code=8)
    engines = [engine_on(start), engine_on(start)]
    one = start_server(root, engines[0]).__enter__()
    two = start_server(root, engines[1]).__enter__()
    slow = engines[1].score_group

    async def slowly(*args, **kwargs):  # server two scores slowly, so it is lost mid-checkpoint
        await asyncio.sleep(0.05)
        return await slow(*args, **kwargs)

    engines[1].score_group = slowly
    lost_url = two.url

    async def watch(url):
        if url != lost_url:
            await asyncio.Event().wait()  # never lost
        while engines[1].n_score_calls < 5:
            await asyncio.sleep(0.01)
        await asyncio.to_thread(two.__exit__, None, None, None)
        return None

    try:
        result = await sweep_async(
            config([one.url, two.url], folders, tmp_path, data, max_in_flight=2, spread="checkpoints"), watch=watch
        )
    finally:
        one.__exit__(None, None, None)
    assert all(r.n_scored == 20 for r in result.runs)
    scored_by_two = sum(r.per_server.get(lost_url, 0) for r in result.runs)
    assert 0 < scored_by_two < 20
    # Server one scored every other group exactly once (its engine's calls are its records).
    assert engines[0].n_score_calls == 60 - scored_by_two
    assert sum(sum(r.per_server.values()) for r in result.runs) == 60
    check_store(tmp_path, data, result.runs)
    document = json.loads((tmp_path / "out" / "sweep.json").read_text())
    (sentence,) = document["servers_lost"]
    assert lost_url in sentence and f"after scoring {scored_by_two} of its groups" in sentence


async def test_restore_models_loads_back_what_each_server_served_before(checkpoints, tmp_path):
    from rmserve.client.client import RewardClient
    from rmserve.pipelines.sweep import restore_models, served_models

    root, start, folders = checkpoints
    data = write_rmbench_data(tmp_path / "rmb.jsonl", n_chat=2, n_code=2)
    engines = [engine_on(start), engine_on(start)]
    with start_server(root, engines[0]) as one, start_server(root, engines[1]) as two:
        for url in (one.url, two.url):  # each serves its start-up folder under a real fingerprint
            async with RewardClient(url) as client:
                await client.load_checkpoint("init", str(start), admin_token=TOKEN)
        cfg = config([one.url, two.url], folders, tmp_path, data, spread="checkpoints")
        before = await served_models(cfg)
        assert {info.name for info in before.values()} == {"init"}
        await sweep_async(cfg)
        after = await served_models(cfg)
        assert {info.name for info in after.values()} != {"init"}  # the sweep left other checkpoints there
        notes = await restore_models(cfg, before, {one.url: str(start)})  # two's folder is not known
        again = await served_models(cfg)
    assert again[one.url].fingerprint == before[one.url].fingerprint
    assert notes[0] == f"{one.url} serves init again (fingerprint {before[one.url].fingerprint}), as before the sweep"
    assert notes[1].startswith(f"{two.url} still serves another checkpoint than before the sweep: loading init back "
                               "failed (its model's folder or the admin token is not known here")


def test_a_fully_stored_sweep_on_ray_starts_no_replica_and_a_partly_stored_one_only_what_it_needs(
    checkpoints, tmp_path, monkeypatch
):
    """``sweep --ray`` (replicas of its own) reads the store before starting any: with every
    checkpoint complete under the key its replicas would file it under (the folder's hash in
    float32, the dtype --serve-args asks for), it starts none and writes the same figures the
    servers' sweep wrote; with one checkpoint more, it starts one replica (not --replicas 4),
    serving that checkpoint first."""
    import rmserve.cli_sweep as cli_sweep
    from rmserve.cluster.ray_cluster import ClusterError

    root, start, folders = checkpoints
    data = write_rmbench_data(tmp_path / "rmb.jsonl", n_chat=4, n_code=2)
    served = cli_sweep_on_a_server(root, start, data, tmp_path, "step-*", "served", "--json")
    assert served.exit_code == 0, served.output
    started = []

    def no_replicas(address, cluster, replicas, spec):
        started.append((replicas, spec.model))
        raise ClusterError("no Ray here (test)")

    monkeypatch.setattr(cli_sweep, "job_replicas", no_replicas)
    ray_args = ["sweep", "--ray", "127.0.0.1:1", "--replicas", "4", "--gpus-per-replica", "0", "--serve-args",
                "--dtype float32 --users-file /nowhere.jsonl", "--bench", "rm-bench", "--data", str(data),
                "--store", str(tmp_path / "s.sqlite"), "--resamples", "20", "--json"]
    stored = CliRunner().invoke(cli_app, [*ray_args, "--checkpoints", str(root / "step-*"), "--out",
                                          str(tmp_path / "stored")])
    assert stored.exit_code == 0, stored.output
    assert started == [] and "no replica started" in stored.stderr
    by_server, by_store = json.loads(served.stdout), json.loads(stored.stdout)
    assert by_store["servers"] == [] and by_store["groups_from_store"] == 18 and by_store["groups_scored"] == 0
    assert [(c["name"], c["fingerprint"]) for c in by_store["checkpoints"]] == [
        (c["name"], c["fingerprint"]) for c in by_server["checkpoints"]]
    assert (tmp_path / "stored" / "sweep.csv").read_text() == (tmp_path / "served" / "sweep.csv").read_text()

    new = fakes.write_fake_checkpoint(root / "step-200", 7.0)
    partly = CliRunner().invoke(cli_app, [*ray_args, "--checkpoints", str(root / "step-*"), "--out",
                                          str(tmp_path / "partly")])
    assert partly.exit_code != 0 and "no Ray here" in partly.stderr
    assert started == [(1, str(new))]
    assert "3 of 4 checkpoints are complete" in partly.stderr and "starting 1 replica, not 4" in partly.stderr

    started.clear()  # other replica options: the store's keys are not theirs, every replica starts
    bf16 = CliRunner().invoke(cli_app, [*ray_args[:8], "--dtype bfloat16", *ray_args[9:], "--checkpoints",
                                        str(root / "step-*"), "--out", str(tmp_path / "bf16")])
    assert bf16.exit_code != 0 and started == [(4, str(folders[0]))]  # step-3, the first checkpoint


def test_missing_groups_counts_a_group_over_a_shorter_limit_than_the_servers_now(tmp_path):
    from rmserve.pipelines.sweep import missing_groups
    from rmserve.schema import Group, Message, ResponseError, ScoreRecord

    def group(i):
        return Group(benchmark="rm-bench", domain="chat", id=str(i), messages=(Message("user", "p"),),
                     responses=("a", "b"), num_chosen=1)

    groups = [group(i) for i in range(3)]
    too_long = ResponseError("sequence_too_long", "307 tokens (chat template included), over max_model_len=200")
    with ScoreStore(tmp_path / "s.sqlite") as db:
        db.put(ScoreRecord(benchmark="rm-bench", domain="chat", id="0", num_chosen=1, rewards=(1.0, 0.5),
                           fingerprint="fp"))
        db.put(ScoreRecord(benchmark="rm-bench", domain="chat", id="1", num_chosen=1, rewards=(None, 0.5),
                           errors=(too_long, None), fingerprint="fp"))
        db.flush()
        keys = lambda found: [g.id for g in found]  # noqa: E731
        assert keys(missing_groups(db, "fp", groups, None)) == ["2"]
        assert keys(missing_groups(db, "fp", groups, None, 200)) == ["2"]  # the same limit: the same answer
        assert keys(missing_groups(db, "fp", groups, None, 400)) == ["1", "2"]
