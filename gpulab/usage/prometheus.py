"""Prometheus' HTTP API, asked through the apiserver's service proxy with the kubeconfig's credentials.

The monitoring add-on (``gpulab addon install monitoring``, ``manifests/addons/monitoring/``) runs
Prometheus behind the Service ``monitoring/prometheus``, port 9090. Any client of the cluster reaches it
the way ``kubectl get --raw`` does, through the apiserver:
``<server>/api/v1/namespaces/monitoring/services/prometheus:9090/proxy/api/v1/query?query=...``, with
the kubeconfig's client certificate and CA (or its token); no port-forward, nothing else to open.

:func:`connect` returns a :class:`prometheus_api_client.PrometheusConnect` on that URL once Prometheus
has answered; :func:`query` and :func:`query_range` run PromQL on it. Every failure becomes a
:class:`PrometheusError` that says what happened and what to do (:class:`PrometheusUnavailable` when
there is no Prometheus to ask).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry

from ..kube import api
from ..kube.names import MONITORING_NAMESPACE

#: Where the monitoring add-on's Prometheus is (its Service in manifests/addons/monitoring/20-prometheus.yaml).
NAMESPACE = MONITORING_NAMESPACE
SERVICE = "prometheus"
PORT = 9090
#: The command that installs it, and waits until it serves.
INSTALL = "gpulab addon install monitoring"
#: Its scrape jobs that GPU usage is read from, and how often it scrapes them (its ``scrape_interval``).
DCGM_JOB = "dcgm-exporter"
KUBE_STATE_METRICS_JOB = "kube-state-metrics"
SCRAPE_INTERVAL = 5

#: When Prometheus last scraped every DCGM exporter and kube-state-metrics: the oldest of their latest
#: scrapes (``timestamp()`` of a sample is its scrape's time), in seconds since the epoch.
LAST_SCRAPE = f'min(timestamp(up{{job=~"{DCGM_JOB}|{KUBE_STATE_METRICS_JOB}"}}))'


class PrometheusError(RuntimeError):
    """Prometheus could not answer; the message says what was asked, why it failed and what to do."""


class PrometheusUnavailable(PrometheusError):
    """There is no Prometheus to ask: the monitoring add-on is not installed, not ready, or not reachable."""


def proxy_url(server: str) -> str:
    """Prometheus' HTTP API through the apiserver at ``server``: the base URL of ``/api/v1/query`` and the rest."""
    return f"{server.rstrip('/')}/api/v1/namespaces/{NAMESPACE}/services/{SERVICE}:{PORT}/proxy"


def _session(kubeconfig: Path | str) -> tuple[requests.Session, str]:
    """A session authenticating as the kubeconfig does (client certificate or token, its CA), and its server."""
    cfg = api.load_configuration(kubeconfig)
    session = requests.Session()
    # As the Kubernetes client: the kubeconfig says how to reach the server, not HTTPS_PROXY and the like.
    session.trust_env = False
    if cfg.proxy:
        session.proxies = {"https": cfg.proxy, "http": cfg.proxy}
    session.verify = (cfg.ssl_ca_cert or True) if cfg.verify_ssl else False
    if cfg.cert_file and cfg.key_file:
        session.cert = (cfg.cert_file, cfg.key_file)
    session.headers.update(api.token_header(cfg))
    return session, cfg.host


def _status_message(body: str) -> str:
    """The apiserver's Status message in an error body (or Prometheus' own error, or the text itself)."""
    try:
        doc = json.loads(body)
    except ValueError:
        return " ".join(body.split())[:300]
    if isinstance(doc, dict):
        return str(doc.get("message") or doc.get("error") or doc)[:300]
    return str(doc)[:300]


def unavailable(status: int, body: str) -> PrometheusUnavailable:
    """What an answer of ``status`` (with ``body``) from the service proxy to Prometheus means, as an error."""
    why = f"{status}: {_status_message(body)}"
    where = f"service {NAMESPACE}/{SERVICE}"
    if status == 404:
        return PrometheusUnavailable(
            f"Prometheus is not installed ({why}): the monitoring add-on runs it as {where}. "
            f"Install it with `{INSTALL}`")
    if status in (401, 403):
        return PrometheusUnavailable(
            f"not allowed to ask Prometheus through the apiserver's service proxy ({why}): the kubeconfig's user "
            f"needs `get` on `services/proxy` in namespace {NAMESPACE}")
    return PrometheusUnavailable(
        f"Prometheus does not answer through the apiserver's service proxy ({why}); "
        f"`kubectl -n {NAMESPACE} get pods` shows its pod, and `{INSTALL}` (re)installs the add-on and waits "
        "until Prometheus serves")


def _unreachable(server: str, error: Exception) -> PrometheusUnavailable:
    return PrometheusUnavailable(f"cannot reach the apiserver at {server} to ask Prometheus ({error}); "
                                 "is the cluster up? (`gpulab status`)")


def connect(kubeconfig: Path | str, timeout: float = 10.0) -> PrometheusConnect:
    """A PromQL client for the add-on's Prometheus, through the apiserver of ``kubeconfig``.

    Raises :class:`PrometheusUnavailable` when Prometheus does not answer ``/-/ready`` (the add-on is not
    installed, its pod is not ready, the apiserver is down): the message says what to run.
    """
    session, server = _session(kubeconfig)
    url = proxy_url(server)
    try:
        ready = session.get(f"{url}/-/ready", timeout=timeout)
    except requests.RequestException as e:
        session.close()
        raise _unreachable(server, e) from None
    if ready.status_code != 200:
        session.close()
        raise unavailable(ready.status_code, ready.text)
    # One retry of a dropped connection; an HTTP error comes back as it is (its message is the explanation).
    return PrometheusConnect(url=url, session=session, timeout=timeout,
                             retry=Retry(total=1, backoff_factor=0.2, status_forcelist=()))


def _failed(prom: PrometheusConnect, name: str, promql: str, error: Exception) -> PrometheusError:
    if isinstance(error, requests.RequestException):
        return PrometheusUnavailable(f"Prometheus did not answer query {name} at {prom.url}: {error}; "
                                     f"`kubectl -n {NAMESPACE} get pods` shows its pod")
    return PrometheusError(f"Prometheus could not run query {name} ({promql}): {error}")


def query(prom: PrometheusConnect, name: str, promql: str, at: float | None = None) -> list[dict[str, Any]]:
    """An instant query (at time ``at``, seconds since the epoch; now when None): Prometheus' result list,
    ``[{"metric": {label: value}, "value": [t, "v"]}, ...]``. ``name`` names the query in errors."""
    try:
        return prom.custom_query(promql, params=None if at is None else {"time": f"{at:.3f}"})
    except (PrometheusApiClientException, requests.RequestException) as e:
        raise _failed(prom, name, promql, e) from None


def query_range(prom: PrometheusConnect, name: str, promql: str, start: float, end: float,
                step: float) -> list[dict[str, Any]]:
    """A range query from ``start`` to ``end`` (seconds since the epoch, whole seconds) every ``step`` seconds:
    ``[{"metric": {label: value}, "values": [[t, "v"], ...]}, ...]``."""
    def when(t: float) -> datetime:
        return datetime.fromtimestamp(t, timezone.utc)

    try:
        return prom.custom_query_range(promql, start_time=when(start), end_time=when(end), step=f"{step:g}")
    except (PrometheusApiClientException, requests.RequestException) as e:
        raise _failed(prom, name, promql, e) from None


def last_scrape(prom: PrometheusConnect) -> float | None:
    """When Prometheus last scraped every DCGM exporter and kube-state-metrics (seconds since the epoch;
    None before its first scrapes of them): data of anything running before then is in what it answers."""
    result = query(prom, "last_scrape", LAST_SCRAPE)
    return float(result[0]["value"][1]) if result else None
