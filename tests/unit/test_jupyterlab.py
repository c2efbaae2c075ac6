"""The learner's JupyterLab: in Chinese, the official zh-CN language pack made the default by the course's settings
override (``make install``, postBuild); and ``gpulab jupyter`` (``make lab``), whose terminals (plain bash, by
the course's server config in jupyter-config/) have gpulab, kubectl 1.37 and the cluster's kubeconfig.

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
    # Its terminals' shell comes from the course's server config (next test), not from a flag.
    assert not any(a.startswith("--ServerApp.terminado_settings") for a in argv)


def test_the_servers_terminals_are_plain_bash_with_the_servers_environment(monkeypatch, tmp_path):
    """Left alone, a server whose output is not a terminal starts `$SHELL -l`, and a login shell's /etc/profile
    may set PATH afresh (Debian's does). `gpulab jupyter` (and the image's start, tests/unit/test_repo2docker.py)
    put the course's server config first on JUPYTER_CONFIG_PATH: every terminal is a plain bash, which inherits
    the server's PATH and KUBECONFIG."""
    from jupyter_server.serverapp import ServerApp

    _argv, env = _exec_of_gpulab_jupyter(monkeypatch, tmp_path, JUPYTER_CONFIG_PATH="/site/jupyter")
    assert env["JUPYTER_CONFIG_PATH"] == f"{REPO / 'jupyter-config'}:/site/jupyter"
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path / "user-config"))
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", env["JUPYTER_CONFIG_PATH"])
    app = ServerApp()
    app.load_config_file()
    assert app.terminado_settings == {"shell_command": ["/bin/bash"]}
    # What a terminal runs then: the server's environment as it is (no -l: /etc/profile is not read).
    shell = subprocess.run([*app.terminado_settings["shell_command"], "-c", 'echo "$PATH|$KUBECONFIG"'],
                           capture_output=True, text=True, env={"PATH": "/venv/bin:/usr/bin:/bin",
                                                                 "KUBECONFIG": "/k/config", "HOME": str(tmp_path)})
    assert shell.stdout.strip() == "/venv/bin:/usr/bin:/bin|/k/config"


def test_gpulab_jupyter_follows_the_chosen_backend(monkeypatch, tmp_path):
    from gpulab.cluster import backend

    monkeypatch.setenv("GPULAB_HOME", str(tmp_path))
    backend.choose("kind")
    _argv, env = _exec_of_gpulab_jupyter(monkeypatch, tmp_path)
    assert env["KUBECONFIG"] == str(tmp_path / "kind" / "kubeconfig") == str(backend.kubeconfig())
