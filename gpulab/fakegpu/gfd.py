"""Node labels for simulated GPU nodes: NFD, GPU Operator and GFD.

Three components label a real GPU node, and learners should be able to tell
them apart (the chapter's point: NFD *describes* the hardware, the device
plugin *advertises* resources, GFD *labels for selection*). Who writes what:

- NFD: ``feature.node.kubernetes.io/pci-10de.present`` (a PCI device of
  vendor 0x10de exists).
- GPU Operator: ``nvidia.com/gpu.present`` (derived from the NFD label),
  ``nvidia.com/gpu.deploy.<operand>`` (node selectors of its operands),
  ``nvidia.com/mig.config`` (default ``all-disabled`` on MIG-capable nodes;
  afterwards the user's choice).
- MIG Manager: ``nvidia.com/mig.config.state`` (see ``mig.py``).
- The user: ``nvidia.com/device-plugin.config`` (picks a sharing config).
- GFD: ``nvidia.com/gfd.timestamp``; driver version as
  ``nvidia.com/cuda.driver-version.*`` and the deprecated
  ``nvidia.com/cuda.driver.*``; ``nvidia.com/cuda.runtime-version.*`` and
  ``nvidia.com/cuda.runtime.*`` which, despite the name, hold the CUDA version
  the *driver* supports; ``nvidia.com/gpu.{product,count,memory,replicas,
  sharing-strategy,family,compute.major,compute.minor,machine,mode}``;
  ``nvidia.com/gpu.{multiprocessors,slices.*,engines.*}`` under MIG strategy
  ``single``; ``nvidia.com/mig-<profile>.*`` under ``mixed``;
  ``nvidia.com/mig.capable``, ``nvidia.com/mig.strategy`` (only for
  single/mixed) and ``nvidia.com/mps.capable``.

All functions here are pure: the same inputs give the same labels, and time
only enters through the ``timestamp`` / ``clock`` arguments.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from gpulab.fakegpu.devicemap import DevicePluginError, resolve_mig_layout
from gpulab.fakegpu.pluginconfig import (
    DEFAULT_CONFIG,
    GPU_RESOURCE,
    SHARING_MPS,
    SHARING_NONE,
    DevicePluginConfig,
    Sharing,
)
from gpulab.kube.names import MIG_CONFIG_LABEL, MIG_CONFIG_STATE_LABEL
from gpulab.hardware.models import LAYOUT_ALL_DISABLED, GpuModel, MigLayout, MigProfile, get_model, sanitize_label_value

__all__ = [
    "DRIVER_VERSION",
    "CUDA_DRIVER_VERSION",
    "NVIDIA_PCI_VENDOR",
    "PCI_PRESENT_LABEL",
    "GPU_PRESENT_LABEL",
    "MIG_CONFIG_LABEL",
    "MIG_CONFIG_STATE_LABEL",
    "TIMESTAMP_LABEL",
    "OPERATOR_OPERANDS",
    "gfd_labels",
    "nfd_labels",
    "operator_labels",
    "node_labels",
    "label_owner",
]

#: Driver of the reference H200 capture (shared/reference/nvidia-h200).
DRIVER_VERSION = "580.159.04"
#: CUDA version that driver supports, as nvidia-smi prints it.
CUDA_DRIVER_VERSION = "13.0"

NVIDIA_PCI_VENDOR = "10de"
PCI_PRESENT_LABEL = f"feature.node.kubernetes.io/pci-{NVIDIA_PCI_VENDOR}.present"
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
TIMESTAMP_LABEL = "nvidia.com/gfd.timestamp"

#: Operands the GPU Operator schedules through ``nvidia.com/gpu.deploy.*``.
OPERATOR_OPERANDS = (
    "driver",
    "container-toolkit",
    "operator-validator",
    "device-plugin",
    "gpu-feature-discovery",
    "dcgm",
    "dcgm-exporter",
    "node-status-exporter",
)


# --------------------------------------------------------------------------
# GFD


class _ResourceLabels:
    """The labels of one resource (``nvidia.com/gpu`` or ``nvidia.com/mig-…``).

    ``sharing`` is None when GFD labels the resource "without sharing"
    (a MIG-enabled GPU's full-GPU labels): replicas 0, no -SHARED suffix.
    """

    def __init__(self, resource: str, sharing: Sharing | None):
        self.resource = resource
        self.sharing = sharing
        self.rep = sharing.replication(resource) if sharing is not None else None

    @property
    def replicas(self) -> int:
        if self.sharing is None:
            return 0
        return self.rep.replicas if self.rep is not None else 1

    @property
    def shared(self) -> bool:
        return self.rep is not None and self.rep.replicas > 1

    def product(self, *parts: str) -> str:
        cleaned = [sanitize_label_value(p) for p in parts if p]
        # Renamed replicas get a new resource name instead of a new product.
        if self.shared and not (self.rep and self.rep.rename):
            cleaned.append("SHARED")
        return "-".join(cleaned)

    def base(self, count: int, *parts: str) -> dict[str, str]:
        strategy = SHARING_NONE
        if self.sharing is not None and self.replicas > 1:
            strategy = self.sharing.strategy
        return {
            f"{self.resource}.product": self.product(*parts),
            f"{self.resource}.count": str(count),
            f"{self.resource}.replicas": str(self.replicas),
            f"{self.resource}.sharing-strategy": strategy,
        }


def _mig_attributes(resource: str, profile: MigProfile) -> dict[str, str]:
    return {
        f"{resource}.memory": str(profile.memory_mib),
        f"{resource}.multiprocessors": str(profile.multiprocessors),
        f"{resource}.slices.gi": str(profile.compute_slices),
        # mig-parted creates one compute instance spanning the whole GI.
        f"{resource}.slices.ci": str(profile.compute_slices),
        f"{resource}.engines.copy": str(profile.copy_engines),
        f"{resource}.engines.decoder": str(profile.decoders),
        f"{resource}.engines.encoder": str(profile.encoders),
        f"{resource}.engines.jpeg": str(profile.jpeg),
        f"{resource}.engines.ofa": str(profile.ofa),
    }


def _version_labels(driver_version: str, cuda_version: str) -> dict[str, str]:
    parts = driver_version.split(".")
    if not 2 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"driver version {driver_version!r} does not match format 'X.Y[.Z]'")
    major, minor = parts[0], parts[1]
    rev = parts[2] if len(parts) == 3 else ""
    cparts = cuda_version.split(".")
    if len(cparts) != 2 or not all(p.isdigit() for p in cparts):
        raise ValueError(f"CUDA version {cuda_version!r} does not match format 'X.Y'")
    # GFD prints these with %d: '13.0' stays '13' / '0', no leading zeros.
    cmaj, cmin = str(int(cparts[0])), str(int(cparts[1]))
    return {
        # Deprecated names, still emitted by GFD.
        "nvidia.com/cuda.driver.major": major,
        "nvidia.com/cuda.driver.minor": minor,
        "nvidia.com/cuda.driver.rev": rev,
        "nvidia.com/cuda.runtime.major": cmaj,
        "nvidia.com/cuda.runtime.minor": cmin,
        "nvidia.com/cuda.driver-version.major": major,
        "nvidia.com/cuda.driver-version.minor": minor,
        "nvidia.com/cuda.driver-version.revision": rev,
        "nvidia.com/cuda.driver-version.full": driver_version,
        "nvidia.com/cuda.runtime-version.major": cmaj,
        "nvidia.com/cuda.runtime-version.minor": cmin,
        "nvidia.com/cuda.runtime-version.full": f"{cmaj}.{cmin}",
    }


def _full_gpu_labels(model: GpuModel, count: int, sharing: Sharing | None) -> dict[str, str]:
    rl = _ResourceLabels(GPU_RESOURCE, sharing)
    labels = rl.base(count, model.product_name)
    labels[f"{GPU_RESOURCE}.memory"] = str(model.memory_mib)
    labels[f"{GPU_RESOURCE}.family"] = model.family
    labels[f"{GPU_RESOURCE}.compute.major"] = str(model.compute_major)
    labels[f"{GPU_RESOURCE}.compute.minor"] = str(model.compute_minor)
    return labels


def _mig_labels(model: GpuModel, count: int, layout: MigLayout, strategy: str, sharing: Sharing) -> dict[str, str]:
    labels = {"nvidia.com/mig.strategy": strategy}
    if not layout.mig_enabled or count == 0:
        # No MIG-enabled GPU: 'single' behaves like 'none' for the resource
        # labels, 'mixed' has nothing to add.
        return labels
    per_gpu = layout.profile_counts
    if strategy == "single":
        if not layout.slices or len(per_gpu) != 1:
            # GFD's "mig-strategy-invalid" labels; the full-GPU labels for
            # family/compute stay as they were.
            invalid = _ResourceLabels(GPU_RESOURCE, None)
            labels[f"{GPU_RESOURCE}.product"] = invalid.product(model.product_name, "MIG", "INVALID")
            labels[f"{GPU_RESOURCE}.count"] = "0"
            labels[f"{GPU_RESOURCE}.replicas"] = "0"
            labels[f"{GPU_RESOURCE}.memory"] = "0"
            return labels
        (name, n), = per_gpu.items()
        profile = model.mig_profile(name)
        rl = _ResourceLabels(GPU_RESOURCE, sharing)
        labels.update(rl.base(n * count, model.product_name, "MIG", profile.name))
        labels.update(_mig_attributes(GPU_RESOURCE, profile))
        return labels
    # mixed: one set of labels per profile present on the node.
    for name, n in per_gpu.items():
        profile = model.mig_profile(name)
        rl = _ResourceLabels(profile.resource_name, sharing)
        labels.update(rl.base(n * count, model.product_name, "MIG", profile.name))
        labels.update(_mig_attributes(profile.resource_name, profile))
    return labels


def gfd_labels(
    model: GpuModel | str,
    gpu_count: int,
    *,
    config: DevicePluginConfig | None = None,
    mig_layout: MigLayout | str | None = None,
    mig_strategy: str | None = None,
    driver_version: str = DRIVER_VERSION,
    cuda_version: str = CUDA_DRIVER_VERSION,
    machine: str | None = None,
    timestamp: int | None = None,
    clock: Callable[[], float] = time.time,
) -> dict[str, str]:
    """The labels GPU Feature Discovery writes for a node.

    ``config`` is the effective device-plugin config (GFD reads the same
    file), ``mig_strategy`` overrides its ``migStrategy`` (the operator's
    ``MIG_STRATEGY``), ``mig_layout`` is what the MIG manager applied
    (None: MIG off). ``timestamp`` (or ``clock()``) fills
    ``nvidia.com/gfd.timestamp`` unless the config sets ``noTimestamp``.
    A node with no GPUs gets no GFD labels.
    """
    model = get_model(model)
    if isinstance(gpu_count, bool) or not isinstance(gpu_count, int) or gpu_count < 0:
        raise ValueError(f"gpu_count must be a non-negative integer, got {gpu_count!r}")
    if gpu_count == 0:
        return {}
    config = (config or DEFAULT_CONFIG).with_mig_strategy(mig_strategy)
    strategy = config.flags.mig_strategy
    layout = resolve_mig_layout(model, mig_layout)
    sharing = config.sharing

    if sharing.strategy == SHARING_MPS and layout.mig_enabled:
        raise DevicePluginError(
            "gpu-feature-discovery: error creating sharing labeler: failed to check MPS-capable: "
            "MPS sharing is not supported for mig devices"
        )

    labels: dict[str, str] = {}
    labels["nvidia.com/gpu.machine"] = sanitize_label_value(machine or model.machine) or "unknown"
    labels.update(_version_labels(driver_version, cuda_version))
    labels["nvidia.com/mig.capable"] = "true" if model.mig_capable else "false"
    labels["nvidia.com/mps.capable"] = "true" if sharing.strategy == SHARING_MPS else "false"
    # Full-GPU labels follow the GPUs' real MIG mode, whatever the strategy:
    # a MIG-enabled GPU is labelled without sharing (replicas 0).
    labels.update(_full_gpu_labels(model, gpu_count, None if layout.mig_enabled else sharing))
    if strategy != "none":
        labels.update(_mig_labels(model, gpu_count, layout, strategy, sharing))
    labels["nvidia.com/gpu.mode"] = "compute"  # PCI class 0x0302 (3D controller)
    if not config.flags.gfd.no_timestamp:
        labels[TIMESTAMP_LABEL] = str(int(timestamp if timestamp is not None else clock()))
    return dict(sorted(labels.items()))


# --------------------------------------------------------------------------
# NFD and GPU Operator


def nfd_labels(model: GpuModel | str, gpu_count: int) -> dict[str, str]:
    """The NFD label that tells the GPU Operator an NVIDIA PCI device exists.

    The operator's NFD worker config labels PCI devices by vendor only,
    hence ``pci-10de`` (not ``pci-0302_10de``). Other NFD labels (kernel,
    CPU) are outside the GPU story and not simulated.
    """
    get_model(model)
    return {PCI_PRESENT_LABEL: "true"} if gpu_count > 0 else {}


def operator_labels(
    model: GpuModel | str,
    gpu_count: int,
    *,
    existing: Mapping[str, str] | None = None,
    mig_config_default: str = LAYOUT_ALL_DISABLED,
    driver_managed: bool = True,
) -> dict[str, str]:
    """Labels the GPU Operator's node labeller adds.

    ``gpu.present`` where NFD saw an NVIDIA device, one
    ``gpu.deploy.<operand>=true`` per operand (``mig-manager`` only on
    MIG-capable nodes, ``driver`` only when the operator manages the
    driver), and ``mig.config=<default>`` on MIG-capable nodes that do not
    have one yet. Deploy labels already present (e.g. ``false`` set by an
    admin, ``paused-for-mig-change`` set by the MIG manager) are kept.
    """
    model = get_model(model)
    existing = existing or {}
    if gpu_count <= 0 and existing.get(PCI_PRESENT_LABEL) != "true":
        return {}
    labels = {GPU_PRESENT_LABEL: "true"}
    operands = [op for op in OPERATOR_OPERANDS if driver_managed or op != "driver"]
    if model.mig_capable:
        operands.append("mig-manager")
    for op in operands:
        key = f"nvidia.com/gpu.deploy.{op}"
        labels[key] = existing.get(key, "true")
    if model.mig_capable:
        labels[MIG_CONFIG_LABEL] = existing.get(MIG_CONFIG_LABEL) or mig_config_default
    return labels


def node_labels(
    model: GpuModel | str,
    gpu_count: int,
    *,
    existing: Mapping[str, str] | None = None,
    config: DevicePluginConfig | None = None,
    mig_layout: MigLayout | str | None = None,
    mig_strategy: str | None = None,
    driver_version: str = DRIVER_VERSION,
    cuda_version: str = CUDA_DRIVER_VERSION,
    machine: str | None = None,
    timestamp: int | None = None,
    clock: Callable[[], float] = time.time,
    driver_managed: bool = True,
) -> dict[str, str]:
    """NFD + GPU Operator + GFD labels for one node, merged in that order."""
    labels: dict[str, str] = {}
    labels.update(nfd_labels(model, gpu_count))
    labels.update(operator_labels(model, gpu_count, existing=existing, driver_managed=driver_managed))
    labels.update(
        gfd_labels(
            model,
            gpu_count,
            config=config,
            mig_layout=mig_layout,
            mig_strategy=mig_strategy,
            driver_version=driver_version,
            cuda_version=cuda_version,
            machine=machine,
            timestamp=timestamp,
            clock=clock,
        )
    )
    return dict(sorted(labels.items()))


_OWNERS: tuple[tuple[str, str], ...] = (
    ("feature.node.kubernetes.io/", "nfd"),
    ("nvidia.com/gpu.present", "gpu-operator"),
    ("nvidia.com/gpu.deploy.", "gpu-operator"),
    ("nvidia.com/gpu-driver-upgrade-state", "gpu-operator"),
    ("nvidia.com/gpu.workload.config", "gpu-operator"),
    ("nvidia.com/mig.config.state", "mig-manager"),
    ("nvidia.com/mig.config", "gpu-operator (default) / user"),
    ("nvidia.com/device-plugin.config", "user"),
    ("nvidia.com/gfd.", "gfd"),
    ("nvidia.com/cuda.", "gfd"),
    ("nvidia.com/gpu.", "gfd"),
    ("nvidia.com/mig-", "gfd"),
    ("nvidia.com/mig.", "gfd"),
    ("nvidia.com/mps.", "gfd"),
    ("nvidia.com/vgpu.", "gfd"),
)


def label_owner(key: str) -> str:
    """Which component writes a label: ``nfd``, ``gpu-operator``, ``gfd`` …

    Returns ``"unknown"`` for labels none of them write.
    """
    for prefix, owner in _OWNERS:
        if key == prefix or key.startswith(prefix):
            return owner
    return "unknown"
