"""Cluster DNS: CoreDNS as kubeadm and kind install it, from ``manifests/cluster-dns/``.

A Deployment in ``kube-system`` behind the Service ``kube-dns`` at
:data:`gpulab.kube.names.CLUSTER_DNS_IP`, the nameserver of every pod's
resolv.conf. Its container runs the real CoreDNS built with the control plane
(:mod:`gpulab.runtime.images`), with the ``kubernetes`` plugin watching the
API through the ``kubernetes`` Service.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import yaml

from .. import _poll, paths
from ..i18n import _
from ..kube import api

NAMESPACE = "kube-system"
DEPLOYMENT = "coredns"
IMAGE_REPOSITORY = "registry.k8s.io/coredns/coredns"
MANAGER = "gpulab-install"


def manifest() -> Path:
    return paths.manifests() / "cluster-dns" / "coredns.yaml"


def install(kubeconfig: Path) -> None:
    """Apply CoreDNS's objects (idempotent)."""
    client = api.Client(kubeconfig)
    for doc in yaml.safe_load_all(manifest().read_text()):
        if doc:
            client.apply(doc, manager=MANAGER)


def ready(client: api.Client) -> bool:
    deploy = client.get("Deployment", DEPLOYMENT, NAMESPACE) or {}
    status = deploy.get("status") or {}
    return bool(status.get("readyReplicas")) and status.get("observedGeneration") == deploy["metadata"].get(
        "generation")


def wait(kubeconfig: Path, say: Callable[[str], None], timeout: float = 60.0) -> None:
    """Wait for CoreDNS to answer; a slow one is reported, not fatal (the cluster still runs)."""
    client = api.Client(kubeconfig)
    started = time.monotonic()
    try:
        _poll.until(lambda: ready(client), timeout, lambda last: TimeoutError(), interval=0.25)
    except TimeoutError:
        say(_("cluster DNS not ready after {seconds:.0f} s; "
              "see `kubectl -n {namespace} describe pod -l k8s-app=kube-dns`", seconds=timeout, namespace=NAMESPACE))
        return
    say(_("cluster DNS ready in {seconds:.1f} s (kube-system/coredns)", seconds=time.monotonic() - started))
