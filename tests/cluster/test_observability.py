"""GPU observability on the real cluster: DCGM exporter, custom metrics, HPA, quota, preemption, report.

The HPA here is kube-controller-manager's: it reads ``DCGM_FI_DEV_GPU_UTIL``
per pod through the aggregation layer from the custom metrics adapter, and
scales the Deployment out when ``gpulab load`` sends requests to its Service and back
in (after its 15 s stabilisation window) when it stops.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import yaml
from gpu_support import gpu_namespace, manifest, wait_gpus_free, wait_phase
from helpers import wait_for
from prometheus_client.parser import text_string_to_metric_families

from gpulab import usage
from gpulab.kube import api
from gpulab.fakegpu import load, monitoring
from gpulab.notebook.quantity import parse as parse_quantity
from gpulab.usage import samples

pytestmark = pytest.mark.cluster


def apply(kubectl, ns: str, *files: str) -> None:
    kubectl("-n", ns, "apply", *[a for f in files for a in ("-f", str(manifest(f)))])


def gpulab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpulab.cli", *args], capture_output=True, text=True, timeout=120)


def ready_replicas(kube, ns: str, name: str) -> int:
    return int(((kube.get("Deployment", name, ns) or {}).get("status") or {}).get("readyReplicas") or 0)


def sampled(cluster, namespace: str) -> bool:
    """Whether the adapter's latest usage sample shows ``namespace`` holding a GPU."""
    snaps = samples.Store(samples.store_path(cluster.root)).read(since=time.time() - 10)
    return bool(snaps) and any(h[0] == namespace for d in snaps[-1].devices for h in d.holders)


@pytest.fixture
def gpu_ns(kube):
    with gpu_namespace(kube, "obs") as name:
        yield name


def test_exporter_series_parse_as_prometheus_text_and_follow_the_pods(kube, kubectl, gpu_ns):
    ns = gpu_ns
    apply(kubectl, ns, "07-monitoring-cost/dev-notebook.yaml")
    wait_phase(kube, ns, "dev-notebook", "Running")

    def page():
        pages = monitoring.scrape_all(kube)
        text = pages.get("gpu-node-1", "")
        return text if 'pod="dev-notebook"' in text else None

    text = wait_for(page, 30, what="the exporter to name dev-notebook")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_TEMP",
                 "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"):
        assert families[name].type == "gauge" and len(families[name].samples) == 2, name
    held = {s.name: s for f in families.values() for s in f.samples if s.labels.get("pod") == "dev-notebook"}
    labels = held["DCGM_FI_DEV_FB_USED"].labels
    assert {k: labels[k] for k in ("namespace", "container", "Hostname", "modelName")} == {
        "namespace": ns, "container": "notebook", "Hostname": "gpu-node-1", "modelName": "NVIDIA H100 80GB HBM3"}
    # The chapter's cost case: the card is held, its memory used, and it computes nothing.
    assert held["DCGM_FI_DEV_FB_USED"].value == 20 * 1024
    assert held["DCGM_FI_DEV_GPU_UTIL"].value == 0
    # The same page, as a user's own Prometheus would scrape it.
    targets = yaml.safe_load(gpulab("metrics", "--targets").stdout)
    [job] = targets["scrape_configs"]
    assert job["static_configs"][0]["labels"] == {"node": "gpu-node-1"}


def test_custom_metrics_api_serves_per_pod_gpu_utilisation(kube, kubectl, cluster, gpu_ns):
    ns = gpu_ns
    apply(kubectl, ns, "07-monitoring-cost/dev-notebook.yaml")
    wait_phase(kube, ns, "dev-notebook", "Running")
    kubectl("wait", "--for=condition=Available", "apiservice/v1beta2.custom.metrics.k8s.io", "--timeout=60s")
    path = f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/*/DCGM_FI_DEV_FB_USED"

    def values():
        body = json.loads(kubectl("get", "--raw", path).stdout)
        return {i["describedObject"]["name"]: i["value"] for i in body["items"]} or None

    # The first scrape may come before the container holds its memory (a value of 0): wait for it.
    want = {"dev-notebook": str(20 * 1024)}
    assert wait_for(lambda: values() == want, 30, what=f"custom metric values {want}")
    # Only the aggregation layer may call the adapter directly.
    port = json.loads((cluster.root / "state.json").read_text())["ports"]["custom-metrics"]
    ctx = ssl.create_default_context(cafile=str(cluster.root / "pki" / "ca.crt"))
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", context=ctx, timeout=5)


def test_hpa_on_gpu_utilisation_scales_out_and_back_in(kube, kubectl, gpu_ns):
    ns = gpu_ns
    apply(kubectl, ns, "07-monitoring-cost/llm-autoscaled.yaml", "07-monitoring-cost/llm-hpa.yaml")
    wait_for(lambda: ready_replicas(kube, ns, "llm") == 1, 60, what="one ready llm replica")

    # 5 requests/s of 16 tokens × 10 ms through the Service: one replica computes 80 % of the time.
    out = gpulab("load", "svc/llm", "5", "-n", ns)
    assert out.returncode == 0, out.stderr
    assert f"deployment.apps/load-llm created: 5 requests/s of 16 tokens to http://llm.{ns}.svc:80" in out.stdout
    # One replica at ~80 % against a 40 % target: the HPA controller asks for ceil(1 × 80 / 40) = 2.
    wait_for(lambda: ready_replicas(kube, ns, "llm") == 2, 120, what="the HPA to scale llm to 2")
    hpa = wait_for(lambda: (h := kube.get("HorizontalPodAutoscaler", "llm", ns))
                   and (h.get("status") or {}).get("currentMetrics") and
                   25 <= parse_quantity(h["status"]["currentMetrics"][0]["pods"]["current"]["averageValue"]) <= 55 and h,
                   60, what="two replicas sharing the traffic at about 40 % each")
    assert hpa["status"]["desiredReplicas"] == 2
    served = kubectl("-n", ns, "logs", "deploy/load-llm", "--tail=1").stdout
    assert " failed 0 " in served and "| total sent" in served, served  # the generator's line for one second

    assert gpulab("load", "svc/llm", "0", "-n", ns).returncode == 0
    wait_for(lambda: (kube.get("Deployment", "llm", ns) or {}).get("spec", {}).get("replicas") == 1, 120,
             what="the HPA to scale llm back to 1")
    # The controller records its event after it scales: wait for it rather than read once.
    reasons = wait_for(lambda: (r := [e["message"] for e in kube.list("Event", ns, field_selector="reason=SuccessfulRescale")])
                       and any("below target" in m for m in r) and r, 30, what="the scale-in event")
    assert any("above target" in m for m in reasons), reasons


def test_quota_on_gpus_rejects_the_pod_with_the_apiservers_message(kube, kubectl, ns):
    apply(kubectl, ns, "07-monitoring-cost/gpu-quota.yaml")
    wait_for(lambda: ((kube.get("ResourceQuota", "gpu-quota", ns) or {}).get("status") or {}).get("hard"), 30,
             what="the quota controller to fill in the quota's status")
    proc = kubectl("-n", ns, "apply", "-f", str(manifest("07-monitoring-cost/two-gpu-train.yaml")), check=False)
    assert proc.returncode != 0
    assert ('pods "two-gpu-train" is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=2, '
            'used: requests.nvidia.com/gpu=0, limited: requests.nvidia.com/gpu=1') in proc.stderr


def test_a_critical_pod_preempts_batch_work_and_the_report_shows_it(kube, kubectl, cluster, tmp_path):
    team_a, team_b = "team-a-obs", "team-b-obs"
    wait_gpus_free(kube)
    for name in (team_a, team_b):
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        wait_for(lambda n=name: kube.get("ServiceAccount", "default", n), 30, what="default service account")
    kubectl("apply", "-f", str(manifest("07-monitoring-cost/priority-classes.yaml")))
    try:
        started = time.time()
        # The lesson's Job trains 10 one-second steps; here it must outlast the wait for a usage sample.
        batch = tmp_path / "batch-train.yaml"
        text = manifest("07-monitoring-cost/batch-train.yaml").read_text()
        assert "STEPS=10\n" in text
        batch.write_text(text.replace("STEPS=10\n", "STEPS=600\n"))
        kubectl("-n", team_b, "apply", "-f", str(batch))
        [victim_name] = [p["metadata"]["name"] for p in wait_for(
            lambda: [p for p in kube.list("Pod", team_b, label_selector="job-name=batch-train")
                     if p["status"].get("phase") == "Running"], 60, what="the batch-train Job's pod Running")]
        wait_for(lambda: sampled(cluster, team_b), 20, what=f"a usage sample with {team_b} holding GPUs")
        # ... and the critical pod (14 s in the lesson) must still hold its card when the report is taken.
        critical = tmp_path / "critical-train.yaml"
        text = manifest("07-monitoring-cost/critical-train.yaml").read_text()
        assert "sleep 14;" in text
        critical.write_text(text.replace("sleep 14;", "sleep 600;"))
        kubectl("-n", team_a, "apply", "-f", str(critical))
        # kube-scheduler finds no free GPU, evicts the lower-priority pod, then binds the critical one.
        wait_phase(kube, team_a, "critical-train", "Running", timeout=90)
        victim = kube.get("Pod", victim_name, team_b)
        assert victim is None or victim["metadata"].get("deletionTimestamp") or \
            victim["status"].get("phase") == "Failed"
        events = kube.list("Event", team_b, field_selector="reason=Preempted")
        assert events and "Preempted by pod" in events[0]["message"]

        wait_for(lambda: sampled(cluster, team_a), 20, what=f"a usage sample with {team_a} holding a GPU")
        report = usage.collect(cluster.root, api.Client(cluster.kubeconfig), since=time.time() - started + 5)
        [preempted] = [p for p in report.preemptions if p.namespace == team_b]
        assert (preempted.pod, preempted.node, preempted.by) == (victim_name, "gpu-node-1",
                                                                  f"{team_a}/critical-train")
        ns_usage = {u.name: u for u in report.namespaces}
        assert ns_usage[team_a].gpus_now == 1 and ns_usage[team_a].computing_h > 0
        assert ns_usage[team_b].allocated_h > 0 and ns_usage[team_b].gpus_now == 0
        text = gpulab("report", "--since", "10m").stdout
        assert f"{team_b}/{victim_name} on gpu-node-1 by {team_a}/critical-train" in text
    finally:
        for name in (team_a, team_b):
            kube.delete("Namespace", name)
        for pc in ("gpu-critical", "gpu-batch"):
            kube.delete("PriorityClass", pc)
        wait_gpus_free(kube, timeout=90)


def test_load_errors_name_the_missing_service(kube, ns):
    with pytest.raises(load.LoadError, match=f"Service {ns}/nope not found"):
        load.set_load(kube, "svc/nope", "5", ns)
