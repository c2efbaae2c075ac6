"""Observability benchmark: DCGM scrapes, custom metrics and usage-report latency with 50 GPU pods, HPA reaction.

    .venv/bin/python bench/observability_bench.py [--pods 50] [--queries 40]

Starts its own cluster (topology manifests/topologies/bench-56-gpus.yaml:
seven 8-GPU nodes) in a temp GPULAB_HOME, installs the monitoring add-on (timed:
custom metrics come from prometheus-adapter over Prometheus' series, the pipeline
DCGM exporter -> Prometheus -> adapter -> HPA), runs ``--pods`` single-GPU pods,
then measures

- one exporter's ``/metrics`` (one node, 8 GPUs) and a scrape of all exporters;
- a PromQL query through the apiserver's service proxy, and ``gpulab report``'s
  queries (``usage.collect``) over the pods' window;
- ``custom.metrics.k8s.io`` through the apiserver's aggregation layer, for
  all pods of the namespace (what the HPA controller asks) and for one pod;
- an HPA on ``DCGM_FI_DEV_GPU_UTIL``: seconds from ``gpulab load`` to the
  HPA's new desired replica count, and to that replica being Ready;
- the RSS of the add-on's processes.

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

from gpulab import usage  # noqa: E402
from gpulab.kube import api  # noqa: E402
from gpulab.cluster import addons  # noqa: E402
from gpulab.cluster.embedded import EmbeddedCluster  # noqa: E402
from gpulab.fakegpu import dcgm, load  # noqa: E402

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
    dep = next(d for d in yaml.safe_load_all((MANIFESTS / "llm-autoscaled.yaml").read_text())
               if d and d["kind"] == "Deployment")
    dep = copy.deepcopy(dep)
    dep["metadata"]["name"] = "fleet"
    dep["spec"]["replicas"] = n
    for key in ("selector",):
        dep["spec"][key]["matchLabels"] = {"app": "fleet"}
    dep["spec"]["template"]["metadata"]["labels"] = {"app": "fleet"}
    dep["spec"]["template"]["metadata"]["annotations"]["gpulab.io/gpu-utilization"] = "35"
    # Simulated containers (an image gpulab has no program for): 50 real servers would measure the machine.
    for c in dep["spec"]["template"]["spec"]["containers"]:
        c["image"] = "nvcr.io/nvidia/tritonserver:24.08-py3"
        for key in ("command", "args", "readinessProbe", "livenessProbe", "startupProbe", "volumeMounts"):
            c.pop(key, None)
    dep["spec"]["template"]["spec"].pop("volumes", None)
    dep["spec"]["template"]["spec"].pop("initContainers", None)
    return dep


def addon_rss() -> list[tuple[str, float]]:
    """RSS of the add-on's programs and of the container shims that keep them (one each)."""
    import psutil

    found: dict[str, float] = {}
    for proc in psutil.process_iter(["cmdline", "memory_info"]):
        cmd = proc.info["cmdline"] or []
        if not cmd or proc.info["memory_info"] is None:
            continue
        for program in ("/bin/prometheus", "/adapter", "/kube-state-metrics"):
            if cmd[0] == program:
                found[program.lstrip("/").split("/")[-1]] = proc.info["memory_info"].rss / 2**20
    return sorted(found.items())


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
        t0 = time.monotonic()
        addons.install(cluster.kubeconfig, "monitoring", say=lambda m: None)
        rows.append(("monitoring add-on installed (3 Deployments, 2 APIServices available)",
                     f"{time.monotonic() - t0:.1f} s"))
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        wait(lambda: kube.get("ServiceAccount", "default", NS), 30, "default service account")

        t0 = time.monotonic()
        pods_started = time.time()
        kube.create({**gpu_pods_deployment(args.pods), "metadata": {**gpu_pods_deployment(args.pods)["metadata"],
                                                                     "namespace": NS}})
        wait(lambda: int((kube.get("Deployment", "fleet", NS).get("status") or {}).get("readyReplicas") or 0)
             == args.pods, 300, f"{args.pods} ready GPU pods")
        rows.append((f"{args.pods} GPU pods Ready", f"{time.monotonic() - t0:.1f} s"))

        endpoints = dcgm.exporter_endpoints(kube)
        one = endpoints[sorted(endpoints)[0]]
        one_page = timed(lambda: urllib.request.urlopen(one, timeout=5).read(), args.queries)
        rows.append(("scrape one exporter (8 GPUs), p50 / p95", f"{pct(one_page, .5):.1f} / {pct(one_page, .95):.1f} ms"))
        everything = timed(lambda: dcgm.scrape_all(kube), args.queries)
        rows.append((f"scrape all {len(endpoints)} exporters (incl. finding them), p50 / p95",
                     f"{pct(everything, .5):.1f} / {pct(everything, .95):.1f} ms"))

        path = f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{NS}/pods/*/DCGM_FI_DEV_GPU_UTIL"

        # The adapter lists the new series at its next relist (30 s).
        def served() -> bool:
            try:
                return len(kube.request("GET", path).get("items") or []) == args.pods
            except api.NotFound:  # not listed yet: the metric is unknown until the relist
                return False

        t0 = time.monotonic()
        wait(served, 120, "the adapter to serve every pod")
        rows.append((f"{args.pods} pods Ready -> the adapter serves all of them (its 30 s relist)",
                     f"{time.monotonic() - t0:.1f} s"))
        promql = ("/api/v1/namespaces/monitoring/services/prometheus:9090/proxy/api/v1/query?query="
                  "avg%20by%20(pod)(DCGM_FI_DEV_GPU_UTIL%7Bnamespace%3D%22bench%22%7D)")
        q = timed(lambda: kube.request("GET", promql), args.queries)
        rows.append((f"PromQL avg by (pod) over {args.pods} pods, through the service proxy, p50 / p95",
                     f"{pct(q, .5):.1f} / {pct(q, .95):.1f} ms"))
        window = time.time() - pods_started
        report = usage.collect(cluster.kubeconfig, since=window)
        assert sum(u.gpus_now for u in report.namespaces if u.name == NS) == args.pods, report.text()
        collect = timed(lambda: usage.collect(cluster.kubeconfig, since=window), max(5, args.queries // 4))
        rows.append((f"gpulab report ({len(report.queries)} PromQL queries, {window / 60:.0f} min of {args.pods} pods), "
                     "p50 / p95", f"{pct(collect, .5):.1f} / {pct(collect, .95):.1f} ms"))
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
        for name, rss in addon_rss():
            rows.append((f"RSS {name}", f"{rss:.1f} MiB"))
    finally:
        cluster.down(purge=True, say=lambda m: None)

    print("| measure | value |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")
    print(json.dumps(dict(rows)), file=sys.stderr)


if __name__ == "__main__":
    main()
