"""The GPU Operator as the chapter installs and verifies it: pods, ClusterPolicy, resources, nvidia-smi."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from gpu_support import (
    CPU_NODE,
    CUDA_IMAGE,
    GPU_NODE,
    OPERATOR_NS,
    create,
    devices,
    gpu_pod,
    gpus_released,  # noqa: F401 (autouse fixture)
    labels,
    manifest,
    operand_pod,
    patch_policy,
    policy,
    restore_policy,
    set_node_label,
    wait_phase,
    wait_resources,
    wait_stack,
)
from helpers import wait_for

pytestmark = pytest.mark.cluster

OPERANDS = ("gpu-feature-discovery", "nvidia-dcgm-exporter", "nvidia-device-plugin-daemonset",
            "nvidia-mig-manager", "nvidia-operator-validator")


def test_every_component_runs_on_the_gpu_node(kube, kubectl):
    wait_stack(kube)
    out = kubectl("-n", OPERATOR_NS, "get", "pods").stdout
    rows = [line.split()[:3] for line in out.splitlines()[1:]]
    status = {r[0].rsplit("-", 1)[0]: (r[1], r[2]) for r in rows}
    for name in OPERANDS:
        assert status[name] == ("1/1", "Running"), out
        assert operand_pod(kube, name)["spec"]["nodeName"] == GPU_NODE
    assert any(r[0].startswith("gpu-operator-") and r[2] == "Running" for r in rows), out
    # The validator's CUDA workload ran once and is done.
    assert any(r[0].startswith("nvidia-cuda-validator-") and r[2] == "Completed" for r in rows), out


def test_clusterpolicy_state_is_ready(kube, kubectl):
    wait_stack(kube)
    out = kubectl("get", "clusterpolicies.nvidia.com").stdout.splitlines()
    assert out[0].split() == ["NAME", "STATUS", "AGE"]
    name, state, _ = out[1].split()
    assert (name, state) == ("cluster-policy", "ready")
    assert policy(kube)["status"]["namespace"] == OPERATOR_NS


def test_daemonsets_are_placed_by_the_real_controllers_through_deploy_labels(kube):
    for name in OPERANDS:
        ds = kube.get("DaemonSet", name, OPERATOR_NS)
        selector = ds["spec"]["template"]["spec"]["nodeSelector"]
        [(key, value)] = selector.items()
        assert key.startswith("nvidia.com/gpu.deploy.") and value == "true"
        assert labels(kube)[key] == "true"
        assert ds["metadata"]["ownerReferences"][0]["kind"] == "ClusterPolicy"
        assert ds["status"]["desiredNumberScheduled"] == 1  # the GPU node only
        pod = operand_pod(kube, name)
        # The DaemonSet controller pins its pod with node affinity; the scheduler binds it.
        affinity = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert affinity["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [GPU_NODE]
        assert pod["spec"]["nodeName"] == GPU_NODE


def test_allocatable_shows_two_gpus_reported_by_the_device_plugin(kube, kubectl, cluster):
    wait_resources(kube, "nvidia.com/gpu", "2", "2")
    allocatable = json.loads(kubectl("get", "nodes", "-o", "json").stdout)
    reported = {n["metadata"]["name"]: n["status"]["allocatable"].get("nvidia.com/gpu") for n in allocatable["items"]}
    assert reported == {GPU_NODE: "2", CPU_NODE: None, "cpu-node-2": None}
    plugin_dir = cluster.root / "nodes" / GPU_NODE / "host" / "var/lib/kubelet/device-plugins"
    assert (plugin_dir / "kubelet.sock").is_socket() and (plugin_dir / "nvidia-gpu.sock").is_socket()
    log = kubectl("-n", OPERATOR_NS, "logs", "ds/nvidia-device-plugin-daemonset").stdout
    assert "Starting to serve 'nvidia.com/gpu' on /var/lib/kubelet/device-plugins/nvidia-gpu.sock" in log
    assert "Registered device plugin for 'nvidia.com/gpu' with Kubelet" in log


def test_gfd_and_nfd_labels_for_choosing_machines(kube, kubectl):
    out = kubectl("get", "nodes", "-L", "nvidia.com/gpu.product,nvidia.com/gpu.count,nvidia.com/gpu.memory").stdout
    row = next(line.split() for line in out.splitlines() if line.startswith(GPU_NODE))
    assert row[-3:] == ["NVIDIA-H100-80GB-HBM3", "2", "81559"]
    got = labels(kube)
    assert got["feature.node.kubernetes.io/pci-10de.present"] == "true"
    assert got["nvidia.com/gpu.present"] == "true"
    assert got["nvidia.com/gpu.family"] == "hopper" and got["nvidia.com/gpu.replicas"] == "1"
    assert got["nvidia.com/mig.strategy"] == "single"  # the chart's default mig.strategy
    assert got["nvidia.com/mig.config.state"] == "success"
    selected = kubectl("get", "nodes", "-l", "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3,nvidia.com/gpu.count=2",
                       "-o", "name").stdout.split()
    assert selected == [f"node/{GPU_NODE}"]


def test_gpu_check_prints_the_h100_in_kubectl_logs(kube, ns, kubectl):
    overrides = ('{"spec":{"containers":[{"name":"gpu-check","image":"nvcr.io/nvidia/cuda:12.6.2-base-ubuntu24.04",'
                 '"command":["nvidia-smi"],"resources":{"limits":{"nvidia.com/gpu":1}}}]}}')
    kubectl("-n", ns, "run", "gpu-check", "--restart=Never", f"--image={CUDA_IMAGE}", f"--overrides={overrides}")
    pod = wait_phase(kube, ns, "gpu-check", "Succeeded", "Failed")
    out = kubectl("-n", ns, "logs", "gpu-check").stdout
    assert pod["status"]["phase"] == "Succeeded", out
    assert "NVIDIA H100 80GB HBM3" in out and "Driver Version: 580.159.04" in out and "81559MiB" in out
    [device] = devices(pod)["gpu-check"]["nvidia.com/gpu"]
    assert device.startswith("GPU-") and device in kubectl("-n", ns, "get", "pod", "gpu-check", "-o", "yaml").stdout
    kubectl("-n", ns, "delete", "pod", "gpu-check")


def test_gpu_check_manifest_and_a_gpu_pod_held_devices_in_status(kube, ns, kubectl, gpulab_home):
    kubectl("-n", ns, "apply", "-f", str(manifest("02-gpu-operator/gpu-check-pod.yaml")))
    wait_phase(kube, ns, "gpu-check", "Succeeded")
    assert "NVIDIA H100 80GB HBM3" in kubectl("-n", ns, "logs", "gpu-check").stdout
    create(kube, ns, gpu_pod("holder", command=["sleep", "300"]))
    wait_phase(kube, ns, "holder", "Running")
    env = dict(os.environ, GPULAB_HOME=str(gpulab_home))
    status = json.loads(subprocess.run([sys.executable, "-m", "gpulab.cli", "status", "--json"], env=env,
                                       capture_output=True, text=True, timeout=60).stdout)
    gpu = next(n for n in status["nodes"] if n["name"] == GPU_NODE)
    [held] = [d for d in gpu["devices"] if d["pod"] == f"{ns}/holder"]
    assert held["resource"] == "nvidia.com/gpu" and held["ids"][0].startswith("GPU-")
    assert gpu["resources"]["nvidia.com/gpu"]["allocated"] == 1


def test_nvidia_smi_from_kubectl_exec(kube, ns, kubectl):
    create(kube, ns, gpu_pod("shell", count=2, command=["sleep", "300"]))
    wait_phase(kube, ns, "shell", "Running")
    out = kubectl("-n", ns, "exec", "shell", "--", "nvidia-smi", "-L").stdout
    assert out.count("NVIDIA H100 80GB HBM3") == 2
    out = kubectl("-n", ns, "exec", "shell", "--", "sh", "-c", "nvidia-smi --query-gpu=name --format=csv,noheader").stdout
    assert out.split("\n")[:2] == ["NVIDIA H100 80GB HBM3"] * 2


def test_without_a_gpu_nvidia_smi_fails_as_in_a_container_without_devices(kube, ns, kubectl):
    create(kube, ns, gpu_pod("no-gpu", count=0, command=["nvidia-smi"], nodeName=GPU_NODE))
    pod = wait_phase(kube, ns, "no-gpu", "Failed")
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 6
    assert kubectl("-n", ns, "logs", "no-gpu").stdout.strip() == "No devices were found"
    # No container toolkit on a CPU node: there is no nvidia-smi at all.
    create(kube, ns, gpu_pod("cpu-only", count=0, command=["nvidia-smi"], nodeName=CPU_NODE))
    pod = wait_phase(kube, ns, "cpu-only", "Failed")
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 127
    assert 'exec: "nvidia-smi": executable file not found in $PATH' in kubectl("-n", ns, "logs", "cpu-only").stdout


def test_gpulab_nvidia_smi_shows_the_hosts_gpus_and_processes(kube, ns, gpulab_home):
    pod = gpu_pod("worker", memory="12Gi", command=["sleep", "300"])
    create(kube, ns, pod)
    wait_phase(kube, ns, "worker", "Running")
    env = dict(os.environ, GPULAB_HOME=str(gpulab_home))

    def smi(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "gpulab.cli", "nvidia-smi", *args], env=env,
                              capture_output=True, text=True, timeout=60)

    listing = wait_for(lambda: (p := smi(GPU_NODE)).returncode == 0 and "12288MiB" in p.stdout and p.stdout, 20,
                       what="the worker's process in nvidia-smi")
    assert listing.count("NVIDIA H100 80GB HBM3") == 2 and " sleep " in listing
    assert smi(GPU_NODE, "-L").stdout.count("GPU ") == 2
    bad = smi(CPU_NODE)
    assert bad.returncode == 1 and "no GPU state for node 'cpu-node-1'" in bad.stderr


def test_pinning_more_gpus_than_the_node_has_is_refused_by_the_kubelet(kube, ns, kubectl):
    # nodeName bypasses the scheduler; the kubelet's admission has the last word.
    create(kube, ns, gpu_pod("greedy", count=3, command=["true"], nodeName=GPU_NODE))
    pod = wait_phase(kube, ns, "greedy", "Failed")
    assert pod["status"]["reason"] == "OutOfnvidia.com/gpu"
    # "used" counts GPUs still held by earlier tests' pods, which may be terminating.
    assert re.fullmatch(r"Pod was rejected: Node didn't have enough resource: nvidia.com/gpu, requested: 3, "
                        r"used: [0-2], capacity: 2", pod["status"]["message"]), pod["status"]["message"]
    # As the kubelet's rejectPod leaves it: no container was created, so kubectl shows the reason.
    assert "containerStatuses" not in pod["status"]
    assert kubectl("-n", ns, "get", "pod", "greedy", "--no-headers").stdout.split()[2] == "OutOfnvidia.com/gpu"
    event = next(e for e in kube.list("Event", ns, field_selector="involvedObject.name=greedy")
                 if e["reason"] == "OutOfnvidia.com/gpu")
    assert event["type"] == "Warning" and event["message"].startswith("Node didn't have enough resource")


def test_a_pod_bound_as_another_finishes_gets_its_gpus(kube, ns):
    """The scheduler binds the next pod the moment a finished one's phase shows; the node must admit it.

    Each waiting pod wants both GPUs, so it is bound exactly when the one before it finishes. A node
    that still counted a finished pod's devices refused the next one (OutOfnvidia.com/gpu).
    """
    names = [f"relay-{i}" for i in range(4)]
    for name in names:
        create(kube, ns, gpu_pod(name, count=2, command=["sleep", "0.5"]))
    for name in names:
        pod = wait_phase(kube, ns, name, "Succeeded", "Failed", timeout=60)
        assert pod["status"]["phase"] == "Succeeded", (name, pod["status"].get("reason"), pod["status"].get("message"))


def test_gpu_train_demo_job_from_the_chapter(kube, ns, kubectl):
    set_node_label(kube, "node-role.kubernetes.io/ai", "true")
    try:
        kubectl("-n", ns, "apply", "-f", str(manifest("03-scheduling/gpu-train-demo.yaml")))
        wait_for(lambda: any(c["type"] == "Complete" and c["status"] == "True"
                             for c in (kube.get("Job", "gpu-train-demo", ns) or {}).get("status", {})
                             .get("conditions") or []), 60, what="gpu-train-demo Complete")
        out = kubectl("-n", ns, "logs", "job/gpu-train-demo").stdout
        assert "NVIDIA H100 80GB HBM3" in out and out.rstrip().endswith("train step done")
    finally:
        set_node_label(kube, "node-role.kubernetes.io/ai", None)


def test_disabling_a_component_in_the_clusterpolicy_removes_it(kube, kubectl):
    original = policy(kube)["spec"]
    try:
        # helm upgrade ... --set dcgmExporter.enabled=false
        kubectl("patch", "clusterpolicies.nvidia.com/cluster-policy", "--type", "merge",
                "-p", '{"spec": {"dcgmExporter": {"enabled": false}}}')
        wait_for(lambda: kube.get("DaemonSet", "nvidia-dcgm-exporter", OPERATOR_NS) is None, 30,
                 what="the dcgm-exporter DaemonSet gone")
        wait_for(lambda: operand_pod(kube, "nvidia-dcgm-exporter") is None, 30, what="its pod gone (GC)")
        patch_policy(kube, {"dcgmExporter": {"enabled": True}})
        wait_for(lambda: (p := operand_pod(kube, "nvidia-dcgm-exporter")) and p["status"].get("phase") == "Running",
                 30, what="dcgm-exporter back")
    finally:
        restore_policy(kube, original)


def test_dcgm_exporter_serves_metrics_with_the_pod_holding_a_gpu(kube, ns):
    import urllib.request

    from gpulab.fakegpu import dcgm

    wait_stack(kube)
    pod = gpu_pod("inference", memory="16Gi", command=["sleep", "300"])
    pod["metadata"]["annotations"]["gpulab.io/gpu-utilization"] = "75"
    create(kube, ns, pod)
    wait_phase(kube, ns, "inference", "Running")
    exporter = operand_pod(kube, "nvidia-dcgm-exporter")
    endpoint = exporter["metadata"]["annotations"]["gpulab.io/metrics-endpoint"]
    assert endpoint.startswith("http://127.0.0.1:")

    def sample():
        text = urllib.request.urlopen(endpoint, timeout=5).read().decode()
        return [(labels, v) for name, labels, v in dcgm.parse(text)
                if name == "DCGM_FI_DEV_GPU_UTIL" and labels.get("pod") == "inference"]

    [(labels_, value)] = wait_for(sample, 20, what="the pod's GPU in the exporter's metrics")
    assert value == 75 and labels_["namespace"] == ns and labels_["Hostname"] == GPU_NODE
