"""Plots: the lessons' matplotlib figures, labelled in Chinese.

The CJK font comes with gpulab itself: the ``noto-cjk-sans-otc`` dependency
(SIL Open Font License 1.1) ships Noto Sans CJK, and :func:`cjk_font` registers
it with matplotlib, so every learner has it without root or apt. matplotlib (and
IPython) are imported only when a figure is drawn, so importing
:mod:`gpulab.notebook` stays cheap. :func:`new_figure` and :func:`show_figure`
are what the other figures (timelines, HPA, usage) are made with.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .gpus import gpu_allocation, gpu_pods

__all__ = ["plot_allocation", "plot_card_memory", "plot_free_gpus", "plot_gpu_memory", "plot_latency", "new_figure",
           "show_figure"]

# The face of the Noto Sans CJK collection for zh-CN (its simplified-Chinese glyph forms).
CJK_FONT = "Noto Sans CJK SC"


def cjk_font_file() -> str:
    """The font collection the ``noto-cjk-sans-otc`` package installs (NotoSansCJK-Regular.ttc)."""
    import noto_cjk_sans_otc

    return str(noto_cjk_sans_otc.FONT_PATH)


@functools.lru_cache(maxsize=1)
def cjk_font() -> str:
    """Register the packaged Noto Sans CJK with matplotlib (once) and return the family plots use."""
    from matplotlib import font_manager

    path = cjk_font_file()
    if not any(str(f.fname) == path and f.name == CJK_FONT for f in font_manager.fontManager.ttflist):
        font_manager.fontManager.addfont(path)  # every face of the collection (matplotlib >= 3.11)
    if not any(f.name == CJK_FONT for f in font_manager.fontManager.ttflist):
        raise RuntimeError(f"字体文件 {path} 里没有 {CJK_FONT!r}，图里的中文画不出来："
                           "重新安装 gpulab（`make install`）")
    return CJK_FONT


def use_cjk_font() -> str:
    """Make the CJK font the first sans-serif font of matplotlib (what figures' text resolves to when drawn)."""
    import matplotlib

    font = cjk_font()
    families = list(matplotlib.rcParams["font.sans-serif"])
    if families[:1] != [font]:
        matplotlib.rcParams["font.sans-serif"] = [font, *(f for f in families if f != font)]
    matplotlib.rcParams["axes.unicode_minus"] = False  # U+2212 is in the font, but keep ASCII minus signs
    return font


def new_figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    use_cjk_font()
    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def show_figure(fig: Any, show: bool) -> Any:
    """Display ``fig`` in the notebook and return None, or return it undisplayed when ``show`` is false."""
    if not show:
        return fig
    try:
        from IPython import get_ipython
        from IPython.display import Image, display
    except ImportError:  # pragma: no cover
        return None
    use_cjk_font()  # figures not made by new_figure (usage reports) are drawn with it too
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
            ax.text(x + free / 2, y, f"空闲 {free}", ha="center", va="center",
                    color="#57606a", fontsize=8)
    top = max([a["allocatable"] for a in alloc.values()] or [1])
    for card in range(1, top):  # one block per card
        ax.axvline(card, color="white", linewidth=3)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlim(0, top)
    ax.set_xticks(range(top + 1))
    ax.set_xlabel("nvidia.com/gpu（张）")
    waiting = [r for r in gpu_pods() if r["STATUS"] == "Pending" and not r["NODE"]]
    if waiting:
        names_waiting = ", ".join(f"{r['POD'].split('/', 1)[1]} ×{r['GPUS']}" for r in waiting)
        ax.set_xlabel(ax.get_xlabel() + f"\n等待调度：{names_waiting}", color="#57606a")
    ax.set_title(title or "各节点 GPU 分配")
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
    ax.set_yticks(range(len(schemes)), [s[0] for s in schemes])
    ax.invert_yaxis()
    ax.set_xlim(0, card_mib)
    ax.set_xlabel(f"一张卡的显存（MiB）。深色：每个副本 {replica_mib} MiB；浅色：余量；斜线：实例太小；灰色：未使用")
    ax.set_title(title or "每张卡能放几个副本")
    return show_figure(fig, show)


def plot_latency(rows: Sequence[tuple[str, float, float]], title: str | None = None, show: bool = True) -> Any:
    """p50 and p99 latency (ms) of the same requests under each set-up: ``(name, p50_ms, p99_ms)`` per row.

    A pair of bars per set-up, p50 dark and p99 light, each labelled with its value.
    """
    fig = new_figure(9, 1.0 + 0.6 * max(1, len(rows)))
    ax = fig.add_subplot()
    ys = range(len(rows))
    for offset, index, colour, label in ((-0.2, 1, "#0969da", "p50"), (0.2, 2, "#9ecbff", "p99")):
        values = [row[index] for row in rows]
        bars = ax.barh([y + offset for y in ys], values, height=0.38, color=colour, label=label)
        ax.bar_label(bars, labels=[f"{v:.0f} ms" for v in values], padding=3, fontsize=9)
    ax.set_yticks(list(ys), [row[0] for row in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, 1.2 * max((max(r[1], r[2]) for r in rows), default=1))
    ax.set_xlabel("一次补全请求的延迟（毫秒），在集群里经 Service 测得")
    ax.legend(loc="lower right")
    ax.set_title(title or "同一个推理服务的延迟：p50 与 p99")
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
    ax.text(capacity_mib, -0.45, f" 整卡 {capacity_mib} MiB",
            color="#57606a", fontsize=8, va="bottom")
    ax.set_yticks(range(len(gpus)), gpus)
    ax.invert_yaxis()
    ax.set_xlim(0, top * 1.02)
    ax.set_xlabel("Pod 申请的显存（MiB）。蓝色：运行中；红色：失败")
    ax.set_title(title or "每张物理卡上的显存")
    return show_figure(fig, show)


def _natural(name: str) -> list[Any]:
    """Sort key that puts h100-node-2 before h100-node-10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def plot_free_gpus(free: Mapping[str, Mapping[str, int]], per_node: int, need: int, title: str | None = None,
                   show: bool = True) -> Any:
    """Free GPUs of every node under each set-up: ``free`` maps a set-up's name to ``{node: free GPUs}``.

    One panel per set-up, one bar per node (in name order): the cards given out
    dark, the free ones light, and green where ``need`` free cards are on that one
    node (a pod asking for ``need`` fits there). A dashed line marks ``need``; each
    panel's title says how many cards are free in all and on how many nodes such a
    pod fits. Displays the figure (returns None); ``show=False`` returns it.
    """
    fig = new_figure(10, 0.6 + 2.6 * max(1, len(free)))
    used_colour, free_colour, fits_colour = "#0969da", "#d0d7de", "#4ac26b"
    for i, (setup, by_node) in enumerate(free.items()):
        ax = fig.add_subplot(len(free), 1, i + 1)
        names = sorted(by_node, key=_natural)
        xs = range(len(names))
        spare = [by_node[n] for n in names]
        ax.bar(xs, [per_node - f for f in spare], color=used_colour, edgecolor="white", label="已分配")
        ax.bar(xs, spare, bottom=[per_node - f for f in spare], edgecolor="white",
               color=[fits_colour if f >= need else free_colour for f in spare], label="空闲")
        ax.axhline(need, color="#57606a", linestyle="--", linewidth=1.2)
        ax.text(len(names) - 0.5, need + per_node * 0.03, f"{need} 卡 Pod 要求单台节点空闲 {need} 张",
                ha="right", va="bottom", color="#57606a", fontsize=8)
        fits = sum(1 for f in spare if f >= need)
        ax.set_title(f"{setup}：空闲 {sum(spare)} 张，能放下 {need} 卡 Pod 的节点 {fits} 台", fontsize=10)
        ax.set_xticks(list(xs), names, rotation=60, ha="right", fontsize=8)
        ax.set_ylim(0, per_node * 1.4)  # room above the bars for the legend and the line's label
        ax.set_yticks(range(0, per_node + 1, 2))
        ax.set_ylabel("nvidia.com/gpu（张）")
        if i == 0:
            from matplotlib.patches import Patch

            ax.legend(handles=[Patch(color=used_colour, label="已分配"), Patch(color=free_colour, label="空闲"),
                               Patch(color=fits_colour, label=f"空闲，且够 {need} 张")],
                      loc="upper left", fontsize=8, ncols=3, frameon=False)
    fig.suptitle(title or "每台节点空闲的 GPU")
    return show_figure(fig, show)
