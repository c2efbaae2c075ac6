"""The simulated GPU stack inside the node agent: hardware, kubelet device side, NVIDIA's programs.

The node agent (``python -m gpulab.cluster.nodeagent``) creates one :class:`GpuStack`
and passes it as its :class:`~gpulab.runtime.devices.DeviceHooks`. The stack

- keeps one :class:`~gpulab.fakegpu.node.GpuNode` per GPU node of the
  topology (GPUs, faults, the kubelet's device manager, nvidia-smi state)
  and routes each pod's admission, containers and termination to it;
- registers the images of the GPU Operator and its operands as built-in
  programs (:mod:`gpulab.fakegpu.operands`, :mod:`gpulab.fakegpu.operator`),
  so the DaemonSet pods the operator creates run NVIDIA's components for
  their node, as threads of this process;
- shares one watch of Nodes and one of ClusterPolicies among those programs
  (:meth:`node_object`, :meth:`subscribe`) and polls the fault files.

Pod annotations it reads and writes:

- ``gpulab.io/gpu-memory`` / ``gpulab.io/gpu-utilization`` (read): what a
  container's CUDA program uses, see :mod:`gpulab.fakegpu.ledger`;
- ``gpulab.io/allocated-devices`` (written after admission): the devices
  the kubelet gave each container, ``{"<container>": {"<resource>": [IDs]}}``.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Callable

from ..kube import api
from ..kube import events
from ..kube.names import OPERATOR_COMPONENT
from ..kube.statedir import StateDir
from ..runtime.devices import ContainerKill, DeviceGrant
from .node import GpuNode

log = logging.getLogger("gpulab.fakegpu")



class Informer:
    """List+watch of one cluster-scoped kind into a cache; calls ``on_change`` after each change."""

    def __init__(self, client: api.Client, kind: str, on_change: Callable[[], None]):
        self.client = client
        self.kind = kind
        self.on_change = on_change
        self.cache: dict[str, dict[str, Any]] = {}
        self.synced = threading.Event()
        self.lock = threading.Lock()

    def get(self, name: str) -> dict[str, Any] | None:
        with self.lock:
            return self.cache.get(name)

    def items(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.cache.values())

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                lst = self.client.list_raw(self.kind)
                with self.lock:
                    self.cache = {o["metadata"]["name"]: o for o in lst.get("items") or []}
                self.synced.set()
                self.on_change()
                rv = lst["metadata"]["resourceVersion"]
                while not stop.is_set():
                    for ev in self.client.watch(self.kind, rv, timeout_seconds=240):
                        if ev["type"] == "BOOKMARK":
                            rv = ev["object"]["metadata"]["resourceVersion"]
                            continue
                        if ev["type"] == "ERROR":
                            raise api.Gone(str(ev["object"]))
                        obj = ev["object"]
                        rv = obj["metadata"]["resourceVersion"]
                        with self.lock:
                            if ev["type"] == "DELETED":
                                self.cache.pop(obj["metadata"]["name"], None)
                            else:
                                self.cache[obj["metadata"]["name"]] = obj
                        self.on_change()
            except api.Gone:
                continue
            except api.NotFound:
                # The kind is not served yet (the ClusterPolicy CRD arrives with the operator).
                stop.wait(2)
            except Exception as e:
                if stop.is_set():
                    return
                log.warning("watch of %s failed (%s); retrying", self.kind, e)
                stop.wait(1)


class Subscription:
    """Wakes a program when the cluster or the simulated hardware changed."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; True when something changed."""
        changed = self.event.wait(timeout)
        self.event.clear()
        return changed


class GpuStack:
    def __init__(self, cluster_dir: Path, client: api.Client | None = None):
        self.cluster_dir = Path(cluster_dir)
        self.client = client or api.Client(self.cluster_dir / "kubeconfigs" / "node-agent.yaml")
        self.stop_event = threading.Event()
        self._subs: set[Subscription] = set()
        self._subs_lock = threading.Lock()
        self.nodes_informer = Informer(self.client, "Node", self.notify)
        self.policies = Informer(self.client, "ClusterPolicy", self.notify)
        self.gpu_nodes: dict[str, GpuNode] = {}
        for spec in self._topology().gpu_nodes:
            self.gpu_nodes[spec.name] = GpuNode(self, spec, self.cluster_dir)
        from . import operands, operator

        operands.register(self)
        operator.register(self)

    def _topology(self):
        return StateDir(self.cluster_dir).topology()

    # -- lifecycle --------------------------------------------------------------

    def start(self) -> None:
        for node in self.gpu_nodes.values():
            node.start()
        for name, target in (("gpu-watch-nodes", self.nodes_informer.run),
                             ("gpu-watch-clusterpolicies", self.policies.run),
                             ("gpu-faults", self._watch_faults),
                             ("gpu-load", self._apply_loads)):
            threading.Thread(target=target, args=(self.stop_event,), daemon=True, name=name).start()
        self.nodes_informer.synced.wait(10)

    def stop(self) -> None:
        self.stop_event.set()
        for node in self.gpu_nodes.values():
            node.stop()

    def _watch_faults(self, stop: threading.Event) -> None:
        while not stop.wait(0.5):
            changed = False
            for node in self.gpu_nodes.values():
                try:
                    changed |= node.reload_faults()
                except Exception:
                    log.exception("cannot reload faults of %s", node.name)
            if changed:
                self.notify()

    def _apply_loads(self, stop: threading.Event, every: float = 2.0) -> None:
        # Programs report what they compute (the traffic that reached them): every few seconds
        # their reports go into the ledger, unless the pod fixes its utilisation by annotation.
        while not stop.wait(every):
            busy = [n for n in self.gpu_nodes.values() if n.has_programs()]
            if not busy:
                continue
            try:
                pods = self.client.list("Pod")
            except (api.ApiError, api.NotFound, OSError) as e:
                log.warning("cannot list pods for GPU load: %s", e)
                continue
            by_node: dict[str, dict[str, dict[str, Any]]] = {}
            for pod in pods:
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
        return self.nodes_informer.get(name)

    def subscribe(self) -> Subscription:
        sub = Subscription()
        with self._subs_lock:
            self._subs.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._subs_lock:
            self._subs.discard(sub)

    def notify(self) -> None:
        with self._subs_lock:
            subs = list(self._subs)
        for s in subs:
            s.event.set()

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
