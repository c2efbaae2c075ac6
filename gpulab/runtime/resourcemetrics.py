"""The kubelet's resource metrics endpoint for the simulated nodes: what metrics-server scrapes.

A kubelet serves ``/metrics/resource``: Prometheus text with each node's and
each running container's cumulative CPU time and memory working set, which
metrics-server turns into the ``metrics.k8s.io`` API behind ``kubectl top``.
The node agent serves the same page for each simulated node, over HTTPS on
127.0.0.1, at ``/metrics/nodes/<node>/metrics/resource`` (one port for all
nodes, as KWOK does). Each Node carries that path in the annotation
``metrics.k8s.io/resource-metrics-path``, which metrics-server v0.8.0 reads
(``pkg/scraper/client/resource``) instead of its default ``/metrics/resource``.

Where the numbers come from:

- a container with a command (a real sandboxed process): the CPU time
  (user + system, with that of its reaped children) and the resident memory
  of its whole process tree, read from ``/proc`` (psutil). The sandbox has no
  cgroup of its own, so the tree's RSS stands for the cgroup's working set;
- a simulated container (no command): what the pod declares in the
  annotations ``gpulab.io/cpu-usage`` (a CPU quantity, e.g. ``250m``) and
  ``gpulab.io/memory-usage`` (a memory quantity, e.g. ``512Mi``), or
  ``gpulab.io/cpu-usage.<container>`` / ``gpulab.io/memory-usage.<container>``
  for one container (the naming of ``gpulab.io/model-load-seconds``). Its CPU
  counter grows by the declared cores every second since it started. Without
  either annotation it is not reported: it has no process that uses anything.
  metrics-server drops a pod with a container whose CPU or memory is 0, so a
  simulated container should declare both;
- a built-in program (the GPU stack's images) runs as a thread of the node
  agent: it is part of the node's own usage, not reported per container;
- the node: its containers, plus the node agent's own CPU time and memory
  (the simulated kubelet for every node) divided evenly among the nodes. Its
  CPU counter never goes back: a container that ends leaves its CPU time in it.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Callable, Iterable, Protocol

import psutil
from kubernetes.utils import parse_quantity
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

log = logging.getLogger("gpulab.runtime")

CPU_ANNOTATION = "gpulab.io/cpu-usage"
MEMORY_ANNOTATION = "gpulab.io/memory-usage"
# metrics-server (pkg/scraper/client/resource.AnnotationResourceMetricsPath) scrapes this path of a node.
PATH_ANNOTATION = "metrics.k8s.io/resource-metrics-path"
PATH_TEMPLATE = "/metrics/nodes/{node}/metrics/resource"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# The endpoint's serving certificate in the cluster's pki/ (issued by `gpulab up` for 127.0.0.1).
SERVING_CERT = "node-agent-serving"
#: How long a kept-alive connection may stay silent before it is closed.
KEEP_ALIVE_S = 120.0
#: How long one grouping of the node agent's pods by node serves the pages (a scrape round of every node).
GROUPING_S = 1.0


def node_path(node: str) -> str:
    return PATH_TEMPLATE.format(node=node)


@dataclasses.dataclass(frozen=True)
class Usage:
    cpu_seconds: float  # cumulative
    memory_bytes: float  # working set now


@dataclasses.dataclass(frozen=True)
class ContainerSample:
    namespace: str
    pod: str
    container: str
    start_time: float
    usage: Usage


# --------------------------------------------------------------------------- measuring


def process_tree_usage(pid: int) -> Usage | None:
    """CPU time and resident memory of ``pid`` and all its descendants; None once it is gone."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    cpu = rss = 0.0
    alive = False
    for p in procs:
        try:
            with p.oneshot():
                t = p.cpu_times()
                mem = p.memory_info().rss
        except psutil.Error:  # exited between listing and reading
            continue
        alive = True
        # children_* hold the reaped children's time: CPU spent by a process that has ended counts too.
        cpu += t.user + t.system + t.children_user + t.children_system
        rss += mem
    return Usage(cpu, rss) if alive else None


def _declared(pod: dict[str, Any], container: str, key: str) -> float | None:
    ann = pod.get("metadata", {}).get("annotations") or {}
    raw = ann.get(f"{key}.{container}", ann.get(key))
    if raw is None:
        return None
    try:
        value = float(parse_quantity(str(raw).strip()))
    except ValueError:
        return None
    return value if value >= 0 else None


def declared_usage(pod: dict[str, Any], container: str, started_at: float, now: float) -> Usage | None:
    """What a simulated container's annotations say it uses, as a cumulative CPU counter; None if nothing."""
    cores = _declared(pod, container, CPU_ANNOTATION)
    memory = _declared(pod, container, MEMORY_ANNOTATION)
    if cores is None and memory is None:
        return None
    return Usage((cores or 0.0) * max(0.0, now - started_at), memory or 0.0)


# --------------------------------------------------------------------------- the page


def _families(node: Usage, containers: Iterable[ContainerSample], now: float) -> list[Metric]:
    """The kubelet's resource metrics, with the names, labels and help texts it uses."""
    node_cpu = CounterMetricFamily("node_cpu_usage_seconds", "Cumulative cpu time consumed by the node in core-seconds")
    node_mem = GaugeMetricFamily("node_memory_working_set_bytes", "Current working set of the node in bytes")
    labels = ["container", "namespace", "pod"]
    c_cpu = CounterMetricFamily("container_cpu_usage_seconds",
                                "Cumulative cpu time consumed by the container in core-seconds", labels=labels)
    c_mem = GaugeMetricFamily("container_memory_working_set_bytes",
                              "Current working set of the container in bytes", labels=labels)
    c_start = GaugeMetricFamily("container_start_time_seconds",
                                "Start time of the container since unix epoch in seconds", labels=labels)
    p_cpu = CounterMetricFamily("pod_cpu_usage_seconds", "Cumulative cpu time consumed by the pod in core-seconds",
                                labels=["namespace", "pod"])
    p_mem = GaugeMetricFamily("pod_memory_working_set_bytes", "Current working set of the pod in bytes",
                              labels=["namespace", "pod"])
    scrape_error = GaugeMetricFamily("scrape_error", "1 if there was an error while getting container metrics, "
                                     "0 otherwise")
    node_cpu.add_metric([], node.cpu_seconds, timestamp=now)
    node_mem.add_metric([], node.memory_bytes, timestamp=now)
    pods: dict[tuple[str, str], list[float]] = {}
    for c in containers:
        values = [c.container, c.namespace, c.pod]
        c_cpu.add_metric(values, c.usage.cpu_seconds, timestamp=now)
        c_mem.add_metric(values, c.usage.memory_bytes, timestamp=now)
        c_start.add_metric(values, c.start_time, timestamp=now)
        total = pods.setdefault((c.namespace, c.pod), [0.0, 0.0])
        total[0] += c.usage.cpu_seconds
        total[1] += c.usage.memory_bytes
    for (ns, pod), (cpu, mem) in sorted(pods.items()):
        p_cpu.add_metric([ns, pod], cpu, timestamp=now)
        p_mem.add_metric([ns, pod], mem, timestamp=now)
    scrape_error.add_metric([], 0.0)
    return [c_cpu, c_mem, c_start, node_cpu, node_mem, p_cpu, p_mem, scrape_error]


class _Page(Collector):
    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


def exposition(node: Usage, containers: Iterable[ContainerSample], now: float | None = None) -> bytes:
    """The ``/metrics/resource`` page (Prometheus text format 0.0.4, written by prometheus_client)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Page(_families(node, containers, time.time() if now is None else now)))
    return generate_latest(registry)


# --------------------------------------------------------------------------- the node agent's nodes


class MeteredPod(Protocol):
    """A pod as :class:`ResourceMetrics` measures it (:class:`gpulab.runtime.pod.PodWorker`)."""

    node: str
    key: tuple[str, str, str]  # namespace, name, uid
    pod: dict[str, Any]

    @property
    def init(self) -> Sequence[Any]:
        """The init containers (:class:`gpulab.runtime.containers.Container`)."""

    @property
    def main(self) -> Sequence[Any]:
        """The app containers."""


class MeteredAgent(Protocol):
    """What :class:`ResourceMetrics` reads of the node agent (:class:`gpulab.runtime.agent.NodeAgent`).

    A Protocol, not the class: the cluster's bring-up reads this module's
    constants without loading the whole pod runner.
    """

    @property
    def nodes(self) -> Collection[str]:
        """The nodes it plays the kubelet for."""

    @property
    def workers(self) -> Mapping[str, MeteredPod]:
        """Its pods by UID."""


class ResourceMetrics:
    """Each simulated node's page, measured from the node agent's pods when asked for."""

    def __init__(self, agent: MeteredAgent):
        self.agent = agent
        self.me = psutil.Process()
        self.lock = threading.Lock()
        # node -> CPU seconds of the containers that ran there and ended; (run id) -> last CPU seconds seen.
        self.retired: dict[str, float] = {}
        self.last: dict[str, dict[tuple[str, str, str], float]] = {}
        self.node_cpu: dict[str, float] = {}  # node -> the counter's last value: a counter never goes back
        # The pods by node, grouped once for a round of scrapes (metrics-server asks every node at once).
        self._by_node: dict[str, list[MeteredPod]] = {}
        self._grouped_at = -GROUPING_S

    def _workers_on(self, node: str) -> list[MeteredPod]:
        with self.lock:
            if time.monotonic() - self._grouped_at >= GROUPING_S:
                by_node: dict[str, list[MeteredPod]] = {}
                for worker in list(self.agent.workers.values()):
                    by_node.setdefault(worker.node, []).append(worker)
                self._by_node, self._grouped_at = by_node, time.monotonic()
            return self._by_node.get(node, [])

    def containers(self, node: str, now: float) -> list[ContainerSample]:
        out = []
        for worker in self._workers_on(node):
            ns, name, _ = worker.key
            for c in worker.init + worker.main:
                if c.state != "running" or c.started_at is None:
                    continue
                usage: Usage | None = None
                if c.simulated:
                    usage = declared_usage(worker.pod, c.name, c.started_at, now)
                elif c.factory is None and c.shim is not None and c.shim.pid:
                    usage = process_tree_usage(c.shim.pid)
                if usage is not None:
                    out.append(ContainerSample(ns, name, c.name, c.started_at, usage))
        return out

    def _own_share(self) -> Usage:
        """The node agent's own CPU time and memory, shared evenly by the nodes it plays the kubelet for."""
        n = max(1, len(self.agent.nodes))
        try:
            with self.me.oneshot():
                t = self.me.cpu_times()
                rss = self.me.memory_info().rss
        except psutil.Error:
            return Usage(0.0, 0.0)
        return Usage((t.user + t.system) / n, rss / n)

    def page(self, node: str) -> bytes | None:
        if node not in self.agent.nodes:
            return None
        now = time.time()
        containers = self.containers(node, now)
        own = self._own_share()
        with self.lock:
            seen = {(c.namespace, c.pod, f"{c.container}@{c.start_time}"): c.usage.cpu_seconds for c in containers}
            previous = self.last.get(node, {})
            # A run that is gone leaves its CPU time in the node's counter; one still here keeps its highest value.
            self.retired[node] = self.retired.get(node, 0.0) + sum(v for k, v in previous.items() if k not in seen)
            self.last[node] = {k: max(v, previous.get(k, 0.0)) for k, v in seen.items()}
            # Summed in another order, the same seconds can come out a rounding error lower.
            node_cpu = max(own.cpu_seconds + self.retired[node] + sum(self.last[node].values()),
                           self.node_cpu.get(node, 0.0))
            self.node_cpu[node] = node_cpu
        node_usage = Usage(node_cpu, own.memory_bytes + sum(c.usage.memory_bytes for c in containers))
        return exposition(node_usage, containers, now)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # metrics-server dials every node at once: room for a fleet's connections while they are accepted.
    request_queue_size = 128

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that went away, or failed the TLS handshake: its connection ends, nothing more.
        log.debug("resource metrics: connection from %s failed", client_address, exc_info=True)


class ResourceMetricsServer:
    """HTTPS on 127.0.0.1: clients must present a certificate of the cluster CA (as metrics-server does).

    Connections are kept alive (HTTP/1.1), as the kubelet's are: metrics-server scrapes every node each
    resolution period over the connection it already has. Each connection's TLS handshake runs in its own
    thread, not in the one that accepts: a fleet's first scrape does not wait for the handshakes in turn.
    """

    def __init__(self, page: Callable[[str], bytes | None], pki: Path, cert_stem: str, port: int = 0):
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(str(pki / f"{cert_stem}.crt"), str(pki / f"{cert_stem}.key"))
        ctx.verify_mode = ssl.CERT_REQUIRED
        self.httpd = _Server(("127.0.0.1", port), _handler(page))
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True, do_handshake_on_connect=False)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True, name="resource-metrics")

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


_PATH = re.compile(PATH_TEMPLATE.replace("{node}", r"([^/]+)"))


def _handler(page: Callable[[str], bytes | None]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # A kept connection that says nothing for this long is closed (metrics-server asks every 15 s).
        timeout = KEEP_ALIVE_S

        def setup(self) -> None:
            super().setup()  # applies the timeout, to the handshake too
            if isinstance(self.request, ssl.SSLSocket):
                self.request.do_handshake()

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            m = _PATH.fullmatch(self.path.split("?", 1)[0])
            body = page(m[1]) if m else None
            if body is None:
                self.send_error(404, "no such node on this node agent" if m else "not found")
                return
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    return Handler
