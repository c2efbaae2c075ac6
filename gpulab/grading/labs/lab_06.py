"""Checks for ``labs/06-inference-sizing.ipynb``: the chapter's exercise 3, deployed.

A 7B model server (16 GiB per replica, 90 s cold start) on the GPU node's
2 × 80 GB cards. The learner records ``sharing_scheme``, carves the cards if
the scheme needs it (``mig.strategy``, ``nvidia.com/mig.config``), chooses
the GPU resource, ``replicas`` and the ``startupProbe`` of Deployment
``llm`` (the notebook fills them into the given manifest), records
``startup_budget_seconds`` and writes the autoscaling/v2 HPA ``llm``.

The 90 s load is the ``model_load_seconds`` parameter of the notebook: 90 by
hand, ``PARAMETERS`` (0 s: weights already cached on the node) under the
grader, so a submission grades in seconds. The probe is judged against the stated 90 s, from the Deployment's
spec, with the kubelet's arithmetic (``initialDelaySeconds + failureThreshold
× periodSeconds``, Kubernetes' defaults for what is left out); the fast run
shows that the replicas really get their GPU share and pass their probes
under the simulated kubelet. The HPA is judged by its spec only: whether the
custom-metrics pipeline scales it is not this lab's question.
"""

from __future__ import annotations

from gpulab.grading import gpustack
from gpulab.kube.names import DEVICE_PLUGIN_CONFIG_LABEL
from gpulab.grading.checks import Context, check, containers, dig, failed, partial, passed, quantity_int, ratio
from gpulab.grading.labs.lab_04 import gpu_node, mig_offer, node_labels, pod_devices

LAB = "06-inference-sizing"
CLUSTER_WIDE = True
CLUSTER_RULES = gpustack.CLUSTER_RULES
NODE_LABELS = (DEVICE_PLUGIN_CONFIG_LABEL,)
GPUS_FREE = 2
SETUP, TEARDOWN = gpustack.make_hooks(())
COLLECT = gpustack.collect
PARAMETERS = {"model_load_seconds": 0}
CELL_TIMEOUT = 90
TIMEOUT = 180

GPU = "nvidia.com/gpu"
DEPLOY = "llm"
LOAD_SECONDS = 90
MARGIN = 1.2             # "留出余量": at least 20 % beyond the load
MODEL_MIB = 16 * 1024
HEADROOM = 1.5           # KV cache and batch peaks: a share should hold 1.5 × the resident weights
METRIC = "DCGM_FI_DEV_GPU_UTIL"
PROBE_DEFAULTS = {"initialDelaySeconds": 0, "periodSeconds": 10, "failureThreshold": 3}
SCHEMES = ("mig", "whole-gpu", "time-slicing", "mps")


def deployment(ctx: Context) -> dict:
    return ctx.require("Deployment", DEPLOY, ctx.namespace)


def server(ctx: Context) -> dict:
    return (containers(deployment(ctx)) or [{}])[0]


def resource_of(ctx: Context) -> str | None:
    names = [k for k in (dig(server(ctx), "resources", "limits") or {}) if k.startswith("nvidia.com/")]
    return names[0] if names else None


def share(ctx: Context, resource: str) -> tuple[int, int | None, bool]:
    """(shares the node advertises, MiB each, memory isolated) for ``resource``."""
    count, mib = mig_offer(ctx, resource)
    if mib:
        return count, mib, True
    labels = node_labels(ctx)
    alloc = quantity_int(dig(gpu_node(ctx) or {}, "status", "allocatable", resource)) or 0
    if resource == GPU:
        whole = quantity_int(labels.get("nvidia.com/gpu.memory"))
        shared = (quantity_int(labels.get("nvidia.com/gpu.replicas")) or 1) > 1
        return alloc, whole, not shared
    return alloc, None, False


def budget(probe: dict) -> int:
    values = {k: quantity_int(probe.get(k)) if probe.get(k) is not None else v for k, v in PROBE_DEFAULTS.items()}
    return (values["initialDelaySeconds"] or 0) + (values["failureThreshold"] or 0) * (values["periodSeconds"] or 0)


def llm_pods(ctx: Context) -> list[dict]:
    return [p for p in ctx.objects("Pod", ctx.namespace, labels={"app": DEPLOY})
            if not p["metadata"].get("deletionTimestamp")]


@check("scheme", points=2, title="共享方案选得对，并且真的用上了")
def scheme(ctx: Context):
    chosen = ctx.value("sharing_scheme")
    if chosen not in SCHEMES:
        return failed(f"sharing_scheme 应该是 {'、'.join(SCHEMES)} 之一。")
    resource = resource_of(ctx)
    _, mib, isolated = share(ctx, resource) if resource else (0, None, False)
    on_mig = bool(resource) and bool(mig_offer(ctx, resource)[1])
    if chosen in ("time-slicing", "mps"):
        return failed("这是对外的付费推理服务：time-slicing/MPS 下副本之间的显存隔离吗？一个副本的 KV cache 撑爆会怎样？")
    if (chosen == "mig") != on_mig:
        return failed("记录的方案和副本实际申请的资源对不上。")
    if chosen == "whole-gpu":
        return partial(0.5, "整卡独占能跑，但每张卡只放一个 16GB 的副本、几十 GB 显存闲着，流量翻倍时也没有地方扩："
                            "有没有既隔离、又能一卡多副本的方案？")
    return passed()


@check("fits-memory", points=2, title="每个副本的份额放得下 16GB，并留有余量")
def fits_memory(ctx: Context):
    resource = resource_of(ctx)
    if resource is None:
        return failed("Deployment llm 的容器没有申请任何 GPU 资源。")
    count, mib, isolated = share(ctx, resource)
    if not count or not mib:
        return failed(f"GPU 节点上没有可用的 {resource}：资源名和节点的切分对得上吗？")
    if not isolated:
        return partial(0.5, "副本拿到的是共享的整张卡，显存不隔离：几个副本加起来的 KV cache 由谁来兜底？")
    if mib < MODEL_MIB:
        return failed(f"每份 {resource} 只有 {mib} MiB，放不下 16GB 的模型：副本一加载就会 CUDA out of memory。")
    if mib < MODEL_MIB * HEADROOM:
        return partial(0.5, f"每份 {mib} MiB 只比模型多一点：长上下文、大 batch 时 KV cache 还要显存，余量够吗？")
    return passed()


@check("replicas", points=2, title="副本数：每个副本都拿到份额，且给扩容留了位置")
def replicas_check(ctx: Context):
    want = dig(deployment(ctx), "spec", "replicas")
    resource = resource_of(ctx)
    count = share(ctx, resource)[0] if resource else 0
    problems, score = [], 0
    holding = [p for p in llm_pods(ctx) if dig(p, "status", "phase") == "Running" and resource
               and pod_devices(p).get(resource)]
    if isinstance(want, int) and want >= 1 and len(holding) >= want:
        score += 1
    else:
        problems.append(f"{len(holding)} 个副本拿着 GPU 份额在运行，少于 Deployment 要的副本数：看 Pending 副本的事件")
    if not isinstance(want, int) or want < 2:
        problems.append("只有一个副本：滚动更新或坏一张卡时服务就断了")
    elif count and want >= count:
        problems.append("副本已经占满了所有份额：流量翻倍时没有地方扩")
    else:
        score += 1
    return ratio(score, 2, problems)


@check("startup-probe", points=3, title="startupProbe 盖住 90 秒的冷启动并留有余量")
def startup_probe(ctx: Context):
    probe = server(ctx).get("startupProbe")
    if not probe:
        return failed("没有 startupProbe：livenessProbe 会从容器启动就开始探测，加载 90 秒的模型会被反复杀掉。")
    if not any(k in probe for k in ("httpGet", "tcpSocket", "grpc", "exec")):
        return failed("startupProbe 没有探测方法。")
    total = budget(probe)
    if total <= LOAD_SECONDS:
        return failed(f"startupProbe 最多只给 {total} 秒：模型还没加载完，kubelet 就杀掉容器重来——"
                      "算一算 initialDelaySeconds + failureThreshold × periodSeconds。")
    if total < LOAD_SECONDS * MARGIN:
        return partial(2 / 3, f"startupProbe 给 {total} 秒，刚好比 90 秒多一点：磁盘慢或缓存没命中时加载会更久，余量呢？")
    return passed()


def _restarts(pods: list[dict]) -> tuple[int, list[dict]]:
    """(restarts of all containers, the last terminations the kubelet recorded for them)."""
    count, last = 0, []
    for p in pods:
        for status in dig(p, "status", "containerStatuses", default=[]) or []:
            count += status.get("restartCount", 0) or 0
            term = dig(status, "lastState", "terminated")
            if term:
                last.append(term)
    return count, last


def _probe_failures(ctx: Context) -> list[str]:
    """Messages of the kubelet's ``Unhealthy`` events (a probe failed) for the llm Pods."""
    names = {p["metadata"]["name"] for p in llm_pods(ctx)}
    return [e.get("message") or "" for e in ctx.objects("Event", ctx.namespace)
            if e.get("reason") == "Unhealthy" and dig(e, "involvedObject", "name") in names]


def _restart_cause(ctx: Context, restarts: int, last: list[dict]) -> str:
    """Why the containers restarted, from what the Pods' status and Events show (never guessed)."""
    oom = [t for t in last if t.get("reason") == "OOMKilled"]
    if oom:
        return (f"容器重启过 {restarts} 次，上一次退出的原因是 OOMKilled（exit code {oom[0].get('exitCode', 137)}）："
                "是内存超限被杀掉的，不是探针失败——它要的内存和 Pod 给它的上限对得上吗？")
    probes = _probe_failures(ctx)
    if probes:
        return f"容器重启过 {restarts} 次，Pod 的事件里有探针失败：{probes[-1]}"
    if any(t.get("exitCode") == 137 for t in last):
        return (f"容器重启过 {restarts} 次，上一次退出码是 137（进程被 SIGKILL 杀掉），事件里没有探针失败："
                "看看 kubectl describe pod 里的 Last State 和节点的事件")
    if last:
        t = last[-1]
        return (f"容器重启过 {restarts} 次，上一次退出：{t.get('reason') or '未知原因'}（exit code {t.get('exitCode')}）："
                "看看 kubectl logs --previous 和 Pod 的事件")
    return f"容器重启过 {restarts} 次：看看 Pod 的事件和 kubectl logs --previous"


@check("ready", points=2, title="副本通过探针、全部就绪")
def ready(ctx: Context):
    """An outcome check: the replicas are Ready and no container restarted. The message names the cause the
    Pods show — an ``OOMKilled`` last state, the kubelet's probe-failure events, an exit code — not a guess."""
    want = dig(deployment(ctx), "spec", "replicas") or 0
    pods = llm_pods(ctx)
    problems, score = [], 0
    ready_pods = [p for p in pods if any(c.get("type") == "Ready" and c.get("status") == "True"
                                         for c in dig(p, "status", "conditions", default=[]) or [])]
    if want and len(ready_pods) >= want:
        score += 1
    else:
        problems.append(f"只有 {len(ready_pods)} 个副本就绪")
    restarts, last = _restarts(pods)
    if pods and not restarts:
        score += 1
    elif not pods:
        problems.append("命名空间里没有 llm 的 Pod")
    else:
        problems.append(_restart_cause(ctx, restarts, last))
    return ratio(score, 2, problems)


def _metric_name(metric: dict) -> str | None:
    kind = metric.get("type")
    section = metric.get({"Pods": "pods", "Object": "object", "External": "external"}.get(kind, "")) or {}
    return dig(section, "metric", "name")


@check("hpa-metric", points=3, title="HPA 按 GPU 利用率扩缩容")
def hpa_metric(ctx: Context):
    hpa = ctx.require("HorizontalPodAutoscaler", DEPLOY, ctx.namespace)
    problems, score = [], 0
    target = dig(hpa, "spec", "scaleTargetRef", default={}) or {}
    if target.get("kind") == "Deployment" and target.get("name") == DEPLOY:
        score += 1
    else:
        problems.append("HPA 的 scaleTargetRef 没有指向 Deployment llm")
    metrics = dig(hpa, "spec", "metrics", default=[]) or []
    gpu = [m for m in metrics if _metric_name(m) == METRIC]
    if any(m.get("type") == "Pods" for m in gpu):
        score += 2
    elif gpu:
        score += 1
        problems.append("用了 GPU 利用率指标，但不是按每个 Pod 的平均值：副本各自的利用率该用哪种指标类型？")
    elif any(m.get("type") == "Resource" for m in metrics):
        problems.append("type: Resource 只看 CPU 和内存（metrics-server）：推理服务的瓶颈在 GPU，CPU 几乎说明不了什么")
    else:
        problems.append("HPA 没有使用 GPU 利用率指标：DCGM Exporter 的哪个指标经适配器变成了每个 Pod 的自定义指标？")
    return ratio(score, 3, problems)


@check("hpa-range", points=2, title="HPA 的上下限：能翻倍，又放得下")
def hpa_range(ctx: Context):
    hpa = ctx.require("HorizontalPodAutoscaler", DEPLOY, ctx.namespace)
    low = dig(hpa, "spec", "minReplicas") or 1
    high = dig(hpa, "spec", "maxReplicas") or 0
    resource = resource_of(ctx)
    count = share(ctx, resource)[0] if resource else 0
    problems, score = [], 0
    if high >= 2 * low:
        score += 1
    else:
        problems.append("maxReplicas 不到 minReplicas 的两倍：流量翻倍时副本翻不了倍")
    if count and high <= count:
        score += 1
    else:
        problems.append("maxReplicas 超过了两张卡上放得下的副本数：扩出来的副本只能 Pending")
    return ratio(score, 2, problems)


@check("budget-recorded", points=1, title="按 kubelet 的算法算出了 startupProbe 的预算")
def budget_recorded(ctx: Context):
    """A step check against the Deployment's own probe. The hint about Kubernetes' defaults appears only
    when the probe really leaves one of the three fields out."""
    recorded = ctx.value("startup_budget_seconds")
    if isinstance(recorded, bool) or not isinstance(recorded, (int, float)):
        return failed("startup_budget_seconds 应该是一个秒数。")
    probe = server(ctx).get("startupProbe") or {}
    if recorded == budget(probe):
        return passed()
    if not probe:
        return failed(f"startup_budget_seconds 是 {recorded}，可 Deployment llm 的容器没有 startupProbe。")
    unset = [k for k in PROBE_DEFAULTS if probe.get(k) is None]
    if unset:
        return failed(f"startup_budget_seconds 是 {recorded}，和 Deployment 里 startupProbe 的实际预算对不上："
                      f"它没写 {'、'.join(unset)}，这些字段取 Kubernetes 的默认值。")
    return failed(f"startup_budget_seconds 是 {recorded}，和 Deployment 里 startupProbe 的实际预算对不上："
                  "三个字段都写了，照 kubelet 的算法（initialDelaySeconds + failureThreshold × periodSeconds）再算一遍。")
