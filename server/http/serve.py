"""Run the scoring server: build the engine and renderer, listen, load, serve, shut down.

Order: the HTTP listener starts first (``/health`` answers 503 ``loading``), the app's
``cleanup_ctx`` loads the engine in the background and then freezes the process's Python heap
(:mod:`rmserve.server.swaps.gc_heap`: :func:`serve` and :func:`serve_node` give every model
app the process's one heap), the URL is announced once the engine is ready, SIGHUP reads the
users file again (:func:`reload_users_file`), and SIGINT/SIGTERM stop the listener, cancel
in-flight requests after ``shutdown_timeout_s`` and shut the engine down.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import socket
import time
from collections.abc import Callable

from aiohttp import web
from rmserve.server.http.app import create_app
from rmserve.server.sharing.auth import USERS_KEY, UserRegistry, UsersFileError
from rmserve.server.config import EngineConfig, ServerConfig
from rmserve.server.kinds.base import RewardKind, kind_of_config
from rmserve.server.engines.protocol import JudgeEngine, LoadedModel, RewardEngine
from rmserve.server.render.chat import Renderer
from rmserve.server.swaps.gc_heap import GC_HEAP_KEY, GcHeap
from rmserve.server.swaps.state import STATE_KEY, EngineState, RendererFactory
from rmserve.server.sharing.users import RequestUserLogFilter

from rmserve.errors import SERVE_REFUSED_EXIT, RMServeError, ServerFault

logger = logging.getLogger("rmserve.server")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""Server log lines on stderr: local time with milliseconds, level, logger name, message."""


class _StderrHandler(logging.StreamHandler):
    """The handler :func:`configure_logging` installs (a class of its own, so a second call replaces it)."""


def configure_logging(level: str = "info") -> None:
    """Send log records to stderr as ``2026-11-30 12:00:00,123 INFO rmserve.server.swaps.swap: message``.

    rmserve's own loggers (``rmserve.*``) write at ``level`` and above; other libraries'
    loggers at WARNING and above. Calling it again replaces the handler and levels.

    Raises:
        ValueError: ``level`` is not debug, info, warning or error (any case).
    """
    number = logging.getLevelName(level.upper())
    if level.lower() not in ("debug", "info", "warning", "error") or not isinstance(number, int):
        raise ValueError(f"log level: {level!r} is not one of debug, info, warning, error")
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(handler)
    handler = _StderrHandler()  # sys.stderr as it is now
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.addFilter(RequestUserLogFilter())  # names the request's user in every line about it
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("rmserve").setLevel(number)


def engine_renderer(loaded: LoadedModel) -> Renderer:
    """Renderer factory that takes the renderer the engine built with its model.

    The real engines build, while loading, a :class:`~rmserve.server.render.chat.Renderer` with
    the model's tokenizer, the chat template in use and the resolved max length (only known
    once the engine is up) and return it in their :class:`LoadedModel`.

    Raises:
        ServerFault: the engine returned no renderer.
    """
    if loaded.renderer is None:
        raise ServerFault(f"the {loaded.info.engine} engine returned no renderer with its model")
    return loaded.renderer


def refused_at_start(error: BaseException | None) -> bool:
    """Whether an engine's start failure is a refusal of what it was given (status
    :data:`~rmserve.errors.SERVE_REFUSED_EXIT`): an rmserve error naming the option or input at
    fault (``field`` set: a chat template that refuses the judge's system turn, a head the
    engine cannot serve, …) or a ``ValueError`` of the settings; anything else (an engine that
    crashed, weights that would not load) is a failure (status 1)."""
    return isinstance(error, ValueError) or (isinstance(error, RMServeError) and error.field is not None)


def listening_socket(host: str, port: int, backlog: int = 128) -> socket.socket:
    """A TCP socket bound to ``host:port`` and listening (non-blocking), the first address
    ``host`` resolves to (``localhost``: the first of its addresses only).

    The server binds it before any engine starts: an engine opens sockets of its own on ports
    the OS picks (vLLM's processes talk over local ports), and one of them could otherwise take
    a free ``port`` between the check and the bind.

    Raises:
        OSError: the address does not resolve, or is in use (``EADDRINUSE``) or not ours.
    """
    family, kind, proto, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp's TCPSite does on Unix
        sock.bind(address)
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _bound_url(runner: web.AppRunner, config: ServerConfig) -> str:
    """The URL of the first listening socket (resolves port 0 to the port the OS chose)."""
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            host, port = str(address[0]), int(address[1])
            host = f"[{host}]" if ":" in host else host
            return f"http://{host}:{port}"
    return config.url


async def serve_app(
    server_config: ServerConfig,
    engine: RewardEngine | JudgeEngine,
    renderer: Renderer | None = None,
    *,
    renderer_factory: RendererFactory | None = None,
    kind: RewardKind | None = None,
    judge: object = None,
    announce: Callable[[str], None] = print,
    stop: asyncio.Event | None = None,
) -> int:
    """Serve ``engine`` over HTTP until ``stop`` is set or SIGINT/SIGTERM arrives.

    Args:
        server_config: host, port and limits.
        engine: a not yet started engine; the app starts and shuts it down.
        renderer, renderer_factory: the chat-template renderer for the engine's model, or a
            factory the app calls once the engine is loaded (see :func:`create_app`); neither
            for a judge engine.
        kind, judge: the served model's kind, or a judge engine's settings (see :func:`create_app`).
        announce: receives one-line status messages (listening, ready, stopping).
        stop: optional event that stops the server when set (tests); signals always do.

    Returns:
        0 after a clean shutdown (logged as ``server stopped cleanly after N s``), 1 when the
        engine failed to load, or had died or failed to shut down by the time the server
        stopped (logged as an error), 2 when the address could not be bound (e.g. the port is
        taken).
    """
    app = create_app(server_config, engine, renderer, renderer_factory=renderer_factory, kind=kind, judge=judge)
    return await run_app(app, server_config, [app[STATE_KEY]], announce=announce, stop=stop)


def warn_unused_admin_token(config: ServerConfig) -> None:
    """Log, once per server, that an admin token given beside a users file is not used (with a
    users file, checkpoint swaps need a user with the role admin)."""
    if config.users_file is not None and config.admin_token is not None:
        logger.warning("the admin token (--admin-token-file / RMSERVE_ADMIN_TOKEN) is not used with a users "
                       "file: checkpoint swaps need a user with the role admin (rmserve users add NAME --role admin)")


async def run_app(
    app: web.Application,
    server_config: ServerConfig,
    states: list[EngineState],
    *,
    announce: Callable[[str], None] = print,
    stop: asyncio.Event | None = None,
) -> int:
    """Serve ``app`` (one model's app, or a node app of several) until ``stop`` is set or
    SIGINT/SIGTERM arrives; ``states`` are the engines' states it waits on before announcing
    ready (every one settled, or the first failure). Logs :func:`warn_unused_admin_token` once.
    Returns as :func:`serve_app`."""
    warn_unused_admin_token(server_config)
    runner = web.AppRunner(
        app, handler_cancellation=True, shutdown_timeout=server_config.shutdown_timeout_s, access_log=None
    )
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    reloads: set[asyncio.Task] = set()
    registry = app.get(USERS_KEY)

    def reload_users() -> None:
        task = asyncio.create_task(reload_users_file(registry, server_config.users_file))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    handlers: list[tuple[signal.Signals, Callable[[], None]]] = [(signal.SIGINT, stop.set), (signal.SIGTERM, stop.set)]
    if registry is not None and server_config.users_file is not None:
        handlers.append((signal.SIGHUP, reload_users))
    for sig, handler in handlers:
        try:
            loop.add_signal_handler(sig, handler)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread / platform
            pass
    started = time.monotonic()
    clean = False  # set once a stop was asked for after a successful start

    def failed() -> EngineState | None:
        return next((s for s in states if s.status == "failed"), None)

    async def settled() -> None:  # every engine loaded, or one failed
        for state in states:
            await state.settled.wait()
            if state.status == "failed":
                return

    try:  # before the engines start (runner.setup runs the apps' start-up, which loads them)
        sock = listening_socket(server_config.host, server_config.port)
    except OSError as exc:
        announce(f"cannot listen on {server_config.url}: {exc.strerror or exc}")
        for sig in installed:
            loop.remove_signal_handler(sig)
        return 2
    await runner.setup()
    try:
        site = web.SockSite(runner, sock, shutdown_timeout=server_config.shutdown_timeout_s)
        await site.start()
        url = _bound_url(runner, server_config)
        what = "the model" if len(states) == 1 else f"{len(states)} models, one after another"
        announce(f"listening on {url} (loading {what}; /health answers 503 until ready)")
        settling = asyncio.create_task(settled())
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({settling, stopped}, return_when=asyncio.FIRST_COMPLETED)
        settling.cancel()
        if (bad := failed()) is not None:
            stopped.cancel()
            announce(f"engine failed to start: {bad.error}")
            return SERVE_REFUSED_EXIT if refused_at_start(bad.error) else 1
        if all(s.status == "ready" and s.info is not None for s in states):
            names = ", ".join(s.info.name for s in states if s.info is not None)
            announce(f"ready: {url} serving {names}")
        await stopped
        announce("stopping")
        clean = True
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        stopping = time.monotonic()
        await runner.cleanup()
        if clean and failed() is None:
            logger.info(
                "server stopped cleanly after %.1f s (shutdown took %.1f s)",
                time.monotonic() - started, time.monotonic() - stopping,
            )
        elif clean:
            logger.error("server stopped after %.1f s; the engine did not shut down cleanly (see above)",
                         time.monotonic() - started)
    return 0 if failed() is None else 1


async def reload_users_file(registry: UserRegistry, path: str) -> bool:
    """Read the users file again (SIGHUP): log who was added and removed, or why the file was
    refused (the users then stay as they were). Returns whether the new file is in use."""
    try:
        added, removed = await registry.reload(path)
    except UsersFileError as exc:
        logger.error("users file not reloaded, the previous users stay: %s", exc)
        return False
    logger.info("users file reloaded: %d users (added: %s; removed: %s)", len(registry.users),
                ", ".join(added) or "none", ", ".join(removed) or "none")
    return True


def _model_app(engine_config: EngineConfig, server_config: ServerConfig, heap: GcHeap) -> web.Application:
    """One model's scoring app, its engine built from ``engine_config`` (not started), the
    process's ``heap`` frozen after its load and unfrozen around its swaps
    (:mod:`rmserve.server.swaps.gc_heap`)."""
    from rmserve.server.engines.registry import build_engine

    engine = build_engine(engine_config)
    kind = kind_of_config(engine_config)
    factory = engine_renderer if kind.needs_renderer else None  # a judge's engine renders its own prompts
    app = create_app(server_config, engine, renderer_factory=factory, kind=kind)
    app[GC_HEAP_KEY] = heap
    return app


def serve_node(
    engine_configs: list[EngineConfig], server_config: ServerConfig, *, announce: Callable[[str], None] = print
) -> int:
    """Serve several models from one server (``--model NAME=PATH`` repeated): one engine and
    model app per config (:func:`rmserve.server.config.node_engine_configs`), behind one node
    app (:mod:`rmserve.server.http.node`). Returns as :func:`serve`.

    Raises:
        ValueError: ``engine_configs`` empty, or two with the same served name.
    """
    from rmserve.server.http.node import create_node_app, model_states

    async def main() -> int:
        heap = GcHeap()
        apps = [
            (config.name, _model_app(config, dataclasses.replace(server_config, served_model_name=config.name), heap))
            for config in engine_configs
        ]
        node = create_node_app(server_config, apps)
        try:
            return await run_app(node, server_config, model_states(node), announce=announce)
        finally:
            heap.thaw()

    return asyncio.run(main())


def serve(engine_config: EngineConfig, server_config: ServerConfig, *, announce: Callable[[str], None] = print) -> int:
    """Build the engine and renderer from ``engine_config`` and serve until SIGINT/SIGTERM.

    Returns:
        The process exit status: 0 after a clean shutdown, 1 when the engine failed to load
        or did not shut down cleanly, 2 when the address could not be bound.

    Raises:
        ValueError: ``engine_config.engine`` names no registered engine.
    """
    async def main() -> int:
        heap = GcHeap()
        app = _model_app(engine_config, server_config, heap)
        try:
            return await run_app(app, server_config, [app[STATE_KEY]], announce=announce)
        finally:
            heap.thaw()

    return asyncio.run(main())
