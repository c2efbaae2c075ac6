"""MIG as the chapter turns it on: the MIG manager, the strategies, and what a MIG slice isolates."""

from __future__ import annotations

import pytest

from gpu_support import (
    GPU_NODE,
    OPERATOR_NS,
    create,
    gpu_pod,
    gpus_released,  # noqa: F401 (autouse fixture)
    labels,
    node,
    node_events,
    policy,
    restore_policy,
    wait_gpus_free,
    wait_phase,
    wait_resources,
    wait_stack,
)
from helpers import wait_for

pytestmark = pytest.mark.cluster

MIG_CONFIG = "nvidia.com/mig.config"
MIG_STATE = "nvidia.com/mig.config.state"
MIG_1G = "nvidia.com/mig-1g.10gb"


def relabel(kube, value: str, timeout: float = 90) -> list[str]:
    """Set ``nvidia.com/mig.config`` and follow the node: the states the MIG manager moves it through.

    The old state label is dropped with the change, so every state seen is
    the MIG manager's answer to this request.
    """
    current = node(kube)
    if current["metadata"]["labels"].get(MIG_CONFIG) == value:
        return [current["metadata"]["labels"].get(MIG_STATE, "")]  # nothing changes, nothing to answer
    rv = current["metadata"]["resourceVersion"]
    kube.patch("Node", GPU_NODE, {"metadata": {"labels": {MIG_CONFIG: value, MIG_STATE: None}}})
    states: list[str] = []
    for ev in kube.watch("Node", rv, field_selector=f"metadata.name={GPU_NODE}", timeout_seconds=int(timeout)):
        obj_labels = (ev.get("object", {}).get("metadata") or {}).get("labels") or {}
        state = obj_labels.get(MIG_STATE)
        if obj_labels.get(MIG_CONFIG) != value or not state:
            continue
        if not states or states[-1] != state:
            states.append(state)
        if state in ("success", "failed"):
            return states
    pytest.fail(f"the MIG manager did not finish {value} in {timeout:.0f} s (states: {states})")


def gpu_allocatable(kube) -> dict[str, str]:
    return {k: v for k, v in node(kube)["status"]["allocatable"].items() if k.startswith("nvidia.com/")}


@pytest.fixture(scope="module")
def mixed(kube, kubectl):
    """helm upgrade ... --set migManager.enabled=true --set mig.strategy=mixed"""
    original = policy(kube)["spec"]
    wait_gpus_free(kube)  # the MIG manager will not touch GPUs in use
    kubectl("patch", "clusterpolicies.nvidia.com/cluster-policy", "--type", "merge",
            "-p", '{"spec": {"migManager": {"enabled": true}, "mig": {"strategy": "mixed"}}}')
    wait_stack(kube)
    yield
    relabel(kube, "all-disabled")
    restore_policy(kube, original)
    wait_resources(kube, "nvidia.com/gpu", "2", "2")


def test_all_1g_10gb_gives_seven_instances_per_gpu(kube, kubectl, mixed):
    states = relabel(kube, "all-1g.10gb")
    assert states == ["pending", "success"]
    # kubectl get nodes -o json | jq '.items[].status.allocatable | with_entries(select(.key | startswith("nvidia.com/")))'
    wait_for(lambda: gpu_allocatable(kube).get(MIG_1G) == "14", 60, what=f"14 x {MIG_1G}")
    assert gpu_allocatable(kube)["nvidia.com/gpu"] == "0"  # the full GPUs are gone from allocatable
    got = wait_for(lambda: (lb := labels(kube)).get(f"{MIG_1G}.count") == "14" and lb, 30, what="GFD's MIG labels")
    assert got["nvidia.com/mig.strategy"] == "mixed"
    assert got[f"{MIG_1G}.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
    assert got[f"{MIG_1G}.memory"] == "9984" and got[f"{MIG_1G}.multiprocessors"] == "16"
    assert got["nvidia.com/gpu.replicas"] == "0"
    log = kubectl("-n", OPERATOR_NS, "logs", "ds/nvidia-mig-manager").stdout
    for line in ("Shutting down all GPU clients in Kubernetes by disabling their component-specific nodeSelector "
                 "labels", "Applying the selected MIG config to the node", "MIG configuration applied successfully",
                 "Restarting validator pod to re-run all validations",
                 "Changing the 'nvidia.com/mig.config.state' node label to 'success'"):
        assert line in log
    wait_stack(kube)


def test_a_mig_slice_isolates_memory(kube, ns, kubectl, mixed):
    if labels(kube).get(MIG_CONFIG) != "all-1g.10gb":
        relabel(kube, "all-1g.10gb")
    wait_for(lambda: gpu_allocatable(kube).get(MIG_1G) == "14", 60, what=f"14 x {MIG_1G}")
    create(kube, ns, gpu_pod("fits", resource=MIG_1G, memory="8Gi", command=["sleep", "300"]))
    wait_phase(kube, ns, "fits", "Running")
    create(kube, ns, gpu_pod("too-big", resource=MIG_1G, memory="12Gi", command=["sleep", "300"]))
    wait_phase(kube, ns, "too-big", "Failed")
    assert "GPU 0 has a total capacity of 9.75 GiB" in kubectl("-n", ns, "logs", "too-big").stdout
    assert wait_phase(kube, ns, "fits", "Running")  # the neighbour never noticed
    out = kubectl("-n", ns, "exec", "fits", "--", "nvidia-smi", "-L").stdout
    assert out.count("MIG 1g.10gb") == 1 and out.count("GPU 0: NVIDIA H100 80GB HBM3") == 1

    # The MIG manager does not evict GPU workloads: it refuses to change the layout under them.
    assert relabel(kube, "all-3g.40gb") == ["pending", "failed"]
    # (The node's events outlive the lessons and tests that caused them: lesson 04 leaves one naming its own pod.)
    [event] = wait_for(lambda: [e for e in node_events(kube, "MigConfigFailed")
                                if "in use" in e["message"] and f"{ns}/fits" in e["message"]], 30,
                       what=f"a MigConfigFailed Event naming {ns}/fits")
    assert event["type"] == "Warning"
    # The GPU clients it paused come back; the geometry is as it was.
    wait_for(lambda: gpu_allocatable(kube).get(MIG_1G) == "14", 60, what=f"14 x {MIG_1G} again")
    kube.delete("Pod", "fits", ns, grace_seconds=0)
    kube.delete("Pod", "too-big", ns, grace_seconds=0)
    wait_for(lambda: not kube.list("Pod", ns), 30, what="the MIG pods gone")
    # The same value again is no change to react to: back to the applied layout first.
    assert relabel(kube, "all-1g.10gb") == ["success"]  # already applied: nothing to pause
    assert relabel(kube, "all-3g.40gb") == ["pending", "success"]
    wait_for(lambda: gpu_allocatable(kube).get("nvidia.com/mig-3g.40gb") == "4", 60, what="4 x 3g.40gb")


def test_an_unknown_layout_fails_with_an_event(kube, mixed):
    assert relabel(kube, "all-9g.99gb") == ["failed"]
    [event] = wait_for(lambda: [e for e in node_events(kube, "MigConfigFailed") if "all-9g.99gb" in e["message"]],
                       30, what="a MigConfigFailed Event")
    assert "unknown MIG layout 'all-9g.99gb' for NVIDIA H100 80GB HBM3; allowed: all-disabled" in event["message"]
    assert labels(kube)[MIG_STATE] == "failed"
    assert relabel(kube, "all-disabled") == ["pending", "success"]
    wait_resources(kube, "nvidia.com/gpu", "2", "2")


def test_single_strategy_advertises_mig_devices_as_gpus(kube, kubectl, mixed):
    kubectl("patch", "clusterpolicies.nvidia.com/cluster-policy", "--type", "merge",
            "-p", '{"spec": {"mig": {"strategy": "single"}}}')
    wait_stack(kube)
    assert relabel(kube, "all-1g.10gb")[-1] == "success"
    wait_resources(kube, "nvidia.com/gpu", None, "14")
    got = wait_for(lambda: (lb := labels(kube)).get("nvidia.com/gpu.count") == "14" and lb, 30,
                   what="GFD's single-strategy labels")
    assert got["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
    assert got["nvidia.com/mig.strategy"] == "single" and got["nvidia.com/gpu.memory"] == "9984"
    assert relabel(kube, "all-disabled")[-1] == "success"
    wait_resources(kube, "nvidia.com/gpu", "2", "2")
