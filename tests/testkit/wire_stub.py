"""A minimal scoring server speaking the rmserve wire schema, for client tests.

It decodes requests and encodes every reply body (scores, models, health, errors) with the
schema records the real server uses, so its bodies match the server's byte for byte; it answers every group with a reward computed from
the response text (``len(response) / 100``, so tests can recompute it; a stub serving a DPO
model — ``model.kind == "dpo"`` — answers the DPO extras of :func:`stub_dpo_extras` and the
reward of its mode instead), and lets a test script
failures (status + error type + headers, or a dropped connection), hold groups back to force
out-of-order replies, and read counters (requests, groups, most groups in flight).

Run as a script (``python wire_stub.py --port N``) it serves until SIGTERM; used by the
launch tests.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass, field

import msgspec
from aiohttp import web

from rmserve import __version__
from rmserve.schema import (
    ErrorBody,
    ErrorDetail,
    GroupResult,
    HealthReply,
    HealthStatus,
    ModelInfo,
    ModelList,
    ScoreRequest,
    ScoreResponse,
    encode,
)

STUB_MODEL = ModelInfo(name="stub-rm", max_model_len=4096, dtype="float32", fingerprint="fp-stub-1", engine="stub")


def stub_reward(response: str) -> float:
    """The reward the stub gives a response: its length in characters / 100."""
    return len(response) / 100


def stub_dpo_model(mode: str, *, ref_model: str | None = None, compat: str = "none", name: str = "stub-policy") -> ModelInfo:
    """A DPO ModelInfo the stub can serve: ``mode`` ``reference`` (needs ``ref_model``) or
    ``avg``/``sum``/``norm``; fingerprint ``fp-stub-dpo-<mode>-<compat>``."""
    return ModelInfo(
        name=name, max_model_len=4096, dtype="float32", fingerprint=f"fp-stub-dpo-{mode}-{compat}", engine="stub",
        kind="dpo", mode=mode, ref_model=ref_model, compat=compat,
    )


def stub_dpo_extras(response: str, mode: str) -> dict[str, float | int | None]:
    """The DPO extras the stub answers for one response (n = its length in characters):
    ``policy_logp`` −n/10, ``answer_tokens`` words + 1, ``policy_logp_norm`` n/25 + 0.5 and
    ``ref_logp`` −n/20 − 0.5 (None unless ``mode`` is ``reference``)."""
    n = len(response)
    return {
        "policy_logp": -n / 10,
        "ref_logp": -n / 20 - 0.5 if mode == "reference" else None,
        "policy_logp_norm": n / 25 + 0.5,
        "answer_tokens": len(response.split()) + 1,
    }


def stub_dpo_reward(response: str, mode: str) -> float:
    """The reward a DPO stub gives: its mode's formula over :func:`stub_dpo_extras`."""
    e = stub_dpo_extras(response, mode)
    if mode == "reference":
        return e["policy_logp"] - e["ref_logp"]
    if mode == "avg":
        return e["policy_logp"] / e["answer_tokens"]
    if mode == "sum":
        return e["policy_logp"]
    return -e["policy_logp_norm"]


def _result(state: StubState, group_id: str, responses: tuple[str, ...]) -> GroupResult:
    model = state.model
    num_tokens = tuple(len(r.split()) + 1 for r in responses)
    num_cached = tuple(0 for _ in responses)
    if model.kind != "dpo":
        return GroupResult(id=group_id, rewards=tuple(stub_reward(r) for r in responses), num_tokens=num_tokens,
                           num_cached_tokens=num_cached)
    mode = model.mode or "avg"
    per_response = [stub_dpo_extras(r, mode) for r in responses]
    extras = {name: tuple(e[name] for e in per_response) for name in per_response[0]}
    return GroupResult(id=group_id, rewards=tuple(stub_dpo_reward(r, mode) for r in responses), num_tokens=num_tokens,
                       num_cached_tokens=num_cached, extras=extras)


@dataclass
class Failure:
    """One scripted reply to a ``POST /v1/score``: an error status, or a dropped connection."""

    status: int = 503
    type: str = "engine_not_ready"
    headers: dict[str, str] = field(default_factory=dict)
    drop_connection: bool = False
    body: bytes | None = None


@dataclass
class StubState:
    """What the stub does and what it saw."""

    model: ModelInfo = STUB_MODEL
    ready: bool = True
    failures: list[Failure] = field(default_factory=list)
    """Consumed one per scoring request, before any scoring."""
    fail_ids: dict[str, Failure] = field(default_factory=dict)
    """Wire id → the reply given (every time) to a request holding that group."""
    hold_until_completed: dict[str, int] = field(default_factory=dict)
    """Wire id → the number of groups that must be answered before this one is."""
    delay_s: float = 0.0
    """Sleep per request before answering (lets requests overlap)."""
    fingerprint_after: dict[int, str] = field(default_factory=dict)
    """From request number n (1-based) on, report this fingerprint."""
    reply_tamper: object = None
    """A function (request, results) → results applied before replying."""
    score_requests: int = 0
    groups_received: int = 0
    groups_completed: int = 0
    in_flight_groups: int = 0
    max_in_flight_groups: int = 0
    health_requests: int = 0
    received_ids: list[str] = field(default_factory=list)
    completed: asyncio.Condition | None = None


STATE_KEY = web.AppKey("stub_state", StubState)


def error_body(type_: str, message: str, field: str | None = None) -> bytes:
    """The stub's error reply body: an :class:`~rmserve.schema.ErrorBody`, as the server writes it."""
    return encode(ErrorBody(error=ErrorDetail(type=type_, message=message, field=field)))


def health_body(status: HealthStatus) -> bytes:
    """The stub's ``GET /health`` body: a :class:`~rmserve.schema.HealthReply` with this rmserve version."""
    return encode(HealthReply(status=status, version=__version__))


def _error(status: int, type_: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=error_body(type_, message), status=status, content_type="application/json", headers=headers)


async def _health(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    state.health_requests += 1
    if not state.ready:
        return web.Response(body=health_body("loading"), status=503, content_type="application/json",
                            headers={"Retry-After": "1"})
    return web.Response(body=health_body("ready"), content_type="application/json")


async def _models(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    if not state.ready:
        return _error(503, "engine_not_ready", "loading", {"Retry-After": "1"})
    return web.Response(body=encode(ModelList(models=(state.model,))), content_type="application/json")


async def _score(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    if state.completed is None:
        state.completed = asyncio.Condition()
    state.score_requests += 1
    number = state.score_requests
    body = await request.read()
    if state.failures:
        failure = state.failures.pop(0)
        if failure.drop_connection:
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=200)
        if failure.body is not None:
            return web.Response(body=failure.body, status=failure.status, headers=failure.headers)
        return _error(failure.status, failure.type, f"scripted {failure.type}", failure.headers)
    try:
        score_request = msgspec.json.decode(body, type=ScoreRequest)
    except msgspec.ValidationError as exc:
        return _error(400, "invalid_request", str(exc))
    groups = score_request.groups
    for g in groups:
        if g.id in state.fail_ids:
            failure = state.fail_ids[g.id]
            return _error(failure.status, failure.type, f"scripted {failure.type} for {g.id}", failure.headers)
    state.groups_received += len(groups)
    state.received_ids.extend(g.id for g in groups)
    state.in_flight_groups += len(groups)
    state.max_in_flight_groups = max(state.max_in_flight_groups, state.in_flight_groups)
    try:
        if state.delay_s:
            await asyncio.sleep(state.delay_s)
        for g in groups:
            needed = state.hold_until_completed.get(g.id)
            if needed is not None:
                async with state.completed:
                    await state.completed.wait_for(lambda: state.groups_completed >= needed)
        results = [_result(state, g.id, g.responses) for g in groups]
        if state.reply_tamper is not None:
            results = state.reply_tamper(score_request, results)
    finally:
        state.in_flight_groups -= len(groups)
    fingerprint = state.model.fingerprint
    for start, value in state.fingerprint_after.items():
        if number >= start:
            fingerprint = value
    reply = ScoreResponse(model=state.model.name, fingerprint=fingerprint, results=tuple(results))
    async with state.completed:
        state.groups_completed += len(groups)
        state.completed.notify_all()
    return web.Response(body=encode(reply), content_type="application/json")


def make_stub_app(state: StubState | None = None) -> web.Application:
    """The stub app; its :class:`StubState` is ``app[STATE_KEY]``."""
    app = web.Application(client_max_size=1024 * 1024)
    app[STATE_KEY] = state or StubState()
    app.router.add_get("/health", _health)
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/score", _score)
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--fail-at-start", action="store_true", help="print a message and exit 3")
    parser.add_argument("--refuse-at-start", default=None, help="print a traceback, then this refusal as serve does; exit 2")
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--startup-delay-s", type=float, default=0.0)
    parser.add_argument("--kind", default="classifier")
    parser.add_argument("--ref-model", default=None)
    parser.add_argument("--ref-free", default=None)
    parser.add_argument("--compat", default="none")
    parser.add_argument("--delay-s", type=float, default=0.0, help="sleep per scoring request")
    parser.add_argument("--warn", action="append", default=[],
                        help="write this warning line as rmserve's server logger does (repeatable)")
    args, unknown = parser.parse_known_args()
    print(f"stub server argv extras: {unknown}", flush=True)
    for message in args.warn:
        print(f"2026-12-03 12:00:00,000 WARNING rmserve.server: {message}", flush=True)
    print("2026-12-03 12:00:00,001 WARNING vllm.other: not ours", flush=True)
    if args.refuse_at_start is not None:
        print("Traceback (most recent call last):\n  File \"x.py\", line 1, in _build", flush=True)
        print(f"rmserve.errors.ServerFault: {args.refuse_at_start}", flush=True)
        print(f"engine failed to start: {args.refuse_at_start}", flush=True)
        sys.exit(2)
    if args.fail_at_start:
        print("stub: cannot load the model (scripted)", flush=True)
        raise SystemExit(3)
    if args.ignore_sigterm:
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.startup_delay_s:
        import time

        time.sleep(args.startup_delay_s)
    print(f"stub: serving on {args.host}:{args.port}", flush=True)
    state = StubState(delay_s=args.delay_s)
    if args.kind == "dpo":
        mode = "reference" if args.ref_model is not None else args.ref_free
        state.model = stub_dpo_model(mode, ref_model=args.ref_model, compat=args.compat)
    print(f"stub: serving {state.model.kind} model {state.model.name}", flush=True)
    web.run_app(make_stub_app(state), host=args.host, port=args.port, print=None, handle_signals=not args.ignore_sigterm)


if __name__ == "__main__":
    main()
