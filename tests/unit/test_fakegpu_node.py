"""One simulated GPU node end to end, without a cluster: plugin ↔ device manager over real sockets,
admission, what containers get, and what their CUDA programs run into."""

from __future__ import annotations

import io
import shutil
import tempfile
import threading
from pathlib import Path

import pytest
from deviceplugin_support import eventually

from gpulab.kube.topology import NodeSpec
from gpulab.fakegpu import dcgm, faults, nvidiasmi
from gpulab.fakegpu.devicemap import advertised_resources
from gpulab.fakegpu.pluginconfig import parse_config
from gpulab.fakegpu.deviceplugin.plugin import DevicePlugin, PluginConfig
from gpulab.fakegpu.node import GpuNode, NodeStatusWriter, cuda_runtime_of
from gpulab.kube.names import ALLOCATED_DEVICES_ANNOTATION
from gpulab.runtime.devices import AdmissionError

CUDA = "nvcr.io/nvidia/cuda:12.6.2-base-ubuntu24.04"
TIME_SLICING = """
version: v1
sharing:
  timeSlicing:
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


class Recorder:
    """Stands in for the API client: remembers what the node wrote."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, str, dict, str | None]] = []
        self.events: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def patch(self, kind, name, body, namespace=None, subresource=None, strategy="merge"):
        with self.lock:
            self.patches.append((kind, name, body, subresource))
        return body

    def event(self, involved, reason, message, type_="Normal", component="kubelet", host=None):
        self.events.append((reason, message))

    def node_status(self) -> dict:
        with self.lock:
            status = [b["status"] for k, _, b, sub in self.patches if k == "Node" and sub == "status"]
        return status[-1] if status else {}


class Stack:
    def __init__(self) -> None:
        self.client = Recorder()
        self.node_status = NodeStatusWriter(self.client, workers=2)

    def notify(self, node=None, everyone=True) -> None:
        pass

    def pod_event(self, pod, reason, message, type_="Normal") -> None:
        self.client.event(pod, reason, message, type_)


@pytest.fixture
def cluster_dir():
    path = Path(tempfile.mkdtemp(prefix="gn-", dir="/tmp"))  # short: unix socket paths
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def node(cluster_dir):
    spec = NodeSpec("gpu-node-1", "gpu", "32", "256Gi", 110, "h100-80gb", 2, {}, ())
    stack = Stack()
    stack.node_status.start()
    n = GpuNode(stack, spec, cluster_dir)
    n.start()
    yield n
    n.stop()
    stack.node_status.stop()


@pytest.fixture
def plugin(node):
    """The node's device plugin, started with a config as the plugin program would."""
    started: list[DevicePlugin] = []

    def start(config_text: str | None = None) -> DevicePlugin:
        config = parse_config(config_text) if config_text else None
        resources = advertised_resources(node.model, node.count, node.name, config, mig_layout=node.mig_layout)
        node.publish(resources)
        p = DevicePlugin(PluginConfig(plugin_dir=node.plugin_dir, nvidia_smi=node.nvidia_smi,
                                      state_dir=node.plugin_dir / "gpulab-nvidia-smi", dev_root=node.dev_root,
                                      poll_interval=0.05), inventory=node.inventory(resources))
        p.start()
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()


def pod(name: str, gpus: int = 1, memory: str | None = None, resource: str = "nvidia.com/gpu") -> dict:
    annotations = {"gpulab.io/gpu-memory": memory} if memory else {}
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "annotations": annotations},
            "spec": {"nodeName": "gpu-node-1", "containers": [
                {"name": "main", "image": CUDA, "command": ["python3", "train.py"],
                 "resources": {"limits": {resource: str(gpus)}}}]}}


def smi(grant, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    rc = nvidiasmi.run(list(args), env=grant.env, out=out, err=out)
    return rc, out.getvalue()


def test_plugin_counts_become_the_nodes_capacity_and_allocatable(node, plugin) -> None:
    plugin(TIME_SLICING)
    status = eventually(lambda: node.stack.client.node_status().get("capacity"))
    assert status == {"nvidia.com/gpu": "8"}
    assert node.stack.client.node_status()["allocatable"] == {"nvidia.com/gpu": "8"}


def test_an_unhealthy_gpu_lowers_allocatable_only(node, plugin, cluster_dir) -> None:
    p = plugin()
    eventually(lambda: node.stack.client.node_status().get("allocatable") == {"nvidia.com/gpu": "2"})
    faults.inject(cluster_dir, {"gpu-node-1": 2}, "gpu-node-1", faults.GPU_UNHEALTHY, gpu=1)
    assert node.reload_faults()
    p.update_inventory(node.inventory(advertised_resources(node.model, 2, node.name)))
    eventually(lambda: node.stack.client.node_status().get("allocatable") == {"nvidia.com/gpu": "1"})
    assert node.stack.client.node_status()["capacity"] == {"nvidia.com/gpu": "2"}


def test_admission_allocates_and_the_container_sees_its_gpu(node, plugin) -> None:
    plugin()
    eventually(lambda: node.manager.resource_counts() == {"nvidia.com/gpu": (2, 2)})
    p = pod("gpu-check")
    node.admit(p)
    annotation = next(b for k, _, b, _ in node.stack.client.patches if k == "Pod")["metadata"]["annotations"]
    assert '"nvidia.com/gpu": ["GPU-' in annotation[ALLOCATED_DEVICES_ANNOTATION]
    grant = node.prepare(p, p["spec"]["containers"][0])
    assert grant.env["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-")
    assert any(m.container_path == "/usr/bin/nvidia-smi" and m.host_path == str(node.nvidia_smi)
               for m in grant.mounts)
    assert {d.container_path for d in grant.devices} >= {"/dev/nvidiactl", "/dev/nvidia-uvm"}
    rc, text = smi(grant)
    assert rc == 0 and "NVIDIA H100 80GB HBM3" in text and "No running processes found" in text
    rc, text = smi(grant, "-L")
    assert text.count("GPU ") == 1  # one of the node's two GPUs


def test_a_container_without_gpus_on_a_gpu_node_finds_none(node) -> None:
    p = pod("nginx", gpus=0)
    grant = node.prepare(p, p["spec"]["containers"][0])
    rc, text = smi(grant)
    assert (rc, text.strip()) == (6, "No devices were found")


def test_too_many_gpus_is_refused_as_out_of_resource(node, plugin) -> None:
    plugin()
    eventually(lambda: node.manager.resource_counts() == {"nvidia.com/gpu": (2, 2)})
    node.admit(pod("one"))
    with pytest.raises(AdmissionError) as e:
        node.admit(pod("two", gpus=2))
    assert e.value.reason == "OutOfnvidia.com/gpu"
    assert e.value.message == ("Node didn't have enough resource: nvidia.com/gpu, requested: 2, used: 1, "
                               "capacity: 2")


def test_an_allocate_error_is_an_unexpected_admission_error(node, plugin) -> None:
    plugin(TIME_SLICING)
    eventually(lambda: node.manager.resource_counts() == {"nvidia.com/gpu": (8, 8)})
    with pytest.raises(AdmissionError) as e:
        node.admit(pod("two-replicas", gpus=2))
    assert e.value.reason == "UnexpectedAdmissionError"
    assert e.value.message.startswith("Allocate failed due to rpc error: code = Unknown desc = ")
    assert "maximum request size for shared resources is 1; found 2" in e.value.message
    assert e.value.message.endswith(", which is unexpected")
    assert node.manager.pod_devices() == {}  # nothing is left half-allocated


def test_time_sliced_neighbours_run_out_of_memory_together(node, plugin) -> None:
    plugin(TIME_SLICING.replace("failRequestsGreaterThanOne: true", "failRequestsGreaterThanOne: false"))
    eventually(lambda: node.manager.resource_counts() == {"nvidia.com/gpu": (8, 8)})
    pods = [pod(f"p{i}", memory="30Gi") for i in range(5)]
    woken: list[str] = []
    node.wake_pod = woken.append
    kills = {}
    for p in pods:
        node.admit(p)
        kill = node.observe(p, p["spec"]["containers"][0], running=True)
        if kill:
            kills[p["metadata"]["name"]] = kill
    # The neighbours killed meanwhile are woken (their workers need not poll), and hear of it on their next sync.
    uid_names = {p["metadata"]["uid"]: p["metadata"]["name"] for p in pods}
    killed_at_start = set(kills)
    for p in pods:
        kill = node.observe(p, p["spec"]["containers"][0], running=True)
        if kill:
            kills[p["metadata"]["name"]] = kill
    by_gpu: dict[str, list[str]] = {}
    for p in pods:
        [device] = node.manager.allocations(p["metadata"]["uid"])[0].device_ids
        by_gpu.setdefault(device.split("::")[0], []).append(p["metadata"]["name"])
    crowded = [names for names in by_gpu.values() if len(names) * 30 > 79.65]
    assert crowded, by_gpu
    assert woken and {uid_names[uid] for uid in woken} == {n for names in crowded for n in names} - killed_at_start
    # The one that filled its card and its neighbours there all saw the same card: 663 MiB left.
    assert {kills[name].lines[0] for names in crowded for name in names} == {
        "CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 79.65 GiB of which 663.00 MiB "
        "is free."}
    for names in by_gpu.values():
        for name in names:
            if names in crowded:
                assert kills[name].exit_code == 1 and "CUDA out of memory" in kills[name].lines[0]
            else:
                assert name not in kills
    host = node.state()
    assert sum(len(g["processes"]) for g in host["gpus"]) == sum(len(n) for n in by_gpu.values() if n not in crowded)


def test_a_declared_cuda_program_fails_on_a_broken_driver(node, plugin, cluster_dir) -> None:
    plugin()
    eventually(lambda: node.manager.resource_counts() == {"nvidia.com/gpu": (2, 2)})
    faults.inject(cluster_dir, {"gpu-node-1": 2}, "gpu-node-1", faults.FABRIC_MANAGER_DOWN)
    node.reload_faults()
    p = pod("train", memory="1Gi")
    node.admit(p)
    kill = node.observe(p, p["spec"]["containers"][0], running=True)
    assert kill is not None and kill.lines == [
        "CUDA error: system not yet initialized (cudaErrorSystemNotReady = 802)"]


def test_release_frees_devices_and_memory(node, plugin) -> None:
    plugin()
    eventually(lambda: node.manager.resource_counts() == {"nvidia.com/gpu": (2, 2)})
    big = [pod(f"b{i}", gpus=1, memory="70Gi") for i in range(2)]
    for p in big:
        node.admit(p)
        assert node.observe(p, p["spec"]["containers"][0], running=True) is None
    assert len(node.manager.pod_devices()) == 2  # the device manager holds both pods' devices
    assert all(g["memory_used_mib"] == 70 * 1024 for g in node.state()["gpus"])
    for p in big:
        node.release(p)
    assert not node.manager.pod_devices() and all(g["memory_used_mib"] == 0 for g in node.state()["gpus"])


def test_mig_devices_from_the_hardware_state(node, plugin) -> None:
    node.apply_mig(node.model.layout("all-1g.10gb"))
    assert (node.gpu_dir / "hardware.json").exists()
    plugin("version: v1\nflags:\n  migStrategy: mixed\n")
    eventually(lambda: node.manager.resource_counts().get("nvidia.com/mig-1g.10gb") == (14, 14))
    ok, big = pod("ok", memory="8Gi", resource="nvidia.com/mig-1g.10gb"), pod(
        "big", memory="12Gi", resource="nvidia.com/mig-1g.10gb")
    for p in (ok, big):
        node.admit(p)
    assert node.observe(ok, ok["spec"]["containers"][0], running=True) is None
    kill = node.observe(big, big["spec"]["containers"][0], running=True)
    assert kill and "GPU 0 has a total capacity of 9.75 GiB" in kill.lines[0]
    rc, text = smi(node.prepare(ok, ok["spec"]["containers"][0]), "-L")
    assert rc == 0 and text.count("MIG 1g.10gb") == 1
    metrics = dcgm.parse(dcgm.render(node))
    used = [(labels.get("pod"), v) for name, labels, v in metrics if name == "DCGM_FI_DEV_FB_USED" and "GPU_I_ID" in labels]
    assert ("ok", 8192.0) in used


def run_inference_pod(node, plugin) -> None:
    """Pod "infer" on one whole GPU, its program using 16 GiB and 75 % of it."""
    plugin()
    eventually(lambda: node.manager.resource_counts() == {"nvidia.com/gpu": (2, 2)})
    p = pod("infer", memory="16Gi")
    p["metadata"]["annotations"]["gpulab.io/gpu-utilization"] = "75"
    node.admit(p)
    node.observe(p, p["spec"]["containers"][0], running=True)


def test_dcgm_metrics_name_the_pod_of_an_exclusive_gpu(node, plugin) -> None:
    run_inference_pod(node, plugin)
    samples = dcgm.parse(dcgm.render(node))
    util = {labels["gpu"]: (v, labels.get("pod")) for name, labels, v in samples if name == "DCGM_FI_DEV_GPU_UTIL"}
    assert sorted(util.values()) == [(0.0, None), (75.0, "infer")]


@pytest.mark.parametrize("image,runtime", [
    (CUDA, "12.6"), ("nvcr.io/nvidia/cuda:11.8.0-runtime-ubi8", "11.8"),
    ("nvcr.io/nvidia/pytorch:24.05-py3", None), ("ubuntu:24.04", None),
])
def test_cuda_runtime_of_images(image: str, runtime: str | None) -> None:
    assert cuda_runtime_of(image) == runtime


def test_the_exporter_page_is_valid_prometheus_text(node, plugin) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    run_inference_pod(node, plugin)
    families = {f.name: f for f in text_string_to_metric_families(dcgm.render(node))}
    assert set(families) == {name for name, _, _ in dcgm.FIELDS}
    assert all(f.type == "gauge" for f in families.values())
    util = {s.labels["gpu"]: s for s in families["DCGM_FI_DEV_GPU_UTIL"].samples}
    assert util["0"].value + util["1"].value == 75
    busy = next(s for s in util.values() if s.value == 75)
    assert {k: busy.labels[k] for k in ("modelName", "Hostname", "namespace", "pod", "container")} == {
        "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "gpu-node-1", "namespace": "default", "pod": "infer",
        "container": "main"}
    assert busy.labels["UUID"].startswith("GPU-") and busy.labels["device"].startswith("nvidia")
    fb = {s.labels["gpu"]: s.value for s in families["DCGM_FI_DEV_FB_USED"].samples}
    assert fb[busy.labels["gpu"]] == 16 * 1024
    power = {s.labels["gpu"]: s.value for s in families["DCGM_FI_DEV_POWER_USAGE"].samples}
    temp = {s.labels["gpu"]: s.value for s in families["DCGM_FI_DEV_GPU_TEMP"].samples}
    idle = "1" if busy.labels["gpu"] == "0" else "0"
    # Power and temperature rise with load, within the model's limits.
    assert power[idle] < power[busy.labels["gpu"]] <= node.model.power.limit_w
    assert temp[idle] < temp[busy.labels["gpu"]]


def _ready(p: dict, ready: bool = True) -> dict:
    p["status"] = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    return p


def test_a_holder_that_declares_nothing_computes_when_its_program_reports_and_stops_when_it_stops(node, plugin) -> None:
    plugin()
    eventually(lambda: node.manager.resource_counts() == {"nvidia.com/gpu": (2, 2)})
    plain = _ready(pod("plain"))  # declares no CUDA program: holds its GPU, computes nothing
    node.admit(plain)
    report = Path(node.prepare(plain, plain["spec"]["containers"][0]).env["GPULAB_GPU_ACTIVITY"])
    node.observe(plain, plain["spec"]["containers"][0], running=True)
    pods = {plain["metadata"]["uid"]: plain}

    def util() -> dict:
        return {s[1].get("pod"): s[2] for s in dcgm.parse(dcgm.render(node)) if s[0] == "DCGM_FI_DEV_GPU_UTIL"
                and s[1].get("pod")}

    assert node.apply_load(pods) is False and util() == {"plain": 0}  # reports nothing: it holds, no load
    assert [proc for g in node.state()["gpus"] for proc in g["processes"]] == []
    report.write_text("70\n")                              # requests reached it (gpulab/fakegpu/llmserver.py)
    assert node.apply_load(pods) is True and util() == {"plain": 70}
    assert [proc["name"] for g in node.state()["gpus"] for proc in g["processes"]] == ["python3"]
    assert node.apply_load(pods) is False                   # nothing changed, nothing rewritten
    report.write_text("0\n")                               # the traffic stopped
    assert node.apply_load(pods) is True and util() == {"plain": 0}


def test_a_programs_reported_activity_is_its_utilisation_and_an_annotation_still_wins(node, plugin) -> None:
    plugin()
    eventually(lambda: node.manager.resource_counts() == {"nvidia.com/gpu": (2, 2)})
    server, fixed = pod("server"), pod("fixed")
    fixed["metadata"]["annotations"]["gpulab.io/gpu-utilization"] = "10"
    pods, reports = {}, {}
    for p in (server, fixed):
        node.admit(p)
        grant = node.prepare(p, p["spec"]["containers"][0])
        report = Path(grant.env["GPULAB_GPU_ACTIVITY"])
        assert any(m.host_path == str(report.parent) and not m.read_only for m in grant.mounts)
        reports[p["metadata"]["name"]] = report
        report.write_text("55\n")  # what the program writes (gpulab/fakegpu/llmserver.py)
        node.observe(p, p["spec"]["containers"][0], running=True)
        pods[p["metadata"]["uid"]] = _ready(p, ready=False)  # measured, so readiness does not matter
    assert node.apply_load(pods) is True
    util = {s[1].get("pod"): s[2] for s in dcgm.parse(dcgm.render(node)) if s[0] == "DCGM_FI_DEV_GPU_UTIL"}
    assert util == {"server": 55, "fixed": 10}
    node.release(server)
    assert not reports["server"].parent.exists() and reports["fixed"].exists()


def test_a_deep_node_directory_gets_short_socket_paths(tmp_path, monkeypatch):
    import shutil
    import tempfile

    from gpulab.fakegpu.node import socket_dir

    run = tempfile.mkdtemp(dir="/tmp")  # as short as /run/user/1000
    monkeypatch.setenv("XDG_RUNTIME_DIR", run)
    # Not pytest's tmp_path: its length grows with the run counter (pytest-of-root/pytest-123/...).
    base = Path(tempfile.mkdtemp(prefix="sd-", dir="/tmp"))
    shallow = base / "n" / "dp"
    assert socket_dir(shallow) == shallow
    cluster = base / ("x" * 60) / "cluster"
    deep = cluster / "nodes" / "gpu-node-1" / "host" / "var" / "lib" / "kubelet" / "device-plugins"
    deep.mkdir(parents=True)
    (deep / "kubelet_internal_checkpoint").write_text("{}")
    short = socket_dir(deep)
    assert len(str(short / "nvidia-mig-7g.141gb.sock")) < 108
    assert deep.is_symlink() and deep.resolve() == short
    assert (deep / "kubelet_internal_checkpoint").read_text() == "{}"  # kept, now behind the link
    assert socket_dir(deep) == short  # the next start finds the same directory
    import os
    assert oct(os.stat(short.parent).st_mode & 0o777) == "0o711"  # pods (nobody) pass through, not list
    from gpulab.fakegpu.node import remove_socket_dirs

    remove_socket_dirs(cluster)  # gpulab down --purge
    assert not short.exists()
    shutil.rmtree(run)
    shutil.rmtree(base)


def test_a_nodes_heartbeat_wakes_only_its_own_programs_and_a_label_change_the_cluster_wide_ones():
    """A fleet's programs are not all woken by each node's status update (KWOK's heartbeats): O(nodes), not
    O(nodes²). Labels, annotations and spec concern the cluster-wide programs too (the operator)."""
    import threading

    from gpulab.fakegpu.stack import GpuStack

    stack = GpuStack.__new__(GpuStack)  # only the subscriptions: no cluster, no hardware
    stack._subs, stack._subs_lock = {}, threading.Lock()
    a, b, operator = stack.subscribe("node-a"), stack.subscribe("node-b"), stack.subscribe()

    def woken() -> set[str]:
        names = {name for name, sub in (("a", a), ("b", b), ("operator", operator)) if sub.event.is_set()}
        for sub in (a, b, operator):
            sub.event.clear()
        return names

    node = {"metadata": {"name": "node-a", "labels": {"x": "1"}}, "spec": {}, "status": {"conditions": []}}
    beat = {**node, "status": {"conditions": [{"type": "Ready", "lastHeartbeatTime": "now"}]}}
    stack._node_changed(node, beat)
    assert woken() == {"a"}
    relabelled = {**beat, "metadata": {"name": "node-a", "labels": {"x": "2"}}}
    stack._node_changed(beat, relabelled)
    assert woken() == {"a", "operator"}
    stack._node_changed(relabelled, relabelled)  # listed again, unchanged
    assert woken() == {"a"}
    stack._node_changed(relabelled, None)  # deleted
    assert woken() == {"a", "operator"}
    stack._node_changed(None, node)  # added
    assert woken() == {"a", "operator"}
    stack.notify()  # everything
    assert woken() == {"a", "b", "operator"}
    stack.notify_cluster()  # a ClusterPolicy changed: the operator's business alone
    assert woken() == {"operator"}
    stack.notify("node-b")  # its hardware or faults changed
    assert woken() == {"b", "operator"}


def test_a_watched_pod_wakes_its_watcher_alone_until_unwatched():
    """A program waiting for one pod (the validator's CUDA workload) is woken by that pod's changes, not by the
    fleet's other pods."""
    import threading

    from gpulab.fakegpu.stack import GpuStack

    stack = GpuStack.__new__(GpuStack)
    stack._subs, stack._subs_lock, stack._pod_watchers = {}, threading.Lock(), {}
    waiting, other = stack.subscribe("node-a"), stack.subscribe("node-a")
    stack.watch_pod(waiting, "gpu-operator/nvidia-cuda-validator-x")
    stack._pod_changed({"metadata": {"namespace": "gpu-operator", "name": "some-other-pod"}})
    assert not waiting.event.is_set()
    stack._pod_changed({"metadata": {"namespace": "gpu-operator", "name": "nvidia-cuda-validator-x"}})
    assert waiting.event.is_set() and not other.event.is_set()
    waiting.event.clear()
    stack.unwatch_pod(waiting, "gpu-operator/nvidia-cuda-validator-x")
    stack._pod_changed({"metadata": {"namespace": "gpu-operator", "name": "nvidia-cuda-validator-x"}})
    assert not waiting.event.is_set() and stack._pod_watchers == {}


class FlakyRecorder(Recorder):
    """Fails the first write of the nodes named, and notes the nodes being written at once."""

    def __init__(self, fail_first: set[str], slow: float = 0.0) -> None:
        super().__init__()
        self.fail_first, self.slow = set(fail_first), slow
        self.writing: set[str] = set()
        self.overlapped: list[str] = []

    def patch(self, kind, name, body, namespace=None, subresource=None, strategy="merge"):
        from gpulab.kube import api
        with self.lock:
            if name in self.writing:
                self.overlapped.append(name)
            self.writing.add(name)
        try:
            if self.slow:
                threading.Event().wait(self.slow)
            with self.lock:
                if name in self.fail_first:
                    self.fail_first.discard(name)
                    raise api.ApiError(500, "etcdserver: request timed out", None)
            return super().patch(kind, name, body, namespace, subresource, strategy)
        finally:
            with self.lock:
                self.writing.discard(name)


def test_one_status_writer_serves_many_nodes_latest_value_wins_and_retries() -> None:
    client = FlakyRecorder(fail_first={"node-3"}, slow=0.01)
    writer = NodeStatusWriter(client, workers=3, retry_s=0.05)
    writer.start()
    try:
        for round_ in range(1, 4):
            for i in range(20):
                writer.submit(f"node-{i}", {"nvidia.com/gpu": (8, 8 - round_)})

        def last(node):
            with client.lock:
                bodies = [b for _, n, b, _ in client.patches if n == node]
            return bodies[-1]["status"]["allocatable"]["nvidia.com/gpu"] if bodies else None

        eventually(lambda: all(last(f"node-{i}") == "5" for i in range(20)), timeout=10)
        assert client.overlapped == []                        # one write of a node at a time
        assert sum(1 for t in threading.enumerate() if t.name.startswith("gpu-status-")) == 3
        assert last("node-3") == "5"                           # its first write failed; it was written again
    finally:
        writer.stop()
    assert not any(t.name.startswith("gpu-status-") and t.is_alive() for t in threading.enumerate())
