"""GFD, NFD and GPU Operator labels."""

from __future__ import annotations

import pytest

from gpulab.fakegpu import devicemap, pluginconfig
from gpulab.fakegpu import gfd

TS = "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"


def labels(model="h100-80gb", count=1, **kw):
    kw.setdefault("timestamp", 1_700_000_000)
    return gfd.gfd_labels(model, count, **kw)


def test_h100_node_matches_nvidias_documented_labels():
    # NVIDIA's published label dump of a one-GPU H100 80GB HBM3 node with MIG
    # disabled (driver 550.54.15, CUDA 12.4, mig.strategy single).
    got = labels(driver_version="550.54.15", cuda_version="12.4", mig_strategy="single",
                 machine="PIO-4124GS-TNR-01-NC24B", timestamp=1715703041)
    expected = {
        "nvidia.com/cuda.driver-version.full": "550.54.15",
        "nvidia.com/cuda.driver-version.major": "550",
        "nvidia.com/cuda.driver-version.minor": "54",
        "nvidia.com/cuda.driver-version.revision": "15",
        "nvidia.com/cuda.driver.major": "550",
        "nvidia.com/cuda.driver.minor": "54",
        "nvidia.com/cuda.driver.rev": "15",
        "nvidia.com/cuda.runtime-version.full": "12.4",
        "nvidia.com/cuda.runtime-version.major": "12",
        "nvidia.com/cuda.runtime-version.minor": "4",
        "nvidia.com/cuda.runtime.major": "12",
        "nvidia.com/cuda.runtime.minor": "4",
        "nvidia.com/gfd.timestamp": "1715703041",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/gpu.count": "1",
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.machine": "PIO-4124GS-TNR-01-NC24B",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "single",
        "nvidia.com/mps.capable": "false",
    }
    assert {k: got[k] for k in expected} == expected
    assert set(got) - set(expected) == {"nvidia.com/gpu.mode"}
    assert got["nvidia.com/gpu.mode"] == "compute"


def test_defaults_are_the_reference_driver():
    got = labels("h200-141gb")
    assert gfd.DRIVER_VERSION == "580.159.04" and gfd.CUDA_DRIVER_VERSION == "13.0"
    assert got["nvidia.com/cuda.driver-version.full"] == "580.159.04"
    assert got["nvidia.com/cuda.driver.rev"] == "04"  # leading zero kept, as GFD does
    assert got["nvidia.com/cuda.runtime-version.full"] == "13.0"
    assert got["nvidia.com/gpu.product"] == "NVIDIA-H200" and got["nvidia.com/gpu.memory"] == "143771"
    assert "nvidia.com/mig.strategy" not in got  # strategy none: no label


def test_label_values_are_strings_and_sorted():
    got = labels()
    assert all(isinstance(v, str) for v in got.values())
    assert list(got) == sorted(got)


def test_time_slicing_adds_shared_suffix_and_replicas():
    got = labels(count=2, config=pluginconfig.parse_config(TS))
    assert got["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-SHARED"
    assert got["nvidia.com/gpu.replicas"] == "4"
    assert got["nvidia.com/gpu.count"] == "2"  # physical GPUs, not replicas
    assert got["nvidia.com/gpu.sharing-strategy"] == "time-slicing"


def test_renamed_replicas_keep_the_plain_product():
    cfg = pluginconfig.parse_config(TS.replace("timeSlicing:\n", "timeSlicing:\n    renameByDefault: true\n"))
    got = labels(config=cfg)
    assert got["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert got["nvidia.com/gpu.replicas"] == "4"


def test_mps_labels():
    got = labels(config=pluginconfig.parse_config(TS.replace("timeSlicing", "mps")))
    assert got["nvidia.com/mps.capable"] == "true"
    assert got["nvidia.com/gpu.sharing-strategy"] == "mps"
    assert got["nvidia.com/gpu.product"].endswith("-SHARED")


def test_mps_on_a_mig_node_breaks_gfd():
    cfg = pluginconfig.parse_config(TS.replace("timeSlicing", "mps"))
    with pytest.raises(devicemap.DevicePluginError, match="MPS sharing is not supported for mig devices"):
        labels(config=cfg, mig_layout="all-1g.10gb", mig_strategy="single")


def test_single_strategy_describes_the_mig_devices():
    got = labels(count=2, mig_layout="all-1g.10gb", mig_strategy="single")
    assert got["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
    assert got["nvidia.com/gpu.count"] == "14"
    assert got["nvidia.com/gpu.memory"] == "9984"
    assert (got["nvidia.com/gpu.slices.gi"], got["nvidia.com/gpu.slices.ci"]) == ("1", "1")
    assert got["nvidia.com/gpu.multiprocessors"] == "16"
    assert got["nvidia.com/gpu.engines.copy"] == "1" and got["nvidia.com/gpu.engines.jpeg"] == "1"
    assert got["nvidia.com/gpu.replicas"] == "1" and got["nvidia.com/mig.strategy"] == "single"
    assert got["nvidia.com/gpu.family"] == "hopper"  # from the full-GPU labels


def test_single_strategy_all_3g_40gb():
    got = labels(mig_layout="all-3g.40gb", mig_strategy="single")
    assert (got["nvidia.com/gpu.count"], got["nvidia.com/gpu.product"]) == ("2", "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb")
    assert got["nvidia.com/gpu.slices.gi"] == "3"


def test_single_strategy_with_time_slicing():
    got = labels("a100-40gb", mig_layout="all-1g.5gb", mig_strategy="single",
                 config=pluginconfig.parse_config(TS.replace("replicas: 4", "replicas: 2")))
    assert got["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED"
    assert (got["nvidia.com/gpu.count"], got["nvidia.com/gpu.replicas"]) == ("7", "2")
    assert got["nvidia.com/gpu.memory"] == "4864"


@pytest.mark.parametrize("layout", ["all-balanced", "all-enabled"])
def test_single_strategy_invalid_geometries(layout):
    got = labels(mig_layout=layout, mig_strategy="single")
    assert got["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-INVALID"
    assert [got[f"nvidia.com/gpu.{k}"] for k in ("count", "replicas", "memory")] == ["0", "0", "0"]


def test_mixed_strategy_all_balanced():
    got = labels(mig_layout="all-balanced", mig_strategy="mixed")
    assert got["nvidia.com/mig.strategy"] == "mixed"
    assert [got[f"nvidia.com/mig-{p}.count"] for p in ("1g.10gb", "2g.20gb", "3g.40gb")] == ["2", "1", "1"]
    assert got["nvidia.com/mig-2g.20gb.memory"] == "20096"
    assert got["nvidia.com/mig-3g.40gb.multiprocessors"] == "60"
    assert got["nvidia.com/mig-3g.40gb.product"] == "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb"
    assert got["nvidia.com/mig-1g.10gb.sharing-strategy"] == "none"
    # The MIG-enabled GPU itself is labelled "without sharing".
    assert (got["nvidia.com/gpu.count"], got["nvidia.com/gpu.replicas"]) == ("1", "0")
    assert got["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"


def test_mixed_strategy_with_a_time_sliced_mig_profile():
    cfg = pluginconfig.parse_config(TS.replace("nvidia.com/gpu", "nvidia.com/mig-1g.10gb").replace("4", "2"))
    got = labels(mig_layout="all-1g.10gb", mig_strategy="mixed", config=cfg)
    assert got["nvidia.com/mig-1g.10gb.replicas"] == "2"
    assert got["nvidia.com/mig-1g.10gb.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb-SHARED"
    assert got["nvidia.com/mig-1g.10gb.sharing-strategy"] == "time-slicing"
    assert got["nvidia.com/mig-1g.10gb.count"] == "7"


def test_me_profiles_sanitise_the_plus():
    got = labels(mig_layout="all-1g.10gb.me", mig_strategy="mixed")
    assert got["nvidia.com/mig-1g.10gb.me.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gbme"


def test_strategy_none_with_mig_enabled_gpus():
    got = labels(mig_layout="all-1g.10gb", mig_strategy="none")
    assert "nvidia.com/mig.strategy" not in got
    assert got["nvidia.com/gpu.replicas"] == "0"
    assert not any(k.startswith("nvidia.com/mig-") for k in got)


def test_l4_is_not_mig_capable():
    got = labels("l4")
    assert got["nvidia.com/mig.capable"] == "false"
    assert got["nvidia.com/gpu.family"] == "ada-lovelace"
    assert (got["nvidia.com/gpu.compute.major"], got["nvidia.com/gpu.compute.minor"]) == ("8", "9")


def test_timestamp_comes_from_the_clock_and_can_be_disabled():
    got = gfd.gfd_labels("l4", 1, clock=lambda: 1234.9)
    assert got[gfd.TIMESTAMP_LABEL] == "1234"
    cfg = pluginconfig.parse_config("flags:\n  gfd:\n    noTimestamp: true\n")
    assert gfd.TIMESTAMP_LABEL not in gfd.gfd_labels("l4", 1, config=cfg, clock=lambda: 1.0)


def test_no_gpus_no_gfd_labels():
    assert gfd.gfd_labels("h100-80gb", 0) == {}
    assert gfd.nfd_labels("h100-80gb", 0) == {} and gfd.operator_labels("h100-80gb", 0) == {}


@pytest.mark.parametrize("bad", ["580", "580.a.1", "1.2.3.4"])
def test_bad_driver_versions(bad):
    with pytest.raises(ValueError, match="does not match format"):
        labels(driver_version=bad)


def test_two_part_driver_version_has_empty_revision():
    assert labels(driver_version="535.54")["nvidia.com/cuda.driver.rev"] == ""


def test_machine_label_is_sanitised():
    assert labels(machine="NVIDIA DGX H100 (rev 2)")["nvidia.com/gpu.machine"] == "NVIDIA-DGX-H100-rev-2"
    assert labels("l4")["nvidia.com/gpu.machine"] == "Google-Compute-Engine"


def test_nfd_and_operator_labels():
    assert gfd.nfd_labels("l4", 1) == {"feature.node.kubernetes.io/pci-10de.present": "true"}
    op = gfd.operator_labels("h100-80gb", 8)
    assert op["nvidia.com/gpu.present"] == "true"
    assert op["nvidia.com/mig.config"] == "all-disabled"
    assert op["nvidia.com/gpu.deploy.mig-manager"] == "true"
    assert {f"nvidia.com/gpu.deploy.{o}" for o in gfd.OPERATOR_OPERANDS} <= set(op)
    l4 = gfd.operator_labels("l4", 1, driver_managed=False)
    assert "nvidia.com/mig.config" not in l4 and "nvidia.com/gpu.deploy.mig-manager" not in l4
    assert "nvidia.com/gpu.deploy.driver" not in l4


def test_operator_keeps_existing_choices():
    existing = {"nvidia.com/gpu.deploy.dcgm-exporter": "false", "nvidia.com/mig.config": "all-1g.10gb",
                "nvidia.com/gpu.deploy.device-plugin": "paused-for-mig-change"}
    op = gfd.operator_labels("h100-80gb", 1, existing=existing)
    assert op["nvidia.com/gpu.deploy.dcgm-exporter"] == "false"
    assert op["nvidia.com/gpu.deploy.device-plugin"] == "paused-for-mig-change"
    assert op["nvidia.com/mig.config"] == "all-1g.10gb"


def test_node_labels_merge_all_three():
    got = gfd.node_labels("h100-80gb", 2, config=pluginconfig.parse_config(TS), timestamp=1)
    assert got["feature.node.kubernetes.io/pci-10de.present"] == "true"
    assert got["nvidia.com/gpu.present"] == "true"
    assert got["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-SHARED"
    owners = {gfd.label_owner(k) for k in got}
    assert owners == {"nfd", "gpu-operator", "gfd", "gpu-operator (default) / user"}


@pytest.mark.parametrize(
    ("key", "owner"),
    [
        ("feature.node.kubernetes.io/pci-10de.present", "nfd"),
        ("nvidia.com/gpu.present", "gpu-operator"),
        ("nvidia.com/gpu.deploy.device-plugin", "gpu-operator"),
        ("nvidia.com/mig.config", "gpu-operator (default) / user"),
        ("nvidia.com/mig.config.state", "mig-manager"),
        ("nvidia.com/device-plugin.config", "user"),
        ("nvidia.com/gpu.product", "gfd"),
        ("nvidia.com/mig-1g.10gb.count", "gfd"),
        ("nvidia.com/cuda.runtime.major", "gfd"),
        ("nvidia.com/gfd.timestamp", "gfd"),
        ("node-role.kubernetes.io/ai", "unknown"),
    ],
)
def test_label_owner(key, owner):
    assert gfd.label_owner(key) == owner
