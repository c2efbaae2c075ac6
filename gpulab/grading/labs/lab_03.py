"""Checks for ``labs/03-taints-tolerations.ipynb`` (the chapter's exercise 2).

The notebook labels and taints the GPU node, applies the given ``web-plain``
Pod (selects the AI node, tolerates nothing), writes ``web-tolerant`` (same
selector, plus a toleration) and records:

- ``plain_reason``: the scheduler's FailedScheduling message for web-plain;
- ``tolerant_node``: where web-tolerant landed;
- ``toleration_attracts``: whether a toleration alone would pull a Pod onto
  the GPU node (a yes/no question);
- ``explanation``: in the learner's words, why web-plain is kept off the node.

Node labels and taints are cluster-wide state: the grader restores them after
every submission (``CLUSTER_WIDE``).
"""

from __future__ import annotations

import re

from gpulab.grading.checks import (Context, WrongClaim, check, dig, failed, judge_explanation, partial, passed,
                                   nodes_with, pod_spec, ratio, scheduling_messages)

LAB = "03-taints-tolerations"
CLUSTER_WIDE = True
NODE_LABELS = ("node-role.kubernetes.io/ai",)
NODE_TAINTS = ("nvidia.com/gpu",)
CLUSTER_RULES = ({"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch", "update"]},)
CELL_TIMEOUT = 90
TIMEOUT = 240

GPU = "nvidia.com/gpu"
AI_LABEL = "node-role.kubernetes.io/ai"
TAINT = {"key": GPU, "value": "true", "effect": "NoSchedule"}



def tolerates_gpu_taint(spec: dict) -> bool:
    for t in spec.get("tolerations") or []:
        if t.get("effect") not in (None, "", "NoSchedule"):
            continue
        key, op = t.get("key"), t.get("operator") or "Equal"
        if op == "Exists" and key in (None, "", GPU):
            return True
        if op == "Equal" and key == GPU and t.get("value") == TAINT["value"]:
            return True
    return False


@check("node-label-taint", points=3, title="GPU 节点打上了角色标签和 GPU 污点")
def node_label_taint(ctx: Context):
    nodes = nodes_with(ctx, GPU)
    if not nodes:
        return failed("评分时集群里找不到 GPU 节点，无法核对；请联系讲师。")
    node = nodes[0]
    problems, score = [], 0
    if (node["metadata"].get("labels") or {}).get(AI_LABEL) == "true":
        score += 1
    else:
        problems.append("GPU 节点没有章节里那个 AI 角色标签（值也要对）")
    taints = dig(node, "spec", "taints", default=[]) or []
    same_key = [t for t in taints if t.get("key") == GPU]
    if any(t.get("value") == TAINT["value"] and t.get("effect") == TAINT["effect"] for t in same_key):
        score += 2
    elif same_key:
        score += 1
        problems.append("GPU 节点有 nvidia.com/gpu 污点，但值或效果和要求的不一样（对照 key=value:effect 的写法）")
    else:
        problems.append("GPU 节点上没有 nvidia.com/gpu 污点")
    return ratio(score, 3, problems)


@check("plain-pod-repelled", points=2, title="不带容忍的 web-plain 被污点挡在 GPU 节点之外")
def plain_pod_repelled(ctx: Context):
    pod = ctx.require("Pod", "web-plain", ctx.namespace)
    if tolerates_gpu_taint(pod_spec(pod)):
        return failed("web-plain 应该保持原样、不带任何容忍：它是用来观察污点效果的对照组。")
    node = dig(pod, "spec", "nodeName")
    if node:
        return failed(f"web-plain 被调度到了 {node}：GPU 节点上的污点生效了吗？")
    messages = scheduling_messages(ctx, "web-plain")
    if not messages:
        return failed("web-plain 没有被调度，但也没有调度失败的事件：等调度器处理过它再继续。")
    if not any("untolerated taint" in m for m in messages):
        return failed("web-plain 停在 Pending，但调度器给出的原因里没有提到污点：是不是 GPU 节点的标签还没打，"
                      "它根本没有资格上那台节点？")
    return passed()


@check("plain-reason-recorded", points=2, title="记录了调度器对 web-plain 的原话")
def plain_reason_recorded(ctx: Context):
    recorded = ctx.value("plain_reason")
    if not isinstance(recorded, str) or not recorded.strip():
        return failed("plain_reason 应该是 web-plain 的 FailedScheduling 事件里的消息文本。")
    messages = scheduling_messages(ctx, "web-plain")
    if not messages:
        return failed("集群里没有 web-plain 的 FailedScheduling 事件可以对照。")
    text = " ".join(recorded.split())
    if any(" ".join(m.split())[:60] in text or text in m for m in messages) and "untolerated taint" in text:
        return passed()
    if "untolerated taint" in text:
        return partial(0.5, "记录的文字提到了污点，但和 web-plain 的调度事件对不上：直接从事件里取消息。")
    return failed("记录的文字不是 web-plain 因为污点而调度失败的那条事件消息（用 kubectl get events 看 web-plain 的事件）。")


@check("tolerant-pod", points=3, title="带容忍的 web-tolerant 落在了 GPU 节点上")
def tolerant_pod(ctx: Context):
    """Three criteria: the toleration matches the taint; the Pod landed on the GPU node (outcome: judged
    as it is, the message says what the Pod's status shows); ``tolerant_node`` records where it is (a step:
    judged against what was observed, so ``None`` for a Pod that never got a node is a correct reading —
    its not being scheduled costs the placement criterion only, once)."""
    pod = ctx.require("Pod", "web-tolerant", ctx.namespace)
    spec = pod_spec(pod)
    gpu = {n["metadata"]["name"] for n in nodes_with(ctx, GPU)}
    problems, score = [], 0
    if tolerates_gpu_taint(spec):
        score += 1
    else:
        problems.append("web-tolerant 的容忍和 GPU 节点上的污点对不上（key、value/operator、effect 三处都要对）")
    node = dig(pod, "spec", "nodeName")
    if node in gpu:
        score += 1
    elif node:
        problems.append(f"web-tolerant 落在了 {node}：容忍只是「允许」上 GPU 节点，要「挑」它还得靠标签选择")
    else:
        phase = dig(pod, "status", "phase") or "Pending"
        reasons = scheduling_messages(ctx, "web-tolerant")
        why = f"，调度器的原话：{reasons[-1]}" if reasons else "，也没有调度失败的事件"
        problems.append(f"web-tolerant 没有被调度（{phase}，spec.nodeName 为空{why}）：看看它的事件")
    recorded = ctx.value("tolerant_node", None)
    if node and recorded == node:
        score += 1
    elif not node and recorded in (None, ""):
        score += 1  # the Pod has no node and none was recorded: the reading matches what was observed
    elif node:
        problems.append(f"tolerant_node 记录的是 {recorded!r}，和 web-tolerant 实际所在的节点不一致")
    else:
        problems.append(f"tolerant_node 记录的是 {recorded!r}，可 web-tolerant 没有被调度到任何节点（spec.nodeName 为空）")
    return ratio(score, 3, problems)


@check("toleration-not-attraction", points=1, title="容忍不等于吸引")
def toleration_not_attraction(ctx: Context):
    answer = ctx.value("toleration_attracts")
    if not isinstance(answer, bool):
        return failed("toleration_attracts 应该是 True 或 False。")
    if answer:
        return failed("想一想：容忍改变的是 Pod 能去哪些节点，还是 Pod 想去哪些节点？"
                      "一个只带容忍、不写节点选择的 Pod，调度器会怎么在三台节点里挑？")
    return passed()


_CONCEPTS = (
    (re.compile(r"污点|taint", re.I), "解释里没有说清是节点上的什么把 Pod 挡在了外面"),
    (re.compile(r"容忍|toleration|tolerat", re.I), "解释里没有说 Pod 缺了什么才没被放行"),
    # Who decides, and when: the scheduler's filter (NoSchedule). Naming the scheduler is not enough —
    # the explanation must say it refuses, filters or skips the node.
    (re.compile(r"NoSchedule|过滤|filter|排除|筛掉|不会被调度|不调度|无法调度|调度不上|不能被?调度|unschedulable|"
                r"(调度器|scheduler|调度).{0,20}(不|拒|跳过|排除|过滤|filter|refus|reject|skip|won't|will not|"
                r"cannot|can't|doesn't|does not)", re.I),
     "解释里没有说这是在哪一步、由谁做出的决定（以及污点的效果是什么）"),
)

#: Mechanisms web-plain's own events contradict, shared with lab 08's dev-notebook.
WRONG_TAINT_CLAIMS = (
    WrongClaim(re.compile(r"(资源|GPU|gpu|卡|显存|内存|CPU|cpu|算力).{0,6}(不够|不足|耗尽|用完|占满|满了|被占)|"
                          r"insufficient|not enough|out of (gpus?|resources|memory)", re.I),
               "GPU 节点是因为资源不够才被排除的", "web-plain 的 FailedScheduling 事件里说 GPU 节点被排除的原因是什么？",
               # the other nodes really lack GPUs (or the selected label): a clause about them is not this claim
               unless=re.compile(r"另外|其他|其它|其余|别的节点|CPU ?节点|cpu nodes?|other nodes?", re.I)),
    WrongClaim(re.compile(r"(GPU ?节点|gpu node).{0,12}(标签|label).{0,8}(不匹配|对不上|不符|不一致|缺|mismatch)", re.I),
               "GPU 节点的标签和 web-plain 的 nodeSelector 对不上", "对照节点上的标签和 Pod 的 nodeSelector 再看一遍。"),
    WrongClaim(re.compile(r"驱逐|evict", re.I),
               "web-plain 被驱逐了", "它在 GPU 节点上运行过吗？驱逐的是已经在运行的 Pod。",
               # what NoExecute would do is a contrast, not a claim about web-plain
               unless=re.compile(r"NoExecute", re.I)),
    # web-plain really requests no GPU: saying so is a fact; the wrong claim is that this keeps it off the node
    WrongClaim(re.compile(r"(因为|由于|既然)[^，,]{0,12}?(没有|没|不)(申请|请求|要|需要).{0,6}(GPU|卡|nvidia\.com/gpu)|"
                          r"(没有|没|不)(申请|请求|要|需要).{0,6}(GPU|卡|nvidia\.com/gpu).{0,12}?"
                          r"(所以|因此|才|就|便|不能|不会|不允许|不让|上不去|进不去)|"
                          r"\b(because|since)\b.{0,24}(doesn't|does not|didn't|did not|don't|do not) "
                          r"(request|ask for|need).{0,10}gpu", re.I),
               "web-plain 因为没申请 GPU 才上不了 GPU 节点", "Kubernetes 会因为 Pod 没申请 GPU 就拦着它上 GPU 节点吗？"),
)


@check("explanation", points=3, title="解释为什么不带容忍的 Pod 不会跑到 GPU 节点上")
def explanation(ctx: Context):
    """Scored on what it claims (:func:`~gpulab.grading.checks.judge_explanation`): taint, toleration and
    the scheduler's filtering each earn a share; a clause that seems to assert a mechanism web-plain's events
    contradict is asked about and marked for review, two shares withheld until the instructor decides."""
    return judge_explanation(ctx.value("explanation"), _CONCEPTS, WRONG_TAINT_CLAIMS,
                             too_short="explanation 应该是你自己写的一两句话（至少十几个字）。")
