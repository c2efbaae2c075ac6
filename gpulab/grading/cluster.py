"""The cluster side of grading: what a lab needs, a sandbox per submission, evidence collection.

A lab's check module (``gpulab/grading/labs/lab_NN.py``) declares what its
notebook does to the cluster, as module attributes read into a
:class:`LabSpec`::

    LAB = "07-quota-priority"
    NAMESPACES = ("team-a", "team-b")     # extra namespaces: <namespace>-team-a, <namespace>-team-b
    CLUSTER_WIDE = True                   # changes cluster-scoped state; graded on a restored cluster
    CLUSTER_RULES = ({"apiGroups": ["scheduling.k8s.io"], "resources": ["priorityclasses"],
                      "verbs": ["get", "list", "watch", "create", "delete"]},)
    PRIORITY_CLASSES = ("training-critical", "batch-low")   # removed before the run starts
    NODE_TAINTS = ("nvidia.com/gpu",)     # taint keys put back to the topology's before the run
    NODE_LABELS = ("node-role.kubernetes.io/ai",)
    GPUS_FREE = 2                         # GPUs that must be free when the run starts
    LOGS = True                           # capture container logs as PodLog objects
    CELL_TIMEOUT, TIMEOUT = 120, 300      # seconds per cell / per notebook
    SETUP = break_one_layer               # hook(env: LabEnv) -> objects for the checks, before the run
    TEARDOWN = repair                     # hook(env: LabEnv), after collection: always, even when the run fails
    COLLECT = gpu_stack_objects           # hook(client) -> {kind: [objects]} captured with the namespaces
    PARAMETERS = {"model_load_seconds": 1}   # papermill parameters the grader injects besides namespace

``SETUP``/``TEARDOWN`` change what the notebook finds on the cluster (a fault on a
GPU node, say); they need ``CLUSTER_WIDE``. ``SETUP`` declares what it changes
with ``@journal.declare("faults", "nodes")`` (:mod:`gpulab.grading.journal`): the
sandbox journals the state of those things before anything changes, so a
grader killed mid-run is cleaned up after by the next command
(:func:`restore_journal`). ``SETUP`` runs last in
:meth:`ClusterSandbox.prepare` (after ``GPUS_FREE`` is checked) and returns API-like
objects (``{"kind": "InjectedFault", ...}``) that the collector adds to what the
checks see, never the learner; ``TEARDOWN`` runs first in
:meth:`ClusterSandbox.release` whenever ``SETUP`` was called, even if it raised.

Per submission :class:`ClusterSandbox` creates the namespaces and a
**namespace-scoped identity**: a client certificate from the cluster CA for
user ``gpulab-grader:<learner>`` (group ``gpulab:graded``), a Role in each
namespace bound to it by a RoleBinding, read-only access to nodes, and — only
for ``CLUSTER_RULES`` — a ClusterRole of exactly those rules. The notebook's
kernel gets a kubeconfig for it whose default namespace is the submission's.
:meth:`ClusterSandbox.release` removes namespaces, bindings and the
ClusterRole, and for ``CLUSTER_WIDE`` labs puts back the cluster-scoped state
the identity could touch (node labels, annotations, taints and
``unschedulable``; PriorityClasses) exactly as it was before the submission —
or, with ``restore="reset"``, resets the whole cluster.

:class:`ClusterCollector` captures the namespaces' API objects as plain dicts
(plus nodes and PriorityClasses, and container logs when the lab asks) for
the checks, which never talk to the cluster themselves.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import re
import shutil
import tempfile
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from gpulab import _poll
from gpulab.cluster import baseline
from gpulab.cluster.baseline import Restored
from gpulab.cluster.base import Cluster
from gpulab.fakegpu import faults
from gpulab.kube import api, kubeconfig, pki
from gpulab.kube.names import MONITORING, MONITORING_NAMESPACE, OPERATOR_NAMESPACE
from gpulab.kube.statedir import StateDir

from . import journal
from .checks import CheckLoadError, lab_module_name

GPU = "nvidia.com/gpu"
GROUP = "gpulab:graded"
USER_PREFIX = "gpulab-grader:"
ROLE = "gpulab-learner"
NODE_READER = "gpulab:grading:read-nodes"
LABEL_GRADING = "gpulab.io/grading"
LABEL_LEARNER = "gpulab.io/learner"

# What a learner may do inside their own namespaces: what the chapter's labs use, and no more.
_ALL = ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]
_READ = ["get", "list", "watch"]
NAMESPACE_RULES: tuple[dict[str, Any], ...] = (
    {"apiGroups": [""], "resources": ["pods", "services", "endpoints", "configmaps", "secrets",
                                      "persistentvolumeclaims", "serviceaccounts", "resourcequotas",
                                      "limitranges", "replicationcontrollers", "events"], "verbs": _ALL},
    {"apiGroups": [""], "resources": ["pods/log", "pods/status", "resourcequotas/status",
                                      "persistentvolumeclaims/status"], "verbs": _READ},
    {"apiGroups": [""], "resources": ["pods/exec", "pods/attach", "pods/eviction"], "verbs": ["create", "get"]},
    {"apiGroups": ["apps"], "resources": ["deployments", "replicasets", "statefulsets", "daemonsets",
                                          "deployments/scale", "replicasets/scale", "statefulsets/scale"],
     "verbs": _ALL},
    {"apiGroups": ["batch"], "resources": ["jobs", "cronjobs"], "verbs": _ALL},
    {"apiGroups": ["autoscaling"], "resources": ["horizontalpodautoscalers"], "verbs": _ALL},
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": _ALL},
    {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": _READ},
)
CLUSTER_READ_RULES: tuple[dict[str, Any], ...] = (
    {"apiGroups": [""], "resources": ["nodes"], "verbs": _READ},
    {"apiGroups": ["scheduling.k8s.io"], "resources": ["priorityclasses"], "verbs": _READ},
    {"apiGroups": ["storage.k8s.io"], "resources": ["storageclasses"], "verbs": _READ},
)

# Kinds captured from each namespace of a submission; cluster-scoped kinds are captured whole.
NAMESPACED_KINDS = ("Pod", "Job", "CronJob", "Deployment", "ReplicaSet", "StatefulSet", "Service", "ConfigMap",
                    "PersistentVolumeClaim", "ResourceQuota", "LimitRange", "HorizontalPodAutoscaler", "Event")
CLUSTER_KINDS = ("Node", "PriorityClass")
POD_LOG = "PodLog"


class SandboxError(RuntimeError):
    """The cluster is not in a state to grade on (the grader's problem, never the learner's)."""


# --------------------------------------------------------------------------- lab specs


@dataclass(frozen=True)
class LabSpec:
    """What a lab's notebook needs from, and does to, the cluster (see the module docstring)."""

    lab: str
    number: str
    namespaces: tuple[str, ...] = ()
    cluster_wide: bool = False
    cluster_rules: tuple[Mapping[str, Any], ...] = ()
    node_labels: tuple[str, ...] = ()
    node_taints: tuple[str, ...] = ()
    priority_classes: tuple[str, ...] = ()
    gpus_free: int = 0
    logs: bool = False
    cell_timeout: float = 120.0
    timeout: float = 300.0
    setup: Callable[[LabEnv], Iterable[Mapping[str, Any]] | None] | None = field(default=None, compare=False)
    teardown: Callable[[LabEnv], Any] | None = field(default=None, compare=False)
    collect: Callable[[api.Client], Mapping[str, Sequence[Mapping[str, Any]]]] | None = field(default=None,
                                                                                              compare=False)
    parameters: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def changes(self) -> tuple[str, ...]:
        """What a run changes cluster-wide and the journal records (see :func:`journal.declared`); () if nothing."""
        return journal.declared(self.setup) if self.cluster_wide else ()

    @classmethod
    def from_module(cls, module: ModuleType) -> LabSpec:
        lab = str(getattr(module, "LAB", module.__name__.rsplit(".", 1)[-1]))
        match = re.match(r"^(?:lab[_-]?)?(\d+)", lab) or re.search(r"lab_(\d+)$", module.__name__)
        number = f"{int(match.group(1)):02d}" if match else lab
        spec = cls(lab=lab, number=number,
                   namespaces=tuple(getattr(module, "NAMESPACES", ())),
                   cluster_wide=bool(getattr(module, "CLUSTER_WIDE", False)),
                   cluster_rules=tuple(getattr(module, "CLUSTER_RULES", ())),
                   node_labels=tuple(getattr(module, "NODE_LABELS", ())),
                   node_taints=tuple(getattr(module, "NODE_TAINTS", ())),
                   priority_classes=tuple(getattr(module, "PRIORITY_CLASSES", ())),
                   gpus_free=int(getattr(module, "GPUS_FREE", 0)),
                   logs=bool(getattr(module, "LOGS", False)),
                   cell_timeout=float(getattr(module, "CELL_TIMEOUT", 120.0)),
                   timeout=float(getattr(module, "TIMEOUT", 300.0)),
                   setup=getattr(module, "SETUP", None), teardown=getattr(module, "TEARDOWN", None),
                   collect=getattr(module, "COLLECT", None), parameters=dict(getattr(module, "PARAMETERS", {})))
        for suffix in spec.namespaces:
            if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,14}[a-z0-9])?", suffix):
                raise CheckLoadError(f"{module.__name__}: NAMESPACES entry {suffix!r} must be a short DNS label")
        if (spec.cluster_rules or spec.node_labels or spec.node_taints or spec.priority_classes) \
                and not spec.cluster_wide:
            raise CheckLoadError(f"{module.__name__}: CLUSTER_RULES/NODE_*/PRIORITY_CLASSES need CLUSTER_WIDE = True")
        for hook in ("setup", "teardown"):
            if getattr(spec, hook) is not None and not callable(getattr(spec, hook)):
                raise CheckLoadError(f"{module.__name__}: {hook.upper()} must be a function of a LabEnv")
        if (spec.setup or spec.teardown) and not spec.cluster_wide:
            raise CheckLoadError(f"{module.__name__}: SETUP/TEARDOWN need CLUSTER_WIDE = True")
        return spec

    def namespace_names(self, namespace: str) -> list[str]:
        """The submission's namespace first, then ``<namespace>-<suffix>`` for each extra one."""
        return [namespace, *(f"{namespace}-{suffix}" for suffix in self.namespaces)]

    @property
    def namespace_room(self) -> int:
        """Longest base namespace name that leaves room for the suffixes (names are at most 63)."""
        return 63 - max((len(s) + 1 for s in self.namespaces), default=0)


@dataclass(frozen=True)
class LabEnv:
    """What a lab's ``SETUP``/``TEARDOWN`` hook gets: the admin client, the cluster's directory, the run."""

    client: api.Client
    cluster_root: Path | None
    namespace: str
    learner: str


def load_lab_spec(lab: str) -> LabSpec:
    """The :class:`LabSpec` of ``lab`` (``"03"``, ``"03-taints-tolerations"``, ``"lab_03"``)."""
    name = lab_module_name(lab)
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        raise CheckLoadError(f"no check module {name} for lab {lab!r}") from exc
    return LabSpec.from_module(module)


# --------------------------------------------------------------------------- small API helpers


def _strip(obj: dict[str, Any], kind: str, api_version: str) -> dict[str, Any]:
    obj = dict(obj)
    obj.setdefault("kind", kind)
    obj.setdefault("apiVersion", api_version)
    meta = dict(obj.get("metadata") or {})
    meta.pop("managedFields", None)
    obj["metadata"] = meta
    return obj


def _api_version(kind: str) -> str:
    prefix = api.KINDS[kind][0]
    return "v1" if prefix == "/api/v1" else prefix.removeprefix("/apis/")


def get_text(client: api.Client, path: str, query: Mapping[str, Any] | None = None, timeout: float = 10) -> str:
    """GET a plain-text endpoint (``pods/log``) through the client's connection pool."""
    import urllib3

    url = client._api.configuration.host + path  # noqa: SLF001 - the dict client has no text verb
    if query:
        url += "?" + urllib.parse.urlencode(query)
    resp = client._pool.request("GET", url, headers={"Accept": "*/*"},  # noqa: SLF001
                                timeout=urllib3.Timeout(total=timeout), retries=False)
    if resp.status == 404:
        raise api.NotFound(path)
    if resp.status >= 400:
        raise api.ApiError(resp.status, resp.reason or "", None)
    return resp.data.decode("utf-8", errors="replace")


def _wait(fn: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    return _poll.until(fn, timeout, lambda _: SandboxError(f"timed out after {timeout:.0f}s waiting for {what}"),
                       interval, max_interval=0.5)


def _gpu_count(value: Any) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def gpu_usage(client: api.Client) -> tuple[int, list[str]]:
    """Free ``nvidia.com/gpu`` across nodes, and ``ns/pod (n)`` for each pod holding some."""
    allocatable = sum(_gpu_count((n.get("status") or {}).get("allocatable", {}).get(GPU)) for n in client.list("Node"))
    used, holders = 0, []
    for pod in client.list("Pod"):
        if not pod.get("spec", {}).get("nodeName") or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        n = sum(max(_gpu_count(((c.get("resources") or {}).get("limits") or {}).get(GPU)),
                    _gpu_count(((c.get("resources") or {}).get("requests") or {}).get(GPU)))
                for c in pod["spec"].get("containers") or [])
        if n:
            used += n
            holders.append(f"{pod['metadata']['namespace']}/{pod['metadata']['name']} ({n})")
    return allocatable - used, holders


# --------------------------------------------------------------------------- collection


@dataclass
class ClusterCollector:
    """Captures a submission's API objects (see :class:`gpulab.grading.gradebook.Collector`)."""

    client: api.Client
    spec: LabSpec
    namespaced_kinds: Sequence[str] = NAMESPACED_KINDS
    cluster_kinds: Sequence[str] = CLUSTER_KINDS
    log_bytes: int = 64 << 10
    extra: Callable[[str], Mapping[str, Sequence[Mapping[str, Any]]]] | None = None  # e.g. ClusterSandbox.injected

    def collect(self, namespace: str) -> dict[str, list[dict[str, Any]]]:
        found: dict[str, list[dict[str, Any]]] = {}
        for ns in self.spec.namespace_names(namespace):
            for kind in self.namespaced_kinds:
                items = self._list(kind, ns)
                found.setdefault(kind, []).extend(items)
        for kind in self.cluster_kinds:
            found[kind] = self._list(kind, None)
        if self.spec.collect is not None:
            for kind, items in self.spec.collect(self.client).items():
                found.setdefault(kind, []).extend(copy.deepcopy(dict(o)) for o in items)
        if self.spec.logs:
            found[POD_LOG] = [log for pod in found.get("Pod", []) for log in self._logs(pod)]
        for kind, items in (self.extra(namespace) if self.extra else {}).items():
            found.setdefault(kind, []).extend(copy.deepcopy(dict(o)) for o in items)
        for kind, items in found.items():
            items.sort(key=lambda o: ((o.get("metadata") or {}).get("namespace") or "",
                                      (o.get("metadata") or {}).get("name") or "", o.get("container", "")))
        return found

    def _list(self, kind: str, namespace: str | None) -> list[dict[str, Any]]:
        try:
            items = self.client.list(kind, namespace)
        except api.NotFound:
            return []
        return [_strip(item, kind, _api_version(kind)) for item in items]

    def _logs(self, pod: Mapping[str, Any]) -> list[dict[str, Any]]:
        meta = pod["metadata"]
        statuses = {s.get("name"): s for s in (pod.get("status") or {}).get("initContainerStatuses") or []}
        statuses.update({s.get("name"): s for s in (pod.get("status") or {}).get("containerStatuses") or []})
        logs = []
        spec = pod.get("spec") or {}
        for init, containers in ((True, spec.get("initContainers") or []), (False, spec.get("containers") or [])):
            for container in containers:
                name = container.get("name")
                state = (statuses.get(name) or {}).get("state") or {}
                if not state or "waiting" in state and not (statuses.get(name) or {}).get("lastState"):
                    continue  # never started: there is no log to ask for
                path = api.Client.path("Pod", meta["name"], meta["namespace"], "log")
                try:
                    text = get_text(self.client, path, {"container": name, "limitBytes": self.log_bytes})
                except (api.ApiError, api.NotFound):
                    continue
                logs.append({"kind": POD_LOG, "apiVersion": "gpulab.io/v1",
                             "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                             "container": name, "init": init, "log": text})
        return logs


# --------------------------------------------------------------------------- cluster-wide state


def normalize(client: api.Client, spec: LabSpec, topology: Mapping[str, Mapping[str, Any]]) -> None:
    """Before a cluster-wide run: the lab's node keys as the topology has them, its PriorityClasses absent."""
    baseline.node_keys_back(client, topology, spec.node_labels, spec.node_taints)
    for name in spec.priority_classes:
        if client.delete("PriorityClass", name):
            _wait(lambda n=name: client.get("PriorityClass", n) is None, 30, f"PriorityClass {name} gone")


# --------------------------------------------------------------------------- sandbox


def learner_user(learner: str) -> str:
    """``gpulab-grader:<learner>``; an X.509 common name holds at most 64 characters, so long ids are hashed."""
    user = f"{USER_PREFIX}{learner}"
    if len(user) <= 64:
        return user
    digest = hashlib.sha1(learner.encode("utf-8")).hexdigest()[:10]
    return f"{USER_PREFIX}{learner[: 64 - len(USER_PREFIX) - 11]}-{digest}"


def _label_value(text: str) -> str:
    value = re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:63].strip("-_.")
    return value or "learner"


@dataclass
class _Prepared:
    learner: str
    namespaces: list[str]
    kubeconfig: Path
    state: baseline.ClusterState | None = None
    set_up: bool = False
    injected: list[dict[str, Any]] = field(default_factory=list)
    record: journal.Journal | None = None  # what a killed grader's successor restores


@dataclass
class ClusterSandbox:
    """Per-submission namespaces and identity (see the module docstring and :class:`gradebook.Sandbox`)."""

    client: api.Client
    pki_dir: Path
    server: str
    spec: LabSpec
    cluster_root: Path | None = None
    restore: str = "targeted"
    reset_cluster: Callable[[], Any] | None = None
    namespace_timeout: float = 90.0
    gpu_wait: float = 30.0
    work_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gpulab-sandbox-")))
    _prepared: dict[str, _Prepared] = field(default_factory=dict, init=False, repr=False)
    _baseline: dict[str, dict[str, Any]] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.restore not in ("targeted", "reset"):
            raise ValueError(f"restore must be 'targeted' or 'reset', not {self.restore!r}")
        if self.restore == "reset" and self.reset_cluster is None:
            raise ValueError("restore='reset' needs reset_cluster (e.g. EmbeddedCluster.reset)")

    @classmethod
    def for_cluster(cls, cluster: Cluster, spec: LabSpec, restore: str = "targeted") -> ClusterSandbox:
        """A sandbox on a cluster of either backend (its admin client and CA)."""
        server = kubeconfig.server_of(cluster.kubeconfig)
        if not server:
            raise SandboxError(f"{cluster.kubeconfig}: no apiserver address; is the cluster up?")
        sandbox = cls(api.Client(cluster.kubeconfig), cluster.pki, server, spec, cluster.root, restore,
                      reset_cluster=(lambda: cluster.reset(say=lambda _m: None)) if restore == "reset" else None)
        if spec.cluster_wide:
            # The cluster object knows its own topology, whichever backend runs it.
            sandbox._baseline = baseline.topology_baseline(cluster)
        return sandbox

    # -- the protocol ------------------------------------------------------------

    def prepare(self, namespace: str, learner: str = "learner") -> dict[str, str]:
        names = self.spec.namespace_names(namespace)
        state = record = None
        if self.spec.cluster_wide:
            state = baseline.ClusterState.capture(self.client)
            # Journaled before anything changes: a grader killed from here on is cleaned up after next time.
            record = self._open_journal(namespace, learner, names, state)
        self._prepared[namespace] = prepared = _Prepared(learner, names, self.work_dir / f"{namespace}.kubeconfig",
                                                         state, record=record)
        try:
            if self.spec.cluster_wide:
                if self._baseline is None:
                    self._baseline = baseline.topology_baseline(self.cluster_root)
                normalize(self.client, self.spec, self._baseline)
            self._ensure_cluster_roles()
            for ns in names:
                self._fresh_namespace(ns, learner)
            user = learner_user(learner)
            for ns in names:
                self._bind_namespace(ns, user)
            if self.spec.cluster_rules:
                self._bind_cluster_rules(namespace, user)
            self._check_gpus()
            if self.spec.setup is not None:
                prepared.set_up = True
                made = self.spec.setup(LabEnv(self.client, self.cluster_root, namespace, learner))
                prepared.injected = [copy.deepcopy(dict(o)) for o in made or ()]
                if record is not None:
                    record.update(phase="running", applied=prepared.injected)
            self._write_kubeconfig(namespace, user, prepared.kubeconfig)
        except BaseException:
            self.release(namespace)
            raise
        return {"KUBECONFIG": str(prepared.kubeconfig)}

    def injected(self, namespace: str) -> dict[str, list[dict[str, Any]]]:
        """What the lab's ``SETUP`` returned for this run, by kind (for the collector; never shown to learners)."""
        prepared = self._prepared.get(namespace)
        grouped: dict[str, list[dict[str, Any]]] = {}
        for obj in prepared.injected if prepared else ():
            grouped.setdefault(str(obj.get("kind")), []).append(copy.deepcopy(obj))
        return grouped

    def release(self, namespace: str) -> None:
        prepared = self._prepared.pop(namespace, None)
        torn_down = False
        try:
            if prepared is not None and prepared.set_up and self.spec.teardown is not None:
                self.spec.teardown(LabEnv(self.client, self.cluster_root, namespace, prepared.learner))
            torn_down = True
        finally:
            self._release(namespace, prepared)
        # Everything is back: nothing left to recover. (After a failed TEARDOWN the journal stays,
        # and the next `gpulab up`/`check`/`grade` once this process has ended puts the state back.)
        if torn_down and prepared is not None and prepared.record is not None:
            prepared.record.close()

    def _open_journal(self, namespace: str, learner: str, names: list[str],
                      state: baseline.ClusterState) -> journal.Journal | None:
        """Record what this run may change and how it was (see :mod:`gpulab.grading.journal`); None without a root."""
        if self.cluster_root is None:
            return None
        changes = self.spec.changes
        before: dict[str, Any] = state.to_dict()
        gpu_nodes = baseline.gpu_nodes(self.cluster_root) if "faults" in changes else None
        if gpu_nodes is not None:
            before["faults"] = faults.snapshot(self.cluster_root, sorted(gpu_nodes))
        if "gpu-stack" in changes:
            before["gpu_stack"] = baseline.capture(self.client)
        cleanup = {"cluster_binding": self._cluster_binding_name(namespace) if self.spec.cluster_rules else None,
                   "grants": granted_namespaces(changes)}
        return journal.Journal.open(self.cluster_root, lab=self.spec.lab, namespace=namespace, learner=learner,
                                    namespaces=names, changes=changes, before=before, cleanup=cleanup,
                                    cluster_uid=journal.cluster_uid(self.client))

    def _release(self, namespace: str, prepared: _Prepared | None) -> None:
        names = prepared.namespaces if prepared else self.spec.namespace_names(namespace)
        for ns in names:
            self._delete_namespace(ns)
        if self.spec.cluster_rules:
            name = self._cluster_binding_name(namespace)
            self.client.delete("ClusterRoleBinding", name)
            self.client.delete("ClusterRole", name)
        if prepared is not None:
            prepared.kubeconfig.unlink(missing_ok=True)
        if self.spec.cluster_wide:
            if self.restore == "reset":
                self.reset_cluster()  # type: ignore[misc]
            elif prepared is not None and prepared.state is not None:
                prepared.state.restore(self.client)
        for ns in names:
            _wait(lambda n=ns: not self.client.list("Pod", n), self.namespace_timeout, f"pods of {ns} gone")

    def close(self) -> None:
        for namespace in list(self._prepared):
            self.release(namespace)
        shutil.rmtree(self.work_dir, ignore_errors=True)

    # -- pieces --------------------------------------------------------------------

    def _fresh_namespace(self, ns: str, learner: str) -> None:
        if self.client.get("Namespace", ns) is not None:
            self._delete_namespace(ns)
            _wait(lambda: self.client.get("Namespace", ns) is None, self.namespace_timeout,
                  f"namespace {ns} left over from an earlier run to be deleted")
        self.client.create({"apiVersion": "v1", "kind": "Namespace",
                            "metadata": {"name": ns, "labels": {LABEL_GRADING: "true",
                                                                LABEL_LEARNER: _label_value(learner)}}})
        # Pods are rejected until the service-account controller has created "default".
        _wait(lambda: self.client.get("ServiceAccount", "default", ns), 30, f"service account default in {ns}")

    def _delete_namespace(self, ns: str) -> None:
        if not self.client.delete("Namespace", ns):
            return
        # Terminating namespaces accept no new pods, so controllers cannot recreate what is force-deleted here;
        # the GPUs the pods held are free for the next submission at once.
        for pod in self.client.list("Pod", ns):
            self.client.delete("Pod", pod["metadata"]["name"], ns, grace_seconds=0)

    def _ensure_cluster_roles(self) -> None:
        self.client.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                           "metadata": {"name": NODE_READER, "labels": {LABEL_GRADING: "true"}},
                           "rules": [dict(r) for r in CLUSTER_READ_RULES]}, manager="gpulab-grading")
        self.client.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                           "metadata": {"name": NODE_READER, "labels": {LABEL_GRADING: "true"}},
                           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                       "name": NODE_READER},
                           "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": GROUP}]},
                          manager="gpulab-grading")

    def _bind_namespace(self, ns: str, user: str) -> None:
        self.client.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                            "metadata": {"name": ROLE, "namespace": ns},
                            "rules": [dict(r) for r in NAMESPACE_RULES]})
        self.client.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                            "metadata": {"name": ROLE, "namespace": ns},
                            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROLE},
                            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})

    @staticmethod
    def _cluster_binding_name(namespace: str) -> str:
        return f"gpulab:grading:{namespace}"

    def _bind_cluster_rules(self, namespace: str, user: str) -> None:
        name = self._cluster_binding_name(namespace)
        self.client.delete("ClusterRoleBinding", name)
        self.client.delete("ClusterRole", name)
        self.client.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                            "metadata": {"name": name, "labels": {LABEL_GRADING: "true"}},
                            "rules": [dict(r) for r in self.spec.cluster_rules]})
        self.client.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                            "metadata": {"name": name, "labels": {LABEL_GRADING: "true"}},
                            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})

    def _check_gpus(self) -> None:
        """The lab's GPUs must be free; pods of a just-deleted namespace get ``gpu_wait`` seconds to let go."""
        if not self.spec.gpus_free:
            return
        free = 0
        holders: list[str] = []

        def enough() -> bool:
            nonlocal free, holders
            free, holders = gpu_usage(self.client)
            return free >= self.spec.gpus_free

        _poll.until(enough, self.gpu_wait, lambda _: SandboxError(
            f"lab {self.spec.lab} needs {self.spec.gpus_free} free nvidia.com/gpu but {max(free, 0)} are free; "
            f"held by: {', '.join(holders) or 'nothing (fewer GPUs allocatable than the lab needs)'}"), interval=0.5)

    def _write_kubeconfig(self, namespace: str, user: str, path: Path) -> None:
        stem = f"grading-{hashlib.sha1(namespace.encode()).hexdigest()[:12]}"
        crt, key = pki.issue_client(self.pki_dir, stem, user, (GROUP,))
        try:
            kubeconfig.write(path, self.server, self.pki_dir / "ca.crt", crt, key, user=user, namespace=namespace)
        finally:
            crt.unlink(missing_ok=True)
            key.unlink(missing_ok=True)


# --------------------------------------------------------------------------- grants beyond the namespaces

GRANT_PREFIX = "gpulab:grading:"


def _grant_name(namespace: str) -> str:
    return f"{GRANT_PREFIX}{namespace}"


# Node events (DevicePluginConfigInvalid, MigConfigFailed) are in "default"; the learner may read them.
STACK_GRANTS = {OPERATOR_NAMESPACE: [{"apiGroups": [""], "resources": ["configmaps"], "verbs": _ALL}],
                "default": [{"apiGroups": [""], "resources": ["events"], "verbs": _READ}]}
#: Labs that repair the monitoring add-on: its ConfigMaps, a rollout restart of its Deployments (a patch),
#: its pods, logs and exec (is the new file there yet?), and the Prometheus Service's proxy (PromQL; POST /-/reload).
MONITORING_GRANTS = {MONITORING_NAMESPACE: [
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch", "patch", "update"]},
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": ["apps"], "resources": ["replicasets"], "verbs": _READ},
    {"apiGroups": [""], "resources": ["pods", "pods/log", "events", "services", "endpoints"], "verbs": _READ},
    {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["get", "create"]},
    {"apiGroups": [""], "resources": ["services/proxy"], "verbs": ["get", "create"]},
]}
#: What a lab's ``SETUP`` grants, by the change it declares (:data:`journal.CHANGES`); a journal records the
#: namespaces, so that a killed grader's grants go too.
GRANTS = {"gpu-stack": STACK_GRANTS, "monitoring": MONITORING_GRANTS}


def grant(client: api.Client, namespace: str, user: str, grants: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
    """Let ``user`` (the submission in ``namespace``) do what ``grants`` says (namespace -> rules) in other
    namespaces: a Role and RoleBinding in each, never a cluster-wide grant."""
    name = _grant_name(namespace)
    for ns, rules in grants.items():
        for kind in ("RoleBinding", "Role"):  # leftovers of an interrupted grader
            for obj in client.list(kind, ns, label_selector=f"{LABEL_GRADING}=true"):
                client.delete(kind, obj["metadata"]["name"], ns)
        client.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                       "metadata": {"name": name, "namespace": ns, "labels": {LABEL_GRADING: "true"}},
                       "rules": [dict(r) for r in rules]})
        client.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                       "metadata": {"name": name, "namespace": ns, "labels": {LABEL_GRADING: "true"}},
                       "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                       "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})


def revoke(client: api.Client, namespace: str, grant_namespaces: Iterable[str]) -> None:
    """Take back what :func:`grant` gave the submission in ``namespace`` in each of ``grant_namespaces``."""
    for ns in grant_namespaces:
        for kind in ("RoleBinding", "Role"):
            client.delete(kind, _grant_name(namespace), ns)


def granted_namespaces(changes: Iterable[str]) -> list[str]:
    """The namespaces in which a lab that declares ``changes`` grants its submissions something."""
    return sorted({ns for c in changes for ns in GRANTS.get(c, {})})


def delete_leftovers(client: api.Client, prefix: str) -> list[str]:
    """Delete what an interrupted grader left for namespaces named ``<prefix>…``: namespaces, ClusterRoles, bindings.

    Their pods may still hold GPUs the next batch needs; everything is found by the
    ``gpulab.io/grading`` label, never by name alone.
    """
    gone = []
    for ns in client.list("Namespace", label_selector=f"{LABEL_GRADING}=true"):
        name = ns["metadata"]["name"]
        if name.startswith(prefix) and ns.get("status", {}).get("phase") != "Terminating":
            client.delete("Namespace", name)
            for pod in client.list("Pod", name):
                client.delete("Pod", pod["metadata"]["name"], name, grace_seconds=0)
            gone.append(f"namespace/{name}")
    for kind in ("ClusterRoleBinding", "ClusterRole"):
        for obj in client.list(kind, label_selector=f"{LABEL_GRADING}=true"):
            name = obj["metadata"]["name"]
            if name.startswith(f"gpulab:grading:{prefix}"):
                client.delete(kind, name)
                gone.append(f"{kind.lower()}/{name}")
    return gone


def restore_journal(client: api.Client, record: journal.Journal, timeout: float = 90.0) -> list[Restored]:
    """Put back what a killed grader's run changed, as its journal recorded it; one :class:`Restored` per thing.

    In the order a finished run's ``TEARDOWN`` and release would have: the run's
    namespaces and grants go (their pods may hold GPUs), GPU faults are set back
    and the stack settles (:func:`baseline.repair_faults`), the GPU stack's
    objects are restored (:func:`baseline.restore`), then nodes and
    PriorityClasses (:meth:`baseline.ClusterState.restore`). On an error the exception
    carries what was already done as ``restored``.
    """
    rec = record.record
    before, changes = rec["before"], set(rec.get("changes") or ())
    root = record.path.parent.parent
    done: list[Restored] = []
    try:
        names = list(rec.get("namespaces") or [rec["namespace"]])
        for ns in names:
            found = client.get("Namespace", ns)
            if found is None:
                continue
            if (found.get("status") or {}).get("phase") != "Terminating":
                client.delete("Namespace", ns)
                done.append(Restored("namespace", ns, "deleted"))
            for pod in client.list("Pod", ns):
                client.delete("Pod", pod["metadata"]["name"], ns, grace_seconds=0)
        cleanup = rec.get("cleanup") or {}
        if cleanup.get("cluster_binding"):
            for kind in ("ClusterRoleBinding", "ClusterRole"):
                if client.delete(kind, cleanup["cluster_binding"]):
                    done.append(Restored("grant", cleanup["cluster_binding"], "deleted", kind))
        grants = cleanup.get("grants")
        if grants:
            # A list of namespaces; `true` in a journal of an earlier gpulab meant the GPU stack's grants.
            revoke(client, rec["namespace"], grants if isinstance(grants, list) else STACK_GRANTS)
        _wait(lambda: not any(client.list("Pod", ns) for ns in names), timeout,
              f"the pods of {', '.join(names)} to be gone")
        if "faults" in changes and "faults" in before:
            nodes = baseline.gpu_nodes(root)
            if nodes:
                done += baseline.repair_faults(client, root, nodes, before["faults"], timeout, settle_unchanged=False)
        stack = before.get("gpu_stack")
        if "gpu-stack" in changes and stack and baseline.differs(client, stack):
            done += baseline.restore(client, stack, timeout)
        if "monitoring" in changes:
            done += baseline.addon_back(StateDir(root).kubeconfig, MONITORING)
        baseline.ClusterState.from_dict(before).restore(client, done)
    except Exception as exc:
        exc.restored = done  # type: ignore[attr-defined]
        raise
    return done


def recover(cluster: Cluster, client: api.Client | None = None) -> list[journal.Outcome]:
    """:func:`journal.recover` for a cluster object of either backend (skipped when it is not running)."""
    root = cluster.root
    if not journal.journal_dir(root).is_dir():
        return []
    if client is None:
        if not cluster.exists() or not cluster.is_up():
            return []
        client = api.Client(cluster.kubeconfig)
    return journal.recover(root, client, restore_journal)
