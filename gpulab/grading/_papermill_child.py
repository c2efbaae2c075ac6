"""Child process of :mod:`gpulab.grading.runner`: executes one notebook with papermill.

Run as ``python -m gpulab.grading._papermill_child SPEC.json``. The spec names
the input and output notebooks, the parameters, the kernel and the timeouts;
the outcome is written as JSON to ``spec["result_path"]``. A spec with a
``go_path`` names only the kernel, its working directory and what to load in it
first (``preload``): the child starts the kernel, loads those modules, then
waits for that file to appear, which holds the rest (the notebooks, the
parameters, the per-cell limit, ``result_path``).
So a runner can start the next submission's kernel while the grader is still
busy with the last one (a *standby*, :class:`gpulab.grading.runner.Runner`'s
``warm``), or write the go file at once (a cold start). Keeping papermill in
its own process lets the parent enforce a wall-clock limit by killing the whole
process tree, whatever the notebook does.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
import time
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


#: How long a standby waits for its submission before it gives up (its runner has gone).
STANDBY_LIFETIME = 3600.0


def start_kernel(spec: dict[str, Any]) -> Any:
    """The kernel the notebook will run in, started in its working directory with this process's environment,
    the modules of ``spec["preload"]`` imported in it (silently: no output, no execution count)."""
    from jupyter_client.blocking import BlockingKernelClient
    from jupyter_client.manager import AsyncKernelManager  # nbclient's kind of manager
    from jupyter_core.utils import run_sync

    km = AsyncKernelManager(kernel_name=spec.get("kernel_name") or "python3")
    run_sync(km.start_kernel)(cwd=spec.get("cwd"))
    modules = spec.get("preload") or []
    if modules:
        kc = BlockingKernelClient()
        kc.load_connection_info(km.get_connection_info())
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=spec.get("start_timeout", 60))
            code = "\n".join(f"try:\n    import {m}\nexcept Exception:\n    pass" for m in modules)
            kc.execute_interactive(code, silent=True, store_history=False, timeout=spec.get("start_timeout", 60),
                                   output_hook=lambda msg: None)
        finally:
            kc.stop_channels()
    return km


def stop_kernel(km: Any) -> None:
    from jupyter_core.utils import run_sync

    try:
        run_sync(km.shutdown_kernel)(now=True)
    except Exception:  # noqa: BLE001 - the runner kills what is left anyway
        pass


def wait_for_go(path: str, lifetime: float = STANDBY_LIFETIME) -> dict[str, Any] | None:
    """The submission, once the runner has written it to ``path``; None after ``lifetime`` seconds."""
    deadline = time.monotonic() + lifetime
    while time.monotonic() < deadline:
        try:
            with open(path, encoding="utf-8") as handle:
                return json.load(handle)
        except FileNotFoundError:
            time.sleep(0.02)
    return None


def execute(spec: dict[str, Any], km: Any = None) -> dict[str, Any]:
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
            km=km,
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
    if "go_path" not in spec:  # everything at once: papermill starts the kernel itself
        _write(spec["result_path"], execute(spec))
        return 0
    importlib.import_module("papermill")  # loaded while waiting, not once the submission is there

    km = None
    try:
        km = start_kernel(spec)
    except Exception:  # noqa: BLE001 - papermill starts one itself then, and says what goes wrong
        traceback.print_exc()
    try:
        go = wait_for_go(spec["go_path"])
        if go is None:
            return 1
        spec = {**spec, **go}
        _write(spec["result_path"], execute(spec, km))
    finally:
        if km is not None:
            stop_kernel(km)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
