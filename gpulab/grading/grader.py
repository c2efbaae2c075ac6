"""Grading against the local cluster: what ``gpulab check`` and ``gpulab grade`` run.

Both use the same pieces, so a learner's ``check`` sees exactly what the
instructor's ``grade`` will: the lab's :class:`~gpulab.grading.cluster.LabSpec`,
a :class:`~gpulab.grading.cluster.ClusterSandbox` (fresh namespaces and a
namespace-scoped identity per run), a :class:`~gpulab.grading.cluster.ClusterCollector`,
and a :class:`~gpulab.grading.runner.Runner` in a :class:`~gpulab.grading.jail.Jail`.

A lab notebook's own ``check()`` (:mod:`gpulab.grading.labkit`) grades through
the same step as ``gpulab check``, :func:`grade_visible`, with the values its
kernel recorded so far and its namespaces as they are now (:func:`check_kernel`).
"""

from __future__ import annotations

import getpass
import re
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulab import paths
from gpulab.cluster.base import Cluster
from gpulab._fsutil import atomic_write_json
from gpulab.kube import api

from ..i18n import _
from .checks import CheckLoadError, CheckSuite, load_hidden_checks, load_lab_checks
from .cluster import (
    ClusterCollector,
    ClusterSandbox,
    LabSpec,
    SandboxError,
    delete_leftovers,
    gpu_usage,
    load_lab_spec,
)
from .gradebook import (
    BatchResult,
    Collector,
    GradebookError,
    GradeRow,
    NotebookRunner,
    ProgressEvent,
    Sandbox,
    Submission,
    TqdmProgress,
    check_out_dir,
    discover_submissions,
    feedback_markdown,
    grade_batch,
    grade_submission,
    k8s_name,
    select_submissions,
)
from .jail import Jail
from .runner import Execution, Runner
from .secret import SecretError, ensure as ensure_secret, path as secret_path


class GradingError(RuntimeError):
    """Grading cannot start (no cluster, unknown lab, no jail); the message says what to do."""


def lab_of_notebook(path: str | Path) -> str:
    """``labs/03-taints-tolerations.ipynb`` → ``"03"``."""
    match = re.match(r"^(\d+)", Path(path).name)
    if not match:
        raise GradingError(_("{path}: a lab notebook's name starts with its number (e.g. 03-taints-tolerations.ipynb)",
                             path=path))
    return f"{int(match.group(1)):02d}"


def _cluster(cluster: Cluster | None = None) -> Cluster:
    from gpulab.cluster import backend  # the backends' modules only when no cluster was given

    cluster = cluster or backend.current()
    if not cluster.exists() or not cluster.is_up():
        raise GradingError(_("the cluster in {path} is not running: start it with `gpulab up`", path=cluster.root))
    return cluster


def _spec(lab: str) -> LabSpec:
    try:
        return load_lab_spec(lab)
    except CheckLoadError as exc:
        raise GradingError(str(exc)) from exc


@dataclass
class Setup:
    """Everything one lab's grading needs, built once per batch."""

    spec: LabSpec
    suite: CheckSuite
    runner: Runner
    collector: ClusterCollector
    sandbox: ClusterSandbox

    def close(self) -> None:
        self.runner.close()
        self.sandbox.close()


def setup(lab: str | LabSpec, *, cluster: Cluster | None = None, hidden: str | Path | None = None,
          jail: bool = True, masks: Iterable[str | Path] = (), restore: str = "targeted",
          cell_timeout: float | None = None, timeout: float | None = None) -> Setup:
    """Build the runner, collector and sandbox for ``lab`` (its id, or its settings already loaded) on
    ``cluster`` (default: the local one).

    The grading secret (:mod:`gpulab.grading.secret`) is created here when this
    ``GPULAB_HOME`` has none, and masked from the jail like the hidden checks.
    """
    spec = lab if isinstance(lab, LabSpec) else _spec(lab)
    cluster = _cluster(cluster)
    try:
        ensure_secret()
    except (SecretError, OSError) as exc:
        raise GradingError(_("cannot read or create the grading secret: {error}", error=exc)) from exc
    try:
        suite = load_lab_checks(spec.lab)
        if hidden is not None:
            suite = suite.with_hidden(load_hidden_checks(hidden, spec.lab))
    except CheckLoadError as exc:
        raise GradingError(str(exc)) from exc
    cage = None
    if jail:
        cage = Jail(mask=[p for p in (hidden, secret_path().parent, *masks) if p is not None])
        try:
            cage.check()
        except RuntimeError as exc:
            raise GradingError(str(exc)) from exc
    runner = Runner(cell_timeout=cell_timeout or spec.cell_timeout, timeout=timeout or spec.timeout, jail=cage)
    sandbox = ClusterSandbox.for_cluster(cluster, spec, restore=restore)
    return Setup(spec, suite, runner, ClusterCollector(sandbox.client, spec, extra=sandbox.injected), sandbox)


def namespace_for(spec: LabSpec, prefix: str = "grade") -> Callable[[str, str], str]:
    """``grade-NN-<learner>``, short enough for the lab's extra namespaces."""
    return lambda _lab, learner: k8s_name(prefix, spec.number, learner, limit=spec.namespace_room)


def parallel_jobs(spec: LabSpec, requested: int, client: api.Client) -> tuple[int, str]:
    """How many submissions of the lab can be graded at once when ``requested`` are asked for, and why.

    Each submission has its own namespaces and identity, so a namespace-scoped
    lab's submissions run side by side, as many as the free GPUs allow
    (``GPUS_FREE`` each). A ``CLUSTER_WIDE`` lab changes what every submission
    sees (node labels and taints, GPU faults, PriorityClasses) and is restored
    after each one: its submissions go one at a time.
    """
    if requested <= 1:
        return 1, ""
    if spec.cluster_wide:
        return 1, _("lab {lab} changes cluster-wide state, which is restored after each submission: "
                    "grading one at a time", lab=spec.lab)
    if spec.gpus_free:
        free, _holders = gpu_usage(client)
        fit = max(1, free // spec.gpus_free)
        if fit < requested:
            return fit, _("lab {lab} needs {gpus} free GPU(s) per submission and {free} are free: "
                          "grading {jobs} at a time", lab=spec.lab, gpus=spec.gpus_free, free=max(free, 0), jobs=fit)
    return requested, _("grading {jobs} submissions at a time", jobs=requested)


def grade_submissions(submissions_dir: str | Path, lab: str, out_dir: str | Path, *, hidden: str | Path | None = None,
                      jail: bool = True, restore: str = "targeted", cluster: Cluster | None = None,
                      progress: Callable[[ProgressEvent], None] | bool = True,
                      cell_timeout: float | None = None, learners: Iterable[str] | None = None,
                      jobs: int = 1, say: Callable[[str], None] = lambda message: None) -> BatchResult:
    """Grade the submissions of ``lab`` in ``submissions_dir`` on the local cluster (``gpulab grade``).

    ``learners`` limits it to those learners; the rows of everyone else already
    in ``out_dir``'s gradebook stay (see :mod:`gpulab.grading.gradebook`).
    ``jobs``: at most that many at once, where the lab allows (:func:`parallel_jobs`; ``say`` is told
    how many).
    """
    if jobs < 1:
        raise GradingError(_("--jobs must be at least 1, not {jobs}", jobs=jobs))
    submissions_dir, out_dir = Path(submissions_dir), Path(out_dir)
    if not submissions_dir.is_dir():
        raise GradingError(_("{path}: no such directory of submissions", path=submissions_dir))
    learners = None if learners is None else list(learners)
    spec = _spec(lab)  # the lab's settings, loaded once for the whole batch
    try:  # before the cluster and the jail: a wrong name or folder is told at once
        subs = select_submissions(discover_submissions(submissions_dir, spec.lab), learners, submissions_dir)
        check_out_dir(out_dir, spec.lab)
    except GradebookError as exc:
        raise GradingError(str(exc)) from exc
    ready = setup(spec, cluster=cluster, hidden=hidden, jail=jail, masks=(submissions_dir, out_dir), restore=restore,
                  cell_timeout=cell_timeout)
    bar = TqdmProgress() if progress is True else (progress or None)
    try:
        # An interrupted earlier batch may have left namespaces behind, holding GPUs this one needs.
        delete_leftovers(ready.sandbox.client, f"grade-{ready.spec.number}-")
        at_once, why = parallel_jobs(ready.spec, min(jobs, len(subs)), ready.sandbox.client)
        if why:
            say(why)
        if len(subs) > 1:  # the next submissions' kernels start while the grader collects, cleans up, prepares
            ready.runner.warm = at_once
        return grade_batch(submissions_dir, ready.spec.lab, ready.suite, ready.runner, out_dir,
                           progress=bar, collector=ready.collector, sandbox=ready.sandbox,
                           parameters=dict(ready.spec.parameters), namespace_for=namespace_for(ready.spec),
                           learners=learners, submissions=subs, jobs=at_once)
    except GradebookError as exc:
        raise GradingError(str(exc)) from exc
    finally:
        if isinstance(bar, TqdmProgress):
            bar.close()
        ready.close()


@dataclass
class CheckReport:
    row: GradeRow
    feedback: str
    spec: LabSpec
    out_dir: Path | None  # None: nothing was kept (a notebook's own check(), see check_kernel)


def grade_visible(spec: LabSpec, suite: CheckSuite, sub: Submission, runner: NotebookRunner, collector: Collector,
                  out: Path, *, sandbox: Sandbox | None = None,
                  names: Callable[[str, str], str] | None = None) -> GradeRow:
    """Grade one run of a lab notebook with ``suite``: the grading step ``gpulab check`` and a lab notebook's
    own ``check()`` share.

    ``gpulab check`` (:func:`check_notebook`) passes the papermill
    :class:`Runner` (in its jail) and a fresh sandbox; ``check()`` (:func:`check_kernel`) a
    :class:`KernelRun` (the kernel's values so far, nothing executed) and no
    sandbox. Either way the run's recorded values and what its namespaces hold
    are read, turned into a :class:`~gpulab.grading.checks.Context` and graded
    by :func:`~gpulab.grading.gradebook.grade_submission`, as ``gpulab grade`` does.
    """
    try:
        return grade_submission(sub, spec.lab, suite, runner, out, collector, sandbox,
                                parameters=dict(spec.parameters), namespace_for=names or namespace_for(spec, "check"))
    except SandboxError as exc:
        raise GradingError(str(exc)) from exc


def check_notebook(notebook: str | Path, *, lab: str | None = None, out_dir: str | Path | None = None,
                   jail: bool = True, cluster: Cluster | None = None, learner: str | None = None) -> CheckReport:
    """Run one notebook as the grader would (``gpulab check``); visible checks only."""
    notebook = Path(notebook)
    if not notebook.is_file():
        raise GradingError(f"{notebook}: no such notebook")
    lab = lab or lab_of_notebook(notebook)
    learner = learner or getpass.getuser() or "learner"
    spec = _spec(lab)
    out = Path(out_dir) if out_dir else paths.home() / "checks" / spec.lab
    ready = setup(spec, cluster=cluster, jail=jail, masks=(out,))
    try:
        row = grade_visible(spec, ready.suite, Submission(learner, notebook), ready.runner, ready.collector, out,
                            sandbox=ready.sandbox)
    finally:
        ready.close()
    text = feedback_markdown(spec.lab, row, ready.suite.max_points)
    (out / "feedback").mkdir(parents=True, exist_ok=True)
    (out / "feedback" / f"{learner}.md").write_text(text, encoding="utf-8")
    return CheckReport(row, text, spec, out)


@dataclass
class KernelRun:
    """The "run" of a notebook that checks itself from its own kernel (a :class:`NotebookRunner`).

    Nothing is executed (running the notebook again from inside it would
    recurse): the kernel's run so far is the run, one that has not failed
    (``ok``), and the values it recorded so far are handed over as that run's
    results file, which :func:`grade_visible` reads like a graded run's.
    """

    values: Mapping[str, Any]

    def run(self, notebook: Path, work_dir: Path, parameters: Mapping[str, Any] | None = None,
            cwd: Path | None = None, env: Mapping[str, str] | None = None, name: str | None = None) -> Execution:
        work_dir = Path(work_dir)
        work_dir.mkdir(parents=True, exist_ok=True)
        results = work_dir / f"{name or Path(notebook).stem}.results.json"
        atomic_write_json(results, dict(self.values))
        return Execution(Path(notebook), ok=True, executed=True, results_path=results,
                         message="checked from the notebook's own kernel", parameters=dict(parameters or {}))

    def close(self) -> None:
        """Nothing is kept started."""


def check_kernel(lab: str, namespace: str, values: Mapping[str, Any], *, notebook: str | Path | None = None,
                 cluster: Cluster | None = None, client: api.Client | None = None) -> CheckReport:
    """Grade a lab notebook from its own kernel (labkit's ``check()``): visible checks only.

    The values the notebook recorded so far (``values``) and what ``namespace``
    (and the lab's extra namespaces) hold now on ``cluster`` (default: the
    local one; ``client``: an API client to read with instead) are graded the
    way ``gpulab check`` grades a run (:func:`grade_visible`). Hidden checks are
    never loaded (nor run, should the lab's module declare some), and a lab's
    ``SETUP`` is not run, so what it would hand the checks (an ``InjectedFault``)
    is not there. Nothing is created or changed on the cluster; nothing is kept
    on disk.
    """
    spec = _spec(lab)
    try:
        suite = load_lab_checks(lab)
    except CheckLoadError as exc:
        raise GradingError(str(exc)) from exc
    suite = CheckSuite(suite.lab, tuple(c for c in suite.checks if not c.hidden))
    owned = None
    if client is None:
        client = owned = api.Client(_cluster(cluster).kubeconfig)
    try:
        with tempfile.TemporaryDirectory(prefix="gpulab-self-check-") as tmp:
            row = grade_visible(spec, suite, Submission("notebook", Path(notebook or f"{spec.lab}.ipynb")),
                                KernelRun(values), ClusterCollector(client, spec), Path(tmp),
                                names=lambda _lab, _learner: namespace)
    finally:
        if owned is not None:
            owned.close()
    return CheckReport(row, feedback_markdown(spec.lab, row, suite.max_points), spec, None)
