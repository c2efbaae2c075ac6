"""Jobs: wait until a lesson's Job has finished, and say how."""

from __future__ import annotations

from typing import Any

from .lesson import current
from .wait import wait_for

__all__ = ["wait_job"]


def wait_job(name: str, namespace: str | None = None, timeout: float = 120) -> dict[str, Any]:
    """Wait until Job ``name`` is Complete or Failed; return its terminal condition (type, reason, message)."""
    ns = namespace or current().namespace

    def finished() -> dict[str, Any] | None:
        job = current().kube.get("Job", name, ns) or {}
        for c in job.get("status", {}).get("conditions") or []:
            if c.get("type") in ("Complete", "Failed") and c.get("status") == "True":
                return c
        return None

    return wait_for(finished, timeout, what=f"Job {name} 结束（Complete 或 Failed）")
