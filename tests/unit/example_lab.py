"""Worked example: checks for a lab built around the chapter's ``gpu-train-demo`` Job.

Test code, not a lab of the course: the grading tests load it by path
(``grading_support.EXAMPLE_LAB``, ``load_lab_checks(path)``); its ``LAB`` makes the lab id "example".

The lab notebook records two values and leaves the Job in its namespace:

- ``record("allocatable_gpus", {node: count, ...})`` — what
  ``kubectl get nodes -o json | jq '.items[].status.allocatable'`` showed;
- ``record("train_log", text)`` — the output of ``kubectl logs job/gpu-train-demo``.

Each check compares the learner's work with what the cluster itself reports
(captured ``Node`` and ``Job`` objects), so no answer is hard-coded here, and
each failure message says what is wrong and where to look, not what to type.
"""

from __future__ import annotations

from gpulab.grading.checks import (
    Context,
    check,
    containers,
    dig,
    failed,
    partial,
    passed,
    pod_spec,
    quantity_int,
    ratio,
)

LAB = "example"
JOB = "gpu-train-demo"
GPU = "nvidia.com/gpu"
AI_LABEL = "node-role.kubernetes.io/ai"


def _job(ctx: Context) -> dict:
    return ctx.require("Job", JOB, ctx.namespace)


@check("allocatable-recorded", points=2, title="记录了每个 GPU 节点可分配的卡数")
def allocatable_recorded(ctx: Context):
    recorded = ctx.value("allocatable_gpus")
    if not isinstance(recorded, dict):
        return failed("allocatable_gpus 应该是「节点名 → 卡数」的字典。")
    actual = {}
    for node in ctx.objects("Node"):
        count = quantity_int(dig(node, "status", "allocatable", GPU))
        if count:
            actual[node["metadata"]["name"]] = count
    if not actual:
        return failed("评分时集群里没有任何节点上报 nvidia.com/gpu，无法核对；请联系讲师。")
    right = [n for n, c in actual.items() if quantity_int(recorded.get(n)) == c]
    extra = [n for n in recorded if n not in actual]
    if len(right) == len(actual) and not extra:
        return passed()
    problems = []
    if len(right) < len(actual):
        problems.append(f"{len(actual) - len(right)} 个 GPU 节点的卡数与 allocatable 不一致或没有记录")
    if extra:
        problems.append("记录里有节点并没有在 allocatable 里上报 nvidia.com/gpu（标签不等于资源）")
    fraction = max(0, len(right) - len(extra)) / len(actual)
    return partial(fraction, "；".join(problems) + "。看 status.allocatable，而不是节点标签。")


@check("job-gpu-limit", points=2, title="训练容器按规矩申请了 GPU")
def job_gpu_limit(ctx: Context):
    job = _job(ctx)
    requested = [c for c in containers(job) if GPU in (dig(c, "resources", "limits") or {})]
    if not requested:
        return failed("Job 的容器没有在 resources.limits 里申请 nvidia.com/gpu：不写 limits，容器里就看不见卡。")
    limit = quantity_int(requested[0]["resources"]["limits"][GPU])
    if limit is None or limit < 1:
        return failed("nvidia.com/gpu 只能是正整数。")
    if limit != 1:
        return partial(0.5, "这个训练只需要 1 张卡；多申请的卡在它运行期间别人都用不了。")
    return passed()


@check("job-placement", points=2, title="Job 能且只能调度到 GPU 节点")
def job_placement(ctx: Context):
    spec = pod_spec(_job(ctx))
    problems = []
    selector_ok = (spec.get("nodeSelector") or {}).get(AI_LABEL) == "true" or bool(
        dig(spec, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution"))
    if not selector_ok:
        problems.append("Pod 没有主动挑选 GPU 节点（看看 GPU 节点上有哪个角色标签）")
    tolerated = any(t.get("key") == GPU and t.get("effect") in (None, "", "NoSchedule")
                    and (t.get("operator") == "Exists" or t.get("value") == "true")
                    for t in spec.get("tolerations") or [])
    if not tolerated:
        problems.append("Pod 没有容忍 GPU 节点上的污点，调度器不会把它放上去（用 kubectl describe node 查看 Taints）")
    return ratio(2 - len(problems), 2, problems)


@check("job-bounded", points=2, title="训练失败时不会无限烧卡")
def job_bounded(ctx: Context):
    job = _job(ctx)
    problems = []
    if pod_spec(job).get("restartPolicy") != "Never":
        problems.append("失败的训练容器会被原地重启，重试应该交给 Job 的 backoffLimit 来计数")
    if dig(job, "spec", "backoffLimit") is None:
        problems.append("没有显式设置重试次数上限")
    if dig(job, "spec", "activeDeadlineSeconds") is None:
        problems.append("没有给整个 Job 设总时长上限")
    return ratio(3 - len(problems), 3, problems)


@check("job-succeeded", points=1, title="训练 Job 成功完成")
def job_succeeded(ctx: Context):
    job = _job(ctx)
    if (dig(job, "status", "succeeded") or 0) >= 1:
        return passed()
    if dig(job, "status", "failed"):
        return failed("Job 的 Pod 失败了：用 kubectl logs job/gpu-train-demo 看看容器输出了什么。")
    return failed("Job 还没有成功完成：如果 Pod 卡在 Pending，用 kubectl describe pod 看 Events 里是哪一类原因。")


@check("train-log", points=1, title="记录了训练日志")
def train_log(ctx: Context):
    log = ctx.value("train_log")
    if not isinstance(log, str) or not log.strip():
        return failed("train_log 应该是 kubectl logs 输出的文本。")
    if "train step done" not in log:
        return failed("记录的日志里没有训练完成的那一行：确认是在 Job 成功之后再取的日志。")
    return passed()
