"""Checks for ``labs/08-troubleshooting.ipynb``: three GPU symptoms, their causes, the fixes a user can make.

Before each run the grader breaks every GPU node the way a bad day does: one
card falls off the bus (``gpu-unhealthy``; which one is fixed per submission by
the grading secret) and an admin has tainted the node
``nvidia.com/gpu=true:NoSchedule``; afterwards it takes both back, whatever the
run did: the fixture :mod:`gpulab.grading.fixtures.gpu_trouble`
(``SETUP``/``TEARDOWN`` below). The notebook applies three teammates' Pods
(``manifests/labs/08-troubleshooting/``):

- ``train`` (2 GPUs, tolerates the taint): Pending, ``Insufficient nvidia.com/gpu``
  — allocatable is one card short of capacity (an unhealthy GPU); nothing a user can fix;
- ``infer`` (1 GPU, tolerates the taint, a CUDA 13.1 image on a driver that
  supports CUDA 13.0): fails with ``CUDA driver version is insufficient for
  CUDA runtime version`` — the image is ahead of the driver; fixable by an
  image whose CUDA runtime the driver supports (``infer-fixed``). Not the
  ``cuda-driver-too-old`` fault: under it gpulab fails every CUDA program,
  whatever its image, so a user could not fix it;
- ``dev-notebook`` (1 GPU, no toleration): Pending, ``untolerated taint`` —
  fixable by a toleration (``dev-notebook-fixed``).

Recorded: ``causes``, ``fixable`` and ``explanations`` (dicts keyed by the
three Pod names). The faults reach the checks as an ``InjectedFault`` object.
A named cause is judged against what the run showed (:func:`observed_cause`:
the pod's log, the scheduler's message, the GPU nodes' capacity and
allocatable), not against a list of answers: a run that went another way is
judged by what it did, and this module holds no answer key.
"""

from __future__ import annotations

import re

from gpulab.fakegpu.cudaerrors import CUDA_ERROR_INSUFFICIENT_DRIVER, CUDA_ERROR_NO_DEVICE
from gpulab.grading import fixtures
from gpulab.grading.checks import (Context, WrongClaim, check, containers, dig, failed, judge_explanation,
                                   nodes_with, passed, pod_spec, quantity_int, ratio, scheduling_messages)
from gpulab.grading.fixtures import gpu_trouble as fixture

LAB = "08-troubleshooting"
CLUSTER_WIDE = True
NODE_TAINTS = ("nvidia.com/gpu",)
# Diagnosing reads the GPU Operator's pods and their logs: read-only, cluster-wide.
CLUSTER_RULES = fixtures.DIAGNOSE_RULES
GPUS_FREE = 2
LOGS = True
CELL_TIMEOUT = 60
TIMEOUT = 150

GPU = fixtures.GPU
SYMPTOMS = ("train", "infer", "dev-notebook")
CAUSES = ("gpu-unhealthy", "device-plugin-down", "gpus-in-use", "untolerated-taint", "selector-mismatch",
          "cuda-driver-too-old", "no-devices")
#: Which causes a user fixes in their own manifest (an image, a toleration, a selector); the others need
#: an administrator (a card, a node's device plugin) or patience (cards other pods hold).
USER_FIXABLE = {"gpu-unhealthy": False, "device-plugin-down": False, "gpus-in-use": False,
                "untolerated-taint": True, "selector-mismatch": True, "cuda-driver-too-old": True,
                "no-devices": False}
CUDA_LABEL = "nvidia.com/cuda.runtime-version.full"  # the CUDA version the *driver* supports


# The fixture that breaks the GPU nodes before the run and repairs them after it (see its module).
SETUP = fixture.setup
TEARDOWN = fixture.teardown


# --------------------------------------------------------------------------- checks

# Hints for a wrong cause, by the cause the run showed and the one the learner named; none names the cause.
_CAUSE_HINTS = {
    "gpu-unhealthy": {
        "device-plugin-down": "如果 device plugin 没在上报，allocatable 里会一张卡都没有；现在 GPU 节点的 allocatable 是多少？",
        "gpus-in-use": "集群里真有别的 Pod 占着这台节点的卡吗？用章节里那条列出所有申请了 GPU 的 Pod 的命令核对一下。",
        "untolerated-taint": "调度器给 {pod} 的原因里，GPU 节点是因为污点被排除的吗？",
        "selector-mismatch": "调度器给 {pod} 的原因里，GPU 节点是因为标签被排除的吗？",
    },
    "cuda-driver-too-old": {
        "no-devices": "{pod} 的日志里是哪一条 CUDA 错误？「没有设备」和「驱动版本不够」不是一回事。",
    },
    "untolerated-taint": {
        wrong: "调度器的消息里，GPU 节点是因为什么被排除的？不是每台节点都是因为卡不够。"
        for wrong in ("gpus-in-use", "gpu-unhealthy", "device-plugin-down")
    },
}
_CAUSE_GENERIC = {
    "gpu-unhealthy": "{pod} 停在 Pending：先读调度器给的原因，再比较 GPU 节点的 capacity 和 allocatable，看少掉的卡去哪了。",
    "device-plugin-down": "{pod} 停在 Pending：先读调度器给的原因，再比较 GPU 节点的 capacity 和 allocatable，"
                          "看看是谁在给 kubelet 报卡。",
    "gpus-in-use": "{pod} 停在 Pending：先读调度器给的原因，再列出所有申请了 GPU 的 Pod，看这台节点的卡分给了谁。",
    "untolerated-taint": "{pod} 停在 Pending：读调度器给的原因，每一类被排除的节点各是为什么。",
    "selector-mismatch": "{pod} 停在 Pending：读调度器给的原因，再对照 Pod 要求的标签和节点上的标签。",
    "cuda-driver-too-old": "{pod} 已经被调度、也分到了卡，是在容器里失败的：读它的日志，"
                           "再对比节点驱动支持的 CUDA 版本和镜像里的 CUDA 版本。",
    "no-devices": "{pod} 已经被调度，是在容器里失败的：读它的日志，看看容器里能不能看到 GPU。",
}
# What CUDA prints (cudaGetErrorString) for the two causes a log shows.
_CUDA_ERRORS = ((CUDA_ERROR_INSUFFICIENT_DRIVER.message, "cuda-driver-too-old"),
                (CUDA_ERROR_NO_DEVICE.message, "no-devices"))


def observed_cause(ctx: Context, pod: str) -> tuple[str | None, str]:
    """The cause the run showed for ``pod`` (one of :data:`CAUSES`), from what the grader captured — the pod's
    log, what the scheduler said, the GPU nodes' capacity and allocatable — or ``None`` and what was seen."""
    obj = ctx.object("Pod", pod, ctx.namespace)
    if obj is None:
        return None, f"评分时集群里没有 {pod} 这个 Pod，无法核对你对它的判断。"
    log = _log(ctx, pod)
    for text, cause in _CUDA_ERRORS:
        if text in log:
            return cause, ""
    said = " ".join(m.split(" preemption:")[0] for m in scheduling_messages(ctx, pod))
    if "untolerated taint" in said:
        return "untolerated-taint", ""
    if f"Insufficient {GPU}" in said:
        counts = [(quantity_int(dig(n, "status", "capacity", GPU)), quantity_int(dig(n, "status", "allocatable", GPU))
                   or 0) for n in nodes_with(ctx, GPU)]
        if counts and not any(allocatable for _, allocatable in counts):
            return "device-plugin-down", ""
        if any(allocatable < capacity for capacity, allocatable in counts):
            return "gpu-unhealthy", ""
        return "gpus-in-use", ""
    if "node affinity/selector" in said:
        return "selector-mismatch", ""
    phase = dig(obj, "status", "phase") or "?"
    return None, f"评分时 {pod} 处于 {phase}，调度器没有给出原因，日志里也没有 CUDA 错误：看不出它出了什么问题，无法核对。"


def _cause_check(ctx: Context, pod: str):
    causes = ctx.value("causes")
    if not isinstance(causes, dict):
        return failed("causes 应该是一个字典：Pod 名 → 原因。")
    answer = causes.get(pod)
    if answer not in CAUSES:
        return failed(f"causes[\"{pod}\"] 应该是 {', '.join(CAUSES)} 之一。")
    truth, seen = observed_cause(ctx, pod)
    if truth is None:
        return failed(seen)
    if answer == truth:
        return passed()
    hint = _CAUSE_HINTS.get(truth, {}).get(answer, _CAUSE_GENERIC[truth])
    return failed(f"{pod} 的原因判断得不对。" + hint.format(pod=pod))


@check("cause-train", points=2, title="train 为什么 Pending")
def cause_train(ctx: Context):
    return _cause_check(ctx, "train")


@check("cause-infer", points=2, title="infer 为什么一启动就失败")
def cause_infer(ctx: Context):
    return _cause_check(ctx, "infer")


@check("cause-dev-notebook", points=2, title="dev-notebook 为什么 Pending")
def cause_dev_notebook(ctx: Context):
    return _cause_check(ctx, "dev-notebook")


@check("fixable", points=1, title="分清哪些问题用户自己能修、哪些要找管理员")
def fixable(ctx: Context):
    answer = ctx.value("fixable")
    if not isinstance(answer, dict) or not all(isinstance(answer.get(p), bool) for p in SYMPTOMS):
        return failed("fixable 应该是一个字典：三个 Pod 名 → True 或 False。")
    seen = {p: observed_cause(ctx, p) for p in SYMPTOMS}
    unknown = [msg for cause, msg in seen.values() if cause is None]
    wrong = [p for p in SYMPTOMS if seen[p][0] is not None and answer[p] != USER_FIXABLE[seen[p][0]]]
    if not wrong and not unknown:
        return passed()
    return ratio(3 - len(wrong) - len(unknown), 3,
                 [f"{p} 的判断不对：问题出在 Pod 的清单里，还是出在节点和硬件上？" for p in wrong] + unknown)


def _cuda_runtime(image: str) -> tuple[int, int] | None:
    match = re.search(r"(?:^|/)cuda:(\d+)\.(\d+)", image or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def _driver_cuda(ctx: Context) -> tuple[int, int] | None:
    """The oldest CUDA version the GPU nodes' drivers support (GFD's label), e.g. (13, 0); None if no node says."""
    found = []
    for node in ctx.objects("Node"):
        match = re.fullmatch(r"(\d+)\.(\d+)", (node["metadata"].get("labels") or {}).get(CUDA_LABEL) or "")
        if match:
            found.append((int(match.group(1)), int(match.group(2))))
    return min(found, default=None)


def _log(ctx: Context, pod: str) -> str:
    return "\n".join(o.get("log", "") for o in ctx.objects("PodLog", ctx.namespace)
                     if o["metadata"]["name"] == pod)


def _tolerates(spec: dict) -> bool:
    for t in spec.get("tolerations") or []:
        if t.get("effect") not in (None, "", "NoSchedule"):
            continue
        key, op = t.get("key"), t.get("operator") or "Equal"
        if op == "Exists" and key in (None, "", GPU) or op == "Equal" and key == GPU and t.get("value") == "true":
            return True
    return False


def _one_gpu(pod: dict) -> bool:
    return sum(quantity_int(dig(c, "resources", "limits", GPU)) or 0 for c in containers(pod)) == 1


@check("fix-infer", points=3, title="infer-fixed：换一个和驱动对得上的镜像")
def fix_infer(ctx: Context):
    pod = ctx.require("Pod", "infer-fixed", ctx.namespace)
    main = containers(pod)
    problems, score = [], 0
    runtimes = [_cuda_runtime(c.get("image", "")) for c in main]
    driver = _driver_cuda(ctx)
    if driver is None:
        problems.append(f"评分时没有一台节点带 {CUDA_LABEL} 标签，看不出驱动支持到哪个 CUDA 版本，"
                        "无法核对 infer-fixed 的镜像；请联系讲师")
    elif runtimes and all(r is not None and r <= driver for r in runtimes):
        score += 1
    elif any(r is None for r in runtimes):
        problems.append("infer-fixed 的镜像看不出 CUDA 版本：继续用 NVIDIA 的 cuda 镜像，只换版本")
    else:
        problems.append("infer-fixed 镜像里的 CUDA 运行时仍然比节点驱动支持的 CUDA 版本新（nvidia-smi 的表头、"
                        "GFD 的 nvidia.com/cuda.* 标签都能看到驱动支持到哪个版本）")
    ann = (pod["metadata"].get("annotations") or {}).get("gpulab.io/gpu-memory")
    if _one_gpu(pod) and _tolerates(pod_spec(pod)) and ann and \
            any("model loaded" in " ".join(c.get("command") or []) for c in main):
        score += 1
    else:
        problems.append("infer-fixed 除了镜像以外应该和 infer 一样：同样的命令、显存注解、1 张卡和容忍")
    if dig(pod, "status", "phase") == "Succeeded" and "model loaded" in _log(ctx, "infer-fixed"):
        score += 1
    else:
        problems.append("infer-fixed 没有成功跑完（日志里没有 model loaded）")
    return ratio(score, 3, problems)


@check("fix-dev-notebook", points=2, title="dev-notebook-fixed：补上对得上污点的容忍")
def fix_dev_notebook(ctx: Context):
    pod = ctx.require("Pod", "dev-notebook-fixed", ctx.namespace)
    problems, score = [], 0
    if _tolerates(pod_spec(pod)) and _one_gpu(pod):
        score += 1
    else:
        problems.append("dev-notebook-fixed 的容忍和 GPU 节点上的污点对不上（key、value/operator、effect），"
                        "或者它不再申请 1 张卡")
    if dig(pod, "status", "phase") == "Succeeded":
        score += 1
    else:
        problems.append("dev-notebook-fixed 没有在 GPU 节点上跑完：看看它的事件")
    return ratio(score, 2, problems)


_CONCEPTS = {
    "train": (
        (re.compile(r"allocatable|可分配|可用的?卡|能用", re.I), "没有说调度器按哪个数字记账"),
        (re.compile(r"unhealthy|不健康|坏|Xid|故障|掉卡|fallen off|损", re.I), "没有说少掉的那张卡怎么了"),
        (re.compile(r"device ?plugin|设备插件|上报|capacity|容量", re.I), "没有说是谁把卡的数量报给 kubelet 的"),
    ),
    "infer": (
        (re.compile(r"驱动|driver", re.I), "没有说节点上哪个组件太旧"),
        (re.compile(r"运行时|runtime|镜像|image|容器", re.I), "没有说和它对不上的是镜像里的什么"),
        (re.compile(r"版本|version|旧|低|新|超前|insufficient|不够|不匹配|对齐|兼容", re.I), "没有说两者之间是什么关系出了问题"),
    ),
    "dev-notebook": (
        (re.compile(r"污点|taint", re.I), "没有说 GPU 节点上的什么把它挡在了外面"),
        (re.compile(r"容忍|toleration|tolerat", re.I), "没有说 Pod 缺了什么"),
        (re.compile(r"NoSchedule|调度器|scheduler|过滤|filter|不调度", re.I), "没有说这是在哪一步、由谁做出的决定"),
    ),
}


_UNHEALTHY = re.compile(r"坏|不健康|unhealthy|Xid|掉卡|fallen off", re.I)
_OTHER_NODES = re.compile(r"另外|其他|其它|其余|别的节点|CPU ?节点|cpu nodes?|other nodes?", re.I)
#: Known-wrong mechanisms and remedies per Pod: a clause that seems to assert one is asked about and marked for
#: review, its shares withheld until the instructor decides (see judge_explanation).
_WRONG = {
    "train": (
        WrongClaim(re.compile(r"(被|让)(别的|其他|其它|其余)?.{0,8}(占(满|用|着|了)|用(满|光|完))|占满|"
                              r"\bin use\b|occupied|held by", re.I),
                   "卡被别的 Pod 占着", "集群里真有别的 Pod 占着这台节点的卡吗？"),
        WrongClaim(re.compile(r"(device ?plugin|设备插件).{0,8}(挂|崩|停|没(有)?(在)?运行|down|crash|not running)",
                              re.I),
                   "device plugin 没在运行", "那样的话 allocatable 里还会剩下卡吗？"),
        WrongClaim(re.compile(r"(加|添加|补|写)(上|个|一个)?.{0,4}(容忍|toleration)", re.I),
                   "加上容忍就能解决", "看看 train 的 spec：它本来有没有容忍？", kind="remedy"),
        WrongClaim(re.compile(r"(删|停|杀|清理).{0,10}(别的|其他|其它|其余).{0,6}(Pod|pod|任务|作业)", re.I),
                   "腾出别的 Pod 占着的卡就能解决", "集群里真有别的 Pod 占着这台节点的卡吗？", kind="remedy"),
    ),
    "infer": (
        WrongClaim(re.compile(r"驱动.{0,6}(太新|过新)|驱动(的)?(版本)?比.{0,12}(新|高)|"
                              r"(镜像|运行时|runtime|image).{0,10}(太旧|过旧|太老|太低|过低)|"
                              r"(镜像|运行时|runtime|image)(里)?(的)?(CUDA)?(版本)?比.{0,12}(旧|老|低)", re.I),
                   "驱动比镜像里的 CUDA 新", "对照 nvidia-smi 表头的 CUDA Version（驱动支持到哪个版本）和镜像标签里的 "
                   "CUDA 版本，再看看谁比谁新。"),
        # a newer driver (the right remedy) is not a newer image: the words between may not name the driver
        WrongClaim(re.compile(r"(换|升级|更新|改|用)(成|到|为)?(?:(?!驱动|driver).){0,6}(更新|最新|新版|更高|latest|newer)"
                              r"(?:(?!驱动|driver).){0,8}(CUDA|镜像|image|运行时|runtime)", re.I),
                   "换一个 CUDA 更新的镜像就能解决", "对照节点驱动支持的 CUDA 版本和镜像标签里的版本，想想该往哪个方向换。",
                   kind="remedy"),
        WrongClaim(re.compile(r"(降级|降低|回退|downgrade).{0,6}(驱动|driver)|(驱动|driver).{0,6}(降级|回退|downgrade)",
                              re.I),
                   "降级驱动就能解决", "驱动版本越低，它能支持的 CUDA 版本是更高还是更低？", kind="remedy"),
        WrongClaim(_UNHEALTHY, "infer 起不来是因为卡坏了", "infer 已经分到卡并启动了，它的日志里是哪一条错误？"),
    ),
    "dev-notebook": (
        WrongClaim(re.compile(r"(资源|GPU|gpu|卡|显存).{0,6}(不够|不足|耗尽|用完|占满|满了|被占)|insufficient|"
                              r"not enough", re.I),
                   "GPU 节点是因为卡不够才排除了 dev-notebook", "调度器的消息里 GPU 节点是因为什么被排除的？",
                   unless=_OTHER_NODES),
        WrongClaim(_UNHEALTHY, "GPU 节点是因为卡坏了才排除了 dev-notebook", "调度器的消息里 GPU 节点是因为什么被排除的？",
                   unless=_OTHER_NODES),
        WrongClaim(re.compile(r"驱逐|evict", re.I),
                   "dev-notebook 被驱逐了", "它在 GPU 节点上运行过吗？", unless=re.compile(r"NoExecute", re.I)),
        WrongClaim(re.compile(r"(驱动|driver|CUDA ?版本).{0,8}(太旧|太新|过旧|过低|不匹配|不兼容|不够|mismatch|"
                              r"incompatible|too old|insufficient)", re.I),
                   "dev-notebook 的问题出在驱动或 CUDA 版本上", "dev-notebook 被调度了吗？它的容器启动过吗？"),
    ),
}


def _explain(ctx: Context, pod: str):
    """Scored on what it claims (:func:`~gpulab.grading.checks.judge_explanation`): each part of the right
    mechanism earns a share; a clause that seems to assert a known-wrong mechanism (two shares) or remedy
    (one) is asked about and marked for review, its shares withheld until the instructor decides."""
    texts = ctx.value("explanations")
    text = texts.get(pod) if isinstance(texts, dict) else None
    concepts = [(pattern, f"{pod} 的解释{msg}") for pattern, msg in _CONCEPTS[pod]]
    return judge_explanation(text, concepts, _WRONG[pod], min_chars=10, subject=f"{pod} 的解释",
                             too_short=f"explanations[\"{pod}\"] 应该是你自己写的一两句话。")


@check("explain-train", points=2, title="解释 train 的问题")
def explain_train(ctx: Context):
    return _explain(ctx, "train")


@check("explain-infer", points=2, title="解释 infer 的问题")
def explain_infer(ctx: Context):
    return _explain(ctx, "infer")


@check("explain-dev-notebook", points=2, title="解释 dev-notebook 的问题")
def explain_dev_notebook(ctx: Context):
    return _explain(ctx, "dev-notebook")
