"""The data plane is real: pods talk over the CNI plugins' network, Services go through kube-proxy,
names through CoreDNS, and probes dial the container."""

from __future__ import annotations

import pytest

from helpers import NEEDS_POD_NETWORK, create, pod_finished, pod_ready, port_forward, wait_for

pytestmark = [pytest.mark.cluster, NEEDS_POD_NETWORK]

PYTHON = "python:3.11"


def pod(name: str, command: list[str], node: str | None = None, restart: str = "Never", **spec) -> dict:
    body: dict = {"restartPolicy": restart,
                  "containers": [{"name": "main", "image": PYTHON, "command": command, **spec.pop("container", {})}],
                  **spec}
    if node:
        body["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}}, "spec": body}


def server(name: str, port: int, node: str | None = None, reply: str = "hello") -> dict:
    """A pod serving HTTP on ``port`` that answers ``<reply> from <its hostname>``."""
    code = ("import http.server, socket\n"
            "class H(http.server.BaseHTTPRequestHandler):\n"
            "    def do_GET(self):\n"
            f"        body = ('{reply} from ' + socket.gethostname()).encode()\n"
            "        self.send_response(200); self.send_header('Content-Length', str(len(body)))\n"
            "        self.end_headers(); self.wfile.write(body)\n"
            "    def log_message(self, *a): pass\n"
            f"http.server.ThreadingHTTPServer(('', {port}), H).serve_forever()\n")
    return pod(name, ["python3", "-c", code], node, restart="Always",
               container={"ports": [{"containerPort": port}],
                          "readinessProbe": {"httpGet": {"path": "/", "port": port}, "periodSeconds": 1}})


def fetch(url: str, tries: int = 10) -> list[str]:
    """A client's command: GET ``url`` (retrying while a Service's rules are being programmed), print the body."""
    code = ("import sys, time, urllib.request\n"
            f"for i in range({tries}):\n"
            "    try:\n"
            f"        print(urllib.request.urlopen({url!r}, timeout=3).read().decode()); sys.exit(0)\n"
            "    except Exception as e:\n"
            "        err = e; time.sleep(1)\n"
            "print('failed:', err); sys.exit(1)\n")
    return ["python3", "-c", code]


def logs(kubectl, ns, name) -> str:
    return kubectl("-n", ns, "logs", name).stdout


def test_pods_on_different_nodes_reach_each_other_by_pod_ip(kube, kubectl, ns):
    create(kube, ns, server("srv", 8080, node="cpu-node-1"))
    srv = wait_for(lambda: pod_ready(kube, ns, "srv"), 60, what="server Ready")
    ip = srv["status"]["podIP"]
    assert srv["status"]["podIPs"] == [{"ip": ip}]
    create(kube, ns, pod("cli", fetch(f"http://{ip}:8080/"), node="cpu-node-2"))
    done = wait_for(lambda: pod_finished(kube, ns, "cli"), 60, what="client finished")
    assert done["status"]["phase"] == "Succeeded", logs(kubectl, ns, "cli")
    assert logs(kubectl, ns, "cli").strip() == "hello from srv"
    # Each node hands out its own podCIDR, as node IPAM gave it.
    nodes = {n["metadata"]["name"]: n["spec"]["podCIDR"] for n in kube.list("Node")}
    assert ip.rsplit(".", 1)[0] == nodes["cpu-node-1"].rsplit(".", 1)[0]
    assert done["status"]["podIP"].rsplit(".", 1)[0] == nodes["cpu-node-2"].rsplit(".", 1)[0]


def test_a_service_balances_over_its_ready_endpoints_by_dns_name(kube, kubectl, ns):
    _two_servers_behind(kube, ns, {})
    # Many requests through the ClusterIP, by the Service's short name (the search path), reach both replicas.
    create(kube, ns, pod("cli", _answers("http://web/", 40, endpoints=2)))
    wait_for(lambda: pod_finished(kube, ns, "cli"), 120, what="client finished")
    endpoints, answered = map(int, logs(kubectl, ns, "cli").split())
    assert endpoints == 2 and answered >= 40, (endpoints, answered)


def test_a_pods_resolv_conf_is_the_kubelets_and_cluster_dns_answers(kube, kubectl, ns):
    code = ("import socket\n"
            "print(open('/etc/resolv.conf').read().strip())\n"
            "print(socket.gethostbyname('kubernetes.default'))\n"
            "print(socket.gethostbyname('kube-dns.kube-system.svc.cluster.local'))\n")
    create(kube, ns, pod("dns", ["python3", "-c", code]))
    done = wait_for(lambda: pod_finished(kube, ns, "dns"), 60, what="pod finished")
    out = logs(kubectl, ns, "dns").splitlines()
    assert done["status"]["phase"] == "Succeeded", out
    assert out[0] == f"search {ns}.svc.cluster.local svc.cluster.local cluster.local"
    assert out[1:3] == ["nameserver 10.96.0.10", "options ndots:5"]
    assert out[3:] == ["10.96.0.1", "10.96.0.10"]


def test_pods_of_an_indexed_job_find_each_other_through_a_headless_service(kube, kubectl, ns):
    create(kube, ns, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "workers"},
                      "spec": {"clusterIP": "None", "selector": {"job-name": "ring"},
                               "ports": [{"port": 29500}]}})
    code = ("import os, socket, sys, time\n"
            "rank = int(os.environ['JOB_COMPLETION_INDEX'])\n"
            "if rank == 0:\n"
            "    s = socket.socket(); s.bind(('', 29500)); s.listen()\n"
            "    c, _ = s.accept(); print('rank 0 got', c.recv(100).decode())\n"
            "else:\n"
            # Rank 1 may ask before rank 0 is Ready: CoreDNS then answers NXDOMAIN and caches that answer
            # for the Corefile's `ttl 30`, as on any kubeadm cluster. Launchers wait minutes for rank 0.
            "    deadline = time.monotonic() + 100\n"
            "    while True:\n"
            "        try:\n"
            f"            c = socket.create_connection(('ring-0.workers.{ns}.svc.cluster.local', 29500), timeout=2)\n"
            "            c.sendall(b'hello from rank 1'); print('sent'); break\n"
            "        except OSError as e:\n"
            "            if time.monotonic() > deadline: sys.exit(f'rank 0 unreachable: {e}')\n"
            "            time.sleep(0.5)\n")
    create(kube, ns, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "ring"},
                      "spec": {"completions": 2, "parallelism": 2, "completionMode": "Indexed", "backoffLimit": 0,
                               "template": {"spec": {"subdomain": "workers", "restartPolicy": "Never",
                                                     "containers": [{"name": "main", "image": PYTHON,
                                                                     "command": ["python3", "-c", code]}]}}}})
    job = wait_for(lambda: (j := kube.get("Job", "ring", ns)) and (j["status"].get("succeeded") == 2
                                                                 or j["status"].get("failed")) and j,
                   150, what="the Job finished")
    pods = kube.list("Pod", ns, label_selector="job-name=ring")
    assert job["status"].get("succeeded") == 2, (job["status"], {
        p["metadata"]["name"]: logs(kubectl, ns, p["metadata"]["name"])[-500:] for p in pods})
    rank0 = next(p for p in pods if p["metadata"]["annotations"].get("batch.kubernetes.io/job-completion-index") == "0")
    assert logs(kubectl, ns, rank0["metadata"]["name"]).strip() == "rank 0 got hello from rank 1"


def test_a_readiness_probe_dials_the_container_and_says_what_it_met(kube, ns):
    # The process runs but listens on nothing: an httpGet probe is refused and the pod is never Ready.
    create(kube, ns, pod("deaf", ["sleep", "300"], restart="Always",
                         container={"readinessProbe": {"httpGet": {"path": "/health", "port": 8000},
                                                       "periodSeconds": 1}}))
    p = wait_for(lambda: (p := kube.get("Pod", "deaf", ns)) and p["status"].get("podIP") and p, 60, what="pod IP")
    ip = p["status"]["podIP"]

    def refused():
        for e in kube.list("Event", ns, field_selector="involvedObject.name=deaf"):
            if e["reason"] == "Unhealthy":
                return e
        return None

    event = wait_for(refused, 30, what="an Unhealthy event")
    assert event["message"] == (f'Readiness probe failed: Get "http://{ip}:8000/health": '
                                f"dial tcp {ip}:8000: connect: connection refused")
    conds = {c["type"]: c["status"] for c in kube.get("Pod", "deaf", ns)["status"]["conditions"]}
    assert conds["Ready"] == "False"


def test_a_pod_reaches_the_apiserver_only_through_the_kubernetes_service(kube, kubectl, ns, cluster):
    api_port = cluster.state()["ports"]["apiserver"]
    code = ("import socket, ssl\n"
            "def dial(host, port):\n"
            "    try: socket.create_connection((host, port), timeout=2).close(); return 'open'\n"
            "    except OSError as e: return type(e).__name__\n"
            f"print(dial('10.96.0.1', 443), dial('127.0.0.1', {api_port}), dial('127.0.0.1', 22))\n")
    create(kube, ns, pod("probe", ["python3", "-c", code]))
    wait_for(lambda: pod_finished(kube, ns, "probe"), 60, what="pod finished")
    service, loopback_api, loopback_ssh = logs(kubectl, ns, "probe").split()
    assert service == "open"
    assert loopback_api == "ConnectionRefusedError" and loopback_ssh == "ConnectionRefusedError"


def test_kubectl_exec_runs_in_the_pods_network_with_its_dns(kube, kubectl, ns):
    # (Named apart from the Service: a pod's /etc/hosts names the pod itself, as the kubelet writes it.)
    create(kube, ns, server("srv", 8080))
    create(kube, ns, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                      "spec": {"selector": {"app": "srv"}, "ports": [{"port": 80, "targetPort": 8080}]}})
    wait_for(lambda: pod_ready(kube, ns, "srv"), 60, what="server Ready")
    code = ("import socket, time, urllib.request\n"
            "print(socket.gethostname(), open('/etc/resolv.conf').read().split()[1])\n"
            "for i in range(10):\n"
            "    try: print(urllib.request.urlopen('http://web/', timeout=3).read().decode()); break\n"
            "    except Exception as e: print(repr(e)); time.sleep(1)\n")
    out = kubectl("-n", ns, "exec", "srv", "--", "python3", "-c", code).stdout.splitlines()
    # (Refused until kube-proxy has the endpoint: a Service without endpoints rejects connections.)
    assert (out[0], out[-1]) == (f"srv {ns}.svc.cluster.local", "hello from srv"), out


def test_kubectl_port_forward_reaches_a_pod_and_a_service(kube, kubectl, ns, cluster):
    create(kube, ns, server("web", 8080))
    create(kube, ns, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                      "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}})
    wait_for(lambda: pod_ready(kube, ns, "web"), 60, what="server Ready")
    for target, remote in (("pod/web", "8080"), ("svc/web", "80")):
        assert port_forward(cluster, ns, target, remote) == "hello from web", target


def _two_servers_behind(kube, ns, service: dict) -> None:
    create(kube, ns, {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                      "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                               "template": {"metadata": {"labels": {"app": "web"}},
                                            "spec": server("x", 8080)["spec"]}}})
    create(kube, ns, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                      "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}], **service}})
    wait_for(lambda: (d := kube.get("Deployment", "web", ns)) and d["status"].get("readyReplicas") == 2, 90,
             what="2 replicas Ready")


def _answers(url: str, count: int, endpoints: int = 1) -> list[str]:
    """A client's command: GET ``url`` until at least ``count`` answers came from at least ``endpoints``
    replicas, or 60 s passed; print how many replicas answered and how many answers came.

    Ready replicas are in the EndpointSlice at once, but kube-proxy programs them on its own schedule (under
    load, seconds later), so a client asks until a deadline rather than a fixed number of times."""
    code = ("import collections, time, urllib.request\n"
            "seen = collections.Counter()\n"
            "deadline = time.monotonic() + 60\n"
            f"while time.monotonic() < deadline and (sum(seen.values()) < {count} or len(seen) < {endpoints}):\n"
            f"    try: seen[urllib.request.urlopen({url!r}, timeout=3).read().decode()] += 1\n"
            "    except Exception: time.sleep(0.5)\n"
            "print(len(seen), sum(seen.values()))\n")
    return ["python3", "-c", code]


def test_session_affinity_keeps_a_client_on_one_endpoint(kube, kubectl, ns):
    _two_servers_behind(kube, ns, {"sessionAffinity": "ClientIP"})
    # First see that kube-proxy has programmed both replicas (through a Service without affinity over the
    # same pods), so that one endpoint answering below is the affinity, not a rule still being written.
    create(kube, ns, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web-any"},
                      "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}})
    create(kube, ns, pod("any", _answers("http://web-any/", 10, endpoints=2)))
    wait_for(lambda: pod_finished(kube, ns, "any"), 120, what="client finished")
    assert logs(kubectl, ns, "any").split()[0] == "2"
    create(kube, ns, pod("cli", _answers("http://web/", 20)))
    wait_for(lambda: pod_finished(kube, ns, "cli"), 90, what="client finished")
    endpoints, answered = map(int, logs(kubectl, ns, "cli").split())
    assert (endpoints, answered) == (1, 20)


def test_a_nodeport_answers_on_the_nodes_addresses(kube, kubectl, ns):
    _two_servers_behind(kube, ns, {"type": "NodePort"})
    node_port = kube.get("Service", "web", ns)["spec"]["ports"][0]["nodePort"]
    # Another node's InternalIP, as `kubectl get nodes -o wide` shows it, and its bridge's gateway.
    node = kube.get("Node", "cpu-node-2")
    internal = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
    assert internal.startswith("10.240.0.")
    gateway = node["spec"]["podCIDR"].rsplit(".", 1)[0] + ".1"
    for name, address in (("cli", internal), ("cli-gw", gateway)):
        create(kube, ns, pod(name, _answers(f"http://{address}:{node_port}/", 10), node="cpu-node-1"))
    for name in ("cli", "cli-gw"):
        done = wait_for(lambda: pod_finished(kube, ns, name), 90, what=f"{name} finished")
        assert done["status"]["phase"] == "Succeeded", logs(kubectl, ns, name)
        endpoints, answered = map(int, logs(kubectl, ns, name).split())
        assert answered == 10 and endpoints in (1, 2)


def test_a_host_network_pod_is_at_its_nodes_address_and_a_host_port_answers_there(kube, kubectl, ns):
    node = kube.get("Node", "cpu-node-1")
    internal = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
    create(kube, ns, pod("hn", ["sleep", "600"], node="cpu-node-1", hostNetwork=True))
    web = server("hp", 8080, node="cpu-node-1")
    web["spec"]["containers"][0]["ports"] = [{"containerPort": 8080, "hostPort": 18080}]
    create(kube, ns, web)
    hn = wait_for(lambda: pod_ready(kube, ns, "hn"), 60, what="the hostNetwork pod ready")
    assert hn["status"]["podIP"] == hn["status"]["hostIP"] == internal
    hp = wait_for(lambda: pod_ready(kube, ns, "hp"), 60, what="the hostPort pod ready")
    assert hp["status"]["hostIP"] == internal and hp["status"]["podIP"] != internal
    # From a pod on another node, to the node's address and the hostPort (the portmap plugin's DNAT).
    create(kube, ns, pod("cli", fetch(f"http://{internal}:18080/"), node="cpu-node-2"))
    done = wait_for(lambda: pod_finished(kube, ns, "cli"), 60, what="client finished")
    assert done["status"]["phase"] == "Succeeded" and logs(kubectl, ns, "cli").startswith("hello from hp")
