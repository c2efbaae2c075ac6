"""kube-scheduler's configuration: the scheduler profiles every gpulab cluster runs, on both backends.

One kube-scheduler process runs several *profiles*; a pod picks one by its
``spec.schedulerName`` (``default-scheduler`` when it names none). Each profile
is the same scheduling framework with its own plugins and their arguments, so
two profiles decide differently on the same cluster without a second
scheduler. gpulab's clusters run two:

- ``default-scheduler``, exactly as Kubernetes ships it: NodeResourcesFit
  scores by ``LeastAllocated`` (over cpu and memory) and, with
  NodeResourcesBalancedAllocation and PodTopologySpread's system-default
  constraints, *spreads* pods over the nodes;
- ``gpu-binpack`` (:data:`BINPACK_PROFILE`): NodeResourcesFit scores by
  ``MostAllocated``, weighted towards ``nvidia.com/gpu``, so pods *pack* onto
  the nodes already most used and whole nodes stay free (for an 8-GPU job, or
  for a cluster autoscaler to remove). The two scorers that pull the other way
  are off in it: NodeResourcesBalancedAllocation, and the spreading
  PodTopologySpread adds by default to pods of a ReplicaSet, StatefulSet or
  Service (``defaultingType: List`` with no ``defaultConstraints``; a pod's own
  ``topologySpreadConstraints`` still hold).

The file is a ``KubeSchedulerConfiguration`` (``kubescheduler.config.k8s.io/v1``).
Given ``--config``, kube-scheduler ignores its deprecated flags (``--kubeconfig``,
``--kube-api-qps``, ``--kube-api-burst``; cmd/kube-scheduler/app/options), so the
client connection is here; ``--leader-elect`` and friends it still honours, and
the serving flags (``--bind-address``, ``--secure-port``, ``--authentication-kubeconfig``,
``--authorization-kubeconfig``) stay flags. The embedded backend passes the file
to its kube-scheduler process (:mod:`.embedded`); the kind backend mounts it into
the control-plane node and points kubeadm's static pod at it (:mod:`.kind`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .._fsutil import atomic_write_text

API_VERSION = "kubescheduler.config.k8s.io/v1"
KIND = "KubeSchedulerConfiguration"

DEFAULT_PROFILE = "default-scheduler"
BINPACK_PROFILE = "gpu-binpack"
PROFILES = (DEFAULT_PROFILE, BINPACK_PROFILE)

GPU_RESOURCE = "nvidia.com/gpu"
#: MostAllocated's weights in the bin-packing profile: a node's score is the weighted mean of how full it
#: would be in each resource, so the GPUs decide (validation allows 1..100) and cpu and memory only break ties.
BINPACK_WEIGHTS = ((GPU_RESOURCE, 10), ("cpu", 1), ("memory", 1))
#: Score plugins of the default set that prefer spreading, disabled in the bin-packing profile.
BINPACK_DISABLED = ("NodeResourcesBalancedAllocation",)

HEADER = ("# kube-scheduler's configuration, written by gpulab (gpulab/cluster/schedulerconfig.py) at every start.\n"
          "# A pod chooses a profile by spec.schedulerName: default-scheduler (Kubernetes' defaults, which spread)\n"
          f"# or {BINPACK_PROFILE} (MostAllocated over {GPU_RESOURCE}: packs pods, keeps whole nodes free).\n")


def binpack_profile() -> dict[str, Any]:
    """The bin-packing profile: MostAllocated over the GPUs (then cpu, memory); nothing that spreads."""
    return {
        "schedulerName": BINPACK_PROFILE,
        "plugins": {"multiPoint": {"disabled": [{"name": name} for name in BINPACK_DISABLED]}},
        "pluginConfig": [
            {"name": "NodeResourcesFit", "args": {"scoringStrategy": {
                "type": "MostAllocated",
                "resources": [{"name": name, "weight": weight} for name, weight in BINPACK_WEIGHTS],
            }}},
            # No cluster-level default constraints: the pods of one Deployment are not spread over the nodes
            # (the system default is a soft maxSkew 3 over hostnames and 5 over zones).
            {"name": "PodTopologySpread", "args": {"defaultingType": "List", "defaultConstraints": []}},
        ],
    }


def profiles() -> list[dict[str, Any]]:
    """Both profiles; the default one states its name only, so it is Kubernetes' default, whatever the version."""
    return [{"schedulerName": DEFAULT_PROFILE}, binpack_profile()]


def configuration(kubeconfig: str | Path, qps: int | None = None, burst: int | None = None,
                  leader_elect: bool = False) -> dict[str, Any]:
    """The whole KubeSchedulerConfiguration: its client connection (``qps``/``burst``: None keeps the
    defaults), leader election and :func:`profiles`."""
    client: dict[str, Any] = {"kubeconfig": str(kubeconfig)}
    if qps is not None:
        client["qps"] = qps
    if burst is not None:
        client["burst"] = burst
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "clientConnection": client,
        "leaderElection": {"leaderElect": leader_elect},
        "profiles": profiles(),
    }


def render(kubeconfig: str | Path, qps: int | None = None, burst: int | None = None,
           leader_elect: bool = False) -> str:
    """:func:`configuration` as the file's text."""
    return HEADER + yaml.safe_dump(configuration(kubeconfig, qps, burst, leader_elect), sort_keys=False)


def write(path: Path, kubeconfig: str | Path, qps: int | None = None, burst: int | None = None,
          leader_elect: bool = False) -> Path:
    """Write the configuration to ``path``; returns it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, render(kubeconfig, qps, burst, leader_elect))
    return path
