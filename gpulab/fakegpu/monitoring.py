"""The monitoring side of the GPU stack: DCGM scrapes, the custom metrics adapter, usage history.

In production, Prometheus scrapes every dcgm-exporter and prometheus-adapter
turns its series into ``custom.metrics.k8s.io`` for the HPA. gpulab keeps
the shape and drops the Prometheus in between: a Deployment in the
``custom-metrics`` namespace (``manifests/monitoring/``) runs the adapter
image, a built-in program of the node agent, which

- scrapes every DCGM exporter (their pods publish their address in the
  ``gpulab.io/metrics-endpoint`` annotation) over HTTP, as Prometheus would;
- serves the per-pod values through the apiserver's aggregation layer
  (:mod:`gpulab.fakegpu.custommetrics`) on the ``custom-metrics`` port of
  the cluster, which ``gpulab up`` registers as an APIService;
- records a usage sample every ``--sample-interval`` for ``gpulab report``
  (:mod:`gpulab.usage`).

``scrape_all`` is also what ``gpulab metrics`` prints, for users who bring
their own Prometheus (``gpulab metrics --targets`` gives its scrape config).
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import yaml

from ..kube import api, pki
from ..kube.statedir import StateDir
from ..runtime import programs
from ..usage import samples as usage
from . import custommetrics, dcgm
from .operands import METRICS_ANNOTATION
from .operator import manifest_documents
from ..kube.names import OPERATOR_NAMESPACE

if TYPE_CHECKING:
    from .stack import GpuStack

ADAPTER_IMAGE = "gpulab.io/custom-metrics-adapter"
EXPORTER_SELECTOR = "app=nvidia-dcgm-exporter"
PORT_KEY = "custom-metrics"
MANAGER = "gpulab-install"


def manifests_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "manifests" / "monitoring"


# --------------------------------------------------------------------------- scraping


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


def parse_pages(pages: dict[str, str]) -> list[custommetrics.Sample]:
    """Every sample of the exporters' pages, read as Prometheus reads them (prometheus_client's parser).

    A page that is not Prometheus text is left out, as Prometheus fails that target's scrape
    and keeps the others.
    """
    samples: list[custommetrics.Sample] = []
    for page in pages.values():
        try:
            samples += dcgm.parse(page)
        except ValueError:
            continue
    return samples


class CachedScraper:
    """All exporters' samples, scraped at most once per ``ttl`` seconds (many HPA queries, one scrape)."""

    def __init__(self, client: api.Client, ttl: float = 1.0):
        self.client = client
        self.ttl = ttl
        self._at = -1e9
        self._samples: list[custommetrics.Sample] = []
        self._lock = threading.Lock()

    def __call__(self) -> list[custommetrics.Sample]:
        with self._lock:
            if time.monotonic() - self._at >= self.ttl:
                try:
                    self._samples = parse_pages(scrape_all(self.client))
                except (api.ApiError, api.NotFound, OSError):
                    pass  # keep the last scrape: a blip should not zero every metric
                self._at = time.monotonic()
            return list(self._samples)


# --------------------------------------------------------------------------- the adapter program


def _duration(text: str, default: float) -> float:
    text = (text or "").strip()
    try:
        return float(text[:-1]) * {"s": 1, "m": 60}[text[-1]] if text and not text[-1].isdigit() else float(text)
    except (ValueError, KeyError):
        return default


def _args(ctx: programs.ProgramContext) -> dict[str, str]:
    out = {}
    for arg in (ctx.container.get("args") or []):
        if arg.startswith("--") and "=" in arg:
            k, _, v = arg[2:].partition("=")
            out[k] = v
    return out


def _adapter_program(stack: "GpuStack", stop: threading.Event, ctx: programs.ProgramContext) -> int:
    def log(msg: str) -> None:
        ctx.log("stderr", f"I{time.strftime('%m%d %H:%M:%S')} adapter.go] {msg}")

    cluster_dir = stack.cluster_dir
    args = _args(ctx)
    state = StateDir(cluster_dir)
    try:
        port = int(state.state()["ports"][PORT_KEY])
    except (ValueError, KeyError, TypeError):
        ctx.log("stderr", f"error: no {PORT_KEY} port in {state.state_file}; run `gpulab up` again")
        return 1
    client = stack.client
    scraper = CachedScraper(client, ttl=_duration(args.get("metrics-max-age", ""), 1.0))
    server = custommetrics.CustomMetricsServer(scraper, client, cluster_dir / "pki", port=port)
    server.start()
    log(f"Serving custom.metrics.k8s.io (v1beta2, v1beta1) securely on 127.0.0.1:{port}")
    interval = _duration(args.get("sample-interval", ""), 5.0)
    store = usage.Store(usage.store_path(cluster_dir))
    log(f"Recording GPU usage every {interval:g}s to {store.path}")
    try:
        while not stop.wait(interval):
            try:
                pods = client.list("Pod")
                store.append(usage.snapshot(time.time(), scraper(), pods))
            except (api.ApiError, api.NotFound, OSError) as e:
                log(f"usage sample skipped: {e}")
    finally:
        server.stop()
    return 0


def register(stack: "GpuStack") -> None:
    programs.register(ADAPTER_IMAGE, lambda ctx: programs.FunctionProgram(
        ctx, lambda stop, c: _adapter_program(stack, stop, c)))


# --------------------------------------------------------------------------- installation at bring-up


def install(kubeconfig: Path, pki_dir: Path, port: int, say: Callable[[str], None], register: bool = True) -> None:
    """Deploy the adapter and register it as ``custom.metrics.k8s.io`` (idempotent). ``register=False``:
    another server (the monitoring add-on's prometheus-adapter) serves the API; leave its APIServices alone."""
    client = api.Client(kubeconfig)
    pki.issue_server(pki_dir, "custom-metrics", custommetrics.SERVICE,
                     (f"{custommetrics.SERVICE}.{custommetrics.NAMESPACE}.svc",))
    ca = (pki_dir / "ca.crt").read_bytes()
    docs = manifest_documents(manifests_dir()) + custommetrics.registration(port, ca)
    for doc in docs:
        if register or doc["kind"] != "APIService":
            client.apply(doc, manager=MANAGER)
    if register:
        say(f"custom metrics adapter installed (APIService v1beta2.{custommetrics.GROUP} -> 127.0.0.1:{port})")
    else:
        say(f"custom metrics adapter running; {custommetrics.GROUP} is served by the monitoring add-on")
