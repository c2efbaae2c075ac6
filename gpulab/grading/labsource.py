"""One source per lab: ``solutions/NN-*.ipynb`` generates ``labs/NN-*.ipynb``.

Marker convention (nbgrader/otter-compatible spellings):

Code cells
    A block between ``# BEGIN SOLUTION`` and ``# END SOLUTION`` lines (any
    number of leading ``#``) is replaced, at the indentation of the BEGIN line,
    by ``# 在这里写你的答案`` and ``...`` so the generated lab still runs and
    later cells can earn partial credit. Variants on the BEGIN line:
    ``# BEGIN SOLUTION RAISE`` puts ``raise NotImplementedError("在这里写你的答案")``
    instead of ``...`` (for helpers whose silent ``None`` would mislead);
    ``# BEGIN SOLUTION NO PROMPT`` removes the block without a placeholder.

    A single line ending in ``# SOLUTION`` is replaced too: ``x = 4  # SOLUTION``
    becomes ``x = ...  # 在这里写你的答案``; any other line becomes ``...`` with
    the same comment.

    In cells run by a cell magic (``%%bash``, ``%%writefile``) the placeholder is
    only the comment line, since ``...`` is not valid there.

Markdown cells
    Text between ``<!-- BEGIN SOLUTION -->`` and ``<!-- END SOLUTION -->`` is
    replaced by ``*在这里写下你的回答。*``.

Whole cells
    Cells tagged ``solution-only`` are dropped from the lab.

Generation also strips outputs, execution counts and run metadata (papermill,
timing, widget state), drops a leftover ``injected-parameters`` cell, and keeps
every tag — the ``parameters`` cell above all, which each lab must have.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

from gpulab._fsutil import atomic_write_text

CODE_PLACEHOLDER = "# 在这里写你的答案"
MARKDOWN_PLACEHOLDER = "*在这里写下你的回答。*"
RAISE_PLACEHOLDER = 'raise NotImplementedError("在这里写你的答案")'
SOLUTION_ONLY_TAG = "solution-only"
PARAMETERS_TAG = "parameters"

_BEGIN_CODE = re.compile(r"^(?P<indent>[ \t]*)#+[ \t]*BEGIN SOLUTION(?P<opts>(?:[ \t]+[A-Z]+)*)[ \t]*$")
_END_CODE = re.compile(r"^[ \t]*#+[ \t]*END SOLUTION[ \t]*$")
_INLINE = re.compile(r"^(?P<code>.*?\S)[ \t]*#[ \t]*SOLUTION[ \t]*$")
_ASSIGN = re.compile(r"^(?P<lhs>[ \t]*[A-Za-z_][\w.\[\]'\", ]*?[ \t]*(?::[^=]+)?(?<![=!<>])=(?!=))")
_BEGIN_MD = re.compile(r"^[ \t]*<!--[ \t]*BEGIN SOLUTION[ \t]*-->[ \t]*$")
_END_MD = re.compile(r"^[ \t]*<!--[ \t]*END SOLUTION[ \t]*-->[ \t]*$")
_DROP_CELL_METADATA = ("execution", "papermill", "collapsed", "scrolled", "ExecuteTime")
_DROP_NB_METADATA = ("papermill", "widgets", "gpulab")


class LabSourceError(ValueError):
    """Raised when a solution notebook's markers are malformed; names file, cell and line."""


def _where(source: str | Path | None, cell: int, line: int | None = None) -> str:
    parts = [str(source or "<notebook>"), f"cell {cell}"]
    if line is not None:
        parts.append(f"line {line}")
    return ": ".join(parts)


def _strip_code(text: str, where: str) -> str:
    lines = text.split("\n")
    magic = bool(lines) and lines[0].lstrip().startswith("%%")
    out: list[str] = []
    begin: tuple[int, str, str] | None = None  # (line number, indent, options)
    for number, line in enumerate(lines, 1):
        if begin is None:
            start = _BEGIN_CODE.match(line)
            if start:
                opts = " ".join(start.group("opts").split())
                if opts not in ("", "RAISE", "NO PROMPT"):
                    raise LabSourceError(f"{where} line {number}: unknown BEGIN SOLUTION option {opts!r} "
                                         "(allowed: RAISE, NO PROMPT)")
                begin = (number, start.group("indent"), opts)
                continue
            if _END_CODE.match(line):
                raise LabSourceError(f"{where} line {number}: END SOLUTION without BEGIN SOLUTION")
            inline = _INLINE.match(line)
            if inline and not magic:
                code = inline.group("code")
                assign = _ASSIGN.match(code)
                indent = code[: len(code) - len(code.lstrip())]
                out.append(f"{assign.group('lhs').rstrip()} ...  {CODE_PLACEHOLDER}" if assign
                           else f"{indent}...  {CODE_PLACEHOLDER}")
            elif inline:
                indent = line[: len(line) - len(line.lstrip())]
                out.append(f"{indent}{CODE_PLACEHOLDER}")
            else:
                out.append(line)
            continue
        if _BEGIN_CODE.match(line):
            raise LabSourceError(f"{where} line {number}: BEGIN SOLUTION inside the region opened on line {begin[0]}")
        if _END_CODE.match(line):
            _, indent, opts = begin
            if opts != "NO PROMPT":
                out.append(f"{indent}{CODE_PLACEHOLDER}")
                if not magic:
                    out.append(f"{indent}{RAISE_PLACEHOLDER if opts == 'RAISE' else '...'}")
            begin = None
    if begin is not None:
        raise LabSourceError(f"{where} line {begin[0]}: BEGIN SOLUTION is never closed by END SOLUTION")
    return "\n".join(out)


def _strip_markdown(text: str, where: str) -> str:
    out: list[str] = []
    open_line: int | None = None
    for number, line in enumerate(text.split("\n"), 1):
        if _BEGIN_MD.match(line):
            if open_line is not None:
                raise LabSourceError(f"{where} line {number}: BEGIN SOLUTION inside the region opened on line "
                                     f"{open_line}")
            open_line = number
            out.append(MARKDOWN_PLACEHOLDER)
        elif _END_MD.match(line):
            if open_line is None:
                raise LabSourceError(f"{where} line {number}: END SOLUTION without BEGIN SOLUTION")
            open_line = None
        elif open_line is None:
            out.append(line)
    if open_line is not None:
        raise LabSourceError(f"{where} line {open_line}: BEGIN SOLUTION is never closed by END SOLUTION")
    return "\n".join(out)


def lab_from_solution(solution: nbformat.NotebookNode, source: str | Path | None = None,
                      require_parameters: bool = True) -> nbformat.NotebookNode:
    """The learner version of an in-memory solution notebook (the input is not modified)."""
    nb = copy.deepcopy(solution)
    cells = []
    for index, cell in enumerate(nb.cells):
        tags = list(cell.get("metadata", {}).get("tags", []))
        if SOLUTION_ONLY_TAG in tags or "injected-parameters" in tags:
            continue
        where = _where(source, index)
        if cell.cell_type == "code":
            cell.source = _strip_code(cell.source, where)
            cell.outputs = []
            cell.execution_count = None
        elif cell.cell_type == "markdown":
            cell.source = _strip_markdown(cell.source, where)
        for key in _DROP_CELL_METADATA:
            cell.metadata.pop(key, None)
        cells.append(cell)
    nb.cells = cells
    if require_parameters and not any(PARAMETERS_TAG in c.get("metadata", {}).get("tags", []) for c in cells):
        raise LabSourceError(f"{source or '<notebook>'}: no cell tagged {PARAMETERS_TAG!r}; the grader injects "
                             "namespace and results_path after it")
    for key in _DROP_NB_METADATA:
        nb.metadata.pop(key, None)
    if source is not None:
        src = Path(source)
        nb.metadata["gpulab"] = {"generated_from": f"{src.parent.name}/{src.name}",
                                 "note": "generated from the solution notebook; edit that one instead"}
    return nb


def generate_lab(solution_path: str | Path, require_parameters: bool = True) -> nbformat.NotebookNode:
    """Read ``solution_path`` and return the generated lab notebook."""
    solution_path = Path(solution_path)
    try:
        solution = nbformat.read(solution_path, as_version=4)
    except (OSError, ValueError) as exc:
        raise LabSourceError(f"{solution_path}: cannot read notebook: {exc}") from exc
    return lab_from_solution(solution, solution_path, require_parameters)


def notebook_text(nb: nbformat.NotebookNode) -> str:
    """The exact text a generated notebook is written as (stable, with a final newline)."""
    return nbformat.writes(nb) + "\n"


def _solutions(solutions_dir: Path) -> list[Path]:
    return sorted(p for p in solutions_dir.glob("*.ipynb") if not p.name.startswith("."))


def generate_all(solutions_dir: str | Path, labs_dir: str | Path) -> list[Path]:
    """Write ``labs_dir/<name>`` for every ``solutions_dir/<name>.ipynb``; returns the files written."""
    solutions_dir, labs_dir = Path(solutions_dir), Path(labs_dir)
    generated = [(path, generate_lab(path)) for path in _solutions(solutions_dir)]  # all-or-nothing
    written = []
    for path, lab in generated:
        target = labs_dir / path.name
        atomic_write_text(target, notebook_text(lab))
        written.append(target)
    return written


@dataclass(frozen=True)
class LabDrift:
    """A lab that is not what generation would produce: ``missing``, ``differs``, ``orphan`` or ``invalid``."""

    name: str
    reason: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.name}: {self.reason}" + (f" ({self.detail})" if self.detail else "")


def _canonical(nb: nbformat.NotebookNode) -> dict:
    return json.loads(nbformat.writes(nb))


def _first_difference(expected: dict, actual: dict) -> str:
    exp_cells, act_cells = expected.get("cells", []), actual.get("cells", [])
    for i, (a, b) in enumerate(zip(exp_cells, act_cells, strict=False)):
        if a != b:
            return f"cell {i} differs"
    if len(exp_cells) != len(act_cells):
        return f"{len(act_cells)} cells, expected {len(exp_cells)}"
    return "notebook metadata differs"


def check_drift(solutions_dir: str | Path, labs_dir: str | Path) -> list[LabDrift]:
    """Labs that differ from what :func:`generate_all` would write (empty list: in sync)."""
    solutions_dir, labs_dir = Path(solutions_dir), Path(labs_dir)
    drift: list[LabDrift] = []
    names = set()
    for path in _solutions(solutions_dir):
        names.add(path.name)
        target = labs_dir / path.name
        try:
            expected = _canonical(generate_lab(path))
        except LabSourceError as exc:
            drift.append(LabDrift(path.name, "invalid", str(exc)))
            continue
        if not target.exists():
            drift.append(LabDrift(path.name, "missing", f"run generation to create {target}"))
            continue
        try:
            actual = _canonical(nbformat.read(target, as_version=4))
        except (OSError, ValueError) as exc:
            drift.append(LabDrift(path.name, "differs", f"unreadable: {exc}"))
            continue
        if actual != expected:
            drift.append(LabDrift(path.name, "differs", _first_difference(expected, actual)))
    if labs_dir.is_dir():
        for path in sorted(labs_dir.glob("*.ipynb")):
            if path.name not in names and not path.name.startswith("."):
                drift.append(LabDrift(path.name, "orphan", "no solution notebook generates it"))
    return drift
