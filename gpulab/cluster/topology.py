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

Every problem is reported as ``<file>: <field>: <what is wrong>; <what is allowed>``
so that a learner can fix the file without reading code.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import yaml

from .. import paths

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|Pi|M|G|T|P)?$")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
MAX_NODES = 200


class TopologyError(ValueError):
    """A topology file is malformed; the message names file, field and what is allowed."""


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
    def __init__(self, source: Path):
        self.source = source

    def fail(self, field: str, msg: str) -> TopologyError:
        return TopologyError(f"{self.source}: {field}: {msg}")

    def mapping(self, value: Any, field: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(field, f"expected a mapping, got {type(value).__name__}")
        return value

    def only(self, m: dict[str, Any], field: str, allowed: tuple[str, ...]) -> None:
        for key in m:
            if key not in allowed:
                raise self.fail(f"{field}.{key}" if field else key,
                                f"unknown field; allowed: {', '.join(allowed)}")

    def string(self, m: dict[str, Any], key: str, field: str, default: str | None = None) -> str:
        value = m.get(key, default)
        if value is None:
            raise self.fail(f"{field}.{key}", "is required")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise self.fail(f"{field}.{key}", f"expected a string, got {type(value).__name__}")
        return str(value)

    def count(self, m: dict[str, Any], key: str, field: str, default: int | None, minimum: int) -> int:
        value = m.get(key, default)
        if value is None:
            raise self.fail(f"{field}.{key}", "is required")
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(f"{field}.{key}", f"expected an integer, got {value!r}")
        if value < minimum:
            raise self.fail(f"{field}.{key}", f"must be >= {minimum}, got {value}")
        return value

    def quantity(self, m: dict[str, Any], key: str, field: str, default: str) -> str:
        value = self.string(m, key, field, default)
        if not QUANTITY.match(value):
            raise self.fail(f"{field}.{key}",
                            f"{value!r} is not a Kubernetes quantity (e.g. \"16\", \"500m\", \"64Gi\")")
        return value


def load(path: str | Path | None = None) -> Topology:
    """Read and validate a topology file (default: ``manifests/topologies/default.yaml``)."""
    source = Path(path) if path else default_path()
    r = _Reader(source)
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TopologyError(f"{source}: no such file") from None
    except OSError as e:
        raise TopologyError(f"{source}: cannot read: {e.strerror}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "YAML"
        problem = getattr(e, "problem", None) or str(e)
        raise TopologyError(f"{source}: {where}: invalid YAML: {problem}") from None
    doc = r.mapping(doc, "(top level)")
    r.only(doc, "", ("apiVersion", "kind", "metadata", "nodePools"))
    if doc.get("kind", "Topology") != "Topology":
        raise r.fail("kind", f"expected Topology, got {doc.get('kind')!r}")
    if doc.get("apiVersion", "gpulab.io/v1alpha1") != "gpulab.io/v1alpha1":
        raise r.fail("apiVersion", f"expected gpulab.io/v1alpha1, got {doc.get('apiVersion')!r}")
    meta = r.mapping(doc.get("metadata") or {}, "metadata")
    name = r.string(meta, "name", "metadata", source.stem)
    pools = doc.get("nodePools")
    if not isinstance(pools, list) or not pools:
        raise r.fail("nodePools", "expected a non-empty list of node pools")
    nodes: list[NodeSpec] = []
    seen: dict[str, str] = {}
    pool_names: set[str] = set()
    for i, raw in enumerate(pools):
        field = f"nodePools[{i}]"
        pool = r.mapping(raw, field)
        r.only(pool, field, ("name", "count", "names", "cpu", "memory", "pods", "gpu", "labels", "taints"))
        pname = r.string(pool, "name", field)
        if not DNS_LABEL.match(pname):
            raise r.fail(f"{field}.name", f"{pname!r} is not a DNS label (lowercase letters, digits, '-')")
        if pname in pool_names:
            raise r.fail(f"{field}.name", f"duplicate pool name {pname!r}; pool names must be unique")
        pool_names.add(pname)
        names = pool.get("names")
        if names is not None:
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or not names:
                raise r.fail(f"{field}.names", "expected a non-empty list of node names")
            if "count" in pool and pool["count"] != len(names):
                raise r.fail(f"{field}.count", f"is {pool['count']!r} but {len(names)} names are given")
            count = len(names)
        else:
            count = r.count(pool, "count", field, 1, 0)
            names = [f"{pname}-node-{k}" for k in range(1, count + 1)]
        cpu = r.quantity(pool, "cpu", field, "16")
        memory = r.quantity(pool, "memory", field, "64Gi")
        pods = r.count(pool, "pods", field, 110, 1)
        model, gpus = _gpu(r, pool.get("gpu"), f"{field}.gpu")
        labels = _labels(r, pool.get("labels"), f"{field}.labels")
        taints = _taints(r, pool.get("taints"), f"{field}.taints")
        for k, node_name in enumerate(names):
            nfield = f"{field}.names[{k}]" if pool.get("names") is not None else f"{field}.name"
            if not DNS_LABEL.match(node_name):
                raise r.fail(nfield, f"node name {node_name!r} is not a DNS label")
            if node_name in seen:
                raise r.fail(nfield, f"duplicate node name {node_name!r} (also in {seen[node_name]}); "
                                     "node names must be unique")
            seen[node_name] = field
            nodes.append(NodeSpec(node_name, pname, cpu, memory, pods, model, gpus, labels, taints))
    if not nodes:
        raise r.fail("nodePools", "the topology has no nodes (every count is 0)")
    if len(nodes) > MAX_NODES:
        raise r.fail("nodePools", f"{len(nodes)} nodes; at most {MAX_NODES} are allowed")
    return Topology(name, source, tuple(nodes))


def _gpu(r: _Reader, raw: Any, field: str) -> tuple[str | None, int]:
    if raw is None:
        return None, 0
    gpu = r.mapping(raw, field)
    r.only(gpu, field, ("model", "count"))
    from ..fakegpu import models

    model_name = r.string(gpu, "model", field)
    try:
        model = models.get_model(model_name)
    except models.UnknownGpuModel:
        allowed = ", ".join(m.key for m in models.list_models())
        raise r.fail(f"{field}.model", f"unknown GPU model {model_name!r}; allowed: {allowed}") from None
    count = r.count(gpu, "count", field, 1, 1)
    if count > 16:
        raise r.fail(f"{field}.count", f"{count} GPUs per node; at most 16 are allowed")
    return model.key, count


def _labels(r: _Reader, raw: Any, field: str) -> dict[str, str]:
    if raw is None:
        return {}
    labels = r.mapping(raw, field)
    out: dict[str, str] = {}
    for k, v in labels.items():
        if not isinstance(k, str) or not LABEL_KEY.match(k):
            raise r.fail(field, f"{k!r} is not a valid label key (prefix/name, e.g. node-role.kubernetes.io/ai)")
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise r.fail(f"{field}.{k}", f"label values are strings; quote {v!r}")
        if not LABEL_VALUE.match(str(v)):
            raise r.fail(f"{field}.{k}", f"{v!r} is not a valid label value (63 chars of [A-Za-z0-9_.-])")
        out[k] = str(v)
    return out


def _taints(r: _Reader, raw: Any, field: str) -> tuple[Taint, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise r.fail(field, "expected a list of {key, value, effect}")
    taints = []
    for i, t in enumerate(raw):
        tf = f"{field}[{i}]"
        t = r.mapping(t, tf)
        r.only(t, tf, ("key", "value", "effect"))
        key = r.string(t, "key", tf)
        if not LABEL_KEY.match(key):
            raise r.fail(f"{tf}.key", f"{key!r} is not a valid taint key")
        effect = r.string(t, "effect", tf)
        if effect not in TAINT_EFFECTS:
            raise r.fail(f"{tf}.effect", f"{effect!r}; allowed: {', '.join(TAINT_EFFECTS)}")
        taints.append(Taint(key, r.string(t, "value", tf, ""), effect))
    return tuple(taints)
