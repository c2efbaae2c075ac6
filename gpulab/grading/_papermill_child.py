"""Child process of :mod:`gpulab.grading.runner`: executes one notebook with papermill.

Run as ``python -m gpulab.grading._papermill_child SPEC.json``. The spec names
the input and output notebooks, the parameters, the kernel and the timeouts;
the outcome is written as JSON to ``spec["result_path"]``. Keeping papermill in
its own process lets the parent enforce a wall-clock limit by killing the whole
process tree, whatever the notebook does.
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _clean_traceback(lines: Any, limit: int = 40) -> str:
    text = _ANSI.sub("", "\n".join(lines or []))
    kept = text.splitlines()[-limit:]
    return "\n".join(kept)


def _write(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, ensure_ascii=False)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _sys_exit_cell(output_path: str) -> tuple[int, str] | None:
    """papermill treats ``sys.exit()``/``sys.exit(0)`` as success; find such a cell ourselves."""
    import nbformat

    nb = nbformat.read(output_path, as_version=4)
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error" and output.get("ename") == "SystemExit":
                return index, output.get("evalue", "")
    return None


def execute(spec: dict[str, Any]) -> dict[str, Any]:
    import papermill as pm
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    from papermill.exceptions import PapermillExecutionError

    try:
        pm.execute_notebook(
            spec["input"],
            spec["output"],
            parameters=spec.get("parameters") or {},
            kernel_name=spec.get("kernel_name"),
            progress_bar=False,
            log_output=False,
            request_save_on_cell_execute=True,
            start_timeout=spec.get("start_timeout", 60),
            execution_timeout=spec.get("cell_timeout"),
            cwd=spec.get("cwd"),
        )
    except PapermillExecutionError as exc:
        kind = "sys-exit" if exc.ename == "SystemExit" else "cell-error"
        return {"kind": kind, "cell_index": exc.cell_index, "ename": exc.ename, "evalue": exc.evalue,
                "traceback": _clean_traceback(exc.traceback)}
    except CellTimeoutError as exc:
        return {"kind": "cell-timeout", "ename": type(exc).__name__, "evalue": str(exc).splitlines()[0][:300]}
    except DeadKernelError as exc:
        return {"kind": "kernel-died", "ename": type(exc).__name__, "evalue": str(exc)[:500]}
    except Exception as exc:  # noqa: BLE001 - everything else is reported, not raised
        return {"kind": "runner-error", "ename": type(exc).__name__, "evalue": str(exc)[:2000],
                "traceback": traceback.format_exc(limit=20)}
    found = _sys_exit_cell(spec["output"])
    if found is not None:
        index, code = found
        return {"kind": "sys-exit", "cell_index": index, "ename": "SystemExit", "evalue": code}
    return {"kind": None}


def main(argv: list[str]) -> int:
    with open(argv[1], encoding="utf-8") as handle:
        spec = json.load(handle)
    _write(spec["result_path"], execute(spec))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
