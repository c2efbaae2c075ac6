"""The two pod sandboxes: choosing one, saying why namespaces are missing, running a command in each."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from gpulab.runtime import sandbox
from gpulab.runtime.shim import ShimHandle


def test_the_sandbox_is_namespaces_unless_told(monkeypatch):
    monkeypatch.delenv(sandbox.SANDBOX_ENV, raising=False)
    assert sandbox.kind() == "namespaces"
    monkeypatch.setenv(sandbox.SANDBOX_ENV, "process")
    assert sandbox.kind() == "process"
    monkeypatch.setenv(sandbox.SANDBOX_ENV, "chroot")
    with pytest.raises(sandbox.SandboxUnavailable, match=r"GPULAB_SANDBOX='chroot'.*allowed: namespaces.*process"):
        sandbox.kind()


@pytest.mark.parametrize("files, env, remedy", [
    ({"/proc/sys/kernel/unprivileged_userns_clone": "0"}, {}, "sysctl -w kernel.unprivileged_userns_clone=1"),
    ({"/proc/sys/user/max_user_namespaces": "0"}, {}, "sysctl -w user.max_user_namespaces="),
    ({"/proc/sys/kernel/apparmor_restrict_unprivileged_userns": "1"}, {},
     "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0"),
    ({"/.dockerenv": ""}, {}, "--security-opt seccomp=unconfined"),
    ({}, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, "seccompProfile: {type: Unconfined}"),
])
def test_missing_namespaces_come_with_the_remedy_for_the_case(files, env, remedy):
    text = sandbox.diagnose("unshare: unshare failed: Operation not permitted", read=files.get, env=env)
    assert "Operation not permitted" in text
    assert remedy in text
    assert "GPULAB_SANDBOX=process" in text  # the weaker way out is always named, never taken silently


@pytest.fixture
def tmp_path():
    # As root, containers run as nobody: their files must be reachable from /, which
    # pytest's own tmp_path (under a private directory) is not.
    path = Path(tempfile.mkdtemp(prefix="gl-sandbox-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _run(tmp_path, monkeypatch, kind: str, argv: list[str], devices=()) -> tuple[int, str]:
    monkeypatch.setenv(sandbox.SANDBOX_ENV, kind)
    data = tmp_path / "data"
    data.mkdir(mode=0o777)
    data.chmod(0o777)
    (data / "in.txt").write_text("from the volume\n")
    spec = sandbox.SandboxSpec(argv=argv, env={"PATH": sandbox.DEFAULT_PATH}, rootfs=tmp_path / "run" / "rootfs",
                               memory_bytes=2 << 30, cpu_seconds=60,
                               mounts=[sandbox.Mount(str(data), "/ckpt")], devices=list(devices))
    handle = ShimHandle.start(spec, tmp_path / "run", tmp_path / "log")
    status = handle.wait(30)
    assert status is not None
    text = subprocess.run(["cat", str(tmp_path / "log")], capture_output=True, text=True).stdout
    return status["returncode"], " ".join(line.split(" ", 3)[3] for line in text.splitlines())


@pytest.mark.skipif(shutil.which("proot") is None, reason="proot is not installed (apt-get install proot)")
def test_the_process_sandbox_places_volumes_and_starts_in_a_private_directory(tmp_path, monkeypatch):
    card = tmp_path / "nvidia0"
    card.touch()
    card.chmod(0o666)
    rc, out = _run(tmp_path, monkeypatch, "process",
                   ["sh", "-c", "cat /ckpt/in.txt; ls /ckpt/*.txt; ls /dev/nvidia*; echo ok > /ckpt/out; pwd"],
                   devices=[sandbox.Mount(str(card), "/dev/nvidia0")])
    assert rc == 0, out
    assert "from the volume /ckpt/in.txt /dev/nvidia0" in out  # listed too, not only opened
    assert (tmp_path / "data" / "out").read_text() == "ok\n"
    assert out.endswith(str(tmp_path / "run" / "work"))
    spec = json.loads((tmp_path / "run" / "sandbox.json").read_text())
    assert spec["sandbox"] == "process"


@pytest.mark.skipif(shutil.which("proot") is None, reason="proot is not installed (apt-get install proot)")
def test_the_process_sandbox_refuses_the_calls_proot_does_not_translate(tmp_path, monkeypatch):
    # openat2 would open the host's /ckpt/in.txt (there is none), not the volume's: ENOSYS makes programs fall back.
    probe = ("import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
             "fd = libc.syscall(437, -100, b'/ckpt/in.txt', (ctypes.c_uint64 * 3)(), 24); "
             "print(fd, ctypes.get_errno(), open('/ckpt/in.txt').read().strip())")
    rc, out = _run(tmp_path, monkeypatch, "process", ["python3", "-I", "-c", probe])
    assert (rc, out) == (0, "-1 38 from the volume")


@pytest.mark.skipif(shutil.which("proot") is None, reason="proot is not installed (apt-get install proot)")
def test_a_missing_command_fails_as_under_a_container_runtime(tmp_path, monkeypatch):
    rc, out = _run(tmp_path, monkeypatch, "process", ["no-such-program"])
    assert (rc, out) == (127, 'exec: "no-such-program": executable file not found in $PATH')


def test_the_namespace_sandbox_has_no_network(tmp_path, monkeypatch):
    try:
        sandbox.check()
    except sandbox.SandboxUnavailable as e:
        pytest.skip(str(e))
    rc, out = _run(tmp_path, monkeypatch, "namespaces",
                   ["sh", "-c", "cat /ckpt/in.txt; grep -c : /proc/net/dev"])
    assert rc == 0, out
    assert "from the volume" in out
    assert out.split()[-1] == "1"  # only a down loopback: nothing to reach


@pytest.mark.parametrize("kind", ["namespaces", "process"])
@pytest.mark.parametrize("argv, expected", [
    # Dies of SIGTERM (143); as PID 1 of its own PID namespace SIGTERM is ignored and SIGKILL ends it (137).
    (["sleep", "300"], {"namespaces": 137, "process": 143}),
    (["sh", "-c", "trap 'echo bye; exit 0' TERM; sleep 300 & wait"], {"namespaces": 0, "process": 0}),
    (["sh", "-c", "trap '' TERM; sleep 300"], {"namespaces": 137, "process": 137}),  # SIGKILL after the grace
])
def test_a_stopped_container_reports_how_it_ended(tmp_path, monkeypatch, kind, argv, expected):
    """SIGTERM reaches the workload, not the sandbox's tooling, and its end is reported as a runtime would."""
    if kind == "process" and shutil.which("proot") is None:
        pytest.skip("proot is not installed (apt-get install proot)")
    monkeypatch.setenv(sandbox.SANDBOX_ENV, kind)
    spec = sandbox.SandboxSpec(argv=argv, env={"PATH": sandbox.DEFAULT_PATH}, rootfs=tmp_path / "run" / "rootfs")
    handle = ShimHandle.start(spec, tmp_path / "run", tmp_path / "log")
    time.sleep(1.0)
    status = handle.stop(grace=2)
    assert status is not None
    rc = status["returncode"]
    assert (128 - rc if rc < 0 else rc) == expected[kind], status
