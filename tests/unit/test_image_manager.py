"""The kubelet's image manager on simulated nodes: pull policy, the kubelet's words, each node's images, serial pulls."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from gpulab.kube import topology
from gpulab.runtime import imagemanager as im
from gpulab.runtime.imagemanager import ImageManager

FAST = 1e12  # bytes per second: a pull that is all round trip


@pytest.mark.parametrize("image, policy", [
    ("busybox", "Always"), ("busybox:latest", "Always"), ("busybox:1.37", "IfNotPresent"),
    ("registry.k8s.io/pause@sha256:" + "a" * 64, "IfNotPresent"), ("localhost:5000/app", "Always"),
    ("registry.example.com:5000/team/app:1.0", "IfNotPresent"), ("gpulab/llm-server:0.1-7b-weights", "IfNotPresent"),
])
def test_the_default_pull_policy_is_the_apiservers(image, policy):
    assert im.default_policy(image) == policy


@pytest.mark.parametrize("image, ref", [
    ("nginx:1.27", "docker.io/library/nginx:1.27"), ("busybox", "docker.io/library/busybox:latest"),
    ("docker.io/nginx", "docker.io/library/nginx:latest"), ("library/python:3.11", "docker.io/library/python:3.11"),
    ("gpulab/llm-server:0.1", "docker.io/gpulab/llm-server:0.1"),
    ("nvcr.io/nvidia/cuda:12.6.2-base-ubuntu24.04", "nvcr.io/nvidia/cuda:12.6.2-base-ubuntu24.04"),
])
def test_references_are_normalized_as_the_runtime_keys_them(image, ref):
    assert im.normalize(image) == ref


def test_sizes_come_from_the_reference_then_the_repository_then_the_default():
    baked = im.info("gpulab/llm-server:0.1-7b-weights")
    assert baked.size == 14_525_000_000 and not baked.preloaded
    assert im.info("gpulab/llm-server:0.1") == im.info("docker.io/gpulab/llm-server:0.2") == im.ImageInfo(45_000_000)
    assert im.info("registry.example.com/web:1.0") == im.ImageInfo(im.DEFAULT_IMAGE_SIZE, preloaded=False)


def test_the_baked_weights_take_tens_of_seconds_at_the_default_bandwidth():
    from gpulab.kube.allocatable import parse

    seconds = im.info(im.BAKED_WEIGHTS_IMAGE).size / float(parse(topology.DEFAULT_IMAGE_PULL_BANDWIDTH))
    assert 20 < seconds <= 40


@pytest.mark.parametrize("seconds, text", [
    (0, "0s"), (0.0004, "0s"), (0.45, "450ms"), (0.0509, "50ms"), (12.345, "12.345s"), (12.3, "12.3s"),
    (12, "12s"), (27.7129, "27.712s"), (60, "1m0s"), (62.5, "1m2.5s"), (3600, "1h0m0s"),
])
def test_durations_are_written_as_go_writes_them_truncated_to_milliseconds(seconds, text):
    assert im.go_duration(seconds) == text


def test_the_kubelets_words():
    image = "gpulab/llm-server:0.1-7b-weights"
    assert im.pulling_message(image) == 'Pulling image "gpulab/llm-server:0.1-7b-weights"'
    assert im.pulled_message(image, 27.7129, 27.9, 14525000000) == (
        'Successfully pulled image "gpulab/llm-server:0.1-7b-weights" in 27.712s (27.9s including waiting). '
        "Image size: 14525000000 bytes.")
    assert im.present_message("nginx:1.27") == (
        'Container image "nginx:1.27" already present on machine and can be accessed by the pod')
    assert im.never_message("x:1") == 'Container image "x:1" is not present with pull policy of Never'


# -- each node's images ----------------------------------------------------------------------------------------

def test_a_new_node_has_what_its_node_image_ships_and_keeps_what_it_pulls(tmp_path):
    store = im.NodeImages(im.store_path(tmp_path, "gpu-node-1"))
    assert store.has("nginx:1.27") and store.has("busybox:1.36") and store.has("gpulab/llm-server:0.1")
    assert store.has("nvcr.io/nvidia/k8s-device-plugin:v0.17.1")
    assert not store.has(im.BAKED_WEIGHTS_IMAGE) and not store.has("x")
    store.add(im.BAKED_WEIGHTS_IMAGE, 14_525_000_000)
    # another process (a restarted node agent) reads the same file
    again = im.NodeImages(tmp_path / "gpu-node-1" / "images.json")
    assert again.has("docker.io/gpulab/llm-server:0.1-7b-weights")
    assert {"image": "docker.io/gpulab/llm-server:0.1-7b-weights", "size": 14_525_000_000, "source": "pulled"} \
        in again.list()
    assert not im.NodeImages(im.store_path(tmp_path, "gpu-node-2")).has(im.BAKED_WEIGHTS_IMAGE)


def test_removing_an_image_is_crictl_rmi(tmp_path):
    store = im.NodeImages(im.store_path(tmp_path, "n"))
    store.add("x:1", 10)
    assert store.remove("x:1") and not store.has("x:1") and not store.remove("x:1")
    assert store.remove("nginx:1.27")  # a preloaded repository goes with its tags
    assert not store.has("nginx:1.27") and not store.has("nginx:1.25") and store.has("busybox:1.37")


# -- decisions and pulls ---------------------------------------------------------------------------------------

@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(im, "REGISTRY_ROUND_TRIP", 0.01)


def wait(pull: im.Pull) -> im.Pull:
    assert pull.done.wait(10)
    return pull


def test_policies_decide_as_ensure_image_exists_does(tmp_path, quick):
    m = ImageManager(tmp_path, lambda node: FAST)
    try:
        assert m.ensure("n", "nginx:1.27", "IfNotPresent") == im.Decision("present", im.present_message("nginx:1.27"))
        assert m.ensure("n", "nginx:1.27", "Never").kind == "present"
        assert m.ensure("n", "x:1", "Never") == im.Decision("never", im.never_message("x:1"))
        assert m.ensure("n", "x:1", None).kind == "pull"  # tagged: IfNotPresent, and it is missing
        always = m.ensure("n", "nginx:1.27", "Always")  # present, but Always asks the registry
        assert always.kind == "pull" and always.message == 'Pulling image "nginx:1.27"'
        assert wait(always.pull).pulled_message().startswith('Successfully pulled image "nginx:1.27" in ')
        assert always.pull.pulled_message().endswith(" including waiting). Image size: 72000000 bytes.")
        assert m.ensure("n", "x", None).kind == "pull"  # untagged: Always
    finally:
        m.stop.set()


def test_a_missing_image_takes_its_size_over_the_bandwidth_and_stays(tmp_path, quick):
    m = ImageManager(tmp_path, lambda node: im.DEFAULT_IMAGE_SIZE / 0.3)  # an unknown image in 0.3 s
    try:
        d = m.ensure("n", "team/app:1", None)
        pull = wait(d.pull)
        assert pull.size == im.DEFAULT_IMAGE_SIZE and pull.pull_seconds >= 0.3
        assert pull.total_seconds >= pull.pull_seconds
        assert m.ensure("n", "team/app:1", None).kind == "present"
        assert ImageManager(tmp_path, lambda node: FAST).ensure("n", "team/app:1", None).kind == "present"
    finally:
        m.stop.set()


def test_pulls_on_one_node_run_one_at_a_time_and_share_the_layers(tmp_path, quick):
    m = ImageManager(tmp_path, lambda node: im.DEFAULT_IMAGE_SIZE / 0.3)
    try:
        first = m.ensure("n", "team/app:1", None).pull
        second = m.ensure("n", "team/app:1", None).pull  # asked before the first finished
        other = m.ensure("m", "team/app:1", None).pull   # another node pulls on its own
        wait(first), wait(second), wait(other)
        assert first.pull_seconds >= 0.3 and other.pull_seconds >= 0.3
        # the second waited for the first, then found the image there: a round trip, all the rest waiting
        assert second.pull_seconds < 0.3 and second.total_seconds >= first.pull_seconds
        assert "(0s including waiting)" not in second.pulled_message()
    finally:
        m.stop.set()


# -- the pod worker ---------------------------------------------------------------------------------------------

def _worker(tmp_path: Path, container: dict, manager: ImageManager, recorded: list, monkeypatch):
    from gpulab.runtime import pod as pod_module
    from gpulab.runtime.pod import PodWorker

    monkeypatch.setattr(pod_module.events, "record",
                        lambda client, obj, reason, message, type_, **kw: recorded.append((type_, reason, message)))
    agent = SimpleNamespace(client=None, devices=None, pods_dir=tmp_path, images=None, image_manager=manager)
    pod = {"metadata": {"namespace": "ns", "name": "llm", "uid": "u-1"},
           "spec": {"nodeName": "gpu-node-1", "containers": [{"name": "server", **container}]}}
    return PodWorker(agent, pod)


def test_a_container_waits_in_container_creating_while_its_image_is_pulled(tmp_path, quick, monkeypatch):
    m = ImageManager(tmp_path / "nodes", lambda node: im.info(im.BAKED_WEIGHTS_IMAGE).size / 0.2)
    recorded: list[tuple[str, str, str]] = []
    try:
        worker = _worker(tmp_path, {"image": im.BAKED_WEIGHTS_IMAGE}, m, recorded, monkeypatch)
        c = worker.main[0]
        assert not worker._image_ready(c)
        assert recorded == [("Normal", "Pulling", f'Pulling image "{im.BAKED_WEIGHTS_IMAGE}"')]
        assert (c.state, c.waiting_reason, c.status()["state"]) == (
            "waiting", "ContainerCreating", {"waiting": {"reason": "ContainerCreating"}})
        wait(c.pull)
        assert worker._image_ready(c) and c.pull is None
        type_, reason, message = recorded[-1]
        assert (type_, reason) == ("Normal", "Pulled") and message.startswith(
            f'Successfully pulled image "{im.BAKED_WEIGHTS_IMAGE}" in ')
        assert message.endswith("including waiting). Image size: 14525000000 bytes.")
        # a second pod on the same node: the image is there
        again = _worker(tmp_path, {"image": im.BAKED_WEIGHTS_IMAGE}, m, recorded, monkeypatch)
        assert again._image_ready(again.main[0])
        assert recorded[-1] == ("Normal", "Pulled", im.present_message(im.BAKED_WEIGHTS_IMAGE))
    finally:
        m.stop.set()


def test_pull_policy_never_without_the_image_is_err_image_never_pull(tmp_path, monkeypatch):
    m = ImageManager(tmp_path / "nodes", lambda node: FAST)
    recorded: list[tuple[str, str, str]] = []
    worker = _worker(tmp_path, {"image": "team/app:1", "imagePullPolicy": "Never"}, m, recorded, monkeypatch)
    c = worker.main[0]
    assert not worker._image_ready(c)
    message = 'Container image "team/app:1" is not present with pull policy of Never'
    assert recorded == [("Warning", "ErrImageNeverPull", message)]
    assert c.status()["state"] == {"waiting": {"reason": "ErrImageNeverPull", "message": message}}
    assert c.next_start > 0 and c.pull is None
