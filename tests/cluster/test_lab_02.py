"""Lab 02 graded on the real cluster: a different layer of the GPU stack broken for each run.

The grader breaks the layer :func:`gpulab.grading.fixtures.broken_layer.scenario`
picks for the run's namespace (``grade-02-<learner>``) under this ``GPULAB_HOME``'s
grading secret, so the learners here are chosen under that secret to cover every
layer: the solution must find each of them. Then the untouched lab (zero, a
message for every check) and two typical mistakes, each on the layer it is about.
Afterwards the cluster has no faults, every card is allocatable again and
nothing of the grading is left.
"""

from __future__ import annotations

import time

import pytest

from gpulab.fakegpu import faults, operator
from gpulab.grading import secret
from gpulab.grading.cluster import load_lab_spec
from gpulab.grading.fixtures import broken_layer
from gpulab.grading.grader import namespace_for
from lab_support import assert_no_grading_leftovers, assert_untouched_scores_zero, from_solution, grade, untouched

pytestmark = pytest.mark.cluster

LAB02 = "02-layered-verification"
GPU_NODES = {"gpu-node-1": 2}  # the default topology
FULL = {"gpu-node-count": 1, "gpu-per-node": 2, "broken-node": 1, "test-pod": 2, "broken-layer": 4, "evidence": 3,
        "evidence-is-a-quote": 1}


def layer_of(learner: str, prefix: str = "grade") -> str:
    """The layer the grader breaks for ``learner`` under this GPULAB_HOME's secret (made here when missing)."""
    namespace = namespace_for(load_lab_spec("02"), prefix)(LAB02, learner)
    return broken_layer.scenario(namespace, GPU_NODES, secret.ensure())[1]


def learner_with(layer: str, name: str) -> str:
    """``name`` with the first number that makes the grader break ``layer`` for it."""
    return next(f"{name}{i}" for i in range(500) if layer_of(f"{name}{i}") == layer)


@pytest.fixture(scope="module")
def learners(cluster) -> dict[str, str]:
    """Role -> learner: one solved submission per layer, the untouched lab, two typical mistakes."""
    roles = {f"solved-{layer}": learner_with(layer, "solved") for layer in broken_layer.LAYERS}
    roles.update(bob=learner_with("gpu", "bob"), peggy=learner_with("driver", "peggy"),
                 ivan=learner_with("container-toolkit", "ivan"))
    return roles


@pytest.fixture(scope="module")
def lab02(cluster, learners, tmp_path_factory):
    subs = {learners[f"solved-{layer}"]: from_solution(LAB02) for layer in broken_layer.LAYERS}
    subs.update({
        learners["bob"]: untouched(LAB02),
        # Counts GFD's labels instead of allocatable; blames the device plugin whenever it is not ready and
        # quotes its pod state as the evidence.
        learners["peggy"]: from_solution(
            LAB02,
            ('    count = node["status"]["allocatable"].get("nvidia.com/gpu")',
             '    count = node["metadata"]["labels"].get("nvidia.com/gpu.count")'),
            ('if nvml_failures:                       # everything that talks to the driver fails: the driver\n'
             '    broken_layer, evidence = "driver", nvml_failures\nelif not plugin["ready"]:',
             'if not plugin["ready"]:'),
            ('first_line(plugin["log"], "error") or plugin["state"]', 'plugin["state"]')),
        # Forgets the test pod's GPU, and writes down what practice showed instead of what this run shows.
        learners["ivan"]: from_solution(
            LAB02,
            ('container["resources"] = {"limits": {"nvidia.com/gpu": 1}}\n', ''),
            ('    broken_layer, evidence = "container-toolkit", first_line(test_log, "No devices", "no CUDA-capable")',
             '    broken_layer, evidence = "container-toolkit", first_line(test_log, "No devices", "no CUDA-capable")\n'
             'broken_layer, evidence = "gpu", "XidCriticalError: Xid=79 on Device=GPU-0; marking device unhealthy."')),
    })
    started = time.monotonic()
    batch = grade(cluster, tmp_path_factory.mktemp("lab02"), "02", subs)
    batch.seconds = (time.monotonic() - started) / len(subs)
    return batch


def test_the_learners_cover_every_layer(learners):
    solved = {layer: learners[f"solved-{layer}"] for layer in broken_layer.LAYERS}
    assert {layer_of(learner) for learner in solved.values()} == set(broken_layer.LAYERS)
    assert (layer_of(learners["peggy"]), layer_of(learners["ivan"]), layer_of(learners["bob"])) == \
        ("driver", "container-toolkit", "gpu")
    # gpulab check runs in check-02-<user>: a learner's practice run rarely meets the grader's fault.
    assert [layer_of(f"x{i}") for i in range(8)] != [layer_of(f"x{i}", "check") for i in range(8)]


def test_lab02_solution_finds_every_layer(lab02, learners):
    for layer in broken_layer.LAYERS:
        learner = learners[f"solved-{layer}"]
        assert lab02.earned(learner) == FULL, (learner, layer)
        assert lab02.rows[learner].status == "ok"
    print(f"lab 02: {lab02.seconds:.1f} s per graded submission")


def test_lab02_untouched_scores_zero(lab02, learners):
    bob = learners["bob"]
    assert_untouched_scores_zero(lab02, bob)
    assert "应该是一个字典" in lab02.message(bob, "gpu-per-node")
    assert "应该是一个节点名" in lab02.message(bob, "broken-node")


def test_lab02_typical_mistakes(lab02, learners):
    peggy, ivan = learners["peggy"], learners["ivan"]
    # The driver is broken: the labels still say two cards, allocatable says none; the device plugin is
    # only the first victim.
    assert lab02.earned(peggy) == {"gpu-node-count": 0, "gpu-per-node": 0, "broken-node": 1, "test-pod": 2,
                                   "broken-layer": 0, "evidence": 1, "evidence-is-a-quote": 1}
    assert "带 GPU 标签的节点数一样" in lab02.message(peggy, "gpu-node-count")
    assert "GFD 标签 nvidia.com/gpu.count 一致" in lab02.message(peggy, "gpu-per-node")
    layer = lab02.message(peggy, "broken-layer")
    assert "device plugin 确实没起来" in layer and "driver" not in layer and "驱动" not in layer
    assert "另一层的问题" in lab02.message(peggy, "evidence")

    # The container toolkit is broken; a test pod without a GPU request, and a hard-coded conclusion.
    assert lab02.earned(ivan) == {"gpu-node-count": 1, "gpu-per-node": 2, "broken-node": 1, "test-pod": 1.33,
                                  "broken-layer": 0, "evidence": 1, "evidence-is-a-quote": 1}
    assert "申请正好 1 张" in lab02.message(ivan, "test-pod")
    assert "坏的不是「卡本身（硬件）」这一层" in lab02.message(ivan, "broken-layer")


def test_lab02_leaves_the_gpu_stack_as_it_found_it(lab02, cluster, kube):
    assert faults.list_all(cluster.root, sorted(GPU_NODES)) == []
    node = kube.get("Node", "gpu-node-1")
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == node["status"]["capacity"]["nvidia.com/gpu"] == "2"
    assert operator.stack_ready(kube) is None
    assert_no_grading_leftovers(kube)
