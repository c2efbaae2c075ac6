"""The fake NVIDIA device plugin.

One program serves every GPU resource of a node, each on its own unix socket
in the device-plugin directory (``nvidia-gpu.sock`` for ``nvidia.com/gpu``,
``nvidia-mig-1g.10gb.sock`` for ``nvidia.com/mig-1g.10gb`` ...), and registers
each with the kubelet on ``<dir>/kubelet.sock``, exactly as NVIDIA's
k8s-device-plugin does. It is data-driven: what it advertises comes from an
*inventory* (a JSON file it watches, or an object handed in), so it knows
nothing about GPU models, time-slicing or MIG layouts beyond what the
inventory says::

    {"resources": [{
        "name": "nvidia.com/gpu",
        "failRequestsGreaterThanOne": false,      # optional, default false
        "allocationPolicy": "packed",             # optional: packed | distributed
        "devices": [{
            "id": "GPU-8f2…::0",                  # the ID the kubelet sees
            "uuid": "GPU-8f2…",                   # optional, default: id before "::"
            "parent": "GPU-8f2…",                 # optional: physical GPU, default uuid
            "minor": 0,                           # optional: N of /dev/nvidiaN
            "numa": 0,                            # optional: NUMA node
            "health": "Healthy",                  # optional, default Healthy
            "info": {…}                           # optional, opaque: for nvidia-smi
        }]}]}

The same program runs against a real kubelet (kind backend) and against
gpulab's simulated kubelet (``kubelet.DeviceManager``); it uses nothing but
the v1beta1 API.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import stat
import threading
import uuid as uuidlib
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from . import (
    DEVICE_PLUGIN_PATH,
    HEALTHY,
    KUBELET_SOCKET_NAME,
    UNHEALTHY,
    VERSION,
    api_pb2,
    api_pb2_grpc,
    eventloop,
)

log = logging.getLogger(__name__)

MAX_DEVICE_ID_LENGTH = 63
REPLICA_SEPARATOR = "::"
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
NVIDIA_SMI_STATE_ENV = "GPULAB_NVIDIA_SMI_STATE"
#: The state file's name in its allocation's directory (``<state dir>/<allocation ID>/``).
STATE_FILE = "nvidia-smi.json"
NVIDIA_SMI_CONTAINER_PATH = "/usr/bin/nvidia-smi"
ANNOTATION_PREFIX = "gpulab.io/"
PACKED = "packed"
DISTRIBUTED = "distributed"
ALLOCATION_POLICIES = (PACKED, DISTRIBUTED)

_RPC_TIMEOUT_S = 5.0


# --------------------------------------------------------------------------
# Inventory
# --------------------------------------------------------------------------


class InventoryError(ValueError):
    """The inventory is malformed."""


@dataclass(frozen=True)
class InventoryDevice:
    """One device as the kubelet sees it, plus what the plugin needs to expose it."""

    id: str
    uuid: str
    parent: str
    health: str = HEALTHY
    numa: int | None = None
    minor: int | None = None
    info: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str) -> InventoryDevice:
        if not isinstance(raw, Mapping):
            raise InventoryError(f"{where}: a device must be an object, got {raw!r}")
        device_id = raw.get("id")
        if not isinstance(device_id, str) or not device_id:
            raise InventoryError(f"{where}: 'id' must be a non-empty string")
        if len(device_id) > MAX_DEVICE_ID_LENGTH:
            raise InventoryError(
                f"{where}: device ID {device_id!r} is longer than {MAX_DEVICE_ID_LENGTH} characters"
            )
        uuid = raw.get("uuid") or device_id.split(REPLICA_SEPARATOR, 1)[0]
        health = raw.get("health", HEALTHY)
        if health not in (HEALTHY, UNHEALTHY):
            raise InventoryError(f"{where}: 'health' must be {HEALTHY!r} or {UNHEALTHY!r}, got {health!r}")
        info = raw.get("info", {})
        if not isinstance(info, Mapping):
            raise InventoryError(f"{where}: 'info' must be an object")
        return cls(
            id=device_id,
            uuid=str(uuid),
            parent=str(raw.get("parent") or uuid),
            health=health,
            numa=_optional_int(raw, "numa", where),
            minor=_optional_int(raw, "minor", where),
            info=dict(info),
        )

    def to_api(self) -> api_pb2.Device:
        device = api_pb2.Device(ID=self.id, health=self.health)
        if self.numa is not None:
            device.topology.nodes.add(ID=self.numa)
        return device


@dataclass(frozen=True)
class InventoryResource:
    """One extended resource and its devices, served on one socket."""

    name: str
    devices: tuple[InventoryDevice, ...] = ()
    fail_requests_greater_than_one: bool = False
    allocation_policy: str = PACKED

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str) -> InventoryResource:
        if not isinstance(raw, Mapping):
            raise InventoryError(f"{where}: a resource must be an object")
        name = raw.get("name")
        if not isinstance(name, str) or "/" not in name:
            raise InventoryError(f"{where}: 'name' must be a resource name like 'nvidia.com/gpu', got {name!r}")
        devices_raw = raw.get("devices", [])
        if not isinstance(devices_raw, list):
            raise InventoryError(f"{where}: 'devices' must be a list")
        devices = tuple(
            InventoryDevice.from_dict(d, f"{where}.devices[{i}]") for i, d in enumerate(devices_raw)
        )
        duplicates = [i for i, n in Counter(d.id for d in devices).items() if n > 1]
        if duplicates:
            raise InventoryError(f"{where}: duplicate device IDs {duplicates}")
        policy = raw.get("allocationPolicy", PACKED)
        if policy not in ALLOCATION_POLICIES:
            raise InventoryError(f"{where}: 'allocationPolicy' must be one of {ALLOCATION_POLICIES}")
        fail = raw.get("failRequestsGreaterThanOne", False)
        if not isinstance(fail, bool):
            raise InventoryError(f"{where}: 'failRequestsGreaterThanOne' must be true or false")
        return cls(name=name, devices=devices, fail_requests_greater_than_one=fail, allocation_policy=policy)

    def device(self, device_id: str) -> InventoryDevice | None:
        return next((d for d in self.devices if d.id == device_id), None)

    def with_health(self, device_id: str, health: str) -> InventoryResource:
        if health not in (HEALTHY, UNHEALTHY):
            raise ValueError(f"health must be {HEALTHY!r} or {UNHEALTHY!r}, got {health!r}")
        if self.device(device_id) is None:
            raise KeyError(f"{self.name}: unknown device {device_id!r}")
        devices = tuple(
            dataclasses.replace(d, health=health) if d.id == device_id else d for d in self.devices
        )
        return dataclasses.replace(self, devices=devices)


@dataclass(frozen=True)
class Inventory:
    """Everything the plugin advertises, one entry per resource."""

    resources: tuple[InventoryResource, ...] = ()

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Inventory:
        if not isinstance(raw, Mapping) or not isinstance(raw.get("resources", []), list):
            raise InventoryError("inventory must be an object with a 'resources' list")
        resources = tuple(
            InventoryResource.from_dict(r, f"resources[{i}]") for i, r in enumerate(raw.get("resources", []))
        )
        names = [r.name for r in resources]
        sockets = [socket_name(n) for n in names]
        if len(set(names)) != len(names) or len(set(sockets)) != len(sockets):
            raise InventoryError(f"resource names must be unique and map to distinct sockets: {names}")
        return cls(resources=resources)

    @classmethod
    def load(cls, path: Path | str) -> Inventory:
        try:
            raw = json.loads(Path(path).read_text())
        except json.JSONDecodeError as err:
            raise InventoryError(f"{path}: not valid JSON: {err}") from err
        return cls.from_dict(raw)

    @classmethod
    def coerce(cls, value: Inventory | Mapping[str, Any]) -> Inventory:
        return value if isinstance(value, Inventory) else cls.from_dict(value)

    def get(self, name: str) -> InventoryResource | None:
        return next((r for r in self.resources if r.name == name), None)


def _optional_int(raw: Mapping[str, Any], key: str, where: str) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InventoryError(f"{where}: {key!r} must be a non-negative integer, got {value!r}")
    return value


def socket_name(resource_name: str) -> str:
    """The plugin's socket file name for a resource, as NVIDIA names it.

    ``nvidia.com/gpu`` → ``nvidia-gpu.sock``; ``nvidia.com/mig-1g.10gb`` →
    ``nvidia-mig-1g.10gb.sock``.
    """
    return f"nvidia-{resource_name.rpartition('/')[2]}.sock"


# --------------------------------------------------------------------------
# Allocation logic (pure functions)
# --------------------------------------------------------------------------


def preferred_allocation(
    resource: InventoryResource,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
) -> list[str]:
    """Pick ``size`` of the ``available`` IDs, keeping all of ``must_include``.

    ``packed`` (default) fills the physical GPU, then the NUMA node, that is
    already in use by the choice, preferring a GPU that can hold the whole
    rest of the request and, among those, the fullest (best fit).
    ``distributed`` spreads a request over distinct physical GPUs, emptiest
    first, as NVIDIA does by default for time-sliced replicas.
    """
    by_id = {d.id: d for d in resource.devices}
    order = {d.id: i for i, d in enumerate(resource.devices)}
    unknown = [i for i in list(available) + list(must_include) if i not in by_id]
    if unknown:
        raise ValueError(f"unknown devices: {', '.join(unknown)}")
    missing = [i for i in must_include if i not in available]
    if missing:
        raise ValueError(f"must-include devices are not available: {', '.join(missing)}")
    chosen = list(dict.fromkeys(must_include))
    if size < len(chosen):
        raise ValueError(f"allocation size {size} is smaller than the {len(chosen)} must-include devices")
    pool = sorted(set(available) - set(chosen), key=order.__getitem__)
    if size > len(chosen) + len(pool):
        raise ValueError(f"requested {size} devices but only {len(set(available))} are available")

    free_gpu = Counter(by_id[i].parent for i in pool)
    free_numa = Counter(by_id[i].numa for i in pool)
    while len(chosen) < size:
        need = size - len(chosen)
        gpus = {by_id[i].parent for i in chosen}
        numas = {by_id[i].numa for i in chosen}

        def rank(device_id: str) -> tuple:
            d = by_id[device_id]
            other_numa = bool(numas) and d.numa not in numas
            numa_too_small = free_numa[d.numa] < need
            if resource.allocation_policy == DISTRIBUTED:
                return (d.parent in gpus, other_numa, numa_too_small, -free_gpu[d.parent], order[device_id])
            return (
                d.parent not in gpus,
                other_numa,
                free_gpu[d.parent] < need,
                numa_too_small,
                free_gpu[d.parent],
                order[device_id],
            )

        pick = min(pool, key=rank)
        pool.remove(pick)
        chosen.append(pick)
        free_gpu[by_id[pick].parent] -= 1
        free_numa[by_id[pick].numa] -= 1
    return chosen


def validate_request(resource: InventoryResource, device_ids: Sequence[str]) -> str | None:
    """Why an Allocate request is invalid, in NVIDIA's words; None when valid."""
    if not device_ids:
        return "invalid request: no devices requested"
    for device_id in device_ids:
        device = resource.device(device_id)
        if device is None:
            return f"invalid request: unknown device: {device_id}"
        if device.health != HEALTHY:
            return f"invalid request: unhealthy device: {device_id}"
    replicas = any(REPLICA_SEPARATOR in i for i in device_ids)
    if resource.fail_requests_greater_than_one and replicas and len(device_ids) > 1:
        return f"invalid request: maximum request size for shared resources is 1; found {len(device_ids)}"
    return None


# --------------------------------------------------------------------------
# Plugin configuration and the per-resource server
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class PluginConfig:
    """Where the plugin lives and what it hands to containers."""

    plugin_dir: Path = Path(DEVICE_PLUGIN_PATH)
    # Host path of the fake nvidia-smi, mounted at /usr/bin/nvidia-smi.
    nvidia_smi: Path | None = None
    # Where per-allocation nvidia-smi state files go. The default sits under
    # the device-plugin dir because a plugin DaemonSet already mounts that
    # host path, and the kubelet only ever deletes sockets there.
    state_dir: Path | None = None
    # Host directory holding nvidia0…, nvidiactl, nvidia-uvm.
    dev_root: Path = Path("/dev")
    # Off on hosts whose dev_root holds plain files and whose runtime is real
    # (a container runtime refuses device specs that are not device nodes).
    pass_device_specs: bool = True
    poll_interval: float = 0.5
    # How often it looks once every server is serving and registered (None: every poll_interval). Where the
    # kubelet cannot restart without the plugin (both in one process, as on the embedded backend), a long one.
    settled_interval: float | None = None

    def __post_init__(self) -> None:
        for name in ("plugin_dir", "nvidia_smi", "state_dir", "dev_root"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, Path(value).absolute())

    @property
    def kubelet_socket(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET_NAME

    @property
    def state_path(self) -> Path:
        return self.state_dir or self.plugin_dir / "gpulab-nvidia-smi"


class _DeviceState:
    """The current device list of one resource; tells its listeners (the ListAndWatch streams) of changes."""

    def __init__(self, resource: InventoryResource) -> None:
        self._lock = threading.Lock()
        self._resource = resource
        self._generation = 0
        self._closed = False
        self._listeners: list[Callable[[], None]] = []

    @property
    def resource(self) -> InventoryResource:
        with self._lock:
            return self._resource

    def replace(self, resource: InventoryResource) -> bool:
        """Swap in a new version; True when the kubelet's view changed."""
        with self._lock:
            changed = _api_view(resource) != _api_view(self._resource)
            self._resource = resource
            if changed:
                self._generation += 1
            listeners = list(self._listeners) if changed else []
        for listener in listeners:
            listener()
        return changed

    def snapshot(self) -> tuple[int, list[api_pb2.Device]]:
        with self._lock:
            return self._generation, [d.to_api() for d in self._resource.devices]

    def listen(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` (from any thread) on each change and on close; returns the function that stops it."""
        with self._lock:
            self._listeners.append(listener)

        def stop() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return stop

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._closed

    def close(self) -> None:
        with self._lock:
            self._closed = True
            listeners = list(self._listeners)
        for listener in listeners:
            listener()


def _api_view(resource: InventoryResource) -> list[tuple]:
    return [(d.id, d.health, d.numa) for d in resource.devices]


class _DevicePluginService(api_pb2_grpc.DevicePluginServicer):
    """The DevicePlugin gRPC service for one resource."""

    def __init__(self, state: _DeviceState, config: PluginConfig) -> None:
        self._state = state
        self._config = config

    async def GetDevicePluginOptions(self, request, context):
        return api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)

    async def ListAndWatch(self, request, context) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        # The whole list first, then again on every change, until the server stops (a cancelled
        # stream ends at the wait).
        changed = asyncio.Event()
        unlisten = self._state.listen(eventloop.waker(changed))
        try:
            sent = None
            while not self._state.closed:
                changed.clear()
                generation, devices = self._state.snapshot()
                if generation != sent:
                    sent = generation
                    yield api_pb2.ListAndWatchResponse(devices=devices)
                    continue
                await changed.wait()
        finally:
            unlisten()

    async def GetPreferredAllocation(self, request, context):
        resource = self._state.resource
        response = api_pb2.PreferredAllocationResponse()
        for req in request.container_requests:
            try:
                ids = preferred_allocation(
                    resource, list(req.available_deviceIDs), list(req.must_include_deviceIDs), req.allocation_size
                )
            except ValueError as err:
                await context.abort(
                    grpc.StatusCode.UNKNOWN, f"error getting list of preferred allocation devices: {err}"
                )
            response.container_responses.add(deviceIDs=ids)
        return response

    async def Allocate(self, request, context):
        resource = self._state.resource
        response = api_pb2.AllocateResponse()
        for req in request.container_requests:
            ids = list(req.devices_ids)
            problem = validate_request(resource, ids)
            if problem:
                # NVIDIA returns a plain Go error, which gRPC sends as Unknown;
                # the kubelet then shows "rpc error: code = Unknown desc = …".
                log.warning("Allocate rejected for '%s': %s", resource.name, problem)
                await context.abort(
                    grpc.StatusCode.UNKNOWN, f"invalid allocation request for {json.dumps(resource.name)}: {problem}"
                )
            try:
                response.container_responses.append(self._container_response(resource, ids))
            except OSError as err:
                await context.abort(grpc.StatusCode.UNKNOWN, f"failed to get allocate response: {err}")
        return response

    async def PreStartContainer(self, request, context):
        return api_pb2.PreStartContainerResponse()

    def _container_response(
        self, resource: InventoryResource, ids: list[str]
    ) -> api_pb2.ContainerAllocateResponse:
        devices = [resource.device(i) for i in ids]
        # Time-slice replicas "<uuid>::<n>" of one GPU expose that GPU once.
        physical = list({d.uuid: d for d in devices}.values())
        visible = ",".join(d.uuid for d in physical)
        allocation_id = str(uuidlib.uuid4())
        state_file = self._write_smi_state(allocation_id, resource.name, ids, physical)

        response = api_pb2.ContainerAllocateResponse()
        response.envs[VISIBLE_DEVICES_ENV] = visible
        response.envs[NVIDIA_SMI_STATE_ENV] = str(state_file)
        if self._config.nvidia_smi is not None:
            response.mounts.add(
                container_path=NVIDIA_SMI_CONTAINER_PATH, host_path=str(self._config.nvidia_smi), read_only=True
            )
        # Same path inside and out, so the env var also holds for commands that
        # simulated nodes run on the host itself. The allocation's directory is
        # mounted, not the file: the node rewrites the file by renaming a new
        # one over it, which a process that runs for long sees only this way.
        response.mounts.add(container_path=str(state_file.parent), host_path=str(state_file.parent), read_only=True)
        if self._config.pass_device_specs:
            for path in _device_paths(resource, physical):
                response.devices.add(
                    container_path=f"/dev/{path}", host_path=str(self._config.dev_root / path), permissions="rw"
                )
        response.annotations[ANNOTATION_PREFIX + "allocation-id"] = allocation_id
        response.annotations[ANNOTATION_PREFIX + "device-ids"] = ",".join(ids)
        log.info("Allocated %s for '%s': %s=%s", ",".join(ids), resource.name, VISIBLE_DEVICES_ENV, visible)
        return response

    def _write_smi_state(
        self, allocation_id: str, resource_name: str, ids: list[str], physical: list[InventoryDevice]
    ) -> Path:
        """Describe the allocated devices for the fake nvidia-smi (atomic write)."""
        directory = self._config.state_path / allocation_id
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / STATE_FILE
        document = {
            "allocationID": allocation_id,
            "resource": resource_name,
            "deviceIDs": ids,
            "visibleDevices": [d.uuid for d in physical],
            "devices": [dict(d.info) for d in physical],
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(document, indent=2, sort_keys=True))
        tmp.chmod(0o644)
        os.replace(tmp, path)
        return path


def _device_paths(resource: InventoryResource, physical: Iterable[InventoryDevice]) -> list[str]:
    """Device node names (under /dev) for the physical GPUs behind ``physical``."""
    # Without an explicit minor, number physical GPUs in inventory order.
    derived: dict[str, int] = {}
    for d in resource.devices:
        derived.setdefault(d.parent, len(derived))
    minors = dict.fromkeys(d.minor if d.minor is not None else derived[d.parent] for d in physical)
    return [f"nvidia{m}" for m in minors] + ["nvidiactl", "nvidia-uvm"]


class ResourceServer:
    """Serves the DevicePlugin service of one resource on its own socket."""

    def __init__(self, resource: InventoryResource, config: PluginConfig) -> None:
        self.name = resource.name
        self.socket_path = config.plugin_dir / socket_name(resource.name)
        self._config = config
        self._state = _DeviceState(resource)
        self._server: grpc.aio.Server | None = None
        self._socket_identity: tuple[int, int] | None = None
        # Identity of the kubelet socket we last registered on; None = not registered.
        self.registered_with: tuple[int, int] | None = None
        self._last_register_error: str | None = None

    @property
    def resource(self) -> InventoryResource:
        return self._state.resource

    def start(self) -> None:
        """Bind the socket and serve (on the process's gRPC loop); returns once the server answers."""
        self._config.plugin_dir.mkdir(parents=True, exist_ok=True)
        _remove_stale(self.socket_path)
        self._state = _DeviceState(self._state.resource)
        try:
            self._server = eventloop.run(self._serve())
        except Exception:
            self._state.close()
            raise
        self.registered_with = None
        log.info("Starting to serve '%s' on %s", self.name, self.socket_path)

    async def _serve(self) -> grpc.aio.Server:
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(_DevicePluginService(self._state, self._config), server)
        try:
            server.add_insecure_port(f"unix:{self.socket_path}")
            await server.start()
            self._socket_identity = _file_identity(self.socket_path)
            # The kubelet dials us as soon as we register: make sure we answer.
            async with grpc.aio.insecure_channel(f"unix:{self.socket_path}") as channel:
                await api_pb2_grpc.DevicePluginStub(channel).GetDevicePluginOptions(
                    api_pb2.Empty(), timeout=_RPC_TIMEOUT_S, wait_for_ready=True
                )
        except BaseException:
            await server.stop(None)
            raise
        return server

    def stop(self) -> None:
        if self._server is None:
            return
        log.info("Stopping to serve '%s' on %s", self.name, self.socket_path)
        self._state.close()
        eventloop.run(self._server.stop(grace=0.2))
        self._server = None
        if _file_identity(self.socket_path) == self._socket_identity:
            self.socket_path.unlink(missing_ok=True)
        self.registered_with = None

    @property
    def serving(self) -> bool:
        return self._server is not None

    def socket_lost(self) -> bool:
        """True when our socket file was deleted or replaced (a kubelet restart does that)."""
        return self.serving and _file_identity(self.socket_path) != self._socket_identity

    def update(self, resource: InventoryResource) -> None:
        if self._state.replace(resource):
            log.info("Device list of '%s' changed; updating ListAndWatch streams", self.name)

    def register(self, kubelet_socket: Path) -> bool:
        """Register with the kubelet; True on success. Failures are logged once."""
        identity = _file_identity(kubelet_socket)
        request = api_pb2.RegisterRequest(
            version=VERSION,
            endpoint=self.socket_path.name,
            resource_name=self.name,
            options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=True),
        )
        try:
            eventloop.run(_register(kubelet_socket, request))
        except grpc.RpcError as err:
            message = f"{err.code().name}: {err.details()}"
            if message != self._last_register_error:
                log.error("Could not register device plugin for '%s': %s; will retry", self.name, message)
            self._last_register_error = message
            return False
        self._last_register_error = None
        self.registered_with = identity
        log.info("Registered device plugin for '%s' with Kubelet", self.name)
        return True


async def _register(kubelet_socket: Path, request: api_pb2.RegisterRequest) -> None:
    async with grpc.aio.insecure_channel(f"unix:{kubelet_socket}") as channel:
        await api_pb2_grpc.RegistrationStub(channel).Register(request, timeout=_RPC_TIMEOUT_S)


def _file_identity(path: Path) -> tuple[int, int] | None:
    """(inode, ctime) of a file, so a deleted-and-recreated socket is noticed."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_ctime_ns


def _remove_stale(path: Path) -> None:
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            path.unlink()
    except FileNotFoundError:
        pass


# --------------------------------------------------------------------------
# The plugin program
# --------------------------------------------------------------------------


class DevicePlugin:
    """All resources of one node: servers, registration, inventory watching.

    A task on the process's event loop (:mod:`.eventloop`), every ``config.poll_interval`` seconds
    (``config.settled_interval`` once every server is serving and registered), reloads the
    inventory file when it changed, restarts servers whose socket the kubelet
    deleted, and (re-)registers servers with a kubelet socket that is new to
    them, which is how a kubelet restart is survived. Its ticks run on the loop's waiting threads
    (:func:`.eventloop.offload_waiting`), shared by every plugin of the process: a fleet's thousand plugins
    are not a thousand threads waiting.
    """

    def __init__(
        self,
        config: PluginConfig,
        inventory: Inventory | Mapping[str, Any] | None = None,
        inventory_path: Path | str | None = None,
    ) -> None:
        self.config = config
        self._inventory = Inventory.coerce(inventory) if inventory is not None else Inventory()
        self._inventory_path = Path(inventory_path) if inventory_path is not None else None
        self._inventory_identity: tuple[int, int, int] | None = None
        self._last_inventory_error: str | None = None
        self._servers: dict[str, ResourceServer] = {}
        self._start_errors: dict[str, str] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._watch: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        """Start serving and registering; raises InventoryError for a bad inventory file."""
        with self._lock:
            if self._watch is not None:
                raise RuntimeError("device plugin already started")
            if self._inventory_path is not None and self._inventory_path.exists():
                self._inventory_identity = _inventory_identity(self._inventory_path)
                self._inventory = Inventory.load(self._inventory_path)
            elif self._inventory_path is not None:
                log.warning("Inventory %s does not exist yet; waiting for it", self._inventory_path)
            if self.config.nvidia_smi is not None and not self.config.nvidia_smi.exists():
                log.warning("nvidia-smi %s does not exist; containers cannot mount it", self.config.nvidia_smi)
            self._stop.clear()
            self._apply(self._inventory)
            self._watch = eventloop.spawn(self._watch_loop())

    def stop(self) -> None:
        """Stop every server and remove their sockets."""
        self._stop.set()
        if self._watch is not None:
            eventloop.cancel(self._watch, timeout=5)
            self._watch = None
        with self._lock:  # a tick under way finishes first; one after it sees _stop
            for server in self._servers.values():
                server.stop()
            self._servers.clear()

    def restart(self) -> None:
        """Restart every server and re-register (what NVIDIA's plugin does on SIGHUP)."""
        with self._lock:
            if self._inventory_path is not None:
                self._inventory_identity = None  # force a reload on the next tick
            for server in self._servers.values():
                server.stop()
                self._ensure_serving(server)
            self._register_all()

    def __enter__(self) -> DevicePlugin:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- inventory and health ---------------------------------------------

    @property
    def inventory(self) -> Inventory:
        with self._lock:
            return self._inventory

    def update_inventory(self, inventory: Inventory | Mapping[str, Any]) -> None:
        """Replace the inventory: streams updates, starts and stops sockets."""
        inventory = Inventory.coerce(inventory)
        with self._lock:
            self._inventory = inventory
            if self._watch is not None:
                self._apply(inventory)

    def set_health(self, resource: str, device_id: str, health: str) -> None:
        """Mark one device Healthy/Unhealthy (until the inventory file next changes)."""
        with self._lock:
            current = self._inventory.get(resource)
            if current is None:
                raise KeyError(f"unknown resource {resource!r}")
            updated = current.with_health(device_id, health)
            resources = tuple(updated if r.name == resource else r for r in self._inventory.resources)
            self.update_inventory(Inventory(resources))
        log.info("'%s' device marked %s: %s", resource, health.lower(), device_id)

    # -- introspection ---------------------------------------------------

    @property
    def resources(self) -> list[str]:
        with self._lock:
            return list(self._servers)

    def socket_path(self, resource: str) -> Path:
        return self.config.plugin_dir / socket_name(resource)

    def is_registered(self, resource: str) -> bool:
        with self._lock:
            server = self._servers.get(resource)
            return server is not None and server.registered_with is not None

    # -- internals ---------------------------------------------------------

    def _apply(self, inventory: Inventory) -> None:
        wanted = {r.name: r for r in inventory.resources}
        for name in [n for n in self._servers if n not in wanted]:
            self._servers.pop(name).stop()
        for name, resource in wanted.items():
            server = self._servers.get(name)
            if server is None:
                server = self._servers[name] = ResourceServer(resource, self.config)
                self._ensure_serving(server)
            else:
                server.update(resource)
        self._register_all()

    def _ensure_serving(self, server: ResourceServer) -> None:
        """(Re)start a server that is down or whose socket vanished; failures retry next tick."""
        if server.serving and not server.socket_lost():
            return
        if server.serving:
            log.info("Socket %s was removed (kubelet restart?); restarting", server.socket_path)
            server.stop()
        try:
            server.start()
        except (OSError, RuntimeError, grpc.RpcError) as err:
            message = str(err) if not isinstance(err, grpc.RpcError) else f"{err.code().name}: {err.details()}"
            if self._start_errors.get(server.name) != message:
                log.error("Could not start device plugin for '%s': %s; will retry", server.name, message)
            self._start_errors[server.name] = message
        else:
            self._start_errors.pop(server.name, None)

    def _register_all(self) -> None:
        kubelet = _file_identity(self.config.kubelet_socket)
        if kubelet is None:
            return
        for server in self._servers.values():
            if server.serving and server.registered_with != kubelet:
                server.register(self.config.kubelet_socket)

    async def _watch_loop(self) -> None:
        wait = self.config.poll_interval
        while True:
            await asyncio.sleep(wait)
            try:
                settled = await eventloop.offload_waiting(self._tick)
            except Exception:  # keep watching: one bad tick must not kill the plugin
                log.exception("Device plugin watch loop failed; continuing")
                settled = False
            wait = (self.config.settled_interval if settled and self.config.settled_interval is not None
                    else self.config.poll_interval)

    def _tick(self) -> bool:
        """One look (see the class): True when every server is serving and registered."""
        with self._lock:
            if self._stop.is_set():
                return False
            self._poll_inventory()
            for server in self._servers.values():
                self._ensure_serving(server)
            self._register_all()
            return all(s.serving and s.registered_with is not None for s in self._servers.values())

    def _poll_inventory(self) -> None:
        if self._inventory_path is None:
            return
        identity = _inventory_identity(self._inventory_path)
        if identity is None or identity == self._inventory_identity:
            return
        try:
            inventory = Inventory.load(self._inventory_path)
        except (OSError, InventoryError) as err:
            # Possibly caught mid-write: retry next tick, log once.
            if str(err) != self._last_inventory_error:
                log.error("Ignoring inventory %s: %s", self._inventory_path, err)
            self._last_inventory_error = str(err)
            return
        self._last_inventory_error = None
        self._inventory_identity = identity
        log.info("Inventory %s changed; applying", self._inventory_path)
        self._inventory = inventory
        self._apply(inventory)


def _inventory_identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size
