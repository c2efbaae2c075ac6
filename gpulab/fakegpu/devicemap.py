"""The device plugin's device map, as a pure function.

:func:`advertised_resources`: given a GPU model, a GPU count, a node name,
a parsed device-plugin config (:mod:`gpulab.fakegpu.pluginconfig`) and the
node's MIG layout, which extended resources does the node advertise, with
which device IDs (GPU UUIDs, ``<uuid>::<n>`` time-slice replicas,
``MIG-…`` UUIDs), and what each device really is (physical GPU, MIG slice,
memory it can use). Where the real plugin would fail to build its device
map it raises :class:`DevicePluginError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpulab.hardware.models import GpuModel, GpuModelError, MigLayout, MigSlice, get_model, gpu_uuid, mig_uuid

from .pluginconfig import (
    DEFAULT_CONFIG,
    GPU_RESOURCE,
    SHARING_MPS,
    SHARING_NONE,
    SHARING_TIME_SLICING,
    DevicePluginConfig,
)

__all__ = [
    "DevicePluginError",
    "AdvertisedDevice",
    "AdvertisedResource",
    "NodeResources",
    "advertised_resources",
    "resolve_mig_layout",
    "visible_devices_env",
    "strip_replica",
]


class DevicePluginError(ValueError):
    """The device plugin would fail to start on this node (bad MIG state)."""


@dataclass(frozen=True)
class AdvertisedDevice:
    """One device ID the plugin reports through ListAndWatch.

    ``device_uuid`` is the underlying GPU or MIG UUID (what the container's
    ``NVIDIA_VISIBLE_DEVICES`` gets); ``id`` adds ``::<replica>`` for shared
    devices. ``memory_mib`` is what a container holding this device can use:
    the whole GPU for exclusive and time-sliced devices (time-slicing does
    not isolate memory), the slice for MIG, an equal share for MPS.
    """

    id: str
    resource: str
    device_uuid: str
    gpu_index: int
    gpu_uuid: str
    memory_mib: int
    mig: MigSlice | None = None
    mig_index: int | None = None
    replica: int | None = None
    replicas: int = 1
    sharing: str = SHARING_NONE
    health: str = "Healthy"

    @property
    def isolation(self) -> str:
        """``exclusive``, ``mig``, ``mps`` or ``time-sliced``."""
        if self.sharing == SHARING_TIME_SLICING:
            return "time-sliced"
        if self.sharing == SHARING_MPS:
            return "mps"
        return "mig" if self.mig is not None else "exclusive"

    @property
    def memory_isolated(self) -> bool:
        """False only for time-slicing: every replica sees all the memory."""
        return self.sharing != SHARING_TIME_SLICING

    @property
    def compute_share(self) -> float:
        """Fraction of its GPU (or MIG slice) guaranteed to this device."""
        return 1.0 / self.replicas if self.sharing == SHARING_MPS else 1.0


@dataclass(frozen=True)
class AdvertisedResource:
    """One extended resource and its devices."""

    name: str
    devices: tuple[AdvertisedDevice, ...]
    sharing: str = SHARING_NONE
    replicas: int = 1
    fail_requests_greater_than_one: bool = False

    @property
    def ids(self) -> list[str]:
        return [d.id for d in self.devices]

    @property
    def count(self) -> int:
        return len(self.devices)

    def request_error(self, requested: int) -> str | None:
        """The Allocate error for a container asking for ``requested`` devices."""
        if self.sharing != SHARING_NONE and self.fail_requests_greater_than_one and requested > 1:
            return f"invalid request: maximum request size for shared resources is 1; found {requested}"
        return None


@dataclass(frozen=True)
class NodeResources:
    """Everything a node's device plugin advertises, ordered by resource name."""

    resources: tuple[AdvertisedResource, ...]
    mig_strategy: str
    sharing: str
    warnings: tuple[str, ...] = ()
    allocation_policy: str = "distributed"

    def __iter__(self) -> Iterator[AdvertisedResource]:
        return iter(self.resources)

    def __len__(self) -> int:
        return len(self.resources)

    def pairs(self) -> list[tuple[str, list[str]]]:
        """``[(resource name, [device IDs])]``."""
        return [(r.name, r.ids) for r in self.resources]

    def capacity(self) -> dict[str, int]:
        """Resource name → device count (what node capacity will show)."""
        return {r.name: r.count for r in self.resources}

    def get(self, name: str) -> AdvertisedResource | None:
        for r in self.resources:
            if r.name == name:
                return r
        return None

    def device(self, device_id: str) -> AdvertisedDevice:
        """Look a device ID up; raises KeyError naming the resource set."""
        for r in self.resources:
            for d in r.devices:
                if d.id == device_id:
                    return d
        raise KeyError(f"device ID {device_id!r} is not advertised on this node")

    def to_inventory(self, smi_state: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The device plugin's inventory document for these resources.

        Format of ``gpulab.fakegpu.deviceplugin`` (``{"resources": [{"name",
        "failRequestsGreaterThanOne", "allocationPolicy", "devices": [{"id",
        "uuid", "parent", "minor", "health", "info"}]}]}``). With
        ``smi_state`` (from ``smistate.build_state`` for the same node), each
        device's ``info`` is its physical GPU's entry of that state plus the
        driver/CUDA versions and fault, so the per-allocation file the plugin
        writes from ``info`` is something the fake nvidia-smi can render.
        """
        gpus: dict[str, dict[str, Any]] = {}
        if smi_state is not None:
            extra = {k: smi_state.get(k) for k in ("driver_version", "cuda_version", "fault", "timestamp")}
            for g in smi_state.get("gpus", []):
                gpus[g["uuid"]] = {**g, **{k: v for k, v in extra.items() if v is not None}}
        resources = []
        for r in self.resources:
            devices = []
            for d in r.devices:
                entry: dict[str, Any] = {
                    "id": d.id,
                    "uuid": d.device_uuid,
                    "parent": d.gpu_uuid,
                    "minor": d.gpu_index,
                    "health": d.health,
                }
                if d.gpu_uuid in gpus:
                    entry["info"] = gpus[d.gpu_uuid]
                devices.append(entry)
            resources.append({
                "name": r.name,
                "failRequestsGreaterThanOne": r.fail_requests_greater_than_one,
                "allocationPolicy": self.allocation_policy,
                "devices": devices,
            })
        return {"resources": resources}


def resolve_mig_layout(model: GpuModel, mig_layout: MigLayout | str | None) -> MigLayout:
    """A layout object from a layout, a layout name, or None (MIG off)."""
    if mig_layout is None:
        return model.layout("all-disabled")
    if isinstance(mig_layout, MigLayout):
        if mig_layout.mig_enabled and not model.mig_capable:
            return model.layout(mig_layout.name)  # raises MigNotSupported
        own = set(model.mig_profiles)
        foreign = sorted({s.profile.name for s in mig_layout.slices if s.profile not in own})
        if foreign:
            raise GpuModelError(
                f"MIG layout {mig_layout.name!r} uses profiles {', '.join(foreign)} that a "
                f"{model.product_name} does not have"
            )
        return mig_layout
    return model.layout(mig_layout)


def advertised_resources(
    model: GpuModel | str,
    gpu_count: int,
    node_name: str,
    config: DevicePluginConfig | None = None,
    *,
    mig_layout: MigLayout | str | None = None,
    mig_strategy: str | None = None,
) -> NodeResources:
    """The resources and device IDs the NVIDIA device plugin advertises.

    ``mig_strategy`` overrides ``config.flags.migStrategy`` (the operator's
    ``MIG_STRATEGY``). Examples: H100 x2 with time-slicing replicas 4 gives
    ``nvidia.com/gpu`` with 8 IDs; mixed with ``all-1g.10gb`` gives
    ``nvidia.com/mig-1g.10gb`` with 7 IDs per GPU; single gives the MIG
    devices as ``nvidia.com/gpu``.

    Raises :class:`DevicePluginError` where the real plugin fails to build
    its device map (MIG enabled but empty, mixed profiles under single) and
    :class:`ConfigError` for config/strategy conflicts (MPS with mixed).
    """
    model = get_model(model)
    if isinstance(gpu_count, bool) or not isinstance(gpu_count, int) or gpu_count < 0:
        raise ValueError(f"gpu_count must be a non-negative integer, got {gpu_count!r}")
    config = (config or DEFAULT_CONFIG).with_mig_strategy(mig_strategy)
    strategy = config.flags.mig_strategy
    layout = resolve_mig_layout(model, mig_layout)
    sharing = config.sharing
    use_mig = layout.mig_enabled and strategy != "none"

    if sharing.strategy == SHARING_MPS and use_mig:
        raise DevicePluginError("MPS sharing is not supported for MIG devices: disable MIG or use time-slicing")

    base: dict[str, list[AdvertisedDevice]] = {}
    for i in range(gpu_count):
        parent = gpu_uuid(node_name, i)
        if not use_mig:
            base.setdefault(GPU_RESOURCE, []).append(
                AdvertisedDevice(parent, GPU_RESOURCE, parent, i, parent, model.memory_mib)
            )
            continue
        if not layout.slices:
            raise DevicePluginError(
                "error building device map: invalid MIG configuration: at least one device with "
                f"migEnabled=true was not configured correctly: device {i} has an invalid MIG "
                f"configuration (MIG layout {layout.name!r} creates no MIG devices)"
            )
        for j, s in enumerate(layout.slices):
            resource = GPU_RESOURCE if strategy == "single" else s.profile.resource_name
            dev_uuid = mig_uuid(parent, s.gi_id, s.ci_id)
            base.setdefault(resource, []).append(
                AdvertisedDevice(dev_uuid, resource, dev_uuid, i, parent, s.memory_mib, mig=s, mig_index=j)
            )
    if use_mig and strategy == "single" and len({s.profile.name for s in layout.slices}) > 1:
        raise DevicePluginError(
            "error building device map: invalid MIG configuration: more than one MIG device type present "
            f"on node (layout {layout.name!r}: {', '.join(sorted(layout.profile_counts))}); "
            "use migStrategy mixed or a single-profile layout"
        )

    warnings: list[str] = []
    result: dict[str, AdvertisedResource] = {}
    active = sharing.active
    replicated = {r.name: r for r in active.resources} if active else {}
    for name, devices in base.items():
        rep = replicated.get(name)
        if rep is None:
            result[name] = AdvertisedResource(name, tuple(devices))
            continue
        shared: list[AdvertisedDevice] = []
        for d in devices:
            memory = d.memory_mib // rep.replicas if sharing.strategy == SHARING_MPS else d.memory_mib
            for n in range(rep.replicas):
                shared.append(
                    replace(
                        d,
                        id=f"{d.device_uuid}::{n}",
                        resource=rep.advertised_name,
                        replica=n,
                        replicas=rep.replicas,
                        sharing=sharing.strategy,
                        memory_mib=memory,
                    )
                )
        result[rep.advertised_name] = AdvertisedResource(
            rep.advertised_name,
            tuple(shared),
            sharing=sharing.strategy,
            replicas=rep.replicas,
            fail_requests_greater_than_one=active.fail_requests_greater_than_one if active else False,
        )
    for name in replicated:
        if name not in base:
            warnings.append(
                f"sharing.{'mps' if sharing.strategy == SHARING_MPS else 'timeSlicing'}: no {name} devices on "
                f"this node (migStrategy {strategy}, MIG layout {layout.name}); nothing replicated, as in the "
                "device plugin"
            )
    ordered = tuple(result[k] for k in sorted(result))
    return NodeResources(
        ordered, strategy, sharing.strategy, tuple(warnings),
        allocation_policy=config.flags.plugin.shared_devices_allocation_policy,
    )


def strip_replica(device_id: str) -> str:
    """``GPU-…::3`` → ``GPU-…`` (the annotation the plugin adds to replicas)."""
    return device_id.split("::", 1)[0]


def visible_devices_env(devices: Iterable[AdvertisedDevice | str]) -> str:
    """``NVIDIA_VISIBLE_DEVICES`` for allocated devices: UUIDs, no duplicates.

    Two replicas of one GPU are still one GPU to the container.
    """
    out: list[str] = []
    for d in devices:
        value = d.device_uuid if isinstance(d, AdvertisedDevice) else strip_replica(d)
        if value not in out:
            out.append(value)
    return ",".join(out)
