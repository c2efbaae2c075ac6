"""The fake nvidia-smi against the real H200 capture, and its failure modes."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gpulab.fakegpu import cudaerrors, smistate
from gpulab.fakegpu import nvidiasmi as smi
from gpulab.fakegpu.devicemap import advertised_resources
from gpulab.fakegpu.pluginconfig import parse_config
from gpulab.hardware.models import gpu_uuid

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "gpulab/fakegpu/nvidiasmi.py"


# Real H200 output captured for these tests (see the README there).
REF = REPO / "tests" / "fixtures" / "nvidia-h200"

TABLE_SEPARATORS = [0, 42, 67, 90]
MIG_SEPARATORS = [0, 19, 54, 66, 90]


def captured_readings() -> dict:
    """Temperature and power of the captured GPU, read off its table row."""
    row = (REF / "nvidia-smi.txt").read_text().splitlines()[9]
    m = re.search(r"(\d+)C\s+P0\s+(\d+)W", row)
    assert m, row
    return {"temperature_gpu": int(m[1]), "power_draw_w": int(m[2])}


def reference_like_state(**gpu_overrides) -> dict:
    """An H200 state whose live readings are those of the captured GPU."""
    state = smistate.build_state("h200-141gb", 1, "ref-node", timestamp=1_700_000_000)
    gpu = state["gpus"][0]
    gpu.update(
        bus_id="00000000:00:06.0", uuid="GPU-00000000-0000-0000-0000-000000000000", serial="0000000000000",
        module_id=7, fabric={"state": "N/A", "status": "N/A"}, **captured_readings(),
    )
    gpu.update(gpu_overrides)
    return state


def run(state: dict | None, *argv: str, visible: str | None = "all", tmp_path: Path, raw_env=None):
    env = {}
    if state is not None:
        path = tmp_path / "smi.json"
        smistate.write_state(str(path), state)
        env[smi.STATE_ENV] = str(path)
    if visible is not None:
        env[smi.VISIBLE_ENV] = visible
    if raw_env is not None:
        env = raw_env
    out, err = io.StringIO(), io.StringIO()
    rc = smi.run(list(argv), env=env, out=out, err=err)
    return rc, out.getvalue(), err.getvalue()


def bars(line: str) -> list[int]:
    return [i for i, ch in enumerate(line) if ch in "|+"]


# -- the box table ---------------------------------------------------------------------------


def test_table_is_the_reference_byte_for_byte(tmp_path):
    rc, out, _ = run(reference_like_state(), tmp_path=tmp_path)
    ref = (REF / "nvidia-smi.txt").read_text()
    assert rc == 0
    assert out.splitlines()[1:] == ref.splitlines()[1:]
    assert out.endswith("\n") and ref.endswith("\n")
    # First line: ctime-style timestamp padded with 7 blanks, like the capture.
    pattern = r"[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4} {7}"
    assert re.fullmatch(pattern, out.splitlines()[0])
    assert re.fullmatch(pattern, ref.splitlines()[0])


def test_column_positions_match_the_reference_for_every_model(tmp_path):
    ref_lines = (REF / "nvidia-smi.txt").read_text().splitlines()
    ref_bars = [bars(l) for l in ref_lines[1:12]]
    for model in ("h100-80gb", "a100-80gb", "a100-40gb", "l4"):
        rc, out, _ = run(smistate.build_state(model, 1, "n"), tmp_path=tmp_path)
        lines = out.splitlines()
        assert rc == 0
        assert [bars(l) for l in lines[1:12]] == ref_bars, model
        assert [len(l) for l in lines[1:12]] == [len(l) for l in ref_lines[1:12]]
        # Header rows are the real ones; only the GPU rows carry values.
        assert lines[1:8] == ref_lines[1:8]


def _check_frame(out: str) -> None:
    lines = out.splitlines()
    section = None
    for line in lines[1:]:
        if not line:
            continue
        assert len(line) == 91, line
        if line.startswith("| GPU  Name"):
            section = "gpu"
        elif line.startswith("| MIG devices:"):
            section = "mig-title"
        elif line.startswith("| GPU  GI  CI  MIG"):
            section = "mig"
        elif line.startswith("| Processes:"):
            section = "proc"
        if section == "gpu" and line != "+" + "-" * 89 + "+":
            assert bars(line) == TABLE_SEPARATORS, line
        if section == "mig" and "No MIG devices" not in line and line != "+" + "-" * 89 + "+":
            assert bars(line) == MIG_SEPARATORS, line
        if section == "proc":
            assert bars(line) == [0, 90], line


@pytest.mark.parametrize(
    ("model", "count", "layout"),
    [("h100-80gb", 8, None), ("h100-80gb", 2, "all-1g.10gb"), ("h200-141gb", 1, "all-balanced"),
     ("a100-40gb", 2, "all-enabled"), ("l4", 4, None), ("h200-141gb", 1, "all-7g.141gb")],
)
def test_every_frame_keeps_the_real_widths(tmp_path, model, count, layout):
    state = smistate.build_state(model, count, "n", mig_layout=layout)
    rc, out, _ = run(state, tmp_path=tmp_path)
    assert rc == 0
    _check_frame(out)
    assert out.count("NVIDIA-SMI 580.159.04") == 1
    assert (" MIG devices:" in out) == (layout is not None)


def test_gpu_rows_carry_the_live_readings(tmp_path):
    state = smistate.build_state("h100-80gb", 1, "n")
    state["gpus"][0].update(memory_used_mib=40960, utilization_gpu=97, power_draw_w=651.4, temperature_gpu=71,
                            persistence_mode=False, pstate="P2", fan_speed=None)
    _, out, _ = run(state, tmp_path=tmp_path)
    rows = out.splitlines()[8:11]
    assert rows[0] == "|   0  NVIDIA H100 80GB HBM3          Off |   00000000:18:00.0 Off |                    0 |"
    assert rows[1] == "| N/A   71C    P2            651W /  700W |   40960MiB /  81559MiB |     97%      Default |"
    assert rows[2].endswith("|             Disabled |")


def test_mig_enabled_gpu_rows(tmp_path):
    _, out, _ = run(smistate.build_state("h200-141gb", 1, "n", mig_layout="all-1g.18gb"), tmp_path=tmp_path)
    rows = out.splitlines()[8:11]
    assert rows[0].endswith("|                   On |")        # ECC column reads "On" under MIG
    assert "|                  N/A   |     N/A      Default |" in rows[1]
    assert rows[2].endswith("|              Enabled |")
    mig_rows = [l for l in out.splitlines() if re.match(r"\|\s+0\s+\d+\s+0\s+\d+\s+\|", l)]
    assert len(mig_rows) == 7
    assert mig_rows[0] == "|  0    7   0   0  |               0MiB / 16384MiB    | 16      0 |  1   0    1    0    1 |"
    assert [int(r.split()[2]) for r in mig_rows] == list(range(7, 14))    # GI ids 7..13


def test_mig_enabled_without_instances(tmp_path):
    _, out, _ = run(smistate.build_state("a100-40gb", 1, "n", mig_layout="all-enabled"), tmp_path=tmp_path)
    assert "|  No MIG devices found" in out


def test_process_rows_line_up_with_the_header(tmp_path):
    state = smistate.build_state("h100-80gb", 2, "n", mig_layout=None)
    state["gpus"][1]["processes"] = [
        {"pid": 31337, "type": "C", "name": "python3 train.py", "used_memory_mib": 10240},
        {"pid": 7, "type": "C+G", "name": "/opt/conda/envs/very/long/path/bin/python3.11", "used_memory_mib": 3},
    ]
    _, out, _ = run(state, tmp_path=tmp_path)
    lines = out.splitlines()
    header = next(l for l in lines if l.startswith("|  GPU   GI   CI"))
    row, long_row = [l for l in lines if "31337" in l or "C+G" in l]
    assert row.index("1 ") + 1 == header.index("GPU") + 3             # index right-aligned under GPU
    assert row.index("N/A") == header.index("GI")                       # N/A starts under GI
    assert row.index("31337") + 5 == header.index("PID") + 3            # PID right-aligned
    assert row.index(" C ") + 2 == header.index("Type") + 4             # type right-aligned
    assert row.index("python3 train.py") == header.index("Process name")
    assert row.index("10240MiB") + 8 == header.index("GPU Memory") + 10
    name_field = long_row[header.index("Process name"):header.index("Process name") + 35]
    assert name_field.startswith("...") and name_field.endswith("/bin/python3.11") and len(long_row) == 91
    assert "No running processes found" not in out


def test_processes_in_mig_instances_show_gi_and_ci(tmp_path):
    state = smistate.build_state("h100-80gb", 1, "n", mig_layout="all-1g.10gb")
    state["gpus"][0]["processes"] = [{"pid": 99, "type": "C", "name": "infer", "used_memory_mib": 512,
                                      "gi_id": 9, "ci_id": 0}]
    _, out, _ = run(state, tmp_path=tmp_path)
    row = next(l for l in out.splitlines() if "infer" in l)
    assert row.startswith("|    0    9    0 ")
    # A container that only sees another instance does not see the process.
    other = state["gpus"][0]["mig_devices"][0]["uuid"]
    _, out, _ = run(state, visible=other, tmp_path=tmp_path)
    assert "infer" not in out and "No running processes found" in out


# -- -L ---------------------------------------------------------------------------------------


def test_list_gpus(tmp_path):
    state = smistate.build_state("h200-141gb", 2, "node-a", mig_layout="all-balanced")
    state["gpus"][1]["mig_mode"], state["gpus"][1]["mig_devices"] = "Disabled", []
    rc, out, _ = run(state, "-L", tmp_path=tmp_path)
    lines = out.splitlines()
    assert rc == 0
    assert lines[0] == f"GPU 0: NVIDIA H200 (UUID: {gpu_uuid('node-a', 0)})"
    assert [re.match(r"  MIG (\S+) +Device +(\d+): \(UUID: MIG-[0-9a-f-]{36}\)$", l).groups() for l in lines[1:5]] == [
        ("3g.71gb", "0"), ("2g.35gb", "1"), ("1g.18gb", "2"), ("1g.18gb", "3")]
    assert lines[1].startswith("  MIG 3g.71gb     Device  0: ")
    assert lines[5] == f"GPU 1: NVIDIA H200 (UUID: {gpu_uuid('node-a', 1)})"


# -- --query-gpu ------------------------------------------------------------------------------

REF_FIELDS = ("index,uuid,name,memory.total,memory.used,utilization.gpu,temperature.gpu,power.draw,"
              "power.limit,mig.mode.current,driver_version,pci.bus_id,compute_cap")


def test_query_csv_is_the_reference(tmp_path):
    row = (REF / "query.csv").read_text().splitlines()[1].split(", ")
    state = reference_like_state(temperature_gpu=int(row[6]), power_draw_w=float(row[7].split()[0]))
    rc, out, _ = run(state, f"--query-gpu={REF_FIELDS}", "--format=csv", tmp_path=tmp_path)
    assert rc == 0
    assert out == (REF / "query.csv").read_text()


def test_query_csv_units_and_header_options(tmp_path):
    state = smistate.build_state("h100-80gb", 2, "n")
    rc, out, _ = run(state, "--query-gpu=name,memory.total,utilization.gpu,power.draw", "--format=csv",
                     tmp_path=tmp_path)
    assert out.splitlines() == [
        "name, memory.total [MiB], utilization.gpu [%], power.draw [W]",
        "NVIDIA H100 80GB HBM3, 81559 MiB, 0 %, 70.00 W",
        "NVIDIA H100 80GB HBM3, 81559 MiB, 0 %, 70.00 W",
    ]
    _, out, _ = run(state, "--query-gpu=memory.total,memory.free", "--format=csv,noheader,nounits",
                    tmp_path=tmp_path)
    assert out.splitlines() == ["81559, 81231"] * 2
    _, out, _ = run(state, "--query-gpu", "count,gpu_name,fan.speed", "--format", "csv,noheader",
                    tmp_path=tmp_path)
    assert out.splitlines()[0] == "2, NVIDIA H100 80GB HBM3, [N/A]"


def test_query_aliases_print_under_their_current_names(tmp_path):
    # Driver 580 prints an alias in the header under the name it stands for.
    state = smistate.build_state("h100-80gb", 1, "n")
    rc, out, _ = run(state, "--query-gpu=clocks.sm,clocks.current.sm,gpu_name,clocks.max.mem,"
                     "clocks_throttle_reasons.active,clocks_throttle_reasons.gpu_idle,"
                     "clocks_throttle_reasons.sw_power_cap", "--format=csv", tmp_path=tmp_path)
    assert rc == 0
    assert out.splitlines() == [
        "clocks.current.sm [MHz], clocks.current.sm [MHz], name, clocks.max.memory [MHz], "
        "clocks_event_reasons.active, clocks_event_reasons.gpu_idle, clocks_event_reasons.sw_power_cap",
        "345 MHz, 345 MHz, NVIDIA H100 80GB HBM3, 2619 MHz, 0x0000000000000001, Active, Not Active",
    ]
    # A busy GPU is not idle; the current names give the same values.
    state["gpus"][0]["utilization_gpu"] = 80
    _, out, _ = run(state, "--query-gpu=clocks_event_reasons.active,clocks_event_reasons.gpu_idle",
                    "--format=csv,noheader", tmp_path=tmp_path)
    assert out == "0x0000000000000000, Not Active\n"
    # temperature.gpu.tlimit is a field of its own (the -q report's "GPU T.Limit Temp"), not an alias.
    ref = (REF / "nvidia-smi-q.txt").read_text()
    current = int(re.search(r"GPU Current Temp\s+: (\d+) C", ref)[1])
    tlimit = re.search(r"GPU T.Limit Temp\s+: (\d+) C", ref)[1]
    _, out, _ = run(reference_like_state(temperature_gpu=current), "--query-gpu=temperature.gpu,temperature.gpu.tlimit",
                    "--format=csv", tmp_path=tmp_path)
    assert out == f"temperature.gpu, temperature.gpu.tlimit\n{current}, {tlimit}\n"


def test_query_without_format_prints_csv(tmp_path):
    state = smistate.build_state("h100-80gb", 2, "n")
    fields = "--query-gpu=index,name,memory.total,clocks.sm"
    rc, out, _ = run(state, fields, tmp_path=tmp_path)
    assert rc == 0
    assert out == run(state, fields, "--format=csv", tmp_path=tmp_path)[1]
    assert out.splitlines()[0] == "index, name, memory.total [MiB], clocks.current.sm [MHz]"


def test_query_under_mig(tmp_path):
    state = smistate.build_state("a100-80gb", 1, "n", mig_layout="all-1g.10gb")
    _, out, _ = run(state, "--query-gpu=mig.mode.current,memory.used,utilization.gpu", "--format=csv,noheader",
                    tmp_path=tmp_path)
    assert out == "Enabled, [N/A], [N/A]\n"
    _, out, _ = run(smistate.build_state("l4", 1, "n"), "--query-gpu=mig.mode.current", "--format=csv,noheader",
                    tmp_path=tmp_path)
    assert out == "[N/A]\n"


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--query-gpu=name,bogus", "--format=csv"], 'Field "bogus" is not a valid field to query.'),
        (["--query-gpu=name", "--format=json"], "Format modifier is not recognized."),
        (["--format=csv"], "Invalid combination of input arguments"),
        (["--frobnicate"], "Invalid combination of input arguments"),
        (["-i"], "Invalid combination of input arguments"),
        (["-d", "MEMORY"], "Invalid combination of input arguments"),
        (["-q", "-d", "GPUS"], "Failed to parse --display/-d flags"),
        (["-l", "0"], "Invalid combination of input arguments"),
        (["mig", "-lci"], "Invalid combination of input arguments"),
        (["topo"], "Invalid combination of input arguments"),
    ],
)
def test_bad_command_lines_exit_2(tmp_path, argv, words):
    rc, out, _ = run(smistate.build_state("l4", 1, "n"), *argv, tmp_path=tmp_path)
    assert rc == smi.EXIT_INVALID_ARGUMENT
    assert words in out


# -- -q --------------------------------------------------------------------------------------


def _structure(text: str) -> list[str]:
    """Indentation and key of every line, values dropped."""
    return [re.sub(r"\s*:.*$", "", l).rstrip() if re.search(r"\s: ", l) else l.rstrip()
            for l in text.splitlines() if not l.startswith("GPU 0000")]


def test_query_report_has_the_reference_structure(tmp_path):
    ref = (REF / "nvidia-smi-q.txt").read_text()
    current = int(re.search(r"GPU Current Temp\s+: (\d+) C", ref)[1])
    rc, out, _ = run(reference_like_state(temperature_gpu=current), "-q", tmp_path=tmp_path)
    assert rc == 0
    assert _structure(out) == _structure(ref)
    colons = {l.index(" : ") + 1 for l in out.splitlines() if " : " in l}
    assert colons == {55}
    same = ["Product Name", "Product Architecture", "Driver Version", "CUDA Version", "GPU UUID",
            "VBIOS Version", "Device Id", "Sub System Id", "Bus Id", "GSP Firmware Version"]
    for key in same:
        mine = [l for l in out.splitlines() if l.strip().startswith(key + " ")]
        theirs = [l for l in ref.splitlines() if l.strip().startswith(key + " ")]
        assert mine == theirs, key
    for line in ("        Total                                          : 143771 MiB",
                 f"        GPU T.Limit Temp                               : {87 - current} C",
                 "        GPU Shutdown T.Limit Temp                      : -8 C",
                 "        GPU Slowdown T.Limit Temp                      : -2 C",
                 "        Max Power Limit                                : 700.00 W",
                 "    Processes                                          : None"):
        assert line in out.splitlines() and line in ref.splitlines()


def test_query_report_sections_and_mig_devices(tmp_path):
    state = smistate.build_state("h100-80gb", 2, "n", mig_layout="all-3g.40gb")
    rc, out, _ = run(state, "-q", "-d", "MEMORY,TEMPERATURE", tmp_path=tmp_path)
    assert rc == 0
    assert "FB Memory Usage" in out and "GPU Current Temp" in out
    assert "Product Name" not in out and "Clocks Event Reasons" not in out
    assert out.count("GPU 00000000:") == 2 and "Attached GPUs                                          : 2" in out
    _, out, _ = run(state, "-q", "-i", "1", tmp_path=tmp_path)
    lines = out.splitlines()
    assert "GPU 00000000:2A:00.0" in out and "GPU 00000000:18:00.0" not in out
    assert sum(l == "        MIG Device" for l in lines) == 2
    assert sum(bool(re.fullmatch(r" {20}Multiprocessor count +: 60", l)) for l in lines) == 2
    assert "        Current                                        : Enabled" in lines


def test_fabric_manager_fault_shows_in_the_report(tmp_path):
    state = smistate.build_state("h100-80gb", 8, "n", fault=smi.FAULT_FABRIC_MANAGER_DOWN)
    rc, out, _ = run(state, "-q", "-i", "0", tmp_path=tmp_path)
    assert rc == 0  # nvidia-smi itself works; CUDA programs do not
    assert "        State                                          : In Progress" in out.splitlines()
    rc, _, _ = run(state, tmp_path=tmp_path)
    assert rc == 0


# -- mig -lgip --------------------------------------------------------------------------------


def test_mig_lgip_is_the_reference(tmp_path):
    rc, out, _ = run(reference_like_state(), "mig", "-lgip", tmp_path=tmp_path)
    assert rc == 0
    assert out == (REF / "mig-lgip.txt").read_text()


def test_mig_lgip_counts_free_instances(tmp_path):
    state = smistate.build_state("h100-80gb", 1, "n", mig_layout="all-3g.40gb")
    state["gpus"][0]["mig_devices"] = state["gpus"][0]["mig_devices"][:1]  # one 3g.40gb left, at slice 0
    _, out, _ = run(state, "mig", "-lgip", tmp_path=tmp_path)
    free = dict(re.findall(r"MIG (\S+)\s+\d+\s+(\d+)/\d+", out))
    # Slices 4-7 are free, but a 1g can only start at 0..6: three more fit.
    assert free == {"1g.10gb": "3", "1g.10gb+me": "1", "1g.20gb": "2", "2g.20gb": "1", "3g.40gb": "1",
                    "4g.40gb": "0", "7g.80gb": "0"}
    rc, out, _ = run(smistate.build_state("l4", 1, "n"), "mig", "-lgip", tmp_path=tmp_path)
    assert (rc, out) == (smi.EXIT_NOT_FOUND, "No MIG-supported devices found.\n")


# -- visibility and failures ------------------------------------------------------------------


def test_no_devices_in_the_container(tmp_path):
    rc, out, _ = run(smistate.build_state("h100-80gb", 2, "n"), visible="none", tmp_path=tmp_path)
    assert (rc, out) == (6, "No devices were found\n")
    rc, out, _ = run(smistate.build_state("h100-80gb", 2, "n"), "-L", visible="GPU-does-not-exist", tmp_path=tmp_path)
    assert (rc, out) == (6, "No devices were found\n")
    rc, out, _ = run(smistate.build_state("h100-80gb", 0, "n"), tmp_path=tmp_path)
    assert rc == 6


@pytest.mark.parametrize("visible", [None, "", "void"])
def test_no_nvidia_runtime_injection_means_no_driver(tmp_path, visible):
    rc, out, _ = run(smistate.build_state("h100-80gb", 2, "n"), visible=visible, tmp_path=tmp_path)
    assert rc == smi.EXIT_DRIVER_NOT_LOADED == 9
    assert out == smi.MSG_NO_DRIVER + "\n"
    assert out.startswith("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")


def test_missing_state_means_no_driver(tmp_path):
    rc, out, _ = run(None, tmp_path=tmp_path)
    assert rc == 9 and "couldn't communicate" in out
    rc, out, _ = run(None, tmp_path=tmp_path, raw_env={smi.STATE_ENV: str(tmp_path / "gone.json"),
                                                      smi.VISIBLE_ENV: "all"})
    assert rc == 9


def test_faults(tmp_path):
    rc, out, _ = run(smistate.build_state("h100-80gb", 1, "n", fault=smi.FAULT_DRIVER_UNREACHABLE), tmp_path=tmp_path)
    assert rc == 9
    rc, out, _ = run(smistate.build_state("h100-80gb", 1, "n", fault=smi.FAULT_NO_DEVICES), tmp_path=tmp_path)
    assert (rc, out) == (6, "No devices were found\n")
    rc, _, _ = run(smistate.build_state("h100-80gb", 1, "n", fault=smi.FAULT_DRIVER_UNREACHABLE), "--version",
                   tmp_path=tmp_path)
    assert rc == 9


def test_a_broken_state_file_is_reported_on_stderr(tmp_path):
    path = tmp_path / "smi.json"
    path.write_text("{not json")
    rc, out, err = run(None, tmp_path=tmp_path, raw_env={smi.STATE_ENV: str(path), smi.VISIBLE_ENV: "all"})
    assert (rc, out) == (smi.EXIT_UNKNOWN, "") and "not valid JSON" in err
    path.write_text(json.dumps({"gpus": [{"uuid": "GPU-x"}]}))
    rc, _, err = run(None, tmp_path=tmp_path, raw_env={smi.STATE_ENV: str(path), smi.VISIBLE_ENV: "all"})
    assert rc == 255 and "needs at least 'name' and 'uuid'" in err
    path.write_text(json.dumps({"fault": "gremlins", "gpus": []}))
    rc, _, err = run(None, tmp_path=tmp_path, raw_env={smi.STATE_ENV: str(path), smi.VISIBLE_ENV: "all"})
    assert rc == 255 and "unknown fault 'gremlins'" in err


def test_visible_devices_select_and_renumber(tmp_path):
    state = smistate.build_state("h100-80gb", 4, "n", mig_layout=None)
    uuids = [g["uuid"] for g in state["gpus"]]
    _, out, _ = run(state, "-L", visible=f"{uuids[2]}::3,{uuids[3]}", tmp_path=tmp_path)
    assert out.splitlines() == [f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {uuids[2]})",
                                f"GPU 1: NVIDIA H100 80GB HBM3 (UUID: {uuids[3]})"]
    _, out, _ = run(state, "-L", visible="1", tmp_path=tmp_path)
    assert out == f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {uuids[1]})\n"
    _, out, _ = run(state, "--query-gpu=index,pci.bus_id", "--format=csv,noheader", visible=uuids[3],
                    tmp_path=tmp_path)
    assert out == "0, 00000000:5D:00.0\n"  # renumbered from 0, bus id stays the real one


def test_one_mig_device_per_container(tmp_path):
    state = smistate.build_state("h200-141gb", 1, "n", mig_layout="all-balanced")
    migs = state["gpus"][0]["mig_devices"]
    _, out, _ = run(state, "-L", visible=migs[1]["uuid"], tmp_path=tmp_path)
    assert out.splitlines()[1] == f"  MIG 2g.35gb     Device  0: (UUID: {migs[1]['uuid']})"
    assert len(out.splitlines()) == 2
    _, out, _ = run(state, visible=f"{migs[2]['uuid']},{migs[3]['uuid']}", tmp_path=tmp_path)
    rows = [l for l in out.splitlines() if re.match(r"\|\s+0\s+\d+\s+0\s+\d\s+\|", l)]
    assert [r.split()[4] for r in rows] == ["0", "1"]  # MIG Dev renumbered
    _, out, _ = run(state, "-L", visible="0:0", tmp_path=tmp_path)
    assert out.count("  MIG ") == 1


def test_id_filter(tmp_path):
    state = smistate.build_state("a100-80gb", 3, "n")
    _, out, _ = run(state, "--query-gpu=index,uuid", "--format=csv,noheader", "-i", "2", tmp_path=tmp_path)
    assert out == f"2, {gpu_uuid('n', 2)}\n"
    _, out, _ = run(state, "--query-gpu=index", "--format=csv,noheader", "--id=00000000:2A:00.0", tmp_path=tmp_path)
    assert out == "1\n"
    _, out, _ = run(state, "-q", "-i", "2", tmp_path=tmp_path)
    assert out.count("\nGPU 0000") == 1
    assert re.search(rf"\n    GPU UUID +: {gpu_uuid('n', 2)}\n", out)
    rc, out, _ = run(state, "-i", "9", tmp_path=tmp_path)
    assert (rc, out) == (6, "No devices were found\n")


@pytest.mark.parametrize("id_option", [["-i", "0"], ["--id=0"]])
def test_list_refuses_an_id_like_the_real_580(tmp_path, id_option):
    # Real 580: `nvidia-smi -L -i 0` prints this on stdout and exits 2; it names the option as written
    # (`--query-gpu=name -L`: "Option --query-gpu=name").
    rc, out, err = run(smistate.build_state("h200-141gb", 2, "n"), "-L", *id_option, tmp_path=tmp_path)
    assert (rc, out, err) == (
        2, f"ERROR: Option {id_option[0]} is not valid for this command. Please run 'nvidia-smi -h' for help.\n\n", "")


# -- topo -m ----------------------------------------------------------------------------------


def test_topo_matrix_is_the_reference(tmp_path):
    ref = (REF / "topo.txt").read_text()
    # The capture's machine had 16 CPUs in one NUMA node, so its GPU row says "0-15": the fake
    # prints the CPUs of the machine it runs on, which is the one value that must differ here.
    host_cpus = "0" if os.cpu_count() == 1 else f"0-{os.cpu_count() - 1}"
    rc, out, _ = run(reference_like_state(), "topo", "-m", tmp_path=tmp_path)
    assert rc == 0
    assert "GPU0\t X \t0-15\t0\t\tN/A\n" in ref
    assert out == ref.replace("GPU0\t X \t0-15\t", f"GPU0\t X \t{host_cpus}\t")
    # Given the capture machine's affinity in the state, it is the capture byte for byte.
    rc, out, _ = run(reference_like_state(cpu_affinity="0-15"), "topo", "--matrix", tmp_path=tmp_path)
    assert (rc, out) == (0, ref)


def test_topo_matrix_links_between_gpus(tmp_path):
    ref_legend = (REF / "topo.txt").read_text().split("\n\nLegend:")[1]
    state = smistate.build_state("h100-80gb", 8, "n")
    for gpu in state["gpus"]:
        gpu.update(cpu_affinity="0-55,112-167", numa_affinity=0)
    _, out, _ = run(state, "topo", "-m", tmp_path=tmp_path)
    lines = out.split("\n\nLegend:")[0].splitlines()
    assert out.split("\n\nLegend:")[1] == ref_legend
    assert lines[0] == ("\t\x1b[4m" + "\t".join(f"GPU{i}" for i in range(8))
                        + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m")
    assert lines[3] == "GPU2\tNV18\tNV18\t X \tNV18\tNV18\tNV18\tNV18\tNV18\t0-55,112-167\t0\t\tN/A"
    assert len(lines) == 9
    # A100 SXM boards have 12 NVLinks a GPU; PCIe cards (L4) talk over PCIe; visible devices renumber.
    _, out, _ = run(smistate.build_state("a100-80gb", 2, "n"), "topo", "-m", tmp_path=tmp_path)
    assert out.splitlines()[1].startswith("GPU0\t X \tNV12\t")
    l4 = smistate.build_state("l4", 4, "n")
    _, out, _ = run(l4, "topo", "-m", visible=f"{l4['gpus'][1]['uuid']},{l4['gpus'][3]['uuid']}", tmp_path=tmp_path)
    assert [l.split("\t")[:3] for l in out.splitlines()[1:3]] == [["GPU0", " X ", "NODE"], ["GPU1", "NODE", " X "]]
    assert smi._cpu_list([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"


def test_version_and_help(tmp_path):
    rc, out, _ = run(smistate.build_state("l4", 1, "n"), "--version", tmp_path=tmp_path)
    assert rc == 0 and out.splitlines() == ["NVIDIA-SMI version  : 580.159.04", "NVML version        : 580.159",
                                            "DRIVER version      : 580.159.04", "CUDA Version        : 13.0"]
    rc, out, _ = run(smistate.build_state("l4", 1, "n"), "-h", tmp_path=tmp_path)
    assert rc == 0 and "NVIDIA System Management Interface -- v580.159.04" in out and "--query-gpu" in out


def test_loop_rereads_the_state(tmp_path, monkeypatch):
    state = smistate.build_state("l4", 1, "n")
    path = tmp_path / "smi.json"
    smistate.write_state(str(path), state)
    frames = []

    def fake_sleep(_seconds):
        frames.append(1)
        if len(frames) == 2:
            raise KeyboardInterrupt
        state["gpus"][0]["utilization_gpu"] = 55
        smistate.write_state(str(path), state)

    monkeypatch.setattr(smi.time, "sleep", fake_sleep)
    out = io.StringIO()
    rc = smi.run(["--query-gpu=utilization.gpu", "--format=csv,noheader", "-l", "1"],
                 env={smi.STATE_ENV: str(path), smi.VISIBLE_ENV: "all"}, out=out, err=io.StringIO())
    assert rc == 0 and out.getvalue() == "0 %\n55 %\n"


# -- CUDA errors -----------------------------------------------------------------------------


def test_cuda_error_strings_are_available():
    assert cudaerrors.CUDA_ERRORS["cudaErrorInsufficientDriver"].message == (
        "CUDA driver version is insufficient for CUDA runtime version")
    assert cudaerrors.CUDA_ERRORS["cudaErrorNoDevice"].message == "no CUDA-capable device is detected"
    assert cudaerrors.CUDA_ERRORS["cudaErrorSystemNotReady"].message == "system not yet initialized"
    assert {e.code for e in cudaerrors.CUDA_ERRORS.values()} == {35, 100, 802}
    assert set(cudaerrors.FAULT_CUDA_ERRORS) == set(smi.FAULTS)


def test_which_fault_triggers_which_cuda_error():
    ok = smistate.build_state("h100-80gb", 1, "n")
    assert cudaerrors.cuda_error(ok, "all", "12.6") is None
    assert cudaerrors.cuda_error(None, "all") is cudaerrors.CUDA_ERROR_INSUFFICIENT_DRIVER
    assert cudaerrors.cuda_error(ok, None) is cudaerrors.CUDA_ERROR_INSUFFICIENT_DRIVER
    assert cudaerrors.cuda_error(ok, "none") is cudaerrors.CUDA_ERROR_NO_DEVICE
    assert cudaerrors.cuda_error(ok, "all", "13.1") is cudaerrors.CUDA_ERROR_INSUFFICIENT_DRIVER
    old = smistate.build_state("h100-80gb", 1, "n", driver_version="535.54.03", cuda_version="12.2")
    assert cudaerrors.cuda_error(old, "all", "12.6") is cudaerrors.CUDA_ERROR_INSUFFICIENT_DRIVER
    for fault, expected in cudaerrors.FAULT_CUDA_ERRORS.items():
        assert cudaerrors.cuda_error(smistate.build_state("h100-80gb", 1, "n", fault=fault), "all") is expected
    empty = smistate.build_state("h100-80gb", 1, "n", mig_layout="all-enabled")
    assert cudaerrors.cuda_error(empty, "all") is cudaerrors.CUDA_ERROR_NO_DEVICE


# -- integration with the rest of fakegpu ---------------------------------------------------


def test_device_plugin_ids_resolve_in_nvidia_smi(tmp_path):
    cfg = parse_config("sharing:\n  timeSlicing:\n    resources: [{name: nvidia.com/gpu, replicas: 4}]")
    res = advertised_resources("h100-80gb", 2, "gpu-node-1", cfg)
    state = smistate.build_state("h100-80gb", 2, "gpu-node-1")
    replica = res.get("nvidia.com/gpu").ids[5]                  # a replica of GPU 1
    _, out, _ = run(state, "-L", visible=replica, tmp_path=tmp_path)
    assert out == f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {gpu_uuid('gpu-node-1', 1)})\n"
    mixed = advertised_resources("h100-80gb", 1, "gpu-node-1", mig_layout="all-1g.10gb", mig_strategy="mixed")
    mstate = smistate.build_state("h100-80gb", 1, "gpu-node-1", mig_layout="all-1g.10gb")
    assert [d.id for d in mixed.get("nvidia.com/mig-1g.10gb").devices] == [
        m["uuid"] for m in mstate["gpus"][0]["mig_devices"]]


def test_the_device_plugins_allocation_file_is_understood(tmp_path):
    res = advertised_resources("h100-80gb", 1, "n", mig_layout="all-balanced", mig_strategy="mixed")
    state = smistate.build_state("h100-80gb", 1, "n", mig_layout="all-balanced")
    inventory = res.to_inventory(state)
    dev = inventory["resources"][1]["devices"][0]   # the 2g.20gb
    document = {"allocationID": "x", "resource": inventory["resources"][1]["name"], "deviceIDs": [dev["id"]],
                "visibleDevices": [dev["uuid"]], "devices": [dev["info"]]}
    path = tmp_path / "alloc.json"
    path.write_text(json.dumps(document))
    out = io.StringIO()
    rc = smi.run(["-L"], env={smi.STATE_ENV: str(path), smi.VISIBLE_ENV: dev["uuid"]}, out=out, err=io.StringIO())
    assert rc == 0
    assert out.getvalue().splitlines()[1] == f"  MIG 2g.20gb     Device  0: (UUID: {dev['uuid']})"
    path.write_text(json.dumps({**document, "devices": [{"uuid": dev["uuid"]}]}))
    err = io.StringIO()
    assert smi.run(["-L"], env={smi.STATE_ENV: str(path), smi.VISIBLE_ENV: "all"}, out=io.StringIO(), err=err) == 255
    assert "to_inventory" in err.getvalue()


def test_write_state_is_atomic_and_round_trips(tmp_path):
    state = smistate.build_state("l4", 2, "n")
    path = tmp_path / "s.json"
    smistate.write_state(str(path), state)
    assert smi.read_state(str(path)) == json.loads(json.dumps(state))
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]
    with pytest.raises(ValueError, match="unknown fault"):
        smistate.build_state("l4", 1, "n", fault="gremlins")


# -- it runs as a command, on the standard library alone ------------------------------------


def _state_file(tmp_path: Path) -> str:
    path = tmp_path / "s.json"
    smistate.write_state(str(path), smistate.build_state("h100-80gb", 1, "n"))
    return str(path)


@pytest.mark.parametrize("how", ["script", "module"])
def test_runs_as_a_command_without_gpulab_dependencies(tmp_path, how):
    env = {"PATH": os.environ.get("PATH", ""), smi.STATE_ENV: _state_file(tmp_path), smi.VISIBLE_ENV: "all"}
    probe = (
        "import runpy, sys\n"
        "sys.argv = ['nvidia-smi', '-L']\n"
        "try:\n"
        f"    runpy.run_{'path' if how == 'script' else 'module'}({str(SCRIPT)!r} if {how == 'script'} "
        "else 'gpulab.fakegpu.nvidiasmi', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    bad = sorted(m for m in sys.modules if m.split('.')[0] in ('yaml', 'grpc', 'kubernetes')"
        " or (m.startswith('gpulab') and m not in ('gpulab', 'gpulab.fakegpu', 'gpulab.fakegpu.nvidiasmi')))\n"
        "    print('IMPORTED', bad, 'RC', e.code)\n"
    )
    cwd = str(REPO) if how == "module" else str(tmp_path)
    proc = subprocess.run([sys.executable, "-c", probe], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-")
    assert proc.stdout.strip().endswith("IMPORTED [] RC 0")


def test_script_entry_point(tmp_path):
    env = {"PATH": os.environ.get("PATH", ""), smi.STATE_ENV: _state_file(tmp_path), smi.VISIBLE_ENV: "none"}
    proc = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30,
                          cwd=str(tmp_path))
    assert (proc.returncode, proc.stdout) == (6, "No devices were found\n")


# -- the real H100 captures: every invocation of their index, numbers aside ---------------------

H100 = REPO / "tests" / "fixtures" / "nvidia-h100"
HELP_CAPTURES = {"h", "dmon-h", "pmon-h", "nvlink-h", "help-query-gpu", "help-query-compute-apps"}


def h100_captures() -> list[tuple[str, int, list[str]]]:
    """(file name, exit status, argv) of each line of the captures' index."""
    rows = []
    for line in (H100 / "index.tsv").read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, status, invocation = line.split("\t")
        argv = shlex.split(invocation)
        assert argv[0] == "nvidia-smi"
        rows.append((name, int(status), argv[1:]))
    return rows


def h100_state(busy: bool = False) -> dict:
    """One H100 like the captured one: its identity and the VM's quirks read off its -x -q, no NVLink peers
    (the VM shows none), and with ``busy`` the one CUDA program of the busy-* captures."""
    xml = (H100 / "x-q.txt").read_text()

    def tag(name: str) -> str:
        return re.search(rf"<{name}>([^<]*)</{name}>", xml)[1]

    state = smistate.build_state("h100-80gb", 1, "ref-node", timestamp=1_796_476_845)
    gpu = state["gpus"][0]
    gpu.update(
        bus_id=re.search(r'<gpu id="([^"]+)">', xml)[1], uuid=tag("uuid"), serial=tag("serial"),
        module_id=int(tag("module_id")), nvlinks=0, fabric={"state": tag("state"), "status": tag("status")},
        vbios_version=tag("vbios_version"),
        board_part_number=tag("board_part_number"), gpu_part_number=tag("gpu_part_number"),
        inforom_image=tag("img_version"), display_attached=tag("display_attached") == "Yes",
        virtualization_mode=tag("virtualization_mode"), cpu_affinity="0-15",
        memory_power_draw_w=float(re.search(r"<gpu_memory_power_readings>\s*<average_power_draw>([\d.]+) W", xml)[1]),
        supported_memory_clocks=[int(m) for m in re.findall(r"<value>(\d+) MHz</value>", xml)],
        row_remapper_banks=int(tag("row_remapper_histogram_max").split()[0]),
    )
    if busy:
        gpu.update(utilization_gpu=100, utilization_memory=10, memory_used_mib=3139, clocks=dict(gpu["max_clocks"]),
                   processes=[{"pid": 670, "type": "C", "name": "python3", "used_memory_mib": 3130}])
    return state


_CTIME = re.compile(r"[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}")
_NUMBER = re.compile(r"(?<![A-Za-z0-9_])( *)\d+(?:\.\d+)?")


def mask(text: str) -> str:
    """``text`` with its numbers replaced by ``#``; labels, headers and layout kept.

    A number is a digit run (with a decimal part) that does not continue a word, so
    "H100", "GPU0", "bar1" and "P0" stay. Right-aligned columns keep their width: a number
    with two or more blanks before it becomes blanks and one ``#`` as wide as both together
    (dmon's "    695" and "     76" mask alike); after a single blank or none (a -q value,
    a CSV cell, an XML element) it is one ``#``. ctime dates are one ``#`` as well.
    """
    def number(m: re.Match) -> str:
        blanks = m[1]
        return "#".rjust(len(m[0])) if len(blanks) >= 2 else blanks + "#"

    return _NUMBER.sub(number, _CTIME.sub("#", text))


def test_mask_keeps_labels_and_column_widths():
    assert mask("    0     76     48 \n    0    695     68 \n") == "    #      #      # \n" * 2
    assert mask("Total                : 81559 MiB\n") == mask("Total                : 0 MiB\n") == (
        "Total                : # MiB\n")
    assert mask("NVIDIA H100 80GB HBM3, GPU0, <bar1_memory_usage>, P0, 0x0000000000000001") == (
        "NVIDIA H100 #GB HBM3, GPU0, <bar1_memory_usage>, P0, #x0000000000000001")
    assert mask("Timestamp : Sat Dec  5 13:20:45 2026") == mask("Timestamp : Tue Nov 14 22:13:20 2023")


@pytest.mark.parametrize(("name", "status", "argv"), h100_captures(), ids=lambda x: x if isinstance(x, str) else "")
def test_the_h100_captures(tmp_path, monkeypatch, name, status, argv):
    monkeypatch.setattr(smi.time, "sleep", lambda seconds: None)  # dmon/pmon samples
    rc, out, err = run(h100_state(busy=name.startswith("busy-")), *argv, tmp_path=tmp_path)
    assert (rc, err) == (status, "")
    if name in HELP_CAPTURES:
        return  # the fake writes its own help: test_help_* compare what it offers
    assert mask(out) == mask((H100 / f"{name}.txt").read_text())


# -- help: the fake's own words, the real tool's option and field names ---------------------------


def _help_options(text: str) -> set[str]:
    """Options of a top-level help (``-h,   --help``, ``--query-gpu``) and its subcommands (``dmon``)."""
    found = set()
    for line in text.splitlines():
        m = re.match(r" {4}(?:(-\w+),? +| {6})?(--[\w-]+)", line)
        if m:
            found |= {o for o in m.groups() if o}
        m = re.match(r" {4}([a-z][\w-]+) {2,}\S", line)
        if m:
            found.add(m[1])
    return found


def _bracket_options(text: str) -> set[str]:
    """``[-i | --id]`` options of a subcommand's help, and its ``-s`` letters as ``s:x``."""
    found = {o for pair in re.findall(r"\[(-\w+|N/A) \| (--[\w-]+)\]", text) for o in pair if o != "N/A"}
    return found | {f"s:{letter}" for letter in re.findall(r"(?m)^ {30}(\w) - ", text)}


def test_help_offers_only_real_options_and_all_the_fake_takes(tmp_path):
    state = h100_state()
    _, out, _ = run(state, "-h", tmp_path=tmp_path)
    real = (H100 / "h.txt").read_text()
    assert out.splitlines()[0] == real.splitlines()[0]  # NVIDIA System Management Interface -- v580.159.04
    mine = _help_options(out)
    assert mine <= _help_options(real)
    taken = {name.rstrip("=") for name in smi._MAIN_OPTIONS} - {"--help-query-gpu", "--help-query-compute-apps"}
    assert taken <= mine | {"--query"} and "-q" in mine  # -q's long form is on -q's line
    assert {"dmon", "pmon", "nvlink", "topo", "mig"} <= mine
    assert "Tesla" not in out and "NVML C-based" not in out  # not NVIDIA's prose


@pytest.mark.parametrize("tool", ["dmon", "pmon", "nvlink"])
def test_subcommand_help(tmp_path, tool):
    rc, out, _ = run(h100_state(), tool, "-h", tmp_path=tmp_path)
    real = (H100 / f"{tool}-h.txt").read_text()
    assert rc == 0 and f"Usage: nvidia-smi {tool} [options]" in out
    mine = _bracket_options(out)
    assert mine <= _bracket_options(real)
    table = smi._NVLINK_OPTIONS if tool == "nvlink" else smi._MONITOR_OPTIONS[tool]
    assert set(table) == {o for o in mine if o.startswith("-")}
    if tool != "nvlink":
        letters = smi._DMON_SELECT if tool == "dmon" else smi._PMON_SELECT
        assert {o[2:] for o in mine if o.startswith("s:")} == set(letters) | {"D", "T"}  # -s and -o letters
        default = r"--select\]:.*\[default=(\w+)\]"
        assert re.findall(default, out) == re.findall(default, real)
    assert "Tesla" not in out


def _help_fields(text: str) -> dict[str, set[str]]:
    """``"name" or "alias"`` lines of a --help-query-* text: name -> aliases."""
    fields = {}
    for line in text.splitlines():
        names = re.fullmatch(r'"([^"]+)"((?: or "[^"]+")*)', line)
        if names:
            fields[names[1]] = set(re.findall(r'"([^"]+)"', names[2])) - {names[1]}
    return fields


@pytest.mark.parametrize("switch", ["--query-gpu", "--query-compute-apps"])
def test_query_help_lists_real_fields_with_their_real_aliases(tmp_path, switch):
    rc, out, _ = run(h100_state(), "--help" + switch[1:], tmp_path=tmp_path)
    real = _help_fields((H100 / f"help{switch[1:]}.txt").read_text())
    mine = _help_fields(out)
    assert rc == 0 and out.splitlines()[0].endswith(f'"{switch}":')
    assert set(mine) <= set(real)
    assert {name: aliases for name, aliases in mine.items()} == {name: real[name] for name in mine}
    query = smi._SELECTIVE[switch]
    assert set(mine) == set(query.fields)  # the help is the field table
    assert {a for aliases in mine.values() for a in aliases} == set(query.aliases)
    # Every field answers, old names under their current ones.
    rc, csv, _ = run(h100_state(busy=True), f"{switch}={','.join(mine)}", tmp_path=tmp_path)
    assert rc == 0 and csv.splitlines()[0].split(", ")[:3] == [
        f"{n} [{query.fields[n][0]}]" if query.fields[n][0] else n for n in list(mine)[:3]]
    for name, aliases in mine.items():
        for alias in aliases:
            _, one, _ = run(h100_state(busy=True), f"{switch}={alias}", tmp_path=tmp_path)
            assert one.splitlines()[0].split(" [")[0] == name


# -- the rest of the widened surface ------------------------------------------------------------


def test_xml_report_nests_mig_devices_and_processes(tmp_path):
    import xml.etree.ElementTree as ET

    state = smistate.build_state("h100-80gb", 2, "n", mig_layout="all-balanced")
    gi = state["gpus"][0]["mig_devices"][0]["gi_id"]
    state["gpus"][0]["processes"] = [{"pid": 99, "type": "C", "name": "infer & train", "used_memory_mib": 512,
                                      "gi_id": gi, "ci_id": 0}]
    rc, out, _ = run(state, "-x", "-q", tmp_path=tmp_path)
    assert rc == 0
    root = ET.fromstring(out.split("\n", 2)[2])  # after the declaration and DOCTYPE
    gpus = root.findall("gpu")
    assert [g.get("id") for g in gpus] == [g["bus_id"] for g in state["gpus"]]
    devices = gpus[0].findall("mig_devices/mig_device")
    migs = sorted(state["gpus"][0]["mig_devices"], key=lambda m: m["gi_id"])
    assert [(d.findtext("gpu_instance_id"), d.findtext("device_attributes/shared/multiprocessor_count"))
            for d in devices] == [(str(m["gi_id"]), str(m["sm"])) for m in migs]
    proc = gpus[0].find("processes/process_info")
    assert (proc.findtext("pid"), proc.findtext("process_name"), proc.findtext("used_memory")) == (
        "99", "infer & train", "512 MiB")
    assert gpus[1].find("processes/process_info") is None and gpus[1].find("processes") is not None
    assert "\t</gpu>\n\n\t<gpu id=" in out and out.endswith("\t</gpu>\n\n</nvidia_smi_log>\n")
    # -q shows the same process with its colon at 42, like the real report.
    _, text, _ = run(state, "-q", "-d", "PIDS", "-i", "0", tmp_path=tmp_path)
    assert "            Name                          : infer & train" in text.splitlines()


def test_query_compute_apps_and_pmon_follow_the_processes(tmp_path, monkeypatch):
    monkeypatch.setattr(smi.time, "sleep", lambda seconds: None)
    state = smistate.build_state("h100-80gb", 2, "n")
    state["gpus"][1].update(utilization_gpu=90, utilization_memory=54, processes=[
        {"pid": 31, "type": "C", "name": "train", "used_memory_mib": 4096, "utilization": 60},
        {"pid": 32, "type": "C", "name": "serve", "used_memory_mib": 1024, "utilization": 30}])
    _, out, _ = run(state, "--query-compute-apps=gpu_name,pid,name,used_memory", "--format=csv,noheader,nounits",
                    tmp_path=tmp_path)
    assert out.splitlines() == ["NVIDIA H100 80GB HBM3, 31, train, 4096", "NVIDIA H100 80GB HBM3, 32, serve, 1024"]
    _, out, _ = run(state, "pmon", "-c", "1", "-s", "um", tmp_path=tmp_path)
    rows = [line.split() for line in out.splitlines()[2:]]
    assert rows == [["0", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-"],
                    ["1", "31", "C", "60", "36", "-", "-", "-", "-", "4096", "0", "train"],
                    ["1", "32", "C", "30", "18", "-", "-", "-", "-", "1024", "0", "serve"]]
    _, out, _ = run(state, "dmon", "-c", "2", "-s", "um", "-i", "1", tmp_path=tmp_path)
    assert [line.split() for line in out.splitlines()[2:]] == [["1", "90", "54", "0", "0", "0", "0", "0", "1", "0"]] * 2


def test_dmon_under_mig_prints_no_utilisation(tmp_path):
    _, out, _ = run(smistate.build_state("a100-80gb", 1, "n", mig_layout="all-1g.10gb"), "dmon", "-c", "1",
                    "-s", "u", tmp_path=tmp_path)
    assert out.splitlines()[2].split() == ["0", "-", "-", "-", "-", "-", "-"]


def test_nvlink_status_of_sxm_boards(tmp_path):
    state = smistate.build_state("h100-80gb", 8, "n")
    rc, out, _ = run(state, "nvlink", "-s", "-i", "2", tmp_path=tmp_path)
    lines = out.splitlines()
    assert rc == 0 and lines[0] == f"GPU 2: NVIDIA H100 80GB HBM3 (UUID: {state['gpus'][2]['uuid']})"
    assert lines[1:] == [f"\t Link {n}: 26.562 GB/s" for n in range(18)]
    _, out, _ = run(smistate.build_state("a100-80gb", 1, "n"), "nvlink", "--status", tmp_path=tmp_path)
    assert out.splitlines()[1:] == [f"\t Link {n}: 25 GB/s" for n in range(12)]
    _, out, _ = run(state, "nvlink", "-c", "-i", "0", "-l", "17", tmp_path=tmp_path)
    assert out.splitlines()[1:3] == ["\t Link 17, P2P is supported: true",
                                     "\t Link 17, Access to system memory supported: true"]
    for quiet in (smistate.build_state("l4", 2, "n"), h100_state()):  # PCIe cards; a VM without NVLink peers
        assert run(quiet, "nvlink", "-s", tmp_path=tmp_path)[:2] == (0, "")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["-q", "-x", "-d", "MEMORY"], smi.MSG_D_WITH_X + "\n"),
        (["-x"], smi.MSG_INVALID_ARGS + "\n"),
        (["dmon", "-s", "z"], smi.MSG_INVALID_ARGS + "\n"),
        (["pmon", "-s", "p"], smi.MSG_INVALID_ARGS + "\n"),
        (["dmon", "-c", "0"], smi.MSG_INVALID_ARGS + "\n"),
        (["nvlink", "-x"], smi.MSG_INVALID_ARGS + "\n"),
        (["--query-compute-apps=pid,bogus"], 'Field "bogus" is not a valid field to query.\n\n'),
    ],
)
def test_more_refused_command_lines(tmp_path, argv, expected):
    assert run(smistate.build_state("h100-80gb", 1, "n"), *argv, tmp_path=tmp_path)[:2] == (2, expected)


def test_topo_refuses_an_id_like_the_real_580(tmp_path):
    rc, out, _ = run(smistate.build_state("h100-80gb", 2, "n"), "topo", "-m", "-i", "0", tmp_path=tmp_path)
    assert (rc, out) == (255, "The -i command line argument must be used in conjunction with -n or -p.\n\n")
