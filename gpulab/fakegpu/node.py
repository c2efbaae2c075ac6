"""One simulated GPU node: its GPUs, its driver, and the kubelet's device side.

A :class:`GpuNode` lives in the node agent process for each GPU node of the
topology and holds what on a real machine is hardware, kernel and kubelet:

- the GPUs (model and count from the topology; the MIG geometry the MIG
  manager applied, kept in ``nodes/<node>/gpu/hardware.json``) and the
  faults injected with ``gpulab fault``;
- the kubelet's device manager (:class:`~gpulab.fakegpu.deviceplugin.kubelet.DeviceManager`)
  serving Registration on the node's ``/var/lib/kubelet/device-plugins/kubelet.sock``;
  its counts become the Node's capacity/allocatable, its Allocate responses
  become the containers' env, mounts and device nodes;
- the driver's view of the GPUs: a live nvidia-smi state for the host
  (``gpu/nvidia-smi.json``, what ``gpulab nvidia-smi NODE`` prints) and for
  each container holding GPUs (the state file its Allocate response named),
  with the memory, load and processes of the CUDA programs in the
  :class:`~gpulab.fakegpu.ledger.Ledger`;
- each GPU container's way back: a writable directory of its own,
  ``gpu/activity/<pod UID>_<container>/``, where a program that computes for
  real (the inference server, :mod:`gpulab.fakegpu.llmserver`) keeps the file
  ``GPULAB_GPU_ACTIVITY`` names: the percent of its GPU it keeps busy, read
  into the ledger as a measured utilization (:meth:`GpuNode.apply_load`).

Its host files sit where a real node has them, under ``nodes/<node>/host/``:
``usr/bin/nvidia-smi`` (the fake, stdlib-only nvidia-smi, mounted into GPU
containers), ``dev/nvidia*`` (device node stand-ins) and the device-plugin
directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any, Protocol

from .._fsutil import socket_home
from ..kube import api
from ..kube.names import ALLOCATED_DEVICES_ANNOTATION
from ..kube.topology import NodeSpec
from ..runtime.devices import AdmissionError, AdmissionPending, ContainerKill, DeviceGrant
from ..runtime.sandbox import Mount
from . import faults as faultmod
from . import ledger as ledgermod
from ..hardware import models
from . import cudaerrors, llmserver, nvidiasmi, smistate
from .devicemap import AdvertisedDevice, NodeResources, strip_replica
from .deviceplugin.kubelet import AllocationError, DeviceManager
from .deviceplugin.plugin import NVIDIA_SMI_CONTAINER_PATH, NVIDIA_SMI_STATE_ENV, VISIBLE_DEVICES_ENV
from .gfd import CUDA_DRIVER_VERSION, DRIVER_VERSION

log = logging.getLogger("gpulab.fakegpu")

#: Pod annotation the node agent writes after admission: {container: {resource: [device IDs]}}.
DEVICE_PLUGIN_DIR = "var/lib/kubelet/device-plugins"
#: A program's report of its own GPU activity older than this is not believed (the program is gone or hung).
ACTIVITY_STALE_SECONDS = 10.0
_CUDA_IMAGE_TAG = re.compile(r"^(\d+)\.(\d+)")


def _resource_requests(container: dict[str, Any]) -> dict[str, int]:
    res = container.get("resources") or {}
    out: dict[str, int] = {}
    for k, v in {**(res.get("limits") or {}), **(res.get("requests") or {})}.items():
        if "/" in k and not k.startswith(("kubernetes.io/", "requests.", "hugepages-")):
            try:
                out[k] = int(str(v))
            except ValueError:
                continue  # the apiserver only admits integers for extended resources
    return out


# The longest socket a node's device-plugin directory gets is a MIG resource's
# (nvidia-mig-7g.141gb.sock), plus room for longer profile names.
_SOCKET_NAME_ROOM = 40


def socket_dir(path: Path) -> Path:
    """The node's device-plugin directory, where its sockets can be bound (:func:`gpulab._fsutil.socket_home`).

    Pod processes (nobody, when gpulab runs as root) read the nvidia-smi state kept in there,
    as they do under the node's own directory, so others may search it.
    """
    return socket_home(path, _SOCKET_NAME_ROOM, mode=0o755)


def remove_socket_dirs(cluster_dir: Path) -> None:
    """Delete the short directories :func:`socket_dir` made for a cluster that is being purged."""
    for link in Path(cluster_dir).glob(f"nodes/*/host/{DEVICE_PLUGIN_DIR}"):
        if link.is_symlink():
            shutil.rmtree(link.resolve(), ignore_errors=True)


def host_state_path(cluster_dir: Path, node: str) -> Path:
    """The live nvidia-smi state of a GPU node's host (what ``gpulab nvidia-smi NODE`` reads)."""
    return Path(cluster_dir) / "nodes" / node / "gpu" / "nvidia-smi.json"


def cuda_runtime_of(image: str) -> str | None:
    """The CUDA runtime an NVIDIA CUDA image was built with (``cuda:12.6.2-…`` → ``12.6``)."""
    name, _, tag = image.split("@", 1)[0].rpartition(":")
    if not name or "/" in tag or name.rsplit("/", 1)[-1] != "cuda":
        return None
    m = _CUDA_IMAGE_TAG.match(tag)
    return f"{m.group(1)}.{m.group(2)}" if m else None


class NodeStatusWriter:
    """The kubelet's part: writes each node's device-manager counts into its Node's status, latest value wins,
    retrying on errors.

    One writer serves every node of the process with a few threads (``workers``): a fleet's nodes are idle
    nearly always, and a thread each would be a thousand threads waiting. A node is written by one worker at a
    time, so its writes stay in order; a node whose write failed is written again ``retry_s`` later.
    """

    def __init__(self, client: api.Client, workers: int = 4, retry_s: float = 1.0):
        self.client = client
        self.workers = workers
        self.retry_s = retry_s
        self._latest: dict[str, dict[str, tuple[int, int]]] = {}
        self._due: dict[str, float] = {}  # node -> monotonic time its write is due (insertion order: first come)
        self._busy: set[str] = set()
        self._cond = threading.Condition()
        self._halt = False
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for i in range(self.workers):
            thread = threading.Thread(target=self._run, daemon=True, name=f"gpu-status-{i}")
            thread.start()
            self._threads.append(thread)

    def submit(self, node: str, counts: dict[str, tuple[int, int]]) -> None:
        with self._cond:
            self._latest[node] = dict(counts)
            self._due.setdefault(node, 0.0)
            self._cond.notify()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the workers (a write under way finishes first, up to ``timeout``)."""
        with self._cond:
            self._halt = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout)

    def _take(self) -> tuple[str, dict[str, tuple[int, int]]] | None:
        """The next node due and not being written (None: stopping); waits for one."""
        with self._cond:
            while not self._halt:
                now, wait = time.monotonic(), None
                for node, due in self._due.items():
                    if node in self._busy:
                        continue
                    if due <= now:
                        del self._due[node]
                        self._busy.add(node)
                        return node, self._latest[node]
                    wait = due - now if wait is None else min(wait, due - now)
                self._cond.wait(wait)
            return None

    def _run(self) -> None:
        while (taken := self._take()) is not None:
            node, counts = taken
            patch = {"status": {"capacity": {r: str(c) for r, (c, _) in counts.items()},
                                "allocatable": {r: str(a) for r, (_, a) in counts.items()}}}
            retry = False
            try:
                self.client.patch("Node", node, patch, subresource="status")
            except (api.ApiError, api.NotFound, api.Conflict) as e:
                log.warning("cannot write GPU resources of node %s: %s; retrying", node, e)
                retry = True
            with self._cond:
                self._busy.discard(node)
                if retry:
                    self._due.setdefault(node, time.monotonic() + self.retry_s)
                self._cond.notify()


class NodeHost(Protocol):
    """What a :class:`GpuNode` needs of the stack that holds it (:class:`gpulab.fakegpu.stack.GpuStack`)."""

    client: api.Client
    #: Writes the nodes' GPU counts into their status (started and stopped by the stack).
    node_status: NodeStatusWriter

    def notify(self, node: str | None = None, everyone: bool = True) -> None:
        """Wake the programs of ``node`` (and the cluster-wide ones): its hardware changed."""

    def pod_event(self, pod: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> None:
        """Record an Event on ``pod``."""


class GpuNode:
    """One GPU node of the topology, as the node agent simulates it (see the module docstring)."""

    def __init__(self, stack: NodeHost, spec: NodeSpec, cluster_dir: Path):
        assert spec.gpu_model and spec.gpu_count
        self.stack = stack
        self.name = spec.name
        self.model = models.get_model(spec.gpu_model)
        self.count = spec.gpu_count
        self.cluster_dir = Path(cluster_dir)
        root = self.cluster_dir / "nodes" / spec.name
        self.host = root / "host"
        self.gpu_dir = root / "gpu"
        self.plugin_dir = socket_dir(self.host / DEVICE_PLUGIN_DIR)
        self.nvidia_smi = self.host / "usr" / "bin" / "nvidia-smi"
        self.dev_root = self.host / "dev"
        self.smi_state_path = host_state_path(self.cluster_dir, spec.name)
        # What a container sees of all GPUs (no processes: its PID namespace hides them).
        self.container_state_path = self.gpu_dir / "nvidia-smi-container.json"
        self.lock = threading.RLock()
        self.ledger = ledgermod.Ledger()
        self.faults = faultmod.NodeFaults()
        self._faults_mtime: object = object()  # never equal to a stat: the first reload applies
        self.mig_layout: models.MigLayout | None = None
        self._advertised: dict[str, AdvertisedDevice] = {}
        self._pods: dict[str, str] = {}                 # pod UID -> "namespace/name"
        self._state_files: dict[tuple[str, str], tuple[Path, tuple[int, ...]]] = {}
        self._state_written: dict[Path, str] = {}  # what each nvidia-smi state file holds (smistate.write_state)
        self._running: dict[tuple[str, str], bool] = {}  # owner -> is a CUDA program
        # GPU containers that declared no CUDA program: computing (a server's reported utilization) makes them one.
        self._idle: dict[tuple[str, str], str] = {}       # owner -> process name
        self._pending: dict[tuple[str, str], ledgermod.Kill] = {}
        # Wakes the pod (by UID) whose container a kill in _pending awaits (DeviceHooks.wake_with).
        self.wake_pod: Callable[[str], None] = lambda uid: None
        self.manager = DeviceManager(self.plugin_dir, on_change=self._devices_changed)

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> None:
        self.gpu_dir.mkdir(parents=True, exist_ok=True)
        self._install_host_files()
        self._load_hardware()
        self.reload_faults()
        self.manager.start()
        self.refresh()

    def stop(self) -> None:
        self.manager.stop()

    def _devices_changed(self, counts: dict[str, tuple[int, int]]) -> None:
        """The device manager's resources changed (a plugin registered, its devices or their health changed): the
        Node's status says so, and the node's components (the device plugin waiting for its registration) look."""
        self.stack.node_status.submit(self.name, counts)
        self.stack.notify(self.name, everyone=False)

    def _install_host_files(self) -> None:
        # The driver's device nodes, as plain files: containers get them bound
        # at /dev/nvidia*, nothing ever opens them.
        self.dev_root.mkdir(parents=True, exist_ok=True)
        for name in [f"nvidia{i}" for i in range(self.count)] + ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]:
            (self.dev_root / name).touch(0o666)
        # nvidia-smi runs inside the sandbox, which sees the host's /usr but
        # not gpulab: the command is the stdlib-only module itself.
        self.nvidia_smi.parent.mkdir(parents=True, exist_ok=True)
        source = Path(nvidiasmi.__file__).read_text()
        tmp = self.nvidia_smi.with_name(".nvidia-smi.tmp")
        tmp.write_text("#!/usr/bin/python3 -IS\n" + source)
        tmp.chmod(0o755)
        os.replace(tmp, self.nvidia_smi)
        for d in (self.host, self.gpu_dir):
            d.chmod(0o755)  # exec'd commands and sandboxes run as nobody

    @property
    def _hardware_file(self) -> Path:
        return self.gpu_dir / "hardware.json"

    def _load_hardware(self) -> None:
        try:
            hw = json.loads(self._hardware_file.read_text())
        except (OSError, ValueError):
            return
        if hw.get("model") != self.model.key or hw.get("count") != self.count or not hw.get("mig"):
            return
        try:
            layout = self.model.layout(hw["mig"])
        except models.GpuModelError:
            return
        self.mig_layout = layout if layout.mig_enabled else None

    def apply_mig(self, layout: models.MigLayout | None) -> None:
        """Give every GPU of the node this MIG geometry (what mig-parted does)."""
        with self.lock:
            self.mig_layout = layout if layout is not None and layout.mig_enabled else None
            doc = {"model": self.model.key, "count": self.count,
                   "mig": self.mig_layout.name if self.mig_layout else None}
            tmp = self._hardware_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(doc, indent=2) + "\n")
            os.replace(tmp, self._hardware_file)
        self.refresh()
        self.stack.notify(self.name)

    def reload_faults(self) -> bool:
        """Pick up ``gpulab fault`` changes; True when they changed."""
        path = faultmod.faults_path(self.cluster_dir, self.name)
        try:
            mtime: object = path.stat().st_mtime_ns
        except FileNotFoundError:
            mtime = None
        if mtime == self._faults_mtime:
            return False
        self._faults_mtime = mtime
        with self.lock:
            new = faultmod.acknowledge(self.cluster_dir, self.name)
            if new == self.faults:
                return False
            log.info("node %s: faults now %s", self.name, ", ".join(f.describe() for f in new.faults) or "none")
            self.faults = new
            self.refresh()
        return True

    # -- what the device plugin advertises ----------------------------------------

    def publish(self, resources: NodeResources) -> None:
        """The device plugin's current device map (what each device ID really is)."""
        with self.lock:
            for r in resources:
                for d in r.devices:
                    self._advertised[d.id] = d

    def inventory(self, resources: NodeResources) -> dict[str, Any]:
        """The plugin inventory for ``resources``, with the health faults give the devices."""
        inv = resources.to_inventory(self.state(in_container=True))
        bad = self.faults.unhealthy_gpus
        for r in inv["resources"]:
            for d in r["devices"]:
                d["health"] = "Unhealthy" if d.get("minor") in bad else "Healthy"
        return inv

    # -- the driver's view: nvidia-smi state -------------------------------------

    def versions(self) -> tuple[str, str]:
        return self.faults.driver_versions(DRIVER_VERSION, CUDA_DRIVER_VERSION)

    def state(self, in_container: bool = False) -> dict[str, Any]:
        """nvidia-smi state of all GPUs as the host (or a container) sees them now."""
        driver, cuda = self.versions()
        with self.lock:
            state = smistate.build_state(self.model, self.count, self.name, mig_layout=self.mig_layout,
                                          driver_version=driver, cuda_version=cuda,
                                          fault=self.faults.driver_fault(in_container))
            for gpu in state["gpus"]:
                self._overlay(gpu, processes=not in_container)
        return state

    def _overlay(self, gpu: dict[str, Any], processes: bool) -> None:
        uuid = gpu["uuid"]
        used = self.ledger.gpu_memory_used(uuid)
        util = self.ledger.gpu_utilization(uuid)
        gpu["memory_used_mib"] = min(used, gpu["memory_total_mib"])
        gpu["utilization_gpu"] = util
        gpu["utilization_memory"] = min(100, util * 3 // 5)
        m = self.model
        gpu["power_draw_w"] = round(m.power.idle_w + (m.power.limit_w - m.power.idle_w) * util / 100 * 0.85, 1)
        gpu["temperature_gpu"] = m.temperature.idle_c + util * 35 // 100
        if util:
            gpu["clocks"] = dict(gpu["max_clocks"])
        for mig in gpu.get("mig_devices") or []:
            mig["memory_used_mib"] = self.ledger.pool_used(mig["uuid"])
        # Inside a container its PID namespace hides every GPU process, its own included.
        if not processes:
            return
        gis = {m["uuid"]: (m["gi_id"], m["ci_id"]) for m in gpu.get("mig_devices") or []}
        # Each program's share of the GPU (pmon's sm), scaled as the GPU's utilisation is capped at 100.
        scale = min(1.0, 100 / max(self.ledger.gpu_demand(uuid), 1))
        procs = []
        for owner, use, demand, name in self.ledger.processes(uuid):
            gi, ci = gis.get(use.pool, (None, None))
            procs.append({"pid": _pid(owner), "type": "C", "name": name, "used_memory_mib": demand.memory_mib,
                          "gi_id": gi, "ci_id": ci,
                          "utilization": round(demand.utilization * use.compute_fraction * scale)})
        gpu["processes"] = sorted(procs, key=lambda p: p["pid"])

    def refresh(self) -> None:
        """Rewrite the host's and every GPU container's nvidia-smi state."""
        with self.lock:
            inside = self.state(in_container=True)
            for path, state in ((self.smi_state_path, self.state()), (self.container_state_path, inside)):
                self._write_state(path, state)
            for owner, (path, gpus) in self._state_files.items():
                # What the container's neighbours on each of its GPUs want (gpulab's own field, read by
                # programs that model time-slicing, such as gpulab/llm-server).
                view = dict(inside, gpus=[dict(g, utilization_neighbours=self.ledger.gpu_demand(g["uuid"], owner))
                                          for g in inside["gpus"] if g["index"] in gpus])
                try:
                    self._write_state(path, view)
                except OSError as e:
                    log.warning("cannot update %s: %s", path, e)

    def _write_state(self, path: Path, state: dict[str, Any]) -> None:
        """Write one nvidia-smi state file (readable by the containers' users) unless it holds that already."""
        before = self._state_written.get(path)
        text = smistate.write_state(str(path), state, unless=before)
        if text != before:
            path.chmod(0o644)
            self._state_written[path] = text

    # -- devices of pods (the DeviceHooks of this node) ---------------------------

    def admit(self, pod: dict[str, Any]) -> None:
        """Allocate every GPU of the pod, or refuse it as the kubelet does."""
        md = pod["metadata"]
        uid = md["uid"]
        known = self.manager.resource_counts()
        containers = (pod["spec"].get("initContainers") or []) + (pod["spec"].get("containers") or [])
        wanted = [(c["name"], {r: n for r, n in _resource_requests(c).items()
                               if n > 0 and (r.startswith("nvidia.com/") or r in known)})
                  for c in containers]
        wanted = [(name, res) for name, res in wanted if res]
        if not wanted:
            return
        expected = sorted({r for _, res in wanted for r in res if self.manager.awaiting_plugin(r)})
        if expected:
            raise AdmissionPending(f"waiting for the device plugin of {', '.join(expected)} to register "
                                   "with the kubelet again")
        self._fit(uid, pod, known)
        try:
            for name, res in wanted:
                for resource, n in sorted(res.items()):
                    self.manager.allocate(uid, name, resource, n)
        except AllocationError as e:
            self.manager.release(uid)
            raise AdmissionError(AllocationError.reason, e.message) from None
        self._annotate(pod)

    def adopt(self, pod: dict[str, Any]) -> None:
        """A pod admitted before the node agent restarted keeps the devices its checkpoint entry names.

        As a restarted kubelet does, it is not admitted again: its plugin may
        not have registered yet, and the devices are its already.
        """
        md = pod["metadata"]
        if not self.manager.allocations(md["uid"]):
            if any(r.startswith("nvidia.com/") for c in (pod["spec"].get("initContainers") or [])
                   + (pod["spec"].get("containers") or []) for r in _resource_requests(c)):
                log.warning("pod %s/%s ran before the restart but the device checkpoint has no entry for it",
                            md["namespace"], md["name"])
            return
        self._annotate(pod)

    def _annotate(self, pod: dict[str, Any]) -> None:
        md = pod["metadata"]
        uid = md["uid"]
        with self.lock:
            self._pods[uid] = f"{md['namespace']}/{md['name']}"
        devices = self.manager.pod_devices().get(uid, {})
        if (md.get("annotations") or {}).get(ALLOCATED_DEVICES_ANNOTATION) != json.dumps(devices, sort_keys=True):
            try:
                self.stack.client.patch("Pod", md["name"], {"metadata": {"annotations": {
                    ALLOCATED_DEVICES_ANNOTATION: json.dumps(devices, sort_keys=True)}}}, md["namespace"])
            except (api.ApiError, api.NotFound, api.Conflict) as e:
                log.warning("cannot annotate pod %s/%s with its devices: %s", md["namespace"], md["name"], e)

    def _fit(self, uid: str, pod: dict[str, Any], known: dict[str, tuple[int, int]]) -> None:
        """The kubelet's resource-fit admission for device resources (OutOf<resource>)."""
        spec = pod["spec"]
        need: dict[str, int] = {}
        for c in spec.get("containers") or []:
            for r, n in _resource_requests(c).items():
                need[r] = need.get(r, 0) + n
        for c in spec.get("initContainers") or []:
            for r, n in _resource_requests(c).items():
                need[r] = max(need.get(r, 0), n)
        held = self.manager.pod_devices()
        for resource, n in sorted(need.items()):
            if resource not in known or n <= 0:
                continue
            used = sum(len(ids) for other, cs in held.items() if other != uid
                       for rs in cs.values() for r, ids in rs.items() if r == resource)
            allocatable = known[resource][1]
            if used + n > allocatable:
                raise AdmissionError(
                    f"OutOf{resource}",
                    f"Node didn't have enough resource: {resource}, requested: {n}, used: {used}, "
                    f"capacity: {allocatable}")

    def prepare(self, pod: dict[str, Any], container: dict[str, Any]) -> DeviceGrant:
        """What the container gets: its Allocate responses merged (env, mounts, device nodes)."""
        uid = pod["metadata"]["uid"]
        allocs = [a for a in self.manager.allocations(uid) if a.container_name == container["name"]]
        if not allocs:
            # The container toolkit is on every GPU node: it injects nvidia-smi
            # and shows the GPUs the container's NVIDIA_VISIBLE_DEVICES names
            # (the operator's own pods set "all"); a container given no GPU
            # sees none.
            own = next((str(e.get("value", "")) for e in container.get("env") or []
                        if e.get("name") == VISIBLE_DEVICES_ENV and "value" in e), "none")
            return DeviceGrant(
                env={VISIBLE_DEVICES_ENV: own or "none", NVIDIA_SMI_STATE_ENV: str(self.container_state_path)},
                mounts=[Mount(str(self.nvidia_smi), NVIDIA_SMI_CONTAINER_PATH, True),
                        Mount(str(self.container_state_path), str(self.container_state_path), True)])
        env: dict[str, str] = {}
        visible: list[str] = []
        mounts: dict[str, Mount] = {}
        devices: dict[str, Mount] = {}
        for a in allocs:
            for k, v in a.envs.items():
                if k == VISIBLE_DEVICES_ENV:
                    visible += [x for x in v.split(",") if x]
                elif k not in env:
                    env[k] = v
            for m in a.mounts:
                mounts.setdefault(m.container_path, Mount(m.host_path, m.container_path, m.read_only))
            for d in a.devices:
                devices.setdefault(d.container_path, Mount(d.host_path, d.container_path, False))
        visible = list(dict.fromkeys(visible))
        env[VISIBLE_DEVICES_ENV] = ",".join(visible)
        # The program's channel back: a directory of its own, writable, where it reports how busy it keeps
        # its GPU (apply_load reads it; the program replaces the file, so the directory is what is mounted).
        activity = self._activity_dir(uid, container["name"])
        activity.mkdir(parents=True, exist_ok=True)
        activity.parent.chmod(0o755)
        activity.chmod(0o777)  # as an emptyDir: the container's user writes here
        env[llmserver.ACTIVITY_ENV] = str(activity / "busy")
        mounts.setdefault(str(activity), Mount(str(activity), str(activity), False))
        state_file = env.get(NVIDIA_SMI_STATE_ENV)
        if state_file:
            key = (uid, container["name"])
            gpus = tuple(sorted({self._gpu_index(u) for u in visible} - {None}))  # type: ignore[arg-type]
            with self.lock:
                fresh = self._state_files.get(key) != (Path(state_file), gpus)
                self._state_files[key] = (Path(state_file), gpus)
            if fresh:
                self.refresh()
        return DeviceGrant(env=env, mounts=list(mounts.values()), devices=list(devices.values()))

    def _activity_dir(self, uid: str, container: str) -> Path:
        return self.gpu_dir / "activity" / f"{uid}_{container}"

    def reported_utilization(self, owner: tuple[str, str]) -> int | None:
        """The percent a container's program says it keeps its GPU busy (``GPULAB_GPU_ACTIVITY``); None: no
        fresh report. The format is :mod:`gpulab.fakegpu.llmserver`'s: one integer, replaced every second."""
        path = self._activity_dir(*owner) / "busy"
        try:
            if time.time() - path.stat().st_mtime > ACTIVITY_STALE_SECONDS:
                return None
            return max(0, min(100, int(path.read_text().strip())))
        except (OSError, ValueError):
            return None

    def _gpu_index(self, uuid: str) -> int | None:
        for i in range(self.count):
            parent = models.gpu_uuid(self.name, i)
            if uuid == parent:
                return i
            if self.mig_layout is not None:
                for s in self.mig_layout.slices:
                    if uuid == models.mig_uuid(parent, s.gi_id, s.ci_id):
                        return i
        return None

    def _uses(self, uid: str, container: str) -> list[ledgermod.DeviceUse]:
        """What each device the container holds lets its CUDA program use."""
        uses: dict[str, ledgermod.DeviceUse] = {}
        ids = [i for a in self.manager.allocations(uid) if a.container_name == container for i in a.device_ids]
        for device_id in ids:
            d = self._advertised.get(device_id)
            if d is not None and d.mig is not None:
                use = ledgermod.DeviceUse(d.device_uuid, d.mig.memory_mib, d.memory_mib, d.gpu_uuid,
                                          compute_fraction=self.model.mig_share(d.mig.profile))
            elif d is not None:
                use = ledgermod.DeviceUse(d.gpu_uuid, self.model.memory_mib, d.memory_mib, d.gpu_uuid,
                                          compute_fraction=d.compute_share)
            else:
                uuid = strip_replica(device_id)
                use = ledgermod.DeviceUse(uuid, self.model.memory_mib, self.model.memory_mib, uuid)
            uses.setdefault(use.pool, use)
        return [ledgermod.DeviceUse(u.pool, u.pool_mib, u.limit_mib, u.gpu_uuid, i, u.compute_fraction)
                for i, u in enumerate(uses.values())]

    def observe(self, pod: dict[str, Any], container: dict[str, Any], running: bool) -> ContainerKill | None:
        """Track the container's CUDA program; the kill it suffers (its own or a neighbour's doing), if any."""
        uid = pod["metadata"]["uid"]
        owner = (uid, container["name"])
        victims: list[str] = []
        kills: dict[tuple[str, str], ledgermod.Kill] = {}
        with self.lock:
            if not running:
                self._pending.pop(owner, None)
                self._idle.pop(owner, None)
                if self._running.pop(owner, None) and self.ledger.stop(owner):
                    self.refresh()
                return None
            if owner not in self._running:
                kills = self._start_program(pod, container, owner)
                for other, kill in kills.items():
                    if other != owner:
                        self._pending[other] = kill
                        victims.append(other[0])
                if kills:
                    self.refresh()
            kill = kills[owner] if owner in kills else self._pending.pop(owner, None)
        for victim in dict.fromkeys(victims):  # outside the lock: their workers observe under it
            self.wake_pod(victim)
        if kill is None:
            return None
        return ContainerKill(kill.exit_code, list(kill.lines))

    def _start_program(self, pod: dict[str, Any], container: dict[str, Any],
                       owner: tuple[str, str]) -> dict[tuple[str, str], ledgermod.Kill]:
        try:
            demand = ledgermod.demand_of(pod, container["name"])
        except ledgermod.DemandError as e:
            self.stack.pod_event(pod, "Failed", f"Error: {e}; the container runs as if it used no GPU", "Warning")
            demand = None
        command = container.get("command") or []
        process = os.path.basename(command[0]) if command else "python3"
        if demand is None:
            self._running[owner] = False
            self._idle[owner] = process
            return {}
        uses = self._uses(owner[0], container["name"])
        self._running[owner] = bool(uses)
        if not uses:
            return {}
        visible = ",".join(dict.fromkeys(
            v for a in self.manager.allocations(owner[0]) if a.container_name == container["name"]
            for v in a.envs.get(VISIBLE_DEVICES_ENV, "").split(",") if v))
        err = cudaerrors.cuda_error(self.state(in_container=True), visible,
                                   cuda_runtime_of(container.get("image", "")))
        if err is not None:
            self._running[owner] = False
            return {owner: ledgermod.Kill(1, (f"CUDA error: {err.message} ({err.name} = {err.code})",))}
        kills = self.ledger.start(owner, uses, demand, process)
        if not kills:
            self.refresh()
        for other in kills:
            self._running[other] = False
        return kills

    def release(self, pod: dict[str, Any]) -> None:
        """The pod is done: its devices, memory and state files go."""
        uid = pod["metadata"]["uid"]
        self.manager.release(uid)
        with self.lock:
            self._pods.pop(uid, None)
            stopped = [o for o in list(self._running) if o[0] == uid]
            for o in stopped:
                self._running.pop(o, None)
                self._idle.pop(o, None)
                self._pending.pop(o, None)
                self.ledger.stop(o)
            for key in [k for k in self._state_files if k[0] == uid]:
                path, _ = self._state_files.pop(key)
                self._state_written.pop(path, None)
                path.unlink(missing_ok=True)
                with contextlib.suppress(OSError):  # its allocation's directory, mounted in the container
                    path.parent.rmdir()
            for activity in (self.gpu_dir / "activity").glob(f"{uid}_*"):
                shutil.rmtree(activity, ignore_errors=True)
        self.refresh()

    def has_programs(self) -> bool:
        with self.lock:
            return bool(self._running or self._idle)

    def apply_load(self, pods: dict[str, dict[str, Any]]) -> bool:
        """Set each GPU container's utilisation from what its program reports computing; True if any changed.

        ``pods`` are this node's pods as the API has them now (by UID). A
        container's own ``gpulab.io/gpu-utilization`` annotation wins; then what
        its program reports it computes (:meth:`reported_utilization`, a
        measurement: the traffic that reached it); a container that reports
        nothing computes nothing.
        """
        with self.lock:
            owners = list(self._running) + list(self._idle)
        wanted: dict[tuple[str, str], int] = {}
        for owner in owners:
            pod = pods.get(owner[0])
            if pod is None or ledgermod.declares_utilization(pod, owner[1]):
                continue
            reported = self.reported_utilization(owner)
            wanted[owner] = reported if reported is not None else 0
        changed = False
        with self.lock:
            for owner, util in wanted.items():
                if owner in self.ledger:
                    changed |= self.ledger.set_utilization(owner, util)
                elif owner in self._idle and util > 0:
                    uses = self._uses(*owner)
                    if uses:
                        self.ledger.start(owner, uses, ledgermod.Demand(0, util), self._idle.pop(owner))
                        self._running[owner] = True
                        changed = True
            if changed:
                self.refresh()
        return changed

    def holders(self) -> dict[str, list[tuple[str, str, str]]]:
        """Device UUID (GPU or MIG) -> ``(namespace, pod, container)`` of each container holding it."""
        out: dict[str, list[tuple[str, str, str]]] = {}
        with self.lock:
            pods = dict(self._pods)
        for uid in self.manager.pod_devices():
            ns, _, name = pods.get(uid, "/").partition("/")
            for a in self.manager.allocations(uid):
                for uuid in dict.fromkeys(strip_replica(i) for i in a.device_ids):
                    entry = (ns, name, a.container_name)
                    if entry not in out.setdefault(uuid, []):
                        out[uuid].append(entry)
        return out

    def mig_activity(self, mig_uuid: str) -> float:
        with self.lock:
            return self.ledger.pool_utilization(mig_uuid) / 100




def _pid(owner: tuple[str, str]) -> int:
    return 1000 + int(hashlib.sha256("/".join(owner).encode()).hexdigest()[:8], 16) % 3_000_000
