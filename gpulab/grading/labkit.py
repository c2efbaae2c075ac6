"""What a lab notebook calls: one :func:`begin`, then kubectl as in a terminal.

A lab's first code cells::

    # parameters                          (cell tagged "parameters": the grader overrides these)
    namespace = "lab-01"
    results_path = ""

    from gpulab.grading.labkit import *
    lab = begin(namespace)

:func:`begin` makes the kernel work the same by hand and under the grader:

- by hand (no ``KUBECONFIG`` in the environment, or the cluster's own, which
  a kernel of ``gpulab jupyter`` inherits) it uses the local cluster's
  kubeconfig, starts the cluster if it is not running (as a lesson's
  ``setup()`` does, saying so line by line), creates the lab's namespaces
  (``fresh=True`` deletes and recreates them, so "Restart & Run All" starts
  clean) and points ``KUBECONFIG`` at a copy whose default namespace is the
  lab's, so ``!kubectl`` cells need no ``-n``;
- under ``gpulab check`` / ``gpulab grade`` the grader has already created the
  namespaces and passes a kubeconfig for a namespace-scoped identity; nothing
  is created, and a command the identity may not run fails as it would for a
  team member on a shared cluster.

Helpers: :func:`kubectl` (prints ``$ kubectl …`` and the output, raises
:class:`KubectlFailed` on error; kubectl's "connection … refused" comes with
what to run), :func:`try_kubectl` (for commands that are
*supposed* to be rejected: returns the outcome instead), :func:`kubectl_json`,
:func:`manifest` / :func:`show` (lab files under ``manifests/labs/``),
:func:`wait_until`, :func:`record` (values for the grader) and :func:`check`
(the lab's visible checks on what the notebook has done so far, as a table).

Standard library only (plus PyYAML), so the kernel starts fast; :func:`check`
imports the grading code when it is called.
"""

from __future__ import annotations

import html
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulab import _poll, i18n, marks, paths
from gpulab.cluster import backend
from gpulab.grading.record import record

__all__ = ["begin", "Lab", "kubectl", "try_kubectl", "kubectl_json", "manifest", "show", "wait_until", "record",
           "check", "KubectlFailed", "Outcome", "Output"]

_NAMESPACED_FLAGS = ("-n", "--namespace", "-A", "--all-namespaces")
_lab: Lab | None = None


class KubectlFailed(RuntimeError):
    """A kubectl command exited non-zero; the message carries its error output."""

    def __init__(self, command: str, output: str, code: int):
        super().__init__(f"命令失败（退出码 {code}）：{command}\n{output.strip()}")
        self.command, self.output, self.code = command, output, code


class Output(str):
    """Command output: a plain ``str`` that a notebook does not echo again (it was printed already)."""

    def _ipython_display_(self) -> None:
        pass


@dataclass(frozen=True)
class Outcome:
    """What a command did: ``ok`` and its combined output."""

    ok: bool
    output: str
    code: int

    def __str__(self) -> str:
        return self.output


@dataclass
class Lab:
    namespace: str
    work: Path
    graded: bool
    kubeconfig: str

    def ns(self, suffix: str) -> str:
        """The name of the lab's extra namespace ``suffix`` (``<namespace>-<suffix>``)."""
        return f"{self.namespace}-{suffix}"


def _kubectl_exe() -> str:
    found = paths.kubectl()
    if not found:
        raise RuntimeError("找不到 kubectl：请用 `make install` 安装 gpulab（它自带 kubectl 1.37）。")
    return found


def _run(args: Sequence[str], input: str | None = None, timeout: float = 120) -> tuple[int, str]:
    proc = subprocess.run([_kubectl_exe(), *args], capture_output=True, text=True, input=input, timeout=timeout)
    out = proc.stdout
    if proc.stderr:
        out = f"{out}{'' if not out or out.endswith(chr(10)) else chr(10)}{proc.stderr}"
    return proc.returncode, out


def _with_namespace(args: Sequence[str], namespace: str | None) -> list[str]:
    args = list(args)
    if namespace is None:
        namespace = _lab.namespace if _lab else None
    if namespace and not any(a in _NAMESPACED_FLAGS or a.startswith(("--namespace=", "-n=")) for a in args):
        args += ["-n", namespace]
    return args


def _split(command: str | Sequence[str]) -> list[str]:
    args = shlex.split(command) if isinstance(command, str) else list(command)
    if args and args[0] == "kubectl":
        args = args[1:]
    return args


#: The cell that starts the cluster, as a lab's notes name it.
FIRST_CELL = "笔记本开头调用 begin(...) 的单元格"


def kubectl(command: str | Sequence[str], *, input: str | None = None, namespace: str | None = None,
            quiet: bool = False, timeout: float = 120) -> str:
    """Run ``kubectl <command>`` in the lab's namespace (unless ``-n``/``-A`` is given); return its output."""
    args = _with_namespace(_split(command), namespace)
    shown = "kubectl " + " ".join(shlex.quote(a) for a in args)
    code, out = _run(args, input, timeout)
    # By hand, kubectl's connection error comes with what to run (under the grader the cluster is the grader's).
    note = (backend.unreachable_note(FIRST_CELL) if backend.UNREACHABLE.search(out) and not (_lab and _lab.graded)
            else "")
    if not quiet:
        print(f"$ {shown}")
        if out:
            print(out, end="" if out.endswith("\n") else "\n")
        if note:
            print(f"⚠ {note}")
    if code != 0:
        raise KubectlFailed(shown, f"{out.rstrip()}\n{note}" if note else out, code)
    return Output(out)


def try_kubectl(command: str | Sequence[str], *, input: str | None = None, namespace: str | None = None,
                quiet: bool = False, timeout: float = 120) -> Outcome:
    """Like :func:`kubectl` but never raises: for commands the cluster is expected to refuse."""
    try:
        return Outcome(True, str(kubectl(command, input=input, namespace=namespace, quiet=quiet, timeout=timeout)), 0)
    except KubectlFailed as exc:
        return Outcome(False, exc.output, exc.code)


def kubectl_json(command: str | Sequence[str], *, namespace: str | None = None) -> Any:
    """``kubectl <command> -o json``, parsed."""
    return json.loads(kubectl([*_split(command), "-o", "json"], namespace=namespace, quiet=True))


def manifest(relative: str) -> Path:
    """A lab file under ``manifests/labs/`` of the repository (an absolute path, usable anywhere)."""
    path = paths.manifests() / "labs" / relative
    if not path.exists():
        raise FileNotFoundError(f"找不到实验文件 manifests/labs/{relative}")
    return path


def show(path: str | Path) -> None:
    """Print a manifest or script with its name, as ``cat`` would."""
    path = Path(path)
    print(f"# {path.name}")
    print(path.read_text(encoding="utf-8"), end="")


def wait_until(fn: Callable[[], Any], timeout: float = 60, interval: float = 0.5, what: str = "条件满足") -> Any:
    """Poll ``fn`` until it returns something truthy; raise TimeoutError (zh-CN) after ``timeout`` seconds."""
    return _poll.until(fn, timeout, lambda value: TimeoutError(
        f"等了 {timeout:g} 秒，{what} 仍未发生（最后一次的值：{value!r}）"), interval)


def _namespaced_copy(source: Path, namespace: str) -> Path:
    import yaml

    doc = yaml.safe_load(source.read_text(encoding="utf-8"))
    for ctx in doc.get("contexts") or []:
        ctx.setdefault("context", {})["namespace"] = namespace
    target = paths.home() / "labs" / f"{namespace}.kubeconfig"
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        yaml.safe_dump(doc, handle, sort_keys=False)
    return target


def _ensure_namespace(name: str, fresh: bool) -> bool:
    """Create ``name`` when running by hand; False when the identity may not look (graded runs)."""
    code, out = _run(["get", "namespace", name, "-o", "name"])
    if code != 0 and "Forbidden" in out:
        return False
    if code == 0 and fresh:
        _run(["delete", "pods", "--all", "-n", name, "--grace-period=0", "--force"])
        _run(["delete", "namespace", name, "--wait=true", "--timeout=120s"])
        code = 1
    if code != 0:
        code, out = _run(["create", "namespace", name])
        if code != 0 and "AlreadyExists" not in out:
            raise KubectlFailed(f"kubectl create namespace {name}", out, code)
        _poll.until(lambda: _run(["get", "serviceaccount", "default", "-n", name])[0] == 0, 30,
                    lambda _: TimeoutError(f"命名空间 {name} 的 default ServiceAccount 迟迟没有创建"), interval=0.2)
    return True


def _start_cluster(admin: Path) -> None:
    """By hand: start the local cluster unless it answers, saying so as a lesson's ``setup()`` does.

    Started rather than reported, for the reason :mod:`gpulab.notebook.lesson` gives: the cell the learner ran
    does what the lab needs. The backend is loaded only when the cluster does not answer (a lab kernel starts
    fast).
    """
    if admin.exists() and _run(["--kubeconfig", str(admin), "get", "--raw=/readyz"], timeout=30)[0] == 0:
        return
    from gpulab.cluster.base import ClusterError
    from gpulab.cluster.binaries import BinaryError
    from gpulab.kube.topology import TopologyError

    cluster = backend.current()
    if cluster.is_up():
        return
    os.environ["LANGUAGE"] = i18n.CHINESE  # bring-up's lines in Chinese, as in a lesson
    first = not cluster.exists()
    print("集群没有在运行，现在启动它" + ("（第一次启动若要编译控制面，需要几分钟）" if first else "") + "……", flush=True)
    try:
        print(cluster.up(say=lambda m: print(f"  {m}", flush=True)), flush=True)
    except (ClusterError, BinaryError, TopologyError) as e:
        raise RuntimeError(f"集群没能启动：{e}\n按上面的说明处理之后，在终端里运行 `gpulab up` 确认集群能启动，"
                           "再重新运行这个单元格。") from None


def begin(namespace: str, extra: Sequence[str] = (), fresh: bool = True) -> Lab:
    """Get the kernel ready for a lab in ``namespace`` (and ``<namespace>-<suffix>`` for each of ``extra``)."""
    global _lab
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join(p for p in (bindir, os.environ.get("PATH", "")) if p)
    given = os.environ.get("KUBECONFIG")
    admin = backend.kubeconfig()
    if given and (Path(given).parent == paths.home() / "labs" or Path(given) == admin):
        # Our own copy, from running this cell before, or the cluster's own kubeconfig, which `gpulab jupyter`
        # (make lab) and start give JupyterLab's terminals and kernels: start over as by hand.
        given = None
    if given:
        config = given
    else:
        _start_cluster(admin)
        config = str(_namespaced_copy(admin, namespace))
        os.environ["KUBECONFIG"] = config
    _lab = Lab(namespace, Path(tempfile.gettempdir()) / f"gpulab-{namespace}", graded=False, kubeconfig=config)
    if not given:  # by hand: the client's "connection refused" says what to run (a graded run's cluster is the grader's)
        backend.explain_client_errors(FIRST_CELL)
    names = [namespace, *(f"{namespace}-{s}" for s in extra)]
    managed = [_ensure_namespace(n, fresh and not given) for n in names]
    # A graded run's identity may not even read namespaces: the grader made them.
    _lab.graded = not all(managed)
    shutil.rmtree(_lab.work, ignore_errors=True)  # scratch space: nothing in it survives a fresh start
    _lab.work.mkdir(parents=True, exist_ok=True)
    print(f"实验命名空间：{', '.join(names)}")
    return _lab


# --------------------------------------------------------------------------- self-check

SKIPPED_WHEN_GRADED = "评分时跳过自查：check() 只在你手动运行笔记本时显示结果。"
HIDDEN_NOTE = "评分时还有隐藏检查。"
SETUP_NOTE = ("这个实验评分时，评分器会在运行笔记本之前先布置集群（把 GPU 栈放回初始状态，或者故意弄坏某处），"
              "并把它做了什么交给检查；自查时没有这一步，用到它的检查在这里可能算不上数，以 `gpulab check` 的结果为准。")


def _lab_of_kernel() -> str | None:
    """The lab's number: from the parameters cell's ``namespace`` (``lab-NN``), else the notebook's file name."""
    if _lab is not None:
        match = re.fullmatch(r"lab-(\d+)", _lab.namespace)
        if match:
            return match.group(1)
    match = re.match(r"(\d+)-", Path(os.environ.get("JPY_SESSION_NAME", "")).name)
    return match.group(1) if match else None


def _verdict(outcome: Any) -> str:
    return "通过" if outcome.passed else "部分" if outcome.earned > 0 else "未通过"


def _points(outcome: Any) -> str:
    return f"{outcome.earned:g} / {outcome.points:g}"


def _heading(report: Any) -> str:
    return f"自查：{report.spec.lab}"


def _intro(report: Any, namespace: str) -> str:
    return (f"按这个笔记本到目前为止用 record() 记录的值和命名空间 {namespace} 里现在的对象，运行公开的检查"
            f"（和 `gpulab check labs/{report.spec.lab}.ipynb` 是同一套）；自查只读集群，不重跑笔记本，也不记录任何值。")


def _total(report: Any) -> str:
    return f"合计：{report.row.total:g} / {report.row.max_points:g} 分"


def self_check_text(report: Any, namespace: str) -> str:
    """The self-check's table as plain text (what a terminal, or a plain-text viewer, shows)."""
    lines = [_heading(report), _intro(report, namespace), ""]
    for o in report.row.outcomes:
        verdict = _verdict(o)
        lines.append(f"{verdict}{' ' * (8 - 2 * len(verdict))}{_points(o):>9}  {o.label}")
        if o.message:
            lines.append(f"{'':19}{o.message}")
    lines += ["", f"{_total(report)}。{HIDDEN_NOTE}"]
    if report.spec.setup is not None:
        lines.append(SETUP_NOTE)
    return "\n".join(lines)


def self_check_html(report: Any, namespace: str) -> str:
    """The self-check's table as HTML (what JupyterLab shows)."""
    esc = html.escape
    cell = 'style="text-align:left;vertical-align:top"'
    rows = "".join(
        f"<tr><td {cell}>{esc(o.label)}</td><td {cell}>{esc(_points(o))}</td>"
        f"<td {cell}>{marks.verdict(o.passed, o.earned)} {_verdict(o)}</td>"
        f"<td {cell}>{esc(o.message)}</td></tr>" for o in report.row.outcomes)
    head = "".join(f"<th {cell}>{h}</th>" for h in ("检查", "得分", "结果", "说明"))
    parts = [f"<p><strong>{esc(_heading(report))}</strong></p>", f"<p>{esc(_intro(report, namespace))}</p>",
             f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>",
             f"<p><strong>{esc(_total(report))}</strong>。{HIDDEN_NOTE}</p>"]
    if report.spec.setup is not None:
        parts.append(f"<p>{esc(SETUP_NOTE)}</p>")
    return f'<div class="gpulab-self-check">{"".join(parts)}</div>'


def _show(text: str, markup: str) -> None:
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # pragma: no cover - labs run in Jupyter
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display({"text/plain": text, "text/html": markup}, raw=True)
    else:
        print(text)


def check(lab: str | None = None) -> None:
    """Show how the lab's visible checks grade what this notebook has done so far (a self-check).

    The values recorded with :func:`record` in this kernel and the objects in
    the lab's namespaces *now* are graded the way ``gpulab check`` grades a
    run (:func:`gpulab.grading.grader.check_kernel`, through the same
    :func:`~gpulab.grading.grader.grade_visible`), without running the
    notebook again; hidden checks are never run. Under the grader it does
    nothing but say so. It records nothing and changes nothing. ``lab`` (e.g.
    ``"01"``) is needed only when the namespace is not the lab's ``lab-NN``.
    """
    if _lab is None:
        print("自查之前先运行笔记本开头调用 begin(namespace) 的单元格。")
        return
    if _lab.graded:
        print(SKIPPED_WHEN_GRADED)
        return
    number = lab or _lab_of_kernel()
    if number is None:
        print("认不出这是哪个实验：请写明实验编号，例如 check(\"01\")。")
        return
    from gpulab.grading import grader
    from gpulab.grading.record import recorded

    try:
        report = grader.check_kernel(number, _lab.namespace, recorded(),
                                     notebook=os.environ.get("JPY_SESSION_NAME") or None)
    except grader.GradingError as exc:
        print(f"自查没能进行：{exc}")
        return
    _show(self_check_text(report, _lab.namespace), self_check_html(report, _lab.namespace))
