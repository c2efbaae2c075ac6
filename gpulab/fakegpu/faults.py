"""Hardware and driver faults injected on simulated GPU nodes (``gpulab fault``).

A fault is part of a node's simulated hardware, so it lives with the node:
``<cluster>/nodes/<node>/gpu/faults.json``. It survives ``gpulab down``/``up``
and node-agent restarts until ``gpulab fault clear`` (``gpulab reset`` wipes
the nodes, faults included). The node agent polls the file and acknowledges
each version it applies (``faults.applied`` next to it), so ``gpulab fault``
returns once the fault is in effect; every component then reacts as on a
real node:

``gpu-unhealthy`` (one GPU, ``--gpu N``)
    an Xid 79 ("GPU has fallen off the bus"): the device plugin reports the
    GPU's devices Unhealthy, so allocatable drops and capacity stays.
``device-plugin-down``
    the node's device plugin cannot start: its pod crash-loops and the
    kubelet takes the node's GPU resources to 0 allocatable.
``driver-unreachable``
    the kernel driver does not answer: nvidia-smi fails everywhere, the
    device plugin and GFD crash, the validator waits at driver validation.
``cuda-driver-too-old``
    the host runs an older driver (535, CUDA 12.2) than the CUDA runtime of
    the images: CUDA programs fail with ``CUDA driver version is
    insufficient for CUDA runtime version``.
``no-devices``
    containers get no usable GPU device nodes: the driver is fine on the
    host, but CUDA in containers reports ``no CUDA-capable device is
    detected`` and nvidia-smi in pods finds no devices.
``fabric-manager-down``
    nvidia-fabricmanager is not running on this NVSwitch system: CUDA
    programs fail with ``system not yet initialized``; ``nvidia-smi -q``
    shows Fabric State "In Progress".

A grader journals the faults it is about to change (:func:`snapshot`) and a
later command puts them back (:func:`put_back`) if it was killed before its
own repair (:mod:`gpulab.grading.journal`).

Driver-level faults change what CUDA programs see from their next start:
the operator's validator notices when its pod next starts (delete it to
re-run the validations, as you would on a real cluster).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

from .. import _poll
from ..i18n import N_, _
from . import nvidiasmi

__all__ = [
    "GPU_UNHEALTHY",
    "DEVICE_PLUGIN_DOWN",
    "DRIVER_UNREACHABLE",
    "CUDA_DRIVER_TOO_OLD",
    "NO_DEVICES",
    "FABRIC_MANAGER_DOWN",
    "KINDS",
    "DRIVER_KINDS",
    "FaultError",
    "Fault",
    "NodeFaults",
    "faults_path",
    "load",
    "save",
    "inject",
    "clear",
    "list_all",
    "snapshot",
    "put_back",
    "acknowledge",
    "wait_applied",
]

GPU_UNHEALTHY = "gpu-unhealthy"
DEVICE_PLUGIN_DOWN = "device-plugin-down"
DRIVER_UNREACHABLE = nvidiasmi.FAULT_DRIVER_UNREACHABLE
CUDA_DRIVER_TOO_OLD = nvidiasmi.FAULT_CUDA_DRIVER_TOO_OLD
NO_DEVICES = nvidiasmi.FAULT_NO_DEVICES
FABRIC_MANAGER_DOWN = nvidiasmi.FAULT_FABRIC_MANAGER_DOWN

#: Kind -> what a learner sees, for ``gpulab fault list`` and errors (marked for the catalog: the CLI shows
#: ``_(KINDS[kind])``). The last three quote what CUDA itself reports, which a translation keeps.
KINDS = {
    GPU_UNHEALTHY: N_("one GPU reports Xid 79; the device plugin marks it Unhealthy (allocatable drops)"),
    DEVICE_PLUGIN_DOWN: N_("the device plugin crash-loops; the node's GPU resources go to 0 allocatable"),
    DRIVER_UNREACHABLE: N_("nvidia-smi cannot talk to the driver; plugin and GFD crash"),
    CUDA_DRIVER_TOO_OLD: N_("CUDA driver version is insufficient for CUDA runtime version"),
    NO_DEVICES: N_("no CUDA-capable device is detected (inside containers)"),
    FABRIC_MANAGER_DOWN: N_("system not yet initialized (nvidia-fabricmanager is down)"),
}

#: A driver fault wins over those after it when several are set.
_DRIVER_ORDER = (DRIVER_UNREACHABLE, FABRIC_MANAGER_DOWN, CUDA_DRIVER_TOO_OLD, NO_DEVICES)
#: Faults of the driver layer, which CUDA programs (and the validator) run into.
DRIVER_KINDS = frozenset(_DRIVER_ORDER)

#: The driver an outdated host runs: older than the CUDA 12.x runtimes of the images.
OLD_DRIVER_VERSION = "535.183.01"
OLD_CUDA_VERSION = "12.2"


class FaultError(ValueError):
    """A fault cannot be set or cleared as asked; the message says why."""


@dataclass(frozen=True)
class Fault:
    kind: str
    gpu: int | None = None
    since: float = 0.0

    def describe(self) -> str:
        where = f" (GPU {self.gpu})" if self.gpu is not None else ""
        return f"{self.kind}{where}"


@dataclass(frozen=True)
class NodeFaults:
    """A node's faults as the simulated hardware applies them."""

    faults: tuple[Fault, ...] = ()

    @property
    def kinds(self) -> set[str]:
        return {f.kind for f in self.faults}

    @property
    def unhealthy_gpus(self) -> frozenset[int]:
        return frozenset(f.gpu for f in self.faults if f.kind == GPU_UNHEALTHY and f.gpu is not None)

    @property
    def plugin_down(self) -> bool:
        return DEVICE_PLUGIN_DOWN in self.kinds

    @property
    def driver_unreachable(self) -> bool:
        return DRIVER_UNREACHABLE in self.kinds

    def driver_fault(self, in_container: bool) -> str | None:
        """The nvidia-smi/CUDA fault in effect on the host or inside containers."""
        for kind in _DRIVER_ORDER:
            if kind in self.kinds and (in_container or kind != NO_DEVICES):
                return kind
        return None

    def driver_versions(self, driver: str, cuda: str) -> tuple[str, str]:
        """(driver version, CUDA version) the node reports."""
        if CUDA_DRIVER_TOO_OLD in self.kinds:
            return OLD_DRIVER_VERSION, OLD_CUDA_VERSION
        return driver, cuda


def faults_path(cluster_dir: Path, node: str) -> Path:
    return Path(cluster_dir) / "nodes" / node / "gpu" / "faults.json"


def _ack_path(cluster_dir: Path, node: str) -> Path:
    return faults_path(cluster_dir, node).with_name("faults.applied")


def _version(cluster_dir: Path, node: str) -> str:
    try:
        return str(faults_path(cluster_dir, node).stat().st_mtime_ns)
    except FileNotFoundError:
        return "none"


def acknowledge(cluster_dir: Path, node: str) -> NodeFaults:
    """Load the node's faults and record which version the simulated hardware now applies."""
    version = _version(cluster_dir, node)
    faults = load(cluster_dir, node)
    ack = _ack_path(cluster_dir, node)
    ack.parent.mkdir(parents=True, exist_ok=True)
    tmp = ack.with_name(f".{ack.name}.{os.getpid()}.tmp")
    tmp.write_text(version)
    os.replace(tmp, ack)
    return faults


class _TimedOut(Exception):
    """:func:`wait_applied`'s timeout, which it answers with False."""


def wait_applied(cluster_dir: Path, node: str, timeout: float = 5.0) -> bool:
    """Until the running node agent applies the node's current faults; False after ``timeout``."""
    def applied() -> bool:
        try:
            return _ack_path(cluster_dir, node).read_text() == _version(cluster_dir, node)
        except FileNotFoundError:
            return False

    try:
        return _poll.until(applied, timeout, lambda last: _TimedOut(), interval=0.05)
    except _TimedOut:
        return False


def load(cluster_dir: Path, node: str) -> NodeFaults:
    """The node's faults; a missing or unreadable file means none."""
    try:
        raw = json.loads(faults_path(cluster_dir, node).read_text())
        faults = tuple(Fault(str(f["kind"]), f.get("gpu"), float(f.get("since", 0))) for f in raw["faults"])
    except (OSError, ValueError, KeyError, TypeError):
        return NodeFaults()
    return NodeFaults(tuple(f for f in faults if f.kind in KINDS))


def save(cluster_dir: Path, node: str, faults: Iterable[Fault]) -> None:
    path = faults_path(cluster_dir, node)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"faults": [asdict(f) for f in faults]}, indent=2) + "\n")
    os.replace(tmp, path)


def inject(cluster_dir: Path, gpu_nodes: dict[str, int], node: str, kind: str, gpu: int | None = None) -> Fault:
    """Set a fault on ``node``; ``gpu_nodes`` maps GPU node names to their GPU counts."""
    if kind not in KINDS:
        raise FaultError(_("unknown fault {kind!r}; allowed: {kinds}", kind=kind, kinds=", ".join(KINDS)))
    if node not in gpu_nodes:
        have = ", ".join(sorted(gpu_nodes)) or _("none")
        raise FaultError(_("node {node!r} has no GPUs in this cluster's topology (GPU nodes: {nodes})",
                           node=node, nodes=have))
    if kind == GPU_UNHEALTHY:
        gpu = 0 if gpu is None else gpu
        if not 0 <= gpu < gpu_nodes[node]:
            raise FaultError(_("{node} has GPUs 0-{last}; there is no GPU {gpu}", node=node,
                               last=gpu_nodes[node] - 1, gpu=gpu))
    elif gpu is not None:
        raise FaultError(_("--gpu applies to {gpu_kind} only; {kind} affects the whole node",
                           gpu_kind=GPU_UNHEALTHY, kind=kind))
    fault = Fault(kind, gpu, time.time())
    current = [f for f in load(cluster_dir, node).faults if (f.kind, f.gpu) != (kind, gpu)]
    save(cluster_dir, node, [*current, fault])
    return fault


def clear(cluster_dir: Path, nodes: Iterable[str], kind: str | None = None) -> list[tuple[str, Fault]]:
    """Clear faults (all, or those of ``kind``) on ``nodes``; returns what was cleared."""
    if kind is not None and kind not in KINDS:
        raise FaultError(_("unknown fault {kind!r}; allowed: {kinds}", kind=kind, kinds=", ".join(KINDS)))
    cleared: list[tuple[str, Fault]] = []
    for node in nodes:
        current = load(cluster_dir, node).faults
        keep = [f for f in current if kind is not None and f.kind != kind]
        cleared += [(node, f) for f in current if f not in keep]
        if len(keep) != len(current):
            save(cluster_dir, node, keep)
    return cleared


def list_all(cluster_dir: Path, nodes: Iterable[str]) -> list[tuple[str, Fault]]:
    return [(node, f) for node in nodes for f in load(cluster_dir, node).faults]


def snapshot(cluster_dir: Path, nodes: Iterable[str]) -> dict[str, list[dict]]:
    """The faults set on ``nodes`` as plain data (for a grading journal); nodes without faults are left out."""
    return {node: [asdict(f) for f in found.faults] for node in nodes
            if (found := load(cluster_dir, node)).faults}


def put_back(cluster_dir: Path, snap: dict[str, list[dict]], nodes: Iterable[str]) -> list[tuple[str, str, Fault]]:
    """Make the faults on ``nodes`` what ``snap`` (from :func:`snapshot`) recorded.

    Returns ``(node, "cleared" | "set", fault)`` for each fault taken away or set
    again; a fault that is there and wanted keeps its ``since``.
    """
    changed: list[tuple[str, str, Fault]] = []
    for node in sorted(set(nodes) | set(snap)):
        current = load(cluster_dir, node).faults
        wanted = [Fault(str(f["kind"]), f.get("gpu"), float(f.get("since", 0))) for f in snap.get(node, ())
                  if f.get("kind") in KINDS]
        have = {(f.kind, f.gpu): f for f in current}
        want = {(f.kind, f.gpu): f for f in wanted}
        if set(have) == set(want):
            continue
        changed += [(node, "cleared", f) for key, f in have.items() if key not in want]
        changed += [(node, "set", f) for key, f in want.items() if key not in have]
        save(cluster_dir, node, [have.get(key, f) for key, f in want.items()])
    return changed
