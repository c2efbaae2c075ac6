"""GPU observability on the real cluster without the monitoring add-on: DCGM exporter, quota, preemption.

What needs Prometheus (custom metrics for the HPA, `gpulab report`'s GPU-hours) is in
test_monitoring_addon.py, which installs the add-on once; here `gpulab report` says to install it.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import yaml
from gpu_support import gpu_namespace, manifest, wait_gpus_free, wait_phase
from helpers import wait_for
from prometheus_client.parser import text_string_to_metric_families

from gpulab import usage
from gpulab.cluster import addons
from gpulab.fakegpu import dcgm, load
from gpulab.kube.names import MONITORING

pytestmark = pytest.mark.cluster


def apply(kubectl, ns: str, *files: str) -> None:
    kubectl("-n", ns, "apply", *[a for f in files for a in ("-f", str(manifest(f)))])


def gpulab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpulab.cli", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def gpu_ns(kube):
    with gpu_namespace(kube, "obs") as name:
        yield name


def test_exporter_series_parse_as_prometheus_text_and_follow_the_pods(kube, kubectl, gpu_ns):
    ns = gpu_ns
    apply(kubectl, ns, "07-monitoring-cost/dev-notebook.yaml")
    wait_phase(kube, ns, "dev-notebook", "Running")

    def page():
        pages = dcgm.scrape_all(kube)
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


def test_quota_on_gpus_rejects_the_pod_with_the_apiservers_message(kube, kubectl, ns):
    apply(kubectl, ns, "07-monitoring-cost/gpu-quota.yaml")
    wait_for(lambda: ((kube.get("ResourceQuota", "gpu-quota", ns) or {}).get("status") or {}).get("hard"), 30,
             what="the quota controller to fill in the quota's status")
    proc = kubectl("-n", ns, "apply", "-f", str(manifest("07-monitoring-cost/two-gpu-train.yaml")), check=False)
    assert proc.returncode != 0
    assert ('pods "two-gpu-train" is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=2, '
            'used: requests.nvidia.com/gpu=0, limited: requests.nvidia.com/gpu=1') in proc.stderr


def test_a_critical_pod_preempts_batch_work_and_usage_names_the_preemptor(kube, kubectl, tmp_path):
    team_a, team_b = "team-a-obs", "team-b-obs"
    wait_gpus_free(kube)
    for name in (team_a, team_b):
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        wait_for(lambda n=name: kube.get("ServiceAccount", "default", n), 30, what="default service account")
    kubectl("apply", "-f", str(manifest("07-monitoring-cost/priority-classes.yaml")))
    try:
        started = time.time()
        # The lesson's Job trains 30 one-second steps; here it must still run when the critical pod comes.
        batch = tmp_path / "batch-train.yaml"
        text = manifest("07-monitoring-cost/batch-train.yaml").read_text()
        assert "STEPS=30\n" in text
        batch.write_text(text.replace("STEPS=30\n", "STEPS=600\n"))
        kubectl("-n", team_b, "apply", "-f", str(batch))
        [victim_name] = [p["metadata"]["name"] for p in wait_for(
            lambda: [p for p in kube.list("Pod", team_b, label_selector="job-name=batch-train")
                     if p["status"].get("phase") == "Running"], 60, what="the batch-train Job's pod Running")]
        kubectl("-n", team_a, "apply", "-f", str(manifest("07-monitoring-cost/critical-train.yaml")))
        # kube-scheduler finds no free GPU, evicts the lower-priority pod, then binds the critical one.
        wait_phase(kube, team_a, "critical-train", "Running", timeout=90)
        victim = kube.get("Pod", victim_name, team_b)
        assert victim is None or victim["metadata"].get("deletionTimestamp") or \
            victim["status"].get("phase") == "Failed"
        events = kube.list("Event", team_b, field_selector="reason=Preempted")
        assert events and "Preempted by pod" in events[0]["message"]
        # What `gpulab report` lists under PREEMPTED: the victim, its node and the preemptor, from the Events.
        [preempted] = [p for p in usage.preemptions(kube, since=started) if p.namespace == team_b]
        assert (preempted.pod, preempted.node, preempted.by) == (victim_name, "gpu-node-1",
                                                                  f"{team_a}/critical-train")
        assert usage.preemptions(kube, team_a) == []
    finally:
        for name in (team_a, team_b):
            kube.delete("Namespace", name)
        for pc in ("gpu-critical", "gpu-batch"):
            kube.delete("PriorityClass", pc)
        wait_gpus_free(kube, timeout=90)


def test_gpulab_report_without_the_monitoring_add_on_says_to_install_it(kube, cluster, tmp_path):
    # Without the add-on: a module before this one on the same cluster (lesson 07, lab 09) may have installed it.
    addons.delete(cluster.kubeconfig, MONITORING, lambda _m: None)
    wait_for(lambda: kube.get("Service", "prometheus", "monitoring") is None, 60, what="the add-on's Service gone")
    out = subprocess.run([sys.executable, "-m", "gpulab.cli", "report", "--since", "5m", "--out", str(tmp_path / "r")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and out.stdout == ""
    assert ('gpulab: error: Prometheus is not installed (404: services "prometheus" not found): the monitoring '
            "add-on runs it as service monitoring/prometheus. Install it with `gpulab addon install monitoring`"
            ) in out.stderr, out.stderr
    assert not (tmp_path / "r").exists()


def test_load_errors_name_the_missing_service(kube, ns):
    with pytest.raises(load.LoadError, match=f"Service {ns}/nope not found"):
        load.set_load(kube, "svc/nope", "5", ns)
