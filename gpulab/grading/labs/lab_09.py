"""Checks for ``labs/09-hpa-not-scaling.ipynb``: an HPA on GPU utilisation that does not scale, and why.

Before each run the grader breaks ONE link of the monitoring add-on's metrics
pipeline (DCGM Exporter -> Prometheus -> prometheus-adapter ->
``custom.metrics.k8s.io`` -> HPA) and puts the add-on back as installed
afterwards, whatever the run did: the fixture
:mod:`gpulab.grading.fixtures.broken_pipeline` (``SETUP``/``TEARDOWN``/``COLLECT``
below), which says which fault breaks which link and how it is picked. The
notebook deploys ``llm`` with the HPA ``llm`` (``manifests/07-monitoring-cost/``),
sends load, walks the chain back from the HPA, records ``broken_link`` (one of
:data:`LINKS`) and ``evidence`` (the changed line of the config, quoted), repairs
the ConfigMap as an operator would and records ``served_pods`` (the pods
``custom.metrics.k8s.io`` serves the metric for afterwards), leaving the load on.

What was broken reaches the checks as an ``InjectedFault`` object; the add-on's
ConfigMaps as the run left them come from ``COLLECT``; the HPA, its Events and
the Deployment from the submission's namespace. Nothing here knows the answer.
"""

from __future__ import annotations

import yaml

from gpulab.grading import fixtures
from gpulab.grading.checks import Context, check, dig, failed, judge_diagnosis, partial, passed, ratio
from gpulab.grading.fixtures import broken_pipeline as fixture
from gpulab.kube.names import MONITORING_NAMESPACE

LAB = "09-hpa-not-scaling"
CLUSTER_WIDE = True
# Walking the chain reads the exporter's pods (gpu-operator), the custom metrics API and its APIService, read-only,
# cluster-wide; the repair itself is granted in the monitoring namespace only (the fixture's MONITORING_GRANTS).
CLUSTER_RULES = (
    *fixtures.DIAGNOSE_RULES,
    {"apiGroups": ["custom.metrics.k8s.io"], "resources": ["*"], "verbs": ["get", "list"]},
    {"apiGroups": ["apiregistration.k8s.io"], "resources": ["apiservices"], "verbs": ["get", "list", "watch"]},
)
GPUS_FREE = 2
CELL_TIMEOUT = 240
TIMEOUT = 600

HPA, DEPLOYMENT, METRIC = "llm", "llm", "DCGM_FI_DEV_GPU_UTIL"
LINKS = fixture.LINKS
LINK_NAMES = {"scrape-target": "Prometheus 的抓取目标", "series-labels": "序列的标签",
              "adapter-rule": "prometheus-adapter 的规则"}

SETUP, TEARDOWN, COLLECT = fixture.setup, fixture.teardown, fixture.collect


def _no_fault():
    return failed("评分器没有记录它弄坏了链路的哪一环，无法核对；请联系讲师。")


# What the learner said -> what was broken -> a hint that points at what to look at, never at the answer.
_LINK_HINTS = {
    ("adapter-rule", "series-labels"): "Prometheus 里那张卡的序列，pod 标签写的是谁？是 llm 的 Pod 吗？",
    ("adapter-rule", "scrape-target"): "prometheus-adapter 要有序列才能提供指标：Prometheus 里现在有 DCGM 的序列吗？",
    ("series-labels", "adapter-rule"): "Prometheus 里的序列带着 llm 的 namespace 和 pod 标签吗？"
                                       "如果带着，断的就在 Prometheus 之后。",
    ("series-labels", "scrape-target"): "先看 Prometheus 有没有在抓 DCGM Exporter：up 里有 dcgm-exporter 这个任务吗？",
    ("scrape-target", "series-labels"): "up 里 dcgm-exporter 的目标在吗、抓取成功吗？在的话，序列是有的，看看它们的标签。",
    ("scrape-target", "adapter-rule"): "up 里 dcgm-exporter 的目标在，序列也在：断的不在抓取这一环。",
}


@check("broken-link", points=3, title="从 HPA 往回查，找出断的是哪一环")
def broken_link(ctx: Context):
    fault = fixtures.injected_record(ctx)
    if fault is None:
        return _no_fault()
    return judge_diagnosis(ctx.value("broken_link"), fault["link"], LINK_NAMES, _LINK_HINTS,
                           field="broken_link", wrong="断的不是「{name}」这一环。",
                           default_hint="从 HPA 这一端往回，一环一环核对：每一环正常时该看到什么？")


@check("evidence", points=2, title="引用配置里改错的那一行")
def evidence(ctx: Context):
    fault = fixtures.injected_record(ctx)
    if fault is None:
        return _no_fault()
    text = ctx.value("evidence")
    if not isinstance(text, str) or not text.strip():
        return failed("evidence 应该是配置里改错的那一行的原文（从 ConfigMap 里取，不要手抄）。")
    quote = text.strip()
    if any(quote in line for line in fault["lines"]) and len(quote) >= 6:
        return passed()
    broken = fault["installed"][fault["configmap"]][fault["key"]]
    if any(quote in line.strip() for line in broken.splitlines() if line.strip()):
        return partial(1 / 2, "这一行在评分时的配置里，但它和安装时一样，没有被改过：问题出在同一个 ConfigMap 的另一处。")
    return failed("evidence 不是评分时被改动的那个 ConfigMap 里的一行原文：先找出断在哪一环，再到管这一环的配置里找。")


def _parsed(text: str):
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return None


def _differences(live, want, path: str = "") -> list[str]:
    """Where two parsed configs differ, as paths (``scrape_configs[0].honor_labels``); at most a few."""
    if isinstance(live, dict) and isinstance(want, dict):
        found = []
        for key in [*want, *(k for k in live if k not in want)]:
            found += _differences(live.get(key), want.get(key), f"{path}.{key}" if path else str(key))
        return found
    if isinstance(live, list) and isinstance(want, list) and len(live) == len(want):
        return [d for i, (a, b) in enumerate(zip(live, want)) for d in _differences(a, b, f"{path}[{i}]")]
    return [] if live == want else [path or "（整个文件）"]


@check("config-as-installed", points=2, title="修好的配置：坏掉的那处改回安装时的样子，别的不动")
def config_as_installed(ctx: Context):
    """Outcome: the broken ConfigMap at the end of the run, parsed, against the installed configuration."""
    fault = fixtures.injected_record(ctx)
    if fault is None:
        return _no_fault()
    name, key = fault["configmap"], fault["key"]
    cm = ctx.object("ConfigMap", name, MONITORING_NAMESPACE)
    if cm is None:
        return failed(f"评分结束时 {MONITORING_NAMESPACE} 里没有 ConfigMap {name}。")
    live, want = (cm.get("data") or {}).get(key) or "", fault["installed"][name][key]
    diffs = _differences(_parsed(live), _parsed(want))
    if not diffs:
        return passed()
    if set(fault["lines"]) <= set(fixture.changed_lines(want, live)):
        return failed(f"评分结束时 {name} 里还留着被改坏的那处：链路没有修好。")
    return partial(1 / 2, f"被改坏的那处动过了，但评分结束时 {name} 和安装时的配置还有不同"
                          f"（{', '.join(diffs[:3])}）：把坏掉的那一处改回安装时的样子，别的不动。")


def _hpa(ctx: Context) -> dict | None:
    return ctx.object("HorizontalPodAutoscaler", HPA, ctx.namespace)


def _condition(obj: dict, kind: str) -> dict:
    return next((c for c in dig(obj, "status", "conditions") or [] if c.get("type") == kind), {})


def _metric_read(hpa: dict) -> bool:
    return any(dig(m, "pods", "metric", "name") == METRIC and dig(m, "pods", "current", "averageValue") is not None
               for m in dig(hpa, "status", "currentMetrics") or [])


@check("metric-served", points=2, title="修好以后，llm 的 Pod 有了 GPU 利用率指标")
def metric_served(ctx: Context):
    """Outcome: what the HPA controller read at the end, and what the notebook read from custom.metrics.k8s.io."""
    hpa = _hpa(ctx)
    if hpa is None:
        return failed(f"评分时命名空间里没有 HPA {HPA}：先按 manifests/07-monitoring-cost/llm-hpa.yaml 建好它。")
    pods = {p["metadata"]["name"] for p in ctx.objects("Pod", ctx.namespace, labels={"app": DEPLOYMENT})}
    served = ctx.value("served_pods", None)
    problems, score = [], 0
    active = _condition(hpa, "ScalingActive")
    if active.get("status") == "True" and _metric_read(hpa):
        score += 1
    else:
        problems.append(f"评分结束时 HPA {HPA} 的 ScalingActive 是 {active.get('status', '?')}"
                        f"（{active.get('reason', '没有原因')}）：HPA 控制器还是读不到 {METRIC}")
    if isinstance(served, list) and served and set(served) <= pods:
        score += 1
    elif isinstance(served, list) and served:
        problems.append(f"served_pods 里有不是 llm 的 Pod（{', '.join(sorted(set(served) - pods))}）："
                        "custom.metrics.k8s.io 把指标挂在了别的 Pod 上")
    else:
        problems.append("served_pods 应该是 custom.metrics.k8s.io 修好后给出指标的 Pod 名列表，不能是空的")
    return ratio(score, 2, problems)


@check("scaled-up", points=3, title="有负载时 HPA 把 llm 扩到 2 个副本")
def scaled_up(ctx: Context):
    """Outcome: the HPA's decision, its SuccessfulRescale Event and the Deployment's ready replicas."""
    hpa = _hpa(ctx)
    if hpa is None:
        return failed(f"评分时命名空间里没有 HPA {HPA}。")
    problems, score = [], 0
    if dig(hpa, "status", "desiredReplicas") == 2:
        score += 1
    elif not _metric_read(hpa):
        problems.append(f"评分结束时 HPA {HPA} 读不到指标，没法按 GPU 利用率决定副本数（见 metric-served）")
    else:
        problems.append(f"评分结束时 HPA {HPA} 想要的副本数是 {dig(hpa, 'status', 'desiredReplicas', default='?')}")
    rescales = [e.get("message") or "" for e in ctx.objects("Event", ctx.namespace)
                if e.get("reason") == "SuccessfulRescale" and dig(e, "involvedObject", "name") == HPA]
    if any("New size: 2" in m and "above target" in m for m in rescales):
        score += 1
    else:
        problems.append(f"没有 HPA {HPA} 因为指标高于目标而扩到 2 的 SuccessfulRescale 事件"
                        + (f"（看到的是：{rescales[-1]}）" if rescales else "") + "：负载还在吗？")
    deployment = ctx.object("Deployment", DEPLOYMENT, ctx.namespace)
    ready = dig(deployment, "status", "readyReplicas", default=0) if deployment else 0
    if ready == 2:
        score += 1
    else:
        problems.append(f"评分结束时 Deployment {DEPLOYMENT} 有 {ready or 0} 个就绪副本，不是 2")
    return ratio(score, 3, problems)
