"""``config-manager``: the device-plugin config for this node, from the ConfigMap and the node label.

The ConfigMap of named configs and the default name come from the host
(:meth:`~gpulab.fakegpu.components.host.Host.config_source`: the pod's
``available-configs`` volume and ``DEFAULT_CONFIG`` on the embedded backend,
where the operator renders them from the ClusterPolicy; the ClusterPolicy
itself on kind, which has no operator process). The config is chosen again
when the node label ``nvidia.com/device-plugin.config`` (``NODE_LABEL``) or
that source changes, as NVIDIA's config-manager does; an edit of the
ConfigMap alone is read at the next such change.

As init container (``ONESHOT=true``) it writes the config once and exits; as
sidecar it starts from what the init container wrote and follows the label.
A config that does not parse, or a label naming none, is not applied: the
sidecar keeps the last good config (or the plugin's defaults) and says why in
a Warning Event on the node; the init container, with nothing to keep, fails.
No config named at all: the plugin runs with its defaults.
"""

from __future__ import annotations

import os
from pathlib import Path

from ...kube import api
from ..pluginconfig import ConfigError, parse_config, select_config
from .host import RESYNC_S, Host, node_labels

SOURCE = "main.go:208"
#: How soon it looks again after it could not read the node, the ConfigMap or the ClusterPolicy.
POLL = 0.5
COMPONENT = "config-manager"

Written = tuple[str | None, str]  # (config name, text); (None, ""): the plugin's defaults


class ConfigManagerMain:
    def __init__(self, host: Host):
        self.host = host
        self.out = host.log
        s = host.settings
        self.oneshot = s.oneshot
        self.label = s.config_label
        self.fallbacks = s.fallbacks
        self.dst = s.config_dst
        self.namespace = s.namespace

    def run(self) -> int:
        if self.dst is None:
            self.out.error("config-manager needs CONFIG_FILE_DST on a mounted volume")
            return 1
        current = self._written() if not self.oneshot else None
        last: object = object()
        while True:
            wait = RESYNC_S  # a change of the label wakes it; its ConfigMap and default are in its pod's spec
            try:
                value = node_labels(self.host).get(self.label)
                source = self.host.config_source()
                if (value, source) != last:
                    self.out.info(f"Updating to config: {value or '<default>'} (label {self.label}={value or ''})")
                    result = self._apply(value, source, current)
                    last = (value, source)
                    if isinstance(result, int):
                        return result
                    current = result
                    if self.oneshot:
                        return 0
            except (api.ApiError, api.NotFound, api.Conflict, OSError) as e:
                self.out.warning(f"cannot read the node, the ConfigMap or the ClusterPolicy: {e}; retrying")
                wait = POLL
            if self.host.wait(wait):
                return 0

    def _written(self) -> Written | None:
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

    def _defaults(self, current: Written | None, why: str) -> Written:
        assert self.dst is not None
        if current != (None, ""):
            self.dst.unlink(missing_ok=True)
            self._name_file.unlink(missing_ok=True)
            self.out.info(f"{why}; the device plugin runs with its defaults")
        return (None, "")

    def _apply(self, label: str | None, source: tuple[str | None, str | None],
               current: Written | None) -> Written | int:
        """Select, check and write the config; the new (name, text), or an exit code."""
        assert self.dst is not None
        configmap, default = source
        if configmap is None:
            return self._defaults(current, "No device-plugin config named")
        cm = self.host.client.get("ConfigMap", configmap, self.namespace)
        data = (cm or {}).get("data") or {}
        selection = select_config(data, label, default, self.fallbacks)
        if selection.name is None:
            if label is None and "empty" in self.fallbacks:
                return self._defaults(current, selection.reason)
            msg = f"ConfigMap {self.namespace}/{configmap}: {selection.reason}"
            return self._refuse("DevicePluginConfigNotFound", msg, current)
        text = data[selection.name]
        try:
            parse_config(text, path=f"{configmap}/{selection.name}")
        except ConfigError as e:
            return self._refuse("DevicePluginConfigInvalid",
                                f"config {selection.name!r} of ConfigMap {self.namespace}/{configmap} is invalid: "
                                f"{e.summary()}", current)
        if current is not None and current == (selection.name, text):
            return current
        self.dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.dst.with_name(f".{self.dst.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, self.dst)
        self._name_file.write_text(selection.name)
        self.host.changed()  # the device plugin and GFD read the file
        self.out.info(f"Successfully updated to config: {selection.name} ({selection.reason})")
        if not self.oneshot:
            self.host.event("DevicePluginConfigApplied",
                            f"device plugin config {selection.name!r} from ConfigMap "
                            f"{self.namespace}/{configmap} applied", component=COMPONENT)
        return (selection.name, text)

    def _refuse(self, reason: str, message: str, current: Written | None) -> Written | int:
        if current is None and self.oneshot:
            self.out.error(f"Error: {message}")
            self.host.event(reason, f"{message}; the device plugin cannot start", "Warning", component=COMPONENT)
            return 1
        keep = (current or (None, ""))[0] or "<defaults>"
        self.out.warning(f"{message}; keeping config {keep}")
        self.host.event(reason, f"{message}; keeping the last good config {keep!r}", "Warning", component=COMPONENT)
        return current if current is not None else (None, "")


def run(host: Host) -> int:
    return ConfigManagerMain(host).run()
