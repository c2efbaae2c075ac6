"""Pictures of a usage report: utilisation over time, and who held which GPU when.

Both draw a :class:`~gpulab.usage.report.Report`'s devices, Prometheus' range results of
``report.UTILIZATION`` and ``report.HOLDERS`` at each step of the window, and return a matplotlib
``Figure`` (no pyplot state, so they work the same in a notebook, a test and ``gpulab report --out``).
Rows are devices (``node/gpuN``, MIG instances as ``node/gpuN/migG-profile``), time runs left to right in
minutes from the window's start.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .report import SHARED, DeviceTimeline, Report

PALETTE = ("#0969da", "#8250df", "#bf3989", "#1a7f37", "#9a6700", "#cf222e", "#0550ae", "#6639ba",
           "#116329", "#953800")
FREE = "#d0d7de"
SHARED_COLOR = "#6e7781"


@dataclass(frozen=True)
class Labels:
    """The words on the pictures: English for ``gpulab report --out``; notebooks pass their Chinese ones."""

    utilization: str = "GPU utilisation over time"
    allocation: str = "GPU allocation per node/GPU"
    minutes: str = "minutes"
    percent: str = "utilisation %"
    free: str = "free"
    shared: str = "in use, no pod named (shared)"


ENGLISH = Labels()


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _minutes(report: Report, t: float) -> float:
    return (t - report.start) / 60


def _held(holder: str | None) -> bool:
    return holder not in (None, "")


def utilization_figure(report: Report, title: str | None = None, labels: Labels = ENGLISH) -> Any:
    """One line per device: its utilisation (%) at each step; ticks at 0 where it was held and computed nothing."""
    fig = _figure(9, 3.6)
    ax = fig.add_subplot()
    for i, dev in enumerate(report.devices):
        points = [(_minutes(report, t), u, h) for t, u, h in zip(dev.times, dev.utilization, dev.held_by)
                  if u is not None]
        color = PALETTE[i % len(PALETTE)]
        ax.step([x for x, _, _ in points], [u for _, u, _ in points], where="post", color=color, linewidth=1.6,
                label=dev.key)
        # Held-but-idle stretches are what the cost section is about: mark them.
        idle = [x for x, u, h in points if _held(h) and u <= 0]
        if idle:
            ax.scatter(idle, [0] * len(idle), color=color, marker="|", s=60)
    ax.set_ylim(-3, 103)
    ax.set_xlim(0, _minutes(report, report.end))
    ax.set_xlabel(labels.minutes)
    ax.set_ylabel(labels.percent)
    ax.set_title(title or labels.utilization)
    if report.devices:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(alpha=0.3)
    return fig


def _runs(dev: DeviceTimeline) -> list[tuple[int, int, str, float]]:
    """(first step, last step, holder, utilisation) of each stretch where both stay the same."""
    runs: list[tuple[int, int, str, float]] = []
    for i, (holder, util) in enumerate(zip(dev.held_by, dev.utilization)):
        if holder is None:
            continue
        level = round(min(util or 0.0, 100.0))
        if runs and runs[-1][1] == i - 1 and runs[-1][2:] == (holder, level):
            runs[-1] = (runs[-1][0], i, holder, level)
        else:
            runs.append((i, i, holder, level))
    return runs


def allocation_figure(report: Report, title: str | None = None, labels: Labels = ENGLISH) -> Any:
    """A row per device, coloured at each step by the namespace holding it (grey: free; dark grey: in use,
    shared, where DCGM names no pod).

    Darker cells compute more: a held cell's opacity follows its utilisation, with a floor so that an idle
    allocation still shows whose it is.
    """
    from matplotlib.patches import Patch

    rows = [dev.key for dev in report.devices]
    fig = _figure(9, max(2.2, 0.42 * len(rows) + 1.4))
    ax = fig.add_subplot()
    namespaces: dict[str, str] = {}
    width = report.step / 60
    shared = False
    for y, dev in enumerate(report.devices):
        for first, last, holder, level in _runs(dev):
            x0 = _minutes(report, dev.times[first])
            if holder == "":
                color, alpha = FREE, 1.0
            else:
                if holder == SHARED:
                    color, shared = SHARED_COLOR, True
                else:
                    color = namespaces.setdefault(holder, PALETTE[len(namespaces) % len(PALETTE)])
                alpha = 0.35 + 0.65 * level / 100
            ax.barh(y, _minutes(report, dev.times[last]) - x0 + width, left=x0, height=0.8, color=color,
                    alpha=alpha, linewidth=0)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, _minutes(report, report.end))
    ax.set_xlabel(labels.minutes)
    ax.set_title(title or labels.allocation)
    handles = [Patch(color=c, label=n) for n, c in namespaces.items()]
    if shared:
        handles.append(Patch(color=SHARED_COLOR, label=labels.shared))
    handles.append(Patch(color=FREE, label=labels.free))
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
