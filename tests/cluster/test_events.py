"""Events as client-go's recorder writes them, on the real apiserver: one Event object per repeated event, counted."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from gpu_support import (
    GPU_NODE,
    gpus_released,  # noqa: F401 (autouse fixture)
    node,
    node_events,
    policy,
    restore_policy,
    wait_gpus_free,
    wait_resources,
    wait_stack,
)
from gpulab.kube import events
from helpers import wait_for

pytestmark = pytest.mark.cluster

MIG_CONFIG = "nvidia.com/mig.config"
MIG_STATE = "nvidia.com/mig.config.state"


def pending_pod(kube, ns: str, name: str) -> dict[str, Any]:
    """A pod no node can take: it stays Pending, the object events are written about."""
    return kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
                        "spec": {"nodeSelector": {"gpulab.io/no-such-node": "true"},
                                 "containers": [{"name": "main", "image": "x", "command": ["sleep", "60"]}]}})


def pod_events(kube, ns: str, name: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in kube.list("Event", ns, field_selector=f"involvedObject.name={name}")
            if e.get("reason") == reason]


def test_the_same_event_is_one_object_with_a_count(kube, ns):
    pod = pending_pod(kube, ns, "counted")
    message = "Back-off restarting failed container main in pod counted"
    for i in range(5):
        events.record(kube, pod, "TestBackOff", message, "Warning", component="kubelet", host=GPU_NODE)
        if i == 0:
            time.sleep(1.1)  # timestamps are whole seconds: let lastTimestamp move on
    [event] = pod_events(kube, ns, "counted", "TestBackOff")
    assert event["count"] == 5 and event["message"] == message and event["type"] == "Warning"
    assert event["lastTimestamp"] > event["firstTimestamp"]  # RFC 3339 in UTC compares as text
    assert event["source"] == {"component": "kubelet", "host": GPU_NODE}
    assert event["reportingComponent"] == "kubelet" and event["reportingInstance"] == GPU_NODE
    assert event["involvedObject"]["uid"] == pod["metadata"]["uid"]

    # Another message is another Event.
    events.record(kube, pod, "TestBackOff", "Back-off restarting failed container sidecar in pod counted", "Warning",
               component="kubelet", host=GPU_NODE)
    got = {e["message"]: e["count"] for e in pod_events(kube, ns, "counted", "TestBackOff")}
    assert got == {message: 5, "Back-off restarting failed container sidecar in pod counted": 1}

    # An Event that is gone (expired or deleted) is created again, with the count so far.
    assert kube.delete("Event", event["metadata"]["name"], ns)
    events.record(kube, pod, "TestBackOff", message, "Warning", component="kubelet", host=GPU_NODE)
    [again] = [e for e in pod_events(kube, ns, "counted", "TestBackOff") if e["message"] == message]
    assert again["count"] == 6 and again["firstTimestamp"] == event["firstTimestamp"]

    # A restarted process starts with an empty cache: a new Event object, as a restarted kubelet writes.
    fresh = events.EventRecorder()
    fresh.event(kube, pod, "TestBackOff", message, "Warning", component="kubelet", host=GPU_NODE)
    assert sorted(e["count"] for e in pod_events(kube, ns, "counted", "TestBackOff") if e["message"] == message) \
        == [1, 6]


def test_concurrent_emitters_count_on_one_object(kube, ns):
    pod = pending_pod(kube, ns, "busy")

    def emit():
        for _ in range(5):
            events.record(kube, pod, "TestProbe", "Readiness probe failed", "Warning", component="kubelet", host=GPU_NODE)

    threads = [threading.Thread(target=emit) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    [event] = pod_events(kube, ns, "busy", "TestProbe")
    assert event["count"] == 20


def test_many_messages_for_one_reason_are_combined(kube, ns):
    pod = pending_pod(kube, ns, "chatty")
    for i in range(12):
        events.record(kube, pod, "TestUnhealthy", f"Liveness probe failed: attempt {i}", "Warning", component="kubelet",
                   host=GPU_NODE)
    got = pod_events(kube, ns, "chatty", "TestUnhealthy")
    plain = [e for e in got if not e["message"].startswith(events.AGGREGATE_PREFIX)]
    [combined] = [e for e in got if e["message"].startswith(events.AGGREGATE_PREFIX)]
    assert len(plain) == events.AGGREGATE_MAX_EVENTS - 1 and all(e["count"] == 1 for e in plain)
    assert combined["count"] == 3 and combined["message"].endswith("attempt 11")


def test_a_crash_looping_container_counts_its_restarts(kube, ns):
    kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "crashy", "namespace": ns},
                 "spec": {"terminationGracePeriodSeconds": 1,
                          "containers": [{"name": "main", "image": "x", "command": ["false"]}]}})
    # The kubelet side writes Pulled/Created/Started at every start: one object each, counting.
    started = wait_for(lambda: [e for e in pod_events(kube, ns, "crashy", "Started") if e["count"] >= 2], 60,
                       what="a Started Event with count 2")
    assert len(pod_events(kube, ns, "crashy", "Started")) == 1 and started[0]["source"]["component"] == "kubelet"
    assert len(pod_events(kube, ns, "crashy", "Created")) == 1
    kube.delete("Pod", "crashy", ns, grace_seconds=0)


# The kubelet's preStop hooks: run before SIGTERM, out of the grace period

_STOPS_ON_SIGTERM = ["python3", "-c", "import signal, sys, time\n"
                     "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
                     "while True: time.sleep(1)"]


def _hooked_pod(name: str, hook: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"terminationGracePeriodSeconds": 20,
                     "containers": [{"name": "main", "image": "python:3.11", "command": _STOPS_ON_SIGTERM,
                                     "lifecycle": {"preStop": hook}}]}}


def _delete_and_time(kube, ns: str, name: str) -> float:
    wait_for(lambda: (kube.get("Pod", name, ns) or {}).get("status", {}).get("phase") == "Running", 60,
             what=f"pod {name} Running")
    began = time.monotonic()
    kube.delete("Pod", name, ns)
    wait_for(lambda: kube.get("Pod", name, ns) is None, 60, what=f"pod {name} gone")
    return time.monotonic() - began


def test_a_pre_stop_sleep_holds_sigterm_back_within_the_grace_period(kube, ns):
    kube.create(dict(_hooked_pod("drained", {"sleep": {"seconds": 3}}), metadata={"name": "drained", "namespace": ns}))
    took = _delete_and_time(kube, ns, "drained")
    # The container stops at SIGTERM at once: what took time is the hook, well inside the 20 s of grace.
    assert 3 <= took < 15, took


def test_a_failing_exec_pre_stop_hook_is_an_event_and_the_container_still_stops(kube, ns):
    hook = {"exec": {"command": ["sh", "-c", "echo draining; exit 3"]}}
    kube.create(dict(_hooked_pod("badhook", hook), metadata={"name": "badhook", "namespace": ns}))
    assert _delete_and_time(kube, ns, "badhook") < 15
    failed = wait_for(lambda: pod_events(kube, ns, "badhook", "FailedPreStopHook"), 30, what="a FailedPreStopHook event")
    message = failed[0]["message"]
    assert message.startswith("Exec lifecycle hook ([sh -c echo draining; exit 3]) for Container \"main\" in Pod \"badhook_")
    assert "exited with 3" in message and 'message: "draining"' in message, message
    assert failed[0]["type"] == "Warning" and failed[0]["source"]["component"] == "kubelet"


# --------------------------------------------------------------------------
# A component's events: the MIG manager answering a broken nvidia.com/mig.config again and again


def relabel(kube, value: str, timeout: float = 90) -> str:
    """Set ``nvidia.com/mig.config`` (dropping the old state) and return the MIG manager's final answer."""
    current = node(kube)
    rv = current["metadata"]["resourceVersion"]
    kube.patch("Node", GPU_NODE, {"metadata": {"labels": {MIG_CONFIG: value, MIG_STATE: None}}})
    for ev in kube.watch("Node", rv, field_selector=f"metadata.name={GPU_NODE}", timeout_seconds=int(timeout)):
        labels = (ev.get("object", {}).get("metadata") or {}).get("labels") or {}
        if labels.get(MIG_CONFIG) == value and labels.get(MIG_STATE) in ("success", "failed"):
            return labels[MIG_STATE]
    pytest.fail(f"the MIG manager did not answer {MIG_CONFIG}={value} in {timeout:.0f} s")


@pytest.fixture
def mig_manager(kube, kubectl):
    original = policy(kube)["spec"]
    wait_gpus_free(kube)
    kubectl("patch", "clusterpolicies.nvidia.com/cluster-policy", "--type", "merge",
            "-p", '{"spec": {"migManager": {"enabled": true}, "mig": {"strategy": "mixed"}}}')
    wait_stack(kube)
    yield
    if (node(kube)["metadata"].get("labels") or {}).get(MIG_CONFIG) != "all-disabled":
        relabel(kube, "all-disabled")
    restore_policy(kube, original)
    wait_resources(kube, "nvidia.com/gpu", "2", "2")


def test_a_repeated_mig_config_failure_is_one_counted_event(kube, mig_manager):
    layout = "all-5g.55gb"  # no such MIG layout

    def failures() -> list[dict[str, Any]]:
        return [e for e in node_events(kube, "MigConfigFailed") if f"'{layout}'" in e["message"]]

    for attempt in range(1, 4):
        assert relabel(kube, layout) == "failed"
        wait_for(lambda n=attempt: any(e["count"] == n for e in failures()), 30,
                 what=f"the MigConfigFailed Event counting {attempt}")
        assert relabel(kube, "all-disabled") == "success"
    [event] = failures()
    assert event["count"] == 3 and event["type"] == "Warning"
    assert event["source"] == {"component": "nvidia-mig-manager", "host": GPU_NODE}
    assert event["involvedObject"]["kind"] == "Node" and event["lastTimestamp"] >= event["firstTimestamp"]
