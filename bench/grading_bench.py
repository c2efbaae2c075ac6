"""Grading benchmark: seconds per graded submission, per lab and for a batch of 20.

    .venv/bin/python bench/grading_bench.py [--lab 01] [--batch 20] [--solutions-only] [-j N]
                                            [--labs 01,02,...,09] [--no-jail] [--reset-compare] [--home DIR]

Starts a fresh cluster in a temp GPULAB_HOME (or uses the running one in
``--home``), then

1. grades the solution of every lab in ``--labs`` twice in one batch, as
   ``gpulab grade`` does (jail, namespace-scoped identity, collection, release
   and — for cluster-wide labs — restore), and splits the second submission's
   time into its phases: a batch's second and later submissions find their
   kernel started (``Runner.warm``), the first starts it when it comes;
2. grades a batch of ``--batch`` submissions of ``--lab`` (solutions and
   untouched labs, alternating; with ``--solutions-only`` every one the
   solution, each submission's seconds and score shown) into a gradebook,
   ``--jobs`` at once where the lab allows (``gpulab grade -j``);
3. with ``--reset-compare``, times one targeted restore of a cluster-wide lab
   against one ``EmbeddedCluster.reset()``.

Results print as Markdown tables for BENCHMARKS.md. Targets on 2 cores: a
median ≤ 10 s per submission over all labs' solutions, none over 20 s; 40
lab-03 submissions ≤ 4 minutes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import nbformat  # noqa: E402

from gpulab.cluster.embedded import EmbeddedCluster  # noqa: E402
from gpulab.grading import grader  # noqa: E402
from gpulab.cluster.baseline import ClusterState  # noqa: E402
from gpulab.grading.gradebook import ProgressEvent  # noqa: E402


class Phases:
    """Wraps a grading setup's sandbox, runner and collector to time each phase of each submission."""

    def __init__(self, ready: grader.Setup):
        self.times: dict[str, list[float]] = defaultdict(list)
        for obj, method, name in ((ready.sandbox, "prepare", "prepare (namespaces, RBAC, cert)"),
                                  (ready.runner, "run", "notebook run (jail + papermill)"),
                                  (ready.collector, "collect", "collect objects"),
                                  (ready.sandbox, "release", "release (+ restore)")):
            self._wrap(obj, method, name)

    def _wrap(self, obj, method, name):
        original = getattr(obj, method)

        def timed(*args, **kwargs):
            start = time.monotonic()
            try:
                return original(*args, **kwargs)
            finally:
                self.times[name].append(time.monotonic() - start)

        setattr(obj, method, timed)


class Clock:
    """A progress callback recording each submission's wall time."""

    def __init__(self):
        self.started: dict[str, float] = {}
        self.seconds: list[float] = []
        self.statuses: list[str] = []

    def __call__(self, event: ProgressEvent) -> None:
        if event.phase == "start":
            self.started[event.learner] = time.monotonic()
        else:
            self.seconds.append(time.monotonic() - self.started[event.learner])
            self.statuses.append(event.row.status if event.row else "?")
            print(f"  {event.index}/{event.total} {event.learner}: {self.seconds[-1]:.1f} s "
                  f"({self.statuses[-1]}, {event.row.total if event.row else '?'})", file=sys.stderr)


def grade(cluster, lab: str, subs: Path, out: Path, jail: bool, jobs: int = 1,
          warm: bool = True) -> tuple[Clock, Phases, list, int]:
    """Grade ``subs`` as ``gpulab grade -j jobs`` does (``warm``: a kernel started ahead for the next submission,
    as a batch has); the clock, the phases, the rows and the jobs used."""
    ready = grader.setup(lab, cluster=cluster, jail=jail, masks=(subs, out))
    phases = Phases(ready)
    clock = Clock()
    try:
        at_once, why = grader.parallel_jobs(ready.spec, jobs, ready.sandbox.client)
        if why:
            print(f"  {why}", file=sys.stderr)
        ready.runner.warm = at_once if warm else 0
        result = grader.grade_batch(subs, ready.spec.lab, ready.suite, ready.runner, out, progress=clock,
                                    collector=ready.collector, sandbox=ready.sandbox,
                                    parameters=dict(ready.spec.parameters),
                                    namespace_for=grader.namespace_for(ready.spec), jobs=at_once)
    finally:
        ready.close()
    return clock, phases, result.rows, at_once


def stats(values: list[float]) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.1f} s"
    return f"{statistics.median(values):.1f} s (min {min(values):.1f}, max {max(values):.1f})"


def bench_labs(cluster, labs: list[str], work: Path, jail: bool) -> None:
    """Each lab's solution graded twice in one batch: the first as a batch's first submission (its kernel
    started when it comes), the second as every later one (its kernel started while the first was graded)."""
    rows = []
    seconds: list[float] = []
    for lab in labs:
        spec = grader.load_lab_spec(lab)
        subs = work / f"one-{lab}"
        subs.mkdir(parents=True)
        for learner in ("alice", "bob"):
            shutil.copy(REPO / "solutions" / f"{spec.lab}.ipynb", subs / f"{learner}.ipynb")
        print(f"lab {spec.lab}: its solution, twice", file=sys.stderr)
        clock, phases, result, _jobs = grade(cluster, lab, subs, work / f"one-{lab}-out", jail)
        first, row = clock.seconds[0], result[1]
        seconds.append(clock.seconds[1])
        parts = ", ".join(f"{name} {v[1]:.1f}" for name, v in phases.times.items())
        score = f"{row.total:g}/{row.max_points:g}" if row.total is not None else f"— ({row.status})"
        rows.append(f"| {spec.lab} | {clock.seconds[1]:.1f} s | {first:.1f} s | {score} | {parts} |")
    print("\n| lab (solution) | seconds per submission | first of a batch | score | phases of the second (s) |\n"
          "|---|---|---|---|---|")
    print("\n".join(rows))
    if seconds:
        print(f"| median over {len(seconds)} labs | {statistics.median(seconds):.1f} s | | | "
              f"max {max(seconds):.1f} s |")


def bench_batch(cluster, lab: str, n: int, work: Path, jail: bool, jobs: int = 1,
                solutions_only: bool = False) -> None:
    spec = grader.load_lab_spec(lab)
    subs = work / f"batch-{lab}"
    subs.mkdir(parents=True)
    solution = nbformat.read(REPO / "solutions" / f"{spec.lab}.ipynb", as_version=4)
    untouched = nbformat.read(REPO / "labs" / f"{spec.lab}.ipynb", as_version=4)
    for i in range(n):
        nbformat.write(solution if solutions_only or i % 2 == 0 else untouched, subs / f"learner-{i:02d}.ipynb")
    print(f"lab {spec.lab}: batch of {n}", file=sys.stderr)
    started = time.monotonic()
    clock, phases, rows, at_once = grade(cluster, lab, subs, work / f"batch-{lab}-out", jail, jobs)
    total = time.monotonic() - started
    print(f"\n| batch of {n} × lab {spec.lab}, -j {jobs} | value |\n|---|---|")
    print(f"| wall time, whole batch (setup included) | {total:.1f} s |")
    print(f"| submissions graded at once | {at_once} |")
    print(f"| per submission | {stats(clock.seconds)} |")
    print(f"| per submission, mean | {statistics.mean(clock.seconds):.1f} s |")
    for name, values in phases.times.items():
        print(f"| of which {name} | {stats(values)} |")
    print(f"| statuses | {', '.join(f'{s} {clock.statuses.count(s)}' for s in sorted(set(clock.statuses)))} |")
    if solutions_only:  # each run: a lab's fixture may set up each namespace differently (lab 09: its fault)
        print("\n| learner | namespace | seconds | score |\n|---|---|---|---|")
        for row, seconds in zip(rows, clock.seconds):
            print(f"| {row.learner} | {row.namespace} | {seconds:.1f} | {row.total} / {row.max_points} |")


def bench_reset(cluster) -> None:
    from gpulab.kube import api

    client = api.Client(cluster.kubeconfig)
    state = ClusterState.capture(client)
    client.patch("Node", "gpu-node-1", {"metadata": {"labels": {"node-role.kubernetes.io/ai": "true"}},
                                        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "true",
                                                             "effect": "NoSchedule"}]}})
    start = time.monotonic()
    state.capture(client)
    state.restore(client)
    targeted = time.monotonic() - start
    start = time.monotonic()
    cluster.reset(say=lambda _m: None)
    reset = time.monotonic() - start
    print("\n| restoring cluster-wide state after a submission | time |\n|---|---|")
    print(f"| targeted restore (capture + patch nodes, PriorityClasses) | {targeted:.2f} s |")
    print(f"| `EmbeddedCluster.reset()` (down, wipe etcd and volumes, up) | {reset:.1f} s |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lab", default="01", help="lab of the batch (default 01)")
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--solutions-only", action="store_true", help="every submission of the batch the solution")
    parser.add_argument("--jobs", "-j", type=int, default=1, help="grade the batch as `gpulab grade -j N`")
    parser.add_argument("--labs", default="01,02,03,04,05,06,07,08,09", help="labs graded once each ('' to skip)")
    parser.add_argument("--no-jail", action="store_true")
    parser.add_argument("--reset-compare", action="store_true")
    parser.add_argument("--home", type=Path, help="use the running cluster of this GPULAB_HOME")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="gl-gradebench-"))
    home = args.home or Path(tempfile.mkdtemp(prefix="glg-", dir="/tmp"))
    os.environ["GPULAB_HOME"] = str(home)
    cluster = EmbeddedCluster(home / "cluster")
    own = args.home is None
    try:
        if own:
            start = time.monotonic()
            cluster.up(say=lambda _m: None)
            print(f"cluster up in {time.monotonic() - start:.1f} s", file=sys.stderr)
        print(f"\nmachine: {os.cpu_count()} cores; jail {'off' if args.no_jail else 'on'}")
        if args.labs:
            bench_labs(cluster, [lab.strip() for lab in args.labs.split(",") if lab.strip()], work, not args.no_jail)
        if args.batch:
            bench_batch(cluster, args.lab, args.batch, work, not args.no_jail, args.jobs, args.solutions_only)
        if args.reset_compare:
            bench_reset(cluster)
    finally:
        if own:
            cluster.down(purge=True)
            shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
