"""The HPA: one HorizontalPodAutoscaler's replicas and metric over time, recorded while a lesson loads it."""

from __future__ import annotations

import threading
import time
from typing import Any

from . import quantity
from .lesson import current
from .plots import new_figure, show_figure

__all__ = ["HpaTimeline", "watch_hpa"]


class HpaTimeline:
    """Replicas and metric value of one HPA over time, recorded on a thread until :meth:`stop`."""

    def __init__(self, name: str, namespace: str, interval: float = 1.0):
        self.name = name
        self.namespace = namespace
        self.t0 = time.monotonic()
        self.samples: list[tuple[float, int, int, float | None]] = []  # t, desired, ready, metric
        self.marks: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def _run(self, interval: float) -> None:
        kube = current().kube
        while not self._stop.is_set():
            hpa = kube.get("HorizontalPodAutoscaler", self.name, self.namespace) or {}
            dep_name = (hpa.get("spec") or {}).get("scaleTargetRef", {}).get("name", self.name)
            dep = kube.get("Deployment", dep_name, self.namespace) or {}
            metrics = (hpa.get("status") or {}).get("currentMetrics") or []
            value = None
            if metrics and metrics[0].get("pods"):
                value = quantity.parse(metrics[0]["pods"]["current"]["averageValue"])
            self.samples.append((time.monotonic() - self.t0, int((dep.get("spec") or {}).get("replicas") or 0),
                                 int((dep.get("status") or {}).get("readyReplicas") or 0), value))
            self._stop.wait(interval)

    def mark(self, text: str) -> None:
        """A vertical line on the plot at this moment (e.g. "load 80")."""
        self.marks.append((time.monotonic() - self.t0, text))

    def stop(self) -> None:
        """End the sampling. Returns nothing: a cell ending in it shows no object."""
        self._stop.set()
        self._thread.join(timeout=5)

    def plot(self, title: str | None = None, show: bool = True) -> Any:
        fig = new_figure(9, 3.4)
        ax = fig.add_subplot()
        ts = [s[0] for s in self.samples]
        ax.step(ts, [s[1] for s in self.samples], where="post", color="#0969da",
                label="期望副本数")
        ax.step(ts, [s[2] for s in self.samples], where="post", color="#1a7f37", linestyle="--",
                label="就绪副本数")
        ax.set_ylabel("副本")
        ax.set_ylim(0, max([s[1] for s in self.samples] + [2]) + 0.5)
        ax2 = ax.twinx()
        ax2.plot([s[0] for s in self.samples if s[3] is not None], [s[3] for s in self.samples if s[3] is not None],
                 color="#bf3989", alpha=0.8, label="平均 GPU 利用率 %")
        ax2.set_ylim(0, 105)
        ax2.set_ylabel("DCGM_FI_DEV_GPU_UTIL %")
        for t, text in self.marks:
            ax.axvline(t, color="#57606a", linestyle=":")
            ax.text(t, ax.get_ylim()[1] - 0.2, f" {text}", fontsize=8, va="top", color="#57606a")
        ax.set_xlabel("秒（从开始记录算起）")
        ax.set_title(title or f"HPA {self.name}")
        lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
        ax.legend(lines, [ln.get_label() for ln in lines], loc="upper left", bbox_to_anchor=(1.08, 1.0),
                  fontsize=8, frameon=False)
        ax.grid(axis="x", alpha=0.3)
        return show_figure(fig, show)


def watch_hpa(name: str, namespace: str | None = None) -> HpaTimeline:
    """Start recording an HPA's replicas and metric (``.mark(text)``, ``.stop()``, ``.plot()``)."""
    return HpaTimeline(name, namespace or current().namespace)
