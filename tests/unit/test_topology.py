"""Topology files: every malformed form gets one message naming file, field and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpulab import cli
from gpulab.cluster import topology


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "topo.yaml"
    p.write_text(text)
    return p


def test_default_topology_is_the_chapters_picture():
    topo = topology.load()
    assert [n.name for n in topo.nodes] == ["gpu-node-1", "cpu-node-1", "cpu-node-2"]
    gpu = topo.node("gpu-node-1")
    assert (gpu.gpu_model, gpu.gpu_count) == ("h100-80gb", 2)
    assert all(not n.taints for n in topo.nodes)


def test_every_shipped_topology_loads():
    for f in sorted((Path(topology.default_path()).parent).glob("*.yaml")):
        assert topology.load(f).nodes


@pytest.mark.parametrize("text, field, allowed", [
    ("nodePools: [\n", "line 2, column 1: invalid YAML", None),
    ("nodePools:\n- name: gpu\n  gpu: {model: h300, count: 1}\n", "nodePools[0].gpu.model", "allowed: h100-80gb"),
    ("nodePools:\n- name: gpu\n  count: -1\n", "nodePools[0].count", "must be >= 0"),
    ("nodePools:\n- name: gpu\n  gpu: {model: l4, count: 0}\n", "nodePools[0].gpu.count", "must be >= 1"),
    ("nodePools:\n- name: a\n  names: [n1]\n- name: b\n  names: [n1]\n", "nodePools[1].names[0]",
     "duplicate node name 'n1'"),
    ("nodePools:\n- name: a\n- name: a\n", "nodePools[1].name", "duplicate pool name"),
    ("nodePools:\n- name: a\n  gpus: 2\n", "nodePools[0].gpus", "unknown field; allowed: name, count"),
    ("nodePools:\n- name: a\n  taints: [{key: k, effect: NoRun}]\n", "nodePools[0].taints[0].effect",
     "allowed: NoSchedule, PreferNoSchedule, NoExecute"),
    ("nodePools:\n- name: a\n  cpu: lots\n", "nodePools[0].cpu", "not a Kubernetes quantity"),
    ("nodePools:\n- name: Bad_Name\n", "nodePools[0].name", "not a DNS label"),
    ("nodePools:\n- name: a\n  labels: {x: true}\n", "nodePools[0].labels.x", "label values are strings"),
    ("nodePools: []\n", "nodePools", "non-empty list"),
    ("kind: Pod\nnodePools: [{name: a}]\n", "kind", "expected Topology"),
    ("- a\n", "(top level)", "expected a mapping"),
])
def test_malformed_topologies(tmp_path, text, field, allowed):
    path = write(tmp_path, text)
    with pytest.raises(topology.TopologyError) as err:
        topology.load(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: {field}")
    if allowed:
        assert allowed in msg


def test_missing_file(tmp_path):
    with pytest.raises(topology.TopologyError, match="no such file"):
        topology.load(tmp_path / "nope.yaml")


def test_gpu_model_aliases_accept_the_gfd_product_name(tmp_path):
    path = write(tmp_path, "nodePools:\n- name: g\n  gpu: {model: NVIDIA-H100-80GB-HBM3, count: 8}\n")
    assert topology.load(path).nodes[0].gpu_model == "h100-80gb"


def test_cli_exits_2_and_starts_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_HOME", str(tmp_path / "home"))
    path = write(tmp_path, "nodePools:\n- name: gpu\n  gpu: {model: h300}\n")
    result = CliRunner().invoke(cli.main, ["up", "--topology", str(path)])
    assert result.exit_code == 2
    assert "nodePools[0].gpu.model: unknown GPU model 'h300'" in result.output
    assert not (tmp_path / "home").exists()
