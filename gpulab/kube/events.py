"""core/v1 Events as client-go's event recorder writes them: counted, aggregated, rate limited.

Every Event a gpulab component emits (the node agent's kubelet side, the
provisioner, the GPU Operator and its operands: MIG manager, device-plugin
config manager, ...) goes through :func:`record`,
which hands it to the one :class:`EventRecorder` of the process. Like
client-go's ``EventCorrelator`` (``tools/record/events_cache.go``) it

- **counts**: the same event again (same source component and host,
  involved object kind/namespace/name/uid/apiVersion, type, reason and
  message: client-go's ``getEventKey``) does not make a new Event object: the
  existing one is PATCHed with ``count`` + 1 and a new ``lastTimestamp``, as
  ``kubectl get events`` shows as COUNT / "(x7 over 3m)". If that Event is
  gone meanwhile (the apiserver drops Events after ``--event-ttl``, or
  someone deleted it), it is created again, with the count so far;
- **aggregates**: when one source writes more than
  :data:`AGGREGATE_MAX_EVENTS` different messages for the same object,
  type and reason within :data:`AGGREGATE_INTERVAL_S`, further ones are
  counted on a single Event whose message starts with
  ``(combined from similar events): `` (client-go's
  ``EventAggregatorByReasonFunc``);
- **rate limits** per source and object (client-go's
  ``EventSourceObjectSpamFilter``): a token bucket of :data:`SPAM_BURST`
  writes, refilled at :data:`SPAM_QPS`. An occurrence over the limit is
  still counted: the next write carries the count. client-go allows 25
  writes and then one per 5 minutes; gpulab allows more, so that nothing a
  lesson does is held back.

The state lives in memory, in LRU caches of :data:`CACHE_SIZE` entries, as
client-go's. After the process restarts (``gpulab up`` again, a new node
agent, a restarted kind DaemonSet pod) the cache is empty and the next
occurrence creates a new Event object with count 1, as a restarted kubelet
or controller does; the old one stays until it expires.

Events are best effort: recording never raises, and a write the apiserver
refuses (namespace terminating, apiserver unreachable) is dropped, as
client-go drops it after its retries.

A process that records many (the node agent: several per pod it starts)
hands them to sender threads (:meth:`EventRecorder.send_in_background`), as
client-go's broadcaster hands them to its sink's goroutine: the caller does
not wait for the apiserver, each occurrence keeps the time it happened, and
when :data:`QUEUE_SIZE` are waiting, new ones are dropped (client-go's
``maxQueuedEvents``). Elsewhere (the CLI, tests) an Event is written before
:func:`record` returns.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Generic, Hashable, TypeVar

from . import api

log = logging.getLogger("gpulab.events")

CACHE_SIZE = 4096
AGGREGATE_MAX_EVENTS = 10
AGGREGATE_INTERVAL_S = 600.0
AGGREGATE_PREFIX = "(combined from similar events): "
SPAM_BURST = 100
SPAM_QPS = 1.0 / 10.0
#: Occurrences waiting for a sender thread before new ones are dropped (client-go's maxQueuedEvents).
QUEUE_SIZE = 1000
_STRIPES = 64

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def rfc3339(t: float) -> str:
    """metav1.Time as it goes over the wire: RFC 3339, whole seconds, UTC."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


# --------------------------------------------------------------------------
# Keys (client-go: getEventKey, getSpamKey, EventAggregatorByReasonFunc)


def _source(ev: dict[str, Any]) -> tuple[str, str]:
    src = ev.get("source") or {}
    return src.get("component") or "", src.get("host") or ""


def _object(ev: dict[str, Any], field_path: bool = False) -> tuple[str, ...]:
    io = ev.get("involvedObject") or {}
    parts = [io.get("kind") or "", io.get("namespace") or "", io.get("name") or ""]
    if field_path:
        parts.append(io.get("fieldPath") or "")
    return (*parts, io.get("uid") or "", io.get("apiVersion") or "")


def event_key(ev: dict[str, Any]) -> tuple[str, ...]:
    """Which occurrences are the same Event: source, involved object, type, reason, message."""
    return (*_source(ev), *_object(ev, field_path=True), ev.get("type") or "", ev.get("reason") or "",
            ev.get("message") or "")


def spam_key(ev: dict[str, Any]) -> tuple[str, ...]:
    """What one token bucket limits: a source writing about one object."""
    return (*_source(ev), *_object(ev))


def aggregate_key(ev: dict[str, Any]) -> tuple[tuple[str, ...], str]:
    """(the group of similar events, what tells them apart): similar events differ only in their message."""
    group = (*_source(ev), *_object(ev), ev.get("type") or "", ev.get("reason") or "",
             ev.get("reportingComponent") or "", ev.get("reportingInstance") or "")
    return group, ev.get("message") or ""


# --------------------------------------------------------------------------
# Building blocks


class LRU(Generic[K, V]):
    """A bounded mapping that forgets the least recently used entry (groupcache's lru.Cache). Not locked."""

    def __init__(self, size: int = CACHE_SIZE):
        self.size = size
        self._d: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._d.get(key)
        if value is not None:
            self._d.move_to_end(key)
        return value

    def add(self, key: K, value: V) -> None:
        self._d[key] = value
        self._d.move_to_end(key)
        while len(self._d) > self.size:
            self._d.popitem(last=False)

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, key: object) -> bool:
        return key in self._d


class TokenBucket:
    """``burst`` tokens, refilled at ``qps`` per second (client-go's flowcontrol token bucket). Not locked."""

    def __init__(self, burst: int, qps: float, now: float):
        self.burst = burst
        self.qps = qps
        self.tokens = float(burst)
        self.last = now

    def try_accept(self, now: float) -> bool:
        self.tokens = min(float(self.burst), self.tokens + max(0.0, now - self.last) * self.qps)
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass
class _Aggregate:
    messages: set[str]
    last: float


@dataclass
class _Log:
    """What the cache knows of one Event object (client-go's eventLog)."""

    count: int
    first_timestamp: str
    name: str


@dataclass
class Correlated:
    """What to write for one occurrence.

    ``event`` is the whole Event to create; when ``patch`` is set, the Event
    named ``event["metadata"]["name"]`` exists (as far as the cache knows)
    and the patch brings it up to date. ``skip``: rate limited, write nothing.
    """

    event: dict[str, Any]
    key: Hashable
    patch: dict[str, Any] | None
    skip: bool = False


# --------------------------------------------------------------------------
# The correlator


class EventCorrelator:
    """Aggregation, counting and spam filtering of Events, before they are written (client-go's EventCorrelator).

    Thread-safe. ``clock`` returns seconds since the epoch (tests pass their own).
    """

    def __init__(self, clock: Callable[[], float] = time.time, cache_size: int = CACHE_SIZE,
                 burst: int = SPAM_BURST, qps: float = SPAM_QPS,
                 aggregate_max: int = AGGREGATE_MAX_EVENTS, aggregate_interval: float = AGGREGATE_INTERVAL_S):
        self.clock = clock
        self.burst, self.qps = burst, qps
        self.aggregate_max, self.aggregate_interval = aggregate_max, aggregate_interval
        self._lock = threading.Lock()
        self._aggregates: LRU[tuple[str, ...], _Aggregate] = LRU(cache_size)
        self._logs: LRU[Hashable, _Log] = LRU(cache_size)
        self._spam: LRU[tuple[str, ...], TokenBucket] = LRU(cache_size)

    def correlate(self, ev: dict[str, Any]) -> Correlated:
        """Aggregate, then count, then rate limit one new occurrence ``ev`` (a complete Event with count 1)."""
        now = self.clock()
        with self._lock:
            ev, key = self._aggregate(ev, now)
            ev, patch = self._observe(ev, key)
            skip = self._filtered(ev, now)
        return Correlated(ev, key, patch, skip)

    def _aggregate(self, ev: dict[str, Any], now: float) -> tuple[dict[str, Any], Hashable]:
        group, local = aggregate_key(ev)
        record = self._aggregates.get(group)
        if record is None or now - record.last > self.aggregate_interval:
            record = _Aggregate(set(), now)
        record.messages.add(local)
        record.last = now
        self._aggregates.add(group, record)
        if len(record.messages) < self.aggregate_max:
            return ev, event_key(ev)
        record.messages.pop()  # do not grow the set beyond the max
        combined = {**ev, "message": AGGREGATE_PREFIX + (ev.get("message") or "")}
        return combined, ("aggregate", group)

    def _observe(self, ev: dict[str, Any], key: Hashable) -> tuple[dict[str, Any], dict[str, Any] | None]:
        last = self._logs.get(key)
        patch = None
        if last is not None:
            ev = {**ev, "metadata": {**ev["metadata"], "name": last.name},
                  "firstTimestamp": last.first_timestamp, "count": last.count + 1}
            patch = {"count": ev["count"], "lastTimestamp": ev["lastTimestamp"], "message": ev.get("message")}
        self._logs.add(key, _Log(ev["count"], ev["firstTimestamp"], ev["metadata"]["name"]))
        return ev, patch

    def _filtered(self, ev: dict[str, Any], now: float) -> bool:
        key = spam_key(ev)
        bucket = self._spam.get(key)
        if bucket is None:
            bucket = TokenBucket(self.burst, self.qps, now)
        accepted = bucket.try_accept(now)
        self._spam.add(key, bucket)
        return not accepted

    def update_state(self, key: Hashable, written: dict[str, Any]) -> None:
        """Remember the Event as the apiserver returned it (its name, count and first timestamp)."""
        md = written.get("metadata") or {}
        if not md.get("name"):
            return
        with self._lock:
            last = self._logs.get(key)
            count = max(int(written.get("count") or 1), last.count if last else 0)
            self._logs.add(key, _Log(count, written.get("firstTimestamp") or (last.first_timestamp if last else ""),
                                     md["name"]))


# --------------------------------------------------------------------------
# The recorder


_names = threading.Lock()
_last_nanos = 0


def _unique_nanos(now: float) -> int:
    """Nanoseconds of ``now``, distinct within the process (two Events on one object in the same instant)."""
    global _last_nanos
    with _names:
        _last_nanos = max(int(now * 1e9), _last_nanos + 1)
        return _last_nanos


def make_event(involved: dict[str, Any], reason: str, message: str, type_: str, component: str,
               host: str | None, now: float) -> dict[str, Any]:
    """A new core/v1 Event about ``involved``, named as client-go names them (``<object>.<nanoseconds hex>``)."""
    md = involved["metadata"]
    stamp = rfc3339(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{md['name']}.{_unique_nanos(now):x}",
                     # Events about cluster-scoped objects (Nodes, PVs) live in "default".
                     "namespace": md.get("namespace") or "default"},
        "involvedObject": {
            "apiVersion": involved.get("apiVersion", "v1"), "kind": involved["kind"],
            "name": md["name"], "namespace": md.get("namespace"), "uid": md.get("uid"),
        },
        "reason": reason,
        "message": message,
        "type": type_,
        "source": {"component": component, **({"host": host} if host else {})},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "reportingComponent": component,
        "reportingInstance": host or component,
    }


class EventRecorder:
    """Writes Events through an API client, correlated as client-go's recorder does. One per process: :data:`RECORDER`."""

    def __init__(self, correlator: EventCorrelator | None = None):
        self.correlator = correlator or EventCorrelator()
        # Occurrences that may share an Event object are written one at a time
        # (client-go writes all of them from one goroutine); others in parallel.
        self._stripes = [threading.Lock() for _ in range(_STRIPES)]
        self._queue: queue.Queue[tuple[api.Client, dict[str, Any]] | None] | None = None
        self._senders: list[threading.Thread] = []

    def send_in_background(self, threads: int = 4) -> None:
        """From now on :meth:`event` queues each occurrence for one of ``threads`` sender threads and returns None."""
        if self._queue is not None:
            return
        self._queue = queue.Queue(QUEUE_SIZE)
        self._senders = [threading.Thread(target=self._send, args=(self._queue,), daemon=True, name=f"events-{i}")
                         for i in range(threads)]
        for t in self._senders:
            t.start()

    def stop_sending(self, timeout: float = 5.0) -> None:
        """Write what is queued (for up to ``timeout`` seconds), then write synchronously again."""
        q, senders = self._queue, self._senders
        if q is None:
            return
        self._queue, self._senders = None, []
        for _ in senders:
            q.put(None)
        deadline = time.monotonic() + timeout
        for t in senders:
            t.join(max(0.0, deadline - time.monotonic()))

    def _send(self, q: queue.Queue[tuple[api.Client, dict[str, Any]] | None]) -> None:
        while (item := q.get()) is not None:
            self._correlate_and_write(*item)

    def event(self, client: api.Client, involved: dict[str, Any], reason: str, message: str,
              type_: str = "Normal", component: str = "kubelet", host: str | None = None) -> dict[str, Any] | None:
        """Record one occurrence; the Event as written, or None (queued for a sender thread, rate limited, or the
        write failed). Never raises."""
        try:
            ev = make_event(involved, reason, message, type_, component, host, self.correlator.clock())
        except Exception as e:  # best effort, as in the kubelet: never fail the caller
            log.debug("cannot record event %s on %s: %s", reason, (involved.get("metadata") or {}).get("name"), e)
            return None
        q = self._queue
        if q is None:
            return self._correlate_and_write(client, ev)
        try:
            q.put_nowait((client, ev))
        except queue.Full:
            log.debug("event %s on %s dropped: %d waiting", reason, ev["involvedObject"].get("name"), QUEUE_SIZE)
        return None

    def _correlate_and_write(self, client: api.Client, ev: dict[str, Any]) -> dict[str, Any] | None:
        try:
            group, _ = aggregate_key(ev)
            with self._stripes[hash(group) % _STRIPES]:
                c = self.correlator.correlate(ev)
                if c.skip:
                    log.debug("event %s/%s on %s rate limited (counted: %d)", ev.get("reason"), ev.get("type"),
                              ev["involvedObject"]["name"], c.event["count"])
                    return None
                written = self._write(client, c)
                if written is not None:
                    self.correlator.update_state(c.key, written)
                return written
        except Exception as e:  # best effort, as in the kubelet: never fail the caller
            log.debug("cannot record event %s on %s: %s", ev.get("reason"), ev["involvedObject"].get("name"), e)
            return None

    @staticmethod
    def _write(client: api.Client, c: Correlated) -> dict[str, Any] | None:
        md = c.event["metadata"]
        try:
            if c.patch is not None:
                try:
                    return client.patch("Event", md["name"], c.patch, namespace=md["namespace"])
                except api.NotFound:
                    pass  # expired (--event-ttl) or deleted: create it again, with the count so far
            return client.create(c.event)
        except (api.ApiError, api.NotFound, api.Conflict) as e:
            # Conflict: an Event of that name exists already; ApiError: e.g. the
            # namespace is terminating or the apiserver cannot be reached.
            log.debug("cannot write event %s/%s: %s", md["namespace"], md["name"], e)
            return None


RECORDER = EventRecorder()
"""The process's recorder; :func:`record` writes through it."""


def record(client: api.Client, involved: dict[str, Any], reason: str, message: str, type_: str = "Normal",
           component: str = "kubelet", host: str | None = None) -> dict[str, Any] | None:
    """Record a core/v1 Event about ``involved`` (as kubectl describe shows them).

    Through the process's recorder, as client-go's: the same event again
    increments ``count`` of the existing Event object. Best effort: returns the
    Event as written, or None, and never raises.
    """
    return RECORDER.event(client, involved, reason, message, type_, component=component, host=host)
