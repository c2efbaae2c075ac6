"""GPU usage: ``gpulab report`` from a notebook — GPU-hours allocated against computing, idle GPUs, quota.

The report itself is :mod:`gpulab.usage`'s, imported when a report is made.
"""

from __future__ import annotations

import time
from typing import Any

from .lesson import current
from .plots import show_figure
from .wait import wait_for

__all__ = ["UsageReport", "usage_report", "wait_usage_sample"]


class UsageReport:
    """:func:`usage_report`'s result: shows as ``gpulab report``'s table; ``plot_*`` draw its pictures."""

    def __init__(self, report: Any):
        self.report = report

    def __repr__(self) -> str:
        return self.report.text()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.report.text())

    def namespace(self, name: str) -> Any:
        """The :class:`gpulab.usage.report.Usage` row of one namespace (None if it held no GPU)."""
        return next((u for u in self.report.namespaces if u.name == name), None)

    def plot_utilization(self, title: str | None = None, show: bool = True) -> Any:
        from ..usage import plots as usage_plots

        return show_figure(usage_plots.utilization_figure(self.report, title or "GPU utilisation over time"), show)

    def plot_allocation(self, title: str | None = None, show: bool = True) -> Any:
        from ..usage import plots as usage_plots

        return show_figure(usage_plots.allocation_figure(self.report, title or "GPU allocation per node/GPU"), show)


def usage_report(since: str | None = None, namespace: str | None = None) -> UsageReport:
    """``gpulab report`` from a notebook: GPU-hours allocated vs computing, idle GPUs, quota, preemptions.

    ``since`` is a duration (``"15m"``); by default the report covers the time since the lesson's ``setup()``.
    """
    from .. import usage

    lab = current()
    seconds = usage.parse_since(since) if since else max(1.0, time.time() - lab.started)
    return UsageReport(usage.collect(lab.cluster.root, lab.kube, since=seconds, namespace=namespace))


def wait_usage_sample(timeout: float = 20) -> None:
    """Wait for the monitoring stack's next usage sample, so a report includes what is running now."""
    from ..usage import samples

    store = samples.Store(samples.store_path(current().cluster.root))
    since = time.time()
    wait_for(lambda: store.read(since=since), timeout, what="下一次 GPU 用量采样（custom-metrics-adapter 每 5 秒一次）")
