"""The node agent's /metrics/resource page: what metrics-server v0.8.0 reads, with real and declared values."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpulab.runtime import resourcemetrics as rm

# The series metrics-server v0.8.0 parses (pkg/scraper/client/resource/decode.go); a
# container whose CPU or memory is 0 makes it drop the whole pod.
PARSED = ("node_cpu_usage_seconds_total", "node_memory_working_set_bytes", "container_cpu_usage_seconds_total",
          "container_memory_working_set_bytes", "container_start_time_seconds")


def samples(page: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], tuple[float, float | None]]:
    out = {}
    for fam in text_string_to_metric_families(page.decode()):
        for s in fam.samples:
            ts = float(s.timestamp) if s.timestamp is not None else None
            out[(s.name, tuple(sorted(s.labels.items())))] = (s.value, ts)
    return out


BUSY = "import os, time\nt = time.time()\nwhile time.time() - t < 30: pass\n"


@pytest.fixture
def busy_tree():
    """A process whose busy child does the work: the CPU is the tree's, not the leader's alone."""
    leader = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {BUSY!r}])"],
                              start_new_session=True)
    try:
        yield leader
    finally:
        os.killpg(leader.pid, signal.SIGKILL)  # the busy child too
        leader.wait()


def test_a_real_process_tree_reports_its_cpu_time_and_memory(busy_tree):
    deadline = time.monotonic() + 10
    usage = rm.process_tree_usage(busy_tree.pid)
    while (usage is None or usage.cpu_seconds < 0.3) and time.monotonic() < deadline:
        time.sleep(0.1)
        usage = rm.process_tree_usage(busy_tree.pid)
    assert usage is not None and usage.cpu_seconds >= 0.3  # the child's busy loop, counted in the tree
    assert usage.memory_bytes > 1 << 20  # two Python interpreters' resident memory
    later = rm.process_tree_usage(busy_tree.pid)
    assert later is not None and later.cpu_seconds >= usage.cpu_seconds  # a counter


def test_a_process_that_is_gone_reports_nothing():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert rm.process_tree_usage(proc.pid) is None


def pod(annotations: dict[str, str]) -> dict:
    return {"metadata": {"name": "p", "namespace": "ns", "annotations": annotations}}


def test_a_simulated_container_reports_what_its_annotations_declare():
    p = pod({rm.CPU_ANNOTATION: "250m", rm.MEMORY_ANNOTATION: "64Mi",
             f"{rm.CPU_ANNOTATION}.sidecar": "1", f"{rm.MEMORY_ANNOTATION}.sidecar": "1Gi"})
    main = rm.declared_usage(p, "main", started_at=1000.0, now=1040.0)
    assert main == rm.Usage(cpu_seconds=0.25 * 40, memory_bytes=64 * 2**20)  # 250m for 40 s
    assert rm.declared_usage(p, "sidecar", 1000.0, 1010.0) == rm.Usage(10.0, 2**30)  # its own annotations win
    assert rm.declared_usage(pod({}), "main", 1000.0, 1040.0) is None  # declares nothing: not reported
    assert rm.declared_usage(pod({rm.CPU_ANNOTATION: "lots"}), "main", 1000.0, 1040.0) is None


def test_the_page_has_the_kubelets_series_with_timestamps():
    containers = [rm.ContainerSample("ns", "web", "app", 1000.0, rm.Usage(12.5, 3 * 2**20)),
                  rm.ContainerSample("ns", "web", "sidecar", 1001.0, rm.Usage(0.5, 2**20))]
    page = rm.exposition(rm.Usage(100.0, 2**30), containers, now=1234.5)
    got = samples(page)
    app = (("container", "app"), ("namespace", "ns"), ("pod", "web"))
    assert got[("node_cpu_usage_seconds_total", ())] == (100.0, 1234.5)
    assert got[("node_memory_working_set_bytes", ())] == (2**30, 1234.5)
    assert got[("container_cpu_usage_seconds_total", app)] == (12.5, 1234.5)
    assert got[("container_memory_working_set_bytes", app)] == (3 * 2**20, 1234.5)
    assert got[("container_start_time_seconds", app)] == (1000.0, 1234.5)
    pod_labels = (("namespace", "ns"), ("pod", "web"))
    assert got[("pod_cpu_usage_seconds_total", pod_labels)] == (13.0, 1234.5)
    assert got[("pod_memory_working_set_bytes", pod_labels)] == (4 * 2**20, 1234.5)
    assert got[("scrape_error", ())][0] == 0
    assert {name for name, _ in got} >= set(PARSED)
    # metrics-server reads the timestamp in milliseconds, after the value.
    assert b'container_cpu_usage_seconds_total{container="app",namespace="ns",pod="web"} 12.5 1234500' in page


def fake_agent(node: str, containers: list) -> SimpleNamespace:
    worker = SimpleNamespace(node=node, key=("ns", "web", "uid-1"), init=[], main=containers,
                             pod=pod({rm.CPU_ANNOTATION: "500m", rm.MEMORY_ANNOTATION: "100Mi"}))
    return SimpleNamespace(nodes={node, "other"}, workers={"uid-1": worker})


def container(name: str, started_at: float, state: str = "running", **kw) -> SimpleNamespace:
    return SimpleNamespace(name=name, state=state, started_at=started_at, simulated=True, factory=None, shim=None,
                           **kw)


def test_node_page_counts_its_containers_and_never_goes_back(busy_tree):
    real = SimpleNamespace(name="real", state="running", started_at=time.time(), simulated=False, factory=None,
                           shim=SimpleNamespace(pid=busy_tree.pid))
    sim = container("sim", time.time() - 100)
    agent = fake_agent("n1", [sim, real])
    metrics = rm.ResourceMetrics(agent)
    time.sleep(0.3)
    first = samples(metrics.page("n1"))
    sim_labels = (("container", "sim"), ("namespace", "ns"), ("pod", "web"))
    real_labels = (("container", "real"), ("namespace", "ns"), ("pod", "web"))
    assert first[("container_cpu_usage_seconds_total", sim_labels)][0] == pytest.approx(50, abs=1)  # 500m x 100 s
    assert first[("container_memory_working_set_bytes", sim_labels)][0] == 100 * 2**20
    assert first[("container_memory_working_set_bytes", real_labels)][0] > 0
    node_cpu = first[("node_cpu_usage_seconds_total", ())][0]
    assert node_cpu >= 50 + first[("container_cpu_usage_seconds_total", real_labels)][0]
    # The simulated container ends: it leaves the page, its CPU time stays in the node's counter.
    sim.state = "terminated"
    second = samples(metrics.page("n1"))
    assert ("container_cpu_usage_seconds_total", sim_labels) not in second
    assert second[("node_cpu_usage_seconds_total", ())][0] >= node_cpu
    # The other node runs none of these; a node the agent does not run has no page.
    other = samples(metrics.page("other"))
    assert not [k for k in other if k[0].startswith("container_")]
    assert metrics.page("nope") is None


def test_built_in_programs_and_waiting_containers_are_not_reported():
    program = SimpleNamespace(name="prog", state="running", started_at=1.0, simulated=False, factory=object(),
                              shim=None)
    waiting = container("waiting", None, state="waiting")  # type: ignore[arg-type]
    metrics = rm.ResourceMetrics(fake_agent("n1", [program, waiting]))
    assert not [k for k in samples(metrics.page("n1")) if k[0].startswith("container_")]


def test_the_path_is_the_one_nodes_announce():
    assert rm.node_path("gpu-node-1") == "/metrics/nodes/gpu-node-1/metrics/resource"
    assert rm._PATH.fullmatch(rm.node_path("gpu-node-1"))[1] == "gpu-node-1"
    assert rm.PATH_ANNOTATION == "metrics.k8s.io/resource-metrics-path"


def test_the_node_counter_never_goes_back_even_by_a_rounding_error():
    sim = container("sim", time.time() - 100)
    metrics = rm.ResourceMetrics(fake_agent("n1", [sim]))
    first = samples(metrics.page("n1"))[("node_cpu_usage_seconds_total", ())][0]
    metrics.retired["n1"] = metrics.retired.get("n1", 0.0) - 1e-9  # as re-summing in another order can do
    metrics.me = SimpleNamespace(oneshot=contextlib.nullcontext, cpu_times=lambda: SimpleNamespace(user=0.0, system=0.0),
                                 memory_info=lambda: SimpleNamespace(rss=0))
    second = samples(metrics.page("n1"))[("node_cpu_usage_seconds_total", ())][0]
    assert second >= first


def test_the_server_keeps_a_connection_for_the_next_scrape_and_wants_a_client_certificate(tmp_path):
    """metrics-server scrapes a fleet's every node each period: over kept connections, as from kubelets."""
    import http.client
    import ssl

    from gpulab.kube import pki
    from gpulab.runtime.resourcemetrics import ResourceMetricsServer

    pki.ensure(tmp_path)
    pki.issue_server(tmp_path, "serving", "gpulab:node-agent", (), ("127.0.0.1",))
    cert, key = pki.issue_client(tmp_path, "scraper", "metrics-server")
    pages = {"node-a": b"# page of node-a\n"}
    server = ResourceMetricsServer(pages.get, tmp_path, "serving")
    server.start()
    try:
        ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        ctx.check_hostname = False
        ctx.load_cert_chain(str(cert), str(key))
        conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=ctx, timeout=5)
        socks = []
        for _ in range(2):
            conn.request("GET", "/metrics/nodes/node-a/metrics/resource")
            resp = conn.getresponse()
            assert (resp.status, resp.read()) == (200, b"# page of node-a\n")
            socks.append(conn.sock)
        assert socks[0] is socks[1] and socks[0] is not None  # one connection, two scrapes
        conn.request("GET", "/metrics/nodes/node-z/metrics/resource")
        assert conn.getresponse().status == 404
        conn.close()
        anonymous = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        anonymous.check_hostname = False
        bare = http.client.HTTPSConnection("127.0.0.1", server.port, context=anonymous, timeout=5)
        with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
            bare.request("GET", "/metrics/nodes/node-a/metrics/resource")
            bare.getresponse()
        bare.close()
    finally:
        server.stop()
