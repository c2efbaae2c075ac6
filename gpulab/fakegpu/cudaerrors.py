"""The CUDA runtime errors a simulated CUDA program hits, and why.

CUDA programs do not run nvidia-smi, but the chapter's troubleshooting
lessons need their error strings: :data:`CUDA_ERRORS` is the table (as
``cudaGetErrorString`` prints them), :data:`FAULT_CUDA_ERRORS` maps each
injected fault (:data:`gpulab.fakegpu.nvidiasmi.FAULTS`) to its error, and
:func:`cuda_error` says which one a program would get in a container,
from the same state file and ``NVIDIA_VISIBLE_DEVICES`` nvidia-smi reads.
"""

from __future__ import annotations

from .nvidiasmi import (
    FAULT_CUDA_DRIVER_TOO_OLD,
    FAULT_DRIVER_UNREACHABLE,
    FAULT_FABRIC_MANAGER_DOWN,
    FAULT_NO_DEVICES,
    NO_DEVICES,
    NO_DRIVER,
    select_visible,
)

__all__ = [
    "CudaError",
    "CUDA_ERROR_INSUFFICIENT_DRIVER",
    "CUDA_ERROR_NO_DEVICE",
    "CUDA_ERROR_SYSTEM_NOT_READY",
    "CUDA_ERRORS",
    "FAULT_CUDA_ERRORS",
    "cuda_error",
]


class CudaError:
    """A CUDA runtime error as ``cudaGetErrorString`` prints it."""

    __slots__ = ("code", "name", "message")

    def __init__(self, code: int, name: str, message: str):
        self.code = code
        self.name = name
        self.message = message

    def __repr__(self) -> str:
        return f"CudaError({self.code}, {self.name!r}, {self.message!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CudaError) and (self.code, self.name) == (other.code, other.name)

    def __hash__(self) -> int:
        return hash((self.code, self.name))


CUDA_ERROR_INSUFFICIENT_DRIVER = CudaError(
    35, "cudaErrorInsufficientDriver", "CUDA driver version is insufficient for CUDA runtime version"
)
CUDA_ERROR_NO_DEVICE = CudaError(100, "cudaErrorNoDevice", "no CUDA-capable device is detected")
CUDA_ERROR_SYSTEM_NOT_READY = CudaError(802, "cudaErrorSystemNotReady", "system not yet initialized")

#: By name, for lookups from tests and lessons.
CUDA_ERRORS = {
    e.name: e for e in (CUDA_ERROR_INSUFFICIENT_DRIVER, CUDA_ERROR_NO_DEVICE, CUDA_ERROR_SYSTEM_NOT_READY)
}

#: Which CUDA error each fault makes a CUDA program report.
FAULT_CUDA_ERRORS = {
    FAULT_DRIVER_UNREACHABLE: CUDA_ERROR_INSUFFICIENT_DRIVER,  # no usable libcuda at all
    FAULT_NO_DEVICES: CUDA_ERROR_NO_DEVICE,
    FAULT_FABRIC_MANAGER_DOWN: CUDA_ERROR_SYSTEM_NOT_READY,
    FAULT_CUDA_DRIVER_TOO_OLD: CUDA_ERROR_INSUFFICIENT_DRIVER,
}


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in str(text).split(".") if p.isdigit())


def cuda_error(state: dict | None, env_value: str | None, runtime_version: str | None = None) -> CudaError | None:
    """The error a CUDA program (built for ``runtime_version``) would get.

    None means CUDA initialises fine. The runtime uses this to make
    simulated CUDA workloads fail the way the chapter describes.
    """
    problem, views = select_visible(state, env_value)
    if problem == NO_DRIVER:
        return CUDA_ERROR_INSUFFICIENT_DRIVER
    if problem == NO_DEVICES:
        return CUDA_ERROR_NO_DEVICE
    fault = state.get("fault") if state else None
    if fault in FAULT_CUDA_ERRORS:
        return FAULT_CUDA_ERRORS[fault]
    if runtime_version and _version_tuple(runtime_version) > _version_tuple(state.get("cuda_version", "0")):
        return CUDA_ERROR_INSUFFICIENT_DRIVER
    if views and all(v.mig_enabled and not v.migs for v in views):
        # A MIG-enabled GPU without instances has nothing to run on.
        return CUDA_ERROR_NO_DEVICE
    return None
