"""Plots: the lessons' matplotlib figures, labelled in Chinese when a CJK font is installed.

matplotlib (and IPython) are imported only when a figure is drawn, so importing
:mod:`gpulab.notebook` stays cheap. :func:`new_figure`, :func:`show_figure` and
:func:`bilingual` are what the other figures (timelines, HPA, usage) are made with.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence
from typing import Any

from .gpus import gpu_allocation, gpu_pods

__all__ = ["plot_allocation", "plot_card_memory", "plot_gpu_memory", "new_figure", "show_figure", "bilingual"]

_CJK_FONTS = ("Noto Sans CJK SC", "Noto Sans SC", "Source Han Sans SC", "WenQuanYi Micro Hei", "WenQuanYi Zen Hei",
              "PingFang SC", "Hiragino Sans GB", "Microsoft YaHei", "SimHei", "Sarasa Gothic SC")
# Files that may hold one of those fonts (Debian's fonts-noto-cjk: NotoSansCJK-Regular.ttc).
_CJK_FILE = re.compile(r"(?i)(notosans(mono)?cjk|notosanssc|sourcehansans|wqy|wenquanyi|pingfang|msyh|simhei|sarasa)")


@functools.lru_cache(maxsize=1)
def _cjk_font() -> str | None:
    from matplotlib import font_manager

    names = {f.name for f in font_manager.fontManager.ttflist}
    found = next((f for f in _CJK_FONTS if f in names), None)
    if found is None:
        # matplotlib caches its font list once: a CJK font installed after that (apt-get install
        # fonts-noto-cjk, whose .ttc collections it also skips there) is added here.
        for path in font_manager.findSystemFonts():
            if _CJK_FILE.search(os.path.basename(path)):
                try:
                    font_manager.fontManager.addfont(path)
                except (OSError, RuntimeError, ValueError):
                    continue
        names = {f.name for f in font_manager.fontManager.ttflist}
        found = next((f for f in _CJK_FONTS if f in names), None)
    return found


def bilingual(zh: str, en: str) -> str:
    """Chinese labels when a CJK font is installed, English otherwise (no missing-glyph boxes)."""
    return zh if _cjk_font() else en


def new_figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    font = _cjk_font()
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    if font:
        import matplotlib

        matplotlib.rcParams["font.sans-serif"] = [font, *matplotlib.rcParams["font.sans-serif"]]
        matplotlib.rcParams["axes.unicode_minus"] = False
    return fig


def show_figure(fig: Any, show: bool) -> Any:
    """Display ``fig`` in the notebook and return None, or return it undisplayed when ``show`` is false."""
    if not show:
        return fig
    try:
        from IPython import get_ipython
        from IPython.display import Image, display
    except ImportError:  # pragma: no cover
        return None
    if get_ipython() is not None:
        # Rendered here rather than left to a matplotlib backend, so the
        # picture is the same in JupyterLab, under nbclient and in nbval.
        import io

        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        display(Image(data=buf.getvalue(), format="png"))
    return None


_PALETTE = ("#0969da", "#8250df", "#bf3989", "#1a7f37", "#9a6700", "#cf222e", "#0550ae", "#6639ba")


def plot_allocation(title: str | None = None, show: bool = True) -> Any:
    """A bar per GPU node: one block per card, coloured by the pod holding it; grey is free.

    Displays the figure (returns None); ``show=False`` returns the matplotlib
    figure instead, undisplayed.
    """
    alloc = gpu_allocation()
    names = list(alloc)
    fig = new_figure(9, 1.2 + 0.7 * max(1, len(names)))
    ax = fig.add_subplot()
    colours: dict[str, str] = {}
    for y, node in enumerate(names):
        x = 0
        for pod, n in alloc[node]["pods"]:
            colour = colours.setdefault(pod, _PALETTE[len(colours) % len(_PALETTE)])
            ax.barh(y, n, left=x, color=colour, edgecolor="white", height=0.6)
            ax.text(x + n / 2, y, pod.split("/", 1)[1], ha="center", va="center", color="white", fontsize=8)
            x += n
        free = alloc[node]["allocatable"] - x
        if free > 0:
            ax.barh(y, free, left=x, color="#eaeef2", edgecolor="white", height=0.6)
            ax.text(x + free / 2, y, bilingual(f"空闲 {free}", f"free {free}"), ha="center", va="center",
                    color="#57606a", fontsize=8)
    top = max([a["allocatable"] for a in alloc.values()] or [1])
    for card in range(1, top):  # one block per card
        ax.axvline(card, color="white", linewidth=3)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlim(0, top)
    ax.set_xticks(range(top + 1))
    ax.set_xlabel(bilingual("nvidia.com/gpu（张）", "nvidia.com/gpu (cards)"))
    waiting = [r for r in gpu_pods() if r["STATUS"] == "Pending" and not r["NODE"]]
    if waiting:
        names_waiting = ", ".join(f"{r['POD'].split('/', 1)[1]} ×{r['GPUS']}" for r in waiting)
        ax.set_xlabel(ax.get_xlabel() + "\n" + bilingual(f"等待调度：{names_waiting}", f"waiting to be scheduled: "
                                                         f"{names_waiting}"), color="#57606a")
    ax.set_title(title or bilingual("各节点 GPU 分配", "GPU allocation per node"))
    return show_figure(fig, show)


def plot_card_memory(card_mib: int, replica_mib: int, schemes: Sequence[tuple[str, int, int | None]],
                     title: str | None = None, show: bool = True) -> Any:
    """How replicas of ``replica_mib`` fit on one card of ``card_mib`` under each sharing scheme.

    ``schemes``: ``(name, instances per card, MiB per instance)``, with MiB
    ``None`` for a scheme whose replicas share the whole card's memory
    (time-slicing). One bar per scheme: a dark block per replica, light for
    the headroom it has, hatched for an instance too small for a replica,
    grey for memory no instance uses.
    """
    fig = new_figure(9, 1.0 + 0.55 * max(1, len(schemes)))
    ax = fig.add_subplot()
    model, spare, small, unused = "#0969da", "#9ecbff", "#d0d7de", "#eaeef2"
    for y, (_, per_card, mib) in enumerate(schemes):
        x = 0
        if mib is None:  # shared: replicas side by side, the rest is their common headroom
            for _ in range(per_card):
                ax.barh(y, replica_mib, left=x, color=model, edgecolor="white")
                x += replica_mib
            ax.barh(y, max(0, card_mib - x), left=x, color=spare, edgecolor="white")
            continue
        for _ in range(per_card):
            if mib >= replica_mib:
                ax.barh(y, replica_mib, left=x, color=model, edgecolor="white")
                ax.barh(y, mib - replica_mib, left=x + replica_mib, color=spare, edgecolor="white")
            else:
                ax.barh(y, mib, left=x, color=small, edgecolor="white", hatch="//")
            x += mib
        ax.barh(y, max(0, card_mib - x), left=x, color=unused, edgecolor="white")
    ax.set_yticks(range(len(schemes)), [s[0] if _cjk_font() else s[0].replace("整卡独占", "whole card")
                                        for s in schemes])
    ax.invert_yaxis()
    ax.set_xlim(0, card_mib)
    ax.set_xlabel(bilingual(f"一张卡的显存（MiB）。深色：每个副本 {replica_mib} MiB；浅色：余量；斜线：实例太小；灰色：未使用",
                            f"MiB of one card. dark: a replica ({replica_mib} MiB), light: headroom, "
                            f"hatched: instance too small, grey: unused"))
    ax.set_title(title or bilingual("每张卡能放几个副本", "Replicas per card"))
    return show_figure(fig, show)


def plot_gpu_memory(rows: Sequence[dict[str, Any]], capacity_mib: int, title: str | None = None,
                    show: bool = True) -> Any:
    """One bar per physical GPU: the GPU memory each pod on it asked for, stacked in the order given.

    ``rows``: ``{"GPU": label, "POD": name, "MIB": memory, "FAILED": bool}``.
    A failed pod's block is red; a dashed line marks the card's memory
    (``capacity_mib``), so a stack that crosses it is one the card could not
    hold. Displays the figure (returns None); ``show=False`` returns it.
    """
    gpus = list(dict.fromkeys(r["GPU"] for r in rows))
    fig = new_figure(9, 1.2 + 0.7 * max(1, len(gpus)))
    ax = fig.add_subplot()
    ok, bad = "#0969da", "#cf222e"
    top = capacity_mib
    for y, gpu in enumerate(gpus):
        x = 0
        for r in (r for r in rows if r["GPU"] == gpu):
            ax.barh(y, r["MIB"], left=x, color=bad if r.get("FAILED") else ok, edgecolor="white", height=0.6)
            ax.text(x + r["MIB"] / 2, y, r["POD"], ha="center", va="center", color="white", fontsize=8)
            x += r["MIB"]
        top = max(top, x)
    ax.axvline(capacity_mib, color="#57606a", linestyle="--", linewidth=1.5)
    ax.text(capacity_mib, -0.45, bilingual(f" 整卡 {capacity_mib} MiB", f" card {capacity_mib} MiB"),
            color="#57606a", fontsize=8, va="bottom")
    ax.set_yticks(range(len(gpus)), gpus)
    ax.invert_yaxis()
    ax.set_xlim(0, top * 1.02)
    ax.set_xlabel(bilingual("Pod 申请的显存（MiB）。蓝色：运行中；红色：失败",
                            "GPU memory asked for (MiB). blue: running, red: failed"))
    ax.set_title(title or bilingual("每张物理卡上的显存", "GPU memory per physical GPU"))
    return show_figure(fig, show)
