"""The node agent's pod worker: the order in which it tells the API server and the device side."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from gpulab.runtime.pod import PodWorker


def _worker(calls: list[str], tmp_path: Path) -> PodWorker:
    agent = SimpleNamespace(
        client=SimpleNamespace(patch=lambda kind, name, body, ns, subresource=None:
                               calls.append(f"push {body['status'].get('phase')}")),
        devices=SimpleNamespace(release=lambda pod: calls.append("release devices")),
        pods_dir=tmp_path)
    pod = {"metadata": {"namespace": "ns", "name": "train", "uid": "u-1"},
           "spec": {"nodeName": "gpu-node-1", "containers": [{"name": "main", "image": "x"}]}}
    return PodWorker(agent, pod)


def test_a_finished_pods_devices_are_free_before_its_phase_is_pushed(tmp_path):
    """The scheduler binds the next pod as soon as it sees this one finished; its GPUs must be free by then."""
    calls: list[str] = []
    worker = _worker(calls, tmp_path)
    worker.status = lambda: {"phase": worker.terminal or "Running"}
    worker._push()
    assert calls == ["push Running"]
    worker.terminal = "Succeeded"
    worker._push()
    worker._push()
    assert calls == ["push Running", "release devices", "push Succeeded"]
