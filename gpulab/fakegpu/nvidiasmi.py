"""A fake ``nvidia-smi`` that prints what the real one prints.

Runs inside simulated pods, so it is standard library only and imports
nothing from gpulab: ``python3 -m gpulab.fakegpu.nvidiasmi`` and
``python3 /path/to/nvidiasmi.py`` both work with any Python 3.9+.
Everything it shows comes from a JSON state file written on the host
(:func:`gpulab.fakegpu.smistate.build_state`, then ``write_state``):

``GPULAB_NVIDIA_SMI_STATE``
    path of the state file. Missing variable or file: the container has no
    driver, and nvidia-smi fails as it does then (exit 9).
``NVIDIA_VISIBLE_DEVICES``
    which devices the container sees, as the NVIDIA container runtime reads
    it: ``all``; ``none`` (driver present, no GPU: "No devices were
    found", exit 6); ``void``, empty or unset (no injection at all: exit 9);
    or a comma list of GPU UUIDs, MIG UUIDs, GPU indices (``0``), MIG
    indices (``0:1``) or device-plugin replica IDs (``GPU-…::2``). Visible
    devices are renumbered from 0, as inside a real container.

State file schema (``"schema": "gpulab.nvidia-smi/v1"``); every field but
``gpus[].name`` and ``gpus[].uuid`` has a default::

    {
      "schema": "gpulab.nvidia-smi/v1",
      "driver_version": "580.159.04",       # also NVML version (first 2 parts)
      "cuda_version": "13.0",               # CUDA version the driver supports
      "timestamp": null,                    # fixed epoch seconds, or null = now
      "fault": null,                        # one of FAULTS
      "gpus": [{
        "index": 0, "minor_number": 0,
        "name": "NVIDIA H200", "brand": "NVIDIA", "architecture": "Hopper",
        "uuid": "GPU-…", "serial": "…", "vbios_version": "…",
        "bus_id": "00000000:18:00.0", "module_id": 1 | null,
        "pci_device_id": "0x233510DE", "pci_subsystem_id": "0x18BF10DE",
        "pcie_gen": 5, "pcie_width": 16,
        "compute_cap": "9.0",
        "memory_total_mib": 143771, "memory_reserved_mib": 616, "memory_used_mib": 0,
        "bar1_total_mib": 262144, "bar1_used_mib": 1,
        "utilization_gpu": 0, "utilization_memory": 0,
        "utilization_neighbours": 0,          # gpulab's own, never printed, only in a container's
                                              # file: what the other programs on this GPU want of
                                              # it, in percent, not capped at 100
        "temperature_gpu": 38, "temperature_memory": 39 | null,
        "temperature_shutdown": 92, "temperature_slowdown": 89, "temperature_max_operating": 87,
        "power_draw_w": 118.0, "power_limit_w": 700.0, "power_default_limit_w": 700.0,
        "power_min_limit_w": 200.0, "power_max_limit_w": 700.0,
        "pstate": "P0", "fan_speed": null, "persistence_mode": true,
        "display_active": false, "ecc_enabled": true, "compute_mode": "Default",
        "clocks": {"graphics": 405, "sm": 405, "memory": 3201, "video": 765},
        "max_clocks": {"graphics": 1980, "sm": 1980, "memory": 3201, "video": 1545},
        "fabric": {"state": "N/A", "status": "N/A"},
        "cpu_affinity": "0-15", "numa_affinity": 0,   # optional, for topo -m: default all CPUs
                                              # of the machine nvidia-smi runs on, node 0
        "nvlinks": 18,                        # optional: NVLinks to each other GPU (topo -m NV18);
                                              # default 18 Hopper / 12 Ampere if module_id set, else PCIe
        "mig_capable": true, "mig_mode": "Disabled" | "Enabled", "mig_mode_pending": null,
        "mig_memory_slices": 8, "mig_compute_slices": 7,   # the GPU's MIG slices (4 and 4 on an A30)
        "mig_profiles": [{"name": "1g.18gb", "id": 19, "g": 1, "mem_slices": 1,
                          "instances": 7, "memory_mib": 16384, "sm": 16, "ce": 1,
                          "dec": 1, "enc": 0, "jpeg": 1, "ofa": 0,
                          "placements": [0, 1, 2, 3, 4, 5, 6]}],
        "mig_devices": [{"index": 0, "gi_id": 7, "ci_id": 0, "profile": "1g.18gb",
                         "uuid": "MIG-…", "start": 0, "mem_slices": 1,
                         "memory_total_mib": 16384, "memory_used_mib": 0,
                         "bar1_total_mib": 32767, "bar1_used_mib": 0,
                         "sm": 16, "ce": 1, "enc": 0, "dec": 1, "ofa": 0, "jpg": 1}],
        "processes": [{"pid": 4242, "type": "C", "name": "python3",
                       "used_memory_mib": 1024, "gi_id": null, "ci_id": null}]
      }]
    }

This module is the program and owns the state file format: the schema
above, :func:`read_state`, the fault names (:data:`FAULTS`) and what
``NVIDIA_VISIBLE_DEVICES`` selects (:func:`select_visible`). The host
side builds and writes the file (:mod:`gpulab.fakegpu.smistate`); the
CUDA errors a simulated program hits are in :mod:`gpulab.fakegpu.cudaerrors`.
Both import from here, never the other way round: this file is copied
as is into simulated pods as ``/usr/bin/nvidia-smi``.
"""

from __future__ import annotations

import json
import os
import sys
import time

STATE_ENV = "GPULAB_NVIDIA_SMI_STATE"
VISIBLE_ENV = "NVIDIA_VISIBLE_DEVICES"
STATE_SCHEMA = "gpulab.nvidia-smi/v1"

# Exit codes documented in nvidia-smi(1).
EXIT_OK = 0
EXIT_INVALID_ARGUMENT = 2
EXIT_NOT_SUPPORTED = 3
EXIT_NOT_FOUND = 6
EXIT_DRIVER_NOT_LOADED = 9
EXIT_UNKNOWN = 255

MSG_NO_DEVICES = "No devices were found"
MSG_NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)
MSG_INVALID_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."
MSG_NO_MIG = "No MIG-supported devices found."
MSG_OPTION_NOT_VALID = "ERROR: Option {option} is not valid for this command."

# --------------------------------------------------------------------------
# Faults (the state file's ``fault`` field)

#: nvidia-smi cannot reach the driver (module not loaded, no device nodes).
FAULT_DRIVER_UNREACHABLE = "driver-unreachable"
#: Driver loaded but no GPU attached to this container/host.
FAULT_NO_DEVICES = "no-devices"
#: NVSwitch system whose nvidia-fabricmanager is not running: nvidia-smi
#: works, ``-q`` shows Fabric State "In Progress", CUDA init fails.
FAULT_FABRIC_MANAGER_DOWN = "fabric-manager-down"
#: The driver is older than the CUDA runtime of the program (set
#: ``cuda_version`` below what the image was built for to show it).
FAULT_CUDA_DRIVER_TOO_OLD = "cuda-driver-too-old"

FAULTS = (FAULT_DRIVER_UNREACHABLE, FAULT_NO_DEVICES, FAULT_FABRIC_MANAGER_DOWN, FAULT_CUDA_DRIVER_TOO_OLD)


class StateError(Exception):
    """The state file exists but cannot be used."""


# --------------------------------------------------------------------------
# State


def read_state(path: str) -> dict:
    """Load and minimally check a state file. Raises OSError / StateError.

    Besides the native schema it accepts the per-allocation file the gpulab
    device plugin writes (``{"allocationID", "visibleDevices", "devices":
    [<inventory info>]}``) when each ``info`` is a GPU entry of this schema
    (``NodeResources.to_inventory`` makes them so): the GPUs are the distinct
    entries, the versions come from the document or its first GPU.
    """
    with open(path, encoding="utf-8") as fh:
        try:
            state = json.load(fh)
        except ValueError as exc:
            raise StateError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(state, dict):
        raise StateError(f"{path}: top level must be an object")
    if "gpus" not in state and isinstance(state.get("devices"), list):
        state = _from_allocation(state, path)
    schema = state.get("schema", STATE_SCHEMA)
    if schema != STATE_SCHEMA:
        raise StateError(f"{path}: schema {schema!r} is not {STATE_SCHEMA!r}")
    gpus = state.get("gpus", [])
    if not isinstance(gpus, list):
        raise StateError(f"{path}: 'gpus' must be a list")
    for i, gpu in enumerate(gpus):
        if not isinstance(gpu, dict) or not gpu.get("uuid") or not gpu.get("name"):
            raise StateError(f"{path}: gpus[{i}] needs at least 'name' and 'uuid'")
    fault = state.get("fault")
    if fault is not None and fault not in FAULTS:
        raise StateError(f"{path}: unknown fault {fault!r}; allowed: {', '.join(FAULTS)}")
    return state


def _from_allocation(doc: dict, path: str) -> dict:
    gpus: dict = {}
    for i, info in enumerate(doc["devices"]):
        if not isinstance(info, dict) or not info.get("name") or not str(info.get("uuid", "")).startswith("GPU-"):
            raise StateError(
                f"{path}: devices[{i}] is not a GPU entry of the {STATE_SCHEMA} schema "
                "(build the device plugin inventory with NodeResources.to_inventory(state))"
            )
        gpus.setdefault(info["uuid"], info)
    first = next(iter(gpus.values()), {})
    state = {"schema": STATE_SCHEMA, "gpus": list(gpus.values())}
    for key, default in (("driver_version", None), ("cuda_version", None), ("fault", None), ("timestamp", None)):
        value = doc.get(key, first.get(key, default))
        if value is not None:
            state[key] = value
    return state


# --------------------------------------------------------------------------
# Visibility


class _View:
    """A GPU as the container sees it: renumbered, with its visible MIG devices."""

    __slots__ = ("gpu", "index", "migs")

    def __init__(self, gpu: dict, index: int, migs: list):
        self.gpu = gpu
        self.index = index
        self.migs = migs

    def get(self, key: str, default=None):
        value = self.gpu.get(key, default)
        return default if value is None else value

    @property
    def mig_enabled(self) -> bool:
        return self.gpu.get("mig_mode") == "Enabled"


NO_DRIVER = "no-driver"
NO_DEVICES = "no-devices"


def select_visible(state: dict | None, env_value: str | None) -> tuple[str | None, list[_View]]:
    """Apply ``NVIDIA_VISIBLE_DEVICES`` to the state.

    Returns ``(problem, views)`` where problem is None, ``"no-driver"`` or
    ``"no-devices"``. Unknown entries are ignored (the real runtime refuses
    to start such a container; the pod would never get here).
    """
    if state is None:
        return NO_DRIVER, []
    fault = state.get("fault")
    if fault == FAULT_DRIVER_UNREACHABLE:
        return NO_DRIVER, []
    value = (env_value or "").strip()
    if value in ("", "void"):
        return NO_DRIVER, []
    gpus = sorted(state.get("gpus", []), key=lambda g: g.get("index", 0))
    if value == "none" or fault == FAULT_NO_DEVICES or not gpus:
        return NO_DEVICES, []

    picked: dict[int, set | None] = {}  # host position -> MIG indices (None = all)
    if value == "all":
        picked = {pos: None for pos in range(len(gpus))}
    else:
        by_uuid = {g["uuid"]: pos for pos, g in enumerate(gpus)}
        by_index = {str(g.get("index", pos)): pos for pos, g in enumerate(gpus)}
        mig_by_uuid = {}
        for pos, g in enumerate(gpus):
            for m in g.get("mig_devices") or []:
                mig_by_uuid[m.get("uuid")] = (pos, m.get("index", 0))
        for entry in value.split(","):
            entry = entry.strip().split("::", 1)[0]
            if not entry:
                continue
            if entry in by_uuid or entry in by_index:
                pos = by_uuid.get(entry, by_index.get(entry))
                picked[pos] = None
            elif entry in mig_by_uuid:
                pos, mig_index = mig_by_uuid[entry]
                if pos not in picked or picked[pos] is not None:
                    picked.setdefault(pos, set()).add(mig_index)
            elif ":" in entry:
                gpu_part, _, mig_part = entry.partition(":")
                if gpu_part in by_index and mig_part.isdigit():
                    pos = by_index[gpu_part]
                    if pos not in picked or picked[pos] is not None:
                        picked.setdefault(pos, set()).add(int(mig_part))
    views = []
    for new_index, pos in enumerate(sorted(picked)):
        gpu = gpus[pos]
        wanted = picked[pos]
        migs = [m for m in gpu.get("mig_devices") or [] if wanted is None or m.get("index", 0) in wanted]
        migs.sort(key=lambda m: m.get("gi_id", 0))
        views.append(_View(gpu, new_index, migs))
    if not views:
        return NO_DEVICES, []
    return None, views


# --------------------------------------------------------------------------
# Formatting helpers

_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def _now(state: dict | None) -> float:
    ts = (state or {}).get("timestamp")
    return float(ts) if isinstance(ts, (int, float)) else time.time()


def _ctime(ts: float) -> str:
    """``Wed Dec  2 10:23:02 2026`` (C locale, like the real tool)."""
    t = time.localtime(ts)
    return (f"{_DAYS[t.tm_wday]} {_MONTHS[t.tm_mon - 1]} {t.tm_mday:>2} "
            f"{t.tm_hour:02}:{t.tm_min:02}:{t.tm_sec:02} {t.tm_year}")


def _int(value, default: int = 0) -> int:
    try:
        return int(round(float(value)))
    except (TypeError, ValueError):
        return default


def _fit(text: str, width: int) -> str:
    """Left-justify, truncating long names the way nvidia-smi does."""
    if len(text) <= width:
        return text.ljust(width)
    return (text[: width - 4] + " ...").ljust(width)


# --------------------------------------------------------------------------
# The default view: the box table

_COLS = (41, 24, 22)
_WIDTH = 89
_MIG_COLS = (18, 34, 11, 23)


def _rule(widths=(_WIDTH,), ch: str = "-", edge: str = "+", join: str = "+") -> str:
    return edge + join.join(ch * w for w in widths) + edge


def _row(*cells: str) -> str:
    return "|" + "|".join(cells) + "|"


def _full(text: str) -> str:
    return "|" + text.ljust(_WIDTH) + "|"


def _gpu_rows(v: _View) -> list[str]:
    g = v.gpu
    persistence = "On" if v.get("persistence_mode", True) else "Off"
    name = _fit(str(g["name"]), 27)
    c1 = f"{v.index:>4}  {name}    {persistence:<3} "
    disp = "On" if v.get("display_active", False) else "Off"
    c2 = f"   {v.get('bus_id', '00000000:00:00.0')} {disp:>3} "
    if v.mig_enabled:
        ecc = "On"
    elif g.get("ecc_enabled") is None:
        ecc = "N/A"
    else:
        ecc = "0" if g.get("ecc_enabled") else "Off"
    c3 = f"{ecc:>21} "

    fan = "N/A" if g.get("fan_speed") is None else f"{_int(g['fan_speed'])}%"
    left = f" {fan:>3}  {_int(v.get('temperature_gpu', 0)):>3}C    {v.get('pstate', 'P0')}"
    power = f"{_int(v.get('power_draw_w', 0))}W / " + f"{_int(v.get('power_limit_w', 0))}W".rjust(5) + " "
    d1 = left + power.rjust(41 - len(left))
    if v.mig_enabled:
        d2 = f"{'N/A':>21}   "
        util = "N/A"
    else:
        d2 = f"{_int(v.get('memory_used_mib', 0))}MiB / {_int(v.get('memory_total_mib', 0)):>6}MiB ".rjust(24)
        util = f"{_int(v.get('utilization_gpu', 0))}%"
    d3 = f"{util:>8}{v.get('compute_mode', 'Default'):>13} "

    mig_mode = v.get("mig_mode") or "N/A"
    return [_row(c1, c2, c3), _row(d1, d2, d3), _row(" " * 41, " " * 24, f"{mig_mode:>21} ")]


def _mig_table(views: list[_View]) -> list[str]:
    out = [
        _rule(),
        _full(" MIG devices:"),
        _rule(_MIG_COLS),
        _row(" GPU  GI  CI  MIG ", "                     Memory-Usage ", "        Vol", "        Shared         "),
        _row("      ID  ID  Dev ", "                       BAR1-Usage ", " SM     Unc", " CE ENC  DEC  OFA  JPG "),
        _row(" " * 18, " " * 34, "        ECC", " " * 23),
        _rule(_MIG_COLS, "=", "|", "+"),
    ]
    rows = []
    for v in views:
        if not v.mig_enabled:
            continue
        for dev_index, m in enumerate(v.migs):
            used = _int(m.get("memory_used_mib", 0))
            total = _int(m.get("memory_total_mib", 0))
            bar_used = _int(m.get("bar1_used_mib", 0))
            bar_total = _int(m.get("bar1_total_mib", 0))
            rows.append(_row(
                f"{v.index:>3}{_int(m.get('gi_id', 0)):>5}{_int(m.get('ci_id', 0)):>4}{dev_index:>4}  ",
                f"{used}MiB / {total:>5}MiB    ".rjust(34),
                f" {_int(m.get('sm', 0)):<3}{0:>6} ",
                f"{_int(m.get('ce', 0)):>3}{_int(m.get('enc', 0)):>4}{_int(m.get('dec', 0)):>5}"
                f"{_int(m.get('ofa', 0)):>5}{_int(m.get('jpg', 0)):>5} ",
            ))
            rows.append(_row(" " * 18, f"{bar_used}MiB / {bar_total:>5}MiB  ".rjust(34), " " * 11, " " * 23))
            rows.append(_rule(_MIG_COLS))
    if rows:
        out += rows
    else:
        out += [_full("  No MIG devices found"), _rule()]
    return out


def _process_rows(views: list[_View]) -> list[str]:
    rows = []
    for v in views:
        visible_gis = {m.get("gi_id") for m in v.migs}
        for p in v.gpu.get("processes") or []:
            gi, ci = p.get("gi_id"), p.get("ci_id")
            if v.mig_enabled and gi is not None and gi not in visible_gis:
                continue  # a process in a MIG instance this container cannot see
            name = str(p.get("name", ""))
            if len(name) > 35:
                name = "..." + name[-32:]
            rows.append(
                "|" + f"{v.index:>5}" + "   "
                + ("N/A" if gi is None else f"{_int(gi):>2} ") + "  "
                + ("N/A" if ci is None else f"{_int(ci):>2} ")
                + f"{_int(p.get('pid', 0)):>16}" + f"{str(p.get('type', 'C')):>7}" + "   "
                + name.ljust(35) + " " + f"{_int(p.get('used_memory_mib', 0))}MiB".rjust(10) + " |"
            )
    return rows


def render_table(state: dict, views: list[_View]) -> str:
    """The output of plain ``nvidia-smi``."""
    driver = str(state.get("driver_version", "N/A"))
    cuda = str(state.get("cuda_version", "N/A"))
    lines = [
        _ctime(_now(state)) + "       ",
        _rule(),
        "| " + f"NVIDIA-SMI {driver:<23}" + f"Driver Version: {driver:<15}" + f"CUDA Version: {cuda:<9}" + "|",
        _rule(_COLS),
        _row(" GPU  Name                 Persistence-M ", " Bus-Id          Disp.A ", " Volatile Uncorr. ECC "),
        _row(" Fan  Temp   Perf          Pwr:Usage/Cap ", "           Memory-Usage ", " GPU-Util  Compute M. "),
        _row(" " * 41, " " * 24, "               MIG M. "),
        _rule(_COLS, "=", "|", "+"),
    ]
    for v in views:
        lines += _gpu_rows(v)
        lines.append(_rule(_COLS))
    lines.append("")
    if any(v.mig_enabled for v in views):
        lines += _mig_table(views)
        lines.append("")
    lines += [
        _rule(),
        _full(" Processes:"),
        _full("  GPU   GI   CI              PID   Type   Process name                        GPU Memory "),
        _full("        ID   ID                                                               Usage      "),
        _rule(ch="=", edge="|"),
    ]
    procs = _process_rows(views)
    lines += procs or [_full("  No running processes found")]
    lines.append(_rule())
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# -L


def render_list(views: list[_View]) -> str:
    lines = []
    for v in views:
        lines.append(f"GPU {v.index}: {v.gpu['name']} (UUID: {v.gpu['uuid']})")
        if v.mig_enabled:
            for dev_index, m in enumerate(v.migs):
                lines.append(f"  MIG {str(m.get('profile', '')):<11} Device {dev_index:>2}: (UUID: {m.get('uuid')})")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# --query-gpu

_NA = "[N/A]"


def _mib(value) -> tuple[str, str]:
    return (str(_int(value)), "MiB") if value is not None else (_NA, "")


def _watts(value) -> tuple[str, str]:
    return (f"{float(value):.2f}", "W") if value is not None else (_NA, "")


def _mhz(value) -> tuple[str, str]:
    return (str(_int(value)), "MHz") if value is not None else (_NA, "")


def _enabled(flag) -> str:
    return "Enabled" if flag else "Disabled"


def _q_mem_used(v: _View) -> tuple[str, str]:
    return (_NA, "") if v.mig_enabled else _mib(v.get("memory_used_mib", 0))


def _q_mem_free(v: _View) -> tuple[str, str]:
    if v.mig_enabled:
        return _NA, ""
    free = _int(v.get("memory_total_mib", 0)) - _int(v.get("memory_reserved_mib", 0)) - _int(v.get("memory_used_mib", 0))
    return _mib(max(free, 0))


def _q_util(key: str):
    def get(v: _View) -> tuple[str, str]:
        if v.mig_enabled:
            return _NA, ""
        return str(_int(v.get(key, 0))), "%"
    return get


def _q_clock(group: str, key: str):
    return lambda v: _mhz((v.get(group) or {}).get(key))


def _q_mig_mode(key: str):
    def get(v: _View) -> tuple[str, str]:
        mode = v.gpu.get(key) or (v.gpu.get("mig_mode") if key == "mig_mode_pending" else None)
        return (mode, "") if mode else (_NA, "")
    return get


def _q_pci_part(index: int):
    def get(v: _View) -> tuple[str, str]:
        bus = str(v.get("bus_id", "00000000:00:00.0"))
        domain, _, rest = bus.partition(":")
        bus_no, _, dev = rest.partition(":")
        parts = (domain[-4:], bus_no, dev.split(".")[0])
        return "0x" + parts[index].upper(), ""
    return get


def _q_tlimit(v: _View) -> tuple[str, str]:
    """Headroom below the max operating temperature (``-q``: GPU T.Limit Temp)."""
    limit = v.gpu.get("temperature_max_operating")
    return (_NA, "") if limit is None else (str(_int(limit) - _int(v.get("temperature_gpu", 0))), "")


# Clock event reasons (NVML's nvmlClocksEventReason* bits) the fake can show.
# Only "gpu_idle" is ever active: an idle GPU (utilisation 0) drops its clocks.
_CLOCK_EVENT_REASONS = (
    ("gpu_idle", 0x1), ("applications_clocks_setting", 0x2), ("sw_power_cap", 0x4), ("hw_slowdown", 0x8),
    ("sync_boost", 0x10), ("sw_thermal_slowdown", 0x20), ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
)


def _event_mask(v: _View) -> int:
    return 0 if _int(v.get("utilization_gpu", 0)) > 0 else 0x1


def _q_event_mask(v: _View) -> tuple[str, str]:
    return f"0x{_event_mask(v):016X}", ""


def _q_event_reason(bit: int):
    return lambda v: ("Active" if _event_mask(v) & bit else "Not Active", "")


# field -> (header unit, getter). Getters return (value, unit).
_QUERY_FIELDS: dict[str, tuple[str, object]] = {
    "timestamp": ("", None),  # filled in by render_query (needs the clock)
    "driver_version": ("", None),
    "count": ("", None),
    "name": ("", lambda v: (str(v.gpu["name"]), "")),
    "serial": ("", lambda v: (str(v.get("serial", _NA)), "")),
    "uuid": ("", lambda v: (str(v.gpu["uuid"]), "")),
    "index": ("", lambda v: (str(v.index), "")),
    "pci.bus_id": ("", lambda v: (str(v.get("bus_id", _NA)), "")),
    "pci.domain": ("", _q_pci_part(0)),
    "pci.bus": ("", _q_pci_part(1)),
    "pci.device": ("", _q_pci_part(2)),
    "pci.device_id": ("", lambda v: (str(v.get("pci_device_id", _NA)), "")),
    "pci.sub_device_id": ("", lambda v: (str(v.get("pci_subsystem_id", _NA)), "")),
    "pcie.link.gen.current": ("", lambda v: (str(v.get("pcie_gen", _NA)), "")),
    "pcie.link.gen.max": ("", lambda v: (str(v.get("pcie_gen", _NA)), "")),
    "pcie.link.width.current": ("", lambda v: (str(v.get("pcie_width", _NA)), "")),
    "pcie.link.width.max": ("", lambda v: (str(v.get("pcie_width", _NA)), "")),
    "vbios_version": ("", lambda v: (str(v.get("vbios_version", _NA)), "")),
    "persistence_mode": ("", lambda v: (_enabled(v.get("persistence_mode", True)), "")),
    "display_active": ("", lambda v: (_enabled(v.get("display_active", False)), "")),
    "display_mode": ("", lambda v: ("Requested functionality has been deprecated", "")),
    "compute_mode": ("", lambda v: (str(v.get("compute_mode", "Default")), "")),
    "compute_cap": ("", lambda v: (str(v.get("compute_cap", _NA)), "")),
    "pstate": ("", lambda v: (str(v.get("pstate", "P0")), "")),
    "fan.speed": ("%", lambda v: (_NA, "") if v.gpu.get("fan_speed") is None else (str(_int(v.gpu["fan_speed"])), "%")),
    "memory.total": ("MiB", lambda v: _mib(v.get("memory_total_mib", 0))),
    "memory.reserved": ("MiB", lambda v: _mib(v.get("memory_reserved_mib", 0))),
    "memory.used": ("MiB", _q_mem_used),
    "memory.free": ("MiB", _q_mem_free),
    "utilization.gpu": ("%", _q_util("utilization_gpu")),
    "utilization.memory": ("%", _q_util("utilization_memory")),
    "temperature.gpu": ("", lambda v: (str(_int(v.get("temperature_gpu", 0))), "")),
    "temperature.memory": ("", lambda v: (_NA, "") if v.gpu.get("temperature_memory") is None
                           else (str(_int(v.gpu["temperature_memory"])), "")),
    "power.draw": ("W", lambda v: _watts(v.get("power_draw_w", 0))),
    "power.draw.average": ("W", lambda v: _watts(v.get("power_draw_w", 0))),
    "power.draw.instant": ("W", lambda v: _watts(v.get("power_draw_w", 0))),
    "power.limit": ("W", lambda v: _watts(v.get("power_limit_w", 0))),
    "enforced.power.limit": ("W", lambda v: _watts(v.get("power_limit_w", 0))),
    "power.default_limit": ("W", lambda v: _watts(v.get("power_default_limit_w", v.get("power_limit_w", 0)))),
    "power.min_limit": ("W", lambda v: _watts(v.get("power_min_limit_w"))),
    "power.max_limit": ("W", lambda v: _watts(v.get("power_max_limit_w", v.get("power_limit_w", 0)))),
    "clocks.current.graphics": ("MHz", _q_clock("clocks", "graphics")),
    "clocks.current.sm": ("MHz", _q_clock("clocks", "sm")),
    "clocks.current.memory": ("MHz", _q_clock("clocks", "memory")),
    "clocks.current.video": ("MHz", _q_clock("clocks", "video")),
    "clocks.max.graphics": ("MHz", _q_clock("max_clocks", "graphics")),
    "clocks.max.sm": ("MHz", _q_clock("max_clocks", "sm")),
    "clocks.max.memory": ("MHz", _q_clock("max_clocks", "memory")),
    "ecc.mode.current": ("", lambda v: (_enabled(v.get("ecc_enabled", True)), "")),
    "ecc.mode.pending": ("", lambda v: (_enabled(v.get("ecc_enabled", True)), "")),
    "mig.mode.current": ("", _q_mig_mode("mig_mode")),
    "mig.mode.pending": ("", _q_mig_mode("mig_mode_pending")),
    "temperature.gpu.tlimit": ("", _q_tlimit),
    "clocks_event_reasons.active": ("", _q_event_mask),
    **{"clocks_event_reasons." + name: ("", _q_event_reason(bit)) for name, bit in _CLOCK_EVENT_REASONS},
}
_QUERY_ALIASES = {
    "gpu_name": "name",
    "gpu_serial": "serial",
    "gpu_uuid": "uuid",
    "gpu_bus_id": "pci.bus_id",
    "clocks.gr": "clocks.current.graphics",
    "clocks.sm": "clocks.current.sm",
    "clocks.mem": "clocks.current.memory",
    "clocks.video": "clocks.current.video",
    "clocks.max.gr": "clocks.max.graphics",
    "clocks.max.mem": "clocks.max.memory",
    # Driver 535 renamed the throttle reasons to clock event reasons.
    **{"clocks_throttle_reasons." + r: "clocks_event_reasons." + r
       for r in ("active",) + tuple(name for name, _bit in _CLOCK_EVENT_REASONS)},
}


def _query_timestamp(ts: float) -> str:
    t = time.localtime(ts)
    return (f"{t.tm_year}/{t.tm_mon:02}/{t.tm_mday:02} {t.tm_hour:02}:{t.tm_min:02}:{t.tm_sec:02}."
            f"{int((ts % 1) * 1000):03}")


class UsageError(Exception):
    """Bad command line: message to print, exit code."""

    def __init__(self, message: str, code: int = EXIT_INVALID_ARGUMENT):
        super().__init__(message)
        self.code = code


def parse_format(spec: str) -> tuple[bool, bool]:
    """``csv[,noheader][,nounits]`` → (header, units)."""
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts or parts[0] != "csv" or any(p not in ("noheader", "nounits") for p in parts[1:]):
        raise UsageError(f'"{spec}" is not a valid format. Valid formats are: csv, noheader, nounits.')
    return "noheader" not in parts, "nounits" not in parts


def render_query(state: dict, views: list[_View], fields: list[str], header: bool, units: bool) -> str:
    """``--query-gpu=<fields> --format=csv[,noheader][,nounits]``."""
    resolved = []
    for f in fields:
        key = _QUERY_ALIASES.get(f, f)
        if key not in _QUERY_FIELDS:
            raise UsageError(f'Field "{f}" is not a valid field to query.\n')
        resolved.append(key)
    lines = []
    if header:
        # An alias prints under its current name, as the real one does
        # (clocks.sm -> "clocks.current.sm [MHz]").
        cols = []
        for key in resolved:
            unit = _QUERY_FIELDS[key][0]
            cols.append(f"{key} [{unit}]" if unit and units else key)
        lines.append(", ".join(cols))
    now = _now(state)
    for v in views:
        values = []
        for key in resolved:
            if key == "timestamp":
                values.append(_query_timestamp(now))
                continue
            if key == "driver_version":
                values.append(str(state.get("driver_version", _NA)))
                continue
            if key == "count":
                values.append(str(len(views)))
                continue
            value, unit = _QUERY_FIELDS[key][1](v)
            values.append(f"{value} {unit}" if unit and units and value != _NA else value)
        lines.append(", ".join(values))
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# -q

_KEY_WIDTH = 55


class _Q:
    """Builds ``nvidia-smi -q`` lines: ``key : value`` with the colon at 55."""

    def __init__(self, sections: set | None):
        self.lines: list[str] = []
        self.sections = sections
        self.on = True

    def section(self, tag: str | None) -> None:
        # With -d only the named sections print; untagged parts are hidden.
        self.on = self.sections is None or tag in self.sections

    def kv(self, depth: int, key: str, value) -> None:
        if self.on:
            self.lines.append(("    " * depth + key).ljust(_KEY_WIDTH) + ": " + str(value))

    def head(self, depth: int, title: str) -> None:
        if self.on:
            self.lines.append("    " * depth + title)


def _na(value, unit: str = "") -> str:
    if value is None:
        return "N/A"
    return f"{value} {unit}".rstrip()


# The per-GPU part of the report is data: a tuple of rows, each
# ``(depth, label, value)``. ``value`` is None for a title line, a constant,
# or a function of a :class:`_QCtx`. Three kinds of marker rows steer the
# renderer (:func:`_q_rows`): :class:`_Section` starts a part that ``-d``
# shows or hides, :class:`_If` picks rows by a test, :class:`_Each` repeats
# rows for every item (MIG device, process), with ``ctx.item``/``ctx.n`` set.


class _QCtx:
    """What a value function sees: the state, the GPU, the current item."""

    __slots__ = ("state", "v", "g", "item", "n")

    def __init__(self, state: dict, v: _View, item=None, n: int = 0):
        self.state, self.v, self.g, self.item, self.n = state, v, v.gpu, item, n

    def bus(self) -> tuple[str, str, str, str]:
        """(bus id, domain, bus, device) of the GPU's PCI address."""
        bus = str(self.v.get("bus_id", "00000000:00:00.0"))
        domain, _, rest = bus.partition(":")
        bus_no, _, dev = rest.partition(":")
        return bus, domain, bus_no, dev.split(".")[0]


class _Section:
    """Rows from here on belong to a ``-d`` section (None: shown only without ``-d``)."""

    __slots__ = ("tag",)

    def __init__(self, tag: str | None):
        self.tag = tag


class _If:
    __slots__ = ("test", "rows", "orelse")

    def __init__(self, test, rows: tuple, orelse: tuple = ()):
        self.test, self.rows, self.orelse = test, rows, orelse


class _Each:
    __slots__ = ("items", "rows")

    def __init__(self, items, rows: tuple):
        self.items, self.rows = items, rows


def _q_rows(q: _Q, rows: tuple, ctx: _QCtx) -> None:
    """Render report rows (see above) into ``q``."""
    for row in rows:
        if isinstance(row, _Section):
            q.section(row.tag)
        elif isinstance(row, _If):
            _q_rows(q, row.rows if row.test(ctx) else row.orelse, ctx)
        elif isinstance(row, _Each):
            for n, item in enumerate(row.items(ctx)):
                _q_rows(q, row.rows, _QCtx(ctx.state, ctx.v, item, n))
        elif q.on:
            depth, label, value = row
            if value is None:
                q.head(depth, label)
            else:
                q.kv(depth, label, value(ctx) if callable(value) else value)


# Value functions and row makers used by the table.


def _gv(key: str, default="N/A"):
    """The GPU's ``key`` (``default`` when missing or null)."""
    return lambda c: c.v.get(key, default)


def _item_int(key: str):
    return lambda c: _int(c.item.get(key, 0))


def _item_mib(key: str):
    return lambda c: f"{_int(c.item.get(key, 0))} MiB"


def _item_free_mib(total: str, used: str):
    return lambda c: f"{max(_int(c.item.get(total, 0)) - _int(c.item.get(used, 0)), 0)} MiB"


def _gpu_mem_used(c: _QCtx) -> int:
    if c.v.mig_enabled:
        return sum(_int(m.get("memory_used_mib", 0)) for m in c.v.migs)
    return _int(c.v.get("memory_used_mib", 0))


def _gpu_mem_free(c: _QCtx) -> str:
    total, reserved = _int(c.v.get("memory_total_mib", 0)), _int(c.v.get("memory_reserved_mib", 0))
    return f"{max(total - reserved - _gpu_mem_used(c), 0)} MiB"


def _bar1_free(c: _QCtx) -> str:
    return f"{max(_int(c.v.get('bar1_total_mib', 0)) - _int(c.v.get('bar1_used_mib', 0)), 0)} MiB"


def _board_id(c: _QCtx) -> str:
    _, _, bus_no, dev_no = c.bus()
    return f"0x{(int(bus_no or '0', 16) << 8) | int(dev_no or '0', 16):x}"


def _tlimit(reading):
    """Driver 580 reports temperatures relative to the max operating one ("T.Limit")."""
    def get(c: _QCtx) -> str:
        limit, t = c.g.get("temperature_max_operating"), reading(c)
        return "N/A" if limit is None or t is None else f"{_int(limit) - _int(t)} C"
    return get


def _power(key: str, fallback: str | None = None, default=None):
    """``_watts`` of the GPU's ``key`` (else ``fallback``'s value, else ``default``) + " W"."""
    def get(c: _QCtx) -> str:
        dflt = c.v.get(fallback) if fallback else default
        return _watts(c.v.get(key, dflt))[0] + " W"
    return get


def _clock(group: str, key: str):
    return lambda c: _na((c.v.get(group) or {}).get(key), "MHz")


def _fabric(key: str):
    return lambda c: (c.v.get("fabric") or {}).get(key, "N/A")


def _q_processes(c: _QCtx) -> list:
    gis = {m.get("gi_id") for m in c.v.migs}
    return [p for p in (c.g.get("processes") or [])
            if not c.v.mig_enabled or p.get("gi_id") is None or p.get("gi_id") in gis]


def _mig_enabled(c: _QCtx) -> bool:
    return c.v.mig_enabled


def _fixed(depth: int, labels: tuple, value) -> tuple:
    """Rows that all print the same ``value``."""
    return tuple((depth, label, value) for label in labels)


_Q_MIG_DEVICE = (
    (2, "MIG Device", None),
    (3, "Index", lambda c: c.n),
    (3, "GPU Instance ID", _item_int("gi_id")),
    (3, "Compute Instance ID", _item_int("ci_id")),
    (3, "Device Attributes", None),
    (4, "Shared", None),
    (5, "Multiprocessor count", _item_int("sm")),
    (5, "Copy Engine count", _item_int("ce")),
    (5, "Encoder count", _item_int("enc")),
    (5, "Decoder count", _item_int("dec")),
    (5, "OFA count", _item_int("ofa")),
    (5, "JPG count", _item_int("jpg")),
    (3, "ECC Errors", None),
    (4, "Volatile", None),
    (5, "SRAM Uncorrectable", 0),
    (3, "FB Memory Usage", None),
    (4, "Total", _item_mib("memory_total_mib")),
    (4, "Reserved", "0 MiB"),
    (4, "Used", _item_mib("memory_used_mib")),
    (4, "Free", _item_free_mib("memory_total_mib", "memory_used_mib")),
    (3, "BAR1 Memory Usage", None),
    (4, "Total", _item_mib("bar1_total_mib")),
    (4, "Used", _item_mib("bar1_used_mib")),
    (4, "Free", _item_free_mib("bar1_total_mib", "bar1_used_mib")),
)

_Q_PROCESS = (
    (2, "GPU instance ID", lambda c: _na(c.item.get("gi_id"))),
    (2, "Compute instance ID", lambda c: _na(c.item.get("ci_id"))),
    (2, "Process ID", _item_int("pid")),
    (2, "Type", lambda c: c.item.get("type", "C")),
    (2, "Name", lambda c: c.item.get("name", "")),
    (2, "Used GPU Memory", _item_mib("used_memory_mib")),
)

_CLOCK_NAMES = (("graphics", "Graphics"), ("sm", "SM"), ("memory", "Memory"), ("video", "Video"))
_ENCODER_STATS = ((2, "Active Sessions", 0), (2, "Average FPS", 0), (2, "Average Latency", 0))
_ECC_COUNTERS = ("SRAM Correctable", "SRAM Uncorrectable Parity", "SRAM Uncorrectable SEC-DED",
                 "DRAM Correctable", "DRAM Uncorrectable")

#: ``nvidia-smi -q`` for one GPU, after its ``GPU <bus id>`` line.
_Q_REPORT = (
    _Section(None),
    (1, "Product Name", lambda c: c.g["name"]),
    (1, "Product Brand", _gv("brand", "NVIDIA")),
    (1, "Product Architecture", _gv("architecture")),
    (1, "Display Mode", "Requested functionality has been deprecated"),
    (1, "Display Attached", "No"),
    (1, "Display Active", lambda c: _enabled(c.v.get("display_active", False))),
    (1, "Persistence Mode", lambda c: _enabled(c.v.get("persistence_mode", True))),
    (1, "Addressing Mode", "None"),
    (1, "MIG Mode", None),
    (2, "Current", lambda c: c.g.get("mig_mode") or "N/A"),
    (2, "Pending", lambda c: c.g.get("mig_mode_pending") or c.g.get("mig_mode") or "N/A"),
    _If(_mig_enabled, (
        (1, "MIG Devices", None),
        _Each(lambda c: c.v.migs, _Q_MIG_DEVICE),
    )),
    (1, "Accounting Mode", "Disabled"),
    (1, "Accounting Mode Buffer Size", 4000),
    (1, "Driver Model", None),
    (2, "Current", "N/A"),
    (2, "Pending", "N/A"),
    (1, "Serial Number", _gv("serial")),
    (1, "GPU UUID", lambda c: c.g["uuid"]),
    (1, "GPU PDI", lambda c: c.v.get("pdi", "0x" + c.g["uuid"][4:12].lower().rjust(16, "0"))),
    (1, "Minor Number", lambda c: c.v.get("minor_number", c.v.index)),
    (1, "VBIOS Version", _gv("vbios_version")),
    (1, "MultiGPU Board", "No"),
    (1, "Board ID", _board_id),
    (1, "Board Part Number", _gv("board_part_number")),
    (1, "GPU Part Number", _gv("gpu_part_number")),
    (1, "FRU Part Number", "N/A"),
    (1, "Platform Info", None),
    *_fixed(2, ("Chassis Serial Number", "Slot Number", "Tray Index", "Host ID", "Peer Type"), "N/A"),
    (2, "Module Id", lambda c: _na(c.g.get("module_id"))),
    (2, "GPU Fabric GUID", "N/A"),
    (1, "Inforom Version", None),
    (2, "Image Version", _gv("inforom_image")),
    (2, "OEM Object", "2.1"),
    (2, "ECC Object", "7.16"),
    (2, "Power Management Object", "N/A"),
    (1, "Inforom BBX Object Flush", None),
    (2, "Latest Timestamp", "N/A"),
    (2, "Latest Duration", "N/A"),
    (1, "GPU Operation Mode", None),
    (2, "Current", "N/A"),
    (2, "Pending", "N/A"),
    (1, "GPU C2C Mode", "Disabled"),
    (1, "GPU Virtualization Mode", None),
    (2, "Virtualization Mode", "None"),
    (2, "Host VGPU Mode", "N/A"),
    (2, "vGPU Heterogeneous Mode", "N/A"),
    (1, "GPU Recovery Action", "None"),
    (1, "GSP Firmware Version", lambda c: c.state.get("driver_version", "N/A")),
    (1, "IBMNPU", None),
    (2, "Relaxed Ordering Mode", "N/A"),
    (1, "PCI", None),
    (2, "Bus", lambda c: f"0x{c.bus()[2].upper()}"),
    (2, "Device", lambda c: f"0x{c.bus()[3].upper()}"),
    (2, "Domain", lambda c: f"0x{c.bus()[1][-4:].upper()}"),
    (2, "Base Classcode", "0x3"),
    (2, "Sub Classcode", "0x2"),
    (2, "Device Id", _gv("pci_device_id")),
    (2, "Bus Id", lambda c: c.bus()[0]),
    (2, "Sub System Id", _gv("pci_subsystem_id")),
    (2, "GPU Link Info", None),
    (3, "PCIe Generation", None),
    *_fixed(4, ("Max", "Current", "Device Current", "Device Max"), _gv("pcie_gen")),
    (4, "Host Max", "N/A"),
    (3, "Link Width", None),
    *_fixed(4, ("Max", "Current"), lambda c: f"{c.v.get('pcie_width')}x" if c.v.get("pcie_width") else "N/A"),
    (2, "Bridge Chip", None),
    (3, "Type", "N/A"),
    (3, "Firmware", "N/A"),
    (2, "Replays Since Reset", 0),
    (2, "Replay Number Rollovers", 0),
    (2, "Tx Throughput", "0 KB/s"),
    (2, "Rx Throughput", "0 KB/s"),
    (2, "Atomic Caps Outbound", "N/A"),
    (2, "Atomic Caps Inbound", "N/A"),
    (1, "Fan Speed", lambda c: "N/A" if c.g.get("fan_speed") is None else f"{_int(c.g['fan_speed'])} %"),

    _Section("PERFORMANCE"),
    (1, "Performance State", _gv("pstate", "P0")),
    (1, "Clocks Event Reasons", None),
    (2, "Idle", lambda c: "Not Active" if _int(c.v.get("utilization_gpu", 0)) > 0 else "Active"),
    *_fixed(2, ("Applications Clocks Setting", "SW Power Cap", "HW Slowdown"), "Not Active"),
    *_fixed(3, ("HW Thermal Slowdown", "HW Power Brake Slowdown"), "Not Active"),
    *_fixed(2, ("Sync Boost", "SW Thermal Slowdown", "Display Clock Setting"), "Not Active"),
    (1, "Clocks Event Reasons Counters", None),
    *_fixed(2, ("SW Power Capping", "Sync Boost", "SW Thermal Slowdown", "HW Thermal Slowdown",
                "HW Power Braking"), "0 us"),
    _Section(None),
    (1, "Sparse Operation Mode", "Disabled"),

    _Section("MEMORY"),
    (1, "FB Memory Usage", None),
    (2, "Total", lambda c: f"{_int(c.v.get('memory_total_mib', 0))} MiB"),
    (2, "Reserved", lambda c: f"{_int(c.v.get('memory_reserved_mib', 0))} MiB"),
    (2, "Used", lambda c: f"{_gpu_mem_used(c)} MiB"),
    (2, "Free", _gpu_mem_free),
    (1, "BAR1 Memory Usage", None),
    (2, "Total", lambda c: f"{_int(c.v.get('bar1_total_mib', 0))} MiB"),
    (2, "Used", lambda c: f"{_int(c.v.get('bar1_used_mib', 0))} MiB"),
    (2, "Free", _bar1_free),
    (1, "Conf Compute Protected Memory Usage", None),
    *_fixed(2, ("Total", "Used", "Free"), "0 MiB"),

    _Section("COMPUTE"),
    (1, "Compute Mode", _gv("compute_mode", "Default")),

    _Section("UTILIZATION"),
    (1, "Utilization", None),
    _If(_mig_enabled, _fixed(2, ("GPU", "Memory", "Encoder", "Decoder", "JPEG", "OFA"), "N/A"), (
        (2, "GPU", lambda c: f"{_int(c.v.get('utilization_gpu', 0))} %"),
        (2, "Memory", lambda c: f"{_int(c.v.get('utilization_memory', 0))} %"),
        *_fixed(2, ("Encoder", "Decoder", "JPEG", "OFA"), "0 %"),
    )),
    (1, "Encoder Stats", None),
    *_ENCODER_STATS,
    (1, "FBC Stats", None),
    *_ENCODER_STATS,
    _Section(None),
    (1, "DRAM Encryption Mode", None),
    (2, "Current", "N/A"),
    (2, "Pending", "N/A"),

    _Section("ECC"),
    (1, "ECC Mode", None),
    *_fixed(2, ("Current", "Pending"), lambda c: _enabled(c.v.get("ecc_enabled", True))),
    (1, "ECC Errors", None),
    (2, "Volatile", None),
    *_fixed(3, _ECC_COUNTERS, 0),
    (2, "Aggregate", None),
    *_fixed(3, _ECC_COUNTERS, 0),
    (3, "SRAM Threshold Exceeded", "No"),
    (2, "Aggregate Uncorrectable SRAM Sources", None),
    *_fixed(3, ("SRAM L2", "SRAM SM", "SRAM Microcontroller", "SRAM PCIE", "SRAM Other"), 0),
    *_fixed(2, ("Channel Repair Pending", "TPC Repair Pending", "Unrepairable Memory"), "No"),

    _Section("PAGE_RETIREMENT"),
    (1, "Retired Pages", None),
    *_fixed(2, ("Single Bit ECC", "Double Bit ECC", "Pending Page Blacklist"), "N/A"),
    (1, "Remapped Rows", None),
    *_fixed(2, ("Correctable Error", "Inactive Correctable Error", "Uncorrectable Error",
                "Inactive Uncorrectable Error"), 0),
    (2, "Pending", "No"),
    (2, "Remapping Failure Occurred", "No"),
    (2, "Bank Remap Availability Histogram", None),
    (3, "Max", "3072 bank(s)"),
    *_fixed(3, ("High", "Partial", "Low", "None"), "0 bank(s)"),

    _Section("TEMPERATURE"),
    (1, "Temperature", None),
    (2, "GPU Current Temp", lambda c: f"{_int(c.v.get('temperature_gpu', 0))} C"),
    # Headroom now, and where shutdown/slowdown sit below the max operating temperature.
    (2, "GPU T.Limit Temp", _tlimit(lambda c: _int(c.v.get("temperature_gpu", 0)))),
    (2, "GPU Shutdown T.Limit Temp", _tlimit(lambda c: c.g.get("temperature_shutdown"))),
    (2, "GPU Slowdown T.Limit Temp", _tlimit(lambda c: c.g.get("temperature_slowdown"))),
    (2, "GPU Max Operating T.Limit Temp", _tlimit(lambda c: c.g.get("temperature_max_operating"))),
    (2, "GPU Target Temperature", "N/A"),
    (2, "Memory Current Temp", lambda c: _na(c.g.get("temperature_memory"), "C")),
    (2, "Memory Max Operating T.Limit Temp", lambda c: "N/A" if c.g.get("temperature_memory") is None else "0 C"),

    _Section("POWER"),
    (1, "GPU Power Readings", None),
    *_fixed(2, ("Average Power Draw", "Instantaneous Power Draw"),
            lambda c: f"{float(c.v.get('power_draw_w', 0)):.2f} W"),
    *_fixed(2, ("Current Power Limit", "Requested Power Limit"), _power("power_limit_w")),
    (2, "Default Power Limit", _power("power_default_limit_w", fallback="power_limit_w")),
    (2, "Min Power Limit", _power("power_min_limit_w", default=0)),
    (2, "Max Power Limit", _power("power_max_limit_w", fallback="power_limit_w")),
    (1, "GPU Memory Power Readings ", None),  # sic: the real tool prints a trailing blank
    *_fixed(2, ("Average Power Draw", "Instantaneous Power Draw"), "N/A"),
    (1, "Module Power Readings", None),
    *_fixed(2, ("Average Power Draw", "Instantaneous Power Draw", "Current Power Limit", "Requested Power Limit",
                "Default Power Limit", "Min Power Limit", "Max Power Limit"), "N/A"),
    (1, "Power Smoothing", "N/A"),
    (1, "Workload Power Profiles", None),
    (2, "Requested Profiles", "N/A"),
    (2, "Enforced Profiles", "N/A"),

    _Section("CLOCK"),
    (1, "Clocks", None),
    *((2, name, _clock("clocks", key)) for key, name in _CLOCK_NAMES),
    *(row for title in ("Applications Clocks", "Default Applications Clocks") for row in (
        (1, title, None),
        (2, "Graphics", _clock("max_clocks", "graphics")),
        (2, "Memory", _clock("max_clocks", "memory")),
    )),
    (1, "Deferred Clocks", None),
    (2, "Memory", "N/A"),
    (1, "Max Clocks", None),
    *((2, name, _clock("max_clocks", key)) for key, name in _CLOCK_NAMES),
    (1, "Max Customer Boost Clocks", None),
    (2, "Graphics", _clock("max_clocks", "graphics")),
    (1, "Clock Policy", None),
    (2, "Auto Boost", "N/A"),
    (2, "Auto Boost Default", "N/A"),

    _Section(None),
    (1, "Fabric", None),
    (2, "State", _fabric("state")),
    (2, "Status", _fabric("status")),
    (2, "CliqueId", _fabric("clique_id")),
    (2, "ClusterUUID", _fabric("cluster_uuid")),
    (2, "Health", None),
    *_fixed(3, ("Summary", "Bandwidth", "Route Recovery in progress", "Route Unhealthy",
                "Access Timeout Recovery", "Incorrect Configuration", "Partition Assigned"), "N/A"),

    _Section("PIDS"),
    _If(_q_processes, (
        (1, "Processes", None),
        _Each(_q_processes, _Q_PROCESS),
    ), (
        (1, "Processes", "None"),
    )),
    _Section(None),
    (1, "Capabilities", None),
    (2, "EGM", "disabled"),
)


def _q_gpu(q: _Q, state: dict, v: _View) -> None:
    q.lines.append(f"GPU {v.get('bus_id', '00000000:00:00.0')}")
    _q_rows(q, _Q_REPORT, _QCtx(state, v))


_DISPLAY_SECTIONS = {
    "MEMORY", "UTILIZATION", "ECC", "TEMPERATURE", "POWER", "CLOCK", "COMPUTE", "PIDS", "PERFORMANCE",
    "PAGE_RETIREMENT",
}


def render_q(state: dict, views: list[_View], sections: set | None = None) -> str:
    """``nvidia-smi -q`` (optionally ``-d SECTION[,SECTION]``)."""
    q = _Q(sections)
    q.lines += [
        "",
        "==============NVSMI LOG==============",
        "",
    ]
    q.kv(0, "Timestamp", _ctime(_now(state)))
    q.kv(0, "Driver Version", state.get("driver_version", "N/A"))
    q.kv(0, "CUDA Version", state.get("cuda_version", "N/A"))
    q.lines.append("")
    q.kv(0, "Attached GPUs", len(views))
    for i, v in enumerate(views):
        if i:
            q.lines.append("")
        _q_gpu(q, state, v)
    q.lines.append("")
    return "\n".join(q.lines) + "\n"


# --------------------------------------------------------------------------
# mig -lgip


def _free_instances(profile: dict, v: _View) -> int:
    """How many more instances of ``profile`` fit next to the existing ones."""
    # The GPU's slices (8 memory / 7 compute on an A100/H100/H200, 4 / 4 on an A30).
    memory_slices = _int(v.gpu.get("mig_memory_slices", 8), 8)
    compute_slices = _int(v.gpu.get("mig_compute_slices", 7), 7)
    used = [False] * memory_slices
    compute = 0
    same = 0
    for m in v.gpu.get("mig_devices") or []:  # occupancy is physical: all devices
        start, size = _int(m.get("start", 0)), _int(m.get("mem_slices", 1))
        for i in range(start, min(start + size, memory_slices)):
            used[i] = True
        compute += _int(str(m.get("profile", "0g"))[0], 0)
        same += m.get("profile") == profile.get("name")
    size = _int(profile.get("mem_slices", 1), 1)
    free = 0
    for start in profile.get("placements") or []:
        span = range(start, start + size)
        if same + free >= _int(profile.get("instances", 0)) or compute + _int(profile.get("g", 1)) > compute_slices:
            break
        if all(not used[i] for i in span if i < memory_slices):
            for i in span:
                used[i] = True
            compute += _int(profile.get("g", 1))
            free += 1
    return free


def render_lgip(views: list[_View]) -> str:
    lines = [
        "+" + "-" * 79 + "+",
        "| GPU instance profiles:".ljust(80) + "|",
        "| GPU   Name               ID    Instances   Memory     P2P    SM    DEC   ENC  |",
        "|                                Free/Total   GiB              CE    JPEG  OFA  |",
        "|" + "=" * 79 + "|",
    ]
    for v in views:
        for p in v.gpu.get("mig_profiles") or []:
            total = _int(p.get("instances", 0))
            free = _free_instances(p, v) if v.mig_enabled else total
            gib = f"{_int(p.get('memory_mib', 0)) / 1024:.2f}"
            lines.append(
                "|" + f"{v.index:>4}" + "  MIG " + f"{p.get('name', ''):<15}" + f"{_int(p.get('id', 0)):>3}"
                + " " * 5 + f"{free}/{total}".ljust(11) + gib.ljust(11) + "No".ljust(7)
                + f"{_int(p.get('sm', 0)):<6}" + f"{_int(p.get('dec', 0)):>2}" + " " * 4
                + f"{_int(p.get('enc', 0)):>2}" + " " * 3 + "|"
            )
            lines.append(
                "|" + " " * 62 + f"{_int(p.get('ce', 0)):>2}" + " " * 4 + f"{_int(p.get('jpeg', 0)):>2}"
                + " " * 4 + f"{_int(p.get('ofa', 0)):>2}" + " " * 3 + "|"
            )
            lines.append("+" + "-" * 79 + "+")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# topo -m

_TOPO_LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""

# NVLinks per GPU of an SXM board (HGX: every pair of GPUs reaches each
# other over all of them, through the NVSwitches).
_NVLINKS = {"Hopper": 18, "Ampere": 12}


def _cpu_list(cpus) -> str:
    """``0-15,32-47``: CPU numbers as ranges, the way nvidia-smi prints them."""
    cpus = sorted(set(cpus))
    parts, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        parts.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(parts)


def _host_cpus() -> str:
    # A simulated node is one NUMA node: each GPU is close to all its CPUs.
    return _cpu_list(range(os.cpu_count() or 1))


def _topo_link(a: _View, b: _View) -> str:
    """How GPU ``a`` reaches GPU ``b``."""
    links = a.gpu.get("nvlinks", _NVLINKS.get(a.gpu.get("architecture")) if a.gpu.get("module_id") else None)
    if links and (b.gpu.get("nvlinks") or b.gpu.get("module_id")):
        return f"NV{_int(links)}"
    return "NODE"  # PCIe cards: different host bridges of the one NUMA node (approximation)


def render_topo(views: list[_View]) -> str:
    """``nvidia-smi topo -m``: tab separated, the header underlined (ANSI), then the legend.

    CPU and NUMA affinity come from a GPU's optional ``cpu_affinity`` and
    ``numa_affinity`` state fields, else all CPUs of this machine and node 0.
    """
    cols = [f"GPU{v.index}" for v in views] + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]
    lines = ["\t\x1b[4m" + "\t".join(cols) + "\x1b[0m"]
    for v in views:
        cells = [f"GPU{v.index}"] + [" X " if w is v else _topo_link(v, w) for w in views]
        # GPU NUMA ID is only set where GPU memory is a NUMA node (Grace Hopper); never here.
        cells += [str(v.get("cpu_affinity") or _host_cpus()), str(v.get("numa_affinity", 0)), "", "N/A"]
        lines.append("\t".join(cells))
    return "\n".join(lines) + "\n" + _TOPO_LEGEND


# --------------------------------------------------------------------------
# CLI

HELP = """NVIDIA System Management Interface -- v{version}

gpulab simulation: prints the simulated GPUs of this node, as the real
nvidia-smi would. Supported options:

    nvidia-smi                      table of GPUs, MIG devices and processes
    -h,   --help                    this help
          --version                 driver, NVML and CUDA versions
    -L,   --list-gpus               one line per GPU (and MIG device)
    -q,   --query                   detailed report
    -d,   --display=                with -q: MEMORY, UTILIZATION, ECC, TEMPERATURE,
                                    POWER, CLOCK, COMPUTE, PIDS, PERFORMANCE
    -i,   --id=                     only this GPU (index, UUID or PCI bus id)
    -l,   --loop=SEC                repeat every SEC seconds (Ctrl+C stops)
          --query-gpu=FIELDS        comma list, e.g. name,memory.total,utilization.gpu
          --format=csv[,noheader][,nounits]   (csv when left out)
    mig -lgip                       GPU instance profiles
    topo -m                         GPU interconnect matrix and CPU/NUMA affinity
"""


def _version_text(state: dict) -> str:
    driver = str(state.get("driver_version", "N/A"))
    nvml = ".".join(driver.split(".")[:2])
    return (f"NVIDIA-SMI version  : {driver}\n"
            f"NVML version        : {nvml}\n"
            f"DRIVER version      : {driver}\n"
            f"CUDA Version        : {state.get('cuda_version', 'N/A')}\n")


class _Args:
    __slots__ = ("mode", "query_fields", "fmt", "ids", "loop", "display")

    def __init__(self):
        self.mode = "table"
        self.query_fields: list[str] | None = None
        self.fmt: str | None = None
        self.ids: list[str] | None = None
        self.loop: float | None = None
        self.display: set | None = None


def _parse_args(argv: list[str]) -> _Args:
    args = _Args()
    i = 0

    def value_of(inline: str | None) -> str:
        nonlocal i
        if inline is not None:
            return inline
        i += 1
        if i >= len(argv):
            raise UsageError(MSG_INVALID_ARGS)
        return argv[i]

    if argv[:1] == ["topo"]:
        if argv[1:] in (["-m"], ["--matrix"]):
            args.mode = "topo"
            return args
        raise UsageError(MSG_INVALID_ARGS)
    if argv[:1] == ["mig"]:
        rest = argv[1:]
        if rest in (["-lgip"], ["--list-gpu-instance-profiles"]):
            args.mode = "lgip"
            return args
        if rest and rest[0] in ("-i", "--id") and len(rest) == 3 and rest[2] == "-lgip":
            args.mode, args.ids = "lgip", rest[1].split(",")
            return args
        raise UsageError(MSG_INVALID_ARGS)
    while i < len(argv):
        arg = argv[i]
        name, eq, inline = arg.partition("=")
        inline_value = inline if eq else None
        if arg in ("-h", "--help"):
            args.mode = "help"
        elif arg == "--version":
            args.mode = "version"
        elif arg in ("-L", "--list-gpus"):
            args.mode = "list"
        elif arg in ("-q", "--query"):
            args.mode = "q"
        elif name in ("-d", "--display"):
            args.display = {s.strip().upper() for s in value_of(inline_value).split(",") if s.strip()}
            unknown = args.display - _DISPLAY_SECTIONS
            if unknown:
                raise UsageError(MSG_INVALID_ARGS)
        elif name in ("-i", "--id"):
            args.ids = [s.strip() for s in value_of(inline_value).split(",") if s.strip()]
        elif name in ("-l", "--loop"):
            raw = value_of(inline_value)
            try:
                args.loop = float(raw)
            except ValueError:
                raise UsageError(MSG_INVALID_ARGS) from None
            if args.loop <= 0:
                raise UsageError(MSG_INVALID_ARGS)
        elif name == "--query-gpu":
            args.query_fields = [f.strip() for f in value_of(inline_value).split(",") if f.strip()]
            args.mode = "query"
        elif name == "--format":
            args.fmt = value_of(inline_value)
        else:
            raise UsageError(MSG_INVALID_ARGS)
        i += 1
    if args.mode == "query" and not args.fmt:
        args.fmt = "csv"  # the real 580 prints CSV when --format is left out
    if args.mode == "list" and args.ids is not None:
        raise UsageError(MSG_OPTION_NOT_VALID.format(option="-i"))
    if args.fmt and args.mode != "query":
        raise UsageError(MSG_INVALID_ARGS)
    if args.display is not None and args.mode != "q":
        raise UsageError(MSG_INVALID_ARGS)
    return args


def _filter_ids(views: list[_View], ids: list[str] | None) -> list[_View]:
    if not ids:
        return views
    out = []
    for v in views:
        bus = str(v.get("bus_id", "")).upper()
        for want in ids:
            w = want.upper()
            if w == str(v.index) or want == v.gpu.get("uuid") or w == bus or (len(w) >= 7 and bus.endswith(w)):
                out.append(v)
                break
    return out


def _load(env) -> tuple[dict | None, str | None]:
    """(state, problem message for stderr)."""
    path = env.get(STATE_ENV)
    if not path:
        return None, None
    try:
        return read_state(path), None
    except FileNotFoundError:
        return None, None
    except (OSError, StateError) as exc:
        return None, f"gpulab: cannot read {STATE_ENV} state file: {exc}"


def run(argv: list[str], env=None, out=None, err=None) -> int:
    """Run once; returns the exit code. ``env``/``out``/``err`` for tests."""
    env = os.environ if env is None else env
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    try:
        args = _parse_args(list(argv))
    except UsageError as exc:
        out.write(str(exc).rstrip("\n") + "\n")
        return exc.code

    state, problem = _load(env)
    if problem:
        err.write(problem + "\n")
        return EXIT_UNKNOWN
    if args.mode == "help":
        out.write(HELP.format(version=(state or {}).get("driver_version", "N/A")))
        return EXIT_OK

    while True:
        status, views = select_visible(state, env.get(VISIBLE_ENV))
        if status == NO_DRIVER:
            out.write(MSG_NO_DRIVER + "\n")
            return EXIT_DRIVER_NOT_LOADED
        if args.mode == "version":
            out.write(_version_text(state))
            return EXIT_OK
        if status == NO_DEVICES:
            out.write(MSG_NO_DEVICES + "\n")
            return EXIT_NOT_FOUND
        views = _filter_ids(views, args.ids)
        if not views:
            out.write(MSG_NO_DEVICES + "\n")
            return EXIT_NOT_FOUND
        try:
            if args.mode == "list":
                out.write(render_list(views))
            elif args.mode == "q":
                out.write(render_q(state, views, args.display))
            elif args.mode == "lgip":
                mig_views = [v for v in views if v.gpu.get("mig_profiles")]
                if not mig_views:
                    out.write(MSG_NO_MIG + "\n")
                    return EXIT_NOT_FOUND
                out.write(render_lgip(mig_views))
            elif args.mode == "topo":
                out.write(render_topo(views))
            elif args.mode == "query":
                header, units = parse_format(args.fmt)
                out.write(render_query(state, views, args.query_fields or [], header, units))
            else:
                out.write(render_table(state, views))
        except UsageError as exc:
            out.write(str(exc).rstrip("\n") + "\n\n")
            return exc.code
        if args.loop is None:
            return EXIT_OK
        out.flush()
        try:
            time.sleep(args.loop)
        except KeyboardInterrupt:
            return EXIT_OK
        state, problem = _load(env)  # pick up utilisation changes between frames
        if problem:
            err.write(problem + "\n")
            return EXIT_UNKNOWN


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``main(sys.argv[1:])``."""
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:
        return EXIT_OK
    except BrokenPipeError:  # nvidia-smi | head
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
