"""The notebook suite's failure report (tests/notebooks/test_notebooks.py): the first failing cell first.

A notebook that fails early makes every later cell that needs its names fail too; the end of nbval's
output shows only those. The samples are nbval's output as the suite captures it (pytest -q, piped).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def report() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpulab_notebook_suite", REPO / "tests/notebooks/test_notebooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cell(k: int, source: str, error: str, filler: str = "") -> str:
    title = f" notebooks/03-x.ipynb::Cell {k} "
    return (f"{title.center(80, '_')}\n"
            "\x1b[91mNotebook cell execution failed\x1b[0m\n"
            f"\x1b[94mCell {k}: Cell execution caused an exception\n\nInput:\n\x1b[0m{source}\n\n"
            "\x1b[94mTraceback:\x1b[0m\n\n"
            "\x1b[31m---------------------------------------------------------------------------\x1b[39m\n"
            f"{filler}\x1b[31m{error.split(':')[0]}\x1b[39m: {error.split(': ', 1)[1]}\n\n")


CELLS = [(2, "lab = Lab('03')\nlab.setup()", "RuntimeError: the namespace lesson-03 is stuck terminating"),
         (4, "lab.apply('deployment.yaml')", "NameError: name 'lab' is not defined"),
         (5, "lab.expect('rollout')", "NameError: name 'lab' is not defined")]


def _output(filler: str = "") -> str:
    return (".." + "F." * len(CELLS) + " " * 60 + "[100%]\n"
            + " FAILURES ".center(80, "=") + "\n"
            + "".join(_cell(k, src, err, filler if k == 2 else "") for k, src, err in CELLS)
            + " short test summary info ".center(80, "=") + "\n"
            + "".join(f"FAILED notebooks/03-x.ipynb::Cell {k} - \x1b[91mNotebook cell execution failed\x1b[0m\n"
                      for k, _, _ in CELLS)
            + "3 failed, 5 passed in 41.20s\n")


def test_the_items_of_the_failures_section_are_split_by_their_headers(report) -> None:
    items = report.failing_items(_output())
    assert [header for header, _ in items] == [f"notebooks/03-x.ipynb::Cell {k}" for k, _, _ in CELLS]
    first = items[0][1]
    assert first.startswith("_" * 10) and "lab.setup()" in first and "stuck terminating" in first
    assert "Cell 4" not in first and "short test summary" not in first


def test_the_first_failing_cell_comes_whole_and_first_the_others_by_name(report) -> None:
    text = report.failure_report(_output(), tail_chars=300)
    assert text.startswith("first failing cell: notebooks/03-x.ipynb::Cell 2\n")
    assert "Input:\nlab = Lab('03')\nlab.setup()" in text
    assert text.index("RuntimeError: the namespace lesson-03 is stuck terminating") < text.index("then 2 more")
    assert "\x1b[" not in text  # no terminal colours
    others = text[text.index("then 2 more"):text.index("end of nbval's output")]
    assert "  notebooks/03-x.ipynb::Cell 4\n  notebooks/03-x.ipynb::Cell 5\n" in others
    assert "NameError" not in others  # headers only
    assert text.endswith("3 failed, 5 passed in 41.20s\n")


def test_a_long_first_cell_keeps_its_start_and_its_error(report) -> None:
    filler = "".join(f"frame {i} of a long traceback\n" for i in range(2000))
    text = report.failure_report(_output(filler), first_chars=4000, tail_chars=200)
    first = text[:text.index("then 2 more")]
    assert len(first) < 4000 + 200
    assert "lab.setup()" in first and "stuck terminating" in first
    assert "characters left out ..." in first


def test_output_without_a_failures_section_is_shown_by_its_end(report) -> None:
    output = "ERROR: file or directory not found: notebooks/99-missing.ipynb\n" * 5 + "no tests ran in 0.01s\n"
    assert report.failure_report(output, first_chars=50, tail_chars=50) == output[-100:]
