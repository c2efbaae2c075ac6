"""The fake NVIDIA node components as real processes, for nodes with a real kubelet (kind).

On the embedded backend these components are programs inside the node agent
(:mod:`gpulab.fakegpu.operands`). On a kind node there is a real kubelet, so
each one runs as its own container of the ``gpulab.local/fakegpu`` image, in
DaemonSets laid out as the GPU Operator lays out its operands
(``manifests/kind/``)::

    python -m gpulab.fakegpu.daemon device-plugin    # kubelet device-plugin API on the real kubelet.sock
    python -m gpulab.fakegpu.daemon gfd              # GPU Feature Discovery labels
    python -m gpulab.fakegpu.daemon config-manager   # picks the device-plugin config (time-slicing, MPS)
    python -m gpulab.fakegpu.daemon mig-manager      # applies nvidia.com/mig.config
    python -m gpulab.fakegpu.daemon dcgm-exporter    # Prometheus metrics on :9400

A kind node has no GPUs, so what it "has" is read from its Node's labels
``gpulab.io/fake-gpu.model`` / ``gpulab.io/fake-gpu.count`` (set from the
topology by ``gpulab up --backend kind``), or given with ``--gpu-model`` /
``--gpu-count``. The simulated hardware state (the MIG geometry mig-manager
applied) is a file under ``--host-dir`` (a hostPath, ``/var/lib/gpulab``), shared
by the components of one node as a real GPU is. The fake ``nvidia-smi`` and the
per-allocation state files live there too, at the same path inside the plugin's
container and on the node, because the kubelet mounts them into GPU containers
by their node path. The fake nvidia-smi is a Python script: it runs in GPU
containers whose image has ``python3``.

What this backend does not have: the embedded backend's GPU memory ledger
(the kubelet runs the containers, so nothing sees a CUDA program's memory),
hence no OOM between time-sliced neighbours and no per-pod DCGM labels; and
``gpulab fault``, whose files live on the embedded backend's simulated hosts.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from .._fsutil import atomic_write_text, file_identity
from ..kube import api
from ..kube import events
from . import dcgm, gfd, mig, nvidiasmi
from ..hardware import models
from .config import (
    CONFIG_LABEL,
    DEFAULT_CONFIG,
    ConfigError,
    DevicePluginConfig,
    advertised_resources,
    parse_config,
    select_config,
)
from .deviceplugin import DEVICE_PLUGIN_PATH
from .deviceplugin.plugin import DevicePlugin, PluginConfig
from ..kube.names import OPERATOR_NAMESPACE

log = logging.getLogger("gpulab.fakegpu.daemon")

MODEL_LABEL = "gpulab.io/fake-gpu.model"
COUNT_LABEL = "gpulab.io/fake-gpu.count"
HOST_DIR = "/var/lib/gpulab"
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class DaemonError(RuntimeError):
    """The component cannot start; the message says what is missing."""


# --------------------------------------------------------------------------
# Plumbing


def in_cluster_kubeconfig(sa_dir: Path = SERVICE_ACCOUNT_DIR, env: dict[str, str] | None = None) -> Path:
    """A kubeconfig for the pod's service account (gpulab's API client reads kubeconfigs only)."""
    env = os.environ if env is None else env
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host or not (sa_dir / "token").is_file():
        raise DaemonError("not in a pod (no KUBERNETES_SERVICE_HOST or service-account token) and no "
                          "--kubeconfig given")
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "in-cluster",
           "clusters": [{"name": "in-cluster", "cluster": {"server": server,
                                                          "certificate-authority": str(sa_dir / "ca.crt")}}],
           "users": [{"name": "sa", "user": {"tokenFile": str(sa_dir / "token")}}],
           "contexts": [{"name": "in-cluster", "context": {"cluster": "in-cluster", "user": "sa"}}]}
    fd, path = tempfile.mkstemp(prefix="gpulab-kubeconfig-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
    return Path(path)


def _client(args: argparse.Namespace) -> api.Client:
    return api.Client(args.kubeconfig or in_cluster_kubeconfig())


class Hardware:
    """One node's simulated GPUs: model and count, and the MIG geometry kept in ``<host-dir>/gpu/``."""

    def __init__(self, node: str, model: str, count: int, host_dir: Path):
        self.node = node
        self.model = models.get_model(model)
        self.count = count
        self.host_dir = host_dir
        self.file = host_dir / "gpu" / "hardware.json"
        self.nvidia_smi = host_dir / "bin" / "nvidia-smi"
        self.state_dir = host_dir / "nvidia-smi"
        self.host_state = host_dir / "gpu" / "nvidia-smi.json"

    @classmethod
    def of_node(cls, args: argparse.Namespace, client: api.Client | None) -> "Hardware":
        model, count = args.gpu_model, args.gpu_count
        if model is None or count is None:
            if client is None:
                raise DaemonError("--gpu-model and --gpu-count are needed without an API server")
            labels = ((client.get("Node", args.node) or {}).get("metadata") or {}).get("labels") or {}
            model = model or labels.get(MODEL_LABEL)
            count = count if count is not None else int(labels.get(COUNT_LABEL) or 0)
        if not model or not count:
            raise DaemonError(f"node {args.node} has no {MODEL_LABEL}/{COUNT_LABEL} labels: it has no fake GPUs")
        return cls(args.node, model, count, Path(args.host_dir))

    def mig_layout(self) -> models.MigLayout | None:
        try:
            hw = json.loads(self.file.read_text())
            layout = self.model.layout(hw["mig"]) if hw.get("mig") else None
        except (OSError, ValueError, KeyError, models.GpuModelError):
            return None
        return layout if layout is not None and layout.mig_enabled else None

    def apply_mig(self, layout: models.MigLayout | None) -> None:
        name = layout.name if layout is not None and layout.mig_enabled else None
        atomic_write_text(self.file, json.dumps({"model": self.model.key, "count": self.count, "mig": name}) + "\n")

    def state(self) -> dict[str, Any]:
        return nvidiasmi.build_state(self.model, self.count, self.node, mig_layout=self.mig_layout())

    def install_nvidia_smi(self) -> None:
        # Mounted into GPU containers at /usr/bin/nvidia-smi by the Allocate response.
        atomic_write_text(self.nvidia_smi, "#!/usr/bin/env -S python3 -IS\n" + Path(nvidiasmi.__file__).read_text(),
                          mode=0o755)
        self.host_state.parent.mkdir(parents=True, exist_ok=True)
        nvidiasmi.write_state(str(self.host_state), self.state())


def _load_config(path: Path | None, mig_strategy: str | None) -> DevicePluginConfig:
    config = DEFAULT_CONFIG
    if path is not None and path.is_file():
        config = parse_config(path.read_text(), path=str(path))
    return config.with_mig_strategy(mig_strategy or None)


class _Stop:
    """SIGTERM/SIGINT end the loop; SIGHUP (config-manager's signal) wakes it early."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.hup = threading.Event()

    def install(self) -> "_Stop":
        signal.signal(signal.SIGTERM, lambda *_: self.event.set())
        signal.signal(signal.SIGINT, lambda *_: self.event.set())
        signal.signal(signal.SIGHUP, lambda *_: self.hup.set())
        return self

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True when asked to stop."""
        deadline = time.monotonic() + seconds
        while not self.event.is_set() and not self.hup.is_set() and time.monotonic() < deadline:
            self.event.wait(min(0.1, max(0.0, deadline - time.monotonic())))
        self.hup.clear()
        return self.event.is_set()


def _node_event(client: api.Client, node: str, reason: str, message: str, type_: str = "Normal",
                component: str = "nvidia-mig-manager") -> None:
    """An Event on the node, as the embedded backend's components write them (counted, see gpulab.kube.events)."""
    try:
        uid = ((client.get("Node", node) or {}).get("metadata") or {}).get("uid") or node
    except (api.ApiError, api.NotFound, api.Conflict):
        uid = node
    events.record(client, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "uid": uid}}, reason, message,
                 type_, component=component, host=node)


# --------------------------------------------------------------------------
# The components


def run_device_plugin(args: argparse.Namespace, stop: _Stop) -> int:
    client = None if args.gpu_model and args.gpu_count else _client(args)
    hw = Hardware.of_node(args, client)
    hw.install_nvidia_smi()
    config_path = Path(args.config_file) if args.config_file else None

    def inventory() -> dict[str, Any]:
        config = _load_config(config_path, args.mig_strategy)
        resources = advertised_resources(hw.model, hw.count, hw.node, config, mig_layout=hw.mig_layout())
        return resources.to_inventory(hw.state())

    plugin = DevicePlugin(PluginConfig(plugin_dir=Path(args.plugin_dir), nvidia_smi=hw.nvidia_smi,
                                       state_dir=hw.state_dir, pass_device_specs=False,
                                       poll_interval=args.poll_interval), inventory=inventory())
    seen = (file_identity(config_path), file_identity(hw.file))
    announced: set[str] = set()
    try:
        plugin.start()
        log.info("Serving %s on %s (%d x %s)", ", ".join(plugin.resources), args.plugin_dir, hw.count, hw.model.key)
        while not stop.wait(args.poll_interval):
            now = (file_identity(config_path), file_identity(hw.file))
            if now != seen:
                seen = now
                try:
                    plugin.update_inventory(inventory())
                except ConfigError as e:
                    log.error("unable to load config: %s; keeping the current devices", e)
                    continue
                hw.install_nvidia_smi()
                log.info("Config or MIG geometry changed: now serving %s", ", ".join(plugin.resources))
            for name in plugin.resources:
                if name not in announced and plugin.is_registered(name):
                    announced.add(name)
                    log.info("Registered device plugin for '%s' with Kubelet", name)
    finally:
        plugin.stop()
    return 0


def _without_timestamp(labels: dict[str, str]) -> dict[str, str]:
    # GFD rewrites its timestamp label every interval; only the rest is a change.
    return {k: v for k, v in labels.items() if k != gfd.TIMESTAMP_LABEL}


def run_gfd(args: argparse.Namespace, stop: _Stop) -> int:
    client = _client(args)
    hw = Hardware.of_node(args, client)
    config_path = Path(args.config_file) if args.config_file else None
    last_write = 0.0
    while True:
        try:
            config = _load_config(config_path, args.mig_strategy)
            want = gfd.gfd_labels(hw.model, hw.count, config=config, mig_layout=hw.mig_layout())
            labels = ((client.get("Node", hw.node) or {}).get("metadata") or {}).get("labels") or {}
            have = {k: v for k, v in labels.items() if gfd.label_owner(k) == "gfd"}
            if _without_timestamp(want) != _without_timestamp(have) or time.monotonic() - last_write >= args.interval:
                patch: dict[str, str | None] = {k: v for k, v in want.items() if have.get(k) != v}
                patch.update({k: None for k in have if k not in want})
                client.patch("Node", hw.node, {"metadata": {"labels": patch}})
                last_write = time.monotonic()
                log.info("Writing %d labels to node %s", len(want), hw.node)
        except ConfigError as e:
            log.error("unable to load config: %s", e)
            return 1
        except (api.ApiError, api.NotFound, api.Conflict) as e:
            log.warning("error writing labels: %s; retrying", e)
        if stop.wait(args.poll_interval):
            return 0


def _config_source(client: api.Client, args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The ConfigMap of device-plugin configs and the default config name.

    ``--configmap``/``--default`` when given; else ClusterPolicy
    ``--cluster-policy``'s ``spec.devicePlugin.config`` (there is no operator
    process on this backend to render it into the DaemonSet, so the
    config-manager follows the ClusterPolicy itself).
    """
    if args.configmap:
        return args.configmap, args.default or None
    policy = client.get("ClusterPolicy", args.cluster_policy) or {}
    config = (((policy.get("spec") or {}).get("devicePlugin") or {}).get("config") or {})
    return (config.get("name") or None), (config.get("default") or None)


def run_config_manager(args: argparse.Namespace, stop: _Stop) -> int:
    client = _client(args)
    dst = Path(args.dst)
    current: tuple[str | None, str] | None = None
    last: object = object()
    while True:
        labels = ((client.get("Node", args.node) or {}).get("metadata") or {}).get("labels") or {}
        configmap, default = _config_source(client, args)
        value = labels.get(args.label)
        cm = client.get("ConfigMap", configmap, args.namespace) if configmap else None
        data = (cm or {}).get("data") or {}
        if (value, configmap, default, data) != last:
            last = (value, configmap, default, data)
            if configmap is None:
                # No config named: the plugin runs with its defaults.
                if current != (None, ""):
                    dst.unlink(missing_ok=True)
                    current = (None, "")
                    log.info("No device-plugin config selected; using the defaults")
            else:
                selection = select_config(data, value, default, tuple(args.fallbacks.split(",")))
                text = data.get(selection.name or "")
                problem = None if selection.name else f"ConfigMap {args.namespace}/{configmap}: {selection.reason}"
                if not problem:
                    try:
                        parse_config(text or "", path=f"{configmap}/{selection.name}")
                    except ConfigError as e:
                        problem = f"config {selection.name!r} of ConfigMap {args.namespace}/{configmap} is invalid: {e}"
                if problem:
                    log.error("%s; keeping %s", problem, (current or (None,))[0] or "the defaults")
                    reason = "DevicePluginConfigInvalid" if selection.name else "DevicePluginConfigNotFound"
                    if current is None and args.oneshot:
                        _node_event(client, args.node, reason, f"{problem}; the device plugin cannot start",
                                    "Warning", component="config-manager")
                        return 1
                    keep = (current or (None,))[0] or "<defaults>"
                    _node_event(client, args.node, reason, f"{problem}; keeping the last good config {keep!r}",
                                "Warning", component="config-manager")
                elif current != (selection.name, text):
                    atomic_write_text(dst, text or "")
                    current = (selection.name, text or "")
                    log.info("Successfully updated to config: %s (%s)", selection.name, selection.reason)
                    if not args.oneshot:
                        _node_event(client, args.node, "DevicePluginConfigApplied",
                                    f"device plugin config {selection.name!r} from ConfigMap "
                                    f"{args.namespace}/{configmap} applied", component="config-manager")
        if args.oneshot or stop.wait(args.poll_interval):
            return 0


def run_mig_manager(args: argparse.Namespace, stop: _Stop) -> int:
    client = _client(args)
    hw = Hardware.of_node(args, client)
    if not hw.model.mig_capable:
        log.info("No MIG-capable GPU on this node; nothing to do. Waiting indefinitely.")
        while not stop.wait(3600):
            pass
        return 0
    last: object = object()
    while True:
        labels = ((client.get("Node", hw.node) or {}).get("metadata") or {}).get("labels") or {}
        if labels and labels.get(mig.MIG_CONFIG_LABEL) != last:
            last = labels.get(mig.MIG_CONFIG_LABEL)
            log.info("Updating to MIG config: %s", last)
            _reconfigure(client, hw, labels, args.namespace, stop)
        if stop.wait(args.poll_interval):
            return 0


def _holding_gpus(client: api.Client, node: str, operator_namespace: str) -> list[str]:
    pods = []
    for pod in client.list("Pod", field_selector=f"spec.nodeName={node}"):
        md = pod["metadata"]
        if md["namespace"] == operator_namespace or (pod.get("status") or {}).get("phase") not in ("Pending", "Running"):
            continue
        for c in pod["spec"].get("containers") or []:
            limits = (c.get("resources") or {}).get("limits") or {}
            if any(k.startswith("nvidia.com/") and str(v) != "0" for k, v in limits.items()):
                pods.append(f"{md['namespace']}/{md['name']}")
                break
    return pods


def _reconfigure(client: api.Client, hw: Hardware, labels: dict[str, str], namespace: str, stop: _Stop) -> None:
    decision = mig.decide_mig_transition(labels, hw.model, applied=hw.mig_layout(),
                                         gpu_pods=_holding_gpus(client, hw.node, namespace))
    restore = {k: ("false" if labels.get(k) == "false" else "true") for k in mig.CLIENT_DEPLOY_LABELS}

    def pods(selector: str) -> list[dict[str, Any]]:
        return client.list("Pod", namespace, label_selector=selector, field_selector=f"spec.nodeName={hw.node}")

    try:
        for step in decision.steps:
            if stop.event.is_set():
                return
            log.info(step.message)
            if step.action == "set-labels":
                client.patch("Node", hw.node, {"metadata": {"labels": dict(step.labels)}})
            elif step.action == "wait-pods-deleted":
                deadline = time.monotonic() + 120
                while pods(step.selector or ""):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"pods {step.selector} still on the node after 120 s")
                    if stop.wait(0.5):
                        return
            elif step.action == "delete-pods":
                for pod in pods(step.selector or ""):
                    client.delete("Pod", pod["metadata"]["name"], namespace, grace_seconds=0)
            elif step.action == "apply-mig":
                hw.apply_mig(step.layout)
    except (TimeoutError, api.ApiError, api.NotFound, api.Conflict) as e:
        log.error("Error applying MIG configuration: %s", e)
        client.patch("Node", hw.node, {"metadata": {"labels": {**restore, mig.MIG_CONFIG_STATE_LABEL: mig.STATE_FAILED}}})
        _node_event(client, hw.node, "MigConfigFailed", f"MIG config {decision.requested!r}: {e}", "Warning")
        return
    if decision.outcome == "failed":
        _node_event(client, hw.node, "MigConfigFailed", decision.reason, "Warning")
    elif decision.outcome == "reconfigured":
        _node_event(client, hw.node, "MigConfigApplied", decision.reason)


class _MetricsView:
    """What :func:`gpulab.fakegpu.dcgm.render` reads of a node: its GPUs' state, no per-pod holders."""

    def __init__(self, hw: Hardware):
        self.hw = hw
        self.name = hw.node

    def state(self) -> dict[str, Any]:
        return self.hw.state()

    def holders(self) -> dict[str, list[tuple[str, str, str]]]:
        return {}

    def mig_activity(self, uuid: str) -> float:
        return 0.0


def run_dcgm_exporter(args: argparse.Namespace, stop: _Stop) -> int:
    client = None if args.gpu_model and args.gpu_count else _client(args)
    view = _MetricsView(Hardware.of_node(args, client))

    host, _, port = args.listen.rpartition(":")
    # In its pod, the exporter listens on all addresses (Prometheus scrapes the pod IP).
    server = dcgm.serve(view, (host or "0.0.0.0", int(port)))  # type: ignore[arg-type]
    log.info("Starting webserver on %s:%d", *server.server_address[:2])
    try:
        while not stop.wait(3600):
            pass
    finally:
        server.shutdown()
        server.server_close()
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace, _Stop], int]] = {
    "device-plugin": run_device_plugin,
    "gfd": run_gfd,
    "config-manager": run_config_manager,
    "mig-manager": run_mig_manager,
    "dcgm-exporter": run_dcgm_exporter,
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpulab.fakegpu.daemon",
                                description="Fake NVIDIA node components for nodes with a real kubelet.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    env = os.environ
    for name in COMMANDS:
        s = sub.add_parser(name)
        s.add_argument("--node", default=env.get("NODE_NAME"), required=not env.get("NODE_NAME"),
                       help="this node's name (default: $NODE_NAME, from the downward API)")
        s.add_argument("--kubeconfig", help="kubeconfig file (default: the pod's service account)")
        s.add_argument("--poll-interval", type=float, default=1.0, help="seconds between checks")
        s.add_argument("-v", "--verbose", action="store_true")
        if name in ("device-plugin", "gfd", "mig-manager", "dcgm-exporter"):
            s.add_argument("--gpu-model", help=f"GPU model key (default: the node's {MODEL_LABEL} label)")
            s.add_argument("--gpu-count", type=int, help=f"GPUs on the node (default: its {COUNT_LABEL} label)")
            s.add_argument("--host-dir", default=env.get("GPULAB_HOST_DIR", HOST_DIR),
                           help="node directory for the simulated hardware, nvidia-smi and its state files, "
                                "mounted at the same path (default: %(default)s)")
        if name in ("device-plugin", "gfd"):
            s.add_argument("--config-file", default=env.get("CONFIG_FILE"),
                           help="device-plugin config written by config-manager (default: $CONFIG_FILE)")
            s.add_argument("--mig-strategy", default=env.get("MIG_STRATEGY"), choices=("none", "single", "mixed"))
        if name == "device-plugin":
            s.add_argument("--plugin-dir", default=DEVICE_PLUGIN_PATH, help="kubelet's device-plugin directory")
        if name == "gfd":
            s.add_argument("--interval", type=float, default=60.0, help="seconds between label rewrites")
        if name in ("config-manager", "mig-manager"):
            s.add_argument("--namespace", default=env.get("POD_NAMESPACE", OPERATOR_NAMESPACE))
        if name == "config-manager":
            s.add_argument("--configmap", help="ConfigMap of named device-plugin configs "
                           "(default: the one ClusterPolicy --cluster-policy names)")
            s.add_argument("--cluster-policy", default="cluster-policy")
            s.add_argument("--label", default=CONFIG_LABEL, help="node label naming the config")
            s.add_argument("--default", default=env.get("DEFAULT_CONFIG", ""),
                           help="config for nodes without the label (with --configmap)")
            s.add_argument("--fallbacks", default="named,single")
            s.add_argument("--dst", default="/config/config.yaml")
            s.add_argument("--oneshot", action="store_true", help="write once and exit (init container)")
        if name == "dcgm-exporter":
            s.add_argument("--listen", default=env.get("DCGM_EXPORTER_LISTEN", ":9400"))
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.DEBUG if args.verbose else logging.INFO,
                        format=f"%(asctime)s %(levelname).1s {args.command}] %(message)s")
    stop = _Stop().install()
    try:
        return COMMANDS[args.command](args, stop)
    except DaemonError as e:
        log.error("%s", e)
        return 1
    except ConfigError as e:
        # As NVIDIA's plugin with FAIL_ON_INIT_ERROR: exit, so the pod shows CrashLoopBackOff.
        log.error("error starting: unable to load config: %s", e)
        return 1


if __name__ == "__main__":
    sys.exit(main())
