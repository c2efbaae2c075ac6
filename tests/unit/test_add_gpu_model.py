"""DEVELOPMENT.md's "A GPU model", done literally for the A30: nothing but its models.yaml entry.

The A30 is the MIG GPU that is *not* cut like an A100/H100/H200: 4 memory and
4 compute slices instead of 8 and 7. Every number asserted here follows from
the entry in gpulab/hardware/models.yaml (whose comments name the sources):
a topology can use the key at once; the MIG manager, the device plugin and
GFD place and name the instances with the driver's GPU instance ids; the usage
report counts a 1g.6gb as a quarter of a GPU.
"""

from __future__ import annotations

import pytest

from gpulab.fakegpu import devicemap
from gpulab.fakegpu import gfd, mig
from gpulab.hardware.models import get_model, gpu_uuid, mig_uuid
from gpulab.kube import topology
from gpulab.usage import report

# Step "use it in a topology": a pool of the new model, by its key.
TOPOLOGY = """\
apiVersion: gpulab.io/v1alpha1
kind: Topology
metadata:
  name: a30-pool
nodePools:
- name: a30
  count: 1
  cpu: "32"
  memory: 256Gi
  gpu: {model: a30, count: 2}
- name: cpu
  count: 1
"""


@pytest.fixture
def node(tmp_path):
    path = tmp_path / "a30-pool.yaml"
    path.write_text(TOPOLOGY)
    [spec] = topology.load(path).gpu_nodes
    return spec


def test_the_topology_uses_the_new_model_by_key(node):
    assert (node.name, node.gpu_model, node.gpu_count) == ("a30-node-1", "a30", 2)
    a30 = get_model(node.gpu_model)
    assert (a30.product_name, a30.gfd_product, a30.memory_mib) == ("NVIDIA A30", "NVIDIA-A30", 24576)
    assert (a30.mig_memory_slices, a30.mig_compute_slices) == (4, 4)


@pytest.mark.parametrize(("layout", "expected"), [
    # (profile, first memory slice, GPU instance id) per instance, as the driver numbers them:
    # real A30: four 1g.6gb are GI 3, 4, 5, 6 at 0:1 .. 3:1; a 2g.12gb at 2:2 is GI 2.
    ("all-1g.6gb", [("1g.6gb", 0, 3), ("1g.6gb", 1, 4), ("1g.6gb", 2, 5), ("1g.6gb", 3, 6)]),
    ("all-1g.6gb.me", [("1g.6gb+me", 0, 3)]),
    ("all-2g.12gb", [("2g.12gb", 0, 1), ("2g.12gb", 2, 2)]),
    ("all-2g.12gb.me", [("2g.12gb+me", 0, 1)]),
    ("all-4g.24gb", [("4g.24gb", 0, 0)]),
])
def test_mig_layouts_get_the_drivers_gpu_instance_ids(node, layout, expected):
    a30 = get_model(node.gpu_model)
    assert [(s.name, s.start, s.gi_id) for s in a30.layout(layout).slices] == expected


def test_all_balanced_is_mig_parteds_four_slice_rule(node):
    layout = get_model(node.gpu_model).layout("all-balanced")
    assert layout.profile_counts == {"1g.6gb": 2, "2g.12gb": 1}
    covered = sorted(i for s in layout.slices for i in range(s.start, s.end))
    assert covered == [0, 1, 2, 3]  # 2 + 1 + 1 memory slices: the whole card, no overlap


def test_the_mig_manager_applies_all_1g_6gb(node):
    labels = {k: "true" for k in mig.CLIENT_DEPLOY_LABELS} | {mig.MIG_CONFIG_LABEL: "all-1g.6gb"}
    decision = mig.decide_mig_transition(labels, node.gpu_model, applied="all-disabled")
    assert (decision.outcome, decision.state) == ("reconfigured", "success")
    assert [s.gi_id for s in decision.layout.slices] == [3, 4, 5, 6]
    # The 7-slice profiles of the other models do not exist here.
    failed = mig.decide_mig_transition(labels | {mig.MIG_CONFIG_LABEL: "all-1g.10gb"}, node.gpu_model)
    assert failed.outcome == "failed" and "all-1g.6gb" in failed.reason


def test_device_plugin_advertises_four_1g_6gb_per_gpu(node):
    mixed = devicemap.advertised_resources(node.gpu_model, node.gpu_count, node.name,
                                           mig_layout="all-1g.6gb", mig_strategy="mixed")
    assert mixed.capacity() == {"nvidia.com/mig-1g.6gb": 8}
    devices = mixed.get("nvidia.com/mig-1g.6gb").devices
    assert [d.id for d in devices] == [mig_uuid(gpu_uuid(node.name, i), gi, 0) for i in (0, 1) for gi in (3, 4, 5, 6)]
    assert {d.memory_mib for d in devices} == {5952}
    single = devicemap.advertised_resources(node.gpu_model, node.gpu_count, node.name,
                                            mig_layout="all-1g.6gb", mig_strategy="single")
    assert single.capacity() == {"nvidia.com/gpu": 8}


def test_gfd_labels_the_1g_6gb_instances(node):
    mixed = gfd.gfd_labels(node.gpu_model, node.gpu_count, mig_layout="all-1g.6gb", mig_strategy="mixed", timestamp=0)
    assert {k: v for k, v in mixed.items() if k.startswith("nvidia.com/mig-1g.6gb.")} == {
        "nvidia.com/mig-1g.6gb.count": "8",
        "nvidia.com/mig-1g.6gb.replicas": "1",
        "nvidia.com/mig-1g.6gb.sharing-strategy": "none",
        "nvidia.com/mig-1g.6gb.product": "NVIDIA-A30-MIG-1g.6gb",
        "nvidia.com/mig-1g.6gb.memory": "5952",
        "nvidia.com/mig-1g.6gb.multiprocessors": "14",
        "nvidia.com/mig-1g.6gb.slices.gi": "1",
        "nvidia.com/mig-1g.6gb.slices.ci": "1",
        "nvidia.com/mig-1g.6gb.engines.copy": "1",
        "nvidia.com/mig-1g.6gb.engines.decoder": "1",
        "nvidia.com/mig-1g.6gb.engines.encoder": "0",
        "nvidia.com/mig-1g.6gb.engines.jpeg": "0",
        "nvidia.com/mig-1g.6gb.engines.ofa": "0",
    }
    assert (mixed["nvidia.com/gpu.product"], mixed["nvidia.com/mig.capable"]) == ("NVIDIA-A30", "true")
    single = gfd.gfd_labels(node.gpu_model, node.gpu_count, mig_layout="all-1g.6gb", mig_strategy="single",
                            timestamp=0)
    assert (single["nvidia.com/gpu.product"], single["nvidia.com/gpu.count"]) == ("NVIDIA-A30-MIG-1g.6gb", "8")


def _instance(node, gi: int, profile: str) -> dict[str, str]:
    """The labels a MIG instance's DCGM series carry in Prometheus (modelName: the product name)."""
    return {"node": node.name, "gpu": "0", "UUID": gpu_uuid(node.name, 0), "Hostname": node.name,
            "modelName": get_model(node.gpu_model).product_name, "GPU_I_PROFILE": profile, "GPU_I_ID": str(gi)}


def test_usage_counts_a_1g_6gb_as_a_quarter_of_a_gpu(node):
    layout = get_model(node.gpu_model).layout("all-1g.6gb")
    model = get_model(node.gpu_model).product_name
    assert sum(report.mig_resource_share(model, "nvidia_com_mig_1g_6gb") for _ in layout.slices) == 1.0  # one card
    # One pod on one 1g.6gb (mixed strategy), computing flat out for an hour, as Prometheus sums it up.
    busy = [s for s in layout.slices if s.gi_id == 3]
    hour = {"namespace": "team", "node": node.name, "resource": "nvidia_com_mig_1g_6gb"}
    r = report.build({
        "allocated_h": [{"metric": hour, "value": [0, "1"]}],
        "gpus_now": [{"metric": hour, "value": [0, "1"]}],
        "computing_h": [{"metric": {**_instance(node, s.gi_id, s.name), "namespace": "team"}, "value": [0, "1"]}
                        for s in busy],
        "gpu_nodes": [{"metric": {"node": node.name, "modelName": model}, "value": [0, "1"]}],
    }, 0.0, 3600.0, 5)
    [team] = r.namespaces
    assert team.allocated_h == pytest.approx(0.25) and team.computing_h == pytest.approx(0.25)
    assert r.nodes[0].gpus_now == pytest.approx(0.25)
