"""Every lab graded on the real cluster, as ``gpulab grade`` does it.

Per lab one batch: the solution (full marks), the untouched generated lab
(zero, with a message for every check) and two submissions with typical
mistakes, made from the solution by a small edit, whose partial scores are
asserted check by check. Then: hostile submissions are contained, grading the
same folder twice gives the same gradebook, and cluster-wide labs leave the
cluster as they found it. Each notebook run costs seconds, so the batches are
shared by the tests of their lab.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from gpulab.grading.gradebook import read_gradebook
from lab_support import (HIDDEN, REPO, assert_no_grading_leftovers, assert_untouched_scores_zero,
                         from_solution, grade, untouched)

pytestmark = pytest.mark.cluster

# --------------------------------------------------------------------------- lab 01


LAB01 = "01-gpu-pod-spec"


@pytest.fixture(scope="module")
def lab01_subs():
    return {
        "alice": from_solution(LAB01),
        "bob": untouched(LAB01),
        # Card counts kept as the strings allocatable holds; requests raised to match limits of 2;
        # rules B and C swapped.
        "carol": from_solution(
            LAB01,
            ('gpu_nodes[node["metadata"]["name"]] = int(count)', 'gpu_nodes[node["metadata"]["name"]] = count'),
            ("requests:\n          nvidia.com/gpu: 1\n        limits:\n          nvidia.com/gpu: 1",
             "requests:\n          nvidia.com/gpu: 2\n        limits:\n          nvidia.com/gpu: 2"),
            ('"gpu-unequal": "C", "gpu-request-only": "B"', '"gpu-unequal": "B", "gpu-request-only": "C"')),
        # Counts every node (with 0 for CPU nodes) and "fixes" half a GPU by rounding down to 0.
        "dave": from_solution(
            LAB01,
            ('    if count is not None and int(count) > 0:\n        gpu_nodes[node["metadata"]["name"]] = int(count)\n'
             'gpu_node_count = len(gpu_nodes)',
             '    gpu_nodes[node["metadata"]["name"]] = int(count or 0)\ngpu_node_count = len(nodes["items"])'),
            ('echo gpu-half ready"]\n      # BEGIN SOLUTION\n      resources:\n        limits:\n          nvidia.com/gpu: 1',
             'echo gpu-half ready"]\n      # BEGIN SOLUTION\n      resources:\n        limits:\n          nvidia.com/gpu: 0')),
    }


@pytest.fixture(scope="module")
def lab01(cluster, tmp_path_factory, lab01_subs):
    return grade(cluster, tmp_path_factory.mktemp("lab01"), "01", lab01_subs)


def test_lab01_scores(lab01):
    assert lab01.earned("alice") == {"gpu-node-count": 1, "gpu-per-node": 2, "rules-identified": 3,
                                     "fix-gpu-half": 2, "fix-gpu-unequal": 2, "fix-gpu-request-only": 2,
                                     "fixed-pods-on-gpu-node": 1, "gpu-nodes-are-integers": 1}
    assert lab01.rows["alice"].total == 14 and lab01.rows["alice"].status == "ok"
    assert_untouched_scores_zero(lab01)
    assert "gpu_nodes 是空的" in lab01.message("bob", "gpu-per-node")
    assert "还没有作答" in lab01.message("bob", "rules-identified")
    assert "没有申请任何 GPU" in lab01.message("bob", "fix-gpu-half")

    assert lab01.earned("carol") == {"gpu-node-count": 1, "gpu-per-node": 2, "rules-identified": 1,
                                     "fix-gpu-half": 2, "fix-gpu-unequal": 1, "fix-gpu-request-only": 2,
                                     "fixed-pods-on-gpu-node": 1, "gpu-nodes-are-integers": 0}
    rules = lab01.message("carol", "rules-identified")
    assert "gpu-unequal 的判断不对" in rules and "gpu-request-only 的判断不对" in rules and "gpu-half" not in rules
    assert "申请了 2 张卡" in lab01.message("carol", "fix-gpu-unequal")

    assert lab01.earned("dave") == {"gpu-node-count": 0, "gpu-per-node": 0, "rules-identified": 3,
                                    "fix-gpu-half": 0, "fix-gpu-unequal": 2, "fix-gpu-request-only": 2,
                                    "fixed-pods-on-gpu-node": 0.67, "gpu-nodes-are-integers": 1}
    assert "不要数节点标签" in lab01.message("dave", "gpu-node-count")
    assert "2 个并没有在 allocatable 里上报" in lab01.message("dave", "gpu-per-node")
    assert "不是正整数" in lab01.message("dave", "fix-gpu-half")


def test_feedback_never_reveals_hidden_checks(lab01):
    carol = lab01.feedback("carol")
    assert "隐藏检查 1：0 / 1 分。隐藏检查未通过。" in carol
    for secret in ("gpu_nodes 的值是整数", "gpu-nodes-are-integers", "not ints", "convert"):
        assert secret not in carol
    row = read_gradebook(lab01.gradebook)[0]
    assert "hidden:gpu-nodes-are-integers (1)" in row


def test_grading_twice_gives_the_same_gradebook(cluster, lab01, lab01_subs):
    again = grade(cluster, lab01.gradebook.parent.parent, "01", lab01_subs, out_name="again")
    # Same rows and scores; only the time each row was graded moves on.
    def rows(path):
        return [{k: v for k, v in row.items() if k != "graded-at"} for row in read_gradebook(path)]

    assert rows(again.gradebook) == rows(lab01.gradebook)
    for learner in lab01_subs:
        assert again.feedback(learner) == lab01.feedback(learner)


# --------------------------------------------------------------------------- lab 03


LAB03 = "03-taints-tolerations"


@pytest.fixture(scope="module")
def lab03(cluster, tmp_path_factory):
    return grade(cluster, tmp_path_factory.mktemp("lab03"), "03", {
        "alice": from_solution(LAB03),
        "bob": untouched(LAB03),
        # A toleration whose value does not match the taint; "yes, it attracts"; an explanation that
        # names taint and toleration but not who decides, or when.
        "carol": from_solution(
            LAB03,
            ("    - key: nvidia.com/gpu\n      operator: Exists\n      effect: NoSchedule",
             '    - key: nvidia.com/gpu\n      operator: Equal\n      value: "yes"\n      effect: NoSchedule'),
            ("toleration_attracts = False", "toleration_attracts = True"),
            ('explanation = ("GPU 节点带着 nvidia.com/gpu=true:NoSchedule 污点，web-plain 没有能匹配它的容忍，"\n'
             '               "调度器在过滤节点时就把这台节点排除了，所以它只能 Pending；"\n'
             '               "容忍只是放行，不会把 Pod 吸引过去，挑节点还得靠标签和 nodeSelector。")',
             'explanation = "节点上有污点，Pod 没有容忍，所以上不去，只能一直等着。"')),
        # Taints the node but forgets the role label: web-tolerant has nowhere to go.
        "dave": from_solution(
            LAB03, ('kubectl(f"label node {gpu_node} node-role.kubernetes.io/ai=true --overwrite")\n', "")),
    })


def test_lab03_scores(lab03):
    assert lab03.earned("alice") == {"node-label-taint": 3, "plain-pod-repelled": 2, "plain-reason-recorded": 2,
                                     "tolerant-pod": 3, "toleration-not-attraction": 1, "explanation": 3,
                                     "toleration-is-scoped": 1}
    assert_untouched_scores_zero(lab03)
    assert "没有 nvidia.com/gpu 污点" in lab03.message("bob", "node-label-taint")

    # web-tolerant stays Pending: the toleration and the placement cost points; tolerant_node = None reads it right.
    assert lab03.earned("carol") == {"node-label-taint": 3, "plain-pod-repelled": 2, "plain-reason-recorded": 2,
                                     "tolerant-pod": 1, "toleration-not-attraction": 0, "explanation": 2,
                                     "toleration-is-scoped": 1}
    tolerant = lab03.message("carol", "tolerant-pod")
    assert "容忍和 GPU 节点上的污点对不上" in tolerant and "web-tolerant 没有被调度（Pending" in tolerant
    assert "不一致" not in tolerant
    assert "在哪一步、由谁做出的决定" in lab03.message("carol", "explanation")
    assert "False" not in lab03.message("carol", "toleration-not-attraction")

    # The scheduler's TaintToleration filter runs before NodeAffinity, so web-plain is still reported as
    # repelled by the taint; web-tolerant, which tolerates it, has no labelled node to go to.
    assert lab03.earned("dave") == {"node-label-taint": 2, "plain-pod-repelled": 2, "plain-reason-recorded": 2,
                                    "tolerant-pod": 2, "toleration-not-attraction": 1, "explanation": 3,
                                    "toleration-is-scoped": 1}
    assert "AI 角色标签" in lab03.message("dave", "node-label-taint")
    tolerant = lab03.message("dave", "tolerant-pod")
    assert "web-tolerant 没有被调度（Pending" in tolerant and "node affinity/selector" in tolerant
    assert "tolerant_node" not in tolerant


def test_lab03_leaves_nodes_as_it_found_them(lab03, kube):
    for node in kube.list("Node"):
        assert not [t for t in node.get("spec", {}).get("taints") or [] if t["key"] == "nvidia.com/gpu"]
        assert "node-role.kubernetes.io/ai" not in node["metadata"].get("labels", {})
    assert_no_grading_leftovers(kube)


# --------------------------------------------------------------------------- lab 05


LAB05 = "05-training-job"


@pytest.fixture(scope="module")
def lab05(cluster, tmp_path_factory):
    return grade(cluster, tmp_path_factory.mktemp("lab05"), "05", {
        "alice": from_solution(LAB05),
        "bob": untouched(LAB05),
        # Checkpoints on an emptyDir: the retry starts over, fails again, the Job gives up.
        "carol": from_solution(
            LAB05,
            ("          persistentVolumeClaim:\n            claimName: train-ckpt", "          emptyDir: {}"),
            ("  backoffLimit: 2", "  backoffLimit: 1")),
        # Restarts in place (OnFailure) and no overall deadline: it recovers, but not as the chapter says.
        "dave": from_solution(
            LAB05,
            ("      restartPolicy: Never", "      restartPolicy: OnFailure"),
            ("  activeDeadlineSeconds: 300\n", "")),
    })


def test_lab05_scores(lab05):
    assert lab05.earned("alice") == {"job-bounded": 3, "init-prepares-data": 2, "checkpoint-on-pvc": 3,
                                     "gpu-limit": 1, "resumed-after-failure": 3, "attempts-recorded": 2,
                                     "emptydir-question": 1, "init-holds-no-gpu": 1}
    assert_untouched_scores_zero(lab05)
    assert lab05.rows["bob"].status == "cell-error"
    assert "没有找到 Job `train`" in lab05.message("bob", "job-bounded")

    assert lab05.earned("carol") == {"job-bounded": 3, "init-prepares-data": 2, "checkpoint-on-pvc": 0,
                                     "gpu-limit": 1, "resumed-after-failure": 0, "attempts-recorded": 0,
                                     "emptydir-question": 0, "init-holds-no-gpu": 1}
    assert "emptyDir" in lab05.message("carol", "checkpoint-on-pvc")
    assert "Job 失败了（BackoffLimitExceeded）" in lab05.message("carol", "resumed-after-failure")

    assert lab05.earned("dave") == {"job-bounded": 1, "init-prepares-data": 2, "checkpoint-on-pvc": 3,
                                    "gpu-limit": 1, "resumed-after-failure": 2, "attempts-recorded": 2,
                                    "emptydir-question": 1, "init-holds-no-gpu": 1}
    bounded = lab05.message("dave", "job-bounded")
    assert "原地重启" in bounded and "总时长上限" in bounded
    assert "一次失败、再一次成功" in lab05.message("dave", "resumed-after-failure")


# --------------------------------------------------------------------------- lab 07


LAB07 = "07-quota-priority"


@pytest.fixture(scope="module")
def lab07(cluster, tmp_path_factory):
    return grade(cluster, tmp_path_factory.mktemp("lab07"), "07", {
        "alice": from_solution(LAB07),
        "bob": untouched(LAB07),
        # team-b's quota on a key the quota controller does not meter; the low class made the global default.
        "carol": from_solution(
            LAB07,
            ('    requests.nvidia.com/gpu: "2"', '    limits.nvidia.com/gpu: "2"'),
            ("value: 1000\nglobalDefault: false", "value: 1000\nglobalDefault: true")),
        # Records the batch Pod that survived and the quota's hard limit instead of what is left.
        "dave": from_solution(
            LAB07,
            ('preempted_pod = events[0]["involvedObject"]["name"]',
             'preempted_pod = kubectl_json(["get", "pods", "-n", team_b, "--field-selector", '
             '"status.phase=Running"])["items"][0]["metadata"]["name"]'),
            ('team_a_gpus_left = int(quota["status"]["hard"]["requests.nvidia.com/gpu"]) - '
             'int(quota["status"]["used"]["requests.nvidia.com/gpu"])',
             'team_a_gpus_left = int(quota["status"]["hard"]["requests.nvidia.com/gpu"])')),
    })


def test_lab07_scores(lab07):
    assert lab07.earned("alice") == {"quota-team-a": 2, "quota-team-b": 1, "priority-classes": 2,
                                     "over-quota-rejected": 2, "preemption": 3, "victim-recorded": 1,
                                     "quota-left": 1, "quotas-named-as-asked": 1}
    assert_untouched_scores_zero(lab07)

    assert lab07.earned("carol") == {"quota-team-a": 2, "quota-team-b": 0, "priority-classes": 1,
                                     "over-quota-rejected": 2, "preemption": 3, "victim-recorded": 1,
                                     "quota-left": 1, "quotas-named-as-asked": 1}
    assert "没有计量 GPU（写了 limits.nvidia.com/gpu）" in lab07.message("carol", "quota-team-b")
    assert "globalDefault" in lab07.message("carol", "priority-classes")

    assert lab07.earned("dave") == {"quota-team-a": 2, "quota-team-b": 1, "priority-classes": 2,
                                    "over-quota-rejected": 2, "preemption": 3, "victim-recorded": 0,
                                    "quota-left": 0, "quotas-named-as-asked": 1}
    assert "hard − used" in lab07.message("dave", "quota-left")


def test_lab07_leaves_no_priority_classes_or_namespaces(lab07, kube):
    assert {pc["metadata"]["name"] for pc in kube.list("PriorityClass")} == {"system-cluster-critical",
                                                                           "system-node-critical"}
    assert_no_grading_leftovers(kube)


# --------------------------------------------------------------------------- hostile submissions


def _hostile(victim: str, cluster_root: Path, subs: Path, out: Path) -> nbformat.NotebookNode:
    nb = untouched(LAB01)
    keep = [c for c in nb.cells if "parameters" in (c.metadata.get("tags") or []) or "begin(namespace)" in c.source]
    solution = REPO / "solutions" / f"{LAB01}.ipynb"  # its cells would score full marks
    probe = f'''
import glob, os, socket
leaks = {{}}
def attempt(name, fn):
    try:
        leaks[name] = ["visible", repr(fn())[:300]]
    except Exception as exc:
        leaks[name] = ["blocked", type(exc).__name__]
attempt("hidden-checks", lambda: [open(p).read() for p in glob.glob({str(HIDDEN)!r} + "/*.py")] or 1 / 0)
attempt("ca-key", lambda: open({str(cluster_root / "pki" / "ca.key")!r}).read())
attempt("admin-kubeconfig", lambda: open({str(cluster_root / "kubeconfig")!r}).read())
attempt("other-submissions", lambda: os.listdir({str(subs)!r}))
attempt("gradebook", lambda: os.listdir({str(out)!r}))
attempt("solution", lambda: open({str(solution)!r}).read())
attempt("solution-relative", lambda: open(os.path.relpath({str(solution)!r})).read())
attempt("etcd", lambda: socket.create_connection(("127.0.0.1", {_etcd_port(cluster_root)}), timeout=2))
record("leaks", leaks)
record("delete_other", str(try_kubectl("delete namespace {victim}")))
record("create_namespace", str(try_kubectl("create namespace mallory-was-here")))
record("list_all_pods", str(try_kubectl("get pods -A")))
while True:
    pass
'''
    nb.cells = keep + [nbformat.v4.new_code_cell(probe)]
    return nb


def _etcd_port(cluster_root: Path) -> int:
    return json.loads((cluster_root / "state.json").read_text())["ports"]["etcd-client"]


def test_hostile_submissions_are_contained(cluster, kube, tmp_path):
    victim = "victim-of-mallory"
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": victim}})
    exit_early = untouched(LAB01)
    exit_early.cells.insert(3, nbformat.v4.new_code_cell("import sys\nsys.exit(0)"))
    try:
        batch = grade(cluster, tmp_path, "01", {
            "mallory": _hostile(victim, cluster.root, tmp_path / "submissions", tmp_path / "out"),
            "oscar": exit_early,
        }, cell_timeout=8)
        assert batch.rows["mallory"].status == "cell-timeout" and batch.rows["mallory"].total == 0
        assert batch.rows["oscar"].status == "sys-exit" and batch.rows["oscar"].total == 0
        values = json.loads((batch.out / "runs" / "mallory.results.json").read_text(encoding="utf-8"))
        expected = {
            "hidden-checks": ["blocked", "ZeroDivisionError"],  # tests/ is not there (nor would the directory be)
            "ca-key": ["blocked", "FileNotFoundError"],
            "admin-kubeconfig": ["blocked", "FileNotFoundError"],
            "other-submissions": ["blocked", "FileNotFoundError"],
            "gradebook": ["blocked", "FileNotFoundError"],
            "solution": ["blocked", "FileNotFoundError"],
            "solution-relative": ["blocked", "FileNotFoundError"],
            "etcd": ["blocked", "ConnectionRefusedError"],
        }
        from gpulab.runtime import sandbox

        if sandbox.kind() == "process":  # no network of its own there (see gpulab.grading.jail): etcd answers
            expected["etcd"] = values["leaks"]["etcd"]
        assert values["leaks"] == expected
        for key in ("delete_other", "create_namespace", "list_all_pods"):
            assert "Forbidden" in values[key] and 'User "gpulab-grader:mallory"' in values[key], values[key]
        assert kube.get("Namespace", victim) is not None
        assert kube.get("Namespace", "mallory-was-here") is None
        feedback = batch.feedback("mallory")
        assert "运行超过 8 秒被中止" in feedback and "gpu_nodes 的值是整数" not in feedback
        assert "sys.exit()" in batch.feedback("oscar")
    finally:
        kube.delete("Namespace", victim)


# --------------------------------------------------------------------------- the learner's command


def test_gpulab_check_prints_each_check(cluster, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "gpulab.cli", "check", str(REPO / "solutions" / f"{LAB01}.ipynb"),
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "笔记本从头到尾运行成功。" in proc.stdout
    assert "✓     2/2  修好 gpu-half" in proc.stdout
    assert proc.stdout.rstrip().endswith("13/13  01-gpu-pod-spec")
    assert (tmp_path / "feedback").is_dir()
