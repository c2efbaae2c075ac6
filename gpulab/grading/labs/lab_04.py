"""Checks for ``labs/04-sharing.ipynb``: time-slicing for the dev namespace, MIG for inference.

The notebook writes the ConfigMap ``time-slicing-config`` in ``gpu-operator``,
points the ClusterPolicy's ``devicePlugin.config`` at it and labels the GPU
node ``nvidia.com/device-plugin.config``; scales the given ``dev-notebooks``
Deployment (``<namespace>-dev``) to what the node now advertises; reads
``nvidia-smi`` inside one notebook (``seen_memory_mib``) and explains why
time-slicing does not isolate memory (``explanation``). It then scales the
notebooks to 0 (the MIG manager changes no layout under running pods), sets
``mig.strategy`` and ``nvidia.com/mig.config``, deploys six ``infer-small``
replicas on the MIG resource it chose (``<namespace>-infer``) and records
``mig_instances``.

The dev phase is over when the objects are collected, so its evidence is
what the real controllers and scheduler wrote down meanwhile: the
Deployment's ``ScalingReplicaSet`` events and the pods' ``Scheduled`` /
``FailedScheduling`` events. The device-plugin config is judged with the
same parser the simulated device plugin uses. Cluster-wide state (the
ClusterPolicy, ``gpu-operator`` ConfigMaps, the two node labels) is put back
after every submission by :mod:`gpulab.grading.gpustack`.

Each mistake costs points once (:mod:`gpulab.grading.checks`). The step
checks ``dev-fit``, ``dev-sees-neighbours`` and ``mig-count`` judge what the
learner did against what their own earlier steps produced: the shares the
captured device-plugin config makes the node offer (:func:`dev_offer`), the
notebooks that really shared a card, the instances the node really
advertises. A config that offers another number than 4 per card costs points
in ``ts-config`` / ``ts-applied`` only; a notebook count that fills what the
config offered is right. When the captured config cannot tell what the node
offered (the device plugin cannot use it), the count is not judged. The
outcome checks (``mig-layout``, ``infer-isolated``) judge the end state as
it is.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from gpulab.fakegpu.pluginconfig import ConfigError, parse_config, parse_config_map, select_config
from gpulab.hardware.models import get_model
from gpulab.grading import gpustack
from gpulab.kube.names import (
    ALLOCATED_DEVICES_ANNOTATION,
    CLUSTER_POLICY,
    DEVICE_PLUGIN_CONFIG_LABEL,
    MIG_CONFIG_LABEL,
    MIG_CONFIG_STATE_LABEL,
    OPERATOR_NAMESPACE,
)
from gpulab.grading.checks import (Context, WrongClaim, check, containers, dig, failed, judge_explanation, partial,
                                   passed, quantity_int, ratio)

LAB = "04-sharing"
NAMESPACES = ("dev", "infer")
CLUSTER_WIDE = True
CLUSTER_RULES = gpustack.CLUSTER_RULES
NODE_LABELS = (DEVICE_PLUGIN_CONFIG_LABEL,)
GPUS_FREE = 2
SETUP, TEARDOWN = gpustack.make_hooks(NAMESPACES)
COLLECT = gpustack.collect
CELL_TIMEOUT = 60
TIMEOUT = 180

GPU = "nvidia.com/gpu"
CONFIG_MAP = "time-slicing-config"
REPLICAS_PER_CARD = 4
DEV = "dev-notebooks"
DEV_MEMORY_MIB = 12 * 1024
INFER = "infer-small"
INFER_REPLICAS = 6
INFER_MEMORY_MIB = 8 * 1024
SCALED_UP = re.compile(r"Scaled up replica set \S+ from \d+ to (\d+)")


def gpu_node(ctx: Context) -> dict | None:
    nodes = [n for n in ctx.objects("Node") if (n["metadata"].get("labels") or {}).get("nvidia.com/gpu.present") == "true"]
    return nodes[0] if nodes else None


def node_labels(ctx: Context) -> dict:
    return (gpu_node(ctx) or {}).get("metadata", {}).get("labels") or {}


def physical_cards(ctx: Context) -> int:
    """Physical GPUs on the node. GFD counts MIG slices as GPUs under the single strategy; undo that."""
    labels = node_labels(ctx)
    count = quantity_int(labels.get("nvidia.com/gpu.count")) or 0
    product = labels.get("nvidia.com/gpu.product", "")
    if "-MIG-" in product:
        try:
            per_gpu = len(get_model(product.split("-MIG-")[0]).mig_layout(labels.get(MIG_CONFIG_LABEL, "")))
        except Exception:  # noqa: BLE001 - an unknown model or layout: keep GFD's count
            per_gpu = 1
        return count // max(per_gpu, 1)
    return count


def policy(ctx: Context) -> dict:
    return ctx.object("ClusterPolicy", CLUSTER_POLICY) or {}


def events(ctx: Context, ns: str, reason: str) -> list[dict]:
    return [e for e in ctx.objects("Event", ns) if e.get("reason") == reason]


def pod_devices(pod: dict) -> dict[str, list[str]]:
    """resource -> device IDs the node side allocated to the pod (all containers)."""
    raw = (pod["metadata"].get("annotations") or {}).get(ALLOCATED_DEVICES_ANNOTATION) or "{}"
    try:
        by_container = json.loads(raw)
    except ValueError:
        return {}
    found: dict[str, list[str]] = {}
    for resources in by_container.values():
        for resource, ids in (resources or {}).items():
            found.setdefault(resource, []).extend(ids)
    return found


def mig_offer(ctx: Context, resource: str) -> tuple[int, int | None]:
    """(instances the node advertises, MiB each) for a MIG resource name — either strategy."""
    labels = node_labels(ctx)
    alloc = quantity_int(dig(gpu_node(ctx) or {}, "status", "allocatable", resource)) or 0
    if resource.startswith("nvidia.com/mig-"):
        return alloc, quantity_int(labels.get(f"{resource}.memory"))
    if resource == GPU and "-MIG-" in labels.get("nvidia.com/gpu.product", ""):
        return alloc, quantity_int(labels.get("nvidia.com/gpu.memory"))
    return 0, None


def time_slicing_replicas(ctx: Context) -> tuple[int | None, str | None]:
    """Replicas per card the ConfigMap's config (the one the node selects) asks for, or why there are none."""
    cm = ctx.object("ConfigMap", CONFIG_MAP, OPERATOR_NAMESPACE)
    if cm is None:
        return None, "missing"
    try:
        configs = parse_config_map(cm.get("data") or {})
    except ConfigError:
        return None, "invalid"
    selected = node_labels(ctx).get(DEVICE_PLUGIN_CONFIG_LABEL) or dig(policy(ctx), "spec", "devicePlugin", "config",
                                                                  "default")
    config = configs.get(selected) if selected in configs else (next(iter(configs.values())) if len(configs) == 1
                                                                 else None)
    if config is None:
        return None, "unselected"
    replicated = config.sharing.replication(GPU) if config.sharing.strategy == "time-slicing" else None
    return (replicated.replicas, None) if replicated else (None, "no-sharing")


@dataclass(frozen=True)
class DevOffer:
    """What the GPU node offered in the dev phase: ``shares`` of nvidia.com/gpu (None: the captured
    objects cannot tell), ``per_card`` of them on each of the ``cards`` physical GPUs, and ``why``."""

    shares: int | None
    per_card: int | None
    cards: int
    why: str


#: Why the captured device-plugin config cannot tell what the node offered (learner-facing).
UNUSABLE = {
    "missing": "ClusterPolicy 指向的 ConfigMap 不存在",
    "unselected": "节点标签和 ClusterPolicy 的 default 都没有选中 ConfigMap 里的任何一份配置",
    "invalid": "被选中的那份配置 device plugin 读不懂",
}


def dev_offer(ctx: Context) -> DevOffer:
    """The nvidia.com/gpu shares the captured config makes the device plugin advertise, as its config-manager
    chooses: no config named in the ClusterPolicy → its defaults (one per card); a named config the node
    label (or the default) selects and that parses → its time-slicing/MPS replicas per card; otherwise the
    plugin refuses the config, and what it advertised then (its last good config, or nothing) is not in the
    captured objects. The notebook leaves the device-plugin config alone after the dev phase."""
    cards = physical_cards(ctx)
    if not cards:
        return DevOffer(None, None, 0, "no-node")
    named = dig(policy(ctx), "spec", "devicePlugin", "config", default={}) or {}
    if not named.get("name"):
        return DevOffer(cards, 1, cards, "defaults")
    cm = ctx.object("ConfigMap", named["name"], OPERATOR_NAMESPACE)
    if cm is None:
        return DevOffer(None, None, cards, "missing")
    data = cm.get("data") or {}
    chosen = select_config(data, node_labels(ctx).get(DEVICE_PLUGIN_CONFIG_LABEL), named.get("default") or None)
    if chosen.name is None:
        return DevOffer(None, None, cards, "unselected")
    try:
        config = parse_config(data[chosen.name])
    except ConfigError:
        return DevOffer(None, None, cards, "invalid")
    replicated = config.sharing.replication(GPU)
    per_card = replicated.replicas if replicated else 1
    return DevOffer(cards * per_card, per_card, cards, "config")


def dev_placed(ctx: Context) -> set[str]:
    """Dev notebooks the scheduler assigned to the GPU node (its ``Scheduled`` events)."""
    node = (gpu_node(ctx) or {}).get("metadata", {}).get("name", "")
    return {m.group(1) for e in events(ctx, f"{ctx.namespace}-dev", "Scheduled")
            if (m := re.search(r"assigned \S+?/(\S+) to (\S+)", e.get("message") or "")) and m.group(2) == node}


@check("ts-config", points=3, title="time-slicing 配置：每张卡报成 4 份")
def ts_config(ctx: Context):
    cm = ctx.object("ConfigMap", CONFIG_MAP, OPERATOR_NAMESPACE)
    if cm is None:
        return failed(f"gpu-operator 命名空间里没有 ConfigMap {CONFIG_MAP}：device plugin 的共享配置放在哪个命名空间？")
    replicas, why = time_slicing_replicas(ctx)
    if why == "invalid":
        return failed("device plugin 读不懂这份配置（GPU 节点的 DevicePluginConfigInvalid 事件里有它的原话）："
                      "对照章节的 ConfigMap，replicas 是写给哪一种资源的、写在哪一层？")
    if why == "unselected":
        return partial(1 / 3, "ConfigMap 里有多份配置，但节点标签和 ClusterPolicy 的 default 都没有选中其中任何一份。")
    if why == "no-sharing":
        return partial(1 / 3, "配置能被读懂，但没有让 nvidia.com/gpu 做 time-slicing：sharing 下面写了什么？")
    if replicas != REPLICAS_PER_CARD:
        return partial(2 / 3, f"time-slicing 生效了，但每张卡报成了 {replicas} 份，和实验要求的份数不一样。")
    return passed()


@check("ts-applied", points=2, title="按 NVIDIA 的方式让配置生效")
def ts_applied(ctx: Context):
    config = dig(policy(ctx), "spec", "devicePlugin", "config", default={}) or {}
    problems, score = [], 0
    if config.get("name") == CONFIG_MAP:
        score += 1
    else:
        problems.append("ClusterPolicy 的 devicePlugin.config.name 没有指向你的 ConfigMap：device plugin 不知道去读它"
                        "（章节里 --set devicePlugin.config.name=… 改的就是这里）")
    cm = ctx.object("ConfigMap", CONFIG_MAP, OPERATOR_NAMESPACE) or {}
    keys = set((cm.get("data") or {}))
    label = node_labels(ctx).get(DEVICE_PLUGIN_CONFIG_LABEL)
    if label in keys or (not label and config.get("default") in keys):
        score += 1
    elif label:
        problems.append(f"GPU 节点的 {DEVICE_PLUGIN_CONFIG_LABEL} 标签选的配置在 ConfigMap 里不存在")
    else:
        problems.append("没有给 GPU 节点选配置：节点标签和 ClusterPolicy 的 default 都没有指向 ConfigMap 里的某一份")
    return ratio(score, 2, problems)


@check("dev-fit", points=3, title="开发笔记本按每卡 N 个放满，且没有人排队")
def dev_fit(ctx: Context):
    """A step check: the notebooks are judged against the shares the GPU node offered in the dev phase
    (:func:`dev_offer`: the captured config applied to the physical cards), not against the lab's 4 per
    card. A config that offers another number costs points in ts-config / ts-applied, once; filling what it
    offered is right here, and the message says what the config offered. When the captured config cannot
    tell what the node offered, neither the count nor the queueing is judged: the message says so."""
    ns = f"{ctx.namespace}-dev"
    deploy = ctx.require("Deployment", DEV, ns)
    offer = dev_offer(ctx)
    if offer.why == "no-node":
        return failed("评分时集群里找不到 GPU 节点，无法核对；请联系讲师。")
    problems, notes, score = [], [], 0
    limits = [quantity_int(dig(c, "resources", "limits", GPU)) for c in containers(deploy)]
    if limits and all(n == 1 for n in limits):
        score += 1
    else:
        problems.append("笔记本的 nvidia.com/gpu 申请被改过了：time-slicing 下的「1」就是一份时间片")
    scaled = [int(m.group(1)) for e in events(ctx, ns, "ScalingReplicaSet")
              if dig(e, "involvedObject", "name") == DEV and (m := SCALED_UP.search(e.get("message") or ""))]
    top = max(scaled, default=0)
    placed = dev_placed(ctx)
    refused = events(ctx, ns, "FailedScheduling")
    if offer.shares is None:
        score += 2
        queued = f"，有 {len(refused)} 条调度失败（FailedScheduling）事件" if refused else ""
        notes.append(f"{UNUSABLE[offer.why]}，开发阶段 GPU 节点报了几份，从评分时采集的对象里看不出来"
                     f"（配置的问题在 ts-config / ts-applied 里计分）：笔记本最多扩到了 {top} 个{queued}，"
                     "扩到几个、有没有排队这两项这里不再扣分")
    else:
        own = offer.per_card != REPLICAS_PER_CARD  # the config offers another number: say what it offered
        source = ("评分时 ClusterPolicy 没有给 device plugin 指定配置，它按默认设置，" if offer.why == "defaults"
                  else "按评分时选中的 device plugin 配置，")
        offered = f"（{source}{offer.cards} 张卡每张报 {offer.per_card} 份，共 {offer.shares} 份）" if own else ""
        if top == offer.shares:
            score += 1
            if own:
                notes.append(f"笔记本扩到了 {top} 个，正好用满了节点报出的份数{offered}；"
                             "每张卡报几份在 ts-config / ts-applied 里计分，这里不再扣分")
        elif top > offer.shares:
            problems.append(f"笔记本扩到了 {top} 个，多于节点能给的份数{offered}：多出来的只能 Pending")
        elif own:
            problems.append(f"笔记本最多只扩到了 {top} 个{offered}：还有份额空着（dev_replicas 是从哪里读的？"
                            "读的时候 device plugin 的新配置生效了吗？）")
        else:
            problems.append(f"笔记本最多只扩到了 {top} 个：两张卡按要求共享后，还有份额空着（dev_replicas 是从哪里读的？"
                            "读的时候 device plugin 的新配置生效了吗？）")
        if refused:
            problems.append("有笔记本因为调度失败排过队（FailedScheduling）：它们要的份额节点上没有")
        elif top and len(placed) >= top:
            score += 1
        else:
            problems.append("没有看到笔记本真的被调度到 GPU 节点上")
    result = ratio(score, 3, problems)
    message = "；".join([*([result.message] if result.message else []), *notes])
    return type(result)(result.fraction, message + ("。" if notes else ""))


@check("dev-sees-neighbours", points=1, title="从容器里看到了邻居的显存")
def dev_sees_neighbours(ctx: Context):
    """A step check: reading ``memory.used``. It shows neighbours only if the notebook's card was shared,
    which the run proves when the GPU node got at least two notebooks per card (the device plugin spreads
    shared devices over the cards). With fewer — because of the config or the scaling, which cost points in
    ts-config / ts-applied / dev-fit — the reading is judged against that: a whole number of notebooks'
    memory (0 when none ran) is right, and the message says how many notebooks were placed."""
    seen = ctx.value("seen_memory_mib")
    if isinstance(seen, bool) or not isinstance(seen, int):
        return failed("seen_memory_mib 应该是 nvidia-smi 输出里 memory.used 的整数值（MiB）。")
    if seen < 0 or seen % DEV_MEMORY_MIB:
        return failed(f"记录的 {seen} MiB 不是若干个笔记本用量（每个 {DEV_MEMORY_MIB} MiB）之和："
                      "取的是 nvidia-smi 输出里 memory.used 那一列吗？")
    if seen > DEV_MEMORY_MIB:
        return passed()
    placed, cards = len(dev_placed(ctx)), physical_cards(ctx)
    if cards and placed >= 2 * cards:
        return failed(f"开发阶段有 {placed} 个笔记本被调度到 GPU 节点的 {cards} 张卡上，每张卡都不止一个，"
                      f"可记录的已用显存（{seen} MiB）没有超出一个笔记本自己的用量：那一刻看的是哪个笔记本、哪一列？")
    return passed(f"开发阶段只有 {placed} 个笔记本被调度到 GPU 节点上（{cards} 张卡），看不出有哪张卡被共享，"
                  f"记录的 {seen} MiB 和这一点对得上；份数和扩容的问题在 ts-config / ts-applied / dev-fit 里计分，"
                  "这里不再扣分。")


_CONCEPTS = (
    (re.compile(r"显存|内存|memory|VRAM|HBM", re.I), "解释里没有说清楚是卡上的哪一种资源没有被隔离"),
    (re.compile(r"时间片|轮流|轮转|分时|交替|time.?slic|take turns|算力|compute", re.I),
     "解释里没有说 time-slicing 实际分的是什么（它怎样让几个容器共用一张卡）"),
    (re.compile(r"OOM|out of memory|一起挂|一起失败|一起崩|连带|邻居|其它容器|其他容器|别的容器|拖垮|neighbo", re.I),
     "解释里没有说一个容器把显存用多了，会怎样波及同一张卡上的其它容器"),
    (re.compile(r"MIG|硬件(级|层面)?隔离|hardware|独立实例|切成", re.I), "解释里没有说要真正隔离显存该用什么"),
)


_MIG = re.compile(r"MIG|硬件", re.I)
_WRONG = (
    # time-slicing splitting the memory is the very thing it does not do (a clause about MIG is another matter)
    WrongClaim(re.compile(r"(显存|memory|VRAM).{0,12}(平分|均分|切分|切开|分成|分割|划分|等分|按份|隔离开|partition|split|"
                          r"divided|isolated)|(平分|均分|切分|分割|划分|等分|partition|split|divide)s?.{0,8}(显存|memory|VRAM)|"
                          r"(1/4|四分之一|1/N|一份|自己那份|自己的那份)\s*的?\s*(显存|memory)", re.I),
               "time-slicing 把显存分开了", "你从容器里用 nvidia-smi 看到的已用显存是多少？", unless=_MIG),
    # under time-slicing an OOM does take the neighbours down (the lab shows it)
    WrongClaim(re.compile(r"(不影响|不会影响|影响不到|不波及|不会波及|互不影响|不会连累|doesn't affect|won't affect|"
                          r"does not affect|will not affect)(到)?\s*(the\s+)?(别人|邻居|其他|其它|别的|others?|neighbo)",
                          re.I),
               "一个容器 OOM 不会波及同一张卡上的其它容器", "同一张卡上的其它笔记本当时怎样了？", unless=_MIG),
    # Kubernetes limits do not reach GPU memory: the device plugin hands out devices, not MiB
    WrongClaim(re.compile(r"(设|设置|加|写|配|用|通过|靠).{0,6}(limits?|requests?|资源限制|resources).{0,12}"
                          r"(显存|memory|VRAM)", re.I),
               "用 limits/requests 就能限住显存", "Pod 的资源声明里有哪一项能限制 GPU 显存吗？",
               unless=_MIG, kind="remedy"),
)


@check("explanation", points=3, title="解释 time-slicing 为什么不隔离显存")
def explanation(ctx: Context):
    """Scored on what it claims (:func:`~gpulab.grading.checks.judge_explanation`): memory, what
    time-slicing shares, the neighbours' OOM and MIG each earn a share; a clause that seems to assert that
    time-slicing splits the memory (a wrong mechanism) or a limits-based remedy is asked about and marked for
    review, two shares or one withheld until the instructor decides."""
    return judge_explanation(ctx.value("explanation"), _CONCEPTS, _WRONG,
                             too_short="explanation 应该是你自己写的两三句话（至少十几个字）。")


def infer_resource(ctx: Context) -> str | None:
    deploy = ctx.object("Deployment", INFER, f"{ctx.namespace}-infer")
    if deploy is None:
        return None
    names = [k for c in containers(deploy) for k in (dig(c, "resources", "limits") or {}) if k.startswith("nvidia.com/")]
    return names[0] if names else None


@check("mig-layout", points=3, title="MIG 切分：mixed 策略、切分成功、实例放得下 8 GiB 的模型")
def mig_layout(ctx: Context):
    labels = node_labels(ctx)
    if not labels:
        return failed("评分时集群里找不到 GPU 节点，无法核对；请联系讲师。")
    problems, score = [], 0
    if dig(policy(ctx), "spec", "mig", "strategy") == "mixed":
        score += 1
    else:
        problems.append("ClusterPolicy 的 mig.strategy 不是章节里用的那种：在这种策略下，MIG 实例以什么资源名上报？")
    state = labels.get(MIG_CONFIG_STATE_LABEL)
    if labels.get(MIG_CONFIG_LABEL, "all-disabled") == "all-disabled":
        problems.append("GPU 节点没有声明任何 MIG 切分（nvidia.com/mig.config）")
    elif state == "success":
        score += 1
    else:
        problems.append(f"MIG manager 没有应用你的切分（状态 {state or '未知'}）：看 GPU 节点的 MigConfigFailed 事件——"
                        "规格名对吗？切的时候卡上还有 Pod 吗？")
    alloc = dig(gpu_node(ctx) or {}, "status", "allocatable", default={}) or {}
    offers = [mig_offer(ctx, r) for r in alloc if r.startswith("nvidia.com/")]
    if any(n >= INFER_REPLICAS and (mib or 0) >= INFER_MEMORY_MIB for n, mib in offers):
        score += 1
    elif any(n and mib for n, mib in offers):
        problems.append("切出来的实例里，放得下 8 GiB 模型的不够六个：每张卡切几个、每个多大？")
    else:
        problems.append("节点上没有上报任何 MIG 实例：切分之后是 device plugin 把实例上报成资源的，它在正常运行吗？")
    return ratio(score, 3, problems)


@check("infer-isolated", points=2, title="六个推理副本各自拿到一个 MIG 实例")
def infer_isolated(ctx: Context):
    ns = f"{ctx.namespace}-infer"
    ctx.require("Deployment", INFER, ns)
    resource = infer_resource(ctx)
    problems, score = [], 0
    count, mib = mig_offer(ctx, resource) if resource else (0, None)
    if resource and resource.startswith("nvidia.com/mig-") or (resource == GPU and mib):
        score += 1
    elif resource:
        problems.append(f"推理副本申请的是 {resource}：它在现在的节点上不是 MIG 实例，租户之间的显存没有隔离")
    else:
        problems.append("推理副本没有申请任何 GPU 资源")
    pods = [p for p in ctx.objects("Pod", ns, labels={"app": INFER}) if not p["metadata"].get("deletionTimestamp")]
    holding = [p for p in pods if dig(p, "status", "phase") == "Running" and resource and pod_devices(p).get(resource)]
    if len(holding) >= INFER_REPLICAS:
        score += 1
    else:
        pending = [p for p in pods if not dig(p, "spec", "nodeName")]
        why = f"（{len(pending)} 个还没被调度：看它们的 FailedScheduling 事件）" if pending else ""
        problems.append(f"只有 {len(holding)} 个副本拿着 GPU 资源在运行{why}")
    return ratio(score, 2, problems)


@check("mig-count", points=1, title="读出了 MIG 实例的数量")
def mig_count(ctx: Context):
    """A step check: ``mig_instances`` is judged against what the GPU node's allocatable holds for the
    resource the inference replicas ask for, 0 included — when the node advertises none of it (a layout or
    strategy that mig-layout / infer-isolated judge), recording 0 reads the node right."""
    recorded = ctx.value("mig_instances")
    if isinstance(recorded, bool) or not isinstance(recorded, int):
        return failed("mig_instances 应该是一个整数。")
    resource = infer_resource(ctx)
    if resource is None:
        return failed("没有找到推理副本申请的 GPU 资源（infer-small 不在，或它没有申请 nvidia.com/ 资源）："
                      "mig_instances 没有可以对照的数。")
    actual = quantity_int(dig(gpu_node(ctx) or {}, "status", "allocatable", resource)) or 0
    if recorded == actual:
        if not actual:
            return passed(f"记录的 0 和节点一致：评分时 GPU 节点的 allocatable 里没有 {resource}"
                          "（为什么没有，在 mig-layout / infer-isolated 里计分）。")
        return passed()
    if not recorded:
        return failed(f"记录的实例数是 0，可评分时 GPU 节点的 allocatable 里有推理副本申请的 {resource}："
                      "读的是哪个资源名、在什么时候读的？")
    if not actual:
        return failed(f"记录的实例数是 {recorded}，可评分时 GPU 节点的 allocatable 里没有推理副本申请的 {resource}。")
    return failed("mig_instances 和 GPU 节点 allocatable 里那种 MIG 实例的数量对不上。")
