"""Binary discovery and build errors name what failed and what to do."""

from __future__ import annotations

import os
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
    (tmp_path / "etcd").write_text("#!/bin/sh\n")
    (tmp_path / "etcd").chmod(stat.S_IRWXU)
    with pytest.raises(binaries.BinaryError) as err:
        binaries.ensure()
    assert "lacks kube-apiserver, kube-controller-manager, kube-scheduler, kwok" in str(err.value)


def test_bin_dir_with_everything_is_used_as_is(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_BIN_DIR", str(tmp_path))
    for name in binaries.REQUIRED:
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(stat.S_IRWXU)
    (tmp_path / "kwok-crds").mkdir()
    for crd in binaries.KWOK_CRDS:
        (tmp_path / "kwok-crds" / crd).write_text("{}")
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
