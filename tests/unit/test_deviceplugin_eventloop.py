"""The device-plugin API's one event loop: blocking code hands coroutines over; the loop never blocks on itself."""

from __future__ import annotations

import asyncio
import threading

import pytest

from gpulab.fakegpu.deviceplugin import eventloop


def test_run_returns_the_result_and_raises_the_error_of_a_coroutine():
    async def answer() -> int:
        return 42

    async def fail() -> None:
        raise ValueError("from the loop")

    assert eventloop.run(answer()) == 42
    with pytest.raises(ValueError, match="from the loop"):
        eventloop.run(fail())


def test_run_on_the_loop_itself_raises_instead_of_deadlocking():
    async def nested() -> None:
        async def inner() -> None:
            pass

        eventloop.run(inner())

    with pytest.raises(RuntimeError, match="on the event loop itself"):
        eventloop.run(nested())


def test_offload_runs_blocking_work_off_the_loop():
    async def where() -> tuple[bool, bool]:
        return eventloop.on_loop(), await eventloop.offload(eventloop.on_loop)

    assert eventloop.run(where()) == (True, False)


def test_a_spawned_task_runs_until_cancelled_and_cancel_waits_for_its_end():
    started, ended = threading.Event(), threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            ended.set()

    task = eventloop.spawn(forever())
    assert started.wait(5)
    assert not ended.is_set()
    eventloop.cancel(task, timeout=5)
    assert ended.is_set() and task.cancelled()


def test_one_loop_thread_serves_every_caller():
    loops: set[int] = set()

    def use() -> None:
        async def which() -> int:
            return id(asyncio.get_running_loop())

        loops.add(eventloop.run(which()))

    threads = [threading.Thread(target=use) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert len(loops) == 1
