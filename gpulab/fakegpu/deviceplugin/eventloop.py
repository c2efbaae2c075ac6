"""The one asyncio event loop that serves every device-plugin socket of a process.

grpc's blocking API gives each server a polling thread and a worker pool, and each
channel a thread of its own, and its blocking calls wake every 0.1 s. A node agent
that simulates a thousand nodes would run thousands of such threads, all waking.
``grpc.aio`` serves any number of sockets from one loop (and one completion-queue
poller), so the device plugins and the kubelet device managers of every node in the
process share this loop.

- :func:`run` is how code that is not async uses the loop: it hands a coroutine over
  and blocks until it finishes. Calling it on the loop itself is a deadlock, so that
  raises.
- :func:`spawn` starts a coroutine on the loop and returns its task; :func:`cancel` ends it.
- :func:`offload` is how a coroutine calls code that may block (locks, files,
  callbacks into the node): on a small pool of threads, never on the loop.
- :func:`offload_waiting` is the same for blocking code that itself waits on the loop
  (calls :func:`run`, as a device plugin's watch tick does when it registers): on a
  pool of its own, so that it never holds the threads the loop's coroutines offload to.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

#: Threads for blocking work that coroutines hand off (registrations, device-list callbacks).
OFFLOAD_THREADS = 4
#: Threads for blocking work that waits on the loop (offload_waiting).
WAITING_THREADS = 4

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_pool: concurrent.futures.ThreadPoolExecutor | None = None
_waiting_pool: concurrent.futures.ThreadPoolExecutor | None = None


def loop() -> asyncio.AbstractEventLoop:
    """The process's loop, started on first use in a daemon thread."""
    global _loop, _thread, _pool, _waiting_pool
    with _lock:
        if _loop is None or _thread is None or not _thread.is_alive():
            started = threading.Event()
            new = asyncio.new_event_loop()

            def main() -> None:
                asyncio.set_event_loop(new)
                new.call_soon(started.set)
                new.run_forever()

            thread = threading.Thread(target=main, name="deviceplugin-loop", daemon=True)
            thread.start()
            started.wait()
            _loop, _thread = new, thread
            _pool = concurrent.futures.ThreadPoolExecutor(OFFLOAD_THREADS, thread_name_prefix="deviceplugin-offload")
            _waiting_pool = concurrent.futures.ThreadPoolExecutor(WAITING_THREADS,
                                                                  thread_name_prefix="deviceplugin-waiting")
        return _loop


def on_loop() -> bool:
    """True in the loop's own thread."""
    return _thread is not None and threading.current_thread() is _thread


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` on the loop and return its result (or raise its exception)."""
    target = loop()
    if on_loop():
        coroutine.close()
        raise RuntimeError("eventloop.run() called on the event loop itself; await the coroutine instead")
    return asyncio.run_coroutine_threadsafe(coroutine, target).result()


def spawn(coroutine: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """Start ``coroutine`` as a task on the loop and return the task (keep it: the loop holds tasks weakly)."""

    async def start() -> asyncio.Task[T]:
        return asyncio.ensure_future(coroutine)

    return run(start())


def cancel(task: asyncio.Task, timeout: float) -> None:
    """Cancel a task of :func:`spawn` and wait up to ``timeout`` seconds for it to end."""

    async def stop() -> None:
        task.cancel()
        await asyncio.wait([task], timeout=timeout)

    run(stop())


async def call(method: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    """Await ``method(*args, **kwargs)``: a gRPC call made in the loop's thread, for :func:`run`."""
    return await method(*args, **kwargs)


async def offload(fn: Callable[..., T], *args: Any) -> T:
    """Await ``fn(*args)`` run on the offload threads."""
    loop()
    return await asyncio.get_running_loop().run_in_executor(_pool, fn, *args)


async def offload_waiting(fn: Callable[..., T], *args: Any) -> T:
    """Await ``fn(*args)``, which may itself wait on the loop, run on the waiting threads."""
    loop()
    return await asyncio.get_running_loop().run_in_executor(_waiting_pool, fn, *args)


def waker(event: asyncio.Event) -> Callable[[], None]:
    """A function any thread may call to set ``event`` on the loop."""
    target = asyncio.get_running_loop()
    return lambda: target.call_soon_threadsafe(event.set)
