"""The chapter notebooks' conventions, checked without a cluster.

- every notebook starts with ``setup(...)``, resets what it changed and ends
  with its section's quiz;
- manifests are real files: every path a notebook names exists, every file in
  a lesson's manifest folder is used by that lesson, and no YAML is pasted
  into code cells;
- committed notebooks carry the outputs of one clean top-to-bottom run
  (``make notebooks``): every code cell executed, in order, without errors.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]-*.ipynb"))
MANIFEST_PATH = re.compile(r"""["'](manifests/[^"'\s]+\.ya?ml)["']""")
CHECK, IGNORE = "nbval-check-output", "nbval-ignore-output"


def code_cells(path: Path) -> list:
    nb = nbformat.read(path, as_version=4)
    return [c for c in nb.cells if c.cell_type == "code"]


@pytest.fixture(params=NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def notebook(request) -> Path:
    return request.param


def test_there_are_chapter_notebooks():
    stems = {p.stem for p in NOTEBOOKS}
    assert {"00-orientation", "03-scheduling", "05-training", "06-inference"} <= stems


def test_notebook_is_valid_and_uses_the_python3_kernel(notebook):
    nb = nbformat.read(notebook, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"


def test_first_code_cell_sets_up_the_lesson_by_its_own_stem(notebook):
    first = code_cells(notebook)[0].source
    assert "from gpulab.notebook import" in first
    assert f'setup("{notebook.stem}"' in first


def test_lesson_resets_the_cluster_and_ends_with_its_quiz(notebook):
    cells = code_cells(notebook)
    assert any(c.source.strip() == "lab.reset()" for c in cells), "no `lab.reset()` cell"
    number = notebook.stem.split("-", 1)[0]
    last = cells[-1].source.strip()
    if number == "00":  # the orientation shows how a quiz looks; it has no bank of its own
        assert any("show_quiz(" in c.source for c in cells)
    else:
        assert last == f'show_quiz("{number}")', f"last code cell is {last!r}"


def test_manifests_named_by_a_notebook_exist(notebook):
    for cell in code_cells(notebook):
        for rel in MANIFEST_PATH.findall(cell.source):
            assert (REPO / rel).is_file(), f"{notebook.name} names {rel}, which does not exist"


def test_every_manifest_of_a_lesson_is_used_by_it(notebook):
    folder = REPO / "manifests" / notebook.stem
    named = {rel for c in code_cells(notebook) for rel in MANIFEST_PATH.findall(c.source)}
    for path in sorted(folder.glob("*.y*ml")):
        rel = str(path.relative_to(REPO))
        assert rel in named, f"{rel} is not used by {notebook.name}"


def test_no_yaml_is_pasted_into_code_cells(notebook):
    for cell in code_cells(notebook):
        assert not re.search(r"^\s*apiVersion:", cell.source, re.MULTILINE), \
            f"{notebook.name} cell {cell.get('id')} has inline YAML; put it in manifests/{notebook.stem}/"


def test_each_code_cell_is_either_checked_or_ignored_by_nbval(notebook):
    for cell in code_cells(notebook):
        tags = set(cell.metadata.get("tags", []))
        assert len(tags & {CHECK, IGNORE}) == 1, f"cell {cell.get('id')} of {notebook.name}: tags {sorted(tags)}"


def test_committed_outputs_come_from_one_clean_run(notebook):
    cells = code_cells(notebook)
    counts = [c.execution_count for c in cells]
    assert counts == list(range(1, len(cells) + 1)), \
        f"{notebook.name} was not executed top to bottom in one run (`make notebooks`): {counts}"
    for cell in cells:
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert not errors, f"{notebook.name} cell {cell.get('id')} was saved with an error: {errors[0].get('evalue')}"
