"""retry_on_conflict: client-go's RetryOnConflict with DefaultRetry (5 tries, 10 ms, factor 1, jitter 0.1)."""

from __future__ import annotations

import pytest

from gpulab.kube import api


def _flaky(conflicts: int, calls: list[int]):
    def fn() -> str:
        calls.append(len(calls) + 1)
        if len(calls) <= conflicts:
            raise api.Conflict("the object has been modified; please apply your changes to the latest version")
        return "stored"

    return fn


def test_a_conflict_twice_then_success_is_retried():
    calls: list[int] = []
    slept: list[float] = []
    assert api.retry_on_conflict(_flaky(2, calls), sleep=slept.append) == "stored"
    assert calls == [1, 2, 3]
    assert len(slept) == 2
    assert all(0.010 <= s <= 0.011 for s in slept), slept  # 10 ms plus at most 10 % jitter


def test_it_gives_up_after_the_steps_and_reraises():
    calls: list[int] = []
    slept: list[float] = []
    with pytest.raises(api.Conflict, match="has been modified"):
        api.retry_on_conflict(_flaky(99, calls), sleep=slept.append)
    assert calls == [1, 2, 3, 4, 5]
    assert len(slept) == 4  # none after the last try


def test_other_errors_are_not_retried():
    calls: list[int] = []

    def fn() -> None:
        calls.append(1)
        raise api.ApiError(422, "Unprocessable Entity", {"message": "spec.replicas: Invalid value"})

    with pytest.raises(api.ApiError):
        api.retry_on_conflict(fn, sleep=lambda s: pytest.fail("slept"))
    assert calls == [1]


def test_each_try_starts_from_a_fresh_read():
    """The shape every caller follows: GET, change, PUT — all inside fn."""
    store = {"rv": 1, "data": {"a": "1"}}
    puts: list[dict] = []

    def get() -> dict:
        return {"metadata": {"resourceVersion": str(store["rv"])}, "data": dict(store["data"])}

    def put(obj: dict) -> dict:
        if obj["metadata"]["resourceVersion"] != str(store["rv"]):
            raise api.Conflict("stale")
        store["rv"] += 1
        store["data"] = obj["data"]
        puts.append(obj)
        return obj

    def change() -> dict:
        obj = get()
        if not puts and store["rv"] == 1:
            store["rv"], store["data"]["b"] = 2, "2"  # someone else writes between our GET and PUT
        obj["data"]["c"] = "3"
        return put(obj)

    api.retry_on_conflict(change, sleep=lambda s: None)
    assert store["data"] == {"a": "1", "b": "2", "c": "3"}  # nothing lost


def test_backoff_parameters_are_honoured():
    slept: list[float] = []
    with pytest.raises(api.Conflict):
        api.retry_on_conflict(_flaky(99, []), steps=3, duration=0.5, factor=2.0, jitter=0.0, sleep=slept.append)
    assert slept == [0.5, 1.0]
