"""The plugin and the simulated kubelet's DeviceManager, talking over real sockets."""

from __future__ import annotations

import json

import grpc
import pytest
from deviceplugin_support import (  # noqa: F401  (fixtures)
    CountsRecorder,
    eventually,
    gpu_uuid,
    gpus,
    inventory,
    make_manager,
    make_plugin,
    mig_uuid,
    migs,
    nvidia_smi,
    plugin_config,
    replicas,
    sock_dir,
)

from gpulab.fakegpu.deviceplugin import api_pb2, api_pb2_grpc
from gpulab.fakegpu.deviceplugin.kubelet import CHECKPOINT_NAME, AllocationError

GPU = "nvidia.com/gpu"


def _register(plugin_config, **fields) -> None:
    request = api_pb2.RegisterRequest(
        **{"version": "v1beta1", "endpoint": "other.sock", "resource_name": GPU, **fields}
    )
    with grpc.insecure_channel(f"unix:{plugin_config.kubelet_socket}") as channel:
        api_pb2_grpc.RegistrationStub(channel).Register(request, timeout=5)


def test_plugin_registers_and_counts_reach_on_change(make_manager, make_plugin) -> None:
    recorder = CountsRecorder()
    manager = make_manager(on_change=recorder)
    plugin = make_plugin(inventory(gpus(2), migs("1g.18gb", n=7, gpu=1)))
    eventually(lambda: recorder.last == {GPU: (2, 2), "nvidia.com/mig-1g.18gb": (7, 7)})
    assert plugin.is_registered(GPU)
    assert manager.devices(GPU) == {gpu_uuid(0): "Healthy", gpu_uuid(1): "Healthy"}


def test_plugin_started_first_registers_when_kubelet_appears(make_manager, make_plugin) -> None:
    plugin = make_plugin(inventory(gpus(2)))
    assert not plugin.is_registered(GPU)
    manager = make_manager()
    eventually(lambda: manager.resource_counts() == {GPU: (2, 2)})


def test_unhealthy_device_lowers_allocatable_not_capacity(make_manager, make_plugin) -> None:
    manager = make_manager()
    plugin = make_plugin(inventory(gpus(2)))
    eventually(lambda: manager.resource_counts() == {GPU: (2, 2)})
    plugin.set_health(GPU, gpu_uuid(0), "Unhealthy")
    eventually(lambda: manager.resource_counts() == {GPU: (2, 1)})
    with pytest.raises(AllocationError, match=r"Requested: 2, Available: 1"):
        manager.allocate("pod-a", "main", GPU, 2)
    assert manager.allocate("pod-a", "main", GPU, 1).device_ids == (gpu_uuid(1),)
    plugin.set_health(GPU, gpu_uuid(0), "Healthy")
    eventually(lambda: manager.resource_counts() == {GPU: (2, 2)})


def test_stopped_plugin_drops_allocatable_then_capacity_after_grace(make_manager, make_plugin) -> None:
    recorder = CountsRecorder()
    manager = make_manager(on_change=recorder, stop_grace_period=0.3)
    plugin = make_plugin(inventory(gpus(2)))
    eventually(lambda: manager.resource_counts() == {GPU: (2, 2)})
    plugin.stop()
    eventually(lambda: {GPU: (2, 0)} in recorder.calls)
    with pytest.raises(AllocationError, match="no healthy devices present; cannot allocate unhealthy devices"):
        manager.allocate("pod-a", "main", GPU, 1)
    eventually(lambda: recorder.last == {GPU: (0, 0)})
    with pytest.raises(AllocationError, match="cannot allocate unregistered device nvidia.com/gpu"):
        manager.allocate("pod-a", "main", GPU, 1)


def test_kubelet_restart_makes_plugin_reregister_and_keeps_assignments(
    make_manager, make_plugin, plugin_config
) -> None:
    first = make_manager()
    make_plugin(inventory(gpus(2)))
    eventually(lambda: first.resource_counts() == {GPU: (2, 2)})
    held = first.allocate("pod-a", "main", GPU, 1)
    first.stop()

    recorder = CountsRecorder()
    second = make_manager(on_change=recorder)
    # Known from the checkpoint, nothing registered yet: a restarted kubelet counts the
    # devices as unhealthy (capacity 2, allocatable 0), and pods wait for the plugin,
    # which notices its socket was deleted and registers again.
    assert recorder.calls[0] == {GPU: (2, 0)}
    eventually(lambda: second.resource_counts() == {GPU: (2, 2)})
    assert not second.awaiting_plugin(GPU)
    assert second.pod_devices() == {"pod-a": {"main": {GPU: list(held.device_ids)}}}
    assert second.allocate("pod-a", "main", GPU, 1) == held  # idempotent, from the checkpoint
    other = second.allocate("pod-b", "main", GPU, 1)
    assert set(other.device_ids).isdisjoint(held.device_ids)


def test_restored_resource_waits_for_its_plugin_then_expires(make_manager, make_plugin) -> None:
    first = make_manager()
    plugin = make_plugin(inventory(gpus(2)))
    eventually(lambda: first.resource_counts() == {GPU: (2, 2)})
    first.allocate("pod-a", "main", GPU, 1)
    plugin.stop()
    first.stop()

    recorder = CountsRecorder()
    second = make_manager(on_change=recorder, stop_grace_period=0.3)
    assert second.awaiting_plugin(GPU)
    assert "pod-a" in second.pod_devices()
    # The plugin never comes back: after the grace period the resource is gone, as a kubelet drops it.
    eventually(lambda: recorder.last == {GPU: (0, 0)})
    assert not second.awaiting_plugin(GPU)


def test_retain_forgets_pods_deleted_while_the_kubelet_was_down(make_manager, make_plugin) -> None:
    first = make_manager()
    make_plugin(inventory(gpus(2)))
    eventually(lambda: first.resource_counts() == {GPU: (2, 2)})
    kept = first.allocate("pod-a", "main", GPU, 1)
    first.allocate("pod-b", "main", GPU, 1)
    first.stop()

    second = make_manager()
    second.retain({"pod-a"})
    assert second.pod_devices() == {"pod-a": {"main": {GPU: list(kept.device_ids)}}}
    eventually(lambda: second.resource_counts() == {GPU: (2, 2)})
    assert second.allocate("pod-c", "main", GPU, 1).device_ids != kept.device_ids


def test_allocate_uses_free_devices_and_release_frees_them(make_manager, make_plugin, plugin_config) -> None:
    manager = make_manager()
    make_plugin(inventory(gpus(3, numa=[0, 1, 1])))
    eventually(lambda: manager.resource_counts() == {GPU: (3, 3)})
    a = manager.allocate("pod-a", "train", GPU, 2)
    assert a.device_ids == (gpu_uuid(1), gpu_uuid(2))  # the plugin's NUMA-aligned preference
    assert a.envs["NVIDIA_VISIBLE_DEVICES"] == f"{gpu_uuid(1)},{gpu_uuid(2)}"
    assert any(m.container_path == "/usr/bin/nvidia-smi" for m in a.mounts)
    assert [d.container_path for d in a.devices][:2] == ["/dev/nvidia1", "/dev/nvidia2"]
    b = manager.allocate("pod-b", "main", GPU, 1)
    assert b.device_ids == (gpu_uuid(0),)
    with pytest.raises(AllocationError) as caught:
        manager.allocate("pod-c", "main", GPU, 1)
    assert caught.value.message == (
        "Allocate failed due to requested number of devices unavailable for nvidia.com/gpu. "
        "Requested: 1, Available: 0, which is unexpected"
    )
    assert caught.value.reason == "UnexpectedAdmissionError"
    manager.release("pod-a")
    assert manager.allocate("pod-c", "main", GPU, 2).device_ids == (gpu_uuid(1), gpu_uuid(2))
    assert set(manager.pod_devices()) == {"pod-b", "pod-c"}

    checkpoint = json.loads((plugin_config.plugin_dir / CHECKPOINT_NAME).read_text())
    entries = {e["PodUID"]: e for e in checkpoint["Data"]["PodDeviceEntries"]}
    assert entries["pod-c"]["DeviceIDs"] == {"1": [gpu_uuid(1), gpu_uuid(2)]}
    assert entries["pod-c"]["ResourceName"] == GPU and entries["pod-c"]["AllocResp"]
    assert checkpoint["Data"]["RegisteredDevices"] == {GPU: [gpu_uuid(i) for i in range(3)]}


def test_allocate_time_slice_replicas(make_manager, make_plugin) -> None:
    manager = make_manager()
    make_plugin(inventory(replicas(n_gpus=2, n=4)))
    eventually(lambda: manager.resource_counts() == {GPU: (8, 8)})
    a = manager.allocate("pod-a", "main", GPU, 2)
    assert all(i.startswith(gpu_uuid(0) + "::") for i in a.device_ids)  # packed onto one GPU
    assert a.envs["NVIDIA_VISIBLE_DEVICES"] == gpu_uuid(0)


def test_allocate_mig_and_fail_requests_greater_than_one(make_manager, make_plugin) -> None:
    manager = make_manager()
    make_plugin(inventory(migs("1g.18gb", n=7, gpu=0), replicas(n_gpus=1, n=4, failRequestsGreaterThanOne=True)))
    eventually(lambda: manager.resource_counts() == {"nvidia.com/mig-1g.18gb": (7, 7), GPU: (4, 4)})
    mig = manager.allocate("pod-a", "main", "nvidia.com/mig-1g.18gb", 1)
    assert mig.envs["NVIDIA_VISIBLE_DEVICES"] == mig_uuid(0, 0)
    with pytest.raises(AllocationError) as caught:
        manager.allocate("pod-b", "main", GPU, 2)
    assert caught.value.message == (
        "Allocate failed due to rpc error: code = Unknown desc = invalid allocation request for "
        '"nvidia.com/gpu": invalid request: maximum request size for shared resources is 1; found 2, '
        "which is unexpected"
    )
    assert "pod-b" not in manager.pod_devices()  # a failed Allocate leaves nothing behind
    manager.allocate("pod-b", "main", GPU, 1)


def test_unsupported_version_rejected(make_manager, plugin_config) -> None:
    make_manager()
    with pytest.raises(grpc.RpcError) as caught:
        _register(plugin_config, version="v1alpha1")
    assert caught.value.code() == grpc.StatusCode.UNKNOWN
    assert caught.value.details() == (
        'requested API version "v1alpha1" is not supported by kubelet. Supported version is ["v1beta1"]'
    )


def test_invalid_resource_name_rejected(make_manager, plugin_config) -> None:
    make_manager()
    with pytest.raises(grpc.RpcError) as caught:
        _register(plugin_config, resource_name="gpu")
    assert caught.value.details() == 'the ResourceName "gpu" is invalid'


def test_resource_held_by_active_plugin_rejected(make_manager, make_plugin, plugin_config) -> None:
    manager = make_manager()
    plugin = make_plugin(inventory(gpus(2)))
    eventually(lambda: manager.resource_counts() == {GPU: (2, 2)})
    with pytest.raises(grpc.RpcError) as caught:
        _register(plugin_config, endpoint="impostor.sock")
    assert caught.value.details() == (
        'resource "nvidia.com/gpu" is already registered by an active device plugin at endpoint "nvidia-gpu.sock"'
    )
    # The same plugin re-registering (e.g. after SIGHUP) replaces its old connection.
    plugin.restart()
    assert plugin.is_registered(GPU)
    eventually(lambda: manager.resource_counts() == {GPU: (2, 2)})


def test_unreachable_endpoint_rejected(make_manager, make_plugin, plugin_config, monkeypatch) -> None:
    from gpulab.fakegpu.deviceplugin import kubelet

    monkeypatch.setattr(kubelet, "_DIAL_TIMEOUT_S", 0.2)
    make_manager()
    with pytest.raises(grpc.RpcError) as caught:
        _register(plugin_config, endpoint="nobody.sock")
    assert caught.value.details().startswith("failed to dial device plugin:")


def test_corrupt_checkpoint_is_ignored(make_manager, plugin_config, caplog) -> None:
    plugin_config.plugin_dir.mkdir(parents=True)
    (plugin_config.plugin_dir / CHECKPOINT_NAME).write_text('{"Data": {"PodDeviceEntries": []}, "Checksum": 1}')
    manager = make_manager()
    assert manager.pod_devices() == {} and manager.resource_counts() == {}
    assert "checkpoint is corrupted" in caplog.text


def test_a_settled_plugin_looks_less_often(make_manager, make_plugin, plugin_config) -> None:
    import dataclasses
    import time

    settled = dataclasses.replace(plugin_config, settled_interval=30.0)
    first = make_manager()
    make_plugin(inventory(gpus(2)), config=settled)
    eventually(lambda: first.resource_counts() == {GPU: (2, 2)})
    time.sleep(3 * plugin_config.poll_interval)  # registered: it is on its settled interval now
    first.stop()
    second = make_manager()
    # A kubelet that restarts under it is not seen before the settled interval: it looks every 30 s.
    time.sleep(10 * plugin_config.poll_interval)
    assert second.resource_counts() == {GPU: (2, 0)}
