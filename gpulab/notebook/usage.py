"""GPU usage: ``gpulab report`` from a notebook — GPU-hours allocated against computing, idle GPUs, quota.

The numbers are PromQL over the monitoring add-on's Prometheus (:mod:`gpulab.usage`, imported when a
report is made): ``gpulab addon install monitoring`` first.
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

__all__ = ["UsageReport", "usage_report", "wait_scrape"]

#: What each of the report's queries adds up, in the chapter's terms (the keys are ``report.queries``').
QUERY_MEANINGS = {
    "gpus_now": "当前持有的 GPU（运行中的 Pod 申请的卡）",
    "allocated_h": "分配的 GPU 小时",
    "computing_h": "计算的 GPU 小时（利用率 × 时间）",
    "idle_h": "持有却闲置的 GPU 小时",
    "idle_now": "当前持有却闲置的 GPU",
    "quota": "配额 requests.nvidia.com/gpu",
    "gpu_nodes": "GPU 节点和型号",
    "scrapes": "Prometheus 抓取 DCGM Exporter 的次数",
    "utilization": "每张卡的利用率（画图用）",
    "holders": "每张卡被哪个命名空间持有（画图用）",
}


@functools.lru_cache(maxsize=1)
def _labels() -> Any:
    """The usage pictures' words, in the chapter's terms (gpulab.usage is imported only when a report is made)."""
    from ..usage.plots import Labels

    return Labels(utilization="GPU 利用率随时间变化", allocation="每张卡被谁占着（颜色越深，算得越多）",
                  minutes="分钟", percent="利用率 %", free="空闲", shared="在用，DCGM 不知是哪个 Pod（共享）")


class UsageReport:
    """:func:`usage_report`'s result: ``gpulab report``'s numbers in Chinese tables; ``plot_*`` draw its pictures,
    :meth:`queries` shows the PromQL behind them.

    ``report`` is the :class:`gpulab.usage.report.Report` itself (``report.text()`` is the CLI's text, in the
    language of the messages: Chinese in a lesson).
    """

    def __init__(self, report: Any):
        self.report = report

    def _parts(self) -> tuple[str, list[Table], list[str]]:
        from ..usage.report import table_rows

        r = self.report
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.start))
        head = (f"GPU 用量：自 {when} 起 {max(0.0, r.end - r.start) / 60:.1f} 分钟，来自 Prometheus"
                f"（每 {r.step:g} 秒一个点，其间抓取 DCGM Exporter {r.scrapes} 次）")
        tables = []
        for key, rows, quota, title in (("NAMESPACE", r.namespaces, True, "按命名空间"),
                                         ("NODE", r.nodes, False, "按节点")):
            columns, body = table_rows(key, rows, with_quota=quota)
            tables.append(Table(body, columns, title=title))
        t = r.total
        notes = [] if r.scrapes else ["这段时间里 Prometheus 还没有抓到 DCGM Exporter：它的数据从装上监控组件、"
                                      "抓取目标就绪时开始（kubectl -n monitoring get pods）。"]
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

    def queries(self) -> Table:
        """The PromQL the report ran, one row per query: what it adds up, and the query as Prometheus got it."""
        return Table([{"QUERY": f"{QUERY_MEANINGS.get(name, name)}（{name}）", "PROMQL": promql}
                      for name, promql in self.report.queries.items()], ["QUERY", "PROMQL"])

    def plot_utilization(self, title: str | None = None, show: bool = True) -> Any:
        from ..usage import plots as usage_plots

        return show_figure(usage_plots.utilization_figure(self.report, title, _labels()), show)

    def plot_allocation(self, title: str | None = None, show: bool = True) -> Any:
        from ..usage import plots as usage_plots

        return show_figure(usage_plots.allocation_figure(self.report, title, _labels()), show)


def usage_report(since: str | None = None, namespace: str | None = None) -> UsageReport:
    """``gpulab report`` from a notebook: GPU-hours allocated vs computing, idle GPUs, quota, preemptions.

    ``since`` is a duration (``"15m"``); by default the report covers the time since the lesson's ``setup()``.
    Needs the monitoring add-on (``gpulab addon install monitoring``); without it the error says so.
    """
    from .. import usage

    lab = current()
    seconds = usage.parse_since(since) if since else max(1.0, time.time() - lab.started)
    return UsageReport(usage.collect(lab.cluster.kubeconfig, since=seconds, namespace=namespace))


def wait_scrape(timeout: float = 20) -> None:
    """Wait until Prometheus has scraped the DCGM exporters and kube-state-metrics after this call, so that a
    report includes what runs now (Prometheus scrapes every 5 s)."""
    from ..usage import prometheus

    asked = time.time()
    prom = prometheus.connect(current().cluster.kubeconfig)
    try:
        wait_for(lambda: (prometheus.last_scrape(prom) or 0) > asked, timeout, interval=0.5,
                 what="Prometheus 再抓一次 DCGM Exporter 和 kube-state-metrics（每 5 秒一次）")
    finally:
        prom.close()
