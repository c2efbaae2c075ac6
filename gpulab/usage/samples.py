"""GPU usage samples: what every GPU device was doing, and for whom, at one instant.

A sample is built from what a monitoring stack has: the DCGM exporters'
metrics (utilisation, framebuffer, the pod holding an exclusive device) and
the pods of the cluster (which devices each container was given, the
``gpulab.io/allocated-devices`` annotation the node side writes; on a
time-sliced GPU DCGM cannot name the pods, the allocation can). Samples are
appended to a JSON-lines file by the custom metrics adapter, as Prometheus
would store its scrapes, and :mod:`gpulab.usage.report` adds them up.

One device is a whole GPU, or one MIG instance counted as its share of the
GPU's compute slices (a ``1g.10gb`` instance of an H100 is 1/7 of a GPU, a
``1g.6gb`` of an A30 1/4), so GPU-hours of MIG and whole cards add up. The
share comes from the GPU's model (:mod:`gpulab.hardware.models`), named by
the ``modelName`` label every DCGM series carries.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..hardware.models import GpuModelError, get_model
from ..kube.names import ALLOCATED_DEVICES_ANNOTATION

Sample = tuple[str, dict[str, str], float]  # (metric name, labels, value), as dcgm.parse gives them

_REPLICA = re.compile(r"::\d+$")


@dataclass
class Device:
    node: str
    gpu: str                      # the GPU's index on its node
    uuid: str                     # the GPU's UUID
    model: str                    # the GPU's product name (DCGM's modelName)
    util: float                   # percent of the device's compute in use
    fb_used_mib: float
    fb_total_mib: float
    mig: str | None = None        # MIG profile, e.g. "1g.10gb"; None for a whole GPU
    gi: str | None = None         # MIG GPU instance ID
    weight: float = 1.0           # share of one GPU this device is
    holders: list[list[str]] = field(default_factory=list)  # [[namespace, pod], ...]

    @property
    def key(self) -> str:
        """A stable row name: node/gpu, with the MIG instance for MIG devices."""
        base = f"{self.node}/gpu{self.gpu}"
        return f"{base}/mig{self.gi}-{self.mig}" if self.mig else base


@dataclass
class Snapshot:
    t: float
    devices: list[Device]

    def to_json(self) -> str:
        return json.dumps({"t": round(self.t, 3), "devices": [asdict(d) for d in self.devices]},
                          separators=(",", ":"), sort_keys=True)

    @staticmethod
    def from_json(line: str) -> "Snapshot":
        raw = json.loads(line)
        return Snapshot(float(raw["t"]), [Device(**d) for d in raw.get("devices") or []])


def mig_weight(model: str, profile: str) -> float:
    """The share of a GPU one ``profile`` instance of a ``model`` GPU is.

    ``model`` is any name :func:`gpulab.hardware.models.get_model` resolves
    (DCGM's ``modelName`` is the product name). An unknown model or profile
    raises :class:`~gpulab.hardware.models.GpuModelError` (a ValueError)
    naming what is allowed: a guessed weight would misstate GPU-hours.
    """
    return get_model(model).mig_share(profile)


def _allocations(pods: Iterable[Mapping[str, Any]]) -> dict[str, list[list[str]]]:
    """Device UUID -> [[namespace, pod], ...] of the live pods the devices were given to."""
    out: dict[str, list[list[str]]] = {}
    for pod in pods:
        md = pod.get("metadata") or {}
        phase = (pod.get("status") or {}).get("phase")
        raw = (md.get("annotations") or {}).get(ALLOCATED_DEVICES_ANNOTATION)
        if not raw or phase in ("Succeeded", "Failed"):
            continue
        try:
            per_container = json.loads(raw)
        except ValueError:
            continue
        holder = [md.get("namespace", ""), md.get("name", "")]
        for resources in per_container.values():
            for ids in (resources or {}).values():
                for device_id in ids or []:
                    uuid = _REPLICA.sub("", str(device_id))
                    if holder not in out.setdefault(uuid, []):
                        out[uuid].append(holder)
    return out


def snapshot(t: float, samples: Iterable[Sample], pods: Iterable[Mapping[str, Any]]) -> Snapshot:
    """The devices of all DCGM pages (``samples``) with their holders at time ``t``."""
    allocated = _allocations(pods)
    devices: dict[tuple[str, str, str | None], Device] = {}
    for name, labels, value in samples:
        if "UUID" not in labels:
            continue
        gi = labels.get("GPU_I_ID")
        key = (labels.get("Hostname", ""), labels["UUID"], gi)
        dev = devices.get(key)
        if dev is None:
            profile = labels.get("GPU_I_PROFILE")
            model = labels.get("modelName", "")
            weight = 1.0
            if profile:
                try:
                    weight = mig_weight(model, profile)
                except GpuModelError as exc:
                    raise GpuModelError(f"MIG device {profile} (GPU instance {gi}) of GPU {labels['UUID']} on "
                                        f"{labels.get('Hostname', '?')}: {exc}") from exc
            dev = devices[key] = Device(node=labels.get("Hostname", ""), gpu=labels.get("gpu", ""),
                                        uuid=labels["UUID"], model=model, util=0.0,
                                        fb_used_mib=0.0, fb_total_mib=0.0, mig=profile, gi=gi,
                                        weight=weight)
        if labels.get("pod"):
            holder = [labels.get("namespace", ""), labels["pod"]]
            if holder not in dev.holders:
                dev.holders.append(holder)
        if name == "DCGM_FI_DEV_FB_USED":
            dev.fb_used_mib = value
            dev.fb_total_mib += value
        elif name == "DCGM_FI_DEV_FB_FREE":
            dev.fb_total_mib += value
        elif name == "DCGM_FI_DEV_GPU_UTIL" and dev.mig is None:
            dev.util = value
        elif name == "DCGM_FI_PROF_GR_ENGINE_ACTIVE" and dev.mig is not None:
            # DCGM has no GPU_UTIL for MIG instances; engine activity is the measure.
            dev.util = round(value * 100, 2)
    # A time-sliced GPU carries no pod labels (DCGM cannot tell its users apart): the allocation can.
    for dev in devices.values():
        if dev.mig is None and not dev.holders:
            dev.holders = allocated.get(dev.uuid, [])
    # A MIG-enabled GPU also has GPU-level series (clocks, power): not a device of its own.
    migged = {(d.node, d.uuid) for d in devices.values() if d.mig}
    rows = [d for d in devices.values() if d.mig or (d.node, d.uuid) not in migged]
    rows.sort(key=lambda d: (d.node, int(d.gpu) if d.gpu.isdigit() else 0, int(d.gi or -1)))
    return Snapshot(t, rows)


class Store:
    """Snapshots as JSON lines in one file; appends are whole lines, reads skip torn ones."""

    def __init__(self, path: Path, max_bytes: int = 64 << 20):
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    def append(self, snap: Snapshot) -> None:
        line = (snap.to_json() + "\n").encode()
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                if self.path.stat().st_size + len(line) > self.max_bytes:
                    os.replace(self.path, self.path.with_suffix(self.path.suffix + ".1"))
            except FileNotFoundError:
                pass
            # O_APPEND: one write of a whole line, so a reader never sees half of one.
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)

    def read(self, since: float | None = None, until: float | None = None) -> list[Snapshot]:
        snaps: list[Snapshot] = []
        for path in (self.path.with_suffix(self.path.suffix + ".1"), self.path):
            try:
                text = path.read_text(encoding="utf-8")
            except FileNotFoundError:
                continue
            for line in text.splitlines():
                try:
                    snap = Snapshot.from_json(line)
                except (ValueError, TypeError, KeyError):
                    continue  # a line cut short by a crash
                if (since is None or snap.t >= since) and (until is None or snap.t <= until):
                    snaps.append(snap)
        snaps.sort(key=lambda s: s.t)
        return snaps


def store_path(cluster_dir: Path) -> Path:
    return Path(cluster_dir) / "usage" / "samples.jsonl"
