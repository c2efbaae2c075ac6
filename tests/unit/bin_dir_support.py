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
    "kube-proxy": f"Kubernetes {versions.KUBERNETES}",
    # `coredns -version`: the version glued to the name, then OS/Arch, Go version and commit (unstamped).
    "coredns": f"CoreDNS-{versions.COREDNS.lstrip('v')}\nlinux/amd64, go1.26.8, ",
    # `agnhost --version`: cobra's line for its root command "app", the version its Makefile stamps.
    "agnhost": f"app version {versions.AGNHOST.lstrip('v')}",
    # Prometheus' and kube-state-metrics' version lines (promu's stamp), the first of four.
    "prometheus": f"prometheus, version {versions.PROMETHEUS.lstrip('v')} (branch: HEAD, revision: unknown)",
    "kube-state-metrics": f"kube-state-metrics, version {versions.KUBE_STATE_METRICS} (branch: HEAD, revision: unknown)",
    # prometheus-adapter prints no version: its binary names the module's sources (read, not run).
    "prometheus-adapter": f"sigs.k8s.io/prometheus-adapter@{versions.PROMETHEUS_ADAPTER}/pkg/client/api.go",
    # A CNI plugin run with CNI_COMMAND empty (on stderr).
    **{f"cni/{p}": f"CNI {p} plugin {versions.CNI_PLUGINS}\n"
                   "CNI protocol versions supported: 0.1.0, 0.2.0, 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0"
       for p in binaries.CNI_PLUGINS},
}
# What a CNI plugin says when CNI_COMMAND is set but the rest of its environment is not (exit 1).
CNI_MISSING_ENV = '{"code":4,"msg":"required env variables [CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME,CNI_PATH] missing"}'


def fake_binary(path: Path, output: str, exit_code: int = 0, mode: int = stat.S_IRWXU) -> Path:
    """A shell script at ``path`` answering `--version` with ``output`` (and exit code)."""
    path.write_text(f"#!/bin/sh\ncat <<'OUT'\n{output}\nOUT\nexit {exit_code}\n")
    path.chmod(mode)
    return path


def fake_cni_plugin(path: Path, output: str) -> Path:
    """A CNI plugin: ``output`` on stderr when CNI_COMMAND is empty, else the real plugin's complaint."""
    path.write_text(f"#!/bin/sh\nif [ -n \"$CNI_COMMAND\" ]; then\n  echo '{CNI_MISSING_ENV}'\n  exit 1\nfi\n"
                    f"cat >&2 <<'OUT'\n{output}\nOUT\n")
    path.chmod(stat.S_IRWXU)
    return path


def kwarg(name: str) -> str:
    """The keyword of make_bin_dir that overrides ``name``'s output: kube_scheduler, cni_host_local."""
    return name.replace("-", "_").replace("/", "_")


def make_bin_dir(root: Path, skip: tuple[str, ...] = (), **outputs: str) -> Path:
    """Every binary and CRD of a GPULAB_BIN_DIR; ``kube_scheduler="Kubernetes v1.36.0"`` overrides one."""
    root.mkdir(parents=True, exist_ok=True)
    for name in binaries.REQUIRED:
        if name not in skip:
            (root / name).parent.mkdir(parents=True, exist_ok=True)  # cni/
            fake = fake_cni_plugin if name.startswith(f"{binaries.CNI_DIR}/") else fake_binary
            fake(root / name, outputs.get(kwarg(name), OUTPUT[name]))
    (root / "kwok-crds").mkdir(exist_ok=True)
    for crd in binaries.KWOK_CRDS:
        if f"kwok-crds/{crd}" not in skip:
            (root / "kwok-crds" / crd).write_text("apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n")
    return root
