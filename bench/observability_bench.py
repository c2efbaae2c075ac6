"""Observability benchmark: DCGM scrape and custom metrics latency with 50 GPU pods, HPA reaction time.

    .venv/bin/python bench/observability_bench.py [--pods 50] [--queries 40]

Starts its own cluster (topology manifests/topologies/bench-56-gpus.yaml:
seven 8-GPU nodes) in a temp GPULAB_HOME, runs ``--pods`` single-GPU pods,
then measures

- one exporter's ``/metrics`` (one node, 8 GPUs) and a scrape of all exporters;
- ``custom.metrics.k8s.io`` through the apiserver's aggregation layer, for
  all pods of the namespace (what the HPA controller asks) and for one pod;
- an HPA on ``DCGM_FI_DEV_GPU_UTIL``: seconds from ``gpulab load`` to the
  HPA's new desired replica count, and to that replica being Ready.

Results print as a Markdown table for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpulab.kube import api
from gpulab.cluster.embedded import EmbeddedCluster  # noqa: E402
from gpulab.fakegpu import load, monitoring  # noqa: E402

TOPOLOGY = REPO / "manifests" / "topologies" / "bench-56-gpus.yaml"
MANIFESTS = REPO / "manifests" / "07-monitoring-cost"
NS = "bench"


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def wait(fn, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def gpu_pods_deployment(n: int) -> dict:
    # The lesson's model server, scaled to n replicas, without the HPA.
    dep = yaml.safe_load((MANIFESTS / "llm-autoscaled.yaml").read_text())
    dep = copy.deepcopy(dep)
    dep["metadata"]["name"] = "fleet"
    dep["spec"]["replicas"] = n
    for key in ("selector",):
        dep["spec"][key]["matchLabels"] = {"app": "fleet"}
    dep["spec"]["template"]["metadata"]["labels"] = {"app": "fleet"}
    dep["spec"]["template"]["metadata"]["annotations"]["gpulab.io/gpu-utilization"] = "35"
    return dep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=50)
    ap.add_argument("--queries", type=int, default=40)
    args = ap.parse_args()

    home = Path(tempfile.mkdtemp(prefix="gl-obs-", dir="/tmp"))
    home.chmod(0o755)
    os.environ["GPULAB_HOME"] = str(home)
    cluster = EmbeddedCluster(home / "cluster")
    rows: list[tuple[str, str]] = []
    try:
        t0 = time.monotonic()
        cluster.up(TOPOLOGY, say=lambda m: None)
        rows.append(("cluster up (8 nodes, 56 GPUs)", f"{time.monotonic() - t0:.1f} s"))
        kube = api.Client(cluster.kubeconfig)
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        wait(lambda: kube.get("ServiceAccount", "default", NS), 30, "default service account")

        t0 = time.monotonic()
        kube.create({**gpu_pods_deployment(args.pods), "metadata": {**gpu_pods_deployment(args.pods)["metadata"],
                                                                     "namespace": NS}})
        wait(lambda: int((kube.get("Deployment", "fleet", NS).get("status") or {}).get("readyReplicas") or 0)
             == args.pods, 300, f"{args.pods} ready GPU pods")
        rows.append((f"{args.pods} GPU pods Ready", f"{time.monotonic() - t0:.1f} s"))

        endpoints = monitoring.exporter_endpoints(kube)
        one = endpoints[sorted(endpoints)[0]]
        one_page = timed(lambda: urllib.request.urlopen(one, timeout=5).read(), args.queries)
        rows.append(("scrape one exporter (8 GPUs), p50 / p95", f"{pct(one_page, .5):.1f} / {pct(one_page, .95):.1f} ms"))
        everything = timed(lambda: monitoring.scrape_all(kube), args.queries)
        rows.append((f"scrape all {len(endpoints)} exporters (incl. finding them), p50 / p95",
                     f"{pct(everything, .5):.1f} / {pct(everything, .95):.1f} ms"))

        path = f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{NS}/pods/*/DCGM_FI_DEV_GPU_UTIL"
        body = kube.request("GET", path)
        assert len(body["items"]) == args.pods, len(body["items"])
        query = timed(lambda: kube.request("GET", path), args.queries)
        rows.append((f"custom metrics, all {args.pods} pods, p50 / p95",
                     f"{pct(query, .5):.1f} / {pct(query, .95):.1f} ms"))
        pod = body["items"][0]["describedObject"]["name"]
        single = timed(lambda: kube.request("GET", path.replace("/*/", f"/{pod}/")), args.queries)
        rows.append(("custom metrics, one pod, p50 / p95", f"{pct(single, .5):.1f} / {pct(single, .95):.1f} ms"))

        # HPA reaction: the lesson's Deployment and HPA, load from 0 to 80 % of one GPU.
        for f in ("llm-autoscaled.yaml", "llm-hpa.yaml"):
            for doc in yaml.safe_load_all((MANIFESTS / f).read_text()):
                doc["metadata"]["namespace"] = NS
                kube.create(doc)
        wait(lambda: int((kube.get("Deployment", "llm", NS).get("status") or {}).get("readyReplicas") or 0) == 1,
             120, "one llm replica")
        wait(lambda: ((kube.get("HorizontalPodAutoscaler", "llm", NS) or {}).get("status") or {}).get(
            "currentMetrics"), 60, "the HPA's first metrics")
        t0 = time.monotonic()
        load.set_load(kube, "svc/llm", "5", NS)
        wait(lambda: (kube.get("Deployment", "llm", NS)["spec"]["replicas"] == 2), 120, "the HPA to scale out")
        decided = time.monotonic() - t0
        wait(lambda: int((kube.get("Deployment", "llm", NS).get("status") or {}).get("readyReplicas") or 0) == 2,
             120, "the second replica Ready")
        ready = time.monotonic() - t0
        rows.append(("HPA: load change -> new replica requested", f"{decided:.1f} s"))
        rows.append(("HPA: load change -> new replica Ready (2 s model load)", f"{ready:.1f} s"))
        t0 = time.monotonic()
        load.set_load(kube, "svc/llm", "0", NS)
        wait(lambda: (kube.get("Deployment", "llm", NS)["spec"]["replicas"] == 1), 180, "the HPA to scale in")
        rows.append(("HPA: load gone -> scaled back in (15 s stabilisation)", f"{time.monotonic() - t0:.1f} s"))
    finally:
        cluster.down(purge=True, say=lambda m: None)

    print("| measure | value |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")
    print(json.dumps(dict(rows)), file=sys.stderr)


if __name__ == "__main__":
    main()
