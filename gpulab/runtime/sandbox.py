"""Host side of the container sandbox.

A container's command runs as an ordinary host process, isolated the way a
container runtime would isolate it, with the tools every Linux has:

- ``unshare`` (util-linux): new network (no interfaces but a down loopback —
  no network at all), mount, PID, UTS and IPC namespaces; when gpulab is not
  root, a user namespace too;
- :mod:`gpulab.runtime.sandbox_init` inside them: the container's own root
  (system directories read-only, volumes and device-plugin mounts at their
  container paths), ``chroot``, the container's user, rlimits;
- limits: memory as an address-space limit (``limits.memory``), CPU as a cap
  on CPU seconds plus a lower scheduling priority (there is no portable
  CPU-rate control without a cgroup manager), a process-count limit, and a
  wall-clock limit enforced by the node agent.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

NOBODY = 65534
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class SandboxUnavailable(RuntimeError):
    pass


@dataclasses.dataclass
class Mount:
    host_path: str
    container_path: str
    read_only: bool = False


@dataclasses.dataclass
class SandboxSpec:
    argv: list[str]
    env: dict[str, str]
    rootfs: Path
    workdir: str = "/"
    hostname: str = ""
    mounts: list[Mount] = dataclasses.field(default_factory=list)
    devices: list[Mount] = dataclasses.field(default_factory=list)
    uid: int | None = NOBODY
    gid: int | None = NOBODY
    memory_bytes: int | None = None
    cpu_seconds: int | None = None
    nproc: int = 512
    file_bytes: int | None = None

    def to_json(self) -> dict:
        return {
            "argv": self.argv,
            "env": self.env,
            "rootfs": str(self.rootfs),
            "scratch": str(self.rootfs.parent),
            "workdir": self.workdir,
            "hostname": self.hostname,
            "mounts": [dataclasses.asdict(m) for m in self.mounts],
            "devices": [dataclasses.asdict(m) for m in self.devices],
            "uid": self.uid,
            "gid": self.gid,
            "limits": {
                "memory_bytes": self.memory_bytes,
                "cpu_seconds": self.cpu_seconds,
                "nproc": self.nproc,
                "file_bytes": self.file_bytes,
            },
        }


def _unshare_argv() -> list[str]:
    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    if not unshare or not setpriv:
        missing = " and ".join(f"`{n}`" for n, p in (("unshare", unshare), ("setpriv", setpriv)) if not p)
        raise SandboxUnavailable(f"{missing} (util-linux) not installed; gpulab needs it to run pod commands")
    # setpriv sets the death signal: if whoever started the sandbox dies without stopping it
    # (the container's shim, or the node agent for a probe, killed with SIGKILL), the kernel
    # kills it too. Doing it in a preexec_fn instead would make subprocess fork() the caller,
    # and gRPC's fork handlers then abort some children.
    argv = [setpriv, "--pdeathsig", "KILL", unshare, "--net", "--mount", "--pid", "--uts", "--ipc", "--fork",
            "--kill-child"]
    if os.geteuid() != 0:
        argv += ["--user", "--map-root-user"]
    return argv


def check() -> None:
    """Fail early, with the reason, if namespaces cannot be created here."""
    argv = _unshare_argv() + ["true"]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SandboxUnavailable(
            "cannot create namespaces for pod sandboxes "
            f"({' '.join(argv)}: {proc.stderr.strip() or proc.returncode}); "
            "gpulab needs root or unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1)"
        )


def write_spec(spec: SandboxSpec, spec_path: Path) -> None:
    """Write what :mod:`gpulab.runtime.sandbox_init` reads, and the container's scratch root."""
    if os.geteuid() != 0:
        # Inside a user namespace with only root mapped, there is no other
        # user to drop to; the process is unprivileged on the host already.
        spec = dataclasses.replace(spec, uid=None, gid=None)
    spec.rootfs.mkdir(parents=True, exist_ok=True)
    spec_path.write_text(json.dumps(spec.to_json()))


def launch_spec_file(spec_path: Path, stdout: int, stderr: int) -> subprocess.Popen:
    """Start the sandboxed process described by ``spec_path``; its pid is that of ``unshare``."""
    init = Path(__file__).with_name("sandbox_init.py")
    return subprocess.Popen(
        _unshare_argv() + ["--", sys.executable, "-I", "-S", str(init), str(spec_path)],
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        env={"PATH": DEFAULT_PATH},
        start_new_session=True,
        close_fds=True,
    )


def launch(spec: SandboxSpec, spec_path: Path, stdout: int, stderr: int) -> subprocess.Popen:
    """Start the sandboxed process; its pid is that of ``unshare``."""
    write_spec(spec, spec_path)
    return launch_spec_file(spec_path, stdout, stderr)
