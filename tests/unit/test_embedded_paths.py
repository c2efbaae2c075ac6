"""EmbeddedCluster's file-system preparation (no processes started)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

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
