"""What the chapter notebooks call: one ``setup`` to get a lesson ready, and small helpers.

Every notebook's first code cell is::

    from gpulab.notebook import *
    lab = setup("03-scheduling",
                node_labels=["node-role.kubernetes.io/ai"],   # what this lesson changes on nodes
                node_taints=["nvidia.com/gpu"])

``setup`` makes the kernel behave like a terminal set up for the course:

- the working directory is the repository root, so ``manifests/...`` paths
  work in Python and in ``!kubectl`` cells alike;
- ``PATH`` starts with the virtualenv's ``bin`` (kubectl 1.37, ``gpulab``);
- ``KUBECONFIG`` points at a copy of the cluster's kubeconfig whose context
  defaults to the lesson's namespace (``lesson-03``), so the chapter's
  commands run as printed, without ``-n``;
- the cluster is started if it is not running, and the lesson starts from a
  clean state: its namespace is deleted and created again, and the node
  labels and taints it declares are put back to the topology's values.

``lab.reset()`` (or :func:`reset_lesson`) at the end of a notebook undoes the
same things, so notebooks run in any order. ``with setup(...) as lab:`` does
it on exit, for scripts.

Helpers, all usable after ``from gpulab.notebook import *``:

=====================  ==========================================================
``sh(cmd)``            run a shell command, print ``$ cmd`` and its output, return it
``apply(path)``        ``kubectl apply -f`` a manifest of the repository
``show_manifest(p)``   display a manifest file (lessons show YAML by reading it)
``wait_for(fn)``       poll until ``fn()`` is truthy; ``wait_pods``/``wait_job`` wrap it
``events(obj)``        the events of an object, oldest first, as a table
``endpoints(svc)``     a Service's endpoints and whether each is ready for traffic
``follow_logs(pod)``   keep a pod's log while it runs (a deleted pod's log is gone)
``pending_reason(p)``  the scheduler's message for a Pending pod
``pods()``/``placements()``  where the lesson's pods landed, and why not
``nodes()``            nodes with GPU model, allocatable and used GPUs, taints
``gpu_pods()``         pods that request GPUs (the chapter's ``jq`` listing)
``plot_allocation()``  nvidia.com/gpu per node: who holds which card count
``plot_card_memory()`` how model replicas fit in a card's memory, per sharing scheme
``plot_gpu_memory()``  what the pods on each physical GPU asked of its memory, and who failed
``watch_pods()``       record pod states over time; ``.plot()`` draws a timeline
``expect(ok, what)``   a lesson's self-check: prints ✅, or fails the cell with ❌
``show_quiz(s)``       the section's quiz (from :mod:`gpulab.quiz`)
=====================  ==========================================================

Tables are :class:`Table` objects: a list of dict rows that renders as HTML in
JupyterLab and as aligned text elsewhere (CJK characters count double).
"""

from __future__ import annotations

import functools
import html
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from . import _poll, paths
from .kube import api

__all__ = [
    # the lesson
    "setup", "reset_lesson", "Lab",
    # shell and manifests
    "sh", "have", "apply", "delete", "show_manifest", "Output", "CommandFailed",
    # waiting and reading the cluster
    "wait_for", "wait_pods", "wait_job", "pods", "pod_status", "pod_gpus", "pending_reason", "placements", "nodes",
    "gpu_pods", "gpu_allocation", "events", "endpoints", "follow_logs", "LogFollower",
    # showing
    "Table", "plot_allocation", "plot_card_memory", "plot_gpu_memory", "watch_pods", "Timeline",
    # checking
    "expect", "show_quiz", "Changes", "GPU", "REPO",
    # monitoring and cost
    "dcgm_metrics", "custom_metrics", "watch_hpa", "HpaTimeline", "usage_report", "UsageReport", "wait_usage_sample",
]

REPO = paths.repo_root()
GPU = "nvidia.com/gpu"
GPU_PREFIX = "nvidia.com/"
LESSON_LABEL = "gpulab.io/lesson"

_lab: Lab | None = None


class Output(str):
    """What :func:`sh` returns: the command's output as a ``str``, which a notebook does not echo a second time."""

    def _ipython_display_(self) -> None:  # already printed while the command ran
        pass


class Changes(list):
    """What :meth:`Lab.reset` returns: the lines it printed, not echoed again by a notebook."""

    def _ipython_display_(self) -> None:
        pass


class CommandFailed(RuntimeError):
    """Raised by :func:`sh` when a command exits non-zero and ``check`` is true."""

    def __init__(self, cmd: str, returncode: int, output: str):
        self.cmd, self.returncode, self.output = cmd, returncode, output
        super().__init__(f"命令失败（退出码 {returncode}）：{cmd}")


# --------------------------------------------------------------------------- shell


def have(program: str) -> bool:
    """Whether ``program`` is on PATH (e.g. ``have("jq")``)."""
    return shutil.which(program) is not None


def sh(cmd: str, check: bool = True, timeout: float = 120, echo: bool = True, quiet: bool = False,
       tail: int | None = None) -> Output:
    """Run ``cmd`` with bash, as a terminal would, and return its output (stdout and stderr together).

    Prints ``$ cmd`` and then the output line by line while it runs (``quiet``
    prints nothing; ``tail=N`` prints only the last N lines, once the command
    has ended — for chatty commands such as ``kubectl rollout status``; the
    whole output is still returned). A non-zero exit raises :class:`CommandFailed` unless
    ``check=False`` — so a lesson cell cannot fail silently, as a failing
    ``!cmd`` would. Pipes behave as in a terminal: the exit status is the last
    command's (``... | grep x`` is 1 when nothing matched).
    """
    if echo and not quiet:
        print(f"$ {cmd}", flush=True)
    proc = subprocess.Popen(["bash", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, errors="replace", cwd=REPO,
                            start_new_session=True)
    timed_out = threading.Event()

    def kill() -> None:
        timed_out.set()
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass

    timer = threading.Timer(timeout, kill)
    timer.start()
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if not quiet and tail is None:
                print(line, end="", flush=True)
        proc.wait()
    finally:
        timer.cancel()
    out = "".join(lines)
    if tail is not None and not quiet:
        print("".join(lines[-tail:]), end="", flush=True)
    if timed_out.is_set():
        raise TimeoutError(f"命令 {timeout:g} 秒还没结束，已终止：{cmd}")
    if check and proc.returncode != 0:
        raise CommandFailed(cmd, proc.returncode, out)
    return Output(out)


def _manifest(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    full = p if p.is_absolute() else REPO / p
    if not full.is_file():
        raise FileNotFoundError(f"找不到清单文件 {path}（路径相对于仓库根目录 {REPO}）")
    return full


def _rel(full: Path) -> str:
    try:
        return str(full.relative_to(REPO))
    except ValueError:
        return str(full)


def apply(path: str | os.PathLike[str], *more: str | os.PathLike[str]) -> Output:
    """``kubectl apply -f`` one or more manifest files (paths relative to the repository)."""
    files = " ".join(f"-f {_rel(_manifest(p))}" for p in (path, *more))
    return sh(f"kubectl apply {files}")


def delete(path: str | os.PathLike[str], wait: bool = True) -> Output:
    """``kubectl delete -f`` a manifest file; waits until the objects are gone unless ``wait=False``."""
    return sh(f"kubectl delete -f {_rel(_manifest(path))} --ignore-not-found --wait={'true' if wait else 'false'}")


def show_manifest(path: str | os.PathLike[str]) -> None:
    """Display a manifest file, with its path, as a YAML block."""
    full = _manifest(path)
    text = full.read_text()
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display
    except ImportError:  # pragma: no cover
        get_ipython = None  # type: ignore[assignment]
    if get_ipython is not None and get_ipython() is not None:
        display(Markdown(f"`{_rel(full)}`\n\n```yaml\n{text.rstrip()}\n```"))
    else:
        print(f"# {_rel(full)}\n{text}")


# --------------------------------------------------------------------------- tables


def _width(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1 for ch in text)


class Table(list):
    """Rows (dicts) with an ordered set of columns; HTML in notebooks, aligned text elsewhere."""

    def __init__(self, rows: Iterable[dict[str, Any]] = (), columns: Sequence[str] | None = None,
                 title: str = ""):
        super().__init__(rows)
        if columns is None:
            columns = list(dict.fromkeys(k for r in self for k in r))
        self.columns = list(columns)
        self.title = title

    def column(self, name: str) -> list[Any]:
        return [r.get(name) for r in self]

    @staticmethod
    def _cell(v: Any) -> str:
        if v is None or v == "":
            return "-"
        if isinstance(v, (list, tuple)):
            return ", ".join(map(str, v)) or "-"
        return str(v)

    def __str__(self) -> str:
        cells = [[self._cell(r.get(c)) for c in self.columns] for r in self]
        widths = [max([_width(c)] + [_width(row[i]) for row in cells]) for i, c in enumerate(self.columns)]

        def line(values: Sequence[str]) -> str:
            return "   ".join(v + " " * (w - _width(v)) for v, w in zip(values, widths)).rstrip()

        out = [self.title] if self.title else []
        out.append(line(self.columns))
        out += [line(row) for row in cells]
        if not self:
            out.append("(无)")
        return "\n".join(out)

    def __repr__(self) -> str:
        return str(self)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    def _repr_html_(self) -> str:
        head = "".join(f'<th style="text-align:left">{html.escape(c)}</th>' for c in self.columns)
        body = "".join(
            "<tr>" + "".join(f'<td style="text-align:left">{html.escape(self._cell(r.get(c)))}</td>'
                             for c in self.columns) + "</tr>" for r in self)
        if not self:
            body = f'<tr><td colspan="{len(self.columns)}">(无)</td></tr>'
        caption = f"<caption style='text-align:left'><b>{html.escape(self.title)}</b></caption>" if self.title else ""
        return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


# --------------------------------------------------------------------------- the lesson


def _say(msg: str) -> None:
    print(msg, flush=True)


class Lab:
    """One lesson's connection to the cluster and the state it promises to undo."""

    def __init__(self, lesson: str, namespace: str, cluster: Any, node_labels: Sequence[str],
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
        if not self.node_labels and not self.node_taints:
            return []
        done = []
        topo = self.topology()
        for spec in topo.nodes:
            node = self.kube.get("Node", spec.name)
            if node is None:
                continue
            labels = node["metadata"].get("labels") or {}
            label_patch: dict[str, str | None] = {}
            for key in self.node_labels:
                want = spec.labels.get(key)
                if labels.get(key) != want:
                    label_patch[key] = want
                    done.append(f"{spec.name}：标签 {key} " + (f"恢复为 {want}" if want is not None else "已去掉"))
            taints = node.get("spec", {}).get("taints") or []
            keep = [t for t in taints if t.get("key") not in self.node_taints]
            want_taints = keep + [t.to_api() for t in spec.taints if t.key in self.node_taints]
            patch: dict[str, Any] = {}
            if label_patch:
                patch["metadata"] = {"labels": label_patch}
            if _taint_set(want_taints) != _taint_set(taints):
                patch["spec"] = {"taints": want_taints or None}
                for t in taints:
                    if t.get("key") in self.node_taints and t not in want_taints:
                        done.append(f"{spec.name}：污点 {_taint_str(t)} 已去掉")
            if patch:
                self.kube.patch("Node", spec.name, patch)
        return done

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

    def _undo_gpu_stack(self) -> list[str]:
        """Clear faults, delete the lesson's device-plugin configs, put ClusterPolicy and GPU node labels back."""
        from .fakegpu import faults, operator
        from .fakegpu.config import CONFIG_LABEL
        from .fakegpu.gfd import MIG_CONFIG_LABEL, MIG_CONFIG_STATE_LABEL
        from .grading import gpustack

        done = []
        gpu_nodes = [n.name for n in self.topology().gpu_nodes]
        cleared = faults.clear(self.cluster.root, gpu_nodes)
        for node in sorted({n for n, _ in cleared}):
            faults.wait_applied(self.cluster.root, node)
        done += [f"{n}：清除了故障 {f.describe()}" for n, f in cleared]
        for kind, name, ns in self._stack_objects():
            if self.kube.get(kind, name, ns) is not None:
                self.kube.delete(kind, name, ns)
                done.append(f"删除了 {ns}/{name}（{kind}）")
        installed = yaml.safe_load((operator.manifests_dir() / "30-cluster-policy.yaml").read_text())["spec"]
        # A merge patch: a GET-then-PUT races the operator's status writes (Conflict).
        if gpustack.put_policy_spec(self.kube, installed):
            done.append(f"ClusterPolicy {operator.POLICY_NAME} 恢复为安装时的配置")
        mig_default = str(((installed.get("migManager") or {}).get("config") or {}).get("default") or "all-disabled")
        for name in gpu_nodes:
            labels = ((self.kube.get("Node", name) or {}).get("metadata") or {}).get("labels") or {}
            patch: dict[str, str | None] = {}
            if CONFIG_LABEL in labels:
                patch[CONFIG_LABEL] = None
                done.append(f"{name}：标签 {CONFIG_LABEL} 已去掉")
            if labels.get(MIG_CONFIG_LABEL) not in (None, mig_default):
                patch.update({MIG_CONFIG_LABEL: mig_default, MIG_CONFIG_STATE_LABEL: None})
                done.append(f"{name}：标签 {MIG_CONFIG_LABEL} 恢复为 {mig_default}")
            if patch:
                self.kube.patch("Node", name, {"metadata": {"labels": patch}})
        # Operand pods left crash-looping or stuck in validation (by a fault) start over at once,
        # as `kubectl delete pod` would make them; the others are left alone.
        for pod in self.kube.list("Pod", operator.NAMESPACE):
            ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in (pod.get("status") or {}).get("conditions") or [])
            owners = {o.get("kind") for o in pod["metadata"].get("ownerReferences") or []}
            done_ok = pod.get("status", {}).get("phase") == "Succeeded"
            if not ready and not done_ok and owners & {"DaemonSet", "ClusterPolicy"}:
                self.kube.delete("Pod", pod["metadata"]["name"], operator.NAMESPACE, grace_seconds=0)
        return done

    def _restore_gpu_stack(self, timeout: float = 120) -> list[str]:
        """:meth:`_undo_gpu_stack`, then wait until the GPU nodes report whole cards again and the stack is ready."""
        from .fakegpu import operator
        from .fakegpu.gfd import MIG_CONFIG_STATE_LABEL
        from .fakegpu.mig import PAUSED_FOR_MIG_CHANGE

        done = self._undo_gpu_stack()
        want = {n.name: str(n.gpu_count) for n in self.topology().gpu_nodes}

        def settled() -> bool:
            for name, count in want.items():
                node = self.kube.get("Node", name) or {}
                labels = node.get("metadata", {}).get("labels") or {}
                alloc = node.get("status", {}).get("allocatable") or {}
                if alloc.get(GPU) != count or labels.get(MIG_CONFIG_STATE_LABEL, "success") != "success":
                    return False
                if any(k.startswith("nvidia.com/mig-") and _qty(v) > 0 for k, v in alloc.items()):
                    return False
                if PAUSED_FOR_MIG_CHANGE in labels.values():  # the MIG manager has operands stopped
                    return False
            return operator.stack_ready(self.kube) is None

        # Right after a MIG change the DaemonSet controller brings paused operands back a moment
        # after the node's labels say so; the stack must stay ready for a few seconds to count.
        settled_since: float | None = None

        def settled_for_a_while() -> bool:
            nonlocal settled_since
            if not settled():
                settled_since = None
                return False
            if settled_since is None:
                settled_since = time.monotonic()
            return time.monotonic() - settled_since >= 3.0

        # Waited for even when nothing was undone here: whoever changed the stack last (another
        # notebook, a grader) may have left it still rolling its operands out.
        wait_for(settled_for_a_while, timeout, interval=0.5,
                 what="GPU 栈恢复为安装时的样子（整卡、ClusterPolicy ready）")
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
                    if not any(k.startswith(GPU_PREFIX) and _qty(v) > 0 for k, v in alloc.items()):
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
    from .cluster import backend

    os.chdir(REPO)
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
        _say(cluster.up(say=lambda m: _say(f"  {m}")))
    lab = Lab(lesson, namespace or f"lesson-{lesson.split('-', 1)[0]}", cluster, node_labels, node_taints,
              extra_namespaces, gpu_stack)
    # Before the nodes are waited for: a killed grader may have left the GPUs unreported (a driver fault).
    _recover_graders(cluster, lab.kube)
    lab._wait_nodes(timeout)
    topo = lab.topology()
    if topology and topo.name != topology:
        _say(f"⚠️ 本课按拓扑 {topology} 编写，当前集群是 {topo.name}：节点名和数字会与讲解不同。"
             f"`gpulab reset --topology manifests/topologies/{topology}.yaml` 可以切回（会清空集群里的对象）。")
    # Start from a clean slate, whatever an earlier (maybe interrupted) run left behind.
    leftovers = lab.reset(quiet=True)
    for line in leftovers:
        _say(f"↩ 清理上次留下的状态：{line}")
    lab._create_namespace()
    lab._write_kubeconfig()
    os.environ["KUBECONFIG"] = str(lab.kubeconfig)
    _lab = lab
    gpus = sum(n.gpu_count for n in topo.nodes)
    _say(f"✅ 集群就绪：{len(topo.nodes)} 个节点（{len(topo.gpu_nodes)} 个 GPU 节点，共 {gpus} 张卡）；"
         f"kubectl 默认命名空间：{lab.namespace}")
    return lab


def _recover_graders(cluster: Any, kube: api.Client) -> None:
    """Put back what a killed ``gpulab grade``/``check`` left on the cluster (a fault, a taint …), saying what."""
    from .grading import cluster as grading_cluster
    from .grading import journal

    for line in journal.report(grading_cluster.recover(cluster, kube), lang="zh"):
        _say(line if line.startswith(" ") else f"⚠️ {line}")


def reset_lesson(quiet: bool = False) -> Changes:
    """Undo what the current lesson changed (see :meth:`Lab.reset`)."""
    return _current().reset(quiet=quiet)


def _current() -> Lab:
    if _lab is None:
        raise RuntimeError("还没有调用 setup(...)：先运行本 notebook 的第一个代码格。")
    return _lab


# --------------------------------------------------------------------------- waiting


def wait_for(fn: Callable[[], Any], timeout: float = 60, interval: float = 0.25, what: str = "条件满足") -> Any:
    """Call ``fn`` until it returns something truthy and return that; raise ``TimeoutError`` after ``timeout`` s."""
    return _poll.until(fn, timeout, lambda _: TimeoutError(f"等了 {timeout:g} 秒仍未等到：{what}"), interval)


def wait_pods(selector: str | None = None, condition: str | Callable[[dict[str, Any]], bool] = "Running",
              count: int = 1, namespace: str | None = None, timeout: float = 60) -> list[dict[str, Any]]:
    """Wait until at least ``count`` pods match ``selector`` and ``condition``; return them.

    ``condition`` is a phase (``"Running"``, ``"Succeeded"``, ``"Failed"``),
    ``"Ready"``, ``"Scheduled"``, ``"Unschedulable"`` (the scheduler has said
    why not), ``"Terminated"`` (Succeeded or Failed), or a predicate on the pod.
    """
    test = condition if callable(condition) else _POD_TESTS.get(condition) or (
        lambda p, c=condition: p.get("status", {}).get("phase") == c)

    def ready() -> list[dict[str, Any]] | None:
        hits = [p for p in pods(selector, namespace) if test(p)]
        return hits if len(hits) >= count else None

    what = f"{count} 个{'满足条件的' if callable(condition) else ' ' + condition + ' 的'} Pod" + (
        f"（{selector}）" if selector else "")
    return wait_for(ready, timeout, what=what)


def _condition(pod: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for c in pod.get("status", {}).get("conditions") or []:
        if c.get("type") == type_:
            return c
    return None


def _unschedulable(pod: dict[str, Any]) -> bool:
    c = _condition(pod, "PodScheduled")
    return bool(c and c.get("status") == "False" and c.get("reason") == "Unschedulable")


_POD_TESTS: dict[str, Callable[[dict[str, Any]], bool]] = {
    "Ready": lambda p: (_condition(p, "Ready") or {}).get("status") == "True",
    "Scheduled": lambda p: bool(p.get("spec", {}).get("nodeName")),
    "Unschedulable": _unschedulable,
    "Terminated": lambda p: p.get("status", {}).get("phase") in ("Succeeded", "Failed"),
}


def wait_job(name: str, namespace: str | None = None, timeout: float = 120) -> dict[str, Any]:
    """Wait until Job ``name`` is Complete or Failed; return its terminal condition (type, reason, message)."""
    ns = namespace or _current().namespace

    def finished() -> dict[str, Any] | None:
        job = _current().kube.get("Job", name, ns) or {}
        for c in job.get("status", {}).get("conditions") or []:
            if c.get("type") in ("Complete", "Failed") and c.get("status") == "True":
                return c
        return None

    return wait_for(finished, timeout, what=f"Job {name} 结束（Complete 或 Failed）")


# --------------------------------------------------------------------------- reading the cluster


def _qty(v: Any) -> float:
    from kubernetes.utils import parse_quantity

    try:
        return float(parse_quantity(v))
    except (ValueError, TypeError):
        return 0.0


def pod_gpus(pod: dict[str, Any], resource: str = GPU) -> int:
    """GPUs a pod holds as the scheduler counts them: max(sum over containers, any one init container)."""
    spec = pod.get("spec") or {}

    def one(c: dict[str, Any]) -> int:
        res = c.get("resources") or {}
        return int(_qty((res.get("limits") or {}).get(resource) or (res.get("requests") or {}).get(resource) or 0))

    regular = sum(one(c) for c in spec.get("containers") or [])
    init = max([one(c) for c in spec.get("initContainers") or []] or [0])
    return max(regular, init)


def _terminal(pod: dict[str, Any]) -> bool:
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed")


def pods(selector: str | None = None, namespace: str | None = None) -> list[dict[str, Any]]:
    """Pods of the lesson's namespace (or ``namespace``; ``"*"`` for all), oldest first, as API dicts."""
    ns = None if namespace == "*" else (namespace or _current().namespace)
    items = _current().kube.list("Pod", ns, label_selector=selector)
    return sorted(items, key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]))


def pod_status(pod: dict[str, Any]) -> str:
    """The STATUS column of ``kubectl get pods`` (Pending, ContainerCreating, Running, CrashLoopBackOff, …)."""
    md, st = pod["metadata"], pod.get("status") or {}
    if md.get("deletionTimestamp"):
        return "Terminating"
    reason = st.get("reason")
    if reason and st.get("phase") in ("Failed", "Succeeded"):
        return reason
    # kubectl's printer: the first init container that has not succeeded says
    # why (a waiting reason, a failure), else how far initialisation got.
    total = len(pod.get("spec", {}).get("initContainers") or [])
    for i, cs in enumerate(st.get("initContainerStatuses") or []):
        state = cs.get("state") or {}
        term = state.get("terminated")
        if term is not None and term.get("exitCode", 0) == 0:
            continue
        if term is not None:
            if term.get("reason"):
                return f"Init:{term['reason']}"
            return f"Init:Signal:{term['signal']}" if term.get("signal") else f"Init:ExitCode:{term.get('exitCode')}"
        reason = (state.get("waiting") or {}).get("reason")
        if reason and reason != "PodInitializing":
            return f"Init:{reason}"
        return f"Init:{i}/{total}"
    status = st.get("phase") or "Pending"
    for cs in st.get("containerStatuses") or []:
        state = cs.get("state") or {}
        if "waiting" in state and state["waiting"].get("reason"):
            status = state["waiting"]["reason"]
        elif "terminated" in state:
            term = state["terminated"]
            status = term.get("reason") or (f"Signal:{term['signal']}" if term.get("signal")
                                            else f"ExitCode:{term.get('exitCode')}")
    return status


def pending_reason(pod: str | dict[str, Any], namespace: str | None = None, timeout: float = 30) -> str:
    """The scheduler's message for a pod it could not place (waits up to ``timeout`` s for the verdict)."""
    name = pod if isinstance(pod, str) else pod["metadata"]["name"]
    ns = namespace or (pod.get("metadata", {}).get("namespace") if isinstance(pod, dict) else None) \
        or _current().namespace

    def verdict() -> str | None:
        p = _current().kube.get("Pod", name, ns)
        if p is None:
            return None
        c = _condition(p, "PodScheduled")
        if c and c.get("status") == "False" and c.get("message"):
            return c["message"]
        return None

    return wait_for(verdict, timeout, what=f"调度器对 Pod {name} 给出不可调度的原因")


def _reason(pod: dict[str, Any]) -> str:
    c = _condition(pod, "PodScheduled")
    if c and c.get("status") == "False":
        return c.get("message") or c.get("reason") or ""
    return ""


def placements(selector: str | None = None, namespace: str | None = None) -> Table:
    """Where each pod landed (NODE), its STATUS, GPUs, and the scheduler's message if it did not land."""
    rows = [{"POD": p["metadata"]["name"], "NODE": p.get("spec", {}).get("nodeName"),
             "STATUS": pod_status(p), "GPUS": pod_gpus(p) or None, "WHY NOT SCHEDULED": _reason(p)}
            for p in pods(selector, namespace)]
    return Table(rows, ["POD", "NODE", "STATUS", "GPUS", "WHY NOT SCHEDULED"])


def _taint_str(t: dict[str, Any]) -> str:
    return f"{t.get('key')}" + (f"={t['value']}" if t.get("value") else "") + f":{t.get('effect')}"


def _taint_set(taints: Iterable[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(t.get("key", ""), t.get("value", "") or "", t.get("effect", "")) for t in taints}


def gpu_allocation() -> dict[str, dict[str, Any]]:
    """Per node reporting GPUs: allocatable count and the pods holding them, as the scheduler counts.

    A pod holds its GPUs from the moment it is bound to a node until it
    reaches Succeeded or Failed (or is gone), whatever its namespace.
    """
    out: dict[str, dict[str, Any]] = {}
    kube = _current().kube
    for node in sorted(kube.list("Node"), key=lambda n: n["metadata"]["name"]):
        alloc = int(_qty((node.get("status", {}).get("allocatable") or {}).get(GPU, 0)))
        if alloc:
            out[node["metadata"]["name"]] = {"allocatable": alloc, "pods": [], "used": 0}
    for p in kube.list("Pod"):
        node = p.get("spec", {}).get("nodeName")
        n = pod_gpus(p)
        if node in out and n and not _terminal(p):
            out[node]["pods"].append((f"{p['metadata']['namespace']}/{p['metadata']['name']}", n))
            out[node]["used"] += n
    for entry in out.values():
        entry["pods"].sort()
    return out


def nodes(labels: Sequence[str] = ()) -> Table:
    """Every node: GPU model, allocatable and used nvidia.com/gpu, taints, and the label columns asked for."""
    alloc = gpu_allocation()
    rows = []
    for node in sorted(_current().kube.list("Node"), key=lambda n: n["metadata"]["name"]):
        name = node["metadata"]["name"]
        node_labels = node["metadata"].get("labels") or {}
        row = {"NODE": name, "GPU MODEL": node_labels.get("nvidia.com/gpu.product"),
               "ALLOCATABLE GPU": alloc.get(name, {}).get("allocatable", 0),
               "GPU IN USE": alloc.get(name, {}).get("used", 0),
               "TAINTS": [_taint_str(t) for t in node.get("spec", {}).get("taints") or []]}
        for key in labels:
            row[key] = node_labels.get(key)
        rows.append(row)
    return Table(rows, ["NODE", "GPU MODEL", "ALLOCATABLE GPU", "GPU IN USE", *labels, "TAINTS"])


def gpu_pods(all_namespaces: bool = True) -> Table:
    """Pods whose containers have a ``nvidia.com/gpu`` limit — the chapter's ``jq`` filter, in Python.

    Same selection as ``kubectl get pods -A -o json | jq -r '.items[] |
    select([.spec.containers[].resources.limits["nvidia.com/gpu"]] | any) |
    "\\(.metadata.namespace)/\\(.metadata.name)"'``: every such pod, whatever
    its phase. The table adds NODE, GPUS and STATUS; ``row["POD"]`` is the
    ``namespace/name`` line jq prints.
    """
    rows = []
    for p in pods(namespace="*" if all_namespaces else None):
        if any(((c.get("resources") or {}).get("limits") or {}).get(GPU) for c in p["spec"].get("containers") or []):
            rows.append({"POD": f"{p['metadata']['namespace']}/{p['metadata']['name']}",
                         "NODE": p["spec"].get("nodeName"), "GPUS": pod_gpus(p), "STATUS": pod_status(p)})
    rows.sort(key=lambda r: r["POD"])
    return Table(rows, ["POD", "NODE", "GPUS", "STATUS"])


api.register_kind("EndpointSlice", "/apis/discovery.k8s.io/v1", "endpointslices", True)


def endpoints(service: str, namespace: str | None = None) -> Table:
    """The endpoints of a Service, from its EndpointSlices: POD, ADDRESS, READY, SERVING, TERMINATING.

    Only a READY endpoint receives traffic through the Service; a pod whose
    readiness probe has not passed is listed with READY false.
    """
    ns = namespace or _current().namespace
    rows = []
    for eps in _current().kube.list("EndpointSlice", ns, label_selector=f"kubernetes.io/service-name={service}"):
        for ep in eps.get("endpoints") or []:
            cond = ep.get("conditions") or {}
            rows.append({"POD": (ep.get("targetRef") or {}).get("name"), "ADDRESS": ", ".join(ep.get("addresses") or []),
                         "READY": bool(cond.get("ready")), "SERVING": bool(cond.get("serving")),
                         "TERMINATING": bool(cond.get("terminating"))})
    rows.sort(key=lambda r: r["POD"] or "")
    return Table(rows, ["POD", "ADDRESS", "READY", "SERVING", "TERMINATING"], title=f"service/{service} 的端点")


def events(obj: str | dict[str, Any], namespace: str | None = None) -> Table:
    """Events about ``obj`` (``"pod/NAME"``, ``"job/NAME"``, a bare pod name, or an API dict), oldest first.

    Like ``kubectl events --for KIND/NAME`` without the age column: TYPE,
    REASON, FROM, COUNT, MESSAGE.
    """
    if isinstance(obj, dict):
        kind, name = obj.get("kind", "Pod"), obj["metadata"]["name"]  # list items carry no kind
        ns = namespace or obj["metadata"].get("namespace")
    else:
        kind, _, name = obj.rpartition("/")
        kind = {"": "Pod", "pod": "Pod", "po": "Pod", "job": "Job", "deployment": "Deployment", "deploy": "Deployment",
                "replicaset": "ReplicaSet", "rs": "ReplicaSet", "node": "Node", "service": "Service",
                "pvc": "PersistentVolumeClaim", "persistentvolumeclaim": "PersistentVolumeClaim"}.get(kind.lower(), kind)
        ns = namespace
    if kind == "Node":
        ns = "default"
    ns = ns or _current().namespace
    items = _current().kube.list("Event", ns, field_selector=f"involvedObject.name={name}")
    items = [e for e in items if e.get("involvedObject", {}).get("kind") == kind]

    def when(e: dict[str, Any]) -> tuple[str, int]:
        series = (e.get("series") or {}).get("lastObservedTime")
        t = series or e.get("lastTimestamp") or e.get("eventTime") or e["metadata"].get("creationTimestamp") or ""
        return (t[:19], int(e["metadata"].get("resourceVersion") or 0))

    rows = []
    for e in sorted(items, key=when):
        source = e.get("reportingComponent") or (e.get("source") or {}).get("component") or ""
        count = (e.get("series") or {}).get("count") or e.get("count") or 1
        rows.append({"TYPE": e.get("type"), "REASON": e.get("reason"), "FROM": source, "COUNT": count,
                     "MESSAGE": e.get("message", "")})
    return Table(rows, ["TYPE", "REASON", "FROM", "COUNT", "MESSAGE"], title=f"{kind.lower()}/{name} 的事件")


class LogFollower:
    """``kubectl logs -f`` on a background thread, made by :func:`follow_logs`.

    A deleted pod takes its logs with it — ``kubectl logs`` cannot read a pod
    that no longer exists — so a lesson that is about to delete a pod follows
    its log first, as a log collector would. ``stop()`` ends following and
    returns everything read.
    """

    def __init__(self, pod: str, container: str | None, namespace: str | None):
        argv = ["kubectl", "logs", "-f", pod, "-n", namespace or _current().namespace]
        if container:
            argv += ["-c", container]
        self.pod = pod
        self._lines: list[str] = []
        self._proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      errors="replace", stdin=subprocess.DEVNULL, cwd=REPO)
        self._thread = threading.Thread(target=self._read, daemon=True, name=f"gpulab-logs-{pod}")
        self._thread.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.append(line)

    @property
    def text(self) -> str:
        return "".join(self._lines)

    def stop(self, linger: float = 0.5) -> Output:
        """Stop following (after ``linger`` s, for the last lines to arrive); return the log read."""
        time.sleep(linger)
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._thread.join(timeout=2)
        return Output(self.text)


def follow_logs(pod: str, container: str | None = None, namespace: str | None = None) -> LogFollower:
    """Start following a pod's log (``kubectl logs -f``); see :class:`LogFollower`."""
    return LogFollower(pod, container, namespace)


# --------------------------------------------------------------------------- checks and quizzes


def expect(ok: Any, what: str, hint: str = "") -> None:
    """A lesson's self-check: print ``✅ what`` when ``ok`` is truthy, else fail the cell with ``❌ what``.

    The lesson's claims about the cluster are written this way, so running the
    notebook (by a learner, or by the test suite) also checks that the cluster
    still behaves as the text says.
    """
    if ok:
        print(f"✅ {what}", flush=True)
        return
    raise AssertionError(f"❌ {what}" + (f"：{hint}" if hint else ""))


def show_quiz(section: str | int) -> None:
    """Display the section's quiz (see :mod:`gpulab.quiz`); answers are saved under ``GPULAB_HOME``."""
    from .quiz import show_quiz as _show

    _show(section)


# --------------------------------------------------------------------------- plots


_CJK_FONTS = ("Noto Sans CJK SC", "Noto Sans SC", "Source Han Sans SC", "WenQuanYi Micro Hei", "WenQuanYi Zen Hei",
              "PingFang SC", "Hiragino Sans GB", "Microsoft YaHei", "SimHei", "Sarasa Gothic SC")
# Files that may hold one of those fonts (Debian's fonts-noto-cjk: NotoSansCJK-Regular.ttc).
_CJK_FILE = re.compile(r"(?i)(notosans(mono)?cjk|notosanssc|sourcehansans|wqy|wenquanyi|pingfang|msyh|simhei|sarasa)")


@functools.lru_cache(maxsize=1)
def _cjk_font() -> str | None:
    from matplotlib import font_manager

    names = {f.name for f in font_manager.fontManager.ttflist}
    found = next((f for f in _CJK_FONTS if f in names), None)
    if found is None:
        # matplotlib caches its font list once: a CJK font installed after that (apt-get install
        # fonts-noto-cjk, whose .ttc collections it also skips there) is added here.
        for path in font_manager.findSystemFonts():
            if _CJK_FILE.search(os.path.basename(path)):
                try:
                    font_manager.fontManager.addfont(path)
                except (OSError, RuntimeError, ValueError):
                    continue
        names = {f.name for f in font_manager.fontManager.ttflist}
        found = next((f for f in _CJK_FONTS if f in names), None)
    return found


def _text(zh: str, en: str) -> str:
    """Chinese labels when a CJK font is installed, English otherwise (no missing-glyph boxes)."""
    return zh if _cjk_font() else en


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    font = _cjk_font()
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    if font:
        import matplotlib

        matplotlib.rcParams["font.sans-serif"] = [font, *matplotlib.rcParams["font.sans-serif"]]
        matplotlib.rcParams["axes.unicode_minus"] = False
    return fig


def _show(fig: Any, show: bool) -> Any:
    """Display ``fig`` in the notebook and return None, or return it undisplayed when ``show`` is false."""
    if not show:
        return fig
    try:
        from IPython import get_ipython
        from IPython.display import Image, display
    except ImportError:  # pragma: no cover
        return None
    if get_ipython() is not None:
        # Rendered here rather than left to a matplotlib backend, so the
        # picture is the same in JupyterLab, under nbclient and in nbval.
        import io

        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        display(Image(data=buf.getvalue(), format="png"))
    return None


_PALETTE = ("#0969da", "#8250df", "#bf3989", "#1a7f37", "#9a6700", "#cf222e", "#0550ae", "#6639ba")


def plot_allocation(title: str | None = None, show: bool = True) -> Any:
    """A bar per GPU node: one block per card, coloured by the pod holding it; grey is free.

    Displays the figure (returns None); ``show=False`` returns the matplotlib
    figure instead, undisplayed.
    """
    alloc = gpu_allocation()
    names = list(alloc)
    fig = _figure(9, 1.2 + 0.7 * max(1, len(names)))
    ax = fig.add_subplot()
    colours: dict[str, str] = {}
    for y, node in enumerate(names):
        x = 0
        for pod, n in alloc[node]["pods"]:
            colour = colours.setdefault(pod, _PALETTE[len(colours) % len(_PALETTE)])
            ax.barh(y, n, left=x, color=colour, edgecolor="white", height=0.6)
            ax.text(x + n / 2, y, pod.split("/", 1)[1], ha="center", va="center", color="white", fontsize=8)
            x += n
        free = alloc[node]["allocatable"] - x
        if free > 0:
            ax.barh(y, free, left=x, color="#eaeef2", edgecolor="white", height=0.6)
            ax.text(x + free / 2, y, _text(f"空闲 {free}", f"free {free}"), ha="center", va="center",
                    color="#57606a", fontsize=8)
    top = max([a["allocatable"] for a in alloc.values()] or [1])
    for card in range(1, top):  # one block per card
        ax.axvline(card, color="white", linewidth=3)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlim(0, top)
    ax.set_xticks(range(top + 1))
    ax.set_xlabel(_text("nvidia.com/gpu（张）", "nvidia.com/gpu (cards)"))
    waiting = [r for r in gpu_pods() if r["STATUS"] == "Pending" and not r["NODE"]]
    if waiting:
        names_waiting = ", ".join(f"{r['POD'].split('/', 1)[1]} ×{r['GPUS']}" for r in waiting)
        ax.set_xlabel(ax.get_xlabel() + "\n" + _text(f"等待调度：{names_waiting}", f"waiting to be scheduled: "
                                                      f"{names_waiting}"), color="#57606a")
    ax.set_title(title or _text("各节点 GPU 分配", "GPU allocation per node"))
    return _show(fig, show)


def plot_card_memory(card_mib: int, replica_mib: int, schemes: Sequence[tuple[str, int, int | None]],
                     title: str | None = None, show: bool = True) -> Any:
    """How replicas of ``replica_mib`` fit on one card of ``card_mib`` under each sharing scheme.

    ``schemes``: ``(name, instances per card, MiB per instance)``, with MiB
    ``None`` for a scheme whose replicas share the whole card's memory
    (time-slicing). One bar per scheme: a dark block per replica, light for
    the headroom it has, hatched for an instance too small for a replica,
    grey for memory no instance uses.
    """
    fig = _figure(9, 1.0 + 0.55 * max(1, len(schemes)))
    ax = fig.add_subplot()
    model, spare, small, unused = "#0969da", "#9ecbff", "#d0d7de", "#eaeef2"
    for y, (_, per_card, mib) in enumerate(schemes):
        x = 0
        if mib is None:  # shared: replicas side by side, the rest is their common headroom
            for _ in range(per_card):
                ax.barh(y, replica_mib, left=x, color=model, edgecolor="white")
                x += replica_mib
            ax.barh(y, max(0, card_mib - x), left=x, color=spare, edgecolor="white")
            continue
        for _ in range(per_card):
            if mib >= replica_mib:
                ax.barh(y, replica_mib, left=x, color=model, edgecolor="white")
                ax.barh(y, mib - replica_mib, left=x + replica_mib, color=spare, edgecolor="white")
            else:
                ax.barh(y, mib, left=x, color=small, edgecolor="white", hatch="//")
            x += mib
        ax.barh(y, max(0, card_mib - x), left=x, color=unused, edgecolor="white")
    ax.set_yticks(range(len(schemes)), [s[0] if _cjk_font() else s[0].replace("整卡独占", "whole card")
                                        for s in schemes])
    ax.invert_yaxis()
    ax.set_xlim(0, card_mib)
    ax.set_xlabel(_text(f"一张卡的显存（MiB）。深色：每个副本 {replica_mib} MiB；浅色：余量；斜线：实例太小；灰色：未使用",
                        f"MiB of one card. dark: a replica ({replica_mib} MiB), light: headroom, "
                        f"hatched: instance too small, grey: unused"))
    ax.set_title(title or _text("每张卡能放几个副本", "Replicas per card"))
    return _show(fig, show)


def plot_gpu_memory(rows: Sequence[dict[str, Any]], capacity_mib: int, title: str | None = None,
                    show: bool = True) -> Any:
    """One bar per physical GPU: the GPU memory each pod on it asked for, stacked in the order given.

    ``rows``: ``{"GPU": label, "POD": name, "MIB": memory, "FAILED": bool}``.
    A failed pod's block is red; a dashed line marks the card's memory
    (``capacity_mib``), so a stack that crosses it is one the card could not
    hold. Displays the figure (returns None); ``show=False`` returns it.
    """
    gpus = list(dict.fromkeys(r["GPU"] for r in rows))
    fig = _figure(9, 1.2 + 0.7 * max(1, len(gpus)))
    ax = fig.add_subplot()
    ok, bad = "#0969da", "#cf222e"
    top = capacity_mib
    for y, gpu in enumerate(gpus):
        x = 0
        for r in (r for r in rows if r["GPU"] == gpu):
            ax.barh(y, r["MIB"], left=x, color=bad if r.get("FAILED") else ok, edgecolor="white", height=0.6)
            ax.text(x + r["MIB"] / 2, y, r["POD"], ha="center", va="center", color="white", fontsize=8)
            x += r["MIB"]
        top = max(top, x)
    ax.axvline(capacity_mib, color="#57606a", linestyle="--", linewidth=1.5)
    ax.text(capacity_mib, -0.45, _text(f" 整卡 {capacity_mib} MiB", f" card {capacity_mib} MiB"), color="#57606a",
            fontsize=8, va="bottom")
    ax.set_yticks(range(len(gpus)), gpus)
    ax.invert_yaxis()
    ax.set_xlim(0, top * 1.02)
    ax.set_xlabel(_text("Pod 申请的显存（MiB）。蓝色：运行中；红色：失败",
                        "GPU memory asked for (MiB). blue: running, red: failed"))
    ax.set_title(title or _text("每张物理卡上的显存", "GPU memory per physical GPU"))
    return _show(fig, show)


# -- timelines --------------------------------------------------------------------

_STATE_COLOURS = {
    "Pending": "#d0d7de", "Init": "#d4a72c", "Creating": "#afb8c1", "Running": "#54aeff", "Ready": "#1a7f37",
    "BackOff": "#fa4549", "Succeeded": "#8250df", "Failed": "#a40e26", "Terminating": "#6e7781",
}
_STATE_ZH = {"Pending": "等待调度", "Init": "Init 容器", "Creating": "创建中", "Running": "运行（未就绪）",
             "Ready": "就绪", "BackOff": "重启退避", "Succeeded": "成功", "Failed": "失败", "Terminating": "终止中"}


def timeline_state(pod: dict[str, Any]) -> str:
    """A coarse state for timelines: Pending, Init, Creating, Running, Ready, BackOff, Succeeded, Failed, Terminating."""
    st = pod.get("status") or {}
    phase = st.get("phase")
    if phase in ("Succeeded", "Failed"):
        return phase
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating"
    if not pod.get("spec", {}).get("nodeName"):
        return "Pending"
    for cs in st.get("initContainerStatuses") or []:
        if "running" in (cs.get("state") or {}):
            return "Init"
    statuses = st.get("containerStatuses") or []
    if any((cs.get("state") or {}).get("waiting", {}).get("reason") == "CrashLoopBackOff" for cs in statuses):
        return "BackOff"
    if phase == "Running":
        return "Ready" if (_condition(pod, "Ready") or {}).get("status") == "True" else "Running"
    return "Creating"


class Timeline:
    """Pod states of a namespace over time, recorded from a watch on a background thread.

    Made by :func:`watch_pods`; ``stop()`` ends the recording, ``plot()``
    draws one bar per pod (colour = state, ✕ = container restart), and
    ``transitions()`` lists the changes as a table.
    """

    def __init__(self, namespace: str, selector: dict[str, str] | None):
        self.namespace = namespace
        self.selector = selector or {}
        self.t0 = time.time()
        self.t_end: float | None = None
        # pod name -> list of (t, state, restarts)
        self.samples: dict[str, list[tuple[float, str, int]]] = {}
        self.deleted: dict[str, float] = {}
        self._stop = threading.Event()
        self._kube = api.Client(_current().cluster.kubeconfig)
        self._thread = threading.Thread(target=self._run, daemon=True, name="gpulab-timeline")
        self._thread.start()

    def _matches(self, pod: dict[str, Any]) -> bool:
        labels = pod["metadata"].get("labels") or {}
        return all(labels.get(k) == v for k, v in self.selector.items())

    def _record(self, pod: dict[str, Any], t: float) -> None:
        if not self._matches(pod):
            return
        name = pod["metadata"]["name"]
        restarts = sum(cs.get("restartCount", 0) for cs in (pod.get("status") or {}).get("containerStatuses") or [])
        state = timeline_state(pod)
        seq = self.samples.setdefault(name, [])
        if not seq or seq[-1][1:] != (state, restarts):
            seq.append((t, state, restarts))

    def _run(self) -> None:
        rv = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    raw = self._kube.list_raw("Pod", self.namespace)
                    now = time.time()
                    for p in raw.get("items") or []:
                        self._record(p, now)
                    rv = raw["metadata"]["resourceVersion"]
                for ev in self._kube.watch("Pod", rv, self.namespace, timeout_seconds=1):
                    obj = ev.get("object") or {}
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    if ev.get("type") == "BOOKMARK":
                        continue
                    now = time.time()
                    if ev.get("type") == "DELETED":
                        if self._matches(obj):
                            self.deleted.setdefault(obj["metadata"]["name"], now)
                        continue
                    self._record(obj, now)
                    if self._stop.is_set():
                        break
            except api.Gone:
                rv = None
            except Exception:  # the apiserver restarted or a read timed out: list again
                rv = None
                self._stop.wait(0.5)

    def stop(self) -> Timeline:
        """End the recording (idempotent); returns self."""
        if self.t_end is None:
            self.t_end = time.time()
            self._stop.set()
            self._thread.join(timeout=5)
        return self

    def transitions(self) -> Table:
        """Every recorded change: seconds since the start, pod, state, restart count."""
        rows = [{"T+S": f"{t - self.t0:5.1f}", "POD": name, "STATE": s, "RESTARTS": r}
                for name, seq in self.samples.items() for t, s, r in seq]
        rows.sort(key=lambda r: float(r["T+S"]))
        return Table(rows, ["T+S", "POD", "STATE", "RESTARTS"])

    def plot(self, title: str | None = None, labels: dict[str, str] | None = None, show: bool = True) -> Any:
        """One horizontal bar per pod, in creation order; ``labels`` renames pods on the y axis.

        Displays the figure (returns None); ``show=False`` returns it instead.
        """
        end = self.t_end or time.time()
        names = sorted(self.samples, key=lambda n: self.samples[n][0][0])
        fig = _figure(10, 1.2 + 0.45 * max(1, len(names)))
        ax = fig.add_subplot()
        seen: set[str] = set()
        for y, name in enumerate(names):
            seq = self.samples[name]
            stop = min(self.deleted.get(name, end), end)
            for i, (t, state, restarts) in enumerate(seq):
                t_next = seq[i + 1][0] if i + 1 < len(seq) else stop
                if t_next <= t:
                    t_next = t + 0.15  # a state seen for an instant still shows
                # After the end the pod object stays, doing nothing: a thin band.
                terminal = state in ("Succeeded", "Failed")
                ax.barh(y, t_next - t, left=t - self.t0, height=0.18 if terminal else 0.55,
                        color=_STATE_COLOURS[state], alpha=0.8 if terminal else 1.0,
                        label=None if state in seen else _text(_STATE_ZH[state], state))
                seen.add(state)
                if i and restarts > seq[i - 1][2]:
                    ax.plot(t - self.t0, y, marker="x", color="black", markersize=7)
        ax.set_yticks(range(len(names)), [(labels or {}).get(n, n) for n in names], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, max(1.0, end - self.t0))
        ax.set_xlabel(_text("秒（从开始记录算起）", "seconds since recording started"))
        ax.set_title(title or _text("Pod 状态时间线", "Pod states over time"))
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
        ax.grid(axis="x", alpha=0.3)
        return _show(fig, show)


def watch_pods(selector: dict[str, str] | None = None, namespace: str | None = None) -> Timeline:
    """Start recording the states of the lesson's pods (those whose labels include ``selector``)."""
    return Timeline(namespace or _current().namespace, selector)


# --------------------------------------------------------------------------- monitoring and cost


def dcgm_metrics(node: str | None = None, pod_only: bool = False) -> Table:
    """One row per GPU (or MIG instance) from the DCGM exporters' pages, as Prometheus would scrape them."""
    from .fakegpu import dcgm, monitoring

    pages = monitoring.scrape_all(_current().kube)
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    columns = {"DCGM_FI_DEV_GPU_UTIL": "GPU_UTIL %", "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "GR_ENGINE_ACTIVE",
               "DCGM_FI_DEV_FB_USED": "FB_USED MiB", "DCGM_FI_DEV_FB_FREE": "FB_FREE MiB",
               "DCGM_FI_DEV_GPU_TEMP": "TEMP °C", "DCGM_FI_DEV_POWER_USAGE": "POWER W"}
    for name in sorted(pages):
        if node is not None and name != node:
            continue
        for metric, labels, value in dcgm.parse(pages[name]):
            if metric not in columns:
                continue
            key = (name, labels.get("gpu", ""), labels.get("GPU_I_ID", ""))
            row = rows.setdefault(key, {"NODE": name, "GPU": labels.get("gpu", "") + (
                f" / MIG {labels['GPU_I_PROFILE']}" if labels.get("GPU_I_PROFILE") else ""), "POD": ""})
            if labels.get("pod"):
                row["POD"] = f"{labels.get('namespace')}/{labels['pod']}"
            row[columns[metric]] = value if metric != "DCGM_FI_PROF_GR_ENGINE_ACTIVE" else round(value, 2)
    out = [r for r in rows.values() if r["POD"] or not pod_only]
    wanted = ["NODE", "GPU", "POD", *columns.values()]
    present = [c for c in wanted if any(c in r for r in out)] or wanted[:3]
    return Table(out, present)


def custom_metrics(metric: str = "DCGM_FI_DEV_GPU_UTIL", namespace: str | None = None) -> Table:
    """Per-pod values of ``metric`` as the HPA controller reads them: from custom.metrics.k8s.io via the apiserver."""
    ns = namespace or _current().namespace
    body = _current().kube.request("GET", f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/*/{metric}")
    return Table([{"POD": i["describedObject"]["name"], "METRIC": i["metric"]["name"], "VALUE": i["value"]}
                  for i in body.get("items") or []], ["POD", "METRIC", "VALUE"])


class HpaTimeline:
    """Replicas and metric value of one HPA over time, recorded on a thread until :meth:`stop`."""

    def __init__(self, name: str, namespace: str, interval: float = 1.0):
        self.name = name
        self.namespace = namespace
        self.t0 = time.monotonic()
        self.samples: list[tuple[float, int, int, float | None]] = []  # t, desired, ready, metric
        self.marks: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def _run(self, interval: float) -> None:
        kube = _current().kube
        while not self._stop.is_set():
            hpa = kube.get("HorizontalPodAutoscaler", self.name, self.namespace) or {}
            dep_name = (hpa.get("spec") or {}).get("scaleTargetRef", {}).get("name", self.name)
            dep = kube.get("Deployment", dep_name, self.namespace) or {}
            metrics = (hpa.get("status") or {}).get("currentMetrics") or []
            value = None
            if metrics and metrics[0].get("pods"):
                value = _qty(metrics[0]["pods"]["current"]["averageValue"])
            self.samples.append((time.monotonic() - self.t0, int((dep.get("spec") or {}).get("replicas") or 0),
                                 int((dep.get("status") or {}).get("readyReplicas") or 0), value))
            self._stop.wait(interval)

    def mark(self, text: str) -> None:
        """A vertical line on the plot at this moment (e.g. "load 80")."""
        self.marks.append((time.monotonic() - self.t0, text))

    def stop(self) -> "HpaTimeline":
        self._stop.set()
        self._thread.join(timeout=5)
        return self

    def plot(self, title: str | None = None, show: bool = True) -> Any:
        fig = _figure(9, 3.4)
        ax = fig.add_subplot()
        ts = [s[0] for s in self.samples]
        ax.step(ts, [s[1] for s in self.samples], where="post", color="#0969da",
                label=_text("期望副本数", "desired replicas"))
        ax.step(ts, [s[2] for s in self.samples], where="post", color="#1a7f37", linestyle="--",
                label=_text("就绪副本数", "ready replicas"))
        ax.set_ylabel(_text("副本", "replicas"))
        ax.set_ylim(0, max([s[1] for s in self.samples] + [2]) + 0.5)
        ax2 = ax.twinx()
        ax2.plot([s[0] for s in self.samples if s[3] is not None], [s[3] for s in self.samples if s[3] is not None],
                 color="#bf3989", alpha=0.8, label=_text("平均 GPU 利用率 %", "average GPU utilisation %"))
        ax2.set_ylim(0, 105)
        ax2.set_ylabel("DCGM_FI_DEV_GPU_UTIL %")
        for t, text in self.marks:
            ax.axvline(t, color="#57606a", linestyle=":")
            ax.text(t, ax.get_ylim()[1] - 0.2, f" {text}", fontsize=8, va="top", color="#57606a")
        ax.set_xlabel(_text("秒（从开始记录算起）", "seconds since recording started"))
        ax.set_title(title or f"HPA {self.name}")
        lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
        ax.legend(lines, [ln.get_label() for ln in lines], loc="upper left", bbox_to_anchor=(1.08, 1.0),
                  fontsize=8, frameon=False)
        ax.grid(axis="x", alpha=0.3)
        return _show(fig, show)


def watch_hpa(name: str, namespace: str | None = None) -> HpaTimeline:
    """Start recording an HPA's replicas and metric (``.mark(text)``, ``.stop()``, ``.plot()``)."""
    return HpaTimeline(name, namespace or _current().namespace)


class UsageReport:
    """:func:`usage_report`'s result: shows as ``gpulab report``'s table; ``plot_*`` draw its pictures."""

    def __init__(self, report: Any):
        self.report = report

    def __repr__(self) -> str:
        return self.report.text()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.report.text())

    def namespace(self, name: str) -> Any:
        """The :class:`gpulab.usage.report.Usage` row of one namespace (None if it held no GPU)."""
        return next((u for u in self.report.namespaces if u.name == name), None)

    def plot_utilization(self, title: str | None = None, show: bool = True) -> Any:
        from .usage import plots

        return _show(plots.utilization_figure(self.report, title or "GPU utilisation over time"), show)

    def plot_allocation(self, title: str | None = None, show: bool = True) -> Any:
        from .usage import plots

        return _show(plots.allocation_figure(self.report, title or "GPU allocation per node/GPU"), show)


def usage_report(since: str | None = None, namespace: str | None = None) -> UsageReport:
    """``gpulab report`` from a notebook: GPU-hours allocated vs computing, idle GPUs, quota, preemptions.

    ``since`` is a duration (``"15m"``); by default the report covers the time since the lesson's ``setup()``.
    """
    from . import usage

    lab = _current()
    seconds = usage.parse_since(since) if since else max(1.0, time.time() - lab.started)
    return UsageReport(usage.collect(lab.cluster.root, lab.kube, since=seconds, namespace=namespace))


def wait_usage_sample(timeout: float = 20) -> None:
    """Wait for the monitoring stack's next usage sample, so a report includes what is running now."""
    from .usage import samples

    store = samples.Store(samples.store_path(_current().cluster.root))
    since = time.time()
    wait_for(lambda: store.read(since=since), timeout, what="下一次 GPU 用量采样（custom-metrics-adapter 每 5 秒一次）")
