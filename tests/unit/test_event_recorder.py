"""The event correlator's keys and caches (client-go's events_cache.go); writing is tested on a real apiserver
in tests/cluster/test_events.py."""

from __future__ import annotations

import threading

from gpulab.kube import events

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "team-a", "uid": "u-1"}}
NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-1", "uid": "n-1"}}


class Clock:
    def __init__(self, t: float = 1_800_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def make(reason="BackOff", message="Back-off restarting failed container", obj=POD, type_="Warning",
         component="kubelet", host="gpu-node-1", now=1_800_000_000.0):
    return events.make_event(obj, reason, message, type_, component, host, now)


def test_the_event_shape_is_kept():
    ev = make()
    assert ev["metadata"]["namespace"] == "team-a" and ev["metadata"]["name"].startswith("web.")
    assert ev["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": "web", "namespace": "team-a",
                                    "uid": "u-1"}
    assert ev["count"] == 1 and ev["firstTimestamp"] == ev["lastTimestamp"] == "2027-01-15T08:00:00Z"
    assert ev["source"] == {"component": "kubelet", "host": "gpu-node-1"}
    assert ev["reportingComponent"] == "kubelet" and ev["reportingInstance"] == "gpu-node-1"
    assert make(obj=NODE)["metadata"]["namespace"] == "default"  # cluster-scoped objects: "default"
    assert make()["metadata"]["name"] != make()["metadata"]["name"]  # unique even at the same instant


def test_the_key_is_client_gos():
    assert events.event_key(make()) == events.event_key(make(now=1_800_000_100.0))  # time is no part of it
    for other in (make(message="other"), make(reason="Failed"), make(type_="Normal"), make(component="x"),
                  make(host="cpu-node-1"), make(obj={**POD, "metadata": {**POD["metadata"], "uid": "u-2"}})):
        assert events.event_key(other) != events.event_key(make())
    # The spam key is the source and the object only.
    assert events.spam_key(make(reason="Failed", message="x")) == events.spam_key(make())
    assert events.spam_key(make(host="cpu-node-1")) != events.spam_key(make())


def test_the_same_event_is_counted_on_one_object():
    clock = Clock()
    c = events.EventCorrelator(clock)
    first = c.correlate(make(now=clock.t))
    assert first.patch is None and not first.skip and first.event["count"] == 1
    c.update_state(first.key, {**first.event, "metadata": {**first.event["metadata"], "resourceVersion": "7"}})
    for n in range(2, 6):
        clock.t += 10
        again = c.correlate(make(now=clock.t))
        assert again.event["metadata"]["name"] == first.event["metadata"]["name"]
        assert again.event["count"] == n and again.event["firstTimestamp"] == first.event["firstTimestamp"]
        assert again.patch == {"count": n, "lastTimestamp": events.rfc3339(clock.t), "message": first.event["message"]}
    other = c.correlate(make(message="something else", now=clock.t))
    assert other.patch is None and other.event["count"] == 1


def test_a_failed_first_write_is_patched_then_created():
    c = events.EventCorrelator(Clock())
    first = c.correlate(make())
    again = c.correlate(make())  # the first was never written: the cache still has its name
    assert again.event["metadata"]["name"] == first.event["metadata"]["name"] and again.event["count"] == 2


def test_ten_messages_for_one_reason_are_combined():
    clock = Clock()
    c = events.EventCorrelator(clock)
    keys = [c.correlate(make(message=f"probe failed: {i}")).key for i in range(9)]
    assert len(set(keys)) == 9
    tenth = c.correlate(make(message="probe failed: 9"))
    assert tenth.event["message"] == "(combined from similar events): probe failed: 9" and tenth.patch is None
    eleventh = c.correlate(make(message="probe failed: 10"))
    assert eleventh.key == tenth.key and eleventh.event["count"] == 2
    assert eleventh.event["message"] == "(combined from similar events): probe failed: 10"
    assert eleventh.patch and eleventh.patch["message"] == eleventh.event["message"]
    # Another reason is another group; after the interval the group starts afresh.
    assert "combined" not in c.correlate(make(reason="Unhealthy", message="probe failed: 11")).event["message"]
    clock.t += events.AGGREGATE_INTERVAL_S + 1
    assert "combined" not in c.correlate(make(message="probe failed: 12")).event["message"]


def test_the_spam_filter_skips_writes_but_keeps_counting():
    clock = Clock()
    c = events.EventCorrelator(clock, burst=3, qps=0.1)
    results = [c.correlate(make()) for _ in range(5)]
    assert [r.skip for r in results] == [False, False, False, True, True]
    assert [r.event["count"] for r in results] == [1, 2, 3, 4, 5]
    assert c.correlate(make(obj=NODE)).skip is False  # another object has its own bucket
    clock.t += 10  # one token back
    back = c.correlate(make())
    assert not back.skip and back.event["count"] == 6 and back.patch and back.patch["count"] == 6


def test_the_caches_are_bounded():
    lru: events.LRU[int, int] = events.LRU(3)
    for i in range(5):
        lru.add(i, i)
    assert len(lru) == 3 and 0 not in lru and 4 in lru
    lru.get(2)
    lru.add(5, 5)
    assert 2 in lru and 3 not in lru


def test_the_token_bucket_refills():
    b = events.TokenBucket(2, 0.5, now=0.0)
    assert b.try_accept(0.0) and b.try_accept(0.0) and not b.try_accept(0.0)
    assert not b.try_accept(1.0) and b.try_accept(2.0)
    assert b.try_accept(100.0) and b.try_accept(100.0) and not b.try_accept(100.0)  # never more than the burst


def test_recording_never_raises():
    class Broken:
        def create(self, obj):
            raise RuntimeError("boom")

        def patch(self, *a, **kw):
            raise RuntimeError("boom")

    recorder = events.EventRecorder(events.EventCorrelator(Clock()))
    assert recorder.event(Broken(), POD, "Started", "Started container main") is None  # type: ignore[arg-type]
    assert recorder.event(Broken(), {"metadata": {}}, "Started", "x") is None  # type: ignore[arg-type]


def test_concurrent_occurrences_are_all_counted():
    c = events.EventCorrelator(Clock(), burst=1000)

    def emit():
        for _ in range(50):
            c.correlate(make())

    threads = [threading.Thread(target=emit) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert c.correlate(make()).event["count"] == 201


class Recording:
    """Takes every create, optionally holding each one until ``release`` is set."""

    def __init__(self, hold: threading.Event | None = None):
        self.created: list[dict] = []
        self.hold = hold

    def create(self, obj):
        if self.hold is not None:
            self.hold.wait(5)
        self.created.append(obj)
        return {**obj, "metadata": {**obj["metadata"], "resourceVersion": "1"}}

    def patch(self, *a, **kw):
        raise AssertionError("nothing is patched here")


def test_in_the_background_the_caller_does_not_wait_and_each_event_keeps_its_time():
    clock = Clock()
    release = threading.Event()
    client = Recording(release)
    recorder = events.EventRecorder(events.EventCorrelator(clock))
    recorder.send_in_background(threads=2)
    try:
        for reason in ("Pulled", "Created", "Started"):
            assert recorder.event(client, POD, reason, f"{reason} container main") is None  # queued
            clock.t += 1
        assert client.created == []  # the sender is still held by the apiserver
        release.set()
    finally:
        recorder.stop_sending(timeout=5)
    by_reason = {ev["reason"]: ev["firstTimestamp"] for ev in client.created}
    assert by_reason == {"Pulled": events.rfc3339(1_800_000_000.0), "Created": events.rfc3339(1_800_000_001.0),
                         "Started": events.rfc3339(1_800_000_002.0)}
    # Stopped: written before the call returns again.
    assert recorder.event(client, POD, "Killing", "Stopping container main")["reason"] == "Killing"


def test_a_full_queue_drops_new_occurrences(monkeypatch):
    monkeypatch.setattr(events, "QUEUE_SIZE", 2)
    release = threading.Event()
    client = Recording(release)
    recorder = events.EventRecorder(events.EventCorrelator(Clock()))
    recorder.send_in_background(threads=1)
    try:
        for n in range(6):
            recorder.event(client, POD, "Started", f"Started container c{n}")
        release.set()
    finally:
        recorder.stop_sending(timeout=5)
    # One taken by the sender (held), two queued, the rest dropped.
    assert 2 <= len(client.created) <= 3
