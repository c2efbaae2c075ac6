"""Grading labs that reconfigure the simulated GPU stack (device-plugin config, MIG layout).

Labs 04 and 06 change what the GPU node advertises: a time-slicing ConfigMap
in ``gpu-operator`` referenced by the ClusterPolicy and picked by the node
label ``nvidia.com/device-plugin.config``, a MIG layout chosen by the node
label ``nvidia.com/mig.config``, the ClusterPolicy's ``mig.strategy``. Their
check modules use :func:`make_hooks` for ``SETUP``/``TEARDOWN``
(:mod:`gpulab.grading.cluster`):

- ``SETUP`` remembers the stack as found, puts the parts the lab changes back
  to how ``gpulab up`` installs them (so a learner's earlier manual run cannot
  skew the graded one), waits until the node advertises plain GPUs again, and
  grants the submission's identity the ConfigMaps of ``gpu-operator`` and
  read access to node events in ``default`` (a Role and RoleBinding in each,
  never a cluster-wide grant; stale ones of an interrupted grader go first);
- ``TEARDOWN`` deletes the submission's namespaces first (the MIG manager
  refuses to change a layout while pods use the GPUs, as the real one does),
  restores the ClusterPolicy's spec, the operator namespace's ConfigMaps and
  the two node labels exactly as found, and waits until every node
  advertises the ``nvidia.com/*`` resources it had before. The sandbox's own
  restore of node labels runs after that, on a settled stack.

Kubernetes does everything in between: the operator, device plugin, GFD and
MIG manager react to the restored objects as they react to a learner's.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import yaml

from gpulab import _poll, paths
from gpulab.cluster import api
from gpulab.fakegpu import operator

OPERATOR_NS = "gpu-operator"
POLICY = "cluster-policy"
CONFIG_LABEL = "nvidia.com/device-plugin.config"
MIG_CONFIG = "nvidia.com/mig.config"
MIG_STATE = "nvidia.com/mig.config.state"
STACK_LABELS = (CONFIG_LABEL, MIG_CONFIG)
GRANT_LABEL = "gpulab.io/grading"
GRANT_PREFIX = "gpulab:grading:"
CONFIGMAP_VERBS = ["get", "list", "watch", "create", "update", "patch", "delete"]
SETTLE_TIMEOUT = 90.0

# What a learner's identity may do beyond its namespaces in these labs (CLUSTER_RULES).
CLUSTER_RULES = (
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch", "update"]},
    {"apiGroups": ["nvidia.com"], "resources": ["clusterpolicies"], "verbs": ["get", "list", "watch", "patch", "update"]},
)


class StackError(RuntimeError):
    """The GPU stack did not settle (the grader's problem, never the learner's)."""


def _wait(fn: Callable[[], Any], timeout: float, what: str) -> Any:
    return _poll.until(fn, timeout, lambda _: StackError(f"timed out after {timeout:.0f}s waiting for {what}"),
                       max_interval=0.5)


def gpu_resources(node: Mapping[str, Any]) -> dict[str, str]:
    """The ``nvidia.com/*`` entries of a node's allocatable that are not 0.

    Like the kubelet, the node side keeps a resource whose plugin stopped
    advertising it at 0 (MIG instances after MIG is turned off): no difference.
    """
    alloc = (node.get("status") or {}).get("allocatable") or {}
    return {k: str(v) for k, v in alloc.items() if k.startswith("nvidia.com/") and str(v) != "0"}


def installed_policy_spec() -> dict[str, Any]:
    doc = yaml.safe_load((paths.manifests() / "gpu-operator" / "30-cluster-policy.yaml").read_text(encoding="utf-8"))
    return doc["spec"]


def _clean_configmap(cm: Mapping[str, Any]) -> dict[str, Any]:
    meta = cm.get("metadata") or {}
    keep = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {k: meta[k] for k in ("name", "namespace", "labels") if meta.get(k)}}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                   if k != "kubectl.kubernetes.io/last-applied-configuration"}
    if annotations:
        keep["metadata"]["annotations"] = annotations
    for key in ("data", "binaryData"):
        if cm.get(key):
            keep[key] = dict(cm[key])
    return keep


def _configmaps(client: api.Client) -> dict[str, dict[str, Any]]:
    # kube-root-ca.crt belongs to its controller; nothing a lab touches.
    return {cm["metadata"]["name"]: _clean_configmap(cm) for cm in client.list("ConfigMap", OPERATOR_NS)
            if cm["metadata"]["name"] != "kube-root-ca.crt" and not cm["metadata"].get("ownerReferences")}


def capture(client: api.Client) -> dict[str, Any]:
    policy = client.get("ClusterPolicy", POLICY) or {}
    nodes = {}
    for node in client.list("Node"):
        labels = node["metadata"].get("labels") or {}
        nodes[node["metadata"]["name"]] = {"labels": {k: labels.get(k) for k in STACK_LABELS},
                                           "resources": gpu_resources(node)}
    return {"policy": copy.deepcopy(policy.get("spec") or {}), "configmaps": _configmaps(client), "nodes": nodes}


def _put_policy(client: api.Client, spec: Mapping[str, Any]) -> bool:
    current = client.get("ClusterPolicy", POLICY)
    if current is None or current.get("spec") == spec:
        return False
    current["spec"] = copy.deepcopy(dict(spec))
    client.request("PUT", client.path("ClusterPolicy", POLICY), current)
    return True


def _restore_configmaps(client: api.Client, want: Mapping[str, Mapping[str, Any]]) -> None:
    have = _configmaps(client)
    for name in sorted(set(have) - set(want)):
        client.delete("ConfigMap", name, OPERATOR_NS)
    for name, obj in want.items():
        if have.get(name) == obj:
            continue
        if name in have:
            current = client.get("ConfigMap", name, OPERATOR_NS)
            body = copy.deepcopy(dict(obj))
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            client.request("PUT", client.path("ConfigMap", name, OPERATOR_NS), body)
        else:
            client.create(copy.deepcopy(dict(obj)))


def _gpu_pods(client: api.Client) -> list[str]:
    """Pods outside the operator's namespace that still hold GPU devices (the MIG manager's 'in use')."""
    held = []
    for pod in client.list("Pod"):
        meta = pod["metadata"]
        if meta["namespace"] == OPERATOR_NS or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        if (meta.get("annotations") or {}).get("gpulab.io/allocated-devices"):
            held.append(f"{meta['namespace']}/{meta['name']}")
    return held


def _settled(client: api.Client, nodes: Mapping[str, Mapping[str, Any]]) -> bool:
    for node in client.list("Node"):
        want = nodes.get(node["metadata"]["name"])
        if want is None:
            continue
        labels = node["metadata"].get("labels") or {}
        have = gpu_resources(node)
        if want["resources"] is None:  # the installed baseline: whole GPUs, nothing shared or sliced
            if any(k.startswith("nvidia.com/mig-") for k in have) or \
                    labels.get("nvidia.com/gpu.sharing-strategy", "none") != "none":
                return False
        elif have != want["resources"]:
            return False
        if labels.get(MIG_CONFIG) and labels.get(MIG_STATE) not in ("success", "failed"):
            return False
    return operator.stack_ready(client) is None


def restore(client: api.Client, state: Mapping[str, Any], timeout: float = SETTLE_TIMEOUT) -> None:
    """Put the ClusterPolicy spec, the operator's ConfigMaps and the stack's node labels back; wait until settled."""
    _wait(lambda: not _gpu_pods(client), timeout, f"GPU pods to go ({', '.join(_gpu_pods(client))})")
    _put_policy(client, state["policy"])
    _restore_configmaps(client, state["configmaps"])
    for name, want in state["nodes"].items():
        node = client.get("Node", name)
        if node is None:
            continue
        labels = node["metadata"].get("labels") or {}
        patch = {k: v for k, v in want["labels"].items() if labels.get(k) != v}
        if patch:
            if MIG_CONFIG in patch:
                patch[MIG_STATE] = None  # the MIG manager answers the change afresh
            client.patch("Node", name, {"metadata": {"labels": patch}})
    _wait(lambda: _settled(client, state["nodes"]), timeout,
          "the GPU nodes to advertise the resources they had before the submission")


def baseline(client: api.Client, found: Mapping[str, Any]) -> dict[str, Any]:
    """``found`` with the parts a lab changes as ``gpulab up`` installs them: no device-plugin config, MIG off."""
    installed = installed_policy_spec()
    spec = copy.deepcopy(dict(found["policy"]))
    spec.setdefault("devicePlugin", {})["config"] = copy.deepcopy(installed["devicePlugin"].get("config") or {})
    spec.setdefault("mig", {})["strategy"] = installed.get("mig", {}).get("strategy", "single")
    nodes = {}
    for name, node in found["nodes"].items():
        labels = dict(node["labels"])
        labels[CONFIG_LABEL] = None
        if labels.get(MIG_CONFIG):
            labels[MIG_CONFIG] = "all-disabled"
        nodes[name] = {"labels": labels, "resources": None}
    return {"policy": spec, "configmaps": found["configmaps"], "nodes": nodes}


def _grant_name(namespace: str) -> str:
    return f"{GRANT_PREFIX}{namespace}"


# Node events (DevicePluginConfigInvalid, MigConfigFailed) are in "default"; the learner may read them.
GRANTS = {OPERATOR_NS: [{"apiGroups": [""], "resources": ["configmaps"], "verbs": CONFIGMAP_VERBS}],
          "default": [{"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list", "watch"]}]}


def grant_configmaps(client: api.Client, namespace: str, user: str) -> None:
    """Let ``user`` manage ConfigMaps in the operator's namespace and read node events (only there)."""
    name = _grant_name(namespace)
    for ns, rules in GRANTS.items():
        for kind in ("RoleBinding", "Role"):  # leftovers of an interrupted grader
            for obj in client.list(kind, ns, label_selector=f"{GRANT_LABEL}=true"):
                client.delete(kind, obj["metadata"]["name"], ns)
        client.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                       "metadata": {"name": name, "namespace": ns, "labels": {GRANT_LABEL: "true"}},
                       "rules": rules})
        client.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                       "metadata": {"name": name, "namespace": ns, "labels": {GRANT_LABEL: "true"}},
                       "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                       "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})


def revoke_configmaps(client: api.Client, namespace: str) -> None:
    for ns in GRANTS:
        for kind in ("RoleBinding", "Role"):
            client.delete(kind, _grant_name(namespace), ns)


def collect(client: api.Client) -> dict[str, list[dict[str, Any]]]:
    """The stack's objects a lab's checks read: the ClusterPolicy and the operator namespace's ConfigMaps."""
    found: dict[str, list[dict[str, Any]]] = {"ClusterPolicy": [], "ConfigMap": []}
    policy = client.get("ClusterPolicy", POLICY)
    if policy is not None:
        found["ClusterPolicy"].append({**_strip(policy), "kind": "ClusterPolicy", "apiVersion": "nvidia.com/v1"})
    for cm in client.list("ConfigMap", OPERATOR_NS):
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

    def setup(env: Any) -> list[dict[str, Any]]:
        from gpulab.grading.cluster import learner_user

        client = env.client
        found = capture(client)
        found_by_run[env.namespace] = found
        start = baseline(client, found)
        if _differs(client, start):
            restore(client, start)
        grant_configmaps(client, env.namespace, learner_user(env.learner))
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
                restore(client, found)
        finally:
            revoke_configmaps(client, env.namespace)

    return setup, teardown


def _differs(client: api.Client, want: Mapping[str, Any]) -> bool:
    now = capture(client)
    if now["policy"] != want["policy"] or now["configmaps"] != want["configmaps"]:
        return True
    return any(now["nodes"].get(n, {}).get("labels") != v["labels"] for n, v in want["nodes"].items())
