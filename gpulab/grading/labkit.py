"""What a lab notebook calls: one :func:`begin`, then kubectl as in a terminal.

A lab's first code cells::

    # parameters                          (cell tagged "parameters": the grader overrides these)
    namespace = "lab-01"
    results_path = ""

    from gpulab.grading.labkit import *
    lab = begin(namespace)

:func:`begin` makes the kernel work the same by hand and under the grader:

- by hand (no ``KUBECONFIG`` in the environment) it uses the local cluster's
  kubeconfig, creates the lab's namespaces (``fresh=True`` deletes and
  recreates them, so "Restart & Run All" starts clean) and points
  ``KUBECONFIG`` at a copy whose default namespace is the lab's, so ``!kubectl``
  cells need no ``-n``;
- under ``gpulab check`` / ``gpulab grade`` the grader has already created the
  namespaces and passes a kubeconfig for a namespace-scoped identity; nothing
  is created, and a command the identity may not run fails as it would for a
  team member on a shared cluster.

Helpers: :func:`kubectl` (prints ``$ kubectl …`` and the output, raises
:class:`KubectlFailed` on error), :func:`try_kubectl` (for commands that are
*supposed* to be rejected: returns the outcome instead), :func:`kubectl_json`,
:func:`manifest` / :func:`show` (lab files under ``manifests/labs/``),
:func:`wait_until`, and :func:`record` (values for the grader).

Standard library only (plus PyYAML), so the kernel starts fast.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulab import _poll, paths
from gpulab.cluster import backend
from gpulab.grading.record import record

__all__ = ["begin", "Lab", "kubectl", "try_kubectl", "kubectl_json", "manifest", "show", "wait_until", "record",
           "KubectlFailed", "Outcome", "Output"]

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
    local = Path(sys.executable).parent / "kubectl"
    if local.exists():
        return str(local)
    found = shutil.which("kubectl")
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


def kubectl(command: str | Sequence[str], *, input: str | None = None, namespace: str | None = None,
            quiet: bool = False, timeout: float = 120) -> str:
    """Run ``kubectl <command>`` in the lab's namespace (unless ``-n``/``-A`` is given); return its output."""
    args = _with_namespace(_split(command), namespace)
    shown = "kubectl " + " ".join(shlex.quote(a) for a in args)
    code, out = _run(args, input, timeout)
    if not quiet:
        print(f"$ {shown}")
        if out:
            print(out, end="" if out.endswith("\n") else "\n")
    if code != 0:
        raise KubectlFailed(shown, out, code)
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
        deadline = time.monotonic() + 30
        while _run(["get", "serviceaccount", "default", "-n", name])[0] != 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"命名空间 {name} 的 default ServiceAccount 迟迟没有创建")
            time.sleep(0.2)
    return True


def begin(namespace: str, extra: Sequence[str] = (), fresh: bool = True) -> Lab:
    """Get the kernel ready for a lab in ``namespace`` (and ``<namespace>-<suffix>`` for each of ``extra``)."""
    global _lab
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join(p for p in (bindir, os.environ.get("PATH", "")) if p)
    given = os.environ.get("KUBECONFIG")
    if given and Path(given).parent == paths.home() / "labs":
        given = None  # our own copy, from running this cell before: start over as by hand
    if given:
        config = given
    else:
        admin = backend.kubeconfig()
        if not admin.exists():
            raise RuntimeError("本地集群还没有创建：先在终端运行 `gpulab up`（或 `make up`），再重新运行这个单元格。")
        config = str(_namespaced_copy(admin, namespace))
        os.environ["KUBECONFIG"] = config
    _lab = Lab(namespace, Path(tempfile.gettempdir()) / f"gpulab-{namespace}", graded=False, kubeconfig=config)
    names = [namespace, *(f"{namespace}-{s}" for s in extra)]
    managed = [_ensure_namespace(n, fresh and not given) for n in names]
    # A graded run's identity may not even read namespaces: the grader made them.
    _lab.graded = not all(managed)
    shutil.rmtree(_lab.work, ignore_errors=True)  # scratch space: nothing in it survives a fresh start
    _lab.work.mkdir(parents=True, exist_ok=True)
    print(f"实验命名空间：{', '.join(names)}")
    return _lab
