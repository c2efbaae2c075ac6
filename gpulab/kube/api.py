"""A small REST client over plain dicts, on top of the official Python client.

gpulab's components (node agent, GPU stack, bring-up) deal in whole API
objects as JSON and know the handful of kinds they touch, so they skip the
typed models and discovery: this keeps start-up fast and memory small.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import urllib.parse

import kubernetes.client
import kubernetes.config
import urllib3

from .. import _poll

# kind -> (API prefix, plural, namespaced)
KINDS: dict[str, tuple[str, str, bool]] = {
    "Namespace": ("/api/v1", "namespaces", False),
    "Node": ("/api/v1", "nodes", False),
    "Pod": ("/api/v1", "pods", True),
    "Service": ("/api/v1", "services", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Secret": ("/api/v1", "secrets", True),
    "Event": ("/api/v1", "events", True),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "PersistentVolume": ("/api/v1", "persistentvolumes", False),
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims", True),
    "ResourceQuota": ("/api/v1", "resourcequotas", True),
    "LimitRange": ("/api/v1", "limitranges", True),
    "Endpoints": ("/api/v1", "endpoints", True),
    "EndpointSlice": ("/apis/discovery.k8s.io/v1", "endpointslices", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "ReplicaSet": ("/apis/apps/v1", "replicasets", True),
    "DaemonSet": ("/apis/apps/v1", "daemonsets", True),
    "StatefulSet": ("/apis/apps/v1", "statefulsets", True),
    "Job": ("/apis/batch/v1", "jobs", True),
    "CronJob": ("/apis/batch/v1", "cronjobs", True),
    "HorizontalPodAutoscaler": ("/apis/autoscaling/v2", "horizontalpodautoscalers", True),
    "StorageClass": ("/apis/storage.k8s.io/v1", "storageclasses", False),
    "PriorityClass": ("/apis/scheduling.k8s.io/v1", "priorityclasses", False),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases", True),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "CustomResourceDefinition": ("/apis/apiextensions.k8s.io/v1", "customresourcedefinitions", False),
    "APIService": ("/apis/apiregistration.k8s.io/v1", "apiservices", False),
    "EventsV1": ("/apis/events.k8s.io/v1", "events", True),
    "ClusterLogs": ("/apis/kwok.x-k8s.io/v1alpha1", "clusterlogs", False),
    "ClusterExec": ("/apis/kwok.x-k8s.io/v1alpha1", "clusterexecs", False),
    "ClusterPortForward": ("/apis/kwok.x-k8s.io/v1alpha1", "clusterportforwards", False),
    "ClusterPolicy": ("/apis/nvidia.com/v1", "clusterpolicies", False),
}


class NotFound(Exception):
    pass


class Conflict(Exception):
    pass


class Gone(Exception):
    """A watch's resourceVersion is too old; list again."""


T = TypeVar("T")


def retry_on_conflict(fn: Callable[[], T], *, steps: int = 5, duration: float = 0.010, factor: float = 1.0,
                      jitter: float = 0.1, sleep: Callable[[float], None] = time.sleep) -> T:
    """Run ``fn`` again while it fails with :class:`Conflict`, as client-go's ``retry.RetryOnConflict``.

    ``fn`` must do the whole read-modify-write: GET the object, apply the
    change to what it got, PUT it (the apiserver checks its resourceVersion).
    A 409 means someone wrote in between; the next try starts from a fresh GET.
    The defaults are client-go's ``retry.DefaultRetry``: at most 5 tries,
    10 ms apart (times ``factor`` after each), plus up to 10 % jitter. After
    the last try the Conflict is raised; any other error at once.
    Where the change does not depend on what is there, a patch needs none of this.
    """
    delay = duration
    for attempt in range(1, steps + 1):
        try:
            return fn()
        except Conflict:
            if attempt >= steps:
                raise
        sleep(delay + (delay * jitter * random.random() if jitter > 0 else 0.0))
        delay *= factor
    raise AssertionError("unreachable")  # pragma: no cover - steps < 1


class ApiError(Exception):
    def __init__(self, status: int, reason: str, body: dict[str, Any] | None):
        self.status = status
        self.body = body or {}
        self.message = self.body.get("message") or reason
        super().__init__(f"{status}: {self.message}")


def load_configuration(kubeconfig: Path | str) -> kubernetes.client.Configuration:
    """The kubeconfig's server and credentials as the official client reads them: ``host``, and the
    certificate, key and CA as files (``cert_file``, ``key_file``, ``ssl_ca_cert``; embedded data is written
    out) or a bearer token (``api_key["BearerToken"]``). What every client of the apiserver authenticates with."""
    cfg = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    return cfg


def token_header(cfg: kubernetes.client.Configuration) -> dict[str, str]:
    """The ``Authorization`` header of a token kubeconfig (a pod's service account); certificate ones have none."""
    token = cfg.api_key.get("BearerToken")
    return {"Authorization": token} if token else {}


class Client:
    def __init__(self, kubeconfig: Path | str, timeout: float = 30, connections: int | None = None):
        """``connections``: for a client many threads share (the node agent's), keep that many connections to
        the apiserver and have a thread wait for a free one rather than open (and TLS-handshake) a connection of
        its own that the pool would throw away; watches hold one each while they stream. By default the
        generated client's pool: 5 per CPU, a thread never waits."""
        self._api = kubernetes.client.ApiClient(load_configuration(kubeconfig))
        # The generated client's REST layer is bypassed; its urllib3 pool
        # already carries the kubeconfig's TLS material.
        self._pool = self._api.rest_client.pool_manager
        if connections:
            shared = {**self._pool.connection_pool_kw, "maxsize": connections, "block": True}
            self._pool = urllib3.PoolManager(num_pools=4, **shared)
        self.timeout = timeout

    def close(self) -> None:
        self._api.close()

    # -- paths ---------------------------------------------------------------

    @staticmethod
    def path(kind: str, name: str | None = None, namespace: str | None = None,
             subresource: str | None = None) -> str:
        try:
            prefix, plural, namespaced = KINDS[kind]
        except KeyError:
            raise KeyError(f"gpulab.kube.api does not know kind {kind!r}") from None
        p = prefix
        if namespaced and namespace:
            p += f"/namespaces/{namespace}"
        p += f"/{plural}"
        if name:
            p += f"/{name}"
        if subresource:
            p += f"/{subresource}"
        return p

    def _auth(self, headers: dict[str, str]) -> dict[str, str]:
        return {**headers, **token_header(self._api.configuration)}

    def _url(self, path: str, query: dict[str, Any] | None) -> str:
        url = self._api.configuration.host + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        return url

    def request(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None,
                content_type: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        payload = self._send(method, path, query, data, {"Accept": "application/json", "Content-Type": content_type})
        return json.loads(payload) if payload else None

    def text(self, path: str) -> str:
        """GET ``path`` as text (``kubectl get --raw``): the apiserver's own ``/metrics``, for one."""
        return self._send("GET", path, None, None, {"Accept": "text/plain"}).decode()

    def _send(self, method: str, path: str, query: dict[str, Any] | None, data: bytes | None,
              headers: dict[str, str]) -> bytes:
        """One request; its body, or the error it answered with (NotFound, Conflict, ApiError)."""
        try:
            resp = self._pool.request(method, self._url(path, query), body=data, headers=self._auth(headers),
                                      timeout=urllib3.Timeout(total=self.timeout), retries=False)
        except urllib3.exceptions.HTTPError as e:
            raise ApiError(0, f"cannot reach the apiserver: {e}", None) from None
        payload = resp.data
        if resp.status >= 400:
            try:
                parsed = json.loads(payload) if payload else None
            except ValueError:
                parsed = None
            if resp.status == 404:
                raise NotFound(path)
            if resp.status == 409:
                raise Conflict((parsed or {}).get("message", path))
            raise ApiError(resp.status, resp.reason or "", parsed)
        return payload

    def ready(self) -> bool:
        """Whether the apiserver answers /readyz with 200: it serves, its post-start hooks (the RBAC roles
        among them) done."""
        try:
            resp = self._pool.request("GET", self._url("/readyz", None), headers=self._auth({}),
                                      timeout=urllib3.Timeout(total=5), retries=False)
        except urllib3.exceptions.HTTPError:
            return False
        return resp.status == 200

    def serves(self, kind: str) -> bool:
        """Whether the apiserver serves ``kind`` yet: a CRD's once it is established, CustomResourceDefinitions
        themselves before its /readyz says ready."""
        try:
            self.request("GET", self.path(kind), query={"limit": 1})
        except (ApiError, NotFound):
            return False
        return True

    # -- verbs ---------------------------------------------------------------

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        try:
            return self.request("GET", self.path(kind, name, namespace))
        except NotFound:
            return None

    def list(self, kind: str, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None) -> list[dict[str, Any]]:
        return self.list_raw(kind, namespace, label_selector, field_selector).get("items") or []

    def list_raw(self, kind: str, namespace: str | None = None, label_selector: str | None = None,
                 field_selector: str | None = None) -> dict[str, Any]:
        q = {}
        if label_selector:
            q["labelSelector"] = label_selector
        if field_selector:
            q["fieldSelector"] = field_selector
        return self.request("GET", self.path(kind, None, namespace), query=q)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        ns = obj.get("metadata", {}).get("namespace")
        return self.request("POST", self.path(obj["kind"], None, ns), obj)

    def apply(self, obj: dict[str, Any], manager: str = "gpulab", force: bool = True) -> dict[str, Any]:
        """Server-side apply."""
        md = obj["metadata"]
        return self.request(
            "PATCH", self.path(obj["kind"], md["name"], md.get("namespace")), obj,
            query={"fieldManager": manager, "force": "true" if force else "false"},
            content_type="application/apply-patch+yaml",
        )

    def patch(self, kind: str, name: str, patch: dict[str, Any], namespace: str | None = None,
              subresource: str | None = None, strategy: str = "merge") -> dict[str, Any]:
        ctype = {"merge": "application/merge-patch+json",
                 "strategic": "application/strategic-merge-patch+json",
                 "json": "application/json-patch+json"}[strategy]
        return self.request("PATCH", self.path(kind, name, namespace, subresource), patch, content_type=ctype)

    def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        """PUT the whole object; its metadata.resourceVersion makes a stale write a :class:`Conflict`."""
        md = obj["metadata"]
        return self.request("PUT", self.path(obj["kind"], md["name"], md.get("namespace")), obj)

    def delete(self, kind: str, name: str, namespace: str | None = None,
               grace_seconds: int | None = None, uid: str | None = None,
               propagation: str | None = None) -> bool:
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        if uid:
            body["preconditions"] = {"uid": uid}
        if propagation:
            body["propagationPolicy"] = propagation
        try:
            self.request("DELETE", self.path(kind, name, namespace), body)
            return True
        except (NotFound, Conflict):
            return False

    def watch(self, kind: str, resource_version: str, namespace: str | None = None,
              timeout_seconds: int = 300, field_selector: str | None = None) -> Iterator[dict[str, Any]]:
        """Yield watch events ({type, object}) until the server closes the stream."""
        q: dict[str, Any] = {"watch": "true", "resourceVersion": resource_version,
                             "timeoutSeconds": timeout_seconds, "allowWatchBookmarks": "true"}
        if field_selector:
            q["fieldSelector"] = field_selector
        resp = self._pool.request(
            "GET", self._url(self.path(kind, None, namespace), q), headers=self._auth({"Accept": "application/json"}),
            preload_content=False, timeout=urllib3.Timeout(connect=10, read=timeout_seconds + 30),
            retries=False,
        )
        if resp.status >= 400:
            body = resp.read()
            resp.release_conn()
            if resp.status == 410:
                raise Gone(body.decode(errors="replace"))
            raise ApiError(resp.status, resp.reason or "", None)
        try:
            buf = b""
            for chunk in resp.stream(65536, decode_content=False):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        finally:
            resp.release_conn()

    def wait_crd(self, name: str, timeout: float = 30) -> None:
        def established() -> bool:
            return condition_true(self.get("CustomResourceDefinition", name), "Established")

        _poll.until(established, timeout,
                    lambda _: TimeoutError(f"CRD {name} not Established after {timeout:.0f} s"), interval=0.1)


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    """The object's status condition of type ``type_`` (``"Available"``, ``"Established"``, ``"Ready"``), or None."""
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c
    return None


def condition_true(obj: dict[str, Any] | None, type_: str) -> bool:
    """Whether the object's condition ``type_`` is ``"True"``."""
    return (condition(obj, type_) or {}).get("status") == "True"
