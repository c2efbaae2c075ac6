"""Small helpers shared by the test suites."""

from __future__ import annotations

import time
from typing import Any, Callable

import pytest


def wait_for(fn: Callable[[], Any], timeout: float = 30, interval: float = 0.2, what: str = "condition") -> Any:
    """Poll ``fn`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} (last value: {last!r})")


def pod_ready(kube, ns: str, name: str) -> Any:
    """The pod, once its Ready condition is True (else a falsy value): a ``wait_for`` predicate."""
    p = kube.get("Pod", name, ns) or {}
    conds = {c["type"]: c["status"] for c in (p.get("status") or {}).get("conditions") or []}
    return conds.get("Ready") == "True" and p


def pod_finished(kube, ns: str, name: str) -> Any:
    """The pod, once it is Succeeded or Failed (else a falsy value): a ``wait_for`` predicate."""
    p = kube.get("Pod", name, ns) or {}
    return (p.get("status") or {}).get("phase") in ("Succeeded", "Failed") and p
