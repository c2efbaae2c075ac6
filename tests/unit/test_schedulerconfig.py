"""kube-scheduler's configuration file: its profiles, and how the embedded backend starts the scheduler with it."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpulab.cluster import binaries, embedded, schedulerconfig


def _profile(config: dict, name: str) -> dict:
    (profile,) = [p for p in config["profiles"] if p["schedulerName"] == name]
    return profile


def _args(profile: dict, plugin: str) -> dict:
    (entry,) = [c for c in profile.get("pluginConfig", []) if c["name"] == plugin]
    return entry["args"]


def test_two_profiles_the_default_one_as_kubernetes_ships_it():
    config = schedulerconfig.configuration("/kc.yaml")
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in config["profiles"]] == ["default-scheduler", "gpu-binpack"]
    assert schedulerconfig.PROFILES == ("default-scheduler", "gpu-binpack")
    # Nothing but its name: the scheduler fills in its own defaults (LeastAllocated, spreading).
    assert _profile(config, "default-scheduler") == {"schedulerName": "default-scheduler"}


def test_the_binpack_profile_scores_by_most_allocated_gpus_first():
    fit = _args(_profile(schedulerconfig.configuration("/kc.yaml"), "gpu-binpack"), "NodeResourcesFit")
    strategy = fit["scoringStrategy"]
    assert strategy["type"] == "MostAllocated"
    weights = {r["name"]: r["weight"] for r in strategy["resources"]}
    assert weights == {"nvidia.com/gpu": 10, "cpu": 1, "memory": 1}
    # kube-scheduler's validation: every weight in (0, 100]; the GPUs weigh most.
    assert all(0 < w <= 100 for w in weights.values())
    assert weights["nvidia.com/gpu"] > max(weights["cpu"], weights["memory"])


def test_the_binpack_profile_turns_off_what_spreads():
    profile = _profile(schedulerconfig.configuration("/kc.yaml"), "gpu-binpack")
    assert profile["plugins"] == {"multiPoint": {"disabled": [{"name": "NodeResourcesBalancedAllocation"}]}}
    # PodTopologySpread stays (a pod's own constraints hold), without the system's default constraints.
    assert _args(profile, "PodTopologySpread") == {"defaultingType": "List", "defaultConstraints": []}
    assert "PodTopologySpread" not in [d["name"] for d in profile["plugins"]["multiPoint"]["disabled"]]


def test_client_connection_and_leader_election():
    config = schedulerconfig.configuration("/etc/kc.yaml", qps=100, burst=200)
    assert config["clientConnection"] == {"kubeconfig": "/etc/kc.yaml", "qps": 100, "burst": 200}
    assert config["leaderElection"] == {"leaderElect": False}
    # Without rates the scheduler's own defaults hold (no qps/burst keys at all).
    kind_like = schedulerconfig.configuration("/etc/kubernetes/scheduler.conf", leader_elect=True)
    assert kind_like["clientConnection"] == {"kubeconfig": "/etc/kubernetes/scheduler.conf"}
    assert kind_like["leaderElection"] == {"leaderElect": True}


def test_the_written_file_is_the_configuration_with_a_header(tmp_path: Path):
    path = schedulerconfig.write(tmp_path / "sub" / "kube-scheduler.yaml", tmp_path / "kc.yaml", 1, 2)
    text = path.read_text()
    assert text.startswith("# kube-scheduler's configuration, written by gpulab")
    assert yaml.safe_load(text) == schedulerconfig.configuration(tmp_path / "kc.yaml", 1, 2)


def test_the_embedded_scheduler_starts_with_the_file_and_the_serving_flags_only(tmp_path: Path):
    cluster = embedded.EmbeddedCluster(tmp_path / "cluster")
    bins = binaries.Binaries(paths={"kube-scheduler": Path("/bin/kube-scheduler"),
                                    "kube-controller-manager": Path("/bin/kube-controller-manager")},
                             kwok_crds=(), cni_bin_dir=Path("/cni"))
    ports = {"scheduler": 10259, "controller-manager": 10257}
    comp = cluster._component("kube-scheduler", bins, ports, "gpu-node-1")
    config_file = tmp_path / "cluster" / "kube-scheduler.yaml"
    kubeconfig = tmp_path / "cluster" / "kubeconfigs" / "kube-scheduler.yaml"
    pki = tmp_path / "cluster" / "pki"
    assert comp.argv == [
        "/bin/kube-scheduler", f"--config={config_file}",
        f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1", "--secure-port=10259",
        f"--tls-cert-file={pki}/kube-scheduler-serving.crt", f"--tls-private-key-file={pki}/kube-scheduler-serving.key",
        "--v=0",
    ]
    # What --config makes it ignore as flags is in the file: the client (with CLIENT_RATES), leader election.
    config = yaml.safe_load(config_file.read_text())
    qps, burst = embedded.CLIENT_RATES
    assert config["clientConnection"] == {"kubeconfig": str(kubeconfig), "qps": qps, "burst": burst}
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["profiles"] == schedulerconfig.profiles()
    # The controller-manager keeps its flags.
    kcm = cluster._component("kube-controller-manager", bins, ports, "gpu-node-1").argv
    cm_kubeconfig = tmp_path / "cluster" / "kubeconfigs" / "kube-controller-manager.yaml"
    assert f"--kubeconfig={cm_kubeconfig}" in kcm and "--leader-elect=false" in kcm
    assert f"--kube-api-qps={qps}" in kcm and f"--kube-api-burst={burst}" in kcm
    assert not any(a.startswith("--config") for a in kcm)


def test_a_cluster_at_the_default_client_rates_sets_none(tmp_path):
    # bench/scale_bench.py --client-rates default: both components keep their own defaults.
    cluster = embedded.EmbeddedCluster(tmp_path / "cluster", client_rates=None)
    (tmp_path / "cluster").mkdir()
    bins = binaries.Binaries(paths={"kube-scheduler": Path("/bin/kube-scheduler"),
                                    "kube-controller-manager": Path("/bin/kube-controller-manager")},
                             kwok_crds=(), cni_bin_dir=Path("/cni"))
    ports = {"scheduler": 10259, "controller-manager": 10257}
    cluster._component("kube-scheduler", bins, ports, "gpu-node-1")
    config = yaml.safe_load((tmp_path / "cluster" / "kube-scheduler.yaml").read_text())
    assert set(config["clientConnection"]) == {"kubeconfig"}
    kcm = cluster._component("kube-controller-manager", bins, ports, "gpu-node-1").argv
    assert not any(a.startswith(("--kube-api-qps", "--kube-api-burst")) for a in kcm)
