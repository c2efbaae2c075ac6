"""The names every layer agrees on: namespaces, annotations, the storage provisioner.

One module owns each shared name so that the component that writes it and the
ones that read it cannot drift apart.
"""

from __future__ import annotations

import ipaddress

# Where NVIDIA's GPU Operator and its operands (device plugin, GFD, MIG manager,
# DCGM exporter, validator) run, on the embedded backend as on kind.
OPERATOR_NAMESPACE = "gpu-operator"

# The monitoring add-on (manifests/addons/monitoring/): its name, and the namespace its Prometheus,
# kube-state-metrics and prometheus-adapter run in.
MONITORING = "monitoring"
MONITORING_NAMESPACE = "monitoring"

# Nodes that gpulab simulates carry this annotation: KWOK keeps them alive
# (heartbeats, leases) and the node agent runs their pods.
NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")

# The default StorageClass and the local-path provisioner behind it (the node agent's).
STORAGE_CLASS = "standard"
PROVISIONER = "gpulab.io/local-path"

# The embedded control plane's address ranges (kube-controller-manager's node IPAM
# hands each node a /24 of POD_CIDR, in order: 10.244.0.0/24, 10.244.1.0/24, …, as kind's 10.244.0.0/16 does;
# a /14 has room for 1024 nodes, as GKE's default pod range; Services get ClusterIPs from SERVICE_CIDR).
POD_CIDR = "10.244.0.0/14"
SERVICE_CIDR = "10.96.0.0/16"
# The `kubernetes` Service (the first address of SERVICE_CIDR) and cluster DNS (`kube-dns`, CoreDNS),
# which every pod's resolv.conf names, as kubeadm and kind place them.
KUBERNETES_SERVICE_IP = "10.96.0.1"
CLUSTER_DNS_IP = "10.96.0.10"
CLUSTER_DOMAIN = "cluster.local"
# Where the apiserver is advertised inside the pod network (the `kubernetes` Service's endpoint):
# an address of the cluster's network namespace, relayed to the apiserver on the host's 127.0.0.1.
API_ADDRESS = "10.255.0.1"
# The nodes' own addresses (each node's InternalIP, a hostNetwork pod's IP) where there is a pod network:
# addresses of the cluster's network namespace, which stands for the nodes' host network, as a node's
# address is on its own machine. Node i of the topology gets NODE_CIDR's address i + 2 (as kind numbers
# its nodes). Without a pod network (GPULAB_SANDBOX=process) every node is at 127.0.0.1.
NODE_CIDR = "10.240.0.0/16"
LOOPBACK_NODE_ADDRESS = "127.0.0.1"


def node_address(index: int) -> str:
    """The InternalIP of the topology's node number ``index`` (from 0) on a cluster with a pod network."""
    net = ipaddress.ip_network(NODE_CIDR)
    if not 0 <= index < net.num_addresses - 3:
        raise ValueError(f"node index {index} is outside {NODE_CIDR} (0 to {net.num_addresses - 4})")
    return str(net[index + 2])

# The GPU Operator's ClusterPolicy (cluster-scoped; one per cluster, as the operator's Helm chart names it).
CLUSTER_POLICY = "cluster-policy"

# Node labels of NVIDIA's stack that lessons and labs set: the device-plugin config a node
# uses (time-slicing, MPS), the MIG layout the MIG manager applies, and its answer.
DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_CONFIG_STATE_LABEL = "nvidia.com/mig.config.state"

# The node agent's record, on a pod, of the devices it was allocated.
ALLOCATED_DEVICES_ANNOTATION = "gpulab.io/allocated-devices"

# On an embedded DCGM exporter's pod: the URL of its /metrics on the host (what `gpulab metrics` scrapes).
METRICS_ANNOTATION = "gpulab.io/metrics-endpoint"

# The GPU Operator as a component: the source of its Events, its field manager, the
# app.kubernetes.io/managed-by of what it creates.
OPERATOR_COMPONENT = "gpu-operator"
