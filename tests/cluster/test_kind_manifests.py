"""What the kind backend applies, checked by the embedded cluster's real apiserver and controllers.

No Docker here, so the kind cluster itself is not created (that is
`make test BACKEND=kind`, where Docker runs). What can be checked without it:

- every object `gpulab up --backend kind` applies passes a server-side dry run
  (``dryRun=All``, strict field validation) of the very call the kind path makes
  (server-side apply; create for the ClusterPolicy);
- the Nodes the kind config makes the kubelets register (names, labels,
  registration taints) and the labels applied after creation are valid objects
  and patches;
- the DaemonSets are placed by the real DaemonSet controller and scheduler on
  exactly the GPU nodes, tolerating their taints;
- the image's GFD, config-manager and MIG manager, as real processes with only
  the stack's ClusterRole, label a Node as on kind (the device plugin against a
  kubelet is tests/unit/test_kind_daemon.py).
"""

from __future__ import annotations

import copy
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpulab.kube import api, topology
from gpulab.cluster import kind
from gpulab.fakegpu import mig as migmod
from helpers import wait_for

pytestmark = pytest.mark.cluster

DRY_RUN = {"dryRun": "All", "fieldValidation": "Strict"}


def _ssa_dry_run(kube: api.Client, obj: dict[str, Any]) -> dict[str, Any]:
    md = obj["metadata"]
    return kube.request("PATCH", kube.path(obj["kind"], md["name"], md.get("namespace")), obj,
                        query={**DRY_RUN, "fieldManager": "gpulab-install", "force": "true"},
                        content_type="application/apply-patch+yaml")


def _create_dry_run(kube: api.Client, obj: dict[str, Any]) -> dict[str, Any]:
    return kube.request("POST", kube.path(obj["kind"], None, obj["metadata"].get("namespace")), obj, query=DRY_RUN)


def test_every_applied_object_passes_a_server_side_dry_run(kube) -> None:
    docs = kind.stack_documents()
    assert {d["kind"] for d in docs} >= {"Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole",
                                         "ClusterRoleBinding", "DaemonSet", "Service", "ClusterPolicy"}
    for doc in docs:
        try:
            out = _ssa_dry_run(kube, doc)
        except api.ApiError as e:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: the apiserver refuses it: {e}")
        assert out["metadata"]["name"] == doc["metadata"]["name"]


def test_namespaced_objects_pass_a_dry_run_create_in_an_empty_namespace(kube, ns) -> None:
    """The create path too, where the embedded operator's same-named objects are not in the way."""
    for doc in kind.stack_documents():
        if not doc["metadata"].get("namespace"):
            continue
        obj = copy.deepcopy(doc)
        obj["metadata"]["namespace"] = ns
        try:
            _create_dry_run(kube, obj)
        except api.ApiError as e:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: the apiserver refuses it: {e}")


def _registered_nodes(topo: topology.Topology, prefix: str) -> list[dict[str, Any]]:
    """The Node objects the kind config makes each kubelet register (renamed, so they do not clash)."""
    out = []
    for entry in kind.render_config(topo)["nodes"]:
        if entry["role"] != "worker":
            continue
        registration = yaml.safe_load(entry["kubeadmConfigPatches"][0])["nodeRegistration"]
        name = prefix + registration["name"]
        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                  **entry.get("labels", {})}
        out.append({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
                    "spec": {"taints": registration.get("taints", [])}})
    return out


@pytest.mark.parametrize("topology_file", ["default.yaml", "mixed-fleet.yaml"])
def test_nodes_of_the_kind_config_pass_a_dry_run(kube, topology_file: str) -> None:
    """Each Node as its kubelet registers it, then with the labels gpulab adds after creation."""
    topo = topology.load(topology.default_path().with_name(topology_file))
    prefix = f"dry-{uuid.uuid4().hex[:6]}-"
    after = kind.admin_labels(topo)
    for spec, node in zip(topo.nodes, _registered_nodes(topo, prefix)):
        labelled = copy.deepcopy(node)
        labelled["metadata"]["labels"].update(after.get(spec.name, {}))
        for obj in (node, labelled):
            try:
                _create_dry_run(kube, obj)
            except api.ApiError as e:
                pytest.fail(f"node {spec.name}: {e}")


def test_daemonsets_schedule_onto_exactly_the_gpu_nodes(kube, ns, cluster) -> None:
    """The real DaemonSet controller and scheduler place the kind stack's pods.

    On this backend a container with a command really runs on the host, and
    the node agent already runs the operator's device plugin on these nodes;
    a second one would register with the same simulated kubelet. So the copies
    here run ``sleep``: placement (node selector, tolerations, priority class,
    service account, volumes) is what is under test.
    """
    topo = cluster.topology()
    gpu_nodes = {n.name for n in topo.gpu_nodes}
    assert gpu_nodes
    kube.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "gpulab-fakegpu", "namespace": ns}})
    created = []
    try:
        for doc in kind.stack_documents():
            if doc["kind"] != "DaemonSet":
                continue
            ds = copy.deepcopy(doc)
            ds["metadata"]["namespace"] = ns
            pod = ds["spec"]["template"]["spec"]
            for c in pod.get("initContainers", []) + pod["containers"]:
                c["command"] = ["sh", "-c", "sleep 3600"]
                c.pop("readinessProbe", None)
            kube.create(ds)
            created.append(ds["metadata"]["name"])
        for name in created:
            def placed(name: str = name) -> set[str] | None:
                pods = kube.list("Pod", ns, label_selector=f"app={name}")
                nodes = {p["spec"].get("nodeName") for p in pods}
                return nodes if nodes == gpu_nodes else None

            wait_for(placed, 60, what=f"daemonset {name}'s pods on {sorted(gpu_nodes)}")
            ds = kube.get("DaemonSet", name, ns)
            assert ds["status"]["desiredNumberScheduled"] == len(gpu_nodes), name
    finally:
        for name in created:
            kube.delete("DaemonSet", name, ns, propagation="Foreground")


# -- the image's components against the real apiserver, as the stack's service account ---------------


@pytest.fixture
def fake_gpu_node(kube) -> str:
    """A Node registered as a kind kubelet with the topology's labels would register it.

    Its operand deploy labels are "false", so the embedded GPU Operator's
    DaemonSets never target it (and the MIG manager's restore keeps them so).
    No KWOK annotation: nothing runs its pods, which no test here needs.
    """
    name = f"kind-gpu-{uuid.uuid4().hex[:6]}"
    labels = {"kubernetes.io/hostname": name, kind.FAKE_MODEL_LABEL: "h100-80gb", kind.FAKE_COUNT_LABEL: "2",
              **{k: "false" for k in migmod.CLIENT_DEPLOY_LABELS}}
    kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}})
    yield name
    kube.delete("Node", name)


@pytest.fixture
def stack_identity(kube, ns, cluster, tmp_path) -> Path:
    """A kubeconfig of the stack's ServiceAccount, bound to manifests/kind/10-rbac.yaml's ClusterRole (renamed)."""
    role = next(d for d in kind.stack_documents() if d["kind"] == "ClusterRole")
    role = {**role, "metadata": {"name": f"gpulab-fakegpu-{ns}"}}
    kube.create(role)
    kube.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "gpulab-fakegpu", "namespace": ns}})
    kube.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                 "metadata": {"name": role["metadata"]["name"]},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                             "name": role["metadata"]["name"]},
                 "subjects": [{"kind": "ServiceAccount", "name": "gpulab-fakegpu", "namespace": ns}]})
    token = kube.request("POST", f"/api/v1/namespaces/{ns}/serviceaccounts/gpulab-fakegpu/token",
                         {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                          "spec": {"expirationSeconds": 3600}})["status"]["token"]
    # The admin kubeconfig's cluster entry (server, CA), with the service account's token.
    cluster_entry = yaml.safe_load(cluster.kubeconfig.read_text())["clusters"][0]
    path = tmp_path / "stack.kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [cluster_entry], "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": cluster_entry["name"], "user": "sa"}}]}))
    yield path
    kube.delete("ClusterRoleBinding", role["metadata"]["name"])
    kube.delete("ClusterRole", role["metadata"]["name"])


def _labels(kube, node: str) -> dict[str, str]:
    return (kube.get("Node", node) or {}).get("metadata", {}).get("labels") or {}


def test_gfd_config_manager_and_mig_manager_work_with_the_stacks_rbac(kube, ns, fake_gpu_node, stack_identity,
                                                                     tmp_path) -> None:
    """The daemons as real processes, with only the ClusterRole the kind stack grants them."""

    host = tmp_path / "host"
    config = tmp_path / "config" / "config.yaml"
    kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "time-slicing-config", "namespace": ns},
                 "data": {"any": "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
                                 "    - name: nvidia.com/gpu\n      replicas: 4\n"}})
    common = ["--node", fake_gpu_node, "--kubeconfig", str(stack_identity), "--poll-interval", "0.2"]
    procs = []

    def start(*args: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", "gpulab.fakegpu.daemon", *args, *common],
                                stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        return proc

    try:
        start("gfd", "--host-dir", str(host), "--config-file", str(config), "--mig-strategy", "single")
        wait_for(lambda: _labels(kube, fake_gpu_node).get("nvidia.com/gpu.product") == "NVIDIA-H100-80GB-HBM3",
                 30, what="GFD's product label")
        assert _labels(kube, fake_gpu_node)["nvidia.com/gpu.count"] == "2"

        # config-manager picks the labelled config from the ConfigMap; GFD then labels the sharing.
        start("config-manager", "--configmap", "time-slicing-config", "--namespace", ns, "--dst", str(config))
        kube.patch("Node", fake_gpu_node, {"metadata": {"labels": {"nvidia.com/device-plugin.config": "any"}}})
        wait_for(lambda: config.is_file() and "replicas: 4" in config.read_text(), 30, what="the chosen config")
        wait_for(lambda: _labels(kube, fake_gpu_node).get("nvidia.com/gpu.replicas") == "4", 30,
                 what="GFD's replicas label")

        # mig-manager applies a MIG layout; GFD sees the new geometry.
        config.unlink()
        start("mig-manager", "--host-dir", str(host), "--namespace", ns)
        kube.patch("Node", fake_gpu_node, {"metadata": {"labels": {migmod.MIG_CONFIG_LABEL: "all-1g.10gb"}}})
        wait_for(lambda: _labels(kube, fake_gpu_node).get(migmod.MIG_CONFIG_STATE_LABEL) == migmod.STATE_SUCCESS,
                 60, what="mig.config.state=success")
        assert "all-1g.10gb" in (host / "gpu" / "hardware.json").read_text()
        wait_for(lambda: _labels(kube, fake_gpu_node).get("nvidia.com/gpu.product")
                 == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", 30, what="GFD's MIG product label")
        assert all(_labels(kube, fake_gpu_node)[k] == "false" for k in migmod.CLIENT_DEPLOY_LABELS)
        for proc in procs:
            assert proc.poll() is None, proc.communicate(timeout=5)[1]
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
