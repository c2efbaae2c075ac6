"""The GPU Operator's ClusterPolicy → DaemonSets, as pure functions, and its manifests."""

from __future__ import annotations

import copy

import pytest
import yaml

from gpulab import paths
from gpulab.hardware import models
from gpulab.fakegpu import operator

MANIFESTS = paths.manifests() / "gpu-operator"


def policy(**spec) -> dict:
    doc = yaml.safe_load((MANIFESTS / "30-cluster-policy.yaml").read_text())
    doc["metadata"]["uid"] = "5f0c6e8a-0000-4000-8000-000000000001"
    for key, value in spec.items():
        doc["spec"][key] = {**doc["spec"].get(key, {}), **value}
    return doc


def containers(ds: dict, init: bool = False) -> dict[str, dict]:
    pod = ds["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod.get("initContainers" if init else "containers") or []}


def env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "<ref>") for e in container.get("env") or []}


def test_the_chart_policy_gives_nvidias_daemonsets_with_nvidias_images() -> None:
    want = operator.desired_daemonsets(policy())
    assert sorted(want) == ["gpu-feature-discovery", "nvidia-dcgm-exporter", "nvidia-device-plugin-daemonset",
                            "nvidia-mig-manager", "nvidia-operator-validator"]
    images = {name: [c["image"] for c in containers(ds).values()] for name, ds in want.items()}
    assert images["nvidia-device-plugin-daemonset"] == ["nvcr.io/nvidia/k8s-device-plugin:v0.17.1"]
    assert images["gpu-feature-discovery"] == ["nvcr.io/nvidia/k8s-device-plugin:v0.17.1"]
    assert images["nvidia-mig-manager"] == ["nvcr.io/nvidia/cloud-native/k8s-mig-manager:v0.12.1-ubuntu20.04"]
    assert images["nvidia-dcgm-exporter"] == ["nvcr.io/nvidia/k8s/dcgm-exporter:4.1.1-4.0.4-ubuntu22.04"]
    assert images["nvidia-operator-validator"] == ["nvcr.io/nvidia/cloud-native/gpu-operator-validator:v25.3.0"]


@pytest.mark.parametrize("name,deploy", [
    ("nvidia-device-plugin-daemonset", "device-plugin"), ("gpu-feature-discovery", "gpu-feature-discovery"),
    ("nvidia-dcgm-exporter", "dcgm-exporter"), ("nvidia-mig-manager", "mig-manager"),
    ("nvidia-operator-validator", "operator-validator"),
])
def test_each_daemonset_selects_its_deploy_label_and_is_owned_by_the_policy(name: str, deploy: str) -> None:
    ds = operator.desired_daemonsets(policy())[name]
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {f"nvidia.com/gpu.deploy.{deploy}": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert ds["spec"]["selector"]["matchLabels"] == {"app": name}
    assert ds["spec"]["template"]["metadata"]["labels"]["app"] == name
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
    [owner] = ds["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("ClusterPolicy", "cluster-policy", True)


def test_mig_strategy_reaches_the_plugin_gfd_and_plugin_validation() -> None:
    want = operator.desired_daemonsets(policy(mig={"strategy": "mixed"}))
    assert env(containers(want["nvidia-device-plugin-daemonset"])["nvidia-device-plugin"])["MIG_STRATEGY"] == "mixed"
    assert env(containers(want["gpu-feature-discovery"])["gpu-feature-discovery"])["MIG_STRATEGY"] == "mixed"
    assert env(containers(want["nvidia-operator-validator"], init=True)["plugin-validation"])["MIG_STRATEGY"] == "mixed"


def test_a_device_plugin_config_adds_the_config_manager_and_the_configmap() -> None:
    ds = operator.desired_daemonsets(policy(devicePlugin={"config": {"name": "time-slicing-config",
                                                                     "default": "any"}}))
    plugin = ds["nvidia-device-plugin-daemonset"]
    assert list(containers(plugin)) == ["nvidia-device-plugin", "config-manager"]
    assert list(containers(plugin, init=True)) == ["config-manager-init"]
    assert env(containers(plugin)["nvidia-device-plugin"])["CONFIG_FILE"] == "/config/config.yaml"
    manager = env(containers(plugin)["config-manager"])
    assert manager["DEFAULT_CONFIG"] == "any" and manager["NODE_LABEL"] == "nvidia.com/device-plugin.config"
    assert env(containers(plugin, init=True)["config-manager-init"])["ONESHOT"] == "true"
    volumes = {v["name"]: v for v in plugin["spec"]["template"]["spec"]["volumes"]}
    assert volumes["available-configs"]["configMap"] == {"name": "time-slicing-config"}
    assert "emptyDir" in volumes["config"]
    assert list(containers(ds["gpu-feature-discovery"])) == ["gpu-feature-discovery", "config-manager"]


def test_without_a_config_the_plugin_runs_alone() -> None:
    plugin = operator.desired_daemonsets(policy())["nvidia-device-plugin-daemonset"]
    assert list(containers(plugin)) == ["nvidia-device-plugin"]
    assert "initContainers" not in plugin["spec"]["template"]["spec"]


def test_disabled_operands_have_no_daemonset_and_the_validator_always_has_one() -> None:
    want = operator.desired_daemonsets(policy(dcgmExporter={"enabled": False}, migManager={"enabled": False},
                                              gfd={"enabled": False}, devicePlugin={"enabled": False}))
    assert [n for n, ds in want.items() if ds is not None] == ["nvidia-operator-validator"]


def test_the_hash_changes_with_the_policy_and_only_then() -> None:
    a = operator.desired_daemonsets(policy())["nvidia-device-plugin-daemonset"]
    b = operator.desired_daemonsets(policy())["nvidia-device-plugin-daemonset"]
    c = operator.desired_daemonsets(policy(mig={"strategy": "mixed"}))["nvidia-device-plugin-daemonset"]
    key = operator.HASH_ANNOTATION
    assert a["metadata"]["annotations"][key] == b["metadata"]["annotations"][key]
    assert a["metadata"]["annotations"][key] != c["metadata"]["annotations"][key]


def test_validator_init_containers_run_in_nvidias_order() -> None:
    ds = operator.desired_daemonsets(policy())["nvidia-operator-validator"]
    inits = containers(ds, init=True)
    assert list(inits) == ["driver-validation", "toolkit-validation", "cuda-validation", "plugin-validation"]
    assert env(inits["driver-validation"])["WITH_WAIT"] == "true"
    assert env(inits["plugin-validation"])["WITH_WORKLOAD"] == "false"
    main = containers(ds)["nvidia-operator-validator"]
    assert main["args"] == ["echo all validations are successful; sleep infinity"]


def test_policy_env_and_image_overrides() -> None:
    p = policy(devicePlugin={"version": "v0.17.2", "env": [{"name": "FAIL_ON_INIT_ERROR", "value": "false"}]})
    c = containers(operator.desired_daemonsets(p)["nvidia-device-plugin-daemonset"])["nvidia-device-plugin"]
    assert c["image"] == "nvcr.io/nvidia/k8s-device-plugin:v0.17.2"
    assert env(c)["FAIL_ON_INIT_ERROR"] == "false"


def test_daemonset_ready_needs_every_pod_ready_and_the_rollout_done() -> None:
    ds = {"metadata": {"generation": 2}, "status": {"observedGeneration": 2, "desiredNumberScheduled": 1,
                                                    "numberReady": 1, "updatedNumberScheduled": 1}}
    assert operator.daemonset_ready(ds)
    for change in ({"numberReady": 0}, {"updatedNumberScheduled": 0}, {"observedGeneration": 1},
                   {"numberUnavailable": 1}):
        broken = copy.deepcopy(ds)
        broken["status"].update(change)
        assert not operator.daemonset_ready(broken), change


def test_mig_on_a_gpu_that_cannot_do_it_is_answered() -> None:
    l4 = models.get_model("l4")
    why = operator.non_mig_node_request({"nvidia.com/mig.config": "all-1g.10gb"}, l4)
    assert why and "not MIG-capable" in why
    assert operator.non_mig_node_request({"nvidia.com/mig.config": "all-disabled"}, l4) is None
    assert operator.non_mig_node_request({"nvidia.com/mig.config": "all-1g.10gb",
                                          "nvidia.com/mig.config.state": "failed"}, l4) is None
    assert operator.non_mig_node_request({"nvidia.com/mig.config": "all-1g.10gb"},
                                         models.get_model("h100-80gb")) is None


def test_the_crd_is_nvidias_api_with_the_state_column() -> None:
    crd = yaml.safe_load((MANIFESTS / "10-crd-clusterpolicies.yaml").read_text())
    assert crd["metadata"]["name"] == "clusterpolicies.nvidia.com"
    assert crd["spec"]["scope"] == "Cluster"
    [version] = crd["spec"]["versions"]
    assert version["name"] == "v1" and version["subresources"] == {"status": {}}
    assert [(c["name"], c["jsonPath"]) for c in version["additionalPrinterColumns"]] == [
        ("Status", ".status.state"), ("Age", ".metadata.creationTimestamp")]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert set(spec["devicePlugin"]["properties"]["config"]["properties"]) == {"name", "default"}
    assert spec["mig"]["properties"]["strategy"]["enum"] == ["none", "single", "mixed"]
    for key in ("driver", "toolkit", "dcgmExporter", "gfd", "migManager", "nodeStatusExporter"):
        assert spec[key]["properties"]["enabled"]["type"] == "boolean"


def test_the_install_manifests_are_what_the_chart_installs() -> None:
    kinds = [(d["kind"], d["metadata"]["name"]) for d in operator.manifest_documents()]
    assert kinds == [("Namespace", "gpu-operator"), ("CustomResourceDefinition", "clusterpolicies.nvidia.com"),
                     ("ServiceAccount", "gpu-operator"), ("Deployment", "gpu-operator"),
                     ("ClusterPolicy", "cluster-policy")]
    deployment = next(d for d in operator.manifest_documents() if d["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "nvcr.io/nvidia/gpu-operator:v25.3.0"


def test_a_daemonset_is_expected_on_the_nodes_its_selector_matches_and_whose_taints_it_tolerates() -> None:
    """stack_ready counts an operand's pods against the nodes themselves: right after a MIG change brings
    paused operands back by their labels, the DaemonSet's status still counts the nodes before."""
    ds = operator.desired_daemonsets(policy())["nvidia-device-plugin-daemonset"]
    selected = {"nvidia.com/gpu.deploy.device-plugin": "true"}

    def node(labels: dict, taints: list | None = None) -> dict:
        return {"metadata": {"name": "gpu-node-1", "labels": labels}, "spec": {"taints": taints or []}}

    assert operator.runs_on(ds, node(selected))
    assert not operator.runs_on(ds, node({"nvidia.com/gpu.deploy.device-plugin": "paused-for-mig-change"}))
    assert operator.runs_on(ds, node(selected, [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]))
    assert operator.runs_on(ds, node(selected, [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]))
    assert operator.runs_on(ds, node(selected, [{"key": "team", "value": "a", "effect": "PreferNoSchedule"}]))
    assert not operator.runs_on(ds, node(selected, [{"key": "team", "value": "a", "effect": "NoSchedule"}]))
