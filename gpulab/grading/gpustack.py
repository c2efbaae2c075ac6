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

Before ``SETUP`` runs, the sandbox journals the stack as found
(:mod:`gpulab.grading.journal`; ``SETUP`` declares ``gpu-stack``), so a grader
killed mid-run has it put back by the next ``gpulab up``/``check``/``grade``
with :func:`restore`. Labs that inject GPU faults (02, 08) take them back, and
wait for the stack to settle, with :func:`repair_faults`.

Every write here is a patch, a create or a delete, never a GET-then-PUT: the
operator writes the ClusterPolicy's status all the time, and a PUT carrying a
resourceVersion read a moment earlier fails with a Conflict.

Kubernetes does everything in between: the operator, device plugin, GFD and
MIG manager react to the restored objects as they react to a learner's.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import yaml

from gpulab import _poll, paths
from gpulab.kube import api
from gpulab.fakegpu import operator

from .checks import dig, quantity_int
from .journal import Restored, declare
from ..kube.names import OPERATOR_NAMESPACE

OPERATOR_NS = OPERATOR_NAMESPACE
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


def merge_patch(have: Mapping[str, Any], want: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns ``have`` into ``want``: ``{}`` when they are equal.

    A patch carries no resourceVersion, so it cannot lose a race with the
    operator's status writes the way a GET-then-PUT does (``Conflict: the
    object has been modified``); lists are replaced whole, as merge patches do.
    """
    patch: dict[str, Any] = {key: None for key in have if key not in want}
    for key, value in want.items():
        if key in have and isinstance(value, Mapping) and isinstance(have[key], Mapping):
            sub = merge_patch(have[key], value)
            if sub:
                patch[key] = sub
        elif key not in have or have[key] != value:
            patch[key] = copy.deepcopy(value)
    return patch


def put_policy_spec(client: api.Client, spec: Mapping[str, Any]) -> bool:
    """Make the ClusterPolicy's spec ``spec`` with a merge patch; False when there is none or nothing differs."""
    current = client.get("ClusterPolicy", POLICY)
    if current is None:
        return False
    patch = merge_patch(current.get("spec") or {}, spec)
    if not patch:
        return False
    client.patch("ClusterPolicy", POLICY, {"spec": patch})
    return True


LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def _restore_configmaps(client: api.Client, want: Mapping[str, Mapping[str, Any]]) -> list[Restored]:
    done = []
    have = _configmaps(client)
    for name in sorted(set(have) - set(want)):
        if client.delete("ConfigMap", name, OPERATOR_NS):
            done.append(Restored("configmap", f"{OPERATOR_NS}/{name}", "deleted"))
    for name, obj in want.items():
        if have.get(name) == obj:
            continue
        if name in have:
            # A merge patch, not GET-then-PUT: nothing to conflict with. What a PUT of the
            # captured object would drop (kubectl's last-applied record) goes too.
            patch = merge_patch(have[name], obj)
            current = client.get("ConfigMap", name, OPERATOR_NS) or {}
            if LAST_APPLIED in ((current.get("metadata") or {}).get("annotations") or {}):
                patch.setdefault("metadata", {}).setdefault("annotations", {})[LAST_APPLIED] = None
            client.patch("ConfigMap", name, patch, OPERATOR_NS)
        else:
            client.create(copy.deepcopy(dict(obj)))
        done.append(Restored("configmap", f"{OPERATOR_NS}/{name}", "restored"))
    return done


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


def restore(client: api.Client, state: Mapping[str, Any], timeout: float = SETTLE_TIMEOUT) -> list[Restored]:
    """Put the ClusterPolicy spec, the operator's ConfigMaps and the stack's node labels back; wait until settled."""
    done = []
    _wait(lambda: not _gpu_pods(client), timeout, f"GPU pods to go ({', '.join(_gpu_pods(client))})")
    if put_policy_spec(client, state["policy"]):
        done.append(Restored("clusterpolicy", POLICY, "restored"))
    done += _restore_configmaps(client, state["configmaps"])
    for name, want in state["nodes"].items():
        node = client.get("Node", name)
        if node is None:
            continue
        labels = node["metadata"].get("labels") or {}
        patch = {k: v for k, v in want["labels"].items() if labels.get(k) != v}
        if patch:
            done += [Restored("label", name, "removed", k) if v is None else Restored("label", name, "restored",
                                                                                        f"{k}={v}")
                     for k, v in patch.items()]
            if MIG_CONFIG in patch:
                patch[MIG_STATE] = None  # the MIG manager answers the change afresh
            client.patch("Node", name, {"metadata": {"labels": patch}})
    _wait(lambda: _settled(client, state["nodes"]), timeout,
          "the GPU nodes to advertise the resources they had before the submission")
    return done


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


def gpu_nodes(cluster_root: Any) -> dict[str, int] | None:
    """GPU node name -> card count from the cluster's topology; None when its GPUs are not simulated hosts (kind)."""
    from pathlib import Path

    from gpulab.cluster.embedded import EmbeddedCluster

    if cluster_root is None or not (Path(cluster_root) / "nodes").is_dir():
        return None
    return {n.name: n.gpu_count for n in EmbeddedCluster(Path(cluster_root)).topology().gpu_nodes}


def crashed(pod: Mapping[str, Any] | None) -> bool:
    """Every container of ``pod`` is not ready and has restarted: crash-looping (or waiting out its back-off)."""
    statuses = dig(pod, "status", "containerStatuses", default=[]) or []
    return bool(statuses) and all(not s.get("ready") and (s.get("restartCount") or 0) >= 1 for s in statuses)


def resources_whole(client: api.Client, nodes: Mapping[str, int]) -> bool:
    """Every GPU resource a device plugin advertises on ``nodes`` has all its devices healthy.

    A resource no plugin advertises any more (after MIG or a renamed time-slicing
    resource) keeps its capacity at allocatable 0 for the kubelet's 5-minute stop
    grace period; it is left out. One resource must have cards.
    """
    for name in nodes:
        status = (client.get("Node", name) or {}).get("status") or {}
        cap, alloc = status.get("capacity") or {}, status.get("allocatable") or {}
        live = {k: quantity_int(v) or 0 for k, v in alloc.items() if k.startswith("nvidia.com/")}
        live = {k: n for k, n in live.items() if n > 0}
        if not live or any(quantity_int(cap.get(k)) != n for k, n in live.items()):
            return False
    return True


def repair_faults(client: api.Client, cluster_root: Any, nodes: Mapping[str, int],
                  want: Mapping[str, Any] | None = None, timeout: float = SETTLE_TIMEOUT,
                  settle_unchanged: bool = True) -> list[Restored]:
    """The GPU nodes' faults as ``want`` (a :func:`faults.snapshot`; default none), the stack settled again.

    Once the node agent applies the change, crashed operands are replaced (a
    crash-looping pod waits out its back-off; a deleted one comes back at once)
    and, unless faults stay on purpose, every card must be allocatable and the
    stack ready. ``settle_unchanged=False`` skips that wait when no fault changed.
    """
    from gpulab.fakegpu import faults

    changed = faults.put_back(cluster_root, dict(want or {}), sorted(nodes))
    for name in sorted({n for n, _, _ in changed}):
        faults.wait_applied(cluster_root, name, timeout=15)
    done = [Restored("fault", n, action, f.describe()) for n, action, f in changed]
    if any(faults.load(cluster_root, n).faults for n in nodes) or not (changed or settle_unchanged):
        return done
    for pod in client.list("Pod", OPERATOR_NS):
        if dig(pod, "spec", "nodeName") in nodes and crashed(pod):
            client.delete("Pod", pod["metadata"]["name"], OPERATOR_NS, grace_seconds=0)
    _wait(lambda: resources_whole(client, nodes), timeout, "every GPU allocatable again")
    _poll.until(lambda: operator.stack_ready(client) is None, timeout, lambda _: StackError(
        f"timed out after {timeout:.0f}s waiting for the GPU stack to be ready again "
        f"(still: {operator.stack_ready(client)})"), max_interval=0.5)
    return done


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

    @declare("gpu-stack", "nodes")
    def setup(env: Any) -> list[dict[str, Any]]:
        from gpulab.grading.cluster import learner_user

        client = env.client
        found = capture(client)
        found_by_run[env.namespace] = found
        start = baseline(client, found)
        if differs(client, start):
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


def differs(client: api.Client, want: Mapping[str, Any]) -> bool:
    """The stack's policy, ConfigMaps or node labels are not as in ``want`` (a :func:`capture`)."""
    now = capture(client)
    if now["policy"] != want["policy"] or now["configmaps"] != want["configmaps"]:
        return True
    return any(now["nodes"].get(n, {}).get("labels") != v["labels"] for n, v in want["nodes"].items())
