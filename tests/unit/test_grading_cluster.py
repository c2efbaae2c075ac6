"""The cluster side of grading without a cluster: lab specs, identities, restoring cluster-wide state."""

from __future__ import annotations

import types

import pytest

from gpulab.kube import api
from gpulab.grading import grader
from gpulab.grading.checks import CheckLoadError
from gpulab.cluster.baseline import ClusterState
from gpulab.grading.cluster import (
    POD_LOG,
    ClusterCollector,
    ClusterSandbox,
    LabEnv,
    LabSpec,
    delete_leftovers,
    gpu_usage,
    learner_user,
    load_lab_spec,
    normalize,
)
from grading_support import FakeClient


def node(name, labels=None, taints=None, gpus=None, annotations=None):
    obj = {"kind": "Node", "metadata": {"name": name, "labels": dict(labels or {}),
                                        "annotations": dict(annotations or {"kwok.x-k8s.io/node": "fake"})},
           "spec": {}, "status": {"allocatable": {}}}
    if taints:
        obj["spec"]["taints"] = taints
    if gpus:
        obj["status"]["allocatable"]["nvidia.com/gpu"] = str(gpus)
    return obj


def pc(name, value):
    return {"kind": "PriorityClass", "apiVersion": "scheduling.k8s.io/v1", "metadata": {"name": name, "uid": "x"},
            "value": value}


def test_lab_specs_are_read_from_the_check_modules():
    lab03 = load_lab_spec("03")
    assert lab03.lab == "03-taints-tolerations" and lab03.number == "03" and lab03.cluster_wide
    assert lab03.node_taints == ("nvidia.com/gpu",) and lab03.node_labels == ("node-role.kubernetes.io/ai",)
    lab07 = load_lab_spec("07-quota-priority")
    assert lab07.namespace_names("grade-07-amy") == ["grade-07-amy", "grade-07-amy-team-a", "grade-07-amy-team-b"]
    assert lab07.namespace_room == 63 - len("-team-a") and lab07.gpus_free == 2
    lab05 = load_lab_spec("lab_05")
    assert lab05.logs and not lab05.cluster_wide and lab05.cell_timeout == 150


def test_cluster_rules_without_cluster_wide_are_refused():
    module = types.ModuleType("gpulab_fake_lab_09")
    module.LAB = "09-bad"
    module.CLUSTER_RULES = ({"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]},)
    with pytest.raises(CheckLoadError, match="need CLUSTER_WIDE"):
        LabSpec.from_module(module)
    module.CLUSTER_WIDE, module.NAMESPACES = True, ("Team_A",)
    with pytest.raises(CheckLoadError, match="short DNS label"):
        LabSpec.from_module(module)


def test_setup_and_teardown_hooks_are_read_and_need_cluster_wide():
    module = types.ModuleType("gpulab_fake_lab_09")
    module.LAB, module.SETUP, module.TEARDOWN = "09-hooks", (lambda env: []), (lambda env: None)
    with pytest.raises(CheckLoadError, match="SETUP/TEARDOWN need CLUSTER_WIDE"):
        LabSpec.from_module(module)
    module.CLUSTER_WIDE = True
    spec = LabSpec.from_module(module)
    assert spec.setup is module.SETUP and spec.teardown is module.TEARDOWN
    assert spec == LabSpec.from_module(module)  # hooks take no part in equality
    module.SETUP = "break it"
    with pytest.raises(CheckLoadError, match="SETUP must be a function"):
        LabSpec.from_module(module)
    lab02 = load_lab_spec("02")
    assert lab02.cluster_wide and lab02.setup is not None and lab02.teardown is not None


def _hooked_sandbox(monkeypatch, setup, teardown, calls, work_dir):
    spec = LabSpec("09-hooks", "09", cluster_wide=True, setup=setup, teardown=teardown)
    client = FakeClient([node("gpu-node-1", gpus=2)])
    sandbox = ClusterSandbox(client, None, "https://127.0.0.1:1", spec, work_dir=work_dir)
    for piece in ("_ensure_cluster_roles", "_check_gpus"):
        monkeypatch.setattr(sandbox, piece, lambda *a: None)
    monkeypatch.setattr(sandbox, "_fresh_namespace", lambda ns, learner: client.create(
        {"kind": "Namespace", "metadata": {"name": ns}}))
    monkeypatch.setattr(sandbox, "_bind_namespace", lambda ns, user: None)
    monkeypatch.setattr(sandbox, "_write_kubeconfig", lambda ns, user, path: calls.append(("kubeconfig", ns)))
    return sandbox, client


def test_setup_runs_last_in_prepare_and_its_objects_reach_the_collector_only(monkeypatch, tmp_path):
    calls = []

    def setup(env):
        assert isinstance(env, LabEnv) and env.namespace == "grade-09-amy" and env.learner == "amy"
        calls.append(("setup", env.namespace))
        taint = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}
        env.client.patch("Node", "gpu-node-1", {"spec": {"taints": [taint]}})
        return [{"kind": "InjectedFault", "metadata": {"name": "gpu-node-1"}, "layer": "driver"}]

    sandbox, client = _hooked_sandbox(monkeypatch, setup, lambda env: calls.append(("teardown", env.namespace)),
                                      calls, tmp_path)
    sandbox.prepare("grade-09-amy", "amy")
    assert calls == [("setup", "grade-09-amy"), ("kubeconfig", "grade-09-amy")]
    found = ClusterCollector(client, sandbox.spec, cluster_kinds=(), extra=sandbox.injected).collect("grade-09-amy")
    assert found["InjectedFault"] == [{"kind": "InjectedFault", "metadata": {"name": "gpu-node-1"}, "layer": "driver"}]
    sandbox.release("grade-09-amy")
    assert calls[-1] == ("teardown", "grade-09-amy")
    assert sandbox.injected("grade-09-amy") == {}
    # The hook's taint is undone with the rest of the cluster-wide state.
    assert client.get("Node", "gpu-node-1")["spec"].get("taints") is None
    assert client.get("Namespace", "grade-09-amy") is None


def test_teardown_runs_when_setup_fails_and_release_finishes_when_teardown_fails(monkeypatch, tmp_path):
    calls = []

    def broken_setup(env):
        calls.append("setup")
        raise RuntimeError("fault injection timed out")

    sandbox, client = _hooked_sandbox(monkeypatch, broken_setup, lambda env: calls.append("teardown"), calls, tmp_path)
    with pytest.raises(RuntimeError, match="timed out"):
        sandbox.prepare("grade-09-amy", "amy")
    assert calls == ["setup", "teardown"] and client.get("Namespace", "grade-09-amy") is None

    def broken_teardown(env):
        raise RuntimeError("repair timed out")

    sandbox, client = _hooked_sandbox(monkeypatch, lambda env: None, broken_teardown, calls, tmp_path)
    sandbox.prepare("grade-09-bo", "bo")
    with pytest.raises(RuntimeError, match="repair timed out"):
        sandbox.release("grade-09-bo")
    assert client.get("Namespace", "grade-09-bo") is None


def test_learner_identities_fit_a_certificate_and_namespaces_fit_their_suffixes():
    assert learner_user("amy") == "gpulab-grader:amy"
    long = learner_user("x" * 80)
    assert len(long) <= 64 and long.startswith("gpulab-grader:x") and long != learner_user("x" * 81)
    spec = load_lab_spec("07")
    name = grader.namespace_for(spec)("07", "A Very Long Learner Name With Spaces And Ünïcode " * 2)
    assert len(name) <= spec.namespace_room and all(len(n) <= 63 for n in spec.namespace_names(name))
    assert grader.namespace_for(spec)("07", "amy") == "grade-07-amy"
    assert grader.namespace_for(spec, "check")("07", "amy") == "check-07-amy"


def test_restore_puts_back_labels_taints_cordon_and_priority_classes():
    before = [node("gpu-node-1", {"kubernetes.io/hostname": "gpu-node-1", "gfd": "1"}, gpus=2), node("cpu-node-1"),
              pc("system-node-critical", 2000001000), pc("kept", 5)]
    client = FakeClient(before)
    state = ClusterState.capture(client)
    # What a submission with node and PriorityClass rights might leave behind:
    client.patch("Node", "gpu-node-1", {"metadata": {"labels": {"node-role.kubernetes.io/ai": "true", "gfd": None},
                                                     "annotations": {"kwok.x-k8s.io/node": None}},
                                        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "true",
                                                             "effect": "NoSchedule"}], "unschedulable": True}})
    client.create(pc("training-critical", 100000))
    client.delete("PriorityClass", "kept")
    client.calls.clear()
    changed = state.restore(client)
    assert changed == ["node/gpu-node-1", "priorityclass/training-critical deleted", "priorityclass/kept restored"]
    after = ClusterState.capture(client)
    assert after == state
    # cpu-node-1 was untouched, so it is not patched at all.
    assert [c for c in client.calls if c[0] == "patch" and c[2] == "cpu-node-1"] == []
    assert client.get("PriorityClass", "kept")["metadata"] == {"name": "kept"}


def test_normalize_sets_the_labs_keys_to_the_topology_and_removes_its_priority_classes():
    spec = load_lab_spec("03")
    client = FakeClient([
        node("gpu-node-1", {"node-role.kubernetes.io/ai": "true", "other": "kept"},
             taints=[{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"},
                     {"key": "dedicated", "value": "x", "effect": "NoSchedule"}]),
        pc("training-critical", 1)])
    baseline = {"gpu-node-1": {"labels": {"other": "kept"}, "taints": []}}
    normalize(client, spec, baseline)
    gpu = client.get("Node", "gpu-node-1")
    assert gpu["metadata"]["labels"] == {"other": "kept"}
    assert gpu["spec"]["taints"] == [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]
    # Lab 03 declares no PriorityClasses; lab 07 does.
    assert client.get("PriorityClass", "training-critical") is not None
    normalize(client, load_lab_spec("07"), baseline)
    assert client.get("PriorityClass", "training-critical") is None


def test_gpu_usage_counts_bound_unfinished_pods():
    def pod(name, gpus, node_name, phase):
        return {"kind": "Pod", "metadata": {"name": name, "namespace": "t"},
                "spec": {"nodeName": node_name, "containers": [{"resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
                "status": {"phase": phase}}

    client = FakeClient([node("gpu-node-1", gpus=2), pod("a", 1, "gpu-node-1", "Running"),
                         pod("b", 1, "gpu-node-1", "Succeeded"), pod("c", 2, None, "Pending")])
    assert gpu_usage(client) == (1, ["t/a (1)"])


def test_collector_captures_namespaces_cluster_kinds_and_logs(monkeypatch):
    pod = {"kind": "Pod", "metadata": {"name": "train-x", "namespace": "ns-team-a", "managedFields": [{}]},
           "spec": {"initContainers": [{"name": "prep"}], "containers": [{"name": "train"}, {"name": "never"}]},
           "status": {"initContainerStatuses": [{"name": "prep", "state": {"terminated": {"exitCode": 0}}}],
                      "containerStatuses": [{"name": "train", "state": {"running": {}}},
                                            {"name": "never", "state": {"waiting": {"reason": "PodInitializing"}}}]}}
    client = FakeClient([pod, node("gpu-node-1", gpus=2)])
    spec = LabSpec("07-x", "07", namespaces=("team-a",), logs=True)
    fetched = []

    def fake_text(_client, path, query=None, timeout=10):
        fetched.append((path, query["container"]))
        return f"log of {query['container']}"

    monkeypatch.setattr("gpulab.grading.cluster.get_text", fake_text)
    found = ClusterCollector(client, spec).collect("ns")
    assert [p["metadata"]["name"] for p in found["Pod"]] == ["train-x"]
    assert "managedFields" not in found["Pod"][0]["metadata"] and found["Pod"][0]["apiVersion"] == "v1"
    assert [n["metadata"]["name"] for n in found["Node"]] == ["gpu-node-1"]
    assert found["Job"] == [] and found["PriorityClass"] == []
    assert [(log["container"], log["init"], log["log"]) for log in found[POD_LOG]] == [
        ("prep", True, "log of prep"), ("train", False, "log of train")]
    assert fetched[0][0] == api.Client.path("Pod", "train-x", "ns-team-a", "log")


def test_lab_of_notebook():
    assert grader.lab_of_notebook("labs/03-taints-tolerations.ipynb") == "03"
    with pytest.raises(grader.GradingError, match="starts with its number"):
        grader.lab_of_notebook("my-lab.ipynb")


def test_leftovers_of_an_interrupted_batch_are_found_by_label_and_prefix():
    def labelled(kind, name, namespace=None, grading=True):
        meta = {"name": name, "labels": {"gpulab.io/grading": "true"} if grading else {}}
        if namespace:
            meta["namespace"] = namespace
        return {"kind": kind, "metadata": meta}

    client = FakeClient([labelled("Namespace", "grade-03-amy"), labelled("Namespace", "grade-05-bo"),
                         labelled("Namespace", "grade-03-mine", grading=False),
                         labelled("Pod", "web", "grade-03-amy", grading=False),
                         labelled("ClusterRole", "gpulab:grading:grade-03-amy"),
                         labelled("ClusterRole", "gpulab:grading:read-nodes")])
    gone = delete_leftovers(client, "grade-03-")
    assert gone == ["namespace/grade-03-amy", "clusterrole/gpulab:grading:grade-03-amy"]
    assert client.get("Namespace", "grade-03-mine") and client.get("Namespace", "grade-05-bo")
    assert client.get("Pod", "web", "grade-03-amy") is None
    assert client.get("ClusterRole", "gpulab:grading:read-nodes")
