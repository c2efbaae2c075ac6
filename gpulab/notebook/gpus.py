"""The cluster's GPUs: how many cards each node offers, and which pods hold them, as the scheduler counts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..cluster import baseline
from . import quantity
from .lesson import current
from .pod import GPU, pod_gpus, pod_status, pods, terminal
from .table import Table

__all__ = ["gpu_allocation", "nodes", "gpu_pods"]


def gpu_allocation() -> dict[str, dict[str, Any]]:
    """Per node reporting GPUs: allocatable count and the pods holding them, as the scheduler counts.

    A pod holds its GPUs from the moment it is bound to a node until it
    reaches Succeeded or Failed (or is gone), whatever its namespace.
    """
    out: dict[str, dict[str, Any]] = {}
    kube = current().kube
    for node in sorted(kube.list("Node"), key=lambda n: n["metadata"]["name"]):
        alloc = int(quantity.parse((node.get("status", {}).get("allocatable") or {}).get(GPU, 0)))
        if alloc:
            out[node["metadata"]["name"]] = {"allocatable": alloc, "pods": [], "used": 0}
    for p in kube.list("Pod"):
        node = p.get("spec", {}).get("nodeName")
        n = pod_gpus(p)
        if node in out and n and not terminal(p):
            out[node]["pods"].append((f"{p['metadata']['namespace']}/{p['metadata']['name']}", n))
            out[node]["used"] += n
    for entry in out.values():
        entry["pods"].sort()
    return out


def nodes(labels: Sequence[str] = ()) -> Table:
    """Every node: GPU model, allocatable and used nvidia.com/gpu, taints, and the label columns asked for."""
    alloc = gpu_allocation()
    rows = []
    for node in sorted(current().kube.list("Node"), key=lambda n: n["metadata"]["name"]):
        name = node["metadata"]["name"]
        node_labels = node["metadata"].get("labels") or {}
        row = {"NODE": name, "GPU MODEL": node_labels.get("nvidia.com/gpu.product"),
               "ALLOCATABLE GPU": alloc.get(name, {}).get("allocatable", 0),
               "GPU IN USE": alloc.get(name, {}).get("used", 0),
               "TAINTS": [baseline.taint_text(t) for t in node.get("spec", {}).get("taints") or []]}
        for key in labels:
            row[key] = node_labels.get(key)
        rows.append(row)
    return Table(rows, ["NODE", "GPU MODEL", "ALLOCATABLE GPU", "GPU IN USE", *labels, "TAINTS"])


def gpu_pods(all_namespaces: bool = True) -> Table:
    """Pods whose containers have a ``nvidia.com/gpu`` limit — the chapter's ``jq`` filter, in Python.

    Same selection as ``kubectl get pods -A -o json | jq -r '.items[] |
    select([.spec.containers[].resources.limits["nvidia.com/gpu"]] | any) |
    "\\(.metadata.namespace)/\\(.metadata.name)"'``: every such pod, whatever
    its phase. The table adds NODE, GPUS and STATUS; ``row["POD"]`` is the
    ``namespace/name`` line jq prints.
    """
    rows = []
    for p in pods(namespace="*" if all_namespaces else None):
        if any(((c.get("resources") or {}).get("limits") or {}).get(GPU) for c in p["spec"].get("containers") or []):
            rows.append({"POD": f"{p['metadata']['namespace']}/{p['metadata']['name']}",
                         "NODE": p["spec"].get("nodeName"), "GPUS": pod_gpus(p), "STATUS": pod_status(p)})
    rows.sort(key=lambda r: r["POD"])
    return Table(rows, ["POD", "NODE", "GPUS", "STATUS"])
