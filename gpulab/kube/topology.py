"""Topology files: which simulated nodes a cluster has.

A topology is a YAML file (see ``manifests/topologies/``)::

    apiVersion: gpulab.io/v1alpha1
    kind: Topology
    metadata: {name: default}
    nodePools:
    - name: gpu                      # nodes are named gpu-node-1, gpu-node-2, ...
      count: 1
      cpu: "32"
      memory: 256Gi
      gpu: {model: h100-80gb, count: 2}
      labels: {...}                  # optional
      taints: [{key, value, effect}] # optional
      # What the kubelet keeps from pods (optional; its configuration's keys and syntax):
      # allocatable = capacity - kubeReserved - systemReserved - evictionHard (gpulab.kube.allocatable)
      kubeReserved: {cpu: 150m, memory: 12165Mi}   # cpu, memory, ephemeral-storage, pid; default none
      systemReserved: {}                           # the same keys; default none
      evictionHard: {memory.available: 100Mi}      # default: the kubelet's (memory.available<100Mi,
                                                   # nodefs.available<10%, ...); naming any signal
                                                   # replaces them all, unless
      mergeDefaultEvictionSettings: false          # true: unnamed signals keep their defaults
      imagePullBandwidth: 500Mi      # optional: bytes per second of the nodes' image pulls (default 500Mi)

Every problem is reported as ``<file>: <field>: <what is wrong>; <what is allowed>``
so that a learner can fix the file without reading code, and every problem in the
file is reported at once (:class:`TopologyError` ``.errors``), not just the first.
"""

from __future__ import annotations

import dataclasses
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from .. import paths
from ..hardware import models
from ..i18n import _
from . import allocatable as alloc

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|Pi|M|G|T|P)?$")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
#: The most nodes a topology may have: POD_CIDR has a /24 for each of 1024 (manifests/topologies/fleet-1000.yaml).
MAX_NODES = 1000
#: The ephemeral-storage every simulated node has (its "disk"; the topology does not set it).
EPHEMERAL_STORAGE = "500Gi"
PERCENT = re.compile(r"^[0-9]+(\.[0-9]+)?%$")
#: How fast a node pulls images when its pool does not say (bytes per second): a 14.5 GB image in about
#: 28 s. Real pulls of big images are often slower (layers are decompressed as they arrive).
DEFAULT_IMAGE_PULL_BANDWIDTH = "500Mi"


@dataclasses.dataclass(frozen=True)
class TopologyIssue:
    """One mistake in a topology file: which file, which field, what is wrong and what is allowed."""

    source: str
    field: str
    message: str

    def __str__(self) -> str:
        return ": ".join(part for part in (self.source, self.field, self.message) if part)


class TopologyError(ValueError):
    """A topology file is malformed.

    ``errors`` holds every mistake found in the file (one :class:`TopologyIssue`
    each); ``str()`` renders them one per line, each as
    ``<file>: <field>: <what is wrong>; <what is allowed>``.
    """

    def __init__(self, errors: str | TopologyIssue | list[TopologyIssue]):
        if isinstance(errors, str):
            errors = [TopologyIssue("", "", errors)]
        elif isinstance(errors, TopologyIssue):
            errors = [errors]
        self.errors: list[TopologyIssue] = list(errors)
        super().__init__("\n".join(str(e) for e in self.errors))


@dataclasses.dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str

    def to_api(self) -> dict[str, str]:
        d = {"key": self.key, "effect": self.effect}
        if self.value:
            d["value"] = self.value
        return d


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    name: str
    pool: str
    cpu: str
    memory: str
    pods: int
    gpu_model: str | None
    gpu_count: int
    labels: dict[str, str]
    taints: tuple[Taint, ...]
    # The kubelet's configuration of what it keeps from pods (gpulab.kube.allocatable); eviction_hard is the
    # effective set of hard eviction thresholds (the kubelet's defaults unless the pool names its own).
    kube_reserved: dict[str, str] = dataclasses.field(default_factory=dict)
    system_reserved: dict[str, str] = dataclasses.field(default_factory=dict)
    eviction_hard: dict[str, str] = dataclasses.field(default_factory=lambda: dict(alloc.DEFAULT_EVICTION_HARD))
    # The network the node pulls images over: bytes per second, a quantity (gpulab.runtime.imagemanager).
    image_pull_bandwidth: str = DEFAULT_IMAGE_PULL_BANDWIDTH

    def capacity(self) -> dict[str, str]:
        """What the kubelet reports as the machine's capacity (GPUs come from the device plugin, later)."""
        return {
            "cpu": self.cpu,
            "memory": self.memory,
            "pods": str(self.pods),
            "ephemeral-storage": EPHEMERAL_STORAGE,
            "hugepages-1Gi": "0",
            "hugepages-2Mi": "0",
        }

    def reserved(self) -> dict[str, Decimal]:
        """Per resource, what the kubelet keeps from pods: kube-reserved + system-reserved + the hard
        eviction threshold (resources with nothing reserved are left out)."""
        return alloc.reservation(self.capacity(), self.kube_reserved, self.system_reserved, self.eviction_hard)

    def allocatable(self) -> dict[str, str]:
        """What the kubelet reports as allocatable: the capacity less :meth:`reserved`."""
        return alloc.allocatable(self.capacity(), self.reserved())


@dataclasses.dataclass(frozen=True)
class Topology:
    name: str
    source: Path
    nodes: tuple[NodeSpec, ...]

    def node(self, name: str) -> NodeSpec:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    @property
    def gpu_nodes(self) -> tuple[NodeSpec, ...]:
        return tuple(n for n in self.nodes if n.gpu_count)


def default_path() -> Path:
    return paths.manifests() / "topologies" / "default.yaml"


class _Reader:
    """Reads one topology file, collecting every mistake instead of stopping at the first.

    Each reader returns None for a value it could not accept (the mistake is
    recorded); callers then skip whatever would only repeat that mistake.
    """

    def __init__(self, source: Path):
        self.source = source
        self.errors: list[TopologyIssue] = []

    def fail(self, field: str, msg: str) -> None:
        self.errors.append(TopologyIssue(str(self.source), field, msg))

    def mapping(self, value: Any, field: str) -> dict[str, Any] | None:
        if not isinstance(value, dict):
            self.fail(field, _("expected a mapping, got {type}", type=type(value).__name__))
            return None
        return value

    def only(self, m: dict[str, Any], field: str, allowed: tuple[str, ...]) -> None:
        for key in m:
            if key not in allowed:
                self.fail(f"{field}.{key}" if field else str(key),
                          _("unknown field; allowed: {fields}", fields=", ".join(allowed)))

    def string(self, m: dict[str, Any], key: str, field: str, default: str | None = None,
               required: str = "") -> str | None:
        value = m.get(key, default)
        if value is None:
            self.fail(f"{field}.{key}", _("is required; {hint}", hint=required) if required else _("is required"))
            return None
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            self.fail(f"{field}.{key}", _("expected a string, got {type}", type=type(value).__name__))
            return None
        return str(value)

    def count(self, m: dict[str, Any], key: str, field: str, default: int | None, minimum: int) -> int | None:
        value = m.get(key, default)
        if value is None:
            self.fail(f"{field}.{key}", _("is required; an integer >= {minimum}", minimum=minimum))
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(f"{field}.{key}", _("expected an integer >= {minimum}, got {value!r}", minimum=minimum, value=value))
            return None
        if value < minimum:
            self.fail(f"{field}.{key}", _("must be >= {minimum}, got {value}", minimum=minimum, value=value))
            return None
        return value

    def quantity(self, m: dict[str, Any], key: str, field: str, default: str) -> str | None:
        value = self.string(m, key, field, default)
        if value is None:
            return None
        if not QUANTITY.match(value):
            self.fail(f"{field}.{key}",
                      _("{value!r} is not a Kubernetes quantity (e.g. \"16\", \"500m\", \"64Gi\")", value=value))
            return None
        return value


_TOP_KEYS = ("apiVersion", "kind", "metadata", "nodePools")
_METADATA_KEYS = ("name",)
_POOL_KEYS = ("name", "count", "names", "cpu", "memory", "pods", "gpu", "labels", "taints",
              "kubeReserved", "systemReserved", "evictionHard", "mergeDefaultEvictionSettings",
              "imagePullBandwidth")


def load(path: str | Path | None = None) -> Topology:
    """Read and validate a topology file (default: ``manifests/topologies/default.yaml``).

    Raises :class:`TopologyError` listing every mistake in the file (a YAML
    syntax error stops parsing, so it is reported alone, with its line and column).
    """
    source = Path(path) if path else default_path()
    r = _Reader(source)
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TopologyError(TopologyIssue(str(source), "", _("no such file"))) from None
    except OSError as e:
        raise TopologyError(TopologyIssue(str(source), "", _("cannot read: {why}", why=e.strerror))) from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = _("line {line}, column {column}", line=mark.line + 1, column=mark.column + 1) if mark else "YAML"
        problem = getattr(e, "problem", None) or str(e)
        raise TopologyError(TopologyIssue(str(source), where, _("invalid YAML: {problem}", problem=problem))) from None
    doc = r.mapping(doc, "(top level)")
    if doc is None:
        raise TopologyError(r.errors)
    r.only(doc, "", _TOP_KEYS)
    if doc.get("kind", "Topology") != "Topology":
        r.fail("kind", _("expected Topology, got {kind!r}", kind=doc.get("kind")))
    if doc.get("apiVersion", "gpulab.io/v1alpha1") != "gpulab.io/v1alpha1":
        r.fail("apiVersion", _("expected gpulab.io/v1alpha1, got {version!r}", version=doc.get("apiVersion")))
    name = source.stem
    meta = r.mapping(doc.get("metadata") or {}, "metadata")
    if meta is not None:
        r.only(meta, "metadata", _METADATA_KEYS)
        name = r.string(meta, "name", "metadata", source.stem) or name
    pools = doc.get("nodePools")
    if not isinstance(pools, list) or not pools:
        r.fail("nodePools", "expected a non-empty list of node pools")
        pools = []
    nodes: list[NodeSpec] = []
    seen: dict[str, str] = {}
    pool_names: set[str] = set()
    errors_before_pools = len(r.errors)
    for i, raw in enumerate(pools):
        nodes.extend(_pool(r, raw, f"nodePools[{i}]", seen, pool_names))
    if pools and not nodes and len(r.errors) == errors_before_pools:
        r.fail("nodePools", _("the topology has no nodes (every count is 0)"))
    if len(nodes) > MAX_NODES:
        r.fail("nodePools", _("{n} nodes; at most {most} are allowed", n=len(nodes), most=MAX_NODES))
    if r.errors:
        raise TopologyError(r.errors)
    return Topology(name, source, tuple(nodes))


def _pool(r: _Reader, raw: Any, field: str, seen: dict[str, str], pool_names: set[str]) -> list[NodeSpec]:
    """The nodes of one pool; every mistake in it is recorded on ``r``."""
    pool = r.mapping(raw, field)
    if pool is None:
        return []
    errors_before = len(r.errors)
    r.only(pool, field, _POOL_KEYS)
    pname = r.string(pool, "name", field, required=_("a DNS label, e.g. gpu"))
    generated_ok = pname is not None  # may node names be derived from the pool name?
    if pname is not None:
        if not DNS_LABEL.match(pname):
            r.fail(f"{field}.name", _("{name!r} is not a DNS label (lowercase letters, digits, '-')", name=pname))
            generated_ok = False
        elif pname in pool_names:
            r.fail(f"{field}.name", _("duplicate pool name {name!r}; pool names must be unique", name=pname))
            generated_ok = False
        pool_names.add(pname)
    names = pool.get("names")
    node_names: list[tuple[str, str]] = []
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or not names:
            r.fail(f"{field}.names", _("expected a non-empty list of node names"))
        else:
            if "count" in pool and pool["count"] != len(names):
                r.fail(f"{field}.count", _("is {count!r} but {n} names are given", count=pool["count"], n=len(names)))
            node_names = [(n, f"{field}.names[{k}]") for k, n in enumerate(names)]
    else:
        count = r.count(pool, "count", field, 1, 0)
        if count is not None and generated_ok:
            node_names = [(f"{pname}-node-{k}", f"{field}.name") for k in range(1, count + 1)]
    cpu = r.quantity(pool, "cpu", field, "16")
    memory = r.quantity(pool, "memory", field, "64Gi")
    pods = r.count(pool, "pods", field, 110, 1)
    gpu = _gpu(r, pool.get("gpu"), f"{field}.gpu")
    labels = _labels(r, pool.get("labels"), f"{field}.labels")
    taints = _taints(r, pool.get("taints"), f"{field}.taints")
    kube_reserved = _reserved(r, pool.get("kubeReserved"), f"{field}.kubeReserved")
    system_reserved = _reserved(r, pool.get("systemReserved"), f"{field}.systemReserved")
    eviction_hard = _eviction_hard(r, pool.get("evictionHard"), f"{field}.evictionHard")
    bandwidth = r.quantity(pool, "imagePullBandwidth", field, DEFAULT_IMAGE_PULL_BANDWIDTH)
    if bandwidth is not None and alloc.parse(bandwidth) <= 0:
        r.fail(f"{field}.imagePullBandwidth", _("{value!r} is not a bandwidth; bytes per second, more than 0 "
                                                "(e.g. \"500Mi\")", value=bandwidth))
        bandwidth = None
    merge = pool.get("mergeDefaultEvictionSettings", False)
    if not isinstance(merge, bool):
        r.fail(f"{field}.mergeDefaultEvictionSettings", _("expected true or false, got {value!r}", value=merge))
        merge = None
    if len(r.errors) == errors_before:
        assert cpu is not None and memory is not None and pods is not None and merge is not None
        assert kube_reserved is not None and system_reserved is not None and eviction_hard is not None
        eviction_hard = alloc.effective_eviction_hard(eviction_hard, merge)
        _fits(r, field, NodeSpec("", "", cpu, memory, pods, None, 0, {}, (), kube_reserved, system_reserved,
                                 eviction_hard))
    nodes: list[NodeSpec] = []
    for node_name, nfield in node_names:
        if not DNS_LABEL.match(node_name):
            r.fail(nfield, _("node name {name!r} is not a DNS label (lowercase letters, digits, '-')", name=node_name))
            continue
        if node_name in seen:
            r.fail(nfield, _("duplicate node name {name!r} (also in {other}); node names must be unique",
                             name=node_name, other=seen[node_name]))
            continue
        seen[node_name] = field
        if len(r.errors) == errors_before:
            assert pname is not None and cpu is not None and memory is not None and pods is not None
            assert gpu is not None and labels is not None and taints is not None
            assert kube_reserved is not None and system_reserved is not None and eviction_hard is not None
            assert bandwidth is not None
            nodes.append(NodeSpec(node_name, pname, cpu, memory, pods, gpu[0], gpu[1], labels, taints,
                                  kube_reserved, system_reserved, eviction_hard, bandwidth))
    return nodes


def _reserved(r: _Reader, raw: Any, field: str) -> dict[str, str] | None:
    """``kubeReserved`` / ``systemReserved``: resource name -> quantity, as in the kubelet's configuration."""
    if raw is None:
        return {}
    m = r.mapping(raw, field)
    if m is None:
        return None
    out: dict[str, str] = {}
    ok = True
    for key in m:
        if key not in alloc.RESERVABLE:
            r.fail(f"{field}.{key}", _("the kubelet cannot reserve this resource; allowed: {names}",
                                      names=", ".join(alloc.RESERVABLE)))
            ok = False
            continue
        value = r.quantity(m, key, field, "0")
        if value is None:
            ok = False
        else:
            out[str(key)] = value
    return out if ok else None


def _eviction_hard(r: _Reader, raw: Any, field: str) -> dict[str, str] | None:
    """``evictionHard``: eviction signal -> threshold (``"100Mi"`` or ``"10%"``), as in the kubelet's
    configuration; an empty mapping is no configuration (the kubelet's defaults)."""
    if raw is None:
        return {}
    m = r.mapping(raw, field)
    if m is None:
        return None
    out: dict[str, str] = {}
    ok = True
    for key, value in m.items():
        where = f"{field}.{key}"
        if key not in alloc.SIGNALS:
            r.fail(where, _("unknown eviction signal; allowed: {signals}", signals=", ".join(alloc.SIGNALS)))
            ok = False
            continue
        text = str(value).strip() if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None
        if text is not None and PERCENT.match(text):
            if float(text[:-1]) > 100:
                r.fail(where, _("{value!r} is more than 100%; a percentage of the resource's capacity, "
                                "0% to 100%", value=value))
                ok = False
                continue
        elif text is None or not QUANTITY.match(text) or alloc.parse(text) <= 0:
            r.fail(where, _("{value!r} is not a threshold; a positive quantity (e.g. \"100Mi\") or a "
                            "percentage of the resource's capacity (e.g. \"10%\")", value=value))
            ok = False
            continue
        out[str(key)] = text
    return out if ok else None


def _fits(r: _Reader, field: str, spec: NodeSpec) -> None:
    """The kubelet refuses to start when what it reserves exceeds a resource's capacity."""
    capacity = spec.capacity()
    for resource, reserved in spec.reserved().items():
        if reserved > alloc.parse(capacity[resource]):
            r.fail(field, _("kubeReserved, systemReserved and evictionHard reserve {reserved} of {resource}, more "
                            "than the node's {capacity} (the kubelet would refuse to start); reserve at most the "
                            "capacity", reserved=alloc.render(reserved, alloc.is_binary(capacity[resource])),
                            resource=resource, capacity=capacity[resource]))


def _gpu(r: _Reader, raw: Any, field: str) -> tuple[str | None, int] | None:
    if raw is None:
        return None, 0
    gpu = r.mapping(raw, field)
    if gpu is None:
        return None
    r.only(gpu, field, ("model", "count"))
    allowed = ", ".join(m.key for m in models.list_models())
    model_key: str | None = None
    model_name = r.string(gpu, "model", field, required=_("allowed: {values}", values=allowed))
    if model_name is not None:
        try:
            model_key = models.get_model(model_name).key
        except models.UnknownGpuModel:
            r.fail(f"{field}.model", _("unknown GPU model {model!r}; allowed: {models}", model=model_name, models=allowed))
    count = r.count(gpu, "count", field, 1, 1)
    if count is not None and count > 16:
        r.fail(f"{field}.count", _("{n} GPUs per node; at most 16 are allowed", n=count))
        count = None
    if model_key is None or count is None:
        return None
    return model_key, count


def _labels(r: _Reader, raw: Any, field: str) -> dict[str, str] | None:
    if raw is None:
        return {}
    labels = r.mapping(raw, field)
    if labels is None:
        return None
    out: dict[str, str] = {}
    ok = True
    for k, v in labels.items():
        if not isinstance(k, str) or not LABEL_KEY.match(k):
            r.fail(field, _("{key!r} is not a valid label key (prefix/name, e.g. node-role.kubernetes.io/ai)", key=k))
            ok = False
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            r.fail(f"{field}.{k}", _("label values are strings; quote {value!r}", value=v))
            ok = False
        elif not LABEL_VALUE.match(str(v)):
            r.fail(f"{field}.{k}", _("{value!r} is not a valid label value (63 chars of [A-Za-z0-9_.-])", value=v))
            ok = False
        else:
            out[str(k)] = str(v)
    return out if ok else None


def _taints(r: _Reader, raw: Any, field: str) -> tuple[Taint, ...] | None:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        r.fail(field, _("expected a list of {key, value, effect}"))
        return None
    taints = []
    ok = True
    for i, t in enumerate(raw):
        tf = f"{field}[{i}]"
        before = len(r.errors)
        t = r.mapping(t, tf)
        if t is None:
            ok = False
            continue
        r.only(t, tf, ("key", "value", "effect"))
        key = r.string(t, "key", tf, required=_("a label-style key, e.g. nvidia.com/gpu"))
        if key is not None and not LABEL_KEY.match(key):
            r.fail(f"{tf}.key", _("{key!r} is not a valid taint key (prefix/name, e.g. nvidia.com/gpu)", key=key))
        effect = r.string(t, "effect", tf, required=_("allowed: {values}", values=", ".join(TAINT_EFFECTS)))
        if effect is not None and effect not in TAINT_EFFECTS:
            r.fail(f"{tf}.effect", _("{effect!r}; allowed: {values}", effect=effect, values=", ".join(TAINT_EFFECTS)))
        value = r.string(t, "value", tf, "")
        if len(r.errors) != before:
            ok = False
            continue
        assert key is not None and effect is not None and value is not None
        taints.append(Taint(key, value, effect))
    return tuple(taints) if ok else None
