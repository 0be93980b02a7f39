"""An eval whose server's checkpoint is swapped under it by an admin (forced past its pinned
work): the run stops on the server's 409 with a message naming who swapped, both
fingerprints, what is kept and how to resume; every group answered before the swap stays in
the score file; after the original checkpoint is loaded again the same run resumes and
scores only the rest. A real aiohttp server over the reloadable fake engine.
"""

from __future__ import annotations

import asyncio

import msgspec
import orjson
import pytest
from aiohttp import web
from testkit.fakes import FAKE_MODEL, FakeRenderer, ReloadableFakeEngine, write_fake_checkpoint
from rmserve.client.client import RewardClient
from rmserve.client.score_file import read_scores
from rmserve.pipelines.evaluate import EvalConfig, evaluate_async
from rmserve.server.http.app import STATE_KEY, ServerConfig, create_app
from rmserve.server.sharing.users import USER_KEY, User

from rmserve import errors
from rmserve.fingerprint import model_fingerprint
from rmserve.schema import Group, Message

TOKEN = "s3cret-token"
BIG = 100_000
N_SMALL = 10  # groups in the small_rmbench fixture
ALICE, ROOT = User("alice"), User("root", role="admin")


@web.middleware
async def user_from_test_header(request: web.Request, handler):
    """Test stand-in for the authentication middleware: ``X-Test-User: root`` is the admin,
    any other request is alice's (the eval client sends no such header)."""
    request[USER_KEY] = ROOT if request.headers.get("X-Test-User") == "root" else ALICE
    return await handler(request)


class SwapMidRun(ReloadableFakeEngine):
    """Reloadable fake engine that calls ``on_call(n)`` before its n-th scoring call (1-based)."""

    on_call = None
    hold = None

    async def score_group(self, token_ids, request_id, **kwargs):
        n = len(self.calls) + 1
        if self.on_call is not None:
            self.on_call(n)
        if self.hold is not None:
            await self.hold(n)
        return await super().score_group(token_ids, request_id, **kwargs)


@pytest.fixture
def checkpoints(tmp_path):
    root = tmp_path / "ckpts"
    return root, write_fake_checkpoint(root / "step-0", 0.0), write_fake_checkpoint(root / "step-1", 10.0)


async def _load(client, user: str, path, **extra) -> tuple[int, dict]:
    body = {"name": "step", "path": str(path), **extra}
    async with client.post("/v1/models/load", json=body,
                           headers={"Authorization": f"Bearer {TOKEN}", "X-Test-User": user}) as resp:
        return resp.status, orjson.loads(await resp.read())


async def test_forced_swap_stops_the_eval_with_a_clear_message_and_a_rerun_resumes(
    aiohttp_client, checkpoints, small_rmbench, tmp_path
):
    root, original, second = checkpoints
    model = msgspec.structs.replace(FAKE_MODEL, max_model_len=BIG)
    engine = SwapMidRun(model=model, checkpoint_dir=str(original))
    app = create_app(ServerConfig(port=0, admin_token=TOKEN, checkpoint_roots=(str(root),)), engine,
                     FakeRenderer(max_model_len=BIG))
    app.middlewares.append(user_from_test_header)
    client = await aiohttp_client(app)
    await app[STATE_KEY].settled.wait()
    step0, step1 = model_fingerprint(original, None), model_fingerprint(second, None)
    status, _ = await _load(client, "alice", second)  # alice's run is on step-1
    assert status == 200

    forced: list[asyncio.Task] = []

    def swap_at_fourth_call(n: int) -> None:
        if n == 4 and not forced:
            forced.append(asyncio.get_running_loop().create_task(_load(client, "root", original, force=True)))

    async def hold_until_the_gate_closes(n: int) -> None:
        # Calls after the 4th wait until the forced swap has closed the scoring gate, so the
        # eval cannot finish before the swap whatever the machine's speed. The gate stays closed
        # while these calls are in flight (the swap drains them), so the wait cannot miss it.
        if n > 4 and forced:
            state = app[STATE_KEY]
            for _ in range(20_000):
                if not state.serving.is_set() or forced[0].done():
                    return
                await asyncio.sleep(0.001)

    engine.on_call = swap_at_fourth_call
    engine.hold = hold_until_the_gate_closes
    out = tmp_path / "out"
    config = EvalConfig(bench="rm-bench", data=str(small_rmbench), out_dir=out, server_url=str(client.make_url("")),
                        resamples=0, quiet=True, max_in_flight=2, groups_per_request=1)
    with pytest.raises(errors.FingerprintMismatch) as caught:
        await evaluate_async(config, session=client.session)
    status, body = await forced[0]
    assert status == 200 and body["models"][0]["fingerprint"] == step0

    scores = out / "scores.jsonl"
    kept = read_scores(scores).records
    calls_before = len(engine.calls)
    assert len(kept) == calls_before  # every group the engine scored before the swap is kept
    assert 4 <= len(kept) < N_SMALL
    assert {r.fingerprint for r in kept} == {step1}  # nothing scored by the new checkpoint
    message = caught.value.message
    assert message.startswith(
        "the server refused to score with another model than the expected one: this request is pinned to "
        f"fingerprint {step1} but model 'step' is now served with fingerprint {step0} (root forced the swap at "
    )
    assert message.endswith(
        f"This run stopped: {len(kept)} of {N_SMALL} groups scored with fingerprint {step1} are kept in {scores}; "
        f"run the same command again once the server serves fingerprint {step1} again to score the other "
        f"{N_SMALL - len(kept)} (the kept ones are not scored again), or use another --out for the new model"
    )

    # root's lease blocks alice until it is released; then she loads step-1 again and reruns
    status, body = await _load(client, "alice", second)
    assert status == 409 and "root holds the lease on model 'step'" in body["error"]["message"]
    async with client.post("/v1/models/release", json={"name": "step"},
                           headers={"Authorization": f"Bearer {TOKEN}", "X-Test-User": "root"}) as resp:
        assert resp.status == 200
    status, _ = await _load(client, "alice", second)
    assert status == 200
    result = await evaluate_async(config, session=client.session)
    assert (result.n_resumed, result.n_scored) == (len(kept), N_SMALL - len(kept))
    assert len(engine.calls) == calls_before + N_SMALL - len(kept)  # the kept groups were not scored again
    records = read_scores(scores).records
    assert len(records) == N_SMALL and {r.fingerprint for r in records} == {step1}


async def test_client_sends_its_fingerprint_and_maps_the_409(aiohttp_client):
    from testkit.fakes import FakeEngine

    engine = FakeEngine()
    app = create_app(ServerConfig(port=0), engine, FakeRenderer())
    http = await aiohttp_client(app)
    await app[STATE_KEY].settled.wait()
    group = Group(benchmark="rm-bench", domain="chat", id="1", messages=(Message("user", "hi"),),
                  responses=("yo", "ya"), num_chosen=1)
    async with RewardClient(str(http.make_url("")), session=http.session) as client:
        reply = await client.score([group], fingerprint=FAKE_MODEL.fingerprint)
        assert reply.fingerprint == FAKE_MODEL.fingerprint
        with pytest.raises(errors.FingerprintMismatch) as caught:
            await client.score([group], fingerprint="fp-expected")
        assert client.attempts == 2  # a 409 is not retried
    assert caught.value.field == "fingerprint"
    assert caught.value.message == (
        "the server refused to score with another model than the expected one: this request is pinned to "
        "fingerprint fp-expected but model 'fake-rm' is now served with fingerprint fp-fake-1; nothing was scored "
        "with it. Load the expected checkpoint again (or wait for the lease holder to do so) and resume, or start "
        "a new run for the new model"
    )
    assert len(engine.calls) == 1


async def test_sweep_refused_by_another_users_lease_says_who_and_resumes_after_release(tmp_path):
    import aiohttp
    from testkit.servers import ThreadedServer, write_rmbench_data
    from rmserve.pipelines.sweep import SweepConfig, sweep_async

    root = tmp_path / "run"
    start = write_fake_checkpoint(root / "init", -1.0)
    folders = [write_fake_checkpoint(root / f"step-{s}", off) for s, off in ((3, 0.0), (20, 10.0))]
    bobs = write_fake_checkpoint(root / "bobs", 7.0)
    data = write_rmbench_data(tmp_path / "rmb.jsonl", n_chat=3, n_code=2)
    engine = ReloadableFakeEngine(model=msgspec.structs.replace(FAKE_MODEL, max_model_len=BIG),
                                  checkpoint_dir=str(start))
    users = {"bob": User("bob")}

    @web.middleware
    async def as_user(request: web.Request, handler):  # the sweep sends no header: alice
        request[USER_KEY] = users.get(request.headers.get("X-Test-User", ""), ALICE)
        return await handler(request)

    def make_app():
        app = create_app(ServerConfig(port=0, admin_token=TOKEN, checkpoint_roots=(str(root),)), engine,
                         FakeRenderer(max_model_len=BIG))
        app.middlewares.append(as_user)
        return app

    bob = {"Authorization": f"Bearer {TOKEN}", "X-Test-User": "bob"}
    with ThreadedServer(make_app) as server:
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{server.url}/v1/models/load", json={"name": "bobs", "path": str(bobs)},
                                 headers=bob) as resp:
                assert resp.status == 200
                bobs_fp = (await resp.json())["models"][0]["fingerprint"]
            config = SweepConfig(servers=(server.url,), checkpoints=tuple(folders), data=(("rm-bench", str(data)),),
                                 out_dir=tmp_path / "out", store=tmp_path / "store.sqlite", admin_token=TOKEN,
                                 resamples=20, quiet=True, server_wait_s=30.0)
            with pytest.raises(errors.Conflict) as caught:
                await sweep_async(config)
            message = caught.value.message
            assert message.startswith(
                f"{server.url} refused to load checkpoint step-3: checkpoint swap refused for alice: bob holds the "
                f"lease on model 'bobs' (fingerprint {bobs_fp}) since "
            )
            assert message.endswith(
                "runs pinned to that fingerprint then stop with 409, keep what they scored and resume once it is "
                "served again. Every group scored so far is kept in the score store; "
                "run the same command again to resume without scoring them again"
            )
            assert engine.reloads == [str(bobs)]  # the sweep's load changed nothing

            async with http.post(f"{server.url}/v1/models/release", json={"name": "bobs"}, headers=bob) as resp:
                assert resp.status == 200
            result = await sweep_async(config)
    assert [r.checkpoint.step for r in result.runs] == [3, 20]
    assert all(r.n_scored == 5 for r in result.runs)
