"""The lesson: ``setup`` gets the kernel and the cluster ready, ``Lab.reset`` undoes what the lesson changed.

``setup`` makes the kernel behave like a terminal set up for the course:

- the working directory is the repository root, so ``manifests/...`` paths
  work in Python and in ``!kubectl`` cells alike;
- ``PATH`` starts with the virtualenv's ``bin`` (kubectl 1.37, ``gpulab``);
- ``LANGUAGE`` is ``zh_CN``, so ``gpulab`` speaks Chinese in the lesson, in ``sh("gpulab ...")`` and in the
  library's own lines alike (:mod:`gpulab.i18n`). Only messages move: ``LANGUAGE`` names the language of
  messages and nothing else (numbers, dates and encodings keep the locale they had), and kubectl does not
  read it, so its output stays as the chapter prints it;
- ``KUBECONFIG`` points at a copy of the cluster's kubeconfig whose context
  defaults to the lesson's namespace (``lesson-03``), so the chapter's
  commands run as printed, without ``-n``;
- the cluster is started if it is not running, and the lesson starts from a
  clean state: its namespace is deleted and created again, and the node
  labels and taints it declares are put back to the topology's values.

A stopped cluster is started, not merely reported: the cell a learner just ran
does what the lesson needs, without a trip to a terminal for ``gpulab up`` and
back (the first hour works from JupyterLab alone). Bring-up takes seconds
(BENCHMARKS.md) and says what it does, line by line, in Chinese; the first one
on a machine says that building the control plane may take minutes. When it
cannot start (no user namespaces, no ``nft``, ...), the cell fails with
``gpulab up``'s own explanation and what to run. A ``sh("kubectl ...")`` that
meets a cluster stopped later says what to run too (:mod:`gpulab.notebook.shell`).

``lab.reset()`` (or :func:`reset_lesson`) at the end of a notebook undoes the
same things, so notebooks run in any order. ``with setup(...) as lab:`` does
it on exit, for scripts. The way back itself is :mod:`gpulab.cluster.baseline`'s.

:func:`current` is the lesson ``setup`` made last: the other helpers of
:mod:`gpulab.notebook` read its namespace and API client.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from kubernetes.config import kube_config

from .. import i18n, paths
from ..cluster import baseline
from ..cluster.base import Cluster, ClusterError
from ..cluster.binaries import BinaryError
from ..kube import api
from ..kube.topology import TopologyError
from . import quantity
from .shell import FIRST_CELL, REPO
from .wait import wait_for

__all__ = ["Lab", "Changes", "setup", "reset_lesson", "current", "LESSON_LABEL", "GPU_PREFIX"]

GPU_PREFIX = "nvidia.com/"
LESSON_LABEL = "gpulab.io/lesson"

_lab: Lab | None = None


class Changes(list):
    """What :meth:`Lab.reset` returns: the lines it printed, not echoed again by a notebook."""

    def _ipython_display_(self) -> None:
        pass


def _say(msg: str) -> None:
    print(msg, flush=True)


class Lab:
    """One lesson's connection to the cluster and the state it promises to undo."""

    def __init__(self, lesson: str, namespace: str, cluster: Cluster, node_labels: Sequence[str],
                 node_taints: Sequence[str], extra_namespaces: Sequence[str] = (), gpu_stack: bool = False):
        self.lesson = lesson
        self.namespace = namespace
        self.cluster = cluster
        self.kube = api.Client(cluster.kubeconfig)
        self.node_labels = tuple(node_labels)
        self.node_taints = tuple(node_taints)
        self.extra_namespaces = tuple(extra_namespaces)
        self.gpu_stack = gpu_stack
        self.kubeconfig = paths.home() / "notebooks" / f"{lesson}.kubeconfig"
        self.started = time.time()  # usage reports default to "since this lesson began"

    def __repr__(self) -> str:
        return f"Lab({self.lesson!r}, namespace={self.namespace!r})"

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.reset()

    # -- the topology's view of the nodes ------------------------------------

    def topology(self) -> Any:
        return self.cluster.topology()

    # -- reset ------------------------------------------------------------------

    def reset(self, quiet: bool = False) -> Changes:
        """Delete the lesson's namespaces and put its node labels and taints back; return what changed."""
        done = Changes()
        for ns in (self.namespace, *self.extra_namespaces):
            if self._delete_namespace(ns):
                done.append(f"删除了命名空间 {ns}")
        done += self._restore_nodes()
        if getattr(self, "gpu_stack", False):
            done += self._restore_gpu_stack()
        if not quiet:
            for line in done or ["集群里没有需要还原的东西"]:
                _say(f"↩ {line}")
        return done

    def _delete_namespace(self, ns: str, timeout: float = 120) -> bool:
        if self.kube.get("Namespace", ns) is None:
            return False
        # Pods first, with a short grace period: a lesson's pods have nothing
        # to flush, and the next lesson should find the GPUs free at once.
        for pod in self.kube.list("Pod", ns):
            self.kube.delete("Pod", pod["metadata"]["name"], ns, grace_seconds=1)
        self.kube.delete("Namespace", ns)
        wait_for(lambda: self.kube.get("Namespace", ns) is None, timeout, what=f"命名空间 {ns} 删除完毕")
        return True

    def _restore_nodes(self) -> list[str]:
        """The lesson's node labels and taints as the topology has them (:func:`baseline.node_keys_back`)."""
        changes = baseline.node_keys_back(self.kube, baseline.topology_baseline(self.cluster),
                                          self.node_labels, self.node_taints)
        return [c.text() for c in changes]

    # -- the GPU stack -------------------------------------------------------------

    def _stack_objects(self) -> list[tuple[str, str, str]]:
        """(kind, name, namespace) of what the lesson's manifests create in other namespaces (gpu-operator)."""
        out = []
        for path in sorted((paths.manifests() / self.lesson).glob("*.y*ml")):
            for doc in yaml.safe_load_all(path.read_text()):
                md = (doc or {}).get("metadata") or {}
                ns = md.get("namespace")
                if ns and ns != self.namespace and doc.get("kind") in api.KINDS and md.get("name"):
                    out.append((doc["kind"], md["name"], ns))
        return out

    def _gpu_stack_target(self) -> dict[str, Any]:
        """The GPU stack as installed (:func:`baseline.installed_stack`), each GPU node with its topology's cards."""
        target = baseline.installed_stack(baseline.capture(self.kube))
        for spec in self.topology().gpu_nodes:
            if spec.name in target["nodes"]:
                target["nodes"][spec.name]["gpus"] = spec.gpu_count
        return target

    def _undo_gpu_stack(self) -> list[str]:
        """Clear faults, delete the lesson's objects in the operator's namespace, put the GPU stack back as installed.

        Only the writes (:func:`baseline.put_back`); :meth:`_restore_gpu_stack` also waits for the stack to settle.
        """
        gpu_nodes = [n.name for n in self.topology().gpu_nodes]
        done = [c.text() for c in baseline.put_faults_back(self.cluster.root, gpu_nodes)]
        for kind, name, ns in self._stack_objects():
            if self.kube.get(kind, name, ns) is not None:
                self.kube.delete(kind, name, ns)
                done.append(f"删除了 {ns}/{name}（{kind}）")
        done += [c.text() for c in baseline.put_back(self.kube, self._gpu_stack_target())]
        # Operand pods left crash-looping or stuck in validation (by a fault) start over at once.
        baseline.restart_stuck_operands(self.kube, only_crashed=False)
        return done

    def _restore_gpu_stack(self, timeout: float = 120) -> list[str]:
        """:meth:`_undo_gpu_stack`, then wait until the stack has settled (:func:`baseline.wait_settled`).

        Waited for even when nothing was undone here: whoever changed the stack last (another
        notebook, a grader) may have left it still rolling its operands out.
        """
        done = self._undo_gpu_stack()
        want = {n: t for n, t in self._gpu_stack_target()["nodes"].items() if "gpus" in t}
        baseline.wait_settled(self.kube, want, timeout, what="GPU 栈恢复为安装时的样子（整卡、ClusterPolicy ready）")
        return done

    # -- start ------------------------------------------------------------------

    def _create_namespace(self) -> None:
        self.kube.create({"apiVersion": "v1", "kind": "Namespace",
                          "metadata": {"name": self.namespace, "labels": {LESSON_LABEL: self.lesson}}})
        # The service-account controller creates "default"; pods cannot be created before it exists.
        wait_for(lambda: self.kube.get("ServiceAccount", "default", self.namespace), 60,
                 what=f"命名空间 {self.namespace} 的 default ServiceAccount")

    def _write_kubeconfig(self) -> None:
        doc = yaml.safe_load(self.cluster.kubeconfig.read_text())
        for ctx in doc.get("contexts") or []:
            ctx.setdefault("context", {})["namespace"] = self.namespace
        self.kubeconfig.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.kubeconfig.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(doc, f, sort_keys=False)
        os.replace(tmp, self.kubeconfig)

    def _wait_nodes(self, timeout: float) -> None:
        topo = self.topology()

        def ready() -> bool:
            by_name = {n["metadata"]["name"]: n for n in self.kube.list("Node")}
            for spec in topo.nodes:
                node = by_name.get(spec.name)
                if node is None:
                    return False
                conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions") or []}
                if conds.get("Ready") != "True":
                    return False
                if spec.gpu_count:
                    alloc = node.get("status", {}).get("allocatable") or {}
                    if not any(k.startswith(GPU_PREFIX) and quantity.parse(v) > 0 for k, v in alloc.items()):
                        return False
            return True

        wait_for(ready, timeout, what="所有节点 Ready，且 GPU 节点上报了 nvidia.com/* 资源")


def setup(lesson: str, *, namespace: str | None = None, node_labels: Sequence[str] = (),
          node_taints: Sequence[str] = (), extra_namespaces: Sequence[str] = (), topology: str | None = "default",
          gpu_stack: bool = False,
          start: bool = True, timeout: float = 180) -> Lab:
    """Get the kernel and the cluster ready for ``lesson`` (e.g. ``"03-scheduling"``); see the module docstring.

    ``namespace`` defaults to ``lesson-NN``. ``node_labels`` / ``node_taints``
    are the label keys and taint keys the lesson adds or changes on nodes;
    reset puts them back to the topology's values (absent, on the default
    topology). ``extra_namespaces`` are namespaces the lesson creates itself
    (one per team, say); reset deletes them too. ``topology`` is the topology
    the lesson's text was written for: another one only earns a warning.
    ``start=False`` fails instead of starting a stopped cluster. ``gpu_stack=True``: the lesson
    changes the GPU stack (faults, the ClusterPolicy, device-plugin ConfigMaps in ``gpu-operator``
    from its manifest folder, ``nvidia.com/device-plugin.config`` / ``nvidia.com/mig.config``);
    reset puts it back as ``gpulab up`` installed it and waits until the cards are whole again.
    What a killed ``gpulab grade``/``check`` left on the cluster (its journal: a fault, a taint, …)
    is put back first, and said, in zh-CN (:mod:`gpulab.grading.journal`).
    """
    global _lab
    from ..cluster import backend

    os.chdir(REPO)
    os.environ["LANGUAGE"] = i18n.CHINESE  # before the cluster is started: its lines are the lesson's too
    venv_bin = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "").split(os.pathsep)
    if not path or path[0] != venv_bin:
        os.environ["PATH"] = os.pathsep.join([venv_bin, *[p for p in path if p != venv_bin]])

    cluster = backend.current()  # the backend `gpulab up --backend` chose
    if not cluster.is_up():
        if not start:
            raise RuntimeError("集群没有在运行：在终端里执行 `gpulab up`（或 `make up`）后再运行本格。")
        first = not cluster.exists()
        _say("集群没有在运行，现在启动它" + ("（第一次启动若要编译控制面，需要几分钟）" if first else "") + "……")
        try:
            _say(cluster.up(say=lambda m: _say(f"  {m}")))
        except (ClusterError, BinaryError, TopologyError) as e:
            raise RuntimeError(f"集群没能启动：{e}\n按上面的说明处理之后，在终端里运行 `gpulab up` 确认集群能启动，"
                               "再重新运行本格。") from None
    lab = Lab(lesson, namespace or f"lesson-{lesson.split('-', 1)[0]}", cluster, node_labels, node_taints,
              extra_namespaces, gpu_stack)
    # Before the nodes are waited for: a killed grader may have left the GPUs unreported (a driver fault).
    _recover_graders(cluster, lab.kube)
    lab._wait_nodes(timeout)
    topo = lab.topology()
    if topology and topo.name != topology:
        _say(f"⚠ 本课按拓扑 {topology} 编写，当前集群是 {topo.name}：节点名和数字会与讲解不同。"
             f"`gpulab reset --topology manifests/topologies/{topology}.yaml` 可以切回（会清空集群里的对象）。")
    # Start from a clean slate, whatever an earlier (maybe interrupted) run left behind.
    leftovers = lab.reset(quiet=True)
    for line in leftovers:
        _say(f"↩ 清理上次留下的状态：{line}")
    lab._create_namespace()
    lab._write_kubeconfig()
    os.environ["KUBECONFIG"] = str(lab.kubeconfig)
    # The official client read $KUBECONFIG once, when it was first imported: point its default there
    # too, so a lesson's plain config.load_kube_config() reads the same file kubectl does.
    kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(lab.kubeconfig)
    _lab = lab
    backend.explain_client_errors(FIRST_CELL)
    gpus = sum(n.gpu_count for n in topo.nodes)
    _say(f"✓ 集群就绪：{len(topo.nodes)} 个节点（{len(topo.gpu_nodes)} 个 GPU 节点，共 {gpus} 张卡）；"
         f"kubectl 默认命名空间：{lab.namespace}")
    return lab


def _recover_graders(cluster: Cluster, kube: api.Client) -> None:
    """Put back what a killed ``gpulab grade``/``check`` left on the cluster (a fault, a taint …), saying what."""
    from ..grading import cluster as grading_cluster
    from ..grading import journal

    for line in journal.report(grading_cluster.recover(cluster, kube)):
        _say(line if line.startswith(" ") else f"⚠ {line}")


def reset_lesson(quiet: bool = False) -> Changes:
    """Undo what the current lesson changed (see :meth:`Lab.reset`)."""
    return current().reset(quiet=quiet)


def current() -> Lab:
    """The lesson :func:`setup` made last; a notebook that skipped its first cell is told to run it."""
    if _lab is None:
        raise RuntimeError("还没有调用 setup(...)：先运行本 notebook 的第一个代码格。")
    return _lab
