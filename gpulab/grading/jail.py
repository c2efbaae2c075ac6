"""The grading jail: what a graded notebook's kernel can see and reach.

A submission is code from a learner, run on the instructor's machine next to
the cluster's CA key, the admin kubeconfig, etcd (no authentication, on
127.0.0.1), the hidden checks, the solutions and every other learner's work.
RBAC only means something if the kernel can reach none of those, so
:class:`gpulab.grading.runner.Runner` with a :class:`Jail` starts papermill
(and so the kernel and whatever it spawns) in gpulab's sandbox
(:mod:`gpulab.runtime.sandbox`, the one pods run in, ``GPULAB_SANDBOX``
chooses it), set up to expose only

- the system directories, the Python installation, and of the repository the
  ``gpulab`` package (the code a lab imports, its visible checks included) and
  ``manifests/`` (the lab's files), all read-only: not ``solutions/``, not the
  tests and their fixtures, nothing else of the checkout; the instructor's
  private directories (hidden checks, submissions, the output folder) are
  masked even where they lie inside an exposed path;
- a private ``/tmp`` and one writable run directory (the submission's copy,
  its working directory and outputs); the grader's home, ``GPULAB_HOME``
  (PKI, kubeconfigs, the cluster's state) and everything else are not there;
- its own network: nothing but a relay to the apiserver named in the kernel's
  ``KUBECONFIG`` (the restricted identity's), at the same 127.0.0.1 address,
  so TLS verification works unchanged;
- no privileges: ``nobody`` when the grader is root, otherwise the grader's
  uid inside a user namespace with no capabilities; ``no_new_privs``;
  limits on address space, processes, file size and open files.

In the namespaces sandbox (the default: root or unprivileged user namespaces)
that is a root of its own in a tmpfs. In the weaker process sandbox
(``GPULAB_SANDBOX=process``) proot gives the same view of the file system on
an empty root of its own, with a seccomp filter against the system calls it
does not translate; there is no network isolation there (the kernel talks to
the apiserver directly, and could reach etcd), read-only is not enforced
beyond file permissions, and a submission that attacks proot itself gets
out: grade untrusted submissions in the namespaces sandbox.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

import gpulab
from gpulab import _proc
from gpulab._fsutil import remove_tree
from gpulab.runtime import sandbox

NOBODY = sandbox.NOBODY

# What a submission sees of the repository: the package it imports and the lab's files.
REPO_EXPOSED = ("gpulab", "manifests")


class JailUnavailable(RuntimeError):
    """The jail cannot be created on this machine; the message says why and what to do."""


def _repo_root() -> Path:
    return Path(gpulab.__file__).resolve().parents[1]


def _python_roots() -> list[Path]:
    roots = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix), Path(sys.base_exec_prefix),
             Path(os.path.realpath(sys.executable)).parent.parent}
    return sorted(p.resolve() for p in roots if p.exists())


def _outermost(paths: Sequence[Path]) -> list[Path]:
    """Drop paths that lie inside another one of the list."""
    result: list[Path] = []
    for path in sorted({p.resolve() for p in paths}, key=lambda p: len(p.parts)):
        if not any(path == kept or kept in path.parents for kept in result):
            result.append(path)
    return result


def _system_path(path: Path) -> bool:
    return any(path == Path(d) or Path(d) in path.parents for d in sandbox.SYSTEM_DIRS)


def _within(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


# A jail's host directories carry their grader's pid and start time, so that the next grader can
# remove what a killed one (SIGKILL, OOM) could not: gpulab-run-<pid>-<start>-XXXX, gpulab-jailroot-...
_OWNED_DIR = re.compile(r"^gpulab-(?:run|jailroot)-(\d+)-(\d+)-")


def _owned_prefix(kind: str) -> str:
    pid = os.getpid()
    return f"gpulab-{kind}-{pid}-{int(_proc.started(pid) or 0)}-"


def sweep_stale(tmp: str | os.PathLike[str] | None = None) -> list[Path]:
    """Remove the jail directories of graders that are gone; the paths removed.

    A directory of a living grader, or one this account may not remove, is left alone.
    """
    removed = []
    base = Path(tmp or tempfile.gettempdir())
    try:
        entries = list(base.iterdir())
    except OSError:
        return removed
    me = os.geteuid()
    for entry in entries:
        m = _OWNED_DIR.match(entry.name)
        if not m:
            continue
        try:
            st = entry.lstat()
        except OSError:
            continue
        if not entry.is_dir() or entry.is_symlink() or (me != 0 and st.st_uid != me):
            continue
        if _proc.alive(int(m[1]), float(m[2])):
            continue
        remove_tree(entry)
        if not entry.exists():
            removed.append(entry)
    return removed


@dataclass
class Jail:
    """Settings of the jail; :class:`~gpulab.grading.runner.Runner` applies it to each run."""

    keep: Sequence[str | Path] = ()
    mask: Sequence[str | Path] = ()
    memory_bytes: int | None = 4 << 30
    nproc: int = 1024
    file_bytes: int = 256 << 20
    nofile: int = 4096
    tmp_size: str = "512m"
    _checked: bool = field(default=False, init=False, repr=False)

    # -- what is visible ------------------------------------------------------

    def kept(self) -> list[Path]:
        """Host paths visible read-only inside (besides system directories and the run directory)."""
        repo = _repo_root()
        paths = [*(repo / name for name in REPO_EXPOSED), *_python_roots(), *(Path(p) for p in self.keep)]
        return [p for p in _outermost([p for p in paths if p.exists()]) if not _system_path(p)]

    def masks(self) -> list[Path]:
        """Masked paths that would otherwise be visible (inside a kept path).

        Besides ``mask``: the rest of the repository, should a kept path hold
        it (a Python installation around the checkout).
        """
        kept = self.kept()
        repo = _repo_root()
        private = [e for e in repo.iterdir() if e.name not in REPO_EXPOSED and e.is_dir() and not e.is_symlink()
                   and not any(_within(k, [e.resolve()]) for k in kept)] if repo.is_dir() else []
        found = []
        for m in [*self.mask, *private]:
            path = Path(m).resolve()
            if _within(path, kept):
                found.append(path)
        return found

    @property
    def uid(self) -> int | None:
        return NOBODY if os.geteuid() == 0 else None

    def own(self, path: Path) -> None:
        """Give ``path`` to the jail's user (only meaningful when the grader is root)."""
        if self.uid is not None:
            os.chown(path, self.uid, self.uid)

    def make_run_dir(self) -> Path:
        """A fresh private directory: the only writable host path inside the jail."""
        run_dir = Path(tempfile.mkdtemp(prefix=_owned_prefix("run")))
        run_dir.chmod(0o700)
        self.own(run_dir)
        for sub in ("home", ".runtime"):
            (run_dir / sub).mkdir()
            self.own(run_dir / sub)
        return run_dir

    def kernel_env(self, env: Mapping[str, str], run_dir: Path) -> tuple[dict[str, str], tuple[str, int] | None]:
        """The environment inside, and the apiserver address to relay (from ``KUBECONFIG``), if any."""
        env = dict(env)
        home = run_dir / "home"
        env.update(HOME=str(home), TMPDIR="/tmp", PYTHONDONTWRITEBYTECODE="1", IPYTHONDIR=str(home / ".ipython"),
                   MPLCONFIGDIR=str(home / ".config" / "matplotlib"), XDG_CACHE_HOME=str(home / ".cache"),
                   XDG_CONFIG_HOME=str(home / ".config"), JUPYTER_RUNTIME_DIR=str(run_dir / ".runtime"))
        env.pop("JUPYTER_CONFIG_DIR", None)
        upstream = None
        source = env.get("KUBECONFIG")
        if source:
            target = self.place_kubeconfig(run_dir, source)
            env["KUBECONFIG"] = str(target)
            upstream = self.upstream(target)
        return env, upstream

    def place_kubeconfig(self, run_dir: Path, source: str | Path | None = None) -> Path:
        """The run's kubeconfig inside the jail (``run_dir/kubeconfig``, 0600, the jail user's): a copy of
        ``source``, or empty until the identity it runs as is known (a standby's, see Runner.warm)."""
        target = run_dir / "kubeconfig"
        if source is None:
            target.write_bytes(b"")
        else:
            shutil.copyfile(source, target)
        target.chmod(0o600)
        self.own(target)
        return target

    @staticmethod
    def upstream(kubeconfig: Path) -> tuple[str, int] | None:
        """The apiserver address the jail relays to for ``kubeconfig``; None in the process sandbox, which has
        no network of its own (the kernel reaches the apiserver as it is)."""
        if sandbox.kind() == "process":
            return None
        return _apiserver(kubeconfig)

    def spec(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, run_dir: Path,
             relay_port: int | None) -> dict[str, Any]:
        """The sandbox of one run (:func:`gpulab.runtime.sandbox.prepare`'s JSON): what the jail exposes."""
        scratch = Path(tempfile.mkdtemp(prefix=_owned_prefix("jailroot")))
        scratch.chmod(0o755)  # the process sandbox's user reaches its root, /dev and /tmp in there
        mounts = [sandbox.Mount(str(p), str(p), read_only=True) for p in self.kept()]
        mounts.append(sandbox.Mount(str(run_dir), str(run_dir)))
        box = sandbox.SandboxSpec(
            argv=list(argv), env=dict(env), rootfs=scratch / "root", workdir=str(cwd),
            mounts=sorted(mounts, key=lambda m: m.container_path.count("/")),
            masks=[str(p) for p in sorted(self.masks(), key=lambda p: len(p.parts))],
            uid=self.uid, gid=self.uid, memory_bytes=self.memory_bytes, nproc=self.nproc,
            file_bytes=self.file_bytes, nofile=self.nofile, nice=0,
            bare_root=True, tmp_size=self.tmp_size, proc_fallback=True, loopback=True,
            relay=(relay_port, str(run_dir / "apiserver.sock")) if relay_port is not None else None,
            namespace_root=False, no_new_privs=True, what="the grading jail")
        try:
            return sandbox.prepare(box)
        except BaseException:
            sandbox.discard({"scratch": str(scratch), "rootfs": str(box.rootfs)})
            raise

    @staticmethod
    def command(spec_path: Path) -> list[str]:
        return sandbox.command(spec_path)

    @staticmethod
    def cleanup(spec: Mapping[str, Any]) -> None:
        sandbox.discard(spec)

    # The host half of the apiserver relay.
    relay = staticmethod(sandbox.relay)

    # -- availability ----------------------------------------------------------

    def check(self) -> None:
        """Raise :class:`JailUnavailable` unless a jail can be created here (tried once)."""
        if self._checked:
            return
        sweep_stale()  # what graders killed before they could clean up left in the temp directory
        run_dir = self.make_run_dir()
        spec: dict[str, Any] = {}
        try:
            # The interpreter, not just /bin/true: the jail's user must reach the Python installation too.
            spec = self.spec([sys.executable, "-I", "-S", "-c", ""], {"PATH": "/usr/bin:/bin"}, run_dir, run_dir,
                             None)
            spec_path = run_dir / ".jail.json"
            spec_path.write_text(json.dumps(spec), encoding="utf-8")
            proc = subprocess.run(self.command(spec_path), capture_output=True, text=True, timeout=30)
            reason = (proc.stderr or proc.stdout).strip() or f"exit status {proc.returncode}"
        except sandbox.SandboxUnavailable as exc:
            proc, reason = None, str(exc)
        finally:
            if spec:
                self.cleanup(spec)
            remove_tree(run_dir)
        if proc is None or proc.returncode != 0:
            needs = ("grading needs root or unprivileged user namespaces "
                     "(sysctl kernel.unprivileged_userns_clone=1)")
            with contextlib.suppress(sandbox.SandboxUnavailable):
                if sandbox.kind() == "process":
                    needs = (f"{sandbox.SANDBOX_ENV}=process needs setpriv, proot and a Python installation "
                             "that the jail's user may read")
            raise JailUnavailable(
                f"cannot confine graded notebooks on this machine ({reason}); {needs}. "
                "--no-jail runs submissions with the grader's own file and network access")
        self._checked = True


def _apiserver(kubeconfig: Path) -> tuple[str, int]:
    try:
        doc = yaml.safe_load(kubeconfig.read_text(encoding="utf-8"))
        server = doc["clusters"][0]["cluster"]["server"]
    except (OSError, KeyError, IndexError, TypeError, yaml.YAMLError) as exc:
        raise JailUnavailable(f"{kubeconfig}: cannot read the apiserver address: {exc}") from exc
    url = urllib.parse.urlsplit(server)
    if url.hostname not in ("127.0.0.1", "localhost") or not url.port:
        raise JailUnavailable(f"the jail relays only a local apiserver (https://127.0.0.1:PORT), not {server}")
    return "127.0.0.1", url.port
