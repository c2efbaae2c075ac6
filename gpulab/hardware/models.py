"""GPU models as data: what a simulated NVIDIA GPU is and how MIG can cut it.

The numbers live in ``models.yaml`` next to this file; this module loads them
into frozen dataclasses, checks them, and answers the questions the rest of
``gpulab.fakegpu`` asks:

- which model a topology means (``get_model("h100-80gb")``, or the GFD
  product label ``get_model("NVIDIA-H100-80GB-HBM3")``);
- which MIG layouts exist for it, named as NVIDIA's mig-parted configs are
  (``all-disabled``, ``all-enabled``, ``all-<profile>``, ``all-balanced``),
  and where each GPU instance lands (``model.mig_layout("all-1g.10gb")``);
- how many memory and compute slices MIG cuts it into (8 and 7 on an
  A100/H100/H200, 4 and 4 on an A30), and so what share of the GPU one
  instance is (``model.mig_share("1g.10gb")``, 1/7 on an H100);
- the identity of simulated devices: GPU and MIG UUIDs and PCI bus ids,
  deterministic so that the device plugin, GFD and ``nvidia-smi`` agree.

Nothing here talks to a cluster.
"""

from __future__ import annotations

import functools
import hashlib
import re
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "LAYOUT_ALL_DISABLED",
    "LAYOUT_ALL_ENABLED",
    "LAYOUT_ALL_BALANCED",
    "GpuModelError",
    "ModelDataError",
    "UnknownGpuModel",
    "UnknownMigLayout",
    "MigNotSupported",
    "MigPlacementError",
    "PowerSpec",
    "TemperatureSpec",
    "ClockSet",
    "PciSpec",
    "MigProfile",
    "MigSlice",
    "MigLayout",
    "GpuModel",
    "get_model",
    "list_models",
    "model_keys",
    "load_models",
    "sanitize_label_value",
    "family_for_compute_capability",
    "normalize_profile_name",
    "gpu_uuid",
    "mig_uuid",
    "pci_bus_id",
]

MODELS_FILE = Path(__file__).with_name("models.yaml")
SCHEMA = "gpulab.fakegpu/models/v1"

LAYOUT_ALL_DISABLED = "all-disabled"
LAYOUT_ALL_ENABLED = "all-enabled"
LAYOUT_ALL_BALANCED = "all-balanced"


# --------------------------------------------------------------------------
# Errors


class GpuModelError(ValueError):
    """Base class of every error raised by this module."""


class ModelDataError(GpuModelError):
    """models.yaml is malformed; the message names the file and field."""


class UnknownGpuModel(GpuModelError, LookupError):
    """No model has that key or alias."""

    def __init__(self, name: str, allowed: Sequence[str]):
        self.name = name
        self.allowed = tuple(allowed)
        super().__init__(
            f"unknown GPU model {name!r}; allowed: {', '.join(self.allowed)} "
            "(or a model's GFD product name / nvidia-smi name)"
        )


class UnknownMigLayout(GpuModelError, LookupError):
    """The MIG layout name does not exist for that model."""

    def __init__(self, model: str, name: str, allowed: Sequence[str]):
        self.model = model
        self.name = name
        self.allowed = tuple(allowed)
        super().__init__(
            f"unknown MIG layout {name!r} for {model}; allowed: {', '.join(self.allowed)}"
        )


class MigNotSupported(GpuModelError):
    """The model cannot be partitioned with MIG."""

    def __init__(self, model: str, name: str):
        self.model = model
        self.name = name
        super().__init__(
            f"{model} is not MIG-capable: cannot apply MIG layout {name!r} "
            f"(the only valid layout is {LAYOUT_ALL_DISABLED!r})"
        )


class MigPlacementError(GpuModelError):
    """The requested GPU instances do not fit on one GPU."""


# --------------------------------------------------------------------------
# Data


@dataclass(frozen=True)
class PowerSpec:
    """Board power in watts: enforced limit, settable range and idle draw."""

    limit_w: float
    min_w: float
    max_w: float
    idle_w: float


@dataclass(frozen=True)
class TemperatureSpec:
    """Idle readings and thermal thresholds in °C (None: reported as N/A)."""

    idle_c: int
    memory_idle_c: int | None
    shutdown_c: int
    slowdown_c: int
    max_operating_c: int


@dataclass(frozen=True)
class ClockSet:
    """Clock frequencies in MHz."""

    graphics: int
    sm: int
    memory: int
    video: int


@dataclass(frozen=True)
class PciSpec:
    """PCI identity as ``nvidia-smi -q`` prints it, plus the link."""

    device_id: str
    subsystem_id: str
    gen: int
    width: int


@dataclass(frozen=True)
class MigProfile:
    """One GPU instance profile (a row of ``nvidia-smi mig -lgip``)."""

    name: str
    gi_profile_id: int
    compute_slices: int
    memory_slices: int
    max_instances: int
    memory_mib: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg: int
    ofa: int
    bar1_mib: int
    placements: tuple[int, ...]

    @property
    def config_name(self) -> str:
        """The profile as mig-parted config names write it (``+`` → ``.``)."""
        return normalize_profile_name(self.name)

    @property
    def resource_name(self) -> str:
        """The extended resource under the ``mixed`` MIG strategy."""
        return f"nvidia.com/mig-{self.config_name}"

    @property
    def is_base(self) -> bool:
        """True for plain profiles, False for ``+me``-style variants."""
        return "+" not in self.name


@dataclass(frozen=True)
class MigSlice:
    """One GPU instance placed on a GPU (with its single compute instance).

    ``start`` is the first memory slice it occupies; ``gi_id`` is the GPU
    instance id the driver gives that placement, ``ci_id`` the compute
    instance inside it (always 0: mig-parted creates one full-size CI).
    """

    profile: MigProfile
    start: int
    gi_id: int
    ci_id: int = 0

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def memory_mib(self) -> int:
        return self.profile.memory_mib

    @property
    def end(self) -> int:
        return self.start + self.profile.memory_slices


@dataclass(frozen=True)
class MigLayout:
    """A named MIG configuration, applied identically to every GPU of a node.

    ``mig_enabled`` is the MIG mode; ``slices`` the GPU instances of one GPU,
    ordered as the driver enumerates them (by GPU instance id).
    ``all-enabled`` is MIG mode on with no instances at all.
    """

    name: str
    mig_enabled: bool
    slices: tuple[MigSlice, ...] = ()

    @property
    def profile_counts(self) -> dict[str, int]:
        """Instances per profile name on one GPU."""
        return dict(Counter(s.profile.name for s in self.slices))

    def same_geometry(self, other: MigLayout | None) -> bool:
        """True when applying ``other`` would leave the GPU as it is."""
        if other is None:
            return not self.mig_enabled
        if self.mig_enabled != other.mig_enabled:
            return False
        return Counter(s.profile.name for s in self.slices) == Counter(
            s.profile.name for s in other.slices
        )


@dataclass(frozen=True)
class GpuModel:
    """A GPU model as data. Build it with :func:`get_model`."""

    key: str
    product_name: str
    gfd_product: str
    aliases: tuple[str, ...]
    brand: str
    architecture: str
    family: str
    compute_major: int
    compute_minor: int
    form_factor: str
    memory_mib: int
    memory_reserved_mib: int
    bar1_mib: int
    power: PowerSpec
    temperature: TemperatureSpec
    pci: PciSpec
    idle_clocks: ClockSet
    max_clocks: ClockSet
    vbios_version: str
    nvswitch: bool
    machine: str
    mig_profiles: tuple[MigProfile, ...] = ()
    mig_balanced: tuple[tuple[str, int], ...] = ()
    #: Memory slices GPU instances are placed on (8 on A100/H100/H200, 4 on
    #: A30) and compute slices they share (7, or 4); 0 when not MIG-capable.
    mig_memory_slices: int = 0
    mig_compute_slices: int = 0
    _layouts: dict[str, MigLayout] = field(default_factory=dict, repr=False, compare=False)

    # -- identity ----------------------------------------------------------

    @property
    def compute_capability(self) -> str:
        return f"{self.compute_major}.{self.compute_minor}"

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)

    @property
    def names(self) -> tuple[str, ...]:
        """Every name :func:`get_model` resolves to this model."""
        return (self.key, self.gfd_product, self.product_name, *self.aliases)

    # -- MIG -----------------------------------------------------------------

    def mig_profile(self, name: str) -> MigProfile:
        """Look a profile up by its name (``1g.10gb+me`` or ``1g.10gb.me``)."""
        wanted = normalize_profile_name(name)
        for p in self.mig_profiles:
            if p.config_name == wanted:
                return p
        allowed = ", ".join(p.name for p in self.mig_profiles) or "none (not MIG-capable)"
        raise GpuModelError(f"{self.product_name} has no MIG profile {name!r}; allowed: {allowed}")

    def mig_share(self, profile: str | MigProfile) -> float:
        """The share of this GPU one instance of ``profile`` is: its compute
        slices over the GPU's (``1g.10gb`` on an H100: 1/7; ``1g.6gb`` on an
        A30: 1/4). What usage reports count a MIG device as."""
        if not self.mig_capable:
            raise MigNotSupported(self.product_name, f"profile {profile}")
        p = profile if isinstance(profile, MigProfile) else self.mig_profile(profile)
        return p.compute_slices / self.mig_compute_slices

    def mig_layout_names(self) -> list[str]:
        """Names of the layouts the GPU Operator's default config offers here."""
        if not self.mig_capable:
            return [LAYOUT_ALL_DISABLED]
        names = [LAYOUT_ALL_DISABLED, LAYOUT_ALL_ENABLED]
        names += [f"all-{p.config_name}" for p in self.mig_profiles]
        names.append(LAYOUT_ALL_BALANCED)
        return names

    def layout(self, name: str) -> MigLayout:
        """Resolve a layout name to a :class:`MigLayout` for one GPU.

        Raises :class:`MigNotSupported` for any MIG layout on a GPU that
        cannot do MIG, :class:`UnknownMigLayout` for a name that does not
        exist for this model.
        """
        key = _normalize_layout_name(name)
        cached = self._layouts.get(key)
        if cached is not None:
            return cached
        layout = self._build_layout(name, key)
        self._layouts[key] = layout
        return layout

    def mig_layout(self, name: str) -> list[MigSlice]:
        """The GPU instances one GPU gets under the layout ``name``."""
        return list(self.layout(name).slices)

    def place(self, counts: Mapping[str, int] | Iterable[tuple[str, int]]) -> tuple[MigSlice, ...]:
        """Place GPU instances on one GPU the way the hardware allows.

        ``counts`` maps profile names to instance counts. Raises
        :class:`MigPlacementError` when they do not fit (memory slices,
        compute slices, per-profile maximum or allowed start positions).
        """
        if not self.mig_capable:
            raise MigNotSupported(self.product_name, "custom geometry")
        items = counts.items() if isinstance(counts, Mapping) else counts
        wanted: list[MigProfile] = []
        for name, count in items:
            profile = self.mig_profile(name)
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise MigPlacementError(f"instance count for {name!r} must be a non-negative integer, got {count!r}")
            if count > profile.max_instances:
                raise MigPlacementError(
                    f"{self.product_name} supports at most {profile.max_instances} x {profile.name}, "
                    f"{count} requested"
                )
            wanted += [profile] * count
        compute = sum(p.compute_slices for p in wanted)
        if compute > self.mig_compute_slices:
            raise MigPlacementError(
                f"{' + '.join(p.name for p in wanted)} needs {compute} compute slices; "
                f"a {self.product_name} has {self.mig_compute_slices}"
            )
        # Largest first, then by name: deterministic, and big instances have
        # the fewest legal start positions so they constrain the search most.
        wanted.sort(key=lambda p: (-p.memory_slices, -p.compute_slices, p.name))
        placed = _place(wanted, [False] * self.mig_memory_slices)
        if placed is None:
            raise MigPlacementError(
                f"{' + '.join(p.name for p in wanted)} does not fit on one {self.product_name} "
                f"({self.mig_memory_slices} memory slices, allowed placements per profile as in "
                "'nvidia-smi mig -lgipp')"
            )
        slices = [MigSlice(p, start, gi_id_for(start, p.memory_slices, self.mig_memory_slices))
                  for p, start in placed]
        return tuple(sorted(slices, key=lambda s: s.gi_id))

    def _build_layout(self, name: str, key: str) -> MigLayout:
        if key == LAYOUT_ALL_DISABLED:
            return MigLayout(LAYOUT_ALL_DISABLED, mig_enabled=False)
        if not self.mig_capable:
            raise MigNotSupported(self.product_name, name)
        if key == LAYOUT_ALL_ENABLED:
            return MigLayout(LAYOUT_ALL_ENABLED, mig_enabled=True)
        if key == LAYOUT_ALL_BALANCED:
            return MigLayout(LAYOUT_ALL_BALANCED, True, self.place(self.mig_balanced))
        if key.startswith("all-"):
            wanted = key[len("all-"):]
            for p in self.mig_profiles:
                if p.config_name == wanted:
                    return MigLayout(f"all-{p.config_name}", True, self.place({p.name: p.max_instances}))
        raise UnknownMigLayout(self.product_name, name, self.mig_layout_names())


def _place(
    wanted: Sequence[MigProfile], used: list[bool]
) -> list[tuple[MigProfile, int]] | None:
    """Backtracking placement of ``wanted`` into free memory slices."""
    if not wanted:
        return []
    head, rest = wanted[0], wanted[1:]
    for start in head.placements:
        span = range(start, start + head.memory_slices)
        if any(used[i] for i in span):
            continue
        for i in span:
            used[i] = True
        tail = _place(rest, used)
        for i in span:
            used[i] = False
        if tail is not None:
            return [(head, start), *tail]
    return None


def gi_id_for(start: int, memory_slices: int, total_slices: int) -> int:
    """The GPU instance id the driver assigns to a placement.

    ``start:memory_slices`` is the placement (as ``nvidia-smi mig -lgi``
    prints it), ``total_slices`` the GPU's memory slices. GI ids number the
    placements as a binary tree over those slices: 0 for the whole GPU, then
    the halves, the quarters, the eighths. With 8 slices (A100/H100/H200): a
    3g at slice 0 is GI 1, a 2g at slice 4 is GI 5, a 1g at slice 6 is GI 13.
    With 4 (A30): 2g at 0 and 2 are GIs 1 and 2, 1g at 0..3 are GIs 3..6.
    """
    if (total_slices < 1 or total_slices & (total_slices - 1) or memory_slices < 1
            or memory_slices & (memory_slices - 1) or memory_slices > total_slices
            or start % memory_slices or not 0 <= start <= total_slices - memory_slices):
        raise GpuModelError(f"invalid MIG placement {start}:{memory_slices} on {total_slices} memory slices")
    return total_slices // memory_slices - 1 + start // memory_slices


# --------------------------------------------------------------------------
# Naming helpers

_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9\-_. ]")


def sanitize_label_value(text: str) -> str:
    """Turn an NVML name into a label value the way GFD does.

    Characters outside ``[A-Za-z0-9-_. ]`` are dropped and runs of blanks
    become one ``-``: ``NVIDIA H100 80GB HBM3`` → ``NVIDIA-H100-80GB-HBM3``.
    """
    return "-".join(_LABEL_UNSAFE.sub("", text).split())


def family_for_compute_capability(major: int, minor: int) -> str:
    """GFD's ``nvidia.com/gpu.family`` for a compute capability."""
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    return {
        1: "tesla",
        2: "fermi",
        3: "kepler",
        5: "maxwell",
        6: "pascal",
        9: "hopper",
        10: "blackwell",
        12: "blackwell",
        13: "rubin",
    }.get(major, "undefined")


def normalize_profile_name(name: str) -> str:
    """``1g.10gb+me`` → ``1g.10gb.me`` (mig-parted and resource-name form)."""
    return name.strip().replace("+", ".")


def _normalize_layout_name(name: str) -> str:
    return normalize_profile_name(name)


# --------------------------------------------------------------------------
# Identity of simulated devices

#: PCI buses of the eight SXM sockets on an HGX baseboard (DGX H100 layout).
#: GPU 8+ sit one bus further along (as on a second baseboard), so up to
#: 120 GPUs get distinct ids.
_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)

_UUID_NAMESPACE = uuid.UUID("6c1d3c1e-6a4f-5a0e-9c6b-67706c616221")


def gpu_uuid(node: str, index: int) -> str:
    """Deterministic GPU UUID for GPU ``index`` of ``node``.

    Real GPU UUIDs are 128 random-looking bits (no RFC 4122 version), so the
    value is a plain hash; same node and index, same UUID, every run.
    """
    if index < 0:
        raise ValueError(f"GPU index must be >= 0, got {index}")
    digest = hashlib.sha256(f"gpulab/gpu/{node}/{index}".encode()).digest()
    return f"GPU-{uuid.UUID(bytes=digest[:16])}"


def mig_uuid(parent_gpu_uuid: str, gi_id: int, ci_id: int = 0) -> str:
    """Deterministic MIG device UUID (``MIG-<uuid>``, the R470+ format).

    Real MIG UUIDs are RFC 4122 version 5, so this one is too, derived from
    the parent GPU and the GPU/compute instance ids: recreating the same
    geometry gives the same UUIDs.
    """
    return f"MIG-{uuid.uuid5(_UUID_NAMESPACE, f'{parent_gpu_uuid}/{gi_id}/{ci_id}')}"


def pci_bus_id(index: int) -> str:
    """PCI bus id (``00000000:18:00.0``) of GPU ``index`` on a simulated node."""
    if index < 0:
        raise ValueError(f"GPU index must be >= 0, got {index}")
    bus = _HGX_BUSES[index % len(_HGX_BUSES)] + index // len(_HGX_BUSES)
    if index >= 15 * len(_HGX_BUSES) or bus > 0xFF:
        raise ValueError(f"no PCI bus left for GPU index {index}")
    return f"00000000:{bus:02X}:00.0"


# --------------------------------------------------------------------------
# Loading


class _Fields:
    """Typed access to one YAML mapping, with errors that name the field."""

    def __init__(self, data: Any, where: str):
        if not isinstance(data, Mapping):
            raise ModelDataError(f"{where}: expected a mapping, got {type(data).__name__}")
        self.data = data
        self.where = where

    def _get(self, key: str, types: tuple[type, ...], optional: bool = False) -> Any:
        if key not in self.data:
            if optional:
                return None
            raise ModelDataError(f"{self.where}.{key}: missing")
        value = self.data[key]
        if value is None and optional:
            return None
        if isinstance(value, bool) and bool not in types:
            raise ModelDataError(f"{self.where}.{key}: expected {types[0].__name__}, got {value!r}")
        if not isinstance(value, types):
            raise ModelDataError(
                f"{self.where}.{key}: expected {' or '.join(t.__name__ for t in types)}, got {value!r}"
            )
        return value

    def str(self, key: str) -> str:
        value = self._get(key, (str,))
        if not value.strip():
            raise ModelDataError(f"{self.where}.{key}: must not be empty")
        return value

    def int(self, key: str, minimum: int = 0, optional: bool = False) -> int | None:
        value = self._get(key, (int,), optional)
        if value is not None and value < minimum:
            raise ModelDataError(f"{self.where}.{key}: must be >= {minimum}, got {value}")
        return value

    def num(self, key: str) -> float:
        value = self._get(key, (int, float))
        if value < 0:
            raise ModelDataError(f"{self.where}.{key}: must be >= 0, got {value}")
        return float(value)

    def bool(self, key: str) -> bool:
        return self._get(key, (bool,))

    def sub(self, key: str) -> _Fields:
        return _Fields(self._get(key, (Mapping,)), f"{self.where}.{key}")

    def list(self, key: str) -> list[Any]:
        return list(self._get(key, (list,)))


def _is_power_of_two(n: int) -> bool:
    return n >= 1 and not n & (n - 1)


def _parse_profile(f: _Fields, memory_slices: int, compute_slices: int) -> MigProfile:
    """One profile of a model whose GPU has ``memory_slices`` / ``compute_slices``."""
    mem_slices = f.int("mem_slices", 1)
    g = f.int("g", 1)
    if not _is_power_of_two(mem_slices) or mem_slices > memory_slices:
        allowed = ", ".join(str(1 << i) for i in range(memory_slices.bit_length()))
        raise ModelDataError(f"{f.where}.mem_slices: must be one of {allowed} (this GPU has {memory_slices} "
                             f"memory slices), got {mem_slices}")
    placements = f.list("placements")
    if not placements or not all(isinstance(p, int) and not isinstance(p, bool) for p in placements):
        raise ModelDataError(f"{f.where}.placements: expected a non-empty list of integers")
    for start in placements:
        if start < 0 or start + mem_slices > memory_slices:
            raise ModelDataError(f"{f.where}.placements: start {start} with {mem_slices} slices leaves the GPU "
                                 f"({memory_slices} memory slices)")
        if start % mem_slices:
            raise ModelDataError(f"{f.where}.placements: start {start} is not aligned to {mem_slices} slices")
    if g > compute_slices:
        raise ModelDataError(f"{f.where}.g: at most {compute_slices} compute slices on this GPU, got {g}")
    name = f.str("name")
    if not re.fullmatch(r"[1-9]\d*g\.\d+gb(\+[a-z]+)?", name):
        raise ModelDataError(f"{f.where}.name: {name!r} is not a MIG profile name like '1g.10gb' or '1g.10gb+me'")
    if not name.startswith(f"{g}g."):
        raise ModelDataError(f"{f.where}: name {name!r} disagrees with g={g}")
    return MigProfile(
        name=name,
        gi_profile_id=f.int("id"),
        compute_slices=g,
        memory_slices=mem_slices,
        max_instances=f.int("instances", 1),
        memory_mib=f.int("memory_mib", 1),
        multiprocessors=f.int("sm", 1),
        copy_engines=f.int("ce"),
        decoders=f.int("dec"),
        encoders=f.int("enc"),
        jpeg=f.int("jpeg"),
        ofa=f.int("ofa"),
        bar1_mib=f.int("bar1_mib"),
        placements=tuple(placements),
    )


def _clocks(f: _Fields) -> ClockSet:
    return ClockSet(f.int("graphics", 1), f.int("sm", 1), f.int("memory", 1), f.int("video", 1))


def _parse_model(key: str, f: _Fields) -> GpuModel:
    cc = f.str("compute_capability")
    m = re.fullmatch(r"(\d+)\.(\d+)", cc)
    if not m:
        raise ModelDataError(f"{f.where}.compute_capability: expected 'major.minor', got {cc!r}")
    major, minor = int(m[1]), int(m[2])

    product_name = f.str("product_name")
    gfd_product = f.str("gfd_product")
    if gfd_product != sanitize_label_value(product_name):
        raise ModelDataError(
            f"{f.where}.gfd_product: {gfd_product!r} is not what GFD derives from "
            f"{product_name!r} ({sanitize_label_value(product_name)!r})"
        )
    family = f.str("family")
    if family != family_for_compute_capability(major, minor):
        raise ModelDataError(
            f"{f.where}.family: {family!r} disagrees with compute capability {cc} "
            f"({family_for_compute_capability(major, minor)!r})"
        )
    aliases = f.list("aliases")
    if not all(isinstance(a, str) and a.strip() for a in aliases):
        raise ModelDataError(f"{f.where}.aliases: expected a list of non-empty strings")
    form_factor = f.str("form_factor")
    if form_factor not in ("sxm", "pcie"):
        raise ModelDataError(f"{f.where}.form_factor: must be 'sxm' or 'pcie', got {form_factor!r}")

    power = f.sub("power")
    temp = f.sub("temperature")
    pci = f.sub("pci")
    clocks = f.sub("clocks")
    for k in ("device_id", "subsystem_id"):
        if not re.fullmatch(r"0x[0-9A-F]{8}", pci.str(k)):
            raise ModelDataError(f"{pci.where}.{k}: expected 0x followed by 8 upper-case hex digits")

    profiles: tuple[MigProfile, ...] = ()
    balanced: tuple[tuple[str, int], ...] = ()
    memory_slices = compute_slices = 0
    mig_data = f.data.get("mig")
    if mig_data is not None:
        mig = _Fields(mig_data, f"{f.where}.mig")
        # The GPU's own slices come first: every placement, GI id and usage
        # weight of the profiles is relative to them.
        memory_slices = mig.int("memory_slices", 1)
        compute_slices = mig.int("compute_slices", 1)
        if not _is_power_of_two(memory_slices) or memory_slices < 2:
            raise ModelDataError(f"{mig.where}.memory_slices: must be a power of two >= 2 (GPU instance ids "
                                 f"number placements as a binary tree over them), got {memory_slices}")
        profiles = tuple(
            _parse_profile(_Fields(p, f"{mig.where}.profiles[{i}]"), memory_slices, compute_slices)
            for i, p in enumerate(mig.list("profiles"))
        )
        if not profiles:
            raise ModelDataError(f"{mig.where}.profiles: a MIG-capable model needs profiles (or set mig: null)")
        names = [p.config_name for p in profiles]
        if len(set(names)) != len(names):
            raise ModelDataError(f"{mig.where}.profiles: duplicate profile names")
        if not any(p.compute_slices == compute_slices and p.memory_slices == memory_slices for p in profiles):
            raise ModelDataError(
                f"{mig.where}: no profile spans the whole GPU (g: {compute_slices}, mem_slices: {memory_slices}); "
                "compute_slices and memory_slices must be those of the largest profile "
                "('nvidia-smi mig -lgip' lists it last, e.g. 7g.80gb on an H100, 4g.24gb on an A30)"
            )
        bal = mig.sub("balanced")
        balanced = tuple((str(k), bal.int(str(k), 1)) for k in bal.data)

    model = GpuModel(
        key=key,
        product_name=product_name,
        gfd_product=gfd_product,
        aliases=tuple(aliases),
        brand=f.str("brand"),
        architecture=f.str("architecture"),
        family=family,
        compute_major=major,
        compute_minor=minor,
        form_factor=form_factor,
        memory_mib=f.int("memory_mib", 1),
        memory_reserved_mib=f.int("memory_reserved_mib"),
        bar1_mib=f.int("bar1_mib", 1),
        power=PowerSpec(power.num("limit_w"), power.num("min_w"), power.num("max_w"), power.num("idle_w")),
        temperature=TemperatureSpec(
            temp.int("idle_c"),
            temp.int("memory_idle_c", optional=True),
            temp.int("shutdown_c"),
            temp.int("slowdown_c"),
            temp.int("max_operating_c"),
        ),
        pci=PciSpec(pci.str("device_id"), pci.str("subsystem_id"), pci.int("gen", 1), pci.int("width", 1)),
        idle_clocks=_clocks(clocks.sub("idle")),
        max_clocks=_clocks(clocks.sub("max")),
        vbios_version=f.str("vbios_version"),
        nvswitch=f.bool("nvswitch"),
        machine=f.str("machine"),
        mig_profiles=profiles,
        mig_balanced=balanced,
        mig_memory_slices=memory_slices,
        mig_compute_slices=compute_slices,
    )
    if model.power.min_w > model.power.limit_w or model.power.limit_w > model.power.max_w:
        raise ModelDataError(f"{power.where}: need min_w <= limit_w <= max_w")
    if profiles:
        try:
            # Every advertised layout must be placeable; fail at load, not
            # in the middle of a learner's relabel.
            for name in model.mig_layout_names():
                model.layout(name)
        except GpuModelError as exc:
            raise ModelDataError(f"{f.where}.mig: {exc}") from exc
    return model


def load_models(path: str | Path = MODELS_FILE) -> dict[str, GpuModel]:
    """Parse and check a models file; return models by key, in file order."""
    where = str(path)
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ModelDataError(f"{where}: cannot load: {exc}") from exc
    top = _Fields(raw, where)
    if top.data.get("schema") != SCHEMA:
        raise ModelDataError(f"{where}.schema: expected {SCHEMA!r}, got {top.data.get('schema')!r}")
    models_map = top.sub("models")
    models: dict[str, GpuModel] = {}
    seen: dict[str, str] = {}
    for key in models_map.data:
        if not isinstance(key, str) or not re.fullmatch(r"[a-z0-9][a-z0-9-]*", key):
            raise ModelDataError(f"{where}.models: key {key!r} must be lower-case letters, digits and '-'")
        model = _parse_model(key, models_map.sub(key))
        for name in model.names:
            folded = name.casefold()
            if folded in seen and seen[folded] != key:
                raise ModelDataError(f"{where}.models.{key}: name {name!r} already used by {seen[folded]!r}")
            seen[folded] = key
        models[key] = model
    if not models:
        raise ModelDataError(f"{where}.models: no models defined")
    return models


@functools.cache
def _registry() -> tuple[dict[str, GpuModel], dict[str, str]]:
    models = load_models()
    index = {name.casefold(): m.key for m in models.values() for name in m.names}
    return models, index


def get_model(name: str | GpuModel) -> GpuModel:
    """Resolve a model key, alias, GFD product name or nvidia-smi name.

    Matching ignores case. Raises :class:`UnknownGpuModel` listing the keys.
    """
    if isinstance(name, GpuModel):
        return name
    models, index = _registry()
    key = index.get(str(name).strip().casefold())
    if key is None:
        raise UnknownGpuModel(str(name), list(models))
    return models[key]


def list_models() -> list[GpuModel]:
    """All models, in the order of models.yaml."""
    return list(_registry()[0].values())


def model_keys() -> list[str]:
    """The short keys topologies use (``h100-80gb``, ``l4`` …)."""
    return list(_registry()[0])
