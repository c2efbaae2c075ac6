"""Image pulls on simulated nodes, as the kubelet's image manager reports them in a pod's Events.

A node that lacks an image pulls it (Pulling, the container in ContainerCreating, then Pulled with the pull
time and the image's size); a second pod of the same image on the same node finds it there. Each test uses an
image of its own (a reference no other test names, gpulab.runtime.imagemanager's default size), so the
session cluster's nodes have never pulled it.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest

from gpulab.cluster.embedded import EmbeddedCluster
from gpulab.runtime import imagemanager
from helpers import create, wait_for

pytestmark = pytest.mark.cluster

NODE = "cpu-node-1"
PULLED = re.compile(r'^Successfully pulled image "(?P<image>[^"]+)" in (?P<pull>\S+) \((?P<total>\S+) including '
                    r"waiting\)\. Image size: (?P<size>\d+) bytes\.$")


@pytest.fixture(autouse=True)
def embedded_only(cluster):
    if not isinstance(cluster, EmbeddedCluster):
        pytest.skip("a kind node's real kubelet pulls from real registries")


def fresh_image() -> str:
    return f"registry.gpulab.test/pull-{uuid.uuid4().hex[:8]}:1"


def pod(name: str, image: str, **container: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": NODE}, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": image, "command": ["sleep", "60"], **container}]}}


def running(kube, ns: str, name: str) -> Any:
    p = kube.get("Pod", name, ns) or {}
    return (p.get("status") or {}).get("phase") == "Running" and p


def image_events(kube, ns: str, name: str) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the pod's image events, oldest first."""
    items = [e for e in kube.list("Event", ns, field_selector=f"involvedObject.name={name}")
             if e.get("reason") in ("Pulling", "Pulled", "ErrImageNeverPull")]
    items.sort(key=lambda e: (e.get("firstTimestamp") or "", int(e["metadata"]["resourceVersion"])))
    return [(e["type"], e["reason"], e["message"]) for e in items]


def test_a_first_pull_says_pulling_then_pulled_with_the_size_and_a_second_pod_finds_the_image(kube, ns):
    image = fresh_image()
    since = kube.list_raw("Pod", ns)["metadata"]["resourceVersion"]
    create(kube, ns, pod("first", image))
    # Every status the node agent wrote, until the container runs: it waited in ContainerCreating for the pull.
    waiting = []
    for ev in kube.watch("Pod", since, ns, timeout_seconds=60, field_selector="metadata.name=first"):
        status = (ev.get("object") or {}).get("status") or {}
        waiting += [cs["state"]["waiting"]["reason"] for cs in status.get("containerStatuses") or []
                    if "waiting" in (cs.get("state") or {})]
        if status.get("phase") == "Running":
            break
    assert waiting and waiting[-1] == "ContainerCreating", waiting
    started = wait_for(lambda: running(kube, ns, "first"), 60, what="first Running")
    events = image_events(kube, ns, "first")
    assert [(t, r) for t, r, _ in events] == [("Normal", "Pulling"), ("Normal", "Pulled")], events
    pulled = PULLED.match(events[1][2])
    assert pulled, events[1][2]
    assert pulled["image"] == image and int(pulled["size"]) == imagemanager.DEFAULT_IMAGE_SIZE
    assert pulled["pull"].endswith(("ms", "s")) and pulled["total"].endswith(("ms", "s"))
    assert started["spec"]["nodeName"] == NODE

    # The same image, the same node: no pull at all.
    create(kube, ns, pod("second", image))
    wait_for(lambda: running(kube, ns, "second"), 60, what="second Running")
    assert image_events(kube, ns, "second") == [
        ("Normal", "Pulled", f'Container image "{image}" already present on machine and can be accessed by the pod')]


def test_an_image_the_node_ships_is_already_present(kube, ns):
    create(kube, ns, pod("shipped", "python:3.11"))
    wait_for(lambda: running(kube, ns, "shipped"), 60, what="shipped Running")
    assert image_events(kube, ns, "shipped") == [
        ("Normal", "Pulled", 'Container image "python:3.11" already present on machine and can be accessed by the pod')]


def test_pull_policy_never_without_the_image_is_err_image_never_pull(kube, ns):
    image = fresh_image()
    create(kube, ns, pod("never", image, imagePullPolicy="Never"))
    message = f'Container image "{image}" is not present with pull policy of Never'

    def waiting() -> Any:
        p = kube.get("Pod", "never", ns) or {}
        states = [cs.get("state") or {} for cs in (p.get("status") or {}).get("containerStatuses") or []]
        return states == [{"waiting": {"reason": "ErrImageNeverPull", "message": message}}] and p

    p = wait_for(waiting, 60, what="never waiting in ErrImageNeverPull")
    assert p["status"]["phase"] == "Pending"
    assert ("Warning", "ErrImageNeverPull", message) in image_events(kube, ns, "never")
