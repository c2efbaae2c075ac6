"""Checks for ``labs/07-quota-priority.ipynb``: GPU quota and priority for two teams on a 2-GPU cluster.

Namespaces ``<namespace>-team-a`` (critical training) and
``<namespace>-team-b`` (batch). The learner writes a ResourceQuota per team
and the PriorityClasses ``training-critical`` and ``batch-low``; the notebook
then fills both GPUs with team-b's low-priority ``batch`` Deployment, tries
team-a's 2-GPU ``big-train`` (over quota: must be rejected) and runs team-a's
1-GPU ``train-critical``, which the real scheduler can only place by
preempting a batch Pod. Recorded: ``over_quota_error`` (the rejection),
``preempted_pod`` (the victim's name) and ``team_a_gpus_left`` (what team-a's
quota still allows).
"""

from __future__ import annotations

from gpulab.grading.checks import Context, check, dig, failed, partial, passed, quantity_int, ratio

LAB = "07-quota-priority"
NAMESPACES = ("team-a", "team-b")
CLUSTER_WIDE = True
PRIORITY_CLASSES = ("training-critical", "batch-low")
CLUSTER_RULES = ({"apiGroups": ["scheduling.k8s.io"], "resources": ["priorityclasses"],
                  "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},)
GPUS_FREE = 2
CELL_TIMEOUT = 90
TIMEOUT = 240

QUOTA_KEY = "requests.nvidia.com/gpu"
QUOTA = {"team-a": 1, "team-b": 2}
HIGH, LOW = PRIORITY_CLASSES


def team(ctx: Context, suffix: str) -> str:
    return f"{ctx.namespace}-{suffix}"


def enforced_gpu_quota(ctx: Context, ns: str) -> tuple[dict | None, int | None, list[dict]]:
    """The quota that meters GPUs in ``ns`` (the quota controller lists it in status.used), its hard value, all quotas."""
    quotas = ctx.objects("ResourceQuota", ns)
    for q in quotas:
        if QUOTA_KEY in (dig(q, "status", "used") or {}):
            return q, quantity_int(dig(q, "spec", "hard", QUOTA_KEY)), quotas
    return None, None, quotas


def _quota_check(ctx: Context, suffix: str):
    ns = team(ctx, suffix)
    quota, hard, quotas = enforced_gpu_quota(ctx, ns)
    if quota is None:
        if not quotas:
            return failed(f"{ns} 里没有 ResourceQuota。")
        keys = sorted({k for q in quotas for k in (dig(q, "spec", "hard") or {})})
        return failed(f"{ns} 的配额没有计量 GPU（写了 {', '.join(keys) or '空的 hard'}）：配额控制器在 status.used 里"
                      "统计它了吗？扩展资源的配额要用哪种写法？")
    if hard is None:
        return partial(0.5, f"{ns} 的 GPU 配额不是整数张卡。")
    if hard != QUOTA[suffix]:
        return partial(0.5, f"{ns} 的 GPU 配额和实验要求的张数不一样。")
    return passed()


@check("quota-team-a", points=2, title="team-a 的 GPU 配额")
def quota_team_a(ctx: Context):
    return _quota_check(ctx, "team-a")


@check("quota-team-b", points=1, title="team-b 的 GPU 配额")
def quota_team_b(ctx: Context):
    return _quota_check(ctx, "team-b")


@check("priority-classes", points=2, title="一高一低两个 PriorityClass")
def priority_classes(ctx: Context):
    high, low = ctx.object("PriorityClass", HIGH), ctx.object("PriorityClass", LOW)
    missing = [n for n, pc in ((HIGH, high), (LOW, low)) if pc is None]
    if missing:
        return failed(f"集群里没有 PriorityClass {', '.join(missing)}。")
    problems, score = [], 0
    if (high.get("value") or 0) > (low.get("value") or 0):
        score += 1
    else:
        problems.append(f"{HIGH} 的 value 没有比 {LOW} 高：调度器按 value 比较优先级")
    if not high.get("globalDefault") and not low.get("globalDefault"):
        score += 1
    else:
        problems.append("有一个 PriorityClass 设成了 globalDefault：以后所有没写优先级的 Pod 都会用它")
    return ratio(score, 2, problems)


@check("over-quota-rejected", points=2, title="超出配额的 big-train 被直接拒绝")
def over_quota_rejected(ctx: Context):
    ns = team(ctx, "team-a")
    quota, _, _ = enforced_gpu_quota(ctx, ns)
    if quota is None:
        return failed(f"{ns} 没有计量 GPU 的配额，big-train 无从被配额拒绝。")
    problems, score = [], 0
    if ctx.object("Pod", "big-train", ns) is None:
        score += 1
    else:
        problems.append("big-train 被创建出来了（哪怕是 Pending）：配额应该在创建时就拒绝它，而不是让它排队")
    text = ctx.value("over_quota_error", "")
    if isinstance(text, str) and "exceeded quota" in text and quota["metadata"]["name"] in text:
        score += 1
    else:
        problems.append("over_quota_error 不是 team-a 的 GPU 配额拒绝 big-train 时 apiserver 返回的错误")
    return ratio(score, 2, problems)


@check("preemption", points=3, title="高优先级训练抢占了低优先级批处理")
def preemption(ctx: Context):
    ns_a, ns_b = team(ctx, "team-a"), team(ctx, "team-b")
    pod = ctx.object("Pod", "train-critical", ns_a)
    if pod is None:
        return failed(f"{ns_a} 里没有 train-critical：它引用的 PriorityClass 存在吗？")
    problems, score = [], 0
    if dig(pod, "spec", "priorityClassName") == HIGH and dig(pod, "spec", "nodeName") \
            and dig(pod, "status", "phase") in ("Running", "Succeeded"):
        score += 1
    else:
        problems.append("train-critical 没有以高优先级运行起来")
    uid = pod["metadata"].get("uid", "")
    preempted = [e for e in ctx.objects("Event", ns_b) if e.get("reason") == "Preempted" and uid and uid in
                 (e.get("message") or "")]
    if preempted:
        score += 1
    else:
        problems.append(f"{ns_b} 里没有被 train-critical 抢占的 Pod：它启动时两张卡都被 batch 占着吗？")
    pending = [p for p in ctx.objects("Pod", ns_b, labels={"app": "batch"})
               if dig(p, "status", "phase") == "Pending" and not dig(p, "spec", "nodeName")]
    if pending:
        score += 1
    else:
        problems.append("batch 的替补 Pod 没有停在 Pending：被抢占的卡真的让出来了吗？")
    return ratio(score, 3, problems)


@check("victim-recorded", points=1, title="记录了被抢占的 Pod")
def victim_recorded(ctx: Context):
    ns_b = team(ctx, "team-b")
    victims = {dig(e, "involvedObject", "name") for e in ctx.objects("Event", ns_b) if e.get("reason") == "Preempted"}
    recorded = ctx.value("preempted_pod")
    if not victims:
        return failed("集群里没有抢占事件可以对照。")
    if recorded in victims:
        return passed()
    return failed("preempted_pod 不是被抢占的那个 Pod 的名字：看 team-b 里 reason 为 Preempted 的事件。")


@check("quota-left", points=1, title="读懂配额的已用与剩余")
def quota_left(ctx: Context):
    quota, hard, _ = enforced_gpu_quota(ctx, team(ctx, "team-a"))
    answer = ctx.value("team_a_gpus_left")
    if isinstance(answer, bool) or not isinstance(answer, int):
        return failed("team_a_gpus_left 应该是一个整数。")
    if quota is None or hard is None:
        return failed("team-a 没有计量 GPU 的配额，无法核对。")
    used = quantity_int(dig(quota, "status", "used", QUOTA_KEY)) or 0
    if answer != hard - used:
        return failed("和 team-a 配额的 status 对不上：剩余 = hard − used（kubectl describe resourcequota）。")
    return passed()
