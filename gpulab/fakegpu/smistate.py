"""The ``nvidia-smi`` state file as the host writes it.

:func:`build_state` makes the state of a node's idle GPUs from the GPU
models (UUIDs, bus ids and MIG UUIDs are those the device plugin
advertises, see :mod:`gpulab.fakegpu.devicemap`); the node, the kind
daemons and the device plugin then adjust it (processes, memory in use,
faults) and :func:`write_state` puts it where the simulated
``nvidia-smi`` (:mod:`gpulab.fakegpu.nvidiasmi`) reads it. The schema
is documented in that module, which owns the file format.
"""

from __future__ import annotations

import json
import os

from ..hardware.models import get_model, gpu_uuid, mig_uuid, pci_bus_id
from .devicemap import resolve_mig_layout
from .gfd import CUDA_DRIVER_VERSION, DRIVER_VERSION
from .nvidiasmi import FAULT_FABRIC_MANAGER_DOWN, FAULTS, STATE_SCHEMA

__all__ = ["build_state", "write_state"]


def write_state(path: str, state: dict, unless: str | None = None) -> str:
    """Write a state file atomically (readers never see half a file); returns what it holds.

    Unless the file exists and holds ``unless`` already (what an earlier call returned): a node rewrites the
    states of all its GPU containers whenever one of them starts, and most of them are unchanged.
    """
    # One line through the C encoder: the node agent writes these files at every container start.
    text = json.dumps(state, sort_keys=True) + "\n"
    if text == unless and os.path.exists(path):
        return text
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)
    return text


def build_state(
    model,
    gpu_count: int,
    node_name: str,
    *,
    mig_layout=None,
    driver_version: str | None = None,
    cuda_version: str | None = None,
    fault: str | None = None,
    timestamp: float | None = None,
) -> dict:
    """A state dict for ``gpu_count`` idle GPUs of ``model`` on ``node_name``.

    UUIDs, bus ids and MIG UUIDs are the ones the device plugin advertises
    (:func:`gpulab.fakegpu.devicemap.advertised_resources`), so a pod's
    ``NVIDIA_VISIBLE_DEVICES`` resolves here.
    """
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; allowed: {', '.join(FAULTS)}")
    model = get_model(model)
    layout = resolve_mig_layout(model, mig_layout)
    gpus = []
    for i in range(gpu_count):
        uuid = gpu_uuid(node_name, i)
        mig_devices = []
        if layout.mig_enabled:
            for j, s in enumerate(layout.slices):
                p = s.profile
                mig_devices.append({
                    "index": j, "gi_id": s.gi_id, "ci_id": s.ci_id, "profile": p.name,
                    "uuid": mig_uuid(uuid, s.gi_id, s.ci_id), "start": s.start, "mem_slices": p.memory_slices,
                    "memory_total_mib": p.memory_mib, "memory_used_mib": 0,
                    "bar1_total_mib": p.bar1_mib, "bar1_used_mib": 0,
                    "sm": p.multiprocessors, "ce": p.copy_engines, "enc": p.encoders,
                    "dec": p.decoders, "ofa": p.ofa, "jpg": p.jpeg,
                })
        fabric = {"state": "N/A", "status": "N/A"}
        if model.nvswitch and model.family == "hopper":
            # Hopper HGX boards report fabric registration; A100 and PCIe don't.
            fabric = {"state": "Completed", "status": "Success"}
        if fault == FAULT_FABRIC_MANAGER_DOWN and model.nvswitch:
            fabric = {"state": "In Progress", "status": "N/A"}
        gpus.append({
            "index": i,
            "minor_number": i,
            "name": model.product_name,
            "brand": model.brand,
            "architecture": model.architecture,
            "uuid": uuid,
            "serial": str(int(uuid[4:].replace("-", ""), 16))[:13],
            "vbios_version": model.vbios_version,
            "bus_id": pci_bus_id(i),
            "module_id": i + 1 if model.form_factor == "sxm" else None,
            "pci_device_id": model.pci.device_id,
            "pci_subsystem_id": model.pci.subsystem_id,
            "pcie_gen": model.pci.gen,
            "pcie_width": model.pci.width,
            "compute_cap": model.compute_capability,
            "memory_total_mib": model.memory_mib,
            "memory_reserved_mib": model.memory_reserved_mib,
            "memory_used_mib": 0,
            "bar1_total_mib": model.bar1_mib,
            "bar1_used_mib": 1,
            "utilization_gpu": 0,
            "utilization_memory": 0,
            "temperature_gpu": model.temperature.idle_c,
            "temperature_memory": model.temperature.memory_idle_c,
            "temperature_shutdown": model.temperature.shutdown_c,
            "temperature_slowdown": model.temperature.slowdown_c,
            "temperature_max_operating": model.temperature.max_operating_c,
            "power_draw_w": model.power.idle_w,
            "power_limit_w": model.power.limit_w,
            "power_default_limit_w": model.power.limit_w,
            "power_min_limit_w": model.power.min_w,
            "power_max_limit_w": model.power.max_w,
            "pstate": "P0",
            "fan_speed": None,
            "persistence_mode": True,
            "display_active": False,
            "ecc_enabled": True,
            "compute_mode": "Default",
            "clocks": _clock_dict(model.idle_clocks),
            "max_clocks": _clock_dict(model.max_clocks),
            "min_graphics_clock_mhz": model.idle_clocks.graphics,  # an idle GPU runs at its lowest clocks
            "fabric": fabric,
            "mig_capable": model.mig_capable,
            "mig_mode": ("Enabled" if layout.mig_enabled else "Disabled") if model.mig_capable else None,
            "mig_mode_pending": None,
            "mig_memory_slices": model.mig_memory_slices,
            "mig_compute_slices": model.mig_compute_slices,
            "mig_profiles": [
                {
                    "name": p.name, "id": p.gi_profile_id, "g": p.compute_slices, "mem_slices": p.memory_slices,
                    "instances": p.max_instances, "memory_mib": p.memory_mib, "sm": p.multiprocessors,
                    "ce": p.copy_engines, "dec": p.decoders, "enc": p.encoders, "jpeg": p.jpeg, "ofa": p.ofa,
                    "placements": list(p.placements),
                }
                for p in model.mig_profiles
            ],
            "mig_devices": mig_devices,
            "processes": [],
        })
    return {
        "schema": STATE_SCHEMA,
        "driver_version": driver_version or DRIVER_VERSION,
        "cuda_version": cuda_version or CUDA_DRIVER_VERSION,
        "timestamp": timestamp,
        "fault": fault,
        "node": node_name,
        "gpus": gpus,
    }


def _clock_dict(clocks) -> dict:
    return {"graphics": clocks.graphics, "sm": clocks.sm, "memory": clocks.memory, "video": clocks.video}
