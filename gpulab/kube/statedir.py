"""The directory in which a backend keeps one cluster's gpulab state.

Both backends keep the same things there: ``state.json`` (topology, ports,
names), the admin ``kubeconfig`` and the cluster CA in ``pki/``. Everything
that reads "the cluster" (CLI, notebooks, grading) relies on this surface.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .topology import Topology
from .topology import load as load_topology


class StateDir:
    """One cluster's state directory; the backends' cluster classes are StateDirs with bring-up on top."""

    root: Path

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    def state(self) -> dict[str, Any]:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    def _save_state(self, state: dict[str, Any]) -> None:
        # Write-then-rename: a reader never sees half a file.
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        os.replace(tmp, self.state_file)

    def exists(self) -> bool:
        """gpulab created this cluster (whether or not it runs now)."""
        return self.state_file.is_file()

    def topology(self) -> Topology:
        return load_topology(self.state().get("topology"))
