"""kube-apiserver reaches pods and Services through its egress selector (``network.EgressProxy``).

The apiserver is a host process and the pod network gpulab's own namespace. With
``--egress-selector-config-file`` (egress ``cluster``: HTTP CONNECT over the node agent's unix socket)
whatever it dials in the cluster goes through the node agent: ``pods/proxy`` and ``services/proxy`` into the
pod network, and on the host's loopback KWOK's kubelet API (logs, exec) and the aggregated APIs behind
``localhost`` ExternalName Services (metrics-server).
"""

from __future__ import annotations

import json

import pytest

from gpulab.runtime import network
from helpers import NEEDS_POD_NETWORK, create, pod_ready, wait_for

pytestmark = [pytest.mark.cluster, NEEDS_POD_NETWORK]

AGNHOST = "registry.k8s.io/e2e-test-images/agnhost:2.53"


def pod(name: str, image: str, port: int, labels: dict | None = None, **container) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {"app": name}},
            "spec": {"containers": [{"name": "main", "image": image, **container,
                                     "ports": [{"containerPort": port, "name": "http"}],
                                     "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 1}}]}}


def service(name: str, selector: dict, port: int, target: int | str) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"selector": selector, "ports": [{"name": "http", "port": port, "targetPort": target}]}}


def raw(kubectl, path: str, check: bool = True):
    return kubectl("get", "--raw", path, check=check)


def test_the_apiserver_runs_with_the_egress_through_the_node_agent(cluster):
    config = cluster.root / "egress-selector.yaml"
    uds = network.ClusterNetwork(cluster.root).dir / network.EGRESS_SOCKET
    assert f"udsName: {json.dumps(str(uds))}" in config.read_text()
    assert uds.is_socket() and (uds.stat().st_mode & 0o777) == 0o600


def test_pods_proxy_reaches_a_pods_http_server(kube, kubectl, ns):
    create(kube, ns, pod("netexec", AGNHOST, 8080, args=["netexec", "--http-port=8080"]))
    wait_for(lambda: pod_ready(kube, ns, "netexec"), 60, what="agnhost netexec Ready")
    base = f"/api/v1/namespaces/{ns}/pods/netexec:8080/proxy"
    assert raw(kubectl, f"{base}/hostname").stdout == "netexec"
    assert raw(kubectl, f"{base}/echo?msg=through-the-egress").stdout == "through-the-egress"
    # With the scheme, as the e2e specs write it.
    assert raw(kubectl, f"/api/v1/namespaces/{ns}/pods/http:netexec:8080/proxy/hostname").stdout == "netexec"


def test_services_proxy_reaches_a_service_over_its_endpoints(kube, kubectl, ns):
    create(kube, ns, pod("web", "python:3", 8000, labels={"app": "web"},
                         command=["python3", "-m", "http.server", "8000"]))
    create(kube, ns, service("web", {"app": "web"}, 80, 8000))
    wait_for(lambda: pod_ready(kube, ns, "web"), 60, what="python http.server Ready")
    path = f"/api/v1/namespaces/{ns}/services/web:80/proxy/"
    # (Until the EndpointSlice names the Ready pod the apiserver answers 503: no endpoints.)
    out = wait_for(lambda: (p := raw(kubectl, path, check=False)).returncode == 0 and p.stdout, 30,
                   what="services/web:80/proxy/")
    assert "Directory listing for /" in out
    assert "Directory listing for /" in raw(kubectl, f"/api/v1/namespaces/{ns}/services/http:web:http/proxy/").stdout
    # The request came from the pod network (the node's bridge), and the server logged it.
    assert '"GET / HTTP/1.1" 200' in kubectl("-n", ns, "logs", "web").stdout


def test_porter_serves_tls_with_the_images_certificate(kube, kubectl, ns):
    # agnhost porter opens localhost.crt and localhost.key in its working directory /, as the image has them.
    create(kube, ns, pod("porter", AGNHOST, 443, args=["porter"],
                         env=[{"name": "SERVE_PORT_80", "value": "plain"},
                              {"name": "SERVE_TLS_PORT_443", "value": "over tls"}]))
    wait_for(lambda: pod_ready(kube, ns, "porter"), 60, what="agnhost porter Ready")
    assert raw(kubectl, f"/api/v1/namespaces/{ns}/pods/porter:80/proxy/").stdout == "plain"
    assert raw(kubectl, f"/api/v1/namespaces/{ns}/pods/https:porter:443/proxy/").stdout == "over tls"


def test_a_port_nobody_listens_on_is_a_502_that_says_why(kube, kubectl, ns):
    create(kube, ns, pod("netexec", AGNHOST, 8080, args=["netexec", "--http-port=8080"]))
    ip = wait_for(lambda: pod_ready(kube, ns, "netexec"), 60, what="agnhost netexec Ready")["status"]["podIP"]
    out = raw(kubectl, f"/api/v1/namespaces/{ns}/pods/netexec:9/proxy/", check=False)
    assert out.returncode != 0
    assert (f"code 502: 502 Bad Gateway (dial tcp {ip}:9 (pod network): connect: connection refused)"
            in out.stderr), out.stderr


def test_logs_exec_and_the_aggregated_apis_still_work(kube, kubectl, ns):
    create(kube, ns, pod("netexec", AGNHOST, 8080, args=["netexec", "--http-port=8080"]))
    wait_for(lambda: pod_ready(kube, ns, "netexec"), 60, what="agnhost netexec Ready")
    # KWOK's kubelet API at the node's InternalIP (127.0.0.1), through the egress on the host's side.
    assert "Started HTTP server on port 8080" in kubectl("-n", ns, "logs", "netexec").stdout
    assert kubectl("-n", ns, "exec", "netexec", "--", "hostname").stdout.strip() == "netexec"
    # The aggregator reaches metrics-server behind its `localhost` ExternalName Service the same way.
    nodes = wait_for(lambda: (p := raw(kubectl, "/apis/metrics.k8s.io/v1beta1/nodes", check=False)).returncode == 0
                     and json.loads(p.stdout)["items"], 90, interval=2, what="metrics-server's node metrics")
    assert {n["metadata"]["name"] for n in nodes} == {n["metadata"]["name"] for n in kube.list("Node")}
