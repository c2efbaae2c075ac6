"""Crash-safe file writes and inter-process locks shared by quiz and grading.

Every file gpulab keeps for a learner or an instructor (quiz progress, recorded
lab values, the gradebook) is replaced atomically: the new content goes to a
temporary file in the same directory, is fsync'ed, and is renamed over the old
one with ``os.replace``. A reader therefore sees either the old or the new file,
never half of one, even if the writer is killed mid-way.

Read-modify-write cycles (two notebooks answering quizzes at once) additionally
take an exclusive advisory lock on a sidecar ``<file>.lock``.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]
    import msvcrt


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; not possible (nor needed) on Windows.
    if os.name != "posix":  # pragma: no cover
        return
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


@contextlib.contextmanager
def locked(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold an exclusive inter-process lock associated with ``path``.

    The lock lives on ``<path>.lock`` rather than on ``path`` itself because
    ``os.replace`` swaps the inode of ``path``: a lock taken on the old inode
    would not exclude a writer that opened the new one.
    """
    lock_path = Path(f"{os.fspath(path)}.lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+b") as handle:
        if fcntl is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        else:  # pragma: no cover - Windows
            handle.seek(0)
            msvcrt.locking(handle.fileno(), msvcrt.LK_LOCK, 1)
            try:
                yield
            finally:
                handle.seek(0)
                msvcrt.locking(handle.fileno(), msvcrt.LK_UNLCK, 1)
