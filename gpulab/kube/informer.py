"""Informers: one list+watch of a kind into a cache, with handlers for its changes, as client-go's.

An :class:`Informer` lists a kind, then watches it from the list's
resourceVersion, keeps every object in a thread-safe cache keyed
``namespace/name`` (``name`` for cluster-scoped kinds) and calls its handlers
for each add, update and delete. When the watch expires (410 Gone, or an
ERROR event) it lists again at once; after any other error it lists again
after a pause. A re-list delivers every listed object again as an update and
an object the list no longer has as a delete, so a consumer misses nothing
that happened while it was not watching. With ``resync`` it also delivers
every cached object again as an update at that interval, as client-go's
resync does (off by default: level-based consumers rarely need it).

:class:`SharedInformers` hands out one informer per kind (and namespace) to
every consumer of a process, as client-go's ``SharedInformerFactory``: the
node agent and the GPU stack share one watch of Nodes.

Handlers run one at a time on the informer's thread; one added late is first
given every cached object as an add, as client-go does (a change arriving in
that moment may then reach it as well: handlers act on the state they are
given, so hearing of an object twice does no harm).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any, Callable, Iterable, Protocol

from . import api

log = logging.getLogger("gpulab.kube")

# How long a watch stream stays open before the apiserver ends it and the informer watches again.
WATCH_TIMEOUT = 240
# The pause before listing again after an error other than an expired watch.
BACKOFF = 1.0
# The pause before listing again a kind the apiserver does not serve (yet: a CRD arrives with its add-on).
NOT_SERVED_BACKOFF = 2.0

Obj = dict[str, Any]


class ListWatcher(Protocol):
    """What an informer needs of a client (:class:`gpulab.kube.api.Client` is one)."""

    def list_raw(self, kind: str, namespace: str | None = None) -> dict[str, Any]: ...

    def watch(self, kind: str, resource_version: str, namespace: str | None = None,
              timeout_seconds: int = ...) -> Iterable[dict[str, Any]]: ...


def key(obj: Obj) -> str:
    """The cache key of an object: ``namespace/name``, or ``name`` for a cluster-scoped one (client-go's)."""
    md = obj["metadata"]
    return f"{md['namespace']}/{md['name']}" if md.get("namespace") else md["name"]


@dataclasses.dataclass(frozen=True)
class Handler:
    """What a consumer is told: ``on_add(obj)``, ``on_update(old, new)``, ``on_delete(last seen obj)``."""

    on_add: Callable[[Obj], None] | None = None
    on_update: Callable[[Obj, Obj], None] | None = None
    on_delete: Callable[[Obj], None] | None = None


class Informer:
    """List+watch of one kind (in one namespace, or all) into a cache, telling every handler what changed.

    ``start()`` runs it on a daemon thread, ``stop()`` ends that thread
    (at once while it waits to retry, else when the current watch stream
    ends: ``watch_timeout`` bounds that). ``synced`` is set once the first
    list is cached and delivered. A handler that raises makes the informer
    list again after ``backoff``, so that what it failed to take is offered
    again. Such failures are logged as warnings, or with ``quiet`` as debug
    lines only (a notebook's cell shows no stray warnings).
    """

    def __init__(self, client: ListWatcher, kind: str, namespace: str | None = None, *,
                 resync: float | None = None, watch_timeout: int = WATCH_TIMEOUT, backoff: float = BACKOFF,
                 quiet: bool = False):
        self.client = client
        self.kind = kind
        self.namespace = namespace
        self.resync = resync
        self.watch_timeout = watch_timeout
        self.backoff = backoff
        self.quiet = quiet
        self.synced = threading.Event()
        self._stop = threading.Event()
        # Ends the pause after a list of a kind not served yet (list_now), and so does stop().
        self._served = threading.Event()
        self._cache: dict[str, Obj] = {}
        self._cache_lock = threading.Lock()
        # Indexes of the cache (client-go's Indexers): index name -> (key function, value -> object keys).
        self._indexes: dict[str, tuple[Callable[[Obj], str | None], dict[str, set[str]]]] = {}
        # Held while handlers run: one delivery at a time, and a late handler's catch-up is not interleaved.
        self._dispatch_lock = threading.RLock()
        self._handlers: list[Handler] = []
        self._thread: threading.Thread | None = None
        self._next_resync = 0.0

    # -- consumers --------------------------------------------------------------

    def add_handler(self, on_add: Callable[[Obj], None] | None = None,
                    on_update: Callable[[Obj, Obj], None] | None = None,
                    on_delete: Callable[[Obj], None] | None = None) -> Handler:
        """Tell a new consumer of every change from now on; what is cached already reaches it as adds first."""
        handler = Handler(on_add, on_update, on_delete)
        with self._dispatch_lock:
            if on_add is not None:
                for obj in self.list():
                    on_add(obj)
            self._handlers.append(handler)
        return handler

    def on_change(self, fn: Callable[[], None]) -> Handler:
        """Call ``fn()`` on every add, update and delete: a consumer that looks at the whole cache whenever anything
        in it changed. Returns the handler (for :meth:`remove_handler`)."""
        return self.add_handler(on_add=lambda obj: fn(), on_update=lambda old, new: fn(), on_delete=lambda obj: fn())

    def remove_handler(self, handler: Handler) -> None:
        """Tell ``handler`` nothing more (client-go's ``RemoveEventHandler``)."""
        with self._dispatch_lock:
            self._handlers = [h for h in self._handlers if h is not handler]

    def has_synced(self) -> bool:
        """Whether the first list has been cached and delivered."""
        return self.synced.is_set()

    def wait_synced(self, timeout: float | None = None) -> bool:
        """Block until :meth:`has_synced` (or ``timeout`` seconds); whether it has."""
        return self.synced.wait(timeout)

    def get(self, key: str) -> Obj | None:
        """The cached object of ``namespace/name`` (``name`` for a cluster-scoped kind), or None."""
        with self._cache_lock:
            return self._cache.get(key)

    def list(self) -> list[Obj]:
        """Every cached object."""
        with self._cache_lock:
            return list(self._cache.values())

    def keys(self) -> list[str]:
        """The keys of every cached object."""
        with self._cache_lock:
            return list(self._cache)

    def add_index(self, name: str, index_of: Callable[[Obj], str | None]) -> None:
        """Keep the cache indexed by ``index_of(obj)`` (None: not in the index), for :meth:`by_index`; client-go's
        ``AddIndexers``. Adding the same name again does nothing."""
        with self._cache_lock:
            if name not in self._indexes:
                self._indexes[name] = (index_of, _indexed(index_of, self._cache))

    def by_index(self, name: str, value: str) -> list[Obj]:
        """The cached objects whose index ``name`` is ``value`` (client-go's ``ByIndex``)."""
        with self._cache_lock:
            _, index = self._indexes[name]
            return [self._cache[k] for k in index.get(value, ())]

    def _store(self, k: str, obj: Obj | None) -> Obj | None:
        """Put ``obj`` in the cache under ``k`` (None: remove it), keeping the indexes; the object it replaced.
        Under the cache lock."""
        before = self._cache.pop(k, None) if obj is None else self._cache.get(k)
        if obj is not None:
            self._cache[k] = obj
        for index_of, index in self._indexes.values():
            old_value = index_of(before) if before is not None else None
            new_value = index_of(obj) if obj is not None else None
            if old_value == new_value:
                continue
            if old_value is not None:
                keys = index.get(old_value)
                if keys is not None:
                    keys.discard(k)
                    if not keys:
                        del index[old_value]
            if new_value is not None:
                index.setdefault(new_value, set()).add(k)
        return before

    # -- lifecycle --------------------------------------------------------------

    def start(self) -> None:
        """Run on a daemon thread (once; later calls do nothing)."""
        if self._thread is not None:
            return
        name = f"informer-{self.kind.lower()}" + (f"-{self.namespace}" if self.namespace else "")
        self._thread = threading.Thread(target=self.run, daemon=True, name=name)
        self._thread.start()

    def stop(self) -> None:
        """End the informer's thread."""
        self._stop.set()
        self._served.set()

    def list_now(self) -> None:
        """The kind is served now (its CRD was installed): if the informer waits to list it again, list at once."""
        self._served.set()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread :meth:`start` started to end."""
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self) -> None:
        """List, then watch, until :meth:`stop`; list again when the watch expires or fails."""
        while not self._stop.is_set():
            try:
                rv = self._relist()
                while not self._stop.is_set():
                    rv = self._watch(rv)
            except api.Gone:
                continue
            except api.NotFound:
                log.debug("%s is not served yet; listing again in %.0f s", self.kind, NOT_SERVED_BACKOFF)
                self._served.wait(NOT_SERVED_BACKOFF)
                self._served.clear()
            except Exception as e:
                if self._stop.is_set():
                    return
                log.log(logging.DEBUG if self.quiet else logging.WARNING, "watch of %s failed (%s); retrying",
                        self.kind, e)
                self._stop.wait(self.backoff)

    # -- the loop's steps ------------------------------------------------------------

    def _relist(self) -> str:
        """Replace the cache by a fresh list, deliver the difference, return the list's resourceVersion."""
        lst = self.client.list_raw(self.kind, self.namespace)
        fresh: dict[str, Obj] = {}
        for obj in lst.get("items") or []:
            obj.setdefault("kind", self.kind)  # a list's items carry no kind
            fresh[key(obj)] = obj
        with self._cache_lock:
            old, self._cache = self._cache, dict(fresh)
            for name, (index_of, _) in list(self._indexes.items()):
                self._indexes[name] = (index_of, _indexed(index_of, fresh))
        with self._dispatch_lock:
            for k, obj in old.items():
                if k not in fresh:
                    self._deliver("delete", obj)
            for k, obj in fresh.items():
                before = old.get(k)
                if before is not None and _uid(before) != _uid(obj):
                    # Deleted and created again under the same name while nobody watched.
                    self._deliver("delete", before)
                    before = None
                if before is None:
                    self._deliver("add", obj)
                else:
                    self._deliver("update", before, obj)
        self.synced.set()
        self._next_resync = time.monotonic() + self.resync if self.resync else 0.0
        return lst["metadata"]["resourceVersion"]

    def _watch(self, rv: str) -> str:
        """One watch stream from ``rv``: apply and deliver its events; the resourceVersion to go on from."""
        timeout = self.watch_timeout
        if self.resync:
            timeout = max(1, min(timeout, round(self._next_resync - time.monotonic() + 0.5)))
        for ev in self.client.watch(self.kind, rv, self.namespace, timeout_seconds=timeout):
            if ev["type"] == "BOOKMARK":
                rv = ev["object"]["metadata"]["resourceVersion"]
                continue
            if ev["type"] == "ERROR":
                raise api.Gone(str(ev["object"]))
            obj = ev["object"]
            obj.setdefault("kind", self.kind)
            rv = obj["metadata"]["resourceVersion"]
            k = key(obj)
            with self._cache_lock:
                before = self._store(k, None if ev["type"] == "DELETED" else obj)
            with self._dispatch_lock:
                if ev["type"] == "DELETED":
                    self._deliver("delete", obj)
                elif before is None:
                    self._deliver("add", obj)
                else:
                    self._deliver("update", before, obj)
            if self._stop.is_set():
                return rv
            self._maybe_resync()
        self._maybe_resync()
        return rv

    def _maybe_resync(self) -> None:
        if not self.resync or time.monotonic() < self._next_resync:
            return
        self._next_resync = time.monotonic() + self.resync
        with self._dispatch_lock:
            for obj in self.list():
                self._deliver("update", obj, obj)

    def _deliver(self, what: str, obj: Obj, new: Obj | None = None) -> None:
        for h in list(self._handlers):
            if what == "add" and h.on_add is not None:
                h.on_add(obj)
            elif what == "update" and h.on_update is not None:
                h.on_update(obj, new if new is not None else obj)
            elif what == "delete" and h.on_delete is not None:
                h.on_delete(obj)


def _indexed(index_of: Callable[[Obj], str | None], objects: dict[str, Obj]) -> dict[str, set[str]]:
    """An index of ``objects`` (key -> object): value -> the keys of the objects ``index_of`` gives it."""
    index: dict[str, set[str]] = {}
    for k, obj in objects.items():
        value = index_of(obj)
        if value is not None:
            index.setdefault(value, set()).add(k)
    return index


def _uid(obj: Obj) -> str | None:
    return obj["metadata"].get("uid")


class SharedInformers:
    """One :class:`Informer` per kind and namespace for every consumer of a process (client-go's factory)."""

    def __init__(self, client: ListWatcher):
        self.client = client
        self._informers: dict[tuple[str, str | None], Informer] = {}
        self._lock = threading.Lock()

    def informer(self, kind: str, namespace: str | None = None) -> Informer:
        """The informer of ``kind`` (in ``namespace``, or all), made on first asking; not started."""
        with self._lock:
            inf = self._informers.get((kind, namespace))
            if inf is None:
                inf = self._informers[(kind, namespace)] = Informer(self.client, kind, namespace)
            return inf

    def start(self) -> None:
        """Start every informer made so far that is not running yet."""
        with self._lock:
            informers = list(self._informers.values())
        for inf in informers:
            inf.start()

    def stop(self) -> None:
        """Stop every informer."""
        with self._lock:
            informers = list(self._informers.values())
        for inf in informers:
            inf.stop()
