"""What NVIDIA's node components need from the node they run on: the host interface.

Each component (:mod:`gpulab.fakegpu.components`) is written once against
:class:`Host`; two hosts implement it:

:class:`gpulab.fakegpu.operands.EmbeddedHost`
    the embedded backend: a program of a GPU Operator DaemonSet pod, run as a
    thread of the node agent, for a :class:`~gpulab.fakegpu.node.GpuNode`
    (GPUs, MIG geometry and ``gpulab fault`` faults in the node agent's memory;
    the Node from the stack's shared watch; wakes up when either changes);
:class:`gpulab.fakegpu.daemon.KindHost`
    the kind backend: a process in one of kind's DaemonSets
    (``python -m gpulab.fakegpu.daemon <component>``), whose GPUs are read from
    its Node's ``gpulab.io/fake-gpu.*`` labels and whose MIG geometry is a file
    under ``--host-dir``; it polls. There are no faults on kind.

What is the same on both is written here once too: node labels and Events
through the API, and which pods hold a node's GPUs.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol

from ...hardware.models import GpuModel, MigLayout
from ...kube import api, events
from ...kube.names import OPERATOR_COMPONENT, OPERATOR_NAMESPACE
from ..dcgm import MetricsView
from ..devicemap import NodeResources
from ..deviceplugin.plugin import PluginConfig
from ..faults import NodeFaults
from ..pluginconfig import CONFIG_LABEL

__all__ = [
    "Gpus",
    "Host",
    "HostError",
    "Klog",
    "Log",
    "MetricsView",
    "Settings",
    "gpu_requests",
    "node_labels",
    "holding_gpus",
    "pods_holding_gpus",
    "record_node_event",
]


#: How long a component sleeps when nothing changed before it looks again on its own. The embedded host wakes it
#: on every change it reads (the Node, the hardware, faults, a neighbour's file: see
#: :meth:`Host.changed`), so this is only a safety net; the kind host polls within it (``--poll-interval``).
#: A fleet's thousands of components then cost nothing between changes.
RESYNC_S = 30.0


class HostError(RuntimeError):
    """The host cannot give a component what it needs; the message says what is missing."""


class Log(Protocol):
    """A component's log: klog-style lines on stderr, plain ones on stdout."""

    def info(self, msg: str) -> None: ...

    def warning(self, msg: str) -> None: ...

    def error(self, msg: str) -> None: ...

    def print(self, text: str) -> None: ...


class Klog:
    """Log lines as NVIDIA's Go components write them (``I0102 15:04:05.000000       1 main.go:356] ...``).

    ``sink(stream, line)`` writes one line to ``"stdout"`` or ``"stderr"``.
    """

    def __init__(self, sink: Callable[[str, str], None], source: str):
        self.sink = sink
        self.source = source

    def _write(self, stream: str, text: str) -> None:
        try:
            self.sink(stream, text)
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


@dataclass(frozen=True)
class Gpus:
    """The node's GPUs: one model, ``count`` of them."""

    model: GpuModel
    count: int


@dataclass(frozen=True)
class Settings:
    """What a component was told to do: its container's env and mounts (embedded), its flags (kind)."""

    #: Where the operator's pods and the device-plugin ConfigMap live.
    namespace: str = OPERATOR_NAMESPACE
    #: The device-plugin config file config-manager writes and the plugin and GFD read, as a path of this host.
    config_file: Path | None = None
    #: That file as the component names it in messages (its path inside the container); None: ``config_file``.
    config_file_shown: str | None = None
    #: ``MIG_STRATEGY`` (none, single, mixed); None: the config file's.
    mig_strategy: str | None = None
    #: The plugin's flags given as environment variables (``PASS_DEVICE_SPECS`` ...), shown in its config dump.
    flags: Mapping[str, str] = field(default_factory=dict)
    #: Seconds between GFD's label rewrites (its timestamp label).
    gfd_interval: float = 60.0
    #: config-manager: write once and exit (the init container).
    oneshot: bool = False
    #: config-manager: the node label naming the config.
    config_label: str = CONFIG_LABEL
    #: config-manager: how a config is chosen when the label names none.
    fallbacks: tuple[str, ...] = ("named", "single")
    #: config-manager: where it writes the chosen config (a path of this host); None: not mounted.
    config_dst: Path | None = None


class Host(Protocol):
    """The node one component runs on, as that component sees it."""

    #: This node's name.
    node: str
    #: The component's log.
    log: Log
    #: What the component was told (env, flags, mounts).
    settings: Settings

    # -- lifecycle -----------------------------------------------------------

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds`` (less when something may have changed); True when asked to stop."""

    def stopping(self) -> bool:
        """True once the component is asked to stop."""

    def changed(self) -> None:
        """This component changed something its node's other components read (a file on a shared volume, as the
        config manager writes the device plugin's config): wake them, as their file watches would be."""

    # -- the Kubernetes API --------------------------------------------------

    @property
    def client(self) -> api.Client:
        """The API client (raises :class:`HostError` where there is none)."""

    def node_object(self) -> dict[str, Any] | None:
        """This node's Node object as the API has it (None: not there)."""

    def patch_node_labels(self, labels: Mapping[str, str | None]) -> None:
        """Merge-patch this node's labels (None removes one)."""

    def event(self, reason: str, message: str, type_: str = "Normal", component: str = OPERATOR_COMPONENT) -> None:
        """An Event on this node (counted when repeated, see :func:`gpulab.kube.events.record`)."""

    def pods_holding_gpus(self) -> list[str]:
        """``namespace/name`` of the pods that hold this node's GPUs (see :func:`pods_holding_gpus`)."""

    def config_source(self) -> tuple[str | None, str | None]:
        """config-manager: the ConfigMap of named device-plugin configs and the default name (None: no config)."""

    # -- the simulated hardware ----------------------------------------------

    def gpus(self) -> Gpus | None:
        """The node's GPUs; None: it has none."""

    def mig_layout(self) -> MigLayout | None:
        """The MIG geometry the GPUs have now (None: MIG disabled)."""

    def apply_mig(self, layout: MigLayout | None) -> None:
        """Give every GPU this MIG geometry (what mig-parted does)."""

    def faults(self) -> NodeFaults:
        """The ``gpulab fault`` faults the node has now (none where the host cannot have any)."""

    def gpu_state(self, in_container: bool = False) -> dict[str, Any]:
        """The driver's view of the GPUs: nvidia-smi state, as the host (or a container) sees it."""

    # -- the device plugin ---------------------------------------------------

    def plugin_config(self) -> PluginConfig:
        """Where the plugin's sockets go (next to the kubelet's), nvidia-smi and its state files, device nodes."""

    def advertised(self, resources: NodeResources) -> None:
        """The plugin now advertises ``resources`` (the host updates what depends on the devices)."""

    # -- the DCGM exporter ---------------------------------------------------

    def metrics_view(self) -> MetricsView:
        """What the exporter reports: the GPUs and who holds them."""

    def metrics_address(self) -> tuple[str, int]:
        """Where the exporter listens."""

    def metrics_published(self, endpoint: str) -> None:
        """The exporter serves at ``endpoint`` now (the host tells whoever scrapes it)."""

    def pod_listener(self, port: int) -> socket.socket | None:
        """A socket listening at the pod's own IP and ``port``, where the pod's network is not the exporter's
        own (a built-in program of the node agent), so that Prometheus scrapes the pod IP; None where the
        exporter's address already is the pod's."""


# --------------------------------------------------------------------------
# Written once for both hosts


def node_labels(host: Host) -> dict[str, str]:
    return dict(((host.node_object() or {}).get("metadata") or {}).get("labels") or {})


def record_node_event(client: api.Client, node: str, uid: str | None, reason: str, message: str,
                      type_: str = "Normal", component: str = OPERATOR_COMPONENT) -> None:
    """An Event on a Node, from ``component`` on that node (the same one again counts on the existing Event)."""
    involved = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "uid": uid or node}}
    events.record(client, involved, reason, message, type_, component=component, host=node)


def gpu_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """The ``nvidia.com/*`` devices each of the pod's containers asks for, summed by resource (nonzero only)."""
    spec = pod.get("spec") or {}
    out: dict[str, int] = {}
    for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        res = c.get("resources") or {}
        for k, v in {**(res.get("requests") or {}), **(res.get("limits") or {})}.items():
            if not k.startswith("nvidia.com/"):
                continue
            try:
                n = int(str(v))
            except ValueError:
                continue
            if n > 0:
                out[k] = out.get(k, 0) + n
    return out


def pods_holding_gpus(client: api.Client, node: str) -> list[str]:
    """``namespace/name`` of the pods holding ``node``'s GPUs, from the API (see :func:`holding_gpus`)."""
    return holding_gpus(client.list("Pod", field_selector=f"spec.nodeName={node}"))


def holding_gpus(pods: Iterable[dict[str, Any]]) -> list[str]:
    """``namespace/name`` of those of a node's ``pods`` that hold its GPUs: the one definition both hosts use.

    A pod holds GPUs from the moment it is bound to the node until it ends:
    asking for an ``nvidia.com/*`` resource, and not Succeeded or Failed (a
    terminating pod still holds them). From the API (a list, or the watch of
    Pods), so that a process in kind's DaemonSet, which sees no kubelet's
    device checkpoint, decides as the embedded node agent does.
    """
    held = []
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        if gpu_requests(pod):
            md = pod["metadata"]
            held.append(f"{md['namespace']}/{md['name']}")
    return sorted(held)


class ApiHost:
    """The parts of :class:`Host` that go through the API the same way on both hosts."""

    node: str

    @property
    def client(self) -> api.Client:  # pragma: no cover - overridden
        raise NotImplementedError

    def node_object(self) -> dict[str, Any] | None:
        return self.client.get("Node", self.node)

    def patch_node_labels(self, labels: Mapping[str, str | None]) -> None:
        if labels:
            self.client.patch("Node", self.node, {"metadata": {"labels": dict(labels)}})

    def event(self, reason: str, message: str, type_: str = "Normal", component: str = OPERATOR_COMPONENT) -> None:
        try:
            uid = ((self.node_object() or {}).get("metadata") or {}).get("uid")
        except (api.ApiError, api.NotFound, api.Conflict, OSError):
            uid = None
        record_node_event(self.client, self.node, uid, reason, message, type_, component)

    def pods_holding_gpus(self) -> list[str]:
        return pods_holding_gpus(self.client, self.node)

    def changed(self) -> None:
        """Nothing to do where components poll (kind's): they see the change at their next look."""
