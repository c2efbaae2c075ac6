"""Images run their program: nginx serves its welcome page, agnhost its test servers, busybox its shell.

No image is pulled: nginx and busybox are the host's (Debian's nginx-light and busybox), agnhost is
built from the k8s.io/kubernetes module with the control plane (gpulab.runtime.images).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulab.runtime import images
from helpers import NEEDS_POD_NETWORK, create, pod_finished, pod_ready, port_forward, wait_for

pytestmark = [pytest.mark.cluster, NEEDS_POD_NETWORK]

AGNHOST = "registry.k8s.io/e2e-test-images/agnhost:2.53"
# Without Debian's nginx-light or busybox their pods do not start (an event says what to install).
needs_nginx = pytest.mark.skipif(not Path(images.host_program("nginx")).exists(),
                                 reason="needs Debian's nginx-light (sudo apt-get install -y nginx-light)")
needs_busybox = pytest.mark.skipif(not Path(images.host_program("busybox")).exists(),
                                   reason="needs Debian's busybox (sudo apt-get install -y busybox)")
WELCOME = "<h1>Welcome to nginx!</h1>"


def pod(name: str, image: str, restart: str = "Always", **container) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}},
            "spec": {"restartPolicy": restart, "containers": [{"name": "main", "image": image, **container}]}}


def serving(port: int) -> dict:
    return {"ports": [{"containerPort": port}],
            "readinessProbe": {"httpGet": {"path": "/", "port": port}, "periodSeconds": 1}}


def service(name: str, port: int, target: int) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"selector": {"app": name}, "ports": [{"port": port, "targetPort": target}]}}


def events(kube, ns, name) -> list[tuple[str, str]]:
    return [(e.get("reason"), e.get("message", "")) for e in kube.list("Event", ns)
            if (e.get("involvedObject") or {}).get("name") == name]


def client(kube, ns) -> None:
    """A python:3.11 pod to `kubectl exec` requests from."""
    create(kube, ns, pod("client", "python:3.11", command=["sleep", "600"]))
    wait_for(lambda: pod_ready(kube, ns, "client"), 60, what="client Ready")


def get_from_client(kubectl, ns, url: str) -> str:
    code = ("import sys, time, urllib.request\n"
            "for i in range(15):\n"
            "    try:\n"
            f"        print(urllib.request.urlopen({url!r}, timeout=3).read().decode()); sys.exit(0)\n"
            "    except Exception as e:\n"
            "        err = e; time.sleep(1)\n"
            "print('failed:', err); sys.exit(1)\n")
    return kubectl("-n", ns, "exec", "client", "--", "python3", "-c", code).stdout


@needs_nginx
def test_nginx_serves_its_welcome_page_behind_a_service_and_through_port_forward(kube, kubectl, ns, cluster):
    # `kubectl run web --image=nginx --port=80` and `kubectl expose pod web --port=80`, as objects.
    create(kube, ns, pod("web", "nginx:1.27", **serving(80)))
    create(kube, ns, service("web", 80, 80))
    client(kube, ns)
    wait_for(lambda: pod_ready(kube, ns, "web"), 60, what="nginx Ready")
    assert WELCOME in get_from_client(kubectl, ns, "http://web/")
    assert WELCOME in get_from_client(kubectl, ns, f"http://web.{ns}.svc.cluster.local/index.html")
    assert WELCOME in port_forward(cluster, ns, "pod/web", 80)
    assert WELCOME in port_forward(cluster, ns, "svc/web", 80)
    # Its access log is the container's output, as the official image's (the FIFO its entrypoint copies).
    log = wait_for(lambda: (out := kubectl("-n", ns, "logs", "web").stdout).count('"GET / HTTP/1.1" 200') >= 2
                   and out, 20, what="nginx's access log in kubectl logs")
    assert '"GET /index.html HTTP/1.1" 200' in log
    # Not a simulation: the process is nginx, and an unknown path is its 404.
    missing = kubectl("-n", ns, "exec", "client", "--", "python3", "-c",
                      "import urllib.request, urllib.error\n"
                      "try: urllib.request.urlopen('http://web/nope', timeout=3)\n"
                      "except urllib.error.HTTPError as e: print(e.code, e.headers['Server'])\n").stdout.split()
    assert missing[0] == "404" and missing[1].startswith("nginx/"), missing


@needs_nginx
def test_a_pods_volume_covers_the_nginx_images_html(kube, kubectl, ns):
    create(kube, ns, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "site"},
                      "data": {"index.html": "<p>our own page</p>\n"}})
    body = pod("site", "nginx", **serving(80),
               volumeMounts=[{"name": "site", "mountPath": "/usr/share/nginx/html"}])
    body["spec"]["volumes"] = [{"name": "site", "configMap": {"name": "site"}}]
    create(kube, ns, body)
    create(kube, ns, service("site", 80, 80))
    client(kube, ns)
    wait_for(lambda: pod_ready(kube, ns, "site"), 60, what="nginx Ready")
    assert get_from_client(kubectl, ns, "http://site/").strip() == "<p>our own page</p>"


def test_agnhost_netexec_answers_its_hostname_and_pause_is_its_default(kube, kubectl, ns):
    create(kube, ns, pod("netexec", AGNHOST, args=["netexec", "--http-port=8080"], **serving(8080)))
    create(kube, ns, pod("paused", AGNHOST))  # CMD: pause
    client(kube, ns)
    srv = wait_for(lambda: pod_ready(kube, ns, "netexec"), 60, what="agnhost netexec Ready")
    assert get_from_client(kubectl, ns, f"http://{srv['status']['podIP']}:8080/hostname").strip() == "netexec"
    assert get_from_client(kubectl, ns, f"http://{srv['status']['podIP']}:8080/echo?msg=hi").strip() == "hi"
    wait_for(lambda: pod_ready(kube, ns, "paused"), 60, what="agnhost pause Ready")
    assert wait_for(lambda: "Paused" in kubectl("-n", ns, "logs", "paused").stdout, 20, what="pause's log")


@needs_busybox
def test_busybox_runs_its_shell_as_the_real_image_does(kube, kubectl, ns):
    # With a command (as the course's manifests give it): that command.
    create(kube, ns, pod("hi", "busybox", restart="Never", command=["sh", "-c", "echo hi"]))
    # Args only: an applet of busybox's /bin and its arguments.
    create(kube, ns, pod("applet", "busybox:1.36", restart="Never",
                         args=["sh", "-c", "read exe < /proc/self/comm; echo hi from $exe"]))
    # Neither: CMD `sh`, which finds no terminal, reads an empty stdin and exits 0.
    create(kube, ns, pod("bare", "docker.io/library/busybox:latest", restart="Never"))
    for name in ("hi", "applet", "bare"):
        p = wait_for(lambda name=name: pod_finished(kube, ns, name), 60, what=f"{name} finished")
        assert p["status"]["phase"] == "Succeeded", (name, p["status"])
    assert kubectl("-n", ns, "logs", "hi").stdout == "hi\n"
    assert kubectl("-n", ns, "logs", "applet").stdout == "hi from busybox\n"  # the shell is busybox's
    assert kubectl("-n", ns, "logs", "bare").stdout == ""
    reasons = {r for r, _ in events(kube, ns, "bare")}
    assert "Simulated" not in reasons and "Started" in reasons, reasons
