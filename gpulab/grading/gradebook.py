"""Grade a folder of submissions into a CSV gradebook and zh-CN feedback files.

Submissions (``submissions_dir``)
    ``<learner>.ipynb`` — the learner id is the file stem; or
    ``<learner>/<any>.ipynb`` — the learner id is the directory name. A directory
    with several notebooks must contain exactly one named after the lab (its
    number prefix, e.g. ``03-…``). Entries starting with ``.`` or ``_`` are skipped.
    ``learners=[...]`` (``gpulab grade --learner NAME``) grades only those.

Output (``out_dir``)
    ``gradebook.csv``      one row per learner (UTF-8 with BOM, so spreadsheet apps detect it)
    ``feedback/<id>.md``   zh-CN feedback for the learner
    ``runs/<id>.*``        executed notebook, recorded values, captured objects, log
    ``details.json``       everything, for instructors (including hidden checks' real messages)

Gradebook columns: ``learner``, one ``<check id> (<points>)`` column per check
(``hidden:`` prefixed for hidden ones; the points earned), ``total``, ``max``,
``percent`` (total/max × 100), ``status``, ``reason``, ``review``, ``graded-at``
(when the row was graded, ISO 8601 UTC such as ``2025-03-01T08:30:00Z``) and ``lab``.

Answers awaiting review: a check may mark its result for the instructor's review
(:attr:`gpulab.grading.checks.CheckResult.review`, as nbgrader marks manually
graded answers; free-text explanations that seem to assert a wrong claim are).
The row's ``review`` cell names those checks (space-separated ids; empty when
none), so filtering on a non-empty ``review`` lists every answer to read;
``details.json`` quotes the clauses (each check's ``review``) and the points
withheld until the review (``withheld``, not part of the check's cell or the
total), and the learner's feedback says which checks a teacher will review.
The instructor decides: where the learner did not mean what the check read, the
withheld points are theirs. A regrade writes the row again, ``review`` and
scores included, so record the decision in a column of your own (``notes``),
which a regrade keeps.

Nothing is lost: grading into an ``out_dir`` that already has a gradebook
*merges*. The learners graded now replace their own rows in place; every other
row stays where it was; learners new to the file are appended in the order
they are graded (sorted by id). Columns are matched by name, so a gradebook
from another check set or an older format (no ``percent``/``graded-at``/``lab``)
keeps its columns and values: check columns no longer in the suite stay (blank
for the rows graded now), and columns gpulab does not know (an instructor's
``notes``) stay at the end, their values kept even on regraded rows. A
gradebook or ``details.json`` of *another lab* is refused with
:class:`GradebookError` before anything is graded or written. ``details.json``
merges the same way (per learner).

Every write holds the lock :func:`gpulab._fsutil.locked` across
read-merge-write (two graders never drop each other's rows) and replaces the
file atomically (temporary file in the same folder, fsync, ``os.replace``): a
grader killed mid-write leaves the previous gradebook intact. Each submission
is isolated: a hanging, crashing or unreadable one yields a row with its
status, never stops the batch; the gradebook is merged after every submission,
so it is always complete up to the last graded learner. Submissions graded in
parallel (``jobs``) are merged in the order they were found, whichever finishes
first, so the gradebook is the same with any number of jobs.

Regrading is idempotent: the same submissions give the same rows, scores and
files, except ``graded-at``, which is the time the row was (re)graded and so
moves forward even when the result did not change (pass ``clock`` to
:func:`grade_batch` for fixed timestamps).
"""

from __future__ import annotations

import concurrent.futures
import csv
import hashlib
import io
import json
import re
import threading
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from gpulab import marks
from gpulab._fsutil import atomic_write_bytes, atomic_write_json, atomic_write_text, locked

from ..i18n import _, ngettext
from .checks import Check, CheckOutcome, CheckSuite, Context, group_by_kind, load_hidden_checks, load_lab_checks
from .record import ResultsError, load_results
from .runner import ErrorKind, Execution, Runner

GRADEBOOK = "gradebook.csv"
DETAILS = "details.json"
# The gradebook's columns after the per-check ones, in order.
SUMMARY_COLUMNS = ("total", "max", "percent", "status", "reason", "review", "graded-at", "lab")
_CHECK_COLUMN = re.compile(r"^(?:hidden:)?\S+ \(-?[0-9.]+\)$")

# Statuses for which the submission itself is at fault and scores zero; grader-side
# failures instead leave the scores blank so that nobody mistakes them for a grade.
NOT_RUN_STATUSES = {ErrorKind.INVALID_NOTEBOOK.value, ErrorKind.NO_PARAMETERS_CELL.value, "no-notebook",
                    "ambiguous-submission"}
UNGRADED_STATUSES = {"grader-error", ErrorKind.RUNNER_ERROR.value}


class GradebookError(Exception):
    """The gradebook cannot be written as asked (another lab's, unreadable, unknown learner); nothing changed."""


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

    def close(self) -> None:
        """Stop whatever it keeps started for runs to come (:class:`~gpulab.grading.runner.Runner`'s standbys)."""


class NullCollector:
    """For labs graded on recorded values only."""

    def collect(self, namespace: str) -> dict[str, list[dict[str, Any]]]:
        return {}


class RecordedCollector:
    """Objects recorded earlier: ``{namespace: [objects or kubectl Lists]}``; ``"*"`` applies to any namespace."""

    def __init__(self, by_namespace: Mapping[str, Iterable[Mapping[str, Any]]]):
        self.by_namespace = {ns: list(objs) for ns, objs in by_namespace.items()}

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


def select_submissions(subs: Sequence[Submission], learners: Iterable[str] | None,
                       where: str | Path = "the submissions directory") -> list[Submission]:
    """The submissions of ``learners`` (all when None), in ``subs``' order.

    Raises :class:`GradebookError` naming the learners found when one is missing.
    """
    if learners is None:
        return list(subs)
    wanted = list(dict.fromkeys(learners))
    found = [s.learner for s in subs]
    missing = [name for name in wanted if name not in found]
    if missing:
        names = ", ".join(found) if found else "none"
        raise GradebookError(f"{where}: no submission from learner {', '.join(repr(m) for m in missing)}; "
                             f"learners found: {names} (a learner is <name>.ipynb or a <name>/ folder)")
    return [s for s in subs if s.learner in wanted]


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
    graded_at: datetime | None = None  # set by grade_batch; the gradebook's "graded-at"

    @property
    def graded(self) -> bool:
        return self.total is not None

    @property
    def awaiting_review(self) -> list[CheckOutcome]:
        """The outcomes marked for the instructor's review (see the module docstring)."""
        return [o for o in self.outcomes if o.review]


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
    gradebook_rows: int | None = None  # rows in the merged gradebook, this batch's and earlier ones

    def summary_text(self) -> str:
        """A short report for the CLI, in the user's language: counts per status and where the files are."""
        counts: dict[str, int] = {}
        for row in self.rows:
            counts[row.status] = counts.get(row.status, 0) + 1
        graded = [r.total for r in self.rows if r.total is not None]
        statuses = ", ".join(f"{status} {n}" for status, n in sorted(counts.items())) or _("none")
        head = _("lab {lab}: {n} submission(s) ({statuses})", lab=self.lab, n=len(self.rows), statuses=statuses)
        if graded:
            head += _(", mean {mean}/{most}", mean=_fmt(sum(graded) / len(graded)), most=_fmt(self.suite.max_points))
        book = _("gradebook: {path}", path=self.gradebook)
        if self.gradebook_rows is not None:
            book += _(" ({n} row(s))", n=self.gradebook_rows)
        lines = [head, book, _("feedback:  {path}", path=self.out_dir / "feedback")]
        waiting = sum(len(row.awaiting_review) for row in self.rows)
        if waiting:
            lines.append(ngettext("review:    {n} answer awaits your review: the gradebook's review column names "
                                  "the check, details.json quotes the clause",
                                  "review:    {n} answers await your review: the gradebook's review column names "
                                  "the checks, details.json quotes the clauses", waiting))
        return "\n".join(lines)


def _fmt(value: float | None) -> str:
    if value is None:
        return ""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def column_name(chk: Check) -> str:
    """CSV header of a check column: ``<id> (<points>)``, hidden ones prefixed ``hidden:``."""
    return f"{'hidden:' if chk.hidden else ''}{chk.id} ({_fmt(chk.points)})"


def gradebook_header(suite: CheckSuite) -> list[str]:
    """The columns gpulab writes for ``suite`` (see the module docstring)."""
    return ["learner", *(column_name(c) for c in suite.checks), *SUMMARY_COLUMNS]


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def iso_utc(moment: datetime) -> str:
    """``2025-03-01T08:30:00Z``: ISO 8601, UTC, whole seconds (naive datetimes are taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def gradebook_cells(suite: CheckSuite, row: GradeRow, lab: str | None = None) -> dict[str, str]:
    """``row`` as the gradebook's cells, by column name; ``graded-at`` is now when the row has none."""
    earned = {o.check_id: o.earned for o in row.outcomes}
    cells = {"learner": row.learner}
    for chk in suite.checks:
        cells[column_name(chk)] = _fmt(earned[chk.id]) if row.graded and chk.id in earned else ""
    max_points = suite.max_points
    percent = _fmt(100 * row.total / max_points) if row.total is not None and max_points > 0 else ""
    review = " ".join(o.check_id for o in row.awaiting_review)
    cells.update({"total": _fmt(row.total), "max": _fmt(max_points), "percent": percent, "status": row.status,
                  "reason": " ".join(row.reason.split()), "review": review,
                  "graded-at": iso_utc(row.graded_at or utc_now()), "lab": lab or suite.lab})
    return cells


def _same_lab(a: str, b: str) -> bool:
    """``"03"``, ``"lab_03"`` and ``"03-taints-tolerations"`` are one lab."""
    if a == b:
        return True
    prefix = _lab_prefix(a)
    return prefix is not None and prefix == _lab_prefix(b)


def _read_table(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """Header and rows of the CSV at ``path``; ``([], [])`` when there is none (or it is empty)."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        return [], []
    except UnicodeDecodeError as exc:
        raise GradebookError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start}); if a spreadsheet app "
                             f"saved it, save it again as \"CSV UTF-8\"; nothing was changed") from exc
    records = [r for r in csv.reader(io.StringIO(text, newline="")) if r]
    if not records:
        return [], []
    header, body = records[0], records[1:]
    if "learner" not in header:
        raise GradebookError(f"{path}: not a gpulab gradebook (no 'learner' column in {header[:4]}); "
                             "move it away or grade into another --out folder; nothing was changed")
    if len(set(header)) != len(header):
        twice = sorted({c for c in header if header.count(c) > 1})
        raise GradebookError(f"{path}: column(s) {', '.join(twice)} appear twice; keep one of each, "
                             "then grade again; nothing was changed")
    rows = []
    for number, record in enumerate(body, 2):
        if len(record) > len(header):
            raise GradebookError(f"{path}: line {number} has {len(record)} cells but the header {len(header)}; "
                                 "fix that row, then grade again; nothing was changed")
        rows.append(dict(zip(header, record + [""] * (len(header) - len(record)))))
    return header, rows


def _details_lab(details: Path) -> str | None:
    try:
        lab = json.loads(details.read_text(encoding="utf-8")).get("lab")
    except (OSError, ValueError, AttributeError):
        return None
    return str(lab) if lab else None


def _check_lab(path: Path, lab: str, rows: Iterable[Mapping[str, str]]) -> None:
    """Refuse when ``rows`` (or, for an older gradebook without a lab column, the details.json beside it)
    belong to another lab."""
    labs = list(dict.fromkeys(r.get("lab", "") for r in rows if r.get("lab", "")))
    source = path
    if not labs:
        found = _details_lab(path.parent / DETAILS)
        labs, source = ([found] if found else []), path.parent / DETAILS
    others = [other for other in labs if not _same_lab(other, lab)]
    if others:
        raise GradebookError(
            f"{source} holds grades of lab {', '.join(others)}, not of lab {lab}: a gradebook folder is for "
            f"one lab. Grade lab {lab} into its own --out folder (default grades/<lab>), or move "
            f"{path.parent} away first; nothing was changed")


def check_out_dir(out_dir: str | Path, lab: str) -> None:
    """Raise :class:`GradebookError` unless ``out_dir`` is new or already holds grades of ``lab``."""
    out = Path(out_dir)
    _header, rows = _read_table(out / GRADEBOOK)
    _check_lab(out / GRADEBOOK, lab, rows)
    found = _details_lab(out / DETAILS)
    if found and not _same_lab(found, lab):
        _check_lab(out / DETAILS, lab, [{"lab": found}])


def merge_gradebook(header: Sequence[str], rows: Sequence[Mapping[str, str]], suite: CheckSuite,
                    graded: Iterable[GradeRow], lab: str | None = None) -> tuple[list[str], list[dict[str, str]]]:
    """Merge ``graded`` into an existing gradebook's ``header`` and ``rows`` (pure; see the module docstring).

    Returns the new header and rows. Rows of learners in ``graded`` are replaced
    in place (a learner listed twice in the old file keeps only the first,
    replaced, row); other rows are kept as they are; new learners come last,
    in ``graded``'s order.
    """
    ours = gradebook_header(suite)
    older = [c for c in header if c not in ours]
    retired = [c for c in older if _CHECK_COLUMN.match(c)]
    extra = [c for c in older if not _CHECK_COLUMN.match(c)]
    columns = [*ours[:-len(SUMMARY_COLUMNS)], *retired, *SUMMARY_COLUMNS, *extra]
    fresh = {row.learner: gradebook_cells(suite, row, lab) for row in graded}
    merged: list[dict[str, str]] = []
    placed: set[str] = set()
    for old in rows:
        learner = old.get("learner", "")
        if learner not in fresh:
            merged.append(dict(old))
        elif learner not in placed:
            placed.add(learner)
            merged.append({**{c: old.get(c, "") for c in extra}, **fresh[learner]})
    merged += [cells for learner, cells in fresh.items() if learner not in placed]
    return columns, merged


def _remove_stale_temps(path: Path) -> None:
    """Temporary files a killed writer of ``path`` left behind (call with ``path``'s lock held)."""
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        stale.unlink(missing_ok=True)


def write_gradebook(path: str | Path, suite: CheckSuite, rows: Iterable[GradeRow], *,
                    lab: str | None = None) -> int:
    """Merge ``rows`` into the CSV at ``path`` (created if missing) atomically; returns its row count.

    Holds ``path``'s lock from reading to replacing, so concurrent graders keep
    each other's rows. Raises :class:`GradebookError`, leaving the file as it
    was, when it holds another lab's grades or cannot be read as a gradebook.
    """
    target = Path(path)
    lab = lab or suite.lab
    with locked(target):
        header, old = _read_table(target)
        _check_lab(target, lab, old)
        columns, merged = merge_gradebook(header, old, suite, rows, lab)
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([cells.get(c, "") for c in columns] for cells in merged)
        _remove_stale_temps(target)
        atomic_write_bytes(target, buffer.getvalue().encode("utf-8-sig"))
    return len(merged)


def read_gradebook(path: str | Path) -> list[dict[str, str]]:
    """The gradebook's rows as ``{column: cell}`` dicts, in file order."""
    with open(path, encoding="utf-8-sig", newline="") as handle:
        return list(csv.DictReader(handle))


def write_details(out_dir: str | Path, lab: str, suite: CheckSuite, learners: Mapping[str, Any]) -> None:
    """Merge ``learners`` (learner → details) into ``out_dir/details.json`` under its lock, atomically."""
    path = Path(out_dir) / DETAILS
    with locked(path):
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            old = {}
        except ValueError as exc:
            raise GradebookError(f"{path}: not valid JSON ({exc}); move it away, then grade again; "
                                 "nothing was changed") from exc
        if not isinstance(old, dict):
            raise GradebookError(f"{path}: not a gpulab details file; move it away, then grade again")
        if old.get("lab"):
            _check_lab(path, lab, [{"lab": str(old["lab"])}])
        merged = dict(old.get("learners") or {})
        merged.update(learners)
        _remove_stale_temps(path)
        atomic_write_json(path, {"lab": lab, "max_points": suite.max_points,
                                 "checks": [{"id": c.id, "title": c.title, "points": c.points, "hidden": c.hidden}
                                            for c in suite.checks],
                                 "learners": merged})


# --------------------------------------------------------------------------- feedback


def feedback_markdown(lab: str, row: GradeRow, max_points: float) -> str:
    """The learner's zh-CN feedback; hidden checks appear only as numbered pass/fail lines."""
    lines = [f"# 实验反馈：{lab}", "", f"- 学员：{row.learner}"]
    if not row.graded:
        lines += ["- 得分：暂无", "",
                  "评分过程中出现了内部错误，这次没有给出成绩，讲师会重新评分。这不是你的问题。", ""]
        return "\n".join(lines)
    lines.append(f"- 得分：**{_fmt(row.total)} / {_fmt(max_points)}**")
    waiting = row.awaiting_review
    if waiting:
        withheld = sum(o.withheld for o in waiting)
        held = f"，暂扣 {_fmt(withheld)} 分，复核后可能加回" if withheld else ""
        lines.append(f"- 待老师复核：{len(waiting)} 项回答{held}（下面标着「待老师复核」的检查）")
    lines += ["", "## 运行情况", ""]
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
        mark = marks.verdict(o.passed, o.earned)
        text = f"- {mark} {o.label}：{_fmt(o.earned)} / {_fmt(o.points)} 分"
        if o.review:
            text += f"（另有 {_fmt(o.withheld)} 分暂扣，待老师复核）" if o.withheld else "（待老师复核）"
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
                namespace_for: Callable[[str, str], str] = default_namespace,
                learners: Iterable[str] | None = None,
                clock: Callable[[], datetime] = utc_now,
                submissions: Sequence[Submission] | None = None, jobs: int = 1) -> BatchResult:
    """Grade the submissions of ``lab`` in ``submissions_dir`` into ``out_dir``, merging into its gradebook.

    ``checks`` is a :class:`CheckSuite` (or checks, or None to load the lab's
    module); ``hidden`` a directory of hidden check files or checks. ``cwd`` is
    the kernel's working directory (default: the submission's directory); set
    it to ``labs/`` so relative paths to ``manifests/`` resolve as for learners.
    ``learners`` limits grading to those learners' submissions; ``clock`` gives
    each row's ``graded-at``; ``submissions``: the ones to grade, already discovered and selected (by
    :func:`gpulab.grading.grader.grade_submissions`), instead of looking again. An unknown learner or an ``out_dir`` holding
    another lab's grades raises :class:`GradebookError` before anything is run
    or written; rows already in the gradebook are kept (see the module docstring). ``jobs``: how many
    submissions are graded at once (their namespaces apart; the caller knows whether the lab allows it,
    see :func:`gpulab.grading.grader.parallel_jobs`); the rows are recorded in the submissions' order.
    """
    out = Path(out_dir)
    suite = _resolve_suite(lab, checks, hidden)
    collector = collector or NullCollector()
    subs = (list(submissions) if submissions is not None
            else select_submissions(discover_submissions(submissions_dir, lab), learners, submissions_dir))
    if jobs < 1:
        raise GradebookError(f"jobs: at least 1 submission at a time, not {jobs}")
    check_out_dir(out, lab)
    (out / "feedback").mkdir(parents=True, exist_ok=True)
    gradebook = out / GRADEBOOK
    rows: list[GradeRow] = []
    count = write_gradebook(gradebook, suite, rows, lab=lab)  # the header of this check set, at once
    write_details(out, lab, suite, {})
    announce = threading.Lock()  # progress callbacks come from the grading threads one at a time

    def grade_one(index: int, sub: Submission) -> tuple[GradeRow, str]:
        if progress:
            with announce:
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
        row.graded_at = clock()
        return row, row_trace

    def record(index: int, row: GradeRow, row_trace: str) -> int:
        rows.append(row)
        atomic_write_text(out / "feedback" / f"{row.learner}.md", feedback_markdown(lab, row, suite.max_points))
        detail = {
            "status": row.status, "reason": row.reason, "total": row.total, "namespace": row.namespace,
            "graded_at": iso_utc(row.graded_at),
            "execution": _execution_dict(row.execution), "grader_traceback": row_trace,
            "checks": [{"id": o.check_id, "label": o.label, "points": o.points, "earned": o.earned,
                        "passed": o.passed, "message": o.message, "detail": o.detail, "error": o.error,
                        "hidden": o.hidden, "review": list(o.review), "withheld": o.withheld}
                       for o in row.outcomes],
        }
        written = write_gradebook(gradebook, suite, [row], lab=lab)
        write_details(out, lab, suite, {row.learner: detail})
        if progress:
            with announce:
                progress(ProgressEvent(index, len(subs), row.learner, "done", row))
        return written

    if jobs == 1 or len(subs) < 2:
        for index, sub in enumerate(subs, 1):
            count = record(index, *grade_one(index, sub))
        return BatchResult(lab, rows, gradebook, out, suite, count)
    # In parallel: each submission has its own namespaces and identity. Rows are recorded in the submissions'
    # order whatever order they finish in, so a batch gives the same gradebook with any number of jobs.
    finished: dict[int, tuple[GradeRow, str]] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="grade") as pool:
        futures = {pool.submit(grade_one, index, sub): index for index, sub in enumerate(subs, 1)}
        following = 1
        for future in concurrent.futures.as_completed(futures):
            finished[futures[future]] = future.result()  # grade_one turns every failure into a row
            while following in finished:
                count = record(following, *finished.pop(following))
                following += 1
    return BatchResult(lab, rows, gradebook, out, suite, count)


class TqdmProgress:
    """A ``progress`` callback drawing a tqdm bar (on stderr) with the last learner's status."""

    def __init__(self, **tqdm_options: Any):
        self.options = {"unit": "份", "desc": _("grading"), **tqdm_options}
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
              show_progress: bool = True, learners: Iterable[str] | None = None) -> BatchResult:
    """CLI-facing wrapper of :func:`grade_batch`: the lab's own checks, a default Runner, a tqdm bar."""
    bar = TqdmProgress() if show_progress else None
    try:
        return grade_batch(submissions_dir, lab, None, runner or Runner(), out_dir, hidden=hidden, progress=bar,
                           collector=collector, sandbox=sandbox, parameters=parameters, cwd=cwd,
                           learners=learners)
    finally:
        if bar is not None:
            bar.close()
