"""GPU usage: ``gpulab report`` from a notebook — GPU-hours allocated against computing, idle GPUs, quota.

The report itself is :mod:`gpulab.usage`'s, imported when a report is made.
"""

from __future__ import annotations

import functools
import html
import time
from typing import Any

from .lesson import current
from .plots import show_figure
from .table import Table
from .wait import wait_for

__all__ = ["UsageReport", "usage_report", "wait_usage_sample"]


@functools.lru_cache(maxsize=1)
def _labels() -> Any:
    """The usage pictures' words, in the chapter's terms (gpulab.usage is imported only when a report is made)."""
    from ..usage.plots import Labels

    return Labels(utilization="GPU 利用率随时间变化", allocation="每张卡被谁占着（颜色越深，算得越多）",
                  minutes="分钟", percent="利用率 %", free="空闲", shared="共享：")


class UsageReport:
    """:func:`usage_report`'s result: ``gpulab report``'s numbers in Chinese tables; ``plot_*`` draw its pictures.

    ``report`` is the :class:`gpulab.usage.report.Report` itself (``report.text()`` is the CLI's English text).
    """

    def __init__(self, report: Any):
        self.report = report

    def _parts(self) -> tuple[str, list[Table], list[str]]:
        from ..usage.report import table_rows

        r = self.report
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.start))
        head = f"GPU 用量：自 {when} 起 {max(0.0, r.end - r.start) / 60:.1f} 分钟，{r.samples} 次采样"
        tables = []
        for key, rows, quota, title in (("NAMESPACE", r.namespaces, True, "按命名空间"),
                                         ("NODE", r.nodes, False, "按节点")):
            columns, body = table_rows(key, rows, with_quota=quota)
            tables.append(Table(body, columns, title=title))
        t = r.total
        notes = [] if r.samples else ["还没有用量采样：custom-metrics-adapter 每隔几秒记录一次"
                                      "（kubectl -n custom-metrics get pods）。"]
        notes.append(f"合计：分配 {t.allocated_h:.3f} GPU 小时，其中计算 {t.computing_h:.3f}，"
                     f"持有却闲置 {t.idle_h:.3f}；当前持有的 {t.gpus_now:g} 张 GPU 中 {t.idle_now:g} 张闲置。")
        notes += [f"抢占：{p.namespace}/{p.pod}（在 {p.node or '?'} 上）被 {p.by or '?'} 抢占，{p.at}"
                  for p in r.preemptions]
        return head, tables, notes

    def __repr__(self) -> str:
        head, tables, notes = self._parts()
        return "\n\n".join([head, *map(str, tables), "\n".join(notes)])

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))

    def _repr_html_(self) -> str:
        head, tables, notes = self._parts()
        return "".join([f"<p><b>{html.escape(head)}</b></p>", *(t._repr_html_() for t in tables),
                        *(f"<p>{html.escape(n)}</p>" for n in notes)])

    def namespace(self, name: str) -> Any:
        """The :class:`gpulab.usage.report.Usage` row of one namespace (None if it held no GPU)."""
        return next((u for u in self.report.namespaces if u.name == name), None)

    def plot_utilization(self, title: str | None = None, show: bool = True) -> Any:
        from ..usage import plots as usage_plots

        return show_figure(usage_plots.utilization_figure(self.report, title, _labels()), show)

    def plot_allocation(self, title: str | None = None, show: bool = True) -> Any:
        from ..usage import plots as usage_plots

        return show_figure(usage_plots.allocation_figure(self.report, title, _labels()), show)


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
