"""Which backend runs "the cluster", chosen once and remembered in ``GPULAB_HOME``.

``gpulab up --backend kind|embedded`` writes the choice to ``$GPULAB_HOME/backend``;
every later command, notebook, lab and check gets the cluster (and its
kubeconfig) from :func:`current` / :func:`kubeconfig`, so none of them
assumes a backend. Without a remembered choice the backend is ``embedded``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .. import paths
from ..kube.statedir import StateDir
from .base import Cluster

BACKENDS = ("embedded", "kind")
DEFAULT = "embedded"
#: What kubectl says when nothing answers at its kubeconfig's server: a stopped cluster (or an address from before
#: the cluster last started). Lessons and labs follow it with what to run (gpulab.notebook.shell, grading.labkit).
UNREACHABLE = re.compile(r"The connection to the server \S+ was refused|dial tcp \S+: connect: connection refused"
                         r"|Unable to connect to the server")
#: What the official Python client (urllib3 under it) says in the same case.
CLIENT_UNREACHABLE = re.compile(r"Connection refused|Failed to establish a new connection")


class BackendError(ValueError):
    """An unknown backend name (in a flag or in the remembered file)."""


def _choice_file() -> Path:
    return paths.home() / "backend"


def _check(name: str, where: str) -> str:
    if name not in BACKENDS:
        raise BackendError(f"{where}: unknown backend {name!r}; allowed: {', '.join(BACKENDS)}")
    return name


def chosen() -> str:
    """The remembered backend, or ``embedded`` when none was chosen yet."""
    try:
        text = _choice_file().read_text().strip()
    except FileNotFoundError:
        return DEFAULT
    return _check(text, str(_choice_file())) if text else DEFAULT


def choose(name: str) -> str:
    """Remember ``name`` as this GPULAB_HOME's backend."""
    _check(name, "--backend")
    path = _choice_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(name + "\n")
    os.replace(tmp, path)
    return name


def forget() -> None:
    _choice_file().unlink(missing_ok=True)


def current(name: str | None = None) -> Cluster:
    """The cluster object of ``name`` (default: the chosen backend)."""
    name = _check(name, "backend") if name else chosen()
    # Only the chosen backend's module is loaded (the embedded one brings the pod runtime along).
    if name == "kind":
        from .kind import KindCluster

        return KindCluster()
    from .embedded import EmbeddedCluster

    return EmbeddedCluster()


def state_dir(name: str | None = None) -> Path:
    """Where the cluster of ``name`` (default: the chosen backend) keeps its state, without loading the backend
    (a lab kernel needs only the kubeconfig)."""
    name = _check(name, "backend") if name else chosen()
    return paths.kind_dir() if name == "kind" else paths.cluster_dir()


def kubeconfig() -> Path:
    """The admin kubeconfig of the chosen backend's cluster (it may not exist yet)."""
    return StateDir(state_dir()).kubeconfig


def unreachable_note(first_cell: str, who: str = "kubectl") -> str:
    """What a learner runs when ``who`` (kubectl, the Python client) cannot reach the cluster.

    ``first_cell`` names the notebook's cell that starts the cluster (a lesson's ``setup()``, a lab's
    ``begin(...)``). Lessons and labs are read in Chinese, so the note is too.
    """
    try:
        up = current().is_up()
    except BackendError:
        up = False
    if up:  # the cluster started again on another port since the notebook wrote its kubeconfig
        return f"gpulab：集群在运行，但 {who} 还在连集群上次启动时的地址。重新运行{first_cell}，再运行这一格。"
    return (f"gpulab：{who} 连不上集群，因为集群没有在运行。重新运行{first_cell}（它会启动集群并显示进度），"
            "或者在终端里运行 `gpulab up`；然后再运行这一格。")


def explain_client_errors(first_cell: str) -> None:
    """In a notebook's kernel: the official client's "connection refused" traceback ends with what to run.

    The note is added to the exception (PEP 678), so IPython shows it under the traceback; the cell still fails.
    Outside IPython (a script, the grader's checks) nothing changes.
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return
    import urllib3

    def handler(shell, etype, value, tb, tb_offset=None):
        if CLIENT_UNREACHABLE.search(str(value)) and not getattr(value, "__notes__", None):
            value.add_note(f"⚠ {unreachable_note(first_cell, who='Python 客户端')}")
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        return None

    shell.set_custom_exc((urllib3.exceptions.MaxRetryError,), handler)
