"""metrics-server on the embedded backend: ``kubectl top`` through the real one.

The unmodified metrics-server (built from the Go module proxy, :mod:`.binaries`)
runs as one more component of the embedded cluster, on 127.0.0.1. It is an
extension API server: the apiserver's aggregation layer forwards
``metrics.k8s.io`` to it through the APIService ``v1beta1.metrics.k8s.io``
and an ExternalName Service (``kube-system/metrics-server`` -> localhost), the
way kwokctl reaches it.

It scrapes every node's resource metrics as it scrapes kubelets: at the
node's InternalIP, on ``--kubelet-port`` (the node agent's
``resource-metrics`` port, one for every simulated node, as KWOK serves all
nodes on one port), at the path in the node's annotation
``metrics.k8s.io/resource-metrics-path`` (:mod:`gpulab.runtime.resourcemetrics`).
With a pod network the nodes' addresses are there, not on the host: it
dials them through the node agent's egress, named as its ``HTTPS_PROXY``
(the way a component behind a proxy reaches kubelets); without one every
node is at 127.0.0.1.
It checks the node agent's serving certificate against the cluster CA and
presents its own client certificate (``system:metrics-server``), whose RBAC
is upstream's ``components.yaml`` with that user as the subject.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from ..kube import api, pki

NAMESPACE = "kube-system"
SERVICE = "metrics-server"
GROUP = "metrics.k8s.io"
VERSION = "v1beta1"
USER = "system:metrics-server"
# pki/<stem>.crt: the client certificate (kubeconfig identity and kubelet client) and the serving one.
CLIENT_CERT = "metrics-server"
SERVING_CERT = "metrics-server-serving"
MANAGER = "gpulab-install"
# metrics-server's minimum; `kubectl top` shows a pod once two scrapes have seen it.
METRIC_RESOLUTION = "10s"
KUBELET_TIMEOUT = "5s"


def serving_cert(pki_dir: Path) -> tuple[Path, Path]:
    """The certificate metrics-server serves with: the name the aggregation layer checks is the Service's."""
    return pki.issue_server(pki_dir, SERVING_CERT, SERVICE, (f"{SERVICE}.{NAMESPACE}.svc",))


def argv(binary: Path, root: Path, port: int, kubelet_port: int) -> list[str]:
    p = root / "pki"
    kubeconfig = root / "kubeconfigs" / f"{CLIENT_CERT}.yaml"
    crt, key = serving_cert(p)
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1", f"--secure-port={port}",
        f"--tls-cert-file={crt}", f"--tls-private-key-file={key}",
        # The "kubelets": the node agent's resource metrics endpoint for every simulated node.
        "--kubelet-preferred-address-types=InternalIP", f"--kubelet-port={kubelet_port}",
        f"--kubelet-certificate-authority={p / 'ca.crt'}",
        f"--kubelet-client-certificate={p / f'{CLIENT_CERT}.crt'}",
        f"--kubelet-client-key={p / f'{CLIENT_CERT}.key'}",
        # It must be shorter than the resolution (metrics-server refuses to start otherwise).
        f"--metric-resolution={METRIC_RESOLUTION}", f"--kubelet-request-timeout={KUBELET_TIMEOUT}",
        "--profiling=false", "--v=0",
    ]


def proxy_env(egress_port: int | None) -> dict[str, str]:
    """The environment that sends its kubelet connections through the egress on ``egress_port`` (none: {}).

    Go's proxy rules never proxy loopback addresses, so the apiserver at 127.0.0.1 is dialled directly.
    """
    if egress_port is None:
        return {}
    proxy = f"http://127.0.0.1:{egress_port}"
    return {"HTTPS_PROXY": proxy, "https_proxy": proxy, "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost"}


def objects(port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """RBAC as in metrics-server's components.yaml (for the user of its certificate), and its registration."""
    subject = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}]

    def binding(kind: str, name: str, role_kind: str, role: str, namespace: str | None = None) -> dict[str, Any]:
        md: dict[str, Any] = {"name": name, "labels": {"k8s-app": "metrics-server"}}
        if namespace:
            md["namespace"] = namespace
        return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": md,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
                "subjects": subject}

    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "system:aggregated-metrics-reader",
                      "labels": {"k8s-app": "metrics-server",
                                 "rbac.authorization.k8s.io/aggregate-to-admin": "true",
                                 "rbac.authorization.k8s.io/aggregate-to-edit": "true",
                                 "rbac.authorization.k8s.io/aggregate-to-view": "true"}},
         "rules": [{"apiGroups": [GROUP], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "system:metrics-server", "labels": {"k8s-app": "metrics-server"}},
         "rules": [{"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]},
                   {"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]}]},
        binding("RoleBinding", "metrics-server-auth-reader", "Role", "extension-apiserver-authentication-reader",
                NAMESPACE),
        binding("ClusterRoleBinding", "metrics-server:system:auth-delegator", "ClusterRole", "system:auth-delegator"),
        binding("ClusterRoleBinding", "system:metrics-server", "ClusterRole", "system:metrics-server"),
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": SERVICE, "namespace": NAMESPACE, "labels": {"k8s-app": "metrics-server"}},
         "spec": {"type": "ExternalName", "externalName": "localhost",
                  "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}},
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
         "metadata": {"name": f"{VERSION}.{GROUP}", "labels": {"k8s-app": "metrics-server"}},
         "spec": {"group": GROUP, "version": VERSION, "groupPriorityMinimum": 100, "versionPriority": 100,
                  "service": {"namespace": NAMESPACE, "name": SERVICE, "port": port},
                  "caBundle": base64.b64encode(ca_bundle).decode()}},
    ]


def install(kubeconfig: Path, pki_dir: Path, port: int) -> None:
    """Apply the RBAC and the APIService (idempotent; the port may have moved since the last start)."""
    client = api.Client(kubeconfig)
    for doc in objects(port, (pki_dir / "ca.crt").read_bytes()):
        client.apply(doc, manager=MANAGER)


def available(client: api.Client) -> bool:
    return api.condition_true(client.get("APIService", f"{VERSION}.{GROUP}"), "Available")
