"""The informer (gpulab.kube.informer) against a client stub that answers list_raw and watch from a script."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from gpulab.kube import api, informer
from gpulab.kube.informer import Informer, SharedInformers, key


def pod(name: str, rv: str, uid: str | None = None, ns: str = "ns") -> dict[str, Any]:
    return {"metadata": {"namespace": ns, "name": name, "uid": uid or f"uid-{name}", "resourceVersion": rv}}


def event(type_: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": type_, "object": obj}


class ScriptEnded(Exception):
    pass


class ScriptedClient:
    """Answers each list_raw and each watch with the next of its scripted answers (an exception is raised).

    When a script runs out, the informer is stopped: the test has seen what it wanted.
    """

    def __init__(self, lists: list[Any], watches: list[Any]):
        self.lists = list(lists)
        self.watches = list(watches)
        self.watched_from: list[str] = []
        self.timeouts: list[int] = []
        self.informer: Informer | None = None

    def _next(self, script: list[Any]) -> Any:
        if not script:
            assert self.informer is not None
            self.informer.stop()
            raise ScriptEnded()
        answer = script.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def list_raw(self, kind: str, namespace: str | None = None) -> dict[str, Any]:
        items = self._next(self.lists)
        rv = max([int(o["metadata"]["resourceVersion"]) for o in items] or [0])
        return {"metadata": {"resourceVersion": str(rv)}, "items": [dict(o) for o in items]}

    def watch(self, kind: str, resource_version: str, namespace: str | None = None, timeout_seconds: int = 300):
        self.watched_from.append(resource_version)
        self.timeouts.append(timeout_seconds)
        return iter(self._next(self.watches))


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def add(self, obj: dict[str, Any]) -> None:
        self.seen.append(("add", key(obj)))

    def update(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        self.seen.append(("update", key(new)))

    def delete(self, obj: dict[str, Any]) -> None:
        self.seen.append(("delete", key(obj)))

    def handlers(self) -> dict[str, Any]:
        return {"on_add": self.add, "on_update": self.update, "on_delete": self.delete}


def informer_for(client: ScriptedClient, **kwargs: Any) -> Informer:
    inf = Informer(client, "Pod", backoff=0, **kwargs)
    client.informer = inf
    return inf


def run(inf: Informer) -> None:
    """Run the informer on a thread until its script ends, and see that the thread ends."""
    inf.start()
    inf.join(timeout=10)
    assert inf._thread is not None and not inf._thread.is_alive()


def test_the_first_list_is_delivered_as_adds_cached_and_sets_synced() -> None:
    client = ScriptedClient([[pod("a", "1"), pod("b", "2")]], [])
    inf = informer_for(client)
    rec = Recorder()
    inf.add_handler(**rec.handlers())
    assert not inf.has_synced()
    run(inf)
    assert inf.has_synced() and inf.wait_synced(0)
    assert rec.seen == [("add", "ns/a"), ("add", "ns/b")]
    assert sorted(inf.keys()) == ["ns/a", "ns/b"]
    assert inf.get("ns/a")["kind"] == "Pod"  # a list's items get their kind back
    assert inf.get("ns/c") is None
    assert client.watched_from == ["2"]  # the watch starts at the list's resourceVersion


def test_watch_events_update_the_cache_and_reach_the_handlers() -> None:
    stream = [event("ADDED", pod("b", "3")), event("MODIFIED", pod("a", "4")),
              event("BOOKMARK", {"metadata": {"resourceVersion": "5"}}), event("DELETED", pod("b", "6"))]
    client = ScriptedClient([[pod("a", "1")]], [stream, []])
    inf = informer_for(client)
    rec = Recorder()
    inf.add_handler(**rec.handlers())
    run(inf)
    assert rec.seen == [("add", "ns/a"), ("add", "ns/b"), ("update", "ns/a"), ("delete", "ns/b")]
    assert inf.keys() == ["ns/a"] and inf.get("ns/a")["metadata"]["resourceVersion"] == "4"
    assert client.watched_from[:2] == ["1", "6"]  # an ended stream is watched again from the last version


def test_gone_lists_again_and_what_the_list_lacks_is_delivered_as_deleted() -> None:
    lists = [[pod("a", "1"), pod("b", "2"), pod("c", "3")],
             # While nobody watched: b went, c was deleted and made again, d came.
             [pod("a", "1"), pod("c", "7", uid="uid-c2"), pod("d", "8")]]
    client = ScriptedClient(lists, [api.Gone("too old"), [event("ERROR", {"code": 410})], []])
    inf = informer_for(client)
    rec = Recorder()
    inf.add_handler(**rec.handlers())
    run(inf)
    assert rec.seen[3:] == [("delete", "ns/b"), ("update", "ns/a"), ("delete", "ns/c"), ("add", "ns/c"),
                            ("add", "ns/d")]
    assert sorted(inf.keys()) == ["ns/a", "ns/c", "ns/d"]
    assert inf.get("ns/c")["metadata"]["uid"] == "uid-c2"
    # Gone and an ERROR event both list again at once.
    assert len(client.watched_from) == 2


def test_an_error_lists_again_after_the_backoff() -> None:
    client = ScriptedClient([api.ApiError(500, "boom", None), [pod("a", "1")]], [])
    inf = informer_for(client)
    rec = Recorder()
    inf.add_handler(**rec.handlers())
    run(inf)
    assert rec.seen == [("add", "ns/a")] and inf.has_synced()


def test_resync_delivers_the_cached_objects_again_as_updates(monkeypatch) -> None:
    clock = iter(range(0, 10_000, 10))  # ten seconds pass between looks at the clock
    monkeypatch.setattr(informer, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    client = ScriptedClient([[pod("a", "1"), pod("b", "2")]], [[], []])
    inf = informer_for(client, resync=15)
    rec = Recorder()
    inf.add_handler(**rec.handlers())
    run(inf)
    assert rec.seen[:2] == [("add", "ns/a"), ("add", "ns/b")]
    assert rec.seen[2:4] == [("update", "ns/a"), ("update", "ns/b")]
    assert all(t <= 15 for t in client.timeouts)  # no watch outlasts the resync period


def test_without_resync_nothing_is_delivered_twice() -> None:
    client = ScriptedClient([[pod("a", "1")]], [[], [], []])
    inf = informer_for(client)
    rec = Recorder()
    inf.add_handler(**rec.handlers())
    run(inf)
    assert rec.seen == [("add", "ns/a")]
    assert set(client.timeouts) == {240}


def test_every_handler_hears_every_change_and_a_late_one_catches_up() -> None:
    client = ScriptedClient([[pod("a", "1")]], [[event("ADDED", pod("b", "2"))]])
    inf = informer_for(client)
    first, second = Recorder(), Recorder()
    inf.add_handler(**first.handlers())
    inf.add_handler(on_delete=second.delete, on_update=second.update)  # a handler may want only some changes
    run(inf)
    assert first.seen == [("add", "ns/a"), ("add", "ns/b")]
    assert second.seen == []
    late = Recorder()
    inf.add_handler(**late.handlers())
    assert sorted(late.seen) == [("add", "ns/a"), ("add", "ns/b")]


def test_a_handler_that_fails_gets_the_object_again_from_a_new_list() -> None:
    client = ScriptedClient([[pod("a", "1")], [pod("a", "1")]], [])
    inf = informer_for(client)
    took: list[str] = []

    def add(obj: dict[str, Any]) -> None:
        if not took:
            took.append("failed")
            raise RuntimeError("not now")
        took.append("added")

    inf.add_handler(on_add=add, on_update=lambda old, new: took.append("updated"))
    run(inf)
    assert took == ["failed", "updated"]


def test_stop_ends_the_thread_while_it_waits_to_retry() -> None:
    class Failing:
        def list_raw(self, kind: str, namespace: str | None = None) -> dict[str, Any]:
            raise api.ApiError(0, "cannot reach the apiserver", None)

        def watch(self, *args: Any, **kwargs: Any):  # pragma: no cover - never reached
            return iter([])

    inf = Informer(Failing(), "Node", backoff=60)
    inf.start()
    inf.stop()
    inf.join(timeout=5)
    assert inf._thread is not None and not inf._thread.is_alive()
    assert not inf.has_synced()


def test_a_kind_not_served_yet_is_listed_again_at_once_when_told_it_is(monkeypatch) -> None:
    monkeypatch.setattr(informer, "NOT_SERVED_BACKOFF", 60)
    client = ScriptedClient([api.NotFound("/apis/nvidia.com/v1/clusterpolicies"), [pod("a", "1")]], [])
    inf = informer_for(client)
    inf.start()
    inf.list_now()  # the CRD is installed: no minute's pause
    inf.join(timeout=5)
    assert inf._thread is not None and not inf._thread.is_alive()
    assert inf.has_synced() and inf.keys() == ["ns/a"]


def test_cluster_scoped_objects_are_keyed_by_name_and_shared_informers_are_one_per_kind() -> None:
    assert key({"metadata": {"name": "gpu-node-1"}}) == "gpu-node-1"
    shared = SharedInformers(ScriptedClient([], []))
    nodes = shared.informer("Node")
    assert shared.informer("Node") is nodes
    assert shared.informer("Pod", "ns") is not shared.informer("Pod")


def test_a_removed_handler_hears_nothing_more() -> None:
    client = ScriptedClient([[pod("a", "1")]], [[event("ADDED", pod("b", "2"))]])
    inf = informer_for(client)
    kept, removed = Recorder(), Recorder()
    inf.add_handler(**kept.handlers())
    handler = inf.add_handler(**removed.handlers())
    inf.remove_handler(handler)
    run(inf)
    assert kept.seen == [("add", "ns/a"), ("add", "ns/b")]
    assert removed.seen == []


def test_on_change_calls_back_for_every_add_update_and_delete() -> None:
    client = ScriptedClient([[pod("a", "1")]], [[event("MODIFIED", pod("a", "2")), event("DELETED", pod("a", "2"))]])
    inf = informer_for(client)
    calls: list[int] = []
    inf.on_change(lambda: calls.append(1))
    run(inf)
    assert len(calls) == 3


def on_node(name: str, rv: str, node: str | None) -> dict[str, Any]:
    obj = pod(name, rv)
    if node is not None:
        obj["spec"] = {"nodeName": node}
    return obj


def test_an_index_follows_lists_moves_and_deletes() -> None:
    def node_of(obj: dict[str, Any]) -> str | None:
        return (obj.get("spec") or {}).get("nodeName")

    lists = [[on_node("a", "1", "n1"), on_node("b", "2", None)],
             # Listed again after the watch expired: c came to n2 while nobody watched.
             [on_node("a", "5", "n1"), on_node("c", "6", "n2")]]
    stream = [event("MODIFIED", on_node("b", "3", "n1")),  # bound
              event("DELETED", on_node("a", "4", "n1"))]
    client = ScriptedClient(lists, [stream, api.Gone("expired"), []])
    inf = informer_for(client)
    seen: list[list[str]] = []

    def look(obj: dict[str, Any]) -> None:
        seen.append(sorted(key(o) for o in inf.by_index("node", "n1")))

    inf.add_index("node", node_of)
    inf.add_handler(on_add=look, on_update=lambda old, new: look(new), on_delete=look)
    run(inf)
    # Each handler sees the index as the cache is: after the list, the binding, the delete, the new list.
    assert seen[:4] == [["ns/a"], ["ns/a"], ["ns/a", "ns/b"], ["ns/b"]]
    assert [key(o) for o in inf.by_index("node", "n1")] == ["ns/a"]
    assert [key(o) for o in inf.by_index("node", "n2")] == ["ns/c"]
    assert inf.by_index("node", "n3") == []
    # An index added to a filled cache indexes what is there.
    inf.add_index("name", lambda obj: obj["metadata"]["name"])
    assert [key(o) for o in inf.by_index("name", "c")] == ["ns/c"]
