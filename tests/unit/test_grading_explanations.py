"""Explanations judged by what they say, not by the words they use.

Each lab that scores a free-text explanation (:func:`gpulab.grading.checks.judge_explanation`: labs 03, 04
and 08) is given right explanations written in several ways — a wrong mechanism denied (with the negation
before the claim or between its noun and verb), in English only, in Chinese and English mixed, with MIG or
NoExecute contrasted in another clause, the wrong belief named as one — and each must keep full credit with
nothing asked about it and nothing marked for review. Wrong explanations in the same languages must still be
caught: marked for the instructor's review with the clause quoted, and the learner asked what the clause
means, never told what they claimed.
"""

from __future__ import annotations

import re

import pytest

from gpulab.grading.checks import CheckResult, Context, asserted
from gpulab.grading.labs import lab_03, lab_04, lab_08


def _lab03(text):
    return lab_03.explanation(Context({"explanation": text}))


def _lab04(text):
    return lab_04.explanation(Context({"explanation": text}))


def _lab08(pod, text):
    return lab_08._explain(Context({"explanations": {pod: text}}), pod)


def _asked_for_review(judged: CheckResult, quoted: str, subject: str = "解释") -> None:
    """``judged`` is marked for review with ``quoted``, and its message asks about it, never asserts it."""
    assert not judged.passed and quoted in judged.review
    assert f"{subject}里写的「{quoted}」——是说" in judged.message
    question = judged.message[judged.message.index(f"「{quoted}」"):]
    assert "吗？如果是这个意思，" in question and "如果不是，这一条会交给老师复核。" in question
    assert "把原因说成了" not in judged.message and "：说" not in judged.message  # the old assertions


# --------------------------------------------------------------------------- how a claim is read


@pytest.mark.parametrize("text, claimed", [
    ("显存被平分了。", "显存被平分了"),
    ("显存并没有被平分。", None),  # the negation between the noun and the verb
    ("不是轮流用算力而是把显存平分。", "不是轮流用算力而是把显存平分"),  # 而是 ends the reach of 不是
    ("Compute is not isolated but the memory is split evenly.", "Compute is not isolated but the memory is split evenly"),
    ("Nothing splits the memory here.", None),
    ("显存会被平分吗？不会。", None),  # a question asks, it claims nothing
    ("很多人误以为显存被平分了。", None),
    ("如果显存被平分，一个容器 OOM 就不会波及别人。", None),  # a supposition
    ("说显存被平分是错的。", None),
    ("That the memory is split is a myth.", None),
    ("The memory is split evenly", "The memory is split evenly"),  # no full stop at the end: still a claim
    ("它可以为每个容器把显存平分。", "它可以为每个容器把显存平分"),  # 可以为 is "can ... for", not 以为
    ("主要是显存被平分了。", "主要是显存被平分了"),
])
def test_a_claim_is_what_the_text_says(text, claimed):
    pattern = re.compile(r"显存.{0,6}平分|memory.{0,6}split|split.{0,6}memory", re.I)
    assert asserted(text, pattern) == claimed


# --------------------------------------------------------------------------- lab 03: why web-plain stays off the GPU node

LAB03_RIGHT = [
    # negated
    "并不是 GPU 不够：GPU 节点带着 NoSchedule 污点，web-plain 没有容忍，调度器把它过滤掉了。",
    "web-plain 没被驱逐过，它从一开始就没被调度上 GPU 节点：节点有污点，它没有容忍，调度器过滤掉了这台节点。",
    "GPU 节点的标签和 nodeSelector 并不是对不上，问题在污点：web-plain 没有容忍，调度器过滤时排除了 GPU 节点。",
    # a true fact that sounds like a wrong mechanism: web-plain really requests no GPU
    "web-plain 既没有申请 GPU，也没有容忍 GPU 节点的污点，所以调度器过滤时把 GPU 节点排除了。",
    # another taint effect contrasted
    "NoExecute 才会驱逐已经在运行的 Pod，而这里是 NoSchedule 污点：web-plain 没有容忍，调度器直接把 GPU 节点过滤掉了。",
    # the wrong belief named as one
    "如果以为是 GPU 不够就错了：GPU 节点有污点，web-plain 没有容忍，调度器过滤掉了它。",
    # English
    "The GPU node carries a NoSchedule taint and web-plain has no matching toleration, so the scheduler filters that "
    "node out. It was never evicted, and resources were not the problem.",
    "Nothing was evicted. The GPU node has a taint that web-plain does not tolerate, so the scheduler filters it out.",
    "It is not that the node ran out of GPUs: the node is tainted, web-plain doesn't tolerate the taint, and the "
    "scheduler won't place it there.",
    # mixed
    "GPU 节点有 taint（NoSchedule），web-plain 没有 toleration，scheduler 过滤的时候就跳过了它；GPU 资源其实是够的。",
]


@pytest.mark.parametrize("text", LAB03_RIGHT)
def test_lab03_right_explanations_keep_full_credit(text):
    judged = _lab03(text)
    assert judged.passed, judged.message
    assert judged.review == () and judged.withheld == 0 and "「" not in judged.message


@pytest.mark.parametrize("text, quoted", [
    ("调度器发现 GPU 节点上的资源不够，所以没有把 web-plain 放上去。", "调度器发现 GPU 节点上的资源不够"),
    ("GPU 节点有污点，web-plain 没申请 GPU 所以调度器不让它上 GPU 节点。", "web-plain 没申请 GPU 所以调度器不让它上 GPU 节点"),
    ("Because web-plain doesn't request a GPU, the scheduler keeps it off the tainted node.",
     "Because web-plain doesn't request a GPU"),
    ("The pod was evicted from the GPU node because it has no toleration for the taint.",
     "The pod was evicted from the GPU node because it has no toleration for the taint"),
    ("不是污点的问题而是 GPU 不够。", "不是污点的问题而是 GPU 不够"),
])
def test_lab03_wrong_mechanisms_are_asked_about_and_marked_for_review(text, quoted):
    _asked_for_review(_lab03(text), quoted)


# --------------------------------------------------------------------------- lab 04: why time-slicing does not isolate memory

LAB04_RIGHT = [
    # negated, before the claim and between its noun and verb
    "time-slicing 只是让几个容器轮流用算力，显存并没有切开，一个容器 OOM，同卡的邻居也跟着挂；要隔离显存得用 MIG。",
    "time-slicing 不是把显存分开，而是让容器轮流使用算力；显存大家共用，一个容器 OOM 会连带邻居一起挂。要真正隔离用 MIG。",
    "time-slicing 并不会把显存切分给各个容器，它只轮流分配算力。显存是共享的，一个容器用超了，其他容器也会 OOM。MIG 才是硬件隔离。",
    "time-slicing 下显存没有隔离开，容器轮流使用算力；一个容器 OOM 不会只影响它自己，同卡的邻居也会挂。要隔离得用 MIG。",
    "给容器设 limits 也限制不了显存：time-slicing 只是轮流分算力，显存共享，一个 OOM 邻居一起挂，真正隔离要用 MIG。",
    # the wrong belief named as one, or asked and answered
    "很多人误以为 time-slicing 会把显存平分给每个容器，其实它只是轮流使用算力，显存共享，一个 OOM 邻居一起挂，隔离要靠 MIG。",
    "time-slicing 会把显存平分给每个容器吗？不会：它只让容器轮流用算力，显存共享，一个 OOM 邻居一起挂，要隔离用 MIG。",
    "说 time-slicing 把显存平分给每个容器是错的：它只让容器轮流用算力，显存共享，一个 OOM 邻居一起挂，要隔离用 MIG。",
    # MIG contrasted in another clause or sentence
    "time-slicing 把算力按时间片轮流分给容器，显存却没有划分；一个容器 OOM 时邻居也受影响。MIG 会把显存切分成独立实例，"
    "这是 time-slicing 做不到的。",
    "MIG 把显存切分成独立实例；time-slicing 只轮流分算力，显存共享，一个 OOM 邻居一起挂。",
    # English
    "Time-slicing only takes turns on compute; memory is not partitioned, so one container's OOM takes its neighbours "
    "down. Use MIG for hardware isolation.",
    "Time-slicing shares compute time, not memory: every container sees the whole VRAM, and an OOM in one affects the "
    "others. MIG, by contrast, partitions memory in hardware.",
    "Time-slicing doesn't split the memory between containers; they take turns on compute. One OOM can crash the "
    "neighbors. MIG gives each instance its own memory.",
    "Time slicing gives each container a turn on the compute, rather than splitting memory; a single OOM takes down "
    "the neighbours, and only MIG isolates memory in hardware.",
    "\"Time-slicing splits the memory\" is a myth: containers take turns on compute, memory is shared, one OOM "
    "crashes the neighbours; MIG isolates it.",
    # mixed
    "time-slicing 只做时间片轮转（time slicing），memory 没有被隔离，一个 container OOM 会拖垮同卡的 neighbours；"
    "需要隔离就用 MIG。",
    "time-slicing 只是 take turns on compute，显存（VRAM）是 shared 的，一个 container OOM 会让 neighbours 一起挂；"
    "真正的隔离要 MIG。",
]


@pytest.mark.parametrize("text", LAB04_RIGHT)
def test_lab04_right_explanations_keep_full_credit(text):
    judged = _lab04(text)
    assert judged.passed, judged.message
    assert judged.review == () and judged.withheld == 0 and "「" not in judged.message


@pytest.mark.parametrize("text, quoted", [
    ("time-slicing 不是轮流用算力而是把显存平分给每个容器。", "time-slicing 不是轮流用算力而是把显存平分给每个容器"),
    ("Time-slicing doesn't isolate compute but memory is split evenly between containers.",
     "Time-slicing doesn't isolate compute but memory is split evenly between containers"),
    ("Time-slicing takes turns on compute. With it one container's OOM won't affect the others.",
     "With it one container's OOM won't affect the others"),
    ("time-slicing 轮流用算力，让每个容器只能用 1/4 的显存。", "让每个容器只能用 1/4 的显存"),
])
def test_lab04_wrong_mechanisms_are_asked_about_and_marked_for_review(text, quoted):
    _asked_for_review(_lab04(text), quoted)


# --------------------------------------------------------------------------- lab 08: three Pods, three causes

LAB08_RIGHT = {
    "train": [
        "有一张卡报了 Xid，device plugin 把它标成 unhealthy，allocatable 少了一张；不是被别的 Pod 占满了。",
        "device plugin 没挂，它把出 Xid 的那张卡报成了 unhealthy，所以 allocatable 比 capacity 少一张。",
        "卡并没有被别的任务占用，是一张卡坏了（Xid），设备插件上报后 allocatable 变少了。",
        "One GPU hit Xid 79; the device plugin reports it unhealthy, so allocatable drops to 1. No other pod holds the card.",
        "The device plugin didn't crash: it marked the GPU with Xid errors unhealthy, so allocatable is one less than "
        "capacity; nothing else occupied it.",
    ],
    "infer": [
        "节点驱动太旧，镜像里的 CUDA 运行时比驱动支持的版本新，版本不兼容；升级到更新的驱动以支持镜像里的 CUDA 就行。",
        "不是驱动太新，而是驱动太旧：镜像的 CUDA runtime 版本比驱动支持的高。卡没坏。",
        "驱动支持的 CUDA 版本低于镜像里 CUDA 运行时的版本，两者不兼容；应该换旧一点的 CUDA 镜像，而不是换更新的镜像。",
        "The driver is too old for the image's CUDA runtime version; the card is not broken.",
        "Driver 版本太旧，image 里的 CUDA runtime 需要更新的 driver；GPU 本身没有坏。",
    ],
    "dev-notebook": [
        "GPU 节点有污点，dev-notebook 没有容忍，调度器把它过滤掉了；卡是够的，也没有被驱逐。",
        "不是卡不够：GPU 节点有 NoSchedule 污点，dev-notebook 没有容忍，scheduler 过滤掉了它。",
        "dev-notebook 没被驱逐，也和驱动版本无关：GPU 节点的 taint 它没有 toleration，调度器过滤掉了。",
        "The GPU node is tainted and dev-notebook has no toleration, so the scheduler filters it out; it is not that "
        "GPUs are insufficient.",
        "NoExecute 会驱逐正在运行的 Pod，NoSchedule 只拦新 Pod：dev-notebook 没有容忍 GPU 节点的污点，调度器把它过滤掉了。",
    ],
}


@pytest.mark.parametrize("pod, text", [(pod, text) for pod, texts in LAB08_RIGHT.items() for text in texts])
def test_lab08_right_explanations_keep_full_credit(pod, text):
    judged = _lab08(pod, text)
    assert judged.passed, judged.message
    assert judged.review == () and judged.withheld == 0 and "「" not in judged.message


@pytest.mark.parametrize("pod, text, quoted", [
    ("train", "有张卡报了 Xid，allocatable 少了一张，device plugin 上报的；卡也被别的任务占满了。", "卡也被别的任务占满了"),
    ("train", "One GPU is unhealthy (Xid), the device plugin reports it and allocatable drops; the other GPU is in use "
              "by another pod.", "the other GPU is in use by another pod"),
    ("infer", "驱动和镜像里的 CUDA 运行时版本不兼容，把镜像换成最新的 CUDA 就行。", "把镜像换成最新的 CUDA 就行"),
    ("dev-notebook", "调度器发现 GPU 节点上卡不够，所以 dev-notebook 只能等。", "调度器发现 GPU 节点上卡不够"),
])
def test_lab08_wrong_claims_are_asked_about_and_marked_for_review(pod, text, quoted):
    _asked_for_review(_lab08(pod, text), quoted, f"{pod} 的解释")
