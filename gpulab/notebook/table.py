"""The table: what the reading helpers return, HTML in JupyterLab and aligned text elsewhere."""

from __future__ import annotations

import html
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["Table"]


def _width(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1 for ch in text)


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
        if isinstance(v, (list, tuple)):
            return ", ".join(map(str, v)) or "-"
        return str(v)

    def __str__(self) -> str:
        cells = [[self._cell(r.get(c)) for c in self.columns] for r in self]
        widths = [max([_width(c)] + [_width(row[i]) for row in cells]) for i, c in enumerate(self.columns)]

        def line(values: Sequence[str]) -> str:
            return "   ".join(v + " " * (w - _width(v)) for v, w in zip(values, widths)).rstrip()

        out = [self.title] if self.title else []
        out.append(line(self.columns))
        out += [line(row) for row in cells]
        if not self:
            out.append("(无)")
        return "\n".join(out)

    def __repr__(self) -> str:
        return str(self)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    def _repr_html_(self) -> str:
        head = "".join(f'<th style="text-align:left">{html.escape(c)}</th>' for c in self.columns)
        body = "".join(
            "<tr>" + "".join(f'<td style="text-align:left">{html.escape(self._cell(r.get(c)))}</td>'
                             for c in self.columns) + "</tr>" for r in self)
        if not self:
            body = f'<tr><td colspan="{len(self.columns)}">(无)</td></tr>'
        caption = f"<caption style='text-align:left'><b>{html.escape(self.title)}</b></caption>" if self.title else ""
        return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
