"""Grade a folder of submissions into a CSV gradebook and zh-CN feedback files.

Submissions (``submissions_dir``)
    ``<learner>.ipynb`` — the learner id is the file stem; or
    ``<learner>/<any>.ipynb`` — the learner id is the directory name. A directory
    with several notebooks must contain exactly one named after the lab (its
    number prefix, e.g. ``03-…``). Entries starting with ``.`` or ``_`` are skipped.

Output (``out_dir``)
    ``gradebook.csv``      one row per learner (UTF-8 with BOM, so spreadsheet apps detect it)
    ``feedback/<id>.md``   zh-CN feedback for the learner
    ``runs/<id>.*``        executed notebook, recorded values, captured objects, log
    ``details.json``       everything, for instructors (including hidden checks' real messages)

Each submission is isolated: a hanging, crashing or unreadable one yields a
row with its status, never stops the batch. The gradebook is rewritten
atomically after every submission, so it is always complete up to the last
graded learner. Results depend only on the inputs (rows sorted, no timestamps),
so grading twice gives the same files.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gpulab._fsutil import atomic_write_bytes, atomic_write_json, atomic_write_text

from .checks import Check, CheckOutcome, CheckSuite, Context, group_by_kind, load_hidden_checks, load_lab_checks
from .record import ResultsError, load_results
from .runner import ErrorKind, Execution, Runner

GRADEBOOK = "gradebook.csv"

# Statuses for which the submission itself is at fault and scores zero; grader-side
# failures instead leave the scores blank so that nobody mistakes them for a grade.
NOT_RUN_STATUSES = {ErrorKind.INVALID_NOTEBOOK.value, ErrorKind.NO_PARAMETERS_CELL.value, "no-notebook",
                    "ambiguous-submission"}
UNGRADED_STATUSES = {"grader-error", ErrorKind.RUNNER_ERROR.value}


class Collector(Protocol):
    """Captures the API objects a submission left in its namespace, as plain dicts.

    ``collect`` returns ``{"Pod": [...], "Job": [...], ...}`` (kind → objects as
    ``kubectl get -o json`` items) and may add cluster-scoped kinds (``Node`` …).
    """

    def collect(self, namespace: str) -> Mapping[str, Sequence[Mapping[str, Any]]]: ...


class Sandbox(Protocol):
    """Optional per-submission environment: a namespace and a restricted identity.

    ``prepare`` creates them for ``learner`` and returns environment variables
    for the kernel (e.g. ``{"KUBECONFIG": path}``); ``release`` removes them
    after collection. :class:`gpulab.grading.cluster.ClusterSandbox` is the
    cluster implementation.
    """

    def prepare(self, namespace: str, learner: str) -> Mapping[str, str]: ...

    def release(self, namespace: str) -> None: ...


class NotebookRunner(Protocol):
    def run(self, notebook: Path, work_dir: Path, parameters: Mapping[str, Any] | None = None,
            cwd: Path | None = None, env: Mapping[str, str] | None = None, name: str | None = None
            ) -> Execution: ...


class NullCollector:
    """For labs graded on recorded values only."""

    def collect(self, namespace: str) -> dict[str, list[dict[str, Any]]]:
        return {}


class RecordedCollector:
    """Objects recorded earlier: ``{namespace: [objects or kubectl Lists]}``; ``"*"`` applies to any namespace."""

    def __init__(self, by_namespace: Mapping[str, Iterable[Mapping[str, Any]]]):
        self.by_namespace = {ns: list(objs) for ns, objs in by_namespace.items()}

    @classmethod
    def from_dir(cls, directory: str | Path) -> RecordedCollector:
        """``<namespace>.json`` files, each a ``kubectl get -o json`` List or a JSON array of objects."""
        data: dict[str, list[Mapping[str, Any]]] = {}
        for path in sorted(Path(directory).glob("*.json")):
            loaded = json.loads(path.read_text(encoding="utf-8"))
            data[path.stem] = loaded if isinstance(loaded, list) else [loaded]
        return cls(data)

    def collect(self, namespace: str) -> dict[str, list[dict[str, Any]]]:
        objects = self.by_namespace.get(namespace, self.by_namespace.get("*", []))
        return group_by_kind(objects)


# --------------------------------------------------------------------------- submissions


@dataclass(frozen=True)
class Submission:
    learner: str
    notebook: Path | None
    problem: str | None = None  # status when nothing can be run
    reason: str = ""


def _lab_prefix(lab: str) -> str | None:
    match = re.match(r"^(?:lab[_-]?)?(\d+)", lab)
    return f"{int(match.group(1)):02d}" if match else None


def discover_submissions(submissions_dir: str | Path, lab: str) -> list[Submission]:
    """Submissions in ``submissions_dir``, sorted by learner id (see the module docstring)."""
    root = Path(submissions_dir)
    if not root.is_dir():
        raise NotADirectoryError(f"{root}: submissions directory does not exist")
    candidates: dict[str, list[Path]] = {}
    problems: dict[str, tuple[str, str]] = {}  # learner -> (status, reason)
    prefix = _lab_prefix(lab)
    for entry in sorted(root.iterdir()):
        if entry.name.startswith((".", "_")):
            continue
        if entry.is_file() and entry.suffix == ".ipynb":
            candidates.setdefault(entry.stem, []).append(entry)
        elif entry.is_dir():
            found = candidates.setdefault(entry.name, [])
            notebooks = sorted(p for p in entry.glob("*.ipynb") if not p.name.startswith("."))
            if len(notebooks) > 1:
                named = [p for p in notebooks if p.stem == lab or (prefix and p.stem.startswith(prefix))]
                notebooks = named if len(named) == 1 else notebooks
            if not notebooks:
                problems[entry.name] = ("no-notebook", f"{entry.name}/ contains no .ipynb file")
            elif len(notebooks) > 1:
                problems[entry.name] = ("ambiguous-submission",
                                        f"{entry.name}/ holds several notebooks "
                                        f"({', '.join(p.name for p in notebooks)}), none clearly for lab {lab}")
            else:
                found.append(notebooks[0])
    subs = []
    for learner in sorted(candidates):
        paths = candidates[learner]
        if learner in problems and not paths:
            status, reason = problems[learner]
            subs.append(Submission(learner, None, status, reason))
        elif len(paths) > 1 or learner in problems:
            listed = ", ".join(str(p.relative_to(root)) for p in paths)
            subs.append(Submission(learner, None, "ambiguous-submission",
                                   f"several submissions for learner {learner}: {listed}"))
        else:
            subs.append(Submission(learner, paths[0]))
    return subs


def _slug(text: str) -> str:
    return re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9]", "-", text.lower())).strip("-")


def k8s_name(*parts: str, limit: int = 63) -> str:
    """A DNS-1123 label from ``parts``; a hash keeps distinct inputs distinct after slugging."""
    raw = "-".join(parts)
    slug = _slug(raw)
    if slug == raw and len(slug) <= limit:
        return slug
    digest = hashlib.sha1(raw.encode("utf-8")).hexdigest()[:8]
    return f"{slug[: limit - 9].rstrip('-')}-{digest}".lstrip("-") or digest


def default_namespace(lab: str, learner: str) -> str:
    """``grade-<lab>-<learner>``, valid as a namespace name."""
    return k8s_name("grade", lab, learner)


# --------------------------------------------------------------------------- rows


@dataclass
class GradeRow:
    learner: str
    status: str
    reason: str = ""
    outcomes: list[CheckOutcome] = field(default_factory=list)
    total: float | None = 0.0
    max_points: float = 0.0
    execution: Execution | None = None
    namespace: str | None = None

    @property
    def graded(self) -> bool:
        return self.total is not None


@dataclass(frozen=True)
class ProgressEvent:
    """Sent to the ``progress`` callback before (``phase="start"``) and after (``"done"``) each submission."""

    index: int
    total: int
    learner: str
    phase: str
    row: GradeRow | None = None


@dataclass
class BatchResult:
    lab: str
    rows: list[GradeRow]
    gradebook: Path
    out_dir: Path
    suite: CheckSuite

    def summary_text(self) -> str:
        """A short English report for the CLI: counts per status and where the files are."""
        counts: dict[str, int] = {}
        for row in self.rows:
            counts[row.status] = counts.get(row.status, 0) + 1
        graded = [r.total for r in self.rows if r.total is not None]
        mean = f", mean {_fmt(sum(graded) / len(graded))}/{_fmt(self.suite.max_points)}" if graded else ""
        statuses = ", ".join(f"{status} {n}" for status, n in sorted(counts.items()))
        return (f"lab {self.lab}: {len(self.rows)} submission(s) ({statuses or 'none'}){mean}\n"
                f"gradebook: {self.gradebook}\nfeedback:  {self.out_dir / 'feedback'}")


def _fmt(value: float | None) -> str:
    if value is None:
        return ""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def column_name(chk: Check) -> str:
    """CSV header of a check column: ``<id> (<points>)``, hidden ones prefixed ``hidden:``."""
    return f"{'hidden:' if chk.hidden else ''}{chk.id} ({_fmt(chk.points)})"


def gradebook_header(suite: CheckSuite) -> list[str]:
    return ["learner", *(column_name(c) for c in suite.checks), "total", "max", "status", "reason"]


def write_gradebook(path: str | Path, suite: CheckSuite, rows: Iterable[GradeRow]) -> None:
    """Atomically (re)write the CSV: header, then one row per learner sorted by id."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(gradebook_header(suite))
    for row in sorted(rows, key=lambda r: r.learner):
        earned = {o.check_id: o.earned for o in row.outcomes}
        cells = [_fmt(earned.get(c.id)) if row.graded and c.id in earned else "" for c in suite.checks]
        writer.writerow([row.learner, *cells, _fmt(row.total), _fmt(suite.max_points), row.status,
                         " ".join(row.reason.split())])
    atomic_write_bytes(path, buffer.getvalue().encode("utf-8-sig"))


def read_gradebook(path: str | Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8-sig", newline="") as handle:
        return list(csv.DictReader(handle))


# --------------------------------------------------------------------------- feedback


def feedback_markdown(lab: str, row: GradeRow, max_points: float) -> str:
    """The learner's zh-CN feedback; hidden checks appear only as numbered pass/fail lines."""
    lines = [f"# 实验反馈：{lab}", "", f"- 学员：{row.learner}"]
    if not row.graded:
        lines += ["- 得分：暂无", "",
                  "评分过程中出现了内部错误，这次没有给出成绩，讲师会重新评分。这不是你的问题。", ""]
        return "\n".join(lines)
    lines += [f"- 得分：**{_fmt(row.total)} / {_fmt(max_points)}**", "", "## 运行情况", ""]
    if row.execution is not None:
        lines.append(row.execution.learner_summary())
    elif row.status == "no-notebook":
        lines.append("没有找到你提交的笔记本文件（.ipynb）。")
    elif row.status == "ambiguous-submission":
        lines.append("你的提交里有多个笔记本，评分器无法确定该评哪一个，请只提交这个实验的笔记本。")
    if row.status in NOT_RUN_STATUSES:
        lines += ["", "因为笔记本没有运行，下面的检查都记 0 分。"]
    lines += ["", "## 各项检查", ""]
    for o in row.outcomes:
        mark = "✅" if o.passed else ("⚠️" if o.earned > 0 else "❌")
        text = f"- {mark} {o.label}：{_fmt(o.earned)} / {_fmt(o.points)} 分"
        if o.message and not (o.passed and o.hidden):
            text += f"。{o.message}"
        lines.append(text)
    lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------- grading


def _zero_outcomes(suite: CheckSuite, message: str) -> list[CheckOutcome]:
    labels = suite.labels()
    return [CheckOutcome(c.id, labels[c.id], c.points, 0.0, False, message, c.hidden) for c in suite.checks]


def _execution_dict(execution: Execution | None) -> dict[str, Any] | None:
    if execution is None:
        return None
    return {"ok": execution.ok, "status": execution.status, "message": execution.message,
            "cell_index": execution.cell_index, "ename": execution.ename, "evalue": execution.evalue,
            "traceback": execution.traceback}


def grade_submission(sub: Submission, lab: str, suite: CheckSuite, runner: NotebookRunner, out_dir: Path,
                     collector: Collector, sandbox: Sandbox | None = None,
                     parameters: Mapping[str, Any] | None = None, cwd: str | Path | None = None,
                     namespace_for: Callable[[str, str], str] = default_namespace) -> GradeRow:
    """Grade one submission; raises only for grader-side failures (the batch turns them into rows)."""
    if sub.problem is not None or sub.notebook is None:
        return GradeRow(sub.learner, sub.problem or "no-notebook", sub.reason,
                        _zero_outcomes(suite, "笔记本没有运行，这项检查记 0 分。"), 0.0, suite.max_points)
    namespace = namespace_for(lab, sub.learner)
    runs = out_dir / "runs"
    env: Mapping[str, str] = {}
    if sandbox is not None:
        env = sandbox.prepare(namespace, sub.learner)
    try:
        params = {**(parameters or {}), "namespace": namespace}
        execution = runner.run(sub.notebook, runs, parameters=params, cwd=Path(cwd) if cwd else None, env=env,
                               name=sub.learner)
        status = execution.status
        if status in UNGRADED_STATUSES:
            return GradeRow(sub.learner, status, execution.message, [], None, suite.max_points, execution,
                            namespace)
        if not execution.executed:
            return GradeRow(sub.learner, status, execution.message,
                            _zero_outcomes(suite, "笔记本没有运行，这项检查记 0 分。"), 0.0, suite.max_points,
                            execution, namespace)
        notes = [execution.message] if not execution.ok else []
        try:
            values = load_results(execution.results_path) if execution.results_path else {}
        except ResultsError as exc:
            values, notes = {}, notes + [f"results unreadable: {exc}"]
        objects = collector.collect(namespace)
        atomic_write_json(runs / f"{sub.learner}.objects.json", {k: list(v) for k, v in objects.items()})
    finally:
        if sandbox is not None:
            sandbox.release(namespace)
    ctx = Context(values, objects, namespace, execution)
    outcomes = suite.run(ctx)
    broken = [o.check_id for o in outcomes if o.error]
    if broken:
        notes.append(f"check errors in {', '.join(broken)} (see details.json)")
    total = round(sum(o.earned for o in outcomes), 2)
    return GradeRow(sub.learner, status, "; ".join(notes), outcomes, total, suite.max_points, execution, namespace)


def _resolve_suite(lab: str, checks: CheckSuite | Iterable[Check] | None,
                   hidden: str | Path | Iterable[Check] | None) -> CheckSuite:
    if checks is None:
        suite = load_lab_checks(lab)
    elif isinstance(checks, CheckSuite):
        suite = checks
    else:
        suite = CheckSuite(lab, tuple(checks))
    if hidden is not None:
        extra = load_hidden_checks(hidden, lab) if isinstance(hidden, (str, Path)) else tuple(hidden)
        suite = suite.with_hidden(extra)
    return suite


def grade_batch(submissions_dir: str | Path, lab: str, checks: CheckSuite | Iterable[Check] | None,
                runner: NotebookRunner, out_dir: str | Path, hidden: str | Path | Iterable[Check] | None = None,
                progress: Callable[[ProgressEvent], None] | None = None, collector: Collector | None = None,
                sandbox: Sandbox | None = None, parameters: Mapping[str, Any] | None = None,
                cwd: str | Path | None = None,
                namespace_for: Callable[[str, str], str] = default_namespace) -> BatchResult:
    """Grade every submission of ``lab`` in ``submissions_dir`` into ``out_dir``.

    ``checks`` is a :class:`CheckSuite` (or checks, or None to load the lab's
    module); ``hidden`` a directory of hidden check files or checks. ``cwd`` is
    the kernel's working directory (default: the submission's directory); set
    it to ``labs/`` so relative paths to ``manifests/`` resolve as for learners.
    """
    out = Path(out_dir)
    suite = _resolve_suite(lab, checks, hidden)
    collector = collector or NullCollector()
    subs = discover_submissions(submissions_dir, lab)
    (out / "feedback").mkdir(parents=True, exist_ok=True)
    gradebook = out / GRADEBOOK
    rows: list[GradeRow] = []
    details: dict[str, Any] = {"lab": lab, "max_points": suite.max_points,
                               "checks": [{"id": c.id, "title": c.title, "points": c.points, "hidden": c.hidden}
                                          for c in suite.checks],
                               "learners": {}}
    write_gradebook(gradebook, suite, rows)
    for index, sub in enumerate(subs, 1):
        if progress:
            progress(ProgressEvent(index, len(subs), sub.learner, "start"))
        try:
            row = grade_submission(sub, lab, suite, runner, out, collector, sandbox, parameters, cwd,
                                   namespace_for)
        except Exception as exc:  # noqa: BLE001 - one broken submission or grader hiccup must not stop the batch
            row = GradeRow(sub.learner, "grader-error", f"{type(exc).__name__}: {exc}", [], None,
                           suite.max_points)
            row_trace = traceback.format_exc(limit=8)
        else:
            row_trace = ""
        rows.append(row)
        atomic_write_text(out / "feedback" / f"{row.learner}.md", feedback_markdown(lab, row, suite.max_points))
        details["learners"][row.learner] = {
            "status": row.status, "reason": row.reason, "total": row.total, "namespace": row.namespace,
            "execution": _execution_dict(row.execution), "grader_traceback": row_trace,
            "checks": [{"id": o.check_id, "label": o.label, "points": o.points, "earned": o.earned,
                        "passed": o.passed, "message": o.message, "detail": o.detail, "error": o.error,
                        "hidden": o.hidden} for o in row.outcomes],
        }
        write_gradebook(gradebook, suite, rows)
        atomic_write_json(out / "details.json", details)
        if progress:
            progress(ProgressEvent(index, len(subs), sub.learner, "done", row))
    atomic_write_json(out / "details.json", details)
    return BatchResult(lab, rows, gradebook, out, suite)


class TqdmProgress:
    """A ``progress`` callback drawing a tqdm bar (on stderr) with the last learner's status."""

    def __init__(self, **tqdm_options: Any):
        self.options = {"unit": "份", "desc": "grading", **tqdm_options}
        self.bar: Any = None

    def __call__(self, event: ProgressEvent) -> None:
        from tqdm.auto import tqdm

        if self.bar is None:
            self.bar = tqdm(total=event.total, **self.options)
        if event.phase == "start":
            self.bar.set_postfix_str(event.learner)
        else:
            self.bar.update(1)
            self.bar.set_postfix_str(f"{event.learner}: {event.row.status if event.row else '?'}")
            if event.index == event.total:
                self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def grade_lab(submissions_dir: str | Path, lab: str, out_dir: str | Path, *,
              hidden: str | Path | None = None, runner: NotebookRunner | None = None,
              collector: Collector | None = None, sandbox: Sandbox | None = None,
              parameters: Mapping[str, Any] | None = None, cwd: str | Path | None = None,
              show_progress: bool = True) -> BatchResult:
    """CLI-facing wrapper of :func:`grade_batch`: the lab's own checks, a default Runner, a tqdm bar."""
    bar = TqdmProgress() if show_progress else None
    try:
        return grade_batch(submissions_dir, lab, None, runner or Runner(), out_dir, hidden=hidden, progress=bar,
                           collector=collector, sandbox=sandbox, parameters=parameters, cwd=cwd)
    finally:
        if bar is not None:
            bar.close()
