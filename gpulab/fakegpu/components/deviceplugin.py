"""``nvidia-device-plugin``: the node's GPUs over the kubelet device-plugin API.

Serves :class:`~gpulab.fakegpu.deviceplugin.plugin.DevicePlugin` next to the
kubelet's socket with the resources the config file (``CONFIG_FILE``, written
by config-manager: time-slicing, MPS, migStrategy) and ``MIG_STRATEGY`` make
of the node's GPUs and MIG geometry. A new config or MIG geometry restarts
the servers, as NVIDIA's plugin does on config-manager's SIGHUP. A GPU with
an Xid fault is reported Unhealthy (allocatable drops, capacity stays).

It exits non-zero, so that its pod crash-loops as NVIDIA's does, when the
config does not load, when the driver does not answer (fault
``driver-unreachable``) and while it is held down (fault ``device-plugin-down``).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from ..._fsutil import file_identity
from ...hardware.models import GpuModelError, MigLayout, gpu_uuid
from ..devicemap import DevicePluginError, NodeResources, advertised_resources
from ..deviceplugin import DEVICE_PLUGIN_PATH
from ..deviceplugin.plugin import DevicePlugin, socket_name
from ..faults import NodeFaults
from ..pluginconfig import DEFAULT_CONFIG, ConfigError, DevicePluginConfig, parse_config
from .host import RESYNC_S, Host, HostError

SOURCE = "main.go:356"
#: How soon it looks again while the kubelet has not confirmed a registration.
POLL = 0.5


def load_plugin_config(host: Host) -> DevicePluginConfig:
    """The config file the component was given, with ``MIG_STRATEGY`` applied; no file: the defaults.

    Raises ConfigError.
    """
    path = host.settings.config_file
    config = DEFAULT_CONFIG
    if path is not None and path.is_file():
        config = parse_config(path.read_text(), path=host.settings.config_file_shown or str(path))
    return config.with_mig_strategy(host.settings.mig_strategy or None)


def config_document(config: DevicePluginConfig, env: Mapping[str, str] | None = None) -> dict[str, Any]:
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


def inventory(host: Host, resources: NodeResources) -> dict[str, Any]:
    """The plugin inventory for ``resources``, with the health the node's faults give the devices."""
    inv = resources.to_inventory(host.gpu_state(in_container=True))
    bad = host.faults().unhealthy_gpus
    for r in inv["resources"]:
        for d in r["devices"]:
            d["health"] = "Unhealthy" if d.get("minor") in bad else "Healthy"
    return inv


def fault_failure(faults: NodeFaults, node: str) -> str | None:
    """Why the plugin cannot run on a node with these faults (None: it can)."""
    if faults.driver_unreachable:
        return ("error starting plugins: error getting plugins: failed to construct NVML resource managers: "
                "error initializing NVML: Driver Not Loaded")
    if faults.plugin_down:
        return (f"error starting plugins: the device plugin is held down on {node} by gpulab fault "
                "'device-plugin-down' (gpulab fault clear)")
    return None


def _layout_name(layout: MigLayout | None) -> str | None:
    return layout.name if layout is not None and layout.mig_enabled else None


class DevicePluginMain:
    """``nvidia-device-plugin`` for one node."""

    def __init__(self, host: Host):
        self.host = host
        self.out = host.log
        self.plugin: DevicePlugin | None = None
        self.resources: NodeResources | None = None
        self.unhealthy: frozenset[int] = frozenset()
        self.announced: set[str] = set()

    def run(self) -> int:
        out = self.out
        out.info("Starting FS watcher.")
        out.info("Starting OS watcher.")
        if self.host.gpus() is None:
            out.info("No devices found. Waiting indefinitely.")
            while not self.host.wait(3600):
                pass
            return 0
        try:
            return self._loop()
        finally:
            self._stop_plugin()

    def _loop(self) -> int:
        host = self.host
        seen: object = object()
        while True:
            faults = host.faults()
            failure = fault_failure(faults, host.node)
            if failure:
                self.out.error(failure)
                return 1
            now = (file_identity(host.settings.config_file), _layout_name(host.mig_layout()))
            if now != seen:
                if self.resources is not None:
                    self.out.info('Received signal "hangup", restarting.')
                    self._stop_plugin()
                seen = now
                rc = self._start()
                if rc is not None:
                    return rc
            elif self.plugin is not None and faults.unhealthy_gpus != self.unhealthy:
                self._update_health(faults.unhealthy_gpus)
            registering = False
            if self.plugin is not None:
                for r in self.resources or ():
                    if r.name not in self.announced and self.plugin.is_registered(r.name):
                        self.announced.add(r.name)
                        self.out.info(f"Registered device plugin for '{r.name}' with Kubelet")
                    registering |= r.name not in self.announced
            # Its config file, the MIG geometry and faults wake it; while the kubelet has not confirmed every
            # resource's registration yet it looks again soon.
            if host.wait(POLL if registering else RESYNC_S):
                return 0

    def _stop_plugin(self) -> None:
        if self.plugin is not None:
            self.plugin.stop()
        self.plugin = None
        self.resources = None
        self.announced.clear()

    def _start(self) -> int | None:
        out, host = self.out, self.host
        gpus = host.gpus()
        assert gpus is not None
        out.info("Starting Plugins.")
        out.info("Loading configuration.")
        try:
            config = load_plugin_config(host)
        except ConfigError as e:
            out.error(f"error starting plugins: unable to load config: {e}")
            return 1
        out.info("Updating config with default resource matching patterns.")
        out.info("\nRunning with config:\n" + json.dumps(config_document(config, host.settings.flags), indent=2))
        for warning in config.warnings:
            out.warning(warning)
        try:
            resources = advertised_resources(gpus.model, gpus.count, host.node, config, mig_layout=host.mig_layout())
        except (DevicePluginError, ConfigError, GpuModelError) as e:
            out.error(f"error starting plugins: {e}")
            return 1
        host.advertised(resources)
        self.resources = resources
        self.unhealthy = host.faults().unhealthy_gpus
        if not len(resources):
            out.info("No devices found. Waiting indefinitely.")
            return None
        try:
            plugin_config = host.plugin_config()
        except HostError as e:
            out.error(f"error starting plugins: {e}")
            return 1
        self.plugin = DevicePlugin(plugin_config, inventory=inventory(host, resources))
        self.plugin.start()
        for r in resources:
            out.info(f"Starting GRPC server for '{r.name}'")
            out.info(f"Starting to serve '{r.name}' on {DEVICE_PLUGIN_PATH.rstrip('/')}/{socket_name(r.name)}")
        self._log_unhealthy(frozenset(), self.unhealthy)
        return None

    def _update_health(self, now: frozenset[int]) -> None:
        assert self.plugin is not None and self.resources is not None
        self.plugin.update_inventory(inventory(self.host, self.resources))
        self._log_unhealthy(self.unhealthy, now)
        self.unhealthy = now

    def _log_unhealthy(self, before: frozenset[int], after: frozenset[int]) -> None:
        node = self.host.node
        for i in sorted(after - before):
            self.out.info(f"XidCriticalError: Xid=79 on Device={gpu_uuid(node, i)}; marking device as unhealthy.")
            for r in self.resources or ():
                for d in r.devices:
                    if d.gpu_index == i:
                        self.out.info(f"'{r.name}' device marked unhealthy: {d.id}")
        for i in sorted(before - after):
            self.out.info(f"Device {gpu_uuid(node, i)} is healthy again (gpulab fault cleared)")


def run(host: Host) -> int:
    return DevicePluginMain(host).run()
