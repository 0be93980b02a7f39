"""Process helpers for tests that start child processes (Linux: they read ``/proc``)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path


def exited(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie waiting for its new parent counts as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def wait_exited(pid: int, limit_s: float) -> bool:
    """Poll :func:`exited` every 50 ms for up to ``limit_s`` seconds; whether ``pid`` exited."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if exited(pid):
            return True
        time.sleep(0.05)
    return exited(pid)


@contextlib.contextmanager
def parent_killed(argv: Sequence[str]) -> Iterator[tuple[int, list[str]]]:
    """Run ``argv``, a parent process that starts a child and prints one line (the child's pid,
    then any other words); assert the child runs, SIGKILL the parent (no cleanup of its own
    runs) and assert it died of that signal; yield ``(child pid, the line's other words)``.

    On leaving, the parent is reaped and its pipe closed, and a child still running is SIGKILLed.
    """
    parent = subprocess.Popen(list(argv), stdout=subprocess.PIPE, text=True)
    child_pid = None
    try:
        first, *rest = parent.stdout.readline().split()
        child_pid = int(first)
        assert not exited(child_pid)
        parent.kill()
        assert parent.wait(timeout=30) == -signal.SIGKILL
        yield child_pid, rest
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()
        if child_pid is not None and not exited(child_pid):
            os.kill(child_pid, signal.SIGKILL)
