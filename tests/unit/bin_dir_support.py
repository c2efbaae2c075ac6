"""A GPULAB_BIN_DIR of fake executables: small shell scripts that print a version like the real ones."""

from __future__ import annotations

import stat
from pathlib import Path

from gpulab import versions
from gpulab.cluster import binaries

# What each real program prints for `--version` (its first line), at the pinned versions.
OUTPUT = {
    "kube-apiserver": f"Kubernetes {versions.KUBERNETES}",
    "kube-controller-manager": f"Kubernetes {versions.KUBERNETES}",
    "kube-scheduler": f"Kubernetes {versions.KUBERNETES}",
    "etcd": f"etcd Version: {versions.ETCD.lstrip('v')}\nGit SHA: Not provided\nGo Version: go1.26.8",
    "kwok": f"kwok version {versions.KWOK} go1.26.8 (linux/amd64)",
    # metrics-server prints client-go's gitVersion, as its Makefile stamps it, and nothing else.
    "metrics-server": versions.METRICS_SERVER,
}


def fake_binary(path: Path, output: str, exit_code: int = 0, mode: int = stat.S_IRWXU) -> Path:
    """A shell script at ``path`` answering `--version` with ``output`` (and exit code)."""
    path.write_text(f"#!/bin/sh\ncat <<'OUT'\n{output}\nOUT\nexit {exit_code}\n")
    path.chmod(mode)
    return path


def make_bin_dir(root: Path, skip: tuple[str, ...] = (), **outputs: str) -> Path:
    """Every binary and CRD of a GPULAB_BIN_DIR; ``kube_scheduler="Kubernetes v1.36.0"`` overrides one."""
    root.mkdir(parents=True, exist_ok=True)
    for name in binaries.REQUIRED:
        if name not in skip:
            fake_binary(root / name, outputs.get(name.replace("-", "_"), OUTPUT[name]))
    (root / "kwok-crds").mkdir(exist_ok=True)
    for crd in binaries.KWOK_CRDS:
        if f"kwok-crds/{crd}" not in skip:
            (root / "kwok-crds" / crd).write_text("apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n")
    return root
