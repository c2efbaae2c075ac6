"""GPU usage over time: samples recorded by the monitoring stack, reports and pictures from them."""

from __future__ import annotations

import time
from pathlib import Path

from ..kube import api
from .report import Report, build
from .samples import Store, store_path

__all__ = ["Report", "collect", "parse_since"]


def parse_since(text: str) -> float:
    """``30s``, ``10m``, ``2h``, ``1d`` -> seconds; errors say what is allowed."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    raw = str(text).strip()
    number, unit = raw[:-1], raw[-1:].lower()
    if unit.isdigit():
        number, unit = raw, "s"
    try:
        seconds = float(number) * units[unit]
    except (KeyError, ValueError):
        raise ValueError(f"--since {text!r}: expected a duration like 90s, 15m, 2h or 1d") from None
    if seconds <= 0:
        raise ValueError(f"--since {text!r}: must be longer than 0")
    return seconds


def collect(cluster_dir: Path, client: api.Client, since: float | None = None,
            namespace: str | None = None) -> Report:
    """The report of the last ``since`` seconds (all recorded history when None)."""
    now = time.time()
    snaps = Store(store_path(cluster_dir)).read(since=None if since is None else now - since)
    quotas = client.list("ResourceQuota", namespace)
    events = client.list("Event", namespace, field_selector="reason=Preempted")
    pods = client.list("Pod", namespace)
    return build(snaps, quotas=quotas, events=events, pods=pods, namespace=namespace, now=now)
