"""The table: what the reading helpers return, HTML in JupyterLab and aligned text elsewhere.

Rows are keyed by kubectl-style column names (``row["NODE"]``, ``t.column("STATUS")``):
that is what a learner's code reads. The header a learner sees shows each key
under its Chinese name from :data:`HEADINGS` (``节点 NODE``), so the table reads
in the chapter's terms and still says which key to use.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import Any

from ..i18n import cells as width, pad

__all__ = ["Table", "HEADINGS"]

# The Chinese name of each column key the notebook library and the lessons use; a key missing
# here (POD, GPU, a node label, a key that is Chinese already) is shown as it is.
HEADINGS = {
    "TYPE": "类型", "REASON": "原因", "FROM": "来源", "COUNT": "次数", "MESSAGE": "消息",
    "NODE": "节点", "GPU MODEL": "GPU 型号", "ALLOCATABLE GPU": "可分配 GPU", "GPU IN USE": "已分配 GPU",
    "TAINTS": "污点", "GPUS": "GPU 数", "STATUS": "状态", "WHY NOT SCHEDULED": "未调度的原因",
    "ADDRESS": "地址", "READY": "就绪", "SERVING": "可服务", "TERMINATING": "终止中",
    "T+S": "秒", "STATE": "状态", "RESTARTS": "重启次数", "METRIC": "指标", "VALUE": "值",
    "GPU_UTIL %": "GPU 利用率", "GR_ENGINE_ACTIVE": "图形引擎活跃度", "FB_USED MiB": "已用显存",
    "FB_FREE MiB": "空闲显存", "TEMP °C": "温度", "POWER W": "功率",
    "NAMESPACE": "命名空间", "GPUS NOW": "当前持有 GPU", "IDLE NOW": "当前闲置",
    "GPU-H ALLOCATED": "分配 GPU 小时", "GPU-H COMPUTING": "计算 GPU 小时", "GPU-H IDLE": "闲置 GPU 小时",
    "EFFICIENCY": "效率", "QUOTA requests.nvidia.com/gpu": "配额", "QUERY": "查询", "PROMQL": "查询语句",
    # columns lessons build their own tables with
    "LABEL": "标签", "GPU SEEN": "看到的 GPU", "ASKED (MiB)": "申请的显存", "USED (MiB)": "已用显存",
    "TOTAL (MiB)": "总显存", "LAST LOG LINE": "最后一行日志",
}


def heading(column: str) -> str:
    """What the header shows for ``column``: its Chinese name and the key, or the key alone."""
    zh = HEADINGS.get(column)
    return f"{zh} {column}" if zh else column


class Table(list):
    """Rows (dicts) with an ordered set of columns; HTML in notebooks, aligned text elsewhere."""

    def __init__(self, rows: Iterable[dict[str, Any]] = (), columns: Sequence[str] | None = None,
                 title: str = ""):
        super().__init__(rows)
        if columns is None:
            columns = list(dict.fromkeys(k for r in self for k in r))
        self.columns = list(columns)
        self.title = title

    def column(self, name: str) -> list[Any]:
        return [r.get(name) for r in self]

    @staticmethod
    def _cell(v: Any) -> str:
        if v is None or v == "":
            return "-"
        if isinstance(v, bool):  # a learner reads 是/否, the row keeps the bool for the code
            return "是" if v else "否"
        if isinstance(v, (list, tuple)):
            return ", ".join(map(str, v)) or "-"
        return str(v)

    def __str__(self) -> str:
        cells = [[self._cell(r.get(c)) for c in self.columns] for r in self]
        widths = [max([width(heading(c))] + [width(row[i]) for row in cells]) for i, c in enumerate(self.columns)]

        def line(values: Sequence[str]) -> str:
            return "   ".join(pad(v, w) for v, w in zip(values, widths)).rstrip()

        out = [self.title] if self.title else []
        out.append(line([heading(c) for c in self.columns]))
        out += [line(row) for row in cells]
        if not self:
            out.append("(无)")
        return "\n".join(out)

    def __repr__(self) -> str:
        return str(self)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    @staticmethod
    def _html_heading(column: str) -> str:
        zh = HEADINGS.get(column)
        key = f'<code style="font-weight:normal">{html.escape(column)}</code>'
        return f"{html.escape(zh)}<br>{key}" if zh else key

    def _repr_html_(self) -> str:
        head = "".join(f'<th style="text-align:left">{self._html_heading(c)}</th>' for c in self.columns)
        body = "".join(
            "<tr>" + "".join(f'<td style="text-align:left">{html.escape(self._cell(r.get(c)))}</td>'
                             for c in self.columns) + "</tr>" for r in self)
        if not self:
            body = f'<tr><td colspan="{len(self.columns)}">(无)</td></tr>'
        caption = f"<caption style='text-align:left'><b>{html.escape(self.title)}</b></caption>" if self.title else ""
        return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
