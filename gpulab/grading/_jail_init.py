"""Runs first inside a grading jail and turns itself into the papermill child.

Started by :mod:`gpulab.grading.jail` as ``python -I -S _jail_init.py SPEC.json``
(standard library only; nothing here survives the final ``exec``). It:

1. ``unshare``s new mount, network, PID, IPC and UTS namespaces — and, when
   the grader is not root, a user namespace in which the grader's uid maps to
   itself (not to root, so that the final ``exec`` drops every capability);
2. forks the jail's PID 1, which builds a new root in a tmpfs: the host's
   system directories, the Python installation and the repository bound
   read-only (with the instructor's private directories masked by empty
   tmpfs mounts), a fresh ``/proc``, ``/dev`` and ``/tmp``, and the run
   directory — the only writable host path;
3. brings up the loopback interface of the new network namespace (the kernel
   talks to papermill over 127.0.0.1) and starts a relay that listens on the
   apiserver's 127.0.0.1 port and forwards to a unix socket in the run
   directory, behind which the grader connects to the real apiserver. Nothing
   else on the host network — etcd above all, which has no authentication —
   is reachable;
4. ``chroot``s, drops to ``nobody`` when the grader is root, sets resource
   limits and ``no_new_privs``, and ``exec``s the command.

``_jail_init.py --relay PORT SOCKET`` is the relay itself.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import json
import os
import resource
import socket
import struct
import sys
import threading
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

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

PR_SET_NO_NEW_PRIVS = 38
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/etc")
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


class JailError(OSError):
    pass


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise JailError(err, f"{what}: {os.strerror(err)}")


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
        except JailError:
            _mount(None, target, None, flags | _locked_flags(target))


def _inside(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def _enter_namespaces(spec: dict) -> None:
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    userns = os.geteuid() != 0
    uid, gid = os.geteuid(), os.getegid()
    if userns:
        flags |= CLONE_NEWUSER
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")
    if userns:
        # The grader's own uid, mapped to itself: inside, the jail is not root, so exec drops capabilities.
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")


def _build_root(spec: dict) -> None:
    root = spec["root"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    os.makedirs(root, exist_ok=True)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=1m")
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            os.symlink(os.readlink(d), _inside(root, d))
        elif os.path.isdir(d):
            _bind(d, _inside(root, d), read_only=True)
    proc = _inside(root, "/proc")
    os.makedirs(proc, exist_ok=True)
    try:
        _mount("proc", proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except JailError:
        # A proc mount needs a fully visible /proc (not so in some containers); the host's, read-only.
        _bind("/proc", proc, read_only=True)
    dev = _inside(root, "/dev")
    os.makedirs(dev, exist_ok=True)
    _mount("tmpfs", dev, "tmpfs", MS_NOSUID, "mode=755,size=64k")
    for name in DEV_NODES:
        if os.path.exists(f"/dev/{name}"):
            _bind(f"/dev/{name}", os.path.join(dev, name), read_only=False)
    os.makedirs(os.path.join(dev, "shm"))
    _mount("tmpfs", os.path.join(dev, "shm"), "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=64m")
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        os.symlink(f"/proc/self/fd/{fd}", os.path.join(dev, name))
    tmp = _inside(root, "/tmp")
    os.makedirs(tmp, exist_ok=True)
    _mount("tmpfs", tmp, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={spec.get('tmp_size', '512m')}")
    for bind in sorted(spec.get("binds", []), key=lambda b: b["target"].count("/")):
        _bind(bind["source"], _inside(root, bind["target"]), read_only=not bind.get("rw", False))
    for mask in sorted(spec.get("masks", []), key=lambda m: m.count("/")):
        target = _inside(root, mask)
        if os.path.isdir(target):
            _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "mode=755,size=4k")


def _loopback_up() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        ifr = struct.pack("16sH14s", b"lo", 0, b"\0" * 14)
        flags = struct.unpack("16sH14s", fcntl.ioctl(sock, SIOCGIFFLAGS, ifr))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | IFF_UP, b"\0" * 14))
    finally:
        sock.close()


def _drop_privileges(spec: dict) -> None:
    if os.geteuid() == 0 and spec.get("uid") is not None:
        os.setgroups([])
        os.setgid(spec["gid"])
        os.setuid(spec["uid"])
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(no_new_privs)")


def _set_limits(spec: dict) -> None:
    lim = spec.get("limits") or {}
    for key, which in (("memory_bytes", resource.RLIMIT_AS), ("nproc", resource.RLIMIT_NPROC),
                       ("file_bytes", resource.RLIMIT_FSIZE), ("nofile", resource.RLIMIT_NOFILE)):
        if lim.get(key):
            resource.setrlimit(which, (lim[key], lim[key]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise JailError(0, f"the apiserver relay did not start listening on 127.0.0.1:{port}") from None
            time.sleep(0.02)


def _jail_pid1(spec: dict) -> int:
    _build_root(spec)
    _loopback_up()
    os.chroot(spec["root"])
    os.chdir(spec.get("cwd") or "/")
    relay = spec.get("relay")
    if relay:
        pid = os.fork()
        if pid == 0:
            try:
                _drop_privileges(spec)
                argv = [spec["python"], "-I", "-S", os.path.abspath(__file__), "--relay", str(relay["port"]),
                        relay["socket"]]
                os.execve(argv[0], argv, {"PATH": "/usr/bin:/bin"})
            finally:
                os._exit(127)
        _wait_port(int(relay["port"]))
    _drop_privileges(spec)
    _set_limits(spec)
    argv = spec["argv"]
    os.execvpe(argv[0], argv, spec["env"])
    return 127  # not reached


def run(spec: dict) -> int:
    _enter_namespaces(spec)
    pid = os.fork()  # the first child is PID 1 of the new PID namespace
    if pid == 0:
        code = 126
        try:
            code = _jail_pid1(spec)
        except BaseException as exc:  # noqa: BLE001 - report, never fall back to running unjailed
            print(f"gpulab grading jail: cannot set up: {exc}", file=sys.stderr, flush=True)
        os._exit(code)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    if code < 0:  # die the way the jail's PID 1 died, so the runner sees the signal
        os.kill(os.getpid(), -code)
    return code


# --------------------------------------------------------------------------- relay


def _pump(src: socket.socket, dst: socket.socket) -> None:
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


def relay(port: int, path: str) -> int:
    """Accept on 127.0.0.1:``port`` (inside the jail) and forward each connection to the unix socket ``path``."""
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
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[1] == "--relay":
        return relay(int(argv[2]), argv[3])
    with open(argv[1]) as handle:
        spec = json.load(handle)
    try:
        return run(spec)
    except OSError as exc:
        print(f"gpulab grading jail: cannot set up: {exc}", file=sys.stderr, flush=True)
        return 126


if __name__ == "__main__":
    sys.exit(main(sys.argv))
