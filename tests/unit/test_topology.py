"""Topology files: every malformed form gets one message naming file, field and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpulab import cli
from gpulab.kube import topology


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


# -- every mistake at once --------------------------------------------------------

MANY_MISTAKES = """\
apiVersion: gpulab.io/v1
metadata: {name: bad, nmae: typo}
extra: 1
nodePools:
- name: gpu
  count: two
  cpu: lots
  gpu: {model: h300, count: 20}
  gpus: 2
  labels: {ok: true}
  taints: [{key: k, effect: NoRun}, {effect: NoSchedule}]
- name: gpu
  memory: 1Gb
- name: Bad_Name
- name: c
  names: [n1, n1]
- 7
"""

MANY_MISTAKES_ERRORS = [
    ("extra", "unknown field; allowed: apiVersion, kind, metadata, nodePools"),
    ("apiVersion", "expected gpulab.io/v1alpha1, got 'gpulab.io/v1'"),
    ("metadata.nmae", "unknown field; allowed: name"),
    ("nodePools[0].gpus", "unknown field; allowed: name, count, names, cpu, memory, pods, gpu, labels, taints"),
    ("nodePools[0].count", "expected an integer >= 0, got 'two'"),
    ("nodePools[0].cpu", "'lots' is not a Kubernetes quantity"),
    ("nodePools[0].gpu.model", "unknown GPU model 'h300'; allowed: h100-80gb"),
    ("nodePools[0].gpu.count", "20 GPUs per node; at most 16 are allowed"),
    ("nodePools[0].labels.ok", "label values are strings"),
    ("nodePools[0].taints[0].effect", "'NoRun'; allowed: NoSchedule, PreferNoSchedule, NoExecute"),
    ("nodePools[0].taints[1].key", "is required"),
    ("nodePools[1].name", "duplicate pool name 'gpu'"),
    ("nodePools[1].memory", "'1Gb' is not a Kubernetes quantity"),
    ("nodePools[2].name", "'Bad_Name' is not a DNS label"),
    ("nodePools[3].names[1]", "duplicate node name 'n1'"),
    ("nodePools[4]", "expected a mapping, got int"),
]


def test_every_mistake_is_reported_with_file_field_and_allowed(tmp_path):
    path = write(tmp_path, MANY_MISTAKES)
    with pytest.raises(topology.TopologyError) as err:
        topology.load(path)
    e = err.value
    assert [(i.source, i.field) for i in e.errors] == [(str(path), f) for f, _ in MANY_MISTAKES_ERRORS]
    lines = str(e).splitlines()
    assert len(lines) == len(MANY_MISTAKES_ERRORS)
    for line, (field, words) in zip(lines, MANY_MISTAKES_ERRORS):
        assert line.startswith(f"{path}: {field}: ") and words in line, line


def test_one_mistake_is_one_error(tmp_path):
    path = write(tmp_path, "nodePools:\n- name: gpu\n  gpu: {model: h300}\n")
    with pytest.raises(topology.TopologyError) as err:
        topology.load(path)
    [issue] = err.value.errors
    assert (issue.field, str(err.value)) == (
        "nodePools[0].gpu.model", f"{path}: nodePools[0].gpu.model: {issue.message}")


def test_a_yaml_syntax_error_is_reported_alone_with_line_and_column(tmp_path):
    path = write(tmp_path, "nodePools:\n- name: gpu\n  count: [1\n")
    with pytest.raises(topology.TopologyError) as err:
        topology.load(path)
    [issue] = err.value.errors
    assert issue.field.startswith("line ") and ", column " in issue.field
    assert str(err.value).startswith(f"{path}: line ")


def test_a_mistake_in_a_pool_does_not_hide_or_repeat(tmp_path):
    # A bad pool name is reported once, not again for each node name derived from it;
    # a duplicate pool name does not also report its derived node names as duplicates.
    path = write(tmp_path, "nodePools:\n- name: Bad_Name\n  count: 3\n- name: a\n- name: a\n  count: 2\n")
    with pytest.raises(topology.TopologyError) as err:
        topology.load(path)
    assert [i.field for i in err.value.errors] == ["nodePools[0].name", "nodePools[2].name"]


@pytest.mark.parametrize("command", [["up"], ["up", "--backend", "kind"], ["reset"]])
def test_cli_prints_every_mistake_exits_2_and_starts_nothing(tmp_path, monkeypatch, command):
    from gpulab.cluster.embedded import EmbeddedCluster
    from gpulab.cluster.kind import KindCluster

    def must_not_run(*args, **kwargs):
        raise AssertionError("a cluster operation ran although the topology is invalid")

    for cls in (EmbeddedCluster, KindCluster):
        for method in ("up", "reset", "down"):
            monkeypatch.setattr(cls, method, must_not_run)
    home = tmp_path / "home"
    path = write(tmp_path, MANY_MISTAKES)
    result = CliRunner().invoke(cli.main, [*command, "--topology", str(path)], env={"GPULAB_HOME": str(home)})
    assert result.exit_code == 2, result.output
    assert f"gpulab: error: {len(MANY_MISTAKES_ERRORS)} errors in the topology file; nothing was started" \
        in result.output
    for field, words in MANY_MISTAKES_ERRORS:
        assert f"{path}: {field}: " in result.output and words in result.output, field
    assert not home.exists()  # no state.json, no pid files, no backend choice


def test_cli_reset_with_a_bad_topology_leaves_an_existing_cluster_alone(tmp_path):
    home = tmp_path / "home"
    (home / "cluster").mkdir(parents=True)
    state = home / "cluster" / "state.json"
    state.write_text('{"topology": "/somewhere/default.yaml"}')
    before = sorted(p.relative_to(home) for p in home.rglob("*"))
    path = write(tmp_path, MANY_MISTAKES)
    result = CliRunner().invoke(cli.main, ["reset", "--topology", str(path)], env={"GPULAB_HOME": str(home)})
    assert result.exit_code == 2, result.output
    assert state.read_text() == '{"topology": "/somewhere/default.yaml"}'
    assert sorted(p.relative_to(home) for p in home.rglob("*")) == before
