"""The NVIDIA k8s-device-plugin configuration format.

:func:`parse_config` reads the device plugin's own config format
(``version: v1``, ``flags.migStrategy``, ``sharing.timeSlicing`` /
``sharing.mps``) exactly as it appears in a ConfigMap such as the
chapter's ``time-slicing-config`` (``data.any``); :func:`parse_config_map`
reads all the configs of such a ConfigMap and :func:`select_config` is the
config-manager's choice among them for one node. The parser follows
NVIDIA's rules — ``replicas`` must be an integer >= 2, ``rename`` and
``devices`` are parsed but ignored, unknown keys are ignored — and reports
every malformed form as a :class:`ConfigError` naming the field path, the
bad value and what is allowed. All the mistakes of a file are reported at
once (``ConfigError.errors``), not just the first; only a YAML syntax
error, which stops parsing, comes alone. Things NVIDIA silently ignores
come back as ``warnings`` (or errors with ``strict=True``).

Where gpulab is stricter than the real plugin (a resource name that can
never be shared, both ``timeSlicing`` and ``mps`` configured, duplicate
keys) the error says so; silently doing nothing is the worst outcome for a
learner.

What a node advertises with a parsed config is :mod:`gpulab.fakegpu.devicemap`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from ..kube.names import DEVICE_PLUGIN_CONFIG_LABEL

__all__ = [
    "CONFIG_VERSION",
    "CONFIG_LABEL",
    "GPU_RESOURCE",
    "SHARED_SUFFIX",
    "MIG_STRATEGIES",
    "SHARING_NONE",
    "SHARING_TIME_SLICING",
    "SHARING_MPS",
    "ConfigError",
    "ReplicatedResource",
    "ReplicatedResources",
    "Sharing",
    "PluginFlags",
    "GfdFlags",
    "Flags",
    "DevicePluginConfig",
    "DEFAULT_CONFIG",
    "parse_config",
    "parse_config_map",
    "ConfigSelection",
    "select_config",
]

CONFIG_VERSION = "v1"
#: Node label the device plugin's config-manager watches to pick a config.
CONFIG_LABEL = DEVICE_PLUGIN_CONFIG_LABEL
GPU_RESOURCE = "nvidia.com/gpu"
#: ``renameByDefault: true`` renames ``<name>`` to ``<name>.shared``.
SHARED_SUFFIX = ".shared"
MIG_STRATEGIES = ("none", "single", "mixed")
SHARING_NONE = "none"
SHARING_TIME_SLICING = "time-slicing"
SHARING_MPS = "mps"

DEVICE_LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
DEVICE_ID_STRATEGIES = ("uuid", "index")
ALLOCATION_POLICIES = ("distributed", "packed")
DISCOVERY_STRATEGIES = ("auto", "nvml", "tegra")

_MISSING = object()


# --------------------------------------------------------------------------
# Errors


class ConfigError(ValueError):
    """A malformed device-plugin config.

    ``path`` is the field (``sharing.timeSlicing.resources[0].replicas``),
    ``value`` the offending value (absent for missing fields), ``allowed``
    what would have been accepted.

    ``errors`` lists every mistake found (each a ConfigError of its own; a
    single mistake lists itself). When there are several, ``path``,
    ``problem``, ``value`` and ``allowed`` are the first one's and ``str()``
    renders all of them, one per line.
    """

    def __init__(self, path: str, problem: str, value: Any = _MISSING, allowed: str | None = None):
        self.path = path
        self.problem = problem
        self.value = None if value is _MISSING else value
        self.allowed = allowed
        self.errors: list[ConfigError] = [self]
        msg = f"{path}: {problem}"
        if value is not _MISSING:
            msg += f" (got {_show(value)})"
        if allowed:
            msg += f"; allowed: {allowed}"
        super().__init__(msg)

    @classmethod
    def collect(cls, errors: Iterable[ConfigError]) -> ConfigError:
        """One exception carrying all of ``errors`` (flattened; a single one is returned as is)."""
        flat = [leaf for e in errors for leaf in e.errors]
        if not flat:
            raise ValueError("ConfigError.collect needs at least one error")
        if len(flat) == 1:
            return flat[0]
        first = flat[0]
        combined = cls.__new__(cls)
        ValueError.__init__(combined, "\n".join(str(e) for e in flat))
        combined.path, combined.problem = first.path, first.problem
        combined.value, combined.allowed = first.value, first.allowed
        combined.errors = flat
        return combined

    def summary(self, limit: int = 10) -> str:
        """``str()`` shortened for one-line places (Events, logs): at most ``limit`` errors."""
        if len(self.errors) == 1:
            return str(self.errors[0])
        shown = "\n".join(str(e) for e in self.errors[:limit])
        more = len(self.errors) - limit
        tail = f"\n... and {more} more" if more > 0 else ""
        return f"{len(self.errors)} errors:\n{shown}{tail}"


def _show(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, float):
        return f"{value!r} (a float)"
    if isinstance(value, (list, tuple)):
        return f"a list {value!r}"
    if isinstance(value, Mapping):
        return "a mapping"
    if value is None:
        return "null"
    return repr(value)


# --------------------------------------------------------------------------
# Parsed config


@dataclass(frozen=True)
class ReplicatedResource:
    """One entry of ``sharing.<strategy>.resources``, as the plugin uses it.

    ``rename`` is the effective name of the replicas (only ever set through
    ``renameByDefault``, since the plugin ignores per-resource ``rename``);
    ``devices`` the value as written (only ``"all"`` takes effect).
    """

    name: str
    replicas: int
    rename: str | None = None
    devices: str | int | tuple[str, ...] = "all"

    @property
    def advertised_name(self) -> str:
        return self.rename or self.name


@dataclass(frozen=True)
class ReplicatedResources:
    """``sharing.timeSlicing`` or ``sharing.mps``."""

    resources: tuple[ReplicatedResource, ...]
    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False

    def get(self, name: str) -> ReplicatedResource | None:
        for r in self.resources:
            if r.name == name:
                return r
        return None


@dataclass(frozen=True)
class Sharing:
    time_slicing: ReplicatedResources | None = None
    mps: ReplicatedResources | None = None

    @property
    def strategy(self) -> str:
        """``none``, ``time-slicing`` or ``mps`` (the label value)."""
        if self.mps is not None and self.mps.resources:
            return SHARING_MPS
        if self.time_slicing is not None and self.time_slicing.resources:
            return SHARING_TIME_SLICING
        return SHARING_NONE

    @property
    def active(self) -> ReplicatedResources | None:
        """The replicated resources of the active strategy."""
        if self.strategy == SHARING_MPS:
            return self.mps
        if self.strategy == SHARING_TIME_SLICING:
            return self.time_slicing
        return None

    def replication(self, resource: str) -> ReplicatedResource | None:
        active = self.active
        return active.get(resource) if active else None


@dataclass(frozen=True)
class PluginFlags:
    pass_device_specs: bool = False
    device_list_strategy: tuple[str, ...] = ("envvar",)
    device_id_strategy: str = "uuid"
    shared_devices_allocation_policy: str = "distributed"


@dataclass(frozen=True)
class GfdFlags:
    oneshot: bool = False
    no_timestamp: bool = False
    sleep_interval_s: float = 60.0


@dataclass(frozen=True)
class Flags:
    mig_strategy: str = "none"
    fail_on_init_error: bool = True
    nvidia_driver_root: str = "/"
    plugin: PluginFlags = field(default_factory=PluginFlags)
    gfd: GfdFlags = field(default_factory=GfdFlags)


@dataclass(frozen=True)
class DevicePluginConfig:
    """A parsed, validated device-plugin config (after NVIDIA's own fix-ups)."""

    version: str = CONFIG_VERSION
    flags: Flags = field(default_factory=Flags)
    sharing: Sharing = field(default_factory=Sharing)
    #: What NVIDIA would ignore (unknown keys, ``rename``, ``devices`` …).
    warnings: tuple[str, ...] = ()

    @property
    def mig_strategy(self) -> str:
        return self.flags.mig_strategy

    def with_mig_strategy(self, strategy: str | None) -> DevicePluginConfig:
        """Apply a ``--mig-strategy`` / ``MIG_STRATEGY`` override.

        The flag beats the config file, which is how the GPU Operator's
        ``mig.strategy`` reaches the plugin and GFD.
        """
        if strategy is None or strategy == self.flags.mig_strategy:
            return self
        _check_choice("--mig-strategy", strategy, MIG_STRATEGIES)
        _check_mps_strategy(self.sharing, strategy, "--mig-strategy")
        return replace(self, flags=replace(self.flags, mig_strategy=strategy))


DEFAULT_CONFIG = DevicePluginConfig()


# --------------------------------------------------------------------------
# YAML loading


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that records duplicate keys (as errors) instead of silently keeping the last."""

    def __init__(self, stream: Any, source: str = "config"):
        super().__init__(stream)
        self.source = source
        self.duplicates: list[ConfigError] = []


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    result: dict = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in result:
            mark = key_node.start_mark
            loader.duplicates.append(ConfigError(
                f"{loader.source} (line {mark.line + 1}, column {mark.column + 1})",
                f"duplicate key {key!r}; the device plugin would silently keep only one of them",
            ))
        result[key] = loader.construct_object(value_node, deep=deep)
    return result


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _load_yaml(text: str | bytes, source: str) -> tuple[Any, list[ConfigError]]:
    """The document, and one error per duplicate key. A syntax error stops parsing: raised alone."""
    loader = _StrictLoader(text, source)
    try:
        return loader.get_single_data(), loader.duplicates
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        raise ConfigError(source, f"not valid YAML at {where}: {exc.problem}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(source, f"not valid YAML: {exc}") from exc
    finally:
        loader.dispose()


# --------------------------------------------------------------------------
# Field readers


class _Ctx:
    """Collects warnings and errors (all of them), and knows whether warnings should be errors."""

    def __init__(self, strict: bool):
        self.strict = strict
        self.warnings: list[str] = []
        self.errors: list[ConfigError] = []

    def error(self, exc: ConfigError) -> None:
        self.errors.extend(exc.errors)

    def check(self, fn: Any, *args: Any, default: Any = None) -> Any:
        """``fn(*args)``; a ConfigError it raises is recorded and ``default`` returned instead."""
        try:
            return fn(*args)
        except ConfigError as exc:
            self.error(exc)
            return default

    def ignored(self, path: str, message: str) -> None:
        if self.strict:
            self.error(ConfigError(path, message + " (strict mode)"))
            return
        self.warnings.append(f"{path}: {message}")

    def raise_errors(self) -> None:
        if self.errors:
            raise ConfigError.collect(self.errors)


class _Obj:
    """One mapping of the config, read the way Go's decoder would.

    ``fold_case`` mirrors encoding/json on plain structs, which also accepts
    a key that differs only in case (``migstrategy``); the plugin's custom
    decoders (time-slicing resources) look keys up exactly.
    """

    def __init__(self, data: Any, path: str, ctx: _Ctx, known: Sequence[str], fold_case: bool):
        if not isinstance(data, Mapping):
            raise ConfigError(path, "must be a mapping", data)
        self.path = path
        self.ctx = ctx
        self.values: dict[str, tuple[str, Any]] = {}
        folded = {k.casefold(): k for k in known}
        for raw_key, value in data.items():
            if not isinstance(raw_key, str):
                ctx.ignored(f"{path}.{raw_key}", "key is not a string; ignored")
                continue
            if raw_key in known:
                key = raw_key
            elif fold_case and raw_key.casefold() in folded:
                key = folded[raw_key.casefold()]
                ctx.warnings.append(
                    f"{path}.{raw_key}: accepted as {key!r} (the device plugin matches these keys "
                    "case-insensitively), but write it as " + repr(key)
                )
            else:
                hint = difflib.get_close_matches(raw_key, known, n=1, cutoff=0.6)
                tip = f" (did you mean {hint[0]!r}?)" if hint else ""
                ctx.ignored(f"{path}.{raw_key}",
                            f"unknown key, ignored by the device plugin{tip}; allowed: {', '.join(known)}")
                continue
            if key in self.values:
                ctx.error(ConfigError(f"{path}.{raw_key}", f"set twice (also as {self.values[key][0]!r})"))
                continue
            self.values[key] = (raw_key, value)

    def has(self, key: str) -> bool:
        return key in self.values

    def at(self, key: str) -> str:
        raw = self.values.get(key, (key, None))[0]
        return f"{self.path}.{raw}"

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        if key in self.values:
            return self.values[key][1]
        return default

    def str(self, key: str, default: str) -> str:
        value = self.raw(key, None)
        if value is None:
            return default
        if not isinstance(value, str):
            self.ctx.error(ConfigError(self.at(key), "must be a string", value))
            return default
        return value

    def bool(self, key: str, default: bool) -> bool:
        value = self.raw(key, None)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.ctx.error(ConfigError(self.at(key), "must be a boolean", value, "true or false"))
            return default
        return value

    def obj(self, key: str, known: Sequence[str], fold_case: bool = True) -> _Obj | None:
        """The mapping under ``key``; None when absent or not a mapping (that error is recorded)."""
        value = self.raw(key, None)
        if value is None:
            return None
        return self.ctx.check(_Obj, value, self.at(key), self.ctx, known, fold_case)


def _check_choice(path: str, value: Any, allowed: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(path, "unknown value", value, ", ".join(allowed))
    return value


def _check_mps_strategy(sharing: Sharing, strategy: str, path: str) -> None:
    if sharing.strategy == SHARING_MPS and strategy == "mixed":
        raise ConfigError(
            path,
            "using --mig-strategy=mixed is not supported with MPS (device plugin refuses to start)",
            strategy,
            "none or single together with sharing.mps",
        )


# --------------------------------------------------------------------------
# Resource names and device references

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_MIG_RESOURCE = re.compile(r"nvidia\.com/mig-[1-7]g\.\d+gb(\.[a-z]+)?")
_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_GPU_UUID = re.compile(rf"GPU-{_UUID}")
_MIG_UUID = re.compile(rf"MIG-{_UUID}|MIG-GPU-{_UUID}/\d+/\d+")
_SHAREABLE = "nvidia.com/gpu, or nvidia.com/mig-<profile> (e.g. nvidia.com/mig-1g.10gb) with migStrategy mixed"


def _resource_name(value: Any, path: str) -> str:
    """Validate a resource name as the plugin does (it adds ``nvidia.com/``)."""
    if not isinstance(value, str) or not value:
        raise ConfigError(path, "must be a non-empty string", value, _SHAREABLE)
    name = value if value.startswith("nvidia.com/") else f"nvidia.com/{value}"
    short = name.split("/", 1)[1]
    if len(short) > 253 or not _DNS_SUBDOMAIN.fullmatch(short):
        raise ConfigError(
            path,
            "incorrect format for resource name: the part after 'nvidia.com/' must be a DNS subdomain "
            "(lower-case letters, digits, '-' and '.')",
            value,
            _SHAREABLE,
        )
    return name


def _shareable_name(value: Any, path: str) -> str:
    name = _resource_name(value, path)
    if name != GPU_RESOURCE and not _MIG_RESOURCE.fullmatch(name):
        # The plugin would accept the name and then match no device: the
        # config would do nothing at all. Say so instead.
        raise ConfigError(path, "unknown resource name: the device plugin cannot replicate it", value, _SHAREABLE)
    return name


def _devices(value: Any, path: str) -> str | int | tuple[str, ...]:
    if isinstance(value, str):
        if value != "all":
            raise ConfigError(path, "the only valid string is 'all'", value, "'all', a count > 0 or a list of devices")
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise ConfigError(path, "a count of devices must be > 0", value)
        return value
    if isinstance(value, list):
        refs: list[str] = []
        bad: list[ConfigError] = []
        for i, item in enumerate(value):
            ipath = f"{path}[{i}]"
            if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
                refs.append(str(item))
            elif isinstance(item, str) and (
                re.fullmatch(r"\d+", item)
                or re.fullmatch(r"\d+:\d+", item)
                or _GPU_UUID.fullmatch(item)
                or _MIG_UUID.fullmatch(item)
            ):
                refs.append(item)
            else:
                bad.append(ConfigError(
                    ipath,
                    "unsupported device reference",
                    item,
                    "a GPU index (0), a MIG index (0:1), a GPU UUID (GPU-…) or a MIG UUID (MIG-…)",
                ))
        if bad:
            raise ConfigError.collect(bad)
        return tuple(refs)
    raise ConfigError(path, "unrecognized type for devices spec", value, "'all', a count > 0 or a list of devices")


def _replicas(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(path, "must be an integer", value, "an integer >= 2")
    if value < 2:
        raise ConfigError(
            path,
            "number of replicas must be >= 2 (to stop sharing, remove the sharing section instead)",
            value,
            "an integer >= 2",
        )
    return value


# --------------------------------------------------------------------------
# Parsing


_TOP_KEYS = ("version", "flags", "resources", "sharing", "imex")
_FLAG_KEYS = (
    "migStrategy",
    "failOnInitError",
    "restartOnDeviceUnhealthy",
    "nvidiaDriverRoot",
    "nvidiaDevRoot",
    "mpsRoot",
    "gdrcopyEnabled",
    "gdsEnabled",
    "mofedEnabled",
    "useNodeFeatureAPI",
    "deviceDiscoveryStrategy",
    "plugin",
    "gfd",
)
_PLUGIN_KEYS = (
    "passDeviceSpecs",
    "deviceListStrategy",
    "deviceIDStrategy",
    "cdiAnnotationPrefix",
    "nvidiaCTKPath",
    "containerDriverRoot",
    "sharedDevicesAllocationPolicy",
)
_GFD_KEYS = ("oneshot", "noTimestamp", "sleepInterval", "outputFile", "machineTypeFile")
_SHARING_KEYS = ("timeSlicing", "mps")
_REPLICATED_KEYS = ("renameByDefault", "failRequestsGreaterThanOne", "resources", "strategy")
_RESOURCE_KEYS = ("name", "rename", "devices", "replicas")

_GO_DURATION = re.compile(r"(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _duration(value: Any, path: str, default: float) -> float:
    if value is None:
        return default
    if not isinstance(value, str) or not _GO_DURATION.fullmatch(value):
        raise ConfigError(path, "must be a Go duration string", value, "e.g. '60s', '1m30s'")
    return sum(float(n) * _DURATION_UNITS[u] for n, _, u in re.findall(r"(\d+(\.\d+)?)(ns|us|µs|ms|s|m|h)", value))


def _parse_flags(obj: _Obj | None, ctx: _Ctx) -> Flags:
    if obj is None:
        return Flags()
    mig = obj.raw("migStrategy", None)
    mig_strategy = "none" if mig is None else ctx.check(_check_choice, obj.at("migStrategy"), mig, MIG_STRATEGIES,
                                                        default="none")
    disc = obj.raw("deviceDiscoveryStrategy", None)
    if disc is not None:
        ctx.check(_check_choice, obj.at("deviceDiscoveryStrategy"), disc, DISCOVERY_STRATEGIES)
    for key in ("restartOnDeviceUnhealthy", "gdrcopyEnabled", "gdsEnabled", "mofedEnabled", "useNodeFeatureAPI"):
        obj.bool(key, False)
    for key in ("nvidiaDevRoot", "mpsRoot"):
        obj.str(key, "")

    plugin = PluginFlags()
    pobj = obj.obj("plugin", _PLUGIN_KEYS)
    if pobj is not None:
        dls = pobj.raw("deviceListStrategy", None)
        if dls is None:
            strategies: tuple[str, ...] = ("envvar",)
        else:
            # A single string is accepted as well as a list, like the flag.
            items = [dls] if isinstance(dls, str) else dls
            if not isinstance(items, list) or not items:
                ctx.error(ConfigError(pobj.at("deviceListStrategy"), "must be a string or a non-empty list", dls,
                                      ", ".join(DEVICE_LIST_STRATEGIES)))
                items = []
            strategies = tuple(
                ctx.check(_check_choice, f"{pobj.at('deviceListStrategy')}[{i}]", s, DEVICE_LIST_STRATEGIES,
                          default="envvar")
                for i, s in enumerate(items)
            ) or ("envvar",)
        idstrat = pobj.raw("deviceIDStrategy", None)
        policy = pobj.raw("sharedDevicesAllocationPolicy", None)
        for key in ("cdiAnnotationPrefix", "nvidiaCTKPath", "containerDriverRoot"):
            pobj.str(key, "")
        plugin = PluginFlags(
            pass_device_specs=pobj.bool("passDeviceSpecs", False),
            device_list_strategy=strategies,
            device_id_strategy="uuid" if idstrat is None
            else ctx.check(_check_choice, pobj.at("deviceIDStrategy"), idstrat, DEVICE_ID_STRATEGIES,
                           default="uuid"),
            shared_devices_allocation_policy="distributed" if policy is None
            else ctx.check(_check_choice, pobj.at("sharedDevicesAllocationPolicy"), policy, ALLOCATION_POLICIES,
                           default="distributed"),
        )

    gfd = GfdFlags()
    gobj = obj.obj("gfd", _GFD_KEYS)
    if gobj is not None:
        for key in ("outputFile", "machineTypeFile"):
            gobj.str(key, "")
        gfd = GfdFlags(
            oneshot=gobj.bool("oneshot", False),
            no_timestamp=gobj.bool("noTimestamp", False),
            sleep_interval_s=ctx.check(_duration, gobj.raw("sleepInterval", None), gobj.at("sleepInterval"), 60.0,
                                       default=60.0),
        )

    return Flags(
        mig_strategy=mig_strategy,
        fail_on_init_error=obj.bool("failOnInitError", True),
        nvidia_driver_root=obj.str("nvidiaDriverRoot", "/"),
        plugin=plugin,
        gfd=gfd,
    )


def _parse_replicated(obj: _Obj, kind: str, ctx: _Ctx) -> ReplicatedResources:
    """``sharing.<kind>``; every mistake is recorded on ``ctx`` (the result then holds the valid resources)."""
    strategy = obj.raw("strategy", None)
    if strategy not in (None, ""):
        ctx.error(ConfigError(obj.at("strategy"), f"unknown {kind} strategy", strategy, "leave it unset"))
    raw = obj.raw("resources", None)
    rpath = obj.at("resources")
    if not obj.has("resources"):
        ctx.error(ConfigError(f"{obj.path}.resources", "no resources specified",
                              allowed="a list with at least one resource"))
        raw = []
    elif not isinstance(raw, list):
        ctx.error(ConfigError(rpath, "must be a list", raw))
        raw = []
    elif not raw:
        ctx.error(ConfigError(rpath, "no resources specified", raw, "a list with at least one resource"))
    rename_by_default = obj.bool("renameByDefault", False)
    # MPS keeps its historical behaviour: requests > 1 fail unless the
    # config says otherwise (config.go). Time-slicing defaults to false.
    fail_gt1 = obj.bool("failRequestsGreaterThanOne", kind == "mps")

    resources: list[ReplicatedResource] = []
    seen: dict[str, str] = {}
    for i, item in enumerate(raw):
        ipath = f"{rpath}[{i}]"
        r = ctx.check(_Obj, item, ipath, ctx, _RESOURCE_KEYS, False)
        if r is None:
            continue
        name: str | None = None
        if not r.has("name"):
            ctx.error(ConfigError(f"{ipath}.name", "no resource name specified", allowed=_SHAREABLE))
        else:
            name = ctx.check(_shareable_name, r.raw("name"), r.at("name"))
        if name is not None and kind == "mps" and name != GPU_RESOURCE:
            ctx.error(ConfigError(r.at("name"), "MPS can only share full GPUs", r.raw("name"), GPU_RESOURCE))
            name = None
        if name is not None and name in seen:
            ctx.error(ConfigError(r.at("name"), f"resource listed twice (first at {seen[name]})", r.raw("name")))
            name = None
        if name is not None:
            seen[name] = ipath
        replicas: int | None = None
        if not r.has("replicas"):
            ctx.error(ConfigError(f"{ipath}.replicas", "no replicas specified", allowed="an integer >= 2"))
        else:
            replicas = ctx.check(_replicas, r.raw("replicas"), r.at("replicas"))
        devices: str | int | tuple[str, ...] = "all"
        if r.has("devices"):
            devices = ctx.check(_devices, r.raw("devices"), r.at("devices"), default="all")
            if devices != "all":
                ctx.ignored(r.at("devices"), f"customizing 'devices' in sharing.{kind}.resources is not yet "
                                             "supported by the device plugin; it replicates all devices")
        rename: str | None = None
        if r.has("rename"):
            written = ctx.check(_resource_name, r.raw("rename"), r.at("rename"))
            if written is not None and (not rename_by_default or name is None or written != name + SHARED_SUFFIX):
                ctx.ignored(r.at("rename"), f"setting 'rename' in sharing.{kind}.resources is not yet supported "
                                            "by the device plugin; use renameByDefault")
        if name is None or replicas is None:
            continue
        if rename_by_default:
            rename = name + SHARED_SUFFIX
        resources.append(ReplicatedResource(name=name, replicas=replicas, rename=rename, devices=devices))
    return ReplicatedResources(
        resources=tuple(resources),
        rename_by_default=rename_by_default,
        fail_requests_greater_than_one=fail_gt1,
    )


def _parse_sharing(obj: _Obj | None, ctx: _Ctx) -> Sharing:
    if obj is None:
        return Sharing()
    ts_obj = obj.obj("timeSlicing", _REPLICATED_KEYS, fold_case=False)
    mps_obj = obj.obj("mps", _REPLICATED_KEYS, fold_case=False)
    ts = _parse_replicated(ts_obj, "timeSlicing", ctx) if ts_obj is not None else None
    mps = _parse_replicated(mps_obj, "mps", ctx) if mps_obj is not None else None
    if ts is not None and mps is not None:
        # The plugin would let MPS win silently; the README calls the two
        # mutually exclusive.
        ctx.error(ConfigError(
            obj.path,
            "timeSlicing and mps are mutually exclusive (the device plugin would silently use only mps)",
            allowed="exactly one of sharing.timeSlicing or sharing.mps",
        ))
    return Sharing(time_slicing=ts, mps=mps)


def _parse_imex(obj: _Obj | None) -> None:
    if obj is None:
        return
    ids = obj.raw("channelIDs", None)
    if ids is not None and ids not in ([], [0]):
        obj.ctx.error(ConfigError(obj.at("channelIDs"), "invalid IMEX channel IDs", ids, "[] or [0]"))
    obj.bool("required", False)


def parse_config(
    source: str | bytes | Mapping[str, Any] | None,
    *,
    path: str = "config",
    strict: bool = False,
) -> DevicePluginConfig:
    """Parse a device-plugin config file (YAML or JSON text, or a mapping).

    ``path`` prefixes every field path in errors (``data.any`` for a
    ConfigMap key). With ``strict=True`` anything the device plugin would
    ignore is an error instead of a warning. Raises one :class:`ConfigError`
    whose ``errors`` lists every mistake in the config.
    """
    ctx = _Ctx(strict)
    if isinstance(source, (str, bytes)):
        data, duplicates = _load_yaml(source, path)
        ctx.errors.extend(duplicates)
    else:
        data = source
    if data is None:
        # An empty file unmarshals to an empty config in Go: all defaults.
        ctx.ignored(path, "empty config; all defaults apply (no sharing, migStrategy none)")
        ctx.raise_errors()
        return DevicePluginConfig(warnings=tuple(ctx.warnings))
    top = ctx.check(_Obj, data, path, ctx, _TOP_KEYS, True)
    if top is None:
        ctx.raise_errors()

    version = top.raw("version", None)
    if version is None or version == "":
        version = CONFIG_VERSION
    elif not isinstance(version, str):
        ctx.error(ConfigError(top.at("version"), "must be a string", version, repr(CONFIG_VERSION)))
    elif version != CONFIG_VERSION:
        ctx.error(ConfigError(top.at("version"), "unknown version", version, repr(CONFIG_VERSION)))

    flags = _parse_flags(top.obj("flags", _FLAG_KEYS), ctx)
    sharing = _parse_sharing(top.obj("sharing", _SHARING_KEYS), ctx)
    ctx.check(_check_mps_strategy, sharing, flags.mig_strategy, f"{path}.flags.migStrategy")
    if top.raw("resources", None) is not None:
        ctx.ignored(top.at("resources"), "customizing the 'resources' field is not yet supported by the "
                                         "device plugin; ignored")
    _parse_imex(top.obj("imex", ("channelIDs", "required")))
    ctx.raise_errors()
    return DevicePluginConfig(version=version, flags=flags, sharing=sharing, warnings=tuple(ctx.warnings))


def parse_config_map(data: Mapping[str, Any], *, strict: bool = False) -> dict[str, DevicePluginConfig]:
    """Parse every key of a ConfigMap's ``data`` (one config per key).

    Raises one :class:`ConfigError` listing the mistakes of every config.
    """
    if not isinstance(data, Mapping):
        raise ConfigError("data", "must be a mapping of config names to config files", data)
    if not data:
        raise ConfigError("data", "no configs: the ConfigMap has no keys")
    configs: dict[str, DevicePluginConfig] = {}
    errors: list[ConfigError] = []
    for key, text in data.items():
        if not isinstance(text, str):
            errors.append(ConfigError(f"data.{key}", "ConfigMap values must be strings (use a YAML block scalar '|')",
                                      text))
            continue
        try:
            configs[str(key)] = parse_config(text, path=f"data.{key}", strict=strict)
        except ConfigError as exc:
            errors.extend(exc.errors)
    if errors:
        raise ConfigError.collect(errors)
    return configs


@dataclass(frozen=True)
class ConfigSelection:
    """Which named config the config-manager picks for a node, and why."""

    name: str | None
    reason: str


def select_config(
    available: Iterable[str],
    label_value: str | None,
    default: str | None = None,
    fallback_strategies: Sequence[str] = ("named", "single"),
) -> ConfigSelection:
    """The device plugin config-manager's choice for one node.

    ``label_value`` is the node's ``nvidia.com/device-plugin.config`` label
    (None when absent). A label naming an unknown config is skipped (the
    plugin keeps its current config); no label means ``default``, then the
    fallback strategies: ``named`` uses a config called ``default``,
    ``single`` the only config, ``empty`` none.
    """
    names = list(available)
    if label_value:
        if label_value in names:
            return ConfigSelection(label_value, f"selected by node label {CONFIG_LABEL}={label_value}")
        return ConfigSelection(
            None,
            f"node label {CONFIG_LABEL}={label_value} names no config (have: {', '.join(names) or 'none'}); "
            "reconfiguration skipped",
        )
    if default:
        if default in names:
            return ConfigSelection(default, f"no {CONFIG_LABEL} label; using the default config {default!r}")
        return ConfigSelection(None, f"default config {default!r} does not exist (have: {', '.join(names) or 'none'})")
    for strategy in fallback_strategies:
        if strategy == "named" and "default" in names:
            return ConfigSelection("default", "no label and no default; fallback 'named' picked config 'default'")
        if strategy == "single" and len(names) == 1:
            return ConfigSelection(names[0], f"no label and no default; fallback 'single' picked {names[0]!r}")
        if strategy == "empty":
            return ConfigSelection(None, "no label and no default; fallback 'empty': no config")
        if strategy not in ("named", "single", "empty"):
            raise ConfigError("fallbackStrategies", "unknown fallback strategy", strategy, "named, single, empty")
    return ConfigSelection(None, "no label, no default and no fallback matched")
