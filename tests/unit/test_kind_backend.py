"""The backend is chosen once (`gpulab up --backend`), remembered in GPULAB_HOME, and found by everything."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpulab import cli
from gpulab.cluster import backend
from gpulab.cluster.embedded import EmbeddedCluster
from gpulab.cluster.kind import KindCluster


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("GPULAB_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GPULAB_KIND_CLUSTER", raising=False)
    return tmp_path / "home"


def test_default_backend_is_embedded(home) -> None:
    assert backend.chosen() == "embedded"
    assert isinstance(backend.current(), EmbeddedCluster)
    assert backend.kubeconfig() == home / "cluster" / "kubeconfig"


def test_choice_is_remembered_and_every_caller_follows_it(home) -> None:
    backend.choose("kind")
    assert (home / "backend").read_text() == "kind\n"
    assert backend.chosen() == "kind"
    assert isinstance(backend.current(), KindCluster)
    # notebooks (setup), labs (labkit) and `gpulab kubeconfig` all read backend.kubeconfig()
    assert backend.kubeconfig() == home / "kind" / "kubeconfig"
    result = CliRunner().invoke(cli.main, ["kubeconfig"])
    assert result.exit_code == 0 and result.output.strip() == str(home / "kind" / "kubeconfig")
    backend.forget()
    assert backend.chosen() == "embedded"


def test_unknown_backend_is_refused_with_the_allowed_ones(home) -> None:
    with pytest.raises(backend.BackendError, match=r"--backend: unknown backend 'docker'; allowed: embedded, kind"):
        backend.choose("docker")
    home.mkdir(parents=True)
    (home / "backend").write_text("minikube\n")
    with pytest.raises(backend.BackendError, match=r"home/backend: unknown backend 'minikube'"):
        backend.chosen()


def test_kind_cluster_name_comes_from_state_then_env(home, monkeypatch) -> None:
    assert KindCluster().name == "gpulab"
    monkeypatch.setenv("GPULAB_KIND_CLUSTER", "course")
    assert KindCluster().name == "course"


def test_up_with_kind_and_no_docker_fails_clearly_and_remembers_nothing(home, tmp_path, monkeypatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(shutil.which("sh"), bin_dir / "sh")
    monkeypatch.setenv("PATH", str(bin_dir))
    result = CliRunner().invoke(cli.main, ["up", "--backend", "kind"])
    assert result.exit_code == 1
    assert "gpulab: error: the kind backend needs Docker" in result.output
    assert backend.chosen() == "embedded"
    assert not (home / "kind").exists()


def test_switching_backends_needs_the_old_cluster_gone(home) -> None:
    # An embedded cluster "exists" once its state file does.
    (home / "cluster").mkdir(parents=True)
    (home / "cluster" / "state.json").write_text("{}")
    result = CliRunner().invoke(cli.main, ["up", "--backend", "kind"])
    assert result.exit_code == 2
    assert "already has a cluster of the embedded backend; `gpulab down --purge` deletes it" in result.output


def test_fault_and_host_nvidia_smi_say_they_are_embedded_only(home) -> None:
    backend.choose("kind")
    for args in (["fault", "list"], ["nvidia-smi", "gpu-node-1"]):
        result = CliRunner().invoke(cli.main, args)
        assert result.exit_code == 1, args
        assert "works on the embedded backend only" in result.output


def test_status_of_a_kind_home_without_a_cluster(home) -> None:
    backend.choose("kind")
    result = CliRunner().invoke(cli.main, ["status"])
    assert result.exit_code == 1
    assert "no kind cluster created by gpulab yet: `gpulab up --backend kind`" in result.output
