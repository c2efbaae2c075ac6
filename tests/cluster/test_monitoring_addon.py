"""The monitoring add-on on the real cluster: Prometheus, kube-state-metrics and prometheus-adapter.

`gpulab addon install monitoring` applies manifests/addons/monitoring/ as a team applies a chart;
Prometheus finds its targets through kubernetes_sd_configs and scrapes them on the pod network (the
DCGM exporter at its pod's IP), prometheus-adapter serves custom.metrics.k8s.io from PromQL (the only
server of that API: the real HPA controller scales on GPU utilisation through it), and `gpulab report`
adds GPU-hours up with PromQL. The add-on is installed once for the module and deleted afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse

import pytest
from gpu_support import gpu_namespace, manifest, wait_phase
from helpers import NEEDS_POD_NETWORK, wait_for

from gpulab import usage
from gpulab.notebook.quantity import parse as parse_quantity
from gpulab.usage import plots, prometheus

pytestmark = [pytest.mark.cluster, NEEDS_POD_NETWORK]


def gpulab(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpulab.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def stack(cluster, kube):
    out = gpulab("addon", "install", "monitoring")
    assert out.returncode == 0, out.stderr
    yield out
    assert gpulab("addon", "delete", "monitoring").returncode == 0
    wait_for(lambda: kube.get("Namespace", "monitoring") is None, 90, what="namespace monitoring deleted")


@pytest.fixture
def gpu_ns(kube):
    with gpu_namespace(kube, "mon") as name:
        yield name


def query(kubectl, promql: str) -> list[dict]:
    """An instant query through the apiserver's service proxy, as `kubectl get --raw` sends it."""
    path = ("/api/v1/namespaces/monitoring/services/prometheus:9090/proxy/api/v1/query?"
            + urllib.parse.urlencode({"query": promql}))
    body = json.loads(kubectl("get", "--raw", path).stdout)
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_install_says_what_it_waited_for_and_a_second_install_changes_nothing(stack):
    for line in ("monitoring: applied", "deployment monitoring/prometheus available",
                 "deployment monitoring/kube-state-metrics available",
                 "deployment monitoring/prometheus-adapter available",
                 "APIService v1beta2.custom.metrics.k8s.io available"):
        assert line in stack.stderr
    assert stack.stdout.startswith("add-on monitoring installed in ")
    again = gpulab("addon", "install", "monitoring")
    assert again.returncode == 0 and "taken over" not in again.stderr
    listed = gpulab("addon", "list")
    assert listed.stdout.split()[:2] == ["monitoring", "installed"]


def test_prometheus_finds_and_scrapes_its_targets_on_the_pod_network(stack, kubectl, kube):
    path = "/api/v1/namespaces/monitoring/services/prometheus:9090/proxy/api/v1/targets"

    def targets():
        active = json.loads(kubectl("get", "--raw", path).stdout)["data"]["activeTargets"]
        health = {t["labels"]["job"]: (t["health"], t["scrapeUrl"]) for t in active}
        return health if all(h == "up" for h, _ in health.values()) and len(health) >= 3 else None

    found = wait_for(targets, 60, what="every target up")
    assert set(found) >= {"dcgm-exporter", "kube-state-metrics", "prometheus"}
    # The exporter is scraped at its pod's IP, port 9400: the pod network, not the host.
    exporter = kube.list("Pod", "gpu-operator", label_selector="app=nvidia-dcgm-exporter")[0]
    assert found["dcgm-exporter"][1] == f"http://{exporter['status']['podIP']}:9400/metrics"
    assert query(kubectl, 'up{job="dcgm-exporter"}')[0]["value"][1] == "1"


def test_a_gpu_pods_series_carry_its_namespace_and_pod_and_the_adapter_serves_them(stack, kube, kubectl, gpu_ns):
    ns = gpu_ns
    kubectl("-n", ns, "apply", "-f", str(manifest("07-monitoring-cost/dev-notebook.yaml")))
    wait_phase(kube, ns, "dev-notebook", "Running")
    # DCGM's series of the card it holds: namespace/pod of the holder (honor_labels keeps them).
    series = wait_for(lambda: query(kubectl, f'DCGM_FI_DEV_FB_USED{{namespace="{ns}",pod="dev-notebook"}}'),
                      30, what="the pod's DCGM series")
    assert series[0]["value"][1] == str(20 * 1024) and series[0]["metric"]["container"] == "notebook"
    assert "exported_pod" not in series[0]["metric"]
    # kube-state-metrics: what it asked for.
    requests = wait_for(lambda: query(kubectl, f'kube_pod_container_resource_requests{{namespace="{ns}",'
                                               f'resource="nvidia_com_gpu"}}'), 30, what="the pod's GPU request")
    assert requests[0]["metric"]["pod"] == "dev-notebook" and requests[0]["value"][1] == "1"
    # prometheus-adapter: the same value through the aggregation layer (after its relist, 10 s at most).
    raw = f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/*/DCGM_FI_DEV_FB_USED"

    def served():
        out = kubectl("get", "--raw", raw, check=False)
        items = json.loads(out.stdout).get("items") if out.returncode == 0 else None
        return items and {i["describedObject"]["name"]: i["value"] for i in items}

    assert wait_for(served, 60, what="the adapter serving the pod's metric") == {"dev-notebook": str(20 * 1024)}


def test_the_add_on_serves_custom_metrics_through_the_aggregation_layer(stack, kube):
    for version in ("v1beta1", "v1beta2"):
        svc = kube.get("APIService", f"{version}.custom.metrics.k8s.io")
        assert svc["spec"]["service"] == {"namespace": "monitoring", "name": "prometheus-adapter", "port": 443}


def test_the_cost_query_shows_a_card_held_idle_beside_a_busy_one(stack, cluster, kube, kubectl, tmp_path):
    """The issue's cost query: one pod keeps its card 90 % busy, another holds one and computes nothing;
    gpulab report's PromQL finds allocated > computing, and the idle one's hours idle."""
    with gpu_namespace(kube, "busy") as busy:
        idle = f"idle-{busy.split('-', 1)[1]}"
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": idle}})
        wait_for(lambda: kube.get("ServiceAccount", "default", idle), 30, what="default service account")
        started = time.time()
        try:
            kubectl("-n", busy, "apply", "-f", str(manifest("07-monitoring-cost/gpu-busy.yaml")))
            kubectl("-n", idle, "apply", "-f", str(manifest("07-monitoring-cost/dev-notebook.yaml")))
            wait_phase(kube, busy, "gpu-busy", "Running")
            wait_phase(kube, idle, "dev-notebook", "Running")
            prom = prometheus.connect(cluster.kubeconfig)
            both_running = time.time()
            # What the lessons' wait_scrape() waits for: scrapes of the exporter and kube-state-metrics since.
            wait_for(lambda: (prometheus.last_scrape(prom) or 0) > both_running + 10, 40,
                     what="Prometheus scraping both pods' cards for 10 s")
            prom.close()

            def rows():
                r = usage.collect(cluster.kubeconfig, since=time.time() - started + 5)
                by_ns = {u.name: u for u in r.namespaces}
                return busy in by_ns and idle in by_ns and by_ns[busy].computing_h > 0 and by_ns[idle].idle_h > 0 \
                    and (r, by_ns)

            report, by_ns = wait_for(rows, 30, what="the report to show both namespaces")
            b, i = by_ns[busy], by_ns[idle]
            assert (b.gpus_now, b.idle_now, i.gpus_now, i.idle_now) == (1, 0, 1, 1)
            # (At most a scrape or two may see its card before its program loads it.)
            assert b.allocated_h > b.computing_h > 0 and b.idle_h <= 2 * 5 / 3600
            assert 0.5 < b.efficiency <= 0.9 + 1e-9   # 90 % while DCGM names it, from the moment it runs
            assert i.allocated_h >= i.idle_h > 0 and i.computing_h == 0 and i.efficiency == 0
            node = next(u for u in report.nodes if u.name == "gpu-node-1")
            assert (node.gpus_now, node.idle_now) == (2, 1)
            assert set(report.queries) == {"gpus_now", "allocated_h", "computing_h", "idle_h", "idle_now", "quota",
                                           "gpu_nodes", "scrapes", "utilization", "holders"}
            assert report.scrapes > 2
            # The pictures: who held each card, over the same steps.
            holders = [set(d.held_by) for d in report.devices if d.key.startswith("gpu-node-1/")]
            assert len(holders) == 2 and any(busy in h for h in holders) and any(idle in h for h in holders)
            assert [p.name for p in plots.save(report, tmp_path)] == ["utilization.png", "allocation.png"]
            # gpulab report, for one namespace, as JSON.
            out = gpulab("report", "--since", "10m", "-n", idle, "--json", timeout=120)
            assert out.returncode == 0, out.stderr
            doc = json.loads(out.stdout)
            [row] = doc["namespaces"]
            assert row["name"] == idle and row["gpu_hours_idle"] > 0 and row["gpus_now"] == 1
            assert "kube_pod_container_resource_requests" in doc["queries"]["allocated_h"]
        finally:
            # dev-notebook's shell ignores SIGTERM: without a short grace its card stays held for 30 s.
            kubectl("-n", idle, "delete", "pod", "dev-notebook", "--grace-period=1", "--wait=false", check=False)
            kube.delete("Namespace", idle)  # gpu_namespace then waits until both cards are free


def _ready_replicas(kube, ns: str, name: str) -> int:
    return ((kube.get("Deployment", name, ns) or {}).get("status") or {}).get("readyReplicas") or 0


def test_an_hpa_scales_on_gpu_utilisation_through_prometheus_and_the_adapter_out_and_back_in(stack, kube, kubectl,
                                                                                              gpu_ns):
    ns = gpu_ns
    for f in ("07-monitoring-cost/llm-autoscaled.yaml", "07-monitoring-cost/llm-hpa.yaml"):
        kubectl("-n", ns, "apply", "-f", str(manifest(f)))
    wait_for(lambda: _ready_replicas(kube, ns, "llm") == 1, 60, what="one ready llm replica")
    # The adapter lists the new pod's series at its next relist (10 s): the HPA reads a value then.
    wait_for(lambda: ((kube.get("HorizontalPodAutoscaler", "llm", ns) or {}).get("status") or {}).get("currentMetrics"),
             90, what="the HPA's first reading through prometheus-adapter")
    # 5 requests/s of 16 tokens × 10 ms through the Service: one replica computes ~80 % of the time, twice the
    # 40 % target, so the HPA controller asks for ceil(1 × 80 / 40) = 2.
    out = gpulab("load", "svc/llm", "5", "-n", ns, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"deployment.apps/load-llm created: 5 requests/s of 16 tokens to http://llm.{ns}.svc:80" in out.stdout
    wait_for(lambda: _ready_replicas(kube, ns, "llm") == 2, 120, what="the HPA to scale llm to 2")
    hpa = wait_for(lambda: (h := kube.get("HorizontalPodAutoscaler", "llm", ns))
                   and (h.get("status") or {}).get("currentMetrics") and
                   25 <= parse_quantity(h["status"]["currentMetrics"][0]["pods"]["current"]["averageValue"]) <= 55 and h,
                   90, what="two replicas sharing the traffic at about 40 % each")
    assert hpa["status"]["desiredReplicas"] == 2
    served = kubectl("-n", ns, "logs", "deploy/load-llm", "--tail=1").stdout
    assert " failed 0 " in served and "| total sent" in served, served  # the generator's line for one second

    assert gpulab("load", "svc/llm", "0", "-n", ns, timeout=120).returncode == 0
    wait_for(lambda: (kube.get("Deployment", "llm", ns) or {}).get("spec", {}).get("replicas") == 1, 120,
             what="the HPA to scale llm back to 1")
    # The controller records its event after it scales: wait for it rather than read once.
    reasons = wait_for(lambda: (r := [e["message"] for e in kube.list("Event", ns, field_selector="reason=SuccessfulRescale")])
                       and any("below target" in m for m in r) and r, 30, what="the scale-in event")
    assert any("DCGM_FI_DEV_GPU_UTIL above target" in m for m in reasons), reasons


def test_an_adapter_rule_that_matches_nothing_leaves_the_hpa_with_failed_get_pods_metric(stack, kube, kubectl, gpu_ns):
    ns = gpu_ns
    config = kube.get("ConfigMap", "adapter-config", "monitoring")
    good = config["data"]["config.yaml"]
    # The mistake of a relabelling that renamed the pod label: the rule asks for series that do not exist.
    broken = good.replace('{__name__=~"^DCGM_FI_.*",namespace!="",pod!=""}',
                          '{__name__=~"^DCGM_FI_.*",namespace!="",exported_pod!=""}')
    assert broken != good
    try:
        kube.patch("ConfigMap", "adapter-config", {"data": {"config.yaml": broken}}, "monitoring")
        kubectl("-n", "monitoring", "rollout", "restart", "deployment/prometheus-adapter")
        kubectl("-n", "monitoring", "rollout", "status", "deployment/prometheus-adapter", "--timeout=120s")
        for f in ("07-monitoring-cost/llm-autoscaled.yaml", "07-monitoring-cost/llm-hpa.yaml"):
            kubectl("-n", ns, "apply", "-f", str(manifest(f)))
        failed = wait_for(lambda: [e["message"] for e in kube.list("Event", ns, field_selector="reason=FailedGetPodsMetric")],
                          90, what="the HPA's FailedGetPodsMetric event")
        assert any("DCGM_FI_DEV_GPU_UTIL" in m for m in failed), failed
        hpa = kube.get("HorizontalPodAutoscaler", "llm", ns)
        active = next(c for c in hpa["status"]["conditions"] if c["type"] == "ScalingActive")
        assert active["status"] == "False" and active["reason"] == "FailedGetPodsMetric"
    finally:
        kube.patch("ConfigMap", "adapter-config", {"data": {"config.yaml": good}}, "monitoring")
        kubectl("-n", "monitoring", "rollout", "restart", "deployment/prometheus-adapter")
        kubectl("-n", "monitoring", "rollout", "status", "deployment/prometheus-adapter", "--timeout=120s")


def test_a_changed_config_reaches_the_running_pods_and_prometheus_reloads_it(stack, kube, kubectl):
    # As an operator changes it: the ConfigMap first (kubectl apply), then the node syncs the mounted file.
    config = kube.get("ConfigMap", "prometheus-config", "monitoring")
    text = config["data"]["prometheus.yml"]
    changed = text.replace("scrape_interval: 5s", "scrape_interval: 6s")
    assert changed != text
    try:
        kube.patch("ConfigMap", "prometheus-config", {"data": {"prometheus.yml": changed}}, "monitoring")
        wait_for(lambda: kubectl("-n", "monitoring", "exec", "deploy/prometheus", "--", "cat",
                                 "/etc/prometheus/prometheus.yml").stdout == changed, 30,
                 what="the mounted prometheus.yml to change in the running pod")
        kubectl("create", "--raw", "/api/v1/namespaces/monitoring/services/prometheus:9090/proxy/-/reload",
                "-f", "/dev/null")
        loaded = json.loads(kubectl("get", "--raw", "/api/v1/namespaces/monitoring/services/prometheus:9090/"
                                                    "proxy/api/v1/status/config").stdout)["data"]["yaml"]
        assert "scrape_interval: 6s" in loaded
    finally:
        # The add-on's own file again: `gpulab addon install` sees the change and reloads, as it says.
        out = gpulab("addon", "install", "monitoring")
        assert out.returncode == 0, out.stderr
        assert "configmap prometheus-config changed: monitoring/prometheus reloaded its config" in out.stderr
    loaded = json.loads(kubectl("get", "--raw", "/api/v1/namespaces/monitoring/services/prometheus:9090/"
                                                "proxy/api/v1/status/config").stdout)["data"]["yaml"]
    assert "scrape_interval: 5s" in loaded
