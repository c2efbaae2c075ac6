"""Checks for ``labs/02-layered-verification.ipynb`` (the chapter's exercise 1, both halves).

Before each run the grader breaks ONE layer of one GPU node's GPU stack and
puts it back afterwards, whatever the run did: the fixture
:mod:`gpulab.grading.fixtures.broken_layer` (``SETUP``/``TEARDOWN`` below), which
also says which fault breaks which layer and how the layer is picked (per
submission, with the grading secret). The notebook must diagnose rather than know.

The notebook records ``gpu_nodes`` / ``gpu_node_count`` (from allocatable, as
the cluster is while broken), ``broken_node``, ``broken_layer`` and
``evidence`` (the output line that shows it), and leaves its test Pod
``gpu-check`` (the chapter's ``nvidia-smi`` pod) behind. What was broken
reaches the checks as an ``InjectedFault`` object, never the notebook.
"""

from __future__ import annotations

from gpulab.grading import fixtures
from gpulab.grading.checks import (
    Context, allocatable_by_node, check, containers, dig, failed, judge_diagnosis, partial, passed, quantity_int, ratio,
)
from gpulab.grading.fixtures import broken_layer as fixture

LAB = "02-layered-verification"
CLUSTER_WIDE = True
# Layered verification reads the GPU Operator's pods and their logs: read-only, cluster-wide.
CLUSTER_RULES = fixtures.DIAGNOSE_RULES
GPUS_FREE = 2
LOGS = True
CELL_TIMEOUT = 60
TIMEOUT = 150

GPU = fixtures.GPU
TEST_POD = "gpu-check"

#: The layers a learner may name, bottom up (and the fault that breaks each: the fixture's).
LAYERS = fixture.LAYERS
LAYER_NAMES = {"gpu": "卡本身（硬件）", "driver": "宿主机驱动", "container-toolkit": "容器运行时 / container toolkit",
               "device-plugin": "device plugin"}

#: Output that shows a layer broken, as the cluster prints it; and output that only shows the symptom.
EVIDENCE = {
    "gpu": ("Xid", "unhealthy"),
    "driver": ("Driver Not Loaded", "couldn't communicate with the NVIDIA driver"),
    "container-toolkit": ("No devices were found", "no CUDA-capable device is detected"),
    "device-plugin": ("error starting plugins", "CrashLoopBackOff"),
}
SYMPTOMS = ("Insufficient nvidia.com/gpu", "allocatable", "Allocatable", '"nvidia.com/gpu": "0"', "nvidia.com/gpu: 0")


# --------------------------------------------------------------------------- checks


def labelled_gpus(ctx: Context) -> dict[str, int]:
    """What GFD's labels claim: nodes with ``nvidia.com/gpu.present=true`` and their ``gpu.count``."""
    found = {}
    for node in ctx.objects("Node"):
        labels = node["metadata"].get("labels") or {}
        if labels.get("nvidia.com/gpu.present") == "true":
            found[node["metadata"]["name"]] = quantity_int(labels.get("nvidia.com/gpu.count")) or 0
    return found


def _no_fault():
    return failed("评分时没有找到评分器注入的故障记录，无法核对；请联系讲师。")


@check("gpu-node-count", points=1, title="数出上报了 nvidia.com/gpu 的节点个数")
def gpu_node_count(ctx: Context):
    answer = ctx.value("gpu_node_count")
    if isinstance(answer, bool) or not isinstance(answer, int):
        return failed("gpu_node_count 应该是一个整数。")
    truth = allocatable_by_node(ctx, GPU)  # as captured, still broken
    if answer == len(truth):
        return passed()
    if answer == len(labelled_gpus(ctx)):
        return failed("这个数和带 GPU 标签的节点数一样，但和 allocatable 对不上：标签说的是「有卡」，"
                      "调度器能用的只看 allocatable。")
    return failed("和评分时各节点 allocatable 里 nvidia.com/gpu 大于 0 的节点个数对不上。")


@check("gpu-per-node", points=2, title="每台节点在 allocatable 里上报了几张卡")
def gpu_per_node(ctx: Context):
    answer = ctx.value("gpu_nodes")
    if not isinstance(answer, dict):
        return failed("gpu_nodes 应该是一个字典：节点名 → 卡数。")
    truth = allocatable_by_node(ctx, GPU)  # as captured, still broken
    if not answer:
        return passed() if not truth else failed("gpu_nodes 是空的，但评分时有节点在 allocatable 里上报了 GPU。")
    counts = {k: quantity_int(v) for k, v in answer.items()}
    if counts == truth:
        return passed()
    if counts == {k: v for k, v in labelled_gpus(ctx).items() if v}:
        return failed("gpu_nodes 和 GFD 标签 nvidia.com/gpu.count 一致，但和 allocatable 不一致："
                      "坏掉的卡、没上报的卡，标签上看不出来。")
    wrong = sorted(set(counts) ^ set(truth)) or sorted(k for k in counts if counts[k] != truth.get(k))
    return failed(f"gpu_nodes 里 {', '.join(wrong)} 的情况和评分时的 allocatable 对不上"
                  "（只算 allocatable 里 nvidia.com/gpu 大于 0 的节点，卡数用整数）。")


@check("broken-node", points=1, title="找出 GPU 栈坏了的节点")
def broken_node(ctx: Context):
    fault = fixtures.injected_record(ctx)
    if fault is None:
        return _no_fault()
    answer = ctx.value("broken_node")
    if not isinstance(answer, str) or not answer:
        return failed("broken_node 应该是一个节点名。")
    if answer == fault["node"]:
        return passed()
    if answer not in labelled_gpus(ctx):
        return failed(f"{answer} 上根本没有卡（没有 GFD 的 nvidia.com/gpu.present 标签）：要查的是「有卡但用不上」的节点。")
    return failed(f"{answer} 不是坏掉的那台：比较每台 GPU 节点的标签、capacity 和 allocatable，再看测试 Pod 在哪台上出的问题。")


def pinned_node(pod: dict) -> str | None:
    """The node the manifest pins the test pod to (its nodeSelector's hostname, as the lab asks).

    Not ``spec.nodeName``: on a collected pod it is where the scheduler placed it, and an unpinned pod
    can land on the broken node by chance (it did, once cluster DNS added a pod to the CPU nodes).
    """
    return dig(pod, "spec", "nodeSelector", "kubernetes.io/hostname") or None


@check("test-pod", points=2, title="用测试 Pod 在可疑节点上跑 nvidia-smi")
def test_pod(ctx: Context):
    pod = ctx.require("Pod", TEST_POD, ctx.namespace)
    fault = fixtures.injected_record(ctx)
    problems, score = [], 0
    main = containers(pod)
    if any("nvidia-smi" in " ".join((c.get("command") or []) + (c.get("args") or [])) for c in main):
        score += 1
    else:
        problems.append("gpu-check 没有运行 nvidia-smi：它是最后一步「容器里真的能用卡吗」的检验")
    limits = [quantity_int(dig(c, "resources", "limits", GPU)) for c in main]
    requests = [dig(c, "resources", "requests", GPU) for c in main]
    if sum(x or 0 for x in limits) == 1 and all(r is None or quantity_int(r) == l for r, l in zip(requests, limits)):
        score += 1
    else:
        problems.append("gpu-check 要在 limits 里申请正好 1 张 nvidia.com/gpu：不申请就分不到卡，容器里自然看不到卡")
    target = pinned_node(pod)
    if fault is not None and target == fault["node"]:
        score += 1
    else:
        problems.append("gpu-check 没有被固定到坏掉的那台节点上（nodeSelector 里的 kubernetes.io/hostname）")
    return ratio(score, 3, problems)


_LAYER_HINTS = {
    # (what the learner said, what was broken) -> a hint that points at the evidence, not at the answer
    ("device-plugin", "driver"): "device plugin 确实没起来，但同一台节点上别的组件呢？看看它们的日志里，"
                                 "大家是不是因为同一个更底层的原因失败的。",
    ("driver", "device-plugin"): "驱动坏了的话，凡是要用 NVML 的组件都会失败；这台节点上是所有组件都失败了吗？",
    ("device-plugin", "gpu"): "device plugin 还在运行、也在上报资源，只是少报了：它的日志里说了哪张卡怎么了？",
    ("gpu", "device-plugin"): "少掉的是一张卡，还是全部？比较 capacity 和 allocatable，再看负责上报资源的那个组件自己还在不在运行。",
    ("container-toolkit", "device-plugin"): "测试 Pod 有没有被调度、分到卡？分不到卡时问题还在容器之前。",
    ("device-plugin", "container-toolkit"): "allocatable 一张不少，调度也没问题：卡分到了，为什么容器里看不见？",
}


@check("broken-layer", points=4, title="找出坏掉的是哪一层")
def broken_layer(ctx: Context):
    fault = fixtures.injected_record(ctx)
    if fault is None:
        return _no_fault()
    return judge_diagnosis(ctx.value("broken_layer"), fault["layer"], LAYER_NAMES, _LAYER_HINTS,
                           field="broken_layer", wrong="坏的不是「{name}」这一层。",
                           default_hint="从最底层往上逐层核对：每一层正常时该是什么样子，哪一层最先不对？")


@check("evidence", points=3, title="记下能证明这一层坏了的输出")
def evidence(ctx: Context):
    fault = fixtures.injected_record(ctx)
    if fault is None:
        return _no_fault()
    text = ctx.value("evidence")
    if not isinstance(text, str) or not text.strip():
        return failed("evidence 应该是一段命令输出的原文（日志或 nvidia-smi 打印的那一行）。")
    truth = fault["layer"]
    if any(s in text for s in EVIDENCE[truth]):
        return passed()
    if any(s in text for s in (s for layer, sigs in EVIDENCE.items() if layer != truth for s in sigs)):
        return partial(1 / 3, "这段输出说明的是另一层的问题，和坏掉的那一层对不上。")
    if any(s in text for s in SYMPTOMS):
        return partial(1 / 3, "这段输出只说明「卡用不上」这个现象，没有说明是哪一层造成的："
                              "记下那一层自己报出的错误原文（日志、nvidia-smi 的输出）。")
    return failed("evidence 里没有能说明哪一层出了问题的输出：直接从日志或 nvidia-smi 的输出里取原文。")


# The fixture that breaks one layer before the run and repairs the stack after it (see its module).
SETUP = fixture.setup
TEARDOWN = fixture.teardown
