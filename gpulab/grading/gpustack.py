"""Grading labs that reconfigure the simulated GPU stack (device-plugin config, MIG layout).

Labs 04 and 06 change what the GPU node advertises: a time-slicing ConfigMap
in ``gpu-operator`` referenced by the ClusterPolicy and picked by the node
label ``nvidia.com/device-plugin.config``, a MIG layout chosen by the node
label ``nvidia.com/mig.config``, the ClusterPolicy's ``mig.strategy``. Their
check modules use :func:`make_hooks` for ``SETUP``/``TEARDOWN``
(:mod:`gpulab.grading.cluster`) and :func:`collect` for what the checks read:

- ``SETUP`` remembers the stack as found, puts it back as ``gpulab up``
  installs it (:func:`gpulab.cluster.baseline.installed_stack`, so a learner's
  earlier manual run cannot skew the graded one), waits until it has settled,
  and grants the submission's identity the ConfigMaps of ``gpu-operator`` and
  read access to node events in ``default``
  (:func:`gpulab.grading.cluster.grant` of ``STACK_GRANTS``);
- ``TEARDOWN`` deletes the submission's namespaces first (the MIG manager
  refuses to change a layout while pods use the GPUs, as the real one does),
  then puts the stack back exactly as found and waits until it has settled
  (:func:`gpulab.cluster.baseline.restore`). The sandbox's own restore of
  node labels runs after that, on a settled stack.

Before ``SETUP`` runs, the sandbox journals the stack as found
(:mod:`gpulab.grading.journal`; ``SETUP`` declares ``gpu-stack``), so a grader
killed mid-run has it put back by the next ``gpulab up``/``check``/``grade``.

Kubernetes does everything in between: the operator, device plugin, GFD and
MIG manager react to the restored objects as they react to a learner's.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpulab.cluster import baseline
from gpulab.kube import api
from gpulab.kube.names import CLUSTER_POLICY, OPERATOR_NAMESPACE

from .cluster import STACK_GRANTS, grant, learner_user, revoke
from .journal import declare

# What a learner's identity may do beyond its namespaces in these labs (CLUSTER_RULES).
CLUSTER_RULES = (
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch", "update"]},
    {"apiGroups": ["nvidia.com"], "resources": ["clusterpolicies"], "verbs": ["get", "list", "watch", "patch", "update"]},
)


def collect(client: api.Client) -> dict[str, list[dict[str, Any]]]:
    """The stack's objects a lab's checks read: the ClusterPolicy and the operator namespace's ConfigMaps."""
    found: dict[str, list[dict[str, Any]]] = {"ClusterPolicy": [], "ConfigMap": []}
    policy = client.get("ClusterPolicy", CLUSTER_POLICY)
    if policy is not None:
        found["ClusterPolicy"].append({**_strip(policy), "kind": "ClusterPolicy", "apiVersion": "nvidia.com/v1"})
    for cm in client.list("ConfigMap", OPERATOR_NAMESPACE):
        if cm["metadata"]["name"] != "kube-root-ca.crt":
            found["ConfigMap"].append({**_strip(cm), "kind": "ConfigMap", "apiVersion": "v1"})
    return found


def _strip(obj: Mapping[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(dict(obj))
    obj.get("metadata", {}).pop("managedFields", None)
    return obj


def make_hooks(namespaces: Sequence[str]) -> tuple[Callable[[Any], list[dict[str, Any]]], Callable[[Any], None]]:
    """``SETUP`` and ``TEARDOWN`` for a lab whose extra namespaces are ``namespaces`` (suffixes)."""
    found_by_run: dict[str, dict[str, Any]] = {}

    def names(env: Any) -> list[str]:
        return [env.namespace, *(f"{env.namespace}-{s}" for s in namespaces)]

    @declare("gpu-stack", "nodes")
    def setup(env: Any) -> list[dict[str, Any]]:
        client = env.client
        found = baseline.capture(client)
        found_by_run[env.namespace] = found
        start = baseline.installed_stack(found)
        if baseline.differs(client, start):
            baseline.restore(client, start)
        grant(client, env.namespace, learner_user(env.learner), STACK_GRANTS)
        return []

    def teardown(env: Any) -> None:
        client = env.client
        try:
            for ns in names(env):
                if client.delete("Namespace", ns):
                    for pod in client.list("Pod", ns):
                        client.delete("Pod", pod["metadata"]["name"], ns, grace_seconds=0)
            found = found_by_run.pop(env.namespace, None)
            if found is not None:
                baseline.restore(client, found)
        finally:
            revoke(client, env.namespace, STACK_GRANTS)

    return setup, teardown
