"""Metrics: the GPU metrics the lessons read, as the DCGM exporter serves them and as the HPA sees them."""

from __future__ import annotations

from typing import Any

from ..kube import api
from .lesson import current
from .table import Table

__all__ = ["dcgm_metrics", "custom_metrics"]


# The DCGM fields dcgm_metrics() shows, and the column key each becomes.
DCGM_COLUMNS = {"DCGM_FI_DEV_GPU_UTIL": "GPU_UTIL %", "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "GR_ENGINE_ACTIVE",
                "DCGM_FI_DEV_FB_USED": "FB_USED MiB", "DCGM_FI_DEV_FB_FREE": "FB_FREE MiB",
                "DCGM_FI_DEV_GPU_TEMP": "TEMP °C", "DCGM_FI_DEV_POWER_USAGE": "POWER W"}


def dcgm_metrics(node: str | None = None, pod_only: bool = False) -> Table:
    """One row per GPU (or MIG instance) from the DCGM exporters' pages, as Prometheus would scrape them."""
    from ..fakegpu import dcgm

    pages = dcgm.scrape_all(current().kube)
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for name in sorted(pages):
        if node is not None and name != node:
            continue
        for metric, labels, value in dcgm.parse(pages[name]):
            if metric not in DCGM_COLUMNS:
                continue
            key = (name, labels.get("gpu", ""), labels.get("GPU_I_ID", ""))
            row = rows.setdefault(key, {"NODE": name, "GPU": labels.get("gpu", "") + (
                f" / MIG {labels['GPU_I_PROFILE']}" if labels.get("GPU_I_PROFILE") else ""), "POD": ""})
            if labels.get("pod"):
                row["POD"] = f"{labels.get('namespace')}/{labels['pod']}"
            row[DCGM_COLUMNS[metric]] = value if metric != "DCGM_FI_PROF_GR_ENGINE_ACTIVE" else round(value, 2)
    out = [r for r in rows.values() if r["POD"] or not pod_only]
    wanted = ["NODE", "GPU", "POD", *DCGM_COLUMNS.values()]
    present = [c for c in wanted if any(c in r for r in out)] or wanted[:3]
    return Table(out, present)


def custom_metrics(metric: str = "DCGM_FI_DEV_GPU_UTIL", namespace: str | None = None) -> Table:
    """Per-pod values of ``metric`` as the HPA controller reads them: from custom.metrics.k8s.io via the apiserver.

    Empty while the API does not serve ``metric`` (yet): without the monitoring add-on nothing serves
    custom.metrics.k8s.io, and prometheus-adapter answers 404 for a metric it has not listed, until its next
    relist finds the series."""
    ns = namespace or current().namespace
    try:
        body = current().kube.request("GET", f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/*/{metric}")
    except api.NotFound:
        body = {}
    return Table([{"POD": i["describedObject"]["name"], "METRIC": i["metric"]["name"], "VALUE": i["value"]}
                  for i in body.get("items") or []], ["POD", "METRIC", "VALUE"])
