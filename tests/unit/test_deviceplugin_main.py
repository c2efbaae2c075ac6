"""``python -m gpulab.fakegpu.deviceplugin`` as a separate process."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from deviceplugin_support import (  # noqa: F401  (fixtures)
    CountsRecorder,
    eventually,
    gpus,
    inventory,
    make_manager,
    nvidia_smi,
    plugin_config,
    sock_dir,
)

GPU = "nvidia.com/gpu"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def start_plugin(plugin_config, sock_dir) -> Iterator[Callable[[], subprocess.Popen]]:
    procs: list[subprocess.Popen] = []
    inventory_path = sock_dir / "inventory.json"
    inventory_path.write_text(json.dumps(inventory(gpus(2))))

    def start() -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpulab.fakegpu.deviceplugin",
             "--inventory", str(inventory_path),
             "--plugin-dir", str(plugin_config.plugin_dir),
             "--nvidia-smi", str(plugin_config.nvidia_smi),
             "--state-dir", str(plugin_config.state_dir),
             "--poll-interval", "0.05"],
            cwd=REPO, stderr=subprocess.PIPE, text=True,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def test_entry_point_registers_and_exits_cleanly_on_sigterm(make_manager, start_plugin, plugin_config) -> None:
    manager = make_manager()
    proc = start_plugin()
    eventually(lambda: manager.resource_counts() == {GPU: (2, 2)}, timeout=15)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 0, stderr
    sock = plugin_config.plugin_dir / "nvidia-gpu.sock"
    assert f"Starting to serve 'nvidia.com/gpu' on {sock}" in stderr
    assert "Registered device plugin for 'nvidia.com/gpu' with Kubelet" in stderr
    assert not sock.exists()
    eventually(lambda: manager.resource_counts() == {GPU: (2, 0)})


def test_killed_plugin_takes_allocatable_to_zero(make_manager, start_plugin) -> None:
    recorder = CountsRecorder()
    manager = make_manager(on_change=recorder)
    proc = start_plugin()
    eventually(lambda: manager.resource_counts() == {GPU: (2, 2)}, timeout=15)
    proc.kill()
    proc.wait(timeout=10)
    eventually(lambda: recorder.last == {GPU: (2, 0)})


def test_sighup_restarts_and_reregisters(make_manager, start_plugin, caplog) -> None:
    caplog.set_level(logging.INFO, logger="gpulab.fakegpu.deviceplugin.kubelet")
    manager = make_manager()
    proc = start_plugin()
    eventually(lambda: manager.resource_counts() == {GPU: (2, 2)}, timeout=15)
    proc.send_signal(signal.SIGHUP)
    eventually(lambda: caplog.text.count("Registered endpoint") == 2)
    eventually(lambda: manager.resource_counts() == {GPU: (2, 2)})
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 0, stderr
    assert stderr.count("Registered device plugin for 'nvidia.com/gpu' with Kubelet") == 2
