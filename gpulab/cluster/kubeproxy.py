"""kube-proxy as a component of the embedded cluster: Services through the real proxy, in nftables mode.

One kube-proxy serves the pod network (:mod:`gpulab.runtime.network`): the
nodes share one network namespace, which stands for their host network, so
the rules one proxy programs there are every node's. It runs inside that
namespace (``nsenter`` into the holder's user and network namespaces) and
talks to the apiserver through the namespace's relay.

Why nftables: it is kube-proxy's current mode (GA since 1.33) and needs
nothing but the ``nft`` program (Debian's ``nftables`` package, in apt.txt):
no legacy iptables tables and no kernel module a user namespace could not
load. Two settings differ from a node's defaults, for reasons of this
network: ``masqueradeAll`` (a client and the endpoint it is sent to can hang
off the same bridge; without br_netfilter their replies would bypass the
NAT), and ``conntrack`` sizes left alone (``0``: the kernel's conntrack table
is global, and a user namespace may not resize it).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from ..i18n import _
from ..kube.names import POD_CIDR
from ..runtime import network

HEALTHZ_PORT = 10256
METRICS_PORT = 10249


def nft_missing() -> str | None:
    """Why kube-proxy cannot run here, or None: it needs ``nft`` (``apt-get install nftables``)."""
    if shutil.which("nft", path=network.TOOL_PATH):
        return None
    return _("kube-proxy (nftables mode) needs the `nft` program: install Debian's nftables package "
             "(sudo apt-get install -y nftables; it is in apt.txt)")


def config(cluster_dir: Path, node: str) -> Path:
    """Write kube-proxy's KubeProxyConfiguration; returns its path."""
    path = cluster_dir / "kube-proxy.yaml"
    path.write_text(yaml.safe_dump({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(cluster_dir / "kubeconfigs" / "kube-proxy.yaml")},
        "mode": "nftables",
        # The node whose Node object kube-proxy reads (its addresses, podCIDR); every node shares its rules.
        "hostnameOverride": node,
        "clusterCIDR": POD_CIDR,
        "detectLocalMode": "ClusterCIDR",
        "nftables": {"masqueradeAll": True},
        # NodePorts on every address of the nodes' network (the bridges' gateways, 10.244.<n>.1).
        "nodePortAddresses": ["0.0.0.0/0"],
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s",
                      "udpTimeout": "0s", "udpStreamTimeout": "0s"},
        "healthzBindAddress": f"127.0.0.1:{HEALTHZ_PORT}",
        "metricsBindAddress": f"127.0.0.1:{METRICS_PORT}",
    }, sort_keys=False))
    return path


def argv(binary: Path, holder: int, config_path: Path) -> list[str]:
    return network.enter_argv(holder) + [str(binary), f"--config={config_path}", "--v=0"]


def ready(cluster_dir: Path) -> bool:
    """kube-proxy answers /healthz with 200 inside the pod network (it has synced its rules once)."""
    net = network.ClusterNetwork(cluster_dir)
    try:
        sock = net.dial("127.0.0.1", HEALTHZ_PORT, 1.0)
    except (network.DialError, network.NetworkError):
        return False
    with sock:
        sock.settimeout(2.0)
        try:
            sock.sendall(b"GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n")
            head = sock.recv(64)
        except OSError:
            return False
    return head.startswith(b"HTTP/1.") and b" 200 " in head[:16]
