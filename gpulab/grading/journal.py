"""A grader that dies cleans up after itself next time: journals of cluster-wide changes.

Before a cluster-wide lab's run changes anything outside its namespaces
(``normalize``, the lab's ``SETUP`` hook: GPU faults, node labels and taints,
PriorityClasses, the GPU stack's ClusterPolicy and ConfigMaps, the monitoring
add-on's configuration),
:class:`~gpulab.grading.cluster.ClusterSandbox` writes a journal,
``<cluster>/journal/<namespace>.<pid>.json`` (atomically, see
:mod:`gpulab._fsutil`): who runs it (pid, the process's start time, command,
host), what the lab declared it changes and what was there before. It is
removed once ``TEARDOWN`` and the sandbox's own restore have finished.

A journal that is still there belongs to a grader that is running, or to one
that was killed (SIGKILL, a closed laptop, an OOM kill) before it could put
the cluster back. :func:`recover` — run by ``gpulab up``, ``gpulab check``,
``gpulab grade`` and a lesson notebook's ``setup()`` — tells them apart by
the owner's pid *and* start time (a pid the system handed to another process
since is dead for this purpose), restores the recorded state of the dead
ones (newest first, so the oldest "before" wins), and leaves a living
grader's journal alone. What it did comes back as :class:`Restored` records,
each one line in English (CLI) or zh-CN (notebooks).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpulab import _proc
from gpulab._fsutil import atomic_write_json, locked
from gpulab.i18n import _
from gpulab.cluster.baseline import Restored

VERSION = 1
DIRNAME = "journal"

#: What a lab's ``SETUP`` may change cluster-wide; a journal records the state of each before the run.
#: ``nodes`` (labels, annotations, taints, cordon) and ``priority-classes`` are journaled for every
#: cluster-wide lab, since the learner's identity may change them too.
CHANGES = {
    "nodes": "node labels, annotations, taints, unschedulable",
    "priority-classes": "PriorityClasses",
    "faults": "simulated GPU faults (gpulab fault) on the GPU nodes",
    "gpu-stack": "the ClusterPolicy's spec, gpu-operator's ConfigMaps, the GPU nodes' stack labels",
    "monitoring": "the monitoring add-on's configuration (Prometheus's scrape config, prometheus-adapter's rules)",
}
ALWAYS = ("nodes", "priority-classes")



class JournalError(RuntimeError):
    """A journal cannot be written or read; the message says which and why."""


def journal_dir(cluster_root: str | os.PathLike[str]) -> Path:
    return Path(cluster_root) / DIRNAME


def declare(*changes: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a ``SETUP`` hook with what it changes cluster-wide (keys of :data:`CHANGES`).

    ``@journal.declare("faults", "nodes")`` before ``def break_things(env)``. A
    hook that declares nothing is journaled for everything it might change.
    """
    unknown = [c for c in changes if c not in CHANGES]
    if unknown:
        raise ValueError(f"unknown change(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(CHANGES)}")

    def mark(hook: Callable[..., Any]) -> Callable[..., Any]:
        hook.changes = tuple(changes)  # type: ignore[attr-defined]
        return hook

    return mark


def declared(hook: Any) -> tuple[str, ...]:
    """What ``hook`` declared with :func:`declare` (everything when it declared nothing), plus :data:`ALWAYS`."""
    changes = getattr(hook, "changes", None) if hook is not None else ()
    if changes is None:
        changes = tuple(CHANGES)
    return tuple(c for c in CHANGES if c in set(changes) | set(ALWAYS))


# --------------------------------------------------------------------------- owners


def _command() -> str:
    text = " ".join([Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python", *sys.argv[1:]])
    return text if len(text) <= 200 else text[:197] + "..."


@dataclass(frozen=True)
class Owner:
    """The process that wrote a journal: pid plus its start time, so a reused pid is not mistaken for it."""

    pid: int
    started: float  # the process's start, seconds since the epoch (psutil's create_time)
    command: str = ""
    host: str = ""

    @classmethod
    def current(cls) -> Owner:
        return cls(os.getpid(), _proc.started(os.getpid()) or 0.0, _command(), socket.gethostname())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Owner:
        return cls(int(data["pid"]), float(data["started"]), str(data.get("command") or ""),
                   str(data.get("host") or ""))

    def here(self) -> bool:
        """This host, where its pid can be checked."""
        return not self.host or self.host == socket.gethostname()

    def alive(self) -> bool:
        """The process still runs: its pid exists, is not a zombie, and started when the owner did."""
        if not self.here():
            return True  # nothing to check it with: a journal of another host is left alone
        return _proc.alive(self.pid, self.started)

    def describe(self) -> str:
        """Which process, in the user's language: its pid (and host, if another), command and start."""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        if self.here():
            return _("pid {pid} ({command}), started {when}", pid=self.pid, command=self.command or "?", when=when)
        return _("pid {pid} on {host} ({command}), started {when}", pid=self.pid, host=self.host,
                 command=self.command or "?", when=when)


# --------------------------------------------------------------------------- one journal


@dataclass
class Journal:
    """One run's journal file; :meth:`open` writes it, :meth:`close` removes it."""

    path: Path
    record: dict[str, Any]

    @classmethod
    def open(cls, cluster_root: str | os.PathLike[str], *, lab: str, namespace: str, learner: str,
             namespaces: Iterable[str], changes: Iterable[str], before: Mapping[str, Any],
             cluster_uid: str | None = None, cleanup: Mapping[str, Any] | None = None,
             owner: Owner | None = None) -> Journal:
        """Write the journal of a run about to change the cluster (before it changes anything)."""
        owner = owner or Owner.current()
        path = journal_dir(cluster_root) / f"{namespace}.{owner.pid}.json"
        record = {"version": VERSION, "lab": lab, "namespace": namespace, "learner": learner,
                  "namespaces": list(namespaces), "owner": asdict(owner), "opened": time.time(),
                  "cluster_uid": cluster_uid, "changes": list(changes), "before": dict(before),
                  "cleanup": dict(cleanup or {}), "phase": "setup"}
        journal = cls(path, record)
        journal._write()
        return journal

    def update(self, **fields: Any) -> None:
        """Record more about the run (what ``SETUP`` applied, the phase it is in)."""
        self.record.update(fields)
        self._write()

    def close(self) -> None:
        """The run put the cluster back: nothing to recover."""
        self.path.unlink(missing_ok=True)

    def _write(self) -> None:
        try:
            atomic_write_json(self.path, self.record)
        except (OSError, ValueError) as exc:
            raise JournalError(f"cannot write the grading journal {self.path}: {exc}") from exc

    @property
    def owner(self) -> Owner:
        return Owner.from_dict(self.record["owner"])

    @property
    def id(self) -> str:
        return self.path.stem


def read(path: str | os.PathLike[str]) -> Journal:
    """The journal at ``path``; :class:`JournalError` when it is not one (it is written atomically: never half)."""
    path = Path(path)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(record, dict) or record.get("version") != VERSION:
            raise ValueError(f"not a version-{VERSION} journal")
        Owner.from_dict(record["owner"])
        record["before"]  # noqa: B018 - must be there
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise JournalError(f"{path}: {exc}") from exc
    return Journal(path, record)


def pending(cluster_root: str | os.PathLike[str]) -> tuple[list[Journal], list[tuple[Path, str]]]:
    """Every journal under the cluster's directory, newest first; and the unreadable ones with why."""
    found, bad = [], []
    directory = journal_dir(cluster_root)
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else ():
        try:
            found.append(read(path))
        except JournalError as exc:
            bad.append((path, str(exc.__cause__ or exc)))
    found.sort(key=lambda j: float(j.record.get("opened") or 0), reverse=True)
    return found, bad


# --------------------------------------------------------------------------- recovery


@dataclass
class Outcome:
    """What :func:`recover` did with one journal."""

    journal: Journal | None
    status: str  # "restored" | "alive" | "failed" | "stale" | "unreadable"
    restored: list[Restored] = field(default_factory=list)
    error: str = ""
    path: Path | None = None

    def lines(self) -> list[str]:
        """What a person is told of this outcome, in the user's language (Chinese in a lesson)."""
        rec = self.journal.record if self.journal else {}
        owner = self.journal.owner if self.journal else None
        facts = {"lab": rec.get("lab", "?"), "namespace": rec.get("namespace", "?"),
                 "owner": owner.describe() if owner else "?",
                 "path": self.path or (self.journal.path if self.journal else "?"), "error": self.error}
        # TRANSLATORS: one thing a recovery put back, indented under the line that says whose it was.
        done = [_("  {change}", change=r.text()) for r in self.restored]
        if self.status == "restored":
            if done:
                return [_("an interrupted grader ({owner}) left lab {lab} set up for {namespace}; restored:", **facts),
                        *done]
            return [_("an interrupted grader ({owner}) left a journal for {namespace}; the cluster was already as "
                      "before, nothing to restore", **facts)]
        if self.status == "alive":
            return [_("a grader is still running lab {lab} for {namespace} ({owner}): its changes are left alone "
                      "(journal {path})", **facts)]
        if self.status == "stale":
            return [_("journal {path} is from before the cluster was reset; removed, nothing to restore", **facts)]
        if self.status == "unreadable":
            return [_("journal {path} is unreadable ({error}); left in place", **facts)]
        return [_("could not finish restoring what an interrupted grader left for {namespace} (lab {lab}): {error}; "
                  "the journal stays ({path}) for the next try, `gpulab reset` resets the whole cluster", **facts),
                *(_("  restored so far: {change}", change=r.text()) for r in self.restored)]


def cluster_uid(client: Any) -> str | None:
    """The kube-system namespace's uid: it changes when the cluster is reset (a journal of before is moot)."""
    try:
        return ((client.get("Namespace", "kube-system") or {}).get("metadata") or {}).get("uid")
    except Exception:  # noqa: BLE001 - identity is a nicety; an unreachable cluster fails later, louder
        return None


def recover(cluster_root: str | os.PathLike[str] | None, client: Any,
            restore: Callable[[Any, Journal], list[Restored]]) -> list[Outcome]:
    """Restore what killed graders left (see the module docstring); what was done, one :class:`Outcome` each.

    ``restore(client, journal)`` puts one journal's state back
    (:func:`gpulab.grading.cluster.restore_journal`). A journal whose restore
    fails stays for the next try; the others are still handled.
    """
    if cluster_root is None or not journal_dir(cluster_root).is_dir():
        return []
    outcomes: list[Outcome] = []
    directory = journal_dir(cluster_root)
    # Two notebooks starting at once must not both put the same things back.
    with locked(directory / ".recover"):
        journals, bad = pending(cluster_root)
        outcomes += [Outcome(None, "unreadable", error=why, path=path) for path, why in bad]
        uid = None
        for journal in journals:
            if journal.owner.alive():
                outcomes.append(Outcome(journal, "alive"))
                continue
            recorded = journal.record.get("cluster_uid")
            uid = uid or cluster_uid(client)
            if recorded and uid and recorded != uid:
                journal.close()
                outcomes.append(Outcome(journal, "stale"))
                continue
            done: list[Restored] = []
            try:
                done = restore(client, journal)
            except Exception as exc:  # noqa: BLE001 - reported; the journal stays for the next try
                partial = getattr(exc, "restored", None) or []
                outcomes.append(Outcome(journal, "failed", list(partial), f"{type(exc).__name__}: {exc}"))
                continue
            journal.close()
            outcomes.append(Outcome(journal, "restored", done))
    return outcomes


def report(outcomes: Iterable[Outcome]) -> list[str]:
    """Every outcome's lines, in order, in the user's language."""
    return [line for outcome in outcomes for line in outcome.lines()]
