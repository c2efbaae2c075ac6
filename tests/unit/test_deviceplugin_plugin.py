"""The device plugin on its own: inventory, preferences, and its gRPC service."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from pathlib import Path

import grpc
import pytest
from deviceplugin_support import (  # noqa: F401  (fixtures)
    allocate_request,
    eventually,
    gpu_uuid,
    gpus,
    inventory,
    make_plugin,
    mig_uuid,
    migs,
    nvidia_smi,
    plugin_config,
    plugin_stub,
    replicas,
    sock_dir,
)

from gpulab.fakegpu.deviceplugin import api_pb2
from gpulab.fakegpu.deviceplugin.eventloop import WAITING_THREADS
from gpulab.fakegpu.deviceplugin.plugin import (
    Inventory,
    InventoryError,
    InventoryResource,
    preferred_allocation,
    socket_name,
)

# -- inventory -------------------------------------------------------------


def test_inventory_defaults() -> None:
    inv = Inventory.from_dict(inventory(replicas(n_gpus=1, n=2)))
    device = inv.resources[0].devices[1]
    assert (device.id, device.uuid, device.parent, device.health) == (
        f"{gpu_uuid(0)}::1", gpu_uuid(0), gpu_uuid(0), "Healthy",
    )
    assert device.numa is None and device.to_api().topology.nodes == []


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"resources": [{"name": "gpu", "devices": []}]}, "resource name"),
        ({"resources": [{"name": "nvidia.com/gpu", "devices": [{"id": "x", "health": "Sick"}]}]}, "health"),
        ({"resources": [{"name": "nvidia.com/gpu", "devices": [{"id": "x"}, {"id": "x"}]}]}, "duplicate"),
        ({"resources": [{"name": "nvidia.com/gpu", "devices": [{"id": "x" * 64}]}]}, "63"),
        ({"resources": [gpus(1), gpus(1)]}, "unique"),
    ],
)
def test_inventory_errors(raw: dict, message: str) -> None:
    with pytest.raises(InventoryError, match=message):
        Inventory.from_dict(raw)


def test_socket_names_follow_nvidia() -> None:
    assert socket_name("nvidia.com/gpu") == "nvidia-gpu.sock"
    assert socket_name("nvidia.com/mig-1g.10gb") == "nvidia-mig-1g.10gb.sock"
    assert socket_name("nvidia.com/gpu.shared") == "nvidia-gpu.shared.sock"


# -- GetPreferredAllocation logic ------------------------------------------


def _resource(raw: dict) -> InventoryResource:
    return Inventory.from_dict(inventory(raw)).resources[0]


def test_preferred_whole_gpus_stay_on_one_numa_node() -> None:
    resource = _resource(gpus(4, numa=[0, 1, 0, 1]))
    ids = [d.id for d in resource.devices]
    assert preferred_allocation(resource, ids, [], 2) == [ids[0], ids[2]]
    # must_include pins the NUMA node of the rest of the choice
    assert preferred_allocation(resource, ids, [ids[1]], 2) == [ids[1], ids[3]]


def test_preferred_packs_replicas_onto_one_gpu() -> None:
    resource = _resource(replicas(n_gpus=2, n=4))
    ids = [d.id for d in resource.devices]
    # GPU 0 has only one replica left, GPU 1 has four: two must come from GPU 1
    available = ids[3:]
    chosen = preferred_allocation(resource, available, [], 2)
    assert {resource.device(i).uuid for i in chosen} == {gpu_uuid(1)}
    # one replica: best fit is the fuller GPU 0
    assert resource.device(preferred_allocation(resource, available, [], 1)[0]).uuid == gpu_uuid(0)


def test_preferred_distributed_spreads_replicas() -> None:
    resource = _resource(replicas(n_gpus=2, n=4, allocationPolicy="distributed"))
    ids = [d.id for d in resource.devices]
    chosen = preferred_allocation(resource, ids, [], 2)
    assert {resource.device(i).uuid for i in chosen} == {gpu_uuid(0), gpu_uuid(1)}


def test_preferred_mig_devices_stay_on_parent_gpu() -> None:
    raw = migs(n=2, gpu=0)
    raw["devices"] += migs(n=3, gpu=1)["devices"]
    resource = _resource(raw)
    ids = [d.id for d in resource.devices]
    chosen = preferred_allocation(resource, ids, [], 3)
    assert {resource.device(i).parent for i in chosen} == {gpu_uuid(1)}


def test_preferred_errors() -> None:
    resource = _resource(gpus(2))
    ids = [d.id for d in resource.devices]
    with pytest.raises(ValueError, match="only 2 are available"):
        preferred_allocation(resource, ids, [], 3)
    with pytest.raises(ValueError, match="unknown"):
        preferred_allocation(resource, ["GPU-nope"], [], 1)
    with pytest.raises(ValueError, match="not available"):
        preferred_allocation(resource, ids[:1], ids[1:], 1)


# -- the gRPC service --------------------------------------------------------


def test_options_and_preferred_allocation_over_grpc(make_plugin, plugin_stub) -> None:
    make_plugin(inventory(gpus(4, numa=[0, 1, 0, 1])))
    stub = plugin_stub()
    options = stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=5)
    assert options.get_preferred_allocation_available and not options.pre_start_required
    request = api_pb2.PreferredAllocationRequest()
    request.container_requests.add(available_deviceIDs=[gpu_uuid(i) for i in range(4)], allocation_size=2)
    response = stub.GetPreferredAllocation(request, timeout=5)
    assert list(response.container_responses[0].deviceIDs) == [gpu_uuid(0), gpu_uuid(2)]


def test_list_and_watch_streams_health_changes(make_plugin, plugin_stub) -> None:
    plugin = make_plugin(inventory(gpus(2, numa=[0, 1])))
    stream = plugin_stub().ListAndWatch(api_pb2.Empty(), timeout=5)
    try:
        first = next(stream)
        assert [(d.ID, d.health, d.topology.nodes[0].ID) for d in first.devices] == [
            (gpu_uuid(0), "Healthy", 0), (gpu_uuid(1), "Healthy", 1),
        ]
        plugin.set_health("nvidia.com/gpu", gpu_uuid(1), "Unhealthy")
        assert [d.health for d in next(stream).devices] == ["Healthy", "Unhealthy"]
        plugin.set_health("nvidia.com/gpu", gpu_uuid(1), "Healthy")
        assert [d.health for d in next(stream).devices] == ["Healthy", "Healthy"]
    finally:
        stream.cancel()


def test_allocate_whole_gpus(make_plugin, plugin_stub, plugin_config) -> None:
    make_plugin(inventory(gpus(2)))
    response = plugin_stub().Allocate(allocate_request(gpu_uuid(1), gpu_uuid(0)), timeout=5)
    container = response.container_responses[0]
    assert container.envs["NVIDIA_VISIBLE_DEVICES"] == f"{gpu_uuid(1)},{gpu_uuid(0)}"
    mounts = {m.container_path: (m.host_path, m.read_only) for m in container.mounts}
    assert mounts["/usr/bin/nvidia-smi"] == (str(plugin_config.nvidia_smi), True)
    state_file = Path(container.envs["GPULAB_NVIDIA_SMI_STATE"])
    # The allocation's own directory is mounted, so a long-running program sees the file replaced.
    assert state_file.name == "nvidia-smi.json" and mounts[str(state_file.parent)] == (str(state_file.parent), True)
    assert str(state_file) not in mounts
    assert state_file.parent.parent == plugin_config.state_dir
    state = json.loads(Path(state_file).read_text())
    assert state["resource"] == "nvidia.com/gpu"
    assert [d["index"] for d in state["devices"]] == [1, 0]  # inventory info, as given
    specs = [(d.container_path, d.host_path, d.permissions) for d in container.devices]
    dev = plugin_config.dev_root
    assert specs == [
        ("/dev/nvidia1", str(dev / "nvidia1"), "rw"),
        ("/dev/nvidia0", str(dev / "nvidia0"), "rw"),
        ("/dev/nvidiactl", str(dev / "nvidiactl"), "rw"),
        ("/dev/nvidia-uvm", str(dev / "nvidia-uvm"), "rw"),
    ]
    assert container.annotations["gpulab.io/device-ids"] == f"{gpu_uuid(1)},{gpu_uuid(0)}"


def test_allocate_time_slice_replicas_map_to_their_gpu(make_plugin, plugin_stub) -> None:
    make_plugin(inventory(replicas(n_gpus=2, n=4)))
    ids = (f"{gpu_uuid(0)}::1", f"{gpu_uuid(0)}::3", f"{gpu_uuid(1)}::0")
    container = plugin_stub().Allocate(allocate_request(*ids), timeout=5).container_responses[0]
    assert container.envs["NVIDIA_VISIBLE_DEVICES"] == f"{gpu_uuid(0)},{gpu_uuid(1)}"
    assert [d.container_path for d in container.devices][:2] == ["/dev/nvidia0", "/dev/nvidia1"]


def test_allocate_mig_device(make_plugin, plugin_stub, plugin_config) -> None:
    make_plugin(inventory(migs("1g.18gb", n=7, gpu=3)))
    assert (plugin_config.plugin_dir / "nvidia-mig-1g.18gb.sock").exists()
    container = plugin_stub("nvidia-mig-1g.18gb.sock").Allocate(
        allocate_request(mig_uuid(3, 2)), timeout=5
    ).container_responses[0]
    assert container.envs["NVIDIA_VISIBLE_DEVICES"] == mig_uuid(3, 2)
    assert container.devices[0].container_path == "/dev/nvidia3"
    state = json.loads(Path(container.envs["GPULAB_NVIDIA_SMI_STATE"]).read_text())
    assert state["devices"] == [{"uuid": mig_uuid(3, 2), "profile": "1g.18gb", "parent": gpu_uuid(3)}]


@pytest.mark.parametrize(
    ("ids", "detail"),
    [
        (("GPU-nope",), "invalid request: unknown device: GPU-nope"),
        ((gpu_uuid(1),), f"invalid request: unhealthy device: {gpu_uuid(1)}"),
    ],
)
def test_allocate_rejects_unknown_and_unhealthy(make_plugin, plugin_stub, ids, detail) -> None:
    plugin = make_plugin(inventory(gpus(2)))
    plugin.set_health("nvidia.com/gpu", gpu_uuid(1), "Unhealthy")
    with pytest.raises(grpc.RpcError) as caught:
        plugin_stub().Allocate(allocate_request(*ids), timeout=5)
    assert caught.value.code() == grpc.StatusCode.UNKNOWN
    assert caught.value.details() == f'invalid allocation request for "nvidia.com/gpu": {detail}'


def test_fail_requests_greater_than_one(make_plugin, plugin_stub) -> None:
    make_plugin(inventory(replicas(n_gpus=1, n=4, failRequestsGreaterThanOne=True)))
    stub = plugin_stub()
    stub.Allocate(allocate_request(f"{gpu_uuid(0)}::0"), timeout=5)
    with pytest.raises(grpc.RpcError) as caught:
        stub.Allocate(allocate_request(f"{gpu_uuid(0)}::0", f"{gpu_uuid(0)}::1"), timeout=5)
    assert caught.value.details().endswith(
        "invalid request: maximum request size for shared resources is 1; found 2"
    )


def test_device_specs_can_be_turned_off(make_plugin, plugin_stub, plugin_config) -> None:
    from dataclasses import replace

    make_plugin(inventory(gpus(1)), config=replace(plugin_config, pass_device_specs=False))
    container = plugin_stub().Allocate(allocate_request(gpu_uuid(0)), timeout=5).container_responses[0]
    assert list(container.devices) == []


def test_inventory_file_changes_start_and_stop_sockets(make_plugin, plugin_stub, plugin_config, sock_dir) -> None:
    path = sock_dir / "inventory.json"

    def write(raw: dict) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(raw))
        os.replace(tmp, path)

    write(inventory(gpus(2)))
    plugin = make_plugin(inventory_path=path)
    gpu_sock = plugin_config.plugin_dir / "nvidia-gpu.sock"
    mig_sock = plugin_config.plugin_dir / "nvidia-mig-1g.18gb.sock"
    assert plugin.resources == ["nvidia.com/gpu"] and gpu_sock.exists()
    stream = plugin_stub().ListAndWatch(api_pb2.Empty(), timeout=5)
    try:
        assert len(next(stream).devices) == 2
        write(inventory(gpus(3)))  # inventory change on a kept resource is streamed
        assert len(next(stream).devices) == 3
    finally:
        stream.cancel()

    write(inventory(migs("1g.18gb", n=7)))  # a MIG relayout renames the resource
    eventually(lambda: mig_sock.exists() and not gpu_sock.exists())
    assert plugin.resources == ["nvidia.com/mig-1g.18gb"]

    write_broken = path.with_suffix(".tmp")
    write_broken.write_text("{not json")
    os.replace(write_broken, path)
    time.sleep(5 * plugin_config.poll_interval)  # a broken file is ignored, the old inventory stays
    assert plugin.resources == ["nvidia.com/mig-1g.18gb"] and mig_sock.exists()
    write(inventory(migs("1g.18gb", n=7), gpus(1)))
    eventually(lambda: gpu_sock.exists())
    assert sorted(plugin.resources) == ["nvidia.com/gpu", "nvidia.com/mig-1g.18gb"]


def test_many_plugins_watch_from_a_few_shared_threads(make_plugin, plugin_config, sock_dir) -> None:
    # A fleet's node agent runs a plugin per node: their watches are tasks on the event loop, their ticks run
    # on the loop's WAITING_THREADS threads, and each still notices its own inventory file change.
    paths = []

    def add(i: int) -> None:
        path = sock_dir / f"inventory-{i}.json"
        path.write_text(json.dumps(inventory(gpus(1))))
        config = dataclasses.replace(plugin_config, plugin_dir=sock_dir / f"dp-{i}")
        make_plugin(inventory_path=path, config=config)
        paths.append((path, config.plugin_dir))

    add(0)
    time.sleep(10 * plugin_config.poll_interval)  # the loop, its offload threads and the watch threads are up
    before = threading.active_count()
    for i in range(1, 12):
        add(i)
    for path, _ in paths:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(inventory(migs("1g.18gb", n=7))))
        os.replace(tmp, path)
    for _, plugin_dir in paths:
        eventually(lambda d=plugin_dir: (d / "nvidia-mig-1g.18gb.sock").exists() and not (d / "nvidia-gpu.sock").exists())
    watchers = [t for t in threading.enumerate() if t.name.startswith("deviceplugin-waiting")]
    assert len(watchers) <= WAITING_THREADS
    assert threading.active_count() - before < 11                    # not a thread per plugin
