"""Checks for ``labs/01-gpu-pod-spec.ipynb``: counting GPUs, the three rules of ``nvidia.com/gpu``.

The notebook records ``gpu_node_count``, ``gpu_nodes`` ({node: cards}) and
``violated`` ({pod: "A"|"B"|"C"}: which rule each broken manifest broke) and
leaves the three fixed Pods ``gpu-half``, ``gpu-unequal``, ``gpu-request-only``
in its namespace. Expected values come from the captured Node objects and from
the manifests in ``manifests/labs/01-gpu-pod-spec/``, never from constants
that could drift from the cluster.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from gpulab import paths
from gpulab.grading.checks import Context, allocatable_by_node, check, dig, failed, partial, passed, quantity_int, ratio

LAB = "01-gpu-pod-spec"
GPUS_FREE = 1
CELL_TIMEOUT = 90
TIMEOUT = 240

GPU = "nvidia.com/gpu"
MANIFESTS = {"gpu-half": "half-gpu.yaml", "gpu-unequal": "unequal.yaml", "gpu-request-only": "request-only.yaml"}
# Which of the chapter's three rules each broken manifest breaks (the notebook lists them as A/B/C).
RULES = {"A": "只能是整数", "B": "必须写 limits", "C": "requests 必须等于 limits"}
NEEDED_GPUS = 1  # every broken manifest says the workload needs one card


def original(pod: str) -> dict:
    """The broken manifest as shipped (what the fix must keep apart from resources)."""
    path = paths.manifests() / "labs" / LAB / MANIFESTS[pod]
    return yaml.safe_load(Path(path).read_text(encoding="utf-8"))


def broken_rule(manifest: dict) -> str | None:
    """Which of :data:`RULES` a Pod manifest's ``nvidia.com/gpu`` breaks, read from its resources (the first
    broken one in the order the chapter gives them), or None."""
    for c in dig(manifest, "spec", "containers", default=[]) or []:
        limits = dig(c, "resources", "limits", default={}) or {}
        requests = dig(c, "resources", "requests", default={}) or {}
        values = [v for v in (limits.get(GPU), requests.get(GPU)) if v is not None]
        if any(quantity_int(v) is None for v in values):
            return "A"
        if GPU in requests and GPU not in limits:
            return "B"
        if GPU in requests and quantity_int(requests[GPU]) != quantity_int(limits[GPU]):
            return "C"
    return None


@check("gpu-node-count", points=1, title="数出了上报 nvidia.com/gpu 的节点数")
def gpu_node_count(ctx: Context):
    recorded = ctx.value("gpu_node_count")
    actual = allocatable_by_node(ctx, GPU)
    if not actual:
        return failed("评分时集群里没有节点上报 nvidia.com/gpu，无法核对；请联系讲师。")
    if isinstance(recorded, bool) or not isinstance(recorded, int):
        return failed("gpu_node_count 应该是一个整数：有几个节点在 allocatable 里上报了 nvidia.com/gpu。")
    if recorded != len(actual):
        return failed("节点数不对：只数 status.allocatable 里真的出现 nvidia.com/gpu（且大于 0）的节点，"
                      "不要数节点标签。")
    return passed()


@check("gpu-per-node", points=2, title="记录了每个 GPU 节点的卡数")
def gpu_per_node(ctx: Context):
    recorded = ctx.value("gpu_nodes")
    actual = allocatable_by_node(ctx, GPU)
    if not isinstance(recorded, dict):
        return failed("gpu_nodes 应该是「节点名 → 卡数」的字典。")
    if not recorded:
        return failed("gpu_nodes 是空的：上面打印的 allocatable 里，哪些节点有 nvidia.com/gpu？")
    if not actual:
        return failed("评分时集群里没有节点上报 nvidia.com/gpu，无法核对；请联系讲师。")
    right = [n for n, c in actual.items() if quantity_int(recorded.get(n)) == c]
    extra = [n for n in recorded if n not in actual]
    if len(right) == len(actual) and not extra:
        return passed()
    problems = []
    if len(right) < len(actual):
        problems.append(f"{len(actual) - len(right)} 个 GPU 节点的卡数与 allocatable 不一致或没有记录")
    if extra:
        problems.append(f"记录了 {len(extra)} 个并没有在 allocatable 里上报 nvidia.com/gpu 的节点")
    return partial(max(0, len(right) - len(extra)) / len(actual), "；".join(problems) + "。")


@check("rules-identified", points=3, title="认出每个被拒绝的清单违反了哪条规矩")
def rules_identified(ctx: Context):
    recorded = ctx.value("violated")
    if not isinstance(recorded, dict):
        return failed("violated 应该是「Pod 名 → 规矩的字母（A/B/C）」的字典。")
    problems, right = [], 0
    broken = {pod: broken_rule(original(pod)) for pod in MANIFESTS}
    for pod, rule in broken.items():
        answer = str(recorded.get(pod) or "").strip().upper()
        if answer == rule:
            right += 1
        elif not answer:
            problems.append(f"{pod} 还没有作答")
        elif answer not in RULES:
            problems.append(f"{pod} 的答案 {answer!r} 不是 A/B/C 之一")
        else:
            problems.append(f"{pod} 的判断不对：对照 apiserver 拒绝它时的原话再看一遍")
    return ratio(right, len(broken), problems)


def _gpu_fix(ctx: Context, pod_name: str):
    pod = ctx.object("Pod", pod_name, ctx.namespace)
    if pod is None:
        return failed(f"命名空间里没有 Pod {pod_name}：修好的清单 apply 成功了吗？被 apiserver 拒绝的清单不会留下任何对象。")
    want = original(pod_name)
    want_c = want["spec"]["containers"][0]
    have = {c.get("name"): c for c in dig(pod, "spec", "containers", default=[])}
    container = have.get(want_c["name"])
    if container is None:
        return failed(f"{pod_name} 里没有名为 {want_c['name']} 的容器：只改资源声明，容器本身保持原样。")
    limits = dig(container, "resources", "limits", default={}) or {}
    requests = dig(container, "resources", "requests", default={}) or {}
    if GPU not in limits:
        other = {k: v for k, v in {**requests, **limits}.items() if k.startswith("nvidia.com/")}
        if other:
            asked = "、".join(f"{k}: {v}" for k, v in other.items())
            what = ("：这是 MIG 实例（从一张卡上切出来的一块），不是整张卡的 nvidia.com/gpu"
                    if any(k.startswith("nvidia.com/mig-") for k in other) else "，不是 nvidia.com/gpu")
            seen = ""
            if not any(allocatable_by_node(ctx, k) for k in other):
                seen = "；评分时集群里没有节点上报这种资源"
                if not dig(pod, "spec", "nodeName"):
                    seen += f"，{pod_name} 停在 {dig(pod, 'status', 'phase') or 'Pending'}"
            return failed(f"{pod_name} 申请的是 {asked}{what}{seen}。清单注释说这个服务要几张卡？"
                          "这个实验练的是 nvidia.com/gpu 的三条规矩。")
        return failed(f"{pod_name} 没有申请任何 GPU：apiserver 接受了它，但调度器不会给它分卡，容器里也看不见卡。")
    count = quantity_int(limits[GPU])
    if count is None or count < 1:
        return failed(f"{pod_name} 的 nvidia.com/gpu 不是正整数。")
    if GPU in requests and quantity_int(requests[GPU]) != count:
        return failed(f"{pod_name} 的 requests 和 limits 不相等。")
    problems, score = [], 1.0
    if count != NEEDED_GPUS:
        problems.append(f"{pod_name} 申请了 {count} 张卡，多于清单注释里说的需要：多出来的卡它用不上，别人也用不了")
        score -= 0.5
    changed = [k for k in ("image", "command", "args") if container.get(k) != want_c.get(k)]
    if changed:
        problems.append(f"{pod_name} 的 {'/'.join(changed)} 和原清单不同：只需要改 resources")
        score -= 0.25
    if score >= 1.0:
        return passed()
    return partial(max(score, 0.0), "；".join(problems) + "。")


@check("fix-gpu-half", points=2, title="修好 gpu-half")
def fix_gpu_half(ctx: Context):
    return _gpu_fix(ctx, "gpu-half")


@check("fix-gpu-unequal", points=2, title="修好 gpu-unequal")
def fix_gpu_unequal(ctx: Context):
    return _gpu_fix(ctx, "gpu-unequal")


@check("fix-gpu-request-only", points=2, title="修好 gpu-request-only")
def fix_gpu_request_only(ctx: Context):
    return _gpu_fix(ctx, "gpu-request-only")


@check("fixed-pods-on-gpu-node", points=1, title="修好的 Pod 真的分到了 GPU 节点")
def fixed_pods_on_gpu_node(ctx: Context):
    gpu_nodes = set(allocatable_by_node(ctx, GPU))
    pods = [ctx.object("Pod", name, ctx.namespace) for name in MANIFESTS]
    present = [p for p in pods if p is not None]
    if not present:
        return failed("三个修好的 Pod 都不在命名空间里。")
    asking = [p for p in present if any((quantity_int(dig(c, "resources", "limits", GPU)) or 0) >= 1
                                        for c in dig(p, "spec", "containers", default=[]))]
    placed = [p for p in asking if dig(p, "spec", "nodeName") in gpu_nodes]
    if len(placed) == len(MANIFESTS):
        return passed()
    stuck = [p["metadata"]["name"] for p in asking if not dig(p, "spec", "nodeName")]
    problems = [f"{len(MANIFESTS) - len(placed)} 个 Pod 没有申请到 GPU 节点上的卡"]
    if stuck:
        problems.append(f"{', '.join(stuck)} 还没被调度：kubectl describe pod 的 Events 会说明原因")
    return ratio(len(placed), len(MANIFESTS), problems)
