"""The grading secret: what keeps a lab's scenario from being computed in advance.

A lab fixture that breaks the cluster for a submission (:mod:`gpulab.grading.fixtures`)
picks what to break — which layer of the GPU stack, which card. Picked from the
submission's namespace alone (``grade-02-<learner>``, which the learner knows), anyone
with the source could compute the answer before the run. So every pick comes from
:func:`derive`: HMAC-SHA256 keyed with a random secret, over the fixture's name and
the submission's identity (its namespace, which names the learner).

The secret is created once per ``GPULAB_HOME`` and kept in
``$GPULAB_HOME/grading/secret`` (32 random bytes as hex, mode 0600 in a 0700
directory; :func:`ensure` creates it atomically, so two graders starting at once
agree on one):

- the instructor's is made by the first ``gpulab grade`` and stays: regrading with
  it gives every submission the same scenario, a new one new scenarios;
- a learner's own ``GPULAB_HOME`` gets its own with the first ``gpulab check`` or
  practice run, and tells nothing about the instructor's;
- a graded notebook never sees it: the grading jail shows no ``GPULAB_HOME``, and the
  grader masks the file should it lie inside a path the jail exposes.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from gpulab import paths

KEY_BYTES = 32


class SecretError(RuntimeError):
    """The secret file is unusable (unreadable, malformed, readable by others); the message says which and why."""


def path(home: str | os.PathLike[str] | None = None) -> Path:
    """``$GPULAB_HOME/grading/secret`` (or under ``home``)."""
    return (Path(home) if home is not None else paths.home()) / "grading" / "secret"


def _parse(text: str, where: Path) -> bytes:
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise SecretError(f"{where}: not a gpulab grading secret ({KEY_BYTES * 2} hex digits); delete it and "
                          f"`gpulab grade` makes a new one (submissions graded before then get new scenarios "
                          f"when regraded)")
    return key


def load(file: str | os.PathLike[str] | None = None) -> bytes | None:
    """The secret in ``file`` (default :func:`path`), None when there is none yet."""
    where = Path(file) if file is not None else path()
    try:
        fd = os.open(where, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SecretError(f"{where}: cannot read the grading secret: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "r", encoding="ascii", errors="replace") as handle:
        mode = os.fstat(handle.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise SecretError(f"{where}: the grading secret must be a regular file")
        if mode & 0o077:
            raise SecretError(f"{where}: the grading secret is readable by others (mode {stat.S_IMODE(mode):04o}); "
                              f"run `chmod 600 {where}` (and make a new one if others may have read it)")
        return _parse(handle.read(), where)


def _create(where: Path) -> bool:
    """Write a new secret to ``where`` unless one appears first; True when this call made it."""
    where.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=where.parent, prefix=f".{where.name}.", suffix=".tmp")  # mode 0600
    try:
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(secrets.token_hex(KEY_BYTES) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, where)  # never replaces: a secret another grader made a moment ago wins
        except FileExistsError:
            return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    dir_fd = os.open(where.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return True


def ensure(file: str | os.PathLike[str] | None = None, say: Callable[[str], None] | None = None) -> bytes:
    """The secret in ``file`` (default :func:`path`), created first when there is none; ``say`` hears of it."""
    where = Path(file) if file is not None else path()
    key = load(where)
    if key is not None:
        return key
    if _create(where) and say is not None:
        say(f"created the grading secret {where} (mode 0600): it picks what a lab breaks for each submission; "
            f"keep it to regrade with the same scenarios, and never share it")
    key = load(where)
    if key is None:  # pragma: no cover - deleted between creating and reading
        raise SecretError(f"{where}: the grading secret vanished right after it was created")
    return key


def derive(key: bytes, *parts: str) -> int:
    """A number fixed by ``key`` and ``parts`` (e.g. a fixture's name and a namespace), unpredictable without ``key``."""
    if len(key) < 16:
        raise ValueError("a grading secret has at least 16 bytes")
    message = "\x00".join(parts).encode("utf-8")
    return int.from_bytes(hmac.new(key, message, hashlib.sha256).digest(), "big")
