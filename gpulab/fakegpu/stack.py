"""The simulated GPU stack inside the node agent: hardware, kubelet device side, NVIDIA's programs.

The node agent (``python -m gpulab.cluster.nodeagent``) creates one :class:`GpuStack`
and passes it as its :class:`~gpulab.runtime.devices.DeviceHooks`. The stack

- keeps one :class:`~gpulab.fakegpu.node.GpuNode` per GPU node of the
  topology (GPUs, faults, the kubelet's device manager, nvidia-smi state)
  and routes each pod's admission, containers and termination to it;
- serves the built-in programs of the GPU Operator and its operands
  (:mod:`gpulab.fakegpu.operands`, :mod:`gpulab.fakegpu.operator`, which
  the node agent's entry point registers for this stack), so the DaemonSet
  pods the operator creates run NVIDIA's components for their node, as
  threads of this process;
- shares the process's informers of Nodes and ClusterPolicies among those
  programs (:meth:`node_object`, :meth:`subscribe`) and polls the fault files.

Pod annotations it reads and writes:

- ``gpulab.io/gpu-memory`` / ``gpulab.io/gpu-utilization`` (read): what a
  container's CUDA program uses, see :mod:`gpulab.fakegpu.ledger`;
- ``gpulab.io/allocated-devices`` (written after admission): the devices
  the kubelet gave each container, ``{"<container>": {"<resource>": [IDs]}}``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..kube import api
from ..kube import events
from ..kube.informer import SharedInformers
from ..kube.informer import key as informer_key
from ..kube.names import OPERATOR_COMPONENT
from ..kube.statedir import StateDir
from ..runtime.devices import ContainerKill, DeviceGrant
from .node import GpuNode, NodeStatusWriter

log = logging.getLogger("gpulab.fakegpu")

#: The pod informer's index by node (``spec.nodeName``).
NODE_INDEX = "node"


class Subscription:
    """Wakes a program when the cluster or the simulated hardware changed: for a program of one node (``node``),
    what concerns that node or the whole cluster; for a cluster-wide one (``node`` None), what concerns the whole
    cluster, a node's labels, annotations or spec, and any node's hardware. A Node's status (KWOK's heartbeats)
    wakes only its own node's programs: a fleet's programs are not all woken by every node's heartbeat."""

    def __init__(self, node: str | None = None) -> None:
        self.node = node
        self.event = threading.Event()

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; True when something changed."""
        changed = self.event.wait(timeout)
        self.event.clear()
        return changed


class GpuStack:
    """The GPU side of every GPU node, as :class:`~gpulab.runtime.devices.DeviceHooks`, and what its programs share.

    ``informers`` are the process's shared ones (the node agent watches
    Nodes too); without them the stack makes its own. Its programs are
    registered by whoever assembles the process (:mod:`gpulab.cluster.nodeagent`).
    """

    def __init__(self, cluster_dir: Path, client: api.Client | None = None,
                 informers: SharedInformers | None = None):
        self.cluster_dir = Path(cluster_dir)
        self.client = client or api.Client(self.cluster_dir / "kubeconfigs" / "node-agent.yaml")
        self.stop_event = threading.Event()
        self._subs: dict[str | None, set[Subscription]] = {}  # by node (None: cluster-wide)
        self._subs_lock = threading.Lock()
        self._own_informers = informers is None
        self.informers = informers or SharedInformers(self.client)
        self.nodes_informer = self.informers.informer("Node")
        # ClusterPolicies: the operator's programs reconcile when one changes.
        self.policies = self.informers.informer("ClusterPolicy")
        # Pods: whose GPU utilisation is fixed by annotation (_apply_loads), which hold a node's GPUs, and the
        # pods programs wait for (watch_pod).
        self.pods = self.informers.informer("Pod")
        self.pods.add_index(NODE_INDEX, lambda pod: (pod.get("spec") or {}).get("nodeName"))
        self._pod_watchers: dict[str, set[Subscription]] = {}
        self.pods.add_handler(on_add=self._pod_changed, on_update=lambda old, new: self._pod_changed(new),
                              on_delete=self._pod_changed)
        self.nodes_informer.add_handler(on_add=lambda obj: self._node_changed(None, obj),
                                        on_update=self._node_changed,
                                        on_delete=lambda obj: self._node_changed(obj, None))
        # A ClusterPolicy concerns the operator alone: it renders the policy into its operands' pods, whose
        # programs read their own pod (a fleet's thousands of them are not woken by each status the operator writes).
        self.policies.on_change(self.notify_cluster)
        self.node_status = NodeStatusWriter(self.client)
        self.gpu_nodes: dict[str, GpuNode] = {}
        for spec in self._topology().gpu_nodes:
            self.gpu_nodes[spec.name] = GpuNode(self, spec, self.cluster_dir)

    def _topology(self):
        return StateDir(self.cluster_dir).topology()

    # -- lifecycle --------------------------------------------------------------

    def start(self) -> None:
        self.node_status.start()
        for node in self.gpu_nodes.values():
            node.start()
        for informer in (self.nodes_informer, self.policies, self.pods):
            informer.start()
        for name, target in (("gpu-faults", self._watch_faults), ("gpu-load", self._apply_loads)):
            threading.Thread(target=target, args=(self.stop_event,), daemon=True, name=name).start()
        self.nodes_informer.wait_synced(10)

    def stop(self) -> None:
        self.stop_event.set()
        if self._own_informers:
            self.informers.stop()
        for node in self.gpu_nodes.values():
            node.stop()
        self.node_status.stop()

    def _watch_faults(self, stop: threading.Event) -> None:
        while not stop.wait(0.5):
            for node in self.gpu_nodes.values():
                try:
                    if node.reload_faults():
                        self.notify(node.name)
                except Exception:
                    log.exception("cannot reload faults of %s", node.name)

    def _apply_loads(self, stop: threading.Event, every: float = 2.0) -> None:
        # Programs report what they compute (the traffic that reached them): every few seconds
        # their reports go into the ledger, unless the pod fixes its utilisation by annotation.
        while not stop.wait(every):
            busy = [n for n in self.gpu_nodes.values() if n.has_programs()]
            if not busy:
                continue
            by_node: dict[str, dict[str, dict[str, Any]]] = {}
            for pod in self.pods.list():
                by_node.setdefault((pod.get("spec") or {}).get("nodeName", ""), {})[pod["metadata"]["uid"]] = pod
            for node in busy:
                try:
                    node.apply_load(by_node.get(node.name, {}))
                except Exception:
                    log.exception("cannot apply GPU load on %s", node.name)

    # -- for programs -----------------------------------------------------------

    def gpu_node(self, name: str) -> GpuNode | None:
        return self.gpu_nodes.get(name)

    def node_object(self, name: str) -> dict[str, Any] | None:
        """The Node ``name`` as last seen by the shared watch of Nodes."""
        return self.nodes_informer.get(name)

    def node_objects(self) -> list[dict[str, Any]]:
        """Every Node, as last seen by the shared watch of Nodes."""
        return self.nodes_informer.list()

    def pods_on(self, node: str) -> list[dict[str, Any]]:
        """The pods bound to ``node``, as the shared watch of Pods last saw them (from the API until it has listed)."""
        if self.pods.has_synced():
            return self.pods.by_index(NODE_INDEX, node)
        return self.client.list("Pod", field_selector=f"spec.nodeName={node}")

    def watch_pod(self, sub: Subscription, key: str) -> None:
        """Wake ``sub`` also when the pod ``namespace/name`` changes (until :meth:`unwatch_pod`)."""
        with self._subs_lock:
            self._pod_watchers.setdefault(key, set()).add(sub)

    def unwatch_pod(self, sub: Subscription, key: str) -> None:
        with self._subs_lock:
            watchers = self._pod_watchers.get(key)
            if watchers is not None:
                watchers.discard(sub)
                if not watchers:
                    del self._pod_watchers[key]

    def _pod_changed(self, pod: dict[str, Any]) -> None:
        with self._subs_lock:
            watchers = list(self._pod_watchers.get(informer_key(pod), ()))
        for sub in watchers:
            sub.event.set()

    def subscribe(self, node: str | None = None) -> Subscription:
        """Be woken by changes (see :class:`Subscription`): those of ``node`` and the cluster's, or all."""
        sub = Subscription(node)
        with self._subs_lock:
            self._subs.setdefault(node, set()).add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._subs_lock:
            subs = self._subs.get(sub.node)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._subs[sub.node]

    def notify(self, node: str | None = None, everyone: bool = True) -> None:
        """Wake the subscribers concerned: with ``node``, that node's programs and (with ``everyone``) the
        cluster-wide ones; without, all of them."""
        self._wake(None if node is None else [node, None] if everyone else [node])

    def notify_cluster(self) -> None:
        """Wake the cluster-wide subscribers only (the operator)."""
        self._wake([None])

    def _wake(self, nodes: list[str | None] | None) -> None:
        """Wake the subscribers of ``nodes`` (None in it: the cluster-wide ones; ``nodes`` None: everyone)."""
        with self._subs_lock:
            subs = [s for n in (self._subs if nodes is None else nodes) for s in self._subs.get(n, ())]
        for s in subs:
            s.event.set()

    @staticmethod
    def _shape(node: dict[str, Any] | None) -> tuple[Any, ...] | None:
        """What cluster-wide programs read of a Node: its labels, annotations and spec (not its status)."""
        if node is None:
            return None
        md = node.get("metadata") or {}
        return md.get("labels"), md.get("annotations"), node.get("spec")

    def _node_changed(self, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        """A Node was added, changed (or listed again) or deleted: wake its programs, and the cluster-wide ones
        unless only its status changed."""
        name = (new or old or {}).get("metadata", {}).get("name")
        self.notify(name, everyone=self._shape(old) != self._shape(new))

    def node_event(self, node: str, reason: str, message: str, type_: str = "Normal",
                   component: str = OPERATOR_COMPONENT) -> None:
        """An Event on a Node; the same one again counts on the existing Event (see :mod:`gpulab.kube.events`)."""
        obj = self.node_object(node) or {"metadata": {"name": node, "uid": ""}}
        events.record(self.client, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node,
                           "uid": obj["metadata"].get("uid") or node}},
                          reason, message, type_, component=component, host=node)

    def pod_event(self, pod: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> None:
        events.record(self.client, {**pod, "kind": "Pod"}, reason, message, type_, component="kubelet",
                          host=pod["spec"].get("nodeName"))

    # -- DeviceHooks ------------------------------------------------------------

    def _node_of(self, pod: dict[str, Any]) -> GpuNode | None:
        return self.gpu_nodes.get((pod.get("spec") or {}).get("nodeName", ""))

    def admit(self, pod: dict[str, Any]) -> None:
        node = self._node_of(pod)
        if node is not None:
            node.admit(pod)

    def adopt(self, pod: dict[str, Any]) -> None:
        node = self._node_of(pod)
        if node is not None:
            node.adopt(pod)

    def prepare(self, pod: dict[str, Any], container: dict[str, Any]) -> DeviceGrant:
        node = self._node_of(pod)
        return node.prepare(pod, container) if node is not None else DeviceGrant()

    def observe(self, pod: dict[str, Any], container: dict[str, Any], running: bool) -> ContainerKill | None:
        node = self._node_of(pod)
        return node.observe(pod, container, running) if node is not None else None

    def release(self, pod: dict[str, Any]) -> None:
        node = self._node_of(pod)
        if node is not None:
            node.release(pod)

    def retain(self, pod_uids: set[str]) -> None:
        for node in self.gpu_nodes.values():
            node.manager.retain(pod_uids)

    def wake_with(self, wake: Callable[[str], None]) -> None:
        for node in self.gpu_nodes.values():
            node.wake_pod = wake
