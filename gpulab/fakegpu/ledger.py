"""GPU memory and load of simulated GPUs: who uses what, and who runs out.

Real CUDA programs simply allocate; the commands that run in gpulab's
sandboxes cannot, so a pod *declares* what its CUDA program uses, with
annotations read per container:

``gpulab.io/gpu-memory: 20Gi``
    GPU memory the program allocates on each GPU (or MIG device) it is
    given. Any Kubernetes quantity (``20Gi``, ``16384Mi``).
``gpulab.io/gpu-utilization: "80"``
    Percent of its device's compute the program keeps busy (0-100).

``gpulab.io/gpu-memory.<container>`` and ``gpulab.io/gpu-utilization.<container>``
set the value for one container. A container that declares neither is not
a CUDA program: it holds its devices (``nvidia-smi`` works) but uses no
memory and gets no CUDA context.

:class:`Ledger` keeps the running CUDA programs of one node and decides
what the hardware would do when one starts. A program does not take its
memory in one piece: like a PyTorch model loading its weights layer by layer
and allocating its activations, it grows by :data:`STEP_MIB` at a time on
each of its devices. On each device it may have

- what the device isolates for it: a MIG instance, its MPS share (the device
  plugin's pinned-memory limit) or the whole GPU;
- and no more than what the other programs on the same memory (the physical
  card; the MIG instance under MIG) have left.

A program that needs more grows until the next step does not fit on one of
its devices, and fails there: ``Tried to allocate`` that step, with the
free memory of the device at that moment (less than a step). When its own
limit stopped it (an MPS share), its neighbours never notice. When the
card itself is full, so is it for every program on it: time-sliced
programs share the card's memory with nothing in between, and each of
them fails on its next step too, reporting the same free memory (the
chapter: 谁先用完谁先 OOM，另外三个一起挂). A program on a MIG instance
fills only that instance.

Pure logic; nothing here talks to a cluster.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MEMORY_ANNOTATION",
    "STEP_MIB",
    "UTILIZATION_ANNOTATION",
    "DemandError",
    "Demand",
    "DeviceUse",
    "Kill",
    "Ledger",
    "declares_utilization",
    "demand_of",
    "format_size",
]

MEMORY_ANNOTATION = "gpulab.io/gpu-memory"
UTILIZATION_ANNOTATION = "gpulab.io/gpu-utilization"

Owner = tuple[str, str]  # (pod UID, container name)

#: How a running CUDA program's memory grows: one allocation of this size at a
#: time (a layer's weights, a batch's activations, a slab of KV cache).
#: PyTorch's caching allocator goes to the driver whenever the tensors need
#: more than it has cached; 1 GiB stands for such an allocation, the same for
#: every program, so when one program fills a card, what is left is less than
#: a step and nobody's next allocation fits.
STEP_MIB = 1024

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_FACTORS = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
            "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


class DemandError(ValueError):
    """A pod's GPU annotations are malformed; the message names the annotation."""


@dataclass(frozen=True)
class Demand:
    """What one container's CUDA program uses on each of its devices."""

    memory_mib: int = 0
    utilization: int = 0


@dataclass(frozen=True)
class DeviceUse:
    """One device a program runs on, and what the hardware lets it use there.

    ``pool`` is the memory the program competes for: the physical GPU for
    exclusive, time-sliced and MPS devices, the MIG device for MIG.
    ``limit_mib`` is what the program itself may allocate (the pool, or the
    MPS share). ``index`` is the device's number inside the container
    (``GPU 0`` in error messages); ``compute_fraction`` the share of the
    physical GPU's SMs the device has (a 1g MIG slice: 1/7).
    """

    pool: str
    pool_mib: int
    limit_mib: int
    gpu_uuid: str
    index: int = 0
    compute_fraction: float = 1.0


@dataclass(frozen=True)
class Kill:
    """The end of a container whose CUDA program failed: its last words and exit code."""

    exit_code: int
    lines: tuple[str, ...]


@dataclass
class _Client:
    uses: tuple[DeviceUse, ...]
    demand: Demand
    process: str


def format_size(mib: float) -> str:
    """Sizes as PyTorch prints them in its out-of-memory message."""
    if mib <= 0:
        return "0 bytes"
    if mib < 1024:
        return f"{mib:.2f} MiB"
    return f"{mib / 1024:.2f} GiB"


def _parse_memory(raw: str, key: str) -> int:
    m = _QUANTITY.match(str(raw).strip())
    if not m:
        raise DemandError(f"annotation {key}: {raw!r} is not a memory quantity (e.g. 20Gi, 16384Mi)")
    return int(float(m.group(1)) * _FACTORS[m.group(2)] / (1 << 20))


def _parse_utilization(raw: str, key: str) -> int:
    try:
        value = float(str(raw).strip().rstrip("%"))
    except ValueError:
        raise DemandError(f"annotation {key}: {raw!r} is not a percentage (0-100)") from None
    if not 0 <= value <= 100:
        raise DemandError(f"annotation {key}: {raw!r} is outside 0-100")
    return int(round(value))


def demand_of(pod: Mapping[str, Any], container: str) -> Demand | None:
    """The declared GPU use of ``container`` in ``pod``; None when it declares none."""
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    mem_key = next((k for k in (f"{MEMORY_ANNOTATION}.{container}", MEMORY_ANNOTATION) if k in ann), None)
    util_key = next((k for k in (f"{UTILIZATION_ANNOTATION}.{container}", UTILIZATION_ANNOTATION) if k in ann),
                    None)
    if mem_key is None and util_key is None:
        return None
    memory = _parse_memory(ann[mem_key], mem_key) if mem_key else 0
    utilization = _parse_utilization(ann[util_key], util_key) if util_key else 0
    return Demand(memory, utilization)


def declares_utilization(pod: Mapping[str, Any], container: str) -> bool:
    """Whether the pod fixes ``container``'s utilisation itself (then traffic does not change it)."""
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    return f"{UTILIZATION_ANNOTATION}.{container}" in ann or UTILIZATION_ANNOTATION in ann


class Ledger:
    """The CUDA programs running on one node's GPUs."""

    def __init__(self) -> None:
        self._clients: dict[Owner, _Client] = {}

    def __contains__(self, owner: Owner) -> bool:
        return owner in self._clients

    def owners(self) -> list[Owner]:
        return list(self._clients)

    def start(self, owner: Owner, uses: list[DeviceUse] | tuple[DeviceUse, ...], demand: Demand,
              process: str = "python3") -> dict[Owner, Kill]:
        """A program starts on ``uses``; returns every program that dies of it (possibly itself).

        The dead are forgotten at once: their memory is free again.
        """
        self.stop(owner)
        uses = tuple(uses)
        # What each device lets the program have: its own limit, and no more than the others left.
        room = [max(0, min(u.limit_mib, u.pool_mib - self.pool_used(u.pool))) for u in uses]
        if all(demand.memory_mib <= r for r in room):
            self._clients[owner] = _Client(uses, demand, process)
            return {}
        # It grows STEP_MIB at a time on all its devices, until the next step does not fit on one.
        i = min(range(len(uses)), key=room.__getitem__)
        held = room[i] // STEP_MIB * STEP_MIB
        kills = {owner: self._oom(min(STEP_MIB, demand.memory_mib - held), uses[i], room[i] - held)}
        # At that moment each card (or MIG instance) it is on has this much left; a neighbour whose
        # next step does not fit there fails too, seeing the same free memory.
        left = {u.pool: u.pool_mib - self.pool_used(u.pool) - held for u in uses}
        for other, client in list(self._clients.items()):
            hit = next((u for u in client.uses if u.pool in left and left[u.pool] < STEP_MIB), None)
            if hit is None:
                continue
            own = hit.limit_mib - client.demand.memory_mib  # what its own limit leaves it (its MPS share)
            kills[other] = self._oom(STEP_MIB, hit, min(left[hit.pool], own))
            del self._clients[other]
        return kills

    def set_utilization(self, owner: Owner, utilization: int) -> bool:
        """The program's load changed (traffic, see :mod:`gpulab.fakegpu.load`); True if it did."""
        client = self._clients.get(owner)
        utilization = max(0, min(100, int(utilization)))
        if client is None or client.demand.utilization == utilization:
            return False
        client.demand = Demand(client.demand.memory_mib, utilization)
        return True

    def stop(self, owner: Owner) -> bool:
        """The program ended; its memory is free again. True if it was running."""
        return self._clients.pop(owner, None) is not None

    @staticmethod
    def _oom(tried_mib: int, use: DeviceUse, free_mib: int) -> Kill:
        return Kill(1, (
            f"CUDA out of memory. Tried to allocate {format_size(tried_mib)}. GPU {use.index} has a total "
            f"capacity of {format_size(use.limit_mib)} of which {format_size(free_mib)} is free.",
        ))

    # -- what nvidia-smi and DCGM read ----------------------------------------

    def pool_used(self, pool: str) -> int:
        return sum(c.demand.memory_mib for c in self._clients.values() for u in c.uses if u.pool == pool)

    def gpu_memory_used(self, gpu_uuid: str) -> int:
        return sum(c.demand.memory_mib for c in self._clients.values() for u in c.uses if u.gpu_uuid == gpu_uuid)

    def gpu_utilization(self, gpu_uuid: str) -> int:
        """Percent of the physical GPU's compute in use (time-sliced programs add up to 100)."""
        return min(100, self.gpu_demand(gpu_uuid))

    def gpu_demand(self, gpu_uuid: str, without: Owner | None = None) -> int:
        """What the programs on a physical GPU want of it, in percent: :meth:`gpu_utilization` before its
        cap at 100 (two time-sliced programs that each want the whole GPU demand 200); ``without``
        leaves one program out (what its neighbours want)."""
        return int(round(sum(c.demand.utilization * u.compute_fraction
                             for owner, c in self._clients.items() if owner != without
                             for u in c.uses if u.gpu_uuid == gpu_uuid)))

    def pool_utilization(self, pool: str) -> int:
        """Percent of one device's compute in use (a MIG device, or a whole GPU)."""
        return min(100, sum(c.demand.utilization for c in self._clients.values() for u in c.uses if u.pool == pool))

    def processes(self, gpu_uuid: str) -> list[tuple[Owner, DeviceUse, Demand, str]]:
        """``(owner, use, demand, process name)`` of every program on a physical GPU."""
        return [(owner, u, c.demand, c.process)
                for owner, c in self._clients.items() for u in c.uses if u.gpu_uuid == gpu_uuid]
