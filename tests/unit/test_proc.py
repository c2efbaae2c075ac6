"""Processes by identity (pid and start time)."""

from __future__ import annotations

import os
import subprocess
import sys

from gpulab import _proc


def test_a_running_process_is_alive_and_known_by_its_start():
    me = os.getpid()
    start = _proc.started(me)
    assert start is not None
    assert _proc.alive(me) and _proc.alive(me, start)
    assert not _proc.alive(me, start - 3600)  # a process with this pid that started an hour earlier is not us


def test_an_ended_or_unreaped_process_is_not_alive():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    while _proc.started(proc.pid) is not None:  # a zombie until reaped: not running
        pass
    assert not _proc.alive(proc.pid)
    proc.wait()
    assert not _proc.alive(proc.pid)
