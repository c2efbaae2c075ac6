"""The kubelet's device-manager side, for simulated nodes.

On a real node the kubelet serves ``Registration`` on
``/var/lib/kubelet/device-plugins/kubelet.sock``, consumes each plugin's
``ListAndWatch``, advertises capacity/allocatable and calls ``Allocate`` when
it admits a pod. Simulated (KWOK) nodes have no kubelet, so ``DeviceManager``
plays that part for one node, over the same gRPC API, with the kubelet's
rules and error messages:

- capacity counts every advertised device, allocatable only the healthy ones
  (an unhealthy device lowers allocatable, not capacity);
- when a plugin's stream ends, all its devices count as unhealthy: allocatable
  drops to 0 and capacity is kept for ``stop_grace_period`` (the kubelet's
  ``endpointStopGracePeriod``, 5 minutes), after which the resource is
  reported as (0, 0) — the kubelet then writes capacity 0 rather than
  dropping the resource from the Node;
- on start it deletes stale sockets in its directory (plugins watch for this
  and re-register) and restores pod assignments from
  ``kubelet_internal_checkpoint``; resources known from the checkpoint read
  (0, 0) until their plugin registers again.

Deviation, documented: the proto allows rejecting a resource name already
held by another active plugin and gpulab does (modern kubelets accept it);
re-registering from the *same* endpoint replaces the old connection.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
import stat
import threading
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from . import (
    DEVICE_PLUGIN_PATH,
    HEALTHY,
    KUBELET_SOCKET_NAME,
    SUPPORTED_VERSIONS,
    UNHEALTHY,
    api_pb2,
    api_pb2_grpc,
    eventloop,
)

log = logging.getLogger(__name__)

CHECKPOINT_NAME = "kubelet_internal_checkpoint"
ENDPOINT_STOP_GRACE_PERIOD_S = 300.0
PRE_START_CONTAINER_TIMEOUT_S = 30.0
# The kubelet's topology-less NUMA key in checkpoints.
NODE_WITHOUT_TOPOLOGY = -1
_DIAL_TIMEOUT_S = 10.0
_RPC_TIMEOUT_S = 10.0

ResourceCounts = dict[str, tuple[int, int]]

# --------------------------------------------------------------------------
# Results and errors
# --------------------------------------------------------------------------


class AllocationError(RuntimeError):
    """The kubelet could not admit the container; str() is the kubelet's error.

    ``message`` is what a real kubelet puts in the pod's status with reason
    ``UnexpectedAdmissionError``.
    """

    reason = "UnexpectedAdmissionError"

    @property
    def message(self) -> str:
        return f"Allocate failed due to {self}, which is unexpected"


@dataclass(frozen=True)
class ContainerMount:
    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True)
class ContainerDevice:
    container_path: str
    host_path: str
    permissions: str


@dataclass(frozen=True)
class Allocation:
    """What one container gets for one resource."""

    pod_uid: str
    container_name: str
    resource: str
    device_ids: tuple[str, ...]
    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[ContainerMount, ...] = ()
    devices: tuple[ContainerDevice, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()

    @classmethod
    def from_response(
        cls, pod_uid: str, container_name: str, resource: str, device_ids: tuple[str, ...],
        response: api_pb2.ContainerAllocateResponse,
    ) -> Allocation:
        return cls(
            pod_uid=pod_uid,
            container_name=container_name,
            resource=resource,
            device_ids=device_ids,
            envs=dict(response.envs),
            mounts=tuple(ContainerMount(m.container_path, m.host_path, m.read_only) for m in response.mounts),
            devices=tuple(ContainerDevice(d.container_path, d.host_path, d.permissions) for d in response.devices),
            annotations=dict(response.annotations),
            cdi_devices=tuple(c.name for c in response.cdi_devices),
        )


def _go_error(err: grpc.RpcError) -> str:
    """Format a gRPC error as Go's grpc status does, as kubelet events show it."""
    code = err.code()
    name = "Canceled" if code == grpc.StatusCode.CANCELLED else "".join(
        part.capitalize() for part in code.name.split("_")
    )
    return f"rpc error: code = {name} desc = {err.details()}"


# --------------------------------------------------------------------------
# Checkpoint
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class _PodDevicesEntry:
    pod_uid: str
    container_name: str
    resource: str
    # NUMA node (NODE_WITHOUT_TOPOLOGY when unknown) -> device IDs
    device_ids: dict[int, tuple[str, ...]]
    response: api_pb2.ContainerAllocateResponse

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(i for ids in self.device_ids.values() for i in ids)

    def allocation(self) -> Allocation:
        return Allocation.from_response(self.pod_uid, self.container_name, self.resource, self.ids, self.response)


class _Checkpoint:
    """``kubelet_internal_checkpoint``, in the kubelet's JSON layout.

    ``{"Data": {"PodDeviceEntries": [{"PodUID", "ContainerName", "ResourceName",
    "DeviceIDs": {"<numa>": [ids]}, "AllocResp": <base64 ContainerAllocateResponse>}],
    "RegisteredDevices": {resource: [ids]}}, "Checksum": <crc32>}``. The kubelet's
    checksum is FNV-32a over a Go dump of Data; gpulab uses CRC-32 over canonical
    JSON, so the files are alike in shape but not interchangeable.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def save(self, entries: list[_PodDevicesEntry], registered: Mapping[str, list[str]]) -> None:
        data = {
            "PodDeviceEntries": [
                {
                    "PodUID": e.pod_uid,
                    "ContainerName": e.container_name,
                    "ResourceName": e.resource,
                    "DeviceIDs": {str(numa): list(ids) for numa, ids in e.device_ids.items()},
                    "AllocResp": base64.b64encode(e.response.SerializeToString()).decode(),
                }
                for e in entries
            ],
            "RegisteredDevices": {name: list(ids) for name, ids in registered.items()},
        }
        blob = json.dumps({"Data": data, "Checksum": _checksum(data)}, indent=1)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(blob)
        os.replace(tmp, self.path)

    def load(self) -> tuple[list[_PodDevicesEntry], dict[str, list[str]]]:
        """Entries and registered devices; empty when missing or corrupt (logged)."""
        try:
            document = json.loads(self.path.read_text())
            data = document["Data"]
            if document["Checksum"] != _checksum(data):
                raise ValueError("checkpoint is corrupted")
            entries = [self._entry(raw) for raw in data.get("PodDeviceEntries") or []]
            registered = {k: list(v) for k, v in (data.get("RegisteredDevices") or {}).items()}
        except FileNotFoundError:
            return [], {}
        except (ValueError, KeyError, TypeError) as err:
            log.warning("Continuing after failing to read checkpoint %s: %s", self.path, err)
            return [], {}
        return entries, registered

    @staticmethod
    def _entry(raw: Mapping) -> _PodDevicesEntry:
        response = api_pb2.ContainerAllocateResponse.FromString(base64.b64decode(raw["AllocResp"]))
        per_numa = {int(numa): tuple(ids) for numa, ids in raw["DeviceIDs"].items()}
        return _PodDevicesEntry(raw["PodUID"], raw["ContainerName"], raw["ResourceName"], per_numa, response)


def _checksum(data: object) -> int:
    return zlib.crc32(json.dumps(data, sort_keys=True, separators=(",", ":")).encode())


# --------------------------------------------------------------------------
# One connected plugin
# --------------------------------------------------------------------------


class _Endpoint:
    """A registered plugin: its channel, options and ListAndWatch consumer (all on the process's gRPC loop)."""

    def __init__(self, resource: str, socket_path: Path) -> None:
        self.resource = resource
        self.socket_path = socket_path
        self.options = api_pb2.DevicePluginOptions()
        self._channel: grpc.aio.Channel | None = None
        self._stub: api_pb2_grpc.DevicePluginStub | None = None
        self._consumer: asyncio.Task | None = None
        self._ended = threading.Event()
        self._stopping = False

    def connect(self) -> None:
        """Dial the plugin and read its options (the kubelet does this before anything else)."""
        try:
            self.options = eventloop.run(self._connect())
        except grpc.RpcError as err:
            raise ConnectionError(f"failed to dial device plugin: {_go_error(err)}") from None

    async def _connect(self) -> api_pb2.DevicePluginOptions:
        self._channel = grpc.aio.insecure_channel(f"unix:{self.socket_path}")
        self._stub = api_pb2_grpc.DevicePluginStub(self._channel)
        try:
            return await self._stub.GetDevicePluginOptions(
                api_pb2.Empty(), timeout=_DIAL_TIMEOUT_S, wait_for_ready=True
            )
        except BaseException:
            await self._channel.close()
            raise

    def watch(
        self,
        on_devices: Callable[[_Endpoint, list[api_pb2.Device]], None],
        on_end: Callable[[_Endpoint], None],
    ) -> None:
        """Consume ListAndWatch; the callbacks run off the loop, one at a time, in the stream's order."""
        self._consumer = eventloop.spawn(self._consume(on_devices, on_end))

    async def _consume(self, on_devices, on_end) -> None:
        try:
            async for response in self._stub.ListAndWatch(api_pb2.Empty()):
                await eventloop.offload(on_devices, self, list(response.devices))
            reason = "stream closed by the plugin"
        except grpc.RpcError as err:
            reason = _go_error(err)
        except asyncio.CancelledError:
            reason = "cancelled"
        except Exception as err:  # a bug on our side: log it, treat the plugin as gone
            log.exception("ListAndWatch consumer for %s failed", self.resource)
            reason = repr(err)
        finally:
            self._ended.set()
        if not self._stopping:
            log.info("ListAndWatch ended unexpectedly for device plugin %s: %s", self.resource, reason)
            await eventloop.offload(on_end, self)

    @property
    def active(self) -> bool:
        return self._consumer is not None and not self._ended.is_set()

    def get_preferred_allocation(self, available: list[str], size: int) -> list[str]:
        request = api_pb2.PreferredAllocationRequest()
        request.container_requests.add(available_deviceIDs=available, allocation_size=size)
        response = eventloop.run(eventloop.call(self._stub.GetPreferredAllocation, request, timeout=_RPC_TIMEOUT_S))
        return list(response.container_responses[0].deviceIDs) if response.container_responses else []

    def allocate(self, device_ids: list[str]) -> api_pb2.ContainerAllocateResponse:
        request = api_pb2.AllocateRequest()
        request.container_requests.add(devices_ids=device_ids)
        response = eventloop.run(eventloop.call(self._stub.Allocate, request, timeout=_RPC_TIMEOUT_S))
        if not response.container_responses:
            raise AllocationError(f"no containers return in allocation response {response}")
        return response.container_responses[0]

    def pre_start(self, device_ids: list[str]) -> None:
        request = api_pb2.PreStartContainerRequest(devices_ids=device_ids)
        eventloop.run(eventloop.call(self._stub.PreStartContainer, request, timeout=PRE_START_CONTAINER_TIMEOUT_S))

    def stop(self) -> None:
        self._stopping = True
        if self._consumer is not None:
            eventloop.cancel(self._consumer, timeout=5)
            self._ended.set()
        if self._channel is not None:
            eventloop.run(self._channel.close())


@dataclass
class _ResourceState:
    """What the manager knows about one resource."""

    endpoint: _Endpoint | None = None
    devices: dict[str, api_pb2.Device] = field(default_factory=dict)
    # False once the stop grace period expired: the resource reads (0, 0).
    registered: bool = True
    grace_timer: threading.Timer | None = None
    # Known from the checkpoint, its plugin not back yet since the manager (re)started.
    restored: bool = False

    def counts(self) -> tuple[int, int]:
        healthy = sum(1 for d in self.devices.values() if d.health == HEALTHY)
        return len(self.devices), healthy

    def cancel_timer(self) -> None:
        if self.grace_timer is not None:
            self.grace_timer.cancel()
            self.grace_timer = None


# --------------------------------------------------------------------------
# The device manager
# --------------------------------------------------------------------------

_EXTENDED_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def is_extended_resource_name(name: str) -> bool:
    """Roughly Kubernetes' IsExtendedResourceName: ``domain/name``, outside kubernetes.io."""
    if not _EXTENDED_NAME.match(name) or name.startswith("requests."):
        return False
    domain = name.split("/", 1)[0]
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


class _RegistrationService(api_pb2_grpc.RegistrationServicer):
    def __init__(self, manager: DeviceManager) -> None:
        self._manager = manager

    async def Register(self, request, context):
        try:
            # Registering dials the plugin (on this loop) and takes the manager's locks: off the loop.
            await eventloop.offload(self._manager.register, request)
        except RegistrationRejected as err:
            # The kubelet returns plain Go errors: gRPC code Unknown.
            await context.abort(grpc.StatusCode.UNKNOWN, str(err))
        return api_pb2.Empty()


class RegistrationRejected(Exception):
    """A Register request the kubelet turns down; str() is the kubelet's error."""


class DeviceManager:
    """The kubelet's device manager for one simulated node, rooted at ``plugin_dir``.

    ``on_change`` receives ``{resource: (capacity, allocatable)}`` for every
    resource ever seen, whenever any count changes; it runs on an internal
    thread and must not block for long.
    """

    def __init__(
        self,
        plugin_dir: Path | str = DEVICE_PLUGIN_PATH,
        on_change: Callable[[ResourceCounts], None] | None = None,
        stop_grace_period: float = ENDPOINT_STOP_GRACE_PERIOD_S,
    ) -> None:
        self.plugin_dir = Path(plugin_dir).absolute()
        self.socket_path = self.plugin_dir / KUBELET_SOCKET_NAME
        self.stop_grace_period = stop_grace_period
        self._on_change = on_change
        self._checkpoint = _Checkpoint(self.plugin_dir / CHECKPOINT_NAME)
        self._resources: dict[str, _ResourceState] = {}
        self._entries: list[_PodDevicesEntry] = []
        self._lock = threading.RLock()  # guards _resources and _entries
        self._alloc_lock = threading.Lock()  # serialises allocate/release
        self._notify_lock = threading.Lock()  # keeps callbacks in order
        self._save_lock = threading.Lock()  # one checkpoint writer at a time
        self._last_counts: ResourceCounts = {}
        self._server: grpc.aio.Server | None = None

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        """Restore the checkpoint, delete stale sockets, serve Registration."""
        if self._server is not None:
            raise RuntimeError("device manager already started")
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        entries, registered = self._checkpoint.load()
        with self._lock:
            self._entries = entries
            self._resources = {}
            for name, ids in registered.items():
                # As the kubelet reads its checkpoint: the devices are known but
                # unhealthy (capacity N, allocatable 0) until the plugin registers
                # again; if it never does, the resource goes after the grace period.
                state = _ResourceState(devices={i: api_pb2.Device(ID=i, health=UNHEALTHY) for i in ids},
                                       restored=True)
                state.grace_timer = threading.Timer(self.stop_grace_period, self._expire_restored,
                                                    args=(name, state))
                state.grace_timer.daemon = True
                state.grace_timer.start()
                self._resources[name] = state
        self._remove_stale_sockets()
        self._server = eventloop.run(self._serve())
        log.info("Serving device plugin registration server on %s", self.socket_path)
        self._notify()

    async def _serve(self) -> grpc.aio.Server:
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(_RegistrationService(self), server)
        server.add_insecure_port(f"unix:{self.socket_path}")
        await server.start()
        return server

    def _remove_stale_sockets(self) -> None:
        # Plugins notice their socket vanishing and re-register with us.
        for entry in self.plugin_dir.iterdir():
            try:
                if stat.S_ISSOCK(entry.lstat().st_mode):
                    entry.unlink()
            except FileNotFoundError:
                pass

    def stop(self) -> None:
        """Stop serving and drop every plugin connection (assignments stay checkpointed)."""
        if self._server is not None:
            eventloop.run(self._server.stop(None))
            self._server = None
        with self._lock:
            endpoints = [s.endpoint for s in self._resources.values() if s.endpoint is not None]
            for state in self._resources.values():
                state.cancel_timer()
        for endpoint in endpoints:
            endpoint.stop()

    def __enter__(self) -> DeviceManager:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- registration (called by the gRPC service) ------------------------

    def register(self, request: api_pb2.RegisterRequest) -> None:
        """Validate and connect a plugin; raises RegistrationRejected."""
        name = request.resource_name
        log.info("Got registration request from device plugin with resource %s", name)
        if request.version not in SUPPORTED_VERSIONS:
            raise RegistrationRejected(
                f"requested API version {json.dumps(request.version)} is not supported by kubelet. "
                f"Supported version is {json.dumps(list(SUPPORTED_VERSIONS))}"
            )
        if not is_extended_resource_name(name):
            raise RegistrationRejected(f"the ResourceName {json.dumps(name)} is invalid")
        if not request.endpoint or Path(request.endpoint).name != request.endpoint:
            raise RegistrationRejected(
                f"invalid endpoint {json.dumps(request.endpoint)}: must be a socket file name"
            )
        socket_path = self.plugin_dir / request.endpoint
        self._check_not_held(name, socket_path)

        endpoint = _Endpoint(name, socket_path)
        try:
            endpoint.connect()
        except ConnectionError as err:
            raise RegistrationRejected(str(err)) from None
        with self._lock:
            try:
                self._check_not_held(name, socket_path)
            except RegistrationRejected:
                endpoint.stop()
                raise
            state = self._resources.setdefault(name, _ResourceState())
            old, state.endpoint, state.registered = state.endpoint, endpoint, True
            state.restored = False
            state.cancel_timer()
            endpoint.watch(self._on_devices, self._on_stream_end)
        if old is not None:
            old.stop()
        log.info("Registered endpoint %s for resource %s", socket_path, name)

    def _check_not_held(self, name: str, socket_path: Path) -> None:
        with self._lock:
            state = self._resources.get(name)
            held = state.endpoint if state is not None else None
        if held is not None and held.active and held.socket_path != socket_path:
            raise RegistrationRejected(
                f"resource {json.dumps(name)} is already registered by an active device plugin "
                f"at endpoint {json.dumps(held.socket_path.name)}"
            )

    def _on_devices(self, endpoint: _Endpoint, devices: list[api_pb2.Device]) -> None:
        with self._lock:
            state = self._resources.get(endpoint.resource)
            if state is None or state.endpoint is not endpoint:
                return  # a replaced endpoint's last words
            state.devices = {d.ID: d for d in devices}
        self._save_now()
        self._notify()

    def _on_stream_end(self, endpoint: _Endpoint) -> None:
        with self._lock:
            state = self._resources.get(endpoint.resource)
            if state is None or state.endpoint is not endpoint:
                return
            log.info("Mark all resources Unhealthy for resource %s", endpoint.resource)
            for device in state.devices.values():
                device.health = UNHEALTHY
            state.cancel_timer()
            state.grace_timer = threading.Timer(self.stop_grace_period, self._expire, args=(endpoint,))
            state.grace_timer.daemon = True
            state.grace_timer.start()
        self._notify()

    def _expire(self, endpoint: _Endpoint) -> None:
        with self._lock:
            state = self._resources.get(endpoint.resource)
            if state is None or state.endpoint is not endpoint:
                return
            log.info("Device plugin for %s gone for %ss; removing its resource", endpoint.resource,
                     self.stop_grace_period)
            state.endpoint, state.devices, state.registered, state.grace_timer = None, {}, False, None
        endpoint.stop()
        self._save_now()
        self._notify()

    def _expire_restored(self, name: str, restored: _ResourceState) -> None:
        with self._lock:
            if self._resources.get(name) is not restored or not restored.restored:
                return
            log.info("Device plugin for %s did not register again within %ss; removing its resource", name,
                     self.stop_grace_period)
            restored.devices, restored.registered, restored.restored, restored.grace_timer = {}, False, False, None
        self._save_now()
        self._notify()

    def awaiting_plugin(self, resource: str) -> bool:
        """True while ``resource`` is known from the checkpoint and its plugin has not registered again."""
        with self._lock:
            state = self._resources.get(resource)
            return state is not None and state.restored and state.endpoint is None

    # -- counts ------------------------------------------------------------

    def resource_counts(self) -> ResourceCounts:
        """``{resource: (capacity, allocatable)}``."""
        with self._lock:
            return {name: state.counts() for name, state in self._resources.items()}

    def devices(self, resource: str) -> dict[str, str]:
        """``{device ID: health}`` as last streamed by the resource's plugin."""
        with self._lock:
            state = self._resources.get(resource)
            return {i: d.health for i, d in state.devices.items()} if state else {}

    def _notify(self) -> None:
        with self._notify_lock:
            counts = self.resource_counts()
            if counts == self._last_counts:
                return
            self._last_counts = counts
            if self._on_change is not None:
                try:
                    self._on_change(dict(counts))
                except Exception:
                    log.exception("on_change callback failed")

    # -- allocation --------------------------------------------------------

    def allocate(self, pod_uid: str, container_name: str, resource: str, count: int) -> Allocation:
        """Give a container ``count`` devices of ``resource``; raises AllocationError.

        Idempotent: a container that already holds devices of the resource
        gets the same allocation back (the kubelet does this on restarts).
        """
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        with self._alloc_lock:
            existing = self._entry(pod_uid, container_name, resource)
            if existing is not None:
                return existing.allocation()
            endpoint, available, topology = self._available(resource, count)
            chosen = self._choose(endpoint, available, count)
            try:
                response = endpoint.allocate(chosen)
                if endpoint.options.pre_start_required:
                    # A real kubelet calls this right before the container starts;
                    # simulated nodes start containers right after admission.
                    endpoint.pre_start(chosen)
            except grpc.RpcError as err:
                raise AllocationError(_go_error(err)) from None
            per_numa: dict[int, list[str]] = {}
            for device_id in chosen:
                per_numa.setdefault(topology.get(device_id, NODE_WITHOUT_TOPOLOGY), []).append(device_id)
            entry = _PodDevicesEntry(
                pod_uid, container_name, resource, {n: tuple(ids) for n, ids in per_numa.items()}, response
            )
            with self._lock:
                self._entries.append(entry)
            self._save_now()
            log.info("Allocated %s %s to pod %s container %s", resource, ",".join(chosen), pod_uid, container_name)
            return entry.allocation()

    def _available(self, resource: str, count: int) -> tuple[_Endpoint, list[str], dict[str, int]]:
        with self._lock:
            state = self._resources.get(resource)
            if state is None or not state.registered:
                raise AllocationError(f"cannot allocate unregistered device {resource}")
            healthy = [i for i, d in state.devices.items() if d.health == HEALTHY]
            if not healthy or state.endpoint is None:
                raise AllocationError(f"no healthy devices present; cannot allocate unhealthy devices {resource}")
            in_use = {i for e in self._entries if e.resource == resource for i in e.ids}
            available = [i for i in healthy if i not in in_use]
            if len(available) < count:
                raise AllocationError(
                    f"requested number of devices unavailable for {resource}. "
                    f"Requested: {count}, Available: {len(available)}"
                )
            topology = {
                i: d.topology.nodes[0].ID for i, d in state.devices.items() if d.topology.nodes
            }
            return state.endpoint, available, topology

    @staticmethod
    def _choose(endpoint: _Endpoint, available: list[str], count: int) -> list[str]:
        if not endpoint.options.get_preferred_allocation_available:
            return available[:count]
        try:
            preferred = endpoint.get_preferred_allocation(available, count)
        except grpc.RpcError as err:
            raise AllocationError(
                f"device plugin GetPreferredAllocation rpc failed with err: {_go_error(err)}"
            ) from None
        # Like the kubelet: trust the preference only within what is available.
        allowed = set(available)
        chosen = [i for i in dict.fromkeys(preferred) if i in allowed][:count]
        chosen += [i for i in available if i not in chosen][: count - len(chosen)]
        return chosen

    def release(self, pod_uid: str) -> None:
        """Forget a pod's devices (the pod is gone); they become available again."""
        with self._alloc_lock:
            with self._lock:
                before = len(self._entries)
                self._entries = [e for e in self._entries if e.pod_uid != pod_uid]
                changed = len(self._entries) != before
            if changed:
                self._save_now()
                log.info("Released devices of pod %s", pod_uid)

    def retain(self, pod_uids: set[str]) -> None:
        """Forget the devices of every pod not in ``pod_uids`` (deleted while nobody watched)."""
        with self._alloc_lock:
            with self._lock:
                gone = {e.pod_uid for e in self._entries} - set(pod_uids)
                self._entries = [e for e in self._entries if e.pod_uid not in gone]
            if gone:
                self._save_now()
                log.info("Released devices of pods gone while the kubelet was down: %s", ", ".join(sorted(gone)))

    def pod_devices(self) -> dict[str, dict[str, dict[str, list[str]]]]:
        """``{pod UID: {container: {resource: [device IDs]}}}`` for every assignment."""
        result: dict[str, dict[str, dict[str, list[str]]]] = {}
        with self._lock:
            for e in self._entries:
                result.setdefault(e.pod_uid, {}).setdefault(e.container_name, {})[e.resource] = list(e.ids)
        return result

    def allocations(self, pod_uid: str) -> list[Allocation]:
        """Every Allocation a pod holds (one per container and resource)."""
        with self._lock:
            return [e.allocation() for e in self._entries if e.pod_uid == pod_uid]

    def _entry(self, pod_uid: str, container_name: str, resource: str) -> _PodDevicesEntry | None:
        with self._lock:
            return next(
                (e for e in self._entries
                 if (e.pod_uid, e.container_name, e.resource) == (pod_uid, container_name, resource)),
                None,
            )

    # -- checkpoint ------------------------------------------------------

    def _save_now(self) -> None:
        # Snapshot and write under one lock so an older state never lands last.
        with self._save_lock:
            with self._lock:
                registered = {n: list(s.devices) for n, s in self._resources.items() if s.registered}
                entries = list(self._entries)
            try:
                self._checkpoint.save(entries, registered)
            except OSError as err:
                log.error("Failed to write checkpoint %s: %s", self._checkpoint.path, err)
