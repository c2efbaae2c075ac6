"""The grading jail: what a graded notebook's kernel can see and reach.

A submission is code from a learner, run on the instructor's machine next to
the cluster's CA key, the admin kubeconfig, etcd (no authentication, on
127.0.0.1), the hidden checks and every other learner's work. RBAC only
means something if the kernel can reach none of those, so
:class:`gpulab.grading.runner.Runner` with a :class:`Jail` starts papermill
(and so the kernel and whatever it spawns) through
:mod:`gpulab.grading._jail_init`, which gives it

- its own root: system directories, the Python installation and the
  repository, read-only — with the instructor's private directories (hidden
  checks, submissions, the output folder) masked even where they lie inside
  the repository — plus a private ``/tmp`` and one writable run directory;
  the grader's home, ``GPULAB_HOME`` and everything else on the host are not
  there;
- its own network: nothing but a relay to the apiserver named in the kernel's
  ``KUBECONFIG`` (the restricted identity's), at the same 127.0.0.1 address,
  so TLS verification works unchanged;
- no privileges: ``nobody`` when the grader is root, otherwise the grader's
  uid inside a user namespace with no capabilities; ``no_new_privs``;
  limits on address space, processes, file size and open files.

Needs root or unprivileged user namespaces (as the pod sandbox does).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

import gpulab

# The relay outside the jail pumps bytes as the one inside it does (one copy).
from ._jail_init import _pump

NOBODY = 65534

INIT = Path(__file__).with_name("_jail_init.py")


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
    return any(path == Path(d) or Path(d) in path.parents for d in ("/usr", "/bin", "/sbin", "/lib", "/lib64",
                                                                      "/etc"))


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
    python: str = sys.executable
    _checked: bool = field(default=False, init=False, repr=False)

    # -- what is visible ------------------------------------------------------

    def kept(self) -> list[Path]:
        """Host paths visible read-only inside (besides system directories and the run directory)."""
        paths = [_repo_root(), *_python_roots(), *(Path(p) for p in self.keep)]
        return [p for p in _outermost([p for p in paths if p.exists()]) if not _system_path(p)]

    def masks(self) -> list[Path]:
        """Masked paths that would otherwise be visible (inside a kept path)."""
        kept = self.kept()
        found = []
        for m in self.mask:
            path = Path(m).resolve()
            if any(path == k or k in path.parents for k in kept):
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
        run_dir = Path(tempfile.mkdtemp(prefix="gpulab-run-"))
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
            target = run_dir / "kubeconfig"
            shutil.copyfile(source, target)
            target.chmod(0o600)
            self.own(target)
            env["KUBECONFIG"] = str(target)
            upstream = _apiserver(target)
        return env, upstream

    def spec(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, run_dir: Path,
             relay_port: int | None) -> dict[str, Any]:
        root = Path(tempfile.mkdtemp(prefix="gpulab-jailroot-"))
        binds = [{"source": str(p), "target": str(p)} for p in self.kept()]
        binds.append({"source": str(run_dir), "target": str(run_dir), "rw": True})
        spec: dict[str, Any] = {
            "argv": list(argv), "env": dict(env), "cwd": str(cwd), "root": str(root), "binds": binds,
            "masks": [str(p) for p in self.masks()], "python": self.python, "tmp_size": self.tmp_size,
            "uid": self.uid, "gid": self.uid,
            "limits": {"memory_bytes": self.memory_bytes, "nproc": self.nproc, "file_bytes": self.file_bytes,
                       "nofile": self.nofile},
        }
        if relay_port is not None:
            spec["relay"] = {"port": relay_port, "socket": str(run_dir / "apiserver.sock")}
        return spec

    def command(self, spec_path: Path) -> list[str]:
        return [self.python, "-I", "-S", str(INIT), str(spec_path)]

    @staticmethod
    def cleanup(spec: Mapping[str, Any]) -> None:
        with contextlib.suppress(OSError):
            os.rmdir(spec["root"])  # a mount point only inside the jail's mount namespace; empty here

    # -- the host half of the apiserver relay --------------------------------

    @contextlib.contextmanager
    def relay(self, socket_path: Path, upstream: tuple[str, int] | None) -> Iterator[None]:
        if upstream is None:
            yield
            return
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(socket_path))
        socket_path.chmod(0o666)
        server.listen(64)
        server.settimeout(0.2)
        stop = threading.Event()
        thread = threading.Thread(target=_accept_loop, args=(server, upstream, stop), daemon=True,
                                  name="gpulab-jail-relay")
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=2)
            server.close()

    # -- availability ----------------------------------------------------------

    def check(self) -> None:
        """Raise :class:`JailUnavailable` unless a jail can be created here (tried once)."""
        if self._checked:
            return
        run_dir = self.make_run_dir()
        spec = self.spec(["/bin/true"], {"PATH": "/usr/bin:/bin"}, run_dir, run_dir, None)
        spec_path = run_dir / ".jail.json"
        try:
            import json

            spec_path.write_text(json.dumps(spec), encoding="utf-8")
            proc = subprocess.run(self.command(spec_path), capture_output=True, text=True, timeout=30)
        finally:
            self.cleanup(spec)
            shutil.rmtree(run_dir, ignore_errors=True)
        if proc.returncode != 0:
            raise JailUnavailable(
                "cannot confine graded notebooks on this machine "
                f"({(proc.stderr or proc.stdout).strip() or f'exit status {proc.returncode}'}); "
                "grading needs root or unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1). "
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


def _accept_loop(server: socket.socket, upstream: tuple[str, int], stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            client, _ = server.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        client.settimeout(None)
        try:
            target = socket.create_connection(upstream, timeout=10)
            target.settimeout(None)
        except OSError:
            client.close()
            continue
        for a, b in ((client, target), (target, client)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()
