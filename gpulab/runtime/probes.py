"""Startup, liveness and readiness probes, timed as the kubelet times them.

``exec`` probes run the command in the container's sandbox and pass on exit 0.
``httpGet``, ``tcpSocket`` and ``grpc`` probes have no network to cross on a
simulated node: they pass once the container has been up for its declared
model-load time (see :mod:`gpulab.runtime.containers`), which is what a model
server's health endpoint does.
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
from typing import Any, Callable

DEFAULTS = {"initialDelaySeconds": 0, "periodSeconds": 10, "timeoutSeconds": 1,
            "successThreshold": 1, "failureThreshold": 3}


@dataclasses.dataclass
class Result:
    ok: bool
    output: str = ""


@dataclasses.dataclass
class ProbeState:
    spec: dict[str, Any]
    next_at: float
    successes: int = 0
    failures: int = 0

    def setting(self, key: str) -> int:
        value = self.spec.get(key)
        return DEFAULTS[key] if value is None else int(value)


def describe(kind: str) -> str:
    """The probe's kind as the kubelet names it in events (e.g. 'Startup')."""
    return {"startupProbe": "Startup", "livenessProbe": "Liveness", "readinessProbe": "Readiness"}[kind]


def run_handler(spec: dict[str, Any], up_for: float, load_seconds: float,
                run_exec: Callable[[list[str], float], tuple[int, str]]) -> Result:
    timeout = float(spec.get("timeoutSeconds") or DEFAULTS["timeoutSeconds"])
    if "exec" in spec:
        cmd = (spec["exec"] or {}).get("command") or []
        try:
            rc, out = run_exec(cmd, timeout)
        except subprocess.TimeoutExpired:
            return Result(False, f"command timed out after {timeout:g}s")
        return Result(rc == 0, out.strip())
    if up_for >= load_seconds:
        return Result(True)
    if "httpGet" in spec:
        h = spec["httpGet"]
        port = h.get("port", 80)
        return Result(False, f'Get "http://{h.get("host") or "10.244.0.1"}:{port}{h.get("path", "/")}": '
                             "dial tcp: connect: connection refused")
    if "tcpSocket" in spec:
        return Result(False, f"dial tcp :{spec['tcpSocket'].get('port')}: connect: connection refused")
    if "grpc" in spec:
        return Result(False, f"timeout: failed to connect service \":{spec['grpc'].get('port')}\" within {timeout:g}s")
    return Result(False, "probe has no handler")


class Prober:
    """The three probes of one running container."""

    def __init__(self, container_spec: dict[str, Any], started_at: float):
        self.states: dict[str, ProbeState] = {}
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            spec = container_spec.get(kind)
            if spec:
                delay = spec.get("initialDelaySeconds") or 0
                self.states[kind] = ProbeState(spec, started_at + float(delay))

    def due(self, kind: str, now: float, started: bool) -> ProbeState | None:
        st = self.states.get(kind)
        if st is None:
            return None
        # Liveness and readiness wait until the startup probe has passed.
        if kind != "startupProbe" and not started:
            return None
        if kind == "startupProbe" and started:
            return None
        return st if now >= st.next_at else None

    @staticmethod
    def record(st: ProbeState, result: Result, now: float) -> str | None:
        """Update counters; returns 'success' / 'failure' when a threshold is crossed."""
        st.next_at = now + st.setting("periodSeconds")
        if result.ok:
            st.successes += 1
            st.failures = 0
            if st.successes >= st.setting("successThreshold"):
                return "success"
        else:
            st.failures += 1
            st.successes = 0
            if st.failures >= st.setting("failureThreshold"):
                return "failure"
        return None


def now() -> float:
    return time.time()
