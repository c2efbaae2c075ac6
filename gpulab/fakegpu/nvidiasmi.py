"""A fake ``nvidia-smi`` that prints what the real one prints.

Runs inside simulated pods, so it is standard library only and imports
nothing from gpulab: ``python3 -m gpulab.fakegpu.nvidiasmi`` and
``python3 /path/to/nvidiasmi.py`` both work with any Python 3.9+.

What it answers, in the formats, messages and exit statuses of the real
580 driver (tests/fixtures/nvidia-h200 and nvidia-h100 hold real output):

- ``nvidia-smi`` (the table), ``-L``, ``--version``, ``-h``; ``-i`` (index,
  UUID, bus id) and ``-l SEC`` where the real tool takes them;
- ``-q`` with ``-d`` sections, and ``-x -q``: both rendered from one row
  table (``_Q_REPORT``), -q's label and XML's tag on each row;
- ``--query-gpu``, ``--query-compute-apps``, ``--query-retired-pages``,
  ``--query-remapped-rows`` with ``--format=csv[,noheader][,nounits]``
  (CSV without it); old field names print under their current ones;
  ``--help-query-gpu`` and ``--help-query-compute-apps`` list the fields;
- ``dmon`` and ``pmon`` (``-i -d -c -s -o``), ``nvlink -s``/``-c`` (``-i
  -l``), ``topo -m``, ``mig -lgip``, each with ``-h``;
- refused combinations (``-L`` with another option, ``-x`` with ``-d``, an
  unknown ``-d`` section, field or format modifier, ``topo -m -i``) as the
  real tool refuses them. Help texts are the fake's own words.

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
        "memory_power_draw_w": 43.02 | null,  # -q's GPU Memory Power Readings (N/A when null)
        "pstate": "P0", "fan_speed": null, "persistence_mode": true,
        "display_active": false, "display_attached": false, "ecc_enabled": true,
        "compute_mode": "Default", "virtualization_mode": "None",   # "Pass-Through" in a VM
        "board_part_number": "…", "gpu_part_number": "…", "inforom_image": "…",  # N/A when missing
        "clocks": {"graphics": 405, "sm": 405, "memory": 3201, "video": 765},
        "max_clocks": {"graphics": 1980, "sm": 1980, "memory": 3201, "video": 1545},
        "min_graphics_clock_mhz": 405,        # -x -q's supported clocks: every 15 MHz from the max
                                              # graphics clock down to this (default: the current one)
        "supported_memory_clocks": [3201],    # default: the max memory clock
        "row_remapper_banks": 3072,           # -q's Bank Remap Availability Histogram Max
        "fabric": {"state": "N/A", "status": "N/A"},
        "cpu_affinity": "0-15", "numa_affinity": 0,   # optional, for topo -m: default all CPUs
                                              # of the machine nvidia-smi runs on, node 0
        "nvlinks": 18,                        # optional: NVLinks to each other GPU (topo -m NV18,
                                              # nvlink -s); default 18 Hopper / 12 Ampere if module_id
                                              # set, else PCIe; 0: none visible (a VM)
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
                       "used_memory_mib": 1024, "gi_id": null, "ci_id": null,
                       "utilization": 80}]   # optional, percent of the GPU (pmon's sm): default
                                             # the GPU's utilization split evenly
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
MSG_OPTION_NOT_VALID = "ERROR: Option {option} is not valid for this command. Please run 'nvidia-smi -h' for help.\n"
MSG_D_WITH_X = ("Invalid combination of input arguments: --display/-d flags can not be combined with "
                "-x/--xml-format flags.")
MSG_BAD_DISPLAY = "Failed to parse --display/-d flags"
MSG_FORMAT = "Format modifier is not recognized."
MSG_BAD_FIELD = 'Field "{field}" is not a valid field to query.\n'
MSG_TOPO_ID = "The -i command line argument must be used in conjunction with -n or -p.\n"

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


def _visible_processes(v: _View) -> list:
    """The GPU's processes this container can see (under MIG, those in its MIG devices)."""
    gis = {m.get("gi_id") for m in v.migs}
    return [p for p in v.gpu.get("processes") or []
            if not v.mig_enabled or p.get("gi_id") is None or p.get("gi_id") in gis]


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
        for p in _visible_processes(v):
            gi, ci = p.get("gi_id"), p.get("ci_id")
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
# Selective queries: --query-gpu, --query-compute-apps, --query-retired-pages,
# --query-remapped-rows (CSV), and their --help-query-* texts

_NA = "[N/A]"


def _mib(value) -> tuple[str, str]:
    return (str(_int(value)), "MiB") if value is not None else (_NA, "")


def _watts(value) -> tuple[str, str]:
    return (f"{float(value):.2f}", "W") if value is not None else (_NA, "")


def _mhz(value) -> tuple[str, str]:
    return (str(_int(value)), "MHz") if value is not None else (_NA, "")


def _enabled(flag) -> str:
    return "Enabled" if flag else "Disabled"


def _q_const(text: str):
    return lambda v: (text, "")


def _q_gv(key: str, default=_NA):
    """The GPU's ``key`` as is (``[N/A]`` when missing or null)."""
    return lambda v: (str(v.get(key, default)), "")


def _q_mem_used(v: _View) -> tuple[str, str]:
    return (_NA, "") if v.mig_enabled else _mib(v.get("memory_used_mib", 0))


def _q_mem_free(v: _View) -> tuple[str, str]:
    if v.mig_enabled:
        return _NA, ""
    free = _int(v.get("memory_total_mib", 0)) - _int(v.get("memory_reserved_mib", 0)) - _int(v.get("memory_used_mib", 0))
    return _mib(max(free, 0))


def _q_util(key: str | None):
    """A utilisation in percent (None: an engine the fake never uses, 0 %); N/A under MIG."""
    def get(v: _View) -> tuple[str, str]:
        if v.mig_enabled:
            return _NA, ""
        return str(_int(v.get(key, 0)) if key else 0), "%"
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


def _q_ecc_count(v: _View) -> tuple[str, str]:
    """An ECC error counter: the fake's memory never errs; N/A with ECC off."""
    return ("0", "") if v.get("ecc_enabled", True) else (_NA, "")


def _q_fabric(key: str):
    return lambda v: (str((v.get("fabric") or {}).get(key) or "N/A").replace("N/A", _NA), "")


# Clock event reasons (NVML's nvmlClocksEventReason* bits) the fake can show.
# Only "gpu_idle" is ever active: an idle GPU (utilisation 0) drops its clocks.
_CLOCK_EVENT_REASONS = (
    ("gpu_idle", 0x1, "the GPU is idle and runs at low clocks"),
    ("applications_clocks_setting", 0x2, "the applications clocks setting holds the clocks down"),
    ("sw_power_cap", 0x4, "the power draw reached the power limit"),
    ("hw_slowdown", 0x8, "a hardware slowdown (thermal or power brake) holds the clocks down"),
    ("sync_boost", 0x10, "the GPU follows the clocks of its sync boost group"),
    ("sw_thermal_slowdown", 0x20, "the GPU or its memory is too hot"),
    ("hw_thermal_slowdown", 0x40, "the hardware slows down because it is too hot"),
    ("hw_power_brake_slowdown", 0x80, "an external power brake signal slows the GPU down"),
)


def _event_mask(v: _View) -> int:
    return 0 if _int(v.get("utilization_gpu", 0)) > 0 else 0x1


def _q_event_mask(v: _View) -> tuple[str, str]:
    return f"0x{_event_mask(v):016X}", ""


def _q_event_reason(bit: int):
    return lambda v: ("Active" if _event_mask(v) & bit else "Not Active", "")


def _fields(*entries) -> tuple[dict, dict]:
    """``(name, aliases, unit, getter, description)`` rows -> (fields, aliases).

    ``fields`` maps a name to ``(unit, getter, description)``; a getter gets
    what the query's rows are (a :class:`_View` for ``--query-gpu``, else a
    :class:`_QCtx` with the item) and returns ``(value, unit)``. A None getter
    is a value of the whole run (:data:`_RUN_VALUES`). ``aliases`` maps an
    old name to its current one, the name the header prints.
    """
    fields, aliases = {}, {}
    for name, names, unit, getter, doc in entries:
        fields[name] = (unit, getter, doc)
        aliases.update((alias, name) for alias in names)
    return fields, aliases


_ECC_WHERE = (("device_memory", "device memory"), ("dram", "DRAM"), ("sram", "SRAM"), ("total", "all memories"))
_ECC_SRAM_SOURCES = (("l2", "the L2 cache"), ("sm", "the SMs"), ("mcu", "microcontrollers"), ("pcie", "the PCIe unit"),
                     ("other", "other units"))

#: ``--query-gpu``: one row per GPU.
_GPU_FIELDS = _fields(
    ("timestamp", (), "", None, "When nvidia-smi ran, as YYYY/MM/DD HH:MM:SS.msec."),
    ("driver_version", (), "", None, "Version of the NVIDIA driver."),
    ("count", (), "", None, "How many GPUs this nvidia-smi sees."),
    ("name", ("gpu_name",), "", lambda v: (str(v.gpu["name"]), ""), "Product name."),
    ("serial", ("gpu_serial",), "", _q_gv("serial"), "Serial number of the board."),
    ("uuid", ("gpu_uuid",), "", lambda v: (str(v.gpu["uuid"]), ""), "UUID of the GPU (GPU-...)."),
    ("pci.bus_id", ("gpu_bus_id",), "", _q_gv("bus_id"), "PCI address, domain:bus:device.function in hex."),
    ("pci.domain", (), "", _q_pci_part(0), "PCI domain, in hex."),
    ("pci.bus", (), "", _q_pci_part(1), "PCI bus, in hex."),
    ("pci.device", (), "", _q_pci_part(2), "PCI device, in hex."),
    ("pci.device_id", (), "", _q_gv("pci_device_id"), "PCI device and vendor id, in hex."),
    ("pci.sub_device_id", (), "", _q_gv("pci_subsystem_id"), "PCI subsystem id, in hex."),
    ("pcie.link.gen.current", (), "", _q_gv("pcie_gen"), "PCIe generation the link runs at now (old name)."),
    ("pcie.link.gen.gpucurrent", (), "", _q_gv("pcie_gen"), "PCIe generation the link runs at now."),
    ("pcie.link.gen.max", (), "", _q_gv("pcie_gen"), "Highest PCIe generation of GPU and slot together."),
    ("pcie.link.gen.gpumax", (), "", _q_gv("pcie_gen"), "Highest PCIe generation of the GPU."),
    ("pcie.link.gen.hostmax", (), "", _q_const(_NA), "Highest PCIe generation of the slot."),
    ("pcie.link.width.current", (), "", _q_gv("pcie_width"), "PCIe lanes in use now."),
    ("pcie.link.width.max", (), "", _q_gv("pcie_width"), "Most PCIe lanes of GPU and slot together."),
    ("index", (), "", lambda v: (str(v.index), ""), "Index of the GPU, from 0, as this nvidia-smi numbers them."),
    ("display_mode", (), "", _q_const("Requested functionality has been deprecated"), "Deprecated."),
    ("display_attached", (), "", lambda v: ("Yes" if v.get("display_attached", False) else "No", ""),
     "Whether a monitor is plugged in: Yes or No."),
    ("display_active", (), "", lambda v: (_enabled(v.get("display_active", False)), ""),
     "Whether a display is set up on the GPU: Enabled or Disabled."),
    ("persistence_mode", (), "", lambda v: (_enabled(v.get("persistence_mode", True)), ""),
     "Whether the driver stays loaded without clients: Enabled or Disabled."),
    ("addressing_mode", (), "", _q_const("None"), "How the GPU reaches system memory: HMM, ATS or None."),
    ("accounting.mode", (), "", _q_const("Disabled"), "Whether per-process accounting is on."),
    ("accounting.buffer_size", (), "", _q_const("4000"), "How many processes the accounting buffer keeps."),
    ("driver_model.current", (), "", _q_const(_NA), "Windows driver model in use (N/A on Linux)."),
    ("driver_model.pending", (), "", _q_const(_NA), "Windows driver model after the next reboot (N/A on Linux)."),
    ("vbios_version", (), "", _q_gv("vbios_version"), "Version of the video BIOS."),
    ("inforom.img", ("inforom.image",), "", _q_gv("inforom_image"), "Version of the inforom image."),
    ("inforom.oem", (), "", _q_const("2.1"), "Version of the inforom's OEM object."),
    ("inforom.ecc", (), "", _q_const("7.16"), "Version of the inforom's ECC object."),
    ("inforom.pwr", ("inforom.power",), "", _q_const(_NA), "Version of the inforom's power object."),
    ("gpu_recovery_action", (), "", _q_const("None"), "What the GPU needs to recover from an error, or None."),
    ("gom.current", ("gpu_operation_mode.current",), "", _q_const(_NA), "GPU operation mode now."),
    ("gom.pending", ("gpu_operation_mode.pending",), "", _q_const(_NA), "GPU operation mode after the next reboot."),
    ("fan.speed", (), "%", lambda v: (_NA, "") if v.gpu.get("fan_speed") is None else (str(_int(v.gpu["fan_speed"])), "%"),
     "Fan speed in percent (N/A for passively cooled boards)."),
    ("pstate", (), "", _q_gv("pstate", "P0"), "Performance state, P0 (fastest) to P12."),
    ("clocks_event_reasons.active", ("clocks_throttle_reasons.active",), "", _q_event_mask,
     "Bit mask of the reasons that hold the clocks down now."),
    *((f"clocks_event_reasons.{name}", (f"clocks_throttle_reasons.{name}",), "", _q_event_reason(bit),
       f"Active when {doc}.") for name, bit, doc in _CLOCK_EVENT_REASONS),
    ("memory.total", (), "MiB", lambda v: _mib(v.get("memory_total_mib", 0)), "Memory of the GPU."),
    ("memory.reserved", (), "MiB", lambda v: _mib(v.get("memory_reserved_mib", 0)), "Memory the driver keeps for itself."),
    ("memory.used", (), "MiB", _q_mem_used, "Memory in use by processes."),
    ("memory.free", (), "MiB", _q_mem_free, "Memory left."),
    ("compute_mode", (), "", _q_gv("compute_mode", "Default"),
     "Who may create CUDA contexts: Default, Exclusive_Process or Prohibited."),
    ("compute_cap", (), "", _q_gv("compute_cap"), "CUDA compute capability, major.minor."),
    ("utilization.gpu", (), "%", _q_util("utilization_gpu"), "Share of the last sample period a kernel ran."),
    ("utilization.memory", (), "%", _q_util("utilization_memory"),
     "Share of the last sample period memory was read or written."),
    ("utilization.encoder", (), "%", _q_util(None), "Video encoder utilisation."),
    ("utilization.decoder", (), "%", _q_util(None), "Video decoder utilisation."),
    ("utilization.jpeg", (), "%", _q_util(None), "JPEG decoder utilisation."),
    ("utilization.ofa", (), "%", _q_util(None), "Optical flow accelerator utilisation."),
    ("encoder.stats.sessionCount", (), "", _q_const("0"), "Encoder sessions running."),
    ("encoder.stats.averageFps", (), "", _q_const("0"), "Average frames per second of the encoder sessions."),
    ("encoder.stats.averageLatency", (), "", _q_const("0"), "Average encoder latency in microseconds."),
    ("ecc.mode.current", (), "", lambda v: (_enabled(v.get("ecc_enabled", True)), ""), "Whether ECC is on."),
    ("ecc.mode.pending", (), "", lambda v: (_enabled(v.get("ecc_enabled", True)), ""),
     "Whether ECC is on after the next reboot."),
    *((f"ecc.errors.{kind}.{when}.{where}", (), "", _q_ecc_count,
       f"{kind.capitalize()} ECC errors in {place} {since}.")
      for kind in ("corrected", "uncorrected")
      for when, since in (("volatile", "since the driver loaded"), ("aggregate", "over the GPU's life"))
      for where, place in _ECC_WHERE),
    *((f"ecc.errors.uncorrected.{when}.sram.{how}", (), "", _q_ecc_count,
       f"Uncorrected SRAM errors found by {what}, {since}.")
      for when, since in (("volatile", "since the driver loaded"), ("aggregate", "over the GPU's life"))
      for how, what in (("parity", "parity"), ("secded", "SEC-DED"))),
    *((f"ecc.errors.uncorrected.aggregate.sram.{src}", (), "", _q_ecc_count,
       f"Uncorrected SRAM errors in {what} over the GPU's life.") for src, what in _ECC_SRAM_SOURCES),
    ("retired_pages.single_bit_ecc.count", ("retired_pages.sbe",), "", _q_const(_NA),
     "Pages retired after single bit errors (N/A on GPUs that remap rows instead)."),
    ("retired_pages.double_bit.count", ("retired_pages.dbe",), "", _q_const(_NA),
     "Pages retired after double bit errors (N/A on GPUs that remap rows instead)."),
    ("retired_pages.pending", (), "", _q_const(_NA), "Whether a page waits to be retired at the next reboot."),
    ("remapped_rows.correctable", ("remapped_rows.sbe",), "", _q_const("0"), "Rows remapped after correctable errors."),
    ("remapped_rows.correctable_inactive", (), "", _q_const("0"), "Such rows whose remapping is not active yet."),
    ("remapped_rows.uncorrectable", ("remapped_rows.dbe",), "", _q_const("0"),
     "Rows remapped after uncorrectable errors."),
    ("remapped_rows.uncorrectable_inactive", (), "", _q_const("0"), "Such rows whose remapping is not active yet."),
    ("remapped_rows.pending", (), "", _q_const("No"), "Whether a remapping waits for a GPU reset: Yes or No."),
    ("remapped_rows.failure", (), "", _q_const("No"), "Whether a remapping failed: Yes or No."),
    ("temperature.gpu", (), "", lambda v: (str(_int(v.get("temperature_gpu", 0))), ""), "GPU temperature in C."),
    ("temperature.gpu.tlimit", (), "", _q_tlimit, "How far below its max operating temperature the GPU is, in C."),
    ("temperature.memory", (), "", lambda v: (_NA, "") if v.gpu.get("temperature_memory") is None
     else (str(_int(v.gpu["temperature_memory"])), ""), "Memory temperature in C."),
    ("power.draw", (), "W", lambda v: _watts(v.get("power_draw_w", 0)), "Power the board draws, in watts."),
    ("power.draw.average", ("gpu.power.draw.average",), "W", lambda v: _watts(v.get("power_draw_w", 0)),
     "Power the board drew on average over the last second."),
    ("power.draw.instant", ("gpu.power.draw.instant",), "W", lambda v: _watts(v.get("power_draw_w", 0)),
     "Power the board draws at this instant."),
    ("power.limit", ("gpu.power.requested_limit",), "W", lambda v: _watts(v.get("power_limit_w", 0)),
     "Power limit set by software."),
    ("enforced.power.limit", ("gpu.power.current_limit",), "W", lambda v: _watts(v.get("power_limit_w", 0)),
     "Power limit in force."),
    ("power.default_limit", ("gpu.power.default_limit",), "W",
     lambda v: _watts(v.get("power_default_limit_w", v.get("power_limit_w", 0))), "Power limit after a reset."),
    ("power.min_limit", ("gpu.power.min_limit",), "W", lambda v: _watts(v.get("power_min_limit_w")),
     "Lowest power limit that can be set."),
    ("power.max_limit", ("gpu.power.max_limit",), "W",
     lambda v: _watts(v.get("power_max_limit_w", v.get("power_limit_w", 0))), "Highest power limit that can be set."),
    *((f"clocks.current.{name}", (f"clocks.{short}",), "MHz", _q_clock("clocks", key), f"{doc} clock now.")
      for name, short, key, doc in (("graphics", "gr", "graphics", "Graphics"), ("sm", "sm", "sm", "SM"),
                                    ("memory", "mem", "memory", "Memory"), ("video", "video", "video", "Video"))),
    *((f"clocks.{group}.{name}", (f"clocks.{group}.{short}",), "MHz", _q_clock("max_clocks", key), f"{doc} clock {when}.")
      for group, when in (("applications", "applications run at"), ("default_applications", "applications run at by default"))
      for name, short, key, doc in (("graphics", "gr", "graphics", "Graphics"), ("memory", "mem", "memory", "Memory"))),
    ("clocks.max.graphics", ("clocks.max.gr",), "MHz", _q_clock("max_clocks", "graphics"), "Highest graphics clock."),
    ("clocks.max.sm", (), "MHz", _q_clock("max_clocks", "sm"), "Highest SM clock."),
    ("clocks.max.memory", ("clocks.max.mem",), "MHz", _q_clock("max_clocks", "memory"), "Highest memory clock."),
    ("mig.mode.current", (), "", _q_mig_mode("mig_mode"), "MIG mode now: Enabled, Disabled or N/A."),
    ("mig.mode.pending", (), "", _q_mig_mode("mig_mode_pending"), "MIG mode after the next GPU reset."),
    ("c2c.mode", (), "", _q_const("Disabled"), "Whether the chip-to-chip link to a CPU is on."),
    ("protected_memory.total", (), "MiB", lambda v: _mib(0), "Memory set aside for confidential computing."),
    ("protected_memory.used", (), "MiB", lambda v: _mib(0), "Confidential computing memory in use."),
    ("protected_memory.free", (), "MiB", lambda v: _mib(0), "Confidential computing memory left."),
    ("fabric.state", (), "", _q_fabric("state"), "Registration of the GPU with the NVLink fabric manager."),
    ("fabric.status", (), "", _q_fabric("status"), "Result of that registration."),
    ("platform.module_id", (), "", lambda v: (str(v.gpu["module_id"]) if v.gpu.get("module_id") is not None
                                              else _NA, ""), "Position of the GPU module on an HGX board."),
)


def _gpu_column(name: str):
    """A ``--query-gpu`` field as a column of a per-item query."""
    getter = _GPU_FIELDS[0][name][1]
    return lambda c: getter(c.v)


_GPU_COLUMNS = (
    ("gpu_name", (), "", _gpu_column("name"), "Product name of the GPU."),
    ("gpu_bus_id", (), "", _gpu_column("pci.bus_id"), "PCI address of the GPU, domain:bus:device.function in hex."),
    ("gpu_serial", (), "", _gpu_column("serial"), "Serial number of the GPU's board."),
    ("gpu_uuid", (), "", _gpu_column("uuid"), "UUID of the GPU (GPU-...)."),
)

#: ``--query-compute-apps``: one row per process with a CUDA context.
_COMPUTE_APPS_FIELDS = _fields(
    ("timestamp", (), "", None, "When nvidia-smi ran, as YYYY/MM/DD HH:MM:SS.msec."),
    *_GPU_COLUMNS,
    ("pid", (), "", lambda c: (str(_int(c.item.get("pid", 0))), ""), "Process ID."),
    ("process_name", ("name",), "", lambda c: (str(c.item.get("name", "")), ""), "Name of the process."),
    ("used_gpu_memory", ("used_memory",), "MiB", lambda c: _mib(c.item.get("used_memory_mib")),
     "GPU memory the process's context uses."),
)

#: ``--query-retired-pages``: one row per retirement cause and GPU (none retired: address N/A).
_RETIRED_PAGES_FIELDS = _fields(
    ("timestamp", (), "", None, "When nvidia-smi ran, as YYYY/MM/DD HH:MM:SS.msec."),
    *_GPU_COLUMNS,
    ("retired_pages.address", (), "", _q_const(_NA), "Address of the retired page."),
    ("retired_pages.timestamp", (), "", _q_const(_NA), "When the page was retired."),
    ("retired_pages.cause", (), "", lambda c: (c.item, ""), "Why: Single Bit ECC or Double Bit ECC."),
)

#: ``--query-remapped-rows``: one row per GPU.
_REMAPPED_ROWS_FIELDS = _fields(
    ("timestamp", (), "", None, "When nvidia-smi ran, as YYYY/MM/DD HH:MM:SS.msec."),
    *_GPU_COLUMNS,
    *((name, (), "", _gpu_column(name), _GPU_FIELDS[0][name][2])
      for name in ("remapped_rows.correctable", "remapped_rows.uncorrectable", "remapped_rows.pending",
                   "remapped_rows.failure")),
)


def _run_timestamp(state: dict, views: list) -> str:
    ts = _now(state)
    t = time.localtime(ts)
    return (f"{t.tm_year}/{t.tm_mon:02}/{t.tm_mday:02} {t.tm_hour:02}:{t.tm_min:02}:{t.tm_sec:02}."
            f"{int((ts % 1) * 1000):03}")


#: Fields whose value is the run's, not a row's: name -> function of (state, views).
_RUN_VALUES = {
    "timestamp": _run_timestamp,
    "driver_version": lambda state, views: str(state.get("driver_version", _NA)),
    "count": lambda state, views: str(len(views)),
}


class _Selective:
    """One ``--query-*`` switch: its fields (see :func:`_fields`) and the rows it prints."""

    __slots__ = ("switch", "fields", "aliases", "rows")

    def __init__(self, switch: str, fields: tuple, rows):
        self.switch, (self.fields, self.aliases), self.rows = switch, fields, rows


_SELECTIVE = {s.switch: s for s in (
    _Selective("--query-gpu", _GPU_FIELDS, lambda state, views: views),
    _Selective("--query-compute-apps", _COMPUTE_APPS_FIELDS,
               lambda state, views: [_QCtx(state, v, p) for v in views for p in _visible_processes(v)]),
    _Selective("--query-retired-pages", _RETIRED_PAGES_FIELDS,
               lambda state, views: [_QCtx(state, v, cause) for v in views
                                     for cause in ("Single Bit ECC", "Double Bit ECC")]),
    _Selective("--query-remapped-rows", _REMAPPED_ROWS_FIELDS, lambda state, views: [_QCtx(state, v) for v in views]),
)}


class UsageError(Exception):
    """Bad command line: the text to print (a trailing newline is added), exit code."""

    def __init__(self, message: str, code: int = EXIT_INVALID_ARGUMENT):
        super().__init__(message)
        self.code = code


def parse_format(spec: str) -> tuple[bool, bool]:
    """``csv[,noheader][,nounits]`` → (header, units). CSV is the only format, so ``csv`` may be left out."""
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if any(p not in ("csv", "noheader", "nounits") for p in parts):
        raise UsageError(MSG_FORMAT)
    return "noheader" not in parts, "nounits" not in parts


def render_query(state: dict, views: list[_View], fields: list[str], header: bool, units: bool,
                 switch: str = "--query-gpu") -> str:
    """``--query-gpu=<fields>`` (or another ``--query-*`` switch) as CSV."""
    query = _SELECTIVE[switch]
    resolved = []
    for f in fields:
        key = query.aliases.get(f, f)
        if key not in query.fields:
            raise UsageError(MSG_BAD_FIELD.format(field=f))
        resolved.append(key)
    lines = []
    if header:
        # An alias prints under its current name, as the real one does
        # (clocks.sm -> "clocks.current.sm [MHz]").
        cols = []
        for key in resolved:
            unit = query.fields[key][0]
            cols.append(f"{key} [{unit}]" if unit and units else key)
        lines.append(", ".join(cols))
    for row in query.rows(state, views):
        values = []
        for key in resolved:
            getter = query.fields[key][1]
            if getter is None:
                values.append(_RUN_VALUES[key](state, views))
                continue
            value, unit = getter(row)
            values.append(f"{value} {unit}" if unit and units and value != _NA else value)
        lines.append(", ".join(values))
    return "".join(line + "\n" for line in lines)


def render_query_help(switch: str) -> str:
    """``--help-query-gpu`` and the like: each field (with its old names) and what it is."""
    query = _SELECTIVE[switch]
    old_names: dict = {}
    for alias, name in query.aliases.items():
        old_names.setdefault(name, []).append(alias)
    lines = [f'Fields the simulated nvidia-smi answers for "{switch}":', ""]
    for name, (_unit, _getter, doc) in query.fields.items():
        lines.append(" or ".join(f'"{n}"' for n in [name, *old_names.get(name, [])]))
        lines += [doc, ""]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# -q and -x -q: one data table, two renderers
#
# The report is data: tuples of rows, each ``(depth, label, tag, value)``:
# ``label`` is what -q prints (indented by ``depth``), ``tag`` the XML
# element (nested by ``depth``; None for a value: the bare text), ``value``
# None for a title (an XML element with children), a constant, a function
# of a :class:`_QCtx` or a :class:`_Hex`. Marker rows steer the renderers
# (:func:`_q_rows`): :class:`_Section` starts a part that ``-d`` shows or
# hides, :class:`_If` picks rows by a test (with :func:`_xml_only`: the
# parts the two formats do not share, XML's rows then -q's, which need only
# a tag or only a label), :class:`_Each` repeats rows for every
# item (MIG device, process, supported clock) with ``ctx.item``/``ctx.n``
# set, and :data:`_BLANK` is an empty -q line.

_KEY_WIDTH = 55
_PROCESS_KEY_WIDTH = 42  # sic: the real report puts the process fields' colons at 42


class _QCtx:
    """What a value function sees: the state, the visible GPUs, the GPU, the item, the renderer."""

    __slots__ = ("state", "views", "v", "g", "item", "n", "out", "width")

    def __init__(self, state: dict, v: _View | None = None, item=None, n: int = 0, out=None, views=(),
                 width: int = _KEY_WIDTH):
        self.state, self.views, self.v, self.item, self.n, self.out = state, views, v, item, n, out
        self.g = v.gpu if v is not None else None
        self.width = width  # where -q puts the colon

    def at(self, item, n: int, width: int) -> _QCtx:
        return _QCtx(self.state, self.v, item, n, self.out, self.views, width)

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
    """``rows`` for every item; ``tag``: an XML element around each (-q has no title there)."""

    __slots__ = ("items", "rows", "tag", "key_width")

    def __init__(self, items, rows: tuple, tag: str | None = None, key_width: int = _KEY_WIDTH):
        self.items, self.rows, self.tag, self.key_width = items, rows, tag, key_width


class _Hex:
    """A ``0x…`` value: -q prints it so, the XML without the ``0x``."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


_BLANK = object()  # an empty line in -q, nothing in XML


def _value(value, c: _QCtx) -> str:
    if isinstance(value, _Hex):
        text = _value(value.value, c)
        return text[2:] if c.out.xml and text.startswith("0x") else text
    return str(value(c) if callable(value) else value)


def _q_rows(out, rows: tuple, c: _QCtx) -> None:
    """Render report rows (see above) with ``out``, a :class:`_QText` or :class:`_QXml`."""
    for row in rows:
        if row is _BLANK:
            out.blank()
        elif isinstance(row, _Section):
            out.section(row.tag)
        elif isinstance(row, _If):
            _q_rows(out, row.rows if row.test(c) else row.orelse, c)
        elif isinstance(row, _Each):
            for n, item in enumerate(row.items(c)):
                if row.tag:
                    out.item(row.rows[0][0], row.tag)
                _q_rows(out, row.rows, c.at(item, n, row.key_width))
        elif out.on:
            depth, label, tag, value = row
            if value is None:
                out.head(depth, label, tag)
            else:
                out.kv(depth, label, tag, _value(value, c), c.width)


class _QText:
    """``nvidia-smi -q``: ``key : value`` lines, the colon at 55; ``-d`` picks sections."""

    xml = False

    def __init__(self, sections: set | None):
        self.lines = ["", "==============NVSMI LOG==============", ""]
        self.sections = sections
        self.on = True

    def section(self, tag: str | None) -> None:
        # With -d only the named sections print; untagged parts are hidden.
        self.on = self.sections is None or tag in self.sections

    def blank(self) -> None:
        self.lines.append("")

    def head(self, depth: int, label: str, tag: str) -> None:
        self.lines.append("    " * depth + label)

    def kv(self, depth: int, label: str, tag: str, value: str, width: int) -> None:
        self.lines.append(("    " * depth + label).ljust(width) + ": " + value)

    def item(self, depth: int, tag: str) -> None:
        pass  # -q has no line for an item: its rows follow each other

    def gpu(self, index: int, bus_id: str) -> None:
        self.section(None)
        if index:
            self.lines.append("")
        self.lines.append(f"GPU {bus_id}")

    def text(self) -> str:
        return "\n".join(self.lines + [""]) + "\n"


class _QXml:
    """``nvidia-smi -x -q``: the same rows as XML elements, nested by depth, tab indented."""

    xml = True
    on = True
    sections = None

    def __init__(self):
        self.lines = ['<?xml version="1.0" ?>', '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">',
                      "<nvidia_smi_log>"]
        self.open: list = [(-1, "nvidia_smi_log")]  # (depth, tag) of the elements not closed yet

    def section(self, tag: str | None) -> None:
        pass

    def blank(self) -> None:
        pass

    def _close(self, depth: float) -> None:
        while self.open[-1][0] >= depth:
            self.lines.append("\t" * (len(self.open) - 1) + f"</{self.open.pop()[1]}>")

    def head(self, depth: float, label, tag: str, attrs: str = "") -> None:
        self._close(depth)
        self.lines.append("\t" * len(self.open) + f"<{tag}{attrs}>")
        self.open.append((depth, tag))

    def kv(self, depth: int, label, tag: str | None, value: str, width: int) -> None:
        self._close(depth)
        indent = "\t" * len(self.open)
        self.lines.append(indent + (value if tag is None else f"<{tag}>{_xml_escape(value)}</{tag}>"))

    def item(self, depth: int, tag: str) -> None:
        # An element around the item's rows, closed by the next row not deeper than them.
        self.head(depth - 0.5, None, tag)

    def gpu(self, index: int, bus_id: str) -> None:
        self._close(0)
        if index:
            self.lines.append("")
        self.head(0, None, "gpu", f' id="{_xml_escape(bus_id)}"')

    def text(self) -> str:
        self._close(0)
        return "\n".join(self.lines + ["", "</nvidia_smi_log>"]) + "\n"


def _xml_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


# Tests and value functions used by the table.


def _xml_only(c: _QCtx) -> bool:
    return c.out.xml


def _asked_with_d(c: _QCtx) -> bool:
    """Parts the real report prints only when ``-d`` names their section."""
    return c.out.sections is not None


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
        value = c.v.get(key, dflt)
        return "N/A" if value is None else _watts(value)[0] + " W"
    return get


def _clock(group: str, key: str):
    return lambda c: _na((c.v.get(group) or {}).get(key), "MHz")


def _fabric(key: str):
    return lambda c: (c.v.get("fabric") or {}).get(key, "N/A")


def _na(value, unit: str = "") -> str:
    if value is None:
        return "N/A"
    return f"{value} {unit}".rstrip()


def _q_processes(c: _QCtx) -> list:
    return _visible_processes(c.v)


def _mig_enabled(c: _QCtx) -> bool:
    return c.v.mig_enabled


def _supported_clocks(c: _QCtx) -> list:
    """(memory clock, graphics clocks) pairs: each memory clock the GPU supports (its max one if the state
    lists none), with every 15 MHz from the max graphics clock down to the lowest (else the current one)."""
    top = _int((c.v.get("max_clocks") or {}).get("graphics", 0))
    low = _int(c.v.get("min_graphics_clock_mhz", (c.v.get("clocks") or {}).get("graphics", top)))
    graphics = list(range(top, min(low, top) - 1, -15))
    memory = c.v.get("supported_memory_clocks") or [(c.v.get("max_clocks") or {}).get("memory")]
    return [(m, graphics) for m in memory if m is not None]


def _fixed(depth: int, rows: tuple, value) -> tuple:
    """Rows ``(label, tag)`` that all print the same ``value``."""
    return tuple((depth, label, tag, value) for label, tag in rows)


def _same(*labels_and_tags: str) -> tuple:
    """``(label, tag)`` pairs from a flat ``label, tag, label, tag …`` list."""
    return tuple(zip(labels_and_tags[::2], labels_and_tags[1::2]))


_Q_LOG = (
    (0, "Timestamp", "timestamp", lambda c: _ctime(_now(c.state))),
    (0, "Driver Version", "driver_version", lambda c: c.state.get("driver_version", "N/A")),
    (0, "CUDA Version", "cuda_version", lambda c: c.state.get("cuda_version", "N/A")),
    _BLANK,
    (0, "Attached GPUs", "attached_gpus", lambda c: len(c.views)),
)

_Q_MIG_DEVICE = (
    (2, "MIG Device", "mig_device", None),
    (3, "Index", "index", lambda c: c.n),
    (3, "GPU Instance ID", "gpu_instance_id", _item_int("gi_id")),
    (3, "Compute Instance ID", "compute_instance_id", _item_int("ci_id")),
    (3, "Device Attributes", "device_attributes", None),
    (4, "Shared", "shared", None),
    (5, "Multiprocessor count", "multiprocessor_count", _item_int("sm")),
    (5, "Copy Engine count", "copy_engine_count", _item_int("ce")),
    (5, "Encoder count", "encoder_count", _item_int("enc")),
    (5, "Decoder count", "decoder_count", _item_int("dec")),
    (5, "OFA count", "ofa_count", _item_int("ofa")),
    (5, "JPG count", "jpg_count", _item_int("jpg")),
    (3, "ECC Errors", "ecc_error_count", None),
    (4, "Volatile", "volatile_count", None),
    (5, "SRAM Uncorrectable", "sram_uncorrectable", 0),
    (3, "FB Memory Usage", "fb_memory_usage", None),
    (4, "Total", "total", _item_mib("memory_total_mib")),
    (4, "Reserved", "reserved", "0 MiB"),
    (4, "Used", "used", _item_mib("memory_used_mib")),
    (4, "Free", "free", _item_free_mib("memory_total_mib", "memory_used_mib")),
    (3, "BAR1 Memory Usage", "bar1_memory_usage", None),
    (4, "Total", "total", _item_mib("bar1_total_mib")),
    (4, "Used", "used", _item_mib("bar1_used_mib")),
    (4, "Free", "free", _item_free_mib("bar1_total_mib", "bar1_used_mib")),
)

_Q_PROCESS = (
    (2, "GPU instance ID", "gpu_instance_id", lambda c: _na(c.item.get("gi_id"))),
    (2, "Compute instance ID", "compute_instance_id", lambda c: _na(c.item.get("ci_id"))),
    (2, "Process ID", "pid", _item_int("pid")),
    (3, "Type", "type", lambda c: c.item.get("type", "C")),
    (3, "Name", "process_name", lambda c: c.item.get("name", "")),
    (3, "Used GPU Memory", "used_memory", _item_mib("used_memory_mib")),
)

_CLOCK_NAMES = _same("Graphics", "graphics_clock", "SM", "sm_clock", "Memory", "mem_clock", "Video", "video_clock")
_APP_CLOCKS = ((2, "Graphics", "graphics_clock", _clock("max_clocks", "graphics")),
               (2, "Memory", "mem_clock", _clock("max_clocks", "memory")))
_ENCODER_STATS = _fixed(2, _same("Active Sessions", "session_count", "Average FPS", "average_fps",
                                 "Average Latency", "average_latency"), 0)
_ECC_COUNTERS = _same("SRAM Correctable", "sram_correctable", "SRAM Uncorrectable Parity", "sram_uncorrectable_parity",
                      "SRAM Uncorrectable SEC-DED", "sram_uncorrectable_secded", "DRAM Correctable", "dram_correctable",
                      "DRAM Uncorrectable", "dram_uncorrectable")
_POWER_LIMITS = _same("Current Power Limit", "current_power_limit", "Requested Power Limit", "requested_power_limit",
                      "Default Power Limit", "default_power_limit", "Min Power Limit", "min_power_limit",
                      "Max Power Limit", "max_power_limit")
_CLOCK_SAMPLES = _fixed(2, _same("Duration", None, "Number of Samples", None, "Max", None, "Min", None, "Avg", None),
                        "Not Found")
_RETIREMENT = ((3, None, "retired_count", "N/A"), (3, None, "retired_pagelist", "N/A"))

#: ``nvidia-smi -q`` for one GPU, after its ``GPU <bus id>`` line (``<gpu id=…>`` in XML).
_Q_REPORT = (
    _Section(None),
    (1, "Product Name", "product_name", lambda c: c.g["name"]),
    (1, "Product Brand", "product_brand", _gv("brand", "NVIDIA")),
    (1, "Product Architecture", "product_architecture", _gv("architecture")),
    (1, "Display Mode", "display_mode", "Requested functionality has been deprecated"),
    (1, "Display Attached", "display_attached", lambda c: "Yes" if c.v.get("display_attached", False) else "No"),
    (1, "Display Active", "display_active", lambda c: _enabled(c.v.get("display_active", False))),
    (1, "Persistence Mode", "persistence_mode", lambda c: _enabled(c.v.get("persistence_mode", True))),
    (1, "Addressing Mode", "addressing_mode", "None"),
    (1, "MIG Mode", "mig_mode", None),
    (2, "Current", "current_mig", lambda c: c.g.get("mig_mode") or "N/A"),
    (2, "Pending", "pending_mig", lambda c: c.g.get("mig_mode_pending") or c.g.get("mig_mode") or "N/A"),
    _If(_mig_enabled, (
        (1, "MIG Devices", "mig_devices", None),
        _Each(lambda c: c.v.migs, _Q_MIG_DEVICE),
    ), (
        _If(_xml_only, ((1, None, "mig_devices", None), (2, None, None, "None"))),
    )),
    (1, "Accounting Mode", "accounting_mode", "Disabled"),
    (1, "Accounting Mode Buffer Size", "accounting_mode_buffer_size", 4000),
    (1, "Driver Model", "driver_model", None),
    *_fixed(2, _same("Current", "current_dm", "Pending", "pending_dm"), "N/A"),
    (1, "Serial Number", "serial", _gv("serial")),
    (1, "GPU UUID", "uuid", lambda c: c.g["uuid"]),
    (1, "GPU PDI", "pdi", lambda c: c.v.get("pdi", "0x" + c.g["uuid"][4:12].lower().rjust(16, "0"))),
    (1, "Minor Number", "minor_number", lambda c: c.v.get("minor_number", c.v.index)),
    (1, "VBIOS Version", "vbios_version", _gv("vbios_version")),
    (1, "MultiGPU Board", "multigpu_board", "No"),
    (1, "Board ID", "board_id", _board_id),
    (1, "Board Part Number", "board_part_number", _gv("board_part_number")),
    (1, "GPU Part Number", "gpu_part_number", _gv("gpu_part_number")),
    (1, "FRU Part Number", "gpu_fru_part_number", "N/A"),
    (1, "Platform Info", "platformInfo", None),
    *_fixed(2, _same("Chassis Serial Number", "chassis_serial_number", "Slot Number", "slot_number",
                     "Tray Index", "tray_index", "Host ID", "host_id", "Peer Type", "peer_type"), "N/A"),
    (2, "Module Id", "module_id", lambda c: _na(c.g.get("module_id"))),
    (2, "GPU Fabric GUID", "gpu_fabric_guid", "N/A"),
    (1, "Inforom Version", "inforom_version", None),
    (2, "Image Version", "img_version", _gv("inforom_image")),
    (2, "OEM Object", "oem_object", "2.1"),
    (2, "ECC Object", "ecc_object", "7.16"),
    (2, "Power Management Object", "pwr_object", "N/A"),
    (1, "Inforom BBX Object Flush", "inforom_bbx_flush", None),
    *_fixed(2, _same("Latest Timestamp", "latest_timestamp", "Latest Duration", "latest_duration"), "N/A"),
    (1, "GPU Operation Mode", "gpu_operation_mode", None),
    *_fixed(2, _same("Current", "current_gom", "Pending", "pending_gom"), "N/A"),
    (1, "GPU C2C Mode", "c2c_mode", "Disabled"),
    (1, "GPU Virtualization Mode", "gpu_virtualization_mode", None),
    (2, "Virtualization Mode", "virtualization_mode", _gv("virtualization_mode", "None")),
    (2, "Host VGPU Mode", "host_vgpu_mode", "N/A"),
    (2, "vGPU Heterogeneous Mode", "vgpu_heterogeneous_mode", "N/A"),
    (1, "GPU Recovery Action", "gpu_recovery_action", "None"),
    (1, "GSP Firmware Version", "gsp_firmware_version", lambda c: c.state.get("driver_version", "N/A")),
    (1, "IBMNPU", "ibmnpu", None),
    (2, "Relaxed Ordering Mode", "relaxed_ordering_mode", "N/A"),
    (1, "PCI", "pci", None),
    (2, "Bus", "pci_bus", _Hex(lambda c: f"0x{c.bus()[2].upper()}")),
    (2, "Device", "pci_device", _Hex(lambda c: f"0x{c.bus()[3].upper()}")),
    (2, "Domain", "pci_domain", _Hex(lambda c: f"0x{c.bus()[1][-4:].upper()}")),
    (2, "Base Classcode", "pci_base_class", _Hex("0x3")),
    (2, "Sub Classcode", "pci_sub_class", _Hex("0x2")),
    (2, "Device Id", "pci_device_id", _Hex(_gv("pci_device_id"))),
    (2, "Bus Id", "pci_bus_id", lambda c: c.bus()[0]),
    (2, "Sub System Id", "pci_sub_system_id", _Hex(_gv("pci_subsystem_id"))),
    (2, "GPU Link Info", "pci_gpu_link_info", None),
    (3, "PCIe Generation", "pcie_gen", None),
    *_fixed(4, _same("Max", "max_link_gen", "Current", "current_link_gen", "Device Current", "device_current_link_gen",
                     "Device Max", "max_device_link_gen"), _gv("pcie_gen")),
    (4, "Host Max", "max_host_link_gen", "N/A"),
    (3, "Link Width", "link_widths", None),
    *_fixed(4, _same("Max", "max_link_width", "Current", "current_link_width"),
            lambda c: f"{c.v.get('pcie_width')}x" if c.v.get("pcie_width") else "N/A"),
    (2, "Bridge Chip", "pci_bridge_chip", None),
    (3, "Type", "bridge_chip_type", "N/A"),
    (3, "Firmware", "bridge_chip_fw", "N/A"),
    (2, "Replays Since Reset", "replay_counter", 0),
    (2, "Replay Number Rollovers", "replay_rollover_counter", 0),
    (2, "Tx Throughput", "tx_util", "0 KB/s"),
    (2, "Rx Throughput", "rx_util", "0 KB/s"),
    (2, "Atomic Caps Outbound", "atomic_caps_outbound", "N/A"),
    (2, "Atomic Caps Inbound", "atomic_caps_inbound", "N/A"),
    (1, "Fan Speed", "fan_speed", lambda c: "N/A" if c.g.get("fan_speed") is None else f"{_int(c.g['fan_speed'])} %"),

    _Section("PERFORMANCE"),
    (1, "Performance State", "performance_state", _gv("pstate", "P0")),
    (1, "Clocks Event Reasons", "clocks_event_reasons", None),
    (2, "Idle", "clocks_event_reason_gpu_idle",
     lambda c: "Not Active" if _int(c.v.get("utilization_gpu", 0)) > 0 else "Active"),
    *_fixed(2, _same("Applications Clocks Setting", "clocks_event_reason_applications_clocks_setting",
                     "SW Power Cap", "clocks_event_reason_sw_power_cap",
                     "HW Slowdown", "clocks_event_reason_hw_slowdown"), "Not Active"),
    *_fixed(3, _same("HW Thermal Slowdown", "clocks_event_reason_hw_thermal_slowdown",
                     "HW Power Brake Slowdown", "clocks_event_reason_hw_power_brake_slowdown"), "Not Active"),
    *_fixed(2, _same("Sync Boost", "clocks_event_reason_sync_boost",
                     "SW Thermal Slowdown", "clocks_event_reason_sw_thermal_slowdown",
                     "Display Clock Setting", "clocks_event_reason_display_clocks_setting"), "Not Active"),
    (1, "Clocks Event Reasons Counters", "clocks_event_reasons_counters", None),
    *_fixed(2, _same("SW Power Capping", "clocks_event_reasons_counters_sw_power_cap",
                     "Sync Boost", "clocks_event_reasons_counters_sync_boost",
                     "SW Thermal Slowdown", "clocks_event_reasons_counters_sw_therm_slowdown",
                     "HW Thermal Slowdown", "clocks_event_reasons_counters_hw_therm_slowdown",
                     "HW Power Braking", "clocks_event_reasons_counters_hw_power_brake"), "0 us"),
    (1, "Sparse Operation Mode", "sparse_operation_mode", "Disabled"),

    _Section("MEMORY"),
    (1, "FB Memory Usage", "fb_memory_usage", None),
    (2, "Total", "total", lambda c: f"{_int(c.v.get('memory_total_mib', 0))} MiB"),
    (2, "Reserved", "reserved", lambda c: f"{_int(c.v.get('memory_reserved_mib', 0))} MiB"),
    (2, "Used", "used", lambda c: f"{_gpu_mem_used(c)} MiB"),
    (2, "Free", "free", _gpu_mem_free),
    (1, "BAR1 Memory Usage", "bar1_memory_usage", None),
    (2, "Total", "total", lambda c: f"{_int(c.v.get('bar1_total_mib', 0))} MiB"),
    (2, "Used", "used", lambda c: f"{_int(c.v.get('bar1_used_mib', 0))} MiB"),
    (2, "Free", "free", _bar1_free),
    (1, "Conf Compute Protected Memory Usage", "cc_protected_memory_usage", None),
    *_fixed(2, _same("Total", "total", "Used", "used", "Free", "free"), "0 MiB"),

    _Section("COMPUTE"),
    (1, "Compute Mode", "compute_mode", _gv("compute_mode", "Default")),

    _Section("UTILIZATION"),
    (1, "Utilization", "utilization", None),
    _If(_mig_enabled, _fixed(2, _same("GPU", "gpu_util", "Memory", "memory_util", "Encoder", "encoder_util",
                                      "Decoder", "decoder_util", "JPEG", "jpeg_util", "OFA", "ofa_util"), "N/A"), (
        (2, "GPU", "gpu_util", lambda c: f"{_int(c.v.get('utilization_gpu', 0))} %"),
        (2, "Memory", "memory_util", lambda c: f"{_int(c.v.get('utilization_memory', 0))} %"),
        *_fixed(2, _same("Encoder", "encoder_util", "Decoder", "decoder_util", "JPEG", "jpeg_util",
                         "OFA", "ofa_util"), "0 %"),
    )),
    (1, "Encoder Stats", "encoder_stats", None),
    *_ENCODER_STATS,
    (1, "FBC Stats", "fbc_stats", None),
    *_ENCODER_STATS,
    _Section(None),
    (1, "DRAM Encryption Mode", "dram_encryption_mode", None),
    *_fixed(2, _same("Current", "current_dram_encryption", "Pending", "pending_dram_encryption"), "N/A"),

    _Section("ECC"),
    (1, "ECC Mode", "ecc_mode", None),
    *_fixed(2, _same("Current", "current_ecc", "Pending", "pending_ecc"),
            lambda c: _enabled(c.v.get("ecc_enabled", True))),
    (1, "ECC Errors", "ecc_errors", None),
    (2, "Volatile", "volatile", None),
    *_fixed(3, _ECC_COUNTERS, 0),
    (2, "Aggregate", "aggregate", None),
    *_fixed(3, _ECC_COUNTERS, 0),
    (3, "SRAM Threshold Exceeded", "sram_threshold_exceeded", "No"),
    (2, "Aggregate Uncorrectable SRAM Sources", "aggregate_uncorrectable_sram_sources", None),
    *_fixed(3, _same("SRAM L2", "sram_l2", "SRAM SM", "sram_sm", "SRAM Microcontroller", "sram_microcontroller",
                     "SRAM PCIE", "sram_pcie", "SRAM Other", "sram_other"), 0),
    *_fixed(2, _same("Channel Repair Pending", "channel_repair_pending", "TPC Repair Pending", "tpc_repair_pending",
                     "Unrepairable Memory", "unrepairable_memory"), "No"),

    _Section("PAGE_RETIREMENT"),
    (1, "Retired Pages", "retired_pages", None),
    _If(_xml_only, (
        (2, None, "multiple_single_bit_retirement", None), *_RETIREMENT,
        (2, None, "double_bit_retirement", None), *_RETIREMENT,
        (2, None, "pending_blacklist", "N/A"),
        (2, None, "pending_retirement", "N/A"),
    ), _fixed(2, _same("Single Bit ECC", None, "Double Bit ECC", None, "Pending Page Blacklist", None), "N/A")),

    _Section("ROW_REMAPPER"),
    (1, "Remapped Rows", "remapped_rows", None),
    *_fixed(2, _same("Correctable Error", "remapped_row_corr", "Inactive Correctable Error", "remapped_row_corr_inactive",
                     "Uncorrectable Error", "remapped_row_unc", "Inactive Uncorrectable Error",
                     "remapped_row_unc_inactive"), 0),
    (2, "Pending", "remapped_row_pending", "No"),
    (2, "Remapping Failure Occurred", "remapped_row_failure", "No"),
    (2, "Bank Remap Availability Histogram", "row_remapper_histogram", None),
    (3, "Max", "row_remapper_histogram_max", lambda c: f"{_int(c.v.get('row_remapper_banks', 3072))} bank(s)"),
    *_fixed(3, _same("High", "row_remapper_histogram_high", "Partial", "row_remapper_histogram_partial",
                     "Low", "row_remapper_histogram_low", "None", "row_remapper_histogram_none"), "0 bank(s)"),

    _Section("TEMPERATURE"),
    (1, "Temperature", "temperature", None),
    (2, "GPU Current Temp", "gpu_temp", lambda c: f"{_int(c.v.get('temperature_gpu', 0))} C"),
    # Headroom now, and where shutdown/slowdown sit below the max operating temperature.
    (2, "GPU T.Limit Temp", "gpu_temp_tlimit", _tlimit(lambda c: _int(c.v.get("temperature_gpu", 0)))),
    (2, "GPU Shutdown T.Limit Temp", "gpu_temp_max_tlimit_threshold", _tlimit(lambda c: c.g.get("temperature_shutdown"))),
    (2, "GPU Slowdown T.Limit Temp", "gpu_temp_slow_tlimit_threshold",
     _tlimit(lambda c: c.g.get("temperature_slowdown"))),
    (2, "GPU Max Operating T.Limit Temp", "gpu_temp_max_gpu_tlimit_threshold",
     _tlimit(lambda c: c.g.get("temperature_max_operating"))),
    (2, "GPU Target Temperature", "gpu_target_temperature", "N/A"),
    (2, "Memory Current Temp", "memory_temp", lambda c: _na(c.g.get("temperature_memory"), "C")),
    (2, "Memory Max Operating T.Limit Temp", "gpu_temp_max_mem_tlimit_threshold",
     lambda c: "N/A" if c.g.get("temperature_memory") is None else "0 C"),
    _If(_xml_only, (
        (1, None, "supported_gpu_target_temp", None),
        *_fixed(2, _same(None, "gpu_target_temp_min", None, "gpu_target_temp_max"), "N/A"),
    )),

    _Section("POWER"),
    (1, "GPU Power Readings", "gpu_power_readings", None),
    _If(_xml_only, ((2, None, "power_state", _gv("pstate", "P0")),)),
    *_fixed(2, _same("Average Power Draw", "average_power_draw", "Instantaneous Power Draw", "instant_power_draw"),
            _power("power_draw_w", default=0)),
    *_fixed(2, _POWER_LIMITS[:2], _power("power_limit_w")),
    (2, "Default Power Limit", "default_power_limit", _power("power_default_limit_w", fallback="power_limit_w")),
    (2, "Min Power Limit", "min_power_limit", _power("power_min_limit_w", default=0)),
    (2, "Max Power Limit", "max_power_limit", _power("power_max_limit_w", fallback="power_limit_w")),
    (1, "GPU Memory Power Readings ", "gpu_memory_power_readings", None),  # sic: -q prints a trailing blank
    (2, "Average Power Draw", "average_power_draw", _power("memory_power_draw_w")),
    (2, "Instantaneous Power Draw", "instant_power_draw", "N/A"),
    (1, "Module Power Readings", "module_power_readings", None),
    _If(_xml_only, ((2, None, "power_state", _gv("pstate", "P0")),)),
    *_fixed(2, _same("Average Power Draw", "average_power_draw", "Instantaneous Power Draw", "instant_power_draw")
            + _POWER_LIMITS, "N/A"),
    (1, "Power Smoothing", "power_smoothing", "N/A"),
    (1, "Workload Power Profiles", "power_profiles", None),
    *_fixed(2, _same("Requested Profiles", "power_profile_requested_profiles",
                     "Enforced Profiles", "power_profile_enforced_profiles"), "N/A"),

    _Section("CLOCK"),
    (1, "Clocks", "clocks", None),
    *((2, name, tag, _clock("clocks", key)) for key, (name, tag) in zip(("graphics", "sm", "memory", "video"),
                                                                          _CLOCK_NAMES)),
    (1, "Applications Clocks", "applications_clocks", None),
    *_APP_CLOCKS,
    (1, "Default Applications Clocks", "default_applications_clocks", None),
    *_APP_CLOCKS,
    (1, "Deferred Clocks", "deferred_clocks", None),
    (2, "Memory", "mem_clock", "N/A"),
    (1, "Max Clocks", "max_clocks", None),
    *((2, name, tag, _clock("max_clocks", key)) for key, (name, tag) in zip(("graphics", "sm", "memory", "video"),
                                                                              _CLOCK_NAMES)),
    (1, "Max Customer Boost Clocks", "max_customer_boost_clocks", None),
    (2, "Graphics", "graphics_clock", _clock("max_clocks", "graphics")),
    _If(_asked_with_d, (
        (1, "SM Clock Samples", None, None), *_CLOCK_SAMPLES,
        (1, "Memory Clock Samples", None, None), *_CLOCK_SAMPLES,
    )),
    (1, "Clock Policy", "clock_policy", None),
    *_fixed(2, _same("Auto Boost", "auto_boost", "Auto Boost Default", "auto_boost_default"), "N/A"),

    _Section(None),
    (1, "Fabric", "fabric", None),
    (2, "State", "state", _fabric("state")),
    (2, "Status", "status", _fabric("status")),
    (2, "CliqueId", "cliqueId", _fabric("clique_id")),
    (2, "ClusterUUID", "clusterUuid", _fabric("cluster_uuid")),
    (2, "Health", "health", None),
    *_fixed(3, _same("Summary", "summary", "Bandwidth", "bandwidth", "Route Recovery in progress",
                     "route_recovery_in_progress", "Route Unhealthy", "route_unhealthy", "Access Timeout Recovery",
                     "access_timeout_recovery", "Incorrect Configuration", "incorrect_configuration",
                     "Partition Assigned", "partition_assigned"), "N/A"),
    _If(_xml_only, (
        (1, None, "supported_clocks", None),
        _Each(_supported_clocks, (
            (3, None, "value", lambda c: f"{_int(c.item[0])} MHz"),
            _Each(lambda c: c.item[1], ((3, None, "supported_graphics_clock", lambda c: f"{c.item} MHz"),)),
        ), tag="supported_mem_clock"),
    )),

    _Section("PIDS"),
    _If(_q_processes, (
        (1, "Processes", "processes", None),
        _Each(_q_processes, _Q_PROCESS, tag="process_info", key_width=_PROCESS_KEY_WIDTH),
    ), (
        _If(_xml_only, ((1, None, "processes", None),), ((1, "Processes", None, "None"),)),
    )),
    _Section(None),
    _If(_xml_only, ((1, None, "accounted_processes", None),)),
    (1, "Capabilities", "capabilities", None),
    (2, "EGM", "egm", "disabled"),
)

_DISPLAY_SECTIONS = {
    "MEMORY", "UTILIZATION", "ECC", "TEMPERATURE", "POWER", "CLOCK", "COMPUTE", "PIDS", "PERFORMANCE",
    "PAGE_RETIREMENT", "ROW_REMAPPER",
}


def render_q(state: dict, views: list[_View], sections: set | None = None, xml: bool = False) -> str:
    """``nvidia-smi -q`` (optionally ``-d SECTION[,SECTION]``), or with ``xml`` ``-x -q``."""
    out = _QXml() if xml else _QText(sections)
    _q_rows(out, _Q_LOG, _QCtx(state, out=out, views=views))
    for i, v in enumerate(views):
        out.gpu(i, v.get("bus_id", "00000000:00:00.0"))
        _q_rows(out, _Q_REPORT, _QCtx(state, v, out=out, views=views))
    return out.text()


# --------------------------------------------------------------------------
# dmon and pmon: one line per GPU (per process) and sample
#
# Columns are data: ``(selector, name, unit, value)``; a selector letter of
# ``-s`` turns a group on, and the groups print in the table's order. Both
# tools print their two header lines once, then a line per GPU (dmon) or
# per process, "-" filled when a GPU has none (pmon), every sample.

def _dmon_util(key: str):
    return lambda v: "-" if v.mig_enabled else _int(v.get(key, 0))


_DMON_COLUMNS = (
    ("p", "pwr", "W", lambda v: _int(v.get("power_draw_w", 0))),
    ("p", "gtemp", "C", lambda v: _int(v.get("temperature_gpu", 0))),
    ("p", "mtemp", "C", lambda v: "-" if v.gpu.get("temperature_memory") is None else _int(v.gpu["temperature_memory"])),
    ("u", "sm", "%", _dmon_util("utilization_gpu")),
    ("u", "mem", "%", _dmon_util("utilization_memory")),
    *(("u", name, "%", lambda v: "-" if v.mig_enabled else 0) for name in ("enc", "dec", "jpg", "ofa")),
    ("c", "mclk", "MHz", lambda v: _int((v.get("clocks") or {}).get("memory", 0))),
    ("c", "pclk", "MHz", lambda v: _int((v.get("clocks") or {}).get("graphics", 0))),
    ("v", "pviol", "%", lambda v: 0),
    ("v", "tviol", "bool", lambda v: 0),
    ("m", "fb", "MB", lambda v: _gpu_used_mib(v)),
    ("m", "bar1", "MB", lambda v: _int(v.get("bar1_used_mib", 0))),
    ("m", "ccpm", "MB", lambda v: 0),
    *(("e", name, "errs", lambda v: 0) for name in ("sbecc", "dbecc", "pci")),
    *(("t", name, "MB/s", lambda v: 0) for name in ("rxpci", "txpci")),
)
_DMON_SELECT = "pucvmet"
_DMON_DEFAULT = "puc"

# pmon: (selector, name, unit, value of a (view, process, share) or None for the "-" row)
_PMON_COLUMNS = (
    ("u", "sm", "%", lambda v, p, share: "-" if v.mig_enabled else round(share * _int(v.get("utilization_gpu", 0)))),
    ("u", "mem", "%", lambda v, p, share: "-" if v.mig_enabled else round(share * _int(v.get("utilization_memory", 0)))),
    *(("u", name, "%", lambda v, p, share: "-") for name in ("enc", "dec", "jpg", "ofa")),
    ("m", "fb", "MB", lambda v, p, share: _int(p.get("used_memory_mib", 0))),
    ("m", "ccpm", "MB", lambda v, p, share: 0),
)
_PMON_SELECT = "um"
_PMON_DEFAULT = "u"

# -o: leading columns, each 8 wide: (letter, header, units line, strftime format)
_STAMP_COLUMNS = (("D", "Date", "YYYYMMDD", "%Y%m%d"), ("T", "Time", "HH:MM:SS", "%H:%M:%S"))


def _gpu_used_mib(v: _View) -> int:
    if v.mig_enabled:
        return sum(_int(m.get("memory_used_mib", 0)) for m in v.migs)
    return _int(v.get("memory_used_mib", 0))


def _stamps(options: str, state: dict) -> tuple[list, list, list]:
    """The -o columns' header, units and value cells."""
    t = time.localtime(_now(state))
    cols = [c for c in _STAMP_COLUMNS if c[0] in options]
    return [c[1] for c in cols], [c[2] for c in cols], [time.strftime(c[3], t) for c in cols]


def _monitor_lines(stamps: tuple, cells: list, tails: tuple, header: bool, rows: list) -> list[str]:
    """Header lines (if asked) and rows of dmon/pmon: a ``#`` (or blank) mark, the -o columns, the GPU
    index, then the cells.

    ``cells``: (name, unit, width) of the header's columns, ``tails`` what ends its two lines;
    ``rows``: (gpu index, [(value, width)…], what ends the line) tuples.
    """
    names, units, values = stamps
    gpu_width = 8 if names else 4

    def lead(mark: str, stamp_cells: list, gpu) -> str:
        return mark + " ".join(f"{s:<8}" for s in stamp_cells) + f"{gpu:>{gpu_width}}"

    lines = []
    if header:
        lines.append(lead("#", names, "gpu") + "".join(f"{n:>{w}}" for n, _u, w in cells) + tails[0])
        lines.append(lead("#", units, "Idx") + "".join(f"{u:>{w}}" for _n, u, w in cells) + tails[1])
    for index, cell_values, tail in rows:
        lines.append(lead(" ", values, index) + "".join(f"{x:>{w}}" for x, w in cell_values) + tail)
    return lines


def render_dmon(state: dict, views: list[_View], select: str, options: str, header: bool) -> str:
    """``nvidia-smi dmon``: one sample."""
    cols = [c for s in _DMON_SELECT if s in select for c in _DMON_COLUMNS if c[0] == s]
    rows = [(v.index, [(c[3](v), 7) for c in cols], " ") for v in views]
    lines = _monitor_lines(_stamps(options, state), [(c[1], c[2], 7) for c in cols], (" ", " "), header, rows)
    return "".join(line + "\n" for line in lines)


def _process_shares(v: _View) -> list:
    """(process, share of the GPU's utilisation) of the GPU's visible processes.

    A process's ``utilization`` (percent of the GPU, gpulab's own field) gives its share;
    without it the processes split the GPU evenly.
    """
    procs = _visible_processes(v)
    total = _int(v.get("utilization_gpu", 0))
    out = []
    for p in procs:
        if p.get("utilization") is not None and total:
            share = min(1.0, _int(p["utilization"]) / total)
        else:
            share = 1 / len(procs)
        out.append((p, share))
    return out


def render_pmon(state: dict, views: list[_View], select: str, options: str, header: bool) -> str:
    """``nvidia-smi pmon``: one sample. Its rows sit one column left of the header's from the pid on, as
    the real ones do."""
    cols = [c for s in _PMON_SELECT if s in select for c in _PMON_COLUMNS if c[0] == s]
    rows = []
    for v in views:
        for p, share in _process_shares(v) or [(None, 0)]:
            if p is None:  # no process on the GPU: a row of dashes
                cells, name = [("-", 11), ("-", 6)] + [("-", 7) for _c in cols], "-"
            else:
                cells = [(_int(p.get("pid", 0)), 11), (str(p.get("type", "C")), 6)]
                cells += [(c[3](v, p, share), 7) for c in cols]
                name = str(p.get("name", ""))
            rows.append((v.index, cells, "    " + name.ljust(15)))
    head = [("pid", "#", 12), ("type", "C/G", 7)] + [(c[1], c[2], 7) for c in cols]
    lines = _monitor_lines(_stamps(options, state), head, ("    command ", "    name "), header, rows)
    return "".join(line + "\n" for line in lines)


# --------------------------------------------------------------------------
# nvlink -s / -c

# NVLinks per GPU of an SXM board (HGX: every pair of GPUs reaches each
# other over all of them, through the NVSwitches) and the speed of one link
# in MB/s as `nvidia-smi nvlink -s` prints it in GB/s (A100: 25 GB/s, real
# output; H100: 26.562 GB/s, NVIDIA's health-check documentation).
_NVLINKS = {"Hopper": 18, "Ampere": 12}
_NVLINK_MBPS = {"Hopper": 26562, "Ampere": 25000}
_NVLINK_CAPABILITIES = (
    ("P2P is supported", "true"), ("Access to system memory supported", "true"), ("P2P atomics supported", "true"),
    ("System memory atomics supported", "true"), ("SLI is supported", "false"), ("Link is supported", "false"),
)


def _nvlink_count(gpu: dict) -> int:
    """The GPU's NVLinks: the state's ``nvlinks``, else those of an SXM board (one with a module id)."""
    if gpu.get("nvlinks") is not None:
        return _int(gpu["nvlinks"])
    return _NVLINKS.get(gpu.get("architecture"), 0) if gpu.get("module_id") else 0


def render_nvlink(views: list[_View], what: str, link: int | None = None) -> str:
    """``nvidia-smi nvlink -s`` (``what`` "status") or ``-c`` ("capabilities"); GPUs without NVLinks print nothing."""
    lines = []
    for v in views:
        count = _nvlink_count(v.gpu)
        links = [n for n in range(count) if link is None or n == link]
        if not links:
            continue
        lines.append(f"GPU {v.index}: {v.gpu['name']} (UUID: {v.gpu['uuid']})")
        speed = f"{_NVLINK_MBPS.get(v.gpu.get('architecture'), 25000) / 1000:.3f}".rstrip("0").rstrip(".")
        for n in links:
            if what == "status":
                lines.append(f"\t Link {n}: {speed} GB/s")
            else:
                lines += [f"\t Link {n}, {cap}: {value}" for cap, value in _NVLINK_CAPABILITIES]
    return "".join(line + "\n" for line in lines)


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
    links = _nvlink_count(a.gpu)
    if links and _nvlink_count(b.gpu):
        return f"NV{links}"
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
#
# Help texts: the real tool's layout and option names, the fake's own words,
# and only what the fake does.

HELP = """NVIDIA System Management Interface -- v{version}

gpulab simulation: this nvidia-smi reports the simulated GPUs of its node,
read from the state the node keeps. The options below behave as the real
tool's; anything else is refused.

nvidia-smi [OPTION1 [ARG1]] [OPTION2 [ARG2]] ...

    -h,   --help                This text.

          --version             Versions of nvidia-smi, NVML, the driver and CUDA.

  LIST OPTIONS:

    -L,   --list-gpus           One line per GPU and MIG device, with its UUID.

  SUMMARY OPTIONS:

    <no arguments>              The table of GPUs, MIG devices and processes.

    [plus any of]

    -i,   --id=                 Only this GPU: index, UUID or PCI bus id.
    -l,   --loop=               Again every so many seconds, until Ctrl+C.

  QUERY OPTIONS:

    -q,   --query               The full report of every GPU.

    [plus any of]

    -i,   --id=                 Only this GPU: index, UUID or PCI bus id.
    -x,   --xml-format          The report as XML.
    -d,   --display=            Only these parts of the report, comma separated:
                                    MEMORY, UTILIZATION, ECC, TEMPERATURE, POWER,
                                    CLOCK, COMPUTE, PIDS, PERFORMANCE,
                                    PAGE_RETIREMENT, ROW_REMAPPER
                                Not with -x.
    -l,   --loop=               Again every so many seconds, until Ctrl+C.

  SELECTIVE QUERY OPTIONS:

    [one of]

    --query-gpu                 Chosen fields of every GPU.
                                See --help-query-gpu.
    --query-compute-apps        Chosen fields of every process on a GPU.
                                See --help-query-compute-apps.
    --query-retired-pages       Memory pages retired after ECC errors.
    --query-remapped-rows       Memory rows remapped after ECC errors.

    [plus any of]

    --format=                   csv (the default), noheader (no header line),
                                nounits (numbers without their units), comma separated.
    -i,   --id=                 Only this GPU: index, UUID or PCI bus id.
    -l,   --loop=               Again every so many seconds, until Ctrl+C.

 Device Monitoring:
    dmon                        A line of readings per GPU and second. "nvidia-smi dmon -h" for its options.

 Process Monitoring:
    pmon                        A line per GPU process and second. "nvidia-smi pmon -h" for its options.

 TOPOLOGY:
    topo                        "nvidia-smi topo -m": how the GPUs reach each other and their CPUs.

 NVLINK:
    nvlink                      NVLink state of the GPUs. "nvidia-smi nvlink -h" for its options.

 MIG:
    mig                         "nvidia-smi mig -lgip": the GPU instance profiles.
"""

_MONITOR_HELP = """
    gpulab simulation: {intro}

    Usage: nvidia-smi {tool} [options]

    Options include:
    [-i | --id]:          Only these GPUs: indices, PCI bus ids or UUIDs, comma separated
    [-d | --delay]:       Seconds between samples [default=1]
    [-c | --count]:       Stop after this many samples
    [-s | --select]:      Which columns [default={default}], any of:
{selectors}
    [-o | --options]:     Leading columns, any of:
                              D - the date (YYYYMMDD)
                              T - the time (HH:MM:SS)
    [-h | --help]:        This text

"""

_DMON_SELECTORS = (
    ("p", "power draw, GPU and memory temperature"), ("u", "utilisation of the SMs, memory and engines"),
    ("c", "memory and graphics clocks"), ("v", "power and thermal violations"),
    ("m", "frame buffer, BAR1 and protected memory in use"), ("e", "ECC and PCIe replay errors"),
    ("t", "PCIe receive and transmit throughput"),
)
_PMON_SELECTORS = (("u", "utilisation of the SMs, memory and engines"), ("m", "frame buffer and protected memory"))


def _monitor_help(tool: str, intro: str, default: str, selectors: tuple) -> str:
    lines = "\n".join(f"                              {s} - {doc}" for s, doc in selectors)
    return _MONITOR_HELP.format(tool=tool, intro=intro, default=default, selectors=lines)


DMON_HELP = _monitor_help("dmon", """one line of readings per GPU and sample, from the
    node's simulated state, until Ctrl+C or the count. Under MIG the
    utilisation columns print "-".""", _DMON_DEFAULT, _DMON_SELECTORS)
PMON_HELP = _monitor_help("pmon", """one line per process on a GPU and sample (dashes
    for a GPU without one), from the node's simulated state, until Ctrl+C
    or the count.""", _PMON_DEFAULT, _PMON_SELECTORS)

NVLINK_HELP = """
    nvlink -- gpulab simulation: the NVLinks of SXM GPUs (none on PCIe cards).

    Usage: nvidia-smi nvlink [options]

    Options include:
    [-h | --help]: This text
    [-i | --id]: Only this GPU: index, PCI bus id or UUID.
    [-l | --link]: Only this link.
    [-s | --status]: Speed of each link.
    [-c | --capabilities]: What each link supports.

"""

def _version_text(state: dict) -> str:
    driver = str(state.get("driver_version", "N/A"))
    nvml = ".".join(driver.split(".")[:2])
    return (f"NVIDIA-SMI version  : {driver}\n"
            f"NVML version        : {nvml}\n"
            f"DRIVER version      : {driver}\n"
            f"CUDA Version        : {state.get('cuda_version', 'N/A')}\n")


class _Args:
    """The parsed command line. ``loop``: seconds between frames (None: one frame); ``count``: frames."""

    __slots__ = ("mode", "query", "fmt", "ids", "loop", "count", "display", "xml", "select", "options", "link",
                 "help_of")

    def __init__(self, mode: str = "table"):
        self.mode = mode
        self.query: tuple | None = None   # (switch, fields) of --query-*
        self.fmt: str | None = None
        self.ids: list[str] | None = None
        self.loop: float | None = None
        self.count: int | None = None
        self.display: set | None = None
        self.xml = False
        self.select = ""
        self.options = ""
        self.link: int | None = None
        self.help_of: str | None = None   # the --query-* switch of --help-query-*


def _number(kind, low: float = 0):
    """A converter for an option's argument: ``kind`` above ``low``, else invalid arguments."""
    def convert(raw: str):
        try:
            value = kind(raw)
        except ValueError:
            raise UsageError(MSG_INVALID_ARGS) from None
        if value <= low:
            raise UsageError(MSG_INVALID_ARGS)
        return value
    return convert


def _comma_list(raw: str) -> list[str]:
    return [s.strip() for s in raw.split(",") if s.strip()]


def _display(raw: str) -> set:
    sections = {s.upper() for s in _comma_list(raw)}
    if not sections or sections - _DISPLAY_SECTIONS:
        raise UsageError(MSG_BAD_DISPLAY)
    return sections


def _letters(allowed: str):
    def convert(raw: str) -> str:
        if not raw or set(raw) - set(allowed):
            raise UsageError(MSG_INVALID_ARGS)
        return raw
    return convert


def _options(*specs) -> dict:
    """``(attribute, value, names…)`` -> {name: (attribute, value)}.

    ``value`` is what the option sets: a constant, or a function that
    converts the option's argument (then the option takes one).
    """
    return {name: (attr, value) for attr, value, *names in specs for name in names}


_MAIN_OPTIONS = _options(
    ("mode", "help", "-h", "--help"),
    ("mode", "version", "--version"),
    ("mode", "list", "-L", "--list-gpus"),
    ("mode", "q", "-q", "--query"),
    ("xml", True, "-x", "--xml-format"),
    ("display", _display, "-d", "--display"),
    ("ids", _comma_list, "-i", "--id"),
    ("loop", _number(float), "-l", "--loop"),
    ("fmt", str, "--format"),
    *(("query", (lambda switch: lambda raw: (switch, _comma_list(raw)))(s), s) for s in _SELECTIVE),
    ("help_of", "--query-gpu", "--help-query-gpu"),
    ("help_of", "--query-compute-apps", "--help-query-compute-apps"),
)
_MONITOR_OPTIONS = {
    tool: _options(
        ("mode", tool + "-help", "-h", "--help"),
        ("ids", _comma_list, "-i", "--id"),
        ("loop", _number(int), "-d", "--delay"),
        ("count", _number(int), "-c", "--count"),
        ("select", _letters(select), "-s", "--select"),
        ("options", _letters("DT"), "-o", "--options"),
    )
    for tool, select in (("dmon", _DMON_SELECT), ("pmon", _PMON_SELECT))
}
_NVLINK_OPTIONS = _options(
    ("mode", "nvlink-help", "-h", "--help"),
    ("ids", _comma_list, "-i", "--id"),
    ("link", _number(int, -1), "-l", "--link"),
    ("select", "status", "-s", "--status"),
    ("select", "capabilities", "-c", "--capabilities"),
)
_TOPO_OPTIONS = _options(("mode", "topo", "-m", "--matrix"), ("ids", _comma_list, "-i", "--id"))
_MIG_OPTIONS = _options(("mode", "lgip", "-lgip", "--list-gpu-instance-profiles"), ("ids", _comma_list, "-i", "--id"))


def _tokens(argv: list[str], table: dict) -> list[tuple[str, str, object, str | None]]:
    """``(option as written, attribute, value spec, argument)`` for each option of ``argv``, in order."""
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        name, eq, raw = arg.partition("=")
        spec = table.get(arg) or (table.get(name) if eq else None)
        if spec is None or (eq and not callable(spec[1]) and arg not in table):
            raise UsageError(MSG_INVALID_ARGS)
        if callable(spec[1]) and not eq:
            i += 1
            if i >= len(argv):
                raise UsageError(MSG_INVALID_ARGS)
            raw = argv[i]
        out.append((arg, spec[0], spec[1], raw if callable(spec[1]) else None))
        i += 1
    return out


def _apply(args: _Args, tokens: list) -> _Args:
    """Set what each option sets (converting its argument) on ``args``."""
    for _arg, attr, value, raw in tokens:
        setattr(args, attr, value(raw) if callable(value) else value)
    return args


def _parse_main(argv: list[str]) -> _Args:
    tokens = _tokens(argv, _MAIN_OPTIONS)
    # Real 580: -L takes no other option; it names the first one it finds.
    if any(value == "list" for _arg, _attr, value, _raw in tokens):
        other = next((arg for arg, _attr, value, _raw in tokens if value != "list"), None)
        if other is not None:
            raise UsageError(MSG_OPTION_NOT_VALID.format(option=other))
    args = _apply(_Args(), tokens)
    if args.help_of:
        args.mode = "help-query"
    elif args.query:
        args.mode = "query"
    if args.xml and args.display is not None:
        raise UsageError(MSG_D_WITH_X)
    if (args.xml or args.display is not None) and args.mode != "q":
        raise UsageError(MSG_INVALID_ARGS)
    if args.fmt is not None and args.mode != "query":
        raise UsageError(MSG_INVALID_ARGS)
    if args.mode == "query":
        parse_format(args.fmt or "csv")  # refuse a bad --format before looking at the GPUs
    return args


def _parse_monitor(tool: str, argv: list[str]) -> _Args:
    args = _Args(tool)
    args.loop, args.select = 1, _DMON_DEFAULT if tool == "dmon" else _PMON_DEFAULT
    return _apply(args, _tokens(argv, _MONITOR_OPTIONS[tool]))


def _parse_nvlink(argv: list[str]) -> _Args:
    args = _Args("nvlink")
    args.select = "status"  # plain `nvidia-smi nvlink` as -s (not verified against a machine with links)
    return _apply(args, _tokens(argv, _NVLINK_OPTIONS))


def _parse_topo(argv: list[str]) -> _Args:
    args = _apply(_Args("bad"), _tokens(argv, _TOPO_OPTIONS))
    if args.ids is not None:
        raise UsageError(MSG_TOPO_ID, EXIT_UNKNOWN)
    if args.mode != "topo":
        raise UsageError(MSG_INVALID_ARGS)
    return args


def _parse_mig(argv: list[str]) -> _Args:
    args = _apply(_Args("bad"), _tokens(argv, _MIG_OPTIONS))
    if args.mode != "lgip":
        raise UsageError(MSG_INVALID_ARGS)
    return args


_SUBCOMMANDS = {
    "dmon": lambda argv: _parse_monitor("dmon", argv),
    "pmon": lambda argv: _parse_monitor("pmon", argv),
    "nvlink": _parse_nvlink,
    "topo": _parse_topo,
    "mig": _parse_mig,
}


def _parse_args(argv: list[str]) -> _Args:
    if argv and argv[0] in _SUBCOMMANDS:
        return _SUBCOMMANDS[argv[0]](argv[1:])
    return _parse_main(argv)


#: Texts that need no GPU: mode -> function of (state, args).
_HELP_TEXTS = {
    "help": lambda state, args: HELP.format(version=(state or {}).get("driver_version", "N/A")),
    "help-query": lambda state, args: render_query_help(args.help_of),
    "dmon-help": lambda state, args: DMON_HELP,
    "pmon-help": lambda state, args: PMON_HELP,
    "nvlink-help": lambda state, args: NVLINK_HELP,
}


def _render_lgip(state: dict, views: list[_View], args: _Args, frame: int) -> str:
    mig_views = [v for v in views if v.gpu.get("mig_profiles")]
    if not mig_views:
        raise UsageError(MSG_NO_MIG, EXIT_NOT_FOUND)
    return render_lgip(mig_views)


def _render_query(state: dict, views: list[_View], args: _Args, frame: int) -> str:
    switch, fields = args.query
    header, units = parse_format(args.fmt or "csv")
    return render_query(state, views, fields, header, units, switch)


#: What each mode prints for one frame: function of (state, views, args, frame number).
_RENDER = {
    "table": lambda state, views, args, frame: render_table(state, views),
    "list": lambda state, views, args, frame: render_list(views),
    "q": lambda state, views, args, frame: render_q(state, views, args.display, args.xml),
    "query": _render_query,
    "lgip": _render_lgip,
    "topo": lambda state, views, args, frame: render_topo(views),
    "dmon": lambda state, views, args, frame: render_dmon(state, views, args.select, args.options, frame == 0),
    "pmon": lambda state, views, args, frame: render_pmon(state, views, args.select, args.options, frame == 0),
    "nvlink": lambda state, views, args, frame: render_nvlink(views, args.select, args.link),
}


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
        out.write(str(exc) + "\n")
        return exc.code

    state, problem = _load(env)
    if problem:
        err.write(problem + "\n")
        return EXIT_UNKNOWN
    if args.mode in _HELP_TEXTS:
        out.write(_HELP_TEXTS[args.mode](state, args))
        return EXIT_OK

    frame = 0
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
            out.write(_RENDER[args.mode](state, views, args, frame))
        except UsageError as exc:
            out.write(str(exc) + "\n")
            return exc.code
        frame += 1
        if args.loop is None or (args.count is not None and frame >= args.count):
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
