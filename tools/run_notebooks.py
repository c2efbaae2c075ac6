#!/usr/bin/env python3
"""Execute the chapter notebooks in place, so the committed copies carry outputs from a clean run.

    .venv/bin/python tools/run_notebooks.py                 # every notebooks/NN-*.ipynb
    .venv/bin/python tools/run_notebooks.py 03 05           # by number or stem
    .venv/bin/python tools/run_notebooks.py --check         # run, report, write nothing

Each notebook runs in a fresh ``python3`` kernel with ``notebooks/`` as its
working directory, against the cluster of ``GPULAB_HOME`` (default
``~/.gpulab``; the notebook's own ``setup()`` starts it if needed). A
notebook that fails is left untouched and the failing cell is reported; the
exit status is 1 if any failed. Run times are printed per notebook.

Cell timing metadata is not recorded (it would change every run); widget
state is stored so that quizzes render when a notebook is opened before
its kernel runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"


def resolve(names: list[str]) -> list[Path]:
    every = sorted(NOTEBOOKS.glob("[0-9][0-9]-*.ipynb"))
    if not names:
        return every
    picked = []
    for name in names:
        stem = Path(name).name.removesuffix(".ipynb")
        hits = [p for p in every if p.stem == stem or p.stem.split("-", 1)[0] == stem]
        if not hits:
            raise SystemExit(f"run_notebooks: no notebook matches {name!r} (have: {', '.join(p.stem for p in every)})")
        picked += hits
    return picked


def execute(path: Path, timeout: int, kernel: str) -> nbformat.NotebookNode:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel, record_timing=False,
                            store_widget_state=True, resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    return nb


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebooks", nargs="*", help="numbers (03) or stems (03-scheduling); default: all")
    ap.add_argument("--check", action="store_true", help="execute but do not write the notebooks back")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per cell (default 300)")
    ap.add_argument("--kernel", default="python3", help="kernel name (default python3)")
    args = ap.parse_args(argv)

    failed = 0
    for path in resolve(args.notebooks):
        rel = path.relative_to(REPO)
        started = time.monotonic()
        try:
            nb = execute(path, args.timeout, args.kernel)
        except CellExecutionError as e:
            failed += 1
            print(f"{rel}: FAILED after {time.monotonic() - started:.1f} s\n{e}", file=sys.stderr, flush=True)
            continue
        took = time.monotonic() - started
        if not args.check:
            nbformat.write(nb, path)
        print(f"{rel}: ok in {took:.1f} s{'' if args.check else ' (outputs saved)'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
