"""Shared fixtures and builders for the device-plugin tests.

Everything runs over real gRPC on unix sockets in a short directory under
/tmp (socket paths must stay below 108 bytes). Factories stop whatever they
started, even when a test fails.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from gpulab.fakegpu.deviceplugin import api_pb2, api_pb2_grpc
from gpulab.fakegpu.deviceplugin.kubelet import DeviceManager
from gpulab.fakegpu.deviceplugin.plugin import DevicePlugin, PluginConfig

TIMEOUT_S = 5.0


def eventually(check: Callable[[], object], timeout: float = TIMEOUT_S, interval: float = 0.02):
    """Poll ``check`` until it returns a truthy value; return it or fail."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value {value!r})")
        time.sleep(interval)


def gpu_uuid(i: int) -> str:
    return f"GPU-{i:08d}-aaaa-bbbb-cccc-{i:012d}"


def gpus(n: int = 2, numa: list[int] | None = None) -> dict:
    devices = []
    for i in range(n):
        device = {"id": gpu_uuid(i), "minor": i, "info": {"index": i, "uuid": gpu_uuid(i), "name": "NVIDIA H200"}}
        if numa is not None:
            device["numa"] = numa[i]
        devices.append(device)
    return {"name": "nvidia.com/gpu", "devices": devices}


def replicas(n_gpus: int = 2, n: int = 4, **extra) -> dict:
    devices = [
        {"id": f"{gpu_uuid(g)}::{r}", "minor": g, "info": {"index": g, "uuid": gpu_uuid(g)}}
        for g in range(n_gpus)
        for r in range(n)
    ]
    return {"name": "nvidia.com/gpu", "devices": devices, **extra}


def mig_uuid(g: int, i: int) -> str:
    return f"MIG-{g:04d}{i:04d}-1111-2222-3333-444455556666"


def migs(profile: str = "1g.18gb", n: int = 7, gpu: int = 0) -> dict:
    devices = [
        {"id": mig_uuid(gpu, i), "parent": gpu_uuid(gpu), "minor": gpu,
         "info": {"uuid": mig_uuid(gpu, i), "profile": profile, "parent": gpu_uuid(gpu)}}
        for i in range(n)
    ]
    return {"name": f"nvidia.com/mig-{profile}", "devices": devices}


def inventory(*resources: dict) -> dict:
    return {"resources": list(resources)}


class CountsRecorder:
    """An ``on_change`` callback that remembers every call."""

    def __init__(self) -> None:
        self.calls: list[dict[str, tuple[int, int]]] = []
        self._lock = threading.Lock()

    def __call__(self, counts: dict[str, tuple[int, int]]) -> None:
        with self._lock:
            self.calls.append(counts)

    @property
    def last(self) -> dict[str, tuple[int, int]]:
        with self._lock:
            return self.calls[-1] if self.calls else {}


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def nvidia_smi(sock_dir: Path) -> Path:
    path = sock_dir / "bin" / "nvidia-smi"
    path.parent.mkdir()
    path.write_text("#!/bin/sh\n")
    return path


@pytest.fixture
def plugin_config(sock_dir: Path, nvidia_smi: Path) -> PluginConfig:
    return PluginConfig(
        plugin_dir=sock_dir / "dp",
        nvidia_smi=nvidia_smi,
        state_dir=sock_dir / "state",
        dev_root=sock_dir / "dev",
        poll_interval=0.05,
    )


@pytest.fixture
def make_manager(plugin_config: PluginConfig) -> Iterator[Callable[..., DeviceManager]]:
    started: list[DeviceManager] = []

    def make(**kwargs) -> DeviceManager:
        manager = DeviceManager(plugin_config.plugin_dir, **kwargs)
        started.append(manager)
        manager.start()
        return manager

    yield make
    for manager in reversed(started):
        manager.stop()


@pytest.fixture
def make_plugin(plugin_config: PluginConfig) -> Iterator[Callable[..., DevicePlugin]]:
    started: list[DevicePlugin] = []

    def make(inventory=None, inventory_path=None, config: PluginConfig | None = None) -> DevicePlugin:
        plugin = DevicePlugin(config or plugin_config, inventory=inventory, inventory_path=inventory_path)
        started.append(plugin)
        plugin.start()
        return plugin

    yield make
    for plugin in reversed(started):
        plugin.stop()


@pytest.fixture
def plugin_stub(plugin_config: PluginConfig) -> Iterator[Callable[[str], api_pb2_grpc.DevicePluginStub]]:
    """Direct DevicePlugin clients, by socket file name."""
    channels: list[grpc.Channel] = []

    def stub(socket: str = "nvidia-gpu.sock") -> api_pb2_grpc.DevicePluginStub:
        channel = grpc.insecure_channel(f"unix:{plugin_config.plugin_dir / socket}")
        channels.append(channel)
        return api_pb2_grpc.DevicePluginStub(channel)

    yield stub
    for channel in channels:
        channel.close()


def allocate_request(*ids: str) -> api_pb2.AllocateRequest:
    request = api_pb2.AllocateRequest()
    request.container_requests.add(devices_ids=list(ids))
    return request
