"""gpulab._poll.until: the polling loop behind every wait in the library."""

from __future__ import annotations

import pytest

from gpulab import _poll


def test_returns_the_first_truthy_value():
    answers = iter([None, [], {"ready": True}])
    assert _poll.until(lambda: next(answers), 5, lambda v: AssertionError(v), interval=0) == {"ready": True}


def test_a_timeout_raises_what_the_caller_builds_from_the_last_value():
    with pytest.raises(TimeoutError, match=r"last: \[\]"):
        _poll.until(lambda: [], 0.05, lambda v: TimeoutError(f"last: {v!r}"), interval=0.01)


def test_the_pause_grows_up_to_max_interval(pauses):
    with pytest.raises(RuntimeError):
        _poll.until(lambda: None, 6, lambda _: RuntimeError(), interval=0.1, max_interval=0.2)
    assert pauses == pytest.approx([0.1, 0.15, 0.2, 0.2, 0.2])


def test_a_stop_aware_pause_ends_the_wait_when_asked_to_stop(pauses):
    taken: list[float] = []

    def pause(seconds: float) -> bool:
        taken.append(seconds)
        return len(taken) == 2  # asked to stop during the second pause

    assert _poll.until(lambda: None, 60, lambda _: RuntimeError(), interval=0.5, pause=pause) is None
    assert taken == [0.5, 0.5] and pauses == []


def test_without_max_interval_the_pause_stays(pauses):
    with pytest.raises(RuntimeError):
        _poll.until(lambda: None, 3, lambda _: RuntimeError(), interval=0.25)
    assert pauses == [0.25, 0.25]
