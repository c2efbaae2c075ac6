"""Checks for ``labs/05-training-job.ipynb``: a training Job that survives a failure.

The notebook creates the ConfigMap ``train-scripts`` (the given ``train.py``
and ``prepare.sh``), the learner's PVC ``train-ckpt`` and Job ``train``, waits
for the Job to finish, and records ``failed_attempts`` (failed Pods of the
Job), ``resumed_step`` (the step the successful attempt resumed from, read
from its log) and ``emptydir_resume_step`` (from which step a second attempt
would start if the checkpoint were on an emptyDir). Checks read the Job, its
Pods, the PVC and the containers' logs (``LOGS``).
"""

from __future__ import annotations

import re
from datetime import datetime

from gpulab.grading.checks import Context, check, containers, dig, failed, partial, passed, pod_spec, quantity_int, ratio

LAB = "05-training-job"
GPUS_FREE = 1
LOGS = True
CELL_TIMEOUT = 150
TIMEOUT = 300

GPU = "nvidia.com/gpu"
JOB = "train"
TRAIN = "train"
PVC = "train-ckpt"
DEFAULT_DATA_DIR = "/data"
DEFAULT_CKPT_DIR = "/ckpt"
RESUMED = re.compile(r"resumed from checkpoint at step (\d+)")
FRESH = re.compile(r"no checkpoint found, starting from step (\d+)")
#: The Job controller waits this long before it recreates a failed Pod, doubling each time (10 s, 20 s, 40 s …,
#: capped at 6 min): the first retry starts no sooner than this after the first failure.
RETRY_BACKOFF_SECONDS = 10


def job(ctx: Context) -> dict:
    return ctx.require("Job", JOB, ctx.namespace)


def train_container(obj: dict) -> dict | None:
    return next((c for c in containers(obj) if c.get("name") == TRAIN), None)


def env_value(container: dict, name: str, default: str) -> str:
    for item in container.get("env") or []:
        if item.get("name") == name and "value" in item:
            return str(item["value"])
    return default


def mount_volume(container: dict, path: str) -> str | None:
    """The volume name mounted at ``path`` (or at a parent of it) in ``container``."""
    best = None
    for m in container.get("volumeMounts") or []:
        mp = (m.get("mountPath") or "").rstrip("/") or "/"
        if path == mp or path.startswith(mp + "/"):
            if best is None or len(mp) > len(best[0]):
                best = (mp, m.get("name"))
    return best[1] if best else None


def volume(spec: dict, name: str | None) -> dict | None:
    return next((v for v in spec.get("volumes") or [] if v.get("name") == name), None)


def job_pods(ctx: Context) -> list[dict]:
    return [p for p in ctx.objects("Pod", ctx.namespace) if (p["metadata"].get("labels") or {}).get("job-name") == JOB]


def pod_log(ctx: Context, pod: str, container: str) -> str:
    for log in ctx.objects("PodLog", ctx.namespace):
        if log["metadata"]["name"] == pod and log.get("container") == container:
            return log.get("log") or ""
    return ""


def resumed_step(ctx: Context) -> int | None:
    for pod in job_pods(ctx):
        if dig(pod, "status", "phase") == "Succeeded":
            found = RESUMED.search(pod_log(ctx, pod["metadata"]["name"], TRAIN))
            if found:
                return int(found.group(1))
    return None


def _time(stamp: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")) if stamp else None
    except ValueError:
        return None


def by_creation(pods: list[dict]) -> list[dict]:
    return sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "")


def first_failure_after(j: dict, pods: list[dict]) -> float | None:
    """Seconds from the Job's start to the first attempt's training container exiting non-zero, if captured."""
    start = _time(dig(j, "status", "startTime"))
    ends = []
    for pod in pods:
        for status in dig(pod, "status", "containerStatuses", default=[]) or []:
            if status.get("name") != TRAIN:
                continue
            for state in (dig(status, "state", "terminated"), dig(status, "lastState", "terminated")):
                end = _time((state or {}).get("finishedAt"))
                if state and state.get("exitCode") not in (None, 0) and end:
                    ends.append(end)
    if start is None or not ends:
        return None
    return max(0.0, (min(ends) - start).total_seconds())


def condition(obj: dict, kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True" for c in dig(obj, "status", "conditions") or [])


@check("job-bounded", points=3, title="失败有上限：Never、backoffLimit、activeDeadlineSeconds")
def job_bounded(ctx: Context):
    """Three limits: ``restartPolicy: Never``, a ``backoffLimit`` that allows a retry (1–6), an
    ``activeDeadlineSeconds`` of at most an hour that leaves room for a retry. The deadline counts from the
    Job's start, retries included, and the Job controller recreates a failed Pod only after its back-off
    (:data:`RETRY_BACKOFF_SECONDS`, doubling per retry): a deadline that ends before one retry can run —
    the back-off plus twice the time the first attempt took to fail, when the run shows it; the back-off
    alone otherwise — forbids retries as surely as ``backoffLimit: 0``, and costs the same point."""
    j = job(ctx)
    problems, score = [], 0
    if pod_spec(j).get("restartPolicy") == "Never":
        score += 1
    else:
        problems.append("失败的容器会在同一个 Pod 里原地重启：训练失败的重试应该交给 Job 来计数")
    backoff = dig(j, "spec", "backoffLimit")
    if backoff is None:
        problems.append("没有显式写 backoffLimit：默认值是多少、对一个烧卡的训练合适吗？")
    elif backoff < 1:
        problems.append("backoffLimit 不允许任何重试：出一次错就放弃，检查点就派不上用场了")
    elif backoff > 6:
        problems.append("backoffLimit 太大：代码或数据有问题时会一直重试、一直占着卡")
    else:
        score += 1
    deadline = dig(j, "spec", "activeDeadlineSeconds")
    first = first_failure_after(j, job_pods(ctx))
    needed = RETRY_BACKOFF_SECONDS + 2 * (first or 0)
    if deadline is None:
        problems.append("没有给整个 Job 一个总时长上限")
    elif deadline > 3600:
        problems.append("总时长上限超过一小时，对这个几秒钟的训练来说等于没有上限")
    elif deadline <= needed:
        seen = f"第一次尝试在 Job 开始约 {first:.0f} 秒后失败；" if first is not None else ""
        problems.append(f"activeDeadlineSeconds 只有 {deadline} 秒：{seen}Job 控制器要先退避 {RETRY_BACKOFF_SECONDS} 秒"
                        "（之后每次翻倍）才重建 Pod，重试还得再跑一遍——这个上限里放不下一次重试，"
                        "效果和 backoffLimit: 0 一样，检查点派不上用场")
    else:
        score += 1
    return ratio(score, 3, problems)


@check("init-prepares-data", points=2, title="initContainer 在训练前准备好数据")
def init_prepares_data(ctx: Context):
    j = job(ctx)
    spec = pod_spec(j)
    inits = spec.get("initContainers") or []
    train = train_container(j)
    if not inits:
        return failed("Job 的 Pod 模板里没有 initContainer：数据准备应该在主容器启动之前完成。")
    if train is None:
        return failed(f"Job 的 Pod 模板里没有名为 {TRAIN} 的容器。")
    data_dir = env_value(train, "DATA_DIR", DEFAULT_DATA_DIR)
    data_volume = mount_volume(train, data_dir)
    shared = [c for c in inits if data_volume and any(m.get("name") == data_volume for m in c.get("volumeMounts") or [])]
    problems, score = [], 0
    if shared:
        score += 1
    else:
        problems.append("initContainer 和训练容器没有共享存放数据集的卷：initContainer 写下的文件，训练容器看不到")
    ran = False
    for pod in job_pods(ctx):
        for status in dig(pod, "status", "initContainerStatuses", default=[]) or []:
            term = dig(status, "state", "terminated") or dig(status, "lastState", "terminated") or {}
            if term.get("exitCode") == 0:
                ran = True
    if ran:
        score += 1
    else:
        problems.append("没有看到 initContainer 成功运行完：用 kubectl logs 的 -c 参数看看它的输出")
    return ratio(score, 2, problems)


@check("checkpoint-on-pvc", points=3, title="检查点写在 PVC 上")
def checkpoint_on_pvc(ctx: Context):
    j = job(ctx)
    spec = pod_spec(j)
    train = train_container(j)
    if train is None:
        return failed(f"Job 的 Pod 模板里没有名为 {TRAIN} 的容器。")
    ckpt_dir = env_value(train, "CKPT_DIR", DEFAULT_CKPT_DIR)
    vol = volume(spec, mount_volume(train, ckpt_dir))
    if vol is None:
        return failed(f"训练容器的检查点目录 {ckpt_dir} 没有挂任何卷：写在容器自己的文件系统里，Pod 一没就全没了。")
    claim = dig(vol, "persistentVolumeClaim", "claimName")
    if claim is None:
        kind = next((k for k in vol if k != "name"), "?")
        return failed(f"检查点目录挂的是 {kind} 卷：它的生命周期和 Pod 绑在一起，Pod 重建后就是空的。")
    pvc = ctx.object("PersistentVolumeClaim", claim, ctx.namespace)
    if pvc is None:
        return partial(2 / 3, f"Job 引用的 PVC {claim} 不在命名空间里。")
    if dig(pvc, "status", "phase") != "Bound":
        return partial(2 / 3, f"PVC {claim} 没有绑定到卷（{dig(pvc, 'status', 'phase') or '未知'}）：它能被 Pod 挂上吗？")
    return passed()


@check("gpu-limit", points=1, title="训练容器申请了 1 张 GPU")
def gpu_limit(ctx: Context):
    train = train_container(job(ctx))
    if train is None:
        return failed(f"Job 的 Pod 模板里没有名为 {TRAIN} 的容器。")
    count = quantity_int(dig(train, "resources", "limits", GPU))
    if count is None:
        return failed("训练容器没有在 limits 里申请 nvidia.com/gpu。")
    if count != 1:
        return failed("这个训练只需要 1 张卡。")
    return passed()


@check("resumed-after-failure", points=3, title="失败一次后从检查点恢复并完成")
def resumed_after_failure(ctx: Context):
    """An outcome check: the Job completed, a failed and a succeeded attempt exist, the succeeded one
    resumed from the checkpoint. Messages say what the Job's conditions, its Pods and their logs show."""
    j = job(ctx)
    pods = by_creation(job_pods(ctx))
    problems, score = [], 0
    if condition(j, "Complete"):
        score += 1
    elif condition(j, "Failed"):
        reason = next((c.get("reason") for c in dig(j, "status", "conditions") or [] if c.get("type") == "Failed"), "")
        if reason == "DeadlineExceeded":
            deadline = dig(j, "spec", "activeDeadlineSeconds")
            limit = f"activeDeadlineSeconds（{deadline} 秒）" if deadline is not None else "总时长上限"
            if len(pods) <= 1:
                problems.append(f"Job 失败了（DeadlineExceeded）：{limit}到期时只有 {len(pods)} 个 Pod，"
                                "Job 控制器没有建第二个 Pod 去重试——这个上限给重试留了多少时间？")
            else:
                problems.append(f"Job 失败了（DeadlineExceeded）：{limit}到期时有 {len(pods)} 次尝试，最后一次没跑完——"
                                "看看每次尝试的日志，各跑到了第几步")
        else:
            problems.append(f"Job 失败了（{reason}），{len(pods)} 个 Pod："
                            "看看每次尝试的日志，第二次是从哪里开始的")
    else:
        problems.append("Job 还没有结束：等它完成（或失败）之后再记录结果")
    failed_pods = [p for p in pods if dig(p, "status", "phase") == "Failed"]
    succeeded = [p for p in pods if dig(p, "status", "phase") == "Succeeded"]
    if failed_pods and succeeded:
        score += 1
    else:
        problems.append(f"没有看到「一次失败、再一次成功」的两个 Pod（失败 {len(failed_pods)} 个，成功 {len(succeeded)} 个）")
    step = resumed_step(ctx)
    if step:
        score += 1
    elif succeeded:
        problems.append("成功的那次尝试没有从检查点恢复（它的日志里是从第 0 步开始的吗？）")
    else:
        fresh = [i + 1 for i, p in enumerate(pods)
                 if i and FRESH.search(pod_log(ctx, p["metadata"]["name"], TRAIN))]
        if fresh:
            problems.append(f"没有一次尝试成功，第 {fresh[0]} 次尝试的日志写着 no checkpoint found：它从头开始了")
        else:
            problems.append("没有一次尝试成功，也就没有「从检查点恢复」的那份日志")
    return ratio(score, 3, problems)


@check("attempts-recorded", points=2, title="从 Pod 和日志里读出了尝试次数与恢复位置")
def attempts_recorded(ctx: Context):
    """A step check: both values are judged against what the Job's Pods and logs show — ``resumed_step``
    recorded as ``None`` when no attempt resumed from a checkpoint reads them right."""
    failed_pods = [p for p in job_pods(ctx) if dig(p, "status", "phase") == "Failed"]
    problems, score = [], 0
    attempts = ctx.value("failed_attempts", None)
    if not ctx.has("failed_attempts"):
        problems.append("没有记录 failed_attempts：记录它的单元格运行到了吗？")
    elif isinstance(attempts, int) and not isinstance(attempts, bool) and attempts == len(failed_pods):
        score += 1
    else:
        problems.append("failed_attempts 和 Job 实际失败的 Pod 数不一致（kubectl get pods -l job-name=train）")
    step = resumed_step(ctx)
    recorded = ctx.value("resumed_step", None)
    if not ctx.has("resumed_step"):
        problems.append("没有记录 resumed_step：记录它的单元格运行到了吗？")
    elif recorded == step:
        score += 1
    elif step is None:
        problems.append(f"resumed_step 记录的是 {recorded!r}，可没有一次成功的尝试在日志里写着从检查点恢复")
    else:
        problems.append("resumed_step 和成功那次尝试日志里写的恢复位置不一致")
    return ratio(score, 2, problems)


@check("emptydir-question", points=1, title="如果检查点放在 emptyDir 里")
def emptydir_question(ctx: Context):
    answer = ctx.value("emptydir_resume_step")
    if isinstance(answer, bool) or not isinstance(answer, int):
        return failed("emptydir_resume_step 应该是一个整数（第几步）。")
    if answer != 0:
        return failed("想一想 emptyDir 是跟着什么一起创建、一起删除的，重试时 Job 给你的是同一个 Pod 吗？")
    return passed()
