"""Shared test fixtures: the shared-data path, a tiny demo reward model, one real vLLM engine.

- :func:`~testkit.shared_data.shared_data_dir` locates ``../shared/data``
  next to the repository (read-only benchmark files; never copied into the repo) and fails,
  naming the path, when it is missing. ``shared_data`` is its fixture form.
- ``demo_model_dir`` (session): a random-weight demo reward model built once per session from
  the RM-Bench files (about 15 s; no download); ``demo_policy_dir`` / ``demo_reference_dir``
  the same shape as causal LMs, ``demo_multi_label_dir`` with three labels, ``demo_gated_dir`` a
  gated multi-objective model with its own modeling code. Every test that uses it is marked ``model``
  (it needs torch, transformers and tokenizers), so the fast lane
  ``-m "not slow and not model"`` runs on the base install plus ``[test]``.
- ``no_blocking_calls`` (autouse in ``tests/server/``, fast tests only): blockbuster raises
  :class:`blockbuster.BlockingError` when server code blocks the event loop (file, socket,
  sleep, lock or sqlite calls made on the loop thread).
- ``vllm_engine`` (session, slow): one started :class:`~rmserve.server.engines.vllm_engine.VLLMEngine` over
  the demo model (25–60 s to start on 2 CPU cores). It lives on the session event loop: tests
  that use it must run there, e.g. ``pytestmark = pytest.mark.asyncio(loop_scope="session")``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from rmserve.client.client import RewardClient
from rmserve.client.config import Concurrency, Retry, Timeouts
from testkit import fakes, wire_stub
from testkit.shared_data import shared_data_dir
from testkit.servers import BIG_MAX_MODEL_LEN, SleepRecorder, ThreadedServer, make_groups, write_rmbench_data

from rmserve.schema import ModelInfo

DEMO_MAX_MODEL_LEN = 4096
"""Max length of the test engines: the longest RM-Bench sequence (4 shared domains) is 2,507
tokens with the demo tokenizer, so every real group fits without truncation."""

VLLM_TEST_BLOCK_SIZE = 32
"""KV-cache block size of the test engine: vLLM's CPU attention needs a multiple of 32."""

VLLM_TEST_KV_CACHE_BYTES = 1 << 30
"""KV-cache size of the test engine (1 GiB; the CPU default is 4 GiB)."""


MODEL_FIXTURES = frozenset({"demo_model_dir", "demo_policy_dir", "demo_reference_dir", "demo_multi_label_dir",
                            "demo_gated_dir"})
"""Fixtures that need the engine extras (building the demo model takes torch, transformers and
tokenizers): a test using one, directly or through another fixture, is marked ``model``."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``model`` every test that uses a fixture of :data:`MODEL_FIXTURES`."""
    for item in items:
        if MODEL_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Fixture form of :func:`shared_data_dir`."""
    return shared_data_dir()


@pytest.fixture(scope="session")
def rmbench_dir(shared_data: Path) -> Path:
    """The RM-Bench release files (four domains) under the shared data folder."""
    return shared_data / "rm-bench"


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory: pytest.TempPathFactory, rmbench_dir: Path) -> Path:
    """A default-shape demo reward model (seed 0, max length 4096) built once per session."""
    from rmserve.demo_model import DemoModelConfig, build_demo_model

    out = tmp_path_factory.mktemp("demo-model") / "model"
    build_demo_model(out, rmbench_dir, DemoModelConfig(seed=0, max_len=DEMO_MAX_MODEL_LEN))
    return out


@pytest.fixture(scope="session")
def demo_policy_dir(tmp_path_factory: pytest.TempPathFactory, rmbench_dir: Path) -> Path:
    """A demo causal LM (seed 1): the DPO policy of the tests; same tokenizer as the demo RM."""
    from rmserve.demo_model import DemoModelConfig, build_demo_model

    out = tmp_path_factory.mktemp("demo-policy") / "policy"
    build_demo_model(out, rmbench_dir, DemoModelConfig(seed=1, max_len=DEMO_MAX_MODEL_LEN, kind="causal"))
    return out


@pytest.fixture(scope="session")
def demo_reference_dir(tmp_path_factory: pytest.TempPathFactory, rmbench_dir: Path) -> Path:
    """A demo causal LM (seed 2): the DPO reference of the tests."""
    from rmserve.demo_model import DemoModelConfig, build_demo_model

    out = tmp_path_factory.mktemp("demo-reference") / "reference"
    build_demo_model(out, rmbench_dir, DemoModelConfig(seed=2, max_len=DEMO_MAX_MODEL_LEN, kind="causal"))
    return out


@pytest.fixture(scope="session")
def family_replica(tmp_path_factory: pytest.TempPathFactory, rmbench_dir: Path):
    """``build(family, kind="reward", seed=0)`` → the folder of that family's demo replica
    (``rmserve demo-model --family``; max length 4096), each built once per session."""
    from rmserve.demo_model import DemoModelConfig, build_demo_model

    built: dict[tuple[str, str, int], Path] = {}

    def build(family: str, kind: str = "reward", seed: int = 0) -> Path:
        key = (family, kind, seed)
        if key not in built:
            out = tmp_path_factory.mktemp(f"family-{family}-{kind}-{seed}") / "model"
            build_demo_model(out, rmbench_dir, DemoModelConfig(family=family, kind=kind, seed=seed,
                                                               max_len=DEMO_MAX_MODEL_LEN))
            built[key] = out
        return built[key]

    return build


DEMO_NUM_LABELS = 3
"""Labels of the multi-label demo reward model (``demo_multi_label_dir``)."""


@pytest.fixture(scope="session")
def demo_multi_label_dir(tmp_path_factory: pytest.TempPathFactory, rmbench_dir: Path) -> Path:
    """A demo reward model with :data:`DEMO_NUM_LABELS` labels (seed 3), built once per session:
    the replica of the multi-label head (same tokenizer and template as the demo RM)."""
    from rmserve.demo_model import DemoModelConfig, build_demo_model

    out = tmp_path_factory.mktemp("demo-multi-label") / "multi-label"
    build_demo_model(out, rmbench_dir, DemoModelConfig(seed=3, max_len=DEMO_MAX_MODEL_LEN, num_labels=DEMO_NUM_LABELS))
    return out


DEMO_OBJECTIVES = 4
"""Objectives of the gated demo reward model (``demo_gated_dir``)."""


@pytest.fixture(scope="session")
def demo_gated_dir(tmp_path_factory: pytest.TempPathFactory, rmbench_dir: Path) -> Path:
    """A gated multi-objective demo reward model (seed 4, :data:`DEMO_OBJECTIVES` objectives)
    that ships its own modeling code (``auto_map``), built once per session: the replica of the
    remote-code head (ArmoRM's shape; same tokenizer and template as the demo RM)."""
    from rmserve.demo_model import DemoModelConfig, build_demo_model

    out = tmp_path_factory.mktemp("demo-gated") / "gated"
    build_demo_model(out, rmbench_dir, DemoModelConfig(seed=4, max_len=DEMO_MAX_MODEL_LEN, kind="gated",
                                                       objectives=DEMO_OBJECTIVES))
    return out


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def vllm_engine(demo_model_dir: Path):
    """One started vLLM engine over the demo model: float32, eager, prefix cache on.

    Shared by the whole session (engine start is the expensive part); shut down at the end.
    """
    from rmserve.server.config import EngineConfig
    from rmserve.server.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine(
        EngineConfig(
            model=str(demo_model_dir),
            engine="vllm",
            dtype="float32",
            max_model_len=DEMO_MAX_MODEL_LEN,
            block_size=VLLM_TEST_BLOCK_SIZE,
            kv_cache_memory_bytes=VLLM_TEST_KV_CACHE_BYTES,
            enforce_eager=True,
        )
    )
    await engine.start()
    try:
        yield engine
    finally:
        await engine.shutdown()


# --- a blocking-call detector on the in-process server tests ---

SERVER_TESTS = Path(__file__).resolve().parent / "server"


@pytest.fixture(autouse=True)
def no_blocking_calls(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a ``tests/server/`` test when the server blocks its event loop.

    Active for the fast server tests, which run the real app in-process over the fakes (the
    slow ones, over real engines, are not checked). Only calls made with a loop running in the calling thread and with a frame
    of the server stage (``rmserve.server``) on the stack count: a test body computing an
    expected fingerprint, or pytest's own file work, is not flagged; the ground called by the
    server is. An engine coroutine that the server starts as a task of its own (one per group)
    has no server frame below it, so blocking inside an engine is not seen here.
    """
    if request.node.get_closest_marker("slow") or SERVER_TESTS not in request.node.path.parents:
        yield
        return
    from blockbuster import blockbuster_ctx

    with blockbuster_ctx("rmserve.server") as detector:
        # Config validation checks that checkpoint roots are folders. A server builds its
        # config once, before the loop starts; tests build it inside async test bodies.
        for module in ("server/http/app.py", "server/config.py"):
            detector.functions["os.stat"].can_block_in(module, "__post_init__")
        for function in detector.functions.values():
            # A module's first import (the server imports some lazily, e.g. prometheus_client
            # in create_app) reads its files once; never again on a request path.
            function.can_block_in("<frozen importlib._bootstrap>", "_find_and_load")
            # One stat and resolve of the loaded checkpoint folder when an engine reports what
            # it loaded (start, reload, restart), before the model serves.
            function.can_block_in("server/engines/protocol.py", "local_checkpoint")
            # Checkpoint swaps (admin only, rare) resolve the requested folder and read its
            # small config and tokenizer files on the loop before draining.
            function.can_block_in("server/swaps/swap.py", {"resolve_checkpoint", "plan_swap"})
            # The fake engines read a checkpoint's config inline where a real engine loads
            # weights in a worker thread; that read belongs to the fake, not to the server.
            function.can_block_in("testkit/fakes.py", {"reload_weights", "restart"})
            function.can_block_in("server/test_swap.py", "failing_reload")
        yield


# --- clients, stubs and in-thread servers (client, pipeline and end-to-end tests) ---


@pytest.fixture(name="make_groups")
def make_groups_fixture():
    """:func:`testkit.servers.make_groups` as a fixture."""
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
        max_retry_after_s: float = 60.0,
    ) -> RewardClient:
        return RewardClient(
            str(stub_http.make_url("")),
            session=stub_http.session,
            timeouts=timeouts,
            concurrency=Concurrency(max_groups_in_flight=max_groups_in_flight, groups_per_request=groups_per_request),
            retry=Retry(max_attempts=max_attempts, base_delay_s=0.25, max_delay_s=2.0, jitter=0.0,
                        max_retry_after_s=max_retry_after_s),
            sleep=sleeps,
        )

    return build


@pytest.fixture
def small_rmbench(tmp_path) -> Path:
    return write_rmbench_data(tmp_path / "rmbench_small.jsonl")


@pytest.fixture
def scoring_server():
    """The server's real app (``create_app`` over :class:`testkit.fakes.FakeEngine` and
    :class:`~testkit.fakes.FakeRenderer`) listening in a thread; yields ``(url, count_scored_groups)``.
    """
    from rmserve.server.http.app import ServerConfig, create_app

    model = ModelInfo(name="fake-rm", max_model_len=BIG_MAX_MODEL_LEN, dtype="float32", fingerprint="fp-fake-1", engine="fake")
    engine = fakes.FakeEngine(model=model)

    def make_app():
        return create_app(ServerConfig(port=0), engine, fakes.FakeRenderer(max_model_len=BIG_MAX_MODEL_LEN))

    with ThreadedServer(make_app) as server:
        yield server.url, lambda: len(engine.calls)
