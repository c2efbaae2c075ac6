"""The node agent's side of its informers: which pods get a worker, and which workers go.

The API is a client stub answering list_raw and watch from a script; the pod workers are stand-ins
that record what the agent asks of them.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from gpulab import _poll
from gpulab.kube import api
from gpulab.kube.informer import SharedInformers
from gpulab.kube.names import NODE_ANNOTATION
from gpulab.runtime import agent as agent_mod


def node(name: str, managed: bool = True) -> dict[str, Any]:
    ann = {NODE_ANNOTATION[0]: NODE_ANNOTATION[1]} if managed else {}
    return {"metadata": {"name": name, "uid": name, "resourceVersion": "1", "annotations": ann},
            "spec": {"podCIDR": "10.244.1.0/24"}}


def pod(name: str, node_name: str, rv: str = "2") -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}", "resourceVersion": rv},
            "spec": {"nodeName": node_name}}


class Client:
    """list_raw and watch from a script per kind (the last list stays; an exception is raised; a watch whose
    script has run out is a quiet stream)."""

    def __init__(self, lists: dict[str, list[list[dict[str, Any]]]], watches: dict[str, list[Any]]):
        self.lists = lists
        self.watches = watches

    def list_raw(self, kind: str, namespace: str | None = None) -> dict[str, Any]:
        items = self.lists[kind].pop(0) if len(self.lists[kind]) > 1 else self.lists[kind][0]
        return {"metadata": {"resourceVersion": "9"}, "items": [dict(o) for o in items]}

    def watch(self, kind: str, resource_version: str, namespace: str | None = None, timeout_seconds: int = 240):
        if not self.watches.get(kind):
            time.sleep(0.01)
            return iter([])
        answer = self.watches[kind].pop(0)
        if isinstance(answer, Exception):
            raise answer
        return iter(answer)


class Worker:
    made: list[Worker] = []

    def __init__(self, agent: Any, pod: dict[str, Any]):
        Worker.made.append(self)
        self.pod = pod
        self.calls: list[str] = []
        self.alive = True

    def start(self) -> None:
        self.calls.append("start")

    def update(self, pod: dict[str, Any]) -> None:
        self.calls.append("update")

    def remove(self) -> None:
        self.calls.append("remove")

    def is_alive(self) -> bool:
        return self.alive


def make_agent(monkeypatch, tmp_path, client: Client) -> agent_mod.NodeAgent:
    monkeypatch.setattr(agent_mod.api, "Client", lambda kubeconfig: client)
    monkeypatch.setattr(agent_mod, "PodWorker", Worker)
    monkeypatch.setattr(Worker, "made", [])
    network = SimpleNamespace(set_node=lambda name, cidr, ip: None)
    return agent_mod.NodeAgent(tmp_path, network, informers=SharedInformers(client))


def test_pods_on_managed_nodes_get_a_worker_and_one_a_relist_lacks_is_removed(monkeypatch, tmp_path) -> None:
    client = Client({"Node": [[node("gpu-node-1"), node("elsewhere", managed=False)]],
                     "Pod": [[pod("a", "gpu-node-1"), pod("b", "elsewhere")],
                             # The watch expired and b's neighbour a was deleted meanwhile.
                             [pod("b", "elsewhere")]]},
                    {"Pod": [[{"type": "MODIFIED", "object": pod("a", "gpu-node-1", "3")}], api.Gone("expired")]})
    agent = make_agent(monkeypatch, tmp_path, client)
    nodes = agent._watch("Node", agent._on_node)
    assert nodes.wait_synced(5)
    assert agent.nodes == {"gpu-node-1"}
    pods = agent._watch("Pod", agent._on_pod)
    assert pods.wait_synced(5)
    [worker] = Worker.made  # none for a pod on a node another kubelet has
    assert worker.pod["metadata"]["name"] == "a"
    _poll.until(lambda: "remove" in worker.calls, 5, lambda _: AssertionError(worker.calls))
    assert worker.calls == ["start", "update", "remove"]
    assert agent.workers == {}
    agent.informers.stop()


def test_ended_workers_are_reaped(monkeypatch, tmp_path) -> None:
    agent = make_agent(monkeypatch, tmp_path, Client({}, {}))
    agent.nodes.add("gpu-node-1")
    agent._on_pod(pod("a", "gpu-node-1"))
    agent._on_pod(pod("b", "gpu-node-1"))
    agent.workers["uid-a"].alive = False  # type: ignore[attr-defined]
    agent._reap()
    assert list(agent.workers) == ["uid-b"]


def test_the_device_side_wakes_the_worker_of_a_pod_it_ended_a_container_of(monkeypatch, tmp_path) -> None:
    """A pod holding GPUs is not polled: the device side wakes its worker when a neighbour's CUDA program ends
    one of its containers (DeviceHooks.wake_with), so its next sync hands it the kill."""
    class Devices(agent_mod.NoDevices):
        def wake_with(self, wake):
            self.wake = wake

    devices = Devices()
    monkeypatch.setattr(agent_mod, "PodWorker", Worker)
    agent = agent_mod.NodeAgent(tmp_path, SimpleNamespace(set_node=lambda name, cidr, ip: None), devices=devices,
                                informers=SharedInformers(Client({}, {})), client=Client({}, {}))  # type: ignore[arg-type]
    agent.nodes.add("gpu-node-1")
    agent._on_pod(pod("a", "gpu-node-1"))
    agent.workers["uid-a"].wake = SimpleNamespace(set=lambda: agent.workers["uid-a"].calls.append("wake"))  # type: ignore[attr-defined]
    devices.wake("uid-a")
    devices.wake("uid-gone")  # a pod that ended meanwhile: nothing to wake
    assert agent.workers["uid-a"].calls == ["start", "wake"]  # type: ignore[attr-defined]


def test_a_pods_logs_and_exec_are_published_again_only_when_they_change(tmp_path) -> None:
    applied: list[str] = []
    client = SimpleNamespace(create=lambda obj: applied.append(obj["kind"]),
                             apply=lambda obj, manager: applied.append(obj["kind"]),
                             delete=lambda kind, name: applied.append(f"-{kind}"))
    registry = agent_mod.LogRegistry(client)  # type: ignore[arg-type]

    class Container:
        def __init__(self, name: str) -> None:
            self.name, self.spec, self.restarts = name, {"name": name}, 0

        def log_path(self):
            return tmp_path / self.name / f"{self.restarts}.log"

        def previous_log_path(self):
            return tmp_path / self.name / f"{self.restarts - 1}.log" if self.restarts else None

    main = Container("main")
    worker = SimpleNamespace(key=("ns", "web", "uid-web-0001"), init=[], main=[main], dir=tmp_path / "pod",
                             agent=SimpleNamespace(cluster_dir=tmp_path), net=None)
    registry.register(worker)  # type: ignore[arg-type]
    assert applied == ["ClusterLogs", "ClusterExec"]
    registry.register(worker)  # type: ignore[arg-type]  # its container started: nothing changed
    assert applied == ["ClusterLogs", "ClusterExec"]
    main.restarts = 1  # restarted: the logs move, the exec target does not
    registry.register(worker)  # type: ignore[arg-type]
    assert applied == ["ClusterLogs", "ClusterExec", "ClusterLogs"]
    registry.unregister(worker)  # type: ignore[arg-type]
    registry.register(worker)  # type: ignore[arg-type]  # published afresh after it was withdrawn
    assert applied[-2:] == ["ClusterLogs", "ClusterExec"]
