"""The local-path provisioner (gpulab.runtime.provisioner) over informer stand-ins: what it creates and deletes,
and that a change of what it follows wakes it."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

from gpulab import _poll
from gpulab.kube import api
from gpulab.kube.names import PROVISIONER
from gpulab.runtime import provisioner as prov
from gpulab.runtime.volumes import node_host_path


class Cache:
    """An informer stand-in: a list of objects and the callbacks told of changes."""

    def __init__(self, objects: list[dict[str, Any]]):
        self.objects = objects
        self.handlers: list[Callable[[Any], None]] = []

    def list(self) -> list[dict[str, Any]]:
        return list(self.objects)

    def on_change(self, fn: Callable[[], None]) -> None:
        self.handlers.append(lambda obj: fn())

    def start(self) -> None:
        pass

    def wait_synced(self, timeout: float | None = None) -> bool:
        return True

    def change(self, obj: dict[str, Any]) -> None:
        self.objects.append(obj)
        for h in self.handlers:
            h(obj)


class Client:
    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        self.deleted: list[str] = []
        self.events: list[dict[str, Any]] = []

    def get(self, kind: str, name: str, namespace: str | None = None):
        return next((o for o in self.created if o["metadata"]["name"] == name), None)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        (self.events if obj["kind"] == "Event" else self.created).append(obj)
        return obj

    def patch(self, *args, **kwargs):
        raise api.NotFound("no event to count on")

    def delete(self, kind: str, name: str, *args, **kwargs) -> None:
        self.deleted.append(f"{kind}/{name}")


def claim(name: str, node: str | None, cls: str = "standard") -> dict[str, Any]:
    ann = {prov.SELECTED_NODE: node} if node else {}
    return {"kind": "PersistentVolumeClaim", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}", "resourceVersion": "3",
                         "annotations": ann},
            "spec": {"storageClassName": cls, "accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "2Gi"}}}}


def setup(tmp_path: Path, claims: list[dict[str, Any]], pvs: list[dict[str, Any]] | None = None):
    caches = {"StorageClass": Cache([{"metadata": {"name": "standard"}, "provisioner": PROVISIONER,
                                      "reclaimPolicy": "Delete"},
                                     {"metadata": {"name": "other"}, "provisioner": "example.com/nfs"}]),
              "PersistentVolumeClaim": Cache(claims), "PersistentVolume": Cache(pvs or [])}
    informers = SimpleNamespace(informer=lambda kind: caches[kind])
    client = Client()
    return prov.Provisioner(client, tmp_path, informers), client, caches  # type: ignore[arg-type]


def test_a_claim_on_its_chosen_node_gets_a_local_volume_there(tmp_path):
    p, client, _ = setup(tmp_path, [claim("data", "gpu-node-1"), claim("waiting", None),
                                    claim("elsewhere", "gpu-node-1", cls="other")])
    p.sync()
    [pv] = client.created
    assert pv["metadata"]["name"] == "pvc-uid-data"
    assert pv["spec"]["claimRef"]["name"] == "data" and pv["spec"]["capacity"] == {"storage": "2Gi"}
    assert pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == [
        "gpu-node-1"]
    assert node_host_path(tmp_path, "gpu-node-1", pv["spec"]["local"]["path"]).is_dir()
    assert [e["reason"] for e in client.events] == ["ProvisioningSucceeded"]
    p.sync()  # once only
    assert len(client.created) == 1


def test_a_released_volume_of_a_delete_class_goes_with_its_data(tmp_path):
    path = f"{prov.VOLUME_ROOT}/pvc-old_team-a_data"
    data = node_host_path(tmp_path, "gpu-node-1", path)
    data.mkdir(parents=True)
    pv = {"metadata": {"name": "pvc-old", "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}},
          "spec": {"persistentVolumeReclaimPolicy": "Delete", "local": {"path": path},
                   "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                       {"key": "kubernetes.io/hostname", "operator": "In", "values": ["gpu-node-1"]}]}]}}},
          "status": {"phase": "Released"}}
    p, client, _ = setup(tmp_path, [], [pv])
    p.sync()
    assert client.deleted == ["PersistentVolume/pvc-old"] and not data.exists()


def test_a_new_claim_wakes_it(tmp_path):
    p, client, caches = setup(tmp_path, [])
    stop = threading.Event()
    worker = threading.Thread(target=p.run, args=(stop,), daemon=True)
    worker.start()
    try:
        caches["PersistentVolumeClaim"].change(claim("data", "gpu-node-1"))
        # Well before its RESYNC_S: the change woke it.
        assert _poll.until(lambda: client.created, 5, lambda _: AssertionError("no volume within 5 s"),
                           interval=0.02)
    finally:
        stop.set()
        p.wake.set()
        worker.join(5)
    assert not worker.is_alive()
