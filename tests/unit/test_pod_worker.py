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


def _settled(tmp_path: Path, **spec) -> PodWorker:
    """A worker whose pod is admitted, set up and running its one container (as ``spec`` says)."""
    worker = _worker([], tmp_path)
    worker.admitted, worker.volumes, worker.initialized = True, {}, True
    worker.pod["spec"].update(spec)
    (c,) = worker.main
    c.state, c.deadline = "running", None
    return worker


def test_a_settled_pod_is_looked_at_when_woken_or_when_something_is_due(tmp_path):
    """A fleet's GPU-stack pods cost nothing between events: a built-in program's or simulated container's pod
    waits SETTLED_WAIT, or less when a probe, a restart or a deadline is due; anything that may change any moment
    keeps the short wait."""
    now = 1000.0
    worker = _settled(tmp_path)
    c = worker.main[0]
    assert worker.next_wait(now) == pod_module.SETTLED_WAIT
    c.deadline = now + 12
    assert worker.next_wait(now) == 12
    c.prober = SimpleNamespace(states={"readinessProbe": SimpleNamespace(next_at=now + 3)})
    assert worker.next_wait(now) == 3
    c.prober = SimpleNamespace(states={"livenessProbe": SimpleNamespace(next_at=now - 1)})
    assert worker.next_wait(now) == pod_module.BUSY_WAIT  # overdue: never less than the short wait
    c.prober, c.deadline = None, None
    worker.pod["spec"]["activeDeadlineSeconds"] = 30
    worker.start_time = now - 25
    assert worker.next_wait(now) == 5
    del worker.pod["spec"]["activeDeadlineSeconds"]
    c.state, c.next_start = "terminated", now + 40  # in back-off
    assert worker.next_wait(now) == pod_module.SETTLED_WAIT
    c.next_start = now + 7
    assert worker.next_wait(now) == 7

    for busy in (dict(shim=object()), dict(state="waiting", next_start=now), dict(state="waiting", pull=object())):
        worker = _settled(tmp_path)
        for key, value in busy.items():
            setattr(worker.main[0], key, value)
        assert worker.next_wait(now) == pod_module.BUSY_WAIT, busy
    worker = _settled(tmp_path)
    worker.device_grants = {"main": object()}  # a neighbour's kill wakes it (DeviceHooks.wake_with): no polling
    assert worker.next_wait(now) == pod_module.SETTLED_WAIT
    worker = _settled(tmp_path)
    worker.admitted = False
    assert worker.next_wait(now) == pod_module.BUSY_WAIT
    worker.terminal = "Succeeded"
    assert worker.next_wait(now) == pod_module.SETTLED_WAIT


def test_a_built_in_program_that_ends_by_itself_wakes_its_pod_worker():
    import threading

    from gpulab.runtime import programs

    woken = threading.Event()
    ctx = programs.ProgramContext(None, "n", {}, {"name": "c"}, {}, {}, log=lambda s, t: None, exited=woken.set)
    program = programs.FunctionProgram(ctx, lambda stop, c: 3)
    program.start()
    assert woken.wait(5) and program.poll() == 3  # the exit code is there when the worker looks
    stopped = threading.Event()
    ctx = programs.ProgramContext(None, "n", {}, {"name": "c"}, {}, {}, log=lambda s, t: None, exited=stopped.set)
    program = programs.FunctionProgram(ctx, lambda stop, c: stop.wait(5))
    program.start()
    program.stop(grace=1)
    assert not stopped.is_set()  # stopped by the worker: it knows already
