"""`gpulab status` on the embedded backend: components up or down, and each node's GPUs.

:meth:`gpulab.cluster.embedded.EmbeddedCluster.status` collects it and ``render_status`` shows it;
the kind backend has its own (node containers instead of processes). Both answer the same
:class:`gpulab.cluster.base.Cluster` calls, with ``exists`` and ``up`` in what they return.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes.utils import parse_quantity

from .. import paths
from ..i18n import _, pad
from ..kube import api
from ..kube.names import ALLOCATED_DEVICES_ANNOTATION
from .base import Cluster

GPU_PREFIX = "nvidia.com/"
# Written on each pod by the node agent after admission (gpulab.fakegpu.node).


def _requests(pod: dict[str, Any]) -> dict[str, float]:
    """Effective requests of a pod as the scheduler counts them."""
    spec = pod.get("spec") or {}
    total: dict[str, float] = {}
    for c in spec.get("containers") or []:
        res = c.get("resources") or {}
        for k, v in {**(res.get("limits") or {}), **(res.get("requests") or {})}.items():
            total[k] = total.get(k, 0) + float(parse_quantity(v))
    for c in spec.get("initContainers") or []:
        res = c.get("resources") or {}
        for k, v in {**(res.get("limits") or {}), **(res.get("requests") or {})}.items():
            total[k] = max(total.get(k, 0), float(parse_quantity(v)))
    return total


def collect(cluster: Cluster, components: tuple[str, ...]) -> dict[str, Any]:
    """The cluster's ``components`` (each up with its pid, or down) and, with an apiserver, its nodes."""
    if not cluster.exists():
        return {"backend": "embedded", "exists": False, "up": False, "dir": str(cluster.root)}
    running = cluster.running()
    out: dict[str, Any] = {
        "backend": "embedded",
        "exists": True,
        "dir": str(cluster.root),
        "kubeconfig": str(cluster.kubeconfig),
        "components": {c: ({"state": "up", "pid": running[c]} if c in running else {"state": "down"})
                       for c in components},
        "nodes": [],
    }
    out["up"] = all(c["state"] == "up" for c in out["components"].values())
    if "kube-apiserver" not in running:
        return out
    try:
        client = api.Client(cluster.kubeconfig, timeout=5)
        nodes = client.list("Node")
        pods = client.list("Pod")
    except Exception as e:  # status must report, not crash
        out["error"] = f"apiserver not answering: {e}"
        return out
    allocated: dict[str, dict[str, float]] = {}
    devices: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for k, v in _requests(pod).items():
            if k.startswith(GPU_PREFIX):
                allocated.setdefault(node, {})[k] = allocated.get(node, {}).get(k, 0) + v
        md = pod["metadata"]
        try:
            held = json.loads((md.get("annotations") or {}).get(ALLOCATED_DEVICES_ANNOTATION) or "{}")
        except ValueError:
            held = {}
        for container, resources in sorted(held.items()):
            for resource, ids in sorted(resources.items()):
                devices.setdefault(node, []).append({"pod": f"{md['namespace']}/{md['name']}",
                                                     "container": container, "resource": resource, "ids": ids})
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        name = node["metadata"]["name"]
        st = node.get("status") or {}
        labels = node["metadata"].get("labels") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])
        resources = sorted({k for k in {**(st.get("capacity") or {}), **(st.get("allocatable") or {})}
                            if k.startswith(GPU_PREFIX)})
        out["nodes"].append({
            "name": name,
            "ready": ready,
            "gpuModel": labels.get("nvidia.com/gpu.product", ""),
            "resources": {r: {"capacity": int(parse_quantity((st.get("capacity") or {}).get(r, "0"))),
                              "allocatable": int(parse_quantity((st.get("allocatable") or {}).get(r, "0"))),
                              "allocated": int(allocated.get(name, {}).get(r, 0))} for r in resources},
            "taints": [f"{t['key']}{'=' + t['value'] if t.get('value') else ''}:{t['effect']}"
                       for t in (node.get("spec") or {}).get("taints") or []],
            # What the kubelet's device manager gave each container (its checkpoint, as pods show it).
            "devices": devices.get(name, []),
        })
    return out


def render(st: dict[str, Any]) -> str:
    if not st["exists"]:
        return _("no cluster yet: `gpulab up` creates one")
    lines = [_("backend: {backend}   state: {path}", backend=st["backend"], path=paths.shown(st["dir"])),
             _("kubeconfig: {path}", path=paths.shown(st["kubeconfig"])), ""]
    lines.append(" ".join((pad(_("COMPONENT"), 25), pad(_("STATE"), 7), _("PID"))))
    for name, c in st["components"].items():
        lines.append(f"{name:<25} {c['state']:<7} {c.get('pid', '')}")
    if st.get("error"):
        lines += ["", st["error"]]
    if st["nodes"]:
        lines += ["", " ".join((pad(_("NODE"), 14), pad(_("READY"), 6), pad(_("GPU"), 26), pad(_("RESOURCE"), 24),
                                pad(_("CAP"), 4, right=True), pad(_("ALLOC"), 6, right=True),
                                pad(_("USED"), 5, right=True), " " + _("TAINTS")))]
        for n in st["nodes"]:
            taints = ",".join(n["taints"]) or "<none>"
            rows = list(n["resources"].items()) or [("-", None)]
            ready = _("yes") if n["ready"] else _("no")
            for i, (res, v) in enumerate(rows):
                first = i == 0
                cap = alloc = used = ""
                if v:
                    cap, alloc, used = str(v["capacity"]), str(v["allocatable"]), str(v["allocated"])
                lines.append(
                    f"{n['name'] if first else '':<14} {pad(ready if first else '', 6)} "
                    f"{(n['gpuModel'] or '-') if first else '':<26} {res:<24} {cap:>4} {alloc:>6} {used:>5}  "
                    f"{taints if first else ''}")
    held = [(n["name"], d) for n in st["nodes"] for d in n.get("devices", [])]
    if held:
        lines += ["", " ".join((pad(_("NODE"), 14), pad(_("POD"), 40), pad(_("CONTAINER"), 16), pad(_("RESOURCE"), 24),
                                _("DEVICES")))]
        for node, d in held:
            lines.append(f"{node:<14} {d['pod']:<40} {d['container']:<16} {d['resource']:<24} {','.join(d['ids'])}")
    return "\n".join(lines)
