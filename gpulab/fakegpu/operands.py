"""NVIDIA's node components as built-in programs of their images: the embedded backend's host.

The GPU Operator's DaemonSets (:mod:`gpulab.fakegpu.operator`) use NVIDIA's
image names; each is registered with :mod:`gpulab.runtime.programs`, so a
container of that image runs the matching component in the node agent, for
its node. The components themselves are written once
(:mod:`gpulab.fakegpu.components`); :class:`EmbeddedHost` is what they run
on here: the simulated hardware of the node
(:class:`~gpulab.fakegpu.node.GpuNode`, with its ``gpulab fault`` faults),
the stack's shared watch of Nodes, the container's env and volume mounts.

``nvcr.io/nvidia/k8s-device-plugin``
    by command: ``nvidia-device-plugin`` (:mod:`~gpulab.fakegpu.components.deviceplugin`)
    serves the node's GPUs on the node's ``kubelet.sock``, with the config
    file ``CONFIG_FILE`` and ``MIG_STRATEGY``; ``gpu-feature-discovery``
    (:mod:`~gpulab.fakegpu.components.featurediscovery`) keeps the node's GFD
    labels current; ``config-manager`` (:mod:`~gpulab.fakegpu.components.configmanager`)
    picks the config for the node from the ConfigMap and the
    ``nvidia.com/device-plugin.config`` label.
``nvcr.io/nvidia/cloud-native/k8s-mig-manager``
    applies ``nvidia.com/mig.config`` (:mod:`~gpulab.fakegpu.components.migmanager`).
``nvcr.io/nvidia/k8s/dcgm-exporter``
    DCGM metrics of the node's GPUs in Prometheus format, on 127.0.0.1
    (the address is in the pod's ``gpulab.io/metrics-endpoint`` annotation).
``nvcr.io/nvidia/cloud-native/gpu-operator-validator``
    the operator validator's init containers (driver, toolkit, cuda with its
    ``nvidia-cuda-validator`` workload pod, plugin) and main container
    (:class:`ValidatorMain`, here only: kind's DaemonSets have no validator).

A program that fails exits non-zero and its container restarts with
back-off, so a broken component shows as CrashLoopBackOff, as it would.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import socket
import string
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from ..hardware.models import MigLayout
from ..kube import api
from ..kube.names import METRICS_ANNOTATION, OPERATOR_COMPONENT
from ..runtime import programs
from ..runtime.network import NetworkError
from . import cudaerrors, nvidiasmi
from .components import COMPONENTS
from .components.host import RESYNC_S, ApiHost, Gpus, HostError, Klog, MetricsView, Settings, holding_gpus
from .devicemap import NodeResources
from .deviceplugin import DEVICE_PLUGIN_PATH
from .deviceplugin.plugin import PluginConfig
from .faults import NodeFaults
from .pluginconfig import CONFIG_LABEL
from .stack import GpuStack

DEVICE_PLUGIN_IMAGE = "nvcr.io/nvidia/k8s-device-plugin"
MIG_MANAGER_IMAGE = "nvcr.io/nvidia/cloud-native/k8s-mig-manager"
VALIDATOR_IMAGE = "nvcr.io/nvidia/cloud-native/gpu-operator-validator"
DCGM_EXPORTER_IMAGE = "nvcr.io/nvidia/k8s/dcgm-exporter"

VALIDATIONS_DIR = "/run/nvidia/validations"
#: The CUDA runtime the validator's vectorAdd sample is built with.
VALIDATOR_CUDA_RUNTIME = "12.8"
POLL = 0.5
#: How often a waiting component looks whether it is asked to stop.
_STOP_CHECK_S = 0.2

#: The device-plugin image's commands -> components.
DEVICE_PLUGIN_COMMANDS = {
    "nvidia-device-plugin": "device-plugin",
    "gpu-feature-discovery": "gfd",
    "config-manager": "config-manager",
}


# --------------------------------------------------------------------------
# The container a program runs in


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


def settings_of(ctx: programs.ProgramContext) -> Settings:
    """What NVIDIA's component reads from its container: env variables and mounted paths."""
    env = ctx.env
    config_file = env.get("CONFIG_FILE") or None
    return Settings(
        namespace=env.get("DEFAULT_GPU_CLIENTS_NAMESPACE") or ctx.pod["metadata"]["namespace"],
        config_file=host_path(ctx, config_file) if config_file else None,
        config_file_shown=config_file,
        mig_strategy=env.get("MIG_STRATEGY") or None,
        flags=dict(env),
        gfd_interval=_seconds(env.get("GFD_SLEEP_INTERVAL", "60s"), 60.0),
        oneshot=env.get("ONESHOT", "false").lower() == "true",
        config_label=env.get("NODE_LABEL") or CONFIG_LABEL,
        fallbacks=tuple(s for s in (env.get("FALLBACK_STRATEGIES") or "named,single").split(",") if s),
        config_dst=host_path(ctx, env.get("CONFIG_FILE_DST", "/config/config.yaml")),
    )


# --------------------------------------------------------------------------
# The host


class EmbeddedHost(ApiHost):
    """:class:`~gpulab.fakegpu.components.host.Host` for a program in the node agent.

    The hardware is the node's :class:`~gpulab.fakegpu.node.GpuNode` (None on a
    node without GPUs), faults included; the Node comes from the stack's shared
    watch, and :meth:`wait` returns early when the cluster or the hardware
    changed. Use as a context manager (it subscribes to those changes).
    """

    def __init__(self, stack: GpuStack, ctx: programs.ProgramContext, stop: threading.Event, source: str):
        self.stack = stack
        self.ctx = ctx
        self.node = ctx.node
        self.gpu_node = stack.gpu_node(ctx.node)
        self.log = Klog(ctx.log, source)
        self.settings = settings_of(ctx)
        self._stop = stop
        self._sub = stack.subscribe(ctx.node)
        # A program's stop wakes its wait at once (its node agent's programs); any other stop is looked at
        # every _STOP_CHECK_S.
        self._stop_wakes = isinstance(stop, programs.StopEvent)
        if self._stop_wakes:
            stop.also_wake(self._sub.event)

    def __enter__(self) -> "EmbeddedHost":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.unsubscribe(self._sub)

    # -- lifecycle

    def wait(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or self._sub.wait(left if self._stop_wakes else min(left, _STOP_CHECK_S)):
                break
        return self._stop.is_set()

    def stopping(self) -> bool:
        return self._stop.is_set()

    def changed(self) -> None:
        self.stack.notify(self.node, everyone=False)

    @contextlib.contextmanager
    def watching_pod(self, key: str) -> Iterator[None]:
        """While in the block, the pod ``namespace/name`` changing also ends :meth:`wait`."""
        self.stack.watch_pod(self._sub, key)
        try:
            yield
        finally:
            self.stack.unwatch_pod(self._sub, key)

    # -- the API

    @property
    def client(self) -> api.Client:
        return self.stack.client

    def node_object(self) -> dict[str, Any] | None:
        return self.stack.node_object(self.node)

    def pods_holding_gpus(self) -> list[str]:
        # The shared watch of Pods, by node: a fleet's MIG managers do not each list the cluster's pods.
        return holding_gpus(self.stack.pods_on(self.node))

    def event(self, reason: str, message: str, type_: str = "Normal", component: str = OPERATOR_COMPONENT) -> None:
        self.stack.node_event(self.node, reason, message, type_, component=component)

    def config_source(self) -> tuple[str | None, str | None]:
        # The operator rendered the ClusterPolicy's devicePlugin.config into the pod.
        configmap = next((v["configMap"]["name"] for v in self.ctx.pod["spec"].get("volumes") or []
                          if v["name"] == "available-configs" and v.get("configMap")), None)
        return configmap, (self.ctx.env.get("DEFAULT_CONFIG") or None)

    # -- the hardware

    def gpus(self) -> Gpus | None:
        return Gpus(self.gpu_node.model, self.gpu_node.count) if self.gpu_node is not None else None

    def mig_layout(self) -> MigLayout | None:
        return self.gpu_node.mig_layout if self.gpu_node is not None else None

    def apply_mig(self, layout: MigLayout | None) -> None:
        assert self.gpu_node is not None
        self.gpu_node.apply_mig(layout)

    def faults(self) -> NodeFaults:
        return self.gpu_node.faults if self.gpu_node is not None else NodeFaults()

    def gpu_state(self, in_container: bool = False) -> dict[str, Any]:
        assert self.gpu_node is not None
        return self.gpu_node.state(in_container=in_container)

    # -- device plugin

    def plugin_config(self) -> PluginConfig:
        assert self.gpu_node is not None
        plugin_dir = host_path(self.ctx, DEVICE_PLUGIN_PATH.rstrip("/"))
        if plugin_dir is None:
            raise HostError(f"the container must mount the host's {DEVICE_PLUGIN_PATH} (a hostPath volume), "
                            "where the kubelet's socket is")
        # The real directory: under a long GPULAB_HOME the node's path is a symlink to a
        # short one, and socket paths must stay under 108 bytes (see node.socket_dir).
        plugin_dir = plugin_dir.resolve()
        pass_specs = self.ctx.env.get("PASS_DEVICE_SPECS", "true").lower() == "true"
        return PluginConfig(plugin_dir=plugin_dir, nvidia_smi=self.gpu_node.nvidia_smi,
                            state_dir=plugin_dir / "gpulab-nvidia-smi", dev_root=self.gpu_node.dev_root,
                            pass_device_specs=pass_specs, poll_interval=POLL,
                            # The kubelet's device manager lives and dies with this process: nothing to watch for.
                            settled_interval=RESYNC_S)

    def advertised(self, resources: NodeResources) -> None:
        assert self.gpu_node is not None
        self.gpu_node.publish(resources)  # the node maps device IDs to what they are (GPU, MIG slice, share)

    # -- DCGM exporter

    def metrics_view(self) -> MetricsView:
        assert self.gpu_node is not None
        return self.gpu_node

    def metrics_address(self) -> tuple[str, int]:
        return ("127.0.0.1", 0)

    def pod_listener(self, port: int) -> socket.socket | None:
        try:
            return self.ctx.network.listen(self.ctx.pod, self.ctx.pod_ip, port)
        except NetworkError as e:
            self.log.warning(f"cannot listen at the pod's IP: {e}")
            return None

    def metrics_published(self, endpoint: str) -> None:
        md = self.ctx.pod["metadata"]
        try:
            self.client.patch("Pod", md["name"], {"metadata": {"annotations": {METRICS_ANNOTATION: endpoint}}},
                              md["namespace"])
        except (api.ApiError, api.NotFound, api.Conflict) as e:
            self.log.warning(f"cannot publish the metrics endpoint: {e}")


def _component(stack: GpuStack, name: str, stop: threading.Event, ctx: programs.ProgramContext) -> int:
    run, source = COMPONENTS[name]
    with EmbeddedHost(stack, ctx, stop, source) as host:
        return run(host)


def _device_plugin_image(stack: GpuStack, stop: threading.Event, ctx: programs.ProgramContext) -> int | None:
    cmd = argv(ctx)
    name = os.path.basename(cmd[0]) if cmd else "nvidia-device-plugin"
    if name in ("sh", "bash") and len(cmd) > 2:
        name = os.path.basename(cmd[-1].split()[-1])  # `sh -c "... exec nvidia-device-plugin"`
    if name not in DEVICE_PLUGIN_COMMANDS:
        Klog(ctx.log, "main.go:1").print(f'exec: "{name}": executable file not found in $PATH')
        return 127
    return _component(stack, DEVICE_PLUGIN_COMMANDS[name], stop, ctx)


# --------------------------------------------------------------------------
# Operator validator (embedded only)


#: How long the validator waits for its CUDA workload pod to succeed (NVIDIA's: 60 looks, 5 s apart), and how often
#: it looks without a change of the pod.
CUDA_WORKLOAD_WAIT_S = 300.0
CUDA_WORKLOAD_RECHECK_S = 5.0
#: How often and how many times the validator looks for the node's GPU resources (NVIDIA's numbers).
GPU_DISCOVERY_INTERVAL_S = 5.0
GPU_DISCOVERY_RETRIES = 30


class ValidatorMain:
    """``nvidia-validator``: the operator validator's checks, one per container."""

    def __init__(self, host: EmbeddedHost):
        self.host = host
        self.stack = host.stack
        self.ctx = host.ctx
        self.out = host.log
        self.node = host.gpu_node
        self.namespace = self.ctx.env.get("OPERATOR_NAMESPACE") or self.ctx.pod["metadata"]["namespace"]
        self.dir = host_path(self.ctx, VALIDATIONS_DIR)

    def run(self) -> int:
        name = self.ctx.container["name"]
        if "vectorAdd" in " ".join(argv(self.ctx)):
            return self.vector_add()
        if name == "nvidia-cuda-validator":
            self.out.print("cuda workload validation is successful")
            return 0
        component = self.ctx.env.get("COMPONENT")
        checks = {"driver": self.driver, "toolkit": self.toolkit, "cuda": self.cuda, "plugin": self.plugin}
        if component in checks:
            return checks[component]()
        # The main container: everything before it passed.
        self.out.print("all validations are successful")
        while not self.host.wait(3600):
            pass
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

    def _sleep(self, seconds: float) -> bool:
        """Sleep ``seconds`` (not woken by changes); True when asked to stop."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.host.wait(deadline - time.monotonic()):
                return True
        return False

    def _nvidia_smi_until_ok(self, what: str, command: str) -> int:
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
            if self._sleep(5):
                return 1

    def driver(self) -> int:
        return self._nvidia_smi_until_ok("driver", "bash with args [-c nvidia-smi]")

    def toolkit(self) -> int:
        return self._nvidia_smi_until_ok("toolkit", "nvidia-smi with args []")

    def cuda(self) -> int:
        client = self.stack.client
        for old in self._cuda_pods():
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
        # The pod's phase comes from the shared watch of Pods, which wakes this wait when the pod changes.
        with self.host.watching_pod(f"{self.namespace}/{name}"):
            try:
                created = client.create(pod)
            except (api.ApiError, api.Conflict) as e:
                self.out.print(f"failed to create cuda validation pod {name}, err {e}")
                return 1
            return self._wait_succeeded(created)

    def _cuda_pods(self) -> list[dict[str, Any]]:
        """The node's CUDA workload pods (left by an earlier run of the validator)."""
        return [p for p in self.stack.pods_on(self.ctx.node) if p["metadata"]["namespace"] == self.namespace
                and (p["metadata"].get("labels") or {}).get("app") == "nvidia-cuda-validator"]

    def _wait_succeeded(self, created: dict[str, Any]) -> int:
        name = created["metadata"]["name"]
        key = f"{self.namespace}/{name}"
        deadline = time.monotonic() + CUDA_WORKLOAD_WAIT_S
        seen = False
        while True:
            current = self.stack.pods.get(key)
            if current is None and seen:
                self.out.print(f"failed to get pod {name}, err pods \"{name}\" not found")
                return 1
            seen = seen or current is not None
            phase = ((current or created).get("status") or {}).get("phase") or "Pending"
            if phase == "Succeeded":
                self.out.print(f"pod {name} ran successfully")
                self._ready("cuda")
                return 0
            self.out.print(f"pod {name} is currently in {phase} phase")
            left = deadline - time.monotonic()
            if left <= 0:
                self.out.print(f"gave up waiting for pod {name} to be available")
                return 1
            if self.host.wait(min(left, CUDA_WORKLOAD_RECHECK_S)):
                return 1

    def plugin(self) -> int:
        # NVIDIA's validator looks 30 times, 5 s apart; a change of the Node (its capacity) makes it look at once.
        deadline = time.monotonic() + GPU_DISCOVERY_RETRIES * GPU_DISCOVERY_INTERVAL_S
        attempt, next_retry = 0, 0.0
        while True:
            node = self.stack.node_object(self.ctx.node) or {}
            capacity = (node.get("status") or {}).get("capacity") or {}
            if any((k == "nvidia.com/gpu" or k.startswith("nvidia.com/mig-")) and str(v) not in ("0", "")
                   for k, v in capacity.items()):
                self._ready("plugin")
                return 0
            now = time.monotonic()
            if now >= deadline:
                self.out.print("GPU resources are not discovered by the node")
                return 1
            if now >= next_retry:
                attempt += 1
                self.out.print(f"GPU resources are not yet discovered by the node, retry: {attempt}")
                next_retry = now + GPU_DISCOVERY_INTERVAL_S
            if self.host.wait(min(deadline, next_retry) - now):
                return 1

    def vector_add(self) -> int:
        self.out.print("[Vector addition of 50000 elements]")
        state = self.node.state(in_container=True) if self.node is not None else None
        err = cudaerrors.cuda_error(state, "all", VALIDATOR_CUDA_RUNTIME)
        if err is not None:
            self.out.print(f"Failed to allocate device vector A (error code {err.message})!")
            return 1
        self.out.print("Copy input data from the host memory to the CUDA device\n"
                       "CUDA kernel launch with 196 blocks of 256 threads\n"
                       "Copy output data from the CUDA device to the host memory\n"
                       "Test PASSED\nDone")
        return 0


def _validator(stack: GpuStack, stop: threading.Event, ctx: programs.ProgramContext) -> int:
    with EmbeddedHost(stack, ctx, stop, "main.go:1") as host:
        return ValidatorMain(host).run()


# --------------------------------------------------------------------------


def _program(stack: GpuStack, run: Callable[[GpuStack, threading.Event, programs.ProgramContext], int | None]
             ) -> programs.Factory:
    return lambda ctx: programs.FunctionProgram(ctx, lambda stop, c: run(stack, stop, c))


def register(stack: GpuStack) -> None:
    """Make NVIDIA's images run these programs on this node agent's nodes."""
    programs.register(DEVICE_PLUGIN_IMAGE, _program(stack, _device_plugin_image))
    programs.register(MIG_MANAGER_IMAGE, _program(stack, lambda s, stop, ctx: _component(s, "mig-manager", stop, ctx)))
    programs.register(VALIDATOR_IMAGE, _program(stack, _validator))
    programs.register(DCGM_EXPORTER_IMAGE,
                      _program(stack, lambda s, stop, ctx: _component(s, "dcgm-exporter", stop, ctx)))
