"""README's lesson table is the notebooks': every notebooks/NN-*.ipynb, in order, with its own title."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[2]


def test_readme_lists_every_lesson_with_its_title() -> None:
    rows = re.findall(r"^\| (\d\d) \| `(notebooks/[^`]+)` \| (.+?) \|$", (REPO / "README.md").read_text(), re.M)
    lessons = []
    for path in sorted((REPO / "notebooks").glob("[0-9][0-9]-*.ipynb")):
        heading = nbformat.read(path, as_version=4).cells[0].source.splitlines()[0]
        number, _, title = heading.removeprefix("# ").partition(" · ")
        lessons.append((number, f"notebooks/{path.name}", title))
    assert rows == lessons, "README's 从这里开始 table drifted from the notebooks' first headings: update the table"
