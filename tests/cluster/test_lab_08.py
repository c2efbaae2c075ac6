"""Lab 08 graded on the real cluster: an unhealthy GPU and a GPU taint, three teammates' Pods.

The grader breaks a card on the GPU node and taints it before each run, and
takes both back afterwards. One batch: the solution (full marks), the
untouched lab (zero, a message for every check) and two typical mistakes.
Afterwards the cluster has no faults and no GPU taint, and nothing of the
grading is left.
"""

from __future__ import annotations

import time

import pytest

from gpulab.fakegpu import faults, operator
from lab_support import assert_no_grading_leftovers, assert_untouched_scores_zero, from_solution, grade, untouched

pytestmark = pytest.mark.cluster

LAB08 = "08-troubleshooting"
FULL = {"cause-train": 2, "cause-infer": 2, "cause-dev-notebook": 2, "fixable": 1, "fix-infer": 3,
        "fix-dev-notebook": 2, "explain-train": 2, "explain-infer": 2, "explain-dev-notebook": 2,
        "train-not-shrunk": 1}


@pytest.fixture(scope="module")
def lab08(cluster, tmp_path_factory):
    subs = {
        "alice": from_solution(LAB08),
        "bob": untouched(LAB08),
        # Reads "Insufficient nvidia.com/gpu" as "someone holds the cards", so train would only have to wait.
        "carol": from_solution(
            LAB08,
            ('causes = {"train": "gpu-unhealthy",', 'causes = {"train": "gpus-in-use",'),
            ('fixable = {"train": False,', 'fixable = {"train": True,'),
            ('    "train": "节点上有一张卡报了 Xid 79，device plugin 把它标成不健康，allocatable 只剩 1 张（capacity 还是 2），"\n'
             '             "调度器按 allocatable 记账，要 2 张卡的 train 只能 Pending；这是硬件问题，要找管理员换卡或修复。",',
             '    "train": "卡被别的任务占满了，等别人用完就会轮到 train。",')),
        # "Just use latest"; a toleration with the wrong effect; an explanation that blames only the image.
        "dave": from_solution(
            LAB08,
            ("      image: nvcr.io/nvidia/cuda:12.6.2-base-ubuntu24.04\n      # END SOLUTION",
             "      image: nvcr.io/nvidia/cuda:latest\n      # END SOLUTION"),
            ("      operator: Exists\n      effect: NoSchedule\n  # END SOLUTION",
             "      operator: Exists\n      effect: NoExecute\n  # END SOLUTION"),
            ('    "infer": "节点上的驱动（580）只支持到 CUDA 13.0，而镜像里的 CUDA 运行时是 13.1，比驱动新，版本超前就报 "\n'
             '             "CUDA driver version is insufficient；换一个 CUDA 运行时不超过 13.0 的镜像就能跑，或者请管理员升级驱动。",',
             '    "infer": "镜像太新了，换一个旧一点的镜像就好。",')),
    }
    started = time.monotonic()
    batch = grade(cluster, tmp_path_factory.mktemp("lab08"), "08", subs)
    batch.seconds = (time.monotonic() - started) / len(subs)
    return batch


def test_lab08_solution_scores_full_marks(lab08):
    assert lab08.earned("alice") == FULL
    assert lab08.rows["alice"].total == 19 and lab08.rows["alice"].status == "ok"
    print(f"lab 08: {lab08.seconds:.1f} s per graded submission")


def test_lab08_untouched_scores_zero(lab08):
    assert_untouched_scores_zero(lab08)
    assert lab08.rows["bob"].status == "cell-error"  # infer-fixed has no image until the learner picks one
    assert "之一" in lab08.message("bob", "cause-train")
    assert "没有找到 Pod `infer-fixed`" in lab08.message("bob", "fix-infer")


def test_lab08_typical_mistakes(lab08):
    assert lab08.earned("carol") == {**FULL, "cause-train": 0, "fixable": 0.67, "explain-train": 0,
                                     "train-not-shrunk": 0}
    cause = lab08.message("carol", "cause-train")
    assert "别的 Pod 占着" in cause and "gpu-unhealthy" not in cause and "不健康" not in cause
    assert "train 的判断不对" in lab08.message("carol", "fixable")
    assert "少掉的那张卡怎么了" in lab08.message("carol", "explain-train")

    assert lab08.earned("dave") == {**FULL, "fix-infer": 2, "fix-dev-notebook": 0, "explain-infer": 1.33}
    assert "看不出 CUDA 版本" in lab08.message("dave", "fix-infer")
    assert "容忍和 GPU 节点上的污点对不上" in lab08.message("dave", "fix-dev-notebook")
    assert "哪个组件太旧" in lab08.message("dave", "explain-infer")


def test_lab08_leaves_the_node_as_it_found_it(lab08, cluster, kube):
    assert faults.list_all(cluster.root, ["gpu-node-1"]) == []
    node = kube.get("Node", "gpu-node-1")
    assert not [t for t in node["spec"].get("taints") or [] if t["key"] == "nvidia.com/gpu"]
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == node["status"]["capacity"]["nvidia.com/gpu"] == "2"
    assert operator.stack_ready(kube) is None
    assert_no_grading_leftovers(kube)
