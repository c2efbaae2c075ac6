"""``gpulab report``: GPU allocation against GPU computing, per namespace and per node, from Prometheus.

The chapter's cost rule is that money is lost when a card is *held but not computing*. Prometheus (the
monitoring add-on) has both halves: kube-state-metrics says what every pod asked for and whether it runs,
the DCGM exporters say what every device computes and, for a device one pod holds, which pod. Over a
window ``[start, end]``, sampled every ``step`` seconds (Prometheus scrapes every 5 s), the queries below
add up:

- **GPUs now** and **GPU-hours allocated** (``ALLOCATED_H``): the GPU resources of the pods that are
  Running (``kube_pod_container_resource_requests`` joined on namespace and pod with
  ``kube_pod_status_phase``), each unit counted as the share of a GPU it is. A unit of ``nvidia.com/gpu``
  (or ``nvidia.com/gpu.shared``) is its node's GPUs over the units the node advertises (``UNIT_SHARE``): a
  whole GPU is 1, a time-sliced or MPS replica 1/replicas, and under the ``single`` MIG strategy an
  instance is 1/(instances per GPU). A MIG instance of the ``mixed`` strategy (``nvidia.com/mig-<profile>``)
  is its compute slices over its GPU's (a 1g on an H100 1/7, on an A30 1/4), from the node's GPU model;
- **GPU-hours computing** (``COMPUTING_H``): each device's utilisation over time (``DCGM_FI_DEV_GPU_UTIL``
  / 100 of a whole GPU, ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` of a MIG instance times its share), counted for
  the namespace of the pod DCGM names on the device while that pod is Running;
- **idle allocated GPU-hours** and **idle now** (``IDLE_H``, ``IDLE_NOW``): the time a device a pod holds
  computes nothing at all;
- **quota**: ``used/hard`` of ``requests.nvidia.com/gpu`` (and ``limits.``) from ``kube_resourcequota``.

DCGM cannot tell the pods sharing a time-sliced (or MPS) GPU apart, so such a GPU's series name no pod:
its holders' GPU-hours count as allocated, while its computing counts for its node only and its idle time
is not known (a namespace sharing GPUs shows allocated without computing or idle hours; node rows count
the computing of every device). The pods the scheduler preempted come from the API's Events (its
``Preempted`` events), not from Prometheus.

:func:`build` is the arithmetic, a pure function of the queries' results; ``usage.collect`` runs the
queries of :func:`queries` and calls it. The report keeps the queries it ran (``report.queries``) so that
a lesson can show them.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from string import Template
from typing import Any

from ..hardware.models import GpuModelError, get_model
from ..i18n import N_, _, cells, pad
from .prometheus import DCGM_JOB, SCRAPE_INTERVAL

# --------------------------------------------------------------------------- the queries
# ``${window}`` and ``${step}`` (whole seconds) are filled in by queries().

#: kube-state-metrics' names of the GPU resources it reports: ``nvidia.com/gpu`` (``.shared`` when
#: time-slicing renames it), and the mixed MIG strategy's ``nvidia.com/mig-<profile>``.
WHOLE_GPU_RESOURCES = "nvidia_com_gpu|nvidia_com_gpu_shared"
MIG_RESOURCES = "nvidia_com_mig_.+"

#: The pods that are running (one series each, value 1).
RUNNING_PODS = 'max by (namespace, pod) (kube_pod_status_phase{phase="Running"}) == 1'
#: The units of ``nvidia.com/gpu`` each pod asked for, on the node it was scheduled to.
WHOLE_GPU_REQUESTS = ("sum by (namespace, pod, node, resource) (kube_pod_container_resource_requests"
                      f'{{unit="integer",resource=~"{WHOLE_GPU_RESOURCES}"}})')
#: The MIG instances (mixed strategy) each pod asked for.
MIG_REQUESTS = ("sum by (namespace, pod, node, resource) (kube_pod_container_resource_requests"
                f'{{unit="integer",resource=~"{MIG_RESOURCES}"}})')
#: The units of ``nvidia.com/gpu`` each node advertises.
GPU_UNITS_ADVERTISED = f'sum by (node) (kube_node_status_capacity{{resource=~"{WHOLE_GPU_RESOURCES}"}})'
#: The share of a GPU one unit of ``nvidia.com/gpu`` is on each node: its GPUs (the distinct UUIDs of its DCGM
#: temperature series) over the units it advertises; 1 where DCGM does not say. Counted by UUID, not by series:
#: while a series changes its labels (a pod takes the card, the scrape config is reloaded) the old one lingers
#: for a scrape or two beside the new one.
UNIT_SHARE = (f"count by (node) (group by (node, UUID) (DCGM_FI_DEV_GPU_TEMP)) / on (node) ({GPU_UNITS_ADVERTISED} > 0)"
              f" or on (node) group by (node) ({GPU_UNITS_ADVERTISED})")
#: GPUs each running pod holds: whole-GPU units weighted by UNIT_SHARE, MIG instances counted (weighted later).
HELD = (f"({WHOLE_GPU_REQUESTS} * on (node) group_left () ({UNIT_SHARE}) or {MIG_REQUESTS})"
        f" * on (namespace, pod) group_left () ({RUNNING_PODS})")
#: How busy each device is, 0 to 1: a whole GPU's utilisation, a MIG instance's graphics engine activity. A
#: device DCGM names a pod on counts while that pod is Running, as in HELD (DCGM names it from the moment its
#: devices are allocated, kube-state-metrics says Running a scrape later), so that computing hours never exceed
#: allocated ones; a device naming no pod (shared by time-slicing or MPS) counts for its node as it is.
DEVICE_BUSY = ('((DCGM_FI_DEV_GPU_UTIL{pod!=""} / 100 or DCGM_FI_PROF_GR_ENGINE_ACTIVE{pod!="",GPU_I_PROFILE!=""})'
               f' * on (namespace, pod) group_left () ({RUNNING_PODS}))'
               ' or DCGM_FI_DEV_GPU_UTIL{pod=""} / 100 or DCGM_FI_PROF_GR_ENGINE_ACTIVE{pod="",GPU_I_PROFILE!=""}')
#: 1 for each device a Running pod holds (DCGM names the pod) while it computes nothing, else 0. Running, as in
#: HELD: DCGM names a pod from the moment its devices are allocated, before it runs, and a card is idle only while
#: it is allocated, so that idle hours never exceed allocated ones.
DEVICE_HELD_IDLE = ('((DCGM_FI_DEV_GPU_UTIL{pod!=""} == bool 0)'
                    ' or (DCGM_FI_PROF_GR_ENGINE_ACTIVE{pod!="",GPU_I_PROFILE!=""} == bool 0))'
                    f' * on (namespace, pod) group_left () ({RUNNING_PODS})')
#: Device series are summed per holder's namespace, node and kind of device (whole GPU or MIG profile).
BY_DEVICE = "namespace, node, modelName, GPU_I_PROFILE"
BY_ALLOCATION = "namespace, node, resource"

GPUS_NOW = f"sum by ({BY_ALLOCATION}) ({HELD})"
ALLOCATED_H = f"sum by ({BY_ALLOCATION}) (sum_over_time(({HELD})[${{window}}s:${{step}}s])) * ${{step}} / 3600"
COMPUTING_H = f"sum by ({BY_DEVICE}) (sum_over_time(({DEVICE_BUSY})[${{window}}s:${{step}}s])) * ${{step}} / 3600"
IDLE_H = f"sum by ({BY_DEVICE}) (sum_over_time(({DEVICE_HELD_IDLE})[${{window}}s:${{step}}s])) * ${{step}} / 3600"
IDLE_NOW = f"sum by ({BY_DEVICE}) ({DEVICE_HELD_IDLE})"
QUOTA = 'kube_resourcequota{resource=~"requests.nvidia.com/gpu|limits.nvidia.com/gpu"}'
#: The GPU nodes of the window and their GPU model (what a MIG profile's share depends on).
GPU_NODES = "group by (node, modelName) (max_over_time(DCGM_FI_DEV_GPU_TEMP[${window}s]))"
#: How many scrapes of the DCGM exporters Prometheus has in the window.
SCRAPES = f'sum(count_over_time(up{{job="{DCGM_JOB}"}}[${{window}}s]))'
#: For the pictures (range queries): each device's utilisation in percent, and who holds it (the namespace
#: DCGM names, with the device's framebuffer use: without a namespace, memory in use means shared).
UTILIZATION = ('max by (node, gpu, GPU_I_ID, GPU_I_PROFILE) '
               '(DCGM_FI_DEV_GPU_UTIL or DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_PROFILE!=""} * 100)')
HOLDERS = "max by (node, gpu, GPU_I_ID, GPU_I_PROFILE, namespace) (DCGM_FI_DEV_FB_USED)"

#: The instant queries a report runs (at its end), by name.
INSTANT_QUERIES = {"gpus_now": GPUS_NOW, "allocated_h": ALLOCATED_H, "computing_h": COMPUTING_H,
                   "idle_h": IDLE_H, "idle_now": IDLE_NOW, "quota": QUOTA, "gpu_nodes": GPU_NODES,
                   "scrapes": SCRAPES}
#: Its range queries (from start to end, every step), by name.
RANGE_QUERIES = {"utilization": UTILIZATION, "holders": HOLDERS}
#: At most this many steps in a window: longer windows get a longer step.
MAX_STEPS = 720

#: ``DeviceTimeline.held_by`` of a device in use that DCGM names no pod for (time-slicing, MPS).
SHARED = "*"


def step_for(window: float) -> int:
    """The step of a window of ``window`` seconds: Prometheus' scrape interval, longer for long windows."""
    return max(SCRAPE_INTERVAL, math.ceil(window / MAX_STEPS))


def queries(window: int, step: int) -> dict[str, str]:
    """Every query of a report over ``window`` seconds every ``step`` seconds, by name, as Prometheus gets it."""
    return {name: Template(q).substitute(window=window, step=step)
            for name, q in {**INSTANT_QUERIES, **RANGE_QUERIES}.items()}


# --------------------------------------------------------------------------- the report


@dataclass
class Usage:
    """Allocated / computing / idle GPU-hours of one namespace or node."""

    name: str
    gpus_now: float = 0.0          # GPUs (or GPU shares) held at the end of the window
    idle_now: float = 0.0          # of those, computing nothing
    allocated_h: float = 0.0
    computing_h: float = 0.0
    idle_h: float = 0.0
    quota: str = ""                # "used/hard" of requests.nvidia.com/gpu

    @property
    def efficiency(self) -> float | None:
        return self.computing_h / self.allocated_h if self.allocated_h > 0 else None


@dataclass
class Preemption:
    namespace: str
    pod: str
    node: str
    by: str          # namespace/name of the preemptor, when it is still known
    at: str


@dataclass
class DeviceTimeline:
    """One device (``node/gpuN``, a MIG instance ``node/gpuN/migG-profile``) at each step of the window."""

    key: str
    times: list[float]
    utilization: list[float | None]   # percent; None where Prometheus has no value
    held_by: list[str | None]         # the namespace holding it; "" free; SHARED; None where Prometheus has nothing


@dataclass
class Report:
    start: float
    end: float
    step: float
    scrapes: int                       # scrapes of the DCGM exporters Prometheus has in the window
    namespaces: list[Usage]
    nodes: list[Usage]
    preemptions: list[Preemption] = field(default_factory=list)
    devices: list[DeviceTimeline] = field(default_factory=list)
    queries: dict[str, str] = field(default_factory=dict)   # name -> the PromQL it ran

    @property
    def total(self) -> Usage:
        t = Usage("total")
        for u in self.nodes:
            t.gpus_now += u.gpus_now
            t.idle_now += u.idle_now
            t.allocated_h += u.allocated_h
            t.computing_h += u.computing_h
            t.idle_h += u.idle_h
        return t

    def to_dict(self) -> dict[str, Any]:
        def row(u: Usage) -> dict[str, Any]:
            return {"name": u.name, "gpus_now": round(u.gpus_now, 3), "idle_now": round(u.idle_now, 3),
                    "gpu_hours_allocated": round(u.allocated_h, 4), "gpu_hours_computing": round(u.computing_h, 4),
                    "gpu_hours_idle": round(u.idle_h, 4), "quota": u.quota}
        return {"start": self.start, "end": self.end, "step": self.step, "scrapes": self.scrapes,
                "namespaces": [row(u) for u in self.namespaces], "nodes": [row(u) for u in self.nodes],
                "total": row(self.total),
                "preemptions": [vars(p) for p in self.preemptions], "queries": dict(self.queries)}

    def text(self) -> str:
        return render_text(self)


# --------------------------------------------------------------------------- results -> report


def _value(sample: Mapping[str, Any]) -> float:
    v = float(sample["value"][1])
    return 0.0 if math.isnan(v) else v


def _sanitized(name: str) -> str:
    """A resource name as kube-state-metrics writes it in its ``resource`` label (nvidia.com/gpu -> nvidia_com_gpu)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def mig_resource_share(model: str, resource: str) -> float:
    """The share of a GPU of ``model`` one unit of the mixed strategy's MIG ``resource`` is, named as
    kube-state-metrics names it (``nvidia_com_mig_1g_10gb``). Raises GpuModelError (a ValueError) for a
    model or resource that has none: a guessed share would misstate GPU-hours."""
    gpu = get_model(model)
    for profile in gpu.mig_profiles:
        if _sanitized(profile.resource_name) == resource:
            return gpu.mig_share(profile)
    raise GpuModelError(f"{gpu.product_name} has no MIG profile with the resource {resource!r}")


def _device_share(labels: Mapping[str, str]) -> float:
    """The share of a GPU a DCGM device is: 1 for a whole GPU, a MIG instance its profile's."""
    profile = labels.get("GPU_I_PROFILE")
    if not profile:
        return 1.0
    model = labels.get("modelName", "")
    try:
        return get_model(model).mig_share(profile)
    except GpuModelError as e:
        raise GpuModelError(f"MIG devices {profile} on {labels.get('node', '?')}: {e}") from e


def _quota(samples: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Namespace -> "used/hard" of each ResourceQuota's GPU keys (limits marked)."""
    found: dict[tuple[str, str, str], dict[str, float]] = {}
    for s in samples:
        m = s["metric"]
        key = (m.get("namespace", ""), m.get("resourcequota", ""), m.get("resource", ""))
        found.setdefault(key, {})[m.get("type", "")] = _value(s)
    out: dict[str, list[str]] = {}
    # requests.nvidia.com/gpu first, then limits.
    for (ns, _quota_name, resource), v in sorted(found.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2].startswith("limits."))):
        if "hard" in v:
            out.setdefault(ns, []).append(f"{v.get('used', 0):g}/{v['hard']:g}"
                                          + ("" if resource.startswith("requests.") else " (limits)"))
    return {ns: ", ".join(texts) for ns, texts in out.items()}


def _timestamp(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except (TypeError, ValueError):
        return None


def preemptions(events: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
                since: float | None = None) -> list[Preemption]:
    """The pods kube-scheduler preempted (its ``Preempted`` events), since ``since`` when given, oldest first;
    ``pods`` name the preemptors (the events name them by UID)."""
    by_uid = {p["metadata"].get("uid"): f"{p['metadata'].get('namespace')}/{p['metadata'].get('name')}"
              for p in pods}
    out = []
    for ev in events:
        if ev.get("reason") != "Preempted":
            continue
        obj = ev.get("involvedObject") or ev.get("regarding") or {}
        message = ev.get("message") or ev.get("note") or ""
        # kube-scheduler: "Preempted by pod <uid> on node <node>"
        words = message.split()
        node = words[words.index("node") + 1] if "node" in words[:-1] else ""
        uid = words[words.index("pod") + 1] if "pod" in words[:-1] else ""
        at = str(ev.get("lastTimestamp") or ev.get("eventTime") or (ev.get("metadata") or {}).get("creationTimestamp", ""))
        when = _timestamp(at)
        if since is not None and when is not None and when < since:
            continue
        out.append(Preemption(obj.get("namespace", ""), obj.get("name", ""), node, by_uid.get(uid, uid), at))
    out.sort(key=lambda p: p.at)
    return out


def _device_key(labels: Mapping[str, str]) -> str:
    base = f"{labels.get('node', '?')}/gpu{labels.get('gpu', '?')}"
    return f"{base}/mig{labels['GPU_I_ID']}-{labels['GPU_I_PROFILE']}" if labels.get("GPU_I_PROFILE") else base


def _device_order(key: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", key))


def timelines(utilization: Iterable[Mapping[str, Any]], holders: Iterable[Mapping[str, Any]]) -> list[DeviceTimeline]:
    """Each device's utilisation and holder at each step, from the range results of UTILIZATION and HOLDERS."""
    util: dict[str, dict[float, float]] = {}
    held: dict[str, dict[float, str]] = {}
    times: set[float] = set()
    for s in utilization:
        points = util.setdefault(_device_key(s["metric"]), {})
        for t, v in s["values"]:
            points[float(t)] = float(v)
            times.add(float(t))
    for s in holders:
        ns = s["metric"].get("namespace", "")
        points_held = held.setdefault(_device_key(s["metric"]), {})
        for t, v in s["values"]:
            t = float(t)
            times.add(t)
            if ns:
                points_held[t] = ns
            elif points_held.get(t, "") in ("", SHARED):
                points_held[t] = SHARED if float(v) > 0 else ""
    ordered = sorted(times)
    return [DeviceTimeline(key, ordered, [util.get(key, {}).get(t) for t in ordered],
                           [held.get(key, {}).get(t) for t in ordered])
            for key in sorted(set(util) | set(held), key=_device_order)]


def build(results: Mapping[str, list[dict[str, Any]]], start: float, end: float, step: float,
          queries: Mapping[str, str] | None = None, preempted: Iterable[Preemption] = (),
          namespace: str | None = None) -> Report:
    """The report from the results of the queries (Prometheus' result lists, by the names of
    ``INSTANT_QUERIES`` and ``RANGE_QUERIES``; a missing one counts as empty), for ``namespace`` alone when
    given (its node rows then count only its GPUs)."""
    def rows(name: str) -> list[dict[str, Any]]:
        return [s for s in results.get(name) or [] if namespace is None or s["metric"].get("namespace") == namespace]

    models = {s["metric"].get("node", ""): s["metric"].get("modelName", "") for s in results.get("gpu_nodes") or []}
    by_ns: dict[str, Usage] = {}
    by_node: dict[str, Usage] = {node: Usage(node) for node in models}

    def allocation_share(labels: Mapping[str, str]) -> float:
        resource = labels.get("resource", "")
        if not re.fullmatch(MIG_RESOURCES, resource):
            return 1.0  # whole-GPU units: HELD weighted them already (UNIT_SHARE)
        node = labels.get("node", "")
        if node not in models:
            raise GpuModelError(f"{resource} on node {node}: no DCGM series name the node's GPU model, so the "
                                "share of a GPU its MIG instances are is not known")
        return mig_resource_share(models[node], resource)

    def add(usage: Usage, attr: str, value: float) -> None:
        setattr(usage, attr, getattr(usage, attr) + value)

    # The query names are Usage's attributes.
    for attr in ("gpus_now", "allocated_h"):
        for s in rows(attr):
            m = s["metric"]
            value = _value(s) * allocation_share(m)
            add(by_ns.setdefault(m.get("namespace", ""), Usage(m.get("namespace", ""))), attr, value)
            add(by_node.setdefault(m.get("node", ""), Usage(m.get("node", ""))), attr, value)
    for attr in ("computing_h", "idle_h", "idle_now"):
        for s in rows(attr):
            m = s["metric"]
            value = _value(s) * _device_share(m)
            add(by_node.setdefault(m.get("node", ""), Usage(m.get("node", ""))), attr, value)
            if m.get("namespace"):  # a device DCGM names no pod for counts for its node only
                add(by_ns.setdefault(m["namespace"], Usage(m["namespace"])), attr, value)
    for ns, text in _quota(rows("quota")).items():
        by_ns.setdefault(ns, Usage(ns)).quota = text
    scrapes = int(sum(_value(s) for s in results.get("scrapes") or []))
    preempted = [p for p in preempted if namespace is None or p.namespace == namespace]
    return Report(start, end, step, scrapes, sorted(by_ns.values(), key=lambda u: u.name),
                  sorted(by_node.values(), key=lambda u: u.name), preempted,
                  # The pictures show every device: whose it is, whatever the namespace asked for.
                  timelines(results.get("utilization") or [], results.get("holders") or []),
                  dict(queries or {}))


# --------------------------------------------------------------------------- text


def _hours(h: float) -> str:
    return f"{h:.3f}"


def _gpus(n: float) -> str:
    return f"{round(n, 3):g}"


def table_rows(title: str, rows: list[Usage], with_quota: bool) -> tuple[list[str], list[dict[str, str]]]:
    """The columns and formatted rows of one usage table (``NAMESPACE`` or ``NODE``), whoever draws it."""
    # Keys for whoever draws the table (the notebook's names them in Chinese); marked, as the CLI shows them translated.
    head = [title, N_("GPUS NOW"), N_("IDLE NOW"), N_("GPU-H ALLOCATED"), N_("GPU-H COMPUTING"), N_("GPU-H IDLE"),
            N_("EFFICIENCY")]
    if with_quota:
        head.append(N_("QUOTA requests.nvidia.com/gpu"))
    body = []
    for u in rows:
        eff = u.efficiency
        cells = [u.name, _gpus(u.gpus_now), _gpus(u.idle_now), _hours(u.allocated_h), _hours(u.computing_h),
                 _hours(u.idle_h), "-" if eff is None else f"{eff:.0%}"]
        if with_quota:
            cells.append(u.quota or "-")
        body.append(dict(zip(head, cells)))
    return head, body


def _table(title: str, rows: list[Usage], with_quota: bool) -> list[str]:
    head, dicts = table_rows(title, rows, with_quota)
    shown = [_(key) for key in head]
    body = [list(d.values()) for d in dicts]
    widths = [max(cells(r[i]) for r in [shown, *body]) for i in range(len(head))]
    return ["   ".join(pad(c, w) for c, w in zip(r, widths)).rstrip() for r in [shown, *body]]


def render_text(report: Report) -> str:
    span = max(0.0, report.end - report.start)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(report.start))
    lines = [_("GPU usage since {when} ({minutes:.1f} min; from Prometheus, every {step:g} s; "
               "{scrapes} DCGM exporter scrapes)", when=when, minutes=span / 60, step=report.step,
               scrapes=report.scrapes), ""]
    if not report.scrapes:
        lines += [_("no DCGM exporter scrapes in this window: Prometheus has data from when the monitoring add-on "
                    "was installed, once its targets are up (kubectl -n monitoring get pods)"), ""]
    lines += _table(N_("NAMESPACE"), report.namespaces, with_quota=True) if report.namespaces else \
        [_("NAMESPACE   (no namespace has held a GPU)")]
    lines.append("")
    lines += _table(N_("NODE"), report.nodes, with_quota=False) if report.nodes else \
        [_("NODE   (no GPU nodes scraped)")]
    total = report.total
    lines += ["", _("total: {allocated:.3f} GPU-hours allocated, {computing:.3f} computing, {idle:.3f} allocated but "
                    "idle; {idle_now} of {gpus_now} allocated GPUs idle now", allocated=total.allocated_h,
                    computing=total.computing_h, idle=total.idle_h, idle_now=_gpus(total.idle_now),
                    gpus_now=_gpus(total.gpus_now))]
    if report.preemptions:
        lines += ["", _("PREEMPTED")]
        for p in report.preemptions:
            lines.append(_("  {namespace}/{pod} on {node} by {by} at {at}", namespace=p.namespace, pod=p.pod,
                           node=p.node or "?", by=p.by or "?", at=p.at))
    return "\n".join(lines) + "\n"
