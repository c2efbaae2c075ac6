"""The cluster as ``gpulab up`` installs it, and the one way back to it.

Lessons, labs and graders change cluster-wide things: GPU faults on the
simulated hosts, the GPU Operator's ClusterPolicy and its ConfigMaps, the
node labels that pick a device-plugin config or a MIG layout, node labels and
taints, PriorityClasses. This module is the only place that knows

- what of that the installed cluster has (:func:`installed_stack`,
  :func:`topology_baseline`), and how to take a snapshot of it as it is
  (:func:`capture`, :meth:`ClusterState.capture`, :func:`gpu_nodes`);
- how to put each part back (:func:`restore`, :func:`repair_faults`,
  :func:`node_keys_back`, :meth:`ClusterState.restore`, an add-on's
  configuration with :func:`addon_back`), every change
  reported as one :class:`Restored` (English for the CLI, zh-CN for notebooks);
- when the GPU stack is **settled** (:func:`unsettled`): every GPU node
  advertises what it should with all its devices healthy, no MIG change is
  in flight, and every operand DaemonSet of the ClusterPolicy's current spec
  is ready on exactly the nodes its selector matches
  (:func:`gpulab.fakegpu.operator.stack_ready`: counted from the nodes'
  labels too, since right after a MIG change the DaemonSet controller's
  status lags behind the labels that bring paused operands back) — for a
  second in a row (:data:`SETTLE_HOLD`).

A lesson's ``reset`` (:mod:`gpulab.notebook`), a grader's ``SETUP``/``TEARDOWN``
(:mod:`gpulab.grading.gpustack`, lab 02 and 08's fault fixtures) and the
recovery of a killed grader's journal (:mod:`gpulab.grading.journal`) all use
these functions.

Every write is a patch, a create or a delete, never a GET-then-PUT: the
operator writes the ClusterPolicy's status all the time, and a PUT carrying a
resourceVersion read a moment earlier fails with a Conflict. A patch that
replaces a whole list (taints) carries the resourceVersion it was computed from
and is retried on a Conflict.
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .. import _poll
from ..i18n import N_, _
from ..fakegpu import faults, operator
from ..fakegpu.mig import PAUSED_FOR_MIG_CHANGE
from ..kube import api
from ..kube.names import (
    ALLOCATED_DEVICES_ANNOTATION,
    CLUSTER_POLICY,
    MIG_CONFIG_LABEL,
    MIG_CONFIG_STATE_LABEL,
    NODE_ANNOTATION,
    OPERATOR_NAMESPACE,
)
from ..kube.names import DEVICE_PLUGIN_CONFIG_LABEL as CONFIG_LABEL
from . import addons
from . import nodes as node_objects
from .base import Cluster, Say

POLICY = CLUSTER_POLICY
STACK_LABELS = (CONFIG_LABEL, MIG_CONFIG_LABEL)
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
SETTLE_TIMEOUT = 90.0
# How long the stack must stay settled to count. The settled state tells every change apart (what each node
# advertises, each operand DaemonSet's spec hash, its pods ready on the nodes its selector matches, even while
# its status lags behind a MIG change's labels): long enough to see it stay so.
SETTLE_HOLD = 1.0
# A node's "resources" in a stack state: None = as installed (whole cards, nothing shared or
# sliced); ANY = whatever the config says, as long as every device is healthy; a dict = exactly these.
ANY = "any"


class StackError(RuntimeError):
    """The GPU stack did not settle (the grader's or the lesson library's problem, never the learner's)."""


# --------------------------------------------------------------------------- what was put back


# (what, action) -> what a person is told, marked for the catalog (gpulab/i18n.py); {subject} is a node or
# object name, {detail} a key, value or fault, {value} what a label or annotation was set back to.
_TEXT = {
    ("namespace", "deleted"): N_("namespace {subject} deleted"),
    ("grant", "deleted"): N_("{detail} {subject} deleted"),
    ("fault", "cleared"): N_("{subject}: fault {detail} cleared"),
    ("fault", "set"): N_("{subject}: fault {detail} set again (it was there before)"),
    ("label", "restored"): N_("{subject}: label {detail}={value} restored"),
    ("label", "removed"): N_("{subject}: label {detail} removed"),
    ("annotation", "restored"): N_("{subject}: annotation {detail}={value} restored"),
    ("annotation", "removed"): N_("{subject}: annotation {detail} removed"),
    ("taint", "removed"): N_("{subject}: taint {detail} removed"),
    ("taint", "added"): N_("{subject}: taint {detail} put back"),
    ("unschedulable", "cordoned"): N_("{subject}: cordoned again (as before)"),
    ("unschedulable", "uncordoned"): N_("{subject}: uncordoned"),
    ("priorityclass", "deleted"): N_("PriorityClass {subject} deleted"),
    ("priorityclass", "restored"): N_("PriorityClass {subject} restored"),
    ("clusterpolicy", "restored"): N_("ClusterPolicy {subject}: spec restored"),
    ("clusterpolicy", "installed"): N_("ClusterPolicy {subject}: spec as installed"),
    ("configmap", "deleted"): N_("ConfigMap {subject} deleted"),
    ("configmap", "restored"): N_("ConfigMap {subject} restored"),
    ("configmap", "installed"): N_("ConfigMap {subject} as installed (add-on {detail}); its program reloaded or restarted"),
}
_UNNAMED = N_("{subject}: {what} {detail} {action}")


@dataclass(frozen=True)
class Restored:
    """One thing put back: ``what`` (label, taint, fault …) of ``subject`` (a node, an object), ``action`` taken."""

    what: str
    subject: str
    action: str
    detail: str = ""
    value: str = ""  # what a label or annotation was set back to

    def text(self) -> str:
        """What was put back, in the user's language (Chinese in a lesson)."""
        said = _(_TEXT.get((self.what, self.action), _UNNAMED), subject=self.subject, detail=self.detail,
                 value=self.value, what=self.what, action=self.action)
        return " ".join(said.split())


def _key_changes(what: str, subject: str, patch: Mapping[str, str | None]) -> list[Restored]:
    """One Restored per key of a label or annotation merge patch (None: removed)."""
    return [Restored(what, subject, "removed", k) if v is None else Restored(what, subject, "restored", k, v)
            for k, v in patch.items()]


def taint_text(taint: Mapping[str, Any]) -> str:
    """``key=value:Effect`` as kubectl writes a taint."""
    value = f"={taint['value']}" if taint.get("value") else ""
    return f"{taint.get('key')}{value}:{taint.get('effect')}"


def _wait(fn: Callable[[], Any], timeout: float, what: str) -> Any:
    return _poll.until(fn, timeout, lambda last: StackError(f"timed out after {timeout:.0f}s waiting for {what}"),
                       max_interval=0.5)


def _count(value: Any) -> int:
    """A resource quantity that counts devices (``"2"``); anything else counts as 0."""
    text = str(value).strip() if value is not None else ""
    return int(text) if re.fullmatch(r"\d+", text) else 0


# --------------------------------------------------------------------------- the GPU stack


def gpu_resources(node: Mapping[str, Any]) -> dict[str, str]:
    """The ``nvidia.com/*`` entries of a node's allocatable that are not 0.

    Like the kubelet, the node side keeps a resource whose plugin stopped
    advertising it at 0 (MIG instances after MIG is turned off): no difference.
    """
    alloc = (node.get("status") or {}).get("allocatable") or {}
    return {k: str(v) for k, v in alloc.items() if k.startswith("nvidia.com/") and str(v) != "0"}


def installed_policy_spec() -> dict[str, Any]:
    """The ClusterPolicy's spec as ``gpulab up`` applies it."""
    doc = yaml.safe_load((operator.manifests_dir() / "30-cluster-policy.yaml").read_text(encoding="utf-8"))
    return doc["spec"]


def _clean_configmap(cm: Mapping[str, Any]) -> dict[str, Any]:
    meta = cm.get("metadata") or {}
    keep = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {k: meta[k] for k in ("name", "namespace", "labels") if meta.get(k)}}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != LAST_APPLIED}
    if annotations:
        keep["metadata"]["annotations"] = annotations
    for key in ("data", "binaryData"):
        if cm.get(key):
            keep[key] = dict(cm[key])
    return keep


def _configmaps(client: api.Client) -> dict[str, dict[str, Any]]:
    # kube-root-ca.crt belongs to its controller; nothing a lab touches.
    return {cm["metadata"]["name"]: _clean_configmap(cm) for cm in client.list("ConfigMap", OPERATOR_NAMESPACE)
            if cm["metadata"]["name"] != "kube-root-ca.crt" and not cm["metadata"].get("ownerReferences")}


def capture(client: api.Client) -> dict[str, Any]:
    """The GPU stack as it is: ClusterPolicy spec, the operator namespace's ConfigMaps, per node its stack labels
    and advertised GPU resources (JSON-serialisable: a grader's journal keeps it)."""
    policy = client.get("ClusterPolicy", POLICY) or {}
    found = {}
    for node in client.list("Node"):
        labels = node["metadata"].get("labels") or {}
        found[node["metadata"]["name"]] = {"labels": {k: labels.get(k) for k in STACK_LABELS},
                                           "resources": gpu_resources(node)}
    return {"policy": copy.deepcopy(policy.get("spec") or {}), "configmaps": _configmaps(client), "nodes": found}


def installed_stack(found: Mapping[str, Any]) -> dict[str, Any]:
    """``found`` (a :func:`capture`) with what lessons and labs change as ``gpulab up`` installs it.

    The ClusterPolicy's whole spec as installed; no device-plugin config label;
    a MIG layout label back to the policy's default (``all-disabled``); whole
    cards advertised. ConfigMaps are kept as found (a lesson deletes its own).
    """
    spec = installed_policy_spec()
    mig_default = str(((spec.get("migManager") or {}).get("config") or {}).get("default") or "all-disabled")
    nodes = {}
    for name, node in found["nodes"].items():
        labels = dict(node["labels"])
        labels[CONFIG_LABEL] = None
        if labels.get(MIG_CONFIG_LABEL):
            labels[MIG_CONFIG_LABEL] = mig_default
        nodes[name] = {"labels": labels, "resources": None}
    return {"policy": spec, "configmaps": found["configmaps"], "nodes": nodes, "installed": True}


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


def _restore_configmaps(client: api.Client, want: Mapping[str, Mapping[str, Any]]) -> list[Restored]:
    done = []
    have = _configmaps(client)
    for name in sorted(set(have) - set(want)):
        if client.delete("ConfigMap", name, OPERATOR_NAMESPACE):
            done.append(Restored("configmap", f"{OPERATOR_NAMESPACE}/{name}", "deleted"))
    for name, obj in want.items():
        if have.get(name) == obj:
            continue
        if name in have:
            # A merge patch, not GET-then-PUT: nothing to conflict with. What a PUT of the
            # captured object would drop (kubectl's last-applied record) goes too.
            patch = merge_patch(have[name], obj)
            current = client.get("ConfigMap", name, OPERATOR_NAMESPACE) or {}
            if LAST_APPLIED in ((current.get("metadata") or {}).get("annotations") or {}):
                patch.setdefault("metadata", {}).setdefault("annotations", {})[LAST_APPLIED] = None
            client.patch("ConfigMap", name, patch, OPERATOR_NAMESPACE)
        else:
            client.create(copy.deepcopy(dict(obj)))
        done.append(Restored("configmap", f"{OPERATOR_NAMESPACE}/{name}", "restored"))
    return done


def gpu_pods(client: api.Client) -> list[str]:
    """Pods outside the operator's namespace that still hold GPU devices (the MIG manager's 'in use')."""
    held = []
    for pod in client.list("Pod"):
        meta = pod["metadata"]
        if meta["namespace"] == OPERATOR_NAMESPACE or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        if (meta.get("annotations") or {}).get(ALLOCATED_DEVICES_ANNOTATION):
            held.append(f"{meta['namespace']}/{meta['name']}")
    return held


def devices_healthy(node: Mapping[str, Any]) -> bool:
    """Every GPU resource a device plugin advertises on ``node`` has all its devices healthy.

    A resource no plugin advertises any more (after MIG or a renamed time-slicing
    resource) keeps its capacity at allocatable 0 for the kubelet's 5-minute stop
    grace period; it is left out. One resource must have devices.
    """
    status = node.get("status") or {}
    cap, alloc = status.get("capacity") or {}, status.get("allocatable") or {}
    live = {k: _count(v) for k, v in alloc.items() if k.startswith("nvidia.com/")}
    live = {k: n for k, n in live.items() if n > 0}
    return bool(live) and all(_count(cap.get(k)) == n for k, n in live.items())


def _node_unsettled(node: Mapping[str, Any], want: Mapping[str, Any]) -> str | None:
    name = node["metadata"]["name"]
    labels = node["metadata"].get("labels") or {}
    if labels.get(MIG_CONFIG_LABEL) and labels.get(MIG_CONFIG_STATE_LABEL) not in ("success", "failed"):
        return f"node/{name}: the MIG manager is applying {labels[MIG_CONFIG_LABEL]}"
    if PAUSED_FOR_MIG_CHANGE in labels.values():
        return f"node/{name}: operands paused for a MIG change"
    resources = want.get("resources")
    if isinstance(resources, Mapping):  # exactly what it had
        have = gpu_resources(node)
        return None if have == dict(resources) else f"node/{name}: advertises {have}, not {dict(resources)}"
    capacity = (node.get("status") or {}).get("capacity") or {}
    has_gpus = any(k.startswith("nvidia.com/") and _count(v) > 0 for k, v in capacity.items())
    if (has_gpus or want.get("gpus")) and not devices_healthy(node):
        return f"node/{name}: not every GPU device is allocatable"
    if resources is None:  # as installed: whole cards, nothing shared or sliced
        have = gpu_resources(node)
        if any(k.startswith("nvidia.com/mig-") for k in have):
            return f"node/{name}: still advertises MIG devices"
        if labels.get("nvidia.com/gpu.sharing-strategy", "none") != "none":
            return f"node/{name}: GPUs still shared ({labels['nvidia.com/gpu.sharing-strategy']})"
        gpus = want.get("gpus")
        if gpus is not None and _count(have.get("nvidia.com/gpu")) != gpus:
            return f"node/{name}: {have.get('nvidia.com/gpu', 0)} of {gpus} GPUs allocatable"
    return None


def unsettled(client: api.Client, nodes: Mapping[str, Mapping[str, Any]]) -> str | None:
    """None when the GPU stack is settled for ``nodes`` (name → {"resources": None | ANY | dict, "gpus": n});
    else what it still waits for. See the module docstring."""
    for node in client.list("Node"):
        want = nodes.get(node["metadata"]["name"])
        if want is not None and (why := _node_unsettled(node, want)):
            return why
    return operator.stack_ready(client)


def wait_settled(client: api.Client, nodes: Mapping[str, Mapping[str, Any]], timeout: float = SETTLE_TIMEOUT,
                 hold: float = SETTLE_HOLD, what: str = "the GPU stack to settle") -> None:
    """Wait until :func:`unsettled` has been None for ``hold`` seconds in a row (at most a third of ``timeout``);
    :class:`StackError` after ``timeout``."""
    hold = min(hold, timeout / 3)
    since: float | None = None
    last: list[str | None] = [None]

    def settled_for_a_while() -> bool:
        nonlocal since
        last[0] = unsettled(client, nodes)
        if last[0] is not None:
            since = None
            return False
        if since is None:
            since = time.monotonic()
        return time.monotonic() - since >= hold

    _poll.until(settled_for_a_while, timeout, lambda last: StackError(
        f"timed out after {timeout:.0f}s waiting for {what} (still: {last[0]})"), max_interval=0.5)


def restore(client: api.Client, state: Mapping[str, Any], timeout: float = SETTLE_TIMEOUT) -> list[Restored]:
    """Make the GPU stack ``state`` (a :func:`capture` or :func:`installed_stack`) and wait until it has settled.

    It first waits until no pod holds GPUs (the MIG manager refuses to change a
    layout in use, as the real one does).
    """
    _wait(lambda: not gpu_pods(client), timeout, f"GPU pods to go ({', '.join(gpu_pods(client))})")
    done = put_back(client, state)
    wait_settled(client, state["nodes"], timeout,
                 what="the GPU nodes to advertise what they should and the stack to be ready")
    return done


def put_back(client: api.Client, state: Mapping[str, Any]) -> list[Restored]:
    """Write the GPU stack ``state``: ClusterPolicy spec, the operator's ConfigMaps, the nodes' stack labels.

    Only the writes; :func:`wait_settled` waits for the stack to follow.
    """
    done = []
    if put_policy_spec(client, state["policy"]):
        done.append(Restored("clusterpolicy", POLICY, "installed" if state.get("installed") else "restored"))
    done += _restore_configmaps(client, state["configmaps"])
    for name, want in state["nodes"].items():
        node = client.get("Node", name)
        if node is None:
            continue
        labels = node["metadata"].get("labels") or {}
        patch = {k: v for k, v in want["labels"].items() if labels.get(k) != v}
        if patch:
            done += _key_changes("label", name, patch)
            if MIG_CONFIG_LABEL in patch:
                patch[MIG_CONFIG_STATE_LABEL] = None  # the MIG manager answers the change afresh
            client.patch("Node", name, {"metadata": {"labels": patch}})
    return done


def differs(client: api.Client, want: Mapping[str, Any]) -> bool:
    """The stack's policy, ConfigMaps or node labels are not as in ``want`` (a :func:`capture`)."""
    now = capture(client)
    if now["policy"] != want["policy"] or now["configmaps"] != want["configmaps"]:
        return True
    return any(now["nodes"].get(n, {}).get("labels") != v["labels"] for n, v in want["nodes"].items())


# --------------------------------------------------------------------------- GPU faults


def gpu_nodes(cluster_root: Any) -> dict[str, int] | None:
    """GPU node name -> card count from the cluster's topology; None when its GPUs are not simulated hosts (kind)."""
    # The embedded backend (and the pod runtime it loads) only where its cluster is asked about.
    from .embedded import EmbeddedCluster

    if cluster_root is None or not (Path(cluster_root) / "nodes").is_dir():
        return None
    return {n.name: n.gpu_count for n in EmbeddedCluster(Path(cluster_root)).topology().gpu_nodes}


def crashed(pod: Mapping[str, Any] | None) -> bool:
    """Every container of ``pod`` is not ready and has restarted: crash-looping (or waiting out its back-off)."""
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or []
    return bool(statuses) and all(not s.get("ready") and (s.get("restartCount") or 0) >= 1 for s in statuses)


def resources_whole(client: api.Client, nodes: Iterable[str]) -> bool:
    """:func:`devices_healthy` on every one of ``nodes``."""
    return all(devices_healthy(client.get("Node", name) or {}) for name in nodes)


def put_faults_back(cluster_root: Any, nodes: Iterable[str], want: Mapping[str, Any] | None = None) -> list[Restored]:
    """The GPU nodes' faults as ``want`` (a :func:`faults.snapshot`; default none), once the node agent applied them."""
    changed = faults.put_back(cluster_root, dict(want or {}), sorted(nodes))
    for name in sorted({n for n, *_rest in changed}):
        faults.wait_applied(cluster_root, name, timeout=15)
    return [Restored("fault", n, action, f.describe()) for n, action, f in changed]


def restart_stuck_operands(client: api.Client, nodes: Iterable[str] | None = None, only_crashed: bool = True) -> None:
    """Delete the operator's DaemonSet pods (on ``nodes``, default all) that crash-loop — or, without
    ``only_crashed``, that are not Ready and not done (stuck in validation) — so they start over at once,
    as ``kubectl delete pod`` would make them; a crash-looping pod would otherwise wait out its back-off."""
    wanted = set(nodes) if nodes is not None else None
    for pod in client.list("Pod", OPERATOR_NAMESPACE):
        if wanted is not None and (pod.get("spec") or {}).get("nodeName") not in wanted:
            continue
        if only_crashed:
            stuck = crashed(pod)
        else:
            owners = {o.get("kind") for o in pod["metadata"].get("ownerReferences") or []}
            status = pod.get("status") or {}
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
            stuck = bool(owners & {"DaemonSet", "ClusterPolicy"}) and not ready and status.get("phase") != "Succeeded"
        if stuck:
            client.delete("Pod", pod["metadata"]["name"], OPERATOR_NAMESPACE, grace_seconds=0)


def repair_faults(client: api.Client, cluster_root: Any, nodes: Mapping[str, int],
                  want: Mapping[str, Any] | None = None, timeout: float = SETTLE_TIMEOUT,
                  settle_unchanged: bool = True) -> list[Restored]:
    """The GPU nodes' faults as ``want`` (a :func:`faults.snapshot`; default none), the stack settled again.

    Once the node agent applies the change, crashed operands are replaced (a
    crash-looping pod waits out its back-off; a deleted one comes back at once)
    and, unless faults stay on purpose, every device must be allocatable and the
    stack settled. ``settle_unchanged=False`` skips that wait when no fault changed.
    """
    done = put_faults_back(cluster_root, nodes, want)
    if any(faults.load(cluster_root, n).faults for n in nodes) or not (done or settle_unchanged):
        return done
    restart_stuck_operands(client, nodes)
    # The node agent has applied the faults (put_faults_back waits for it): what is left shows in the stack.
    wait_settled(client, {name: {"resources": ANY} for name in nodes}, timeout,
                 what="every GPU allocatable again and the GPU stack ready")
    return done


# --------------------------------------------------------------------------- add-ons


def addon_back(kubeconfig: Path, name: str, say: Say = lambda _m: None,
               tell: Iterable[str] | None = None) -> list[Restored]:
    """The add-on ``name`` (``manifests/addons/<name>/``), if installed, as its manifests say: a ConfigMap with
    other contents is applied again and the program reading it reloads or restarts (:func:`addons.put_back`).
    The programs of ``tell`` (ConfigMaps ``namespace/name``; None: all of them) are told in any case: a
    ConfigMap changed back without telling its program leaves the program on the other configuration."""
    tell = addons.configmaps(name) if tell is None else tell
    return [Restored("configmap", key, "installed", name) for key in addons.put_back(kubeconfig, name, say, tell)]


# --------------------------------------------------------------------------- nodes and PriorityClasses


def taint_key(taint: Mapping[str, Any]) -> dict[str, Any]:
    """A taint as it identifies itself (timeAdded, set by the node lifecycle controller for NoExecute, is not)."""
    return {k: v for k, v in taint.items() if k != "timeAdded" and v not in (None, "")}


def _clean_priority_class(pc: Mapping[str, Any]) -> dict[str, Any]:
    keep = {k: v for k, v in pc.items() if k not in ("metadata", "status")}
    meta = pc.get("metadata") or {}
    keep["metadata"] = {k: meta[k] for k in ("name", "labels", "annotations") if meta.get(k)}
    keep.setdefault("kind", "PriorityClass")
    keep.setdefault("apiVersion", "scheduling.k8s.io/v1")
    return keep


def topology_baseline(source: Cluster | Path | None) -> dict[str, dict[str, Any]]:
    """Per node, the labels and taints the topology gives it at bring-up ({} when unknown).

    ``source`` is a cluster of either backend or the directory of an embedded cluster.
    """
    if source is None:
        return {}
    # The embedded backend (and the pod runtime it loads) only where its cluster is asked about.
    from .embedded import EmbeddedCluster

    topo = (EmbeddedCluster(source) if isinstance(source, Path) else source).topology()
    found = {}
    for node_spec in topo.nodes:
        obj = node_objects.node_object(node_spec, NODE_ANNOTATION)
        found[node_spec.name] = {"labels": obj["metadata"]["labels"],
                                 "taints": [taint_key(t) for t in (obj.get("spec") or {}).get("taints") or []]}
    return found


def node_keys_back(client: api.Client, baseline: Mapping[str, Mapping[str, Any]], label_keys: Sequence[str],
                   taint_keys: Sequence[str]) -> list[Restored]:
    """The node labels ``label_keys`` and taints with ``taint_keys`` as ``baseline`` (a :func:`topology_baseline`)
    has them, on every node; other labels and taints are left alone."""
    done: list[Restored] = []
    if not label_keys and not taint_keys:
        return done

    def once(name: str) -> list[Restored]:
        node = client.get("Node", name)
        if node is None:
            return []
        base = baseline.get(name, {"labels": {}, "taints": []})
        labels = node["metadata"].get("labels") or {}
        label_patch = {k: base["labels"].get(k) for k in label_keys if labels.get(k) != base["labels"].get(k)}
        taints = [taint_key(t) for t in (node.get("spec") or {}).get("taints") or []]
        wanted = [t for t in taints if t.get("key") not in taint_keys]
        wanted += [t for t in base["taints"] if t.get("key") in taint_keys]
        changes = _key_changes("label", name, label_patch)
        patch: dict[str, Any] = {}
        if label_patch:
            patch["metadata"] = {"labels": label_patch}
        if sorted(map(str, wanted)) != sorted(map(str, taints)):
            # The whole list is replaced: only over the version it was computed from.
            rv = node["metadata"].get("resourceVersion")
            if rv:
                patch.setdefault("metadata", {})["resourceVersion"] = rv
            patch["spec"] = {"taints": wanted or None}
            changes += [Restored("taint", name, "removed", taint_text(t)) for t in taints if t not in wanted]
            changes += [Restored("taint", name, "added", taint_text(t)) for t in wanted if t not in taints]
        if patch:
            client.patch("Node", name, patch)
        return changes

    for node in client.list("Node"):
        done += api.retry_on_conflict(lambda n=node["metadata"]["name"]: once(n))
    return done


@dataclass
class ClusterState:
    """What a cluster-wide lab may change: per node labels/annotations/taints/unschedulable; PriorityClasses."""

    nodes: dict[str, dict[str, Any]]
    priority_classes: dict[str, dict[str, Any]]

    @classmethod
    def capture(cls, client: api.Client) -> ClusterState:
        found = {}
        for node in client.list("Node"):
            meta, spec = node["metadata"], node.get("spec") or {}
            found[meta["name"]] = {"labels": dict(meta.get("labels") or {}),
                                   "annotations": dict(meta.get("annotations") or {}),
                                   "taints": [taint_key(t) for t in spec.get("taints") or []],
                                   "unschedulable": bool(spec.get("unschedulable"))}
        pcs = {}
        for pc in client.list("PriorityClass"):
            pcs[pc["metadata"]["name"]] = _clean_priority_class(pc)
        return cls(found, pcs)

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": copy.deepcopy(self.nodes), "priority_classes": copy.deepcopy(self.priority_classes)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClusterState:
        return cls(copy.deepcopy(dict(data.get("nodes") or {})), copy.deepcopy(dict(data.get("priority_classes") or {})))

    def restore(self, client: api.Client, details: list[Restored] | None = None) -> list[str]:
        """Put nodes and PriorityClasses back as captured; returns what had to change (for logs).

        ``details`` gets one :class:`Restored` per label, annotation, taint,
        cordon and PriorityClass put back (what a recovered journal reports).
        A node's taint list is replaced over the version it was computed from,
        retried on a Conflict.
        """
        changed = []
        details = details if details is not None else []
        for name, want in self.nodes.items():
            if api.retry_on_conflict(lambda n=name, w=want: self._restore_node(client, n, w, details)):
                changed.append(f"node/{name}")
        now = ClusterState.capture(client)
        for name in sorted(set(now.priority_classes) - set(self.priority_classes)):
            client.delete("PriorityClass", name)
            changed.append(f"priorityclass/{name} deleted")
            details.append(Restored("priorityclass", name, "deleted"))
        for name, want in self.priority_classes.items():
            have = now.priority_classes.get(name)
            if have == want:
                continue
            if have is not None:
                client.delete("PriorityClass", name)
                _wait(lambda n=name: client.get("PriorityClass", n) is None, 30, f"PriorityClass {name} gone")
            client.create(copy.deepcopy(want))
            changed.append(f"priorityclass/{name} restored")
            details.append(Restored("priorityclass", name, "restored"))
        return changed

    @staticmethod
    def _restore_node(client: api.Client, name: str, want: Mapping[str, Any], details: list[Restored]) -> bool:
        node = client.get("Node", name)
        if node is None:
            return False
        meta, spec = node["metadata"], node.get("spec") or {}
        have = {"labels": dict(meta.get("labels") or {}), "annotations": dict(meta.get("annotations") or {}),
                "taints": [taint_key(t) for t in spec.get("taints") or []],
                "unschedulable": bool(spec.get("unschedulable"))}
        if have == want:
            return False
        found: list[Restored] = []
        patch: dict[str, Any] = {"metadata": {}, "spec": {}}
        for key in ("labels", "annotations"):
            if have[key] != want[key]:
                diff = {k: v for k, v in want[key].items() if have[key].get(k) != v}
                diff.update({k: None for k in have[key] if k not in want[key]})
                patch["metadata"][key] = diff
                found += _key_changes(key[:-1], name, diff)
        if have["taints"] != want["taints"]:
            patch["spec"]["taints"] = [dict(t) for t in want["taints"]] or None
            patch["metadata"]["resourceVersion"] = meta.get("resourceVersion")
            found += [Restored("taint", name, "removed", taint_text(t)) for t in have["taints"]
                      if t not in want["taints"]]
            found += [Restored("taint", name, "added", taint_text(t)) for t in want["taints"]
                      if t not in have["taints"]]
        if have["unschedulable"] != want["unschedulable"]:
            patch["spec"]["unschedulable"] = want["unschedulable"] or None
            found.append(Restored("unschedulable", name, "cordoned" if want["unschedulable"] else "uncordoned"))
        client.patch("Node", name, patch)
        details += found  # only once the patch went through (a Conflict retries from a fresh read)
        return True
