"""Builders for the small notebooks the grading tests execute or transform; a fake API client."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from gpulab.grading.checks import CheckSuite, load_lab_checks

PARAMETERS = 'namespace = "gpulab-default"\nresults_path = ""'

#: The worked example's check module (lab id "example": the chapter's gpu-train-demo Job); test code, so
#: it lives beside this file rather than in gpulab/grading/labs/, and is loaded by path.
EXAMPLE_LAB = Path(__file__).with_name("example_lab.py")


def example_checks() -> CheckSuite:
    """The suite of :data:`EXAMPLE_LAB` (what ``load_lab_checks("example")`` was while it was in the package)."""
    return load_lab_checks(EXAMPLE_LAB)


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


class FakeClient:
    """Just enough of :class:`gpulab.kube.api.Client` for the grading code: objects in a dict;
    patches merge as the apiserver's JSON merge patch (RFC 7386) does. There is no PUT."""

    def __init__(self, objects=()):
        self.store = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): copy.deepcopy(o)
                      for o in objects}
        self.calls = []

    def list(self, kind, namespace=None, label_selector=None, field_selector=None):
        key, _, value = (label_selector or "").partition("=")
        return [copy.deepcopy(o) for (k, ns, _), o in sorted(self.store.items(), key=lambda i: str(i[0]))
                if k == kind and (namespace is None or ns == namespace)
                and (not key or (o["metadata"].get("labels") or {}).get(key) == value)]

    def get(self, kind, name, namespace=None):
        obj = self.store.get((kind, namespace, name))
        return copy.deepcopy(obj) if obj else None

    def create(self, obj):
        self.calls.append(("create", obj["kind"], obj["metadata"]["name"]))
        self.store[(obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])] = copy.deepcopy(obj)
        return obj

    def delete(self, kind, name, namespace=None, **_):
        self.calls.append(("delete", kind, name))
        return self.store.pop((kind, namespace, name), None) is not None

    def patch(self, kind, name, patch, namespace=None, **_):
        self.calls.append(("patch", kind, name, copy.deepcopy(patch)))
        obj = self.store[(kind, namespace, name)]
        apply_merge_patch(obj, patch)
        return obj


def apply_merge_patch(target, patch):
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            apply_merge_patch(target[key], value)
        elif isinstance(value, dict):
            target[key] = {}
            apply_merge_patch(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


# A device-plugin time-slicing config with {n} replicas, and one with replicas misplaced (labs 04 and 06).
TIME_SLICING = """version: v1
flags:
  migStrategy: none
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: {n}
"""
TIME_SLICING_MISPLACED = """version: v1
sharing:
  timeSlicing:
    replicas: 4
    resources:
      - name: nvidia.com/gpu
"""
