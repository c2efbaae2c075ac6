"""Builders for the small notebooks the grading tests execute or transform."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

PARAMETERS = 'namespace = "gpulab-default"\nresults_path = ""'


def notebook(cells: Iterable[str | nbformat.NotebookNode], parameters: str | None = PARAMETERS
             ) -> nbformat.NotebookNode:
    """A python3 notebook: a ``parameters`` cell (unless None), then ``cells`` (strings become code cells)."""
    body = [c if isinstance(c, nbformat.NotebookNode) else new_code_cell(c) for c in cells]
    if parameters is not None:
        body.insert(0, new_code_cell(parameters, metadata={"tags": ["parameters"]}))
    nb = new_notebook(cells=body)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def write(nb: nbformat.NotebookNode, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def markdown(text: str, tags: list[str] | None = None) -> nbformat.NotebookNode:
    return new_markdown_cell(text, metadata={"tags": tags} if tags else {})


def code(text: str, tags: list[str] | None = None) -> nbformat.NotebookNode:
    return new_code_cell(text, metadata={"tags": tags} if tags else {})
