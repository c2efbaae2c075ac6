"""Binary discovery and build errors name what failed and what to do."""

from __future__ import annotations

import os
import shutil
import stat

import pytest

from gpulab.cluster import binaries


def test_missing_go_toolchain_points_at_gpulab_bin_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("GPULAB_BIN_DIR", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(binaries.BinaryError) as err:
        binaries.ensure(progress=lambda m: None)
    assert "Go toolchain not found" in str(err.value)
    assert "GPULAB_BIN_DIR" in str(err.value)


@pytest.mark.skipif(shutil.which("go") is None, reason="needs Go on PATH (GPULAB_BIN_DIR users need no Go)")
def test_failed_module_download_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("GPULAB_BIN_DIR", raising=False)
    monkeypatch.setenv("GOMODCACHE", str(tmp_path / "modcache"))
    monkeypatch.setenv("GOPROXY", "off")
    monkeypatch.setenv("GOFLAGS", "-mod=mod")
    with pytest.raises(binaries.BinaryError) as err:
        binaries.ensure(progress=lambda m: None)
    msg = str(err.value)
    assert "go mod download for kubernetes failed" in msg
    assert "GPULAB_BIN_DIR" in msg


def test_bin_dir_must_hold_every_binary(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_BIN_DIR", str(tmp_path))
    (tmp_path / "etcd").write_text("#!/bin/sh\necho 'etcd Version: 3.6.16'\n")
    (tmp_path / "etcd").chmod(stat.S_IRWXU)
    with pytest.raises(binaries.BinaryError) as err:
        binaries.ensure()
    for name in binaries.REQUIRED:
        if name != "etcd":
            assert f"  {name}: missing ({tmp_path / name})" in str(err.value)
    for name in ("kube-proxy", "coredns", "cni/bridge", "cni/host-local", "cni/loopback", "cni/portmap"):
        assert name in binaries.REQUIRED
    assert "etcd:" not in str(err.value).split("\n", 1)[1].split("It must hold")[0]


def test_bin_dir_with_everything_is_used_as_is(tmp_path, monkeypatch):
    # More cases (versions, permissions, every problem at once) are in test_bin_dir.py.
    from bin_dir_support import make_bin_dir

    monkeypatch.setenv("GPULAB_BIN_DIR", str(tmp_path))
    make_bin_dir(tmp_path)
    found = binaries.ensure()
    assert found["kube-apiserver"] == tmp_path / "kube-apiserver"


def test_wrapper_modules_pin_every_kubernetes_staging_module():
    gomod = (binaries.GOBUILD / "kubernetes" / "go.mod").read_text()
    from gpulab import versions

    replaces = [ln for ln in gomod.splitlines() if ln.startswith("replace k8s.io/")]
    assert len(replaces) >= 33
    assert all(ln.endswith(versions.KUBERNETES_STAGING) for ln in replaces)
    assert f"k8s.io/kubernetes {versions.KUBERNETES}" in gomod
    assert os.path.isfile(binaries.GOBUILD / "kubernetes" / "go.sum")


def test_kube_proxy_is_built_with_the_control_plane():
    """Same module, same version stamp: `kube-proxy --version` prints "Kubernetes v1.37.2"."""
    from gpulab import versions

    tools = _tool_block(binaries.GOBUILD / "kubernetes" / "go.mod")
    build = next(b for b in binaries.BUILDS if b.name == "kubernetes")
    assert ("k8s.io/kubernetes/cmd/kube-proxy", "kube-proxy") in build.programs
    assert {pkg for pkg, _ in build.programs} <= tools
    assert f"-X k8s.io/component-base/version.gitVersion={versions.KUBERNETES}" in build.ldflags
    assert "github.com/vishvananda/netlink" in (binaries.GOBUILD / "kubernetes" / "go.sum").read_text()


def test_agnhost_is_built_from_the_kubernetes_module_with_its_own_version():
    """A tool of the kubernetes wrapper module; `agnhost --version` prints "app version 2.66.1"."""
    from gpulab import versions

    build = next(b for b in binaries.BUILDS if b.name == "agnhost")
    assert build.module_dir() == binaries.GOBUILD / "kubernetes"
    assert build.programs == (("k8s.io/kubernetes/test/images/agnhost", "agnhost"),)
    assert {pkg for pkg, _ in build.programs} <= _tool_block(binaries.GOBUILD / "kubernetes" / "go.mod")
    assert f"-X main.Version={versions.AGNHOST.lstrip('v')}" in build.ldflags
    assert "github.com/ishidawataru/sctp" in (binaries.GOBUILD / "kubernetes" / "go.sum").read_text()
    assert "agnhost" in binaries.REQUIRED and build.bin_dir.name == f"agnhost-{versions.AGNHOST}"


def _tool_block(gomod: os.PathLike) -> set[str]:
    """The packages of a go.mod's `tool` directives (single or block)."""
    import re

    text = open(gomod).read()
    tools = set(re.findall(r"(?m)^tool\s+([^\s(]\S*)\s*$", text))
    for block in re.findall(r"(?ms)^tool\s*\((.*?)^\)", text):
        tools |= {ln.strip() for ln in block.splitlines() if ln.strip()}
    return tools


def test_cni_plugins_wrapper_module_builds_four_plugins_into_one_directory():
    from gpulab import versions

    gomod = (binaries.GOBUILD / "cni-plugins" / "go.mod").read_text()
    assert gomod.startswith("// Wrapper module: builds the CNI plugins")
    assert f"github.com/containernetworking/plugins {versions.CNI_PLUGINS}" in gomod
    assert os.path.isfile(binaries.GOBUILD / "cni-plugins" / "go.sum")
    build = next(b for b in binaries.BUILDS if b.name == "cni-plugins")
    assert {pkg for pkg, _ in build.programs} == _tool_block(binaries.GOBUILD / "cni-plugins" / "go.mod")
    assert [out for _, out in build.programs] == [f"cni/{p}" for p in binaries.CNI_PLUGINS]
    assert ("-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion="
            f"{versions.CNI_PLUGINS}") in build.ldflags


def test_coredns_wrapper_module_is_its_own_main_package():
    from gpulab import versions

    mod = binaries.GOBUILD / "coredns"
    gomod = (mod / "go.mod").read_text()
    assert "module gpulab.local/gobuild/coredns" in gomod
    assert f"github.com/coredns/coredns {versions.COREDNS}" in gomod
    main = (mod / "main.go").read_text()
    assert "package main" in main and "coremain.Run()" in main
    build = next(b for b in binaries.BUILDS if b.name == "coredns")
    assert build.programs == (("gpulab.local/gobuild/coredns", "coredns"),)
    assert [f.name for f in binaries._module_files(build)] == ["go.mod", "go.sum", "main.go"]


def test_up_builds_what_a_cluster_needs_and_leaves_agnhost_to_gpulab_build(tmp_path, monkeypatch):
    """A first `make lab` waits for no image program only tests or an add-on use; `gpulab build` builds them."""
    monkeypatch.setenv("GPULAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("GPULAB_BIN_DIR", raising=False)
    monkeypatch.setattr(binaries, "_is_built", lambda b: False)
    monkeypatch.setattr(binaries, "_go", lambda: "go")
    built = []
    monkeypatch.setattr(binaries, "_build_locked", lambda todo, go, say: built.append([b.name for b in todo]))
    found = binaries.ensure(lambda m: None, for_up=True)
    assert built == [["kubernetes", "etcd", "kwok", "metrics-server", "cni-plugins", "coredns"]]
    assert found["agnhost"].name == "agnhost"  # where `gpulab build` puts it: an image says so until then
    later = ["agnhost", "prometheus", "prometheus-adapter", "kube-state-metrics"]
    assert [b.name for b in binaries.pending()] == later
    assert found["prometheus"].name == "prometheus"
    binaries.ensure(lambda m: None)
    assert built[-1][-len(later):] == later
    monkeypatch.setenv("GPULAB_BIN_DIR", str(tmp_path))
    assert binaries.pending() == []  # ready binaries: nothing is ever built


def test_build_in_the_background_with_nothing_left_says_so(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from gpulab import cli

    monkeypatch.setattr(binaries, "pending", lambda: [])
    result = CliRunner().invoke(cli.main, ["build", "--background"])
    assert result.exit_code == 0 and "nothing left to build" in result.output


def test_builds_come_in_order_and_give_every_required_binary(tmp_path, monkeypatch):
    """The control plane first, then the pod network; every program at its name in its bin dir."""
    monkeypatch.setenv("GPULAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("GPULAB_BIN_DIR", raising=False)
    assert [b.name for b in binaries.BUILDS] == ["kubernetes", "etcd", "kwok", "metrics-server", "cni-plugins",
                                                 "coredns", "agnhost", "prometheus", "prometheus-adapter",
                                                 "kube-state-metrics"]
    monkeypatch.setattr(binaries, "_is_built", lambda b: True)
    found = binaries.ensure(lambda m: None)
    assert set(binaries.REQUIRED) <= set(found.paths)
    cni = next(b for b in binaries.BUILDS if b.name == "cni-plugins")
    assert found.cni_bin_dir == cni.bin_dir / "cni"
    assert {found[f"cni/{p}"] for p in binaries.CNI_PLUGINS} == {found.cni_bin_dir / p for p in binaries.CNI_PLUGINS}
    assert found["coredns"] == tmp_path / "cache" / "bin" / "coredns-v1.14.7" / "coredns"
    assert found["kube-proxy"].parent == found["kube-apiserver"].parent


def test_the_stamp_covers_every_file_of_the_wrapper_module(tmp_path, monkeypatch):
    import hashlib

    monkeypatch.setattr(binaries, "GOBUILD", tmp_path)
    mod = tmp_path / "w"
    mod.mkdir()
    (mod / "go.mod").write_text("module w\n")
    (mod / "go.sum").write_text("x v1 h1:abc=\n")
    build = binaries.Build("w", "v1", (("w", "w"),), "-s -w")
    # A module of go.mod and go.sum alone keeps the stamp it had before main.go counted.
    old = hashlib.sha256(b"module w\n" + b"x v1 h1:abc=\n" + b"-s -w").hexdigest()
    assert binaries._stamp(build) == old
    (mod / "main.go").write_text("package main\n")
    with_main = binaries._stamp(build)
    assert with_main != old
    (mod / "main.go").write_text("package main\n\nfunc main() {}\n")
    assert binaries._stamp(build) not in (old, with_main)
    (mod / "sub").mkdir()  # directories are not files of the module
    assert [f.name for f in binaries._module_files(build)] == ["go.mod", "go.sum", "main.go"]


def test_metrics_server_wrapper_module_pins_the_version_and_stamps_it():
    """v0.8.0 from the module proxy (v0.9.0 is not the course's); `--version` prints the stamped gitVersion."""
    from gpulab import versions

    gomod = (binaries.GOBUILD / "metrics-server" / "go.mod").read_text()
    assert versions.METRICS_SERVER == "v0.8.0"
    assert f"sigs.k8s.io/metrics-server {versions.METRICS_SERVER}" in gomod
    assert "tool sigs.k8s.io/metrics-server/cmd/metrics-server" in gomod
    assert os.path.isfile(binaries.GOBUILD / "metrics-server" / "go.sum")
    build = next(b for b in binaries.BUILDS if b.name == "metrics-server")
    assert build.programs == (("sigs.k8s.io/metrics-server/cmd/metrics-server", "metrics-server"),)
    assert f"-X k8s.io/client-go/pkg/version.gitVersion={versions.METRICS_SERVER}" in build.ldflags
    assert "metrics-server" in binaries.REQUIRED


@pytest.mark.parametrize("output, found", [
    ("v0.8.0\n", "v0.8.0"), ("v0.8.1", "v0.8.1"), ("  v0.8.0-dirty  \n", "v0.8.0-dirty"),
    ("I1203 12:00:00 noise\nv0.8.0\n", "v0.8.0"), ("version v0.8.0", None), ("", None),
])
def test_a_bare_version_line_is_read(output, found):
    import re

    m = re.search(binaries.VERSION_RULES["metrics-server"].pattern, output)
    assert (m[1] if m else None) == found


@pytest.mark.parametrize("output, found", [
    ("CoreDNS-1.14.7\nlinux/amd64, go1.26.8, \n", "1.14.7"), ("CoreDNS-1.14.8", "1.14.8"),
    ("CoreDNS-(untracked dev build)\n", None), ("CoreDNS 1.14.7", None), ("", None),
])
def test_coredns_version_glued_to_its_name_is_read(output, found):
    import re

    rule = binaries.VERSION_RULES["coredns"]
    assert rule.sample() == "CoreDNS-1.14.7" and rule.args == ("-version",)
    m = re.search(rule.pattern, output)
    assert (m[1] if m else None) == found


_OTHER_BUILD = r"""
import sys, time
from pathlib import Path
from gpulab._fsutil import hold_lock

lock, release = Path(sys.argv[1]), Path(sys.argv[2])
with hold_lock(lock, what="the build lock", purpose="building kubernetes v1.37.2"):
    print("held", flush=True)
    while not release.exists():
        time.sleep(0.01)
"""


def test_a_second_build_says_whom_it_waits_for_and_reuses_its_work(tmp_path, monkeypatch):
    import subprocess
    import sys

    monkeypatch.setenv("GPULAB_CACHE", str(tmp_path / "cache"))
    lock, release = binaries.build_lock_path(), tmp_path / "release"
    lock.parent.mkdir(parents=True)
    other = subprocess.Popen([sys.executable, "-c", _OTHER_BUILD, str(lock), str(release)],
                             stdout=subprocess.PIPE, text=True)
    built: list[str] = []
    heard: list[str] = []

    def say(msg: str) -> None:
        heard.append(msg)
        release.touch()  # the other build finishes...
        built.append("kubernetes")  # ...having built kubernetes

    monkeypatch.setattr(binaries, "_is_built", lambda b: b.name in built)
    monkeypatch.setattr(binaries, "_build", lambda b, go, progress: pytest.fail(f"built {b.name} again"))
    try:
        assert other.stdout.readline() == "held\n"
        binaries._build_locked([b for b in binaries.BUILDS if b.name == "kubernetes"], "go", say, interval=0.05)
    finally:
        release.touch()
        other.wait(timeout=30)
        other.stdout.close()
    assert heard[0].startswith(f"waiting for the build lock {lock} held by pid {other.pid} (python -c "), heard
    assert heard[0].split(", ")[0].endswith(": building kubernetes v1.37.2)"), heard
    assert heard[-1].startswith("got the build lock after "), heard


def test_the_build_lock_names_what_its_holder_compiles(tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("GPULAB_CACHE", str(tmp_path / "cache"))
    seen: list[str] = []

    def fake_build(b, go, progress):
        progress("kubernetes: compiling kube-apiserver (88/2454 packages, 7 s)")
        seen.append(json.loads(binaries.build_lock_path().read_text())["purpose"])

    monkeypatch.setattr(binaries, "_is_built", lambda b: False)
    monkeypatch.setattr(binaries, "_build", fake_build)
    heard: list[str] = []
    binaries._build_locked([b for b in binaries.BUILDS if b.name == "kubernetes"], "go", heard.append)
    from gpulab import versions

    assert seen == [f"building kubernetes {versions.KUBERNETES}, "
                    "kubernetes: compiling kube-apiserver (88/2454 packages, 7 s)"]
    assert heard[-1] == "kubernetes: compiling kube-apiserver (88/2454 packages, 7 s)"
    assert binaries.build_lock_path().read_text() == ""  # released
