"""The learner's JupyterLab: in Chinese, the official zh-CN language pack made the default by the course's settings
override (``make install``, postBuild).

tests/browser/test_first_hour_browser.py sees it in a real browser.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

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
