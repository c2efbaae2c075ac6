"""Grading: papermill-executed lab notebooks, pure checks, a CSV gradebook.

Notebook side: :func:`record` (values for the grader) and
:mod:`gpulab.grading.labkit` (``begin``, ``kubectl``). Instructor side:
:func:`grade_batch` / :func:`grade_lab` (gradebook), :class:`Runner`
(one notebook in its own process tree, optionally in a :class:`Jail`),
:func:`generate_all` / :func:`check_drift` (labs generated from solutions).
On the cluster: :func:`grade_submissions` (``gpulab grade``) and
:func:`check_notebook` (``gpulab check``) with a :class:`ClusterSandbox`
(namespaces and a namespace-scoped identity per submission) and a
:class:`ClusterCollector`. Check authors use :mod:`gpulab.grading.checks`.

The heavier modules are imported on first use, so ``import gpulab.grading``
in a lab notebook stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

from .checks import (
    Check,
    CheckLoadError,
    CheckOutcome,
    CheckResult,
    CheckSuite,
    Context,
    check,
    failed,
    load_hidden_checks,
    load_lab_checks,
    partial,
    passed,
    ratio,
)
from .record import load_results, record, recorded, results_path, set_results_path

_LAZY = {
    "Runner": "runner", "Execution": "runner", "ErrorKind": "runner", "execute_notebook": "runner",
    "grade_batch": "gradebook", "grade_lab": "gradebook", "grade_submission": "gradebook",
    "Collector": "gradebook", "Sandbox": "gradebook", "NullCollector": "gradebook",
    "RecordedCollector": "gradebook", "GradeRow": "gradebook", "BatchResult": "gradebook",
    "ProgressEvent": "gradebook", "TqdmProgress": "gradebook", "read_gradebook": "gradebook",
    "generate_lab": "labsource", "generate_all": "labsource", "check_drift": "labsource",
    "LabDrift": "labsource", "LabSourceError": "labsource",
    "ClusterCollector": "cluster", "ClusterSandbox": "cluster", "LabSpec": "cluster", "load_lab_spec": "cluster",
    "Jail": "jail", "grade_submissions": "grader", "check_notebook": "grader", "GradingError": "grader",
}

__all__ = ["Check", "CheckLoadError", "CheckOutcome", "CheckResult", "CheckSuite", "Context", "check", "failed",
           "load_hidden_checks", "load_lab_checks", "partial", "passed", "ratio", "load_results", "record",
           "recorded", "results_path", "set_results_path", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
