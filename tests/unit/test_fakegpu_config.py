"""NVIDIA device-plugin config: parsing, validation, advertised resources."""

from __future__ import annotations

import re

import pytest
import yaml

from gpulab.fakegpu import devicemap as dm
from gpulab.fakegpu import pluginconfig as pc
from gpulab.hardware.models import GpuModelError, MigNotSupported, get_model, gpu_uuid, mig_uuid

# The chapter's ConfigMap, verbatim.
CHAPTER_CONFIGMAP = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: time-slicing-config
  namespace: gpu-operator
data:
  any: |-
    version: v1
    flags:
      migStrategy: none
    sharing:
      timeSlicing:
        resources:
          - name: nvidia.com/gpu
            replicas: 4
"""

UUID_RE = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


def ts(replicas=4, name="nvidia.com/gpu", **extra) -> str:
    body = {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": name, "replicas": replicas}]}}}
    body["sharing"]["timeSlicing"].update(extra)
    return yaml.safe_dump(body)


# -- parsing -------------------------------------------------------------------------


def test_the_chapter_configmap_works_unchanged():
    cm = yaml.safe_load(CHAPTER_CONFIGMAP)
    configs = pc.parse_config_map(cm["data"])
    cfg = configs["any"]
    assert cfg.version == "v1" and cfg.mig_strategy == "none"
    assert cfg.sharing.strategy == "time-slicing"
    (r,) = cfg.sharing.time_slicing.resources
    assert (r.name, r.replicas, r.rename, r.devices) == ("nvidia.com/gpu", 4, None, "all")
    assert not cfg.sharing.time_slicing.fail_requests_greater_than_one
    assert cfg.warnings == ()


def test_defaults():
    cfg = pc.parse_config("version: v1\n")
    assert cfg == pc.DevicePluginConfig()
    assert (cfg.mig_strategy, cfg.sharing.strategy, cfg.flags.fail_on_init_error) == ("none", "none", True)
    assert cfg.flags.plugin.device_list_strategy == ("envvar",) and cfg.flags.gfd.sleep_interval_s == 60


def test_missing_version_means_v1_and_json_is_yaml():
    cfg = pc.parse_config('{"flags": {"migStrategy": "mixed"}}')
    assert (cfg.version, cfg.mig_strategy) == ("v1", "mixed")


def test_empty_file_is_all_defaults_with_a_warning():
    cfg = pc.parse_config("")
    assert cfg.sharing.strategy == "none" and cfg.warnings and "empty config" in cfg.warnings[0]


def test_mapping_input_and_full_flags():
    cfg = pc.parse_config({
        "version": "v1",
        "flags": {"migStrategy": "single", "failOnInitError": False, "nvidiaDriverRoot": "/run/nvidia/driver",
                  "plugin": {"passDeviceSpecs": True, "deviceListStrategy": ["envvar", "cdi-cri"],
                             "deviceIDStrategy": "index", "sharedDevicesAllocationPolicy": "packed"},
                  "gfd": {"oneshot": True, "noTimestamp": True, "sleepInterval": "1m30s"}},
    })
    assert cfg.flags.mig_strategy == "single" and not cfg.flags.fail_on_init_error
    assert cfg.flags.plugin.device_list_strategy == ("envvar", "cdi-cri")
    assert cfg.flags.plugin.device_id_strategy == "index"
    assert cfg.flags.plugin.shared_devices_allocation_policy == "packed"
    assert cfg.flags.gfd.no_timestamp and cfg.flags.gfd.sleep_interval_s == 90


def test_mps_fails_requests_greater_than_one_by_default():
    cfg = pc.parse_config("sharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n")
    assert cfg.sharing.strategy == "mps" and cfg.sharing.mps.fail_requests_greater_than_one
    cfg = pc.parse_config(ts(failRequestsGreaterThanOne=True))
    assert cfg.sharing.time_slicing.fail_requests_greater_than_one


def test_rename_by_default_renames_to_shared():
    cfg = pc.parse_config(ts(renameByDefault=True))
    assert cfg.sharing.time_slicing.resources[0].advertised_name == "nvidia.com/gpu.shared"


def test_short_resource_names_get_the_nvidia_prefix():
    cfg = pc.parse_config(ts(name="gpu"))
    assert cfg.sharing.time_slicing.resources[0].name == "nvidia.com/gpu"


def test_with_mig_strategy_overrides_the_file():
    cfg = pc.parse_config(ts())
    assert cfg.with_mig_strategy("mixed").mig_strategy == "mixed"
    assert cfg.with_mig_strategy(None) is cfg
    with pytest.raises(pc.ConfigError, match="unknown value"):
        cfg.with_mig_strategy("both")


MALFORMED = [
    # (config text, field path in the error, words in the error)
    ("version: v1\nflags: [", "config", "not valid YAML at line"),
    ("version: v1\n  bad: indent", "config", "not valid YAML"),
    ("- version: v1", "config", "must be a mapping"),
    ("just a string", "config", "must be a mapping"),
    ("version: v2", "config.version", "unknown version (got 'v2'); allowed: 'v1'"),
    ("version: 1", "config.version", "must be a string (got 1)"),
    ("flags: none", "config.flags", "must be a mapping (got 'none')"),
    ("flags:\n  migStrategy: both", "config.flags.migStrategy", "unknown value (got 'both'); allowed: none, single, mixed"),
    ("flags:\n  migStrategy: Mixed", "config.flags.migStrategy", "allowed: none, single, mixed"),
    ("flags:\n  migStrategy: 1", "config.flags.migStrategy", "unknown value (got 1)"),
    ("flags:\n  failOnInitError: 'yes'", "config.flags.failOnInitError", "must be a boolean (got 'yes')"),
    ("flags:\n  plugin:\n    deviceListStrategy: magic", "config.flags.plugin.deviceListStrategy[0]", "unknown value"),
    ("flags:\n  plugin:\n    deviceListStrategy: []", "config.flags.plugin.deviceListStrategy", "non-empty list"),
    ("flags:\n  plugin:\n    deviceIDStrategy: serial", "config.flags.plugin.deviceIDStrategy", "uuid, index"),
    ("flags:\n  gfd:\n    sleepInterval: 60", "config.flags.gfd.sleepInterval", "Go duration"),
    ("flags:\n  deviceDiscoveryStrategy: pci", "config.flags.deviceDiscoveryStrategy", "auto, nvml, tegra"),
    ("sharing: [timeSlicing]", "config.sharing", "must be a mapping"),
    ("sharing:\n  timeSlicing: 4", "config.sharing.timeSlicing", "must be a mapping (got 4)"),
    ("sharing:\n  timeSlicing: {}", "config.sharing.timeSlicing.resources", "no resources specified"),
    ("sharing:\n  timeSlicing:\n    resources: []", "config.sharing.timeSlicing.resources", "no resources specified"),
    ("sharing:\n  timeSlicing:\n    resources: {name: nvidia.com/gpu}", "config.sharing.timeSlicing.resources",
     "must be a list"),
    ("sharing:\n  timeSlicing:\n    strategy: round-robin\n    resources: [{name: gpu, replicas: 2}]",
     "config.sharing.timeSlicing.strategy", "unknown timeSlicing strategy"),
    ("sharing:\n  timeSlicing:\n    resources: [nvidia.com/gpu]", "config.sharing.timeSlicing.resources[0]",
     "must be a mapping (got 'nvidia.com/gpu')"),
    ("sharing:\n  timeSlicing:\n    resources:\n    - replicas: 4", "config.sharing.timeSlicing.resources[0].name",
     "no resource name specified"),
    (ts(name=""), "config.sharing.timeSlicing.resources[0].name", "non-empty string"),
    (ts(name=7), "config.sharing.timeSlicing.resources[0].name", "non-empty string (got 7)"),
    (ts(name="nvidia.com/GPU"), "config.sharing.timeSlicing.resources[0].name", "incorrect format for resource name"),
    (ts(name="amd.com/gpu"), "config.sharing.timeSlicing.resources[0].name", "incorrect format"),
    (ts(name="nvidia.com/gpu.shared"), "config.sharing.timeSlicing.resources[0].name", "unknown resource name"),
    (ts(name="nvidia.com/tpu"), "config.sharing.timeSlicing.resources[0].name",
     "allowed: nvidia.com/gpu, or nvidia.com/mig-<profile>"),
    ("sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu",
     "config.sharing.timeSlicing.resources[0].replicas", "no replicas specified"),
    (ts(replicas=1), "config.sharing.timeSlicing.resources[0].replicas", "number of replicas must be >= 2 (to stop"),
    (ts(replicas=0), "config.sharing.timeSlicing.resources[0].replicas", "must be >= 2 (to stop sharing"),
    (ts(replicas=-3), "config.sharing.timeSlicing.resources[0].replicas", "(got -3)"),
    (ts(replicas="4"), "config.sharing.timeSlicing.resources[0].replicas", "must be an integer (got '4')"),
    (ts(replicas=4.0), "config.sharing.timeSlicing.resources[0].replicas", "must be an integer (got 4.0 (a float))"),
    (ts(replicas=True), "config.sharing.timeSlicing.resources[0].replicas", "(got true (a boolean))"),
    (ts(replicas=None), "config.sharing.timeSlicing.resources[0].replicas", "must be an integer (got null)"),
    (ts(replicas=[4]), "config.sharing.timeSlicing.resources[0].replicas", "must be an integer"),
    (ts(renameByDefault="true"), "config.sharing.timeSlicing.renameByDefault", "must be a boolean (got 'true')"),
    (ts(failRequestsGreaterThanOne=1), "config.sharing.timeSlicing.failRequestsGreaterThanOne", "must be a boolean"),
    ("sharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n"
     "    - {name: gpu, replicas: 3}", "config.sharing.timeSlicing.resources[1].name", "resource listed twice"),
    ("sharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2, devices: some}",
     "config.sharing.timeSlicing.resources[0].devices", "the only valid string is 'all'"),
    ("sharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2, devices: 0}",
     "config.sharing.timeSlicing.resources[0].devices", "count of devices must be > 0"),
    ("sharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2, devices: [GPU-1]}",
     "config.sharing.timeSlicing.resources[0].devices[0]", "unsupported device reference"),
    ("sharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2, devices: {a: 1}}",
     "config.sharing.timeSlicing.resources[0].devices", "unrecognized type"),
    ("sharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2, rename: 'Bad Name'}",
     "config.sharing.timeSlicing.resources[0].rename", "incorrect format"),
    ("sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 2}]\n  mps:\n    resources: [{name: gpu, replicas: 2}]",
     "config.sharing", "timeSlicing and mps are mutually exclusive"),
    ("flags: {migStrategy: mixed}\nsharing:\n  mps:\n    resources: [{name: gpu, replicas: 2}]",
     "config.flags.migStrategy", "mixed is not supported with MPS"),
    ("sharing:\n  mps:\n    resources: [{name: nvidia.com/mig-1g.10gb, replicas: 2}]",
     "config.sharing.mps.resources[0].name", "MPS can only share full GPUs"),
    ("imex:\n  channelIDs: [1, 2]", "config.imex.channelIDs", "allowed: [] or [0]"),
    ("version: v1\nversion: v1", "config (line 2, column 1)", "duplicate key 'version'"),
    ("sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: 2\n      replicas: 4",
     "config (line 6, column 7)", "duplicate key 'replicas'"),
    ("flags:\n  migStrategy: none\n  migstrategy: mixed", "config.flags.migstrategy", "set twice"),
]


@pytest.mark.parametrize(("text", "path", "words"), MALFORMED)
def test_malformed_configs_name_the_field_value_and_allowed(text, path, words):
    with pytest.raises(pc.ConfigError) as exc:
        pc.parse_config(text)
    msg = str(exc.value)
    assert msg.startswith(path + ":") or msg.startswith(path + " "), msg
    assert words in msg, msg


def test_config_error_carries_structured_fields():
    with pytest.raises(pc.ConfigError) as exc:
        pc.parse_config(ts(replicas=1))
    e = exc.value
    assert (e.path, e.value, e.allowed) == ("config.sharing.timeSlicing.resources[0].replicas", 1, "an integer >= 2")


def test_configmap_errors_are_prefixed_with_the_key():
    with pytest.raises(pc.ConfigError, match=r"^data\.any\.sharing\.timeSlicing\.resources\[0\]\.replicas: "):
        pc.parse_config_map({"any": ts(replicas=1)})
    with pytest.raises(pc.ConfigError, match=r"^data\.any: ConfigMap values must be strings"):
        pc.parse_config_map({"any": {"version": "v1"}})
    with pytest.raises(pc.ConfigError, match="no configs"):
        pc.parse_config_map({})


IGNORED = [
    ("version: v1\nflgs: {}", "config.flgs", "did you mean 'flags'"),
    ("flags:\n  migStratgy: mixed", "config.flags.migStratgy", "did you mean 'migStrategy'"),
    ("sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 2, replica: 4}]",
     "config.sharing.timeSlicing.resources[0].replica", "unknown key"),
    ("sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 2, rename: gpu-shared}]",
     "config.sharing.timeSlicing.resources[0].rename", "not yet supported"),
    ("sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 2, devices: [0, '0:1']}]",
     "config.sharing.timeSlicing.resources[0].devices", "replicates all devices"),
    ("resources:\n  gpus: [{pattern: '*', name: gpu}]", "config.resources", "not yet supported"),
]


@pytest.mark.parametrize(("text", "path", "words"), IGNORED)
def test_what_nvidia_ignores_is_a_warning_or_a_strict_error(text, path, words):
    cfg = pc.parse_config(text)
    assert any(w.startswith(path + ":") and words in w for w in cfg.warnings), cfg.warnings
    with pytest.raises(pc.ConfigError, match=re.escape(path) + ".*strict mode"):
        pc.parse_config(text, strict=True)


def test_ignored_fields_really_are_ignored():
    cfg = pc.parse_config("sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 2, rename: x, devices: 1}]")
    (r,) = cfg.sharing.time_slicing.resources
    assert r.rename is None and r.advertised_name == "nvidia.com/gpu"
    cfg = pc.parse_config("flgs: {migStrategy: mixed}")
    assert cfg.mig_strategy == "none"


def test_keys_differing_in_case_match_like_go_json():
    cfg = pc.parse_config("Flags:\n  migstrategy: mixed")
    assert cfg.mig_strategy == "mixed"
    assert any("case-insensitively" in w for w in cfg.warnings)
    cfg = pc.parse_config("sharing:\n  timeslicing:\n    resources: [{name: gpu, replicas: 2}]")
    assert cfg.sharing.strategy == "time-slicing"
    assert cfg.warnings[0].startswith("config.sharing.timeslicing: accepted as 'timeSlicing'")
    # Inside a resource the plugin looks keys up exactly: 'Replicas' is unknown.
    with pytest.raises(pc.ConfigError, match="no replicas specified"):
        pc.parse_config("sharing:\n  timeSlicing:\n    resources: [{name: gpu, Replicas: 2}]")


# -- config selection (config-manager) ---------------------------------------------------


@pytest.mark.parametrize(
    ("names", "label", "default", "picked"),
    [
        (["any", "a100"], "a100", "any", "a100"),
        (["any", "a100"], None, "any", "any"),
        (["any", "a100"], "t4", "any", None),
        (["default", "x"], None, None, "default"),
        (["only"], None, None, "only"),
        (["a", "b"], None, None, None),
        (["a"], None, "missing", None),
    ],
)
def test_select_config(names, label, default, picked):
    assert pc.select_config(names, label, default).name == picked


def test_select_config_explains_a_skipped_label():
    sel = pc.select_config(["any"], "t4-config")
    assert sel.name is None and "reconfiguration skipped" in sel.reason and pc.CONFIG_LABEL in sel.reason


# -- advertised resources ------------------------------------------------------------


def chapter_config() -> pc.DevicePluginConfig:
    return pc.parse_config_map(yaml.safe_load(CHAPTER_CONFIGMAP)["data"])["any"]


def test_whole_gpus_without_a_config():
    res = dm.advertised_resources("h100-80gb", 2, "gpu-node-1")
    assert res.capacity() == {"nvidia.com/gpu": 2}
    assert res.pairs() == [("nvidia.com/gpu", [gpu_uuid("gpu-node-1", 0), gpu_uuid("gpu-node-1", 1)])]
    d = res.get("nvidia.com/gpu").devices[0]
    assert (d.isolation, d.memory_mib, d.mig, d.replicas) == ("exclusive", 81559, None, 1)


def test_time_slicing_h100_x2_replicas_4_gives_8_ids():
    res = dm.advertised_resources("h100-80gb", 2, "gpu-node-1", chapter_config())
    assert res.capacity() == {"nvidia.com/gpu": 8}
    r = res.get("nvidia.com/gpu")
    assert r.sharing == "time-slicing" and r.replicas == 4
    uuids = [gpu_uuid("gpu-node-1", i) for i in range(2)]
    assert r.ids == [f"{u}::{n}" for u in uuids for n in range(4)]
    for d in r.devices:
        assert re.fullmatch(rf"GPU-{UUID_RE}::[0-3]", d.id) and len(d.id) <= 63
        assert d.device_uuid == uuids[d.gpu_index] == dm.strip_replica(d.id)
        # Time-slicing does not isolate memory: every replica sees all 80GB.
        assert d.memory_mib == 81559 and not d.memory_isolated and d.isolation == "time-sliced"
    assert res.device(r.ids[5]).gpu_index == 1 and res.device(r.ids[5]).replica == 1
    with pytest.raises(KeyError, match="not advertised"):
        res.device("GPU-nope")


def test_rename_by_default_advertises_gpu_shared():
    res = dm.advertised_resources("a100-40gb", 1, "n", pc.parse_config(ts(renameByDefault=True)))
    assert res.capacity() == {"nvidia.com/gpu.shared": 4}


def test_mps_splits_memory_and_compute():
    cfg = pc.parse_config("sharing:\n  mps:\n    resources: [{name: nvidia.com/gpu, replicas: 4}]")
    res = dm.advertised_resources("a100-80gb", 1, "n", cfg)
    r = res.get("nvidia.com/gpu")
    assert r.count == 4 and r.sharing == "mps"
    d = r.devices[0]
    assert d.memory_mib == 81920 // 4 and d.compute_share == 0.25 and d.isolation == "mps" and d.memory_isolated
    assert r.request_error(2) == "invalid request: maximum request size for shared resources is 1; found 2"
    assert r.request_error(1) is None


def test_fail_requests_greater_than_one_only_when_asked_for_time_slicing():
    assert dm.advertised_resources("l4", 1, "n", chapter_config()).get("nvidia.com/gpu").request_error(3) is None
    cfg = pc.parse_config(ts(failRequestsGreaterThanOne=True))
    assert "found 3" in dm.advertised_resources("l4", 1, "n", cfg).get("nvidia.com/gpu").request_error(3)
    assert dm.advertised_resources("l4", 1, "n").get("nvidia.com/gpu").request_error(3) is None


def test_mixed_all_1g_10gb_gives_7_mig_devices_per_gpu():
    res = dm.advertised_resources("h100-80gb", 2, "gpu-node-1", mig_layout="all-1g.10gb", mig_strategy="mixed")
    assert res.capacity() == {"nvidia.com/mig-1g.10gb": 14}
    devs = res.get("nvidia.com/mig-1g.10gb").devices
    parent = gpu_uuid("gpu-node-1", 0)
    assert devs[0].id == mig_uuid(parent, devs[0].mig.gi_id, 0)
    assert all(re.fullmatch(rf"MIG-{UUID_RE}", d.id) for d in devs)
    assert len({d.id for d in devs}) == 14
    assert {d.memory_mib for d in devs} == {9984}
    assert [d.mig_index for d in devs[:7]] == list(range(7)) and devs[7].gpu_index == 1
    assert devs[0].isolation == "mig" and devs[0].gpu_uuid == parent


def test_mixed_all_balanced_has_one_resource_per_profile():
    res = dm.advertised_resources("a100-40gb", 1, "n", mig_layout="all-balanced", mig_strategy="mixed")
    assert res.capacity() == {"nvidia.com/mig-1g.5gb": 2, "nvidia.com/mig-2g.10gb": 1, "nvidia.com/mig-3g.20gb": 1}


def test_single_strategy_exposes_mig_devices_as_gpus():
    res = dm.advertised_resources("h100-80gb", 1, "n", mig_layout="all-1g.10gb", mig_strategy="single")
    assert res.capacity() == {"nvidia.com/gpu": 7}
    assert all(d.mig is not None for d in res.get("nvidia.com/gpu").devices)


def test_single_strategy_refuses_mixed_profiles():
    with pytest.raises(dm.DevicePluginError, match="more than one MIG device type"):
        dm.advertised_resources("h100-80gb", 1, "n", mig_layout="all-balanced", mig_strategy="single")


@pytest.mark.parametrize("strategy", ["single", "mixed"])
def test_mig_enabled_without_instances_breaks_the_plugin(strategy):
    with pytest.raises(dm.DevicePluginError, match="invalid MIG configuration"):
        dm.advertised_resources("h100-80gb", 1, "n", mig_layout="all-enabled", mig_strategy=strategy)


def test_strategy_none_ignores_mig():
    res = dm.advertised_resources("h100-80gb", 1, "n", mig_layout="all-1g.10gb", mig_strategy="none")
    assert res.capacity() == {"nvidia.com/gpu": 1}


def test_time_slicing_a_mig_resource():
    cfg = pc.parse_config(ts(replicas=2, name="nvidia.com/mig-1g.10gb"))
    res = dm.advertised_resources("h100-80gb", 1, "n", cfg, mig_layout="all-1g.10gb", mig_strategy="mixed")
    r = res.get("nvidia.com/mig-1g.10gb")
    assert r.count == 14 and r.devices[1].id.endswith("::1") and r.devices[1].memory_mib == 9984


def test_a_replicated_resource_missing_on_the_node_is_a_warning():
    cfg = pc.parse_config(ts(replicas=2, name="nvidia.com/mig-1g.5gb"))
    res = dm.advertised_resources("h100-80gb", 1, "n", cfg)
    assert res.capacity() == {"nvidia.com/gpu": 1}
    assert res.warnings and "no nvidia.com/mig-1g.5gb devices" in res.warnings[0]


def test_mps_and_mig_do_not_mix():
    cfg = pc.parse_config("sharing:\n  mps:\n    resources: [{name: gpu, replicas: 2}]")
    with pytest.raises(dm.DevicePluginError, match="MPS sharing is not supported for MIG devices"):
        dm.advertised_resources("h100-80gb", 1, "n", cfg, mig_layout="all-1g.10gb", mig_strategy="single")
    with pytest.raises(pc.ConfigError, match="not supported with MPS"):
        dm.advertised_resources("h100-80gb", 1, "n", cfg, mig_strategy="mixed")


def test_l4_cannot_take_a_mig_layout():
    with pytest.raises(MigNotSupported):
        dm.advertised_resources("l4", 1, "n", mig_layout="all-1g.10gb", mig_strategy="mixed")
    with pytest.raises(MigNotSupported):
        dm.advertised_resources("l4", 1, "n", mig_layout=get_model("h100-80gb").layout("all-1g.10gb"))


def test_a_layout_object_of_another_model_is_refused():
    h100_layout = get_model("h100-80gb").layout("all-1g.10gb")
    with pytest.raises(GpuModelError, match="NVIDIA A100-SXM4-40GB does not have"):
        dm.advertised_resources("a100-40gb", 1, "n", mig_layout=h100_layout, mig_strategy="mixed")
    same = dm.advertised_resources("h100-80gb", 1, "n", mig_layout=h100_layout, mig_strategy="mixed")
    assert same.capacity() == {"nvidia.com/mig-1g.10gb": 7}


def test_bad_gpu_counts():
    assert dm.advertised_resources("l4", 0, "n").capacity() == {}
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="gpu_count"):
            dm.advertised_resources("l4", bad, "n")


def test_device_ids_are_stable_across_calls_and_nodes_differ():
    a = dm.advertised_resources("h100-80gb", 2, "gpu-node-1", chapter_config()).pairs()
    assert a == dm.advertised_resources("h100-80gb", 2, "gpu-node-1", chapter_config()).pairs()
    b = dm.advertised_resources("h100-80gb", 2, "gpu-node-2", chapter_config()).pairs()
    assert set(a[0][1]).isdisjoint(b[0][1])


def test_visible_devices_env_deduplicates_replicas():
    res = dm.advertised_resources("h100-80gb", 2, "n", chapter_config())
    ids = res.get("nvidia.com/gpu").ids
    assert dm.visible_devices_env([ids[0], ids[1], ids[4]]) == f"{gpu_uuid('n', 0)},{gpu_uuid('n', 1)}"
    assert dm.visible_devices_env(res.get("nvidia.com/gpu").devices[:2]) == gpu_uuid("n", 0)


def test_inventory_for_the_device_plugin():
    from gpulab.fakegpu.smistate import build_state

    res = dm.advertised_resources("h100-80gb", 1, "n", mig_layout="all-balanced", mig_strategy="mixed")
    state = build_state("h100-80gb", 1, "n", mig_layout="all-balanced")
    inv = res.to_inventory(state)
    names = [r["name"] for r in inv["resources"]]
    assert names == ["nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb"]
    dev = inv["resources"][0]["devices"][0]
    assert dev["uuid"].startswith("MIG-") and dev["parent"] == gpu_uuid("n", 0) and dev["minor"] == 0
    assert dev["info"]["uuid"] == gpu_uuid("n", 0) and dev["info"]["driver_version"] == state["driver_version"]
    assert dev["uuid"] in {m["uuid"] for m in dev["info"]["mig_devices"]}
    assert inv["resources"][0]["allocationPolicy"] == "distributed"
    assert "info" not in res.to_inventory()["resources"][0]["devices"][0]


def test_config_dataclasses_are_frozen():
    cfg = chapter_config()
    with pytest.raises(AttributeError):
        cfg.version = "v2"  # type: ignore[misc]


# -- every mistake at once ---------------------------------------------------------------

MANY_MISTAKES = """\
version: v2
flags:
  migStrategy: sometimes
  plugin: {deviceIDStrategy: name}
sharing:
  timeSlicing:
    renameByDefault: "true"
    resources:
    - name: nvidia.com/gpu
      replicas: 1
    - name: nvidia.com/tpu
      replicas: 4
    - {name: nvidia.com/mig-1g.10gb, devices: [GPU-1, 0, x]}
imex: {channelIDs: [3]}
"""

MANY_MISTAKES_ERRORS = [
    ("data.any.version", "unknown version", "allowed: 'v1'"),
    ("data.any.flags.migStrategy", "unknown value (got 'sometimes')", "allowed: none, single, mixed"),
    ("data.any.flags.plugin.deviceIDStrategy", "unknown value (got 'name')", "allowed: uuid, index"),
    ("data.any.sharing.timeSlicing.renameByDefault", "must be a boolean (got 'true')", "allowed: true or false"),
    ("data.any.sharing.timeSlicing.resources[0].replicas", "number of replicas must be >= 2", "an integer >= 2"),
    ("data.any.sharing.timeSlicing.resources[1].name", "cannot replicate it (got 'nvidia.com/tpu')",
     "allowed: nvidia.com/gpu"),
    ("data.any.sharing.timeSlicing.resources[2].replicas", "no replicas specified", "allowed: an integer >= 2"),
    ("data.any.sharing.timeSlicing.resources[2].devices[0]", "unsupported device reference (got 'GPU-1')",
     "allowed: a GPU index"),
    ("data.any.sharing.timeSlicing.resources[2].devices[2]", "unsupported device reference (got 'x')",
     "allowed: a GPU index"),
    ("data.any.imex.channelIDs", "invalid IMEX channel IDs", "allowed: [] or [0]"),
]


def test_every_mistake_of_a_config_is_reported_with_path_and_allowed():
    with pytest.raises(pc.ConfigError) as exc:
        pc.parse_config(MANY_MISTAKES, path="data.any")
    e = exc.value
    assert [err.path for err in e.errors] == [path for path, _, _ in MANY_MISTAKES_ERRORS]
    lines = str(e).splitlines()
    assert len(lines) == len(MANY_MISTAKES_ERRORS)
    for line, (path, problem, allowed) in zip(lines, MANY_MISTAKES_ERRORS):
        assert line.startswith(path + ": ") and problem in line and allowed in line, line
    # The structured fields are the first error's; each error keeps its own.
    assert (e.path, e.value, e.allowed) == ("data.any.version", "v2", "'v1'")
    assert all(isinstance(err, pc.ConfigError) and err.errors == [err] for err in e.errors)
    assert e.errors[4].value == 1 and e.errors[4].allowed == "an integer >= 2"


def test_a_single_mistake_is_one_error_as_before():
    with pytest.raises(pc.ConfigError) as exc:
        pc.parse_config(ts(replicas=1))
    assert exc.value.errors == [exc.value] and "\n" not in str(exc.value)


def test_every_duplicate_key_and_every_configmap_key_is_reported():
    text = "version: v1\nversion: v1\nflags:\n  migStrategy: none\n  migStrategy: mixed\n"
    with pytest.raises(pc.ConfigError) as exc:
        pc.parse_config(text)
    assert [e.path for e in exc.value.errors] == ["config (line 2, column 1)", "config (line 5, column 3)"]
    with pytest.raises(pc.ConfigError) as exc:
        pc.parse_config_map({"a": ts(replicas=1), "b": 7, "c": "version: v9", "ok": ts()})
    assert [e.path for e in exc.value.errors] == [
        "data.a.sharing.timeSlicing.resources[0].replicas", "data.b", "data.c.version"]


def test_strict_mode_reports_every_ignored_key():
    text = "flgs: {}\nsharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 2, replica: 4}]\n"
    with pytest.raises(pc.ConfigError) as exc:
        pc.parse_config(text, strict=True)
    assert [e.path for e in exc.value.errors] == ["config.flgs", "config.sharing.timeSlicing.resources[0].replica"]
    assert "allowed: version, flags, resources, sharing, imex" in str(exc.value)
    assert "allowed: name, rename, devices, replicas" in str(exc.value)


def test_a_yaml_syntax_error_is_reported_alone_with_line_and_column():
    with pytest.raises(pc.ConfigError) as exc:
        pc.parse_config("version: v2\nsharing: [\n")
    assert len(exc.value.errors) == 1
    assert re.match(r"config: not valid YAML at line \d+, column \d+", str(exc.value))


def test_summary_shortens_many_errors():
    errors = [pc.ConfigError(f"config.x[{i}]", "bad") for i in range(25)]
    e = pc.ConfigError.collect(errors)
    assert len(str(e).splitlines()) == 25
    short = e.summary(limit=10)
    assert short.startswith("25 errors:\nconfig.x[0]: bad") and short.endswith("... and 15 more")
    assert len(short.splitlines()) == 12
    assert errors[0].summary() == "config.x[0]: bad"


def test_config_manager_event_lists_every_error(tmp_path):
    from types import SimpleNamespace

    from gpulab.fakegpu.components import configmanager
    from gpulab.fakegpu.components.host import Settings

    events: list[tuple[str, str]] = []
    logged: list[str] = []
    host = SimpleNamespace(
        node="gpu-node-1",
        client=SimpleNamespace(get=lambda kind, name, ns: {"data": {"broken": MANY_MISTAKES}}),
        event=lambda reason, message, *args, **kw: events.append((reason, message)),
        log=SimpleNamespace(info=logged.append, warning=logged.append, error=logged.append),
        settings=Settings(namespace="gpu-operator", config_dst=tmp_path / "config.yaml"),
    )
    cm = configmanager.ConfigManagerMain(host)  # type: ignore[arg-type]
    assert cm._apply("broken", ("time-slicing-config", None), ("any", ts())) == ("any", ts())
    [(reason, message)] = events
    assert reason == "DevicePluginConfigInvalid"
    assert message.startswith("config 'broken' of ConfigMap gpu-operator/time-slicing-config is invalid: "
                              f"{len(MANY_MISTAKES_ERRORS)} errors:\n")
    for path, problem, _ in MANY_MISTAKES_ERRORS:
        assert path.replace("data.any", "time-slicing-config/broken") + ": " in message, path
    assert message.endswith("; keeping the last good config 'any'")
    assert not (tmp_path / "config.yaml").exists()


def test_config_manager_wakes_its_neighbours_when_it_writes_the_config(tmp_path):
    from types import SimpleNamespace

    from gpulab.fakegpu.components import configmanager
    from gpulab.fakegpu.components.host import Settings

    woken: list[str] = []
    host = SimpleNamespace(
        node="gpu-node-1",
        client=SimpleNamespace(get=lambda kind, name, ns: {"data": {"any": ts()}}),
        event=lambda *args, **kw: None,
        changed=lambda: woken.append("changed"),
        log=SimpleNamespace(info=lambda m: None, warning=lambda m: None, error=lambda m: None),
        settings=Settings(namespace="gpu-operator", config_dst=tmp_path / "config.yaml"),
    )
    cm = configmanager.ConfigManagerMain(host)  # type: ignore[arg-type]
    assert cm._apply("any", ("time-slicing-config", None), None) == ("any", ts())
    assert (tmp_path / "config.yaml").read_text() == ts() and woken == ["changed"]
    # The same config again writes nothing and wakes no one.
    assert cm._apply("any", ("time-slicing-config", None), ("any", ts())) == ("any", ts())
    assert woken == ["changed"]
