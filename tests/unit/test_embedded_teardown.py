"""Whatever stops the embedded cluster also stops the pod network's holder.

The node agent makes the nodes' network namespace, held by a process in a session of its own
(gpulab.runtime.netholder) that outlives the node agent on purpose. So stopping the components is not
enough: `down`, and an `up` that fails midway and so leaves nothing running, must stop the holder too.
The components here are `sleep`s and the holder a `sleep` recorded as the node agent records it; nothing
of Kubernetes starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpulab import _proc
from gpulab._fsutil import atomic_write_json
from gpulab.cluster import embedded
from gpulab.cluster.base import ClusterError
from gpulab.cluster.embedded import EmbeddedCluster
from gpulab.cluster.processes import Component
from gpulab.runtime import network


def _start_holder(root: Path) -> subprocess.Popen:
    """A stand-in for the holder the node agent starts: its own session, recorded in holder.json."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    net = network.ClusterNetwork(root)
    atomic_write_json(net.dir / network.HOLDER_FILE, {"pid": proc.pid, "start": _proc.started(proc.pid)})
    assert net.holder() == proc.pid
    return proc


def _stopped(proc: subprocess.Popen) -> bool:
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return False
    return True


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch):
    """An embedded cluster whose components are `sleep`s; the node agent's start makes a holder, and
    nodes never get Ready (`up` fails after every component started)."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))  # a short socket directory, if any, stays in here
    c = EmbeddedCluster(tmp_path / "cluster")
    holders: list[subprocess.Popen] = []
    monkeypatch.setattr(embedded, "components", lambda: embedded.COMPONENTS[:-1])  # no kube-proxy: no nft
    monkeypatch.setattr(embedded.sandbox, "check", lambda: None)
    monkeypatch.setattr(embedded.binaries, "ensure", lambda say, **_: SimpleNamespace(kwok_crds=None))
    monkeypatch.setattr(embedded.pki, "ensure", lambda *a: None)
    monkeypatch.setattr(embedded.pki, "issue_server", lambda *a: None)
    monkeypatch.setattr(embedded.metricsserver, "install", lambda *a: None)
    monkeypatch.setattr(embedded.nodes, "install_crds", lambda *a: None)
    monkeypatch.setattr(embedded.nodes, "bootstrap", lambda *a: None)
    monkeypatch.setattr(c, "_make_reachable", lambda say: None)
    monkeypatch.setattr(c, "_write_kubeconfigs", lambda port: None)

    def component(name, bins, ports, first_node):
        if name == "node-agent":
            holders.append(_start_holder(c.root))
        return Component(name, ["sleep", "300"], lambda: True)

    def nodes_never_ready(*a, **kw):
        raise ClusterError("nodes not Ready within 10 s")

    monkeypatch.setattr(c, "_component", component)
    monkeypatch.setattr(embedded.nodes, "wait_ready", nodes_never_ready)
    c.holders = holders
    yield c
    for proc in holders:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    for pid in c.procs.running().values():  # components a test left running
        os.killpg(pid, signal.SIGKILL)


def test_an_up_that_fails_midway_stops_the_holder_the_node_agent_made(cluster) -> None:
    with pytest.raises(ClusterError, match="nodes not Ready"):
        cluster.up(say=lambda m: None)
    assert cluster.running() == {}
    [holder] = cluster.holders
    assert _stopped(holder), "a failed `gpulab up` left the pod network's holder running"
    assert network.ClusterNetwork(cluster.root).holder() is None


def test_a_failed_restart_keeps_the_namespace_of_the_parts_still_running(cluster) -> None:
    # etcd ran before: the cluster is not stopped by the failure, and a later `up` adopts the namespace.
    cluster.procs.spawn(Component("etcd", ["sleep", "300"], lambda: True))
    with pytest.raises(ClusterError, match="nodes not Ready"):
        cluster.up(say=lambda m: None)
    assert set(cluster.running()) == {"etcd"}
    [holder] = cluster.holders
    assert holder.poll() is None
    # `down` stops what is left, the holder with it.
    cluster.down(say=lambda m: None)
    assert _stopped(holder)


def test_down_stops_the_holder_even_when_stopping_a_component_is_interrupted(cluster, monkeypatch) -> None:
    holder = _start_holder(cluster.root)
    cluster.holders.append(holder)

    def interrupted(names, grace=10.0):
        raise KeyboardInterrupt  # Ctrl-C, or a test run's SIGTERM, while `down` waits for a component

    monkeypatch.setattr(cluster.procs, "stop", interrupted)
    monkeypatch.setattr(cluster.procs, "stop_all", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cluster.down(say=lambda m: None)
    assert _stopped(holder), "an interrupted `gpulab down` left the pod network's holder running"
