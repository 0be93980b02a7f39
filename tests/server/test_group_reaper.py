"""The server's group reaper (``server/http/group_reaper.py``): a server killed with SIGKILL
leaves no engine process behind; a server that does not lead its group starts no reaper."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

LEADER = """
import subprocess, sys, time
from rmserve.server.http.group_reaper import start_group_reaper
reaper = start_group_reaper()
engine = subprocess.Popen(["sleep", "300"])  # stands for vLLM's engine core
print(reaper.pid if reaper else 0, engine.pid, flush=True)
time.sleep(300)
"""


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _start(new_session: bool) -> tuple[subprocess.Popen, int, int]:
    leader = subprocess.Popen([sys.executable, "-c", LEADER], stdout=subprocess.PIPE, text=True,
                              start_new_session=new_session)
    reaper, engine = (int(x) for x in leader.stdout.readline().split())
    return leader, reaper, engine


@pytest.mark.skipif(not hasattr(os, "getpgrp"), reason="POSIX process groups")
def test_a_killed_group_leader_s_engine_processes_are_killed_too():
    leader, reaper, engine = _start(new_session=True)
    try:
        assert reaper > 0
        time.sleep(0.3)
        assert not _gone(engine, 0.1)  # the reaper leaves a live server alone
        os.kill(leader.pid, signal.SIGKILL)
        leader.wait()
        assert _gone(engine, 5.0), "the engine process outlived its server"
        assert _gone(reaper, 5.0)
    finally:
        leader.stdout.close()
        for pid in (engine, reaper):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_no_reaper_where_the_server_does_not_lead_its_group():
    leader, reaper, engine = _start(new_session=False)  # in pytest's own group
    try:
        assert reaper == 0
    finally:
        leader.kill()
        leader.wait()
        leader.stdout.close()
        os.kill(engine, signal.SIGKILL)
