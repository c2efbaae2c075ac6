"""Kubeconfig files for the embedded cluster's identities."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import yaml

CONTEXT = "gpulab"


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write(path: Path, server: str, ca: Path, cert: Path, key: Path, user: str = "gpulab-admin",
          namespace: str | None = None) -> Path:
    """Write a self-contained kubeconfig (certificates embedded, mode 0600)."""
    ctx: dict[str, str] = {"cluster": CONTEXT, "user": user}
    if namespace:
        ctx["namespace"] = namespace
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": {"server": server,
                                                   "certificate-authority-data": _b64(ca)}}],
        "users": [{"name": user, "user": {"client-certificate-data": _b64(cert),
                                          "client-key-data": _b64(key)}}],
        "contexts": [{"name": CONTEXT, "context": ctx}],
        "current-context": CONTEXT,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    os.replace(tmp, path)
    return path


def server_of(path: Path) -> str | None:
    try:
        doc = yaml.safe_load(path.read_text())
        return doc["clusters"][0]["cluster"]["server"]
    except (OSError, KeyError, IndexError, TypeError, yaml.YAMLError):
        return None
