"""A 100-node GPU fleet (manifests/topologies/fleet-100.yaml) comes up whole and is schedulable.

A cluster of its own (not the session's), brought up and purged by the module's fixture: 100 nodes of eight
H100s, the GPU Operator's five operand DaemonSets on every one of them (about 500 pods, each container a built-in
program of the node agent), and the real scheduler placing an eight-GPU pod on one node. Speed is measured by
bench/scale_bench.py, not here.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Iterator

import pytest

from gpulab.cluster.embedded import EmbeddedCluster
from gpulab.fakegpu.operator import NAMESPACE as OPERATOR_NS
from gpulab.kube import api
from gpulab.kube.topology import load as load_topology

from helpers import wait_for

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
TOPOLOGY = REPO / "manifests" / "topologies" / "fleet-100.yaml"
GPU = "nvidia.com/gpu"


@pytest.fixture(scope="module")
def fleet() -> Iterator[api.Client]:
    home = Path(tempfile.mkdtemp(prefix="glf-", dir="/tmp"))  # short: the nodes' unix sockets live under it
    home.chmod(0o755)
    cluster = EmbeddedCluster(home / "cluster")
    try:
        # `up` returns once every node is Ready and the ClusterPolicy is ready: every operand on every node.
        cluster.up(TOPOLOGY, say=lambda msg: None, timeout=480)
        yield api.Client(cluster.kubeconfig)
    finally:
        try:
            cluster.down(purge=True, say=lambda msg: None)
        finally:
            shutil.rmtree(home, ignore_errors=True)


@pytest.mark.timeout(900)
def test_every_node_is_ready_with_its_eight_gpus_and_its_operands(fleet):
    topo = load_topology(TOPOLOGY)
    nodes = fleet.list("Node")
    assert len(nodes) == len(topo.nodes) == 100
    for node in nodes:
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True", node["metadata"]["name"]
        assert node["status"]["allocatable"].get(GPU) == "8", node["metadata"]["name"]
    # Each DaemonSet of the operator has a pod on every node, and every one of them is Running.
    daemonsets = fleet.list("DaemonSet", OPERATOR_NS)
    assert len(daemonsets) >= 5
    for ds in daemonsets:
        status = ds["status"]
        assert status["desiredNumberScheduled"] == 100 == status["numberReady"], ds["metadata"]["name"]
    phases = Counter(p["status"].get("phase") for p in fleet.list("Pod", OPERATOR_NS)
                     if p["metadata"].get("ownerReferences", [{}])[0].get("kind") == "DaemonSet")
    assert phases == {"Running": 100 * len(daemonsets)}, phases
    policy = fleet.list("ClusterPolicy")[0]
    assert policy["status"]["state"] == "ready"


@pytest.mark.timeout(300)
def test_the_scheduler_places_an_eight_gpu_pod_on_one_node(fleet):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train-8gpu", "namespace": "default"},
           "spec": {"terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "train", "image": "busybox:1.36", "resources": {"limits": {GPU: "8"}}}]}}
    fleet.create(pod)
    try:
        running = wait_for(lambda: (p := fleet.get("Pod", "train-8gpu", "default"))
                           and p["status"].get("phase") == "Running" and p, 120, what="train-8gpu Running")
        node = fleet.get("Node", running["spec"]["nodeName"])
        assert node["status"]["allocatable"][GPU] == "8"
    finally:
        fleet.delete("Pod", "train-8gpu", "default", grace_seconds=0)
