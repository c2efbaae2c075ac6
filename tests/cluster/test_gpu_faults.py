"""`gpulab fault`: broken hardware and drivers, seen where the chapter says to look."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gpu_support import (
    GPU_NODE,
    OPERATOR_NS,
    gpus_released,  # noqa: F401 (autouse fixture)
    operand_pod,
    resources,
    wait_resources,
    wait_stack,
)
from helpers import wait_for

pytestmark = pytest.mark.cluster


@pytest.fixture
def fault(gpulab_home, kube):
    """Run ``gpulab fault ...``; every fault is cleared and the stack back to ready afterwards."""
    env = dict(os.environ, GPULAB_HOME=str(gpulab_home))

    def run(*args: str) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, "-m", "gpulab.cli", "fault", *args], env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc

    yield run
    run("clear")
    # Validations only run when the validator starts; re-run them on the repaired node.
    for app in ("nvidia-operator-validator", "nvidia-cuda-validator"):
        for pod in kube.list("Pod", OPERATOR_NS, label_selector=f"app={app}"):
            kube.delete("Pod", pod["metadata"]["name"], OPERATOR_NS, grace_seconds=0)
    wait_stack(kube)
    wait_resources(kube, "nvidia.com/gpu", "2", "2")


def rerun_validations(kube) -> set[str]:
    """Replace the validator pod (as `kubectl delete pod` would); the UIDs of the pods there were before."""
    before = {p["metadata"]["uid"] for p in kube.list("Pod", OPERATOR_NS)}
    for pod in kube.list("Pod", OPERATOR_NS, label_selector="app=nvidia-operator-validator"):
        kube.delete("Pod", pod["metadata"]["name"], OPERATOR_NS, grace_seconds=0)
    return before


def cuda_validation_log(kube, kubectl, before: set[str]) -> str:
    """The cuda-validation log of the CUDA workload pod the new validator created."""
    pods = [p for p in kube.list("Pod", OPERATOR_NS, label_selector="app=nvidia-cuda-validator")
            if p["metadata"]["uid"] not in before]
    if not pods:
        return ""
    return kubectl("-n", OPERATOR_NS, "logs", pods[0]["metadata"]["name"], "-c", "cuda-validation",
                   check=False).stdout


@pytest.mark.parametrize("kind,message", [
    ("cuda-driver-too-old", "CUDA driver version is insufficient for CUDA runtime version"),
    ("no-devices", "no CUDA-capable device is detected"),
    ("fabric-manager-down", "system not yet initialized"),
])
def test_driver_faults_fail_the_cuda_validator_with_the_chapters_message(kube, kubectl, fault, kind, message):
    proc = fault("set", kind, GPU_NODE)
    assert message in proc.stdout
    before = rerun_validations(kube)
    deadline = time.monotonic() + 90
    while "Failed" not in (log := cuda_validation_log(kube, kubectl, before)):
        if time.monotonic() > deadline:
            pods = kubectl("-n", OPERATOR_NS, "get", "pods").stdout
            validator = kubectl("-n", OPERATOR_NS, "logs", "ds/nvidia-operator-validator", "-c", "cuda-validation",
                                check=False)
            pytest.fail(f"the cuda-validation init container did not fail; last log {log!r}; pods:\n{pods}\n"
                        f"validator: {validator.stdout[-2000:]} {validator.stderr}")
        time.sleep(0.3)
    assert log.splitlines() == ["[Vector addition of 50000 elements]",
                                f"Failed to allocate device vector A (error code {message})!"]
    validator = wait_for(lambda: (p := operand_pod(kube, "nvidia-operator-validator"))
                         and (p["status"].get("initContainerStatuses") or [{}])[0].get("state", {}).get("terminated")
                         and p, 30, what="the validator past driver validation")
    statuses = {s["name"]: s for s in validator["status"]["initContainerStatuses"]}
    assert statuses["driver-validation"]["state"]["terminated"]["exitCode"] == 0
    assert "terminated" not in statuses["plugin-validation"]["state"]  # it never got that far
    out = kubectl("-n", OPERATOR_NS, "get", "pods").stdout
    assert "Init:2/4" in out or "Init:Error" in out or "Init:CrashLoopBackOff" in out, out
    wait_for(lambda: policy_state(kube) == "notReady", 150, what="the ClusterPolicy notReady")


def policy_state(kube) -> str | None:
    return ((kube.get("ClusterPolicy", "cluster-policy") or {}).get("status") or {}).get("state")


def test_fabric_manager_down_shows_in_nvidia_smi_q(kube, gpulab_home, fault):
    fault("set", "fabric-manager-down", GPU_NODE)
    env = dict(os.environ, GPULAB_HOME=str(gpulab_home))

    def fabric() -> str:
        return subprocess.run([sys.executable, "-m", "gpulab.cli", "nvidia-smi", GPU_NODE, "-q"], env=env,
                              capture_output=True, text=True, timeout=60).stdout

    out = wait_for(lambda: "In Progress" in (text := fabric()) and text, 10, what="Fabric State In Progress")
    assert "Fabric" in out


def test_an_unhealthy_gpu_lowers_allocatable_not_capacity(kube, kubectl, fault):
    fault("set", "gpu-unhealthy", GPU_NODE, "--gpu", "1")
    wait_resources(kube, "nvidia.com/gpu", "2", "1")
    log = kubectl("-n", OPERATOR_NS, "logs", "ds/nvidia-device-plugin-daemonset").stdout
    assert "XidCriticalError: Xid=79" in log and "'nvidia.com/gpu' device marked unhealthy" in log
    fault("clear", GPU_NODE)
    wait_resources(kube, "nvidia.com/gpu", "2", "2")


def test_a_stopped_device_plugin_takes_allocatable_to_zero(kube, kubectl, fault):
    fault("set", "device-plugin-down", GPU_NODE)
    wait_resources(kube, "nvidia.com/gpu", "2", "0")  # capacity stays for the kubelet's grace period
    pod = wait_for(lambda: (p := operand_pod(kube, "nvidia-device-plugin-daemonset"))
                   and p["status"]["containerStatuses"][0]["state"].get("waiting", {}).get("reason")
                   == "CrashLoopBackOff" and p, 60, what="the device plugin in CrashLoopBackOff")
    assert pod["status"]["containerStatuses"][0]["restartCount"] >= 1
    log = kubectl("-n", OPERATOR_NS, "logs", pod["metadata"]["name"], "--previous").stdout
    assert "error starting plugins" in log
    fault("clear", GPU_NODE)
    # Back-off decides when it restarts; a deleted pod is replaced at once.
    kube.delete("Pod", pod["metadata"]["name"], OPERATOR_NS, grace_seconds=0)
    wait_resources(kube, "nvidia.com/gpu", "2", "2")


def test_faults_survive_a_node_agent_restart(cluster, kube, fault):
    fault("set", "gpu-unhealthy", GPU_NODE, "--gpu", "0")
    wait_resources(kube, "nvidia.com/gpu", "2", "1")
    cluster.procs.stop("node-agent")
    cluster.up(say=lambda m: None)
    wait_stack(kube)
    wait_resources(kube, "nvidia.com/gpu", "2", "1")
    listing = fault("list").stdout
    assert "gpu-unhealthy" in listing and GPU_NODE in listing
    assert resources(kube) == ("2", "1")


def test_reset_reinstalls_the_stack_and_repairs_the_hardware(cluster, kube, fault):
    fault("set", "device-plugin-down", GPU_NODE)
    kube.patch("ClusterPolicy", "cluster-policy", {"spec": {"dcgmExporter": {"enabled": False}}})
    wait_resources(kube, "nvidia.com/gpu", "2", "0")
    cluster.reset(say=lambda m: None)
    from gpulab.kube.api import Client

    fresh = Client(cluster.kubeconfig)
    wait_stack(fresh)
    assert fresh.get("ClusterPolicy", "cluster-policy")["spec"]["dcgmExporter"]["enabled"] is True
    assert fresh.get("DaemonSet", "nvidia-dcgm-exporter", OPERATOR_NS) is not None
    assert "no faults set" in fault("list").stdout
    wait_resources(fresh, "nvidia.com/gpu", "2", "2")
