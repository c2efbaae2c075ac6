"""What the kubelet writes into every pod: ``/etc/resolv.conf``, ``/etc/hosts``, ``/etc/hostname``.

The same files, in the same words, as the kubelet's (``pkg/kubelet/network/dns``
and ``kubelet_pods.go``): a pod with ``dnsPolicy: ClusterFirst`` (the default)
asks cluster DNS (the ``kube-dns`` Service, CoreDNS) with the search path
``<ns>.svc.cluster.local svc.cluster.local cluster.local`` and ``ndots:5``;
``/etc/hosts`` names the pod itself (``<hostname>.<subdomain>.<ns>.svc.cluster.local``
when it has a subdomain, as the pods of an Indexed Job behind a headless Service
do) and its ``hostAliases``. The host's own search domains and nameservers
are left out: a pod's network has no way to the host's resolver.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..kube.names import CLUSTER_DNS_IP, CLUSTER_DOMAIN
from .sandbox import Mount

HOSTS_HEADER = """# Kubernetes-managed hosts file.
127.0.0.1\tlocalhost
::1\tlocalhost ip6-localhost ip6-loopback
fe00::0\tip6-localnet
fe00::0\tip6-mcastprefix
fe00::1\tip6-allnodes
fe00::2\tip6-allrouters
"""
MAX_SEARCHES = 32
HOST_RESOLV = Path("/etc/resolv.conf")


def hostname(pod: dict[str, Any]) -> str:
    """The pod's hostname: ``spec.hostname``, else its name, cut to 63 bytes as the kubelet cuts it."""
    spec = pod.get("spec") or {}
    name = spec.get("hostname") or pod["metadata"]["name"]
    return name[:63].rstrip("-.")


def fqdn(pod: dict[str, Any]) -> str | None:
    """``<hostname>.<subdomain>.<ns>.svc.<domain>`` for a pod with a subdomain, else None."""
    subdomain = (pod.get("spec") or {}).get("subdomain")
    if not subdomain:
        return None
    return f"{hostname(pod)}.{subdomain}.{pod['metadata']['namespace']}.svc.{CLUSTER_DOMAIN}"


def _host_resolv() -> tuple[list[str], list[str], list[str]]:
    """Nameservers, searches and options of the host's resolv.conf (``dnsPolicy: Default``)."""
    servers: list[str] = []
    searches: list[str] = []
    options: list[str] = []
    try:
        lines = HOST_RESOLV.read_text().splitlines()
    except OSError:
        return servers, searches, options
    for line in lines:
        fields = line.split("#")[0].split()
        if not fields:
            continue
        if fields[0] == "nameserver" and len(fields) > 1:
            servers.append(fields[1])
        elif fields[0] in ("search", "domain"):
            searches = fields[1:]
        elif fields[0] == "options":
            options += fields[1:]
    return servers, searches, options


def resolv_conf(pod: dict[str, Any]) -> str:
    """The pod's resolv.conf by its ``dnsPolicy`` and ``dnsConfig``."""
    spec = pod.get("spec") or {}
    policy = spec.get("dnsPolicy") or "ClusterFirst"
    ns = pod["metadata"]["namespace"]
    if policy == "ClusterFirst" and spec.get("hostNetwork"):
        policy = "Default"  # the kubelet: ClusterFirst on the host network falls back to Default
    if policy in ("ClusterFirst", "ClusterFirstWithHostNet"):
        servers = [CLUSTER_DNS_IP]
        searches = [f"{ns}.svc.{CLUSTER_DOMAIN}", f"svc.{CLUSTER_DOMAIN}", CLUSTER_DOMAIN]
        options = ["ndots:5"]
    elif policy == "Default":
        servers, searches, options = _host_resolv()
    else:  # None: dnsConfig alone
        servers, searches, options = [], [], []
    config = spec.get("dnsConfig") or {}
    servers += [s for s in config.get("nameservers") or [] if s not in servers]
    searches += [s for s in config.get("searches") or [] if s not in searches]
    by_name = {o.split(":")[0]: o for o in options}
    for opt in config.get("options") or []:
        name = opt.get("name", "")
        by_name[name] = f"{name}:{opt['value']}" if opt.get("value") is not None else name
    lines = []
    if searches:
        lines.append("search " + " ".join(searches[:MAX_SEARCHES]))
    lines += [f"nameserver {s}" for s in servers]
    if by_name:
        lines.append("options " + " ".join(by_name.values()))
    return "\n".join(lines) + "\n"


def hosts_file(pod: dict[str, Any], ip: str | None) -> str:
    """The kubelet's managed /etc/hosts for a pod at ``ip``."""
    text = HOSTS_HEADER
    if ip:
        name = hostname(pod)
        full = fqdn(pod)
        text += f"{ip}\t{full}\t{name}\n" if full else f"{ip}\t{name}\n"
    aliases = (pod.get("spec") or {}).get("hostAliases") or []
    if aliases:
        text += "\n# Entries added by HostAliases.\n"
        for alias in aliases:
            text += f"{alias.get('ip', '')}\t" + "\t".join(alias.get("hostnames") or []) + "\n"
    return text


def write(pod: dict[str, Any], ip: str | None, pod_dir: Path) -> list[Mount]:
    """Write the pod's three files into ``pod_dir/etc`` and return their mounts for each container."""
    etc = pod_dir / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    files = {"resolv.conf": resolv_conf(pod), "hosts": hosts_file(pod, ip), "hostname": hostname(pod) + "\n"}
    if (pod.get("spec") or {}).get("hostNetwork"):
        files.pop("hosts")  # the kubelet leaves the node's own /etc/hosts to host-network pods
    mounts = []
    for name, text in files.items():
        path = etc / name
        path.write_text(text)
        path.chmod(0o644)
        mounts.append(Mount(str(path), f"/etc/{name}", read_only=False))
    return mounts
