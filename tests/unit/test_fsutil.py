"""Atomic writes keep or set the file mode; file_identity notices a rewrite; a lock waiter speaks."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import shutil
import sys
import tempfile
from pathlib import Path

from gpulab._fsutil import atomic_write_text, file_identity, hold_lock, lock_holder, locked, remove_tree


def test_atomic_write_sets_the_mode_asked_for(tmp_path):
    target = tmp_path / "bin" / "nvidia-smi"
    atomic_write_text(target, "#!/bin/sh\n", mode=0o755)
    assert target.read_text() == "#!/bin/sh\n"
    assert target.stat().st_mode & 0o777 == 0o755
    assert [p.name for p in target.parent.iterdir()] == ["nvidia-smi"]  # no temporary file left


def test_atomic_write_keeps_an_existing_mode(tmp_path):
    target = tmp_path / "config.yaml"
    target.write_text("a")
    os.chmod(target, 0o600)
    atomic_write_text(target, "b")
    assert target.stat().st_mode & 0o777 == 0o600


def test_file_identity_changes_with_content_and_is_none_when_missing(tmp_path):
    target = tmp_path / "hw.json"
    assert file_identity(target) is None
    assert file_identity(None) is None
    atomic_write_text(target, "{}")
    first = file_identity(target)
    atomic_write_text(target, '{"mig": "all-1g.10gb"}')
    assert first is not None and file_identity(target) != first



# -- inter-process locks that say what they wait for -------------------------------------------

_HOLDER = r"""
import sys, time
from pathlib import Path
from gpulab._fsutil import hold_lock

lock, release = Path(sys.argv[1]), Path(sys.argv[2])
with hold_lock(lock, what="the test lock", purpose="building kube-apiserver v1.37.2"):
    print("held", flush=True)
    while not release.exists():  # the waiter lets us go once it has said something
        time.sleep(0.01)
"""


@contextlib.contextmanager
def _holder(lock, release):
    """Another process holding ``lock`` until ``release`` exists."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(lock), str(release)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "held\n"
        yield proc
        assert proc.wait(timeout=30) == 0
    finally:
        release.touch()
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_a_waiter_says_what_it_waits_for_and_who_holds_it(tmp_path):
    lock, release = tmp_path / "build.lock", tmp_path / "release"
    heard: list[str] = []

    def say(msg: str) -> None:
        heard.append(msg)
        release.touch()

    with _holder(lock, release) as holder:
        who = lock_holder(lock)
        assert who.startswith(f"pid {holder.pid} (python -c ") and who.endswith(": building kube-apiserver v1.37.2)")
        with hold_lock(lock, what="the test lock", purpose="second", say=say, interval=0.05) as held:
            waited = list(heard)
            assert json.loads(lock.read_text())["pid"] == os.getpid()
            assert json.loads(lock.read_text())["purpose"] == "second"
            held.note("second, a later step")
            assert json.loads(lock.read_text())["purpose"] == "second, a later step"
    assert len(waited) >= 2, waited
    assert waited[0].startswith(f"waiting for the test lock {lock} held by pid {holder.pid} (python -c "), waited
    assert re.search(r": building kube-apiserver v1\.37\.2\), \d+ s so far$", waited[0]), waited
    assert waited[-1].startswith("got the test lock after "), waited
    assert lock.read_text() == ""  # released: no holder is named any more


def test_locked_says_what_it_waits_for(tmp_path):
    target = tmp_path / "progress.json"
    release = tmp_path / "release"
    heard: list[str] = []

    def say(msg: str) -> None:
        heard.append(msg)
        release.touch()

    with _holder(tmp_path / "progress.json.lock", release):
        with locked(target, say=say, interval=0.05):
            waited = list(heard)
    assert waited and waited[0].startswith(f"waiting for the lock on {target} {target}.lock held by pid "), waited


def test_an_uncontended_lock_says_nothing(tmp_path):
    heard: list[str] = []
    with locked(tmp_path / "results.json", say=heard.append, interval=0.0):
        pass
    with hold_lock(tmp_path / "build.lock", what="the build lock", purpose="p", say=heard.append, interval=0.0):
        pass
    assert heard == []


def test_remove_tree_empties_directories_its_owner_may_not_list():
    # What a sandbox leaves: an overlay's work directory (mode 000, made by the kernel) and a
    # read-only root. Root could always remove them; the owner, an ordinary account, must too.
    base = Path(tempfile.mkdtemp(prefix="remove-tree-"))  # in /tmp: reachable by the owner below
    try:
        _remove_as_owner(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _remove_as_owner(tmp_path: Path) -> None:
    top = tmp_path / "pod"
    (top / "layers" / "etc" / "work" / "work").mkdir(parents=True)
    (top / "rootfs" / "usr").mkdir(parents=True)
    (top / "rootfs" / "usr" / "file").write_text("x")
    owner = os.getuid() if os.getuid() != 0 else 65534
    for dirpath, dirs, files in os.walk(tmp_path):
        for name in dirs + files:
            os.chown(os.path.join(dirpath, name), owner, owner)
    os.chown(tmp_path, owner, owner)
    os.chmod(top / "layers" / "etc" / "work" / "work", 0)
    os.chmod(top / "rootfs" / "usr", 0o555)
    os.chmod(top / "rootfs", 0o555)
    pid = os.fork()
    if pid == 0:  # as the owner (root drops to it): what a learner's `gpulab down --purge` meets
        code = 1
        try:
            if os.getuid() == 0:
                os.setgid(owner)
                os.setuid(owner)
            remove_tree(top)
            remove_tree(top)  # gone already: not an error
            code = 0 if not top.exists() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not top.exists()
