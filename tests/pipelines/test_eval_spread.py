"""``rmserve eval`` over several servers serving one model (replicas), with fake engines.

Rewards are the fake engine's ``sum(ids) % 1000 / 100`` over the fake chat template's ids
(:mod:`testkit.fakes`), so every record can be checked without a server.
"""

from __future__ import annotations

import asyncio

import pytest
from rmserve.client.score_file import read_scores
from rmserve.pipelines.evaluate import EvalConfig, evaluate_async
from testkit import fakes
from testkit.servers import ThreadedServer, write_rmbench_data

from rmserve.schema import ModelInfo

BIG = 1_000_000


def server(engine):
    from rmserve.server.http.app import ServerConfig, create_app

    return ThreadedServer(lambda: create_app(ServerConfig(port=0, retry_after_s=1), engine,
                                             fakes.FakeRenderer(max_model_len=BIG)))


def model(fingerprint="fp-1"):
    return ModelInfo(name="fake-rm", max_model_len=BIG, dtype="float32", fingerprint=fingerprint, engine="fake")


def expected(data):
    from rmserve.datasets import load_benchmark

    groups = load_benchmark("rm-bench", str(data)).groups
    return {g.key: [fakes.fake_reward(fakes.fake_ids([(m.role, m.content) for m in g.messages], r))
                    for r in g.responses] for g in groups}


def check_records(tmp_path, want):
    records = read_scores(tmp_path / "out" / "scores.jsonl").records
    assert sorted(r.key for r in records) == sorted(want)
    for record in records:
        assert list(record.rewards) == pytest.approx(want[record.key])


async def test_groups_spread_over_two_replicas_once_each(tmp_path):
    data = write_rmbench_data(tmp_path / "rmb.jsonl", n_chat=12, n_code=8)
    engines = [fakes.FakeEngine(model=model()), fakes.FakeEngine(model=model())]
    with server(engines[0]) as one, server(engines[1]) as two:
        config = EvalConfig(bench="rm-bench", data=str(data), out_dir=tmp_path / "out", server_url=one.url,
                            more_servers=(two.url,), max_in_flight=4, quiet=True, resamples=10)
        result = await evaluate_async(config)
    assert result.n_scored == 20
    assert len(engines[0].calls) + len(engines[1].calls) == 20 and min(len(e.calls) for e in engines) >= 4
    assert f"groups scored per server: {one.url} {len(engines[0].calls)}, {two.url} {len(engines[1].calls)}" in \
        result.notes
    want = expected(data)
    check_records(tmp_path, want)


async def test_a_replica_with_another_fingerprint_is_left_out(tmp_path):
    data = write_rmbench_data(tmp_path / "rmb.jsonl", n_chat=4, n_code=2)
    engines = [fakes.FakeEngine(model=model()), fakes.FakeEngine(model=model("fp-2"))]
    with server(engines[0]) as one, server(engines[1]) as two:
        config = EvalConfig(bench="rm-bench", data=str(data), out_dir=tmp_path / "out", server_url=one.url,
                            more_servers=(two.url,), quiet=True, resamples=10)
        result = await evaluate_async(config)
    assert len(engines[0].calls) == 6 and engines[1].calls == []
    assert any(f"{two.url} left out: it serves fingerprint fp-2" in n for n in result.notes)


async def test_a_lost_replica_s_groups_go_to_the_other(tmp_path):
    """Replica two (a window of 4 / 2 servers = 2) is held at its engine's gate, then stopped with 2 groups taken; replica one
    scores every group, and each group is recorded once."""
    data = write_rmbench_data(tmp_path / "rmb.jsonl", n_chat=12, n_code=8)
    gate = asyncio.Event()  # never set: replica two answers nothing
    engines = [fakes.FakeEngine(model=model()), fakes.FakeEngine(model=model(), score_gate=gate)]
    one = server(engines[0]).__enter__()
    two = server(engines[1]).__enter__()

    async def stop_two():
        while len(engines[1].calls) < 2:
            await asyncio.sleep(0.01)
        await asyncio.to_thread(two.__exit__, None, None, None)

    try:
        config = EvalConfig(bench="rm-bench", data=str(data), out_dir=tmp_path / "out", server_url=one.url,
                            more_servers=(two.url,), max_in_flight=4, quiet=True, resamples=10, max_attempts=2,
                            timeout_s=5)
        stopper = asyncio.create_task(stop_two())
        result = await evaluate_async(config)
        await stopper
    finally:
        one.__exit__(None, None, None)
    assert len(engines[0].calls) == 20
    assert any(n.startswith(f"{two.url} was lost") and "its 2 unanswered groups" in n for n in result.notes)
    records = read_scores(tmp_path / "out" / "scores.jsonl").records
    assert len(records) == 20
    check_records(tmp_path, expected(data))


async def test_a_replica_whose_model_changes_stops_the_run_saying_what_is_kept(tmp_path):
    """Both replicas hold their first requests (2 each: a window of 4 over 2 servers); replica two's
    model then changes (its fingerprint, as a swap would), and its next request is refused (409).
    The run stops with the message a one-server run gives: how many groups are kept, and how to
    go on; every kept record is in the score file."""
    import msgspec

    from rmserve import errors
    from rmserve.server.http.app import STATE_KEY

    data = write_rmbench_data(tmp_path / "rmb.jsonl", n_chat=12, n_code=8)
    gates = [asyncio.Event(), asyncio.Event()]
    engines = [fakes.FakeEngine(model=model(), score_gate=gates[0]), fakes.FakeEngine(model=model(), score_gate=gates[1])]
    with server(engines[0]) as one, server(engines[1]) as two:

        async def swap_two():
            while min(len(e.calls) for e in engines) < 2:
                await asyncio.sleep(0.01)
            state = two.app[STATE_KEY]
            state.info = msgspec.structs.replace(state.info, fingerprint="fp-swapped")
            for srv, gate in ((one, gates[0]), (two, gates[1])):
                srv._loop.call_soon_threadsafe(gate.set)

        config = EvalConfig(bench="rm-bench", data=str(data), out_dir=tmp_path / "out", server_url=one.url,
                            more_servers=(two.url,), max_in_flight=4, quiet=True, resamples=10)
        swapper = asyncio.create_task(swap_two())
        with pytest.raises(errors.FingerprintMismatch) as stopped:
            await evaluate_async(config)
        await swapper
    kept = len(read_scores(tmp_path / "out" / "scores.jsonl").records)
    assert 0 < kept < 20
    assert f"This run stopped: {kept} of 20 groups scored with fingerprint fp-1 are kept in" in stopped.value.message
    assert f"to score the other {20 - kept}" in stopped.value.message
