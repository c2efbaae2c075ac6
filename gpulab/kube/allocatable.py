"""Node Allocatable: what a kubelet reports as ``status.allocatable``, from its capacity and its configuration.

A kubelet does not offer pods its whole machine. It reports

    allocatable = capacity − kubeReserved − systemReserved − hard eviction thresholds

per resource (``pkg/kubelet/cm``: ``GetNodeAllocatableReservation``, ``hardEvictionReservation``;
``pkg/kubelet/nodestatus``: ``MachineInfo``), and it refuses to start when a reservation exceeds
the capacity. The reservations use the kubelet configuration's own keys and syntax:

- ``kubeReserved`` / ``systemReserved``: ``cpu``, ``memory``, ``ephemeral-storage``, ``pid``
  (quantities; ``pid`` has no entry in a Node's capacity, so it changes nothing shown there);
- ``evictionHard``: signal → threshold, ``"100Mi"`` or ``"10%"`` of the resource's capacity.
  Only ``memory.available`` (memory) and ``nodefs.available`` (``ephemeral-storage``) are taken
  from allocatable; the other signals only trigger evictions. The defaults are the kubelet's
  (:data:`DEFAULT_EVICTION_HARD`); a configuration that names any signal replaces them all
  (an unnamed signal is 0) unless ``mergeDefaultEvictionSettings`` is true, as in the kubelet.

The arithmetic is the kubelet's: exact quantities, a percentage threshold parsed as a float32 and
truncated to whole bytes (``GetThresholdQuantity``), negative results clamped to 0, and quantities
written in the canonical form the apiserver returns (``31850m``, ``249879Mi``).
"""

from __future__ import annotations

import struct
from decimal import ROUND_CEILING, Decimal
from typing import Mapping

#: What ``kubeReserved`` and ``systemReserved`` may name (the kubelet's ``parseResourceList``).
RESERVABLE = ("cpu", "memory", "ephemeral-storage", "pid")

#: The kubelet's eviction signals and the resource of the Node's allocatable each one reserves
#: (``None``: it only triggers evictions).
SIGNALS: dict[str, str | None] = {
    "memory.available": "memory",
    "nodefs.available": "ephemeral-storage",
    "nodefs.inodesFree": None,
    "imagefs.available": None,
    "imagefs.inodesFree": None,
    "containerfs.available": None,
    "containerfs.inodesFree": None,
    "pid.available": None,
}

#: The kubelet's default ``evictionHard`` on Linux.
DEFAULT_EVICTION_HARD: dict[str, str] = {
    "memory.available": "100Mi",
    "nodefs.available": "10%",
    "nodefs.inodesFree": "5%",
    "imagefs.available": "15%",
    "imagefs.inodesFree": "5%",
}

_BINARY = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL = ("", "k", "M", "G", "T", "P", "E")


def parse(quantity: str | int) -> Decimal:
    """A Kubernetes quantity as an exact number (``"150m"`` → 0.150, ``"1Gi"`` → 1073741824)."""
    from kubernetes.utils import parse_quantity  # here: reading a topology must not load the kubernetes client

    return Decimal(parse_quantity(str(quantity)))


def is_binary(quantity: str) -> bool:
    """Whether a quantity is written with a binary suffix (``Ki`` … ``Ei``): the format its arithmetic keeps."""
    return str(quantity).strip().endswith("i")


def render(value: Decimal, binary: bool = False) -> str:
    """``value`` as the apiserver writes a quantity of that format (``resource.Quantity.String``).

    Binary: the largest power of 1024 that divides it (``249879Mi``), plain digits when none does; a
    value below 1024 or with a fraction is written as a decimal one. Decimal: an integer mantissa and
    the largest SI suffix that keeps it whole (``32k``, ``1500``), a fraction in milli-, micro- or
    nano-units (``31850m``), rounded up to the nano-unit.
    """
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    value = abs(value)
    if binary and value >= 1024 and value == value.to_integral_value():
        n, i = int(value), 0
        while n % 1024 == 0 and i < len(_BINARY) - 1:
            n, i = n // 1024, i + 1
        return f"{sign}{n}{_BINARY[i]}"
    if value == value.to_integral_value():
        n, i = int(value), 0
        while n % 1000 == 0 and i < len(_DECIMAL) - 1:
            n, i = n // 1000, i + 1
        return f"{sign}{n}{_DECIMAL[i]}"
    for suffix, scale in (("m", 3), ("u", 6), ("n", 9)):
        scaled = value.scaleb(scale)
        if scaled == scaled.to_integral_value() or suffix == "n":
            return f"{sign}{int(scaled.to_integral_value(rounding=ROUND_CEILING))}{suffix}"
    raise AssertionError("unreachable")


def _float32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def threshold_reservation(value: str, capacity: str) -> Decimal:
    """What one hard eviction threshold takes from a resource of ``capacity`` (``GetThresholdQuantity``).

    ``"100Mi"`` takes 100Mi; ``"10%"`` takes 10 % of the capacity in whole bytes, the percentage being a
    float32 as the kubelet parses it (so ``10%`` of 500Gi is 53687092000, not 53687091200); ``"0%"`` and
    ``"100%"`` are ignored, as the kubelet ignores them.
    """
    value = str(value).strip()
    if value.endswith("%"):
        if value in ("0%", "100%"):
            return Decimal(0)
        percent = _float32(_float32(float(value[:-1])) / 100)
        return Decimal(int(float(int(parse(capacity))) * percent))
    return parse(value)


def effective_eviction_hard(configured: Mapping[str, str] | None, merge_defaults: bool = False) -> dict[str, str]:
    """The kubelet's hard eviction thresholds for a configuration: its defaults when ``evictionHard`` names
    none; else what it names, over the defaults when ``mergeDefaultEvictionSettings`` is true."""
    if not configured:
        return dict(DEFAULT_EVICTION_HARD)
    return {**DEFAULT_EVICTION_HARD, **configured} if merge_defaults else dict(configured)


def reservation(capacity: Mapping[str, str], kube_reserved: Mapping[str, str],
                system_reserved: Mapping[str, str], eviction_hard: Mapping[str, str]) -> dict[str, Decimal]:
    """Per resource of ``capacity``, what the kubelet keeps from pods (``GetNodeAllocatableReservation``);
    resources with nothing reserved are left out. ``eviction_hard`` is the effective one."""
    evict: dict[str, Decimal] = {}
    for signal, value in eviction_hard.items():
        resource = SIGNALS.get(signal)
        if resource is not None and resource in capacity:
            evict[resource] = threshold_reservation(value, capacity[resource])
    out: dict[str, Decimal] = {}
    for resource in capacity:
        total = sum((parse(m[resource]) for m in (system_reserved, kube_reserved) if resource in m), Decimal(0))
        total += evict.get(resource, Decimal(0))
        if total:
            out[resource] = total
    return out


def allocatable(capacity: Mapping[str, str], reserved: Mapping[str, Decimal]) -> dict[str, str]:
    """``capacity`` less ``reserved``, each in its capacity's format, never below 0 (``MachineInfo``)."""
    out = {}
    for resource, cap in capacity.items():
        if resource not in reserved:
            out[resource] = cap
            continue
        value = max(Decimal(0), parse(cap) - reserved[resource])
        out[resource] = render(value, is_binary(cap))
    return out
