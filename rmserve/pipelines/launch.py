"""``rmserve run MODEL``: start a scoring server in a child process, evaluate, stop it.

The child is ``python -m rmserve.cli serve MODEL --host 127.0.0.1 --port P …`` on a free
loopback port, in its own process group (so the engine's worker processes stop with it), with
stdout and stderr appended to ``OUT/server.log``. :class:`ServerProcess` waits until its
``/health`` answers 200 — failing early, with the log's last lines, if the child exits — and
always stops it: SIGTERM to the group, then SIGKILL after a grace period, on success, error,
Ctrl-C or SIGTERM alike. If the launcher itself dies without cleaning up (SIGKILL), the child
still stops: on Linux it gets SIGTERM from the kernel (a parent-death signal), and the server
watches the launcher's pid itself (``rmserve serve --parent-pid``).

While it waits, a status line on stderr says so (``starting server for NAME (log:
OUT/server.log)… 35 s``, then ``… ready after 212 s``); ``quiet`` silences it.

Before starting anything, :func:`run` computes the fingerprint the server would report for a
local checkpoint folder (:func:`local_fingerprint`); when ``OUT/scores.jsonl`` already holds
every selected group under it, the figures come from that file and no server is started.
With a score store (``EvalConfig.store``) and a local checkpoint folder, :func:`run` first
hashes the folder (:func:`~rmserve.client.score_store.checkpoint_signature`); when the store
remembers the fingerprint a server reported for it and holds every group of the data under
that fingerprint, no server is started: the run is answered from the store. After a run that
started a server, the store remembers the folder's fingerprint.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

import msgspec

from rmserve.client.client import RewardClient
from rmserve.client.config import Timeouts
from rmserve.pipelines.evaluate import (
    EvalConfig,
    EvalResult,
    evaluate,
    evaluate_from_file,
    evaluate_from_store,
)
from rmserve.client.score_store import ScoreStore, checkpoint_signature
from rmserve.pipelines.progress import StatusLine, duration_text

from rmserve import errors
from rmserve.schema import CLASSIFIER_KIND, DPO_KIND, JUDGE_KIND, LENGTH_KIND, ModelInfo, RewardHead

if TYPE_CHECKING:
    from rmserve.server.config import EngineConfig

SERVER_LOG_FILENAME = "server.log"
"""Name of the child server's log inside the output folder."""

LOG_TAIL_LINES = 30
"""Lines of the server log quoted in an error."""


def free_port(host: str) -> int:
    """A TCP port on ``host`` that was free a moment ago (bind port 0, read it, release)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (:func:`free_port`)."""
    return free_port("127.0.0.1")


ENGINE_FAILED_PREFIX = "engine failed to start: "
"""What ``rmserve serve`` writes before the reason when its engine could not start (``server/http/serve.py``)."""

_RMSERVE_WARNING = re.compile(r"^\S+ \S+ WARNING rmserve[\w.]*: (.*)$", re.MULTILINE)
"""A warning line of rmserve's own loggers in a server log (``server/http/serve.py``'s format)."""


def log_tail_lines(path: Path, lines: int = LOG_TAIL_LINES) -> tuple[str, ...]:
    """The last ``lines`` lines of a log file, each without its line end (() when it does not
    exist). Only the file's last 64 KiB are read."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read()
    except FileNotFoundError:
        return ()
    return tuple(data.decode("utf-8", "replace").splitlines()[-lines:])


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file joined by newlines ('' when it does not exist)."""
    return "\n".join(log_tail_lines(path, lines))


PR_SET_PDEATHSIG = 1
"""``prctl`` option: the signal a process receives when the thread that created it exits (Linux)."""


def parent_death_signal(sig: signal.Signals = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child receive ``sig`` when this process dies, or None.

    Linux only (``prctl(PR_SET_PDEATHSIG)`` through ctypes), and only from the main thread:
    the kernel sends the signal when the *thread* that forked the child exits, so a child
    forked by a worker thread would be stopped when that thread ends. Elsewhere None (no
    ``preexec_fn``); a server started with ``--parent-pid`` still watches its parent itself.
    If this process is already gone by the time the child is set up, the child stops itself.
    """
    import threading

    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: no imports after fork
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), sig)

    return preexec


@dataclass(frozen=True)
class ServeOptions:
    """How ``rmserve run`` starts its server.

    The engine options are one mapping of :class:`~rmserve.server.config.EngineConfig` field
    names to values (a field left out keeps the ``rmserve serve`` default); the command line
    is derived from the same declaration as ``rmserve serve``'s options
    (:func:`rmserve.cli_common.engine_argv`).

    Raises:
        ValueError: from ``__post_init__``: an empty model, an unknown engine option or a bad
            value (the ``EngineConfig`` message, naming the field and the limit), a model
            (or ``ref_model``) that ``rmserve serve`` would refuse before loading it — a
            path-like string that does not exist, or a folder whose files break the kind's
            rules (no ``config.json``, no weights, …; the message serve gives,
            :func:`rmserve.cli_common.check_model_sources`) —, a non-positive
            ``startup_timeout_s``, a negative ``stop_grace_s``, an empty ``serve_command``.
    """

    model: str
    """Model path or hub id, passed to ``rmserve serve``."""

    engine_options: Mapping[str, object] = field(default_factory=dict)
    """``EngineConfig`` field → value, e.g. ``{"dtype": "float32", "max_model_len": 4096}``."""

    extra_args: tuple[str, ...] = ()
    """More ``rmserve serve`` arguments, passed as given."""

    startup_timeout_s: float = 1800.0
    """How long the model may take to load before the run fails, seconds. Default 1800; > 0."""

    stop_grace_s: float = 30.0
    """Seconds between SIGTERM and SIGKILL when stopping the server. Default 30; ≥ 0."""

    watch_parent: bool = True
    """Pass ``--parent-pid`` (this process) so the server shuts itself down if this process dies."""

    serve_command: tuple[str, ...] = field(default_factory=lambda: (sys.executable, "-m", "rmserve.cli", "serve"))
    """The command that starts a server; the model and options are appended."""

    def __post_init__(self) -> None:
        from rmserve.cli_common import check_model_sources, engine_argv

        if not self.model:
            raise ValueError("model must be a path or hub id, got an empty string")
        engine_argv(self.engine_options)  # unknown names, non-boolean switches
        config = self.engine_config()  # every value within its limits
        check_model_sources(config)  # the checks rmserve serve makes, before any server starts
        object.__setattr__(self, "engine_options", MappingProxyType(dict(self.engine_options)))
        if not self.startup_timeout_s > 0:
            raise ValueError(f"startup_timeout_s must be > 0, got {self.startup_timeout_s!r}")
        if not self.stop_grace_s >= 0:
            raise ValueError(f"stop_grace_s must be ≥ 0, got {self.stop_grace_s!r}")
        if not self.serve_command:
            raise ValueError("serve_command must name a program")

    def engine_config(self) -> EngineConfig:
        """The :class:`~rmserve.server.config.EngineConfig` of the server's model and engine options."""
        from rmserve.server.config import EngineConfig

        return EngineConfig(model=self.model, **self.engine_options)

    def argv(self, host: str, port: int) -> list[str]:
        """The child's command line for a server on ``host:port``: the serve command, the model,
        ``--host``/``--port``, the engine options (declaration order), ``--parent-pid`` (when
        ``watch_parent``), then ``extra_args``."""
        from rmserve.cli_common import engine_argv

        argv = [*self.serve_command, self.model, "--host", host, "--port", str(port), *engine_argv(self.engine_options)]
        if self.watch_parent:
            argv += ["--parent-pid", str(os.getpid())]
        return argv + list(self.extra_args)


@dataclass(frozen=True)
class RunConfig:
    """Settings of ``rmserve run``: the server to start and the evaluation to run on it.

    ``evaluation.server_url`` must be None: the launcher fills in the child's URL.
    """

    serve: ServeOptions
    evaluation: EvalConfig

    def __post_init__(self) -> None:
        if self.evaluation.server_url is not None:
            raise ValueError("evaluation.server_url must be None: rmserve run starts its own server")


class ServerProcess:
    """A ``rmserve serve`` child process, as a context manager that always stops it.

    Args:
        argv: the command line.
        url: the base URL it will listen on.
        log_path: where its stdout and stderr are appended.
        startup_timeout_s: longest wait for ``/health`` 200 in :meth:`wait_ready`.
        stop_grace_s: seconds between SIGTERM and SIGKILL in :meth:`stop`.
        poll_interval_s: pause between health checks.
        name: what the status line calls the model (default: the log's folder name).
        quiet: no status line on stderr while waiting.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        url: str,
        log_path: Path,
        startup_timeout_s: float,
        stop_grace_s: float,
        poll_interval_s: float = 0.25,
        name: str | None = None,
        quiet: bool = False,
    ) -> None:
        self.argv = list(argv)
        self.name = name or Path(log_path).parent.name
        self.quiet = quiet
        self._log_start = 0
        self.ready_after_s: float | None = None
        """Seconds :meth:`wait_ready` waited until ``/health`` answered 200 (None before)."""
        self.url = url
        self.log_path = Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self.poll_interval_s = poll_interval_s
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        """Spawn the child in a new process group, output appended to the log file.

        On Linux, when called from the main thread, the child gets SIGTERM if this process
        dies, even by SIGKILL (:func:`parent_death_signal`).
        """
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== rmserve: {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(self.argv)}\n".encode())
            log.flush()
            self._log_start = log.tell()
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=parent_death_signal(),
            )

    @property
    def returncode(self) -> int | None:
        """The child's exit status, or None while it runs (or before it started)."""
        return None if self.process is None else self.process.poll()

    def _log_quote(self) -> tuple[str, tuple[str, ...]]:
        """What an error says of the log, and the log's last lines (quoted below the message,
        one per line: :attr:`rmserve.errors.RMServeError.quoted`)."""
        lines = log_tail_lines(self.log_path)
        if not lines:
            return f"{self.log_path} is empty", ()
        return f"last lines of {self.log_path}:", lines

    def _exited_error(self, when: str) -> errors.ServerFault:
        said, lines = self._log_quote()
        if self.returncode == errors.SERVE_REFUSED_EXIT and when == "before it was ready":
            reason = self._refusal()
            if reason is not None:  # the engine's own refusal: its reason, not the traceback above it
                return errors.StartRefused(
                    f"the server refused to start: {reason} (the whole log: {self.log_path})"
                )
            return errors.StartRefused(
                f"the server refused to start (exit status {self.returncode}: the model, an option or the port "
                f"was refused); {said}",
                quoted=lines,
            )
        return errors.ServerFault(f"the server exited with status {self.returncode} {when}; {said}", quoted=lines)

    def wait_ready(self) -> None:
        """Block until ``GET /health`` answers 200.

        The server was started here, so a refused connection is expected while it starts
        (it listens only once it has begun loading): it is waited for as long as the child
        is alive. Meanwhile a status line on stderr (:class:`~rmserve.pipelines.progress.StatusLine`,
        unless ``quiet``) says ``starting server for NAME (log: OUT/server.log)… 35 s``,
        rewritten in place on a terminal and repeated every 15 s elsewhere, and ends with
        ``… ready after 212 s`` (also kept in :attr:`ready_after_s`).

        Raises:
            rmserve.errors.StartRefused: the child exited first with status 2 (it refused the
                model or an option; quotes the log's last lines).
            rmserve.errors.ServerFault: the child exited first otherwise (quotes the log's last lines).
            rmserve.errors.EngineNotReady: not ready after ``startup_timeout_s`` (quotes the
                log's last lines; the child is left for :meth:`stop`).
        """
        asyncio.run(self._wait_ready())

    async def _wait_ready(self) -> None:
        started = time.monotonic()
        deadline = started + self.startup_timeout_s
        status = StatusLine(quiet=self.quiet)
        what = f"starting server for {self.name} (log: {self.log_path})…"
        probe = Timeouts(connect_s=2.0, sock_read_s=5.0, total_s=5.0, probe_s=5.0)
        try:
            async with RewardClient(self.url, timeouts=probe) as client:
                while True:
                    if self.returncode is not None:
                        raise self._exited_error("before it was ready")
                    try:
                        await client.health()
                        break
                    except errors.RMServeError as exc:
                        if not exc.retryable:
                            raise
                        state = "engine loading" if isinstance(exc, errors.EngineNotReady) else "not listening yet"
                    elapsed_s = time.monotonic() - started
                    if elapsed_s >= self.startup_timeout_s:
                        said, lines = self._log_quote()
                        raise errors.EngineNotReady(
                            f"the server at {self.url} was not ready after {self.startup_timeout_s:g} s; {said}",
                            quoted=lines,
                        )
                    status.show(f"{what} {duration_text(elapsed_s)} ({state})", kind=state)
                    await asyncio.sleep(min(self.poll_interval_s, max(0.0, deadline - time.monotonic())))
        except BaseException:
            status.end()
            raise
        self.ready_after_s = time.monotonic() - started
        status.finish(f"{what} ready after {duration_text(self.ready_after_s)}", always=True)
        for message in self.start_warnings():
            print(f"server warning: {message}", file=sys.stderr, flush=True)

    def _refusal(self) -> str | None:
        """The reason of the last ``engine failed to start: REASON`` line ``serve`` wrote in this
        start's part of the log, or None."""
        for line in reversed(self._start_log().splitlines()):
            if line.startswith(ENGINE_FAILED_PREFIX):
                return line[len(ENGINE_FAILED_PREFIX):].strip() or None
        return None

    def _start_log(self) -> str:
        """This start's part of the log (from its header on; its first MiB), '' when unreadable."""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self._log_start)
                return fh.read(1 << 20).decode("utf-8", "replace")
        except OSError:
            return ""

    def start_warnings(self) -> list[str]:
        """The messages of the warnings rmserve's own loggers wrote to this start's part of the
        log (``… WARNING rmserve.server: MESSAGE``: remote code run, a route that will refuse
        every request, …); :meth:`wait_ready` prints them on stderr once the server is ready,
        so a user of ``run`` or ``eval`` sees them without opening the log. Other libraries'
        warnings stay in the log only."""
        return [m.group(1) for m in _RMSERVE_WARNING.finditer(self._start_log())]

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)

    def stop(self) -> int | None:
        """Stop the child: SIGTERM to it, then SIGKILL to its process group after the grace period.

        The SIGTERM goes to the server process alone, as ``docker stop`` does: the server then
        shuts its engine down in order. Sent to the whole group, it also reaches vLLM's
        engine-core and worker processes, which die before the server has stopped them (the log
        then ends in an ``EngineDeadError`` traceback and a ``resource_tracker`` warning about
        leaked shared memory). Whatever is left in the group once the child has exited, or after
        the grace period, is SIGKILLed.

        Idempotent. Returns the child's exit status (None if it never started).
        """
        if self.process is None:
            return None
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=self.stop_grace_s)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.process.wait()
        # Workers the server left behind in its group go too.
        self._signal_group(signal.SIGKILL)
        return self.process.returncode


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """While active, SIGTERM raises SystemExit(143) so cleanup (stopping the child) runs.

    A SIGTERM handler already in force (the CLI's, :func:`rmserve.cli_common.sigterm_exits`,
    which also stops the child and says what was kept) is left as it is."""
    import threading

    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _folder_signature(
    path: str, dtype: str, head: RewardHead | None = None, chat_template_override: str | None = None
) -> str | None:
    """:func:`checkpoint_signature` of a local folder read with ``head`` and rendered with the
    template of digest ``chat_template_override`` (None: its own), or None (a hub id, or it
    cannot be hashed)."""
    if not Path(path).is_dir():
        return None
    try:
        return checkpoint_signature(path, dtype, head=head, chat_template_override=chat_template_override)
    except (errors.RMServeError, OSError, ValueError):
        return None


def config_context_limit(model: str) -> int | None:
    """The context limit a server gives the checkpoint folder ``model`` without
    ``--max-model-len``, as its ``config.json`` declares it (``max_position_embeddings``, or that
    of its ``text_config``), in tokens; None when the file or the field is missing. vLLM may
    allow more (rope scaling): it is a lower bound, so a stored group over a smaller limit is
    scored again and one stored under the server's own default stays answered."""
    import json

    try:
        config = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for section in (config, config.get("text_config") if isinstance(config, dict) else None):
        value = section.get("max_position_embeddings") if isinstance(section, dict) else None
        if isinstance(value, int) and value > 0:
            return value
    return None


def server_context_limit(serve: ServeOptions) -> int | None:
    """The context limit, in tokens, of a server started with ``serve``: ``--max-model-len``,
    else :func:`config_context_limit` of the model; None when neither is known."""
    given = serve.engine_options.get("max_model_len")
    return int(given) if given is not None else config_context_limit(serve.model)


def store_signature(config: RunConfig) -> str | None:
    """The checkpoint signature ``run`` keys the score store with, or None when it cannot.

    None when the run has no store, the model is not a local folder (a hub id) or is judged
    behind ``--judge-url``, ``--chat-template`` is passed in ``extra_args`` or its file cannot be
    read, or the folder cannot be hashed (the server will report why). The signature covers the
    dtype the server will compute in (``--dtype``, else its ``auto`` rule) and the template
    given with ``--chat-template`` (its digest, as the server reports it:
    ``ModelInfo.chat_template_override``), so it equals the key ``rmserve sweep`` files the same
    checkpoint under on such servers.

    For ``--kind judge`` it is :func:`rmserve.fingerprint.judge_fingerprint` of the folder's
    signature and the judge settings. For ``--kind dpo`` it is
    :func:`rmserve.fingerprint.dpo_fingerprint` of the policy's and
    (with ``--ref-model``) the reference's folder signatures, the reward mode and ``--compat``,
    so it never equals a classifier's signature nor that of another mode, reference or compat;
    for a classifier it covers the reward head the server would read (``--head``,
    ``--label-index``, ``--label-weights``, ``--head-token-id``: :func:`_local_head`), so a run
    under other head options never takes another run's stored scores;
    None also when the reference is not a local folder, or when the engine options do not
    make a valid DPO setting (the server will report why).
    """
    if config.evaluation.store is None:
        return None
    return store_key(config.serve)


def store_key(serve: ServeOptions, *, cuda_available: bool | None = None) -> str | None:
    """The key the score store files ``serve.model`` under when a server started with ``serve``
    scores it (:func:`store_signature`, which says what it covers and when it is None), the
    dtype rule's CUDA question answered by ``cuda_available`` (None: by torch here; replicas
    on a Ray cluster answer it with their GPUs).
    """
    from rmserve.fingerprint import chat_template_digest, dpo_fingerprint
    from rmserve.server.config import resolve_dtype

    options = serve.engine_options
    if "--chat-template" in serve.extra_args:
        return None
    if not Path(serve.model).is_dir() or options.get("judge_url") is not None:
        return None  # a hub id or a judge behind an endpoint: nothing to hash (and no need to ask torch)
    try:
        dtype = resolve_dtype(str(options.get("dtype") or "auto"), cuda_available)  # the server's rule
    except ImportError:
        return None
    override = None
    if options.get("chat_template") is not None:
        try:
            override = chat_template_digest(Path(str(options["chat_template"])).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            return None  # the server will say why it cannot read it
    kind = options.get("kind") or CLASSIFIER_KIND
    if kind == CLASSIFIER_KIND:
        try:  # the head options change the rewards: a memo made under other ones is not this run's
            head = _local_head(serve)
        except (errors.RMServeError, OSError, ValueError):
            return None  # the server will say what is wrong with them
        return _folder_signature(serve.model, dtype, head, override)
    policy = _folder_signature(serve.model, dtype, chat_template_override=override)
    if policy is None:
        return policy
    if kind == LENGTH_KIND:
        return None  # the server hashes the tokenizer alone (rmserve.fingerprint.length_fingerprint)
    if kind == JUDGE_KIND:
        return _judge_fingerprint(policy, options)
    ref_model, ref_free = options.get("ref_model"), options.get("ref_free")
    if (ref_model is None) == (ref_free is None):
        return None
    reference = _folder_signature(str(ref_model), dtype) if ref_model is not None else None
    if ref_model is not None and reference is None:
        return None
    mode = "reference" if ref_model is not None else str(ref_free)
    return dpo_fingerprint(policy, reference, mode, str(options.get("compat") or "none"))


def _judge_fingerprint(model: str, options: Mapping[str, object]) -> str:
    """:func:`rmserve.fingerprint.judge_fingerprint` of ``model`` (a fingerprint or folder
    signature) with the judge settings among the engine ``options`` (their defaults otherwise)."""
    from rmserve.fingerprint import judge_fingerprint

    def option(name: str, default: object) -> object:
        value = options.get(name)
        return default if value is None else value

    return judge_fingerprint(
        model,
        protocol=str(option("protocol", "auto")),
        max_tokens=int(option("judge_max_tokens", 2048)),
        seed=int(option("judge_seed", 0)),
        compat=str(option("compat", "none")),
        system_prompt=bool(option("judge_system_prompt", True)),
        thinking=None if options.get("judge_thinking") is None else str(options["judge_thinking"]),
    )


def _tokenizer_chat_template(folder: Path) -> str | None:
    """The chat template a tokenizer loaded from ``folder`` carries, read from its files as
    transformers reads them: ``chat_template.jinja``, else ``chat_template.json``'s
    ``chat_template``, else ``tokenizer_config.json``'s (a list of named templates gives the
    one named ``default``). None when there is none or a file cannot be read."""
    import json

    jinja = folder / "chat_template.jinja"
    try:
        if jinja.is_file():
            return jinja.read_text(encoding="utf-8")
        template = None
        for name in ("chat_template.json", "tokenizer_config.json"):
            file = folder / name
            if file.is_file():
                template = json.loads(file.read_text(encoding="utf-8")).get("chat_template")
                if template is not None:
                    break
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _local_head(serve: ServeOptions) -> RewardHead | None:
    """The head a classifier server started with ``serve`` would serve (its head options;
    :func:`rmserve.server.config.check_reward_head` on the folder's ``config.json``), None for
    the other kinds. Raises what the check raises (the caller gives up the shortcut)."""
    from rmserve.server.config import check_reward_head

    config = serve.engine_config()
    return check_reward_head(config.model, config.head_settings) if config.kind == CLASSIFIER_KIND else None


def local_fingerprint(serve: ServeOptions) -> str | None:
    """The fingerprint a server started with ``serve`` would report, computed here without
    loading the model, or None when it cannot be.

    :func:`rmserve.fingerprint.model_fingerprint` of the checkpoint folder with the chat
    template the server would use (``--chat-template``'s file, else the tokenizer's, read by
    :func:`_tokenizer_chat_template`) and the dtype it would compute in (``--dtype``, else its
    ``auto`` rule, :func:`rmserve.server.config.resolve_dtype`). For ``--kind judge`` that
    fingerprint with the judge settings (:func:`rmserve.fingerprint.judge_fingerprint`, as the
    server binds them). For ``--kind dpo`` the
    policy's and the reference's fingerprints (same template and dtype) go through
    :func:`rmserve.fingerprint.dpo_fingerprint` with the reward mode and compat mode.

    None when the model (or the DPO reference) is not a local folder (a hub id would need
    the hub) or a judge runs behind ``--judge-url``, ``--chat-template`` is passed in ``extra_args``, no template can be read, torch
    is needed for ``auto`` and missing, or hashing fails (the server will say why). A value
    that differs from the server's only costs the shortcut: :func:`run` starts the server.
    """
    from rmserve.fingerprint import dpo_fingerprint, model_fingerprint
    from rmserve.server.config import resolve_dtype

    options = serve.engine_options
    folder = Path(serve.model)
    if "--chat-template" in serve.extra_args or not folder.is_dir() or options.get("judge_url") is not None:
        return None
    if options.get("kind") == LENGTH_KIND:
        return None
    try:
        dtype = resolve_dtype(str(options.get("dtype") or "auto"))
    except ImportError:
        return None
    override = options.get("chat_template")
    try:
        template = Path(str(override)).read_text(encoding="utf-8") if override is not None else _tokenizer_chat_template(folder)
    except OSError:
        return None
    if template is None:
        return None
    try:
        policy = model_fingerprint(folder, template, dtype, _local_head(serve))
        if options.get("kind") == JUDGE_KIND:
            return _judge_fingerprint(policy, options)
        if options.get("kind", CLASSIFIER_KIND) != DPO_KIND:
            return policy
        ref_model = options.get("ref_model")
        reference = None
        if ref_model is not None:
            if not Path(str(ref_model)).is_dir():
                return None
            reference = model_fingerprint(str(ref_model), template, dtype)
        mode = "reference" if ref_model is not None else str(options.get("ref_free"))
        return dpo_fingerprint(policy, reference, mode, str(options.get("compat") or "none"))
    except (errors.RMServeError, OSError, ValueError):
        return None


def _local_model_info(serve: ServeOptions, fingerprint: str, name: str) -> ModelInfo:
    """The :class:`ModelInfo` reported for a run answered from its score file: the name the
    records carry, the local fingerprint, the dtype and engine the server would use, and the
    context limit ``--max-model-len`` sets (else ``max_position_embeddings`` of ``config.json``,
    the limit vLLM derives by default: :func:`config_context_limit`; 0 when neither is known)."""
    from rmserve.server.config import resolve_dtype

    options = serve.engine_options
    return ModelInfo(
        name=name,
        max_model_len=server_context_limit(serve) or 0,
        dtype=resolve_dtype(str(options.get("dtype") or "auto")),
        fingerprint=fingerprint,
        engine=str(options.get("engine") or "vllm"),
        kind=str(options.get("kind") or CLASSIFIER_KIND),
        **_local_judge_fields(options),
    )


def _local_judge_fields(options: Mapping[str, object]) -> dict[str, object]:
    """For ``--kind judge``, the :class:`ModelInfo` fields a judge server reports from its
    options (``mode`` = the protocol choice, ``compat``, ``judge_max_tokens``, ``judge_seed``,
    ``judge_thinking`` when set); empty for other kinds."""
    if options.get("kind") != JUDGE_KIND:
        return {}
    fields: dict[str, object] = {
        "mode": str(options.get("protocol") or "auto"),
        "compat": str(options.get("compat") or "none"),
        "judge_max_tokens": int(options.get("judge_max_tokens") or 2048),
        "judge_seed": int(options.get("judge_seed") or 0),
    }
    if options.get("judge_thinking") is not None:
        fields["judge_thinking"] = str(options["judge_thinking"])
    return fields


def run(config: RunConfig) -> EvalResult:
    """Start a server for ``config.serve.model``, evaluate on it, and stop it.

    The server's output goes to ``OUT/server.log``. The evaluation is
    :func:`rmserve.pipelines.evaluate.evaluate` with the child's URL, so the score file and the
    score store resume as in ``rmserve eval`` (both kept by
    :class:`~rmserve.client.score_log.ScoreLog`). ``run`` itself touches the score store only
    for the checkpoint → fingerprint memo: with a local checkpoint folder whose fingerprint the
    store remembers (:func:`store_signature`), a run whose every group is stored starts no
    server (:func:`~rmserve.pipelines.evaluate.evaluate_from_store`; note "answered from the
    store, no server started"); after a run that started one, the store remembers the folder's
    fingerprint.

    Without a store, when the score file ``OUT/scores.jsonl`` already holds every selected
    group under the fingerprint the server would report (:func:`local_fingerprint`, computed
    here from the checkpoint folder), no server is started either: the figures are computed
    from the file (note "scores.jsonl already holds every group …, no server started").

    Raises:
        rmserve.errors.ServerFault: the server exited before it was ready or during the
            evaluation (the message quotes the log's last lines).
        rmserve.errors.EngineNotReady: the server was not ready within ``startup_timeout_s``.
        The errors of :func:`~rmserve.pipelines.evaluate.evaluate`.
    """
    from rmserve.datasets import load_benchmark

    # Bad data fails here, in a second, not after the model has loaded.
    load_benchmark(config.evaluation.bench, config.evaluation.data, config.evaluation.only)
    signature = store_signature(config)
    if signature is not None:
        assert config.evaluation.store is not None
        with ScoreStore(config.evaluation.store) as store:
            info = store.model_info_for(signature)
        if info is not None:
            # The limit this run's server would have: a stored group with a response over a
            # shorter one is scored after all (the server is started for it).
            max_model_len = server_context_limit(config.serve)
            if max_model_len is not None:
                info = msgspec.structs.replace(info, max_model_len=max_model_len)
            stored = evaluate_from_store(config.evaluation, info)
            if stored is not None:
                note = f"answered from the store, no server started (checkpoint {signature} = fingerprint {info.fingerprint})"
                return replace(stored, notes=(*stored.notes, note))
    fingerprint = local_fingerprint(config.serve)
    if fingerprint is not None:
        done = evaluate_from_file(config.evaluation, fingerprint, lambda name: _local_model_info(config.serve, fingerprint, name))
        if done is not None:
            note = (
                f"{done.scores_path} already holds every group for this checkpoint (fingerprint {fingerprint}): "
                "no server started"
            )
            return replace(done, notes=(*done.notes, note))
    out_dir = config.evaluation.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    host = "127.0.0.1"
    port = free_loopback_port()
    url = f"http://{host}:{port}"
    server = ServerProcess(
        config.serve.argv(host, port),
        url=url,
        log_path=out_dir / SERVER_LOG_FILENAME,
        startup_timeout_s=config.serve.startup_timeout_s,
        stop_grace_s=config.serve.stop_grace_s,
        name=Path(config.serve.model).name or config.serve.model,
        quiet=config.evaluation.quiet,
    )
    with _sigterm_raises(), server:
        server.wait_ready()
        try:
            result = evaluate(replace(config.evaluation, server_url=url))
        except errors.RMServeError as exc:
            if server.returncode is not None:
                raise server._exited_error("during the evaluation") from exc
            raise
    # Remember the folder only if it is still the one hashed before the server loaded it.
    if signature is not None and store_signature(config) == signature:
        assert config.evaluation.store is not None
        with ScoreStore(config.evaluation.store) as store:
            store.remember_checkpoint(
                signature,
                path=str(Path(config.serve.model).resolve()),
                fingerprint=result.model.fingerprint,
                model=result.model.name,
                info=result.model,
            )
    return result
