"""The server's engine processes never outlive it: a reaper kills its process group when it dies.

vLLM runs its engine core and workers in child processes of the server. A server that exits
normally stops them first; one killed with SIGKILL (the kernel's OOM killer, Ray killing a
replica actor's children, ``kill -9``) leaves them running, holding accelerator and host memory,
and a replica restarted on the same node then finds its GPU taken. So a server that leads its
own process group (as ``rmserve run`` and a Ray replica start it) starts a small reaper
process in that group. The reaper polls its parent; once the parent is gone it SIGKILLs the
whole group: the engine's processes and itself.

A server that does not lead its process group (started by a shell script without job control,
say, where the group is the script's) starts no reaper: killing that group would kill the
caller too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

POLL_S = 0.5
"""How often the reaper checks that its parent is still there, seconds."""


def start_group_reaper() -> subprocess.Popen[bytes] | None:
    """Start the reaper for this process's group, when this process leads the group.

    Returns:
        The reaper process, or None (this process does not lead its group, or not on POSIX).
    """
    if not hasattr(os, "getpgrp") or os.getpgrp() != os.getpid():
        return None
    return subprocess.Popen(
        [sys.executable, "-m", "rmserve.server.http.group_reaper", str(os.getpid())],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True,
    )


def main(argv: list[str]) -> None:
    """Wait until the process ``argv[0]`` (the server) is no longer this process's parent, then
    SIGKILL this process group."""
    parent = int(argv[0])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the server; it stops the engine itself
    while os.getppid() == parent:
        time.sleep(POLL_S)
    os.killpg(os.getpgrp(), signal.SIGKILL)


if __name__ == "__main__":
    main(sys.argv[1:])
