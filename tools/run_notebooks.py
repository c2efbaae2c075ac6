#!/usr/bin/env python3
"""Execute the chapter notebooks in place, so the committed copies carry outputs from one clean run.

    .venv/bin/python tools/run_notebooks.py                 # all of them, 00..09, on a FRESH cluster
    .venv/bin/python tools/run_notebooks.py 03 05           # by number or stem, on the current cluster
    .venv/bin/python tools/run_notebooks.py --check         # run, report, write nothing

Without names (``make notebooks``) this is the one clean run the committed
outputs come from: a fresh ``GPULAB_HOME`` in a temporary directory, a new
cluster started there (``gpulab up``), every ``notebooks/NN-*.ipynb`` run in
order on it, and the cluster stopped and its directory removed at the end,
whether the notebooks passed or not (Ctrl-C and SIGTERM included). With names
the notebooks run against the cluster of ``GPULAB_HOME`` (default
``~/.gpulab``; the notebook's own ``setup()`` starts it if needed).

Each notebook runs in a fresh ``python3`` kernel with ``notebooks/`` as its
working directory; the kernel inherits ``GPULAB_HOME``. A notebook that fails
is left untouched and the failing cell is reported; the exit status is 1 if
any failed. Run times are printed per notebook.

Every notebook written back records in its metadata (``metadata.gpulab``)
which run produced its outputs: the cluster (the UID of its ``kube-system``
namespace), when the run started, whether that cluster was made fresh for it,
where the notebook stood in the run, and how long it took.
``tests/notebooks/test_notebook_hygiene.py`` fails when the committed
notebooks do not all come from the same fresh run.

Cell timing metadata is not recorded (it would change every run); widget
state is stored so that quizzes render when a notebook is opened before
its kernel runs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
METADATA_KEY = "gpulab"


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


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def cluster_uid() -> str:
    """The UID of the ``kube-system`` namespace of the cluster in ``GPULAB_HOME``: which cluster this is."""
    from gpulab.cluster import backend
    from gpulab.kube import api

    ns = api.Client(backend.current().kubeconfig).get("Namespace", "kube-system")
    if not ns:
        raise RuntimeError("the cluster has no kube-system namespace")
    return ns["metadata"]["uid"]


def gpulab(*args: str) -> None:
    """``gpulab ARGS`` as the command line runs it, against the cluster of this process's ``GPULAB_HOME``."""
    subprocess.run([sys.executable, "-m", "gpulab.cli", *args], check=True, cwd=REPO)


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def fresh_cluster() -> Iterator[Path]:
    """A new cluster in a temporary ``GPULAB_HOME``; stopped and removed on the way out, whatever happens."""
    old_home = os.environ.get("GPULAB_HOME")
    old_term = signal.signal(signal.SIGTERM, _terminate)  # `kill` too goes through the finally below
    # Short (unix sockets live under it) and world-readable (pods run as nobody and must reach their workdir).
    home = Path(tempfile.mkdtemp(prefix="gl-nb-", dir="/tmp"))
    home.chmod(0o755)
    os.environ["GPULAB_HOME"] = str(home)
    print(f"run_notebooks: a fresh cluster in GPULAB_HOME={home}", flush=True)
    try:
        gpulab("up")
        yield home
    finally:
        try:
            gpulab("down", "--purge")
        except (subprocess.CalledProcessError, OSError) as e:
            print(f"run_notebooks: `gpulab down --purge` failed ({e}); removing {home} anyway", file=sys.stderr)
        finally:
            shutil.rmtree(home, ignore_errors=True)
            if old_home is None:
                os.environ.pop("GPULAB_HOME", None)
            else:
                os.environ["GPULAB_HOME"] = old_home
            signal.signal(signal.SIGTERM, old_term)
            print(f"run_notebooks: the fresh cluster is stopped and {home} removed", flush=True)


def run(paths: list[Path], args: argparse.Namespace, fresh: bool) -> int:
    started = now()
    failed = 0
    for position, path in enumerate(paths):
        rel = path.relative_to(REPO)
        t0 = time.monotonic()
        try:
            nb = execute(path, args.timeout, args.kernel)
        except CellExecutionError as e:
            failed += 1
            print(f"{rel}: FAILED after {time.monotonic() - t0:.1f} s\n{e}", file=sys.stderr, flush=True)
            continue
        took = time.monotonic() - t0
        nb.metadata[METADATA_KEY] = {
            "run": {"cluster": cluster_uid(), "started": started, "fresh_cluster": fresh},
            "position": position,
            "finished": now(),
            "seconds": round(took, 1),
        }
        if not args.check:
            nbformat.write(nb, path)
        print(f"{rel}: ok in {took:.1f} s{'' if args.check else ' (outputs saved)'}", flush=True)
    return failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebooks", nargs="*",
                    help="numbers (03) or stems (03-scheduling), run on the current cluster; "
                         "default: all, in order, on a fresh cluster")
    ap.add_argument("--check", action="store_true", help="execute but do not write the notebooks back")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per cell (default 300)")
    ap.add_argument("--kernel", default="python3", help="kernel name (default python3)")
    args = ap.parse_args(argv)

    paths = resolve(args.notebooks)
    t0 = time.monotonic()
    try:
        if args.notebooks:
            failed = run(paths, args, fresh=False)
        else:
            with fresh_cluster():
                failed = run(paths, args, fresh=True)
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: the fresh cluster is already gone (fresh_cluster's finally)
        print(f"run_notebooks: interrupted ({e or 'Ctrl-C'}); notebooks finished before that were saved",
              file=sys.stderr)
        return 130
    print(f"run_notebooks: {len(paths) - failed} of {len(paths)} notebooks ok in {time.monotonic() - t0:.0f} s",
          flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
