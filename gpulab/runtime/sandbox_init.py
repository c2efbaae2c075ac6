"""The inside half of gpulab's sandbox: turns itself into the sandboxed command.

:mod:`gpulab.runtime.sandbox` (the host half, which describes both sandboxes
and the spec) starts it as ``python -I -S sandbox_init.py SPEC``. It serves a
pod's container and the grading jail (:mod:`gpulab.grading.jail`) alike; the
spec says what each one exposes.

``namespaces``: started by
``unshare --net --mount --pid --uts --ipc --fork [--user --map-root-user]``, it
is (namespaced) root with the host's mounts privately copied. It:

1. builds the sandbox's root: the host's system directories bound read-only,
   a fresh ``/proc``, a minimal ``/dev``, ``/tmp``, the spec's mounts and
   device nodes at their paths and the masks (empty read-only directories)
   over what must stay hidden. The root is ``rootfs`` on disk, writable (a
   container's), or with ``bare_root`` an empty tmpfs, read-only once built
   (the jail's: nothing there but what the spec names);
2. sets the hostname and, with ``loopback``, brings up the loopback interface
   of the new network namespace (otherwise it stays down: no network at all);
3. takes the sandbox's user: as real root, ``uid``/``gid``; otherwise root of
   its user namespace (a container's uid 0) or, without ``namespace_root``,
   the caller's own uid in a nested user namespace, so that ``exec`` leaves it
   no capabilities at all; then ``chroot``, the working directory and, with
   ``no_new_privs`` (in both sandboxes), no way to gain privileges;
4. with a ``relay``, starts a process that listens on that 127.0.0.1 port
   inside and forwards each connection to a unix socket, behind which the host
   half (:func:`gpulab.runtime.sandbox.relay`) reaches the one TCP service
   the sandbox may use.

``process``: proot has placed the view and setpriv the user; here only a
seccomp filter turns off the system calls proot does not translate.

Both then: the parent-death signal, resource limits, a lower priority, and
``exec`` of the command with the spec's environment. Standard library only,
and nothing here survives the ``exec``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import json
import os
import resource
import signal
import socket
import struct
import sys
import threading
import time

CLONE_NEWUSER = 0x10000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21

PR_SET_PDEATHSIG = 1
PR_SET_SECCOMP = 22
PR_SET_NO_NEW_PRIVS = 38
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/etc")
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    rc = _libc.mount(source.encode() if source else None, target.encode(), fstype.encode() if fstype else None,
                     ctypes.c_ulong(flags), data.encode() if data else None)
    _check(rc, f"mount {source or fstype} on {target}")


def _locked_flags(path: str) -> int:
    """Flags of the mount holding ``path`` that a user namespace may not clear on remount."""
    st = os.statvfs(path).f_flag
    flags = 0
    for st_flag, ms_flag in ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
                             (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME),
                             (os.ST_RELATIME, MS_RELATIME)):
        if st & st_flag:
            flags |= ms_flag
    return flags


def _bind(source: str, target: str, read_only: bool) -> None:
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target):
            open(target, "a").close()
    _mount(source, target, None, MS_BIND | MS_REC)
    if read_only:
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV
        try:
            _mount(None, target, None, flags)
        except OSError:
            _mount(None, target, None, flags | _locked_flags(target))


def _layer(lower: str, target: str, scratch: str, inner: list[str]) -> None:
    """A writable copy-on-write view of ``lower`` at ``target``; the host's files stay untouched.

    ``inner`` are the directories (relative to ``lower``) that will hold mount
    points. They are made in the upper layer before it is mounted: in a user
    namespace the host's root-owned directories cannot be copied up (their
    owner is not mapped), but a directory already in the upper layer needs no
    copy-up, and the mount points go there.
    """
    upper, work = os.path.join(scratch, "upper"), os.path.join(scratch, "work")
    os.makedirs(upper, exist_ok=True)
    os.makedirs(work, exist_ok=True)
    os.makedirs(target, exist_ok=True)
    for rel in inner:
        if rel and os.path.isdir(os.path.join(lower, rel)):
            os.makedirs(os.path.join(upper, rel), mode=0o755, exist_ok=True)
    try:
        _mount("overlay", target, "overlay", 0, f"lowerdir={lower},upperdir={upper},workdir={work}")
        return
    except OSError:
        pass
    # No overlayfs (older kernels in a user namespace): a tmpfs holding a
    # bind of each entry of the host directory.
    _mount("tmpfs", target, "tmpfs", MS_NOSUID, "mode=755")
    for entry in os.listdir(lower):
        src = os.path.join(lower, entry)
        if os.path.islink(src):
            os.symlink(os.readlink(src), os.path.join(target, entry))
        else:
            _bind(src, os.path.join(target, entry), read_only=True)


def _inside(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _through_links(path: str) -> str:
    """``path`` with a linked system directory replaced by its target, as the container's root resolves it
    (on a merged-/usr host /bin/prometheus is /usr/bin/prometheus)."""
    for d in SYSTEM_DIRS:
        if path.startswith(d + "/") and os.path.islink(d):
            return os.path.join(os.path.dirname(d), os.readlink(d), path[len(d) + 1:])
    return path


def build_root(spec: dict) -> None:
    root = spec["rootfs"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    os.makedirs(root, exist_ok=True)
    if spec.get("bare_root"):
        _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=1m")
    else:
        # The root itself must be a mount point for the binds below to be
        # independent of the host's mount tree.
        _mount(root, root, None, MS_BIND | MS_REC)
    targets = [_through_links(m["container_path"]) for m in spec.get("mounts", []) + spec.get("devices", [])]
    for d in SYSTEM_DIRS:
        if os.path.isdir(d) and not os.path.islink(d):
            if any(t.startswith(d + "/") for t in targets):
                # A volume goes inside a system directory (say /etc/config):
                # it needs a mount point there, which the read-only host
                # directory cannot take; give the container a layer of its own.
                inner = [os.path.dirname(t[len(d) + 1:]) for t in targets if t.startswith(d + "/")]
                _layer(d, _inside(root, d), os.path.join(spec["scratch"], "layers", d.strip("/")), inner)
            else:
                _bind(d, _inside(root, d), read_only=True)
        elif os.path.islink(d):
            link = _inside(root, d)
            if not os.path.lexists(link):
                os.symlink(os.readlink(d), link)
    proc = _inside(root, "/proc")
    os.makedirs(proc, exist_ok=True)
    try:
        _mount("proc", proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError:
        if not spec.get("proc_fallback"):
            raise
        # A proc mount needs a fully visible /proc (not so in some containers); the host's, read-only.
        _bind("/proc", proc, read_only=True)
    dev = _inside(root, "/dev")
    os.makedirs(dev, exist_ok=True)
    _mount("tmpfs", dev, "tmpfs", MS_NOSUID, "mode=755,size=64k")
    for name in DEV_NODES:
        if os.path.exists(f"/dev/{name}"):
            _bind(f"/dev/{name}", os.path.join(dev, name), read_only=False)
    os.makedirs(os.path.join(dev, "shm"), exist_ok=True)
    _mount("tmpfs", os.path.join(dev, "shm"), "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=64m")
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        os.symlink(f"/proc/self/fd/{fd}", os.path.join(dev, name))
    tmp = _inside(root, "/tmp")
    os.makedirs(tmp, exist_ok=True)
    if spec.get("tmp_size"):
        _mount("tmpfs", tmp, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={spec['tmp_size']}")
    else:
        os.chmod(tmp, 0o1777)
    for m in spec.get("mounts", []):
        _bind(m["host_path"], _inside(root, m["container_path"]), m.get("read_only", False))
    for d in spec.get("devices", []):
        _bind(d["host_path"], _inside(root, d["container_path"]), read_only=False)
    for mask in spec.get("masks", []):
        target = _inside(root, mask)
        if os.path.isdir(target):
            _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "mode=755,size=4k")
    if spec.get("bare_root"):
        # Every mount point exists now: nothing more may be written outside the mounts.
        _mount(None, root, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def set_limits(spec: dict) -> None:
    lim = spec.get("limits", {})
    if lim.get("memory_bytes"):
        resource.setrlimit(resource.RLIMIT_AS, (lim["memory_bytes"], lim["memory_bytes"]))
    if lim.get("cpu_seconds"):
        resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu_seconds"], lim["cpu_seconds"] + 5))
    if lim.get("nproc"):
        resource.setrlimit(resource.RLIMIT_NPROC, (lim["nproc"], lim["nproc"]))
    if lim.get("file_bytes"):
        resource.setrlimit(resource.RLIMIT_FSIZE, (lim["file_bytes"], lim["file_bytes"]))
    nofile = lim.get("nofile") or 1024
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


# -- the process sandbox's seccomp filter ----------------------------------------

# System calls that name a file but that proot 5 does not translate (it predates them), or that
# reach files without any system call it sees (io_uring): made to fail with ENOSYS, every libc and
# coreutils falls back to the translated ones (fstatat, openat, faccessat, execve...). Without this
# `ls /data` would miss a volume that `cat` finds, and openat2 would open the host's file.
_UNTRANSLATED_ARCH = {
    "x86_64": (0xC000003E, (332, 322)),   # statx, execveat
    "aarch64": (0xC00000B7, (291, 281)),  # statx, execveat
}
_UNTRANSLATED_COMMON = (  # numbered alike on every architecture since Linux 5.1
    425, 426, 427,  # io_uring_setup, io_uring_enter, io_uring_register
    428, 429, 430, 431, 432, 433,  # open_tree, move_mount, fsopen, fsconfig, fsmount, fspick
    437, 439, 442, 452,  # openat2, faccessat2, mount_setattr, fchmodat2
    463, 464, 465, 466, 467, 468, 469,  # *xattrat, open_tree_attr, file_getattr, file_setattr
)
_X32_SYSCALL_BIT = 0x40000000


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _deny_untranslated(strict: bool) -> None:
    """Install the process sandbox's seccomp filter (and ``no_new_privs``, which it needs).

    ``strict`` (a sandbox that hides the host's files) also refuses every
    other ABI: proot reads a 64-bit program's ``int 0x80`` (i386) system calls
    with the 64-bit numbers and leaves their paths alone.
    """
    arch = _UNTRANSLATED_ARCH.get(os.uname().machine)
    if arch is None:
        if strict:
            raise OSError(f"no system-call filter for {os.uname().machine}: proot alone cannot hide files")
        return
    audit_arch, own = arch
    numbers = own + _UNTRANSLATED_COMMON
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, enosys = 0x7FFF0000, 0x00050000 | 38  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | ENOSYS
    program = [_SockFilter(ld, 0, 0, 4),  # seccomp_data.arch
               _SockFilter(jeq, 1, 0, audit_arch),
               _SockFilter(ret, 0, 0, enosys if strict else allow),  # another ABI
               _SockFilter(ld, 0, 0, 0)]  # seccomp_data.nr
    checks = ([(jge, _X32_SYSCALL_BIT)] if audit_arch == 0xC000003E else []) + [(jeq, nr) for nr in numbers]
    for i, (op, k) in enumerate(checks):
        program.append(_SockFilter(op, len(checks) - i, 0, k))  # a match jumps to the last instruction
    program += [_SockFilter(ret, 0, 0, allow), _SockFilter(ret, 0, 0, enosys)]
    instructions = (_SockFilter * len(program))(*program)
    prog = _SockFprog(len(program), instructions)
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    _check(_libc.prctl(PR_SET_SECCOMP, 2, ctypes.byref(prog), 0, 0), "prctl(PR_SET_SECCOMP)")  # SECCOMP_MODE_FILTER


# -- the namespaces sandbox --------------------------------------------------------


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def _become_caller() -> None:
    """Root of this user namespace → the caller's own uid in a nested one, so that exec drops every capability."""
    ids = []
    for path in ("/proc/self/uid_map", "/proc/self/gid_map"):
        with open(path) as handle:
            ids.append(int(handle.readline().split()[1]))  # "0 <outside id> 1": whom root stands for
    if ids[0] == 0:
        raise OSError(1, "refusing to run the sandbox as root: no user namespace to leave")
    _check(_libc.unshare(ctypes.c_int(CLONE_NEWUSER)), "unshare(CLONE_NEWUSER)")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{ids[0]} 0 1")
    _write("/proc/self/gid_map", f"{ids[1]} 0 1")


def _loopback_up() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        ifr = struct.pack("16sH14s", b"lo", 0, b"\0" * 14)
        flags = struct.unpack("16sH14s", fcntl.ioctl(sock, SIOCGIFFLAGS, ifr))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | IFF_UP, b"\0" * 14))
    finally:
        sock.close()


def _enter(spec: dict) -> None:
    """The namespaces sandbox: its root, hostname, network, user and working directory."""
    build_root(spec)
    if spec.get("hostname"):
        _libc.sethostname(spec["hostname"].encode(), len(spec["hostname"]))
    if spec.get("loopback"):
        _loopback_up()
    uid, gid = spec.get("uid"), spec.get("gid")
    if uid is None and not spec.get("namespace_root", True):
        _become_caller()  # before chroot: a chrooted process may not make a user namespace
    os.chroot(spec["rootfs"])
    os.chdir("/")
    workdir = spec.get("workdir") or "/"
    if not os.path.isdir(workdir):
        # A runtime creates a missing workingDir, owned by the container's user.
        os.makedirs(workdir)
        if uid is not None:
            os.chown(workdir, uid, gid if gid is not None else uid)
    os.chdir(workdir)
    if os.getuid() == 0 and uid is not None:
        os.setgroups([])
        os.setgid(gid if gid is not None else uid)
        os.setuid(uid)


# -- the relay: one TCP port inside, a unix socket outside ----------------------------


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy bytes from ``src`` to ``dst`` until either side closes (one direction of a relayed connection)."""
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _serve_relay(port: int, path: str) -> None:
    """Accept on 127.0.0.1:``port`` and forward each connection to the unix socket ``path``."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(64)
    while True:
        client, _ = server.accept()
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(path)
        except OSError:
            client.close()
            upstream.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=pump, args=(a, b), daemon=True).start()


def _start_relay(relay: dict) -> None:
    port = int(relay["port"])
    if os.fork() == 0:
        try:
            # No exec here to drop what a nested user namespace still grants: drop it by hand.
            _check(_libc.capset(ctypes.byref(_CapHeader(0x20080522, 0)), (_CapData * 2)()), "capset")
            _serve_relay(port, relay["socket"])
        finally:
            os._exit(127)
    # A wait by hand: this file runs on its own (python -I -S), without gpulab._poll.
    deadline = time.monotonic() + 10.0
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise OSError(f"the relay did not start listening on 127.0.0.1:{port}") from None
            time.sleep(0.02)


# -- both ---------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    with open(argv[1]) as f:
        spec = json.load(f)
    try:
        if spec.get("sandbox") == "process":
            # The weaker sandbox (see gpulab.runtime.sandbox): proot placed the mounts and the
            # working directory, setpriv the user; only the untranslated calls need turning off here.
            _deny_untranslated(strict=bool(spec.get("bare_root")))
        else:
            _enter(spec)
        if spec.get("no_new_privs"):
            _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
        # Changing credentials cleared the parent-death signal `unshare --kill-child` set;
        # set it again so the sandbox dies with its unshare or proot (and so with its shim).
        _libc.prctl(PR_SET_PDEATHSIG, 9)  # SIGKILL
        if os.getppid() == 1:
            return 137
        if spec.get("relay") and spec.get("sandbox") != "process":
            _start_relay(spec["relay"])
        set_limits(spec)
        os.nice(spec.get("nice", 5))
    except OSError as e:
        print(f"gpulab sandbox: cannot set up {spec.get('what') or 'the container'}: {e}", file=sys.stderr)
        return 128
    if spec.get("sandbox") == "process":
        return _run_as_parent(spec)
    return _exec(spec)


# Signals the node sends a container's processes: in the process sandbox they reach the command itself.
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def _run_as_parent(spec: dict) -> int:
    """The process sandbox: run the command as a child and end with its status, as a shell does.

    proot reports a traced process that died of a signal as exit status 0, where a
    container runtime reports 128 + the signal. Waiting for the command here turns
    its end into an ordinary exit status (143 for SIGTERM), which proot passes on.
    This parent ignores the stop signals, which reach the command directly.
    """
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        for sig in _STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)  # ignored signals would stay ignored across exec
        os._exit(_exec(spec) or 0)  # _exec returns only when the command could not be started
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _exec(spec: dict) -> int:
    argv_ = spec["argv"]
    try:
        os.execvpe(argv_[0], argv_, spec["env"])
    except FileNotFoundError:
        # The message a container runtime gives for a missing executable.
        print(f'exec: "{argv_[0]}": executable file not found in $PATH', file=sys.stderr)
        return 127
    except PermissionError:
        print(f'exec: "{argv_[0]}": permission denied', file=sys.stderr)
        return 126


if __name__ == "__main__":
    # os.execvpe looks up PATH in the environment it is given, not ours.
    sys.exit(main(sys.argv))
