"""NVIDIA's node components behave the same on both hosts: the contract of gpulab.fakegpu.components.

The components are written once (:mod:`gpulab.fakegpu.components`) and run
on two hosts; here the same scenarios run on both, side by side, and each
must leave the same node labels, the same advertised resources
(capacity/allocatable) and the same Events:

embedded host
    ``gpu-node-1`` of the session cluster: the GPU Operator's DaemonSet pods
    run the components in the node agent (:class:`gpulab.fakegpu.operands.EmbeddedHost`).
kind host
    the image's processes, ``python -m gpulab.fakegpu.daemon <component>``
    (:class:`gpulab.fakegpu.daemon.KindHost`), as kind's DaemonSets start
    them (config-manager init, then its sidecar, the device plugin, GFD, the
    MIG manager), against the same apiserver, for a Node this module creates
    with the labels a kind node of the same topology entry has. It is tainted,
    so that nothing else runs there, and KWOK does not manage it. Its kubelet
    is the part the test plays: gpulab's device manager (the kubelet's device
    side) on a temporary socket directory, its counts written into the Node's
    status as the kubelet does; the hardware lives in a temporary ``--host-dir``.

Where the hosts legitimately differ, the difference asserted is the
documented one (see :mod:`gpulab.fakegpu.daemon`): kind has no ``gpulab
fault``, and its config-manager follows the ClusterPolicy itself (an
operator restarts the pods on the embedded backend), which it reports with a
``DevicePluginConfigApplied`` Event.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from gpu_support import (
    GPU_NODE,
    OPERATOR_NS,
    gpus_released,  # noqa: F401 (autouse fixture)
    manifest,
    policy,
    restore_policy,
    wait_gpus_free,
    wait_stack,
)
from helpers import wait_for
from prometheus_client.parser import text_string_to_metric_families

from gpulab.cluster import kind
from gpulab.fakegpu import daemon, faults, gfd, mig
from gpulab.fakegpu.deviceplugin.kubelet import DeviceManager
from gpulab.fakegpu.node import NodeStatusWriter
from gpulab.kube.names import METRICS_ANNOTATION
from gpulab.kube import api
from gpulab.kube import topology as topo_mod

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
CONFIG_LABEL = "nvidia.com/device-plugin.config"
TAINT = {"key": "gpulab.io/component-contract", "value": "kind-host", "effect": "NoSchedule"}
EventKey = tuple[str, str, str]  # (reason, type, message)


# --------------------------------------------------------------------------
# The kind host: its Node, its kubelet's device side, its processes


@dataclasses.dataclass
class Hosts:
    kube: api.Client
    kind_node: str
    root: Path
    procs: dict[str, subprocess.Popen]

    @property
    def kind_metrics(self) -> str | None:
        """The kind host's DCGM exporter, as its log says once it listens ("" before); the embedded one publishes
        its endpoint on its pod. It listens on a port of its own choosing: a port picked free here could be taken
        by the time its process binds it."""
        found = re.search(r"metrics at (http://\S+/metrics)", self.log("dcgm-exporter"))
        return found[1] if found else ""

    @property
    def nodes(self) -> tuple[str, str]:
        return (GPU_NODE, self.kind_node)

    def log(self, name: str) -> str:
        try:
            return (self.root / "logs" / f"{name}.log").read_text()
        except OSError:
            return ""

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            assert proc.poll() is None, f"kind host's {name} exited ({proc.returncode}):\n{self.log(name)[-3000:]}"

    # -- what is compared

    def labels(self, node: str) -> dict[str, str]:
        """The node's NVIDIA labels: GFD's, the operator's and the MIG manager's (not GFD's timestamp)."""
        got = (self.kube.get("Node", node) or {}).get("metadata", {}).get("labels") or {}
        return {k: v for k, v in got.items() if k.startswith("nvidia.com/") and k != gfd.TIMESTAMP_LABEL}

    def resources(self, node: str) -> dict[str, tuple[str | None, str | None]]:
        """``{resource: (capacity, allocatable)}`` of the node's ``nvidia.com/*`` resources, zeros left out."""
        st = (self.kube.get("Node", node) or {}).get("status") or {}
        cap, alloc = st.get("capacity") or {}, st.get("allocatable") or {}
        out = {r: (cap.get(r), alloc.get(r)) for r in set(cap) | set(alloc) if r.startswith("nvidia.com/")}
        return {r: v for r, v in out.items() if v != ("0", "0")}

    def events(self, node: str) -> dict[str, tuple[EventKey, int]]:
        """The node's Events by object name: ((reason, type, message), count).

        Only the NVIDIA components' (and the kubelet's): the node lifecycle controller's own
        (RegisteredNode, for a node it has just seen) come whenever it gets to them.
        """
        return {e["metadata"]["name"]: ((e.get("reason", ""), e.get("type", ""), e.get("message", "")),
                                         int(e.get("count") or 1))
                for e in self.kube.list("Event", "default", field_selector=f"involvedObject.name={node}")
                if (e.get("source") or {}).get("component") != "node-controller"}

    def snapshot(self) -> dict[str, dict[str, tuple[EventKey, int]]]:
        return {node: self.events(node) for node in self.nodes}

    def new_events(self, before: dict[str, dict[str, tuple[EventKey, int]]], node: str) -> set[EventKey]:
        """Events recorded on ``node`` since ``before`` (new objects, or a higher count)."""
        old = before[node]
        return {key for name, (key, count) in self.events(node).items()
                if name not in old or count > old[name][1]}

    def label_both(self, labels: dict[str, str | None]) -> None:
        for node in self.nodes:
            self.kube.patch("Node", node, {"metadata": {"labels": labels}})

    def wait_same_labels(self, timeout: float = 60) -> dict[str, str]:
        wait_for(lambda: self.labels(GPU_NODE) == self.labels(self.kind_node), timeout,
                 what=f"the same NVIDIA labels on both hosts (embedded {self.labels(GPU_NODE)}, "
                      f"kind {self.labels(self.kind_node)})")
        return self.labels(GPU_NODE)

    def offers(self, node: str, want: dict[str, tuple[str | None, str | None]]) -> bool:
        """The node's resources are ``want``, and nothing else is allocatable. A resource whose device plugin
        left (MIG's, after an earlier test turned MIG off) keeps its capacity at 0 allocatable for the kubelet's
        grace period, as a real kubelet's does; it offers nothing, so it does not count."""
        have = self.resources(node)
        return (all(have.get(r) == v for r, v in want.items())
                and all(alloc in (None, "0") for r, (_, alloc) in have.items() if r not in want))

    def wait_resources(self, node: str, want: dict[str, tuple[str | None, str | None]], timeout: float = 90) -> None:
        wait_for(lambda: self.offers(node, want), timeout,
                 what=f"{node}'s resources {want} (now {self.resources(node)})")


def _kind_labels(name: str) -> dict[str, str]:
    """The labels a kind node of the topology's GPU node has after ``gpulab up --backend kind``."""
    spec = topo_mod.load().node(GPU_NODE)
    return {**kind.node_labels(dataclasses.replace(spec, name=name)), "kubernetes.io/hostname": name}


@pytest.fixture(scope="module")
def hosts(kube, cluster) -> Iterator[Hosts]:
    name = f"contract-kind-{uuid.uuid4().hex[:6]}"
    root = Path(tempfile.mkdtemp(prefix="ck-", dir="/tmp"))  # short: the plugin's unix sockets live in it
    (root / "logs").mkdir()
    plugin_dir, host_dir, config = root / "dp", root / "host", root / "config" / "config.yaml"
    plugin_dir.mkdir()
    strategy = ((policy(kube)["spec"].get("mig") or {}).get("strategy")) or "single"
    procs: dict[str, subprocess.Popen] = {}
    status = NodeStatusWriter(api.Client(cluster.kubeconfig), workers=1)  # the kubelet's part on kind
    manager = DeviceManager(plugin_dir, on_change=lambda counts: status.submit(name, counts))
    created = False
    logs = []
    try:
        kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": _kind_labels(name)},
                     "spec": {"taints": [TAINT]}})
        created = True
        status.start()
        manager.start()
        env = {k: v for k, v in os.environ.items() if k not in ("NODE_NAME", "POD_NAMESPACE", "CONFIG_FILE",
                                                                 "MIG_STRATEGY", "KUBERNETES_SERVICE_HOST")}
        common = ["--node", name, "--kubeconfig", str(cluster.kubeconfig), "--poll-interval", "0.2"]

        def start(label: str, *args: str) -> subprocess.Popen:
            out = open(root / "logs" / f"{label}.log", "w")
            logs.append(out)
            return subprocess.Popen([sys.executable, "-m", "gpulab.fakegpu.daemon", *args, *common],
                                    cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)

        # The device plugin DaemonSet's init container, then its containers; GFD; the MIG manager.
        init = start("config-manager-init", "config-manager", "--oneshot", "--dst", str(config),
                     "--namespace", OPERATOR_NS)
        assert init.wait(60) == 0, (root / "logs" / "config-manager-init.log").read_text()
        procs["config-manager"] = start("config-manager", "config-manager", "--dst", str(config),
                                        "--namespace", OPERATOR_NS)
        procs["device-plugin"] = start("device-plugin", "device-plugin", "--host-dir", str(host_dir),
                                       "--plugin-dir", str(plugin_dir), "--config-file", str(config),
                                       "--mig-strategy", strategy)
        procs["gfd"] = start("gfd", "gfd", "--host-dir", str(host_dir), "--config-file", str(config),
                             "--mig-strategy", strategy)
        procs["mig-manager"] = start("mig-manager", "mig-manager", "--host-dir", str(host_dir),
                                     "--namespace", OPERATOR_NS)
        procs["dcgm-exporter"] = start("dcgm-exporter", "dcgm-exporter", "--host-dir", str(host_dir),
                                       "--listen", "127.0.0.1:0")
        hosts = Hosts(kube, name, root, procs)
        yield hosts
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for label in sorted(procs):
            text = (root / "logs" / f"{label}.log").read_text() if (root / "logs" / f"{label}.log").exists() else ""
            print(f"--- kind host's {label} (last lines) ---\n{text[-2000:]}", file=sys.stderr)
        for out in logs:
            out.close()
        manager.stop()
        status.stop()
        if created:
            for e in kube.list("Event", "default", field_selector=f"involvedObject.name={name}"):
                kube.delete("Event", e["metadata"]["name"], "default")
            kube.delete("Node", name)
        shutil.rmtree(root, ignore_errors=True)


BASE = {"nvidia.com/gpu": ("2", "2")}


def _series(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """An exporter's page as {(name, labels without the per-machine ones): value}."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    per_machine = {"Hostname", "UUID", "pci_bus_id"}  # each host's own node name and GPUs' identities
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in per_machine))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_the_dcgm_exporter_serves_the_same_series_on_both_hosts(hosts, kube):
    wait_gpus_free(kube)  # idle cards: an earlier module's GPU pods may still be terminating
    exporter = kube.list("Pod", OPERATOR_NS, label_selector="app=nvidia-dcgm-exporter")[0]
    embedded_url = wait_for(lambda: (kube.get("Pod", exporter["metadata"]["name"], OPERATOR_NS)["metadata"]
                                     .get("annotations") or {}).get(METRICS_ANNOTATION), 30,
                            what="the embedded exporter's endpoint")
    wait_for(lambda: _reachable(hosts.kind_metrics), 30, what="the kind host's exporter listening")
    # Idle cards (no pod holds one here): the same series, labels and values on both hosts.
    embedded, on_kind = _series(embedded_url), _series(hosts.kind_metrics)
    assert embedded == on_kind, {k: (embedded.get(k), on_kind.get(k)) for k in set(embedded) ^ set(on_kind)}
    assert ("DCGM_FI_DEV_GPU_UTIL", (("device", "nvidia0"), ("gpu", "0"),
                                     ("modelName", "NVIDIA H100 80GB HBM3"))) in embedded
    hosts.check_alive()


def _reachable(url: str) -> bool:
    if not url:
        return False
    try:
        urllib.request.urlopen(url, timeout=2).read()
        return True
    except OSError:
        return False


def test_both_hosts_start_with_the_same_labels_and_resources(hosts):
    for node in hosts.nodes:
        hosts.wait_resources(node, BASE)
    labels = hosts.wait_same_labels()
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3" and labels["nvidia.com/gpu.count"] == "2"
    assert labels[mig.MIG_CONFIG_LABEL] == "all-disabled"
    hosts.check_alive()


# --------------------------------------------------------------------------
# Time-slicing and a broken device-plugin config


@pytest.fixture(scope="class")
def time_slicing(hosts, kube, kubectl):
    """The chapter's three steps on both nodes; the Events they caused on each; undone afterwards."""
    original = policy(kube)["spec"]
    wait_gpus_free(kube)
    before = hosts.snapshot()
    try:
        kubectl("apply", "-f", str(manifest("04-sharing/time-slicing-config.yaml")))
        kubectl("patch", "clusterpolicies.nvidia.com/cluster-policy", "--type", "merge",
                "-p", '{"spec": {"devicePlugin": {"config": {"name": "time-slicing-config", "default": "any"}}}}')
        hosts.label_both({CONFIG_LABEL: "any"})
        for node in hosts.nodes:
            hosts.wait_resources(node, {"nvidia.com/gpu": ("8", "8")})
        wait_stack(kube)
        yield before
    finally:
        hosts.label_both({CONFIG_LABEL: None})
        restore_policy(kube, original)
        kube.delete("ConfigMap", "time-slicing-config", OPERATOR_NS)
        for node in hosts.nodes:
            hosts.wait_resources(node, BASE)


class TestTimeSlicing:
    def test_replicas_4_turn_two_gpus_into_8_on_both(self, hosts, time_slicing):
        labels = hosts.wait_same_labels()
        assert labels["nvidia.com/gpu.replicas"] == "4"
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-SHARED"
        assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
        for node in hosts.nodes:
            assert hosts.offers(node, {"nvidia.com/gpu": ("8", "8")}), (node, hosts.resources(node))
        # Documented difference: on kind no operator restarts the pods for the new ClusterPolicy; the
        # config-manager sidecar follows it and says so. On the embedded backend the restarted pods'
        # init containers write the config, which their sidecars then keep (no Event).
        applied = ("DevicePluginConfigApplied", "Normal",
                   "device plugin config 'any' from ConfigMap gpu-operator/time-slicing-config applied")
        kind_events = wait_for(lambda: (e := hosts.new_events(time_slicing, hosts.kind_node)) and e, 30,
                               what="the kind host's Event")
        assert kind_events == {applied}
        assert hosts.new_events(time_slicing, GPU_NODE) == set()
        hosts.check_alive()

    def test_a_broken_config_keeps_the_last_good_one_on_both(self, hosts, kube, time_slicing):
        before = hosts.snapshot()
        kube.patch("ConfigMap", "time-slicing-config", {"data": {"broken": (
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 1\n")}},
            OPERATOR_NS)
        hosts.label_both({CONFIG_LABEL: "broken"})
        invalid = ("DevicePluginConfigInvalid", "Warning",
                   "config 'broken' of ConfigMap gpu-operator/time-slicing-config is invalid: ")
        for node in hosts.nodes:
            wait_for(lambda node=node: any(k[0] == invalid[0] for k in hosts.new_events(before, node)), 30,
                     what=f"a {invalid[0]} Event on {node}")
        hosts.label_both({CONFIG_LABEL: "nonexistent"})
        for node in hosts.nodes:
            wait_for(lambda node=node: any(k[0] == "DevicePluginConfigNotFound" for k in hosts.new_events(before, node)),
                     30, what=f"a DevicePluginConfigNotFound Event on {node}")
        hosts.label_both({CONFIG_LABEL: "any"})
        embedded, kind_events = hosts.new_events(before, GPU_NODE), hosts.new_events(before, hosts.kind_node)
        assert embedded == kind_events
        assert {(r, t) for r, t, _ in embedded} == {("DevicePluginConfigInvalid", "Warning"),
                                                    ("DevicePluginConfigNotFound", "Warning")}
        for _, _, message in embedded:
            assert message.endswith("keeping the last good config 'any'"), message
        assert any(m.startswith(invalid[2]) and "number of replicas must be >= 2" in m for _, _, m in embedded)
        for node in hosts.nodes:
            assert hosts.offers(node, {"nvidia.com/gpu": ("8", "8")}), (node, hosts.resources(node))
        assert hosts.wait_same_labels()["nvidia.com/gpu.replicas"] == "4"
        hosts.check_alive()


# --------------------------------------------------------------------------
# MIG


def _relabel_mig(hosts: Hosts, value: str, timeout: float = 120) -> None:
    hosts.label_both({mig.MIG_CONFIG_LABEL: value, mig.MIG_CONFIG_STATE_LABEL: None})
    for node in hosts.nodes:
        wait_for(lambda node=node: hosts.labels(node).get(mig.MIG_CONFIG_STATE_LABEL) in (mig.STATE_SUCCESS,
                                                                                           mig.STATE_FAILED),
                 timeout, what=f"the MIG manager's answer on {node}")


def test_mig_all_1g_10gb_on_both(hosts, kube):
    wait_gpus_free(kube)  # the MIG manager does not touch GPUs in use
    before = hosts.snapshot()
    try:
        _relabel_mig(hosts, "all-1g.10gb")
        for node in hosts.nodes:
            assert hosts.labels(node)[mig.MIG_CONFIG_STATE_LABEL] == mig.STATE_SUCCESS
        # MIG strategy single: the 14 slices are advertised as nvidia.com/gpu.
        for node in hosts.nodes:
            hosts.wait_resources(node, {"nvidia.com/gpu": ("14", "14")})
        labels = hosts.wait_same_labels()
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
        assert labels["nvidia.com/gpu.count"] == "14"
        assert all(labels[k] == "true" for k in mig.CLIENT_DEPLOY_LABELS if k in labels)
        applied = {("MigConfigApplied", "Normal", "applied MIG config 'all-1g.10gb'")}
        for node in hosts.nodes:
            wait_for(lambda node=node: hosts.new_events(before, node) == applied, 30,
                     what=f"the MigConfigApplied Event on {node} ({hosts.new_events(before, node)})")
        hosts.check_alive()
    finally:
        _relabel_mig(hosts, "all-disabled")
        wait_stack(kube)
        for node in hosts.nodes:
            hosts.wait_resources(node, BASE)
    assert hosts.new_events(before, GPU_NODE) == hosts.new_events(before, hosts.kind_node)
    hosts.wait_same_labels()


# --------------------------------------------------------------------------
# Faults: the embedded host has them, the kind host cannot


@pytest.fixture
def fault(gpulab_home, kube, hosts):
    """``gpulab fault ...``; cleared and the stack ready again afterwards."""
    env = dict(os.environ, GPULAB_HOME=str(gpulab_home))

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, "-m", "gpulab.cli", "fault", *args], env=env,
                              capture_output=True, text=True, timeout=60)
        if check:
            assert proc.returncode == 0, proc.stderr
        return proc

    yield run
    run("clear")
    for app in ("nvidia-operator-validator", "nvidia-cuda-validator", "nvidia-device-plugin-daemonset"):
        for pod in kube.list("Pod", OPERATOR_NS, label_selector=f"app={app}"):
            kube.delete("Pod", pod["metadata"]["name"], OPERATOR_NS, grace_seconds=0)
    wait_stack(kube)
    hosts.wait_resources(GPU_NODE, BASE)


def test_faults_change_the_embedded_host_only(hosts, fault):
    # The kind host cannot have faults: `gpulab fault` knows the topology's simulated GPU nodes only ...
    refused = fault("set", faults.GPU_UNHEALTHY, hosts.kind_node, "--gpu", "1", check=False)
    assert refused.returncode != 0 and "has no GPUs in this cluster's topology" in refused.stderr + refused.stdout
    # ... and KindHost says it has none.
    args = daemon.parser().parse_args(["gfd", "--node", hosts.kind_node, "--gpu-model", "h100-80gb",
                                       "--gpu-count", "2", "--host-dir", str(hosts.root / "host")])
    assert daemon.KindHost(args, daemon._Stop(), "main.go:1").faults() == faults.NodeFaults()

    before = hosts.snapshot()
    fault("set", faults.GPU_UNHEALTHY, GPU_NODE, "--gpu", "1")
    fault("set", faults.CUDA_DRIVER_TOO_OLD, GPU_NODE)
    # Embedded: the device plugin marks GPU 1 Unhealthy (allocatable drops, capacity stays); GFD labels
    # the older driver the node now reports.
    hosts.wait_resources(GPU_NODE, {"nvidia.com/gpu": ("2", "1")})
    wait_for(lambda: hosts.labels(GPU_NODE).get("nvidia.com/cuda.driver-version.full") == faults.OLD_DRIVER_VERSION,
             30, what="GFD's driver labels after cuda-driver-too-old")
    embedded, kind_labels = hosts.labels(GPU_NODE), hosts.labels(hosts.kind_node)
    assert embedded["nvidia.com/cuda.runtime-version.full"] == faults.OLD_CUDA_VERSION
    # Kind: nothing changed.
    assert hosts.offers(hosts.kind_node, BASE), hosts.resources(hosts.kind_node)
    assert kind_labels["nvidia.com/cuda.driver-version.full"] == gfd.DRIVER_VERSION
    assert {k: v for k, v in embedded.items() if not k.startswith("nvidia.com/cuda.")} == \
        {k: v for k, v in kind_labels.items() if not k.startswith("nvidia.com/cuda.")}
    assert "XidCriticalError" not in hosts.log("device-plugin")

    fault("set", faults.DEVICE_PLUGIN_DOWN, GPU_NODE)
    hosts.wait_resources(GPU_NODE, {"nvidia.com/gpu": ("2", "0")})
    assert hosts.offers(hosts.kind_node, BASE), hosts.resources(hosts.kind_node)
    # Faults are no Events on either host.
    assert hosts.new_events(before, GPU_NODE) == hosts.new_events(before, hosts.kind_node) == set()
    hosts.check_alive()
