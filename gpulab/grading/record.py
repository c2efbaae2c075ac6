"""Values a lab notebook hands to the grader.

In a lab notebook::

    # parameters              (cell tagged "parameters")
    namespace = "gpulab-lab03"
    results_path = "results/03-scheduling.json"

    import gpulab.grading as grading
    grading.record("allocatable_gpus", {"gpu-node-1": 2})

``record`` writes to the notebook's ``results_path`` parameter, which the
grader overrides per submission through papermill. The file is one JSON object
(name → value), rewritten atomically on every call so that a notebook killed
mid-run leaves the values recorded so far intact and readable.

Note: ``gpulab.grading.record`` is the *function* (the package re-exports it);
import this module's other names with ``from gpulab.grading.record import …``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpulab._fsutil import atomic_write_json, locked

PARAMETER = "results_path"

_explicit_path: Path | None = None
_memory: dict[str, Any] = {}


class ResultsError(ValueError):
    """Raised when a results file exists but is not a JSON object."""


def set_results_path(path: str | os.PathLike[str] | None) -> None:
    """Pin where :func:`record` writes (overrides the ``results_path`` notebook variable)."""
    global _explicit_path
    _explicit_path = Path(path) if path else None


def _notebook_parameter() -> Path | None:
    # The papermill parameter is a plain global of the running notebook; read it through IPython's
    # documented user namespace rather than by inspecting caller frames.
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return None
    shell = get_ipython()
    value = shell.user_ns.get(PARAMETER) if shell is not None else None
    return Path(value) if isinstance(value, (str, os.PathLike)) and str(value) else None


def results_path() -> Path | None:
    """Where :func:`record` writes now, or None (values are then kept in memory only)."""
    return _explicit_path or _notebook_parameter()


def to_jsonable(value: Any) -> Any:
    """Convert ``value`` to plain JSON data, or raise TypeError with a learner-facing message.

    Kubernetes client models are converted with their ``to_dict()``; datetimes
    become ISO strings; tuples and sets become lists; numpy scalars their Python
    value. Anything else must already be JSON.
    """
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise TypeError("record() 的值里不能有 NaN 或无穷大")
        return value
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"record() 的字典键必须是字符串，收到 {key!r}")
            out[key] = to_jsonable(item)
        return out
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((to_jsonable(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, (_dt.datetime, _dt.date)):
        return value.isoformat()
    if hasattr(value, "to_dict") and callable(value.to_dict):
        return to_jsonable(value.to_dict())
    if hasattr(value, "item") and callable(value.item) and type(value).__module__ == "numpy":
        return to_jsonable(value.item())
    raise TypeError(f"record() 只能记录可以转成 JSON 的值（数字、字符串、列表、字典……），"
                    f"收到的是 {type(value).__name__}")


def record(name: str, value: Any) -> Any:
    """Record ``value`` under ``name`` for the grader and return it unchanged.

    Without a results path (a learner running the notebook by hand with an
    empty ``results_path``) the value is only kept in memory, so the notebook
    still runs.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError("record() 的第一个参数必须是非空字符串，作为结果的名字")
    data = to_jsonable(value)
    _memory[name] = data
    path = results_path()
    if path is not None:
        with locked(path):
            current = load_results(path)
            current[name] = data
            atomic_write_json(path, current)
    return value


def load_results(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The recorded values in ``path``; ``{}`` when the file does not exist."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ResultsError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ResultsError(f"{path}: expected a JSON object of recorded values, got {type(data).__name__}")
    return data


def recorded() -> dict[str, Any]:
    """Values recorded in this process so far (what a learner can inspect interactively)."""
    return dict(_memory)
