"""The usage report from Prometheus' answers (no cluster): its queries, its arithmetic, its pictures, its errors.

The results here are what Prometheus' HTTP API returns for the report's queries (``data.result``), written
by hand: the arithmetic from results to GPU-hours is a pure function (``report.build``).
"""

from __future__ import annotations

import json
import socket
import textwrap
from datetime import datetime, timezone

import pytest
from click.testing import CliRunner

from gpulab import cli, usage
from gpulab.usage import plots, prometheus, report

H100 = "NVIDIA H100 80GB HBM3"
END = 1_800_000_000.0


def vector(*rows: tuple[dict[str, str], float]) -> list[dict]:
    """An instant query's result."""
    return [{"metric": labels, "value": [END, repr(float(value))]} for labels, value in rows]


def matrix(*rows: tuple[dict[str, str], list[tuple[float, float]]]) -> list[dict]:
    """A range query's result."""
    return [{"metric": labels, "values": [[t, repr(float(v))] for t, v in points]} for labels, points in rows]


def held(ns: str, node: str, value: float, resource: str = "nvidia_com_gpu") -> tuple[dict[str, str], float]:
    """A row of GPUS_NOW / ALLOCATED_H (by namespace, node, resource)."""
    return {"namespace": ns, "node": node, "resource": resource}, value


def device(ns: str, node: str, value: float, profile: str = "", model: str = H100) -> tuple[dict[str, str], float]:
    """A row of COMPUTING_H / IDLE_H / IDLE_NOW (by namespace, node, modelName, GPU_I_PROFILE); "" for no pod."""
    labels = {"node": node, "modelName": model}
    if ns:
        labels["namespace"] = ns
    if profile:
        labels["GPU_I_PROFILE"] = profile
    return labels, value


def quota(ns: str, used: float, hard: float, resource: str = "requests.nvidia.com/gpu") -> list[dict]:
    base = {"__name__": "kube_resourcequota", "namespace": ns, "resourcequota": "gpu-quota", "resource": resource}
    return vector(({**base, "type": "used"}, used), ({**base, "type": "hard"}, hard))


def nodes(*pairs: tuple[str, str]) -> list[dict]:
    return vector(*(({"node": n, "modelName": m}, 1) for n, m in pairs))


def build(results: dict, **kw) -> report.Report:
    return report.build(results, END - 3600, END, 5, **kw)


def test_every_query_is_promql_with_its_window_and_step_filled_in():
    queries = report.queries(900, 5)
    assert set(queries) == set(report.INSTANT_QUERIES) | set(report.RANGE_QUERIES)
    assert all("$" not in q for q in queries.values())
    assert queries["allocated_h"].endswith("[900s:5s])) * 5 / 3600")
    assert "kube_pod_container_resource_requests" in queries["allocated_h"]
    assert 'kube_pod_status_phase{phase="Running"}' in queries["allocated_h"]
    assert queries["computing_h"].startswith("sum by (namespace, node, modelName, GPU_I_PROFILE) (sum_over_time(("
                                             "((DCGM_FI_DEV_GPU_UTIL{pod!=\"\"} / 100")
    # A device a pod holds computes for it while it is Running (as allocated counts it); a shared one as it is.
    assert 'group_left () (max by (namespace, pod) (kube_pod_status_phase{phase="Running"}) == 1))' \
        in queries["computing_h"] and 'or DCGM_FI_DEV_GPU_UTIL{pod=""} / 100' in queries["computing_h"]
    assert queries["utilization"] == report.UTILIZATION  # range queries have no window of their own
    # Longer windows, longer steps: at most MAX_STEPS points a series.
    assert [report.step_for(w) for w in (60, 900, 3600, 7200, 86400)] == [5, 5, 5, 10, 120]


def test_allocated_computing_and_idle_gpu_hours_of_a_busy_and_an_idle_card():
    # One hour: team-a's pod holds gpu0 and computes at 50 %; dev's holds gpu1 and computes nothing; gpu2 is free.
    r = build({
        "gpus_now": vector(held("team-a", "n1", 1), held("dev", "n1", 1)),
        "allocated_h": vector(held("team-a", "n1", 1.0), held("dev", "n1", 1.0)),
        "computing_h": vector(device("team-a", "n1", 0.5), device("dev", "n1", 0), device("", "n1", 0)),
        "idle_h": vector(device("team-a", "n1", 0), device("dev", "n1", 1.0)),
        "idle_now": vector(device("team-a", "n1", 0), device("dev", "n1", 1)),
        "quota": quota("team-a", 1, 2),
        "gpu_nodes": nodes(("n1", H100), ("n2", H100)),
        "scrapes": vector(({}, 720)),
    })
    ns = {u.name: u for u in r.namespaces}
    assert set(ns) == {"team-a", "dev"}
    assert (ns["team-a"].allocated_h, ns["team-a"].computing_h, ns["team-a"].idle_h) == (1.0, 0.5, 0)
    assert ns["team-a"].quota == "1/2" and ns["team-a"].efficiency == 0.5
    assert (ns["dev"].allocated_h, ns["dev"].computing_h, ns["dev"].idle_h, ns["dev"].idle_now) == (1.0, 0, 1.0, 1)
    # Every GPU node has a row, the one with nothing held too.
    assert [(u.name, u.gpus_now, u.idle_now) for u in r.nodes] == [("n1", 2, 1), ("n2", 0, 0)]
    assert r.total.efficiency == pytest.approx(0.25)
    assert r.scrapes == 720
    text = r.text()
    assert "team-a" in text and "1/2" in text and "1 of 2 allocated GPUs idle now" in text
    assert "720 DCGM exporter scrapes" in text and "every 5 s" in text


def test_a_time_sliced_card_splits_its_allocation_and_counts_its_computing_for_its_node():
    # Two pods of two namespaces on one card time-sliced in 2 (UNIT_SHARE made each replica half a GPU):
    # DCGM names neither, so its 60 % counts for the node, and neither namespace looks idle.
    r = build({
        "gpus_now": vector(held("a", "n1", 0.5), held("b", "n1", 0.5)),
        "allocated_h": vector(held("a", "n1", 0.5), held("b", "n1", 0.5)),
        "computing_h": vector(device("", "n1", 0.6)),
        "idle_h": [], "idle_now": [],
        "gpu_nodes": nodes(("n1", H100)),
    })
    ns = {u.name: u for u in r.namespaces}
    assert (ns["a"].allocated_h, ns["a"].computing_h, ns["a"].idle_h, ns["a"].gpus_now) == (0.5, 0, 0, 0.5)
    assert ns["b"].allocated_h == 0.5
    [node] = r.nodes
    assert (node.gpus_now, node.allocated_h, node.computing_h, node.idle_h) == (1.0, 1.0, 0.6, 0)
    # A report of one namespace: its share only, and no computing it cannot be given.
    only_a = build({"allocated_h": vector(held("a", "n1", 0.5), held("b", "n1", 0.5)),
                    "computing_h": vector(device("", "n1", 0.6)), "gpu_nodes": nodes(("n1", H100))}, namespace="a")
    assert [u.name for u in only_a.namespaces] == ["a"]
    assert (only_a.nodes[0].allocated_h, only_a.nodes[0].computing_h) == (0.5, 0)


def test_mig_instances_count_as_their_share_of_the_gpus_model():
    # Mixed strategy: a 1g.10gb of an H100 is 1/7 of a GPU, a 1g.6gb of an A30 1/4; both computing flat out.
    r = build({
        "allocated_h": vector(held("c", "n3", 1.0, "nvidia_com_mig_1g_10gb"),
                              held("d", "n4", 2.0, "nvidia_com_mig_1g_6gb")),
        "gpus_now": vector(held("c", "n3", 1, "nvidia_com_mig_1g_10gb")),
        "computing_h": vector(device("c", "n3", 1.0, "1g.10gb"), device("", "n3", 0, "3g.40gb"),
                              device("d", "n4", 2.0, "1g.6gb", "NVIDIA A30")),
        "gpu_nodes": nodes(("n3", H100), ("n4", "NVIDIA A30")),
    })
    ns = {u.name: u for u in r.namespaces}
    assert ns["c"].allocated_h == pytest.approx(1 / 7) and ns["c"].computing_h == pytest.approx(1 / 7)
    assert ns["c"].gpus_now == pytest.approx(1 / 7)
    assert ns["d"].allocated_h == pytest.approx(0.5) and ns["d"].computing_h == pytest.approx(0.5)
    assert report.mig_resource_share(H100, "nvidia_com_mig_3g_40gb") == pytest.approx(3 / 7)
    assert report.mig_resource_share("NVIDIA A30", "nvidia_com_mig_1g_6gb_me") == 0.25


def test_an_unknown_gpu_model_or_profile_is_an_error_not_a_guessed_share():
    with pytest.raises(ValueError, match=r"MIG devices 1g\.10gb on n3: unknown GPU model 'NVIDIA Z9'"):
        build({"computing_h": vector(({"node": "n3", "modelName": "NVIDIA Z9", "GPU_I_PROFILE": "1g.10gb"}, 1))})
    with pytest.raises(ValueError, match="no MIG profile with the resource 'nvidia_com_mig_1g_6gb'"):
        build({"allocated_h": vector(held("c", "n3", 1, "nvidia_com_mig_1g_6gb")), "gpu_nodes": nodes(("n3", H100))})
    with pytest.raises(ValueError, match="no DCGM series name the node's GPU model"):
        build({"allocated_h": vector(held("c", "n9", 1, "nvidia_com_mig_1g_10gb"))})


def test_a_namespace_with_quota_but_no_gpu_has_a_row_with_its_quota():
    r = build({"quota": quota("empty", 0, 4) + quota("empty", 0, 4, "limits.nvidia.com/gpu"),
               "gpu_nodes": nodes(("n1", H100))})
    [row] = r.namespaces
    assert (row.name, row.quota, row.allocated_h, row.efficiency) == ("empty", "0/4, 0/4 (limits)", 0, None)
    assert "no DCGM exporter scrapes in this window" in r.text()
    assert report.table_rows("NAMESPACE", r.namespaces, True)[1][0]["EFFICIENCY"] == "-"


def test_preemptions_come_from_the_schedulers_events_with_the_preemptor():
    events = [{"reason": "Preempted", "involvedObject": {"namespace": "team-b", "name": "batch-train"},
               "message": "Preempted by pod 1234-abcd on node gpu-node-1", "lastTimestamp": "2026-12-02T10:00:00Z"},
              {"reason": "Preempted", "involvedObject": {"namespace": "team-b", "name": "older"},
               "message": "Preempted by pod 99 on node gpu-node-1", "lastTimestamp": "2026-12-02T08:00:00Z"},
              {"reason": "Scheduled", "involvedObject": {"namespace": "x", "name": "y"}, "message": "ok"}]
    pods = [{"metadata": {"namespace": "team-a", "name": "critical-train", "uid": "1234-abcd"}}]
    since = datetime(2026, 12, 2, 9, tzinfo=timezone.utc).timestamp()
    found = report.preemptions(events, pods, since=since)
    assert [(p.namespace, p.pod, p.node, p.by) for p in found] == [
        ("team-b", "batch-train", "gpu-node-1", "team-a/critical-train")]
    r = build({}, preempted=found, queries={"scrapes": "sum(...)"})
    assert "team-b/batch-train on gpu-node-1 by team-a/critical-train" in r.text()
    assert r.to_dict()["preemptions"][0]["by"] == "team-a/critical-train"
    assert r.to_dict()["queries"] == {"scrapes": "sum(...)"}
    assert build({}, preempted=found, namespace="other").preemptions == []


def test_device_timelines_say_who_held_each_card_and_the_plots_draw_them(tmp_path):
    t = [END - 15 + 5 * i for i in range(4)]
    gpu0, gpu1 = {"node": "n1", "gpu": "0"}, {"node": "n1", "gpu": "1"}
    mig = {"node": "n3", "gpu": "0", "GPU_I_ID": "7", "GPU_I_PROFILE": "1g.10gb"}
    r = build({
        "utilization": matrix((gpu1, [(x, 0) for x in t]), (gpu0, [(x, 90) for x in t[1:]]),
                              (mig, [(x, 40) for x in t])),
        "holders": matrix(({**gpu0, "namespace": "a"}, [(x, 16384) for x in t[1:]]),
                          (gpu0, [(t[0], 0)]),                                  # free, then a's
                          (gpu1, [(x, 8000) for x in t]),                       # in use, no pod named: shared
                          ({**mig, "namespace": "b"}, [(x, 100) for x in t])),
    })
    devices = {d.key: d for d in r.devices}
    assert list(devices) == ["n1/gpu0", "n1/gpu1", "n3/gpu0/mig7-1g.10gb"]
    assert devices["n1/gpu0"].held_by == ["", "a", "a", "a"]
    assert devices["n1/gpu0"].utilization == [None, 90, 90, 90]
    assert devices["n1/gpu1"].held_by == [report.SHARED] * 4
    assert devices["n3/gpu0/mig7-1g.10gb"].held_by == ["b"] * 4
    written = plots.save(r, tmp_path)
    assert [p.name for p in written] == ["utilization.png", "allocation.png"]
    for p in written:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("status,body,says", [
    (404, {"kind": "Status", "message": 'services "prometheus" not found', "reason": "NotFound", "code": 404},
     ['Prometheus is not installed (404: services "prometheus" not found)', "`gpulab addon install monitoring`"]),
    (503, {"kind": "Status", "message": 'no endpoints available for service "prometheus"', "code": 503},
     ['503: no endpoints available for service "prometheus"', "kubectl -n monitoring get pods",
      "`gpulab addon install monitoring`"]),
    (403, {"kind": "Status", "message": "forbidden", "code": 403}, ["`get` on `services/proxy` in namespace monitoring"]),
])
def test_what_the_service_proxy_answers_becomes_an_error_that_says_what_to_run(status, body, says):
    error = prometheus.unavailable(status, json.dumps(body))
    assert isinstance(error, prometheus.PrometheusUnavailable)
    for words in says:
        assert words in str(error)


def _closed_port_kubeconfig(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = tmp_path / "kubeconfig"
    path.write_text(textwrap.dedent(f"""\
        apiVersion: v1
        kind: Config
        clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
        users: [{{name: u, user: {{token: t}}}}]
        contexts: [{{name: c, context: {{cluster: c, user: u}}}}]
        current-context: c
        """))
    return path, port


def test_connect_proxies_through_the_apiserver_and_says_when_it_cannot_reach_it(tmp_path):
    assert prometheus.proxy_url("https://127.0.0.1:6443/") == \
        "https://127.0.0.1:6443/api/v1/namespaces/monitoring/services/prometheus:9090/proxy"
    config, port = _closed_port_kubeconfig(tmp_path)
    with pytest.raises(prometheus.PrometheusUnavailable, match=rf"cannot reach the apiserver at http://127.0.0.1:{port}"):
        prometheus.connect(config, timeout=2)


def test_gpulab_report_without_the_add_on_fails_with_what_to_run_and_writes_nothing(tmp_path, monkeypatch):
    config, _ = _closed_port_kubeconfig(tmp_path)

    def not_installed(kubeconfig, timeout=10.0):
        assert kubeconfig == config
        raise prometheus.unavailable(404, json.dumps({"kind": "Status", "message": 'services "prometheus" not found'}))

    monkeypatch.setattr(prometheus, "connect", not_installed)
    out = tmp_path / "out"
    result = CliRunner().invoke(cli.main, ["report", "--since", "10m", "--out", str(out)],
                                env={"KUBECONFIG": str(config), "GPULAB_HOME": str(tmp_path)})
    assert result.exit_code == 1, result.output
    assert "gpulab: error: Prometheus is not installed" in result.output
    assert "`gpulab addon install monitoring`" in result.output
    assert not out.exists()
    assert isinstance(result.exception, SystemExit)  # an exit with the message, no traceback


@pytest.mark.parametrize("text,seconds", [("90s", 90), ("15m", 900), ("2h", 7200), ("1d", 86400), ("30", 30)])
def test_parse_since(text, seconds):
    assert usage.parse_since(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "5x", "-5m", "0s"])
def test_parse_since_rejects_what_is_not_a_duration(text):
    with pytest.raises(ValueError, match="--since"):
        usage.parse_since(text)
