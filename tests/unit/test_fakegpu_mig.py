"""MIG layouts per model and the MIG manager's state machine."""

from __future__ import annotations

from collections import Counter

import pytest

from gpulab.fakegpu import mig
from gpulab.hardware.models import MigNotSupported, get_model, list_models

MIG_MODELS = [x for x in list_models() if x.mig_capable]


# -- layouts --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "layout", "expected"),
    [
        ("h100-80gb", "all-1g.10gb", {"1g.10gb": 7}),
        ("a100-80gb", "all-1g.10gb", {"1g.10gb": 7}),
        ("a100-40gb", "all-1g.5gb", {"1g.5gb": 7}),
        # The same name means 4 instances on a 40GB card: there 1g.10gb is the
        # two-memory-slice profile.
        ("a100-40gb", "all-1g.10gb", {"1g.10gb": 4}),
        ("h200-141gb", "all-1g.18gb", {"1g.18gb": 7}),
        ("h100-80gb", "all-3g.40gb", {"3g.40gb": 2}),
        ("h100-80gb", "all-1g.10gb.me", {"1g.10gb+me": 1}),
        ("h200-141gb", "all-7g.141gb", {"7g.141gb": 1}),
        ("a30", "all-1g.6gb", {"1g.6gb": 4}),
        ("a30", "all-2g.12gb", {"2g.12gb": 2}),
        ("a30", "all-2g.12gb.me", {"2g.12gb+me": 1}),
        ("a30", "all-4g.24gb", {"4g.24gb": 1}),
    ],
)
def test_instance_counts(model, layout, expected):
    assert Counter(s.name for s in get_model(model).mig_layout(layout)) == expected


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("h100-80gb", {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}),
        ("a100-80gb", {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}),
        ("a100-40gb", {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}),
        ("h200-141gb", {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}),
        ("a30", {"1g.6gb": 2, "2g.12gb": 1}),
    ],
)
def test_all_balanced_per_model(model, expected):
    assert get_model(model).layout("all-balanced").profile_counts == expected


@pytest.mark.parametrize("model", MIG_MODELS, ids=lambda x: x.key)
def test_all_balanced_follows_mig_parted_rule(model):
    # mig-parted's balanced.go: 7-slot GPUs 2 x 1g + 1 x 2g + 1 x 3g, 4-slot
    # GPUs 2 x 1g + 1 x 2g; base profiles only, for each g the profile with
    # the most instances.
    rule = {7: ((1, 2), (2, 1), (3, 1)), 4: ((1, 2), (2, 1))}[model.mig_compute_slices]
    want = {}
    for g, n in rule:
        base = [p for p in model.mig_profiles if p.compute_slices == g and p.is_base]
        want[max(base, key=lambda p: p.max_instances).name] = n
    assert model.layout("all-balanced").profile_counts == want


@pytest.mark.parametrize("model", MIG_MODELS, ids=lambda x: x.key)
def test_every_layout_is_physically_valid(model):
    for name in model.mig_layout_names():
        layout = model.layout(name)
        used = [0] * model.mig_memory_slices
        for s in layout.slices:
            assert s.start in s.profile.placements
            for i in range(s.start, s.end):
                used[i] += 1
        assert max(used, default=0) <= 1, f"{name}: overlapping instances"
        assert sum(s.profile.compute_slices for s in layout.slices) <= model.mig_compute_slices
        assert [s.gi_id for s in layout.slices] == sorted({s.gi_id for s in layout.slices})
        assert layout.mig_enabled == (name != "all-disabled")


@pytest.mark.parametrize("model", MIG_MODELS, ids=lambda x: x.key)
def test_all_profile_layouts_use_the_maximum_count(model):
    for p in model.mig_profiles:
        assert len(model.mig_layout(f"all-{p.config_name}")) == p.max_instances


def test_all_enabled_and_all_disabled():
    h100 = get_model("h100-80gb")
    assert h100.layout("all-enabled").mig_enabled and h100.mig_layout("all-enabled") == []
    assert not h100.layout("all-disabled").mig_enabled
    assert h100.layout("all-disabled").same_geometry(None)
    assert not h100.layout("all-enabled").same_geometry(None)


def test_l4_refuses_mig():
    with pytest.raises(MigNotSupported):
        get_model("l4").mig_layout("all-1g.10gb")


# -- MIG manager -------------------------------------------------------------------

DEPLOYED = {k: "true" for k in mig.CLIENT_DEPLOY_LABELS if not k.endswith("nvsm")}


def _labels(config=None, **extra):
    labels = {**DEPLOYED, "nvidia.com/gpu.present": "true", **extra}
    if config is not None:
        labels[mig.MIG_CONFIG_LABEL] = config
    return labels


def test_no_label_means_nothing_to_do():
    d = mig.decide_mig_transition(_labels(), "h100-80gb")
    assert (d.outcome, d.state, d.steps) == ("idle", None, ())


def test_relabel_to_all_1g_10gb_walks_pending_to_success():
    labels = _labels("all-1g.10gb", **{mig.MIG_CONFIG_STATE_LABEL: "success"})
    d = mig.decide_mig_transition(labels, "h100-80gb", applied="all-disabled")
    assert (d.outcome, d.state) == ("reconfigured", "success")
    assert d.layout.name == "all-1g.10gb" and len(d.layout.slices) == 7

    patches = d.label_patches
    assert patches[0] == {mig.MIG_CONFIG_STATE_LABEL: "pending"}
    paused = patches[1]
    assert set(paused) == set(mig.CLIENT_DEPLOY_LABELS)
    assert set(paused.values()) == {mig.PAUSED_FOR_MIG_CHANGE}
    assert patches[-1] == {mig.MIG_CONFIG_STATE_LABEL: "success"}
    assert set(patches[-2].values()) == {"true"}

    actions = [s.action for s in d.steps]
    # Operands are gone before the GPUs are touched; validator restarted after.
    first_apply = actions.index("apply-mig")
    waits = [i for i, a in enumerate(actions) if a == "wait-pods-deleted"]
    assert len(waits) == 4 and max(waits) < first_apply
    deletes = [s.selector for s in d.steps if s.action == "delete-pods"]
    assert deletes == ["app=nvidia-cuda-validator", "app=nvidia-device-plugin-validator",
                       "app=nvidia-operator-validator"]
    assert d.steps[first_apply].layout is d.layout

    final = d.final_labels(labels)
    assert final[mig.MIG_CONFIG_STATE_LABEL] == "success"
    assert all(final[k] == "true" for k in mig.CLIENT_DEPLOY_LABELS)
    assert "Applying the selected MIG config to the node" in d.log


def test_user_pods_are_never_touched():
    d = mig.decide_mig_transition(_labels("all-balanced"), "h100-80gb")
    selectors = {s.selector for s in d.steps if s.selector}
    assert selectors <= {sel for sel, _ in mig.OPERAND_POD_SELECTORS + mig.VALIDATOR_POD_SELECTORS} | {
        mig.OPERATOR_VALIDATOR_SELECTOR}


def test_a_deploy_label_set_false_is_left_alone():
    labels = _labels("all-1g.10gb", **{"nvidia.com/gpu.deploy.dcgm": "false"})
    d = mig.decide_mig_transition(labels, "h100-80gb")
    assert d.label_patches[1]["nvidia.com/gpu.deploy.dcgm"] == "false"
    assert d.final_labels(labels)["nvidia.com/gpu.deploy.dcgm"] == "false"


def test_already_applied_goes_straight_to_success():
    d = mig.decide_mig_transition(_labels("all-1g.10gb"), "h100-80gb", applied="all-1g.10gb")
    assert (d.outcome, d.state) == ("already-applied", "success")
    assert "apply-mig" not in [s.action for s in d.steps]
    assert {mig.MIG_CONFIG_STATE_LABEL: "pending"} not in d.label_patches


def test_all_disabled_on_a_fresh_node_is_already_applied():
    d = mig.decide_mig_transition(_labels("all-disabled"), "a100-40gb", applied=None)
    assert d.outcome == "already-applied" and d.layout is None


def test_back_to_all_disabled_turns_mig_off():
    d = mig.decide_mig_transition(_labels("all-disabled"), "h100-80gb", applied="all-1g.10gb")
    assert (d.outcome, d.state, d.layout) == ("reconfigured", "success", None)
    assert "Applying the MIG mode change from the selected config to the node" in d.log


def test_unknown_layout_fails_with_the_allowed_names():
    labels = _labels("all-1g.18gb")
    d = mig.decide_mig_transition(labels, "h100-80gb", applied="all-1g.10gb")
    assert (d.outcome, d.state) == ("failed", "failed")
    assert "unknown MIG layout 'all-1g.18gb'" in d.reason and "all-1g.10gb" in d.reason
    assert d.layout.name == "all-1g.10gb"  # the GPUs keep what they had
    assert d.final_labels(labels)[mig.MIG_CONFIG_STATE_LABEL] == "failed"
    assert "apply-mig" not in [s.action for s in d.steps]


def test_gpu_that_cannot_do_mig_fails():
    d = mig.decide_mig_transition(_labels("all-1g.10gb"), "l4")
    assert (d.outcome, d.state) == ("failed", "failed")
    assert "not MIG-capable" in d.reason


def test_running_gpu_workloads_make_the_change_fail():
    labels = _labels("all-1g.10gb")
    d = mig.decide_mig_transition(labels, "h100-80gb", gpu_pods=["default/train-0", "ml/infer-1"])
    assert (d.outcome, d.state) == ("failed", "failed")
    assert "default/train-0" in d.reason and "In use by another client" in " ".join(d.log)
    assert "apply-mig" not in [s.action for s in d.steps]
    final = d.final_labels(labels)
    assert final[mig.MIG_CONFIG_STATE_LABEL] == "failed"
    assert all(final[k] == "true" for k in mig.CLIENT_DEPLOY_LABELS)  # clients come back


def test_apply_label_patch_removes_none_values():
    assert mig.apply_label_patch({"a": "1", "b": "2"}, {"a": None, "c": "3"}) == {"b": "2", "c": "3"}
