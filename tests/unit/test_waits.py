"""The library's waits, each a gpulab._poll.until call: what they return, how often they look, what a timeout says.

Most run on a fake clock that moves one second per look (no real sleeping); the process table's and the
shim's start run real processes with short timeouts.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from gpulab.cluster import kind, nodes
from gpulab.cluster.processes import Component, ProcessTable, StartError
from gpulab.fakegpu import operator
from gpulab.kube import api
from gpulab.runtime import sandbox, shim


def node(name: str, ready: bool = True, gpus: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if gpus is not None:
        status["allocatable"] = {"nvidia.com/gpu": gpus}
    return {"metadata": {"name": name}, "status": status}


TOPO = SimpleNamespace(nodes=[SimpleNamespace(name="cpu-node-1"), SimpleNamespace(name="gpu-node-1")],
                       gpu_nodes=[SimpleNamespace(name="gpu-node-1", gpu_count=2)])


class Nodes:
    """A client whose Node list is ``answers`` in turn (the last one from then on)."""

    def __init__(self, *answers: list[dict[str, Any]]):
        self.answers = list(answers)
        self.looks = 0

    def list(self, kind_: str) -> list[dict[str, Any]]:
        assert kind_ == "Node"
        self.looks += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    def get(self, kind_: str, name: str) -> dict[str, Any] | None:
        return next((n for n in self.list(kind_) if n["metadata"]["name"] == name), None)


# -- kind ------------------------------------------------------------------------


def test_kind_waits_for_every_node_looking_more_rarely_up_to_2_s(pauses, tmp_path) -> None:
    client = Nodes([node("cpu-node-1")], [node("cpu-node-1"), node("gpu-node-1", ready=False)],
                   [node("cpu-node-1"), node("gpu-node-1")])
    kind.KindCluster(tmp_path, name="t")._wait_nodes_ready(client, TOPO)
    assert client.looks == 3
    assert pauses == pytest.approx([0.5, 0.75])


def test_kind_nodes_not_ready_in_time_name_the_missing_ones(pauses, tmp_path) -> None:
    client = Nodes([node("cpu-node-1"), node("gpu-node-1", ready=False)])
    late = r"^kind nodes not Ready after 8 s: gpu-node-1; see `docker logs t-worker`"
    with pytest.raises(kind.KindError, match=late):
        kind.KindCluster(tmp_path, name="t")._wait_nodes_ready(client, TOPO, timeout=8)
    assert max(pauses) == 2.0


def test_kind_gpus_reported_in_time_are_said(pauses, tmp_path) -> None:
    said: list[str] = []
    client = Nodes([node("gpu-node-1", gpus="0")], [node("gpu-node-1", gpus="2")])
    kind.KindCluster(tmp_path, name="t")._wait_gpus(client, TOPO, said.append)
    assert said == ["every GPU node's kubelet reports its nvidia.com/gpu (1 nodes)"]


def test_kind_gpus_missing_after_the_timeout_are_said_not_raised(pauses, tmp_path) -> None:
    said: list[str] = []
    kind.KindCluster(tmp_path, name="t")._wait_gpus(Nodes([node("gpu-node-1")]), TOPO, said.append, timeout=6)
    assert len(said) == 1
    assert said[0].startswith("GPU nodes without their nvidia.com/gpu after 6 s: gpu-node-1 (0/2); see ")


# -- the embedded cluster's nodes ----------------------------------------------------


def test_embedded_nodes_wait_every_0_2_s_and_name_the_late_ones(pauses, monkeypatch, tmp_path) -> None:
    client = Nodes([node("cpu-node-1"), node("gpu-node-1", ready=False)])
    monkeypatch.setattr(nodes.api, "Client", lambda kubeconfig: client)
    cluster = SimpleNamespace(kubeconfig=tmp_path / "kubeconfig", procs=ProcessTable(tmp_path))
    with pytest.raises(nodes.ClusterError, match=r"^nodes not Ready after 4 s: gpu-node-1; see .*kwok\.log$"):
        nodes.wait_ready(cluster, TOPO, timeout=4)
    assert pauses == [0.2] * 3
    client.answers = [[node("cpu-node-1"), node("gpu-node-1")]]
    nodes.wait_ready(cluster, TOPO, timeout=4)


# -- the CRD wait ----------------------------------------------------------------------


def test_wait_crd_looks_every_0_1_s_until_established(pauses) -> None:
    answers = [None, {"status": {}}, {"status": {"conditions": [{"type": "Established", "status": "True"}]}}]
    client = api.Client.__new__(api.Client)
    client.get = lambda kind_, name: answers.pop(0)
    client.wait_crd("clusterpolicies.nvidia.com")
    assert pauses == [0.1, 0.1]
    client.get = lambda kind_, name: {"status": {"conditions": [{"type": "Established", "status": "False"}]}}
    with pytest.raises(TimeoutError, match=r"^CRD clusterpolicies\.nvidia\.com not Established after 30 s$"):
        client.wait_crd("clusterpolicies.nvidia.com")


# -- the GPU Operator's install ------------------------------------------------------------


def test_the_operator_reports_a_stack_that_is_not_up_in_time(pauses, monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(operator.api, "Client", lambda kubeconfig: SimpleNamespace())
    monkeypatch.setattr(operator, "manifest_documents", lambda: [])
    answers = ["daemonset/a: 0 pods ready", "daemonset/b: 1 pods ready"]
    monkeypatch.setattr(operator, "stack_ready",
                        lambda client, since: answers.pop(0) if len(answers) > 1 else answers[0])
    said: list[str] = []
    operator.install(tmp_path / "kubeconfig", said.append, timeout=5)
    assert said == [f"GPU Operator not ready after 5 s (daemonset/b: 1 pods ready); see `kubectl -n "
                    f"{operator.NAMESPACE} get pods` and `gpulab fault list`"]
    assert pauses and set(pauses) == {0.5}

    answers[:] = ["daemonset/a: 0 pods ready", None]
    said.clear()
    operator.install(tmp_path / "kubeconfig", said.append, timeout=5)
    assert len(said) == 1 and said[0].startswith("GPU Operator ready in ")


# -- the node agent's container shims ----------------------------------------------------------


def handle(monkeypatch, tmp_path, statuses: list[Any], alive: list[bool]) -> shim.ShimHandle:
    h = shim.ShimHandle(tmp_path)
    monkeypatch.setattr(h, "exit_status", lambda: statuses.pop(0) if len(statuses) > 1 else statuses[0])
    monkeypatch.setattr(h, "shim_alive", lambda: alive.pop(0) if len(alive) > 1 else alive[0])
    return h


def test_shim_wait_returns_the_status_once_written(pauses, monkeypatch, tmp_path) -> None:
    done = {"returncode": 0, "finished_at": 1.0}
    assert handle(monkeypatch, tmp_path, [None, None, done], [True]).wait(10) is done
    assert pauses == [0.02, 0.02]


def test_shim_wait_ends_at_once_when_the_shim_died_without_a_status(pauses, monkeypatch, tmp_path) -> None:
    assert handle(monkeypatch, tmp_path, [None], [True, False]).wait(10) is None
    assert pauses == [0.02]
    # A status written as the shim died still counts.
    done = {"returncode": 1, "finished_at": 1.0}
    assert handle(monkeypatch, tmp_path, [None, done], [False]).wait(10) is done


def test_shim_wait_gives_none_after_the_timeout(pauses, monkeypatch, tmp_path) -> None:
    assert handle(monkeypatch, tmp_path, [None], [True]).wait(3) is None
    assert pauses == [0.02] * 2
    pauses.clear()
    assert handle(monkeypatch, tmp_path, [None], [True]).wait(-1) is None  # one look, no pause
    assert pauses == []


@pytest.mark.parametrize("script, timeout, why", [
    ("echo boom >&2; exit 1", 15.0, "boom"),  # the shim exits before it records its process
    ("echo still starting >&2; exec sleep 300", 0.3, "still starting"),  # it never does: killed
])
def test_a_shim_that_does_not_start_raises_with_its_last_word(monkeypatch, tmp_path, script, timeout, why) -> None:
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(0o755)
    monkeypatch.setattr(shim.sys, "executable", str(fake))
    monkeypatch.setattr(shim, "START_TIMEOUT", timeout)
    spec = sandbox.SandboxSpec(argv=["true"], env={}, rootfs=tmp_path / "rootfs")
    started = time.monotonic()
    with pytest.raises(shim.ShimError, match=rf"^the container's shim did not start its process: {why}$"):
        shim.ShimHandle.start(spec, tmp_path / "run", tmp_path / "log")
    assert time.monotonic() - started < 10


# -- the embedded cluster's processes ------------------------------------------------------------


def test_components_that_serve_in_time_are_waited_for(tmp_path) -> None:
    table = ProcessTable(tmp_path)
    looks = iter([False, False, True])
    comp = Component("a", ["sleep", "300"], lambda: next(looks))
    proc = table.spawn(comp)
    try:
        table.wait_ready([(comp, proc)], timeout=10)
        assert proc.poll() is None
    finally:
        table.stop("a", grace=1)
        proc.wait()
    table.wait_ready([], timeout=0)  # nothing to wait for


def test_a_component_that_does_not_serve_in_time_is_stopped(tmp_path) -> None:
    table = ProcessTable(tmp_path)
    comp = Component("a", ["sleep", "300"], lambda: False)
    proc = table.spawn(comp)
    with pytest.raises(StartError, match=r"^a did not become ready within 0 s; last lines of .*a\.log:"):
        table.wait_ready([(comp, proc)], timeout=0.3)
    proc.wait(5)  # gone (stop() may have reaped it first: then its code reads 0)
    assert table.running() == {}


def test_a_component_that_exits_while_starting_is_reported(tmp_path) -> None:
    table = ProcessTable(tmp_path)
    comp = Component("a", ["sh", "-c", "echo no config; exit 3"], lambda: False)
    proc = table.spawn(comp)
    proc.wait()
    with pytest.raises(StartError, match=r"^a exited with code 3 while starting; last lines of (?s:.*)\n  no config$"):
        table.wait_ready([(comp, proc)], timeout=10)


def test_what_a_starting_component_makes_is_waited_for(tmp_path) -> None:
    table = ProcessTable(tmp_path)
    comp = Component("a", ["sleep", "300"], lambda: False)
    proc = table.spawn(comp)
    looks = iter([False, False, True])
    try:
        table.wait_for("its socket", lambda: next(looks), (comp, proc), timeout=10)
        with pytest.raises(StartError, match=r"^a did not make its socket within 0 s; last lines of .*a\.log:"):
            table.wait_for("its socket", lambda: False, (comp, proc), timeout=0.2)
        assert proc.poll() is None  # a late component is left to the caller
    finally:
        table.stop("a", grace=1)
        proc.wait()


def test_a_component_that_exits_before_making_what_is_waited_for_ends_the_wait(tmp_path) -> None:
    table = ProcessTable(tmp_path)
    comp = Component("a", ["sh", "-c", "echo cannot unshare; exit 1"], lambda: False)
    proc = table.spawn(comp)
    proc.wait()
    with pytest.raises(StartError, match=r"^a exited with code 1 while starting; (?s:.*)cannot unshare$"):
        table.wait_for("its socket", lambda: False, (comp, proc), timeout=60)


def test_stop_kills_what_outlives_its_grace(tmp_path) -> None:
    table = ProcessTable(tmp_path)
    proc = table.spawn(Component("a", ["sh", "-c", "trap '' TERM; sleep 300"], lambda: True))
    time.sleep(0.2)  # the trap is set
    started = time.monotonic()
    assert table.stop("a", grace=0.3)
    assert 0.3 <= time.monotonic() - started < 5  # the grace, then SIGKILL
    proc.wait(5)
    assert not table.stop("a")
    quick = table.spawn(Component("b", ["sleep", "300"], lambda: True))
    started = time.monotonic()
    assert table.stop("b", grace=10)
    assert time.monotonic() - started < 5  # SIGTERM sufficed: no waiting out the grace
    quick.wait(5)


def test_components_stopped_together_share_one_grace(tmp_path) -> None:
    table = ProcessTable(tmp_path)
    stubborn = [table.spawn(Component(n, ["sh", "-c", "trap '' TERM; sleep 300"], lambda: True)) for n in "ab"]
    quick = table.spawn(Component("c", ["sleep", "300"], lambda: True))
    time.sleep(0.2)  # the traps are set
    started = time.monotonic()
    assert table.stop_all(["a", "gone", "b", "c"], grace=2) == ["a", "b", "c"]
    assert 2 <= time.monotonic() - started < 4  # one grace for both stubborn ones (not one each), then SIGKILL
    for proc in (*stubborn, quick):
        proc.wait(5)
    assert table.running() == {}
