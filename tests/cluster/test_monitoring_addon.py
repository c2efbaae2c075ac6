"""The monitoring add-on on the real cluster: Prometheus, kube-state-metrics and prometheus-adapter.

`gpulab addon install monitoring` applies manifests/addons/monitoring/ as a team applies a chart;
Prometheus finds its targets through kubernetes_sd_configs and scrapes them on the pod network (the
DCGM exporter at its pod's IP), and prometheus-adapter serves custom.metrics.k8s.io from PromQL. The
module deletes the add-on afterwards and gives custom.metrics.k8s.io back to the built-in adapter,
as the next `gpulab up` would.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.parse

import pytest
from gpu_support import gpu_namespace, manifest, wait_phase
from helpers import NEEDS_POD_NETWORK, wait_for

from gpulab.cluster import addons
from gpulab.fakegpu import monitoring

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
    # What `gpulab up` does: the built-in adapter serves custom.metrics.k8s.io again.
    state = json.loads((cluster.root / "state.json").read_text())
    monitoring.install(cluster.kubeconfig, cluster.root / "pki", state["ports"]["custom-metrics"], lambda m: None)


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
    # prometheus-adapter: the same value through the aggregation layer (after its relist, 30 s at most).
    raw = f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/*/DCGM_FI_DEV_FB_USED"

    def served():
        out = kubectl("get", "--raw", raw, check=False)
        items = json.loads(out.stdout).get("items") if out.returncode == 0 else None
        return items and {i["describedObject"]["name"]: i["value"] for i in items}

    assert wait_for(served, 60, what="the adapter serving the pod's metric") == {"dev-notebook": str(20 * 1024)}


def test_the_add_on_owns_custom_metrics_and_a_restart_would_leave_it_there(stack, kube):
    for version in ("v1beta1", "v1beta2"):
        svc = kube.get("APIService", f"{version}.custom.metrics.k8s.io")
        assert svc["spec"]["service"] == {"namespace": "monitoring", "name": "prometheus-adapter", "port": 443}
        assert addons.owns_api_service(kube, f"{version}.custom.metrics.k8s.io")


def _ready_replicas(kube, ns: str, name: str) -> int:
    return ((kube.get("Deployment", name, ns) or {}).get("status") or {}).get("readyReplicas") or 0


def test_an_hpa_scales_on_gpu_utilisation_through_prometheus_and_the_adapter(stack, kube, kubectl, gpu_ns):
    ns = gpu_ns
    for f in ("07-monitoring-cost/llm-autoscaled.yaml", "07-monitoring-cost/llm-hpa.yaml"):
        kubectl("-n", ns, "apply", "-f", str(manifest(f)))
    wait_for(lambda: _ready_replicas(kube, ns, "llm") == 1, 60, what="one ready llm replica")
    # The adapter lists the new pod's series at its next relist (30 s): the HPA reads a value then.
    wait_for(lambda: ((kube.get("HorizontalPodAutoscaler", "llm", ns) or {}).get("status") or {}).get("currentMetrics"),
             90, what="the HPA's first reading through prometheus-adapter")
    # 5 requests/s of 16 tokens: one replica computes ~80 % of the time, twice the 40 % target.
    assert gpulab("load", "svc/llm", "5", "-n", ns, timeout=120).returncode == 0
    wait_for(lambda: _ready_replicas(kube, ns, "llm") == 2, 120, what="the HPA to scale llm to 2")
    events = [e["message"] for e in kube.list("Event", ns, field_selector="reason=SuccessfulRescale")]
    assert any("DCGM_FI_DEV_GPU_UTIL above target" in m for m in events), events
    assert gpulab("load", "svc/llm", "0", "-n", ns, timeout=120).returncode == 0


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
