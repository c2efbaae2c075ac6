"""The rules every lab follows: DEVELOPMENT.md's "A lab" steps, checked for one lab under a checkout.

`gpulab labs check` runs them for every lab (with the drift of labs/ from solutions/), and so do the
tests (tests/unit/test_grading_labs.py, and tests/unit/test_add_a_lab.py on a new lab in a temporary
copy). Each problem reported says the rule and why it exists.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable
from pathlib import Path

import nbformat

from .. import paths
from .checks import CheckLoadError, lab_module_name, load_hidden_checks, load_lab_checks
from .cluster import load_lab_spec

#: ``NN-<slug>``: two digits, then lower-case words joined by ``-``.
LAB_NAME = re.compile(r"^(?P<number>\d{2})-[a-z0-9]+(?:-[a-z0-9]+)*$")


def lab_names(solutions: Path) -> list[str]:
    """The labs, derived from the files: one ``solutions/NN-<slug>.ipynb`` is one lab."""
    return sorted(p.stem for p in Path(solutions).glob("*.ipynb") if not p.name.startswith("."))


def naming_problems(names: Iterable[str]) -> list[str]:
    """Lab file names that break the numbering rule, each with the rule and why."""
    problems, seen = [], {}
    for name in names:
        m = LAB_NAME.match(name)
        if m is None:
            problems.append(f"solutions/{name}.ipynb: a lab file is named NN-<slug>.ipynb (two digits, then "
                            "lower-case words joined by '-'), because the number picks its check module "
                            "gpulab/grading/labs/lab_NN.py and `gpulab check/grade --lab NN`")
        elif m["number"] in seen:
            problems.append(f"solutions/{name}.ipynb: number {m['number']} is already lab {seen[m['number']]}; "
                            "each lab needs a number of its own, because the number picks its check module "
                            "gpulab/grading/labs/lab_NN.py")
        else:
            seen[m["number"]] = name
    return problems


def lab_problems(lab: str, root: Path | None = None, hidden: Path | None = None) -> list[str]:
    """Every rule of DEVELOPMENT.md's "A lab" that ``lab`` breaks under checkout ``root``.

    ``root`` (default: this checkout) holds ``solutions/`` and the generated ``labs/``; the check module is the one
    ``import gpulab.grading.labs.lab_NN`` finds; ``hidden`` (default: ``root``'s
    tests/fixtures/hidden) holds the example hidden checks.
    """
    root = Path(root) if root is not None else paths.repo_root()
    hidden = Path(hidden) if hidden is not None else root / "tests" / "fixtures" / "hidden"
    solution = nbformat.read(root / "solutions" / f"{lab}.ipynb", as_version=4)
    generated_path = root / "labs" / f"{lab}.ipynb"
    if not generated_path.exists():
        return [f"labs/{lab}.ipynb is missing: generate it from the solution with `make labs` "
                "(`gpulab labs generate`); labs/ is never written by hand"]
    generated = nbformat.read(generated_path, as_version=4)
    problems: list[str] = []

    # The check module: found by the lab's number, named by LAB.
    module_name = lab_module_name(lab)
    try:
        module = importlib.import_module(module_name)
        suite, spec = load_lab_checks(lab), load_lab_spec(lab)
    except (ModuleNotFoundError, CheckLoadError) as exc:
        return problems + [f"{lab}: needs a check module gpulab/grading/labs/lab_{lab[:2]}.py with at least one "
                           f"@check(id, points=...) ({exc}); `gpulab check` and `gpulab grade` find a lab's "
                           "checks by its number"]
    if spec.lab != lab or getattr(module, "LAB", None) != lab:
        problems.append(f"{module_name}: LAB = {getattr(module, 'LAB', None)!r}, expected LAB = {lab!r}; LAB ties "
                        "the module to its notebook and names the lab in gradebooks and hidden-check files")
    if suite.max_points <= 0:
        problems.append(f"{module_name}: its checks are worth no points; give each @check(id, points=...) points")

    # The parameters cell: the only contract between the grader and the notebook.
    params = [c for c in generated.cells if "parameters" in (c.metadata.get("tags") or [])]
    if len(params) != 1:
        problems.append(f"{lab}: {len(params)} cells tagged 'parameters', expected exactly 1; papermill injects "
                        "the grader's values (namespace, results_path, PARAMETERS) right after that one cell")
    else:
        assigned = set(re.findall(r"^(\w+) = ", params[0].source, re.M))
        expected = {"namespace", "results_path", *spec.parameters}
        if assigned != expected:
            problems.append(f"{lab}: the parameters cell assigns {sorted(assigned)}, expected exactly "
                            f"{sorted(expected)} (namespace, results_path and the check module's PARAMETERS); "
                            "it holds only what the grader injects, so nothing in it looks like a knob the "
                            "grader would honour")

    # Answer regions: what makes the generated lab a task rather than a copy of the solution.
    if not any(("BEGIN SOLUTION" in c.source or re.search(r"#\s*SOLUTION\s*$", c.source, re.M))
               for c in solution.cells):
        problems.append(f"solutions/{lab}.ipynb: no answer region (# BEGIN SOLUTION ... # END SOLUTION, a line "
                        "ending in # SOLUTION, or <!-- BEGIN SOLUTION --> in markdown); without one the "
                        "generated lab is the solution word for word")
    if any("BEGIN SOLUTION" in c.source for c in generated.cells):
        problems.append(f"labs/{lab}.ipynb still contains BEGIN SOLUTION: regenerate it with `make labs`")

    # The cleanup cell: run by hand, skipped by the grader.
    if "skip-execution" not in (generated.cells[-1].metadata.get("tags") or []):
        problems.append(f"{lab}: the last cell must be the cleanup cell, tagged 'skip-execution'; a learner runs "
                        "it by hand, the grader skips it because the checks read what the notebook leaves "
                        "behind in the namespace")

    # Values: every value a check reads is one the notebook records.
    recorded = set(re.findall(r"""record\(\s*["'](\w+)["']""", "\n".join(c.source for c in solution.cells)))
    used = set(re.findall(r"""ctx\.value\(\s*["'](\w+)["']""", Path(module.__file__).read_text(encoding="utf-8")))
    if not used <= recorded:
        problems.append(f"{module_name}: checks read values the notebook never records: {sorted(used - recorded)}; "
                        "record each with record(\"name\", value) in the solution, or every submission "
                        "scores 0 on that check")

    # The example hidden checks: the "plus a few hidden checks" labs/README.md promises learners.
    if not hidden.is_dir():
        problems.append(f"{lab}: no hidden-check directory {hidden}")
    else:
        hidden_checks = load_hidden_checks(hidden, lab)
        if not hidden_checks or not all(c.hidden for c in hidden_checks):
            problems.append(f"{lab}: no example hidden check; add tests/fixtures/hidden/lab_{lab[:2]}_hidden.py "
                            f"with LAB = {lab!r} and at least one @check: labs/README.md tells learners every "
                            "lab is graded with hidden checks too, and the cluster tests grade each lab with "
                            "this directory to prove they run and stay unnamed in feedback")
        clash = sorted({c.id for c in hidden_checks} & {c.id for c in suite.checks})
        if clash:
            problems.append(f"{lab}: hidden check ids {clash} are also the lab's own check ids; feedback names "
                            "checks by id, so a clash would show a hidden check's place under a visible name")
    return problems


def all_problems(root: Path | None = None) -> list[str]:
    """Every lab's problems under ``root`` (default: this checkout), naming rule first."""
    root = Path(root) if root is not None else paths.repo_root()
    names = lab_names(root / "solutions")
    return naming_problems(names) + [p for name in names for p in lab_problems(name, root)]
