"""Timelines: the states of the lesson's pods over time, recorded from a watch while the lesson runs."""

from __future__ import annotations

import time
from typing import Any

from ..kube import api
from ..kube.informer import Informer
from .lesson import current
from .plots import new_figure, show_figure
from .pod import pod_condition
from .table import Table

__all__ = ["timeline_state", "Timeline", "watch_pods"]

_STATE_COLOURS = {
    "Pending": "#d0d7de", "Init": "#d4a72c", "Creating": "#afb8c1", "Running": "#54aeff", "Ready": "#1a7f37",
    "BackOff": "#fa4549", "Succeeded": "#8250df", "Failed": "#a40e26", "Terminating": "#6e7781",
}
_STATE_ZH = {"Pending": "等待调度", "Init": "Init 容器", "Creating": "创建中", "Running": "运行（未就绪）",
             "Ready": "就绪", "BackOff": "重启退避", "Succeeded": "成功", "Failed": "失败", "Terminating": "终止中"}


def timeline_state(pod: dict[str, Any]) -> str:
    """A coarse state for timelines: Pending, Init, Creating, Running, Ready, BackOff, Succeeded, Failed, Terminating."""
    st = pod.get("status") or {}
    phase = st.get("phase")
    if phase in ("Succeeded", "Failed"):
        return phase
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating"
    if not pod.get("spec", {}).get("nodeName"):
        return "Pending"
    for cs in st.get("initContainerStatuses") or []:
        if "running" in (cs.get("state") or {}):
            return "Init"
    statuses = st.get("containerStatuses") or []
    if any((cs.get("state") or {}).get("waiting", {}).get("reason") == "CrashLoopBackOff" for cs in statuses):
        return "BackOff"
    if phase == "Running":
        return "Ready" if (pod_condition(pod, "Ready") or {}).get("status") == "True" else "Running"
    return "Creating"


class Timeline:
    """Pod states of a namespace over time, recorded from a watch on a background thread.

    Made by :func:`watch_pods`; ``stop()`` ends the recording, ``plot()``
    draws one bar per pod (colour = state, ✕ = container restart), and
    ``transitions()`` lists the changes as a table.
    """

    def __init__(self, namespace: str, selector: dict[str, str] | None):
        self.namespace = namespace
        self.selector = selector or {}
        self.t0 = time.time()
        self.t_end: float | None = None
        # pod name -> list of (t, state, restarts)
        self.samples: dict[str, list[tuple[float, str, int]]] = {}
        self.deleted: dict[str, float] = {}
        # Watch streams of a second: stop() ends the recording at once. A failed watch (the apiserver
        # restarted) is listed again soon, without a warning in the cell's output.
        self._pods = Informer(api.Client(current().cluster.kubeconfig), "Pod", namespace, watch_timeout=1,
                              backoff=0.5, quiet=True)
        self._pods.add_handler(on_add=lambda pod: self._record(pod, time.time()),
                               on_update=lambda old, new: self._record(new, time.time()), on_delete=self._deleted)
        self._pods.start()

    def _matches(self, pod: dict[str, Any]) -> bool:
        labels = pod["metadata"].get("labels") or {}
        return all(labels.get(k) == v for k, v in self.selector.items())

    def _record(self, pod: dict[str, Any], t: float) -> None:
        if not self._matches(pod):
            return
        name = pod["metadata"]["name"]
        restarts = sum(cs.get("restartCount", 0) for cs in (pod.get("status") or {}).get("containerStatuses") or [])
        state = timeline_state(pod)
        seq = self.samples.setdefault(name, [])
        if not seq or seq[-1][1:] != (state, restarts):
            seq.append((t, state, restarts))

    def _deleted(self, pod: dict[str, Any]) -> None:
        if self._matches(pod):
            self.deleted.setdefault(pod["metadata"]["name"], time.time())

    def stop(self) -> None:
        """End the recording (idempotent). Returns nothing: a cell ending in it shows no object."""
        if self.t_end is None:
            self.t_end = time.time()
            self._pods.stop()
            self._pods.join(timeout=5)

    def transitions(self) -> Table:
        """Every recorded change: seconds since the start, pod, state, restart count."""
        rows = [{"T+S": f"{t - self.t0:5.1f}", "POD": name, "STATE": s, "RESTARTS": r}
                for name, seq in self.samples.items() for t, s, r in seq]
        rows.sort(key=lambda r: float(r["T+S"]))
        return Table(rows, ["T+S", "POD", "STATE", "RESTARTS"])

    def plot(self, title: str | None = None, labels: dict[str, str] | None = None, show: bool = True) -> Any:
        """One horizontal bar per pod, in creation order; ``labels`` renames pods on the y axis.

        Displays the figure (returns None); ``show=False`` returns it instead.
        """
        end = self.t_end or time.time()
        names = sorted(self.samples, key=lambda n: self.samples[n][0][0])
        fig = new_figure(10, 1.2 + 0.45 * max(1, len(names)))
        ax = fig.add_subplot()
        seen: set[str] = set()
        for y, name in enumerate(names):
            seq = self.samples[name]
            stop = min(self.deleted.get(name, end), end)
            for i, (t, state, restarts) in enumerate(seq):
                t_next = seq[i + 1][0] if i + 1 < len(seq) else stop
                if t_next <= t:
                    t_next = t + 0.15  # a state seen for an instant still shows
                # After the end the pod object stays, doing nothing: a thin band.
                terminal = state in ("Succeeded", "Failed")
                ax.barh(y, t_next - t, left=t - self.t0, height=0.18 if terminal else 0.55,
                        color=_STATE_COLOURS[state], alpha=0.8 if terminal else 1.0,
                        label=None if state in seen else _STATE_ZH[state])
                seen.add(state)
                if i and restarts > seq[i - 1][2]:
                    ax.plot(t - self.t0, y, marker="x", color="black", markersize=7)
        ax.set_yticks(range(len(names)), [(labels or {}).get(n, n) for n in names], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, max(1.0, end - self.t0))
        ax.set_xlabel("秒（从开始记录算起）")
        ax.set_title(title or "Pod 状态时间线")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
        ax.grid(axis="x", alpha=0.3)
        return show_figure(fig, show)


def watch_pods(selector: dict[str, str] | None = None, namespace: str | None = None) -> Timeline:
    """Start recording the states of the lesson's pods (those whose labels include ``selector``)."""
    return Timeline(namespace or current().namespace, selector)
