"""Processes known by identity: a pid and the moment it started.

A pid alone is reused by the kernel; a pid together with its start time names
one process for good. The node agent's container shims, the grading journal's
owner and the cluster's component records all ask the same two questions here.
"""

from __future__ import annotations

import psutil

# psutil's create_time is derived from clock ticks since boot: equal starts agree to well within this.
START_SLACK = 1.0


def started(pid: int) -> float | None:
    """When ``pid`` started (seconds since the epoch), or None if it is gone or a zombie."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:  # killed, not yet reaped by its parent
            return None
        return proc.create_time()
    except psutil.NoSuchProcess:
        return None
    except psutil.AccessDenied:  # can't tell when: another user's process that exists
        return float("nan")


def alive(pid: int, started_at: float | None = None) -> bool:
    """``pid`` runs (not a zombie) and, when ``started_at`` is given, is the process that started then."""
    when = started(pid)
    if when is None:
        return False
    if started_at is None or when != when:  # nan: exists, start unknown
        return True
    return abs(when - started_at) < START_SLACK
