"""Grading journals without a cluster: writing and reading them, who owns one, what recovery puts back."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time

import pytest

from gpulab.fakegpu import faults
from gpulab.cluster import baseline
from gpulab.grading import journal
from gpulab.cluster.baseline import ClusterState
from gpulab.grading.cluster import ClusterSandbox, LabSpec, granted_namespaces, load_lab_spec, restore_journal
from gpulab.cluster.baseline import Restored
from gpulab.grading.journal import Journal, JournalError, Owner
from grading_support import FakeClient, apply_merge_patch


TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}


def node(name, labels=None, taints=None, gpus=2):
    obj = {"kind": "Node", "metadata": {"name": name, "labels": dict(labels or {}), "annotations": {}},
           "spec": {}, "status": {"capacity": {"nvidia.com/gpu": str(gpus)},
                                  "allocatable": {"nvidia.com/gpu": str(gpus)}}}
    if taints:
        obj["spec"]["taints"] = taints
    return obj


def dead_owner() -> Owner:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return Owner(proc.pid, time.time() - 5, "gpulab grade subs --lab 02", "")


def open_journal(root, client, namespace="grade-02-amy", owner=None, changes=("nodes", "priority-classes", "faults"),
                 faults_before=None, **extra):
    before = ClusterState.capture(client).to_dict()
    if faults_before is not None:
        before["faults"] = faults_before
    return Journal.open(root, lab="02-layered-verification", namespace=namespace, learner="amy",
                        namespaces=[namespace], changes=changes, before=before, owner=owner or dead_owner(),
                        cluster_uid=extra.get("cluster_uid"), cleanup=extra.get("cleanup"))


# --------------------------------------------------------------------------- owners


def test_this_process_is_alive_and_a_reused_or_finished_pid_is_not():
    me = Owner.current()
    assert me.pid == os.getpid() and me.alive() and me.host
    # The same pid with another start time: the system gave the pid to a new process.
    assert not Owner(me.pid, me.started - 3600, me.command, me.host).alive()
    assert not dead_owner().alive()


def test_a_killed_but_unreaped_grader_is_dead():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        import psutil

        owner = Owner(proc.pid, psutil.Process(proc.pid).create_time(), "gpulab grade", "")
        assert owner.alive()
        proc.kill()
        deadline = time.monotonic() + 10
        while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not owner.alive()  # a zombie: killed, its parent has not waited for it yet
    finally:
        proc.kill()
        proc.wait()


def test_an_owner_on_another_host_cannot_be_checked_and_counts_as_alive():
    assert Owner(1, 0.0, "gpulab grade", "some-other-host.invalid").alive()


# --------------------------------------------------------------------------- files


def test_a_journal_is_written_atomically_read_back_updated_and_removed(tmp_path):
    client = FakeClient([node("gpu-node-1", taints=[TAINT])])
    owner = Owner.current()
    record = open_journal(tmp_path, client, owner=owner, faults_before={}, cluster_uid="uid-1")
    assert record.path == tmp_path / "journal" / f"grade-02-amy.{os.getpid()}.json"
    assert [p.name for p in record.path.parent.iterdir()] == [record.path.name]  # no temporary file left
    data = json.loads(record.path.read_text())
    assert data["owner"]["pid"] == os.getpid() and data["owner"]["command"]
    assert data["lab"] == "02-layered-verification" and data["phase"] == "setup"
    assert data["before"]["nodes"]["gpu-node-1"]["taints"] == [TAINT] and data["before"]["faults"] == {}
    assert data["changes"] == ["nodes", "priority-classes", "faults"] and data["cluster_uid"] == "uid-1"
    record.update(phase="running", applied=[{"kind": "InjectedFault", "node": "gpu-node-1"}])
    again = journal.read(record.path)
    assert again.record["phase"] == "running" and again.owner == owner
    found, bad = journal.pending(tmp_path)
    assert [j.path for j in found] == [record.path] and bad == []
    record.close()
    assert journal.pending(tmp_path) == ([], [])


def test_unreadable_journals_are_reported_and_newest_come_first(tmp_path):
    client = FakeClient([node("gpu-node-1")])
    older = open_journal(tmp_path, client, "grade-02-a")
    newer = open_journal(tmp_path, client, "grade-02-b")
    newer.update(opened=older.record["opened"] + 10)
    (tmp_path / "journal" / "junk.json").write_text("{not json")
    with pytest.raises(JournalError, match="junk.json"):
        journal.read(tmp_path / "journal" / "junk.json")
    found, bad = journal.pending(tmp_path)
    assert [j.record["namespace"] for j in found] == ["grade-02-b", "grade-02-a"]
    assert [p.name for p, _ in bad] == ["junk.json"]


def test_hooks_declare_what_they_change():
    with pytest.raises(ValueError, match="unknown change"):
        journal.declare("etcd")
    assert journal.declared(lambda env: None) == tuple(journal.CHANGES)  # nothing declared: everything
    assert journal.declared(None) == journal.ALWAYS
    assert load_lab_spec("02").changes == ("nodes", "priority-classes", "faults")
    assert load_lab_spec("08").changes == ("nodes", "priority-classes", "faults")
    assert load_lab_spec("04").changes == ("nodes", "priority-classes", "gpu-stack")
    assert load_lab_spec("03").changes == ("nodes", "priority-classes")  # the learner's own node changes
    assert load_lab_spec("05").changes == ()


# --------------------------------------------------------------------------- recovery


def test_recover_restores_dead_owners_leaves_living_ones_and_keeps_failed_ones(tmp_path, monkeypatch):
    client = FakeClient([node("gpu-node-1")])
    dead = open_journal(tmp_path, client, "grade-02-dead")
    living = open_journal(tmp_path, client, "check-02-alive", owner=Owner.current())
    failing = open_journal(tmp_path, client, "grade-02-fails")
    seen = []

    def restore(_client, record):
        seen.append(record.record["namespace"])
        if record.record["namespace"] == "grade-02-fails":
            exc = RuntimeError("timed out waiting for every GPU allocatable again")
            exc.restored = [Restored("namespace", "grade-02-fails", "deleted")]
            raise exc
        return [Restored("fault", "gpu-node-1", "cleared", "gpu-unhealthy (GPU 1)"),
                Restored("taint", "gpu-node-1", "removed", "nvidia.com/gpu=true:NoSchedule")]

    outcomes = {o.journal.record["namespace"]: o for o in journal.recover(tmp_path, client, restore)}
    assert sorted(seen) == ["grade-02-dead", "grade-02-fails"]
    assert {ns: o.status for ns, o in outcomes.items()} == {
        "grade-02-dead": "restored", "check-02-alive": "alive", "grade-02-fails": "failed"}
    assert not dead.path.exists() and living.path.exists() and failing.path.exists()

    en = outcomes["grade-02-dead"].lines()
    assert en[0].startswith("an interrupted grader (pid ") and "gpulab grade subs --lab 02" in en[0]
    assert en[1:] == ["  gpu-node-1: fault gpu-unhealthy (GPU 1) cleared",
                      "  gpu-node-1: taint nvidia.com/gpu=true:NoSchedule removed"]
    assert "still running" in outcomes["check-02-alive"].lines()[0]
    failed = outcomes["grade-02-fails"].lines()
    assert "could not finish restoring" in failed[0] and "timed out" in failed[0] and "gpulab reset" in failed[0]
    assert failed[1] == "  restored so far: namespace grade-02-fails deleted"
    monkeypatch.setenv("LANGUAGE", "zh_CN")  # as in a lesson (gpulab/i18n.py)
    zh = outcomes["grade-02-dead"].lines()
    assert "被中断" in zh[0] and "grade-02-dead" in zh[0] and "gpulab grade subs --lab 02" in zh[0]
    assert zh[1:] == ["  ↩ gpu-node-1：清除了故障 gpu-unhealthy (GPU 1)",
                      "  ↩ gpu-node-1：污点 nvidia.com/gpu=true:NoSchedule 已去掉"]
    assert "仍在运行" in outcomes["check-02-alive"].lines()[0]
    assert outcomes["grade-02-fails"].lines()[1] == "  ↩ 删除了评分用的命名空间 grade-02-fails"


def test_a_journal_from_before_a_reset_is_dropped(tmp_path):
    client = FakeClient([node("gpu-node-1"), {"kind": "Namespace", "metadata": {"name": "kube-system", "uid": "new"}}])
    old = open_journal(tmp_path, client, cluster_uid="old")
    outcomes = journal.recover(tmp_path, client, lambda *_: pytest.fail("nothing to restore on a reset cluster"))
    assert [o.status for o in outcomes] == ["stale"] and not old.path.exists()


def test_restore_journal_puts_back_faults_taints_labels_and_priority_classes(tmp_path, monkeypatch):
    pc = {"kind": "PriorityClass", "apiVersion": "scheduling.k8s.io/v1", "metadata": {"name": "kept"}, "value": 5}
    client = FakeClient([node("gpu-node-1", {"gfd": "1"}), node("cpu-node-1", gpus=0), pc])
    monkeypatch.setattr(baseline, "gpu_nodes", lambda root: {"gpu-node-1": 2})
    monkeypatch.setattr(faults, "wait_applied", lambda *a, **k: True)
    monkeypatch.setattr(baseline.operator, "stack_ready", lambda client: None)
    record = open_journal(tmp_path, client, faults_before=faults.snapshot(tmp_path, ["gpu-node-1"]),
                          cleanup={"cluster_binding": "gpulab:grading:grade-02-amy"})
    # What SETUP and the run did before the grader was killed:
    faults.inject(tmp_path, {"gpu-node-1": 2}, "gpu-node-1", "gpu-unhealthy", 1)
    client.patch("Node", "gpu-node-1", {"metadata": {"labels": {"gfd": None, "node-role.kubernetes.io/ai": "true"}},
                                        "spec": {"taints": [TAINT]}})
    client.create({"kind": "PriorityClass", "metadata": {"name": "training-critical"}, "value": 100})
    client.create({"kind": "Namespace", "metadata": {"name": "grade-02-amy"}})
    client.create({"kind": "Pod", "metadata": {"name": "gpu-check", "namespace": "grade-02-amy"}})
    client.create({"kind": "ClusterRole", "metadata": {"name": "gpulab:grading:grade-02-amy"}})
    done = [r.text() for r in restore_journal(client, record, timeout=1)]
    assert done == [
        "namespace grade-02-amy deleted",
        "ClusterRole gpulab:grading:grade-02-amy deleted",
        "gpu-node-1: fault gpu-unhealthy (GPU 1) cleared",
        "gpu-node-1: label gfd=1 restored",
        "gpu-node-1: label node-role.kubernetes.io/ai removed",
        "gpu-node-1: taint nvidia.com/gpu=true:NoSchedule removed",
        "PriorityClass training-critical deleted",
    ]
    assert faults.list_all(tmp_path, ["gpu-node-1"]) == []
    before = record.record["before"]
    assert ClusterState.capture(client).to_dict() == {k: before[k] for k in ("nodes", "priority_classes")}
    gpu = client.get("Node", "gpu-node-1")
    assert gpu["metadata"]["labels"] == {"gfd": "1"} and "taints" not in gpu["spec"]
    assert client.get("PriorityClass", "training-critical") is None and client.get("PriorityClass", "kept")
    assert client.list("Pod", "grade-02-amy") == []
    # Nothing left to do: a second restore changes nothing.
    assert restore_journal(client, record, timeout=1) == []


def test_restore_journal_puts_the_monitoring_add_on_back_and_takes_the_grants(tmp_path, monkeypatch):
    """Lab 09's run was killed: its namespace and its Role in monitoring go, the add-on is put back as installed."""
    client = FakeClient([node("gpu-node-1")])
    put_back = []
    monkeypatch.setattr(baseline, "addon_back", lambda kubeconfig, name: put_back.append((kubeconfig, name)) or
                        [Restored("configmap", "monitoring/adapter-config", "installed", name)])
    record = open_journal(tmp_path, client, "grade-09-amy", changes=("nodes", "priority-classes", "monitoring"),
                          cleanup={"cluster_binding": None, "grants": ["monitoring"]})
    client.create({"kind": "Namespace", "metadata": {"name": "grade-09-amy"}})
    for kind in ("Role", "RoleBinding"):
        client.create({"kind": kind, "metadata": {"name": "gpulab:grading:grade-09-amy", "namespace": "monitoring"}})
    done = restore_journal(client, record, timeout=1)
    assert [r.text() for r in done] == [
        "namespace grade-09-amy deleted",
        "ConfigMap monitoring/adapter-config as installed (add-on monitoring); its program reloaded or restarted"]
    monkeypatch.setenv("LANGUAGE", "zh_CN")  # as in a lesson (gpulab/i18n.py)
    assert "恢复为安装时的配置" in done[1].text()
    assert put_back == [(tmp_path / "kubeconfig", "monitoring")]
    assert client.list("Role", "monitoring") == client.list("RoleBinding", "monitoring") == []


def test_the_journal_names_the_namespaces_a_lab_grants_in():
    assert granted_namespaces(("nodes", "gpu-stack")) == ["default", "gpu-operator"]
    assert granted_namespaces(("monitoring",)) == ["monitoring"]
    assert granted_namespaces(("faults", "nodes")) == []
    assert journal.declared(load_lab_spec("09").setup) == ("nodes", "priority-classes", "monitoring")


def test_faults_are_snapshotted_and_put_back_keeping_what_was_there(tmp_path):
    gpus = {"gpu-node-1": 2, "gpu-node-2": 2}
    manual = faults.inject(tmp_path, gpus, "gpu-node-2", "cuda-driver-too-old")
    snap = faults.snapshot(tmp_path, sorted(gpus))
    assert list(snap) == ["gpu-node-2"] and snap["gpu-node-2"][0]["kind"] == "cuda-driver-too-old"
    faults.clear(tmp_path, sorted(gpus))
    faults.inject(tmp_path, gpus, "gpu-node-1", "device-plugin-down")
    changed = faults.put_back(tmp_path, snap, sorted(gpus))
    assert [(n, a, f.kind) for n, a, f in changed] == [("gpu-node-1", "cleared", "device-plugin-down"),
                                                       ("gpu-node-2", "set", "cuda-driver-too-old")]
    assert faults.list_all(tmp_path, sorted(gpus)) == [("gpu-node-2", manual)]  # its `since` too
    assert faults.put_back(tmp_path, snap, sorted(gpus)) == []


def test_the_sandbox_journals_before_setup_and_removes_the_journal_after_teardown(tmp_path, monkeypatch):
    seen = {}

    @journal.declare("faults", "nodes")
    def setup(env):
        (path,) = (tmp_path / "journal").glob("*.json")
        seen["before"] = json.loads(path.read_text())
        env.client.patch("Node", "gpu-node-1", {"spec": {"taints": [TAINT]}})
        return [{"kind": "InjectedFault", "metadata": {"name": "gpu-node-1"}}]

    def teardown(env):
        (path,) = (tmp_path / "journal").glob("*.json")
        seen["during"] = json.loads(path.read_text())
        if seen.get("fail"):
            raise RuntimeError("repair timed out")

    spec = LabSpec("09-hooks", "09", cluster_wide=True, setup=setup, teardown=teardown)
    client = FakeClient([node("gpu-node-1")])
    monkeypatch.setattr(baseline, "gpu_nodes", lambda root: {"gpu-node-1": 2})
    sandbox = ClusterSandbox(client, None, "https://127.0.0.1:1", spec, cluster_root=tmp_path, work_dir=tmp_path / "work")
    for piece in ("_ensure_cluster_roles", "_check_gpus"):
        monkeypatch.setattr(sandbox, piece, lambda *a: None)
    monkeypatch.setattr(sandbox, "_fresh_namespace", lambda ns, learner: client.create(
        {"kind": "Namespace", "metadata": {"name": ns}}))
    monkeypatch.setattr(sandbox, "_bind_namespace", lambda ns, user: None)
    monkeypatch.setattr(sandbox, "_write_kubeconfig", lambda ns, user, path: None)

    sandbox.prepare("grade-09-amy", "amy")
    before = seen["before"]
    assert before["phase"] == "setup" and before["owner"]["pid"] == os.getpid()
    assert before["changes"] == ["nodes", "priority-classes", "faults"]
    assert before["before"]["nodes"]["gpu-node-1"]["taints"] == [] and before["before"]["faults"] == {}
    sandbox.release("grade-09-amy")
    assert seen["during"]["phase"] == "running" and seen["during"]["applied"][0]["kind"] == "InjectedFault"
    assert list((tmp_path / "journal").glob("*.json")) == []

    # A TEARDOWN that fails leaves the journal for the next command to finish the job.
    seen["fail"] = True
    sandbox.prepare("grade-09-bo", "bo")
    with pytest.raises(RuntimeError, match="repair timed out"):
        sandbox.release("grade-09-bo")
    assert [p.name for p in (tmp_path / "journal").glob("*.json")] == [f"grade-09-bo.{os.getpid()}.json"]


# --------------------------------------------------------------------------- no GET-then-PUT


def test_merge_patch_turns_one_spec_into_another():
    have = {"devicePlugin": {"config": {"name": "ts", "default": "any"}, "enabled": True}, "mig": {"strategy": "mixed"},
            "extra": [1, 2]}
    want = {"devicePlugin": {"config": {}, "enabled": True}, "mig": {"strategy": "single"}}
    patch = baseline.merge_patch(have, want)
    assert patch == {"devicePlugin": {"config": {"name": None, "default": None}}, "mig": {"strategy": "single"},
                     "extra": None}
    merged = copy.deepcopy(have)
    apply_merge_patch(merged, patch)
    assert merged == want
    assert baseline.merge_patch(want, want) == {}


def test_the_cluster_policy_is_restored_with_a_patch_never_a_put():
    policy = {"kind": "ClusterPolicy", "metadata": {"name": "cluster-policy", "resourceVersion": "7"},
              "spec": {"mig": {"strategy": "mixed"}}, "status": {"state": "ready"}}
    client = FakeClient([policy])  # FakeClient has no request(): a PUT would fail here
    assert baseline.put_policy_spec(client, {"mig": {"strategy": "single"}})
    assert client.calls == [("patch", "ClusterPolicy", "cluster-policy", {"spec": {"mig": {"strategy": "single"}}})]
    assert not baseline.put_policy_spec(client, {"mig": {"strategy": "single"}})
    assert client.get("ClusterPolicy", "cluster-policy")["status"] == {"state": "ready"}


def test_check_grade_and_up_say_what_they_restored_before_they_start(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from gpulab import cli
    from gpulab.grading import cluster as grading_cluster
    from gpulab.grading import grader

    monkeypatch.setenv("GPULAB_HOME", str(tmp_path / "home"))
    client = FakeClient([node("gpu-node-1")])
    dead = open_journal(tmp_path, client)
    outcome = journal.Outcome(dead, "restored", [Restored("fault", "gpu-node-1", "cleared", "no-devices")])
    calls = []
    monkeypatch.setattr(grading_cluster, "recover", lambda cluster: calls.append(cluster) or [outcome])

    def not_now(*_a, **_k):
        raise grader.GradingError("stop here")

    monkeypatch.setattr(grader, "grade_submissions", not_now)
    monkeypatch.setattr(grader, "check_notebook", not_now)
    notebook = tmp_path / "02-layered-verification.ipynb"
    notebook.write_text("{}")
    for args in (["grade", str(tmp_path), "--lab", "02"], ["check", str(notebook)]):
        result = CliRunner().invoke(cli.main, args)
        assert "gpulab: an interrupted grader (pid " in result.output, result.output
        assert "  gpu-node-1: fault no-devices cleared" in result.output
        assert "stop here" in result.output
    assert len(calls) == 2
