"""Labs 04 (sharing) and 06 (exercise 3) checks on hand-made objects (no cluster, no notebook runs)."""

from __future__ import annotations

from grading_support import TIME_SLICING, TIME_SLICING_MISPLACED

import pytest

from gpulab.grading.checks import Context
from gpulab.grading.cluster import load_lab_spec
from gpulab.grading.labs import lab_04, lab_06

CONFIG = TIME_SLICING
MISPLACED = TIME_SLICING_MISPLACED


def _node(labels=None, alloc=None):
    return {"kind": "Node", "metadata": {"name": "gpu-node-1", "labels": {"nvidia.com/gpu.present": "true",
                                                                         "nvidia.com/gpu.count": "2", **(labels or {})}},
            "status": {"allocatable": alloc or {"nvidia.com/gpu": "2"}}}


def _cm(text):
    return {"kind": "ConfigMap", "metadata": {"name": "time-slicing-config", "namespace": "gpu-operator"},
            "data": {"any": text}}


def test_specs_reconfigure_the_gpu_stack_and_lab06_injects_a_short_load():
    spec04, spec06 = load_lab_spec("04"), load_lab_spec("06")
    assert spec04.cluster_wide and spec04.setup and spec04.teardown and spec04.collect
    assert spec04.namespace_names("g") == ["g", "g-dev", "g-infer"]
    assert spec06.parameters == {"model_load_seconds": 0}


@pytest.mark.parametrize("text, fraction, hint", [
    (CONFIG.format(n=4), 1, ""),
    (CONFIG.format(n=8), 2 / 3, "份数不一样"),
    (MISPLACED, 0, "replicas 是写给哪一种资源的"),
])
def test_lab04_config_is_judged_by_the_device_plugins_parser(text, fraction, hint):
    ctx = Context.from_objects([_cm(text), _node({"nvidia.com/device-plugin.config": "any"})], namespace="g")
    result = lab_04.ts_config(ctx)
    assert result.fraction == pytest.approx(fraction) and hint in result.message


def test_lab04_explanation_credits_concepts_with_synonyms():
    def score(text):
        return lab_04.explanation(Context({"explanation": text})).fraction

    assert score("Time slicing only lets containers take turns on the compute; the memory is shared, so one "
                 "container running out of memory takes its neighbours down. MIG isolates it in hardware.") == 1
    assert score("time-slicing 只是让大家轮流用 GPU，一个人把显存用多了，别人也会跟着 OOM。") == pytest.approx(3 / 4)
    assert score("太短了") == 0


def test_lab04_mig_instances_are_read_in_either_strategy():
    mixed = Context.from_objects([_node({"nvidia.com/mig-1g.10gb.memory": "9984"},
                                        {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "14"})])
    assert lab_04.mig_offer(mixed, "nvidia.com/mig-1g.10gb") == (14, 9984)
    single = Context.from_objects([_node({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb",
                                          "nvidia.com/gpu.memory": "9984"}, {"nvidia.com/gpu": "14"})])
    assert lab_04.mig_offer(single, "nvidia.com/gpu") == (14, 9984)
    assert lab_04.mig_offer(single, "nvidia.com/mig-1g.10gb") == (0, None)


def _llm(probe, resource="nvidia.com/mig-3g.40gb"):
    container = {"name": "server", "resources": {"limits": {resource: 1}}}
    if probe is not None:
        container["startupProbe"] = probe
    return {"kind": "Deployment", "metadata": {"name": "llm", "namespace": "g"},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [container]}}}}


@pytest.mark.parametrize("probe, fraction", [
    ({"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 10, "failureThreshold": 12}, 1),
    ({"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 10, "failureThreshold": 10}, 2 / 3),
    ({"httpGet": {"path": "/health", "port": 8000}}, 0),  # defaults: 3 x 10 s
    ({"httpGet": {"path": "/health", "port": 8000}, "initialDelaySeconds": 60, "failureThreshold": 6}, 1),
    (None, 0),
])
def test_lab06_startup_probe_budget_uses_the_kubelets_arithmetic_and_defaults(probe, fraction):
    result = lab_06.startup_probe(Context.from_objects([_llm(probe)], namespace="g"))
    assert result.fraction == pytest.approx(fraction)


def _hpa(metrics):
    return {"kind": "HorizontalPodAutoscaler", "metadata": {"name": "llm", "namespace": "g"},
            "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "llm"}, "minReplicas": 2,
                     "maxReplicas": 4, "metrics": metrics}}


def test_lab06_hpa_metric_wants_the_gpu_per_pod():
    def score(metrics):
        return lab_06.hpa_metric(Context.from_objects([_hpa(metrics)], namespace="g")).fraction

    pods = {"type": "Pods", "pods": {"metric": {"name": "DCGM_FI_DEV_GPU_UTIL"},
                                     "target": {"type": "AverageValue", "averageValue": "70"}}}
    external = {"type": "External", "external": {"metric": {"name": "DCGM_FI_DEV_GPU_UTIL"},
                                                 "target": {"type": "Value", "value": "70"}}}
    cpu = {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization",
                                                                       "averageUtilization": 70}}}
    assert score([pods]) == 1
    assert score([external]) == pytest.approx(2 / 3)
    assert score([cpu]) == pytest.approx(1 / 3)
