"""``gpulab report``: GPU allocation against GPU computing, per namespace and per node.

The chapter's cost rule is that money is lost when a card is *held but not
computing*. From the usage samples (:mod:`gpulab.usage.samples`) this adds
up, over a time window:

- GPU-hours allocated: time a device was given to some pod, times the share
  of a GPU it is (a MIG instance counts its compute slices over its GPU's:
  a 1g on an H100 1/7, on an A30 1/4);
- GPU-hours computing: the same, weighted by the device's utilisation;
- idle allocated GPU-hours: allocated while its utilisation was 0 %;

and from the API, as they are now: ResourceQuota use of
``requests.nvidia.com/gpu`` per namespace, and the pods the scheduler
preempted (its ``Preempted`` events). A device shared by several pods
(time-slicing) is split evenly among their namespaces.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .samples import Snapshot

QUOTA_KEYS = ("requests.nvidia.com/gpu", "limits.nvidia.com/gpu")


@dataclass
class Usage:
    """Allocated / computing / idle GPU-hours of one namespace, node or device."""

    name: str
    gpus_now: float = 0.0          # GPUs (or GPU shares) held in the latest sample
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
class Report:
    start: float
    end: float
    samples: int
    namespaces: list[Usage]
    nodes: list[Usage]
    preemptions: list[Preemption] = field(default_factory=list)
    snapshots: list[Snapshot] = field(default_factory=list)

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
        return {"start": self.start, "end": self.end, "samples": self.samples,
                "namespaces": [row(u) for u in self.namespaces], "nodes": [row(u) for u in self.nodes],
                "total": row(self.total),
                "preemptions": [vars(p) for p in self.preemptions]}

    def text(self) -> str:
        return render_text(self)


def _durations(snaps: list[Snapshot], interval: float | None) -> list[float]:
    """Seconds each snapshot stands for: until the next one, capped where sampling paused."""
    if not snaps:
        return []
    gaps = [b.t - a.t for a, b in zip(snaps, snaps[1:]) if b.t > a.t]
    step = interval or (statistics.median(gaps) if gaps else 5.0)
    out = [min(b.t - a.t, 2 * step) for a, b in zip(snaps, snaps[1:])]
    return out + [step]


def _quota(quotas: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    out: dict[str, list[str]] = {}
    for q in quotas:
        ns = q["metadata"].get("namespace", "")
        status = q.get("status") or {}
        for key in QUOTA_KEYS:
            hard = (status.get("hard") or q.get("spec", {}).get("hard") or {}).get(key)
            if hard is None:
                continue
            used = (status.get("used") or {}).get(key, "0")
            out.setdefault(ns, []).append(f"{used}/{hard}" + ("" if key.startswith("requests.") else " (limits)"))
    return {ns: ", ".join(v) for ns, v in out.items()}


def _preemptions(events: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> list[Preemption]:
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
        at = ev.get("lastTimestamp") or ev.get("eventTime") or (ev.get("metadata") or {}).get("creationTimestamp", "")
        out.append(Preemption(obj.get("namespace", ""), obj.get("name", ""), node,
                              by_uid.get(uid, uid), str(at)))
    out.sort(key=lambda p: p.at)
    return out


def build(snapshots: Iterable[Snapshot], quotas: Iterable[Mapping[str, Any]] = (),
          events: Iterable[Mapping[str, Any]] = (), pods: Iterable[Mapping[str, Any]] = (),
          namespace: str | None = None, interval: float | None = None, now: float | None = None) -> Report:
    snaps = sorted(snapshots, key=lambda s: s.t)
    durations = _durations(snaps, interval)
    by_ns: dict[str, Usage] = {}
    by_node: dict[str, Usage] = {}
    last = snaps[-1] if snaps else None
    for snap, dt in zip(snaps, durations):
        hours = dt / 3600
        for dev in snap.devices:
            node = by_node.setdefault(dev.node, Usage(dev.node))
            holders = dev.holders
            if namespace is not None:
                holders = [h for h in holders if h[0] == namespace]
            if not holders:
                continue
            share = dev.weight * len(holders) / len(dev.holders)
            busy = share * min(dev.util, 100.0) / 100
            idle = share if dev.util <= 0 else 0.0
            node.allocated_h += share * hours
            node.computing_h += busy * hours
            node.idle_h += idle * hours
            if snap is last:
                node.gpus_now += share
                node.idle_now += idle
            for ns, _pod in holders:
                u = by_ns.setdefault(ns, Usage(ns))
                part = dev.weight / len(dev.holders)
                u.allocated_h += part * hours
                u.computing_h += part * min(dev.util, 100.0) / 100 * hours
                u.idle_h += (part if dev.util <= 0 else 0.0) * hours
                if snap is last:
                    u.gpus_now += part
                    u.idle_now += part if dev.util <= 0 else 0.0
    quota = _quota(quotas)
    for ns, text in quota.items():
        if namespace is None or ns == namespace:
            by_ns.setdefault(ns, Usage(ns)).quota = text
    preempted = [p for p in _preemptions(events, pods) if namespace is None or p.namespace == namespace]
    end = now if now is not None else (snaps[-1].t if snaps else time.time())
    start = snaps[0].t if snaps else end
    return Report(start, end, len(snaps), sorted(by_ns.values(), key=lambda u: u.name),
                  sorted(by_node.values(), key=lambda u: u.name), preempted, snaps)


def _hours(h: float) -> str:
    return f"{h:.3f}"


def table_rows(title: str, rows: list[Usage], with_quota: bool) -> tuple[list[str], list[dict[str, str]]]:
    """The columns and formatted rows of one usage table (``NAMESPACE`` or ``NODE``), whoever draws it."""
    head = [title, "GPUS NOW", "IDLE NOW", "GPU-H ALLOCATED", "GPU-H COMPUTING", "GPU-H IDLE", "EFFICIENCY"]
    if with_quota:
        head.append("QUOTA requests.nvidia.com/gpu")
    body = []
    for u in rows:
        eff = u.efficiency
        cells = [u.name, f"{u.gpus_now:g}", f"{u.idle_now:g}", _hours(u.allocated_h), _hours(u.computing_h),
                 _hours(u.idle_h), "-" if eff is None else f"{eff:.0%}"]
        if with_quota:
            cells.append(u.quota or "-")
        body.append(dict(zip(head, cells)))
    return head, body


def _table(title: str, rows: list[Usage], with_quota: bool) -> list[str]:
    head, dicts = table_rows(title, rows, with_quota)
    body = [list(d.values()) for d in dicts]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    return ["   ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *body]]


def render_text(report: Report) -> str:
    span = max(0.0, report.end - report.start)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(report.start))
    lines = [f"GPU usage since {when} ({span / 60:.1f} min, {report.samples} samples)", ""]
    if not report.samples:
        lines += ["no usage samples yet: the custom metrics adapter records one every few seconds "
                  "(kubectl -n custom-metrics get pods)", ""]
    lines += _table("NAMESPACE", report.namespaces, with_quota=True) if report.namespaces else \
        ["NAMESPACE   (no namespace has held a GPU)"]
    lines.append("")
    lines += _table("NODE", report.nodes, with_quota=False) if report.nodes else ["NODE   (no GPU nodes sampled)"]
    total = report.total
    lines += ["", f"total: {total.allocated_h:.3f} GPU-hours allocated, {total.computing_h:.3f} computing, "
                  f"{total.idle_h:.3f} allocated but idle; {total.idle_now:g} of {total.gpus_now:g} "
                  "allocated GPUs idle now"]
    if report.preemptions:
        lines += ["", "PREEMPTED"]
        for p in report.preemptions:
            lines.append(f"  {p.namespace}/{p.pod} on {p.node or '?'} by {p.by or '?'} at {p.at}")
    return "\n".join(lines) + "\n"
