"""Built-in images: container images whose program runs inside the node agent.

Simulated nodes fetch no image files (a pull is only time: :mod:`gpulab.runtime.imagemanager`). A container
whose spec has a command runs
that command in a sandbox; one without a command is simulated as a process
that runs until stopped. A third kind covers the software the cluster's
own stack ships as images — NVIDIA's device plugin, GFD, the DCGM exporter,
the MIG manager, the validator: their images are *registered* here with a
factory, and a container using one runs that factory's :class:`Program`
in the node agent's process, for that container's node. So the GPU
Operator's DaemonSet pods really are what runs the device plugin on each
node: stop the program and the pod's container exits and is restarted with
back-off, exactly as a crashing plugin would be; its log lines are the
container's log.

Programs run in-process (threads), not as separate interpreters, so that a
full GPU stack on every node costs megabytes, not a Python process each.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any, Callable, Protocol

from .images import image_repository
from .network import PodNetwork


@dataclasses.dataclass
class ProgramContext:
    """What a built-in program is given about the container it runs as."""

    # the pod network, where a program serves a port (PodNetwork.listen)
    network: PodNetwork
    node: str
    pod: dict[str, Any]
    container: dict[str, Any]
    env: dict[str, str]
    # volume name -> host path, as the pod's volumes were set up
    volumes: dict[str, Path]
    # write one line to the container's log: log("stdout"|"stderr", text)
    log: Callable[[str, str], None]
    # the pod's IP, once its sandbox has one
    pod_ip: str | None = None
    # called when the program has ended by itself (its pod worker then looks at once)
    exited: Callable[[], None] | None = None


class Program(Protocol):
    def start(self) -> None:
        """Begin running (return quickly; do the work on threads)."""

    def poll(self) -> int | None:
        """The exit code once the program has ended by itself, else None."""

    def stop(self, grace: float) -> int:
        """End the program (SIGTERM semantics); return its exit code."""


Factory = Callable[[ProgramContext], Program]

_registry: dict[str, Factory] = {}
_lock = threading.Lock()


def register(repository: str, factory: Factory) -> None:
    """Make every tag of ``repository`` run ``factory``'s program."""
    with _lock:
        _registry[repository] = factory


def lookup(image: str) -> Factory | None:
    with _lock:
        return _registry.get(image_repository(image))


def registered() -> list[str]:
    with _lock:
        return sorted(_registry)


class StopEvent(threading.Event):
    """A program's stop signal that also wakes what the program sleeps on instead (:meth:`also_wake`): a program
    waiting for a change need not wake every fraction of a second to look whether it was stopped."""

    def __init__(self) -> None:
        super().__init__()
        self._wakes: list[threading.Event] = []

    def also_wake(self, event: threading.Event) -> None:
        self._wakes.append(event)
        if self.is_set():
            event.set()

    def set(self) -> None:
        super().set()
        for event in list(self._wakes):
            event.set()


class FunctionProgram:
    """A program made of one function run on a thread until ``stop`` is set.

    ``target(stop_event, ctx)`` returns an exit code (or None for 0); an
    exception is logged to the container's stderr and ends it with code 1.
    """

    def __init__(self, ctx: ProgramContext, target: Callable[[threading.Event, ProgramContext], int | None]):
        self.ctx = ctx
        self.target = target
        self.stop_event = StopEvent()
        self.exit_code: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"program-{ctx.node}-{ctx.container['name']}")

    def _run(self) -> None:
        try:
            rc = self.target(self.stop_event, self.ctx)
            self.exit_code = 0 if rc is None else int(rc)
        except Exception as e:  # a crashing program is a crashing container
            self.ctx.log("stderr", f"fatal: {type(e).__name__}: {e}")
            self.exit_code = 1
        finally:
            if self.ctx.exited is not None and not self.stop_event.is_set():
                self.ctx.exited()

    def start(self) -> None:
        self.thread.start()

    def poll(self) -> int | None:
        # exit_code is set once the target has returned (or raised), before ``exited`` is called.
        return self.exit_code

    def stop(self, grace: float) -> int:
        self.stop_event.set()
        self.thread.join(timeout=max(grace, 0.5))
        if self.thread.is_alive():
            return 137
        return self.exit_code if self.exit_code is not None else 143
