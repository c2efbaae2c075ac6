"""The repository's manifests: apply, delete and display the YAML files a lesson names.

Paths are relative to the repository root (``manifests/03-scheduling/...``),
whatever the notebook's working directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from .shell import REPO, Output, sh

__all__ = ["apply", "delete", "show_manifest"]


def _manifest(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    full = p if p.is_absolute() else REPO / p
    if not full.is_file():
        raise FileNotFoundError(f"找不到清单文件 {path}（路径相对于仓库根目录 {REPO}）")
    return full


def _rel(full: Path) -> str:
    try:
        return str(full.relative_to(REPO))
    except ValueError:
        return str(full)


def apply(path: str | os.PathLike[str], *more: str | os.PathLike[str]) -> Output:
    """``kubectl apply -f`` one or more manifest files (paths relative to the repository)."""
    files = " ".join(f"-f {_rel(_manifest(p))}" for p in (path, *more))
    return sh(f"kubectl apply {files}")


def delete(path: str | os.PathLike[str], wait: bool = True) -> Output:
    """``kubectl delete -f`` a manifest file; waits until the objects are gone unless ``wait=False``."""
    return sh(f"kubectl delete -f {_rel(_manifest(path))} --ignore-not-found --wait={'true' if wait else 'false'}")


def show_manifest(path: str | os.PathLike[str]) -> None:
    """Display a manifest file, with its path, as a YAML block."""
    full = _manifest(path)
    text = full.read_text()
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display
    except ImportError:  # pragma: no cover
        get_ipython = None  # type: ignore[assignment]
    if get_ipython is not None and get_ipython() is not None:
        display(Markdown(f"`{_rel(full)}`\n\n```yaml\n{text.rstrip()}\n```"))
    else:
        print(f"# {_rel(full)}\n{text}")
