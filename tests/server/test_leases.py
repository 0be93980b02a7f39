"""Pinned fingerprints and checkpoint leases on a real aiohttp server over the fake engines:
409 on a stale fingerprint (classifier and judge paths, before any engine work), a lease
refusal naming the holder and the pinned work in flight, an admin-forced swap, lease expiry
with a fake clock, release, and the lease fields of ``/v1/models``.

Fake checkpoints carry a reward offset (``testkit/fakes.py``): for ``VALID`` (prompt "hi",
answers "yo"/"ya") the rewards are 4.55 and 4.41 plus the offset (worked out in
``test_app.py``). Users come from the ``X-Test-User`` header (the stand-in for the
authentication middleware used in ``test_fair_queue_app.py``).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import msgspec
import orjson
import pytest
from testkit.app_client import wait_until
from testkit.auth_stub import user_header_middleware
from testkit.fakes import FAKE_MODEL, FakeEngine, FakeRenderer, ReloadableFakeEngine, write_fake_checkpoint
from testkit.judge_fakes import FakeJudgeEngine, rb2_group
from rmserve.server.http.app import STATE_KEY, ServerConfig, create_app
import rmserve.server as server_package
from rmserve.errors import Conflict
from rmserve.server.sharing.leases import LEASES_KEY, LeaseBook, swap_refusal
from rmserve.server.sharing.users import User
from rmserve.fingerprint import judge_fingerprint, model_fingerprint

TOKEN = "s3cret-token"
USERS = {"alice": User("alice"), "bob": User("bob"), "root": User("root", role="admin")}
VALID = {"groups": [{"id": "g1", "prompt": "hi", "responses": ["yo", "ya"]}]}
WALL = 1_800_000_000.0  # the fake Unix time of every lease: 2027-01-15 08:00:00 UTC


user_from_test_header = user_header_middleware(USERS)


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def checkpoints(tmp_path):
    root = tmp_path / "ckpts"
    return root, write_fake_checkpoint(root / "step-0", 0.0), write_fake_checkpoint(root / "step-1", 10.0)


@pytest.fixture
def make_server(aiohttp_client, checkpoints):
    root, original, _ = checkpoints

    async def make(**config):
        engine = ReloadableFakeEngine(checkpoint_dir=str(original))
        app = create_app(ServerConfig(port=0, admin_token=TOKEN, checkpoint_roots=(str(root),), **config), engine,
                         FakeRenderer())
        app.middlewares.append(user_from_test_header)
        clock = Clock()
        app[LEASES_KEY].clock = clock
        app[LEASES_KEY].wall = lambda: WALL
        client = await aiohttp_client(app)
        await app[STATE_KEY].settled.wait()
        return client, engine, clock

    return make


def headers(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}", "X-Test-User": user}


async def load(client, user: str, path, name: str = "step", **extra) -> tuple[int, dict]:
    body = {"name": name, "path": str(path), **extra}
    async with client.post("/v1/models/load", json=body, headers=headers(user)) as resp:
        return resp.status, orjson.loads(await resp.read())


async def release(client, user: str, name: str = "step") -> tuple[int, dict]:
    async with client.post("/v1/models/release", json={"name": name}, headers=headers(user)) as resp:
        return resp.status, orjson.loads(await resp.read())


async def score(client, user: str, fingerprint: str | None, ids=("g1",), responses=("yo", "ya")) -> tuple[int, dict]:
    """POST /v1/score as ``user``; groups with the same answers are answered from the result
    cache after the first, so tests that need engine calls send other ``responses``."""
    body = {"groups": [{"id": i, "prompt": "hi", "responses": list(responses)} for i in ids]}
    if fingerprint is not None:
        body["fingerprint"] = fingerprint
    async with client.post("/v1/score", json=body, headers={"X-Test-User": user}) as resp:
        return resp.status, orjson.loads(await resp.read())


async def models_body(client) -> bytes:
    async with client.get("/v1/models") as resp:
        assert resp.status == 200
        return await resp.read()


# --- stale fingerprints --------------------------------------------------------------------


async def test_stale_fingerprint_is_409_naming_both_before_any_engine_work(aiohttp_client):
    engine = FakeEngine()
    app = create_app(ServerConfig(port=0), engine, FakeRenderer())
    client = await aiohttp_client(app)
    await app[STATE_KEY].settled.wait()
    async with client.post("/v1/score", json=dict(VALID, fingerprint="fp-older")) as resp:
        assert resp.status == 409
        error = orjson.loads(await resp.read())["error"]
    assert (error["type"], error["field"]) == ("conflict", "fingerprint")
    assert error["message"].startswith(
        f"this request is pinned to fingerprint fp-older but model 'fake-rm' is now served with fingerprint "
        f"{FAKE_MODEL.fingerprint}; nothing was scored with it."
    )
    assert engine.calls == []  # refused at admission
    async with client.post("/v1/score", json=dict(VALID, fingerprint=FAKE_MODEL.fingerprint)) as resp:
        assert resp.status == 200
        assert orjson.loads(await resp.read())["results"][0]["rewards"] == pytest.approx([4.55, 4.41])
    assert len(engine.calls) == 1


async def test_stale_fingerprint_on_the_judge_path_is_409_before_any_engine_work(aiohttp_client):
    engine = FakeJudgeEngine()
    app = create_app(ServerConfig(port=0), engine)
    client = await aiohttp_client(app)
    await app[STATE_KEY].settled.wait()
    served = judge_fingerprint("fp-judge-1", protocol="auto", max_tokens=64, seed=0)
    group = rb2_group("Factuality", "7")
    wire = {"id": f"{group.benchmark}/{group.domain}/{group.id}", "messages": [{"role": m.role, "content": m.content} for m in group.messages],
            "responses": list(group.responses), "num_chosen": group.num_chosen}
    async with client.post("/v1/score", json={"groups": [wire], "fingerprint": "fp-judge-1"}) as resp:
        assert resp.status == 409
        error = orjson.loads(await resp.read())["error"]
    assert (error["type"], error["field"]) == ("conflict", "fingerprint")
    assert f"pinned to fingerprint fp-judge-1 but model 'fake-judge' is now served with fingerprint {served}" in (
        error["message"])
    assert engine.calls == []
    async with client.post("/v1/score", json={"groups": [wire], "fingerprint": served}) as resp:
        assert resp.status == 200
    assert len(engine.calls) == 1


async def test_stale_fingerprint_after_a_swap_names_who_swapped(make_server, checkpoints):
    _, original, second = checkpoints
    client, engine, _ = await make_server()
    old = orjson.loads(await models_body(client))["models"][0]["fingerprint"]
    new = model_fingerprint(second, None)
    status, body = await load(client, "alice", second)
    assert status == 200, body
    assert body["models"][0]["fingerprint"] == new
    calls = len(engine.calls)
    status, body = await score(client, "bob", old)
    assert status == 409
    assert body["error"]["message"] == (
        f"this request is pinned to fingerprint {old} but model 'step' is now served with fingerprint {new} "
        "(alice swapped it at 2027-01-15 08:00:00 UTC); nothing was scored with it. Load the expected checkpoint "
        "again (or wait for the lease holder to do so) and resume, or start a new run for the new model"
    )
    assert len(engine.calls) == calls


# --- leases --------------------------------------------------------------------------------


async def test_models_lists_the_lease_holder_only_while_a_lease_is_held(make_server, checkpoints):
    _, _, second = checkpoints
    client, _, _ = await make_server()
    before = orjson.loads(await models_body(client))["models"][0]
    assert "lease_holder" not in before and "lease_since" not in before
    status, body = await load(client, "alice", second)
    assert status == 200
    assert (body["models"][0]["lease_holder"], body["models"][0]["lease_since"]) == ("alice", WALL)
    listed = orjson.loads(await models_body(client))["models"][0]
    assert (listed["lease_holder"], listed["lease_since"]) == ("alice", WALL)


async def test_swap_is_refused_while_another_user_holds_the_lease_or_has_pinned_work(make_server, checkpoints):
    _, original, second = checkpoints
    client, engine, _ = await make_server()
    status, body = await load(client, "alice", second)
    assert status == 200, body
    new = body["models"][0]["fingerprint"]

    # bob, no work of anyone in flight: alice's live lease refuses him
    status, body = await load(client, "bob", original)
    assert status == 409
    assert body["error"]["type"] == "conflict"
    assert body["error"]["message"] == (
        f"checkpoint swap refused for bob: alice holds the lease on model 'step' (fingerprint {new}) since "
        "2027-01-15 08:00:00 UTC; it ends after 600 s without alice's pinned work in flight, or when alice or an "
        "admin releases it (POST /v1/models/release). An admin may force the swap (force: true): runs pinned to "
        "that fingerprint then stop with 409, keep what they scored and resume once it is served again"
    )

    # alice has 2 pinned groups at the (stalled) engine: bob's refusal counts them
    engine.score_gate = asyncio.Event()
    alice = asyncio.create_task(score(client, "alice", new, ids=("a1", "a2")))
    await wait_until(lambda: len(engine.calls) == 2)
    status, body = await load(client, "bob", original)
    assert status == 409
    assert body["error"]["message"] == (
        f"checkpoint swap refused for bob: alice holds the lease on model 'step' (fingerprint {new}) since "
        "2027-01-15 08:00:00 UTC; it ends after 600 s without alice's pinned work in flight, or when alice or an "
        "admin releases it (POST /v1/models/release); pinned work of 1 other user is in flight on it: alice: "
        "2 groups; retry once it is done and the lease has ended. An admin may force the swap (force: true), which "
        "stops those pinned runs with 409; they keep what they scored and resume once that fingerprint is served again"
    )
    engine.score_gate.set()
    status, body = await alice
    assert status == 200 and [r["rewards"] for r in body["results"]] == [pytest.approx([14.55, 14.41])] * 2

    # the holder is refused too while bob's pinned work is in flight on her checkpoint
    engine.score_gate = asyncio.Event()
    bob = asyncio.create_task(score(client, "bob", new, ids=("b1",), responses=("yb", "yc")))
    await wait_until(lambda: len(engine.calls) == 3)
    status, body = await load(client, "alice", original)
    assert status == 409
    assert body["error"]["message"] == (  # her own lease does not block her: only bob's work is named
        f"checkpoint swap refused for alice: pinned work of 1 other user is in flight on model 'step' (fingerprint "
        f"{new}): bob: 1 group; retry once it is done. An admin may force the swap (force: true), which stops those "
        "pinned runs with 409; they keep what they scored and resume once that fingerprint is served again"
    )
    engine.score_gate.set()
    assert (await bob)[0] == 200
    assert engine.reloads == [str(second)]  # nothing was loaded by a refused swap

    # nothing in flight: the holder swaps again
    status, body = await load(client, "alice", original)
    assert status == 200, body
    assert body["models"][0]["lease_holder"] == "alice"
    assert engine.mixed == 0


def _book() -> LeaseBook:
    return LeaseBook(600.0, clock=Clock(), wall=lambda: WALL)


SERVED = msgspec.structs.replace(FAKE_MODEL, name="step", fingerprint="fp-step-1")
FORCE_STOPS_PINNED = (
    "An admin may force the swap (force: true), which stops those pinned runs with 409; they keep what they scored "
    "and resume once that fingerprint is served again"
)


def _refusal(book: LeaseBook, user: User) -> str:
    with pytest.raises(Conflict) as info:
        book.check_swap(user, False, SERVED)
    assert info.value.status == 409 and info.value.field is None
    return info.value.message


def test_a_refusal_for_another_user_s_lease_names_the_holder_and_how_it_ends():
    book = _book()
    book.granted("alice", SERVED, "fp-step-0", (), False)
    assert _refusal(book, USERS["root"]) == (
        "checkpoint swap refused for root: alice holds the lease on model 'step' (fingerprint fp-step-1) since "
        "2027-01-15 08:00:00 UTC; it ends after 600 s without alice's pinned work in flight, or when alice or an "
        "admin releases it (POST /v1/models/release). An admin may force the swap (force: true): runs pinned to "
        "that fingerprint then stop with 409, keep what they scored and resume once it is served again"
    )


def test_a_refusal_for_pinned_work_without_a_lease_says_what_blocks_and_names_no_holder():
    book = _book()
    with book.pinned("alice", "fp-step-1", 3), book.pinned("bob", "fp-step-1", 1):
        message = _refusal(book, USERS["root"])
    assert message == (
        "checkpoint swap refused for root: pinned work of 2 other users is in flight on model 'step' (fingerprint "
        "fp-step-1): alice: 3 groups, bob: 1 group; retry once it is done. " + FORCE_STOPS_PINNED
    )
    assert "nobody" not in message and "holder" not in message and "holds" not in message
    assert book.check_swap(USERS["root"], False, SERVED) == (False, ())  # done: nothing blocks the load


def test_a_refusal_for_a_lease_and_pinned_work_names_both():
    book = _book()
    book.granted("alice", SERVED, "fp-step-0", (), False)
    with book.pinned("alice", "fp-step-1", 2), book.pinned("bob", "fp-step-1", 1):
        assert _refusal(book, USERS["root"]) == (
            "checkpoint swap refused for root: alice holds the lease on model 'step' (fingerprint fp-step-1) since "
            "2027-01-15 08:00:00 UTC; it ends after 600 s without alice's pinned work in flight, or when alice or an "
            "admin releases it (POST /v1/models/release); pinned work of 2 other users is in flight on it: alice: "
            "2 groups, bob: 1 group; retry once it is done and the lease has ended. " + FORCE_STOPS_PINNED
        )
        assert book.check_swap(USERS["root"], True, SERVED) == (True, (("alice", 2), ("bob", 1)))


def test_swap_refusal_needs_something_that_blocks():
    with pytest.raises(ValueError, match="^swap_refusal: nothing blocks the swap$"):
        swap_refusal("root", SERVED, None, {}, 600.0)


STATUS_JS = Path(server_package.__file__).parent / "static" / "status.js"
NODE_RUNNER = """
const vm = require("vm"), fs = require("fs");
const element = { hidden: true, textContent: "", addEventListener() {} };
const context = { document: { body: { dataset: {} }, getElementById: () => element, querySelector: () => element },
  sessionStorage: { getItem: () => null }, fetch: () => new Promise(() => {}), setInterval: () => 0 };
vm.createContext(context);
vm.runInContext(fs.readFileSync(process.argv[1], "utf8"), context);
process.stdout.write(vm.runInContext("leasesSummary", context)(JSON.parse(fs.readFileSync(0, "utf8"))));
"""


def leases_summary(leases: list) -> str:
    """The status page's lease summary (status.js ``leasesSummary``) for ``leases`` as /v1/status
    sends them, computed by node (skipped without it; the browser test covers the page itself)."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node not found: the status page's lease summary is checked in Chromium only")
    done = subprocess.run([node, "-e", NODE_RUNNER, str(STATUS_JS)], input=orjson.dumps(leases), capture_output=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


async def test_pinned_work_without_a_lease_blocks_loads_in_status_and_on_the_page(make_server, checkpoints):
    _, original, second = checkpoints
    client, engine, _ = await make_server()
    served = orjson.loads(await models_body(client))["models"][0]
    fp = served["fingerprint"]
    async with client.get("/v1/status") as resp:
        idle = orjson.loads(await resp.read())["leases"]
    assert idle == [{"model": "fake-rm", "fingerprint": fp, "holder": None, "since": None, "expires_in_s": None,
                     "pinned": []}]
    assert leases_summary(idle) == (
        "Nobody holds a lease and no pinned work is in flight: an admin may load a checkpoint (scorers never may).")

    engine.score_gate = asyncio.Event()
    alice = asyncio.create_task(score(client, "alice", fp, ids=("a1", "a2"), responses=("ya", "yb")))
    await wait_until(lambda: len(engine.calls) == 2)
    async with client.get("/v1/status") as resp:
        busy = orjson.loads(await resp.read())["leases"]
    assert busy == [{"model": "fake-rm", "fingerprint": fp, "holder": None, "since": None, "expires_in_s": None,
                     "pinned": [{"user": "alice", "groups": 2}]}]
    assert leases_summary(busy) == (
        "Only admins load checkpoints. Loads into fake-rm are blocked by the pinned work in flight on it (alice: "
        "2 groups): a load by any other user is refused until it is done. An admin may force a load, which stops "
        "those pinned runs; they keep what they scored and resume once their checkpoint is served again."
    )
    status, body = await load(client, "root", second)
    assert status == 409
    assert body["error"]["message"] == (
        f"checkpoint swap refused for root: pinned work of 1 other user is in flight on model 'fake-rm' (fingerprint "
        f"{fp}): alice: 2 groups; retry once it is done. " + FORCE_STOPS_PINNED
    )
    engine.score_gate.set()
    assert (await alice)[0] == 200
    assert engine.reloads == []  # nothing was loaded by the refused swap

    held = [{"model": "step", "fingerprint": "fp-1", "holder": "alice", "since": WALL, "expires_in_s": 12.0,
             "pinned": []}]
    assert leases_summary(held) == (
        "Only admins load checkpoints. alice holds the lease on step: another admin's load is refused until the lease "
        "ends (once alice has had no pinned work in flight for the server's --lease-idle-s) or is released. An admin "
        "may force a load; runs pinned to the old checkpoint then stop, keep what they scored and resume once it is "
        "served again."
    )
    assert leases_summary([]) == "No model is served."


async def test_admin_forced_swap_answers_in_flight_work_on_its_checkpoint_then_409(make_server, checkpoints):
    _, original, second = checkpoints
    client, engine, _ = await make_server()
    status, body = await load(client, "alice", second)
    assert status == 200
    step1 = body["models"][0]["fingerprint"]
    step0 = model_fingerprint(original, None)

    engine.score_gate = asyncio.Event()
    alice = asyncio.create_task(score(client, "alice", step1, ids=("a1", "a2")))
    await wait_until(lambda: len(engine.calls) == 2)

    status, body = await load(client, "bob", original, force=True)  # a scorer may not force
    assert status == 403
    assert (body["error"]["type"], body["error"]["field"]) == ("forbidden", "force")
    assert body["error"]["message"] == "force: only an admin may force a checkpoint swap; bob is a scorer"

    forced = asyncio.create_task(load(client, "root", original, force=True))
    await wait_until(lambda: not client.app[STATE_KEY].serving.is_set())  # the gate is closed, draining
    assert engine.reloads == [str(second)]  # alice's work is still at the engine: nothing loaded yet
    engine.score_gate.set()
    status, body = await alice  # answered on the checkpoint it pinned: nothing lost, nothing mixed
    assert status == 200
    assert body["fingerprint"] == step1
    assert [r["rewards"] for r in body["results"]] == [pytest.approx([14.55, 14.41])] * 2
    status, body = await forced
    assert status == 200, body
    info = body["models"][0]
    assert (info["fingerprint"], info["lease_holder"]) == (step0, "root")
    assert engine.reloads == [str(second), str(original)] and engine.mixed == 0

    status, body = await score(client, "alice", step1, ids=("a3",))
    assert status == 409
    assert body["error"]["message"].startswith(
        f"this request is pinned to fingerprint {step1} but model 'step' is now served with fingerprint {step0} "
        "(root forced the swap at 2027-01-15 08:00:00 UTC)"
    )


async def test_lease_ends_after_its_holder_is_idle_for_lease_idle_s(make_server, checkpoints):
    _, original, second = checkpoints
    client, engine, clock = await make_server(lease_idle_s=60)
    status, body = await load(client, "alice", second)
    assert status == 200
    step1 = body["models"][0]["fingerprint"]

    clock.now += 59.0
    status, body = await load(client, "bob", original)
    assert status == 409 and "alice holds the lease on model 'step'" in body["error"]["message"]
    async with client.get("/v1/status") as resp:
        (lease,) = orjson.loads(await resp.read())["leases"]
    assert lease == {"model": "step", "fingerprint": step1, "holder": "alice", "since": WALL,
                     "expires_in_s": 1.0, "pinned": []}

    # pinned work in flight keeps the lease however long it takes; idleness counts from its end
    engine.score_gate = asyncio.Event()
    alice = asyncio.create_task(score(client, "alice", step1))
    await wait_until(lambda: len(engine.calls) == 1)
    clock.now += 1000.0
    async with client.get("/v1/status") as resp:
        (lease,) = orjson.loads(await resp.read())["leases"]
    assert (lease["holder"], lease["expires_in_s"], lease["pinned"]) == ("alice", None, [{"user": "alice", "groups": 1}])
    engine.score_gate.set()
    assert (await alice)[0] == 200
    clock.now += 59.5
    status, body = await load(client, "bob", original)
    assert status == 409 and "alice holds the lease on model 'step'" in body["error"]["message"]

    clock.now += 0.5  # 60 s idle: the lease has ended
    assert "lease_holder" not in orjson.loads(await models_body(client))["models"][0]
    status, body = await load(client, "bob", original)
    assert status == 200, body
    assert body["models"][0]["lease_holder"] == "bob"


async def test_release_by_the_holder_or_an_admin_only(make_server, checkpoints):
    _, original, second = checkpoints
    client, _, _ = await make_server()
    assert (await load(client, "alice", second))[0] == 200

    status, body = await release(client, "bob")
    assert status == 403
    assert body["error"]["message"] == (
        "the lease on model 'step' is held by alice; only its holder or an admin may release it (bob is a scorer)"
    )
    status, body = await release(client, "alice", name="other")
    assert (status, body["error"]["type"]) == (404, "model_not_found")

    status, body = await release(client, "alice")
    assert status == 200
    assert "lease_holder" not in body["models"][0]
    assert b"lease_" not in await models_body(client)
    status, body = await release(client, "alice")
    assert (status, body["error"]["type"]) == (409, "conflict")
    assert body["error"]["message"] == "no lease is held on model 'step'; nothing to release"

    status, body = await load(client, "bob", original)  # released: bob may swap
    assert status == 200 and body["models"][0]["lease_holder"] == "bob"
    status, body = await release(client, "root")  # an admin may end anyone's lease
    assert status == 200


async def test_without_users_every_swap_is_the_anonymous_users_and_never_refused(make_server, checkpoints):
    _, original, second = checkpoints
    client, _, _ = await make_server()
    for path in (second, original, second):
        async with client.post("/v1/models/load", json={"name": "step", "path": str(path)},
                               headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
            assert resp.status == 200
            assert orjson.loads(await resp.read())["models"][0]["lease_holder"] == "anonymous"


def test_lease_idle_s_must_be_positive():
    with pytest.raises(ValueError, match=r"ServerConfig.lease_idle_s is 0; it must be > 0 seconds"):
        ServerConfig(lease_idle_s=0)


def test_new_request_fields_are_left_out_of_the_json_at_their_defaults():
    from rmserve.schema import LoadModelRequest, RequestGroup, ScoreRequest, encode

    group = RequestGroup(id="g1", prompt="hi", responses=("yo", "ya"))
    assert encode(ScoreRequest(groups=(group,))) == b'{"groups":[{"id":"g1","responses":["yo","ya"],"prompt":"hi"}]}'
    assert encode(ScoreRequest(groups=(group,), fingerprint="fp-1")).endswith(b',"fingerprint":"fp-1"}')
    assert encode(LoadModelRequest(name="m", path="/c")) == b'{"name":"m","path":"/c"}'
    assert encode(LoadModelRequest(name="m", path="/c", force=True)) == b'{"name":"m","path":"/c","force":true}'
