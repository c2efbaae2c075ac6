"""Traffic on a GPU workload, as the utilisation its pods' CUDA programs show.

``gpulab load deploy/NAME 80`` says: the traffic this Deployment serves
would keep one replica's GPU 80 % busy. Traffic is shared by the ready
replicas, so each shows ``80 / replicas`` percent (at most 100). That is what
lets an HPA on ``DCGM_FI_DEV_GPU_UTIL`` converge: with a target of 40 %, a
load of 160 settles at 4 replicas, and a load of 0 brings it back to the
minimum. The value lives in the annotation ``gpulab.io/gpu-load`` on the
workload object itself (not its pod template, so setting it rolls nothing).

A pod's own ``gpulab.io/gpu-utilization`` annotation (see
:mod:`gpulab.fakegpu.ledger`) is a fixed load for that pod alone and wins.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

from ..kube import api

ANNOTATION = "gpulab.io/gpu-load"
KINDS = {"deploy": "Deployment", "deployment": "Deployment", "deployments": "Deployment",
         "sts": "StatefulSet", "statefulset": "StatefulSet", "statefulsets": "StatefulSet",
         "rs": "ReplicaSet", "replicaset": "ReplicaSet", "replicasets": "ReplicaSet"}
MAX_LOAD = 10000


class LoadError(ValueError):
    """A malformed target or load value; the message says what is allowed."""


def parse_target(target: str) -> tuple[str, str]:
    """``deploy/web`` -> ("Deployment", "web")."""
    kind, sep, name = target.partition("/")
    if not sep or not name:
        raise LoadError(f"target {target!r}: expected KIND/NAME, e.g. deploy/llm-server "
                        f"(kinds: {', '.join(sorted(set(KINDS)))})")
    if kind.lower() not in KINDS:
        raise LoadError(f"target {target!r}: unknown kind {kind!r}; allowed: {', '.join(sorted(set(KINDS)))}")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name):
        raise LoadError(f"target {target!r}: {name!r} is not a valid object name")
    return KINDS[kind.lower()], name


def parse_load(value: str) -> float:
    """A load in percent of one GPU: a number from 0 to 10000 (a trailing % is allowed)."""
    text = str(value).strip().rstrip("%").strip()
    try:
        load = float(text)
    except ValueError:
        raise LoadError(f"load {value!r}: expected a number of percent of one GPU, e.g. 80 or 250") from None
    if load != load or load < 0 or load > MAX_LOAD:  # NaN fails the first test
        raise LoadError(f"load {value!r}: must be between 0 and {MAX_LOAD} (percent of one GPU's compute)")
    return load


def set_load(client: api.Client, target: str, value: str, namespace: str) -> str:
    kind, name = parse_target(target)
    load = parse_load(value)
    if client.get(kind, name, namespace) is None:
        raise LoadError(f"{kind} {namespace}/{name} not found")
    text = f"{load:g}"
    client.patch(kind, name, {"metadata": {"annotations": {ANNOTATION: text}}}, namespace)
    return f"{kind.lower()}.apps/{name} load set to {text}% of one GPU, shared by its ready replicas"


class LoadModel:
    """Per-pod utilisation from workload loads; caches owner lookups for a few seconds."""

    def __init__(self, client: api.Client, ttl: float = 2.0):
        self.client = client
        self.ttl = ttl
        self._cache: dict[tuple[str, str, str], tuple[float, dict[str, Any] | None]] = {}
        self._lock = threading.Lock()

    def _get(self, kind: str, name: str, ns: str) -> dict[str, Any] | None:
        key = (kind, name, ns)
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
            if hit and now - hit[0] < self.ttl:
                return hit[1]
        obj = self.client.get(kind, name, ns)
        with self._lock:
            self._cache[key] = (now, obj)
        return obj

    def workload(self, pod: dict[str, Any]) -> dict[str, Any] | None:
        """The Deployment/StatefulSet/ReplicaSet carrying a load for this pod, if any."""
        ns = pod["metadata"].get("namespace", "default")
        for ref in pod["metadata"].get("ownerReferences") or []:
            if ref.get("kind") == "ReplicaSet":
                rs = self._get("ReplicaSet", ref["name"], ns)
                if rs is None:
                    return None
                for up in rs["metadata"].get("ownerReferences") or []:
                    if up.get("kind") == "Deployment":
                        dep = self._get("Deployment", up["name"], ns)
                        if dep and ANNOTATION in (dep["metadata"].get("annotations") or {}):
                            return dep
                if ANNOTATION in (rs["metadata"].get("annotations") or {}):
                    return rs
            elif ref.get("kind") == "StatefulSet":
                sts = self._get("StatefulSet", ref["name"], ns)
                if sts and ANNOTATION in (sts["metadata"].get("annotations") or {}):
                    return sts
        return None

    def utilization(self, pod: dict[str, Any]) -> float | None:
        """Percent busy for this pod from its workload's load, or None if no load is set."""
        wl = self.workload(pod)
        if wl is None:
            return None
        try:
            load = parse_load(wl["metadata"]["annotations"][ANNOTATION])
        except LoadError:
            return None
        replicas = max(1, int((wl.get("status") or {}).get("readyReplicas") or 1))
        return min(100.0, load / replicas)
