"""What a kubelet registers, done once for each simulated node at bring-up.

A real kubelet creates its Node object with capacity from the machine, its
allocatable (the capacity less what its configuration reserves: kube-reserved,
system-reserved, the hard eviction thresholds; :mod:`gpulab.kube.allocatable`),
its well-known labels, and registration taints; NFD and GFD add hardware labels
later. Here gpulab creates each topology node the same way, marked for KWOK
(``kwok.x-k8s.io/node: fake``) so KWOK keeps it alive. A GPU node starts
with NFD's PCI label only (NFD is not simulated): its ``nvidia.com/gpu``
resources come from the device plugin once the GPU Operator runs, and its
``nvidia.com/*`` labels from the operator and GFD (:mod:`gpulab.fakegpu`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Protocol

import yaml

from .. import _poll, versions
from ..i18n import _
from ..fakegpu import gfd
from ..kube import allocatable, api
from .base import ClusterError
from .processes import ProcessTable, Started
from ..kube.names import LOOPBACK_NODE_ADDRESS, NODE_ANNOTATION, PROVISIONER, STORAGE_CLASS, node_address
from ..kube.topology import NodeSpec, Topology
from ..runtime import sandbox
from ..runtime.resourcemetrics import PATH_ANNOTATION, node_path

POOL_LABEL = "gpulab.io/pool"
#: The taints of a node not (yet) Ready, which kube-controller-manager's node lifecycle controller keeps in step
#: with its Ready condition.
NOT_READY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


class BootingCluster(Protocol):
    """What registering the nodes and waiting for them needs of the cluster (:class:`~gpulab.cluster.embedded.EmbeddedCluster`)."""

    @property
    def kubeconfig(self) -> Path: ...

    @property
    def procs(self) -> ProcessTable:
        """The cluster's processes (KWOK's log says why a node is not Ready)."""


def base_labels(spec: NodeSpec) -> dict[str, str]:
    return {
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
        POOL_LABEL: spec.pool,
    }


def hardware_labels(spec: NodeSpec) -> dict[str, str]:
    """What NFD finds on the machine: an NVIDIA PCI device on GPU nodes."""
    if not spec.gpu_count or not spec.gpu_model:
        return {}
    return gfd.nfd_labels(spec.gpu_model, spec.gpu_count)


def addresses(spec: NodeSpec, index: int, pod_network: bool) -> list[dict[str, str]]:
    """What a kubelet reports as the node's addresses: its InternalIP and its hostname.

    On a pod network each node has an address of its own there (:func:`gpulab.kube.names.node_address`),
    which pods reach (NodePorts, hostPorts) and the apiserver dials through its egress; without one the
    nodes share the host's loopback.
    """
    ip = node_address(index) if pod_network else LOOPBACK_NODE_ADDRESS
    return [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": spec.name}]


def internal_ips(topo: Topology, pod_network: bool) -> tuple[str, ...]:
    """Every node's InternalIP (what a certificate serving the kubelet API for all of them must name)."""
    return tuple(sorted({addresses(spec, i, pod_network)[0]["address"] for i, spec in enumerate(topo.nodes)}))


def node_object(spec: NodeSpec, annotation: tuple[str, str],
                node_addresses: list[dict[str, str]] | None = None) -> dict[str, Any]:
    labels = {**base_labels(spec), **hardware_labels(spec), **spec.labels}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": labels,
            "annotations": {
                annotation[0]: annotation[1],
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                # Where metrics-server scrapes this node's resource metrics (the node agent's endpoint).
                PATH_ANNOTATION: node_path(spec.name),
            },
        },
        "spec": {"taints": [t.to_api() for t in spec.taints]} if spec.taints else {},
        "status": {
            "addresses": node_addresses or [],
            "capacity": spec.capacity(),
            "allocatable": spec.allocatable(),
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "osImage": "Ubuntu 24.04.1 LTS",
                "kernelVersion": "6.8.0-gpulab",
                "containerRuntimeVersion": "gpulab://" + versions.KUBERNETES.lstrip("v"),
                "kubeletVersion": versions.KUBERNETES,
                "kubeProxyVersion": versions.KUBERNETES,
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
        },
    }


def machine_resources(spec: NodeSpec, node: dict[str, Any]) -> dict[str, Any]:
    """The status patch that makes ``node``'s capacity and allocatable of the machine's own resources (cpu,
    memory, pods, ephemeral-storage, hugepages) what the topology says; ``{}`` when they already are."""
    status = node.get("status") or {}
    patch = {}
    for key, want in (("capacity", spec.capacity()), ("allocatable", spec.allocatable())):
        have = status.get(key) or {}
        # Compared as numbers: the apiserver writes every quantity in its canonical form.
        if any(resource not in have or allocatable.parse(have[resource]) != allocatable.parse(value)
               for resource, value in want.items()):
            patch[key] = want
    return patch


def storage_class(name: str, provisioner: str) -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": name,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": provisioner,
        # Bind once the scheduler has picked a node, so the volume is local
        # to the node the pod runs on (like local-path provisioners).
        "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Delete",
    }


def install_crds(cluster: BootingCluster, crds: tuple[Path, ...], apiserver: Started) -> None:
    """Create KWOK's CRDs (the node agent's per-pod ClusterLogs, ClusterExec, ClusterPortForward) as soon as
    ``apiserver``, just started, serves CRDs: before its post-start hooks are done. Idempotent.

    Early, because a custom resource created within 2 s of its CRD's Established condition waits 2 s in the
    apiserver (a grace for apiservers of an HA control plane that have not seen the CRD yet), and the node
    agent creates the first ones as the first pod starts."""
    client = api.Client(cluster.kubeconfig, timeout=5)
    cluster.procs.wait_for("its CustomResourceDefinition API", lambda: client.serves("CustomResourceDefinition"),
                           apiserver, timeout=60)
    for crd in crds:
        client.apply(yaml.safe_load(crd.read_text()))


def bootstrap(cluster: BootingCluster, topo: Topology, crds: tuple[Path, ...],
              say: Callable[[str], None]) -> None:
    """Create what a fresh cluster needs before the controllers start (after :func:`install_crds`); idempotent."""
    client = api.Client(cluster.kubeconfig)
    for crd in crds:
        name = yaml.safe_load(crd.read_text())["metadata"]["name"]
        client.wait_crd(name)
    if client.get("StorageClass", STORAGE_CLASS) is None:
        client.create(storage_class(STORAGE_CLASS, PROVISIONER))
    created = 0
    pod_network = sandbox.kind() == "namespaces"
    for index, spec in enumerate(topo.nodes):
        node = client.get("Node", spec.name)
        want = addresses(spec, index, pod_network)
        if node is None:
            client.create(node_object(spec, NODE_ANNOTATION, want))
            created += 1
            continue
        if (node.get("status") or {}).get("addresses") != want:
            # Registered by another version or in another sandbox mode: the kubelet reports what it has now.
            client.patch("Node", spec.name, {"status": {"addresses": want}}, subresource="status")
        machine = machine_resources(spec, node)
        if machine:
            # Registered before gpulab modelled the kubelet's reservations (or with other ones): as a kubelet
            # does at every status update, it reports its machine's capacity and allocatable. A merge patch:
            # the device plugin's nvidia.com/* entries stay as they are.
            client.patch("Node", spec.name, {"status": machine}, subresource="status")
        if (node["metadata"].get("annotations") or {}).get(PATH_ANNOTATION) != node_path(spec.name):
            # A node registered before gpulab served resource metrics.
            client.patch("Node", spec.name, {"metadata": {"annotations": {PATH_ANNOTATION: node_path(spec.name)}}})
    if created:
        say(_("registered {n} nodes from topology {topology!r}", n=created, topology=topo.name))


def wait_ready(cluster: BootingCluster, topo: Topology, timeout: float) -> None:
    client = api.Client(cluster.kubeconfig)
    want = {n.name for n in topo.nodes}
    not_ready = want

    def all_ready() -> bool:
        nonlocal not_ready
        ready = set()
        for node in client.list("Node"):
            # Ready as the scheduler sees it: the condition True, and kube-controller-manager has taken off the
            # taint a node is registered with until then (a pod placed meanwhile lands on whichever node's taint
            # went first).
            if any(t.get("key") in NOT_READY_TAINTS for t in node.get("spec", {}).get("taints") or []):
                continue
            for cond in node.get("status", {}).get("conditions") or []:
                if cond.get("type") == "Ready" and cond.get("status") == "True":
                    ready.add(node["metadata"]["name"])
        not_ready = want - ready
        return not not_ready

    _poll.until(all_ready, timeout, lambda last: ClusterError(_(
        "nodes not Ready after {seconds:.0f} s: {nodes}; see {log}", seconds=timeout,
        nodes=", ".join(sorted(not_ready)), log=cluster.procs.log("kwok"))), interval=0.2)
