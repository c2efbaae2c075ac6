"""The node agent: the pod-running half of a kubelet for every simulated node.

KWOK keeps the simulated nodes alive (heartbeats, leases) and serves their
kubelet HTTP API; this process does what KWOK does not: it runs each bound
pod (:mod:`gpulab.runtime.pod`), puts each pod on the pod network through the
CNI plugins with its node's ``podCIDR`` (:mod:`gpulab.runtime.network`), tells KWOK where each container's log file is and how to exec
into it, provisions local persistent volumes, and lets the GPU stack
allocate devices to containers (:class:`~gpulab.runtime.devices.DeviceHooks`).

One process serves all simulated nodes; it watches pods cluster-wide and
keeps one worker thread per pod bound to a node it manages.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from ..kube import api
from ..kube.allocatable import parse as parse_quantity
from ..kube.informer import Informer, SharedInformers
from ..kube.topology import DEFAULT_IMAGE_PULL_BANDWIDTH
from . import sandbox, streaming
from .devices import DeviceHooks, NoDevices
from .imagemanager import ImageManager
from .images import ImageCatalog
from .network import PodNetwork
from .pod import SYNC_SLOTS, PodWorker
from .provisioner import Provisioner
from .volumes import VolumeBuilder
from ..kube.names import NODE_ANNOTATION

log = logging.getLogger("gpulab.runtime")


# How often the workers of ended pods are forgotten (as often as the pod watch's stream used to end).
REAP_EVERY = 240.0

DEFAULT_PULL_RATE = float(parse_quantity(DEFAULT_IMAGE_PULL_BANDWIDTH))

# KWOK's per-pod objects for the kubelet API's logs, exec and port-forward.
KINDS = ("ClusterLogs", "ClusterExec", "ClusterPortForward")


class LogRegistry:
    """Publishes where each pod's logs are, and how to exec into it, for KWOK.

    KWOK serves ``kubectl logs`` and ``kubectl exec`` for simulated nodes from
    cluster-scoped ClusterLogs/ClusterExec objects; one of each per pod.
    Being cluster-scoped, they are invisible to namespace-scoped users.
    """

    def __init__(self, client: api.Client):
        self.client = client
        # What was last published for each pod (by name): a pod's containers starting republish the same.
        self._published: dict[str, list[dict[str, Any]]] = {}

    @staticmethod
    def name(worker: PodWorker) -> str:
        ns, name, uid = worker.key
        return f"{ns}.{name}.{uid[:8]}"

    def register(self, worker: PodWorker) -> None:
        ns, name, _ = worker.key
        selector = {"matchNamespaces": [ns], "matchNames": [name]}
        logs = []
        execs = []
        for c in worker.init + worker.main:
            prev = c.previous_log_path()
            current = c.log_path()
            # Waiting to restart: the logs are the last run's, as a kubelet shows them.
            shown = current if current.exists() or prev is None else prev
            entry: dict[str, Any] = {"containers": [c.name], "logsFile": str(shown), "follow": True}
            if prev:
                entry["previousLogsFile"] = str(prev)
            logs.append(entry)
            # The command runs in the container (streaming.dispatch hands it to the node agent's ExecServer);
            # KWOK only starts the dispatcher, from its own PATH, in this directory.
            workdir = worker.dir / "exec" / c.name
            workdir.mkdir(parents=True, exist_ok=True)
            workdir.chmod(0o777)
            env = {streaming.SOCKET_ENV: str(streaming.socket_path(worker.agent.cluster_dir)),
                   streaming.TARGET_ENV: f"{worker.key[2]}/{c.name}"}
            local: dict[str, Any] = {"workDir": str(workdir), "envs": [{"name": k, "value": v} for k, v in env.items()]}
            if os.geteuid() == 0:
                local["securityContext"] = {"runAsUser": sandbox.NOBODY, "runAsGroup": sandbox.NOBODY}
            execs.append({"containers": [c.name], "local": local})
        forwards = []
        if worker.net is not None and worker.net.sandbox_pid and not worker.net.shared:
            ports = sorted({int(p["containerPort"]) for c in worker.init + worker.main
                            for p in c.spec.get("ports") or [] if (p.get("protocol") or "TCP") == "TCP"})
            forwards = [{"ports": [port], "command": [sys.executable, "-I", "-m", "gpulab.runtime.streaming", "forward",
                                                      str(worker.agent.cluster_dir), str(worker.net.sandbox_pid),
                                                      str(port)]} for port in ports]
        meta = {"name": self.name(worker), "labels": {"gpulab.io/pod-uid": worker.key[2]}}
        objects = [{"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "ClusterLogs", "metadata": meta,
                    "spec": {"selector": selector, "logs": logs}},
                   {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "ClusterExec", "metadata": meta,
                    "spec": {"selector": selector, "execs": execs}}]
        if forwards:
            objects.append({"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "ClusterPortForward", "metadata": meta,
                            "spec": {"selector": selector, "forwards": forwards}})
        published = self._published.get(meta["name"]) or []
        try:
            for obj in objects:
                if obj in published:
                    continue
                if any(p["kind"] == obj["kind"] for p in published):
                    self.client.apply(obj, manager="gpulab-node-agent")
                    continue
                try:
                    # New: a create costs the apiserver far less than a server-side apply of a custom resource.
                    self.client.create(obj)
                except api.Conflict:  # left by an earlier node agent
                    self.client.apply(obj, manager="gpulab-node-agent")
            self._published[meta["name"]] = objects
        except (api.ApiError, api.NotFound) as e:
            self._published.pop(meta["name"], None)
            log.warning("cannot publish logs/exec for %s/%s: %s", ns, name, e)

    def unregister(self, worker: PodWorker) -> None:
        self._published.pop(self.name(worker), None)
        for kind in KINDS:
            self.client.delete(kind, self.name(worker))

    def sweep(self, live_uids: set[str]) -> None:
        for kind in KINDS:
            for obj in self.client.list(kind):
                uid = (obj["metadata"].get("labels") or {}).get("gpulab.io/pod-uid")
                if uid and uid not in live_uids:
                    self.client.delete(kind, obj["metadata"]["name"])


class NodeAgent:
    """Runs the pods bound to the nodes it manages: one :class:`PodWorker` per pod.

    It follows Nodes, Pods and ConfigMaps through ``informers`` (shared with
    the process's other consumers, such as the GPU stack; without them it
    makes its own, and stops them when it stops).
    """

    def __init__(self, cluster_dir: Path, network: PodNetwork, devices: DeviceHooks | None = None,
                 images: ImageCatalog | None = None, image_manager: ImageManager | None = None,
                 informers: SharedInformers | None = None, client: api.Client | None = None):
        self.cluster_dir = cluster_dir
        self.client = client or api.Client(cluster_dir / "kubeconfigs" / "node-agent.yaml")
        self.sync_slots = threading.BoundedSemaphore(SYNC_SLOTS)
        self._own_informers = informers is None
        self.informers = informers or SharedInformers(self.client)
        self.pods_dir = cluster_dir / "pods"
        self.nodes_dir = cluster_dir / "nodes"
        self.devices: DeviceHooks = devices or NoDevices()
        self.devices.wake_with(self._wake_pod)
        self.network = network
        self.images = images or ImageCatalog()
        # Each node's images and pulls (the kubelet's image manager); without one, every node pulls at the default rate.
        self.image_manager = image_manager or ImageManager(self.nodes_dir, lambda node: DEFAULT_PULL_RATE)
        self.logs = LogRegistry(self.client)
        self.volumes = VolumeBuilder(self.client, self.nodes_dir, configmaps=self.informers.informer("ConfigMap"))
        self.provisioner = Provisioner(self.client, self.nodes_dir, self.informers)
        self.nodes: set[str] = set()
        self.workers: dict[str, PodWorker] = {}
        # The pod informer's thread adds and removes workers; the main thread reaps the ended ones.
        self._workers_lock = threading.Lock()
        # resourceVersion of each ConfigMap seen, by (namespace, name): a change refreshes pods' volumes.
        self.configmaps: dict[tuple[str, str], str | None] = {}
        self.stop = threading.Event()

    # -- watches --------------------------------------------------------------

    def _managed(self, node: dict[str, Any]) -> bool:
        ann = node["metadata"].get("annotations") or {}
        return ann.get(NODE_ANNOTATION[0]) == NODE_ANNOTATION[1]

    def _on_node(self, node: dict[str, Any], deleted: bool = False) -> None:
        name = node["metadata"]["name"]
        if deleted or not self._managed(node):
            self.nodes.discard(name)
            return
        self.nodes.add(name)
        internal = [a.get("address") for a in (node.get("status") or {}).get("addresses") or []
                    if a.get("type") == "InternalIP"]
        self.network.set_node(name, node.get("spec", {}).get("podCIDR"), internal[0] if internal else None)

    def _on_configmap(self, cm: dict[str, Any], deleted: bool = False) -> None:
        md = cm["metadata"]
        key, version = (md["namespace"], md["name"]), md.get("resourceVersion")
        seen = self.configmaps.get(key)
        self.configmaps[key] = version
        if deleted or seen is None or seen == version:
            return  # first seen (pods set up their volumes from the API themselves) or unchanged
        for worker in list(self.workers.values()):
            if worker.pod["metadata"]["namespace"] == md["namespace"]:
                worker.configmap_changed(md["name"])

    def _on_pod(self, pod: dict[str, Any], deleted: bool = False) -> None:
        uid = pod["metadata"]["uid"]
        with self._workers_lock:
            worker = self.workers.get(uid)
            if deleted:
                if worker:
                    worker.remove()
                    self.workers.pop(uid, None)
                return
            node = pod.get("spec", {}).get("nodeName")
            if not node or node not in self.nodes:
                return
            if worker is None:
                worker = PodWorker(self, pod)
                self.workers[uid] = worker
                worker.start()
            else:
                worker.update(pod)

    def _wake_pod(self, uid: str) -> None:
        """The device side ended one of the pod's containers between syncs: its worker looks now."""
        worker = self.workers.get(uid)
        if worker is not None:
            worker.wake.set()

    def _reap(self) -> None:
        """Forget the workers whose thread has ended."""
        with self._workers_lock:
            for uid, w in list(self.workers.items()):
                if not w.is_alive():
                    self.workers.pop(uid, None)

    def _watch(self, kind: str, handler: Callable[..., None]) -> Informer:
        """Tell ``handler(obj, deleted=...)`` of every ``kind`` object the shared informer sees, and start it."""
        informer = self.informers.informer(kind)
        informer.add_handler(on_add=handler, on_update=lambda old, new: handler(new),
                             on_delete=lambda obj: handler(obj, deleted=True))
        informer.start()
        return informer

    # -- main -----------------------------------------------------------------

    def prepare(self) -> None:
        """What the agent sets up on this host before it talks to the apiserver (its start need not wait for
        one): the sandbox checked, `kubectl exec`'s way in."""
        sandbox.check()
        # `kubectl exec`: KWOK finds every program here first, and the node agent runs it in the container.
        streaming.write_farm(self.cluster_dir)
        threading.Thread(target=streaming.keep_farm, args=(self.cluster_dir, self.stop), daemon=True,
                         name="exec-farm").start()
        streaming.ExecServer(self).start()

    def api_ready(self) -> bool:
        """Whether the apiserver is ready for this agent: ready itself (/readyz), and serving KWOK's kinds the
        agent writes for every pod (KINDS; `gpulab up` installs their CRDs as soon as the apiserver serves)."""
        return self.client.ready() and all(self.client.serves(kind) for kind in KINDS)

    def run(self, ready_file: Path | None = None) -> None:
        """Watch the nodes and their pods and run them until :attr:`stop` is set (after :meth:`prepare`)."""
        # The nodes first: a pod is run only on a node this agent manages.
        self._watch("Node", self._on_node).wait_synced(30)
        # A pod the list no longer has (deleted while the watch was down) reaches _on_pod as deleted.
        self._watch("Pod", self._on_pod)
        # ConfigMaps a running pod mounts: a change reaches its volumes, as a kubelet's sync does.
        self._watch("ConfigMap", self._on_configmap)
        prov = threading.Thread(target=self.provisioner.run, args=(self.stop,), daemon=True, name="provisioner")
        prov.start()
        try:
            live = {p["metadata"]["uid"] for p in self.client.list("Pod")}
            self.logs.sweep(live)
            # Workers started since the list are live too.
            self.devices.retain(live | set(self.workers))
        except api.ApiError:
            pass
        if ready_file:
            ready_file.write_text(str(os.getpid()))
        log.info("node agent running for %d nodes", len(self.nodes))
        while not self.stop.wait(REAP_EVERY):
            self._reap()
        self.provisioner.wake.set()
        if self._own_informers:
            self.informers.stop()
        self.image_manager.stop.set()
        for w in list(self.workers.values()):
            w.shutdown()
        for w in list(self.workers.values()):
            w.join(timeout=5)
