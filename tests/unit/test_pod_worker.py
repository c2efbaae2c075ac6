"""The node agent's pod worker: the order in which it tells the API server and the device side."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from gpulab.runtime import pod as pod_module
from gpulab.runtime.devices import AdmissionError
from gpulab.runtime.pod import PodWorker


def _worker(calls: list[str], tmp_path: Path, status: dict | None = None, pushed: list[dict] | None = None,
            admit=lambda pod: None) -> PodWorker:
    """A worker for one pod, whose API pushes and device releases are appended to ``calls`` (and each pushed
    status to ``pushed``)."""
    def patch(kind, name, body, ns, subresource=None):
        calls.append(f"push {body['status'].get('phase')}")
        if pushed is not None:
            pushed.append(body["status"])

    agent = SimpleNamespace(client=SimpleNamespace(patch=patch),
                            devices=SimpleNamespace(release=lambda pod: calls.append("release devices"), admit=admit),
                            pods_dir=tmp_path, images=None)
    pod = {"metadata": {"namespace": "ns", "name": "train", "uid": "u-1"},
           "spec": {"nodeName": "gpu-node-1", "containers": [{"name": "main", "image": "x"}]}}
    if status is not None:
        pod["status"] = status
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


def test_a_pod_refused_at_admission_is_reported_as_the_kubelets_reject_pod(tmp_path, monkeypatch):
    """Failed with the handler's reason, "Pod was rejected: ..." and no container statuses (none was created),
    so that kubectl shows the reason as the pod's STATUS; the event carries the handler's own message."""
    events: list[tuple[str, str, str]] = []
    monkeypatch.setattr(pod_module.events, "record",
                        lambda client, obj, reason, message, type_, **kw: events.append((type_, reason, message)))
    message = "Node didn't have enough resource: nvidia.com/gpu, requested: 3, used: 0, capacity: 2"

    def refuse(pod):
        raise AdmissionError("OutOfnvidia.com/gpu", message)

    pushed: list[dict] = []
    scheduled = {"phase": "Pending", "qosClass": "BestEffort", "conditions": [{"type": "PodScheduled", "status": "True"}]}
    _worker([], tmp_path, scheduled, pushed, admit=refuse).sync()
    status = pushed[-1]
    assert status["phase"] == "Failed" and status["reason"] == "OutOfnvidia.com/gpu"
    assert status["message"] == "Pod was rejected: " + message
    assert status["containerStatuses"] is None and status["hostIP"] is None  # a merge patch: nothing there
    assert status["conditions"] == [{"type": "PodScheduled", "status": "True"}] and status["qosClass"] == "BestEffort"
    assert events == [("Warning", "OutOfnvidia.com/gpu", message)]
    # a node agent that restarts finds it finished and has nothing new to report
    reported = {k: v for k, v in status.items() if v is not None}
    after = _worker([], tmp_path, reported)
    assert after.rejected and after.status() == reported
