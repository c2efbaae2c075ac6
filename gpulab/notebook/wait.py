"""Waiting: poll until the cluster says so, or fail the cell with what was waited for (zh-CN)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import _poll

__all__ = ["wait_for"]


def wait_for(fn: Callable[[], Any], timeout: float = 60, interval: float = 0.25, what: str = "条件满足") -> Any:
    """Call ``fn`` until it returns something truthy and return that; raise ``TimeoutError`` after ``timeout`` s."""
    return _poll.until(fn, timeout, lambda _: TimeoutError(f"等了 {timeout:g} 秒仍未等到：{what}"), interval)
