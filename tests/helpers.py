"""Small helpers shared by the test suites."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

import pytest

from gpulab.runtime import sandbox

#: A cluster test that needs the pod network: skipped under GPULAB_SANDBOX=process, which has none.
NEEDS_POD_NETWORK = pytest.mark.skipif(sandbox.kind() != "namespaces",
                                       reason="GPULAB_SANDBOX=process has no pod network (README: what each mode gives)")


def create(kube, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
    """Create ``obj`` in namespace ``ns``."""
    obj["metadata"]["namespace"] = ns
    return kube.create(obj)


def wait_for(fn: Callable[[], Any], timeout: float = 30, interval: float = 0.2, what: str = "condition") -> Any:
    """Poll ``fn`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} (last value: {last!r})")


def pod_ready(kube, ns: str, name: str) -> Any:
    """The pod, once its Ready condition is True (else a falsy value): a ``wait_for`` predicate."""
    p = kube.get("Pod", name, ns) or {}
    conds = {c["type"]: c["status"] for c in (p.get("status") or {}).get("conditions") or []}
    return conds.get("Ready") == "True" and p


def pod_finished(kube, ns: str, name: str) -> Any:
    """The pod, once it is Succeeded or Failed (else a falsy value): a ``wait_for`` predicate."""
    p = kube.get("Pod", name, ns) or {}
    return (p.get("status") or {}).get("phase") in ("Succeeded", "Failed") and p


def port_forward(cluster, ns: str, target: str, remote: int | str, path: str = "/") -> str:
    """GET ``path`` through `kubectl port-forward TARGET LOCAL:REMOTE` (retried while the forward comes up)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        local = s.getsockname()[1]
    exe = str(Path(sys.executable).parent / "kubectl")
    proc = subprocess.Popen([exe, "--kubeconfig", str(cluster.kubeconfig), "-n", ns, "port-forward", target,
                             f"{local}:{remote}", "--address=127.0.0.1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    body = None
    try:
        for _ in range(50):
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{local}{path}", timeout=3).read().decode()
                break
            except OSError:
                time.sleep(0.2)
    finally:
        proc.terminate()
        said = proc.communicate(timeout=10)[0]
    assert body is not None, f"{target}: kubectl port-forward said: {said}"
    return body
