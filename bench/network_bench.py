"""Pod network benchmark: sandbox set-up per pod, and requests through a Service.

Two measures, each on something of its own:

- ``--sandboxes N`` (default 20): the pod network alone (its namespace and apiserver relay, as the node
  agent starts them, against a stand-in apiserver port; no cluster): N pod sandboxes made one after another as the node agent makes them
  (sandbox process + CNI loopback, bridge with host-local IPAM, portmap), then torn down (CNI DEL);
  milliseconds per pod, median and max.
- ``--requests N`` (default 2000): on a fresh embedded cluster, a Deployment of 2 HTTP servers behind a
  ClusterIP Service; a client pod sends N requests, a new TCP connection each (so kube-proxy's DNAT
  picks an endpoint every time), first to one server's pod IP, then through the Service by name.
  Requests per second of each, and how the Service spread them.

Usage: .venv/bin/python bench/network_bench.py [--sandboxes N] [--requests N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpulab.cluster import binaries  # noqa: E402
from gpulab.runtime import network  # noqa: E402


def bench_sandboxes(count: int) -> dict[str, list[float]]:
    bins = binaries.ensure()
    home = Path(tempfile.mkdtemp(prefix="gl-netbench-"))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))  # the apiserver the relay would lead to: nothing is asked of it here
    listener.listen()
    relay = network.ApiRelay(home, listener.getsockname()[1])
    out: dict[str, list[float]] = {"setup_ms": [], "teardown_ms": []}
    try:
        relay.start()
        pods = network.PodNetwork(home, home / "nodes", bins.cni_bin_dir, isolated=True)
        pods.set_node("bench-node", "10.244.7.0/24")
        made = []
        for i in range(count):
            pod = {"metadata": {"name": f"p{i}", "namespace": "bench", "uid": f"bench-{i}"}, "spec": {}}
            pod_dir = home / "pods" / f"p{i}"
            pod_dir.mkdir(parents=True)
            t0 = time.perf_counter()
            pods.setup(pod, "bench-node", pod_dir)
            out["setup_ms"].append((time.perf_counter() - t0) * 1000)
            made.append((pod, pod_dir))
        for pod, pod_dir in made:
            t0 = time.perf_counter()
            pods.teardown(pod, "bench-node", pod_dir)
            out["teardown_ms"].append((time.perf_counter() - t0) * 1000)
    finally:
        relay.stop()
        network.stop_sandboxes(home)
        relay.network.stop_holder()
        listener.close()
        shutil.rmtree(home, ignore_errors=True)
    return out


SERVER = """
import http.server, socket
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = socket.gethostname().encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("", 8080), H).serve_forever()
"""

CLIENT = """
import collections, http.client, sys, time
n = int(sys.argv[1])
def run(host, port):
    seen = collections.Counter()
    t0 = time.perf_counter()
    for _ in range(n):
        c = http.client.HTTPConnection(host, port, timeout=5)
        c.request("GET", "/"); seen[c.getresponse().read().decode()] += 1; c.close()
    return n / (time.perf_counter() - t0), seen
direct, _ = run(sys.argv[2], 8080)
service, seen = run("web", 80)
print(f"{direct:.0f} {service:.0f} " + ",".join(str(v) for v in sorted(seen.values())))
"""


def bench_requests(count: int) -> tuple[float, float, str]:
    from gpulab.cluster.embedded import EmbeddedCluster
    from gpulab.kube.api import Client

    home = Path(tempfile.mkdtemp(prefix="gl-netbench-"))
    os.environ["GPULAB_HOME"] = str(home)
    cluster = EmbeddedCluster(home / "cluster")
    try:
        cluster.up(say=lambda m: None)
        kube = Client(cluster.kubeconfig)
        ns = "default"
        kube.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": ns},
                     "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                              "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{
                                  "name": "web", "image": "python:3.11", "command": ["python3", "-c", SERVER],
                                  "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}}]}}}})
        kube.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": ns},
                     "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}})
        deadline = time.monotonic() + 120
        while (kube.get("Deployment", "web", ns) or {}).get("status", {}).get("readyReplicas") != 2:
            if time.monotonic() > deadline:
                raise RuntimeError("the servers did not become Ready")
            time.sleep(0.5)
        time.sleep(2)  # kube-proxy has the endpoints by now
        ip = kube.list("Pod", ns, label_selector="app=web")[0]["status"]["podIP"]
        kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client", "namespace": ns},
                     "spec": {"restartPolicy": "Never", "containers": [{
                         "name": "c", "image": "python:3.11",
                         "command": ["python3", "-c", CLIENT, str(count), ip]}]}})
        deadline = time.monotonic() + 600
        while (kube.get("Pod", "client", ns) or {}).get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            if time.monotonic() > deadline:
                raise RuntimeError("the client did not finish")
            time.sleep(1)
        logs = next((home / "cluster" / "pods").glob(f"{ns}_client_*/logs/c/0.log")).read_text().split()
        direct, service, spread = logs[-3:]
        return float(direct), float(service), spread
    finally:
        cluster.down(purge=True)
        shutil.rmtree(home, ignore_errors=True)


def fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):.0f} (max {max(xs):.0f})"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sandboxes", type=int, default=20)
    ap.add_argument("--requests", type=int, default=2000)
    args = ap.parse_args()
    s = bench_sandboxes(args.sandboxes)
    direct, service, spread = bench_requests(args.requests)
    print("\n| measure | value |\n|---|---|")
    print(f"| pod sandbox + CNI ADD, per pod ({args.sandboxes} pods, ms) | {fmt(s['setup_ms'])} |")
    print(f"| CNI DEL + sandbox stop, per pod (ms) | {fmt(s['teardown_ms'])} |")
    print(f"| requests/s to a pod IP, a new connection each ({args.requests}) | {direct:.0f} |")
    print(f"| requests/s through a ClusterIP Service, a new connection each ({args.requests}) | {service:.0f} |")
    print(f"| how the Service spread them over its 2 endpoints | {spread} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
