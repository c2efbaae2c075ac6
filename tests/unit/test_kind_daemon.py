"""The image's entry point, ``python -m gpulab.fakegpu.daemon``, as real processes.

The device plugin registers with a test kubelet (the Registration server of
:class:`~gpulab.fakegpu.deviceplugin.kubelet.DeviceManager`, the same gRPC API a
real kubelet serves on kind), which then allocates devices from it; a device-plugin
config and a MIG geometry written as config-manager and mig-manager write them
change what it serves. The DCGM exporter serves its metrics over HTTP.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from deviceplugin_support import eventually, make_manager, nvidia_smi, plugin_config, sock_dir  # noqa: F401

from gpulab.kube import api
from gpulab.fakegpu import daemon, dcgm, nvidiasmi

REPO = Path(__file__).resolve().parents[2]
GPU = "nvidia.com/gpu"
TIME_SLICING = """version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


@pytest.fixture
def start_daemon(sock_dir) -> Iterator[Callable[..., subprocess.Popen]]:
    procs: list[subprocess.Popen] = []

    def start(*args: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", "gpulab.fakegpu.daemon", *args,
                                 "--node", "gpu-node-1", "--gpu-model", "h100-80gb", "--gpu-count", "2",
                                 "--host-dir", str(sock_dir / "host"), "--poll-interval", "0.05"],
                                cwd=REPO, stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def test_device_plugin_registers_with_the_kubelet_and_serves_allocations(
        make_manager, start_daemon, plugin_config, sock_dir) -> None:
    manager = make_manager()
    config = sock_dir / "config.yaml"
    proc = start_daemon("device-plugin", "--plugin-dir", str(plugin_config.plugin_dir), "--config-file", str(config),
                        "--mig-strategy", "single")  # as the DaemonSet's MIG_STRATEGY
    eventually(lambda: manager.resource_counts() == {GPU: (2, 2)}, timeout=20)

    alloc = manager.allocate("pod-uid-1", "train", GPU, 1)
    host = sock_dir / "host"
    mounts = {m.container_path: m.host_path for m in alloc.mounts}
    assert mounts["/usr/bin/nvidia-smi"] == str(host / "bin" / "nvidia-smi")
    state_file = alloc.envs[nvidiasmi.STATE_ENV]
    assert state_file.startswith(str(host / "nvidia-smi" / ""))  # on the node's hostPath, mountable by the kubelet
    assert alloc.envs["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-")
    assert not alloc.devices  # kind nodes have no /dev/nvidia* device nodes to pass

    # The nvidia-smi the kubelet mounts prints the allocated GPU (its image needs python3).
    smi = subprocess.run([str(host / "bin" / "nvidia-smi"), "-L"], capture_output=True, text=True,
                         env={nvidiasmi.STATE_ENV: state_file, "NVIDIA_VISIBLE_DEVICES": alloc.envs["NVIDIA_VISIBLE_DEVICES"],
                              "PATH": "/usr/bin:/bin"})
    assert smi.returncode == 0, smi.stderr
    assert smi.stdout.count("NVIDIA H100 80GB HBM3") == 1

    # config-manager writes a time-slicing config: 4 replicas of each GPU.
    config.write_text(TIME_SLICING)
    eventually(lambda: manager.resource_counts().get(GPU) == (8, 8), timeout=20)

    # mig-manager applies all-1g.10gb (MIG strategy single: MIG devices as nvidia.com/gpu).
    config.unlink()
    hardware = daemon.Hardware("gpu-node-1", "h100-80gb", 2, host)
    hardware.apply_mig(hardware.model.layout("all-1g.10gb"))
    eventually(lambda: manager.resource_counts().get(GPU) == (14, 14), timeout=20)

    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 0, stderr
    assert "Registered device plugin for 'nvidia.com/gpu' with Kubelet" in stderr
    eventually(lambda: manager.resource_counts().get(GPU, (0, 1))[1] == 0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dcgm_exporter_serves_the_nodes_gpus(start_daemon) -> None:
    port = _free_port()
    proc = start_daemon("dcgm-exporter", "--listen", f"127.0.0.1:{port}")

    def metrics() -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                return r.read().decode()
        except OSError:
            return None

    text = eventually(metrics, timeout=20)
    util = [(labels, v) for name, labels, v in dcgm.parse(text) if name == "DCGM_FI_DEV_GPU_UTIL"]
    assert len(util) == 2
    assert {labels["Hostname"] for labels, _ in util} == {"gpu-node-1"}
    assert {labels["modelName"] for labels, _ in util} == {"NVIDIA H100 80GB HBM3"}
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=10)
    assert proc.returncode == 0


def test_node_without_fake_gpu_labels_is_a_clear_error(sock_dir) -> None:
    args = daemon.parser().parse_args(["gfd", "--node", "cpu-node-1", "--host-dir", str(sock_dir)])

    class NoLabels:
        def get(self, kind: str, name: str) -> dict:
            return {"metadata": {"name": name, "labels": {"gpulab.io/pool": "cpu"}}}

    with pytest.raises(daemon.DaemonError, match="node cpu-node-1 has no gpulab.io/fake-gpu.model/"
                                                 "gpulab.io/fake-gpu.count labels"):
        daemon.Hardware.of_node(args, NoLabels())  # type: ignore[arg-type]


def test_in_cluster_kubeconfig_from_the_service_account(tmp_path) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("t0ken")
    from gpulab.kube import pki

    pki.ensure(tmp_path / "pki")
    (sa / "ca.crt").write_bytes((tmp_path / "pki" / "ca.crt").read_bytes())
    path = daemon.in_cluster_kubeconfig(sa, {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"})
    try:
        doc = json.loads(path.read_text())
        assert doc["clusters"][0]["cluster"]["server"] == "https://10.96.0.1:443"
        client = api.Client(path)
        assert client._api.configuration.host == "https://10.96.0.1:443"
        assert client._auth({}) == {"Authorization": "Bearer t0ken"}  # sent with every request
    finally:
        path.unlink()


def test_outside_a_pod_without_kubeconfig_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(daemon.DaemonError, match="not in a pod .* and no --kubeconfig given"):
        daemon.in_cluster_kubeconfig(tmp_path, {})
