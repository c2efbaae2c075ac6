"""The fake NVIDIA node components as real processes, for nodes with a real kubelet (kind): the kind host.

On the embedded backend the components are programs inside the node agent
(:mod:`gpulab.fakegpu.operands`). On a kind node there is a real kubelet, so
each one runs as its own container of the ``gpulab.local/fakegpu`` image, in
DaemonSets laid out as the GPU Operator lays out its operands
(``manifests/kind/``)::

    python -m gpulab.fakegpu.daemon device-plugin    # kubelet device-plugin API on the real kubelet.sock
    python -m gpulab.fakegpu.daemon gfd              # GPU Feature Discovery labels
    python -m gpulab.fakegpu.daemon config-manager   # picks the device-plugin config (time-slicing, MPS)
    python -m gpulab.fakegpu.daemon mig-manager      # applies nvidia.com/mig.config
    python -m gpulab.fakegpu.daemon dcgm-exporter    # Prometheus metrics on :9400

The components are the same as the embedded backend's
(:mod:`gpulab.fakegpu.components`); :class:`KindHost` is what they run on here.

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

What this backend does not have, and so the components do not do here:

- faults: ``gpulab fault`` writes into the embedded backend's simulated hosts,
  and a kind node has none (:meth:`KindHost.faults` is always empty), so no
  GPU turns Unhealthy, the plugin is never held down, GFD always labels the
  reference driver;
- the GPU memory ledger (the kubelet runs the containers, so nothing sees a
  CUDA program's memory), hence no OOM between time-sliced neighbours and no
  per-pod DCGM labels;
- an operator process: config-manager follows the ClusterPolicy's
  ``spec.devicePlugin.config`` itself (``--cluster-policy``), so when the
  policy names a config its sidecar applies it and records a
  ``DevicePluginConfigApplied`` Event, where on the embedded backend the
  operator restarts the pods and their init containers write the config
  without one; and there is no operator validator;
- the processes poll (``--poll-interval``) where the embedded programs are
  woken by the node agent's shared watch.
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
from typing import Any

from .._fsutil import atomic_write_text
from ..hardware import models
from ..kube import api
from ..kube.names import OPERATOR_NAMESPACE
from . import nvidiasmi, smistate
from .components import COMPONENTS
from .components.host import ApiHost, Gpus, HostError, Klog, MetricsView, Settings
from .devicemap import NodeResources
from .deviceplugin import DEVICE_PLUGIN_PATH
from .deviceplugin.plugin import PluginConfig
from .faults import NodeFaults
from .pluginconfig import CONFIG_LABEL, ConfigError

log = logging.getLogger("gpulab.fakegpu.daemon")

MODEL_LABEL = "gpulab.io/fake-gpu.model"
COUNT_LABEL = "gpulab.io/fake-gpu.count"
HOST_DIR = "/var/lib/gpulab"
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

#: The subcommands: one per component.
COMMANDS = tuple(COMPONENTS)
#: Subcommands that run on the node's (fake) GPUs.
_HARDWARE_COMMANDS = ("device-plugin", "gfd", "mig-manager", "dcgm-exporter")


class DaemonError(HostError):
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
        return smistate.build_state(self.model, self.count, self.node, mig_layout=self.mig_layout())

    def install_nvidia_smi(self) -> None:
        # Mounted into GPU containers at /usr/bin/nvidia-smi by the Allocate response.
        atomic_write_text(self.nvidia_smi, "#!/usr/bin/env -S python3 -IS\n" + Path(nvidiasmi.__file__).read_text(),
                          mode=0o755)
        self.host_state.parent.mkdir(parents=True, exist_ok=True)
        smistate.write_state(str(self.host_state), self.state())


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


def _stdio(stream: str, line: str) -> None:
    print(line, file=sys.stderr if stream == "stderr" else sys.stdout, flush=True)


def settings_of(args: argparse.Namespace) -> Settings:
    """What the component's flags tell it."""
    config_file = getattr(args, "config_file", None)
    return Settings(
        namespace=getattr(args, "namespace", OPERATOR_NAMESPACE),
        config_file=Path(config_file) if config_file else None,
        mig_strategy=getattr(args, "mig_strategy", None) or None,
        # Device nodes on kind are the host's /dev; a fake GPU has none to pass.
        flags={"PASS_DEVICE_SPECS": "false"},
        gfd_interval=getattr(args, "interval", 60.0),
        oneshot=getattr(args, "oneshot", False),
        config_label=getattr(args, "label", CONFIG_LABEL),
        fallbacks=tuple(s for s in getattr(args, "fallbacks", "named,single").split(",") if s),
        config_dst=Path(args.dst) if getattr(args, "dst", None) else None,
    )


# --------------------------------------------------------------------------
# The host


class KindHost(ApiHost):
    """:class:`~gpulab.fakegpu.components.host.Host` for a process in one of kind's DaemonSets.

    The GPUs come from the Node's ``gpulab.io/fake-gpu.*`` labels (or
    ``--gpu-model``/``--gpu-count``), the MIG geometry from ``--host-dir``;
    there are no faults. The API client is the pod's service account (or
    ``--kubeconfig``), made when first needed.
    """

    def __init__(self, args: argparse.Namespace, stop: _Stop, source: str):
        self.args = args
        self.node = args.node
        self.log = Klog(_stdio, source)
        self.settings = settings_of(args)
        self._stop = stop
        self._client: api.Client | None = None
        self.hw: Hardware | None = None
        if args.command in _HARDWARE_COMMANDS:
            need_api = not (args.gpu_model and args.gpu_count)
            self.hw = Hardware.of_node(args, self.client if need_api else None)

    # -- lifecycle

    def wait(self, seconds: float) -> bool:
        return self._stop.wait(min(seconds, self.args.poll_interval))

    def stopping(self) -> bool:
        return self._stop.event.is_set()

    # -- the API

    @property
    def client(self) -> api.Client:
        if self._client is None:
            self._client = api.Client(self.args.kubeconfig or in_cluster_kubeconfig())
        return self._client

    def config_source(self) -> tuple[str | None, str | None]:
        """``--configmap``/``--default`` when given; else ClusterPolicy ``--cluster-policy``'s ``spec.devicePlugin.config``.

        There is no operator process on this backend to render the ClusterPolicy
        into the DaemonSet, so the config-manager follows the ClusterPolicy itself.
        """
        args = self.args
        if args.configmap:
            return args.configmap, args.default or None
        policy = self.client.get("ClusterPolicy", args.cluster_policy) or {}
        config = ((policy.get("spec") or {}).get("devicePlugin") or {}).get("config") or {}
        return (config.get("name") or None), (config.get("default") or None)

    # -- the hardware

    def _hw(self) -> Hardware:
        if self.hw is None:
            raise DaemonError(f"{self.args.command} does not run on the node's GPUs")
        return self.hw

    def gpus(self) -> Gpus | None:
        return Gpus(self.hw.model, self.hw.count) if self.hw is not None else None

    def mig_layout(self) -> models.MigLayout | None:
        return self.hw.mig_layout() if self.hw is not None else None

    def apply_mig(self, layout: models.MigLayout | None) -> None:
        self._hw().apply_mig(layout)

    def faults(self) -> NodeFaults:
        # `gpulab fault` lives on the embedded backend's simulated hosts: a kind node has no faults.
        return NodeFaults()

    def gpu_state(self, in_container: bool = False) -> dict[str, Any]:
        # No ledger on kind: a container sees what the host sees.
        return self._hw().state()

    # -- device plugin

    def plugin_config(self) -> PluginConfig:
        hw = self._hw()
        return PluginConfig(plugin_dir=Path(self.args.plugin_dir), nvidia_smi=hw.nvidia_smi, state_dir=hw.state_dir,
                            pass_device_specs=False, poll_interval=self.args.poll_interval)

    def advertised(self, resources: NodeResources) -> None:
        # The nvidia-smi the kubelet mounts into GPU containers, and the host's state for the new geometry.
        self._hw().install_nvidia_smi()

    # -- DCGM exporter

    def metrics_view(self) -> MetricsView:
        return _MetricsView(self._hw())

    def metrics_address(self) -> tuple[str, int]:
        host, _, port = self.args.listen.rpartition(":")
        # In its pod, the exporter listens on all addresses (Prometheus scrapes the pod IP).
        return (host or "0.0.0.0", int(port))

    def metrics_published(self, endpoint: str) -> None:
        pass  # the DaemonSet's Service (manifests/kind/50-dcgm-exporter.yaml) fronts the pods

    def pod_listener(self, port: int) -> None:
        return None  # a real container: metrics_address is in the pod's own network


# --------------------------------------------------------------------------


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
        if name in _HARDWARE_COMMANDS:
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
    run, source = COMPONENTS[args.command]
    try:
        return run(KindHost(args, stop, source))
    except HostError as e:
        log.error("%s", e)
        return 1
    except ConfigError as e:
        # As NVIDIA's plugin with FAIL_ON_INIT_ERROR: exit, so the pod shows CrashLoopBackOff.
        log.error("error starting: unable to load config: %s", e)
        return 1


if __name__ == "__main__":
    sys.exit(main())
