"""The node agent's entry point: the simulated kubelet with the GPU side plugged in.

``python -m gpulab.cluster.nodeagent --cluster-dir DIR`` is what the embedded
cluster starts as its ``node-agent`` component. It composes the two halves that
know nothing of each other: the pod runner (:class:`gpulab.runtime.agent.NodeAgent`)
and the GPU stack (:class:`gpulab.fakegpu.stack.GpuStack`), which takes part in
each pod's life through :class:`gpulab.runtime.devices.DeviceHooks`; registers the GPU
stack's programs (the GPU Operator's and its operands' images); gives both one set of
informers (:class:`gpulab.kube.informer.SharedInformers`); and puts pods on the
pod network with the CNI plugins (:class:`gpulab.runtime.network.PodNetwork`). Like a
kubelet it also serves each node's resource metrics (CPU and memory of its
containers, :mod:`gpulab.runtime.resourcemetrics`) to metrics-server, on the
cluster's ``resource-metrics`` port.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from .. import _poll
from ..fakegpu import llmserver, operands, operator
from ..fakegpu.stack import GpuStack
from . import clusterdns
from ..kube import api, events
from ..kube.informer import SharedInformers
from ..kube.statedir import StateDir
from ..runtime import sandbox
from ..kube.allocatable import parse as parse_quantity
from ..runtime.agent import DEFAULT_PULL_RATE, NodeAgent
from ..runtime import imagemanager
from ..runtime.imagemanager import ImageManager
from ..runtime.images import (HOST_PROGRAMS, Entrypoint, ImageCatalog, agnhost_images, busybox_images,
                              monitoring_images, nginx_images)
from ..runtime.network import ApiRelay, NetworkError, PodNetwork
from ..runtime.resourcemetrics import SERVING_CERT, ResourceMetrics, ResourceMetricsServer

# The port key in state.json of the resource metrics endpoint.
RESOURCE_METRICS_PORT = "resource-metrics"
#: The node agent's connections to the apiserver, shared by its threads (see :class:`gpulab.kube.api.Client`).
API_CONNECTIONS = 48
#: The interpreter's switch interval in the node agent (Python's default: 5 ms). A thread waiting for the GIL asks
#: its holder to let go every interval: with a fleet's thousands of threads, hundreds of them woken at once (a burst
#: of pods, every node's programs starting) made that hand-over, not the work, most of the process's CPU time
#: (mostly the kernel's). Its threads do short steps between waits, so a longer interval costs them no latency.
SWITCH_INTERVAL_S = 0.05
#: The cyclic garbage collector's thresholds in the node agent, and how often it collects the whole heap. Most of
#: the heap lives long (the informers' copies of every Pod and Node, every node's programs and servers). With
#: Python's defaults (700, 10, 10) the youngest objects were traced every 700 allocations, and the whole heap each
#: time it had grown by a quarter: while a 252-node fleet came up, 16 full collections took 4.3 s and the young
#: ones 1.5 s, all of it holding the GIL, and each full one longer as the fleet is larger. A larger young
#: generation lets a watch event's or a request's objects die before they are traced; the whole heap is
#: collected every FULL_GC_S instead of as it grows.
GC_THRESHOLDS = (20_000, 20, 1_000_000_000)
FULL_GC_S = 300.0
#: Threads per node the futex hash is sized for (widen_futex_hash): a GPU node's pods, programs and servers.
FUTEX_SLOTS_PER_NODE = 16
#: How long the node agent, started beside the apiserver, waits for it to be ready.
APISERVER_WAIT_S = 120.0
#: prctl(2)'s PR_FUTEX_HASH and its PR_FUTEX_HASH_SET_SLOTS (Linux 6.16 and later).
_PR_FUTEX_HASH, _PR_FUTEX_HASH_SET_SLOTS = 78, 1


def baked_weights_image(root: Path) -> Entrypoint:
    """Lesson 06's ``gpulab/llm-server:0.1-7b-weights``: the inference server with a 7B model in the image at
    ``/models/llama-7b`` (its model.json, written under ``root``), which it serves when the pod gives no args."""
    model = root / imagemanager.BAKED_MODEL
    llmserver.write_model(str(model), imagemanager.BAKED_MODEL, round(imagemanager.BAKED_WEIGHTS_BYTES / 2**30, 2), "7B")
    for path, mode in ((root, 0o755), (model, 0o755), (model / llmserver.MODEL_FILE, 0o644)):
        path.chmod(mode)  # readable by the pod's user, as an image's files are
    return Entrypoint(imagemanager.BAKED_WEIGHTS_IMAGE, ("python3", llmserver.CONTAINER_PATH), Path(llmserver.__file__),
                      mount_at=llmserver.CONTAINER_PATH, cmd=("serve", "--model", imagemanager.BAKED_MODEL_PATH),
                      files=((model, imagemanager.BAKED_MODEL_PATH),))


def widen_futex_hash(nodes: int) -> int:
    """Give the process a futex hash of a slot or more per thread its ``nodes`` bring; returns the slots (0: the
    kernel keeps its own, as before Linux 6.16, which has no such setting).

    Every thread waiting on a lock, an event or the GIL is on one slot's list, and each wake-up walks that list
    under its lock. Linux 6.16 gives each process a hash of its own, sized by the CPUs: 16 slots on 2 cores,
    whatever the number of threads. A fleet-1000 node agent, 17 000 threads, then spent more CPU in the kernel's
    futex_wake than in Python (430 s system against 258 s user while the fleet came up).
    """
    slots = 1 << max(10, (FUTEX_SLOTS_PER_NODE * nodes - 1).bit_length())
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_FUTEX_HASH, _PR_FUTEX_HASH_SET_SLOTS, slots, 0, 0) != 0:
            return 0
    except (OSError, AttributeError):
        return 0
    return slots


def tune_gc() -> None:
    """The node agent's collector (GC_THRESHOLDS): what is built at start is frozen (never traced again), and a
    thread collects the whole heap every FULL_GC_S."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)

    def collect() -> None:
        while True:
            time.sleep(FULL_GC_S)
            gc.collect()

    threading.Thread(target=collect, daemon=True, name="gc-full").start()


def _apiserver_not_ready(_last: object) -> SystemExit:
    return SystemExit(f"gpulab node agent: the apiserver was not ready (or did not serve KWOK's kinds) "
                      f"within {APISERVER_WAIT_S:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpulab.cluster.nodeagent",
                                     description="gpulab's simulated kubelet for the embedded cluster")
    parser.add_argument("--cluster-dir", type=Path, required=True)
    parser.add_argument("--cni-bin", type=Path, required=True, help="the CNI plugins (CNI_PATH)")
    parser.add_argument("--coredns", type=Path, required=True, help="CoreDNS, the program of its image")
    parser.add_argument("--agnhost", type=Path, required=True, help="agnhost, the program of Kubernetes' test image")
    for image in ("prometheus", "prometheus-adapter", "kube-state-metrics"):
        parser.add_argument(f"--{image}", type=Path, required=True, help=f"{image}, the program of its image")
    parser.add_argument("--apiserver-port", type=int, required=True,
                        help="relayed into the pod network as the kubernetes Service's endpoint")
    args = parser.parse_args(argv)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    topology = StateDir(args.cluster_dir).topology()
    widen_futex_hash(len(topology.nodes))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    # One client for the whole process, its connections shared by every pod worker and program (a fleet's
    # thousands of threads reuse API_CONNECTIONS connections instead of each opening its own), and one informer
    # per kind: the pod runner and the GPU stack share the watch of Nodes.
    client = api.Client(args.cluster_dir / "kubeconfigs" / "node-agent.yaml", connections=API_CONNECTIONS)
    informers = SharedInformers(client)
    # The GPU side of every GPU node: device managers, GPUs, and NVIDIA's programs, which the DaemonSet
    # pods of the GPU Operator (and the operator's own pod) run as built-in images of this process.
    gpus = GpuStack(args.cluster_dir, client=client, informers=informers)
    operands.register(gpus)
    operator.register(gpus)
    # The nodes' network namespace (started or adopted) with the apiserver relayed in, before any pod.
    ports = StateDir(args.cluster_dir).state().get("ports", {})
    # The nodes' kubelet endpoints (KWOK's kubelet API, this agent's resource metrics), which the egress
    # dials on the host for any node's address.
    kubelet_ports = frozenset(int(ports[k]) for k in ("kwok", RESOURCE_METRICS_PORT) if ports.get(k))
    relay = (ApiRelay(args.cluster_dir, args.apiserver_port, kubelet_ports,
                      int(ports.get("egress") or 0) or None)
             if sandbox.kind() == "namespaces" else None)
    if relay is not None:
        try:
            relay.start()
        except NetworkError as e:
            print(f"gpulab node agent: {e}", file=sys.stderr)
            return 1
    # Pods on the pod network: their own namespaces in the namespaces sandbox; IPs alone without namespaces.
    network = PodNetwork(args.cluster_dir, args.cluster_dir / "nodes", args.cni_bin,
                         isolated=sandbox.kind() == "namespaces")
    # Images whose program runs for real; every other image without a command is simulated.
    images = ImageCatalog([Entrypoint(clusterdns.IMAGE_REPOSITORY, ("/coredns",), args.coredns),
                           # The inference server: a stdlib script, run by the host's python3 (serve ... by default).
                           Entrypoint(llmserver.IMAGE_REPOSITORY, ("python3", llmserver.CONTAINER_PATH),
                                      Path(llmserver.__file__), mount_at=llmserver.CONTAINER_PATH),
                           # ... and one tag of it with a model's weights inside, which it serves by default.
                           baked_weights_image(args.cluster_dir / "images" / "llm-server-weights"),
                           *HOST_PROGRAMS,
                           # agnhost (built with the control plane), and the host's busybox and nginx (Debian's);
                           # nginx only with a pod network (without one every nginx pod would want the host's port 80).
                           *agnhost_images(args.agnhost), *busybox_images(),
                           # The monitoring add-on's (built after the core: until then such a pod says so).
                           *monitoring_images(args.prometheus, args.prometheus_adapter, args.kube_state_metrics),
                           *(nginx_images(args.cluster_dir / "images" / "nginx", root_in_userns=os.geteuid() != 0)
                             if sandbox.kind() == "namespaces" else [])])
    # Each node pulls images at its pool's imagePullBandwidth (the topology's network).
    rates = {spec.name: float(parse_quantity(spec.image_pull_bandwidth))
             for spec in topology.nodes}
    image_manager = ImageManager(args.cluster_dir / "nodes", lambda node: rates.get(node, DEFAULT_PULL_RATE))
    agent = NodeAgent(args.cluster_dir, network, devices=gpus, images=images, image_manager=image_manager,
                      client=client, informers=informers)

    def on_term(signum, frame):
        agent.stop.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    port = int(ports.get(RESOURCE_METRICS_PORT) or 0)
    metrics = ResourceMetricsServer(ResourceMetrics(agent).page, args.cluster_dir / "pki", SERVING_CERT, port)
    metrics.start()
    logging.getLogger("gpulab.runtime").info("serving resource metrics on https://127.0.0.1:%d", metrics.port)
    # Every pod it starts records several Events: a pod's sync does not wait for them to be written.
    events.RECORDER.send_in_background()
    tune_gc()
    try:
        agent.prepare()
        # `gpulab up` starts this agent beside the apiserver: nothing is watched before the apiserver is ready
        # (an informer that failed its first list would wait out its backoff). None: asked to stop meanwhile.
        if _poll.until(agent.api_ready, APISERVER_WAIT_S, _apiserver_not_ready, interval=0.05,
                       pause=agent.stop.wait):
            gpus.start()
            agent.run(ready_file=args.cluster_dir / "node-agent.ready")
    finally:
        metrics.stop()
        gpus.stop()
        informers.stop()
        events.RECORDER.stop_sending()
        if relay is not None:
            relay.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
