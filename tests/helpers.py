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
