"""GPU models as data: lookup, label values, MIG profiles, device identity."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

from gpulab.hardware import models as m

REPO = Path(__file__).resolve().parents[2]


# Real H200 output captured for these tests (see the README there).
REF = REPO / "tests" / "fixtures" / "nvidia-h200"


def test_the_required_models_exist():
    assert {"h100-80gb", "h200-141gb", "a100-80gb", "a100-40gb", "a30", "l4"} <= set(m.model_keys())
    assert [x.key for x in m.list_models()] == m.model_keys()


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("h100-80gb", "h100-80gb"),
        ("NVIDIA-H100-80GB-HBM3", "h100-80gb"),          # GFD product label
        ("NVIDIA H100 80GB HBM3", "h100-80gb"),          # nvidia-smi name
        ("nvidia-h100-80gb-hbm3", "h100-80gb"),          # case does not matter
        ("NVIDIA-H100-SXM5-80GB", "h100-80gb"),          # the chapter's spelling
        ("  h200-141gb ", "h200-141gb"),
        ("NVIDIA-H200", "h200-141gb"),
        ("NVIDIA-A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA-A100-SXM4-40GB", "a100-40gb"),
        ("NVIDIA-L4", "l4"),
        ("NVIDIA-A30", "a30"),
        ("NVIDIA A30", "a30"),                            # DCGM's modelName
        ("A30-24GB", "a30"),
    ],
)
def test_get_model_accepts_keys_and_product_names(name, key):
    assert m.get_model(name).key == key


def test_get_model_passes_a_model_through():
    model = m.get_model("l4")
    assert m.get_model(model) is model


def test_unknown_model_error_lists_the_allowed_keys():
    with pytest.raises(m.UnknownGpuModel) as exc:
        m.get_model("h300")
    msg = str(exc.value)
    assert "'h300'" in msg
    for key in m.model_keys():
        assert key in msg
    assert isinstance(exc.value, LookupError) and isinstance(exc.value, ValueError)
    assert exc.value.allowed == tuple(m.model_keys())


@pytest.mark.parametrize("model", m.list_models(), ids=lambda x: x.key)
def test_gfd_product_is_the_sanitised_nvml_name(model):
    assert model.gfd_product == m.sanitize_label_value(model.product_name)
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", model.gfd_product)
    assert len(model.gfd_product) <= 63


@pytest.mark.parametrize("model", m.list_models(), ids=lambda x: x.key)
def test_family_follows_compute_capability(model):
    assert model.family == m.family_for_compute_capability(model.compute_major, model.compute_minor)


@pytest.mark.parametrize(
    ("cc", "family"),
    [((7, 0), "volta"), ((7, 5), "turing"), ((8, 0), "ampere"), ((8, 6), "ampere"), ((8, 9), "ada-lovelace"),
     ((9, 0), "hopper"), ((10, 0), "blackwell"), ((4, 0), "undefined")],
)
def test_family_table(cc, family):
    assert m.family_for_compute_capability(*cc) == family


def test_sanitize_label_value():
    assert m.sanitize_label_value("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert m.sanitize_label_value("Tesla  T4 (rev+a)") == "Tesla-T4-reva"
    assert m.sanitize_label_value("1g.10gb+me") == "1g.10gbme"


def test_values_seen_on_real_hardware():
    h100 = m.get_model("h100-80gb")
    assert (h100.product_name, h100.gfd_product, h100.memory_mib) == (
        "NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3", 81559)
    assert h100.compute_capability == "9.0" and h100.family == "hopper"
    p = h100.mig_profile("1g.10gb")
    assert (p.memory_mib, p.multiprocessors, p.copy_engines, p.decoders, p.encoders, p.jpeg, p.ofa) == (
        9984, 16, 1, 1, 0, 1, 0)
    assert (h100.mig_profile("2g.20gb").memory_mib, h100.mig_profile("3g.40gb").multiprocessors) == (20096, 60)
    a100 = m.get_model("a100-40gb")
    p = a100.mig_profile("1g.5gb")
    assert (p.memory_mib, p.multiprocessors, p.copy_engines, p.decoders) == (4864, 14, 1, 0)
    assert h100.pci.device_id == "0x233010DE"
    assert m.get_model("h200-141gb").pci.device_id == "0x233510DE"
    l4 = m.get_model("l4")
    assert not l4.mig_capable and l4.family == "ada-lovelace" and l4.compute_capability == "8.9"


def test_profile_naming():
    p = m.get_model("h100-80gb").mig_profile("1g.10gb+me")
    assert p.config_name == "1g.10gb.me"
    assert p.resource_name == "nvidia.com/mig-1g.10gb.me"
    assert not p.is_base
    assert m.get_model("h100-80gb").mig_profile("1g.10gb.me") is p
    with pytest.raises(m.GpuModelError, match="no MIG profile '9g.1gb'.*1g.10gb"):
        m.get_model("h100-80gb").mig_profile("9g.1gb")


def test_h200_matches_the_reference_capture():
    h200 = m.get_model("h200-141gb")
    smi = (REF / "nvidia-smi.txt").read_text()
    assert f"  {h200.product_name}  " in smi
    assert f"/ {h200.memory_mib}MiB" in smi
    assert f"{h200.power.limit_w:.0f}W |" in smi
    header, row = (REF / "query.csv").read_text().splitlines()[:2]
    values = dict(zip([h.strip() for h in header.split(",")], [v.strip() for v in row.split(",")]))
    assert values["name"] == h200.product_name
    assert values["memory.total [MiB]"] == f"{h200.memory_mib} MiB"
    assert values["compute_cap"] == h200.compute_capability
    assert values["power.limit [W]"] == f"{h200.power.limit_w:.2f} W"
    q = (REF / "nvidia-smi-q.txt").read_text()
    assert f": {h200.pci.device_id}" in q and f": {h200.pci.subsystem_id}" in q
    assert f"Reserved                                       : {h200.memory_reserved_mib} MiB" in q
    assert f": {h200.bar1_mib} MiB" in q
    assert f"Product Architecture                               : {h200.architecture}" in q


def test_h200_mig_profiles_match_nvidia_smi_mig_lgip():
    h200 = m.get_model("h200-141gb")
    lines = (REF / "mig-lgip.txt").read_text().splitlines()
    rows = [l for l in lines if re.match(r"\|\s+\d+\s+MIG ", l)]
    seconds = [lines[lines.index(r) + 1] for r in rows]
    assert len(rows) == len(h200.mig_profiles)
    for row, second, p in zip(rows, seconds, h200.mig_profiles):
        f = row.strip("|").split()
        name, pid, inst, gib, sm, dec, enc = f[2], int(f[3]), f[4], float(f[5]), int(f[7]), int(f[8]), int(f[9])
        ce, jpeg, ofa = (int(x) for x in second.strip("|").split())
        assert (name, pid, inst) == (p.name, p.gi_profile_id, f"{p.max_instances}/{p.max_instances}")
        assert gib == pytest.approx(p.memory_mib / 1024, abs=0.005)
        assert (sm, dec, enc, ce, jpeg, ofa) == (p.multiprocessors, p.decoders, p.encoders,
                                                 p.copy_engines, p.jpeg, p.ofa)
    placements = {}
    for line in (REF / "mig-lgipp.txt").read_text().splitlines():
        mm = re.search(r"Profile ID\s+(\d+) Placements?\s*: \{([\d,]+)\}:(\d+)", line)
        placements[int(mm[1])] = (tuple(int(x) for x in mm[2].split(",")), int(mm[3]))
    for p in h200.mig_profiles:
        assert placements[p.gi_profile_id] == (p.placements, p.memory_slices)


def test_layout_names_follow_mig_parted():
    names = m.get_model("h100-80gb").mig_layout_names()
    assert names[:2] == ["all-disabled", "all-enabled"] and names[-1] == "all-balanced"
    assert "all-1g.10gb" in names and "all-1g.10gb.me" in names and "all-7g.80gb" in names
    assert m.get_model("l4").mig_layout_names() == ["all-disabled"]


def test_layout_lookup_errors():
    with pytest.raises(m.UnknownMigLayout) as exc:
        m.get_model("h200-141gb").mig_layout("all-1g.10gb")
    assert "all-1g.18gb" in str(exc.value) and exc.value.allowed[0] == "all-disabled"
    with pytest.raises(m.MigNotSupported, match="NVIDIA L4 is not MIG-capable"):
        m.get_model("l4").mig_layout("all-1g.10gb")
    with pytest.raises(m.MigNotSupported):
        m.get_model("l4").mig_layout("all-balanced")
    assert m.get_model("l4").mig_layout("all-disabled") == []


def test_plus_form_of_a_layout_name_is_accepted():
    h100 = m.get_model("h100-80gb")
    assert h100.layout("all-1g.10gb+me") is h100.layout("all-1g.10gb.me")


@pytest.mark.parametrize(
    ("counts", "problem"),
    [
        ({"3g.40gb": 2, "1g.10gb": 1}, "does not fit"),
        ({"7g.80gb": 1, "1g.10gb": 1}, "compute slices"),
        ({"1g.10gb": 8}, "at most 7"),
        ({"4g.40gb": 1, "4g.40gb+x": 1}, "no MIG profile"),
        ({"1g.10gb": -1}, "non-negative"),
    ],
)
def test_place_rejects_impossible_geometries(counts, problem):
    with pytest.raises(m.GpuModelError, match=problem):
        m.get_model("h100-80gb").place(counts)


def test_place_finds_a_legal_geometry():
    slices = m.get_model("h100-80gb").place({"4g.40gb": 1, "3g.40gb": 1})
    assert sorted((s.name, s.start) for s in slices) == [("3g.40gb", 4), ("4g.40gb", 0)]


def test_gpu_instance_ids_follow_the_driver():
    # 8 memory slices (A100/H100/H200)
    assert m.gi_id_for(0, 8, 8) == 0
    assert (m.gi_id_for(0, 4, 8), m.gi_id_for(4, 4, 8)) == (1, 2)
    assert (m.gi_id_for(0, 2, 8), m.gi_id_for(4, 2, 8)) == (3, 5)
    assert (m.gi_id_for(0, 1, 8), m.gi_id_for(6, 1, 8)) == (7, 13)
    # 4 memory slices (A30; real: 1g at 0..3 -> GI 3..6, 2g at 2 -> GI 2)
    assert [m.gi_id_for(i, 1, 4) for i in range(4)] == [3, 4, 5, 6]
    assert (m.gi_id_for(0, 2, 4), m.gi_id_for(2, 2, 4), m.gi_id_for(0, 4, 4)) == (1, 2, 0)
    for bad in ((1, 2, 8), (0, 8, 4), (4, 1, 4), (0, 1, 6)):
        with pytest.raises(m.GpuModelError):
            m.gi_id_for(*bad)


@pytest.mark.parametrize("model", [x for x in m.list_models() if x.mig_capable], ids=lambda x: x.key)
def test_every_mig_model_declares_its_slices_and_a_whole_gpu_profile(model):
    whole = [p for p in model.mig_profiles
             if (p.compute_slices, p.memory_slices) == (model.mig_compute_slices, model.mig_memory_slices)]
    assert len(whole) == 1 and whole[0].placements == (0,)
    assert model.layout(f"all-{whole[0].config_name}").slices[0].gi_id == 0
    for p in model.mig_profiles:
        assert model.mig_share(p) == pytest.approx(p.compute_slices / model.mig_compute_slices)


def test_slices_and_shares_are_the_models():
    h100, a30 = m.get_model("h100-80gb"), m.get_model("a30")
    assert (h100.mig_memory_slices, h100.mig_compute_slices) == (8, 7)
    assert (a30.mig_memory_slices, a30.mig_compute_slices) == (4, 4)
    assert h100.mig_share("1g.10gb") == pytest.approx(1 / 7) and a30.mig_share("1g.6gb") == 0.25
    assert a30.mig_share("2g.12gb+me") == 0.5
    l4 = m.get_model("l4")
    assert (l4.mig_memory_slices, l4.mig_compute_slices) == (0, 0)
    with pytest.raises(m.MigNotSupported):
        l4.mig_share("1g.10gb")
    with pytest.raises(m.MigPlacementError, match="needs 5 compute slices; a NVIDIA A30 has 4"):
        a30.place({"4g.24gb": 1, "1g.6gb": 1})


def test_a30_matches_the_real_captures():
    a30 = m.get_model("a30")
    assert (a30.product_name, a30.memory_mib, a30.power.limit_w, a30.compute_capability) == (
        "NVIDIA A30", 24576, 165, "8.0")
    assert a30.pci.device_id == "0x20B710DE"
    # nvidia-smi mig -lgip / -lgipp on a real A30 (driver 535.183.01)
    lgip = {"1g.6gb": (14, 4, 5.81, 14), "1g.6gb+me": (21, 1, 5.81, 14), "2g.12gb": (5, 2, 11.69, 28),
            "2g.12gb+me": (6, 1, 11.69, 28), "4g.24gb": (0, 1, 23.44, 56)}
    lgipp = {14: ((0, 1, 2, 3), 1), 21: ((0, 1, 2, 3), 1), 5: ((0, 2), 2), 6: ((0, 2), 2), 0: ((0,), 4)}
    assert [p.name for p in a30.mig_profiles] == list(lgip)
    for p in a30.mig_profiles:
        pid, inst, gib, sm = lgip[p.name]
        assert (p.gi_profile_id, p.max_instances, p.multiprocessors) == (pid, inst, sm)
        assert p.memory_mib / 1024 == pytest.approx(gib, abs=0.005)
        assert lgipp[pid] == (p.placements, p.memory_slices)


def test_gpu_uuids_are_deterministic_and_look_real():
    a = m.gpu_uuid("gpu-node-1", 0)
    assert a == m.gpu_uuid("gpu-node-1", 0)
    assert a != m.gpu_uuid("gpu-node-1", 1) != m.gpu_uuid("gpu-node-2", 0)
    assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", a)
    mig = m.mig_uuid(a, 7, 0)
    assert mig == m.mig_uuid(a, 7, 0) != m.mig_uuid(a, 8, 0)
    assert re.fullmatch(r"MIG-[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", mig)
    assert uuid.UUID(mig[4:]).version == 5  # as real MIG UUIDs
    with pytest.raises(ValueError):
        m.gpu_uuid("n", -1)


def test_pci_bus_ids_are_distinct_for_sixteen_gpus():
    ids = [m.pci_bus_id(i) for i in range(16)]
    assert len(set(ids)) == 16
    assert ids[0] == "00000000:18:00.0"
    assert all(re.fullmatch(r"00000000:[0-9A-F]{2}:00\.0", i) for i in ids)


# -- models.yaml validation ---------------------------------------------------

_MINIMAL = """
schema: gpulab.fakegpu/models/v1
models:
  t4:
    product_name: Tesla T4
    gfd_product: {gfd}
    aliases: [{alias}]
    brand: NVIDIA
    architecture: Turing
    family: turing
    compute_capability: "7.5"
    form_factor: pcie
    memory_mib: 15360
    memory_reserved_mib: 0
    bar1_mib: 256
    power: {{limit_w: 70, min_w: 60, max_w: 70, idle_w: 10}}
    temperature: {{idle_c: 40, memory_idle_c: null, shutdown_c: 96, slowdown_c: 93, max_operating_c: 85}}
    pci: {{device_id: "0x1EB810DE", subsystem_id: "0x12A210DE", gen: 3, width: 16}}
    clocks:
      idle: {{graphics: 300, sm: 300, memory: 405, video: 540}}
      max: {{graphics: 1590, sm: 1590, memory: 5001, video: 1470}}
    vbios_version: 90.04.38.00.03
    nvswitch: false
    machine: any
    mig: null
"""


def _write(tmp_path, text):
    p = tmp_path / "models.yaml"
    p.write_text(text)
    return p


def test_a_minimal_models_file_loads(tmp_path):
    models = m.load_models(_write(tmp_path, _MINIMAL.format(gfd="Tesla-T4", alias="t4-16gb")))
    assert models["t4"].gfd_product == "Tesla-T4" and not models["t4"].mig_capable


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (_MINIMAL.format(gfd="Tesla_T4", alias="x"), r"models\.t4\.gfd_product: 'Tesla_T4' is not what GFD"),
        (_MINIMAL.format(gfd="Tesla-T4", alias="Tesla-T4x").replace("memory_mib: 15360", "memory_mib: big"),
         r"models\.t4\.memory_mib: expected int"),
        (_MINIMAL.format(gfd="Tesla-T4", alias="x").replace("family: turing", "family: volta"),
         r"family: 'volta' disagrees"),
        (_MINIMAL.format(gfd="Tesla-T4", alias="x").replace("    vbios_version: 90.04.38.00.03\n", ""),
         r"models\.t4\.vbios_version: missing"),
        (_MINIMAL.format(gfd="Tesla-T4", alias="x").replace("gpulab.fakegpu/models/v1", "v0"), r"schema"),
        ("models: [", r"cannot load"),
    ],
)
def test_models_file_errors_name_the_field(tmp_path, text, problem):
    with pytest.raises(m.ModelDataError, match=problem):
        m.load_models(_write(tmp_path, text))


_MIG = _MINIMAL.format(gfd="Tesla-T4", alias="x").replace("    mig: null\n", """    mig:
      memory_slices: MEM
      compute_slices: G
      profiles:
        - {name: 1g.4gb, id: 14, g: 1, mem_slices: 1, instances: 4, memory_mib: 3800, sm: 10, ce: 1, dec: 0, enc: 0, jpeg: 0, ofa: 0, bar1_mib: 4095, placements: [0, 1, 2, 3]}
        - {name: 4g.15gb, id: 0, g: 4, mem_slices: 4, instances: 1, memory_mib: 15200, sm: 40, ce: 4, dec: 1, enc: 0, jpeg: 0, ofa: 0, bar1_mib: 16383, placements: [0]}
      balanced: {1g.4gb: 2}
""")


def _mig(mem, g):
    return _MIG.replace("MEM", str(mem)).replace("compute_slices: G", f"compute_slices: {g}")


def test_a_mig_model_with_four_slices_loads(tmp_path):
    t4 = m.load_models(_write(tmp_path, _mig(4, 4)))["t4"]
    assert (t4.mig_memory_slices, t4.mig_compute_slices) == (4, 4)
    assert [s.gi_id for s in t4.layout("all-1g.4gb").slices] == [3, 4, 5, 6]


@pytest.mark.parametrize(("mem", "g", "problem"), [
    (8, 7, r"mig: no profile spans the whole GPU \(g: 7, mem_slices: 8\)"),   # the 7/8 default assumed
    (4, 7, r"mig: no profile spans the whole GPU \(g: 7, mem_slices: 4\)"),
    (6, 4, r"mig\.memory_slices: must be a power of two"),
    (2, 4, r"profiles\[0\]\.placements: start 2 with 1 slices leaves the GPU \(2 memory slices\)"),
    (4, 2, r"profiles\[1\]\.g: at most 2 compute slices on this GPU, got 4"),
])
def test_mig_slices_are_checked_against_the_profiles(tmp_path, mem, g, problem):
    with pytest.raises(m.ModelDataError, match=problem):
        m.load_models(_write(tmp_path, _mig(mem, g)))


def test_mig_slices_are_required(tmp_path):
    text = _mig(4, 4).replace("      compute_slices: 4\n", "")
    with pytest.raises(m.ModelDataError, match=r"models\.t4\.mig\.compute_slices: missing"):
        m.load_models(_write(tmp_path, text))


def test_models_file_rejects_an_alias_used_twice(tmp_path):
    text = _MINIMAL.format(gfd="Tesla-T4", alias="Tesla T4")
    m.load_models(_write(tmp_path, text))  # its own product name: fine
    two = text + text.split("models:\n", 1)[1].replace("  t4:", "  t4b:")
    with pytest.raises(m.ModelDataError, match="already used by 't4'"):
        m.load_models(_write(tmp_path, two))
