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


# -- what the kubelet keeps from pods: allocatable = capacity - reserved - hard eviction ---------------------------

def test_the_default_gpu_node_reserves_what_gke_reserves_on_such_a_machine():
    topo = topology.load()
    gpu = topo.node("gpu-node-1")
    assert gpu.kube_reserved == {"cpu": "150m", "memory": "12165Mi"} and gpu.system_reserved == {}
    assert gpu.capacity()["cpu"] == "32" and gpu.capacity()["memory"] == "256Gi"
    allocatable = gpu.allocatable()
    # 32 - 150m; 256Gi - 12165Mi (kube-reserved) - 100Mi (the kubelet's default memory.available<100Mi)
    assert (allocatable["cpu"], allocatable["memory"], allocatable["pods"]) == ("31850m", "249879Mi", "110")
    # nodefs.available<10% of 500Gi, the percentage a float32 as the kubelet parses it
    assert allocatable["ephemeral-storage"] == str(500 * 2**30 - 53687092000)
    cpu = topo.node("cpu-node-1")
    assert cpu.kube_reserved == {} and cpu.allocatable()["cpu"] == "16"
    assert cpu.allocatable()["memory"] == "65436Mi"  # the eviction threshold alone


def test_every_shipped_topology_leaves_pods_room():
    for f in sorted((Path(topology.default_path()).parent).glob("*.yaml")):
        for node in topology.load(f).nodes:
            cap, alloc = node.capacity(), node.allocatable()
            for resource in ("cpu", "memory"):
                assert 0 < allocation(alloc[resource]) <= allocation(cap[resource]), (f.name, node.name, resource)


def allocation(q: str) -> float:
    from gpulab.kube import allocatable

    return float(allocatable.parse(q))


def test_reservations_are_added_and_taken_from_capacity(tmp_path):
    path = write(tmp_path, """\
nodePools:
- name: a
  cpu: "8"
  memory: 32Gi
  kubeReserved: {cpu: 100m, memory: 1Gi, ephemeral-storage: 10Gi, pid: "1000"}
  systemReserved: {cpu: "0.5", memory: 512Mi}
  evictionHard: {memory.available: 5%}
""")
    [node] = topology.load(path).nodes
    assert node.eviction_hard == {"memory.available": "5%"}  # naming a signal replaces the defaults...
    alloc = node.allocatable()
    assert alloc["cpu"] == "7400m"
    # 32Gi - 1Gi - 512Mi - int(32Gi * float32(0.05))
    assert alloc["memory"] == str(32 * 2**30 - 2**30 - 512 * 2**20 - int(32 * 2**30 * 0.05000000074505806))
    assert alloc["ephemeral-storage"] == "490Gi"  # ...so no nodefs.available threshold: only kube-reserved


def test_merge_default_eviction_settings_keeps_the_signals_not_named(tmp_path):
    path = write(tmp_path, "nodePools:\n- name: a\n  memory: 64Gi\n  evictionHard: {memory.available: 1Gi}\n"
                           "  mergeDefaultEvictionSettings: true\n")
    [node] = topology.load(path).nodes
    assert node.eviction_hard["memory.available"] == "1Gi" and node.eviction_hard["nodefs.available"] == "10%"
    assert node.allocatable()["memory"] == "63Gi"
    assert node.allocatable()["ephemeral-storage"] == str(500 * 2**30 - 53687092000)


def test_zero_and_hundred_percent_thresholds_are_ignored_as_the_kubelet_ignores_them(tmp_path):
    path = write(tmp_path, "nodePools:\n- name: a\n  evictionHard: {memory.available: 0%, nodefs.available: 100%}\n")
    [node] = topology.load(path).nodes
    assert node.reserved() == {}
    assert node.allocatable() == node.capacity()


@pytest.mark.parametrize("text, field, words", [
    ("  kubeReserved: {gpu: 1}\n", "nodePools[0].kubeReserved.gpu",
     "the kubelet cannot reserve this resource; allowed: cpu, memory, ephemeral-storage, pid"),
    ("  systemReserved: {memory: 1GB}\n", "nodePools[0].systemReserved.memory", "'1GB' is not a Kubernetes quantity"),
    ("  kubeReserved: [cpu]\n", "nodePools[0].kubeReserved", "expected a mapping"),
    ("  evictionHard: {memory.free: 1Gi}\n", "nodePools[0].evictionHard.memory.free",
     "unknown eviction signal; allowed: memory.available, nodefs.available"),
    ("  evictionHard: {memory.available: 120%}\n", "nodePools[0].evictionHard.memory.available", "more than 100%"),
    ("  evictionHard: {memory.available: \"0\"}\n", "nodePools[0].evictionHard.memory.available",
     "a positive quantity (e.g. \"100Mi\") or a percentage"),
    ("  evictionHard: {nodefs.available: lots}\n", "nodePools[0].evictionHard.nodefs.available", "not a threshold"),
    ("  mergeDefaultEvictionSettings: yes please\n", "nodePools[0].mergeDefaultEvictionSettings",
     "expected true or false"),
    ("  cpu: \"2\"\n  kubeReserved: {cpu: \"1\"}\n  systemReserved: {cpu: 1500m}\n", "nodePools[0]",
     "reserve 2500m of cpu, more than the node's 2 (the kubelet would refuse to start)"),
    ("  memory: 1Gi\n  evictionHard: {memory.available: 2Gi}\n", "nodePools[0]", "reserve 2Gi of memory"),
    ("  imagePullBandwidth: \"0\"\n", "nodePools[0].imagePullBandwidth", "not a bandwidth; bytes per second"),
    ("  imagePullBandwidth: fast\n", "nodePools[0].imagePullBandwidth", "'fast' is not a Kubernetes quantity"),
])
def test_malformed_reservations(tmp_path, text, field, words):
    path = write(tmp_path, "nodePools:\n- name: a\n" + text)
    with pytest.raises(topology.TopologyError) as err:
        topology.load(path)
    [issue] = err.value.errors
    assert issue.field == field and words in issue.message, str(err.value)


@pytest.mark.parametrize("value, binary, text", [
    ("31.85", False, "31850m"), ("32000", False, "32k"), ("1500", False, "1500"), ("0.0000000001", False, "1n"),
    ("249879Mi", True, "249879Mi"), ("256Gi", True, "256Gi"), ("483183820000", True, "483183820000"),
    ("512", True, "512"), ("0", True, "0"),
])
def test_quantities_are_written_as_the_apiserver_writes_them(value, binary, text):
    from gpulab.kube import allocatable

    assert allocatable.render(allocatable.parse(value), binary) == text


def test_a_node_registers_its_allocatable_and_an_older_node_is_brought_up_to_date():
    from gpulab.cluster import nodes
    from gpulab.kube.names import NODE_ANNOTATION

    spec = topology.load().node("gpu-node-1")
    obj = nodes.node_object(spec, NODE_ANNOTATION)
    assert obj["status"]["capacity"] == spec.capacity() and obj["status"]["allocatable"] == spec.allocatable()
    # as the apiserver returns it: canonical quantities, and the device plugin's resources beside them
    seen = {"status": {"capacity": {**spec.capacity(), "nvidia.com/gpu": "2"},
                       "allocatable": {**spec.allocatable(), "ephemeral-storage": "483183820k", "nvidia.com/gpu": "2"}}}
    assert nodes.machine_resources(spec, seen) == {}
    # registered before the kubelet's reservations were modelled: allocatable was the capacity
    old = {"status": {"capacity": {**spec.capacity(), "nvidia.com/gpu": "2"},
                      "allocatable": {**spec.capacity(), "nvidia.com/gpu": "1"}}}
    assert nodes.machine_resources(spec, old) == {"allocatable": spec.allocatable()}


def test_image_pull_bandwidth_is_the_pools_or_the_default(tmp_path):
    path = write(tmp_path, "nodePools:\n- name: a\n- name: b\n  imagePullBandwidth: 100Mi\n")
    a, b = topology.load(path).nodes
    assert (a.image_pull_bandwidth, b.image_pull_bandwidth) == (topology.DEFAULT_IMAGE_PULL_BANDWIDTH, "100Mi")
