"""`kubectl top` through the real metrics-server, fed by the node agent's /metrics/resource.

A pod with a real command (a busy loop in its sandbox) shows the CPU it burns;
a simulated pod shows what its ``gpulab.io/cpu-usage`` and
``gpulab.io/memory-usage`` annotations declare. ``kubectl top nodes`` shows
CPU and memory of every node, and no GPU column: GPUs are not resource
metrics (their usage is the DCGM exporter's, see test_observability.py).
"""

from __future__ import annotations

import re

import pytest
from helpers import wait_for
from kubernetes.utils import parse_quantity

from gpulab.cluster import metricsserver
from gpulab.runtime import resourcemetrics

pytestmark = pytest.mark.cluster


def pod(name: str, ns: str, command: list[str] | None = None, annotations: dict[str, str] | None = None) -> dict:
    # Without a command, an image gpulab has no program for (busybox's would run its shell and exit): simulated.
    container = {"name": "main", "image": "busybox:1.36" if command else "registry.example.com/app:1.0"}
    if command:
        container["command"] = command
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "annotations": annotations or {}},
            "spec": {"containers": [container], "terminationGracePeriodSeconds": 1}}


def top(kubectl, *args: str) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of `kubectl top ...`, or ([], []) while metrics are not there yet."""
    proc = kubectl("top", *args, check=False)
    if proc.returncode != 0:
        return [], []
    lines = [ln.split() for ln in proc.stdout.strip().splitlines()]
    return (lines[0], lines[1:]) if lines else ([], [])


def test_kubectl_top_shows_real_and_declared_usage(kube, kubectl, ns, cluster):
    assert cluster.status()["components"]["metrics-server"]["state"] == "up"
    wait_for(lambda: metricsserver.available(kube), 60, what="APIService v1beta1.metrics.k8s.io Available")
    kube.create(pod("busy", ns, ["sh", "-c", "while :; do :; done"]))
    kube.create(pod("declared", ns, annotations={resourcemetrics.CPU_ANNOTATION: "250m",
                                                 resourcemetrics.MEMORY_ANNOTATION: "64Mi"}))
    wait_for(lambda: all((kube.get("Pod", n, ns) or {}).get("status", {}).get("phase") == "Running"
                         for n in ("busy", "declared")), 60, what="both pods Running")

    def both_shown():
        header, rows = top(kubectl, "pods", "-n", ns)
        shown = {r[0]: r for r in rows}
        return (header, shown) if {"busy", "declared"} <= set(shown) else None

    # metrics-server needs two scrapes (--metric-resolution=10s) of a container to give it a rate.
    header, shown = wait_for(both_shown, 90, interval=2, what="`kubectl top pods` showing both pods")
    assert header == ["NAME", "CPU(cores)", "MEMORY(bytes)"]
    busy_cpu = float(parse_quantity(shown["busy"][1]))
    assert busy_cpu > 0.05, shown["busy"]  # a busy loop burns CPU (on a loaded 2-core machine, at least some)
    assert float(parse_quantity(shown["busy"][2])) > 0, shown["busy"]
    declared_cpu = float(parse_quantity(shown["declared"][1]))
    assert 0.2 <= declared_cpu <= 0.3, shown["declared"]  # 250m, as declared
    assert parse_quantity(shown["declared"][2]) == parse_quantity("64Mi"), shown["declared"]

    header, rows = wait_for(lambda: (lambda h, r: (h, r) if r and all("<unknown>" not in row for row in r)
                                     else None)(*top(kubectl, "nodes")),
                            60, interval=2, what="`kubectl top nodes` with numbers for every node")
    assert header == ["NAME", "CPU(cores)", "CPU(%)", "MEMORY(bytes)", "MEMORY(%)"]
    assert not any("GPU" in h for h in header)
    assert {r[0] for r in rows} == {n["metadata"]["name"] for n in kube.list("Node")}
    for row in rows:
        assert re.fullmatch(r"\d+m?", row[1]) and re.fullmatch(r"\d+(Ki|Mi|Gi)?", row[3]), row
    node = kube.get("Pod", "busy", ns)["spec"]["nodeName"]
    node_cpu = float(parse_quantity(next(r for r in rows if r[0] == node)[1]))
    assert node_cpu >= 0.05  # the busy loop runs there


def test_nodes_announce_where_their_resource_metrics_are(kube):
    for node in kube.list("Node"):
        ann = node["metadata"].get("annotations") or {}
        assert ann.get(resourcemetrics.PATH_ANNOTATION) == resourcemetrics.node_path(node["metadata"]["name"])
