"""Fixtures the unit tests share."""

from __future__ import annotations

import pytest

from gpulab import _poll


@pytest.fixture
def pauses(monkeypatch) -> list[float]:
    """The pauses gpulab._poll.until takes (every wait of the library), on a clock that moves one second per
    look: no real sleeping."""
    taken: list[float] = []
    clock = iter(range(10_000))
    monkeypatch.setattr(_poll.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(_poll.time, "sleep", taken.append)
    return taken
