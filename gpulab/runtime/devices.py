"""The device seam: how a device side (the GPU stack) takes part in a pod's life.

The node agent (:mod:`gpulab.runtime.agent`) runs pods; whatever owns devices
plugs in from above through :class:`DeviceHooks`, as a kubelet's device
manager does. Nothing in :mod:`gpulab.runtime` knows about GPUs: the GPU
side (:mod:`gpulab.fakegpu`) implements these hooks, and the node agent's
entry point (:mod:`gpulab.cluster.nodeagent`) hands them to the agent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

from .sandbox import Mount


@dataclasses.dataclass
class DeviceGrant:
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    mounts: list[Mount] = dataclasses.field(default_factory=list)
    devices: list[Mount] = dataclasses.field(default_factory=list)


class AdmissionError(Exception):
    """The node refuses a pod, as a kubelet's admission handlers do: the pod fails with ``reason``."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


class AdmissionPending(Exception):
    """The node cannot admit a pod yet (its device plugin is expected back): the pod waits, Pending."""


@dataclasses.dataclass
class ContainerKill:
    """The device side ends a running container (say, its CUDA program ran out of GPU memory)."""

    exit_code: int
    lines: list[str]  # its last words, on stderr


class DeviceHooks(Protocol):
    """How the GPU stack takes part in a pod's life (the kubelet's device manager and the GPUs)."""

    def admit(self, pod: dict[str, Any]) -> None:
        """Allocate the pod's devices before anything starts; raises AdmissionError or AdmissionPending."""

    def adopt(self, pod: dict[str, Any]) -> None:
        """A pod that ran before the node agent restarted: take back its devices from the checkpoint."""

    def prepare(self, pod: dict[str, Any], container: dict[str, Any]) -> DeviceGrant: ...

    def observe(self, pod: dict[str, Any], container: dict[str, Any], running: bool) -> ContainerKill | None:
        """Told every sync whether a container runs; a ContainerKill ends it."""

    def release(self, pod: dict[str, Any]) -> None:
        """The pod is finished (terminal or deleted): its devices are free again. Idempotent."""

    def retain(self, pod_uids: set[str]) -> None:
        """After a restart: forget devices held by pods that no longer exist (deleted meanwhile)."""

    def wake_with(self, wake: Callable[[str], None]) -> None:
        """How to wake the pod (by UID) whose container the device side ends between its syncs: a neighbour's
        CUDA program took the memory it held. The pod's next :meth:`observe` then hands it the ContainerKill,
        so a pod holding devices need not be looked at every fraction of a second."""


class NoDevices:
    def admit(self, pod: dict[str, Any]) -> None:
        pass

    def adopt(self, pod: dict[str, Any]) -> None:
        pass

    def prepare(self, pod: dict[str, Any], container: dict[str, Any]) -> DeviceGrant:
        return DeviceGrant()

    def observe(self, pod: dict[str, Any], container: dict[str, Any], running: bool) -> ContainerKill | None:
        return None

    def release(self, pod: dict[str, Any]) -> None:
        pass

    def retain(self, pod_uids: set[str]) -> None:
        pass

    def wake_with(self, wake: Callable[[str], None]) -> None:
        pass
