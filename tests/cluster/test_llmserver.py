"""The inference server image runs its real program: a Deployment of gpulab/llm-server loads its model
(an init container fetches it), is not Ready while loading, answers completions through its Service,
and the traffic shows as its GPU's utilization in the node's nvidia-smi state."""

from __future__ import annotations

import json

import pytest

from gpulab.fakegpu import llmserver
from gpulab.fakegpu.node import host_state_path

from gpu_support import GPU_NODE, wait_resources
from helpers import NEEDS_POD_NETWORK, wait_for

pytestmark = [pytest.mark.cluster, NEEDS_POD_NETWORK]

IMAGE = f"{llmserver.IMAGE_REPOSITORY}:test"


def deployment() -> dict:
    probe = {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 1}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llm"}, "spec": {
        "replicas": 1, "selector": {"matchLabels": {"app": "llm"}},
        "template": {"metadata": {"labels": {"app": "llm"}}, "spec": {
            "nodeSelector": {"kubernetes.io/hostname": GPU_NODE},
            "volumes": [{"name": "models", "emptyDir": {}}],
            "initContainers": [{"name": "fetch", "image": IMAGE, "volumeMounts": [{"name": "models",
                                                                                    "mountPath": "/models"}],
                                "args": ["fetch", "--name", "tiny-1b", "--size-gib", "1", "--to", "/models/tiny-1b",
                                         "--mib-per-second", "0"]}],
            "containers": [{"name": "server", "image": IMAGE,
                            "args": ["--model", "/models/tiny-1b", "--load-gib-per-second", "0.2",
                                     "--ms-per-token", "20"],
                            "ports": [{"name": "http", "containerPort": 8000}],
                            "volumeMounts": [{"name": "models", "mountPath": "/models"}],
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                            "readinessProbe": probe}]}}}}


def service() -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "llm"},
            "spec": {"selector": {"app": "llm"}, "ports": [{"port": 80, "targetPort": "http"}]}}


def loadgen(duration: int) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "loadgen"}, "spec": {
        "restartPolicy": "Never",
        "containers": [{"name": "loadgen", "image": IMAGE,
                        "args": ["loadgen", "http://llm/v1/completions", "--rps", "10", "--duration", str(duration),
                                 "--max-tokens", "10", "--timeout", "5"]}]}}


def server_pod(kube, ns) -> dict | None:
    pods = kube.list("Pod", ns, label_selector="app=llm")
    return pods[0] if pods else None


def condition(p: dict | None, kind: str) -> str | None:
    for c in ((p or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return c["status"]
    return None


def running_not_ready(p: dict | None) -> bool:
    statuses = ((p or {}).get("status") or {}).get("containerStatuses") or []
    return bool(statuses) and "running" in statuses[0].get("state", {}) and condition(p, "Ready") == "False"


def test_the_llm_server_loads_answers_through_its_service_and_its_gpu_shows_the_traffic(
        kube, kubectl, ns, cluster):
    wait_resources(kube, "nvidia.com/gpu", None, "2", timeout=120)
    for obj in (service(), deployment()):
        obj["metadata"]["namespace"] = ns
        kube.create(obj)

    # Loading: the server runs and its /health answers 503, so the readiness probe keeps it out of the Service.
    p = wait_for(lambda: (lambda p: running_not_ready(p) and p)(server_pod(kube, ns)), 90,
                 what="the server running, not Ready, while it loads")
    name = p["metadata"]["name"]
    assert "fetched tiny-1b into /models/tiny-1b" in kubectl("-n", ns, "logs", name, "-c", "fetch").stdout
    wait_for(lambda: any("statuscode: 503" in e.get("message", "")
                         for e in kube.list("Event", ns, field_selector=f"involvedObject.name={name}")),
             30, what="a readiness probe failure with 503 while loading")
    p = wait_for(lambda: (lambda p: condition(p, "Ready") == "True" and p)(server_pod(kube, ns)), 60,
                 what="the server Ready once loaded")
    log = kubectl("-n", ns, "logs", name, "-c", "server").stdout
    assert "loading model tiny-1b (1.0 GiB) from /models/tiny-1b" in log
    assert "model loaded in" in log and "listening on :8000" in log
    assert "compute share 1.00" in log  # a whole GPU, nobody else computing on it

    # Traffic through the Service: every request answered, and the node sees the GPU busy.
    pod = loadgen(12)
    pod["metadata"]["namespace"] = ns
    kube.create(pod)
    gpu = json.loads((p["metadata"].get("annotations") or {}).get("gpulab.io/allocated-devices") or "{}")
    uuid = gpu["server"]["nvidia.com/gpu"][0].split("::")[0]
    state_file = host_state_path(cluster.root, GPU_NODE)

    def busy() -> int:
        state = json.loads(state_file.read_text())
        return next(g["utilization_gpu"] for g in state["gpus"] if g["uuid"] == uuid)

    wait_for(lambda: busy() >= 50, 30, interval=0.5, what="the server's GPU busy in the node's nvidia-smi state")
    done = wait_for(lambda: (lambda q: (q.get("status") or {}).get("phase") in ("Succeeded", "Failed") and q)(
        kube.get("Pod", "loadgen", ns) or {}), 60, what="loadgen finished")
    out = kubectl("-n", ns, "logs", "loadgen").stdout
    assert done["status"]["phase"] == "Succeeded", out
    summary = json.loads(out.splitlines()[-1])
    assert summary["sent"] == 120 and summary["ok"] == summary["sent"], out
    assert summary["p50_ms"] >= 200  # 10 tokens x 20 ms on a whole GPU
    server_log = kubectl("-n", ns, "logs", name, "-c", "server").stdout
    assert server_log.count('"POST /v1/completions" 200') >= 120
    # The traffic is over: the report falls back to idle and so does the GPU.
    wait_for(lambda: busy() == 0, 30, interval=0.5, what="the GPU idle again after the traffic")
