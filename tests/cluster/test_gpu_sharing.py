"""Time-slicing as the chapter sets it up, and what it does (and does not) isolate."""

from __future__ import annotations

import re

import pytest

from gpu_support import (
    GPU_NODE,
    OPERATOR_NS,
    create,
    devices,
    gpu_pod,
    gpus_released,  # noqa: F401 (autouse fixture)
    labels,
    manifest,
    node_events,
    policy,
    resources,
    restore_policy,
    set_node_label,
    wait_gpus_free,
    wait_phase,
    wait_resources,
    wait_stack,
)
from helpers import wait_for

pytestmark = pytest.mark.cluster

CONFIG_LABEL = "nvidia.com/device-plugin.config"
H100_GIB = 81559 / 1024


@pytest.fixture
def time_slicing(kube, kubectl):
    """The chapter's three steps; undone afterwards."""
    original = policy(kube)["spec"]
    wait_gpus_free(kube)  # earlier tests' pods may still be terminating
    kubectl("apply", "-f", str(manifest("04-sharing/time-slicing-config.yaml")))
    # --set devicePlugin.config.name=time-slicing-config --set devicePlugin.config.default=any
    kubectl("patch", "clusterpolicies.nvidia.com/cluster-policy", "-n", OPERATOR_NS, "--type", "merge",
            "-p", '{"spec": {"devicePlugin": {"config": {"name": "time-slicing-config", "default": "any"}}}}')
    kubectl("label", "node", GPU_NODE, f"{CONFIG_LABEL}=any", "--overwrite")
    wait_resources(kube, "nvidia.com/gpu", "8", "8")
    # GFD rolls out with its own config manager; one started after a test relabels the node would
    # read that label, not "any".
    wait_stack(kube)
    yield
    set_node_label(kube, CONFIG_LABEL, None)
    restore_policy(kube, original)
    kube.delete("ConfigMap", "time-slicing-config", OPERATOR_NS)
    wait_resources(kube, "nvidia.com/gpu", "2", "2")


def plugin_log(kubectl) -> str:
    return kubectl("-n", OPERATOR_NS, "logs", "ds/nvidia-device-plugin-daemonset", "-c", "nvidia-device-plugin").stdout


def test_replicas_4_turn_two_gpus_into_8(kube, kubectl, time_slicing):
    assert resources(kube) == ("8", "8")
    out = kubectl("describe", "node", GPU_NODE).stdout
    capacity, allocatable = out.split("Capacity:")[1].split("System Info:")[0].split("Allocatable:")
    assert re.search(r"^  nvidia.com/gpu:\s+8$", capacity, re.M) and re.search(r"^  nvidia.com/gpu:\s+8$", allocatable, re.M)
    got = wait_for(lambda: (lb := labels(kube)).get("nvidia.com/gpu.replicas") == "4" and lb, 30,
                   what="GFD's sharing labels")
    assert got["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert got["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-SHARED"
    assert got["nvidia.com/gpu.count"] == "2"  # still two physical GPUs
    pods = kubectl("-n", OPERATOR_NS, "get", "pods", "-l", "app=nvidia-device-plugin-daemonset").stdout
    assert "2/2" in pods  # the plugin and its config-manager sidecar
    assert '"replicas": 4' in plugin_log(kubectl)


def test_time_slicing_does_not_isolate_memory(kube, ns, kubectl, time_slicing):
    """谁先用完谁先 OOM，另外三个一起挂: whoever runs out first fails, and its neighbours with it."""
    names = [f"train-{i}" for i in range(5)]
    for name in names:  # one after the other, as jobs arrive
        create(kube, ns, gpu_pod(name, memory="30Gi", command=["sleep", "300"]))
        wait_phase(kube, ns, name, "Running", "Failed")
    by_gpu: dict[str, list[str]] = {}
    for name in names:
        [device] = devices(kube.get("Pod", name, ns))["main"]["nvidia.com/gpu"]
        by_gpu.setdefault(device.split("::")[0], []).append(name)
    crowded = [group for group in by_gpu.values() if len(group) * 30 > H100_GIB]
    assert len(crowded) == 1, by_gpu  # five pods on two cards: one card gets three
    last_words = set()
    for group in by_gpu.values():
        for name in group:
            if group in crowded:
                pod = wait_phase(kube, ns, name, "Failed")
                assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 1
                log = kubectl("-n", ns, "logs", name).stdout
                assert "CUDA out of memory." in log
                last_words.add(log.strip().splitlines()[-1])
            else:
                assert wait_phase(kube, ns, name, "Running")
    # The third grew 1 GiB at a time to 19 GiB beside the other two's 60: all three saw the same full card.
    assert last_words == {"CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 79.65 GiB "
                          "of which 663.00 MiB is free."}
    [survivors] = [group for group in by_gpu.values() if group not in crowded]
    # Each sees the whole card, and the memory its neighbour uses.
    out = kubectl("-n", ns, "exec", survivors[0], "--", "nvidia-smi", "--query-gpu=memory.used,memory.total",
                  "--format=csv,noheader").stdout
    assert out.strip() == f"{30 * 1024 * len(survivors)} MiB, 81559 MiB"


def add_config(kube, name: str, text: str) -> None:
    """One more key in the device plugin's ConfigMap: a merge patch, which no concurrent write can make stale."""
    kube.patch("ConfigMap", "time-slicing-config", {"data": {name: text}}, OPERATOR_NS)


def test_a_broken_config_keeps_the_last_good_one(kube, kubectl, time_slicing):
    add_config(kube, "broken", "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
                               "    - name: nvidia.com/gpu\n      replicas: 1\n")
    kubectl("label", "node", GPU_NODE, f"{CONFIG_LABEL}=broken", "--overwrite")
    # The label's event (a node's events outlive the lessons, labs and tests that caused them).
    [event] = wait_for(lambda: [e for e in node_events(kube, "DevicePluginConfigInvalid") if "'broken'" in e["message"]],
                       30, what="an Event on the node")
    assert event["type"] == "Warning"
    assert "config 'broken' of ConfigMap gpu-operator/time-slicing-config is invalid" in event["message"]
    assert "number of replicas must be >= 2" in event["message"]
    assert "keeping the last good config 'any'" in event["message"]
    assert resources(kube) == ("8", "8")
    kubectl("label", "node", GPU_NODE, f"{CONFIG_LABEL}=nonexistent", "--overwrite")
    # The label's event, not one an earlier test's clean-up left on the node (its ConfigMap deleted first).
    [event] = wait_for(lambda: [e for e in node_events(kube, "DevicePluginConfigNotFound")
                                if "nonexistent" in e["message"]], 30, what="an Event on the node")
    assert "names no config" in event["message"] and "keeping the last good config 'any'" in event["message"]
    kubectl("label", "node", GPU_NODE, f"{CONFIG_LABEL}=any", "--overwrite")
    assert resources(kube) == ("8", "8")


def test_a_shared_gpu_request_over_one_fails_admission(kube, ns, kubectl, time_slicing):
    add_config(kube, "strict", "version: v1\nsharing:\n  timeSlicing:\n    failRequestsGreaterThanOne: true\n"
                               "    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n")
    kubectl("label", "node", GPU_NODE, f"{CONFIG_LABEL}=strict", "--overwrite")

    def restarted_strict() -> bool:
        log = plugin_log(kubectl)
        last = log.rsplit("Running with config:", 1)[-1]
        return '"failRequestsGreaterThanOne": true' in last and "Registered device plugin" in last

    wait_for(restarted_strict, 30, what="the device plugin restarted with the new config")
    wait_resources(kube, "nvidia.com/gpu", "8", "8")
    create(kube, ns, gpu_pod("two", count=2, command=["true"]))
    pod = wait_phase(kube, ns, "two", "Failed")
    assert pod["status"]["reason"] == "UnexpectedAdmissionError"
    message = pod["status"]["message"]
    assert message.startswith("Pod was rejected: Allocate failed due to rpc error: code = Unknown desc = ")
    assert "maximum request size for shared resources is 1; found 2" in message
    assert message.endswith(", which is unexpected")
    events = kube.list("Event", ns, field_selector="involvedObject.name=two")
    assert any(e["reason"] == "UnexpectedAdmissionError" and e["type"] == "Warning" for e in events)
