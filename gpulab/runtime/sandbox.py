"""Host side of gpulab's sandbox: pods' containers and the grading jail run in it.

A container's command runs as an ordinary host process, isolated the way a
container runtime would isolate it, with the tools every Linux has. Two
sandboxes, chosen by ``GPULAB_SANDBOX``:

``namespaces`` (the default) — what a container runtime does:

- a pod's container joins its pod's network namespace (``nsenter``: the pod
  network's, :mod:`gpulab.runtime.network`, and without root the user
  namespace that owns it) and gets new mount, PID, UTS and IPC namespaces
  (``unshare``, util-linux); any other sandbox (the grading jail) gets a new
  network namespace too (no interfaces but a down loopback — no network at
  all) and, when gpulab is not root, a user namespace of its own (which maps
  only the learner's own account);
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

This is gpulab's one sandbox: the grading jail (:mod:`gpulab.grading.jail`)
is a :class:`SandboxSpec` too, one that states what it exposes — a
``bare_root`` (nothing but the system directories and its mounts: in the
namespaces sandbox an empty read-only tmpfs root, in the process sandbox
``proot -r`` on an empty directory, so the host's other files are not there),
``masks``, a private ``/tmp``, the loopback interface up and a :func:`relay`
to a single TCP service, and, without root, the caller's own uid with no
capabilities instead of a container's uid 0 (``namespace_root=False``). In
the process sandbox there is no network isolation and ptrace is no security
boundary: a program that attacks proot itself (kills or traces it) leaves the
view proot gives it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from .._fsutil import remove_tree
from ..i18n import _
from .sandbox_init import DEV_NODES, SYSTEM_DIRS, pump

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
    """One sandboxed command; the defaults are a container's (see the module's docstring for the rest)."""

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
    nofile: int = 1024
    nice: int = 5
    # Container paths hidden behind an empty read-only directory (inside a mount that shows them).
    masks: list[str] = dataclasses.field(default_factory=list)
    # Nothing but the system directories, /proc, /dev, /tmp and the mounts, and no writable root
    # (a container's root is ``rootfs`` on disk, writable; in the process sandbox the host's).
    bare_root: bool = False
    # /tmp as a tmpfs of this size (process sandbox: a private directory); else a directory of the root.
    tmp_size: str | None = None
    # The host's /proc, read-only, where a fresh one cannot be mounted (some containers).
    proc_fallback: bool = False
    loopback: bool = False
    # (port, unix socket): 127.0.0.1:port inside reaches what :func:`relay` serves on the socket.
    relay: tuple[int, str] | None = None
    # Without real root: the command runs as root of its user namespace (True, a container's uid 0)
    # or as the caller's own uid with no capabilities at all (False).
    namespace_root: bool = True
    no_new_privs: bool = False
    # The pod's sandbox process (:mod:`gpulab.runtime.network`): the command joins its network namespace
    # (and, without root, the user namespace that owns it) instead of getting an empty one of its own.
    join_pid: int | None = None
    what: str = "the container"  # for messages

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
            "masks": list(self.masks),
            "uid": self.uid,
            "gid": self.gid,
            "limits": {
                "memory_bytes": self.memory_bytes,
                "cpu_seconds": self.cpu_seconds,
                "nproc": self.nproc,
                "file_bytes": self.file_bytes,
                "nofile": self.nofile,
            },
            "nice": self.nice,
            "bare_root": self.bare_root,
            "tmp_size": self.tmp_size,
            "proc_fallback": self.proc_fallback,
            "loopback": self.loopback,
            "relay": {"port": self.relay[0], "socket": self.relay[1]} if self.relay else None,
            "namespace_root": self.namespace_root,
            "no_new_privs": self.no_new_privs,
            "join_pid": self.join_pid,
            "what": self.what,
        }


def kind() -> str:
    """The sandbox ``GPULAB_SANDBOX`` asks for (``namespaces`` unless set)."""
    raw = os.environ.get(SANDBOX_ENV, "").strip() or "namespaces"
    if raw not in SANDBOXES:
        raise SandboxUnavailable(_("{variable}={value!r} is not a sandbox gpulab knows; allowed: "
                                   "namespaces (the default), process (weaker, no namespaces; see README)",
                                   variable=SANDBOX_ENV, value=raw))
    return raw


def _tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if not path:
        raise SandboxUnavailable(_("`{program}` ({package}) is not installed; gpulab needs it to run pod commands",
                                   program=name, package=package))
    return path


def _unshare_argv(join_pid: int | None = None) -> list[str]:
    unshare, setpriv = _tool("unshare", "util-linux"), _tool("setpriv", "util-linux")
    # setpriv sets the death signal: if whoever started the sandbox dies without stopping it
    # (the container's shim, or the node agent for a probe, killed with SIGKILL), the kernel
    # kills it too. Doing it in a preexec_fn instead would make subprocess fork() the caller,
    # and gRPC's fork handlers then abort some children.
    argv = [setpriv, "--pdeathsig", "KILL"]
    if join_pid is not None:
        # A pod's container: into its sandbox's network namespace (root of the pod network's user
        # namespace, without real root: credentials kept, the caller's uid is root there), then the rest new.
        argv += [_tool("nsenter", "util-linux"), f"--target={join_pid}"]
        if os.geteuid() != 0:
            argv += ["--user", "--preserve-credentials"]
        return argv + ["--net", "--", unshare, "--mount", "--pid", "--uts", "--ipc", "--fork", "--kill-child"]
    argv += [unshare, "--net", "--mount", "--pid", "--uts", "--ipc", "--fork", "--kill-child"]
    if os.geteuid() != 0:
        argv += ["--user", "--map-root-user"]
    return argv


def _process_argv(spec: dict, spec_path: Path) -> list[str]:
    """``process`` sandbox: setpriv, proot, then :mod:`gpulab.runtime.sandbox_init` and the command.

    setpriv sets the death signal and, as root, the sandbox's user (before
    proot, whose loader must belong to the user it traces); proot places the
    mounts at their paths over a private ``/dev`` — with ``bare_root`` on an
    empty root of its own holding nothing else — and starts in the working
    directory; sandbox_init sets the seccomp filter and the limits and runs
    the command.
    """
    setpriv, proot = _tool("setpriv", "util-linux"), _tool("proot", "Debian/Ubuntu package proot")
    argv = [setpriv, "--pdeathsig", "KILL"]
    uid, gid = spec.get("uid"), spec.get("gid")
    if os.geteuid() == 0 and uid is not None:
        argv += [f"--reuid={uid}", f"--regid={gid if gid is not None else uid}", "--clear-groups"]
    scratch = Path(spec["scratch"])
    init = scratch / "sandbox_init.py"
    workdir = spec.get("workdir") or "/"
    if workdir == "/":
        # No root of its own to start in: a private scratch directory instead of the host's /.
        workdir = str(scratch / "work")
    argv += [proot, "--verbose=-1"]
    if spec.get("bare_root"):
        # prepare() made that root: the system directories' symlinks and a read-only mount point per bind.
        argv += ["-r", spec["rootfs"], "-b", "/proc", "-b", str(init), "-b", str(spec_path)]
        argv += [x for d in SYSTEM_DIRS if os.path.isdir(d) and not os.path.islink(d) for x in ("-b", d)]
    argv += ["-w", workdir, "-b", f"{scratch / 'dev'}:/dev"]
    for name in DEV_NODES:
        if os.path.exists(f"/dev/{name}"):
            argv += ["-b", f"/dev/{name}:/dev/{name}"]
    if spec.get("tmp_size"):
        argv += ["-b", f"{scratch / 'tmp'}:/tmp"]
    for m in spec.get("mounts", []) + spec.get("devices", []):
        argv += ["-b", f"{m['host_path']}:{m['container_path']}"]
    for mask in spec.get("masks", []):
        argv += ["-b", f"{scratch / 'empty'}:{mask}"]
    # A system interpreter, which the sandbox's user can run (a virtualenv's may live in a
    # private home); sandbox_init needs nothing but the standard library.
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    return argv + [python, "-I", "-S", str(init), str(spec_path)]


def _private_dir(path: Path, spec: SandboxSpec, mode: int = 0o755) -> None:
    """A directory of the process sandbox's scratch, the sandbox's user's when gpulab is root."""
    path.mkdir(exist_ok=True)
    path.chmod(mode)
    if os.geteuid() == 0 and spec.uid is not None:
        os.chown(path, spec.uid, spec.gid if spec.gid is not None else spec.uid)


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


def _bare_root(spec: SandboxSpec) -> None:
    """The process sandbox's own root for ``proot -r``: the system directories' symlinks (/bin -> usr/bin)
    and a mount point for everything bound there, all read-only (proot would make writable stand-ins)."""
    root = spec.rootfs
    points = [(d, True) for d in (*SYSTEM_DIRS, "/proc", "/dev", "/tmp") if os.path.isdir(d) and not os.path.islink(d)]
    points += [(m.container_path, os.path.isdir(m.host_path)) for m in spec.mounts + spec.devices]
    for d in SYSTEM_DIRS:
        if os.path.islink(d) and not (root / d.lstrip("/")).is_symlink():
            (root / d.lstrip("/")).symlink_to(os.readlink(d))
    for path, is_dir in points:
        parts = Path(path).parts[1:]
        if not parts or (root / parts[0]).is_symlink():
            continue  # inside a system directory: there already
        target = root.joinpath(*parts)
        if is_dir:
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()
    for dirpath, _dirs, files in os.walk(root, topdown=False):
        for path in (os.path.join(dirpath, name) for name in files):
            if not os.path.islink(path):
                os.chmod(path, 0o444)
        os.chmod(dirpath, 0o555)


def discard(spec: Mapping) -> None:
    """Remove the scratch directory :func:`prepare` made ready (for a sandbox that has ended)."""
    # The process sandbox's read-only root and an overlay's mode-000 work directory: its owner empties them.
    remove_tree(spec["scratch"])


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
        remedies.append(_("Debian kernels: `sudo sysctl -w kernel.unprivileged_userns_clone=1` "
                          "(add it to /etc/sysctl.d/ to keep it)"))
    if read("/proc/sys/user/max_user_namespaces") == "0":
        remedies.append(_("user namespaces are switched off: `sudo sysctl -w user.max_user_namespaces=15000`"))
    if read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
        remedies.append(_("Ubuntu 23.10 and later (AppArmor): "
                          "`sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`, or an AppArmor profile "
                          "that allows `userns` for /usr/bin/unshare"))
    if read("/.dockerenv") is not None or env.get("KUBERNETES_SERVICE_HOST") or env.get("container"):
        remedies.append(_("inside a container, its seccomp profile usually forbids them: run it with "
                          "`--security-opt seccomp=unconfined` (Docker, Podman) or "
                          "`securityContext: {seccompProfile: {type: Unconfined}}` (Kubernetes, JupyterHub)"))
    if not remedies:
        remedies.append(_("run gpulab as root, or enable unprivileged user namespaces for your account"))
    remedies.append(_("or, knowing it isolates much less, set {variable}=process "
                      "(pods run as plain processes; needs `proot`; see README)", variable=SANDBOX_ENV))
    return (_("cannot create namespaces for pod sandboxes ({why}). Remedies:", why=stderr or _("unshare failed"))
            + "\n" + "\n".join(f"  - {r}" for r in remedies))


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


def prepare(spec: SandboxSpec) -> dict:
    """What :mod:`gpulab.runtime.sandbox_init` reads, after making the sandbox's scratch directory ready."""
    if os.geteuid() != 0:
        # Inside a user namespace with only root mapped, there is no other
        # user to drop to; the process is unprivileged on the host already.
        spec = dataclasses.replace(spec, uid=None, gid=None)
    spec.rootfs.mkdir(parents=True, exist_ok=True)
    data = spec.to_json()
    data["sandbox"] = kind()
    if data["sandbox"] == "process":
        scratch = spec.rootfs.parent
        # Its private working directory and /dev, and sandbox_init where the sandbox's user can read it.
        _private_dir(scratch / "work", spec)
        _private_dev(scratch, spec.devices)
        shutil.copyfile(Path(__file__).with_name("sandbox_init.py"), scratch / "sandbox_init.py")
        if spec.bare_root:
            _bare_root(spec)
        if spec.tmp_size:
            _private_dir(scratch / "tmp", spec, 0o1777)
        if spec.masks:
            _private_dir(scratch / "empty", dataclasses.replace(spec, uid=None), 0o555)
    return data


def write_spec(spec: SandboxSpec, spec_path: Path) -> None:
    """Write what :mod:`gpulab.runtime.sandbox_init` reads, and the sandbox's scratch root."""
    spec_path.write_text(json.dumps(prepare(spec)))


def command(spec_path: Path) -> list[str]:
    """The command line that runs the sandbox ``spec_path`` describes (written by :func:`write_spec`)."""
    spec = json.loads(spec_path.read_text())
    if spec.get("sandbox") == "process":
        return _process_argv(spec, spec_path)
    init = Path(__file__).with_name("sandbox_init.py")
    return _unshare_argv(spec.get("join_pid")) + ["--", sys.executable, "-I", "-S", str(init), str(spec_path)]


# What proot may exit with when the processes it traces were killed (it does not say by what):
# the process sandbox's init turns a signal death of the command into 128 + the signal, but SIGKILL
# takes that init too.
PROOT_SIGNALLED = (0, 255)


def signal_sandbox(spec_path: Path, leader: int, sig: int) -> None:
    """Send ``sig`` to the sandboxed processes as a container runtime signals a container's.

    The namespaces sandbox's group is signalled whole. The process sandbox's leader is proot,
    whose own SIGTERM handler kills what it traces and exits 0 — the workload would neither
    see the signal nor be seen dying of it — so there the signal goes to the traced processes
    (proot's descendants) only, and to proot itself when none is left.
    """
    targets: list[int] = []
    try:
        process_mode = json.loads(Path(spec_path).read_text()).get("sandbox") == "process"
    except (OSError, ValueError):
        process_mode = False
    if process_mode:
        import psutil

        with contextlib.suppress(psutil.Error):
            targets = [p.pid for p in psutil.Process(leader).children(recursive=True)]
    if not targets:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(leader, sig)
        return
    for pid in targets:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def signalled_status(spec_path: Path, returncode: int, sent: int | None) -> int:
    """The exit status to report for a sandbox the node killed (``sent``): what proot says becomes the SIGKILL."""
    if sent != signal.SIGKILL or returncode not in PROOT_SIGNALLED:
        return returncode
    try:
        process_mode = json.loads(Path(spec_path).read_text()).get("sandbox") == "process"
    except (OSError, ValueError):
        return returncode
    return -sent if process_mode else returncode


def launch_spec_file(spec_path: Path, stdout: int, stderr: int) -> subprocess.Popen:
    """Start the sandboxed process described by ``spec_path``; its pid is that of ``unshare``."""
    return subprocess.Popen(
        command(spec_path),
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


# -- the host half of the relay ------------------------------------------------------


@contextlib.contextmanager
def relay(socket_path: Path, upstream: tuple[str, int] | None) -> Iterator[None]:
    """While inside, serve the unix socket of a :attr:`SandboxSpec.relay`: each connection goes on to ``upstream``."""
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
                              name="gpulab-sandbox-relay")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=2)
        server.close()


def _accept_loop(server: socket.socket, upstream: tuple[str, int], stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            client, _address = server.accept()
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
            threading.Thread(target=pump, args=(a, b), daemon=True).start()
