"""NVIDIA's node components as built-in programs of their images.

The GPU Operator's DaemonSets (:mod:`gpulab.fakegpu.operator`) use NVIDIA's
image names; each is registered with :mod:`gpulab.runtime.programs`, so a
container of that image runs the matching program below in the node agent,
for its node. What they do is what NVIDIA's programs do, against the
simulated hardware (:class:`~gpulab.fakegpu.node.GpuNode`) and the real API:

``nvcr.io/nvidia/k8s-device-plugin``
    by command: ``nvidia-device-plugin`` serves the node's GPUs over the
    kubelet device-plugin API on the node's ``kubelet.sock``
    (:class:`~gpulab.fakegpu.deviceplugin.plugin.DevicePlugin`), with the
    config file ``CONFIG_FILE`` (time-slicing, MPS, migStrategy) and
    ``MIG_STRATEGY``; ``gpu-feature-discovery`` keeps the node's GFD labels
    current; ``config-manager`` picks the config for the node from the
    ConfigMap and the ``nvidia.com/device-plugin.config`` label.
``nvcr.io/nvidia/cloud-native/k8s-mig-manager``
    applies ``nvidia.com/mig.config`` (decisions: :mod:`gpulab.fakegpu.mig`).
``nvcr.io/nvidia/cloud-native/gpu-operator-validator``
    the operator validator's init containers (driver, toolkit, cuda with its
    ``nvidia-cuda-validator`` workload pod, plugin) and main container.
``nvcr.io/nvidia/k8s/dcgm-exporter``
    DCGM metrics of the node's GPUs in Prometheus format, on 127.0.0.1
    (the address is in the pod's ``gpulab.io/metrics-endpoint`` annotation).

A program that fails exits non-zero and its container restarts with
back-off, so a broken component shows as CrashLoopBackOff, as it would.
"""

from __future__ import annotations

import io
import json
import os
import random
import string
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .._fsutil import file_identity
from ..kube import api
from ..runtime import programs
from . import dcgm, gfd, mig, nvidiasmi
from .config import (
    CONFIG_LABEL,
    DEFAULT_CONFIG,
    ConfigError,
    DevicePluginConfig,
    DevicePluginError,
    NodeResources,
    advertised_resources,
    parse_config,
    select_config,
)
from .deviceplugin import DEVICE_PLUGIN_PATH
from .deviceplugin.plugin import DevicePlugin, PluginConfig, socket_name
from ..hardware.models import GpuModelError

if TYPE_CHECKING:
    from .node import GpuNode
    from .stack import GpuStack

DEVICE_PLUGIN_IMAGE = "nvcr.io/nvidia/k8s-device-plugin"
MIG_MANAGER_IMAGE = "nvcr.io/nvidia/cloud-native/k8s-mig-manager"
VALIDATOR_IMAGE = "nvcr.io/nvidia/cloud-native/gpu-operator-validator"
DCGM_EXPORTER_IMAGE = "nvcr.io/nvidia/k8s/dcgm-exporter"

METRICS_ANNOTATION = "gpulab.io/metrics-endpoint"
VALIDATIONS_DIR = "/run/nvidia/validations"
#: The CUDA runtime the validator's vectorAdd sample is built with.
VALIDATOR_CUDA_RUNTIME = "12.8"
POLL = 0.5


# --------------------------------------------------------------------------
# Plumbing shared by the programs


class Out:
    """A program's log lines, klog-style as NVIDIA's Go components write them."""

    def __init__(self, ctx: programs.ProgramContext, source: str):
        self.ctx = ctx
        self.source = source

    def _write(self, stream: str, text: str) -> None:
        try:
            self.ctx.log(stream, text)
        except ValueError:
            pass  # the container already ended: its log is closed

    def _klog(self, severity: str, msg: str) -> None:
        now = time.time()
        stamp = time.strftime("%m%d %H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}"
        for i, line in enumerate(msg.splitlines() or [""]):
            self._write("stderr", f"{severity}{stamp}       1 {self.source}] {line}" if i == 0 else line)

    def info(self, msg: str) -> None:
        self._klog("I", msg)

    def warning(self, msg: str) -> None:
        self._klog("W", msg)

    def error(self, msg: str) -> None:
        self._klog("E", msg)

    def print(self, text: str) -> None:
        for line in text.rstrip("\n").splitlines():
            self._write("stdout", line)


def host_path(ctx: programs.ProgramContext, container_path: str) -> Path | None:
    """Where a path inside the container lives on the node (through its volume mounts)."""
    best: tuple[str, dict[str, Any]] | None = None
    for vm in ctx.container.get("volumeMounts") or []:
        mount = vm["mountPath"].rstrip("/") or "/"
        if container_path == mount or container_path.startswith(mount.rstrip("/") + "/"):
            if best is None or len(mount) > len(best[0]):
                best = (mount, vm)
    if best is None or best[1]["name"] not in ctx.volumes:
        return None
    base = ctx.volumes[best[1]["name"]]
    if best[1].get("subPath"):
        base = base / best[1]["subPath"]
    rest = container_path[len(best[0]):].lstrip("/")
    return base / rest if rest else base


def argv(ctx: programs.ProgramContext) -> list[str]:
    return list(ctx.container.get("command") or []) + list(ctx.container.get("args") or [])


def _node_labels(stack: "GpuStack", node: str) -> dict[str, str]:
    obj = stack.node_object(node) or {}
    return dict((obj.get("metadata") or {}).get("labels") or {})


def _patch_labels(stack: "GpuStack", node: str, labels: dict[str, str | None]) -> None:
    if labels:
        stack.client.patch("Node", node, {"metadata": {"labels": labels}})


def load_plugin_config(ctx: programs.ProgramContext) -> DevicePluginConfig:
    """The config file the container was given (``CONFIG_FILE``), with ``MIG_STRATEGY`` applied.

    No file: the plugin's defaults. Raises ConfigError.
    """
    path = ctx.env.get("CONFIG_FILE")
    host = host_path(ctx, path) if path else None
    config = DEFAULT_CONFIG
    if host is not None and host.is_file():
        config = parse_config(host.read_text(), path=path or "config")
    return config.with_mig_strategy(ctx.env.get("MIG_STRATEGY") or None)


def config_document(config: DevicePluginConfig, env: dict[str, str] | None = None) -> dict[str, Any]:
    """A parsed config as the device plugin prints it at start ("Running with config").

    ``env`` holds the container's flags as environment variables, which beat
    the config file (the DaemonSet sets PASS_DEVICE_SPECS and friends).
    """
    p = config.flags.plugin
    env = env or {}

    def flag(name: str, value: Any) -> Any:
        raw = env.get(name)
        if raw is None:
            return value
        return raw.lower() == "true" if isinstance(value, bool) else raw

    doc: dict[str, Any] = {
        "version": config.version,
        "flags": {
            "migStrategy": config.flags.mig_strategy,
            "failOnInitError": flag("FAIL_ON_INIT_ERROR", config.flags.fail_on_init_error),
            "nvidiaDriverRoot": config.flags.nvidia_driver_root,
            "plugin": {"passDeviceSpecs": flag("PASS_DEVICE_SPECS", p.pass_device_specs),
                       "deviceListStrategy": env["DEVICE_LIST_STRATEGY"].split(",")
                       if env.get("DEVICE_LIST_STRATEGY") else list(p.device_list_strategy),
                       "deviceIDStrategy": flag("DEVICE_ID_STRATEGY", p.device_id_strategy)},
        },
        "resources": {"gpus": [{"pattern": "*", "name": "nvidia.com/gpu"}]},
        "sharing": {},
    }
    for key, shared in (("timeSlicing", config.sharing.time_slicing), ("mps", config.sharing.mps)):
        if shared is not None and shared.resources:
            doc["sharing"][key] = {
                "renameByDefault": shared.rename_by_default,
                "failRequestsGreaterThanOne": shared.fail_requests_greater_than_one,
                "resources": [{"name": r.name, "devices": "all", "replicas": r.replicas} for r in shared.resources],
            }
    return doc


def _program(stack: "GpuStack", run: Callable[["GpuStack", threading.Event, programs.ProgramContext], int | None]
             ) -> programs.Factory:
    return lambda ctx: programs.FunctionProgram(ctx, lambda stop, c: run(stack, stop, c))


# --------------------------------------------------------------------------
# k8s-device-plugin image: device plugin, GFD, config manager


class DevicePluginMain:
    """``nvidia-device-plugin`` for one node."""

    def __init__(self, stack: "GpuStack", ctx: programs.ProgramContext):
        self.stack = stack
        self.ctx = ctx
        self.out = Out(ctx, "main.go:356")
        self.node = stack.gpu_node(ctx.node)
        self.plugin: DevicePlugin | None = None
        self.resources: NodeResources | None = None
        self.unhealthy: frozenset[int] = frozenset()
        self.announced: set[str] = set()

    def run(self, stop: threading.Event) -> int:
        out = self.out
        out.info("Starting FS watcher.")
        out.info("Starting OS watcher.")
        if self.node is None:
            out.info("No devices found. Waiting indefinitely.")
            stop.wait()
            return 0
        sub = self.stack.subscribe()
        try:
            return self._loop(stop, sub)
        finally:
            self.stack.unsubscribe(sub)
            if self.plugin is not None:
                self.plugin.stop()

    def _loop(self, stop: threading.Event, sub) -> int:
        node = self.node
        assert node is not None
        config_path = host_path(self.ctx, self.ctx.env["CONFIG_FILE"]) if self.ctx.env.get("CONFIG_FILE") else None
        seen: object = object()
        while not stop.is_set():
            failure = self._fault_failure(node)
            if failure:
                self.out.error(failure)
                return 1
            config_id = file_identity(config_path)
            if config_id != seen:
                if self.resources is not None:
                    self.out.info('Received signal "hangup", restarting.')
                    self._stop_plugin()
                seen = config_id
                rc = self._start(node)
                if rc is not None:
                    return rc
            elif self.plugin is not None and node.faults.unhealthy_gpus != self.unhealthy:
                self._update_health(node)
            if self.plugin is not None:
                for r in self.resources or ():
                    if r.name not in self.announced and self.plugin.is_registered(r.name):
                        self.announced.add(r.name)
                        self.out.info(f"Registered device plugin for '{r.name}' with Kubelet")
            sub.wait(POLL)
        return 0

    @staticmethod
    def _fault_failure(node: "GpuNode") -> str | None:
        if node.faults.driver_unreachable:
            return ("error starting plugins: error getting plugins: failed to construct NVML resource managers: "
                    "error initializing NVML: Driver Not Loaded")
        if node.faults.plugin_down:
            return (f"error starting plugins: the device plugin is held down on {node.name} by gpulab fault "
                    "'device-plugin-down' (gpulab fault clear)")
        return None

    def _stop_plugin(self) -> None:
        if self.plugin is not None:
            self.plugin.stop()
        self.plugin = None
        self.resources = None
        self.announced.clear()

    def _start(self, node: "GpuNode") -> int | None:
        out = self.out
        out.info("Starting Plugins.")
        out.info("Loading configuration.")
        try:
            config = load_plugin_config(self.ctx)
        except ConfigError as e:
            out.error(f"error starting plugins: unable to load config: {e}")
            return 1
        out.info("Updating config with default resource matching patterns.")
        out.info("\nRunning with config:\n" + json.dumps(config_document(config, self.ctx.env), indent=2))
        for warning in config.warnings:
            out.warning(warning)
        try:
            resources = advertised_resources(node.model, node.count, node.name, config, mig_layout=node.mig_layout)
        except (DevicePluginError, ConfigError, GpuModelError) as e:
            out.error(f"error starting plugins: {e}")
            return 1
        node.publish(resources)
        self.resources = resources
        self.unhealthy = node.faults.unhealthy_gpus
        if not len(resources):
            out.info("No devices found. Waiting indefinitely.")
            return None
        plugin_dir = host_path(self.ctx, DEVICE_PLUGIN_PATH.rstrip("/"))
        if plugin_dir is not None:
            # The real directory: under a long GPULAB_HOME the node's path is a symlink to a
            # short one, and socket paths must stay under 108 bytes (see node.socket_dir).
            plugin_dir = plugin_dir.resolve()
        if plugin_dir is None:
            out.error(f"error starting plugins: the container must mount the host's {DEVICE_PLUGIN_PATH} "
                      "(a hostPath volume), where the kubelet's socket is")
            return 1
        pass_specs = self.ctx.env.get("PASS_DEVICE_SPECS", "true").lower() == "true"
        self.plugin = DevicePlugin(
            PluginConfig(plugin_dir=plugin_dir, nvidia_smi=node.nvidia_smi, state_dir=plugin_dir / "gpulab-nvidia-smi",
                         dev_root=node.dev_root, pass_device_specs=pass_specs, poll_interval=POLL),
            inventory=node.inventory(resources))
        self.plugin.start()
        for r in resources:
            out.info(f"Starting GRPC server for '{r.name}'")
            out.info(f"Starting to serve '{r.name}' on /var/lib/kubelet/device-plugins/{socket_name(r.name)}")
        self._log_unhealthy(node, frozenset(), self.unhealthy)
        return None

    def _update_health(self, node: "GpuNode") -> None:
        assert self.plugin is not None and self.resources is not None
        now = node.faults.unhealthy_gpus
        self.plugin.update_inventory(node.inventory(self.resources))
        self._log_unhealthy(node, self.unhealthy, now)
        self.unhealthy = now

    def _log_unhealthy(self, node: "GpuNode", before: frozenset[int], after: frozenset[int]) -> None:
        from ..hardware.models import gpu_uuid

        for i in sorted(after - before):
            self.out.info(f"XidCriticalError: Xid=79 on Device={gpu_uuid(node.name, i)}; marking device as unhealthy.")
            for r in self.resources or ():
                for d in r.devices:
                    if d.gpu_index == i:
                        self.out.info(f"'{r.name}' device marked unhealthy: {d.id}")
        for i in sorted(before - after):
            self.out.info(f"Device {gpu_uuid(node.name, i)} is healthy again (gpulab fault cleared)")


class GfdMain:
    """``gpu-feature-discovery``: the node's GFD labels, kept current."""

    def __init__(self, stack: "GpuStack", ctx: programs.ProgramContext):
        self.stack = stack
        self.ctx = ctx
        self.out = Out(ctx, "main.go:152")
        self.node = stack.gpu_node(ctx.node)

    def run(self, stop: threading.Event) -> int:
        out = self.out
        out.info("Starting OS watcher.")
        out.info("Loading configuration.")
        if self.node is None:
            out.info("No GPUs on this node; nothing to label. Waiting indefinitely.")
            stop.wait()
            return 0
        interval = _seconds(self.ctx.env.get("GFD_SLEEP_INTERVAL", "60s"), 60.0)
        config_path = host_path(self.ctx, self.ctx.env["CONFIG_FILE"]) if self.ctx.env.get("CONFIG_FILE") else None
        seen: object = object()
        config = DEFAULT_CONFIG
        last_write = 0.0
        sub = self.stack.subscribe()
        try:
            while not stop.is_set():
                if self.node.faults.driver_unreachable:
                    out.error("Failed to initialize NVML: Driver Not Loaded")
                    return 1
                if file_identity(config_path) != seen:
                    seen = file_identity(config_path)
                    try:
                        config = load_plugin_config(self.ctx)
                    except ConfigError as e:
                        out.error(f"unable to load config: {e}")
                        return 1
                    out.info("\nRunning with config:\n" + json.dumps(config_document(config), indent=2))
                    out.info("Start running")
                try:
                    if self._label(config, force=time.monotonic() - last_write >= interval):
                        last_write = time.monotonic()
                except (DevicePluginError, GpuModelError) as e:
                    out.error(f"error creating labels: {e}")
                    return 1
                except (api.ApiError, api.NotFound, api.Conflict) as e:
                    out.warning(f"error writing labels: {e}; retrying")
                sub.wait(1.0)
        finally:
            self.stack.unsubscribe(sub)
        return 0

    def _label(self, config: DevicePluginConfig, force: bool) -> bool:
        node = self.node
        assert node is not None
        driver, cuda = node.versions()
        want = gfd.gfd_labels(node.model, node.count, config=config, mig_layout=node.mig_layout,
                              driver_version=driver, cuda_version=cuda)
        have = {k: v for k, v in _node_labels(self.stack, node.name).items() if gfd.label_owner(k) == "gfd"}

        def content(labels: dict[str, str]) -> dict[str, str]:
            return {k: v for k, v in labels.items() if k != gfd.TIMESTAMP_LABEL}

        changed = content(want) != content(have)
        if not changed and not force:
            return False
        patch: dict[str, str | None] = {k: v for k, v in want.items() if have.get(k) != v}
        patch.update({k: None for k in have if k not in want})
        _patch_labels(self.stack, node.name, patch)
        if changed:
            self.out.info("Creating Labels")
            self.out.info(f"Writing {len(want)} labels to the node")
        return True


class ConfigManagerMain:
    """``config-manager``: the device-plugin config for this node, from the ConfigMap and the node label.

    As init container (``ONESHOT=true``) it writes the config once and exits;
    as sidecar it follows the label. A config that does not parse is not
    applied: the sidecar keeps the last good one and says why in an Event on
    the node; at init, with nothing to keep, it fails.
    """

    def __init__(self, stack: "GpuStack", ctx: programs.ProgramContext):
        self.stack = stack
        self.ctx = ctx
        self.out = Out(ctx, "main.go:208")
        env = ctx.env
        self.oneshot = env.get("ONESHOT", "false").lower() == "true"
        self.label = env.get("NODE_LABEL") or CONFIG_LABEL
        self.default = env.get("DEFAULT_CONFIG") or None
        self.fallbacks = tuple(s for s in (env.get("FALLBACK_STRATEGIES") or "named,single").split(",") if s)
        self.dst = host_path(ctx, env.get("CONFIG_FILE_DST", "/config/config.yaml"))
        self.configmap = next((v["configMap"]["name"] for v in ctx.pod["spec"].get("volumes") or []
                               if v["name"] == "available-configs" and v.get("configMap")), None)
        self.namespace = ctx.pod["metadata"]["namespace"]

    def run(self, stop: threading.Event) -> int:
        if self.dst is None or self.configmap is None:
            self.out.error("config-manager needs the 'available-configs' ConfigMap volume and CONFIG_FILE_DST "
                           "on a mounted volume")
            return 1
        current = self._written() if not self.oneshot else None
        last_label: object = object()
        sub = self.stack.subscribe()
        try:
            while not stop.is_set():
                value = _node_labels(self.stack, self.ctx.node).get(self.label)
                if value != last_label:
                    last_label = value
                    self.out.info(f"Updating to config: {value or '<default>'} (label {self.label}={value or ''})")
                    result = self._apply(value, current)
                    if isinstance(result, int):
                        return result
                    current = result
                    if self.oneshot:
                        return 0
                sub.wait(POLL)
        finally:
            self.stack.unsubscribe(sub)
        return 0

    def _written(self) -> tuple[str | None, str] | None:
        """The config the init container wrote, which the sidecar starts from."""
        assert self.dst is not None
        try:
            return (self._name_file.read_text().strip() or None, self.dst.read_text())
        except OSError:
            return None

    @property
    def _name_file(self) -> Path:
        assert self.dst is not None
        return self.dst.with_name(f".{self.dst.name}.name")

    def _apply(self, label: str | None, current: tuple[str | None, str] | None) -> tuple[str | None, str] | int:
        """Select, check and write the config; the new (name, text), or an exit code."""
        node = self.ctx.node
        cm = self.stack.client.get("ConfigMap", self.configmap, self.namespace)
        data = (cm or {}).get("data") or {}
        selection = select_config(data, label, self.default, self.fallbacks)
        if selection.name is None:
            if label is None and "empty" in self.fallbacks:
                self.dst.unlink(missing_ok=True)
                self._name_file.unlink(missing_ok=True)
                return (None, "")
            msg = f"ConfigMap {self.namespace}/{self.configmap}: {selection.reason}"
            return self._refuse(node, "DevicePluginConfigNotFound", msg, current)
        text = data[selection.name]
        try:
            parse_config(text, path=f"{self.configmap}/{selection.name}")
        except ConfigError as e:
            return self._refuse(node, "DevicePluginConfigInvalid",
                                f"config {selection.name!r} of ConfigMap {self.namespace}/{self.configmap} is invalid: "
                                f"{e.summary()}", current)
        if current is not None and current == (selection.name, text):
            return current
        self.dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.dst.with_name(f".{self.dst.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, self.dst)
        self._name_file.write_text(selection.name)
        self.out.info(f"Successfully updated to config: {selection.name} ({selection.reason})")
        if not self.oneshot:
            self.stack.node_event(node, "DevicePluginConfigApplied",
                                  f"device plugin config {selection.name!r} from ConfigMap "
                                  f"{self.namespace}/{self.configmap} applied", component="config-manager")
        return (selection.name, text)

    def _refuse(self, node: str, reason: str, message: str,
                current: tuple[str | None, str] | None) -> tuple[str | None, str] | int:
        if current is None:
            self.out.error(f"Error: {message}")
            self.stack.node_event(node, reason, f"{message}; the device plugin cannot start",
                                  "Warning", component="config-manager")
            return 1
        keep = current[0] or "<defaults>"
        self.out.warning(f"{message}; keeping config {keep}")
        self.stack.node_event(node, reason, f"{message}; keeping the last good config {keep!r}", "Warning",
                              component="config-manager")
        return current


def _seconds(text: str, default: float) -> float:
    text = text.strip()
    try:
        if text.endswith("ms"):
            return float(text[:-2]) / 1000
        if text.endswith("m"):
            return float(text[:-1]) * 60
        return float(text.rstrip("s"))
    except ValueError:
        return default


def _device_plugin_image(stack: "GpuStack", stop: threading.Event, ctx: programs.ProgramContext) -> int | None:
    cmd = argv(ctx)
    name = os.path.basename(cmd[0]) if cmd else "nvidia-device-plugin"
    if name in ("sh", "bash") and len(cmd) > 2:
        name = os.path.basename(cmd[-1].split()[-1])  # `sh -c "... exec nvidia-device-plugin"`
    programs_by_name: dict[str, Callable[[], Any]] = {
        "nvidia-device-plugin": lambda: DevicePluginMain(stack, ctx),
        "gpu-feature-discovery": lambda: GfdMain(stack, ctx),
        "config-manager": lambda: ConfigManagerMain(stack, ctx),
    }
    if name not in programs_by_name:
        Out(ctx, "main.go:1").print(f'exec: "{name}": executable file not found in $PATH')
        return 127
    return programs_by_name[name]().run(stop)


# --------------------------------------------------------------------------
# MIG manager


class MigManagerMain:
    """``nvidia-mig-manager``: applies ``nvidia.com/mig.config`` to the node's GPUs."""

    WAIT_S = 120.0

    def __init__(self, stack: "GpuStack", ctx: programs.ProgramContext):
        self.stack = stack
        self.ctx = ctx
        self.out = Out(ctx, "main.go:287")
        self.node = stack.gpu_node(ctx.node)
        self.namespace = ctx.env.get("DEFAULT_GPU_CLIENTS_NAMESPACE") or ctx.pod["metadata"]["namespace"]

    def run(self, stop: threading.Event) -> int:
        node = self.node
        if node is None or not node.model.mig_capable:
            self.out.info("No MIG-capable GPU on this node; nothing to do. Waiting indefinitely.")
            stop.wait()
            return 0
        self.out.info(f"Watching changes to the '{mig.MIG_CONFIG_LABEL}' label on node {node.name}")
        last: object = object()
        sub = self.stack.subscribe()
        try:
            while not stop.is_set():
                labels = _node_labels(self.stack, node.name)
                if labels and labels.get(mig.MIG_CONFIG_LABEL) != last:
                    last = labels.get(mig.MIG_CONFIG_LABEL)
                    self.out.info(f"Updating to MIG config: {last}")
                    self._reconfigure(labels, stop)
                sub.wait(POLL)
        finally:
            self.stack.unsubscribe(sub)
        return 0

    def _reconfigure(self, labels: dict[str, str], stop: threading.Event) -> None:
        node = self.node
        assert node is not None
        decision = mig.decide_mig_transition(labels, node.model, applied=node.mig_layout, gpu_pods=node.gpu_pods())
        restore = {k: ("false" if labels.get(k) == "false" else "true") for k in mig.CLIENT_DEPLOY_LABELS}
        try:
            for step in decision.steps:
                if stop.is_set():
                    return
                self.out.info(step.message)
                if step.action == "set-labels":
                    _patch_labels(self.stack, node.name, dict(step.labels))
                elif step.action == "wait-pods-deleted":
                    self._wait_gone(step.selector or "", stop)
                elif step.action == "delete-pods":
                    for pod in self._pods(step.selector or ""):
                        self.stack.client.delete("Pod", pod["metadata"]["name"], self.namespace, grace_seconds=0)
                elif step.action == "apply-mig":
                    node.apply_mig(step.layout)
        except (TimeoutError, api.ApiError, api.NotFound, api.Conflict) as e:
            self.out.error(f"Error applying MIG configuration: {e}")
            _patch_labels(self.stack, node.name, {**restore, mig.MIG_CONFIG_STATE_LABEL: mig.STATE_FAILED})
            self.stack.node_event(node.name, "MigConfigFailed", f"MIG config {decision.requested!r}: {e}",
                                  "Warning", component="nvidia-mig-manager")
            return
        if decision.outcome == "failed":
            self.stack.node_event(node.name, "MigConfigFailed", decision.reason, "Warning",
                                  component="nvidia-mig-manager")
        elif decision.outcome == "reconfigured":
            self.stack.node_event(node.name, "MigConfigApplied", decision.reason, component="nvidia-mig-manager")

    def _pods(self, selector: str) -> list[dict[str, Any]]:
        return self.stack.client.list("Pod", self.namespace, label_selector=selector,
                                      field_selector=f"spec.nodeName={self.ctx.node}")

    def _wait_gone(self, selector: str, stop: threading.Event) -> None:
        deadline = time.monotonic() + self.WAIT_S
        while self._pods(selector):
            if time.monotonic() > deadline:
                raise TimeoutError(f"pods {selector} still on the node after {self.WAIT_S:.0f} s")
            if stop.wait(POLL):
                return


# --------------------------------------------------------------------------
# Operator validator


class ValidatorMain:
    """``nvidia-validator``: the operator validator's checks, one per container."""

    def __init__(self, stack: "GpuStack", ctx: programs.ProgramContext):
        self.stack = stack
        self.ctx = ctx
        self.out = Out(ctx, "main.go:1")
        self.node = stack.gpu_node(ctx.node)
        self.namespace = ctx.env.get("OPERATOR_NAMESPACE") or ctx.pod["metadata"]["namespace"]
        self.dir = host_path(ctx, VALIDATIONS_DIR)

    def run(self, stop: threading.Event) -> int:
        name = self.ctx.container["name"]
        if "vectorAdd" in " ".join(argv(self.ctx)):
            return self.vector_add()
        if name == "nvidia-cuda-validator":
            self.out.print("cuda workload validation is successful")
            return 0
        component = self.ctx.env.get("COMPONENT")
        checks = {"driver": self.driver, "toolkit": self.toolkit, "cuda": self.cuda, "plugin": self.plugin}
        if component in checks:
            return checks[component](stop)
        # The main container: everything before it passed.
        self.out.print("all validations are successful")
        stop.wait()
        if self.dir is not None:
            for f in self.dir.glob("*-ready"):
                f.unlink(missing_ok=True)  # the preStop hook of NVIDIA's DaemonSet
        return 0

    def _ready(self, what: str) -> None:
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
            (self.dir / f"{what}-ready").touch()

    def _smi(self) -> tuple[int, str]:
        if self.node is None:
            return nvidiasmi.EXIT_DRIVER_NOT_LOADED, nvidiasmi.MSG_NO_DRIVER + "\n"
        out = io.StringIO()
        rc = nvidiasmi.run([], env={nvidiasmi.STATE_ENV: str(self.node.smi_state_path),
                                    nvidiasmi.VISIBLE_ENV: "all"}, out=out, err=out)
        return rc, out.getvalue()

    def _nvidia_smi_until_ok(self, what: str, command: str, stop: threading.Event) -> int:
        # WITH_WAIT=true: retry until the driver answers, as the real validator does.
        wait = self.ctx.env.get("WITH_WAIT", "true").lower() == "true"
        last = None
        while True:
            rc, text = self._smi()
            if rc == 0 or text != last:
                self.out.print(f"running command {command}")
                self.out.print(text)
            if rc == 0:
                self._ready(what)
                return 0
            if not wait:
                self.out.print(f"{what} is not ready")
                return 1
            last = text
            if stop.wait(5):
                return 1

    def driver(self, stop: threading.Event) -> int:
        return self._nvidia_smi_until_ok("driver", "bash with args [-c nvidia-smi]", stop)

    def toolkit(self, stop: threading.Event) -> int:
        return self._nvidia_smi_until_ok("toolkit", "nvidia-smi with args []", stop)

    def cuda(self, stop: threading.Event) -> int:
        client = self.stack.client
        sel = "app=nvidia-cuda-validator"
        for old in client.list("Pod", self.namespace, label_selector=sel, field_selector=f"spec.nodeName={self.ctx.node}"):
            client.delete("Pod", old["metadata"]["name"], self.namespace, grace_seconds=0, propagation="Background")
        ds = client.get("DaemonSet", "nvidia-operator-validator", self.namespace) or {}
        image = self.ctx.env.get("VALIDATOR_IMAGE") or self.ctx.container.get("image", VALIDATOR_IMAGE)
        suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
        pod = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"nvidia-cuda-validator-{suffix}", "namespace": self.namespace,
                         "labels": {"app": "nvidia-cuda-validator"},
                         "ownerReferences": ds.get("metadata", {}).get("ownerReferences") or []},
            "spec": {
                "nodeName": self.ctx.node,  # the validator pins its workload to this node
                "restartPolicy": "OnFailure",
                "serviceAccountName": "nvidia-operator-validator",
                "tolerations": ((ds.get("spec") or {}).get("template") or {}).get("spec", {}).get("tolerations") or [],
                "initContainers": [{"name": "cuda-validation", "image": image, "command": ["sh", "-c"],
                                    "args": ["vectorAdd"], "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                                    "securityContext": {"privileged": True}}],
                "containers": [{"name": "nvidia-cuda-validator", "image": image, "command": ["sh", "-c"],
                                "args": ["echo cuda workload validation is successful"],
                                "securityContext": {"privileged": True, "readOnlyRootFilesystem": True}}],
            },
        }
        name = pod["metadata"]["name"]
        try:
            client.create(pod)
        except (api.ApiError, api.Conflict) as e:
            self.out.print(f"failed to create cuda validation pod {name}, err {e}")
            return 1
        for _ in range(240):
            current = client.get("Pod", name, self.namespace)
            if current is None:
                self.out.print(f"failed to get pod {name}, err pods \"{name}\" not found")
                return 1
            phase = (current.get("status") or {}).get("phase") or "Pending"
            if phase == "Succeeded":
                self.out.print(f"pod {name} ran successfully")
                self._ready("cuda")
                return 0
            self.out.print(f"pod {name} is currently in {phase} phase")
            if stop.wait(0.5):
                return 1
        self.out.print(f"gave up waiting for pod {name} to be available")
        return 1

    def plugin(self, stop: threading.Event) -> int:
        for attempt in range(1, 31):
            node = self.stack.node_object(self.ctx.node) or {}
            capacity = (node.get("status") or {}).get("capacity") or {}
            if any((k == "nvidia.com/gpu" or k.startswith("nvidia.com/mig-")) and str(v) not in ("0", "")
                   for k, v in capacity.items()):
                self._ready("plugin")
                return 0
            self.out.print(f"GPU resources are not yet discovered by the node, retry: {attempt}")
            if stop.wait(2):
                return 1
        self.out.print("GPU resources are not discovered by the node")
        return 1

    def vector_add(self) -> int:
        self.out.print("[Vector addition of 50000 elements]")
        state = self.node.state(in_container=True) if self.node is not None else None
        err = nvidiasmi.cuda_error(state, "all", VALIDATOR_CUDA_RUNTIME)
        if err is not None:
            self.out.print(f"Failed to allocate device vector A (error code {err.message})!")
            return 1
        self.out.print("Copy input data from the host memory to the CUDA device\n"
                       "CUDA kernel launch with 196 blocks of 256 threads\n"
                       "Copy output data from the CUDA device to the host memory\n"
                       "Test PASSED\nDone")
        return 0


# --------------------------------------------------------------------------
# DCGM exporter


class DcgmExporterMain:
    """``dcgm-exporter``: Prometheus metrics of the node's GPUs on 127.0.0.1."""

    def __init__(self, stack: "GpuStack", ctx: programs.ProgramContext):
        self.stack = stack
        self.ctx = ctx
        self.out = Out(ctx, "main.go:95")
        self.node = stack.gpu_node(ctx.node)

    def run(self, stop: threading.Event) -> int:
        node = self.node
        self.out.info("Starting dcgm-exporter")
        if node is None:
            self.out.error("Error: no GPUs on this node")
            return 1
        if node.faults.driver_unreachable:
            self.out.error("Failed to initialize NVML: Driver Not Loaded")
            return 1
        stack = self.stack

        server = dcgm.serve(node, ("127.0.0.1", 0), thread_name=f"dcgm-exporter-{node.name}")
        endpoint = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        md = self.ctx.pod["metadata"]
        try:
            stack.client.patch("Pod", md["name"], {"metadata": {"annotations": {METRICS_ANNOTATION: endpoint}}},
                               md["namespace"])
        except (api.ApiError, api.NotFound, api.Conflict) as e:
            self.out.warning(f"cannot publish the metrics endpoint: {e}")
        self.out.info("Kubernetes metrics collection enabled!")
        self.out.info(f"Starting webserver; metrics at {endpoint}")
        try:
            stop.wait()
        finally:
            server.shutdown()
            server.server_close()
        return 0


# --------------------------------------------------------------------------


def register(stack: "GpuStack") -> None:
    """Make NVIDIA's images run these programs on this node agent's nodes."""
    programs.register(DEVICE_PLUGIN_IMAGE, _program(stack, _device_plugin_image))
    programs.register(MIG_MANAGER_IMAGE, _program(stack, lambda s, stop, ctx: MigManagerMain(s, ctx).run(stop)))
    programs.register(VALIDATOR_IMAGE, _program(stack, lambda s, stop, ctx: ValidatorMain(s, ctx).run(stop)))
    programs.register(DCGM_EXPORTER_IMAGE, _program(stack, lambda s, stop, ctx: DcgmExporterMain(s, ctx).run(stop)))
