"""Runs inside fresh namespaces and turns itself into a container's process.

(The weaker ``process`` sandbox does without it: see :mod:`gpulab.runtime.sandbox`.)

Started by :mod:`gpulab.runtime.sandbox` as
``unshare --net --mount --pid --uts --ipc --fork [--user --map-root-user] -- python sandbox_init.py SPEC``.
Here it is (namespaced) root, with the host's mounts privately copied. It:

1. builds the container's root in ``spec.rootfs``: the host's system
   directories bound read-only, a fresh ``/proc``, a minimal ``/dev``, the
   pod's volumes and the device plugin's mounts and device nodes at their
   container paths;
2. ``chroot``s there, drops to the container's user (``nobody`` unless the
   pod asks for another non-root uid), sets resource limits;
3. ``exec``s the command with the pod's environment.

Standard library only, and nothing here survives the ``exec``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import resource
import sys

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/etc")
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    rc = _libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None,
                     ctypes.c_ulong(flags), data.encode() if data else None)
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def _bind(source: str, target: str, read_only: bool) -> None:
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target):
            open(target, "a").close()
    _mount(source, target, None, MS_BIND | MS_REC)
    if read_only:
        _mount(source, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


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


def build_root(spec: dict) -> None:
    root = spec["rootfs"]
    _mount("none", "/", None, MS_REC | MS_PRIVATE)
    os.makedirs(root, exist_ok=True)
    # The root itself must be a mount point for the binds below to be
    # independent of the host's mount tree.
    _mount(root, root, None, MS_BIND | MS_REC)
    targets = [m["container_path"] for m in spec.get("mounts", []) + spec.get("devices", [])]
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
    _mount("proc", proc, "proc", MS_NOSUID | MS_NODEV)
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
    os.chmod(tmp, 0o1777)
    for m in spec.get("mounts", []):
        _bind(m["host_path"], _inside(root, m["container_path"]), m.get("read_only", False))
    for d in spec.get("devices", []):
        _bind(d["host_path"], _inside(root, d["container_path"]), read_only=False)


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
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _deny_statx() -> None:
    """Make ``statx`` fail with ENOSYS (seccomp), so programs fall back to ``fstatat``.

    proot (the process sandbox's path translation) predates ``statx`` and does
    not translate its path: ``ls /data`` would miss a volume that ``cat`` finds.
    Every libc and coreutils falls back to ``fstatat`` when ``statx`` is missing.
    """
    arch = {"x86_64": (0xC000003E, 332), "aarch64": (0xC00000B7, 291)}.get(os.uname().machine)
    if arch is None:
        return

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    ld, jeq, ret = 0x20, 0x15, 0x06
    program = (SockFilter * 6)(
        SockFilter(ld, 0, 0, 4),            # seccomp_data.arch
        SockFilter(jeq, 0, 3, arch[0]),     # another ABI: allow
        SockFilter(ld, 0, 0, 0),            # seccomp_data.nr
        SockFilter(jeq, 0, 1, arch[1]),     # statx?
        SockFilter(ret, 0, 0, 0x00050000 | 38),  # SECCOMP_RET_ERRNO | ENOSYS
        SockFilter(ret, 0, 0, 0x7FFF0000),  # SECCOMP_RET_ALLOW
    )
    prog = SockFprog(len(program), program)
    if _libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if _libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def _enter(spec: dict) -> None:
    """The namespaces sandbox: the container's root, hostname, working directory and user."""
    build_root(spec)
    if spec.get("hostname"):
        _libc.sethostname(spec["hostname"].encode(), len(spec["hostname"]))
    os.chroot(spec["rootfs"])
    os.chdir("/")
    workdir = spec.get("workdir") or "/"
    uid, gid = spec.get("uid"), spec.get("gid")
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


def main(argv: list[str]) -> int:
    with open(argv[1]) as f:
        spec = json.load(f)
    try:
        if spec.get("sandbox") == "process":
            # The weaker sandbox (see gpulab.runtime.sandbox): proot placed the mounts and the
            # working directory, setpriv the user; only statx needs turning off here.
            _deny_statx()
        else:
            _enter(spec)
        # Changing credentials cleared the parent-death signal `unshare --kill-child` set;
        # set it again so the container dies with its unshare or proot (and so with its shim).
        _libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
        if os.getppid() == 1:
            return 137
        set_limits(spec)
        os.nice(spec.get("nice", 5))
    except OSError as e:
        print(f"gpulab sandbox: cannot set up the container: {e}", file=sys.stderr)
        return 128
    return _exec(spec)


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
