"""Events: what the cluster's controllers said about one object, oldest first."""

from __future__ import annotations

from typing import Any

from .lesson import current
from .table import Table

__all__ = ["events"]


def events(obj: str | dict[str, Any], namespace: str | None = None) -> Table:
    """Events about ``obj`` (``"pod/NAME"``, ``"job/NAME"``, a bare pod name, or an API dict), oldest first.

    Like ``kubectl events --for KIND/NAME`` without the age column: TYPE,
    REASON, FROM, COUNT, MESSAGE.
    """
    if isinstance(obj, dict):
        kind, name = obj.get("kind", "Pod"), obj["metadata"]["name"]  # list items carry no kind
        ns = namespace or obj["metadata"].get("namespace")
    else:
        kind, _, name = obj.rpartition("/")
        kind = {"": "Pod", "pod": "Pod", "po": "Pod", "job": "Job", "deployment": "Deployment", "deploy": "Deployment",
                "replicaset": "ReplicaSet", "rs": "ReplicaSet", "node": "Node", "service": "Service",
                "pvc": "PersistentVolumeClaim", "persistentvolumeclaim": "PersistentVolumeClaim"}.get(kind.lower(), kind)
        ns = namespace
    if kind == "Node":
        ns = "default"
    ns = ns or current().namespace
    items = current().kube.list("Event", ns, field_selector=f"involvedObject.name={name}")
    items = [e for e in items if e.get("involvedObject", {}).get("kind") == kind]

    def when(e: dict[str, Any]) -> tuple[str, int]:
        series = (e.get("series") or {}).get("lastObservedTime")
        t = series or e.get("lastTimestamp") or e.get("eventTime") or e["metadata"].get("creationTimestamp") or ""
        return (t[:19], int(e["metadata"].get("resourceVersion") or 0))

    rows = []
    for e in sorted(items, key=when):
        source = e.get("reportingComponent") or (e.get("source") or {}).get("component") or ""
        count = (e.get("series") or {}).get("count") or e.get("count") or 1
        rows.append({"TYPE": e.get("type"), "REASON": e.get("reason"), "FROM": source, "COUNT": count,
                     "MESSAGE": e.get("message", "")})
    return Table(rows, ["TYPE", "REASON", "FROM", "COUNT", "MESSAGE"], title=f"{kind.lower()}/{name} 的事件")
