"""Faults of simulated GPU nodes: kept with the node, validated, cleared."""

from __future__ import annotations

import json

import pytest

from gpulab.fakegpu import cudaerrors, faults, smistate

GPU_NODES = {"gpu-node-1": 2, "edge-node-1": 1}


def test_a_fault_is_kept_in_the_nodes_directory(tmp_path) -> None:
    f = faults.inject(tmp_path, GPU_NODES, "gpu-node-1", faults.FABRIC_MANAGER_DOWN)
    path = tmp_path / "nodes" / "gpu-node-1" / "gpu" / "faults.json"
    assert json.loads(path.read_text())["faults"][0]["kind"] == "fabric-manager-down"
    assert faults.load(tmp_path, "gpu-node-1").faults == (f,)
    assert faults.load(tmp_path, "edge-node-1").faults == ()


def test_gpu_unhealthy_names_a_gpu_and_defaults_to_gpu_0(tmp_path) -> None:
    faults.inject(tmp_path, GPU_NODES, "gpu-node-1", faults.GPU_UNHEALTHY)
    faults.inject(tmp_path, GPU_NODES, "gpu-node-1", faults.GPU_UNHEALTHY, gpu=1)
    faults.inject(tmp_path, GPU_NODES, "gpu-node-1", faults.GPU_UNHEALTHY, gpu=1)  # once is enough
    assert faults.load(tmp_path, "gpu-node-1").unhealthy_gpus == {0, 1}
    assert len(faults.load(tmp_path, "gpu-node-1").faults) == 2


@pytest.mark.parametrize("node,kind,gpu,problem", [
    ("gpu-node-1", "gpu-on-fire", None, "unknown fault 'gpu-on-fire'; allowed: gpu-unhealthy"),
    ("cpu-node-1", faults.NO_DEVICES, None, "has no GPUs in this cluster's topology"),
    ("gpu-node-1", faults.GPU_UNHEALTHY, 2, "has GPUs 0-1; there is no GPU 2"),
    ("gpu-node-1", faults.DEVICE_PLUGIN_DOWN, 0, "--gpu applies to gpu-unhealthy only"),
])
def test_bad_requests_say_what_is_allowed(tmp_path, node, kind, gpu, problem) -> None:
    with pytest.raises(faults.FaultError, match=problem):
        faults.inject(tmp_path, GPU_NODES, node, kind, gpu)


def test_clear_all_or_one_kind(tmp_path) -> None:
    faults.inject(tmp_path, GPU_NODES, "gpu-node-1", faults.DEVICE_PLUGIN_DOWN)
    faults.inject(tmp_path, GPU_NODES, "gpu-node-1", faults.NO_DEVICES)
    faults.inject(tmp_path, GPU_NODES, "edge-node-1", faults.CUDA_DRIVER_TOO_OLD)
    cleared = faults.clear(tmp_path, ["gpu-node-1"], faults.NO_DEVICES)
    assert [(n, f.kind) for n, f in cleared] == [("gpu-node-1", "no-devices")]
    assert faults.load(tmp_path, "gpu-node-1").kinds == {"device-plugin-down"}
    cleared = faults.clear(tmp_path, sorted(GPU_NODES))
    assert {(n, f.kind) for n, f in cleared} == {("gpu-node-1", "device-plugin-down"),
                                                 ("edge-node-1", "cuda-driver-too-old")}
    assert faults.list_all(tmp_path, sorted(GPU_NODES)) == []


def test_an_unreadable_file_means_no_faults(tmp_path) -> None:
    path = faults.faults_path(tmp_path, "gpu-node-1")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert faults.load(tmp_path, "gpu-node-1") == faults.NodeFaults()


def test_driver_faults_in_precedence_and_no_devices_only_inside_containers() -> None:
    f = faults.NodeFaults((faults.Fault(faults.NO_DEVICES), faults.Fault(faults.CUDA_DRIVER_TOO_OLD)))
    assert f.driver_fault(in_container=True) == faults.CUDA_DRIVER_TOO_OLD
    only = faults.NodeFaults((faults.Fault(faults.NO_DEVICES),))
    assert only.driver_fault(in_container=True) == faults.NO_DEVICES
    assert only.driver_fault(in_container=False) is None
    assert faults.NodeFaults().driver_fault(True) is None


def test_an_old_driver_reports_an_older_cuda() -> None:
    old = faults.NodeFaults((faults.Fault(faults.CUDA_DRIVER_TOO_OLD),))
    assert old.driver_versions("580.159.04", "13.0") == ("535.183.01", "12.2")
    assert faults.NodeFaults().driver_versions("580.159.04", "13.0") == ("580.159.04", "13.0")


@pytest.mark.parametrize("kind,message", [
    (faults.CUDA_DRIVER_TOO_OLD, "CUDA driver version is insufficient for CUDA runtime version"),
    (faults.NO_DEVICES, "no CUDA-capable device is detected"),
    (faults.FABRIC_MANAGER_DOWN, "system not yet initialized"),
])
def test_each_driver_fault_gives_the_chapters_cuda_error(kind: str, message: str) -> None:
    state = smistate.build_state("h100-80gb", 2, "gpu-node-1", fault=kind)
    assert cudaerrors.cuda_error(state, "all", "12.8").message == message
    assert faults.KINDS[kind].startswith(message) or message in faults.KINDS[kind]


def test_the_node_agent_acknowledges_the_version_it_applies(tmp_path) -> None:
    assert not faults.wait_applied(tmp_path, "gpu-node-1", timeout=0)
    assert faults.acknowledge(tmp_path, "gpu-node-1") == faults.NodeFaults()
    assert faults.wait_applied(tmp_path, "gpu-node-1", timeout=0)  # no file: nothing to apply
    faults.inject(tmp_path, GPU_NODES, "gpu-node-1", faults.NO_DEVICES)
    assert not faults.wait_applied(tmp_path, "gpu-node-1", timeout=0)
    assert faults.acknowledge(tmp_path, "gpu-node-1").kinds == {"no-devices"}
    assert faults.wait_applied(tmp_path, "gpu-node-1", timeout=0)
