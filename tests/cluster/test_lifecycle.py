"""Bring-up, restart and status of the embedded cluster.

These stop, restart and reset the shared session cluster; every other test
works in a namespace of its own, so the order of files does not matter.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from gpulab.notebook import pod_status
from helpers import wait_for

pytestmark = pytest.mark.cluster


def gpulab(*args: str, env_home) -> subprocess.CompletedProcess:
    env = dict(os.environ, GPULAB_HOME=str(env_home))
    return subprocess.run([sys.executable, "-m", "gpulab.cli", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_everything_listens_on_loopback_only(cluster):
    import psutil

    pids = set(cluster.running().values())
    for conn in psutil.net_connections("tcp"):
        if conn.pid in pids and conn.status == psutil.CONN_LISTEN:
            assert conn.laddr.ip in ("127.0.0.1", "::1"), (conn.pid, conn.laddr)


def test_status_json_reports_components_and_gpus(cluster, gpulab_home):
    proc = gpulab("status", "--json", env_home=gpulab_home)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert all(c["state"] == "up" for c in data["components"].values())
    gpu = next(n for n in data["nodes"] if n["name"] == "gpu-node-1")
    assert gpu["gpuModel"] == "NVIDIA-H100-80GB-HBM3"
    assert gpu["resources"]["nvidia.com/gpu"]["capacity"] == 2
    text = gpulab("status", env_home=gpulab_home).stdout
    assert "kube-scheduler" in text and "NVIDIA-H100-80GB-HBM3" in text


def test_the_apiserver_answers_a_raw_get_as_text(kube):
    """Client.text: what `kubectl get --raw` prints (bench/scale_bench.py counts the apiserver's writes so)."""
    from prometheus_client.parser import text_string_to_metric_families

    from gpulab.kube.api import NotFound

    families = {f.name for f in text_string_to_metric_families(kube.text("/metrics"))}
    assert "apiserver_request" in families
    with pytest.raises(NotFound):
        kube.text("/no-such-path")


def test_up_while_running_starts_no_second_cluster(cluster, gpulab_home):
    before = cluster.running()
    proc = gpulab("up", env_home=gpulab_home)
    assert proc.returncode == 0
    assert "already running" in proc.stdout
    assert cluster.running() == before


def test_crashed_component_is_reported_and_restarted_with_objects_kept(cluster, kube, gpulab_home):
    kube.create({"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "survivor", "namespace": "default"}, "data": {"k": "v"}})
    os.kill(cluster.running()["kube-scheduler"], signal.SIGKILL)
    wait_for(lambda: "kube-scheduler" not in cluster.running(), 10, what="scheduler gone")
    data = cluster.status()
    assert data["components"]["kube-scheduler"]["state"] == "down"
    proc = gpulab("status", env_home=gpulab_home)
    assert proc.returncode == 1 and "kube-scheduler            down" in proc.stdout
    proc = gpulab("up", env_home=gpulab_home)
    assert proc.returncode == 0, proc.stderr
    assert "restarting stopped components: kube-scheduler" in proc.stderr
    assert "kube-scheduler" in cluster.running()
    assert kube.get("ConfigMap", "survivor", "default")["data"] == {"k": "v"}


def test_objects_survive_down_and_up(cluster, kube, gpulab_home):
    kube.create({"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "kept", "namespace": "default"}, "data": {"step": "42"}})
    pids = set(cluster.running().values())
    proc = gpulab("down", env_home=gpulab_home)
    assert proc.returncode == 0
    assert cluster.running() == {}
    assert not [p for p in pids if _alive(p)], "gpulab down left processes behind"
    proc = gpulab("up", env_home=gpulab_home)
    assert proc.returncode == 0, proc.stderr
    assert kube.get("ConfigMap", "kept", "default")["data"] == {"step": "42"}


def test_a_taken_port_is_given_up_with_a_message(cluster, kube, gpulab_home):
    port = cluster.state()["ports"]["kwok"]
    gpulab("down", env_home=gpulab_home)
    with socket.socket() as s:
        # Connections kwok accepted linger in TIME_WAIT on its port for a minute after
        # it exits; like kwok itself (Go sets SO_REUSEADDR on every listener), the
        # test's listener must not be refused for them.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
        proc = gpulab("up", env_home=gpulab_home)
    assert proc.returncode == 0, proc.stderr
    assert f"port {port} (kwok) is held by" in proc.stderr
    assert cluster.state()["ports"]["kwok"] != port
    assert cluster.is_up()


def test_reset_returns_to_the_initial_state(cluster, kube, gpulab_home):
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "scratch"}})
    kube.patch("Node", "gpu-node-1", {"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}})
    proc = gpulab("reset", env_home=gpulab_home)
    assert proc.returncode == 0, proc.stderr
    from gpulab.kube.api import Client

    fresh = Client(cluster.kubeconfig)
    assert fresh.get("Namespace", "scratch") is None
    assert not fresh.get("Node", "gpu-node-1")["spec"].get("taints")
    assert fresh.get("ConfigMap", "kept", "default") is None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _pod(kube, ns, name):
    return kube.get("Pod", name, ns)


def _running(kube, ns, name):
    return (p := _pod(kube, ns, name)) and p["status"].get("phase") == "Running" and p


def _container_facts(pod):
    """What a restart of the kubelet must not change: identity, restarts, start times."""
    st = pod["status"]
    return (pod["metadata"]["uid"], st.get("startTime"),
            [(c["name"], c.get("restartCount"), c.get("containerID"), c.get("state"))
             for c in st.get("initContainerStatuses", []) + st.get("containerStatuses", [])])


def test_a_killed_node_agent_keeps_pods_and_their_gpus(cluster, kube, ns, gpulab_home, kubectl):
    import subprocess as sp

    kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sleeper", "namespace": ns},
                 "spec": {"restartPolicy": "Never",
                          "containers": [{"name": "c", "image": "x", "command": ["sleep", "4321"]}]}})
    # A pod whose init container finished before the agent died keeps that status.
    kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "prepared", "namespace": ns},
                 "spec": {"initContainers": [{"name": "prep", "image": "x", "command": ["true"]}],
                          "containers": [{"name": "c", "image": "x", "command": ["sleep", "4322"]}]}})
    # Ends while no agent watches: its real exit code must still be reported. It holds until the test
    # opens its gate (a file on its node's host filesystem), so that it cannot end before it is seen Running.
    gate = f"/gate-{ns}"
    kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "finisher", "namespace": ns},
                 "spec": {"restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": "cpu-node-1"},
                          "volumes": [{"name": "gate", "hostPath": {"path": gate, "type": "DirectoryOrCreate"}}],
                          "containers": [{"name": "c", "image": "x",
                                          "volumeMounts": [{"name": "gate", "mountPath": "/gate"}],
                                          "command": ["sh", "-c", "echo started; while [ ! -e /gate/open ]; do "
                                                      "sleep 0.2; done; echo done; exit 7"]}]}})
    # A simulated GPU container holding one of the node's two cards.
    kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu", "namespace": ns},
                 "spec": {"nodeSelector": {"kubernetes.io/hostname": "gpu-node-1"},
                          "containers": [{"name": "c", "image": "nvcr.io/nvidia/cuda:12.6.2-base-ubuntu24.04",
                                          "resources": {"limits": {"nvidia.com/gpu": 1}}}]}})
    names = ("sleeper", "prepared", "finisher", "gpu")
    for name in names:
        wait_for(lambda n=name: _running(kube, ns, n), 30, what=f"pod {name} Running")
    wait_for(lambda: sp.run(["pgrep", "-f", "sleep 4321"], capture_output=True).returncode == 0, 10,
             what="container process")
    before = {n: _container_facts(_pod(kube, ns, n)) for n in ("sleeper", "prepared", "gpu")}
    devices = _pod(kube, ns, "gpu")["metadata"]["annotations"]["gpulab.io/allocated-devices"]

    os.kill(cluster.running()["node-agent"], signal.SIGKILL)
    wait_for(lambda: "node-agent" not in cluster.running(), 10, what="node agent gone")
    # Containers live on under their shims, as under a real container runtime.
    assert sp.run(["pgrep", "-f", "sleep 4321"], capture_output=True).returncode == 0
    (cluster.root / "nodes" / "cpu-node-1" / "host" / gate.lstrip("/") / "open").write_text("")
    wait_for(lambda: sp.run(["pgrep", "-f", "/gate/open"], capture_output=True).returncode != 0, 15,
             what="the finisher's process to end while the agent is down")
    assert gpulab("up", env_home=gpulab_home).returncode == 0

    pod = wait_for(lambda: (p := _pod(kube, ns, "finisher")) and p["status"].get("phase") == "Failed" and p,
                   30, what="finisher reported Failed")
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 7, term
    assert kubectl("-n", ns, "logs", "finisher").stdout.split() == ["started", "done"]
    # Nothing else changed: same pods, same containers, no restarts, same GPU.
    wait_for(lambda: resources(kube) == ("2", "2"), 60, what=f"allocatable back (now {resources(kube)})")
    for name, facts in before.items():
        assert _container_facts(_running(kube, ns, name)) == facts, name
    assert _pod(kube, ns, "gpu")["metadata"]["annotations"]["gpulab.io/allocated-devices"] == devices
    # The other card is still free for a new pod; the adopted one keeps its own.
    kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu2", "namespace": ns},
                 "spec": {"nodeSelector": {"kubernetes.io/hostname": "gpu-node-1"},
                          "containers": [{"name": "c", "image": "nvcr.io/nvidia/cuda:12.6.2-base-ubuntu24.04",
                                          "resources": {"limits": {"nvidia.com/gpu": 1}}}]}})
    pod2 = wait_for(lambda: _running(kube, ns, "gpu2"), 30, what="a new GPU pod Running")
    assert pod2["metadata"]["annotations"]["gpulab.io/allocated-devices"] != devices

    # A node that goes down stops its containers; coming back, a kubelet starts them again.
    assert gpulab("down", env_home=gpulab_home).returncode == 0
    assert sp.run(["pgrep", "-f", "sleep 432[12]"], capture_output=True).returncode != 0, "containers left running"
    assert gpulab("up", env_home=gpulab_home).returncode == 0
    pod = wait_for(lambda: (p := _pod(kube, ns, "sleeper")) and p["status"].get("phase") == "Failed" and p,
                   30, what="sleeper reported Failed")
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 137 and "node agent restarted" in term["message"]
    pod = wait_for(lambda: (p := _pod(kube, ns, "prepared")) and p["status"]["containerStatuses"][0]
                   .get("restartCount", 0) >= 1 and p, 30, what="the prepared pod's container restarted")
    [init] = pod["status"]["initContainerStatuses"]
    assert init["state"]["terminated"]["exitCode"] == 0 and init["state"]["terminated"]["reason"] == "Completed", init
    assert pod_status(pod) in ("Running", "CrashLoopBackOff"), pod["status"]


def resources(kube, resource: str = "nvidia.com/gpu"):
    st = kube.get("Node", "gpu-node-1").get("status") or {}
    return (st.get("capacity") or {}).get(resource), (st.get("allocatable") or {}).get(resource)
