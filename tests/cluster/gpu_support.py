"""Helpers for the GPU stack's cluster tests: the chapter's node, its resources, pods and the ClusterPolicy.

Tests that change the shared cluster's GPU node or ClusterPolicy put them
back (see :func:`restore_policy`, :func:`restore_node_label`), so the other
suites see the cluster as ``gpulab up`` leaves it.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulab import paths
from gpulab.kube import api
from gpulab.fakegpu import operator
from helpers import wait_for

GPU_NODE = "gpu-node-1"
CPU_NODE = "cpu-node-1"
CUDA_IMAGE = "nvcr.io/nvidia/cuda:12.6.2-base-ubuntu24.04"
OPERATOR_NS = "gpu-operator"
MANIFESTS = paths.manifests()


def manifest(rel: str) -> Path:
    return MANIFESTS / rel


def node(kube) -> dict[str, Any]:
    return kube.get("Node", GPU_NODE)


def labels(kube) -> dict[str, str]:
    return node(kube)["metadata"].get("labels") or {}


def resources(kube, resource: str = "nvidia.com/gpu") -> tuple[str | None, str | None]:
    """(capacity, allocatable) of ``resource`` on the GPU node, as the API has them."""
    st = node(kube).get("status") or {}
    return (st.get("capacity") or {}).get(resource), (st.get("allocatable") or {}).get(resource)


def wait_resources(kube, resource: str, capacity: str | None, allocatable: str, timeout: float = 60) -> None:
    def check():
        cap, alloc = resources(kube, resource)
        return (capacity is None or cap == capacity) and alloc == allocatable

    wait_for(check, timeout, what=f"{resource} capacity {capacity} / allocatable {allocatable} "
                                  f"(now {resources(kube, resource)})")


def wait_stack(kube, timeout: float = 120) -> None:
    """Until ClusterPolicy, operand DaemonSets and their pods are all ready."""
    wait_for(lambda: operator.stack_ready(kube) is None, timeout,
             what=f"the GPU stack to be ready ({operator.stack_ready(kube)})")


def policy(kube) -> dict[str, Any]:
    return kube.get("ClusterPolicy", operator.POLICY_NAME)


def patch_policy(kube, spec: dict[str, Any]) -> None:
    kube.patch("ClusterPolicy", operator.POLICY_NAME, {"spec": spec})


def restore_policy(kube, spec: dict[str, Any]) -> None:
    """Put the ClusterPolicy's spec back as it was and wait for the stack to settle.

    A whole-spec PUT (a merge patch would keep keys the test added): the
    operator writes the policy's status meanwhile, so a 409 means GET and PUT again.
    """
    def put_spec() -> None:
        current = policy(kube)
        current["spec"] = spec
        kube.replace(current)

    api.retry_on_conflict(put_spec)
    wait_stack(kube)


def set_node_label(kube, key: str, value: str | None) -> None:
    kube.patch("Node", GPU_NODE, {"metadata": {"labels": {key: value}}})


def gpu_pod(name: str, resource: str = "nvidia.com/gpu", count: int = 1, memory: str | None = None,
            command: list[str] | None = None, restart: str = "Never", **spec: Any) -> dict[str, Any]:
    annotations = {"gpulab.io/gpu-memory": memory} if memory else {}
    container: dict[str, Any] = {"name": "main", "image": CUDA_IMAGE}
    if command:
        container["command"] = command
    if count:
        container["resources"] = {"limits": {resource: count}}
    # `sleep` as PID 1 ignores SIGTERM: without a short grace period a deleted
    # test pod would hold its GPU (and GPU memory) for 30 s.
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations},
            "spec": {"restartPolicy": restart, "terminationGracePeriodSeconds": 1, "containers": [container], **spec}}


def gpu_holders(kube) -> list[str]:
    """Pods outside the operator's namespace that hold the GPU node's devices (terminating ones included)."""
    return [f"{p['metadata']['namespace']}/{p['metadata']['name']}"
            for p in kube.list("Pod", field_selector=f"spec.nodeName={GPU_NODE}")
            if p["metadata"]["namespace"] != OPERATOR_NS and devices(p)
            and p.get("status", {}).get("phase") not in ("Succeeded", "Failed")]


def wait_gpus_free(kube, timeout: float = 60) -> None:
    wait_for(lambda: not gpu_holders(kube), timeout, what=f"GPUs released (held by {gpu_holders(kube)})")


@contextlib.contextmanager
def gpu_namespace(kube, prefix: str) -> Iterator[str]:
    """A namespace ``<prefix>-<random>`` for GPU pods, with every GPU free before and after (other tests
    need them)."""
    wait_gpus_free(kube)
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    wait_for(lambda: kube.get("ServiceAccount", "default", name), 30, what="default service account")
    try:
        yield name
    finally:
        kube.delete("Namespace", name)
        wait_gpus_free(kube, timeout=90)


@pytest.fixture(scope="module", autouse=True)
def gpus_released(kube):
    """Leave the GPUs free for the next module (the other suites and the labs count on them)."""
    yield
    wait_gpus_free(kube, timeout=90)


def create(kube, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"]["namespace"] = ns
    return kube.create(obj)


def phase(kube, ns: str, name: str) -> str | None:
    pod = kube.get("Pod", name, ns)
    return (pod or {}).get("status", {}).get("phase")


def wait_phase(kube, ns: str, name: str, *phases: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = kube.get("Pod", name, ns)
        if pod and pod.get("status", {}).get("phase") in phases:
            return pod
        time.sleep(0.2)
    events = [f"{e['reason']}: {e['message']}" for e in kube.list("Event", ns, field_selector=f"involvedObject.name={name}")]
    pytest.fail(f"pod {ns}/{name} not {'/'.join(phases)} after {timeout:.0f} s: "
                f"status {json.dumps((pod or {}).get('status'))}; events {events}")


def devices(pod: dict[str, Any]) -> dict[str, dict[str, list[str]]]:
    return json.loads((pod["metadata"].get("annotations") or {}).get("gpulab.io/allocated-devices") or "{}")


def node_events(kube, reason: str) -> list[dict[str, Any]]:
    return [e for e in kube.list("Event", "default", field_selector=f"involvedObject.name={GPU_NODE}")
            if e.get("reason") == reason]


def operand_pod(kube, app: str) -> dict[str, Any] | None:
    pods = [p for p in kube.list("Pod", OPERATOR_NS, label_selector=f"app={app}")
            if not p["metadata"].get("deletionTimestamp")]
    return pods[0] if pods else None
