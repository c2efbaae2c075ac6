"""Pictures of a usage report: utilisation over time, and who held which GPU when.

Both take a :class:`~gpulab.usage.report.Report` and return a matplotlib
``Figure`` (no pyplot state, so they work the same in a notebook, a test and
``gpulab report --out``). Rows are devices (``node/gpuN``, MIG instances as
``node/gpuN/migG-profile``), time runs left to right in minutes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .report import Report

PALETTE = ("#0969da", "#8250df", "#bf3989", "#1a7f37", "#9a6700", "#cf222e", "#0550ae", "#6639ba",
           "#116329", "#953800")
FREE = "#d0d7de"


@dataclass(frozen=True)
class Labels:
    """The words on the pictures: English for ``gpulab report --out``; notebooks pass their Chinese ones."""

    utilization: str = "GPU utilisation over time"
    allocation: str = "GPU allocation per node/GPU"
    minutes: str = "minutes"
    percent: str = "utilisation %"
    free: str = "free"
    shared: str = "shared: "


ENGLISH = Labels()


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _rows(report: Report) -> list[str]:
    keys: dict[str, None] = {}
    for snap in report.snapshots:
        for dev in snap.devices:
            keys.setdefault(dev.key, None)
    return sorted(keys)


def _minutes(report: Report, t: float) -> float:
    return (t - report.start) / 60


def utilization_figure(report: Report, title: str | None = None, labels: Labels = ENGLISH) -> Any:
    """One line per device: its utilisation (%) in each sample; dashed while nobody holds it."""
    fig = _figure(9, 3.6)
    ax = fig.add_subplot()
    rows = _rows(report)
    for i, key in enumerate(rows):
        xs, ys, held = [], [], []
        for snap in report.snapshots:
            dev = next((d for d in snap.devices if d.key == key), None)
            if dev is None:
                continue
            xs.append(_minutes(report, snap.t))
            ys.append(dev.util)
            held.append(bool(dev.holders))
        color = PALETTE[i % len(PALETTE)]
        ax.step(xs, ys, where="post", color=color, linewidth=1.6, label=key)
        # Held-but-idle stretches are what the cost section is about: mark them.
        idle = [x for x, y, h in zip(xs, ys, held) if h and y <= 0]
        if idle:
            ax.scatter(idle, [0] * len(idle), color=color, marker="|", s=60)
    ax.set_ylim(-3, 103)
    ax.set_xlabel(labels.minutes)
    ax.set_ylabel(labels.percent)
    ax.set_title(title or labels.utilization)
    if rows:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(alpha=0.3)
    return fig


def allocation_figure(report: Report, title: str | None = None, labels: Labels = ENGLISH) -> Any:
    """A heat map: a row per device, a cell per sample, coloured by the namespace holding it (grey: free).

    Darker cells compute less: a held cell's opacity follows its utilisation,
    with a floor so that an idle allocation still shows whose it is.
    """
    from matplotlib.patches import Patch

    rows = _rows(report)
    fig = _figure(9, max(2.2, 0.42 * len(rows) + 1.4))
    ax = fig.add_subplot()
    namespaces: dict[str, str] = {}
    snaps = report.snapshots
    for j, snap in enumerate(snaps):
        x0 = _minutes(report, snap.t)
        x1 = _minutes(report, snaps[j + 1].t) if j + 1 < len(snaps) else x0 + max(
            (x0 - _minutes(report, snaps[j - 1].t)) if j else 0.1, 0.05)
        for dev in snap.devices:
            y = rows.index(dev.key)
            if not dev.holders:
                ax.barh(y, x1 - x0, left=x0, height=0.8, color=FREE, linewidth=0)
                continue
            ns = sorted({h[0] for h in dev.holders})
            label = ns[0] if len(ns) == 1 else labels.shared + "+".join(ns)
            color = namespaces.setdefault(label, PALETTE[len(namespaces) % len(PALETTE)])
            alpha = 0.35 + 0.65 * min(dev.util, 100) / 100
            ax.barh(y, x1 - x0, left=x0, height=0.8, color=color, alpha=alpha, linewidth=0)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(labels.minutes)
    ax.set_title(title or labels.allocation)
    handles = [Patch(color=c, label=n) for n, c in namespaces.items()] + [Patch(color=FREE, label=labels.free)]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def save(report: Report, out: Path) -> list[Path]:
    """Write ``utilization.png`` and ``allocation.png`` into ``out``; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in (("utilization.png", utilization_figure(report)), ("allocation.png", allocation_figure(report))):
        path = out / name
        fig.savefig(path, dpi=100)
        written.append(path)
    return written
