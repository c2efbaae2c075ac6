"""The lesson's pods: list them, read them as ``kubectl`` and the scheduler do, wait for them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..kube import api
from . import quantity
from .lesson import current
from .table import Table
from .wait import wait_for

__all__ = ["GPU", "pods", "pod_status", "pod_gpus", "pending_reason", "placements", "wait_pods",
           "pod_condition", "terminal"]

GPU = "nvidia.com/gpu"


def pod_condition(pod: dict[str, Any], type_: str) -> dict[str, Any] | None:
    """The pod's status condition of type ``type_`` (``"Ready"``, ``"PodScheduled"``), or None."""
    return api.condition(pod, type_)


def terminal(pod: dict[str, Any]) -> bool:
    """Whether the pod has ended (Succeeded or Failed): it holds no GPU any more."""
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed")


def _unschedulable(pod: dict[str, Any]) -> bool:
    c = pod_condition(pod, "PodScheduled")
    return bool(c and c.get("status") == "False" and c.get("reason") == "Unschedulable")


def _reason(pod: dict[str, Any]) -> str:
    c = pod_condition(pod, "PodScheduled")
    if c and c.get("status") == "False":
        return c.get("message") or c.get("reason") or ""
    return ""


def pod_gpus(pod: dict[str, Any], resource: str = GPU) -> int:
    """GPUs a pod holds as the scheduler counts them: max(sum over containers, any one init container)."""
    spec = pod.get("spec") or {}

    def one(c: dict[str, Any]) -> int:
        res = c.get("resources") or {}
        return int(quantity.parse((res.get("limits") or {}).get(resource)
                                  or (res.get("requests") or {}).get(resource) or 0))

    regular = sum(one(c) for c in spec.get("containers") or [])
    init = max([one(c) for c in spec.get("initContainers") or []] or [0])
    return max(regular, init)


def pods(selector: str | None = None, namespace: str | None = None) -> list[dict[str, Any]]:
    """Pods of the lesson's namespace (or ``namespace``; ``"*"`` for all), oldest first, as API dicts."""
    ns = None if namespace == "*" else (namespace or current().namespace)
    items = current().kube.list("Pod", ns, label_selector=selector)
    return sorted(items, key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]))


def pod_status(pod: dict[str, Any]) -> str:
    """The STATUS column of ``kubectl get pods`` (Pending, ContainerCreating, Running, CrashLoopBackOff, …)."""
    md, st = pod["metadata"], pod.get("status") or {}
    if md.get("deletionTimestamp"):
        return "Terminating"
    reason = st.get("reason")
    if reason and st.get("phase") in ("Failed", "Succeeded"):
        return reason
    # kubectl's printer: the first init container that has not succeeded says
    # why (a waiting reason, a failure), else how far initialisation got.
    total = len(pod.get("spec", {}).get("initContainers") or [])
    for i, cs in enumerate(st.get("initContainerStatuses") or []):
        state = cs.get("state") or {}
        term = state.get("terminated")
        if term is not None and term.get("exitCode", 0) == 0:
            continue
        if term is not None:
            if term.get("reason"):
                return f"Init:{term['reason']}"
            return f"Init:Signal:{term['signal']}" if term.get("signal") else f"Init:ExitCode:{term.get('exitCode')}"
        reason = (state.get("waiting") or {}).get("reason")
        if reason and reason != "PodInitializing":
            return f"Init:{reason}"
        return f"Init:{i}/{total}"
    status = st.get("phase") or "Pending"
    for cs in st.get("containerStatuses") or []:
        state = cs.get("state") or {}
        if "waiting" in state and state["waiting"].get("reason"):
            status = state["waiting"]["reason"]
        elif "terminated" in state:
            term = state["terminated"]
            status = term.get("reason") or (f"Signal:{term['signal']}" if term.get("signal")
                                            else f"ExitCode:{term.get('exitCode')}")
    return status


def pending_reason(pod: str | dict[str, Any], namespace: str | None = None, timeout: float = 30) -> str:
    """The scheduler's message for a pod it could not place (waits up to ``timeout`` s for the verdict)."""
    name = pod if isinstance(pod, str) else pod["metadata"]["name"]
    ns = namespace or (pod.get("metadata", {}).get("namespace") if isinstance(pod, dict) else None) \
        or current().namespace

    def verdict() -> str | None:
        p = current().kube.get("Pod", name, ns)
        if p is None:
            return None
        c = pod_condition(p, "PodScheduled")
        if c and c.get("status") == "False" and c.get("message"):
            return c["message"]
        return None

    return wait_for(verdict, timeout, what=f"调度器对 Pod {name} 给出不可调度的原因")


def placements(selector: str | None = None, namespace: str | None = None) -> Table:
    """Where each pod landed (NODE), its STATUS, GPUs, and the scheduler's message if it did not land."""
    rows = [{"POD": p["metadata"]["name"], "NODE": p.get("spec", {}).get("nodeName"),
             "STATUS": pod_status(p), "GPUS": pod_gpus(p) or None, "WHY NOT SCHEDULED": _reason(p)}
            for p in pods(selector, namespace)]
    return Table(rows, ["POD", "NODE", "STATUS", "GPUS", "WHY NOT SCHEDULED"])


_POD_TESTS: dict[str, Callable[[dict[str, Any]], bool]] = {
    "Ready": lambda p: (pod_condition(p, "Ready") or {}).get("status") == "True",
    "Scheduled": lambda p: bool(p.get("spec", {}).get("nodeName")),
    "Unschedulable": _unschedulable,
    "Terminated": terminal,
}


def wait_pods(selector: str | None = None, condition: str | Callable[[dict[str, Any]], bool] = "Running",
              count: int = 1, namespace: str | None = None, timeout: float = 60) -> list[dict[str, Any]]:
    """Wait until at least ``count`` pods match ``selector`` and ``condition``; return them.

    ``condition`` is a phase (``"Running"``, ``"Succeeded"``, ``"Failed"``),
    ``"Ready"``, ``"Scheduled"``, ``"Unschedulable"`` (the scheduler has said
    why not), ``"Terminated"`` (Succeeded or Failed), or a predicate on the pod.
    """
    test = condition if callable(condition) else _POD_TESTS.get(condition) or (
        lambda p, c=condition: p.get("status", {}).get("phase") == c)

    def ready() -> list[dict[str, Any]] | None:
        hits = [p for p in pods(selector, namespace) if test(p)]
        return hits if len(hits) >= count else None

    what = f"{count} 个{'满足条件的' if callable(condition) else ' ' + condition + ' 的'} Pod" + (
        f"（{selector}）" if selector else "")
    return wait_for(ready, timeout, what=what)
