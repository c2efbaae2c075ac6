"""The kind backend: real kubelets in Docker containers, the same fake GPUs.

``gpulab up --backend kind`` makes a kind cluster whose worker nodes are the
topology's nodes (same names, labels and taints), builds the fake GPU stack's
image (``images/fakegpu/Dockerfile``), loads it into the nodes with
``kind load docker-image`` and applies ``manifests/kind/``: the GPU stack as
DaemonSets in the ``gpu-operator`` namespace, where NVIDIA's GPU Operator runs
its operands, and metrics-server (``kubectl top``; it scrapes the real kubelets'
``/metrics/resource``). On each GPU node the fake device plugin registers with the real
kubelet over ``/var/lib/kubelet/device-plugins/kubelet.sock``, so the
kubelet, not gpulab, puts ``nvidia.com/gpu`` into the Node's capacity and
allocates devices to pods.

Why the steps are split the way they are:

- the kubelet may only set labels outside ``kubernetes.io``/``k8s.io`` (and a
  few well-known ones) on its own Node (``--node-labels``), so the kind
  config carries those and :meth:`KindCluster.up` applies the rest (NFD's
  ``feature.node.kubernetes.io/...``, ``node-role.kubernetes.io/...``) as the
  cluster admin, which is what NFD and an admin do on a real cluster;
- node names come from kubeadm's ``nodeRegistration.name`` (kind names its
  containers ``<cluster>-worker<N>``; lessons talk about ``gpu-node-1``);
- taints go into kubeadm's ``nodeRegistration.taints``, so a tainted node is
  never schedulable untainted, not even for a moment;
- kube-scheduler runs the embedded backend's profiles (:mod:`.schedulerconfig`):
  ``up`` writes the configuration file into a directory of its own, the
  control-plane node mounts that directory (``extraMounts``) and a kubeadm
  ``ClusterConfiguration`` patch gives the scheduler's static pod the
  directory as a volume and ``--config`` (kubeadm's own flags stay:
  ``--leader-elect=true`` is honoured with a file, ``--kubeconfig`` is not,
  so the file names kubeadm's ``/etc/kubernetes/scheduler.conf``).

Only the pure parts (config rendering, tool checks, the manifests) are tested
on machines without Docker; creating a cluster is tested end to end only where
Docker runs (``make test BACKEND=kind``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from .. import _poll, paths, versions
from .._fsutil import atomic_write_text
from . import binaries, nodes, schedulerconfig
from .base import ClusterError, Say
from .base import say_to_stderr as _say
from ..fakegpu import gfd, llmserver
from ..kube.names import OPERATOR_NAMESPACE
from ..kube.statedir import StateDir
from ..kube.topology import NodeSpec, Topology
from ..kube.topology import load as load_topology


KIND_VERSION = versions.KIND
NODE_IMAGE = versions.KIND_NODE_IMAGE
DEFAULT_NAME = "gpulab"
FAKEGPU_IMAGE = "gpulab.local/fakegpu:dev"
DOCKERFILE = Path("images") / "fakegpu" / "Dockerfile"
#: The images `up` builds and loads into the nodes: the GPU stack's, and the lessons' inference server.
IMAGES = ((FAKEGPU_IMAGE, DOCKERFILE), (llmserver.IMAGE, Path("images") / "llm-server" / "Dockerfile"))
NAMESPACE = OPERATOR_NAMESPACE

#: Node labels telling the fake GPU stack what hardware a kind node "has";
#: the daemons read them from their Node (a container cannot see PCI devices
#: that do not exist).
FAKE_MODEL_LABEL = "gpulab.io/fake-gpu.model"
FAKE_COUNT_LABEL = "gpulab.io/fake-gpu.count"

#: kube-scheduler's configuration on the control-plane node: a directory mounted from the host's
#: ``<kind dir>/kube-scheduler/`` (a directory, not the file: a bind-mounted file would keep showing the
#: old one after an atomic rewrite), seen at the same path by kubeadm's static pod of the scheduler.
SCHEDULER_DIR_NAME = "kube-scheduler"
SCHEDULER_NODE_DIR = "/etc/kubernetes/gpulab-scheduler"
SCHEDULER_CONFIG_NAME = "kube-scheduler.yaml"
#: The kubeconfig kubeadm writes for the scheduler (its ``--kubeconfig``, ignored once ``--config`` is given).
SCHEDULER_KUBECONFIG = "/etc/kubernetes/scheduler.conf"

KIND_BUILD = binaries.Build("kind", KIND_VERSION, (("sigs.k8s.io/kind", "kind"),), "-s -w")

# What the kubelet may set on its own Node with --node-labels (the
# NodeRestriction rules of k8s.io/kubelet/pkg/apis/well_known_labels.go).
_KUBELET_LABELS = frozenset({
    "kubernetes.io/hostname", "kubernetes.io/os", "kubernetes.io/arch",
    "beta.kubernetes.io/os", "beta.kubernetes.io/arch", "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type", "topology.kubernetes.io/region", "topology.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region", "failure-domain.beta.kubernetes.io/zone",
})
_KUBELET_NAMESPACES = ("kubelet.kubernetes.io", "node.kubernetes.io")


class KindError(ClusterError):
    """The kind backend cannot do what was asked; the message says why and what to do."""


class _TimedOut(Exception):
    """A wait that reports its timeout instead of raising it (:meth:`KindCluster._wait_gpus`)."""



# --------------------------------------------------------------------------
# The kind config (pure)


def kubelet_may_set(key: str) -> bool:
    """True when a kubelet may put label ``key`` on its own Node (``--node-labels``)."""
    prefix, _, _ = key.rpartition("/")
    if not prefix:
        return True
    restricted = any(prefix == ns or prefix.endswith("." + ns) for ns in ("kubernetes.io", "k8s.io"))
    if not restricted:
        return True
    return key in _KUBELET_LABELS or any(prefix == ns or prefix.endswith("." + ns) for ns in _KUBELET_NAMESPACES)


def node_labels(spec: NodeSpec) -> dict[str, str]:
    """Every label a topology node has on this backend right after ``gpulab up``.

    The same labels as the embedded backend's Node (pool, NFD's PCI label,
    the topology's own), plus what the GPU Operator's labeller adds before
    its operands run, plus the fake hardware description the daemons read.
    """
    labels = {nodes.POOL_LABEL: spec.pool, **nodes.hardware_labels(spec), **spec.labels}
    if spec.gpu_count and spec.gpu_model:
        labels[FAKE_MODEL_LABEL] = spec.gpu_model
        labels[FAKE_COUNT_LABEL] = str(spec.gpu_count)
        # The ClusterPolicy's driver.enabled is false (the nodes "come with" the
        # driver), so there is no gpu.deploy.driver label, as on the embedded backend.
        labels.update(gfd.operator_labels(spec.gpu_model, spec.gpu_count, existing=labels, driver_managed=False))
    return labels


def scheduler_config() -> str:
    """kube-scheduler's configuration file on this backend: the same profiles as the embedded backend's,
    kubeadm's kubeconfig, leader election on as kubeadm's flag has it anyway."""
    return schedulerconfig.render(SCHEDULER_KUBECONFIG, leader_elect=True)


def scheduler_patch() -> dict[str, Any]:
    """The kubeadm ``ClusterConfiguration`` patch that starts kube-scheduler with :func:`scheduler_config`.

    Versioned (``kubeadm.k8s.io/v1beta4``, what kind uses from Kubernetes 1.36 on), so ``extraArgs`` is
    v1beta4's list of name/value pairs; kind appends them to its own.
    """
    return {
        "apiVersion": "kubeadm.k8s.io/v1beta4",
        "kind": "ClusterConfiguration",
        "scheduler": {
            "extraArgs": [{"name": "config", "value": f"{SCHEDULER_NODE_DIR}/{SCHEDULER_CONFIG_NAME}"}],
            "extraVolumes": [{"name": "gpulab-scheduler", "hostPath": SCHEDULER_NODE_DIR,
                              "mountPath": SCHEDULER_NODE_DIR, "readOnly": True, "pathType": "Directory"}],
        },
    }


def render_config(topo: Topology, name: str = DEFAULT_NAME, node_image: str = NODE_IMAGE,
                  scheduler_dir: Path | None = None) -> dict[str, Any]:
    """The kind ``Cluster`` (v1alpha4) for a topology: one control plane, one worker per node.

    Labels the kubelet may not set itself are left out here; :func:`admin_labels`
    lists them for :meth:`KindCluster.up` to apply. ``scheduler_dir`` is the host's
    directory with :func:`scheduler_config` (:meth:`KindCluster.up` writes it; by
    default the one in ``paths.kind_dir()``), mounted into the control-plane node.
    """
    scheduler_dir = (scheduler_dir or paths.kind_dir() / SCHEDULER_DIR_NAME).absolute()
    workers = []
    for spec in topo.nodes:
        registration: dict[str, Any] = {"name": spec.name}
        if spec.taints:
            registration["taints"] = [t.to_api() for t in spec.taints]
        join = {"kind": "JoinConfiguration", "nodeRegistration": registration}
        workers.append({
            "role": "worker",
            "image": node_image,
            "labels": {k: v for k, v in node_labels(spec).items() if kubelet_may_set(k)},
            "kubeadmConfigPatches": [yaml.safe_dump(join, sort_keys=False)],
        })
    return {
        "kind": "Cluster",
        "apiVersion": "kind.x-k8s.io/v1alpha4",
        "name": name,
        "nodes": [{
            "role": "control-plane",
            "image": node_image,
            "extraMounts": [{"hostPath": str(scheduler_dir), "containerPath": SCHEDULER_NODE_DIR,
                             "readOnly": True}],
            "kubeadmConfigPatches": [yaml.safe_dump(scheduler_patch(), sort_keys=False)],
        }, *workers],
    }


def admin_labels(topo: Topology) -> dict[str, dict[str, str]]:
    """Node name -> the labels only an admin (or NFD) may set, applied after creation."""
    out = {}
    for spec in topo.nodes:
        rest = {k: v for k, v in node_labels(spec).items() if not kubelet_may_set(k)}
        if rest:
            out[spec.name] = rest
    return out


def config_yaml(topo: Topology, name: str = DEFAULT_NAME, node_image: str = NODE_IMAGE,
                scheduler_dir: Path | None = None) -> str:
    header = (f"# kind cluster for topology {topo.name!r}, generated by gpulab (gpulab/cluster/kind.py).\n"
              "# `gpulab up --backend kind` writes and uses this; labels that a kubelet may not set\n"
              "# on its own Node are applied after creation.\n")
    return header + yaml.dump(render_config(topo, name, node_image, scheduler_dir), Dumper=_BlockDumper,
                              sort_keys=False)


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (the kubeadm patches) as literal blocks, as people write them."""


_BlockDumper.add_representer(str, lambda d, s: d.represent_scalar(
    "tag:yaml.org,2002:str", s, style="|" if "\n" in s else None))


def manifests_dir() -> Path:
    return paths.manifests() / "kind"


def stack_manifests() -> list[Path]:
    """The files ``gpulab up --backend kind`` applies, in order.

    The GPU Operator's CRD and ClusterPolicy are the embedded backend's own
    files, so ``kubectl get/patch clusterpolicy`` read and change the same
    object on both backends; the operands are manifests/kind/.
    """
    operator = paths.manifests() / "gpu-operator"
    kind_files = sorted(manifests_dir().glob("[0-9]*.yaml"))
    return [kind_files[0], operator / "10-crd-clusterpolicies.yaml", *kind_files[1:],
            operator / "30-cluster-policy.yaml"]


def stack_documents(image: str = FAKEGPU_IMAGE) -> list[dict[str, Any]]:
    """The GPU stack's objects, with the fake GPU image that was loaded into the nodes."""
    docs: list[dict[str, Any]] = []
    for path in stack_manifests():
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            pod = doc.get("spec", {}).get("template", {}).get("spec", {})
            for c in (pod.get("initContainers") or []) + (pod.get("containers") or []):
                if c.get("image") == FAKEGPU_IMAGE:
                    c["image"] = image
            docs.append(doc)
    return docs


# --------------------------------------------------------------------------
# Tools


def docker() -> str:
    """The docker CLI, with a daemon that answers; else a KindError saying what to install or start."""
    exe = shutil.which("docker")
    if not exe:
        raise KindError(
            "the kind backend needs Docker, and `docker` is not on PATH. Install Docker Engine "
            "(https://docs.docker.com/engine/install/) or Docker Desktop, or use the default backend, "
            "which needs no Docker: `gpulab up --backend embedded`."
        )
    try:
        proc = subprocess.run([exe, "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True,
                              timeout=30)
    except subprocess.TimeoutExpired:
        raise KindError(f"`{exe} info` did not answer within 30 s: is the Docker daemon hung?") from None
    if proc.returncode != 0:
        detail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise KindError(
            f"the Docker daemon is not reachable ({detail}). Start it (`sudo systemctl start docker`, or "
            "open Docker Desktop) and make sure your user may use it (`docker info` must work), "
            "or use `gpulab up --backend embedded`."
        )
    return exe


def kind(progress: Say | None = None) -> str:
    """The kind binary: ``GPULAB_KIND`` or ``kind`` on PATH, else built once from the Go module proxy."""
    given = os.environ.get("GPULAB_KIND")
    if given:
        if not os.access(given, os.X_OK):
            raise KindError(f"GPULAB_KIND={given} is not an executable file; point it at a kind binary "
                            f"(kind {KIND_VERSION} is tested) or unset it")
        return given
    found = shutil.which("kind")
    if found:
        return found
    if not binaries.status_of(KIND_BUILD) and not shutil.which("go"):
        raise KindError(
            f"kind is not on PATH, and neither is Go, with which gpulab would build kind {KIND_VERSION} from "
            "the Go module proxy. Install kind (https://kind.sigs.k8s.io/docs/user/quick-start/#installation) "
            f"or Go >= {'.'.join(map(str, versions.GO_MIN))}, or set GPULAB_KIND to a kind binary.")
    try:
        binaries.ensure_build(KIND_BUILD, progress)
    except binaries.BinaryError as e:
        raise KindError(
            f"kind is not on PATH and could not be built from the Go module proxy:\n{e}\n"
            f"Install kind {KIND_VERSION} (https://kind.sigs.k8s.io/docs/user/quick-start/#installation) "
            "or set GPULAB_KIND to its path."
        ) from None
    return str(KIND_BUILD.bin_dir / "kind")


def _run(cmd: list[str], what: str, timeout: float = 900, input: str | None = None) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, input=input)
    except subprocess.TimeoutExpired:
        raise KindError(f"{what}: `{' '.join(cmd)}` did not finish within {timeout:.0f} s") from None
    if proc.returncode != 0:
        tail = "\n  ".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise KindError(f"{what} failed (`{' '.join(cmd)}`, exit {proc.returncode}):\n  {tail}")
    return proc.stdout


# --------------------------------------------------------------------------
# The backend


class KindCluster(StateDir):
    """A kind cluster named ``name``; its gpulab state (topology, kubeconfig) lives in ``root``."""

    backend = "kind"

    def __init__(self, root: Path | None = None, name: str | None = None):
        self.root = root or paths.kind_dir()
        self.name = name or self.state().get("name") or os.environ.get("GPULAB_KIND_CLUSTER") or DEFAULT_NAME
        # pki/ holds the cluster CA, copied out of the control-plane node at `up`:
        # grading signs its per-submission identities with it, as on the embedded backend.

    @property
    def config_file(self) -> Path:
        return self.root / "kind-config.yaml"

    @property
    def scheduler_dir(self) -> Path:
        """The host's directory the control-plane node mounts kube-scheduler's configuration from."""
        return self.root / SCHEDULER_DIR_NAME

    def clusters(self) -> list[str]:
        """Names of the kind clusters that exist on this Docker host."""
        out = _run([kind(), "get", "clusters"], "listing kind clusters", timeout=60)
        return [ln.strip() for ln in out.splitlines() if ln.strip() and not ln.startswith("No kind clusters")]

    def running(self) -> dict[str, int]:
        """Node containers that run, as ``{container name: 1}`` (no local pids on this backend)."""
        if shutil.which("docker") is None:
            return {}
        proc = subprocess.run(["docker", "ps", "--filter", f"label=io.x-k8s.kind.cluster={self.name}",
                               "--format", "{{.Names}}"], capture_output=True, text=True, timeout=30)
        return {n: 1 for n in proc.stdout.split()} if proc.returncode == 0 else {}

    def is_up(self) -> bool:
        return self.exists() and len(self.running()) == len(self.topology().nodes) + 1

    def status(self) -> dict[str, Any]:
        """What `gpulab status` shows on this backend: node containers, and each node's GPUs as its kubelet reports."""
        data: dict[str, Any] = {"backend": "kind", "name": self.name, "exists": self.exists(), "up": False,
                                "containers": sorted(self.running()), "nodes": []}
        if not self.exists():
            return data
        data["up"] = self.is_up()
        try:
            from ..kube import api  # the Kubernetes client loads only when the cluster is asked

            for node in api.Client(self.kubeconfig, timeout=10).list("Node"):
                st = node.get("status") or {}
                ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])
                data["nodes"].append({
                    "name": node["metadata"]["name"], "ready": ready,
                    "gpu_model": (node["metadata"].get("labels") or {}).get(FAKE_MODEL_LABEL),
                    "allocatable": {k: v for k, v in (st.get("allocatable") or {}).items() if k.startswith("nvidia.com/")},
                    "taints": [f"{t['key']}={t.get('value', '')}:{t['effect']}" for t in node["spec"].get("taints") or []],
                })
        except Exception as e:  # the API is down while containers are not: say so, do not crash
            data["error"] = f"cannot reach the apiserver: {e}"
            data["up"] = False
        return data

    @staticmethod
    def render_status(data: dict[str, Any]) -> str:
        if not data["exists"]:
            return f"no kind cluster created by gpulab yet: `gpulab up --backend kind` creates {data['name']!r}"
        lines = [f"backend kind, cluster {data['name']!r}: {'up' if data['up'] else 'NOT up'} "
                 f"({len(data['containers'])} node containers)"]
        if data.get("error"):
            lines.append(data["error"])
        for n in data["nodes"]:
            gpus = ", ".join(f"{k}={v}" for k, v in n["allocatable"].items()) or "-"
            lines.append(f"  {n['name']:<24} {'Ready' if n['ready'] else 'NotReady':<9} {n['gpu_model'] or '-':<12} "
                         f"{gpus}  {' '.join(n['taints'])}")
        return "\n".join(lines)

    # -- bring-up ------------------------------------------------------------

    def up(self, topology_path: str | Path | None = None, say: Say = _say, timeout: float = 300) -> str:
        """Create the cluster and install the fake GPU stack. Returns a one-line summary."""
        topo = load_topology(topology_path if topology_path is not None else self.state().get("topology"))
        stored = self.state().get("topology")
        if self.exists() and topology_path is not None and Path(stored).resolve() != topo.source.resolve():
            raise KindError(f"kind cluster {self.name!r} was created with topology {stored}; "
                            "`gpulab down --purge` deletes it, then `gpulab up --backend kind --topology FILE`")
        docker_exe = docker()
        kind_exe = kind(say)
        started = time.monotonic()
        existing = self.clusters()
        if self.name in existing and not self.exists():
            raise KindError(
                f"a kind cluster named {self.name!r} already exists and gpulab did not create it "
                f"(no {self.state_file}); nothing was changed. Delete it with `kind delete cluster --name "
                f"{self.name}` or pick another name with GPULAB_KIND_CLUSTER=<name>.")
        # The control-plane node mounts this directory; its kube-scheduler reads the file whenever it starts.
        atomic_write_text(self.scheduler_dir / SCHEDULER_CONFIG_NAME, scheduler_config())
        if self.name in existing:
            self._export_kubeconfig(kind_exe)
            self._install_stack(docker_exe, kind_exe, topo, say)
            return f"kind cluster {self.name!r} already exists ({len(topo.nodes)} nodes); kubeconfig: {paths.shown(self.kubeconfig)}"
        self.root.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(config_yaml(topo, self.name, scheduler_dir=self.scheduler_dir))
        say(f"creating kind cluster {self.name!r}: {len(topo.nodes)} workers from topology {topo.name!r} "
            f"({self.config_file})")
        _run([kind_exe, "create", "cluster", "--name", self.name, "--config", str(self.config_file),
              "--kubeconfig", str(self.kubeconfig), "--wait", f"{int(timeout)}s"], "kind create cluster",
             timeout=timeout + 600)
        self._save_state({"backend": "kind", "name": self.name, "topology": str(topo.source.resolve())})
        self._install_stack(docker_exe, kind_exe, topo, say)
        return (f"kind cluster {self.name!r} up in {time.monotonic() - started:.0f} s: {len(topo.nodes)} nodes "
                f"({len(topo.gpu_nodes)} with GPUs); kubeconfig: {paths.shown(self.kubeconfig)}")

    def _export_kubeconfig(self, kind_exe: str) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        _run([kind_exe, "export", "kubeconfig", "--name", self.name, "--kubeconfig", str(self.kubeconfig)],
             "kind export kubeconfig", timeout=60)

    def _install_stack(self, docker_exe: str, kind_exe: str, topo: Topology, say: Say) -> None:
        from ..kube import api  # the Kubernetes client loads only when the cluster is asked

        for image, dockerfile in IMAGES:
            say(f"building {image} from {dockerfile}")
            _run([docker_exe, "build", "-f", str(paths.repo_root() / dockerfile), "-t", image,
                  str(paths.repo_root())], f"docker build of {image}")
            say(f"loading {image} into the nodes")
            _run([kind_exe, "load", "docker-image", image, "--name", self.name], "kind load docker-image")
        self.pki.mkdir(parents=True, exist_ok=True)
        for f in ("ca.crt", "ca.key"):
            _run([docker_exe, "cp", f"{self.name}-control-plane:/etc/kubernetes/pki/{f}", str(self.pki / f)],
                 f"copying the cluster CA's {f}", timeout=60)
        (self.pki / "ca.key").chmod(0o600)
        client = api.Client(self.kubeconfig)
        # `kind create --wait` waits for the control plane only; workers register a little later.
        self._wait_nodes_ready(client, topo)
        for node, labels in admin_labels(topo).items():
            client.patch("Node", node, {"metadata": {"labels": labels}})
        for doc in stack_documents():
            if doc["kind"] == "ClusterPolicy":
                # Created once: the learner's later `kubectl patch clusterpolicy` is kept on re-runs.
                if client.get("ClusterPolicy", doc["metadata"]["name"]) is None:
                    client.create(doc)
                continue
            client.apply(doc, manager="gpulab-install")
            if doc["kind"] == "CustomResourceDefinition":
                client.wait_crd(doc["metadata"]["name"])
        say(f"applied {', '.join(p.name for p in stack_manifests())}; waiting for the GPU stack")
        self._wait_gpus(client, topo, say)

    def _wait_nodes_ready(self, client: Any, topo: Topology, timeout: float = 300) -> None:
        want = {n.name for n in topo.nodes}
        not_ready = want

        def all_ready() -> bool:
            nonlocal not_ready
            ready = {n["metadata"]["name"] for n in client.list("Node")
                     if any(c.get("type") == "Ready" and c.get("status") == "True"
                            for c in (n.get("status") or {}).get("conditions") or [])}
            not_ready = want - ready
            return not not_ready

        _poll.until(all_ready, timeout, lambda _: KindError(
            f"kind nodes not Ready after {timeout:.0f} s: {', '.join(sorted(not_ready))}; see "
            f"`docker logs {self.name}-worker` and `kind export logs --name {self.name}`"),
            interval=0.5, max_interval=2.0)

    def _wait_gpus(self, client: Any, topo: Topology, say: Say, timeout: float = 180) -> None:
        """Until every GPU node's kubelet reports the GPUs the topology gives it; a timeout is only reported."""
        missing: list[str] = []

        def all_reported() -> bool:
            missing.clear()
            for spec in topo.gpu_nodes:
                node = client.get("Node", spec.name) or {}
                have = ((node.get("status") or {}).get("allocatable") or {}).get("nvidia.com/gpu")
                if have != str(spec.gpu_count):
                    missing.append(f"{spec.name} ({have or 0}/{spec.gpu_count})")
            return not missing

        try:
            _poll.until(all_reported, timeout, lambda _: _TimedOut(), interval=0.5, max_interval=2.0)
        except _TimedOut:
            say(f"GPU nodes without their nvidia.com/gpu after {timeout:.0f} s: {', '.join(missing)}; see "
                f"`gpulab kubectl -n {NAMESPACE} get pods -o wide` and the device plugin's logs")
            return
        say(f"every GPU node's kubelet reports its nvidia.com/gpu ({len(topo.gpu_nodes)} nodes)")

    # -- stop / reset ---------------------------------------------------------

    def down(self, purge: bool = False, say: Say = _say) -> str:
        """Delete the kind cluster (a kind cluster cannot be stopped and resumed); ``purge`` also forgets it."""
        if not self.exists():
            return f"no kind cluster created by gpulab in {self.root}"
        _run([kind(say), "delete", "cluster", "--name", self.name], "kind delete cluster", timeout=300)
        if purge:
            shutil.rmtree(self.root, ignore_errors=True)
        else:
            self.state_file.unlink(missing_ok=True)
            self.kubeconfig.unlink(missing_ok=True)
        return f"kind cluster {self.name!r} deleted"

    def reset(self, topology_path: str | Path | None = None, say: Say = _say) -> str:
        """Back to the topology's initial state: the cluster is deleted and created again."""
        topo = topology_path if topology_path is not None else self.state().get("topology")
        self.down(say=say)
        return self.up(topo, say=say)
