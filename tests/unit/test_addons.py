"""Add-ons (manifests/addons/<name>/): what `gpulab addon` applies, without a cluster."""

from __future__ import annotations

import pytest

from gpulab.cluster import addons
from gpulab.runtime import images


def test_the_monitoring_add_on_is_prometheus_kube_state_metrics_and_the_adapter_in_its_namespace():
    assert "monitoring" in addons.names()
    docs = addons.documents("monitoring")
    assert docs[0] == {"apiVersion": "v1", "kind": "Namespace",
                       "metadata": {"name": "monitoring", "labels": {"app.kubernetes.io/part-of": "monitoring"}}}
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    assert set(deployments) == {"prometheus", "kube-state-metrics", "prometheus-adapter"}
    # Everything in its namespace but the adapter's reader of the apiserver's auth config (kube-system's).
    elsewhere = {(d["kind"], d["metadata"]["namespace"]) for d in docs
                 if d["metadata"].get("namespace", "monitoring") != "monitoring"}
    assert elsewhere == {("RoleBinding", "kube-system")}
    # Each image is one whose program gpulab builds (the catalog knows its repository).
    known = {e.repository for e in images.monitoring_images(*(["/nonexistent"] * 3))}
    for dep in deployments.values():
        image = dep["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image.rsplit(":", 1)[0] in known, image
    served = {d["metadata"]["name"]: d["spec"]["service"] for d in docs if d["kind"] == "APIService"}
    assert served == {f"{v}.custom.metrics.k8s.io": {"namespace": "monitoring", "name": "prometheus-adapter",
                                                     "port": 443} for v in ("v1beta1", "v1beta2")}


def test_prometheus_keeps_the_exporters_pod_labels_and_the_adapter_relists_quickly():
    import yaml

    docs = addons.documents("monitoring")
    config = yaml.safe_load(next(d for d in docs if d["metadata"]["name"] == "prometheus-config")["data"]["prometheus.yml"])
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert jobs["dcgm-exporter"]["honor_labels"] is True
    assert {"dcgm-exporter", "kube-state-metrics", "kubernetes-pods", "prometheus"} <= set(jobs)
    adapter = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "prometheus-adapter")
    args = adapter["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--metrics-relist-interval=10s" in args
    rules = yaml.safe_load(next(d for d in docs if d["metadata"]["name"] == "adapter-config")["data"]["config.yaml"])
    assert any("DCGM_FI_" in r["seriesQuery"] for r in rules["rules"])


def test_an_unknown_add_on_is_refused_with_the_ones_there_are():
    with pytest.raises(addons.AddonError) as e:
        addons.documents("grafana")
    assert "unknown add-on 'grafana'" in str(e.value) and "monitoring" in str(e.value)


def test_the_usage_report_asks_the_add_ons_prometheus_for_what_it_scrapes():
    """gpulab report's PromQL (gpulab/usage) reads the add-on's Prometheus Service, its DCGM and
    kube-state-metrics jobs, and kube-state-metrics' pod, node and quota metrics."""
    import yaml

    from gpulab.usage import prometheus

    docs = addons.documents("monitoring")
    service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == prometheus.SERVICE)
    assert service["metadata"]["namespace"] == prometheus.NAMESPACE
    assert [p["port"] for p in service["spec"]["ports"]] == [prometheus.PORT]
    config = yaml.safe_load(next(d for d in docs if d["metadata"]["name"] == "prometheus-config")["data"]["prometheus.yml"])
    assert config["global"]["scrape_interval"] == f"{prometheus.SCRAPE_INTERVAL}s"
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert jobs[prometheus.KUBE_STATE_METRICS_JOB]["honor_labels"] is True
    # The DCGM series' `node` is the exporter pod's node (the report joins it with kube-state-metrics' `node`).
    assert {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"} in \
        jobs[prometheus.DCGM_JOB]["relabel_configs"]
    ksm = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "kube-state-metrics")
    [resources] = [a for a in ksm["spec"]["template"]["spec"]["containers"][0]["args"] if a.startswith("--resources=")]
    assert {"pods", "nodes", "resourcequotas"} <= set(resources.split("=", 1)[1].split(","))
