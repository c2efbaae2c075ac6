"""Host side of the container sandbox.

A container's command runs as an ordinary host process, isolated the way a
container runtime would isolate it, with the tools every Linux has. Two
sandboxes, chosen by ``GPULAB_SANDBOX``:

``namespaces`` (the default) — what a container runtime does:

- ``unshare`` (util-linux): new network (no interfaces but a down loopback —
  no network at all), mount, PID, UTS and IPC namespaces; when gpulab is not
  root, a user namespace too (which maps only the learner's own account);
- :mod:`gpulab.runtime.sandbox_init` inside them: the container's own root
  (system directories read-only, volumes and device-plugin mounts at their
  container paths), ``chroot``, the container's user, rlimits.

``process`` — a weaker sandbox for machines where namespaces cannot be made
(a JupyterHub or Binder container, a locked-down kernel), used only when
asked for: no namespaces at all. The command runs as a plain process in a
process group of its own, with the same rlimits, starting in a private
working directory; volumes and device-plugin mounts appear at their
container paths through ``proot`` (path translation with ptrace, no
privileges: ``apt-get install proot``), but read-only mounts are writable
where the host file is, the host's file system and processes are visible,
and there is no network isolation.

Both: memory as an address-space limit (``limits.memory``), CPU as a cap on
CPU seconds plus a lower scheduling priority (there is no portable CPU-rate
control without a cgroup manager), a process-count limit, and a wall-clock
limit enforced by the node agent.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from .sandbox_init import DEV_NODES

NOBODY = 65534
SANDBOXES = ("namespaces", "process")
SANDBOX_ENV = "GPULAB_SANDBOX"
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


def kind() -> str:
    """The sandbox ``GPULAB_SANDBOX`` asks for (``namespaces`` unless set)."""
    raw = os.environ.get(SANDBOX_ENV, "").strip() or "namespaces"
    if raw not in SANDBOXES:
        raise SandboxUnavailable(f"{SANDBOX_ENV}={raw!r} is not a sandbox gpulab knows; allowed: "
                                 "namespaces (the default), process (weaker, no namespaces; see README)")
    return raw


def _tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if not path:
        raise SandboxUnavailable(f"`{name}` ({package}) is not installed; gpulab needs it to run pod commands")
    return path


def _unshare_argv() -> list[str]:
    unshare, setpriv = _tool("unshare", "util-linux"), _tool("setpriv", "util-linux")
    # setpriv sets the death signal: if whoever started the sandbox dies without stopping it
    # (the container's shim, or the node agent for a probe, killed with SIGKILL), the kernel
    # kills it too. Doing it in a preexec_fn instead would make subprocess fork() the caller,
    # and gRPC's fork handlers then abort some children.
    argv = [setpriv, "--pdeathsig", "KILL", unshare, "--net", "--mount", "--pid", "--uts", "--ipc", "--fork",
            "--kill-child"]
    if os.geteuid() != 0:
        argv += ["--user", "--map-root-user"]
    return argv


def _process_argv(spec: dict, spec_path: Path) -> list[str]:
    """``process`` sandbox: setpriv, proot, then :mod:`gpulab.runtime.sandbox_init` and the command.

    setpriv sets the death signal and, as root, the container's user (before
    proot, whose loader must belong to the user it traces); proot places the
    mounts at their container paths over a private ``/dev`` and starts in the
    working directory; sandbox_init sets the limits and runs the command.
    """
    setpriv, proot = _tool("setpriv", "util-linux"), _tool("proot", "Debian/Ubuntu package proot")
    argv = [setpriv, "--pdeathsig", "KILL"]
    uid, gid = spec.get("uid"), spec.get("gid")
    if os.geteuid() == 0 and uid is not None:
        argv += [f"--reuid={uid}", f"--regid={gid if gid is not None else uid}", "--clear-groups"]
    scratch = Path(spec["scratch"])
    workdir = spec.get("workdir") or "/"
    if workdir == "/":
        # No root of its own to start in: a private scratch directory instead of the host's /.
        workdir = str(scratch / "work")
    argv += [proot, "--verbose=-1", "-w", workdir, "-b", f"{scratch / 'dev'}:/dev"]
    for name in DEV_NODES:
        if os.path.exists(f"/dev/{name}"):
            argv += ["-b", f"/dev/{name}:/dev/{name}"]
    for m in spec.get("mounts", []) + spec.get("devices", []):
        argv += ["-b", f"{m['host_path']}:{m['container_path']}"]
    # A system interpreter, which the container's user can run (a virtualenv's may live in a
    # private home); sandbox_init needs nothing but the standard library.
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    return argv + [python, "-I", "-S", str(scratch / "sandbox_init.py"), str(spec_path)]


def _private_dev(scratch: Path, devices: list[Mount]) -> None:
    """The process sandbox's /dev: names only (proot binds the real nodes over them), so it lists like a container's."""
    dev = scratch / "dev"
    dev.mkdir(exist_ok=True)
    for name in list(DEV_NODES) + [Path(d.container_path).name for d in devices
                                   if d.container_path.startswith("/dev/")]:
        (dev / name).touch()
    shm = dev / "shm"
    shm.mkdir(exist_ok=True)
    shm.chmod(0o1777)
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        if not (dev / name).is_symlink():
            (dev / name).symlink_to(f"/proc/self/fd/{fd}")


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def diagnose(stderr: str, read: Callable[[str], str | None] = _read,
             env: Mapping[str, str] = os.environ) -> str:
    """Why namespaces could not be made here, and the exact remedy for the common cases."""
    remedies = []
    if read("/proc/sys/kernel/unprivileged_userns_clone") == "0":
        remedies.append("Debian kernels: `sudo sysctl -w kernel.unprivileged_userns_clone=1` "
                        "(add it to /etc/sysctl.d/ to keep it)")
    if read("/proc/sys/user/max_user_namespaces") == "0":
        remedies.append("user namespaces are switched off: `sudo sysctl -w user.max_user_namespaces=15000`")
    if read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
        remedies.append("Ubuntu 23.10 and later (AppArmor): "
                        "`sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`, or an AppArmor profile "
                        "that allows `userns` for /usr/bin/unshare")
    if read("/.dockerenv") is not None or env.get("KUBERNETES_SERVICE_HOST") or env.get("container"):
        remedies.append("inside a container, its seccomp profile usually forbids them: run it with "
                        "`--security-opt seccomp=unconfined` (Docker, Podman) or "
                        "`securityContext: {seccompProfile: {type: Unconfined}}` (Kubernetes, JupyterHub)")
    if not remedies:
        remedies.append("run gpulab as root, or enable unprivileged user namespaces for your account")
    remedies.append(f"or, knowing it isolates much less, set {SANDBOX_ENV}=process "
                    "(pods run as plain processes; needs `proot`; see README)")
    return (f"cannot create namespaces for pod sandboxes ({stderr or 'unshare failed'}). Remedies:\n"
            + "\n".join(f"  - {r}" for r in remedies))


def check() -> None:
    """Fail early, before anything starts, with the reason and the remedy, if pods cannot be sandboxed here."""
    if kind() == "process":
        for name, package in (("setpriv", "util-linux"), ("proot", "Debian/Ubuntu package proot")):
            _tool(name, package)
        return
    argv = _unshare_argv() + ["true"]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SandboxUnavailable(diagnose(proc.stderr.strip()))


def write_spec(spec: SandboxSpec, spec_path: Path) -> None:
    """Write what :mod:`gpulab.runtime.sandbox_init` reads, and the container's scratch root."""
    if os.geteuid() != 0:
        # Inside a user namespace with only root mapped, there is no other
        # user to drop to; the process is unprivileged on the host already.
        spec = dataclasses.replace(spec, uid=None, gid=None)
    spec.rootfs.mkdir(parents=True, exist_ok=True)
    data = spec.to_json()
    data["sandbox"] = kind()
    if data["sandbox"] == "process":
        scratch = spec.rootfs.parent
        # Its private working directory and /dev, and sandbox_init where the container's user can read it.
        work = scratch / "work"
        work.mkdir(exist_ok=True)
        if os.geteuid() == 0 and spec.uid is not None:
            os.chown(work, spec.uid, spec.gid if spec.gid is not None else spec.uid)
        _private_dev(scratch, spec.devices)
        shutil.copyfile(Path(__file__).with_name("sandbox_init.py"), scratch / "sandbox_init.py")
    spec_path.write_text(json.dumps(data))


def launch_spec_file(spec_path: Path, stdout: int, stderr: int) -> subprocess.Popen:
    """Start the sandboxed process described by ``spec_path``; its pid is that of ``unshare``."""
    spec = json.loads(spec_path.read_text())
    if spec.get("sandbox") == "process":
        argv = _process_argv(spec, spec_path)
    else:
        init = Path(__file__).with_name("sandbox_init.py")
        argv = _unshare_argv() + ["--", sys.executable, "-I", "-S", str(init), str(spec_path)]
    return subprocess.Popen(
        argv,
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
