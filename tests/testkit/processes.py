"""Process helpers for tests that start child processes (Linux: they read ``/proc``)."""

from __future__ import annotations

import time
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
