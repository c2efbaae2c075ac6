"""DCGM exporter metrics of a simulated node, in Prometheus' text format.

The fields are those of dcgm-exporter's default counters, with its label
set (``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``,
``Hostname``; ``GPU_I_PROFILE``/``GPU_I_ID`` for MIG devices) and, as with
``DCGM_EXPORTER_KUBERNETES=true``, the ``namespace``/``pod``/``container``
holding the device. Like the real exporter, it cannot tell containers apart
on a time-sliced GPU, so shared GPUs carry no pod labels.

The page is written by ``prometheus_client`` (a collector on a private
registry, never the global one) and read back by its parser, as Prometheus
and prometheus-adapter read dcgm-exporter's. Its text is the client's: label
names in sorted order and values as Go prints floats (``0.0``, ``75.0``).

:func:`scrape_all` reads every embedded exporter's page from the host (their pods
publish its address in the ``gpulab.io/metrics-endpoint`` annotation): what
``gpulab metrics`` prints and the lessons' ``dcgm_metrics()`` shows;
:func:`prometheus_targets` is the scrape config for a Prometheus of one's own.
"""

from __future__ import annotations

import http.server
import socket
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator, Protocol

import yaml
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from .._httpserve import SharedHTTPServer
from ..kube import api
from ..kube.names import METRICS_ANNOTATION, OPERATOR_NAMESPACE

#: The exporter pods of the GPU Operator's DaemonSet.
EXPORTER_SELECTOR = "app=nvidia-dcgm-exporter"


class MetricsView(Protocol):
    """What the exporter reads of a node: its GPUs' state, who holds each device, MIG instances' activity.
    A simulated node (:class:`gpulab.fakegpu.node.GpuNode`) is one on either host."""

    name: str

    def state(self) -> dict[str, Any]: ...

    def holders(self) -> dict[str, list[tuple[str, str, str]]]: ...

    def mig_activity(self, uuid: str) -> float: ...

#: (name, type, help) as dcgm-exporter's default-counters.csv describes them.
FIELDS = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
)

# A field's type -> its family. (prometheus_client names a counter's samples NAME_total.)
_FAMILIES: dict[str, type[Metric]] = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily}

Sample = tuple[str, dict[str, str], float]
# What generate_latest writes: Prometheus' text format 0.0.4 (dcgm-exporter's Content-Type).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _series(node: MetricsView) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Field name -> ``(labels, value)`` of each of its series on the node, now."""
    state = node.state()
    holders = node.holders()  # device UUID -> [(namespace, pod, container)]
    series: dict[str, list[tuple[dict[str, str], float]]] = {name: [] for name, _, _ in FIELDS}
    for gpu in state["gpus"]:
        base = {"gpu": str(gpu["index"]), "UUID": gpu["uuid"], "pci_bus_id": gpu["bus_id"],
                "device": f"nvidia{gpu['minor_number']}", "modelName": gpu["name"], "Hostname": node.name}
        migs = gpu.get("mig_devices") or []
        total = gpu["memory_total_mib"] - gpu.get("memory_reserved_mib", 0)
        values = {
            "DCGM_FI_DEV_SM_CLOCK": gpu["clocks"]["sm"], "DCGM_FI_DEV_MEM_CLOCK": gpu["clocks"]["memory"],
            "DCGM_FI_DEV_GPU_TEMP": gpu["temperature_gpu"], "DCGM_FI_DEV_POWER_USAGE": gpu["power_draw_w"],
            "DCGM_FI_DEV_GPU_UTIL": gpu["utilization_gpu"], "DCGM_FI_DEV_MEM_COPY_UTIL": gpu["utilization_memory"],
            "DCGM_FI_DEV_FB_FREE": max(0, total - gpu["memory_used_mib"]),
            "DCGM_FI_DEV_FB_USED": gpu["memory_used_mib"],
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": round(gpu["utilization_gpu"] / 100, 6),
        }
        if not migs:
            for name, value in values.items():
                series[name].append(({**base, **_owner(holders.get(gpu["uuid"]))}, value))
            continue
        for name in ("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_GPU_TEMP",
                     "DCGM_FI_DEV_POWER_USAGE"):
            series[name].append((base, values[name]))
        for m in migs:
            labels = {**base, "GPU_I_PROFILE": m["profile"], "GPU_I_ID": str(m["gi_id"]),
                      **_owner(holders.get(m["uuid"]))}
            used = m["memory_used_mib"]
            for name, value in (("DCGM_FI_DEV_FB_FREE", max(0, m["memory_total_mib"] - used)),
                                ("DCGM_FI_DEV_FB_USED", used),
                                ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", round(node.mig_activity(m["uuid"]), 6))):
                series[name].append((labels, value))
    return series


def _owner(holders: list[tuple[str, str, str]] | None) -> dict[str, str]:
    # One holder: the metrics are that container's. Several (time-slicing): nobody's.
    if not holders or len(holders) != 1:
        return {}
    namespace, pod, container = holders[0]
    return {"container": container, "namespace": namespace, "pod": pod}


class NodeCollector:
    """A ``prometheus_client`` collector: the node's DCGM fields, read at each collection.

    A field without any series (GPU_UTIL on a node whose GPUs are all MIG-partitioned)
    is left out, HELP and TYPE included, as dcgm-exporter leaves it out.
    """

    def __init__(self, node: MetricsView):
        self.node = node

    def collect(self) -> Iterator[Metric]:
        series = _series(self.node)
        for name, kind, help_ in FIELDS:
            if not series[name]:
                continue
            family = _FAMILIES[kind](name, help_)
            for labels, value in series[name]:
                family.add_sample(family.name + ("_total" if kind == "counter" else ""), labels, value)
            yield family


def registry(node: MetricsView) -> CollectorRegistry:
    """A private registry holding only the node's collector (the global one is never touched)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(NodeCollector(node))
    return reg


def render(node: MetricsView) -> str:
    """The ``/metrics`` page of the node's exporter, now."""
    return generate_latest(registry(node)).decode()


def parse(text: str) -> list[Sample]:
    """``(name, labels, value)`` of every sample of a metrics page, read by Prometheus' text parser.

    Raises ValueError for a page that is not Prometheus text.
    """
    return [(s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text) for s in family.samples]


def serve(node: MetricsView, address: tuple[str, int] | socket.socket) -> SharedHTTPServer:
    """Serve ``/metrics`` (rendered per request) and ``/health`` as dcgm-exporter does, in the background, at
    ``address`` or on a socket already listening (made where the pod's IP is).

    Returns the running server; ``server.shutdown()`` stops it.
    """
    reg = registry(node)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = self.path.split("?")[0]
            if path == "/health":
                body, ctype = b"OK", "text/plain"
            elif path == "/metrics":
                body, ctype = generate_latest(reg), CONTENT_TYPE
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    if isinstance(address, socket.socket):
        server = SharedHTTPServer(address.getsockname()[:2], Handler, bind_and_activate=False)
        server.socket.close()
        server.socket = address
        server.server_address = address.getsockname()[:2]
    else:
        server = SharedHTTPServer(address, Handler)
    server.start()
    return server


# --------------------------------------------------------------------------- scraping from the host


def exporter_endpoints(client: api.Client) -> dict[str, str]:
    """Node name -> metrics URL of each running DCGM exporter."""
    out = {}
    for pod in client.list("Pod", OPERATOR_NAMESPACE, label_selector=EXPORTER_SELECTOR):
        url = (pod["metadata"].get("annotations") or {}).get(METRICS_ANNOTATION)
        node = (pod.get("spec") or {}).get("nodeName")
        if url and node and (pod.get("status") or {}).get("phase") == "Running":
            out[node] = url
    return out


def _fetch(url: str, timeout: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (127.0.0.1 only)
        return resp.read().decode()


def scrape_all(client: api.Client, timeout: float = 2.0) -> dict[str, str]:
    """Node name -> the exporter's page (an exporter that does not answer is left out)."""
    endpoints = exporter_endpoints(client)
    pages: dict[str, str] = {}
    if not endpoints:
        return pages
    with ThreadPoolExecutor(max_workers=min(8, len(endpoints))) as pool:
        futures = {node: pool.submit(_fetch, url, timeout) for node, url in endpoints.items()}
        for node, fut in futures.items():
            try:
                pages[node] = fut.result()
            except (OSError, urllib.error.URLError):
                continue
    return pages


def prometheus_targets(client: api.Client) -> str:
    """A Prometheus scrape config (static targets) for every DCGM exporter, as YAML."""
    targets = []
    for node, url in sorted(exporter_endpoints(client).items()):
        host = url.split("//", 1)[1].split("/", 1)[0]
        targets.append({"targets": [host], "labels": {"node": node}})
    config = {"scrape_configs": [{"job_name": "gpulab-dcgm-exporter", "scrape_interval": "5s",
                                  "metrics_path": "/metrics", "static_configs": targets}]}
    return yaml.safe_dump(config, sort_keys=False)
