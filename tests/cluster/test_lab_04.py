"""Lab 04 (GPU sharing) graded on the real cluster: time-slicing for dev, MIG for inference.

One batch: the solution (full marks), the untouched lab (zero, a message for
every check) and two typical mistakes made from the solution by small edits.
The lab reconfigures the GPU stack, so the test also checks that the grader
puts the ClusterPolicy, the operator's ConfigMaps and the GPU node back.
"""

from __future__ import annotations

import time

import pytest

from lab_support import (assert_no_grading_leftovers, assert_untouched_scores_zero, from_solution, gpu_stack_state,
                         grade, untouched)

pytestmark = pytest.mark.cluster

LAB = "04-sharing"
SOLUTION_EXPLANATION = (
    'explanation = ("time-slicing 只是让多个容器轮流使用同一张卡的算力（时间片），并没有把显存切开："\n'
    '               "每个容器都能看到并申请整张卡的全部显存，也能看到邻居用掉的显存。"\n'
    '               "谁先把显存用完，就会 CUDA out of memory，同一张卡上的其它容器一起挂掉。"\n'
    '               "要硬件级的显存和算力隔离，得用 MIG。")')


@pytest.fixture(scope="module")
def before(kube):
    return gpu_stack_state(kube)


def submissions() -> dict:
    return {
        "alice": from_solution(LAB),
        "bob": untouched(LAB),
        # replicas written for the whole timeSlicing section instead of per resource: the device
        # plugin rejects the config and keeps advertising 2 GPUs, so only 2 notebooks get a share.
        "carol": from_solution(
            LAB, ("        resources:\n          - name: nvidia.com/gpu\n            replicas: 4",
                  "        replicas: 4\n        resources:\n          - name: nvidia.com/gpu")),
        # MIG turned on without mig.strategy=mixed: the slices are advertised as nvidia.com/gpu, the
        # pods asking for nvidia.com/mig-1g.10gb stay Pending; an explanation that forgets MIG.
        "dave": from_solution(
            LAB,
            ('kubectl(["patch", "clusterpolicies.nvidia.com/cluster-policy", "--type", "merge", "-p",\n'
             '         \'{"spec": {"mig": {"strategy": "mixed"}}}\'])\n', ""),
            (SOLUTION_EXPLANATION,
             'explanation = "time-slicing 只是让大家轮流用 GPU，所以一个人把显存用多了，别人也会跟着 OOM。"')),
    }


@pytest.fixture(scope="module")
def lab04(cluster, kube, before, tmp_path_factory):
    subs = submissions()
    started = time.monotonic()
    batch = grade(cluster, tmp_path_factory.mktemp("lab04"), "04", subs)
    print(f"lab 04: {len(subs)} submissions graded in {time.monotonic() - started:.1f} s")
    return batch


def test_lab04_scores(lab04):
    assert lab04.earned("alice") == {"ts-config": 3, "ts-applied": 2, "dev-fit": 3, "dev-sees-neighbours": 1,
                                     "explanation": 3, "mig-layout": 3, "infer-isolated": 2, "mig-count": 1,
                                     "infer-distinct-instances": 1}
    assert lab04.rows["alice"].total == 19 and lab04.rows["alice"].status == "ok"
    assert_untouched_scores_zero(lab04)
    assert "gpu-operator 命名空间里没有 ConfigMap" in lab04.message("bob", "ts-config")

    # A config the device plugin cannot read takes it down (as NVIDIA's does): no GPUs at all, then no MIG
    # instances advertised either. The notebook keeps going, so the explanation still earns its points. Each
    # mistake costs points once: the steps that follow (scaling to what the node offered, reading the memory
    # and the instance count) are judged against what the node really offered, and cannot tell it here.
    assert lab04.earned("carol") == {"ts-config": 0, "ts-applied": 2, "dev-fit": 3, "dev-sees-neighbours": 1,
                                     "explanation": 3, "mig-layout": 2, "infer-isolated": 1, "mig-count": 1,
                                     "infer-distinct-instances": 0}
    assert lab04.rows["carol"].status == "ok"
    assert "replicas 是写给哪一种资源的" in lab04.message("carol", "ts-config")
    dev_fit = lab04.message("carol", "dev-fit")
    assert "device plugin 读不懂" in dev_fit and "最多扩到了 1 个" in dev_fit and "FailedScheduling" in dev_fit
    assert "还有份额空着" not in dev_fit and "不再扣分" in dev_fit
    assert "看不出有哪张卡被共享" in lab04.message("carol", "dev-sees-neighbours")
    assert "device plugin" in lab04.message("carol", "mig-layout")
    assert "allocatable 里没有 nvidia.com/mig-1g.10gb" in lab04.message("carol", "mig-count")

    # mig-count reads the node right: the resource asked for is not advertised (mig-layout judges why).
    assert lab04.earned("dave") == {"ts-config": 3, "ts-applied": 2, "dev-fit": 3, "dev-sees-neighbours": 1,
                                    "explanation": 2.25, "mig-layout": 2, "infer-isolated": 1, "mig-count": 1,
                                    "infer-distinct-instances": 0}
    assert "mig.strategy" in lab04.message("dave", "mig-layout")
    assert "只有 0 个副本" in lab04.message("dave", "infer-isolated")
    assert "要真正隔离显存该用什么" in lab04.message("dave", "explanation")
    for learner in ("carol", "dave"):  # hints, never the answer
        for o in lab04.rows[learner].outcomes:
            assert "all-1g.10gb" not in o.message and "mixed" not in o.message


def test_lab04_leaves_the_gpu_stack_as_it_found_it(lab04, kube, before):
    assert gpu_stack_state(kube) == before
    assert before["resources"] == {"nvidia.com/gpu": "2"}
    for ns in ("gpu-operator", "default"):
        assert not kube.list("Role", ns, label_selector="gpulab.io/grading=true")
        assert not kube.list("RoleBinding", ns, label_selector="gpulab.io/grading=true")
    assert_no_grading_leftovers(kube)
