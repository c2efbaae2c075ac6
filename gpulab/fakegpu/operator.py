"""The NVIDIA GPU Operator on the embedded cluster: installed as NVIDIA installs it.

Installation (:func:`install`, run by ``gpulab up``) applies what the
operator's Helm chart would: the ``gpu-operator`` namespace, the
``clusterpolicies.nvidia.com`` CRD, the operator's ServiceAccount and
Deployment and one ClusterPolicy ``cluster-policy`` (``manifests/gpu-operator/``).
From there on the operator's own program does the rest, like the real one:

- it labels GPU nodes (those NFD marked ``pci-10de.present``) with
  ``nvidia.com/gpu.present``, the ``nvidia.com/gpu.deploy.<operand>``
  labels its DaemonSets select on, and the default ``nvidia.com/mig.config``;
- it turns the ClusterPolicy into DaemonSets (``nvidia-device-plugin-daemonset``,
  ``gpu-feature-discovery``, ``nvidia-dcgm-exporter``, ``nvidia-mig-manager``,
  ``nvidia-operator-validator``), owned by the ClusterPolicy, whose pods the
  real DaemonSet controller and scheduler place; a changed ClusterPolicy
  (``kubectl patch clusterpolicy``, the equivalent of ``helm --set``) changes
  the DaemonSets, which roll;
- it reports ``status.state``: ``ready`` once every operand DaemonSet is,
  ``notReady`` otherwise, ``ignored`` for any ClusterPolicy but the oldest.

The chart's ``driver.enabled`` and ``toolkit.enabled`` are false here: the
simulated nodes come with the driver and the container toolkit installed.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from .. import _poll, paths
from ..i18n import _
from ..kube import api
from ..runtime import programs
from . import gfd, mig
from .pluginconfig import CONFIG_LABEL
from .stack import GpuStack
from ..kube.names import CLUSTER_POLICY, OPERATOR_COMPONENT, OPERATOR_NAMESPACE

NAMESPACE = OPERATOR_NAMESPACE
POLICY_NAME = CLUSTER_POLICY
OPERATOR_IMAGE = "nvcr.io/nvidia/gpu-operator"
HASH_ANNOTATION = "nvidia.com/last-applied-hash"
MANAGER = OPERATOR_COMPONENT
STATE_READY = "ready"
STATE_NOT_READY = "notReady"
STATE_IGNORED = "ignored"
#: How soon the operator reconciles again while an operand is not ready (the GPU Operator's requeue); a change of
#: a ClusterPolicy, a node's labels, the hardware or one of its DaemonSets wakes it sooner.
NOT_READY_REQUEUE_S = 5.0
#: How often it reconciles with everything ready and nothing changed.
RESYNC_S = 30.0
#: Changes that come within this of a reconcile wait for the next one together.
BATCH_S = 0.5


def manifests_dir() -> Path:
    return paths.manifests() / "gpu-operator"


# --------------------------------------------------------------------------
# The operands and their DaemonSets (pure)


@dataclass(frozen=True)
class Operand:
    key: str                 # its section of ClusterPolicy.spec
    name: str                # DaemonSet name and app label
    deploy: str              # node selector nvidia.com/gpu.deploy.<deploy>=true
    service_account: str
    repository: str
    image: str
    version: str
    switchable: bool = True  # has spec.<key>.enabled


OPERANDS = (
    Operand("validator", "nvidia-operator-validator", "operator-validator", "nvidia-operator-validator",
            "nvcr.io/nvidia/cloud-native", "gpu-operator-validator", "v25.3.0", switchable=False),
    Operand("devicePlugin", "nvidia-device-plugin-daemonset", "device-plugin", "nvidia-device-plugin",
            "nvcr.io/nvidia", "k8s-device-plugin", "v0.17.1"),
    Operand("dcgmExporter", "nvidia-dcgm-exporter", "dcgm-exporter", "nvidia-dcgm-exporter",
            "nvcr.io/nvidia/k8s", "dcgm-exporter", "4.1.1-4.0.4-ubuntu22.04"),
    Operand("gfd", "gpu-feature-discovery", "gpu-feature-discovery", "nvidia-gpu-feature-discovery",
            "nvcr.io/nvidia", "k8s-device-plugin", "v0.17.1"),
    Operand("migManager", "nvidia-mig-manager", "mig-manager", "nvidia-mig-manager",
            "nvcr.io/nvidia/cloud-native", "k8s-mig-manager", "v0.12.1-ubuntu20.04"),
)


def _section(spec: dict[str, Any], *keys: str) -> dict[str, Any]:
    cur: Any = spec
    for k in keys:
        cur = (cur or {}).get(k) if isinstance(cur, dict) else None
    return cur if isinstance(cur, dict) else {}


def enabled(spec: dict[str, Any], operand: Operand) -> bool:
    if not operand.switchable:
        return True
    return _section(spec, operand.key).get("enabled", True) is not False


def image_of(spec: dict[str, Any], operand: Operand) -> str:
    sec = _section(spec, operand.key)
    repository = sec.get("repository") or operand.repository
    image = sec.get("image") or operand.image
    version = str(sec.get("version") or operand.version)
    if "/" in image or ":" in image or "@" in image:
        return image  # a full reference
    sep = "@" if version.startswith("sha256:") else ":"
    return f"{repository.rstrip('/')}/{image}{sep}{version}"


def _env(pairs: dict[str, str], extra: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    env = [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
    env += [{"name": k, "value": v} for k, v in pairs.items()]
    for e in extra or []:
        if isinstance(e, dict) and e.get("name"):
            env = [x for x in env if x["name"] != e["name"]] + [{"name": e["name"], "value": str(e.get("value", ""))}]
    return env


def _host_path(name: str, path: str, kind: str = "DirectoryOrCreate") -> dict[str, Any]:
    return {"name": name, "hostPath": {"path": path, "type": kind}}


def _config_manager(image: str, process: str, default: str, oneshot: bool) -> dict[str, Any]:
    return {
        "name": "config-manager-init" if oneshot else "config-manager",
        "image": image,
        "command": ["config-manager"],
        "env": _env({"ONESHOT": str(oneshot).lower(), "KUBECONFIG": "", "NODE_LABEL": CONFIG_LABEL,
                     "CONFIG_FILE_SRCDIR": "/available-configs", "CONFIG_FILE_DST": "/config/config.yaml",
                     "DEFAULT_CONFIG": default, "FALLBACK_STRATEGIES": "named,single",
                     "SEND_SIGNAL": str(not oneshot).lower(), "SIGNAL": "1", "PROCESS_TO_SIGNAL": process}),
        "volumeMounts": [{"name": "available-configs", "mountPath": "/available-configs"},
                         {"name": "config", "mountPath": "/config"}],
    }


def _with_config(spec: dict[str, Any], image: str, process: str, main: dict[str, Any],
                 pod: dict[str, Any]) -> None:
    """Add the config-manager init container and sidecar when the ClusterPolicy names a config."""
    config = _section(spec, "devicePlugin", "config")
    if not config.get("name"):
        return
    default = str(config.get("default") or "")
    main["env"].append({"name": "CONFIG_FILE", "value": "/config/config.yaml"})
    main.setdefault("volumeMounts", []).append({"name": "config", "mountPath": "/config"})
    pod["initContainers"] = [_config_manager(image, process, default, True)]
    pod["containers"].append(_config_manager(image, process, default, False))
    pod["volumes"] += [{"name": "available-configs", "configMap": {"name": config["name"]}},
                       {"name": "config", "emptyDir": {}}]


def _device_plugin_pod(spec: dict[str, Any], op: Operand) -> dict[str, Any]:
    image = image_of(spec, op)
    main = {
        "name": "nvidia-device-plugin",
        "image": image,
        "command": ["nvidia-device-plugin"],
        "env": _env({"PASS_DEVICE_SPECS": "true", "FAIL_ON_INIT_ERROR": "true", "DEVICE_LIST_STRATEGY": "envvar",
                     "DEVICE_ID_STRATEGY": "uuid", "NVIDIA_VISIBLE_DEVICES": "all",
                     "NVIDIA_DRIVER_CAPABILITIES": "all", "MIG_STRATEGY": _mig_strategy(spec)},
                    _section(spec, op.key).get("env")),
        "securityContext": {"privileged": True},
        "volumeMounts": [{"name": "device-plugin", "mountPath": "/var/lib/kubelet/device-plugins"}],
    }
    pod = {"containers": [main], "volumes": [_host_path("device-plugin", "/var/lib/kubelet/device-plugins")]}
    _with_config(spec, image, "nvidia-device-plugin", main, pod)
    return pod


def _gfd_pod(spec: dict[str, Any], op: Operand) -> dict[str, Any]:
    image = image_of(spec, op)
    main = {
        "name": "gpu-feature-discovery",
        "image": image,
        "command": ["gpu-feature-discovery"],
        "env": _env({"GFD_SLEEP_INTERVAL": "60s", "GFD_FAIL_ON_INIT_ERROR": "true",
                     "MIG_STRATEGY": _mig_strategy(spec)}, _section(spec, op.key).get("env")),
        "securityContext": {"privileged": True},
    }
    pod = {"containers": [main], "volumes": []}
    _with_config(spec, image, "gpu-feature-discovery", main, pod)
    return pod


def _dcgm_exporter_pod(spec: dict[str, Any], op: Operand) -> dict[str, Any]:
    return {"containers": [{
        "name": "nvidia-dcgm-exporter",
        "image": image_of(spec, op),
        "env": _env({"DCGM_EXPORTER_LISTEN": ":9400", "DCGM_EXPORTER_KUBERNETES": "true",
                     "DCGM_EXPORTER_COLLECTORS": "/etc/dcgm-exporter/dcp-metrics-included.csv"},
                    _section(spec, op.key).get("env")),
        "ports": [{"name": "metrics", "containerPort": 9400}],
        "securityContext": {"privileged": True},
    }], "volumes": []}


def _mig_manager_pod(spec: dict[str, Any], op: Operand) -> dict[str, Any]:
    env = _env({"CONFIG_FILE": "/mig-parted-config/config.yaml", "WITH_REBOOT": "false"},
               _section(spec, op.key).get("env"))
    env.append({"name": "DEFAULT_GPU_CLIENTS_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}})
    return {"containers": [{"name": "nvidia-mig-manager", "image": image_of(spec, op),
                            "command": ["nvidia-mig-manager"], "env": env,
                            "securityContext": {"privileged": True}}], "volumes": []}


def _validator_pod(spec: dict[str, Any], op: Operand) -> dict[str, Any]:
    image = image_of(spec, op)
    mounts = [{"name": "run-nvidia-validations", "mountPath": "/run/nvidia/validations",
               "mountPropagation": "Bidirectional"}]
    namespace = {"name": "OPERATOR_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}

    def check(component: str, pairs: dict[str, str]) -> dict[str, Any]:
        env = _env({"WITH_WAIT": "false", "COMPONENT": component, **pairs},
                   _section(spec, "validator", component).get("env"))
        return {"name": f"{component}-validation", "image": image, "command": ["sh", "-c"],
                "args": ["nvidia-validator"], "env": env + [namespace],
                "securityContext": {"privileged": True}, "volumeMounts": mounts}

    return {
        "initContainers": [
            check("driver", {"WITH_WAIT": "true"}),
            check("toolkit", {"NVIDIA_VISIBLE_DEVICES": "all"}),
            check("cuda", {"WITH_WORKLOAD": "true", "VALIDATOR_IMAGE": image}),
            check("plugin", {"WITH_WORKLOAD": "false", "MIG_STRATEGY": _mig_strategy(spec), "VALIDATOR_IMAGE": image}),
        ],
        "containers": [{
            "name": "nvidia-operator-validator", "image": image, "command": ["sh", "-c"],
            "args": ["echo all validations are successful; sleep infinity"],
            "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "rm -f /run/nvidia/validations/*-ready"]}}},
            "securityContext": {"privileged": True}, "volumeMounts": mounts,
        }],
        "volumes": [_host_path("run-nvidia-validations", "/run/nvidia/validations")],
    }


_PODS: dict[str, Callable[[dict[str, Any], Operand], dict[str, Any]]] = {
    "validator": _validator_pod, "devicePlugin": _device_plugin_pod, "dcgmExporter": _dcgm_exporter_pod,
    "gfd": _gfd_pod, "migManager": _mig_manager_pod,
}


def _mig_strategy(spec: dict[str, Any]) -> str:
    return str(_section(spec, "mig").get("strategy") or "single")


def owner_reference(policy: dict[str, Any]) -> dict[str, Any]:
    md = policy["metadata"]
    return {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "name": md["name"], "uid": md["uid"],
            "controller": True, "blockOwnerDeletion": True}


def daemonset(policy: dict[str, Any], op: Operand, namespace: str = NAMESPACE) -> dict[str, Any]:
    """The DaemonSet of ``op`` for this ClusterPolicy (with its spec hash annotation)."""
    spec = policy.get("spec") or {}
    ds_conf = _section(spec, "daemonsets")
    pod = _PODS[op.key](spec, op)
    tolerations = ds_conf.get("tolerations") or [{"key": "nvidia.com/gpu", "operator": "Exists",
                                                  "effect": "NoSchedule"}]
    template_spec: dict[str, Any] = {
        "nodeSelector": {f"nvidia.com/gpu.deploy.{op.deploy}": "true"},
        "tolerations": tolerations,
        "priorityClassName": ds_conf.get("priorityClassName") or "system-node-critical",
        "serviceAccountName": op.service_account,
        **{k: v for k, v in pod.items() if v},
    }
    strategy: dict[str, Any] = {"type": ds_conf.get("updateStrategy") or "RollingUpdate"}
    if strategy["type"] == "RollingUpdate":
        raw = str(_section(ds_conf, "rollingUpdate").get("maxUnavailable") or "1")
        strategy["rollingUpdate"] = {"maxUnavailable": int(raw) if raw.isdigit() else raw}
    labels = {"app": op.name, "app.kubernetes.io/part-of": "nvidia-gpu", **(ds_conf.get("labels") or {})}
    body = {
        "selector": {"matchLabels": {"app": op.name}},
        "updateStrategy": strategy,
        "template": {"metadata": {"labels": labels, "annotations": dict(ds_conf.get("annotations") or {})},
                     "spec": template_spec},
    }
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": op.name, "namespace": namespace,
                     "labels": {"app": op.name, "app.kubernetes.io/managed-by": OPERATOR_COMPONENT},
                     "annotations": {HASH_ANNOTATION: digest},
                     "ownerReferences": [owner_reference(policy)]},
        "spec": body,
    }


def desired_daemonsets(policy: dict[str, Any], namespace: str = NAMESPACE) -> dict[str, dict[str, Any] | None]:
    """DaemonSet name -> its spec, or None where the ClusterPolicy disables the operand."""
    spec = policy.get("spec") or {}
    return {op.name: daemonset(policy, op, namespace) if enabled(spec, op) else None for op in OPERANDS}


def runs_on(ds: dict[str, Any], node: dict[str, Any]) -> bool:
    """The DaemonSet controller starts a pod of ``ds`` on ``node``: its node selector matches and every taint
    that keeps new pods off is tolerated (a DaemonSet's pods tolerate the node.kubernetes.io/ conditions)."""
    template = ((ds.get("spec") or {}).get("template") or {}).get("spec") or {}
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in (template.get("nodeSelector") or {}).items()):
        return False
    tolerations = template.get("tolerations") or []
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") not in ("NoSchedule", "NoExecute") or taint.get("key", "").startswith(
                "node.kubernetes.io/"):
            continue
        if not any(_tolerates(t, taint) for t in tolerations):
            return False
    return True


def _tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if not toleration.get("key"):
        return toleration.get("operator") == "Exists"
    if toleration["key"] != taint.get("key"):
        return False
    return toleration.get("operator") == "Exists" or toleration.get("value", "") == taint.get("value", "")


def daemonset_ready(ds: dict[str, Any]) -> bool:
    st = ds.get("status") or {}
    if st.get("observedGeneration", 0) < ds["metadata"].get("generation", 1):
        return False
    desired = st.get("desiredNumberScheduled", 0)
    return st.get("numberReady", 0) == desired and st.get("updatedNumberScheduled", 0) == desired \
        and not st.get("numberUnavailable")


def non_mig_node_request(labels: dict[str, str], model) -> str | None:
    """Why a MIG layout requested on a GPU that cannot do MIG fails (None: nothing to say).

    NVIDIA deploys no MIG manager on such nodes, so the label would sit
    unanswered; gpulab's operator answers it as the MIG manager would.
    """
    requested = labels.get(mig.MIG_CONFIG_LABEL)
    if model.mig_capable or not requested or requested == "all-disabled":
        return None
    if labels.get(mig.MIG_CONFIG_STATE_LABEL) == mig.STATE_FAILED:
        return None
    return mig.decide_mig_transition(labels, model).reason


# --------------------------------------------------------------------------
# The operator program


class Operator:
    """Reconciles ClusterPolicies into node labels, DaemonSets and status."""

    def __init__(self, stack: GpuStack, namespace: str, log: Callable[[str, str], None]):
        self.stack = stack
        self.client = stack.client
        self.namespace = namespace
        self.log = log
        self._said: dict[str, str] = {}
        # Its DaemonSets as the shared watch has them (controller-runtime's cache of owned objects).
        self.daemonsets = stack.informers.informer("DaemonSet", namespace)

    def watch(self, wake: threading.Event) -> Callable[[], None]:
        """Set ``wake`` whenever one of its DaemonSets changes (their status: operand pods ready); returns what
        undoes it."""
        handler = self.daemonsets.on_change(wake.set)
        self.daemonsets.start()
        # Its chart installed the ClusterPolicy CRD before it: the shared watch, started with the node agent
        # (maybe before the CRD), lists them now, as the operator's own cache would as it starts.
        self.stack.policies.list_now()
        self.stack.policies.wait_synced(10)
        self.daemonsets.wait_synced(10)
        return lambda: self.daemonsets.remove_handler(handler)

    def _say(self, key: str, msg: str, level: str = "info") -> None:
        # Log a line when what it says changed, as controller-runtime logs transitions.
        if self._said.get(key) != msg:
            self._said[key] = msg
            self.log(level, msg)

    def reconcile(self) -> bool:
        """One pass over the ClusterPolicies (from the stack's shared watch); True when the active one is ready."""
        policies = sorted(self.stack.policies.list(),
                          key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]))
        if not policies:
            self._say("policy", "no ClusterPolicy: nothing to deploy")
            return True
        active, others = policies[0], policies[1:]
        for extra in others:
            self._status(extra, STATE_IGNORED, "another ClusterPolicy is already in use: "
                         f"{active['metadata']['name']}")
        spec = active.get("spec") or {}
        self._say("policy", f"Reconciling ClusterPolicy {active['metadata']['name']}")
        self._label_nodes(spec)
        self._service_accounts(active)
        not_ready = []
        for name, want in desired_daemonsets(active, self.namespace).items():
            have = self.daemonsets.get(f"{self.namespace}/{name}")
            if want is None:
                if have is not None:
                    self.client.delete("DaemonSet", name, self.namespace, propagation="Background")
                    self._say(name, f"DaemonSet {name} deleted (disabled in the ClusterPolicy)")
                continue
            digest = want["metadata"]["annotations"][HASH_ANNOTATION]
            if have is None or (have["metadata"].get("annotations") or {}).get(HASH_ANNOTATION) != digest:
                have = self.client.apply(want, manager=MANAGER)
                self._say(name, f"DaemonSet {name} {'updated' if have['metadata'].get('generation', 1) > 1 else 'created'}"
                          f" ({digest})")
            if not daemonset_ready(have):
                not_ready.append(name)
        if not_ready:
            self._status(active, STATE_NOT_READY, f"not ready: {', '.join(sorted(not_ready))}")
        else:
            self._status(active, STATE_READY, "ClusterPolicy is ready as all resources have been successfully "
                                              "reconciled")
        return not not_ready

    def _label_nodes(self, spec: dict[str, Any]) -> None:
        default_mig = str(_section(spec, "migManager", "config").get("default") or "all-disabled")
        driver_managed = _section(spec, "driver").get("enabled", True) is not False
        for node in self.stack.node_objects():
            name = node["metadata"]["name"]
            labels = node["metadata"].get("labels") or {}
            gpu = self.stack.gpu_node(name)
            if gpu is None or labels.get(gfd.PCI_PRESENT_LABEL) != "true":
                continue
            want = gfd.operator_labels(gpu.model, gpu.count, existing=labels, mig_config_default=default_mig,
                                       driver_managed=driver_managed)
            patch: dict[str, str | None] = {k: v for k, v in want.items() if labels.get(k) != v}
            why = non_mig_node_request({**labels, **patch}, gpu.model)
            if why:
                patch[mig.MIG_CONFIG_STATE_LABEL] = mig.STATE_FAILED
                self.stack.node_event(name, "MigConfigFailed", why, "Warning", component=OPERATOR_COMPONENT)
            if patch:
                self.client.patch("Node", name, {"metadata": {"labels": patch}})
                self._say(f"labels/{name}", f"labelled node {name}: {', '.join(sorted(patch))}")

    def _service_accounts(self, policy: dict[str, Any]) -> None:
        for op in OPERANDS:
            key = f"sa/{op.service_account}"
            if self._said.get(key) == policy["metadata"]["uid"]:
                continue
            self.client.apply({"apiVersion": "v1", "kind": "ServiceAccount",
                               "metadata": {"name": op.service_account, "namespace": self.namespace,
                                            "ownerReferences": [owner_reference(policy)]}}, manager=MANAGER)
            self._said[key] = policy["metadata"]["uid"]

    def _status(self, policy: dict[str, Any], state: str, message: str) -> None:
        old = policy.get("status") or {}
        ready = state == STATE_READY
        if old.get("state") == state and old.get("namespace") == self.namespace and \
                next((c.get("message") for c in old.get("conditions") or [] if c.get("type") == "Ready"), None) == message:
            return
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status = {"state": state, "namespace": self.namespace, "conditions": [
            {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": now,
             "reason": "Reconciled" if ready else ("Ignored" if state == STATE_IGNORED else "OperandNotReady"),
             "message": message},
            {"type": "Error", "status": "False", "lastTransitionTime": now, "reason": "Ready" if ready else state,
             "message": ""},
        ]}
        self.client.patch("ClusterPolicy", policy["metadata"]["name"], {"status": status}, subresource="status")
        self._say(f"state/{policy['metadata']['name']}", f"ClusterPolicy {policy['metadata']['name']} is {state}: "
                                                         f"{message}")


def _operator_program(stack: GpuStack, stop: threading.Event, ctx: programs.ProgramContext) -> int:
    def log(level: str, msg: str) -> None:
        line = json.dumps({"level": level, "ts": round(time.time(), 3), "logger": "controllers.ClusterPolicy",
                           "msg": msg})
        try:
            ctx.log("stderr", line)
        except ValueError:
            pass

    log("info", "starting manager")
    op = Operator(stack, ctx.pod["metadata"]["namespace"], log)
    sub = stack.subscribe()
    # A program's stop wakes its wait at once; any other stop is looked at every second.
    stop_wakes = isinstance(stop, programs.StopEvent)
    if stop_wakes:
        stop.also_wake(sub.event)
    unwatch = op.watch(sub.event)
    last = -BATCH_S
    try:
        while not stop.is_set():
            # A burst of changes (a fleet's operand pods getting ready, GFD labelling every node) makes one pass.
            if stop.wait(last + BATCH_S - time.monotonic()):
                break
            last = time.monotonic()
            wait = NOT_READY_REQUEUE_S
            try:
                if op.reconcile():
                    wait = RESYNC_S
            except (api.ApiError, api.NotFound, api.Conflict) as e:
                op._say("error", f"Reconciler error: {e}", "error")
                wait = 1.0
            sub.wait(wait if stop_wakes else min(wait, 1.0))
    finally:
        unwatch()
        stack.unsubscribe(sub)
    return 0


def register(stack: GpuStack) -> None:
    programs.register(OPERATOR_IMAGE, lambda ctx: programs.FunctionProgram(
        ctx, lambda stop, c: _operator_program(stack, stop, c)))


# --------------------------------------------------------------------------
# Installation at bring-up


def manifest_documents(folder: Path | None = None) -> list[dict[str, Any]]:
    """Every YAML document of the folder's files, in file-name order (default: the operator's)."""
    docs: list[dict[str, Any]] = []
    for f in sorted((folder or manifests_dir()).glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(f.read_text()) if d]
    return docs


def _rfc3339_seconds(text: str) -> float:
    import calendar

    return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))


def stack_ready(client: api.Client, since: float = 0.0) -> str | None:
    """None when the GPU stack is up; else what it waits for.

    Up means: ``cluster-policy`` is ready, every enabled operand DaemonSet
    carries the policy's current spec and is fully rolled out, and every pod
    of the operator and its DaemonSets has been Ready since ``since`` (by
    default: is Ready).
    """
    policy = client.get("ClusterPolicy", POLICY_NAME)
    state = ((policy or {}).get("status") or {}).get("state")
    if state != STATE_READY:
        return f"clusterpolicy/{POLICY_NAME}: {state or 'no status yet'}"
    pods = client.list("Pod", NAMESPACE)
    nodes = client.list("Node")
    for name, want in desired_daemonsets(policy, NAMESPACE).items():  # type: ignore[arg-type]
        ds = client.get("DaemonSet", name, NAMESPACE) if want is not None else None
        if want is None:
            continue
        if ds is None or (ds["metadata"].get("annotations") or {}).get(HASH_ANNOTATION) \
                != want["metadata"]["annotations"][HASH_ANNOTATION]:
            # The policy's status (and the DaemonSet's) may still describe the spec before the last change.
            return f"daemonset/{name}: the operator has not applied the ClusterPolicy's current spec yet"
        if not daemonset_ready(ds):
            return f"daemonset/{name} rolling out"
        # The DaemonSet's status lags behind its pods; count them too.
        ready = [p for p in pods if (p["metadata"].get("labels") or {}).get("app") == name
                 and not p["metadata"].get("deletionTimestamp") and _ready_since(p, since)]
        if len(ready) != (ds.get("status") or {}).get("desiredNumberScheduled", 0):
            return f"daemonset/{name}: {len(ready)} pods ready"
        # ... and its status lags behind the nodes' labels (a MIG change pauses and brings back operands by them).
        expected = sum(1 for node in nodes if runs_on(ds, node))
        if len(ready) < expected:
            return f"daemonset/{name}: {len(ready)} pods ready of the {expected} its node selector matches"
    for pod in pods:
        owners = {o.get("kind") for o in pod["metadata"].get("ownerReferences") or []}
        if "ReplicaSet" in owners and not _ready_since(pod, since):
            return f"pod/{pod['metadata']['name']} not ready"
    return None


def _ready_since(pod: dict[str, Any], since: float) -> bool:
    ready = next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), {})
    changed = ready.get("lastTransitionTime") or "1970-01-01T00:00:00Z"
    return ready.get("status") == "True" and _rfc3339_seconds(changed) >= int(since)


class _TimedOut(Exception):
    """:func:`install`'s wait for the stack running out, which it reports rather than raises."""


def install(kubeconfig: Path, say: Callable[[str], None], since: float = 0.0, timeout: float = 90.0) -> None:
    """Install the GPU Operator as its Helm chart does, then wait until the GPU stack is up.

    ``since`` is when the node agent (which runs the stack's pods) last
    started. Re-running it updates the operator's objects and keeps an
    existing ClusterPolicy (and the user's changes to it) as it is. A stack
    that is not up in time (say, a fault is set) is reported, not fatal.
    """
    client = api.Client(kubeconfig)
    started = time.monotonic()
    policies = []
    for doc in manifest_documents():
        if doc["kind"] == "ClusterPolicy":
            policies.append(doc)
            continue
        client.apply(doc, manager="gpulab-install")
        if doc["kind"] == "CustomResourceDefinition":
            client.wait_crd(doc["metadata"]["name"])
    for doc in policies:
        if client.get("ClusterPolicy", doc["metadata"]["name"]) is None:
            # Applied as the chart's other objects are (Helm 4 applies server-side). A create (POST) of a custom
            # resource within 2 s of its CRD's Established condition waits 2 s in the apiserver.
            client.apply(doc, manager="gpulab-install")
    waiting: str | None = None

    def up() -> bool:
        nonlocal waiting
        waiting = stack_ready(client, since)
        return waiting is None

    try:
        # The timeout counts from the start of the install, not of this wait.
        _poll.until(up, timeout - (time.monotonic() - started), lambda last: _TimedOut(), interval=0.5)
    except _TimedOut:
        say(_("GPU Operator not ready after {seconds:.0f} s ({waiting}); see `kubectl -n {namespace} get pods` "
              "and `gpulab fault list`", seconds=timeout, waiting=waiting, namespace=NAMESPACE))
        return
    say(_("GPU Operator ready in {seconds:.1f} s (clusterpolicy/{policy}: ready)", seconds=time.monotonic() - started,
          policy=POLICY_NAME))
