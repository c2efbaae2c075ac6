"""A custom metrics API server: DCGM metrics per pod, for the real HPA controller.

The chapter's point is that an HPA cannot see GPUs until DCGM metrics become
custom metrics (prometheus-adapter or KEDA in production). This is the
adapter: it serves ``custom.metrics.k8s.io`` (v1beta2 and v1beta1) through
the apiserver's aggregation layer, answering for each pod the value of a
DCGM field from the DCGM exporters' pages (a pod holding several devices
gets their mean, as an adapter's ``avg`` query would). The HPA controller in
kube-controller-manager asks the apiserver, the aggregator forwards here.

Only the aggregator may call it: clients must present a certificate from
the cluster's CA with the front-proxy identity, and each request is
authorized for its end user with a SubjectAccessReview, as an extension
apiserver delegates authorization.
"""

from __future__ import annotations

import json
import logging
import re
import ssl
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterable

from ..kube import api

log = logging.getLogger("gpulab.custommetrics")

GROUP = "custom.metrics.k8s.io"
VERSIONS = ("v1beta2", "v1beta1")
NAMESPACE = "custom-metrics"
SERVICE = "gpulab-custom-metrics"
FRONT_PROXY_CN = "front-proxy-client"
# Fields offered per pod (dcgm-exporter's names).
METRICS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
           "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP")

# (metric name, labels, value): one sample of an exporter's page, as prometheus_client's parser reads it
Sample = tuple[str, dict[str, str], float]
# returns every sample of every exporter, now (monitoring.CachedScraper: scraped and parsed as Prometheus does)
SampleSource = Callable[[], Iterable[Sample]]

_PATH = re.compile(
    rf"^/apis/{re.escape(GROUP)}/(?P<version>v1beta[12])/namespaces/(?P<ns>[^/]+)/pods/(?P<pod>[^/]+)/(?P<metric>[^/]+)$")


def pod_values(samples: Iterable[Sample], metric: str, namespace: str) -> dict[str, float]:
    """Mean value of ``metric`` per pod of ``namespace``."""
    acc: dict[str, list[float]] = {}
    for name, labels, value in samples:
        if name == metric and labels.get("namespace") == namespace and labels.get("pod"):
            acc.setdefault(labels["pod"], []).append(value)
    return {pod: sum(v) / len(v) for pod, v in acc.items()}


def _quantity(value: float) -> str:
    # Kubernetes quantities: integers as such, fractions in milli-units.
    if float(value).is_integer():
        return str(int(value))
    return f"{int(round(value * 1000))}m"


class _Authorizer:
    """SubjectAccessReview per (user, groups, metric), cached briefly."""

    def __init__(self, client: api.Client, ttl: float = 10.0):
        self.client = client
        self.ttl = ttl
        self.cache: dict[tuple, tuple[float, bool]] = {}
        self.lock = threading.Lock()

    def allowed(self, user: str, groups: list[str], namespace: str, metric: str) -> bool:
        key = (user, tuple(groups), namespace, metric)
        now = time.monotonic()
        with self.lock:
            hit = self.cache.get(key)
            if hit and now - hit[0] < self.ttl:
                return hit[1]
        review = {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": groups, "resourceAttributes": {
                "group": GROUP, "resource": "pods", "subresource": metric, "namespace": namespace,
                "verb": "get"}},
        }
        try:
            resp = self.client.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
            ok = bool(resp.get("status", {}).get("allowed"))
        except (api.ApiError, api.NotFound):
            ok = False
        with self.lock:
            self.cache[key] = (now, ok)
        return ok


class CustomMetricsServer:
    def __init__(self, source: SampleSource, client: api.Client, pki: Path, port: int = 0):
        self.source = source
        self.authorizer = _Authorizer(client)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(str(pki / "custom-metrics.crt"), str(pki / "custom-metrics.key"))
        ctx.verify_mode = ssl.CERT_REQUIRED
        server = self
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler(server))
        self.httpd.daemon_threads = True
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True, name="custom-metrics")

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- responses -------------------------------------------------------------

    @staticmethod
    def discovery(version: str) -> dict[str, Any]:
        return {
            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{GROUP}/{version}",
            "resources": [{"name": f"pods/{m}", "singularName": "", "namespaced": True,
                           "kind": "MetricValueList", "verbs": ["get"]} for m in METRICS],
        }

    @staticmethod
    def group() -> dict[str, Any]:
        versions = [{"groupVersion": f"{GROUP}/{v}", "version": v} for v in VERSIONS]
        return {"kind": "APIGroup", "apiVersion": "v1", "name": GROUP, "versions": versions,
                "preferredVersion": versions[0]}

    def values(self, version: str, namespace: str, pod: str, metric: str,
               selector: dict[str, str] | None, pods_by_name: Callable[[str], dict[str, dict[str, str]]]) -> dict[str, Any]:
        values = pod_values(self.source(), metric, namespace)
        labels_of = pods_by_name(namespace)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        items = []
        for name in sorted(values):
            if pod != "*" and name != pod:
                continue
            if selector is not None and not all(labels_of.get(name, {}).get(k) == v for k, v in selector.items()):
                continue
            obj = {"kind": "Pod", "namespace": namespace, "name": name, "apiVersion": "/v1"}
            if version == "v1beta2":
                items.append({"describedObject": obj, "metric": {"name": metric}, "timestamp": now,
                              "windowSeconds": 15, "value": _quantity(values[name])})
            else:
                items.append({"describedObject": obj, "metricName": metric, "timestamp": now,
                              "windowSeconds": 15, "value": _quantity(values[name])})
        return {"kind": "MetricValueList", "apiVersion": f"{GROUP}/{version}", "metadata": {}, "items": items}


def parse_selector(text: str | None) -> dict[str, str] | None:
    """Equality-based label selectors (what the HPA controller sends for a Deployment)."""
    if not text:
        return None
    out = {}
    for part in text.split(","):
        if "=" not in part or "!=" in part:
            raise ValueError(f"unsupported label selector term {part!r}")
        k, _, v = part.partition("=")
        out[k.strip()] = v.lstrip("=").strip()
    return out


def _handler(server: CustomMetricsServer):
    client = server.authorizer.client

    def pods_by_name(namespace: str) -> dict[str, dict[str, str]]:
        return {p["metadata"]["name"]: p["metadata"].get("labels") or {} for p in client.list("Pod", namespace)}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:
            log.debug("%s %s", self.address_string(), fmt % args)

        def _send(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _status(self, code: int, reason: str, message: str) -> None:
            self._send(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
                              "reason": reason, "message": message})

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            url = urllib.parse.urlsplit(self.path)
            path = urllib.parse.unquote(url.path)
            if path in ("/healthz", "/readyz", "/livez"):
                data = b"ok"
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(data)
                return
            cert = self.connection.getpeercert() or {}
            cn = next((v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"), None)
            if cn != FRONT_PROXY_CN:
                self._status(401, "Unauthorized", "only the aggregation layer may call this server")
                return
            user = self.headers.get("X-Remote-User", "")
            groups = self.headers.get_all("X-Remote-Group") or []
            if path in ("/apis", f"/apis/{GROUP}"):
                self._send(200, server.group() if path != "/apis" else
                           {"kind": "APIGroupList", "apiVersion": "v1", "groups": [server.group()]})
                return
            for v in VERSIONS:
                if path == f"/apis/{GROUP}/{v}":
                    self._send(200, server.discovery(v))
                    return
            m = _PATH.match(path)
            if not m:
                self._status(404, "NotFound", f"the server could not find the requested resource ({path})")
                return
            if m["metric"] not in METRICS:
                self._status(404, "NotFound", f'the server could not find the metric {m["metric"]} for pods')
                return
            if not server.authorizer.allowed(user, groups, m["ns"], m["metric"]):
                self._status(403, "Forbidden", f'{user} cannot get pods/{m["metric"]} in namespace "{m["ns"]}"')
                return
            query = urllib.parse.parse_qs(url.query)
            try:
                selector = parse_selector((query.get("labelSelector") or [None])[0])
            except ValueError as e:
                self._status(400, "BadRequest", str(e))
                return
            body = server.values(m["version"], m["ns"], m["pod"], m["metric"], selector, pods_by_name)
            if m["pod"] != "*" and not body["items"]:
                self._status(404, "NotFound", f'the server could not find the metric {m["metric"]} for pods {m["pod"]}')
                return
            self._send(200, body)

    return Handler


def registration(port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """The objects that put the server behind the aggregation layer."""
    import base64

    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE, "namespace": NAMESPACE},
           "spec": {"type": "ExternalName", "externalName": "localhost",
                    "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}}
    objs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        svc,
    ]
    for priority, v in zip((200, 100), VERSIONS):
        objs.append({
            "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": f"{v}.{GROUP}"},
            "spec": {"group": GROUP, "version": v, "groupPriorityMinimum": 100, "versionPriority": priority,
                     "service": {"namespace": NAMESPACE, "name": SERVICE, "port": port},
                     "caBundle": base64.b64encode(ca_bundle).decode()},
        })
    # The HPA controller reads custom metrics as system:controller:horizontal-pod-autoscaler;
    # Kubernetes' bootstrap policy already allows it (`get` on *.custom.metrics.k8s.io).
    return objs
