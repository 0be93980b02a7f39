"""Status and progress lines on stderr while a run waits or scores.

Both writers are silent with ``quiet`` and look at the stream when they write (so a test
runner that swaps ``sys.stderr`` gets the text):

- :class:`StatusLine`: one line about a wait (a server starting, ``/health`` not ready).
  On a terminal it is rewritten in place (carriage return, erase to end of line) at most
  every ``refresh_s``, fitted to the terminal's width (one line, cut with ``…``: a line
  that wrapped could not be rewritten in place and would leave a trail of copies); elsewhere (a log file, CI) it is written as a full line when the wait
  starts, when its kind changes and every ``repeat_s`` after, so a log shows the wait going on.
- :class:`ProgressLine`: scoring progress without a terminal, ``scoring: 120/798 groups,
  3.2 groups/s, ETA 3 min 31 s`` every ``interval_s`` and once at the end; on a terminal
  :class:`EngineBar`, a tqdm bar with the same figures (``scoring:  15%|█▌   | 120/798 [3.2
  groups/s, ETA 3 min 31 s]``).

Both count rates and ETAs over the engine's work only (:class:`EngineRate`): groups answered
from the server's result cache (``cached``, set by the pipeline) and resumed groups are left out
of groups/s, and the ETA comes from the groups the engine scored since its first one.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from tqdm.std import tqdm

STATUS_REPEAT_S = 15.0
"""Seconds between repeats of an unchanged status line when stderr is not a terminal."""

PROGRESS_INTERVAL_S = 5.0
"""Seconds between progress lines when stderr is not a terminal."""

_ERASE_TO_END = "\x1b[K"


def duration_text(seconds: float) -> str:
    """``45 s``, ``3 min 31 s``, ``2 h 05 min`` (rounded to whole seconds)."""
    total = max(0, round(seconds))
    if total < 60:
        return f"{total} s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class _Writer:
    def __init__(self, *, quiet: bool, stream: TextIO | None, tty: bool | None, clock: Callable[[], float]) -> None:
        self.quiet = quiet
        self._stream = stream
        self._tty = tty
        self.clock = clock

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    @property
    def tty(self) -> bool:
        if self._tty is not None:
            return self._tty
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def columns(self) -> int:
        """The stream's terminal width in columns (``COLUMNS`` when set, else the terminal's
        size, else 80)."""
        env = os.environ.get("COLUMNS", "")
        if env.isdigit() and int(env) > 0:
            return int(env)
        try:
            return os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, OSError, ValueError):
            return shutil.get_terminal_size((80, 24)).columns


def fit_line(text: str, columns: int) -> str:
    """``text`` as one line of at most ``columns - 1`` characters (the last column is left free:
    some terminals wrap when it is written): runs of whitespace (newlines of a quoted reply)
    become one space, and a longer line is cut with ``…``."""
    line = " ".join(text.split())
    room = max(columns - 1, 1)
    return line if len(line) <= room else line[: room - 1] + "…"


class StatusLine(_Writer):
    """One status line about a wait, on stderr (see the module docstring).

    Args:
        quiet: write nothing.
        stream: where to write; None = ``sys.stderr`` at the time of writing.
        tty: whether ``stream`` is a terminal; None = ask the stream.
        repeat_s: seconds between repeats of the line off a terminal. Default 15; > 0.
        refresh_s: shortest pause between rewrites on a terminal. Default 1; ≥ 0.
        clock: seconds, monotonic (a test seam).

    Raises:
        ValueError: ``repeat_s`` not > 0 or ``refresh_s`` < 0.
    """

    def __init__(
        self,
        *,
        quiet: bool = False,
        stream: TextIO | None = None,
        tty: bool | None = None,
        repeat_s: float = STATUS_REPEAT_S,
        refresh_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not repeat_s > 0:
            raise ValueError(f"repeat_s must be > 0, got {repeat_s!r}")
        if not refresh_s >= 0:
            raise ValueError(f"refresh_s must be ≥ 0, got {refresh_s!r}")
        super().__init__(quiet=quiet, stream=stream, tty=tty, clock=clock)
        self.repeat_s = repeat_s
        self.refresh_s = refresh_s
        self._last_write: float | None = None
        self._kind: str | None = None
        self.shown = False
        """Whether any line was written."""

    def show(self, text: str, *, kind: str = "") -> None:
        """Show ``text`` as the current status. ``kind`` names the state (e.g. ``refused``,
        ``loading``): a change of kind is written at once, otherwise the text is written when
        the refresh (terminal) or repeat (elsewhere) interval has passed."""
        if self.quiet:
            return
        now = self.clock()
        interval = self.refresh_s if self.tty else self.repeat_s
        due = self._last_write is None or kind != self._kind or now - self._last_write >= interval
        if not due:
            return
        self._last_write, self._kind, self.shown = now, kind, True
        self._write(f"\r{fit_line(text, self.columns())}{_ERASE_TO_END}" if self.tty else f"{text}\n")

    def finish(self, text: str, *, always: bool = False) -> None:
        """End the status with ``text`` (a full line). Written only when a status was shown,
        or ``always``."""
        if self.quiet or not (self.shown or always):
            return
        self._write(f"\r{text}{_ERASE_TO_END}\n" if self.tty else f"{text}\n")
        self.shown = True

    def end(self) -> None:
        """End the line on a terminal, leaving the last status visible (before an error
        message); off a terminal nothing. Idempotent."""
        if not self.quiet and self.shown and self.tty and self._last_write is not None:
            self._write("\n")
            self._last_write = None


class EngineRate:
    """Groups per second and an ETA over the groups the engine scored.

    Of the ``n`` groups done, ``initial`` were done before (resumed) and :attr:`cached` came
    from the server's result cache; the rest, the engine's, are what the figures count:

    - groups/s: the engine's groups over the seconds since this object was made;
    - ETA: the groups left over the engine's rate since its first group (the wait for that one —
      a cold engine, a checkpoint load — says nothing about the rest; groups from the cache,
      answered at once, say nothing either), "ETA unknown" until the engine has scored two;
      ``done in D`` once ``n`` reaches ``total``; a run whose groups all came from before or
      from the cache ends on ``none by the engine, done in D`` (no rate of ``0.0 groups/s``).

    Args:
        total: groups of the run.
        initial: groups done before the run.
        clock: seconds, monotonic (a test seam).
    """

    def __init__(self, total: int, initial: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total
        self.initial = initial
        self.clock = clock
        self.started = clock()
        self.cached = 0
        """Groups answered from the server's result cache (set by the pipeline before each update)."""
        self._first: tuple[float, int] | None = None  # (time, engine groups) when the engine's first group came

    def engine_groups(self, n: int) -> int:
        """Of ``n`` groups done, those the engine scored in this run (never below 0)."""
        return max(n - self.initial - self.cached, 0)

    def seen(self, n: int) -> None:
        """Note that ``n`` groups are done now (call on every update, after :attr:`cached` is set)."""
        if self._first is None and self.engine_groups(n) > 0:
            self._first = (self.clock(), self.engine_groups(n))

    def text(self, n: int) -> str:
        """``3.2 groups/s, ETA 3 min 31 s`` (or ``ETA unknown``, ``done in 50 s``) for ``n`` done."""
        now = self.clock()
        elapsed_s = now - self.started
        engine = self.engine_groups(n)
        rate = engine / elapsed_s if elapsed_s > 0 else 0.0
        if n >= self.total:
            if engine == 0:  # every group resumed or answered from the cache: no rate to speak of
                return f"none by the engine, done in {duration_text(elapsed_s)}"
            eta = f"done in {duration_text(elapsed_s)}"
        elif self._first is not None and engine > self._first[1] and now > self._first[0]:
            since_first = (engine - self._first[1]) / (now - self._first[0])
            eta = f"ETA {duration_text((self.total - n) / since_first)}"
        else:
            eta = "ETA unknown"
        return f"{rate:.1f} groups/s, {eta}"


class _EngineCounted:
    """What a line or bar counting through :class:`EngineRate` (its ``engine``) shares."""

    engine: EngineRate

    @property
    def cached(self) -> int:
        """Groups answered from the server's result cache (set by the pipeline)."""
        return self.engine.cached

    @cached.setter
    def cached(self, groups: int) -> None:
        self.engine.cached = groups


class ProgressLine(_EngineCounted, _Writer):
    """Scoring progress as plain lines, for stderr that is not a terminal.

    ``scoring: 120/798 groups, 3.2 groups/s, ETA 3 min 31 s`` (plus :meth:`set_postfix_str`'s
    text) every ``interval_s`` seconds and once on :meth:`close`. Rate and ETA are
    :class:`EngineRate`'s: the groups the engine scored (``initial`` resumed groups and the
    :attr:`cached` ones answered from the server's result cache are not counted). The method
    names follow tqdm's, so a pipeline can use either this or :class:`EngineBar`.

    Args:
        total: groups of the run.
        initial: groups already done when scoring starts.
        label: the line's first word.
        quiet: write nothing.
        stream, clock: as :class:`StatusLine`.
        interval_s: seconds between lines. Default 5; > 0.

    Raises:
        ValueError: ``interval_s`` not > 0.
    """

    def __init__(
        self,
        total: int,
        initial: int = 0,
        *,
        label: str = "scoring",
        quiet: bool = False,
        stream: TextIO | None = None,
        interval_s: float = PROGRESS_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        super().__init__(quiet=quiet, stream=stream, tty=False, clock=clock)
        self.total = total
        self.initial = initial
        self.n = initial
        self.label = label
        self.interval_s = interval_s
        self.postfix = ""
        self.engine = EngineRate(total, initial, clock)
        self._last_write = self.engine.started
        self._written_n: int | None = None
        self._closed = False

    def text(self) -> str:
        """The current line (without newline)."""
        extra = f", {self.postfix}" if self.postfix else ""
        return f"{self.label}: {self.n}/{self.total} groups, {self.engine.text(self.n)}{extra}"

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        """Text appended to the line (e.g. tokens/s)."""
        self.postfix = text

    def update(self, n: int = 1) -> None:
        """Count ``n`` more groups done; write a line when ``interval_s`` has passed."""
        self.n += n
        self.engine.seen(self.n)
        now = self.clock()
        if now - self._last_write >= self.interval_s:
            self._emit(now)

    def close(self) -> None:
        """Write the last line (when anything was done since the last one); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.n != self.initial and self._written_n != self.n:
            self._emit(self.clock())

    def _emit(self, now: float) -> None:
        self._last_write = now
        self._written_n = self.n
        if not self.quiet:
            self._write(self.text() + "\n")


ENGINE_BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{engine}{postfix}]"
"""The bar's layout: tqdm's bar and counts, then :class:`EngineRate`'s figures in place of tqdm's
own rate and ETA (which would count groups from the result cache), then the postfix."""


class EngineBar(_EngineCounted, tqdm):
    """A tqdm bar whose rate and ETA are :class:`EngineRate`'s (for stderr on a terminal).

    ``scoring:  15%|█▌        | 120/798 [3.2 groups/s, ETA 3 min 31 s, 1,234 tok/s]``: tqdm's
    own rate and remaining time would count the groups answered from the server's result
    cache (hundreds per second, no engine work) and the wait for the first group; this bar
    shows the figures :class:`ProgressLine` writes off a terminal. The pipeline sets
    :attr:`cached` before each :meth:`update`.

    Args:
        total, initial, label, quiet: as :class:`ProgressLine`.
        stream: where the bar is drawn (None: ``sys.stderr`` now).
        clock: seconds, monotonic, for the rate and ETA (a test seam).
        **kwargs: more tqdm arguments (``ncols``…).
    """

    def __init__(
        self,
        total: int,
        initial: int = 0,
        *,
        label: str = "scoring",
        quiet: bool = False,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        **kwargs: Any,
    ) -> None:
        self.engine = EngineRate(total, initial, clock)
        kwargs.setdefault("dynamic_ncols", True)
        super().__init__(
            total=total, initial=initial, unit="group", desc=label, disable=quiet,
            file=stream if stream is not None else sys.stderr, bar_format=ENGINE_BAR_FORMAT, **kwargs,
        )

    def update(self, n: float | None = 1) -> bool | None:
        """Count ``n`` more groups done (noted for the ETA before tqdm redraws)."""
        self.engine.seen(self.n + int(n or 0))
        return super().update(n)

    @property
    def format_dict(self) -> dict[str, Any]:
        """tqdm's fields for :data:`ENGINE_BAR_FORMAT`, with ``engine``: :meth:`EngineRate.text`."""
        fields = super().format_dict
        fields["engine"] = self.engine.text(self.n)  # also once closed (tqdm then sets disable)
        return fields
