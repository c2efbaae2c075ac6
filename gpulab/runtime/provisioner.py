"""Dynamic provisioning of node-local volumes for the default StorageClass.

The storage driver of the simulated nodes, in the manner of local-path
provisioners: the StorageClass binds on first consumer, so the real
kube-scheduler picks the node first (annotating the claim with
``volume.kubernetes.io/selected-node``); this loop then creates a PV with
a ``local`` source on that node and node affinity to it, and the real PV
controller binds claim and volume. Released volumes of class reclaim policy
``Delete`` are removed with their data.

It follows StorageClasses, claims and volumes through the process's shared
informers and looks when one of them changes (and every :data:`RESYNC_S`),
as a provisioner's controller does: an idle cluster costs it no request.
"""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path
from typing import Any

from ..kube import api
from ..kube import events
from ..kube.informer import SharedInformers
from .volumes import node_host_path
from ..kube.names import PROVISIONER

log = logging.getLogger("gpulab.runtime")

SELECTED_NODE = "volume.kubernetes.io/selected-node"
VOLUME_ROOT = "/var/lib/gpulab/volumes"
#: How often it looks with nothing changed (a pass that failed is retried by then).
RESYNC_S = 30.0
#: How soon a failed pass is tried again.
RETRY_S = 1.0
KINDS = ("StorageClass", "PersistentVolumeClaim", "PersistentVolume")


class Provisioner:
    def __init__(self, client: api.Client, nodes_dir: Path, informers: SharedInformers):
        self.client = client
        self.nodes_dir = nodes_dir
        self.informers = {kind: informers.informer(kind) for kind in KINDS}
        self.wake = threading.Event()

    def run(self, stop: threading.Event) -> None:
        for informer in self.informers.values():
            informer.on_change(self.wake.set)
            informer.start()
        for informer in self.informers.values():
            informer.wait_synced(30)
        while not stop.is_set():
            self.wake.clear()
            wait = RESYNC_S
            try:
                self.sync()
            except Exception as e:
                log.warning("provisioner pass failed: %s", e)
                wait = RETRY_S
            self.wake.wait(wait)
            if stop.is_set():
                return

    def _classes(self) -> dict[str, dict[str, Any]]:
        return {sc["metadata"]["name"]: sc for sc in self.informers["StorageClass"].list()
                if sc.get("provisioner") == PROVISIONER}

    def sync(self) -> None:
        classes = self._classes()
        if not classes:
            return
        for claim in self.informers["PersistentVolumeClaim"].list():
            spec = claim.get("spec") or {}
            ann = claim["metadata"].get("annotations") or {}
            if spec.get("volumeName") or spec.get("storageClassName") not in classes:
                continue
            node = ann.get(SELECTED_NODE)
            if node:
                self._provision(claim, classes[spec["storageClassName"]], node)
        for pv in self.informers["PersistentVolume"].list():
            ann = pv["metadata"].get("annotations") or {}
            if (ann.get("pv.kubernetes.io/provisioned-by") == PROVISIONER
                    and pv.get("status", {}).get("phase") == "Released"
                    and pv["spec"].get("persistentVolumeReclaimPolicy") == "Delete"):
                self._delete(pv)

    def _provision(self, claim: dict[str, Any], sc: dict[str, Any], node: str) -> None:
        md = claim["metadata"]
        name = f"pvc-{md['uid']}"
        if self.client.get("PersistentVolume", name) is not None:
            return
        path = f"{VOLUME_ROOT}/{name}_{md['namespace']}_{md['name']}"
        host = node_host_path(self.nodes_dir, node, path)
        host.mkdir(parents=True, exist_ok=True)
        host.chmod(0o777)
        size = ((claim["spec"].get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
        pv = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}},
            "spec": {
                "capacity": {"storage": size},
                "accessModes": claim["spec"].get("accessModes") or ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": sc.get("reclaimPolicy", "Delete"),
                "storageClassName": sc["metadata"]["name"],
                "volumeMode": claim["spec"].get("volumeMode", "Filesystem"),
                "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": md["namespace"],
                             "name": md["name"], "uid": md["uid"], "resourceVersion": md["resourceVersion"]},
                "local": {"path": path},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}},
            },
        }
        try:
            self.client.create(pv)
        except api.Conflict:
            return
        events.record(self.client, claim, "ProvisioningSucceeded",
                          f"Successfully provisioned volume {name} on node {node}",
                          component=PROVISIONER)

    def _delete(self, pv: dict[str, Any]) -> None:
        path = (pv["spec"].get("local") or {}).get("path")
        terms = pv["spec"].get("nodeAffinity", {}).get("required", {}).get("nodeSelectorTerms") or []
        node = None
        for t in terms:
            for e in t.get("matchExpressions") or []:
                if e.get("key") == "kubernetes.io/hostname" and e.get("values"):
                    node = e["values"][0]
        if path and node and path.startswith(VOLUME_ROOT + "/"):
            shutil.rmtree(node_host_path(self.nodes_dir, node, path), ignore_errors=True)
        self.client.delete("PersistentVolume", pv["metadata"]["name"])
