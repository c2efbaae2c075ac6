"""Crash-safe file writes and inter-process locks shared by quiz and grading.

Every file gpulab keeps for a learner or an instructor (quiz progress, recorded
lab values, the gradebook) is replaced atomically: the new content goes to a
temporary file in the same directory, is fsync'ed, and is renamed over the old
one with ``os.replace``. A reader therefore sees either the old or the new file,
never half of one, even if the writer is killed mid-way.

Read-modify-write cycles (two notebooks answering quizzes at once) additionally
take an exclusive advisory lock on a sidecar ``<file>.lock``.

Every inter-process lock gpulab takes goes through :func:`hold_lock`: a process
that has to wait says so every few seconds, naming the lock and the process
that holds it (the holder writes its pid, command and purpose into the lock
file), instead of sitting silent behind someone else's twenty-minute build.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from . import _proc


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _default_mode(path: Path) -> int:
    # mkstemp creates 0600 files; keep the mode a plain open() would have given.
    try:
        return path.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` so that no reader ever sees a partial file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    mode = _default_mode(target) if mode is None else mode
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    _fsync_dir(target.parent)


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8",
                      mode: int | None = None) -> None:
    """Text flavour of :func:`atomic_write_bytes`."""
    atomic_write_bytes(path, text.encode(encoding), mode)


def file_identity(path: Path | None) -> tuple[int, int] | None:
    """(mtime, size) of ``path``, None when there is none: cheap "did this file change" for pollers."""
    try:
        st = path.stat() if path else None
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size) if st else None


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as pretty, key-sorted UTF-8 JSON (stable diffs, readable Chinese)."""
    text = json.dumps(obj, ensure_ascii=False, indent=2, sort_keys=True, allow_nan=False)
    atomic_write_text(path, text + "\n")


Say = Callable[[str], None]


def _say_stderr(msg: str) -> None:
    print(f"gpulab: {msg}", file=sys.stderr, flush=True)


def _shown(path: Path) -> str:
    """``path`` with the home directory written as ``~`` (shorter messages)."""
    try:
        return "~/" + str(path.relative_to(Path.home()))
    except (ValueError, RuntimeError):
        return str(path)


def _this_command() -> str:
    """A short form of this process's command line, for other processes to read."""
    argv = list(sys.argv) or [""]
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name:  # python -m pkg.mod
        name = "python -m " + spec.name.removesuffix(".__main__")
    elif argv[0] in ("", "-c"):
        name = "python -c ..." if argv[0] == "-c" else "python"
    else:
        name = Path(argv[0]).name
    text = " ".join([name, *argv[1:]])
    return text if len(text) <= 100 else text[:97] + "..."


def _flock_owner(lock_path: Path) -> int | None:
    """The pid /proc/locks names for a flock on ``lock_path`` (Linux), else None.

    This finds the holder even when it did not write who it is (an older gpulab).
    """
    try:
        st = lock_path.stat()
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in lines:
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 4653 fe:00:10035209 0 EOF"; waiters carry "->".
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == dev:
            with contextlib.suppress(ValueError):
                return int(fields[4])
    return None


def _cmdline(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    except OSError:
        return ""
    text = " ".join(os.fsdecode(a) for a in argv if a)
    return text if len(text) <= 100 else text[:97] + "..."


def lock_holder(lock_path: str | os.PathLike[str]) -> str:
    """Who holds ``lock_path``, as words: "pid 1234 (gpulab build: building etcd v3.6.5)"."""
    lock_path = Path(lock_path)
    owner = _flock_owner(lock_path)
    try:
        info = json.loads(lock_path.read_text(encoding="utf-8"))
        pid = int(info["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        info, pid = None, None
    if info is not None and pid is not None and _proc.alive(pid) and owner in (None, pid):
        what = ": ".join(str(x) for x in (info.get("command"), info.get("purpose")) if x)
        return f"pid {pid} ({what})" if what else f"pid {pid}"
    if owner is not None:
        cmd = _cmdline(owner)
        return f"pid {owner} ({cmd})" if cmd else f"pid {owner}"
    return "another process"


class HeldLock:
    """An inter-process lock this process holds (see :func:`hold_lock`)."""

    def __init__(self, handle: IO[bytes], path: Path):
        self._handle = handle
        self.path = path
        self.command = _this_command()

    def note(self, purpose: str) -> None:
        """Tell processes waiting for this lock what its holder is doing now."""
        info = {"pid": os.getpid(), "command": self.command, "purpose": purpose, "since": int(time.time())}
        with contextlib.suppress(OSError):
            self._handle.seek(0)
            self._handle.truncate()
            self._handle.write((json.dumps(info) + "\n").encode())
            self._handle.flush()

    def _clear(self) -> None:
        with contextlib.suppress(OSError):
            self._handle.seek(0)
            self._handle.truncate()
            self._handle.flush()


def _try_lock(handle: IO[bytes]) -> bool:
    """Take the lock if no one holds it; False (at once) if someone does."""
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _unlock(handle: IO[bytes]) -> None:
    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


@contextlib.contextmanager
def hold_lock(path: str | os.PathLike[str], *, what: str, purpose: str, say: Say | None = None,
              interval: float = 5.0) -> Iterator[HeldLock]:
    """Hold the exclusive inter-process lock on the file ``path``; wait for it out loud.

    While another process holds it, ``say`` (default: stderr, as gpulab's
    progress lines) hears every ``interval`` seconds what this process waits
    for, who holds it and for how long it has waited, e.g. "waiting for the
    build lock ~/.cache/gpulab/build.lock held by pid 1234 (gpulab build:
    building kubernetes v1.37.2), 35 s so far". Once held, this process's pid,
    command line and ``purpose`` are written into the file for the next
    waiter to read; :meth:`HeldLock.note` updates the purpose.
    """
    lock_path = Path(path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    say = say or _say_stderr
    # "a+b", not "w": opening must not wipe what the current holder wrote.
    with open(lock_path, "a+b") as handle:
        started = time.monotonic()
        next_message = started + min(interval, 1.0)  # a moment's contention stays quiet
        delay = 0.005
        told = False
        while not _try_lock(handle):
            now = time.monotonic()
            if now >= next_message:
                say(f"waiting for {what} {_shown(lock_path)} held by {lock_holder(lock_path)}, "
                    f"{now - started:.0f} s so far")
                told = True
                next_message = now + interval
            time.sleep(max(0.0, min(delay, next_message - time.monotonic())))
            delay = min(delay * 2, 0.1)
        held = HeldLock(handle, lock_path)
        try:
            if told:
                say(f"got {what} after {time.monotonic() - started:.0f} s")
            held.note(purpose)
            yield held
        finally:
            held._clear()
            _unlock(handle)


@contextlib.contextmanager
def locked(path: str | os.PathLike[str], *, purpose: str | None = None, say: Say | None = None,
           interval: float = 5.0) -> Iterator[None]:
    """Hold an exclusive inter-process lock associated with ``path``.

    The lock lives on ``<path>.lock`` rather than on ``path`` itself because
    ``os.replace`` swaps the inode of ``path``: a lock taken on the old inode
    would not exclude a writer that opened the new one. Waiting for it is
    reported as :func:`hold_lock` does.
    """
    target = Path(os.fspath(path))
    with hold_lock(Path(f"{os.fspath(path)}.lock"), what=f"the lock on {_shown(target)}",
                   purpose=purpose or f"updating {target.name}", say=say, interval=interval):
        yield


# A unix socket's path may not exceed 107 bytes (sun_path, with its terminating NUL).
SUN_PATH_MAX = 107


def socket_home(path: Path, room: int, mode: int = 0o700) -> Path:
    """``path``, a directory where unix sockets with names of up to ``room`` bytes can be bound.

    Under a long ``GPULAB_HOME`` (a home directory such as /home/first.last/.gpulab, a test's
    temporary directory) a cluster's socket directories are too deep for socket paths. Then
    the directory lives under a short per-user runtime directory and ``path`` is a symlink to
    it, so whatever finds it by path (a hostPath volume) still does; everything that binds or
    dials a socket uses the short real path this returns.
    """
    if path.is_symlink():
        return path.resolve()
    if len(str(path.absolute())) + 1 + room <= SUN_PATH_MAX:
        path.mkdir(parents=True, exist_ok=True)
        return path
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()) / f"gpulab-{os.getuid()}"
    import hashlib  # here, not at the top: every container's shim imports this module, and hashlib loads OpenSSL (3 MiB)
    short = base / hashlib.sha256(str(path.absolute()).encode()).hexdigest()[:12]
    short.mkdir(parents=True, exist_ok=True)
    base.chmod(0o711)  # search only: what lives below says who may read it
    short.chmod(mode)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir():  # made before: keep what it holds (the device manager's checkpoint)
        for entry in path.iterdir():
            shutil.move(str(entry), str(short / entry.name))
        path.rmdir()
    path.symlink_to(short, target_is_directory=True)
    return short


def remove_tree(path: str | os.PathLike[str]) -> None:
    """Delete ``path`` and everything below it, as its owner, whatever the modes inside say.

    ``shutil.rmtree`` stops at a directory its owner may not list: the kernel makes an
    overlay mount's work directory mode 000, and a process sandbox leaves its root
    read-only. Root never notices; an ordinary account does. Such a directory is made
    the owner's again (u+rwx) and emptied; what vanished meanwhile is not an error.
    A missing ``path`` is fine. Anything else (a file of another user) is left and
    ignored, as ``rmtree(..., ignore_errors=True)`` would.
    """

    def retry(func: Callable[..., Any], name: str, exc: BaseException) -> None:
        if isinstance(exc, FileNotFoundError) or not isinstance(exc, PermissionError):
            return
        with contextlib.suppress(OSError):
            parent = os.path.dirname(name)
            if parent:
                os.chmod(parent, 0o700)
            if os.path.isdir(name) and not os.path.islink(name):
                os.chmod(name, 0o700)
                _rmtree(name)
            else:
                os.unlink(name)

    def _rmtree(name: str) -> None:
        if sys.version_info >= (3, 12):
            shutil.rmtree(name, onexc=retry)
        else:  # pragma: no cover - Python 3.11
            shutil.rmtree(name, onerror=lambda func, p, info: retry(func, p, info[1]))

    if os.path.lexists(path):
        _rmtree(os.fspath(path))
