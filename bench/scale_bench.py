"""Fleet-scale benchmark: a large topology brought up, thousands of GPU pods bound and Running, against KWOK alone.

    .venv/bin/python bench/scale_bench.py [--topology manifests/topologies/fleet-1000.yaml] [--pods 8000]
                                          [--gpus-per-pod 1] [--client-rates raised|default]
                                          [--no-kwok | --kwok-only] [--timeout 600]

1. ``gpulab up`` of the topology in a temporary ``GPULAB_HOME``: seconds until every node is Ready, until the GPU
   Operator is ready on every GPU node (its operand DaemonSets' pods Running), and in all; then the memory (RSS)
   and CPU time of each component of the cluster, and the writes the apiserver took per pod, by resource
   (``apiserver_request_total``: what a simulated kubelet asks of it, beside the controllers).
2. A Deployment of ``--pods`` pods of ``--gpus-per-pod`` GPUs each (no command: each container is simulated
   as a process that runs until stopped) on that cluster: seconds from its creation until every pod is bound
   by the scheduler, and until every pod is Running; pods per second.
3. The anchor, KWOK alone (``kwokctl create cluster --runtime binary``, the same binaries and the same
   control-plane client rates): the same nodes (capacity and ``nvidia.com/gpu``) created as Node objects that
   KWOK keeps Ready; then the GPU Operator's operand DaemonSets as gpulab's operator makes them (about 5000 pods
   on fleet-1000), for the scheduler and the DaemonSet controller, Running as soon as KWOK says so: the control
   plane's own share of the GPU stack's bring-up; then the same Deployment.

``--client-rates raised`` (the default) runs both with the rates gpulab sets (``CLIENT_RATES``);
``--client-rates default`` runs both with the components' own defaults (kube-controller-manager's
``--kube-api-qps`` 20, ``--kube-api-burst`` 30; the scheduler's ``clientConnection`` 50/100).

Results print as one Markdown table for BENCHMARKS.md. Long phases print progress on stderr.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import yaml
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpulab.cluster import binaries, nodes  # noqa: E402
from gpulab.cluster.embedded import CLIENT_RATES, EmbeddedCluster  # noqa: E402
from gpulab.fakegpu import operator  # noqa: E402
from gpulab.kube import api  # noqa: E402
from gpulab.kube.names import NODE_ANNOTATION  # noqa: E402
from gpulab.kube.topology import load as load_topology  # noqa: E402

GPU = "nvidia.com/gpu"


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def process_tree(pid: int) -> list[psutil.Process]:
    """``pid`` and its children (none once it is gone)."""
    try:
        return [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def rss_mib(pid: int) -> float:
    """RSS of ``pid`` and its children, MiB."""
    total = 0
    for p in process_tree(pid):
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 2**20


def cpu_s(pid: int) -> tuple[float, float, int]:
    """User and system CPU seconds of ``pid`` and its children, and their threads."""
    user = system = 0.0
    threads = 0
    for p in process_tree(pid):
        try:
            t = p.cpu_times()
            user, system, threads = user + t.user + t.children_user, system + t.system + t.children_system, \
                threads + p.num_threads()
        except psutil.NoSuchProcess:
            pass
    return user, system, threads


#: Writes: what costs kube-apiserver (admission, etcd, every watcher told) far more than a read from its cache.
WRITES = ("POST", "PUT", "PATCH", "APPLY", "DELETE")


def write_census(client: api.Client) -> dict[str, float]:
    """The apiserver's writes since it started (``apiserver_request_total``), per resource: ``pods/status``,
    ``events``, ...; and the number of pods in the cluster under ``"(pods)"``."""
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(client.text("/metrics")):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            labels = sample.labels
            if sample.name != "apiserver_request_total" or labels.get("verb") not in WRITES:
                continue
            resource = labels.get("resource") or "?"
            if labels.get("subresource"):
                resource += "/" + labels["subresource"]
            counts[resource] = counts.get(resource, 0.0) + sample.value
    counts["(pods)"] = float(len(client.list("Pod")))
    return counts


def print_census(label: str, census: dict[str, float], rows: int = 8) -> None:
    pods = census.get("(pods)") or 1.0
    writes = {k: v for k, v in census.items() if k != "(pods)"}
    print(f"| {label}: apiserver writes per pod ({pods:.0f} pods) | {sum(writes.values()) / pods:.1f} |")
    for resource, n in sorted(writes.items(), key=lambda kv: -kv[1])[:rows]:
        print(f"| {label}: writes per pod, {resource} | {n / pods:.2f} |")


def deployment(name: str, replicas: int, gpus: int) -> dict:
    limits = {GPU: str(gpus)} if gpus else {}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": "default"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"terminationGracePeriodSeconds": 0,
                                           "containers": [{"name": "train", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                                                           "resources": {"limits": limits}}]}}}}


class PodCounter:
    """Watches the pods of ``namespace`` with the label ``label`` (key, value): when each was first seen bound,
    and Running."""

    def __init__(self, client: api.Client, label: tuple[str, str], namespace: str = "default"):
        self.client, self.label, self.namespace = client, label, namespace
        self.bound: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> PodCounter:
        self.thread.start()
        return self

    def _note(self, pod: dict) -> None:
        if (pod["metadata"].get("labels") or {}).get(self.label[0]) != self.label[1]:
            return
        uid, now = pod["metadata"]["uid"], time.monotonic()
        if pod.get("spec", {}).get("nodeName"):
            self.bound.setdefault(uid, now)
        if (pod.get("status") or {}).get("phase") == "Running":
            self.running.setdefault(uid, now)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                listed = self.client.list_raw("Pod", self.namespace, label_selector="=".join(self.label))
                for pod in listed.get("items") or []:
                    self._note(pod)
                rv = listed["metadata"]["resourceVersion"]
                for ev in self.client.watch("Pod", rv, self.namespace, timeout_seconds=60):  # _note skips the others
                    if self.stop.is_set():
                        return
                    if ev["type"] in ("ADDED", "MODIFIED"):
                        self._note(ev["object"])
            except Exception as e:  # noqa: BLE001 - a benchmark's watch just starts over
                progress(f"  (pod watch: {type(e).__name__}: {e}; listing again)")
                time.sleep(1)

    def wait(self, count: int, timeout: float, what: str) -> tuple[float | None, float | None]:
        """Seconds (monotonic) when ``count`` pods were bound and Running; None where the timeout came first."""
        deadline, shown = time.monotonic() + timeout, 0.0
        while time.monotonic() < deadline and len(self.running) < count:
            if time.monotonic() - shown > 10:
                progress(f"  {what}: {len(self.bound)} bound, {len(self.running)} Running of {count}")
                shown = time.monotonic()
            time.sleep(0.5)
        self.stop.set()
        bound = sorted(self.bound.values())
        running = sorted(self.running.values())
        return (bound[count - 1] if len(bound) >= count else None,
                running[count - 1] if len(running) >= count else None)


def pod_throughput(client: api.Client, pods: int, gpus: int, timeout: float, what: str) -> dict[str, float | None]:
    counter = PodCounter(client, ("app", "fleet-train")).start()
    time.sleep(1)
    start = time.monotonic()
    client.apply(deployment("fleet-train", pods, gpus), manager="scale-bench")
    bound, running = counter.wait(pods, timeout, what)
    return {"bound_s": None if bound is None else bound - start,
            "running_s": None if running is None else running - start,
            "pods_per_s": None if running is None else pods / (running - start),
            "running": float(len(counter.running))}


def bench_gpulab(topology: Path, pods: int, gpus: int, rates: tuple[int, int] | None, timeout: float) -> dict:
    home = Path(tempfile.mkdtemp(prefix="glscale-", dir="/tmp"))
    os.environ["LANGUAGE"] = "en"  # the progress lines below are read in English (gpulab/i18n.py)
    cluster = EmbeddedCluster(home / "cluster", client_rates=rates)
    out: dict = {}
    start = time.monotonic()

    def say(msg: str) -> None:
        progress(f"  gpulab: {msg}")
        if "nodes Ready after" in msg:
            out["nodes_ready_s"] = time.monotonic() - start
        if "GPU Operator ready" in msg:
            out["gpu_stack_s"] = time.monotonic() - start

    try:
        cluster.up(topology, say=say, timeout=timeout)
        out["up_s"] = time.monotonic() - start
        time.sleep(5)
        out["rss"] = {name: rss_mib(pid) for name, pid in sorted(cluster.running().items())}
        out["cpu"] = {name: cpu_s(pid) for name, pid in sorted(cluster.running().items())}
        client = api.Client(cluster.kubeconfig)
        out["writes"] = write_census(client)
        if pods:
            out["pods"] = pod_throughput(client, pods, gpus, timeout, "gpulab")
            out["rss_with_pods"] = {name: rss_mib(pid) for name, pid in sorted(cluster.running().items())}
    finally:
        cluster.down(purge=True, say=lambda m: None)
        shutil.rmtree(home, ignore_errors=True)
    return out


def kwok_nodes(topology: Path) -> list[dict]:
    """The topology's nodes as gpulab registers them (:func:`gpulab.cluster.nodes.node_object`), for KWOK to keep
    Ready, with the GPUs a device plugin would add to their capacity and the labels by which the GPU Operator
    deploys its operands there (KWOK alone runs neither)."""
    out = []
    for spec in load_topology(topology).nodes:
        node = nodes.node_object(spec, NODE_ANNOTATION)
        if spec.gpu_count:
            for key in ("capacity", "allocatable"):
                node["status"][key][GPU] = str(spec.gpu_count)
            node["metadata"]["labels"].update(
                {f"nvidia.com/gpu.deploy.{op.deploy}": "true" for op in operator.OPERANDS})
        out.append(node)
    return out


#: Every operand pod of the KWOK-alone anchor carries it (the DaemonSets' own labels differ).
OPERAND_LABEL = ("scale-bench/operand", "true")


def operand_objects() -> list[dict]:
    """The GPU Operator's operand DaemonSets as gpulab's operator makes them for a default ClusterPolicy
    (:func:`gpulab.fakegpu.operator.desired_daemonsets`), with their namespace and service accounts, for KWOK
    alone: the same pods for the scheduler to place and the DaemonSet controller to create, none of them run."""
    policy = {"metadata": {"name": "cluster-policy", "uid": "0"}, "spec": {}}
    objects: list[dict] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": operator.NAMESPACE}}]
    for op in operator.OPERANDS:
        objects.append({"apiVersion": "v1", "kind": "ServiceAccount",
                        "metadata": {"name": op.service_account, "namespace": operator.NAMESPACE}})
    for ds in operator.desired_daemonsets(policy).values():
        if ds is not None:
            del ds["metadata"]["ownerReferences"]  # no ClusterPolicy here: the garbage collector would take them
            ds["spec"]["template"]["metadata"]["labels"][OPERAND_LABEL[0]] = OPERAND_LABEL[1]
            objects.append(ds)
    return objects


def bench_kwok(topology: Path, pods: int, gpus: int, rates: tuple[int, int] | None, timeout: float) -> dict:
    bins = binaries.ensure(lambda m: None)
    work = Path(tempfile.mkdtemp(prefix="kwscale-", dir="/tmp"))
    flags = [] if rates is None else [{"key": "kube-api-qps", "value": str(rates[0])},
                                      {"key": "kube-api-burst", "value": str(rates[1])}]
    config = {"kind": "KwokctlConfiguration", "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
              "options": {"runtime": "binary", "bindAddress": "127.0.0.1",
                          "kubeApiserverBinary": str(bins["kube-apiserver"]),
                          "kubeControllerManagerBinary": str(bins["kube-controller-manager"]),
                          "kubeSchedulerBinary": str(bins["kube-scheduler"]),
                          "kwokControllerBinary": str(bins["kwok"]), "etcdBinary": str(bins["etcd"])},
              "componentsPatches": [{"name": "kube-controller-manager", "extraArgs": flags},
                                    {"name": "kube-scheduler", "extraArgs": flags}]}
    (work / "kwokctl.yaml").write_text(yaml.safe_dump(config))
    env = dict(os.environ, KWOK_WORKDIR=str(work / "kwok"), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    kubeconfig = work / "kubeconfig"
    out: dict = {}
    try:
        start = time.monotonic()
        subprocess.run([str(bins["kwokctl"]), "-c", str(work / "kwokctl.yaml"), "create", "cluster", "--name",
                        "scale", "--runtime", "binary", "--wait", "2m", "--kubeconfig", str(kubeconfig)],
                       env=env, check=True, capture_output=True)
        out["create_s"] = time.monotonic() - start
        client = api.Client(kubeconfig)
        fleet = kwok_nodes(topology)
        start = time.monotonic()
        for node in fleet:
            client.create(node)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready = sum(1 for n in client.list("Node") if any(
                c["type"] == "Ready" and c["status"] == "True" for c in (n.get("status") or {}).get("conditions") or []))
            if ready >= len(fleet):
                break
            time.sleep(1)
        out["nodes_ready_s"] = time.monotonic() - start
        pids = {p.stem: int(p.read_text()) for p in (work / "kwok" / "clusters" / "scale" / "pids").glob("*.pid")}
        out["rss"] = sum(rss_mib(pid) for pid in pids.values())
        # The GPU stack's shape: the operand DaemonSets' pods on every GPU node, Running as KWOK says.
        objects = operand_objects()
        expected = sum(1 for n in fleet if GPU in n["status"]["capacity"]) * sum(
            1 for o in objects if o["kind"] == "DaemonSet")
        counter = PodCounter(client, OPERAND_LABEL, operator.NAMESPACE).start()
        time.sleep(1)
        start = time.monotonic()
        for obj in objects:
            client.create(obj)
        _bound, running = counter.wait(expected, timeout, "KWOK alone, the GPU Operator's operands")
        out["operands_s"] = None if running is None else running - start
        out["operand_pods"] = expected
        out["cpu"] = {name: cpu_s(pid) for name, pid in sorted(pids.items())}
        out["writes"] = write_census(client)
        if pods:
            out["pods"] = pod_throughput(client, pods, gpus, timeout, "KWOK alone")
    finally:
        subprocess.run([str(bins["kwokctl"]), "delete", "cluster", "--name", "scale", "--kubeconfig", str(kubeconfig)],
                       env=env, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    return out


def fmt(value: float | None, unit: str = "s") -> str:
    return "—" if value is None else f"{value:.1f} {unit}".strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topology", type=Path, default=REPO / "manifests" / "topologies" / "fleet-1000.yaml")
    ap.add_argument("--pods", type=int, default=8000)
    ap.add_argument("--gpus-per-pod", type=int, default=1, help="0: pods without GPUs")
    ap.add_argument("--client-rates", choices=("raised", "default"), default="raised",
                    help="the control plane's client rates: gpulab's (raised) or the components' defaults")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--no-kwok", action="store_true", help="skip the KWOK-alone anchor")
    which.add_argument("--kwok-only", action="store_true", help="only the KWOK-alone anchor")
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    topo = load_topology(args.topology)
    progress(f"topology {topo.name}: {len(topo.nodes)} nodes, {sum(n.gpu_count for n in topo.nodes)} GPUs")
    rates = CLIENT_RATES if args.client_rates == "raised" else None
    g = {} if args.kwok_only else bench_gpulab(args.topology, args.pods, args.gpus_per_pod, rates, args.timeout)
    k = None if args.no_kwok else bench_kwok(args.topology, args.pods, args.gpus_per_pod, rates, args.timeout)
    clients = ("control-plane clients at their defaults" if rates is None
               else f"control-plane clients at qps {rates[0]}, burst {rates[1]}")
    print(f"\n| {topo.name}: {len(topo.nodes)} nodes; {clients} | value |")
    print("|---|---|")
    if g:
        print(f"| gpulab `up`: nodes Ready | {fmt(g.get('nodes_ready_s'))} |")
        print(f"| gpulab `up`: GPU Operator ready on every GPU node | {fmt(g.get('gpu_stack_s'))} |")
        print(f"| gpulab `up` returns | {fmt(g.get('up_s'))} |")
        for name, mib in g.get("rss", {}).items():
            print(f"| RSS {name} | {mib:.0f} MiB |")
        print(f"| RSS of the cluster | {sum(g.get('rss', {}).values()):.0f} MiB |")
        for name, (user, system, threads) in g.get("cpu", {}).items():
            print(f"| CPU by then, {name} | {user + system:.1f} s (user {user:.1f}, system {system:.1f}; "
                  f"{threads} threads) |")
        if "writes" in g:
            print_census("gpulab, once `up` returns", g["writes"])
        if "pods" in g:
            p = g["pods"]
            print(f"| gpulab: {args.pods} pods of {args.gpus_per_pod} GPUs bound | {fmt(p['bound_s'])} |")
            print(f"| gpulab: {args.pods} pods Running | {fmt(p['running_s'])} ({fmt(p['pods_per_s'], 'pods/s')}) |")
            print(f"| RSS of the cluster with the pods | {sum(g['rss_with_pods'].values()):.0f} MiB |")
    if k:
        print(f"| KWOK alone: `kwokctl create cluster` | {fmt(k.get('create_s'))} |")
        print(f"| KWOK alone: {len(topo.nodes)} nodes Ready after creation | {fmt(k.get('nodes_ready_s'))} |")
        print(f"| KWOK alone: RSS | {k.get('rss', 0):.0f} MiB |")
        print(f"| KWOK alone: the GPU Operator's {k.get('operand_pods')} operand pods (its DaemonSets) Running after "
              f"their creation | {fmt(k.get('operands_s'))} |")
        for name, (user, system, _threads) in k.get("cpu", {}).items():
            print(f"| KWOK alone: CPU by then, {name} | {user + system:.1f} s |")
        if "writes" in k:
            print_census("KWOK alone, its operand pods Running", k["writes"])
        if "pods" in k:
            p = k["pods"]
            print(f"| KWOK alone: {args.pods} pods Running | {fmt(p['running_s'])} ({fmt(p['pods_per_s'], 'pods/s')}) |")
            if g.get("pods", {}).get("pods_per_s") and p["pods_per_s"]:
                print(f"| gpulab / KWOK alone, pods per second | {g['pods']['pods_per_s'] / p['pods_per_s']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
