"""The learner distribution: what a class receives, without what only the instructor may have.

``gpulab dist learner OUT`` (:func:`write_learner`) copies the course from this
checkout into ``OUT`` so that it works on its own — ``make lab`` installs and
starts it, ``gpulab check`` runs a lab's visible checks, ``make test`` runs its
tests — and holds no answers. Copied (:data:`INCLUDED`, caches left behind):
the lessons (``notebooks/``), the generated labs (``labs/``), ``manifests/``,
``quizzes/``, the package with the visible checks (``gpulab/``), the docs, the
Makefile, ``pyproject.toml`` and ``constraints.txt``, repo2docker's files
(``environment.yml``, ``apt.txt``, ``postBuild``, ``start``), JupyterLab's settings
override (``jupyterlab-overrides.json``: Chinese by default) and the dev
container, ``images/`` (the kind backend), ``tools/`` and ``bench/`` (the
Makefile's targets and the repo2docker tests use them), and the tests.

Left out (:data:`LEFT_OUT`, each with its reason; ``gpulab-dist.json`` in
``OUT`` lists them again):

- ``solutions/``, the reference answers, and every hidden check
  (``tests/fixtures/hidden/``, and any ``*_hidden.py`` or ``hidden=True`` check
  in the package; real hidden checks live outside the repository anyway);
- whatever only works with those: the tests that grade the solutions or read
  the hidden checks, and ``bench/grading_bench.py``;
- ``.ci/``: the course's CI runs the instructor's whole suite, solutions included.

Its tests are the learner subset by construction: the tests that need a left-out
file are not in ``OUT``, so ``make test`` there runs all that is (and fails, as
pytest does, if nothing is collected). The Makefile is copied with a block
appended that takes left-out tests out of its test lists (``LEARNER_TESTS``);
targets that need a left-out file (``make labs``, ``make bench-grading``) are
named in the manifest and in :meth:`Distribution.lines`.

Before anything is written, ``labs/`` must be what ``solutions/`` generates
(:func:`gpulab.grading.labsource.check_drift`); the copy is made in a staging
directory next to ``OUT`` and checked for answers (:func:`leaks`) before it
takes ``OUT``'s place, so a failed run leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import gpulab
from gpulab import paths

from .labsource import check_drift

#: Top-level entries of the checkout a class receives; the first group must be there.
REQUIRED = ("gpulab", "notebooks", "labs", "manifests", "quizzes", "tests", "README.md", "Makefile",
            "pyproject.toml", "constraints.txt", "environment.yml", "apt.txt", "postBuild", "start",
            "jupyterlab-overrides.json")
OPTIONAL = ("DEVELOPMENT.md", "BENCHMARKS.md", ".gitignore", ".gitattributes", ".devcontainer", "images", "tools",
            "bench")
INCLUDED = REQUIRED + OPTIONAL

#: What stays with the instructor (paths relative to the checkout), and why.
LEFT_OUT: dict[str, str] = {
    "solutions": "the reference answers (labs/ is generated from them)",
    "tests/fixtures/hidden": "example hidden checks (graders pass real ones with --hidden, from outside the repository)",
    ".ci": "the course's CI: it runs the instructor's whole test suite, solutions included",
    "bench/grading_bench.py": "benchmarks grading with the labs' solutions",
    "tests/cluster/lab_support.py": "builds submissions from solutions/ and grades them with the example hidden checks",
    "tests/cluster/test_labs.py": "grades every lab's solution (lab_support)",
    "tests/cluster/test_lab_02.py": "grades lab 02's solution and typical mistakes (lab_support)",
    "tests/cluster/test_lab_04.py": "grades lab 04's solution and typical mistakes (lab_support)",
    "tests/cluster/test_lab_06.py": "grades lab 06's solution and typical mistakes (lab_support)",
    "tests/cluster/test_lab_08.py": "grades lab 08's solution and typical mistakes (lab_support)",
    "tests/cluster/test_lab_09.py": "grades lab 09's solution and typical mistakes (lab_support)",
    "tests/cluster/test_grader_journal.py": "kills a grader grading a lab's solution (lab_support)",
    "tests/unit/test_grading_labs.py": "checks each lab against its solution and its example hidden checks",
    "tests/unit/test_add_a_lab.py": "adds a lab as DEVELOPMENT.md says, from copies of solutions/ and the hidden checks",
    "tests/unit/test_grading_jail.py": "shows that a graded notebook cannot read solutions/ or the hidden checks",
    "tests/unit/test_grading_dist.py": "makes a learner distribution, which needs the instructor's checkout",
}
HIDDEN_REASON = "hidden checks"
#: Makefile targets that need what is left out even where no left-out path is named in them.
INSTRUCTOR_TARGETS = {"labs": "regenerates labs/ from solutions/"}

MANIFEST = "gpulab-dist.json"
_SKIP_DIRS = {"__pycache__", ".ipynb_checkpoints", ".pytest_cache", ".mypy_cache", ".ruff_cache",
              ".import_linter_cache"}
_SKIP_SUFFIXES = (".pyc", ".pyo")
_HIDDEN_CHECK = re.compile(r"@check\([^)]*\bhidden\s*=\s*True")
# Answer markers as gpulab.grading.labsource reads them (code, inline, markdown).
_MARKERS = re.compile(r"^[ \t]*#+[ \t]*(BEGIN|END) SOLUTION\b|^.*\S[ \t]*#[ \t]*SOLUTION[ \t]*$"
                      r"|^[ \t]*<!--[ \t]*(BEGIN|END) SOLUTION[ \t]*-->", re.M)


class DistError(RuntimeError):
    """The distribution cannot be written (stale labs, a leak, or bad input: see :class:`DistInputError`)."""


class DistInputError(DistError):
    """Bad input: an OUT that is not empty (without force) or would hurt, a checkout that is not an instructor's."""


@dataclass
class Distribution:
    """What :func:`write_learner` wrote."""

    out: Path
    files: list[str]
    left_out: dict[str, str]
    unavailable_targets: dict[str, str] = field(default_factory=dict)
    replaced: bool = False

    def lines(self) -> list[str]:
        """What was written and left out, one line each (English, for the CLI)."""
        tops: dict[str, int] = {}
        for rel in self.files:
            top = rel.split("/", 1)[0] + ("/" if "/" in rel else "")
            tops[top] = tops.get(top, 0) + 1
        out = [f"{'replaced' if self.replaced else 'wrote'} {self.out}: {len(self.files)} files"]
        out += [f"  {top}" + (f" ({count} files)" if top.endswith("/") else "") for top, count in sorted(tops.items())]
        out.append("left out (instructor-only):")
        out += [f"  {path}: {why}" for path, why in sorted(self.left_out.items())]
        if self.unavailable_targets:
            out.append("make targets that need what is left out:")
            out += [f"  make {target}: {why}" for target, why in sorted(self.unavailable_targets.items())]
        return out


# --------------------------------------------------------------------------- what goes in


def _within(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


def _left_out(rel: str) -> str | None:
    return next((why for prefix, why in LEFT_OUT.items() if _within(rel, prefix)), None)


def _hidden_check(rel: str, path: Path) -> bool:
    """A file of hidden checks: ``*_hidden.py``, or a module of the package declaring ``hidden=True`` checks."""
    if not rel.endswith(".py"):
        return False
    if rel.endswith("_hidden.py"):
        return True
    return _within(rel, "gpulab/grading/labs") and bool(_HIDDEN_CHECK.search(path.read_text(encoding="utf-8")))


def select(root: Path) -> tuple[list[str], dict[str, str]]:
    """The files (relative, sorted) a learner distribution of ``root`` holds, and what is left out and why."""
    files: list[str] = []
    left: dict[str, str] = {}
    for entry in INCLUDED:
        top = root / entry
        if not top.exists() and not top.is_symlink():
            if entry in REQUIRED:
                raise DistInputError(f"{top}: missing; a learner distribution needs it (is {root} a gpulab checkout?)")
            continue
        candidates = [top] if not top.is_dir() or top.is_symlink() else []
        if not candidates:
            for dirpath, dirnames, filenames in os.walk(top):
                here = Path(dirpath)
                kept = []
                for name in sorted(dirnames):
                    rel = (here / name).relative_to(root).as_posix()
                    why = _left_out(rel)
                    if why is not None:
                        left[rel] = why
                    elif name not in _SKIP_DIRS and not (here / name).is_symlink():
                        kept.append(name)
                    elif (here / name).is_symlink():
                        candidates.append(here / name)
                dirnames[:] = kept
                candidates += [here / name for name in sorted(filenames) if not name.endswith(_SKIP_SUFFIXES)]
        for path in candidates:
            rel = path.relative_to(root).as_posix()
            why = _left_out(rel)
            if why is None and path.is_file() and _hidden_check(rel, path):
                why = HIDDEN_REASON
            if why is not None:
                left[rel] = why
            else:
                files.append(rel)
    for prefix, why in LEFT_OUT.items():  # outside the copied entries (solutions/, .ci/): named all the same
        if (root / prefix).exists() and prefix not in left:
            left[prefix] = why
    return sorted(files), left


# --------------------------------------------------------------------------- the Makefile


def _logical_lines(text: str) -> list[str]:
    return re.sub(r"\\\n", " ", text).splitlines()


def learner_makefile(text: str, left_out: Iterable[str]) -> tuple[str, dict[str, str]]:
    """``text`` with a block appended that filters left-out files out of its variables; and the targets
    whose recipes need a left-out file (target -> why)."""
    gone = sorted(set(left_out), key=len, reverse=True)

    def named(line: str) -> list[str]:
        return [p for p in gone if re.search(rf"(?<![\w./-]){re.escape(p)}(?![\w.-])", line)]

    filters: dict[str, list[str]] = {}
    targets: dict[str, str] = {}
    target = None
    for line in _logical_lines(text):
        rule = None if line.startswith("\t") else re.match(r"^([^\s:#=][^:=]*?)\s*:(?!=)", line)
        if rule:
            target = rule.group(1)
        assignment = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)\s*(?::=|\?=|\+=|=)", line)
        hits = named(line)
        if not hits:
            continue
        if assignment and not line.startswith("\t"):
            filters.setdefault(assignment.group(1), []).extend(h for h in hits if h not in filters.get(
                assignment.group(1), []))
        elif line.startswith("\t") and target is not None:
            targets[target] = f"needs {', '.join(hits)}, which is left out"
    for name, why in INSTRUCTOR_TARGETS.items():
        if re.search(rf"^{re.escape(name)}\s*:(?!=)", text, re.M):
            targets.setdefault(name, why)
    block = ["", "# ---- written by `gpulab dist learner`: this is a learner distribution ----",
             f"# solutions/, hidden checks and the tests that need them are left out ({MANIFEST} lists them);",
             "# make test runs every test that is here."]
    for name, hits in filters.items():
        block.append(f"{name} := $(filter-out {' '.join(hits)},$({name}))")
    for name, why in sorted(targets.items()):
        block.append(f"# make {name}: not in a learner distribution ({why})")
    return text.rstrip("\n") + "\n" + "\n".join(block) + "\n", targets


# --------------------------------------------------------------------------- checking a copy


def leaks(out: Path, root: Path | None = None) -> list[str]:
    """What in ``out`` a learner must not have: solutions, hidden checks, answer markers in notebooks, and
    (given the instructor's ``root``) copies of a left-out file under another name."""
    found = []
    if (out / "solutions").exists():
        found.append("solutions/ is there")
    secret_copies: dict[bytes, str] = {}
    if root is not None:
        for prefix in ("solutions", "tests/fixtures/hidden"):
            for path in sorted((root / prefix).rglob("*")) if (root / prefix).is_dir() else ():
                if path.is_file() and not path.name.endswith(_SKIP_SUFFIXES) and "__pycache__" not in path.parts \
                        and path.stat().st_size >= 64:  # an empty __init__.py is nobody's answer
                    secret_copies.setdefault(path.read_bytes(), path.relative_to(root).as_posix())
    for path in sorted(out.rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        rel = path.relative_to(out).as_posix()
        if rel.endswith("_hidden.py") or "/hidden/" in f"/{rel}":
            found.append(f"{rel}: a hidden check")
        elif _hidden_check(rel, path):
            found.append(f"{rel}: declares hidden checks")
        if path.suffix == ".ipynb":
            try:
                nb = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                found.append(f"{rel}: unreadable notebook ({exc})")
                continue
            for index, cell in enumerate(nb.get("cells") or []):
                source = cell.get("source") or ""
                source = "".join(source) if isinstance(source, list) else source
                if _MARKERS.search(source):
                    found.append(f"{rel}: cell {index} has an answer marker (BEGIN/END SOLUTION or '# SOLUTION')")
            if (nb.get("metadata") or {}).get("gpulab", {}).get("generated_from", "").startswith("solutions/") \
                    and any(cell.get("outputs") for cell in nb.get("cells") or []):
                found.append(f"{rel}: a generated lab with outputs (of a solution's run?)")
        if secret_copies:
            data = path.read_bytes()
            if data in secret_copies:
                found.append(f"{rel}: a copy of {secret_copies[data]}")
    return found


# --------------------------------------------------------------------------- writing it


def _check_out(out: Path, root: Path, force: bool) -> bool:
    """Refuse an ``out`` that would hurt; True when it exists with something in it (to be replaced)."""
    res_out, res_root = out.resolve(), root.resolve()
    if res_out == res_root or res_root.is_relative_to(res_out):
        raise DistInputError(f"{out}: the distribution cannot replace the checkout it is made from ({root})")
    if res_out.is_relative_to(res_root):
        first = res_out.relative_to(res_root).parts[0]
        if first in INCLUDED or first in LEFT_OUT:
            raise DistInputError(f"{out}: inside {first}/ of the checkout, which the distribution copies or guards; "
                            f"choose a directory outside {root} (or an ignored one such as {root / 'dist'})")
    if out.exists() and not out.is_dir():
        raise DistInputError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise DistInputError(f"{out}: not empty; pass --force to replace everything in it")
        return True
    return False


def write_learner(out: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None,
                  force: bool = False) -> Distribution:
    """Write the learner distribution of ``root`` (default: this checkout) to ``out`` (see the module docstring).

    ``out`` must be empty or missing, unless ``force``: then everything in it is replaced.
    """
    root = Path(root) if root is not None else paths.repo_root()
    out = Path(out)
    if not (root / "solutions").is_dir():
        raise DistInputError(f"{root}: no solutions/ here; a learner distribution is made from the instructor's "
                        f"checkout (this may be one already)")
    replace = _check_out(out, root, force)
    drift = check_drift(root / "solutions", root / "labs")
    if drift:
        raise DistError("labs/ is not what solutions/ generates, so the class would get other labs than are graded: "
                        + "; ".join(map(str, drift)) + " (run `gpulab labs generate`)")
    files, left = select(root)
    makefile, targets = learner_makefile((root / "Makefile").read_text(encoding="utf-8"), left)

    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for rel in files:
            source, target = root / rel, stage / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target, follow_symlinks=False)
        (stage / "Makefile").write_text(makefile, encoding="utf-8")
        manifest = {"kind": "learner", "gpulab": gpulab.__version__, "files": len(files) + 1,
                    "left_out": dict(sorted(left.items())), "unavailable_make_targets": dict(sorted(targets.items()))}
        (stage / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        problems = leaks(stage, root)
        if problems:
            raise DistError("the learner distribution would hold what learners must not have: " + "; ".join(problems))
        stage.chmod(0o755 & ~_umask())
        if replace:
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            os.replace(out, old / "out")
            os.replace(stage, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            if out.is_dir():
                out.rmdir()  # empty (checked above)
            os.replace(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return Distribution(out, sorted([*files, MANIFEST]), left, targets, replaced=replace)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask

