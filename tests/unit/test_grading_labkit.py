"""The notebook side of labs: kubectl in the lab's namespace, expected failures as values."""

from __future__ import annotations

import os
import stat

import pytest

from gpulab.grading import labkit


@pytest.fixture
def fake_kubectl(tmp_path, monkeypatch):
    """A kubectl that prints its arguments, and fails (like the apiserver would) for `apply -f bad.yaml`."""
    exe = tmp_path / "kubectl"
    exe.write_text("#!/bin/sh\n"
                   "case \"$*\" in *bad.yaml*) echo 'The Pod \"x\" is invalid: must be an integer' >&2; exit 1;; esac\n"
                   "echo \"args: $*\"\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(labkit, "_kubectl_exe", lambda: str(exe))
    monkeypatch.setattr(labkit, "_lab", labkit.Lab("lab-01", tmp_path / "work", False, "kc"))
    return exe


def test_commands_run_in_the_labs_namespace_unless_told_otherwise(fake_kubectl, capsys):
    out = labkit.kubectl("get pods")
    assert out == "args: get pods -n lab-01\n"
    assert capsys.readouterr().out == "$ kubectl get pods -n lab-01\nargs: get pods -n lab-01\n"
    assert labkit.kubectl(["kubectl", "get", "pods", "-A"], quiet=True) == "args: get pods -A\n"
    assert labkit.kubectl("get pods --namespace=team-a", quiet=True) == "args: get pods --namespace=team-a\n"
    assert labkit.kubectl("get pods", namespace="other", quiet=True) == "args: get pods -n other\n"


def test_expected_rejections_are_values_and_unexpected_ones_raise(fake_kubectl):
    outcome = labkit.try_kubectl("apply -f bad.yaml", quiet=True)
    assert not outcome.ok and outcome.code == 1 and "must be an integer" in outcome.output
    with pytest.raises(labkit.KubectlFailed, match="must be an integer") as err:
        labkit.kubectl("apply -f bad.yaml", quiet=True)
    assert err.value.code == 1


def test_output_is_not_echoed_twice_in_a_notebook(fake_kubectl):
    out = labkit.kubectl("get nodes", quiet=True)
    assert isinstance(out, str) and out._ipython_display_() is None


def test_wait_until_says_what_did_not_happen():
    with pytest.raises(TimeoutError, match="Pod 运行起来"):
        labkit.wait_until(lambda: False, timeout=0.2, interval=0.05, what="Pod 运行起来")
    assert labkit.wait_until(lambda: "ready", timeout=1) == "ready"


def test_manifest_paths_are_absolute_and_checked():
    path = labkit.manifest("01-gpu-pod-spec/half-gpu.yaml")
    assert path.is_absolute() and path.exists()
    with pytest.raises(FileNotFoundError, match="manifests/labs/nope.yaml"):
        labkit.manifest("nope.yaml")


def test_begin_without_a_cluster_says_how_to_start_one(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("GPULAB_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", os.environ.get("PATH", ""))  # begin() may prepend to it
    with pytest.raises(RuntimeError, match="gpulab up"):
        labkit.begin("lab-01")
