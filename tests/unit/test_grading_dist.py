"""`gpulab dist learner OUT`: what a class receives holds no answers and works on its own.

One distribution is written per module from this checkout; the tests read it, run its
package and CLI from it (``PYTHONPATH=OUT``, so nothing of the checkout is imported) and
run a subset of its own tests there. The whole learner subset (``make test-unit`` in OUT)
is too slow for a unit test; it is what ``make test`` runs in a distribution.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpulab.cli import main
from gpulab.grading import dist

REPO = Path(__file__).resolve().parents[2]
MARKERS = re.compile(r"BEGIN SOLUTION|END SOLUTION|#\s*SOLUTION\b")


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("dist") / "course"
    result = dist.write_learner(target)
    assert result.out == target and result.files
    return target


def _run(out: Path, *args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python ARGS`` in ``out`` with only ``out`` on the path (a fresh GPULAB_HOME, no checkout)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    environ.update(PYTHONPATH=str(out), GPULAB_HOME=str(out.parent / "home"), **(env or {}))
    return subprocess.run([sys.executable, *args], cwd=out, env=environ, capture_output=True, text=True,
                          timeout=timeout)


# --------------------------------------------------------------------------- what is (not) there


def test_no_solutions_no_hidden_checks_no_answer_markers(out):
    assert not (out / "solutions").exists()
    assert not (out / "tests" / "fixtures" / "hidden").exists()
    assert not list(out.rglob("*_hidden.py"))
    # The labs' answer markers appear in no notebook (solutions' regions are replaced in labs/).
    notebooks = sorted(out.rglob("*.ipynb"))
    assert {p.parent.name for p in notebooks} == {"labs", "notebooks"}
    for path in notebooks:
        assert not MARKERS.search(path.read_text(encoding="utf-8")), f"{path.relative_to(out)} has an answer marker"
    # No solution or hidden check hides under another name.
    secret_files = {p.read_bytes(): p for d in ("solutions", "tests/fixtures/hidden") for p in (REPO / d).rglob("*")
                    if p.is_file() and "__pycache__" not in p.parts}
    assert not [p for p in out.rglob("*") if p.is_file() and p.read_bytes() in secret_files]
    assert dist.leaks(out, REPO) == []


def test_what_a_class_receives(out):
    for name in ("README.md", "Makefile", "pyproject.toml", "constraints.txt", "environment.yml", "apt.txt",
                 "postBuild", "start", "labs/README.md", "gpulab/cli.py", "gpulab/grading/labs/lab_02.py",
                 "gpulab/grading/fixtures/broken_layer.py", "manifests/labs/02-layered-verification/gpu-check.yaml",
                 "quizzes/02-gpu-operator.yaml", "tests/conftest.py"):
        assert (out / name).is_file(), name
    for script in ("postBuild", "start"):
        assert os.access(out / script, os.X_OK), f"{script} lost its exec bit"
    labs = sorted(p.name for p in (REPO / "labs").glob("*.ipynb"))
    assert sorted(p.name for p in (out / "labs").glob("*.ipynb")) == labs
    assert all((out / "labs" / n).read_bytes() == (REPO / "labs" / n).read_bytes() for n in labs)
    assert not list(out.rglob("__pycache__")) and not (out / ".venv").exists() and not (out / ".ci").exists()
    manifest = json.loads((out / dist.MANIFEST).read_text())
    assert manifest["kind"] == "learner"
    assert {"solutions", "tests/fixtures/hidden", ".ci"} <= set(manifest["left_out"])
    assert all(why for why in manifest["left_out"].values())
    assert manifest["unavailable_make_targets"].keys() >= {"labs", "bench-grading"}


def test_every_test_that_needs_the_answers_is_left_out(out):
    """A test that reads solutions/, the hidden checks or grades solutions cannot run in a distribution."""
    needs = re.compile(r"""REPO\s*/\s*["']solutions["']|["']fixtures["']\s*/\s*["']hidden["']|fixtures/hidden"""
                       r"""|\blab_support\b|grading_bench|gpulab\.grading\.dist\b""")
    for path in sorted((REPO / "tests").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if "__pycache__" in rel or rel.startswith("tests/fixtures/hidden/"):
            continue
        if needs.search(path.read_text(encoding="utf-8")):
            assert rel in dist.LEFT_OUT, f"{rel} needs what a learner distribution leaves out; add it to dist.LEFT_OUT"
            assert not (out / rel).exists()


def test_the_makefile_runs_only_tests_that_are_there(out):
    text = (out / "Makefile").read_text()
    assert text.startswith((REPO / "Makefile").read_text().rstrip("\n"))
    assert "LEARNER_TESTS := $(filter-out tests/cluster/test_lab_02.py,$(LEARNER_TESTS))" in text
    if shutil.which("make") is None:
        pytest.skip("no make on this machine: the Makefile's learner test list is checked as text only")
    # -n: print what `make test-learner` would run (its prerequisites would install; -n runs nothing).
    dry = subprocess.run(["make", "-n", "-C", str(out), "test-learner", "GPULAB_BIN_DIR=/nonexistent"],
                         capture_output=True, text=True, timeout=60)
    line = next(ln for ln in dry.stdout.splitlines() if "-m pytest" in ln)
    named = re.findall(r"tests/\S+\.py", line)
    assert named and all((out / p).is_file() for p in named), named
    assert "test_lab_02.py" not in line


# --------------------------------------------------------------------------- it works on its own


def test_the_package_and_the_cli_run_from_the_distribution(out):
    imported = _run(out, "-c", "import gpulab, gpulab.grading.fixtures.broken_layer as f, gpulab.grading.labs.lab_02; "
                               "print(gpulab.__file__); print(callable(f.practice_break))")
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.splitlines() == [str(out / "gpulab" / "__init__.py"), "True"]
    check = _run(out, "-m", "gpulab.cli", "check", "--help")
    assert check.returncode == 0 and "Run a lab notebook as the grader does" in check.stdout, check.stderr
    # Made from a distribution, a distribution says what is missing.
    again = _run(out, "-m", "gpulab.cli", "dist", "learner", str(out.parent / "again"))
    assert again.returncode == 2 and "no solutions/ here" in again.stderr


def test_its_own_tests_pass_there(out):
    # A subset of its unit tests (make test runs all that are there); PYTEST_ADDOPTS cannot turn collection off.
    run = _run(out, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit/test_grading_fixtures.py",
               "tests/unit/test_grading_checks.py", "tests/unit/test_grading_labsource.py", timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert re.search(r"\b\d+ passed\b", run.stdout) and "skipped" not in run.stdout
    # A selection that finds nothing fails (pytest's exit status 5): "no tests ran" never passes.
    empty = _run(out, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit", "-k", "no_such_test_anywhere")
    assert empty.returncode == 5 and "deselected" in empty.stdout


# --------------------------------------------------------------------------- the command


def test_the_command_refuses_a_non_empty_out_unless_forced(tmp_path):
    target = tmp_path / "course"
    target.mkdir()
    (target / "stale.txt").write_text("from last term")
    runner = CliRunner()
    refused = runner.invoke(main, ["dist", "learner", str(target)])
    assert refused.exit_code == 2 and "not empty; pass --force" in refused.output
    assert (target / "stale.txt").exists()
    forced = runner.invoke(main, ["dist", "learner", str(target), "--force"])
    assert forced.exit_code == 0, forced.output
    assert forced.output.startswith(f"replaced {target}: ") and "left out (instructor-only):" in forced.output
    assert "  solutions: the reference answers" in forced.output
    assert not (target / "stale.txt").exists() and (target / "labs").is_dir()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".course")]  # no staging left behind


def test_an_out_that_would_hurt_is_refused_before_anything_happens(tmp_path):
    # Checked on the guard itself: a broken guard must not get a chance to replace the checkout.
    for where in (REPO, REPO.parent):
        with pytest.raises(dist.DistInputError, match="cannot replace the checkout"):
            dist._check_out(where, REPO, force=True)
    result = CliRunner().invoke(main, ["dist", "learner", str(REPO / "labs" / "x"), "--force"])
    assert result.exit_code == 2 and "inside labs/ of the checkout" in result.output, result.output
    assert not (REPO / "labs" / "x").exists()
    (tmp_path / "file").write_text("")
    with pytest.raises(dist.DistInputError, match="not a directory"):
        dist._check_out(tmp_path / "file", REPO, force=True)


def test_a_stale_lab_stops_the_distribution(tmp_path):
    root = tmp_path / "checkout"
    for name in dist.REQUIRED + ("solutions",):
        source = REPO / name
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, root / name,
                                                                **({"ignore": shutil.ignore_patterns("__pycache__")}
                                                                   if source.is_dir() else {}))
    lab = root / "labs" / "02-layered-verification.ipynb"
    lab.write_text(lab.read_text(encoding="utf-8").replace("practice_break", "practise_break"), encoding="utf-8")
    with pytest.raises(dist.DistError, match="labs/ is not what solutions/ generates.*02-layered-verification"):
        dist.write_learner(tmp_path / "out", root=root)
    assert not (tmp_path / "out").exists()
