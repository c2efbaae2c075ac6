"""The learner's JupyterLab: in Chinese, the official zh-CN language pack made the default by the course's settings
override (``make install``, postBuild); and ``gpulab jupyter`` (``make lab``), whose terminals have gpulab,
kubectl 1.37 and the cluster's kubeconfig.

tests/browser/test_first_hour_browser.py sees both in a real browser.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from click.testing import CliRunner
from packaging.requirements import Requirement

from gpulab import cli

REPO = Path(__file__).resolve().parents[2]
OVERRIDES = REPO / "jupyterlab-overrides.json"
# Where make install puts it, relative to the environment (postBuild: tests/unit/test_repo2docker.py).
INSTALLED = "share/jupyter/lab/settings/overrides.d/gpulab.json"


def test_the_override_makes_zh_cn_the_default_language_of_an_installed_pack():
    assert json.loads(OVERRIDES.read_text()) == {"@jupyterlab/translation-extension:plugin": {"locale": "zh_CN"}}
    declared = [Requirement(r).name for r in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
                ["dependencies"]]
    assert "jupyterlab-language-pack-zh-CN" in declared  # what a learner installs, not a test tool
    packs = {ep.name for ep in metadata.entry_points(group="jupyterlab.languagepack")}
    assert "zh_CN" in packs, f"no zh_CN language pack installed here (found: {sorted(packs)})"


def test_make_install_puts_it_where_the_environments_jupyterlab_reads_overrides(tmp_path, monkeypatch):
    from jupyterlab.labapp import LabApp

    venv = tmp_path / "venv"
    target = venv / INSTALLED
    dry = subprocess.run(["make", "-n", "-C", str(REPO), f"VENV={venv}", "install"], capture_output=True, text=True)
    assert f"install -D -m 0644 jupyterlab-overrides.json {target}" in dry.stdout, dry.stdout + dry.stderr
    made = subprocess.run(["make", "-s", "-C", str(REPO), f"VENV={venv}", str(target)], capture_output=True,
                          text=True)
    assert made.returncode == 0, made.stdout + made.stderr
    assert target.read_text() == OVERRIDES.read_text()
    # An environment's JupyterLab reads settings overrides from every overrides.d/*.json of its application
    # settings directory, which is <prefix>/share/jupyter/lab/settings.
    monkeypatch.delenv("JUPYTERLAB_DIR", raising=False)
    assert Path(LabApp().app_settings_dir) == (Path(sys.prefix) / INSTALLED).parent.parent.resolve()


def _exec_of_gpulab_jupyter(monkeypatch, tmp_path, *args: str, **env: str) -> tuple[list[str], dict[str, str]]:
    """What `gpulab jupyter ARGS` would exec: its argv and environment."""
    execs = []
    monkeypatch.setattr(cli.os, "execve", lambda exe, argv, environ: execs.append((exe, argv, environ)))
    result = CliRunner().invoke(cli.main, ["jupyter", *args], env={"GPULAB_HOME": str(tmp_path), **env})
    assert result.exit_code == 0, result.output
    (exe, argv, environ), = execs
    assert exe == sys.executable == argv[0]
    return argv, environ


def test_gpulab_jupyter_gives_jupyterlab_this_environments_bin_and_the_clusters_kubeconfig(monkeypatch, tmp_path):
    bindir = str(Path(sys.executable).parent)
    argv, env = _exec_of_gpulab_jupyter(monkeypatch, tmp_path, "--ServerApp.port=8899", "--no-browser",
                                        PATH=f"/usr/bin:{bindir}:/bin", KUBECONFIG="/home/me/.kube/config",
                                        SHELL="/bin/zsh")
    assert argv[1:3] == ["-m", "jupyterlab"] and argv[-2:] == ["--ServerApp.port=8899", "--no-browser"]
    # gpulab and kubectl 1.37 first, once; the cluster's kubeconfig (a learner's own is not the course's cluster).
    assert env["PATH"] == f"{bindir}:/usr/bin:/bin"
    assert (Path(bindir) / "gpulab").exists() and (Path(bindir) / "kubectl").exists()
    assert env["KUBECONFIG"] == str(tmp_path / "cluster" / "kubeconfig")
    # A terminal is the learner's shell, never a login shell whose /etc/profile would set PATH afresh.
    setting = next(a for a in argv if a.startswith("--ServerApp.terminado_settings="))
    assert json.loads(setting.split("=", 1)[1]) == {"shell_command": ["/bin/zsh"]}


def test_gpulab_jupyter_follows_the_chosen_backend(monkeypatch, tmp_path):
    from gpulab.cluster import backend

    monkeypatch.setenv("GPULAB_HOME", str(tmp_path))
    backend.choose("kind")
    _argv, env = _exec_of_gpulab_jupyter(monkeypatch, tmp_path)
    assert env["KUBECONFIG"] == str(tmp_path / "kind" / "kubeconfig") == str(backend.kubeconfig())
