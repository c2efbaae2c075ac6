"""What every backend's cluster is: the one interface the CLI, notebooks and grading use.

A backend (:mod:`gpulab.cluster.embedded`, :mod:`gpulab.cluster.kind`) brings a
cluster up, takes it down and resets it; everything else reads the cluster
through its state directory (:class:`gpulab.kube.statedir.StateDir`: the
kubeconfig, the CA, the topology). :func:`gpulab.cluster.backend.current`
returns the chosen backend's cluster typed as :class:`Cluster`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ..kube.topology import Topology

Say = Callable[[str], None]


def say_to_stderr(msg: str) -> None:
    print(f"gpulab: {msg}", file=sys.stderr, flush=True)


class ClusterError(RuntimeError):
    """Something about the cluster's state stops the command; the message says what to do."""


class Cluster(Protocol):
    """A cluster gpulab brings up: its state directory plus up, down and reset."""

    root: Path

    @property
    def kubeconfig(self) -> Path: ...

    @property
    def pki(self) -> Path: ...

    def state(self) -> dict[str, Any]: ...

    def exists(self) -> bool: ...

    def topology(self) -> Topology: ...

    def running(self) -> dict[str, int]:
        """Component name → pid (embedded) or container (kind) of what runs now."""

    def is_up(self) -> bool: ...

    def up(self, topology_path: str | Path | None = None, say: Say = say_to_stderr,
           timeout: float = 120) -> str: ...

    def down(self, purge: bool = False, say: Say = say_to_stderr) -> str: ...

    def reset(self, topology_path: str | Path | None = None, say: Say = say_to_stderr) -> str: ...

    def status(self) -> dict[str, Any]:
        """What `gpulab status` shows; always with ``exists`` and ``up`` (every part of the cluster running)."""

    def render_status(self, data: dict[str, Any]) -> str:
        """``data`` (from :meth:`status`) as `gpulab status` prints it."""
