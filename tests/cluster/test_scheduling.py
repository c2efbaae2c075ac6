"""The chapter's scheduling claims, decided by the real kube-scheduler and apiserver."""

from __future__ import annotations

import pytest

from gpulab.kube import api

from helpers import create, wait_for

pytestmark = pytest.mark.cluster

GPU_NODE = "gpu-node-1"


def gpu_pod(name: str, gpus, **spec) -> dict:
    resources = {"limits": {"nvidia.com/gpu": gpus}}
    container = {"name": "main", "image": "nvcr.io/nvidia/cuda:12.6.2-base-ubuntu24.04", "resources": resources}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [container], **spec}}


def scheduling_events(kube, ns, pod):
    return [ev["message"] for ev in kube.list("Event", ns, field_selector=f"involvedObject.name={pod}")
            if ev.get("reason") == "FailedScheduling"]


def scheduling_event(kube, ns, pod):
    return next(iter(scheduling_events(kube, ns, pod)), None)


def test_allocatable_reports_two_gpus_on_the_gpu_node_only(kube):
    alloc = {n["metadata"]["name"]: n["status"]["allocatable"] for n in kube.list("Node")}
    assert alloc[GPU_NODE]["nvidia.com/gpu"] == "2"
    for name, a in alloc.items():
        if name != GPU_NODE:
            assert "nvidia.com/gpu" not in a


def test_capacity_and_allocatable_in_describe_node(kubectl):
    out = kubectl("describe", "node", GPU_NODE).stdout
    cap = describe_section(out, "Capacity:", "Allocatable:")
    alloc = describe_section(out, "Allocatable:", "System Info:")
    # Other resources may be listed beside it (a MIG resource whose plugin went away stays in
    # capacity for the kubelet's grace period), which widens the column: compare values, not text.
    assert cap["nvidia.com/gpu"] == "2"
    assert alloc["nvidia.com/gpu"] == "2"
    # The default topology's GPU node reserves what GKE reserves on such a machine (kube-reserved 150m CPU and
    # 12165Mi), and the kubelet's default eviction threshold memory.available<100Mi comes off memory too.
    assert (cap["cpu"], alloc["cpu"]) == ("32", "31850m")
    assert (cap["memory"], alloc["memory"]) == ("256Gi", "249879Mi")


def test_allocatable_is_capacity_less_what_each_kubelet_reserves(kube, cluster):
    from gpulab.cluster.embedded import EmbeddedCluster
    from gpulab.kube import allocatable

    if not isinstance(cluster, EmbeddedCluster):
        pytest.skip("a kind node's real kubelet reports its own machine and configuration, not the topology's")
    for spec in cluster.topology().nodes:
        status = kube.get("Node", spec.name)["status"]
        for resource in ("cpu", "memory", "ephemeral-storage", "pods"):
            cap = allocatable.parse(status["capacity"][resource])
            alloc = allocatable.parse(status["allocatable"][resource])
            assert cap == allocatable.parse(spec.capacity()[resource]), (spec.name, resource)
            assert cap - alloc == spec.reserved().get(resource, 0), (spec.name, resource)


def describe_section(text: str, start: str, end: str) -> dict[str, str]:
    section = text.split(start)[1].split(end)[0]
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in section.splitlines()) if v}


def test_one_gpu_pod_lands_on_the_gpu_node(kube, ns):
    create(kube, ns, gpu_pod("one-gpu", 1))
    pod = wait_for(lambda: (p := kube.get("Pod", "one-gpu", ns)) and p["status"].get("phase") == "Running" and p,
                   what="pod Running")
    assert pod["spec"]["nodeName"] == GPU_NODE


def test_three_gpus_stay_pending_with_insufficient_gpu(kube, ns):
    create(kube, ns, gpu_pod("three-gpus", 3))
    msg = wait_for(lambda: scheduling_event(kube, ns, "three-gpus"), what="FailedScheduling event")
    # CPU-only nodes have no nvidia.com/gpu at all, so all three are short of it.
    assert msg.startswith("0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")
    assert kube.get("Pod", "three-gpus", ns)["status"]["phase"] == "Pending"


def test_chapter_pending_message_with_a_gpu_node_selector(kube, ns):
    create(kube, ns, gpu_pod("three-on-gpu-nodes", 3, nodeSelector={"nvidia.com/gpu.present": "true"}))
    msg = wait_for(lambda: scheduling_event(kube, ns, "three-on-gpu-nodes"), what="FailedScheduling event")
    assert msg.startswith("0/3 nodes are available: 1 Insufficient nvidia.com/gpu, "
                          "2 node(s) didn't match Pod's node affinity/selector.")


def test_taint_without_toleration_keeps_ai_pod_pending(kube, ns):
    node = kube.get("Node", GPU_NODE)
    labels = node["metadata"]["labels"]
    kube.patch("Node", GPU_NODE, {"metadata": {"labels": {"node-role.kubernetes.io/ai": "true"}},
                                  "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "true",
                                                       "effect": "NoSchedule"}]}})
    try:
        create(kube, ns, gpu_pod("no-toleration", 1, nodeSelector={"node-role.kubernetes.io/ai": "true"}))
        # The scheduler may try the pod before its informer has seen the label and the taint; the
        # Node's update requeues the pod and the next attempt's event names the taint.
        msg = wait_for(lambda: next((m for m in scheduling_events(kube, ns, "no-toleration")
                                     if "untolerated taint" in m), None),
                       what="FailedScheduling event naming the taint")
        assert "0/3 nodes are available:" in msg
        assert "1 node(s) had untolerated taint(s)" in msg
        assert "2 node(s) didn't match Pod's node affinity/selector" in msg
        tolerated = gpu_pod("with-toleration", 1, nodeSelector={"node-role.kubernetes.io/ai": "true"},
                            tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
        create(kube, ns, tolerated)
        pod = wait_for(lambda: (p := kube.get("Pod", "with-toleration", ns)) and p["spec"].get("nodeName") and p,
                       what="tolerating pod scheduled")
        assert pod["spec"]["nodeName"] == GPU_NODE
    finally:
        patch = {"metadata": {"labels": {"node-role.kubernetes.io/ai": None}}, "spec": {"taints": None}}
        if "node-role.kubernetes.io/ai" in labels:
            patch["metadata"]["labels"]["node-role.kubernetes.io/ai"] = labels["node-role.kubernetes.io/ai"]
        kube.patch("Node", GPU_NODE, patch)


def test_fractional_gpu_is_rejected_by_the_apiserver(kube, ns):
    with pytest.raises(api.ApiError) as err:
        create(kube, ns, gpu_pod("half", "0.5"))
    assert err.value.status == 422
    assert "must be an integer" in err.value.message


def test_gpu_requests_must_equal_limits(kube, ns):
    pod = gpu_pod("unequal", 2)
    pod["spec"]["containers"][0]["resources"]["requests"] = {"nvidia.com/gpu": 1}
    with pytest.raises(api.ApiError) as err:
        create(kube, ns, pod)
    assert err.value.status == 422
    assert "must be equal to nvidia.com/gpu limit" in err.value.message


def test_gpu_request_without_limit_is_rejected(kube, ns):
    pod = gpu_pod("request-only", 1)
    pod["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": 1}}
    with pytest.raises(api.ApiError) as err:
        create(kube, ns, pod)
    assert "Limit must be set for non overcommitable resources" in err.value.message


def test_pods_naming_the_binpack_profile_are_scheduled_by_it_onto_one_node(kube, ns):
    """kube-scheduler runs gpulab's profiles (gpulab/cluster/schedulerconfig.py): pods that name gpu-binpack are
    bound by that profile, whose name is the Scheduled event's source, and it packs them (MostAllocated)."""
    from gpulab.cluster.schedulerconfig import BINPACK_PROFILE

    names = [f"packed-{i}" for i in range(3)]
    for name in names:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
               "spec": {"schedulerName": BINPACK_PROFILE, "terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "main", "image": "nvcr.io/nvidia/cuda:12.6.2-base-ubuntu24.04",
                                        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}
        create(kube, ns, pod)
    placed = wait_for(lambda: (n := {p["metadata"]["name"]: p["spec"].get("nodeName") for p in kube.list("Pod", ns)})
                      and all(n.get(name) for name in names) and n, what="the three pods bound")

    def sources():
        found = {e["involvedObject"]["name"]: e.get("reportingComponent") for e in kube.list("Event", ns)
                 if e.get("reason") == "Scheduled"}
        return found if set(found) >= set(names) else None

    by = wait_for(sources, what="Scheduled events")
    assert {by[n] for n in names} == {BINPACK_PROFILE}, by
    # The node already most used wins each time: after the first pod, that is the node the first one went to.
    assert len({placed[n] for n in names}) == 1, placed
