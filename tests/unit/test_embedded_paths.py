"""EmbeddedCluster's file-system preparation (no processes started), and how messages show its paths."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from gpulab import paths
from gpulab.cluster import embedded
from gpulab.cluster.embedded import EmbeddedCluster


def test_private_directories_on_the_way_get_only_the_search_bit(tmp_path: Path, monkeypatch) -> None:
    # As root, pod and exec processes run as nobody: a 0700 home on the way to
    # the cluster directory would make `kubectl exec POD -- nvidia-smi` fail.
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    home.chmod(0o700)
    monkeypatch.setattr(embedded.os, "geteuid", lambda: 0)
    monkeypatch.setattr(embedded.sys, "prefix", str(tmp_path))
    said: list[str] = []
    EmbeddedCluster(home / ".gpulab" / "cluster")._make_reachable(said.append)
    assert stat.S_IMODE(home.stat().st_mode) == 0o701
    assert any(str(home) in line and "o+x" in line for line in said)
    said.clear()
    EmbeddedCluster(home / ".gpulab" / "cluster")._make_reachable(said.append)
    assert said == []  # nothing left to change, nothing said


def test_non_root_changes_nothing(tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o700)
    monkeypatch.setattr(embedded.os, "geteuid", lambda: 1000)
    EmbeddedCluster(home / "cluster")._make_reachable(lambda _m: pytest.fail("nothing to say"))
    assert stat.S_IMODE(home.stat().st_mode) == 0o700


def test_messages_show_paths_under_gpulab_home_or_the_home_directory_short(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_HOME", str(tmp_path / "gl"))
    assert paths.shown(tmp_path / "gl" / "cluster" / "kubeconfig") == "$GPULAB_HOME/cluster/kubeconfig"
    assert paths.shown(tmp_path / "gl") == "$GPULAB_HOME"
    assert paths.shown(Path.home() / ".gpulab" / "cluster") == "~/.gpulab/cluster"
    assert paths.shown("/opt/elsewhere/kubeconfig") == "/opt/elsewhere/kubeconfig"
    monkeypatch.delenv("GPULAB_HOME")
    assert paths.shown(paths.home() / "cluster") == "~/.gpulab/cluster"


def test_first_on_puts_a_directory_first_once():
    assert paths.first_on("/usr/bin:/venv/bin::/bin", "/venv/bin") == "/venv/bin:/usr/bin:/bin"
    assert paths.first_on(None, Path("/course/jupyter-config")) == "/course/jupyter-config"
