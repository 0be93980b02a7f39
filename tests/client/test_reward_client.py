"""RewardClient against the in-process wire stub: streaming, bounds, retries, reply checks.

The last section aims the client at the real server app (fake engine and renderer) and checks
that its health and error replies decode through the records the client uses, and that the
stub's replies are byte-identical to the app's, so a change to either body fails a test here.
"""

from __future__ import annotations

import asyncio
import socket
import sqlite3

import pytest
from aiohttp import web
from rmserve.client.client import RewardClient
from rmserve.client.config import Concurrency, Retry, Timeouts
from rmserve.client.errors import connection_reason
from rmserve.server.http import wire
from rmserve.server.http.app import STATE_KEY, ServerConfig, create_app
from testkit.fakes import FAKE_MODEL, FakeEngine, FakeRenderer

from rmserve import __version__, errors
from rmserve.schema import ErrorBody, ErrorDetail, GroupResult, HealthReply, ResponseError, Truncation, decode


async def _collect(client, groups, **kwargs):
    return [record async for record in client.score_stream(groups, **kwargs)]


# --- config -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "words"),
    [
        (lambda: Timeouts(connect_s=0), "Timeouts.connect_s"),
        (lambda: Timeouts(connect_s=1, total_s=5, sock_read_s=6), "Timeouts.sock_read_s must be ≤ 5"),
        (lambda: Concurrency(max_groups_in_flight=0), "Concurrency.max_groups_in_flight must be an integer ≥ 1"),
        (lambda: Concurrency(max_groups_in_flight=4, groups_per_request=5), "groups_per_request must be ≤"),
        (lambda: Concurrency(max_groups_in_flight=8, groups_per_request=2, pool_limit=3), "pool_limit must be an integer ≥ 4"),
        (lambda: Retry(max_attempts=0), "Retry.max_attempts"),
        (lambda: Retry(jitter=1.5), "Retry.jitter must be in [0, 1]"),
        (lambda: Retry(base_delay_s=2, max_delay_s=1), "Retry.max_delay_s must be ≥"),
    ],
)
def test_config_rejects_bad_values_naming_field_and_limit(build, words):
    with pytest.raises(ValueError, match=None) as info:
        build()
    assert words in str(info.value)


def test_config_repr_shows_units_and_timeouts_set_every_field():
    t = Timeouts(connect_s=3, sock_read_s=20, total_s=40, probe_s=2)
    assert repr(t) == "Timeouts(connect_s=3, sock_read_s=20, total_s=40, probe_s=2)"
    ct = t.for_scoring()
    assert (ct.total, ct.connect, ct.sock_connect, ct.sock_read) == (40, 3, 3, 20)
    pt = t.for_probe()
    assert (pt.total, pt.connect, pt.sock_connect, pt.sock_read) == (2, 2, 2, 2)


def test_backoff_is_exponential_capped_and_jittered():
    r = Retry(base_delay_s=0.5, max_delay_s=3.0, jitter=0.5)
    # min(3, 0.5·2^(n-1)) · (1 − 0.5·u), by hand:
    assert r.backoff_s(1, 0.0) == 0.5
    assert r.backoff_s(2, 0.0) == 1.0
    assert r.backoff_s(3, 0.5) == 2.0 * 0.75
    assert r.backoff_s(10, 0.0) == 3.0
    assert r.backoff_s(10, 1.0) == 1.5


def test_concurrency_derives_requests_and_pool():
    c = Concurrency(max_groups_in_flight=7, groups_per_request=2)
    assert c.max_requests_in_flight == 3
    assert c.connection_limit == 3


def test_bad_url_is_refused():
    with pytest.raises(ValueError, match="http"):
        RewardClient("localhost:8000")


# --- endpoints ----------------------------------------------------------------------------


async def test_health_models_and_not_ready(make_client, stub, stub_state):
    async with make_client() as client:
        assert await client.health() == HealthReply(status="ready", version=__version__)
        assert await client.models() == (stub.STUB_MODEL,)
        stub_state.ready = False
        with pytest.raises(errors.EngineNotReady):
            await client.health()
        with pytest.raises(errors.EngineNotReady, match="not ready after 0.2 s"):
            await client.wait_until_ready(0.2, poll_interval_s=0.05)
        assert stub_state.health_requests >= 3


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_wait_until_ready_on_a_closed_port_fails_after_the_grace_naming_the_refusal():
    port = _closed_port()
    seen = []
    async with RewardClient(f"http://127.0.0.1:{port}") as client:
        started = asyncio.get_running_loop().time()
        with pytest.raises(errors.ConnectionFailed) as info:
            await client.wait_until_ready(600.0, poll_interval_s=0.1, connect_grace_s=0.6, on_wait=seen.append)
        elapsed_s = asyncio.get_running_loop().time() - started
    assert 0.6 <= elapsed_s < 5  # the grace, not the 600 s limit
    message = str(info.value)
    assert message.startswith(f"nothing answers at http://127.0.0.1:{port}/health: connection refused (retried for 0.")
    assert "--wait-for-server" in message
    assert seen and all(not w.answering for w in seen)
    assert seen[0].sentence() == f"waiting for http://127.0.0.1:{port}/health: connection refused, retrying for 1 s"
    assert all(0 <= w.retry_for_s <= 0.6 for w in seen)
    assert connection_reason(info.value) == "connection refused"


async def test_wait_until_ready_for_a_server_waits_to_the_limit_then_names_the_refusal():
    port = _closed_port()
    async with RewardClient(f"http://127.0.0.1:{port}") as client:
        started = asyncio.get_running_loop().time()
        with pytest.raises(errors.ConnectionFailed, match="connection refused") as info:
            await client.wait_until_ready(1.0, poll_interval_s=0.1, connect_grace_s=0.2, wait_for_server=True)
        elapsed_s = asyncio.get_running_loop().time() - started
    assert 1.0 <= elapsed_s < 5
    assert "--wait-for-server" not in str(info.value)


async def test_wait_until_ready_waits_for_a_loading_server_and_reports_it(make_client, stub_state):
    stub_state.ready = False
    seen = []

    async def turn_ready():
        while len(seen) < 3:
            await asyncio.sleep(0.01)
        stub_state.ready = True

    async with make_client() as client:
        flip = asyncio.create_task(turn_ready())
        # A grace far shorter than the wait: a 503 is not a refused connection.
        reply = await client.wait_until_ready(5.0, poll_interval_s=0.05, connect_grace_s=0.01, on_wait=seen.append)
        await flip
    assert reply.status == "ready"
    assert len(seen) >= 3 and all(w.answering and isinstance(w.last, errors.EngineNotReady) for w in seen)
    assert seen[0].sentence().startswith(f"waiting for {client.base_url.joinpath('health')}: engine not ready (")
    assert "waiting up to 5 s more" in seen[0].sentence()


@pytest.mark.parametrize("grace", [0, -1.0, float("nan")])
async def test_wait_until_ready_refuses_a_bad_grace(grace):
    async with RewardClient("http://127.0.0.1:9") as client:
        with pytest.raises(ValueError, match="connect_grace_s"):
            await client.wait_until_ready(1.0, connect_grace_s=grace)


async def test_score_stream_returns_every_group_with_the_stub_rewards(make_client, make_groups, stub_state):
    groups = make_groups(10)
    async with make_client(max_groups_in_flight=3) as client:
        records = await _collect(client, groups)
    assert sorted(r.key for r in records) == sorted(g.key for g in groups)
    by_key = {r.key: r for r in records}
    for g in groups:
        r = by_key[g.key]
        # The stub's reward is len(response)/100; responses are "x"*(10i+k+1).
        i = int(g.id)
        assert r.rewards == tuple((10 * i + k + 1) / 100 for k in range(6))
        assert (r.model, r.fingerprint, r.num_chosen) == ("stub-rm", "fp-stub-1", 3)
    assert stub_state.score_requests == 10
    assert sorted(stub_state.received_ids) == sorted(str(g.key) for g in groups)


@pytest.mark.parametrize(("limit", "per_request", "expected_max"), [(4, 1, 4), (5, 2, 4), (1, 1, 1)])
async def test_groups_in_flight_stay_within_the_bound(make_client, make_groups, stub_state, limit, per_request, expected_max):
    stub_state.delay_s = 0.02  # every request overlaps the ones launched with it
    groups = make_groups(16)
    async with make_client(max_groups_in_flight=limit, groups_per_request=per_request) as client:
        records = await _collect(client, groups)
    assert len(records) == 16
    # floor(limit / per_request) requests of per_request groups: 4, 2·2, 1.
    assert stub_state.max_in_flight_groups == expected_max
    assert stub_state.score_requests == -(-16 // per_request)


async def test_results_stream_in_completion_order(make_client, make_groups, stub_state):
    groups = make_groups(8)
    first = str(groups[0].key)
    stub_state.hold_until_completed[first] = 7  # group 0 answers only after the 7 others
    async with make_client(max_groups_in_flight=4) as client:
        records = await _collect(client, groups)
    assert stub_state.received_ids[0] == first  # sent first …
    assert str(records[0].key) != first  # … answered after others
    assert first in [str(r.key) for r in records]
    assert sorted(r.key for r in records) == sorted(g.key for g in groups)


@pytest.mark.parametrize(
    ("status", "type_", "drop"),
    [(503, "engine_not_ready", False), (429, "overloaded", False), (200, "", True)],
    ids=["503", "429", "dropped-connection"],
)
async def test_retryable_failures_are_retried_then_succeed(make_client, make_groups, stub, stub_state, sleeps, status, type_, drop):
    failure = stub.Failure(status, type_, drop_connection=drop)
    stub_state.failures = [failure, failure]
    async with make_client(max_attempts=4) as client:
        records = await _collect(client, make_groups(1))
        assert client.attempts == 3 and client.retries == 2
    assert len(records) == 1
    assert stub_state.score_requests == 3
    # Backoff without jitter: 0.25 s, then 0.5 s.
    assert sleeps.delays_s == [0.25, 0.5]


async def test_retry_after_header_is_honoured(make_client, stub, make_groups, stub_state, sleeps):
    stub_state.failures = [
        stub.Failure(503, "engine_not_ready", {"Retry-After": "7"}),
        stub.Failure(429, "overloaded", {"Retry-After": "2"}),
    ]
    async with make_client() as client:
        await client.score(make_groups(1))
    assert sleeps.delays_s == [7.0, 2.0]


async def test_a_retry_after_over_the_cap_is_cut_to_it_with_a_warning(
    make_client, stub, make_groups, stub_state, sleeps, stub_http, caplog
):
    stub_state.failures = [
        stub.Failure(429, "overloaded", {"Retry-After": "86400"}),  # a day
        stub.Failure(503, "engine_not_ready", {"Retry-After": "60"}),  # the cap itself: taken as it is
        stub.Failure(503, "engine_not_ready", {"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT"}),
    ]
    with caplog.at_level("WARNING", logger="rmserve.client"):
        async with make_client() as client:  # the default cap, 60 s
            await client.score(make_groups(1))
    assert sleeps.delays_s == [60.0, 60.0, 60.0]
    url = stub_http.make_url("/v1/score")
    warnings = [r.getMessage() for r in caplog.records if r.name == "rmserve.client"]
    assert warnings[0] == (
        f"POST {url}: the server asked to wait 86400 s before retrying (Retry-After); waiting 60 s instead, the "
        "client's cap (max_retry_after_s, --wait-retry-after-s)"
    )
    # the HTTP date, some 250 billion seconds away, is cut too; the 60 s equal to the cap is not
    assert len(warnings) == 2 and warnings[1].startswith(f"POST {url}: the server asked to wait ")
    assert warnings[1].endswith(" s before retrying (Retry-After); waiting 60 s instead, the client's cap "
                                "(max_retry_after_s, --wait-retry-after-s)")


async def test_the_retry_after_cap_is_a_client_option(make_client, stub, make_groups, stub_state, sleeps, caplog):
    stub_state.failures = [
        stub.Failure(429, "overloaded", {"Retry-After": "7"}),
        stub.Failure(429, "overloaded", {"Retry-After": "3"}),
    ]
    with caplog.at_level("WARNING", logger="rmserve.client"):
        async with make_client(max_retry_after_s=5.0) as client:
            await client.score(make_groups(1))
    assert sleeps.delays_s == [5.0, 3.0]  # 7 s cut to 5; 3 s under the cap, as asked
    warnings = [r.getMessage() for r in caplog.records if r.name == "rmserve.client"]
    assert len(warnings) == 1
    assert "asked to wait 7 s before retrying (Retry-After); waiting 5 s instead" in warnings[0]


def test_retry_after_cap_default_and_bounds():
    assert Retry().max_retry_after_s == 60.0
    assert Retry().retry_after_wait_s(86400.0) == 60.0
    assert Retry(max_retry_after_s=0.5).retry_after_wait_s(0.25) == 0.25
    for bad in (0, -1, float("inf"), True):
        with pytest.raises(ValueError, match=r"Retry.max_retry_after_s must be a finite number > 0"):
            Retry(max_retry_after_s=bad)


async def test_retries_stop_after_max_attempts(make_client, stub, make_groups, stub_state, sleeps):
    stub_state.failures = [stub.Failure(503, "engine_not_ready")] * 5
    async with make_client(max_attempts=3) as client:
        with pytest.raises(errors.EngineNotReady):
            await client.score(make_groups(1))
    assert stub_state.score_requests == 3
    assert len(sleeps.delays_s) == 2


@pytest.mark.parametrize(
    ("status", "type_", "cls"),
    [
        (400, "invalid_request", errors.InvalidRequest),
        (413, "sequence_too_long", errors.SequenceTooLong),
        (413, "body_too_large", errors.BodyTooLarge),
        (404, "model_not_found", errors.ModelNotFound),
        (500, "engine_error", errors.EngineError),
    ],
    ids=["400", "413-seq", "413-body", "404", "500"],
)
async def test_non_retryable_failures_raise_after_one_attempt(make_client, make_groups, stub, stub_state, sleeps, status, type_, cls):
    failure = stub.Failure(status, type_)
    stub_state.failures = [failure, failure]
    async with make_client(max_attempts=5) as client:
        with pytest.raises(cls) as info:
            await _collect(client, make_groups(1))
        assert client.attempts == 1
    assert type(info.value) is cls
    assert stub_state.score_requests == 1
    assert sleeps.delays_s == []


async def test_failure_mid_stream_yields_finished_groups_then_raises(make_client, stub, make_groups, stub_state):
    groups = make_groups(3)
    stub_state.fail_ids[str(groups[1].key)] = stub.Failure(413, "sequence_too_long")
    got = []
    async with make_client(max_groups_in_flight=1) as client:
        with pytest.raises(errors.SequenceTooLong):
            async for record in client.score_stream(groups):
                got.append(record.key)
    assert got == [groups[0].key]
    assert stub_state.score_requests == 2  # group 2 was never sent


async def test_connection_refused_becomes_connection_failed_after_retries(sleeps, make_groups):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = RewardClient(
        f"http://127.0.0.1:{port}",
        timeouts=Timeouts(connect_s=2, sock_read_s=5, total_s=5, probe_s=2),
        retry=Retry(max_attempts=3, base_delay_s=0.1, max_delay_s=1, jitter=0),
        sleep=sleeps,
    )
    async with client:
        with pytest.raises(errors.ConnectionFailed, match="failed") as info:
            await client.score(make_groups(1))
    assert client.attempts == 3 and sleeps.delays_s == [0.1, 0.2]
    assert info.value.__cause__ is not None


async def test_read_timeout_is_retried_as_connection_failed(make_client, make_groups, stub_state, sleeps):
    stub_state.delay_s = 0.5
    timeouts = Timeouts(connect_s=0.1, sock_read_s=0.1, total_s=0.1, probe_s=1)
    async with make_client(max_attempts=2, timeouts=timeouts) as client:
        with pytest.raises(errors.ConnectionFailed, match="timed out"):
            await client.score(make_groups(1))
        assert client.attempts == 2
    assert stub_state.score_requests == 2


# --- reply checks ---------------------------------------------------------------------------


def _drop_last(request, results):
    return results[:-1]


def _rename(request, results):
    return [GroupResult(id=r.id + "-x", rewards=r.rewards, num_tokens=r.num_tokens, num_cached_tokens=r.num_cached_tokens) for r in results]


def _short_rewards(request, results):
    return [GroupResult(id=r.id, rewards=r.rewards[:-1], num_tokens=r.num_tokens, num_cached_tokens=r.num_cached_tokens) for r in results]


def _duplicate(request, results):
    return [results[0], results[0]]


@pytest.mark.parametrize(
    ("tamper", "words"),
    [
        (_drop_last, "1 results for 2 groups"),
        (_rename, "no result for group"),
        (_short_rewards, "5 rewards for 6 responses"),
        (_duplicate, "twice"),
    ],
)
async def test_mismatched_reply_is_a_server_fault(make_client, make_groups, stub_state, tamper, words):
    stub_state.reply_tamper = tamper
    async with make_client(max_groups_in_flight=2, groups_per_request=2) as client:
        with pytest.raises(errors.ServerFault, match=words):
            await client.score(make_groups(2))
        assert client.attempts == 1


async def test_results_are_put_back_in_request_order(make_client, make_groups, stub_state):
    stub_state.reply_tamper = lambda request, results: list(reversed(results))
    groups = make_groups(3)
    async with make_client() as client:
        reply = await client.score(groups)
    assert [r.id for r in reply.results] == [str(g.key) for g in groups]


async def test_model_change_mid_run_is_refused(make_client, make_groups, stub_state):
    stub_state.fingerprint_after[3] = "fp-other"
    got = []
    async with make_client(max_groups_in_flight=1) as client:
        with pytest.raises(errors.FingerprintMismatch, match="fp-other"):
            async for record in client.score_stream(make_groups(5), expect_fingerprint="fp-stub-1"):
                got.append(record)
    assert len(got) == 2


async def test_duplicate_groups_are_refused_before_sending(make_client, make_groups, stub_state):
    groups = make_groups(2)
    async with make_client() as client:
        with pytest.raises(errors.InvalidRequest, match="twice"):
            await client.score([groups[0], groups[0]])
        with pytest.raises(errors.InvalidRequest, match="twice"):
            await _collect(client, [groups[0], groups[1], groups[0]])
    assert stub_state.groups_received <= 2


async def test_closing_the_stream_early_cancels_the_rest(make_client, make_groups, stub_state):
    stub_state.delay_s = 0.01
    async with make_client(max_groups_in_flight=4) as client:
        stream = client.score_stream(make_groups(50))
        async for _ in stream:
            break
        await stream.aclose()
    assert stub_state.score_requests <= 5  # the 4 in flight, plus at most the one launched after


# --- the real app: same records, same bytes ----------------------------------------------


@pytest.fixture
def real_app(aiohttp_client):
    """Start the real server app on a fake engine; returns (app, aiohttp test client)."""

    async def start(engine: FakeEngine | None = None, **config):
        app = create_app(ServerConfig(port=0, **config), engine or FakeEngine(), FakeRenderer())
        return app, await aiohttp_client(app)

    return start


def _client_on(http) -> RewardClient:
    """A client on the test server's session that tries every request once."""
    return RewardClient(
        str(http.make_url("")),
        session=http.session,
        timeouts=Timeouts(connect_s=5, sock_read_s=30, total_s=30, probe_s=5),
        retry=Retry(max_attempts=1),
    )


async def test_client_reads_the_real_app_health_with_its_version(real_app, make_groups):
    gate = asyncio.Event()
    app, http = await real_app(FakeEngine(start_gate=gate), retry_after_s=7)
    async with _client_on(http) as client:
        with pytest.raises(errors.EngineNotReady) as info:
            await client.health()
        # /health's 503 body is a HealthReply, not an error body: the status decides.
        assert info.value.message == f'HTTP 503: {{"status":"loading","version":"{__version__}"}}'
        assert info.value.retry_after_s == 7.0
        with pytest.raises(errors.EngineNotReady) as info:
            await client.score(make_groups(1))
        assert info.value.message == "the engine is not ready (status: loading); retry later"
        assert (info.value.status, info.value.retry_after_s) == (503, 7.0)
        gate.set()
        await app[STATE_KEY].settled.wait()
        assert await client.health() == HealthReply(status="ready", version=__version__)
        assert (await client.wait_until_ready(5.0)).version == __version__


async def test_real_app_errors_decode_to_the_classes_the_client_raises(real_app, make_groups):
    app, http = await real_app()
    await app[STATE_KEY].settled.wait()
    groups = make_groups(1)  # 16..21 fake tokens: BOS, user turn (12), assistant turn (3 + 1..6)
    async with _client_on(http) as client:
        with pytest.raises(errors.ModelNotFound) as info:
            await client.score(groups, model="other-rm")
        assert (info.value.status, info.value.field) == (404, "model")
        assert info.value.message == f"model 'other-rm' is not served here; this server scores {FAKE_MODEL.name!r}"

        with pytest.raises(errors.InvalidRequest) as info:
            await client.score(groups, truncation=Truncation(side="left", max_tokens=FAKE_MODEL.max_model_len + 1))
        assert (info.value.status, info.value.field) == (400, "truncation.max_tokens")
        assert info.value.message == "truncation.max_tokens is 65; it must be between 2 and the model's max length 64"

        # An over-length response is not an error of the request: it is answered per response.
        long_group = make_groups(7)[6:]  # responses of 61..66 characters: 76..81 tokens, over 64
        reply = await client.score(long_group)
        assert reply.results[0].rewards == (None,) * 6
        assert reply.results[0].errors == tuple(
            ResponseError("sequence_too_long", f"{n} tokens (chat template included), over max_model_len=64")
            for n in range(76, 82)
        )


async def test_stub_replies_equal_the_real_app_replies(real_app, stub, stub_http, stub_state):
    gate = asyncio.Event()
    app, http = await real_app(FakeEngine(start_gate=gate))

    async def reply(client, method, path, **kwargs):
        async with client.request(method, path, **kwargs) as resp:
            return resp.status, resp.content_type, "Retry-After" in resp.headers, await resp.read()

    # Health while loading, then ready: same status, content type, header and bytes.
    stub_state.ready = False
    loading = await reply(http, "GET", "/health")
    assert loading == await reply(stub_http, "GET", "/health")
    assert loading[:3] == (503, "application/json", True)
    gate.set()
    await app[STATE_KEY].settled.wait()
    stub_state.ready = True
    ready = await reply(http, "GET", "/health")
    assert ready == await reply(stub_http, "GET", "/health")
    assert decode(ready[3], HealthReply) == HealthReply(status="ready", version=__version__)

    # An error: the app's body, rebuilt by the stub from the decoded record, is the same bytes.
    status, content_type, _, body = await reply(
        http, "POST", "/v1/score", json={"model": "nope", "groups": [{"id": "g", "prompt": "q", "responses": ["a"]}]}
    )
    detail = decode(body, ErrorBody).error
    assert (status, content_type, detail.type, detail.field) == (404, "application/json", "model_not_found", "model")
    assert stub.error_body(detail.type, detail.message, detail.field) == body
    # ... and the stub's scripted error is what the server writes for that error.
    stub_state.failures = [stub.Failure(404, "model_not_found")]
    stub_reply = await reply(stub_http, "POST", "/v1/score", json={"groups": []})
    assert stub_reply == (404, "application/json", False, wire.encode_error(errors.ModelNotFound("scripted model_not_found")))
    assert decode(stub_reply[3], ErrorBody) == ErrorBody(ErrorDetail("model_not_found", "scripted model_not_found", None))


async def test_a_run_with_a_store_records_the_version_the_real_server_sends(scoring_server, small_rmbench, tmp_path):
    from rmserve.pipelines.evaluate import EvalConfig, evaluate_async

    url, _ = scoring_server
    store = tmp_path / "scores.sqlite"
    config = EvalConfig(
        bench="rm-bench", data=str(small_rmbench), out_dir=tmp_path / "out", server_url=url, store=store,
        resamples=0, quiet=True,
    )
    result = await evaluate_async(config)
    assert result.n_scored == 10  # the small RM-Bench fixture: 6 chat + 4 code groups
    with sqlite3.connect(store) as conn:
        versions = conn.execute("SELECT server_version, COUNT(*) FROM scores GROUP BY server_version").fetchall()
    assert versions == [(__version__, 10)]


@pytest.mark.parametrize(
    ("body", "words"),
    [(b'{"ok": true}', "missing required field `status`"), (b"<html>up</html>", "malformed"),
     (b'{"status": "sleeping"}', "Invalid enum value 'sleeping'")],
    ids=["no-status", "not-json", "unknown-status"],
)
async def test_a_200_health_reply_that_is_not_a_health_record_is_a_server_fault(aiohttp_client, body, words):
    async def health(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/health", health)
    http = await aiohttp_client(app)
    async with _client_on(http) as client:
        with pytest.raises(errors.ServerFault) as info:
            await client.health()
    assert info.value.message.startswith("GET /health: invalid reply (")
    assert words in info.value.message
    assert not info.value.retryable
