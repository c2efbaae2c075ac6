"""GPU usage over time, from Prometheus (the monitoring add-on): reports and pictures.

:func:`collect` asks the add-on's Prometheus (:mod:`.prometheus`) the queries of :mod:`.report` over a
window and the API for the scheduler's preemptions; :mod:`.plots` draws what it got.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..i18n import _
from ..kube import api
from . import prometheus, report
from .prometheus import PrometheusError, PrometheusUnavailable
from .report import Preemption, Report

__all__ = ["PrometheusError", "PrometheusUnavailable", "Report", "collect", "parse_since", "preemptions"]


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
        raise ValueError(_("--since {text!r}: expected a duration like 90s, 15m, 2h or 1d", text=text)) from None
    if seconds <= 0:
        raise ValueError(_("--since {text!r}: must be longer than 0", text=text))
    return seconds


def preemptions(client: api.Client, namespace: str | None = None, since: float | None = None) -> list[Preemption]:
    """The pods kube-scheduler preempted (in ``namespace``; since ``since``, seconds since the epoch)."""
    events = client.list("Event", namespace, field_selector="reason=Preempted")
    return report.preemptions(events, client.list("Pod", namespace), since=since)


def collect(kubeconfig: Path | str, since: float, namespace: str | None = None, end: float | None = None) -> Report:
    """The report of the ``since`` seconds before ``end`` (now when None), for ``namespace`` alone when given.

    Raises :class:`PrometheusUnavailable` when there is no Prometheus to ask (its message says to run
    ``gpulab addon install monitoring``), :class:`PrometheusError` when a query fails, and
    :class:`gpulab.kube.api.ApiError` when the API does not answer.
    """
    prom = prometheus.connect(kubeconfig)
    try:
        end = time.time() if end is None else end
        window = max(1, round(since))
        step = report.step_for(window)
        start = end - window
        promql = report.queries(window, step)
        results = {name: prometheus.query(prom, name, promql[name], at=end) for name in report.INSTANT_QUERIES}
        # The pictures' steps fall where the subqueries' do: on the multiples of `step` in (start, end].
        last = int(end // step) * step
        first = min(last, (int(start // step) + 1) * step)
        results |= {name: prometheus.query_range(prom, name, promql[name], first, last, step)
                    for name in report.RANGE_QUERIES}
    finally:
        prom.close()
    preempted = preemptions(api.Client(kubeconfig), namespace, since=start)
    return report.build(results, start, end, step, queries=promql, preempted=preempted, namespace=namespace)

