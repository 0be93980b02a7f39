"""Fixtures of the client tests: an in-process wire stub and clients aimed at it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from rmserve.client.client import Concurrency, Retry, RewardClient, Timeouts

from rmserve.schema import Group, Message

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SHARED_DATA = REPO / ".." / "shared" / "data"
RMBENCH_DIR = SHARED_DATA / "rm-bench"
WIRE_STUB_PATH = HERE / "wire_stub.py"


def _load_wire_stub():
    name = "rmserve_tests_client_wire_stub"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, WIRE_STUB_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


wire_stub = _load_wire_stub()


def make_groups(n: int, *, domain: str = "chat", benchmark: str = "rm-bench") -> list[Group]:
    """``n`` RM-Bench-shaped groups (3 chosen, 3 rejected) with distinct response lengths."""
    return [
        Group(
            benchmark=benchmark,
            domain=domain,
            id=str(i),
            messages=(Message("user", f"question {i}"),),
            responses=tuple("x" * (10 * i + k + 1) for k in range(6)),
            num_chosen=3,
        )
        for i in range(n)
    ]


class SleepRecorder:
    """Stands in for ``asyncio.sleep`` in the client's retry loop: records, never waits."""

    def __init__(self) -> None:
        self.delays_s: list[float] = []

    async def __call__(self, delay_s: float) -> None:
        self.delays_s.append(delay_s)


@pytest.fixture(name="make_groups")
def make_groups_fixture():
    """:func:`make_groups`, for tests (they cannot import this conftest by name)."""
    return make_groups


@pytest.fixture
def stub():
    """The wire stub module (Failure, StubState, STUB_MODEL, stub_reward, make_stub_app)."""
    return wire_stub


@pytest.fixture
def stub_state():
    return wire_stub.StubState()


@pytest.fixture
async def stub_http(aiohttp_client, stub_state):
    """An aiohttp TestClient over the wire stub (its ``session`` is the client's seam)."""
    return await aiohttp_client(wire_stub.make_stub_app(stub_state))


@pytest.fixture
def sleeps():
    return SleepRecorder()


@pytest.fixture
def make_client(stub_http, sleeps):
    """Build a RewardClient on the stub's session; keyword args override the config."""

    def build(
        *,
        max_groups_in_flight: int = 4,
        groups_per_request: int = 1,
        max_attempts: int = 4,
        timeouts: Timeouts = Timeouts(connect_s=5, sock_read_s=30, total_s=30, probe_s=5),
    ) -> RewardClient:
        return RewardClient(
            str(stub_http.make_url("")),
            session=stub_http.session,
            timeouts=timeouts,
            concurrency=Concurrency(max_groups_in_flight=max_groups_in_flight, groups_per_request=groups_per_request),
            retry=Retry(max_attempts=max_attempts, base_delay_s=0.25, max_delay_s=2.0, jitter=0.0),
            sleep=sleeps,
        )

    return build


# --- a real listening server in a background thread (for CLI / evaluate-in-a-loop tests) ---


class ThreadedServer:
    """Serve an aiohttp app on 127.0.0.1 (a free port) from its own thread and event loop.

    ``make_app`` is called inside that loop. ``url`` is the base URL once started; ``app``
    the running application.
    """

    def __init__(self, make_app) -> None:
        self._make_app = make_app
        self.url: str | None = None
        self.app = None
        self._loop = None
        self._runner = None
        self._thread = None

    def __enter__(self) -> "ThreadedServer":
        import asyncio
        import threading

        from aiohttp import web

        started = threading.Event()
        failure: list[BaseException] = []

        async def setup() -> None:
            self.app = self._make_app()
            self._runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            host, port = self._runner.addresses[0][:2]
            self.url = f"http://{host}:{port}"

        def main() -> None:
            self._loop = asyncio.new_event_loop()
            try:
                self._loop.run_until_complete(setup())
            except BaseException as exc:  # reported to the test thread
                failure.append(exc)
                started.set()
                return
            started.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._runner.cleanup())
            self._loop.close()

        self._thread = threading.Thread(target=main, name="test-server", daemon=True)
        self._thread.start()
        started.wait(30)
        if failure:
            raise failure[0]
        return self

    def __exit__(self, *exc_info) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)


def load_server_fakes():
    """``tests/server/fakes.py`` (FakeEngine, FakeRenderer), loaded by path; None if absent."""
    path = REPO / "tests" / "server" / "fakes.py"
    name = "rmserve_tests_server_fakes"
    if name in sys.modules:
        return sys.modules[name]
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def write_rmbench_data(path: Path, *, n_chat: int = 6, n_code: int = 4) -> Path:
    """A small RM-Bench JSONL file (records carry ``domain``).

    chat: every chosen response is longer than every rejected one; code: every chosen one is
    shorter. With a reward that grows with length, every chat comparison is won and every
    code comparison lost.
    """
    import orjson

    rows = []
    for i in range(n_chat):
        rows.append({"id": i, "domain": "chat", "prompt": f"chat {i}",
                     "chosen": ["c" * (100 + k) for k in range(3)], "rejected": ["r" * (10 + k) for k in range(3)]})
    for i in range(n_code):
        rows.append({"id": i, "domain": "code", "prompt": f"code {i}",
                     "chosen": ["c" * (10 + k) for k in range(3)], "rejected": ["r" * (100 + k) for k in range(3)]})
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


@pytest.fixture
def small_rmbench(tmp_path) -> Path:
    return write_rmbench_data(tmp_path / "rmbench_small.jsonl")


BIG_MAX_MODEL_LEN = 1_000_000
"""max_model_len of the fake model in end-to-end tests: the fake tokenizer is per character."""


@pytest.fixture
def scoring_server():
    """Start the server's real app (``create_app`` over ``FakeEngine``/``FakeRenderer`` from
    ``tests/server/fakes.py``) in a thread; yields ``(url, count_scored_groups)``.

    Falls back to the wire stub when the server package or its fakes are not there.
    """
    engines = []

    def make_app():
        fakes = load_server_fakes()
        try:
            from rmserve.server.app import ServerConfig, create_app
        except ImportError:
            fakes = None
        if fakes is None:
            app = wire_stub.make_stub_app()
            engines.append(app[wire_stub.STATE_KEY])
            return app
        from rmserve.schema import ModelInfo

        model = ModelInfo(
            name="fake-rm", max_model_len=BIG_MAX_MODEL_LEN, dtype="float32", fingerprint="fp-fake-1", engine="fake"
        )
        engine = fakes.FakeEngine(model=model)
        engines.append(engine)
        return create_app(ServerConfig(port=0), engine, fakes.FakeRenderer(max_model_len=BIG_MAX_MODEL_LEN))

    def scored_groups() -> int:
        engine = engines[0]
        return len(engine.calls) if hasattr(engine, "calls") else engine.groups_received

    with ThreadedServer(make_app) as server:
        yield server.url, scored_groups


@pytest.fixture
def rmbench_dir() -> Path:
    """The RM-Bench release files in the shared data folder."""
    return RMBENCH_DIR.resolve()
