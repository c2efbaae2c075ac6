"""The labs as files, and their checks on hand-made objects (no cluster, no notebook runs).

The structural rules every lab follows are DEVELOPMENT.md's "A lab" steps, in the package
(:mod:`gpulab.grading.labrules`, which `gpulab labs check` runs); here they run on every lab
(``tests/unit/test_add_a_lab.py`` runs them on a new lab in a temporary copy).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbformat
import pytest
import yaml

from gpulab.grading.checks import Context, load_hidden_checks, load_lab_checks
from gpulab.grading.labrules import lab_names, lab_problems, naming_problems
from gpulab.grading.fixtures import broken_pipeline
from gpulab.grading.labs import lab_01, lab_02, lab_03, lab_05, lab_07, lab_08, lab_09
from gpulab.grading.labsource import check_drift

REPO = Path(__file__).resolve().parents[2]
HIDDEN = REPO / "tests" / "fixtures" / "hidden"
LABS = lab_names(REPO / "solutions")


def test_labs_are_generated_from_solutions():
    assert check_drift(REPO / "solutions", REPO / "labs") == []


def test_labs_are_named_and_numbered_once():
    assert LABS, "no solutions/NN-<slug>.ipynb found"
    problems = naming_problems(LABS)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("lab", LABS)
def test_each_lab_follows_the_lab_rules(lab):
    problems = lab_problems(lab)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("lab", LABS)
def test_hidden_examples_are_found_for_their_lab_only(lab):
    own = set()
    for path in sorted(HIDDEN.glob("*.py")):
        suite = load_lab_checks(path)  # its LAB names the lab the file belongs to
        if suite.lab == lab:
            own |= {c.id for c in suite.checks}
    found = load_hidden_checks(HIDDEN, lab)
    assert own and {c.id for c in found} == own and all(c.hidden for c in found)


# --------------------------------------------------------------------------- lab 01


def _gpu_pod(name, limits=None, requests=None, image="nvcr.io/nvidia/cuda:12.6.2-base-ubuntu24.04", node=None):
    want = lab_01.original(name)["spec"]["containers"][0]
    container = {"name": "cuda", "image": image, "command": want["command"], "resources": {}}
    if limits is not None:
        container["resources"]["limits"] = {"nvidia.com/gpu": limits}
    if requests is not None:
        container["resources"]["requests"] = {"nvidia.com/gpu": requests}
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "ns"},
            "spec": {"containers": [container], **({"nodeName": node} if node else {})}}


def test_lab01_fix_keeps_the_workload_and_asks_for_what_it_needs():
    def result(pod):
        return lab_01.fix_gpu_half(Context.from_objects([pod], namespace="ns"))

    assert result(_gpu_pod("gpu-half", "1")).passed
    changed = result(_gpu_pod("gpu-half", "1", image="nvidia/cuda:latest"))
    assert changed.fraction == 0.75 and "image" in changed.message
    assert result(_gpu_pod("gpu-half", "2")).fraction == 0.5
    assert "不是正整数" in result(_gpu_pod("gpu-half", "0")).message
    assert "没有申请任何 GPU" in result(_gpu_pod("gpu-half")).message
    assert "apply 成功了吗" in lab_01.fix_gpu_half(Context.from_objects([], namespace="ns")).message


def test_lab01_rule_messages_never_name_the_right_letter():
    ctx = Context({"violated": {"gpu-half": "B", "gpu-unequal": "C", "gpu-request-only": "X"}})
    result = lab_01.rules_identified(ctx)
    assert result.fraction == pytest.approx(1 / 3)
    assert "gpu-half 的判断不对" in result.message and "不是 A/B/C 之一" in result.message
    assert not re.search(r"应(该|为)\s*[ABC]", result.message)


def test_lab01_the_broken_rule_is_read_from_the_manifest():
    def pod(**resources):
        return {"spec": {"containers": [{"name": "c", "resources": resources}]}}

    assert lab_01.broken_rule(pod(limits={"nvidia.com/gpu": 0.5})) == "A"
    assert lab_01.broken_rule(pod(limits={"nvidia.com/gpu": "500m"})) == "A"
    assert lab_01.broken_rule(pod(requests={"nvidia.com/gpu": 1})) == "B"
    assert lab_01.broken_rule(pod(requests={"nvidia.com/gpu": 1}, limits={"nvidia.com/gpu": 2})) == "C"
    assert lab_01.broken_rule(pod(requests={"nvidia.com/gpu": 1}, limits={"nvidia.com/gpu": 1})) is None
    assert lab_01.broken_rule(pod(limits={"cpu": "1"})) is None
    # the lab's three manifests break three different rules
    assert sorted(lab_01.broken_rule(lab_01.original(p)) for p in lab_01.MANIFESTS) == ["A", "B", "C"]
    source = Path(lab_01.__file__).read_text(encoding="utf-8")
    assert not re.search(r'"gpu-(half|unequal|request-only)":\s*"[ABC]"', source)


# --------------------------------------------------------------------------- lab 03


@pytest.mark.parametrize("toleration, ok", [
    ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}, True),
    ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}, True),
    ({"key": "nvidia.com/gpu", "value": "true"}, True),  # operator defaults to Equal, any effect
    ({"operator": "Exists"}, True),  # tolerates everything (a hidden check frowns on it)
    ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}, False),
    ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}, False),
    ({"key": "gpu", "operator": "Exists"}, False),
])
def test_lab03_toleration_matching_follows_the_scheduler(toleration, ok):
    assert lab_03.tolerates_gpu_taint({"tolerations": [toleration]}) is ok


def test_lab03_explanation_credits_concepts_not_wording():
    def score(text):
        return lab_03.explanation(Context({"explanation": text})).fraction

    assert score("The GPU node has a taint and web-plain lacks a toleration, so the scheduler filters it out.") == 1
    assert score("节点上有污点，Pod 没有对应的容忍，所以上不去。") == pytest.approx(2 / 3)
    assert score("太短") == 0


# --------------------------------------------------------------------------- lab 05


def _job(ckpt_volume, env=None, mount="/ckpt"):
    return {"kind": "Job", "metadata": {"name": "train", "namespace": "ns"}, "spec": {"template": {"spec": {
        "volumes": [{"name": "ckpt", **ckpt_volume}],
        "containers": [{"name": "train", "env": env or [], "volumeMounts": [{"name": "ckpt", "mountPath": mount}]}]}}}}


def test_lab05_checkpoint_volume_is_found_by_the_scripts_directory():
    pvc = {"kind": "PersistentVolumeClaim", "metadata": {"name": "c", "namespace": "ns"},
           "status": {"phase": "Bound"}}
    on_pvc = _job({"persistentVolumeClaim": {"claimName": "c"}})
    assert lab_05.checkpoint_on_pvc(Context.from_objects([on_pvc, pvc], namespace="ns")).passed
    host = lab_05.checkpoint_on_pvc(Context.from_objects([_job({"hostPath": {"path": "/x"}})], namespace="ns"))
    assert host.fraction == 0 and "hostPath" in host.message
    moved = _job({"persistentVolumeClaim": {"claimName": "c"}}, env=[{"name": "CKPT_DIR", "value": "/state/ckpt"}])
    assert "没有挂任何卷" in lab_05.checkpoint_on_pvc(Context.from_objects([moved, pvc], namespace="ns")).message
    parent = _job({"persistentVolumeClaim": {"claimName": "c"}}, env=[{"name": "CKPT_DIR", "value": "/state/ckpt"}],
                  mount="/state")
    assert lab_05.checkpoint_on_pvc(Context.from_objects([parent, pvc], namespace="ns")).passed
    unbound = dict(pvc, status={"phase": "Pending"})
    assert lab_05.checkpoint_on_pvc(Context.from_objects([on_pvc, unbound], namespace="ns")).fraction == \
        pytest.approx(2 / 3)


# --------------------------------------------------------------------------- lab 07


def _quota(ns, hard, used=True):
    q = {"kind": "ResourceQuota", "metadata": {"name": "gpu-quota", "namespace": ns}, "spec": {"hard": hard},
         "status": {"hard": hard}}
    if used:
        q["status"]["used"] = {k: "0" for k in hard}
    return q


def test_lab07_quota_must_be_metered_and_whole_cards():
    def check(quota):
        return lab_07.quota_team_a(Context.from_objects([quota], namespace="g"))

    assert check(_quota("g-team-a", {"requests.nvidia.com/gpu": "1"})).passed
    unmetered = check(_quota("g-team-a", {"nvidia.com/gpu": "1"}, used=False))
    assert unmetered.fraction == 0 and "写了 nvidia.com/gpu" in unmetered.message
    assert "不是整数张卡" in check(_quota("g-team-a", {"requests.nvidia.com/gpu": "500m"})).message
    assert check(_quota("g-team-a", {"requests.nvidia.com/gpu": "2"})).fraction == 0.5
    assert "里没有 ResourceQuota" in lab_07.quota_team_a(Context.from_objects([], namespace="g")).message


# --------------------------------------------------------------------------- lab 02


def _node02(name, allocatable, count=2, present=True):
    labels = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": str(count)} if present else {}
    return {"kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"capacity": {"nvidia.com/gpu": str(count)} if present else {},
                       "allocatable": {"nvidia.com/gpu": str(allocatable)} if present else {}}}


def _fault02(layer, node="gpu-node-1"):
    return {"kind": "InjectedFault", "metadata": {"name": node}, "node": node, "layer": layer}


# The scenario lab 02's grader breaks, and its repair: tests/unit/test_grading_fixtures.py.


def test_lab02_counts_come_from_allocatable_not_labels():
    objects = [_node02("gpu-node-1", 0), _node02("cpu-node-1", 0, present=False), _fault02("device-plugin")]

    def run(check, **values):
        return check(Context.from_objects(objects, values=values, namespace="ns"))

    assert run(lab_02.gpu_node_count, gpu_node_count=0).passed
    assert "带 GPU 标签的节点数一样" in run(lab_02.gpu_node_count, gpu_node_count=1).message
    assert run(lab_02.gpu_per_node, gpu_nodes={}).passed
    assert "应该是一个字典" in run(lab_02.gpu_per_node, gpu_nodes=None).message  # the lab's placeholder
    assert "GFD 标签" in run(lab_02.gpu_per_node, gpu_nodes={"gpu-node-1": 2}).message
    objects[0] = _node02("gpu-node-1", 1)
    assert run(lab_02.gpu_per_node, gpu_nodes={"gpu-node-1": 1}).passed
    assert run(lab_02.gpu_per_node, gpu_nodes={"gpu-node-1": "1"}).passed


@pytest.mark.parametrize("layer, text, fraction", [
    ("driver", "E1202 main.go:356] error initializing NVML: Driver Not Loaded", 1),
    ("driver", "CrashLoopBackOff", 1 / 3),  # the device plugin's state: true, but another layer's evidence
    ("device-plugin", "E1202 main.go:356] error starting plugins: the device plugin is held down", 1),
    ("container-toolkit", "No devices were found", 1),
    ("gpu", "XidCriticalError: Xid=79 on Device=GPU-1; marking device as unhealthy.", 1),
    ("gpu", '0/3 nodes are available: 3 Insufficient nvidia.com/gpu.', 1 / 3),
    ("container-toolkit", "looks fine to me", 0),
])
def test_lab02_evidence_must_come_from_the_broken_layer(layer, text, fraction):
    ctx = Context.from_objects([_fault02(layer)], values={"evidence": text})
    assert lab_02.evidence(ctx).fraction == pytest.approx(fraction)


def test_lab02_layer_hints_never_name_the_broken_layer():
    for (said, truth), _ in lab_02._LAYER_HINTS.items():
        message = lab_02.broken_layer(Context.from_objects([_fault02(truth)], values={"broken_layer": said})).message
        assert truth not in message and lab_02.LAYER_NAMES[truth] not in message
    assert "之一" in lab_02.broken_layer(Context.from_objects([_fault02("gpu")], values={"broken_layer": "GPU"})).message


# --------------------------------------------------------------------------- lab 09


def _fault09(name):
    """The InjectedFault record the fixture returns for ``name``, and the broken text of its ConfigMap."""
    fault = broken_pipeline.FAULTS[name]
    installed = broken_pipeline.installed_configs()
    good = installed[fault.configmap][fault.key]
    bad = fault.apply(good)
    return ({"kind": "InjectedFault", "metadata": {"name": name}, "fault": name, "link": fault.link,
             "configmap": fault.configmap, "key": fault.key, "lines": broken_pipeline.changed_lines(good, bad),
             "installed": installed}, bad)


def _configmap09(name, key, text):
    return {"kind": "ConfigMap", "metadata": {"name": name, "namespace": "monitoring"}, "data": {key: text}}


def test_lab09_link_hints_never_name_the_broken_link():
    for (said, truth), _ in lab_09._LINK_HINTS.items():
        fault = next(f for f in broken_pipeline.FAULTS if broken_pipeline.FAULTS[f].link == truth)
        message = lab_09.broken_link(Context.from_objects([_fault09(fault)[0]], values={"broken_link": said})).message
        assert truth not in message and lab_09.LINK_NAMES[truth] not in message, (said, truth)
    assert "之一" in lab_09.broken_link(Context.from_objects([_fault09("keep-regex")[0]],
                                                               values={"broken_link": None})).message
    assert lab_09.broken_link(Context.from_objects([_fault09("exported-pod")[0]],
                                                   values={"broken_link": "series-labels"})).passed


@pytest.mark.parametrize("fault, text, fraction", [
    ("keep-regex", "regex: dcgm-exporter", 1),
    ("keep-regex", "  regex: dcgm-exporter\n", 1),
    ("exported-pod", "honor_labels: false", 1),
    ("series-query", """- seriesQuery: '{__name__=~"^DCMG_FI_.*",namespace!="",pod!=""}'""", 1),
    ("resources-override", "exported_pod: {resource: pod}", 1),
    ("keep-regex", "action: keep", 1 / 2),            # a line of the same config, as installed
    ("series-query", "namespace: {resource: namespace}", 1 / 2),
    ("exported-pod", "HPA 拿不到指标", 0),
    ("resources-override", "", 0),
])
def test_lab09_evidence_is_the_changed_line_quoted(fault, text, fraction):
    ctx = Context.from_objects([_fault09(fault)[0]], values={"evidence": text})
    assert lab_09.evidence(ctx).fraction == pytest.approx(fraction)


def test_lab09_config_is_judged_parsed_against_the_installed_one():
    record, bad = _fault09("exported-pod")
    good = record["installed"]["prometheus-config"]["prometheus.yml"]

    def judge(text):
        return lab_09.config_as_installed(Context.from_objects(
            [record, _configmap09("prometheus-config", "prometheus.yml", text)], namespace="ns"))

    assert judge(good).passed
    assert judge(yaml.safe_dump(yaml.safe_load(good))).passed  # comments lost in a re-dump: the same config
    assert judge(bad).fraction == 0 and "还留着被改坏的那处" in judge(bad).message
    # Lesson 07's other fix: honor_labels back on, the copied relabellings kept. It works; it is not as installed.
    other = bad.replace("    honor_labels: false\n", "    honor_labels: true\n")
    assert judge(other).fraction == pytest.approx(1 / 2)
    assert "relabel_configs" in judge(other).message and "honor_labels" not in judge(other).message


def _hpa09(active="True", desired=2, value="80", reason="ValidMetricFound"):
    return {"kind": "HorizontalPodAutoscaler", "metadata": {"name": "llm", "namespace": "ns"},
            "spec": {"minReplicas": 1, "maxReplicas": 2},
            "status": {"desiredReplicas": desired,
                       "conditions": [{"type": "ScalingActive", "status": active, "reason": reason}],
                       "currentMetrics": [{"type": "Pods", "pods": {"metric": {"name": "DCGM_FI_DEV_GPU_UTIL"},
                                                                    "current": {"averageValue": value}}}]
                       if value else None}}


def _run09(hpa, ready=2, rescale="New size: 2; reason: pods metric DCGM_FI_DEV_GPU_UTIL above target"):
    pods = [{"kind": "Pod", "metadata": {"name": f"llm-{i}", "namespace": "ns", "labels": {"app": "llm"}}}
            for i in range(ready)]
    events = [{"kind": "Event", "metadata": {"name": "e", "namespace": "ns"}, "reason": "SuccessfulRescale",
               "involvedObject": {"name": "llm"}, "message": rescale}] if rescale else []
    deployment = {"kind": "Deployment", "metadata": {"name": "llm", "namespace": "ns"}, "status": {"readyReplicas": ready}}
    return [hpa, deployment, *pods, *events]


def test_lab09_the_metric_served_and_the_scale_up_are_what_the_cluster_shows():
    def run(check, objects, **values):
        return check(Context.from_objects(objects, values=values, namespace="ns"))

    assert run(lab_09.metric_served, _run09(_hpa09()), served_pods=["llm-0"]).passed
    assert run(lab_09.scaled_up, _run09(_hpa09())).passed
    broken = _run09(_hpa09("False", 1, None, "FailedGetPodsMetric"), ready=1, rescale=None)
    served = run(lab_09.metric_served, broken, served_pods=["nvidia-dcgm-exporter-abc"])
    assert served.fraction == 0 and "FailedGetPodsMetric" in served.message and "nvidia-dcgm-exporter-abc" in served.message
    scaled = run(lab_09.scaled_up, broken)
    assert scaled.fraction == 0 and "见 metric-served" in scaled.message and "1 个就绪副本" in scaled.message
    # Read, but still wanting one replica (the load was stopped): the controller's own number is said.
    assert "想要的副本数是 1" in run(lab_09.scaled_up, _run09(_hpa09(desired=1, value="30"), ready=1)).message
    # Scaled by hand, not by the HPA: no SuccessfulRescale of the HPA's own.
    assert run(lab_09.scaled_up, _run09(_hpa09(), rescale=None)).fraction == pytest.approx(2 / 3)
    assert "没有 HPA" in run(lab_09.scaled_up, []).message


# --------------------------------------------------------------------------- lab 08


def _lab08_run(*, allocatable=1, capacity=2, train_said="0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
               infer_log="CUDA error: CUDA driver version is insufficient for CUDA runtime version\n",
               dev_said="0/3 nodes are available: 1 node(s) had untolerated taint(s), "
                        "2 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: "
                        "3 Preemption is not helpful for scheduling."):
    """What the grader captures from a lab 08 run: the GPU node, the three pods, their events and logs."""
    node = {"kind": "Node", "metadata": {"name": "gpu-node-1"},
            "status": {"capacity": {"nvidia.com/gpu": str(capacity)},
                       "allocatable": {"nvidia.com/gpu": str(allocatable)}}}
    objects = [node]
    for pod, phase, said, log in (("train", "Pending", train_said, ""), ("infer", "Failed", "", infer_log),
                                  ("dev-notebook", "Pending", dev_said, "")):
        objects.append({"kind": "Pod", "metadata": {"name": pod, "namespace": "ns"}, "status": {"phase": phase}})
        if said:
            objects.append({"kind": "Event", "metadata": {"name": f"{pod}.1", "namespace": "ns"},
                            "involvedObject": {"kind": "Pod", "name": pod}, "reason": "FailedScheduling",
                            "message": said})
        if log:
            objects.append({"kind": "PodLog", "metadata": {"name": pod, "namespace": "ns"}, "log": log})
    return objects


def test_lab08_causes_are_read_from_what_the_run_showed():
    def seen(pod, **run):
        return lab_08.observed_cause(Context.from_objects(_lab08_run(**run), namespace="ns"), pod)[0]

    assert [seen(p) for p in lab_08.SYMPTOMS] == ["gpu-unhealthy", "cuda-driver-too-old", "untolerated-taint"]
    assert seen("train", allocatable=0) == "device-plugin-down"
    assert seen("train", allocatable=2) == "gpus-in-use"
    assert seen("train", train_said="0/3 nodes are available: 3 node(s) didn't match Pod's node "
                                    "affinity/selector.") == "selector-mismatch"
    assert seen("infer", infer_log="CUDA error: no CUDA-capable device is detected\n") == "no-devices"
    # the scheduler's message also counts when it is only on the pod (no event captured)
    objects = [o for o in _lab08_run() if o["kind"] != "Event"]
    objects[1]["status"]["conditions"] = [{"type": "PodScheduled", "status": "False",
                                           "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]
    assert lab_08.observed_cause(Context.from_objects(objects, namespace="ns"), "train")[0] == "gpu-unhealthy"


def test_lab08_a_cause_the_run_did_not_show_is_not_assumed():
    ctx = Context.from_objects(_lab08_run(infer_log="model loaded\n"), {"causes": {"infer": "cuda-driver-too-old"}},
                               namespace="ns")
    result = lab_08._cause_check(ctx, "infer")
    assert result.fraction == 0 and "Failed" in result.message and "无法核对" in result.message
    missing = Context.from_objects(_lab08_run()[:1], {"causes": {"train": "gpu-unhealthy"}}, namespace="ns")
    assert "没有 train 这个 Pod" in lab_08._cause_check(missing, "train").message
    # the same answers are right when the run showed them
    ctx = Context.from_objects(_lab08_run(), {"causes": {"train": "gpu-unhealthy", "infer": "cuda-driver-too-old",
                                                         "dev-notebook": "untolerated-taint"},
                                              "fixable": {"train": False, "infer": True, "dev-notebook": True}},
                               namespace="ns")
    assert all(lab_08._cause_check(ctx, p).passed for p in lab_08.SYMPTOMS) and lab_08.fixable(ctx).passed


def test_lab08_cause_hints_never_name_the_cause():
    runs = {"gpu-unhealthy": {}, "device-plugin-down": {"allocatable": 0}, "gpus-in-use": {"allocatable": 2}}
    for truth, run in runs.items():
        ctx_objects = _lab08_run(**run)
        for wrong in lab_08.CAUSES:
            if wrong == truth:
                continue
            ctx = Context.from_objects(ctx_objects, {"causes": {"train": wrong}}, namespace="ns")
            result = lab_08._cause_check(ctx, "train")
            assert result.fraction == 0 and truth not in result.message, (truth, wrong)
    for pod, truth in (("infer", "cuda-driver-too-old"), ("dev-notebook", "untolerated-taint")):
        for wrong in lab_08.CAUSES:
            if wrong != truth:
                ctx = Context.from_objects(_lab08_run(), {"causes": {pod: wrong}}, namespace="ns")
                result = lab_08._cause_check(ctx, pod)
                assert result.fraction == 0 and truth not in result.message, (pod, wrong)


def test_lab08_holds_no_answer_key():
    source = Path(lab_08.__file__).read_text(encoding="utf-8")
    assert not re.search(r'"(train|infer|dev-notebook)":\s*"(' + "|".join(lab_08.CAUSES) + ')"', source)
    assert not re.search(r'"(train|infer|dev-notebook)":\s*(True|False)', source)


def _infer_fixed(image, phase="Succeeded", gpus=1):
    return {"kind": "Pod", "metadata": {"name": "infer-fixed", "namespace": "ns",
                                        "annotations": {"gpulab.io/gpu-memory": "16Gi"}},
            "spec": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                     "containers": [{"name": "infer", "image": image,
                                     "command": ["sh", "-c", "sleep 1; echo model loaded"],
                                     "resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
            "status": {"phase": phase}}


def test_lab08_infer_fix_compares_the_images_cuda_with_the_drivers():
    node = {"kind": "Node", "metadata": {"name": "gpu-node-1", "labels": {lab_08.CUDA_LABEL: "13.0"}}}
    log = {"kind": "PodLog", "metadata": {"name": "infer-fixed", "namespace": "ns"}, "log": "model loaded\n"}

    def result(pod, *extra):
        return lab_08.fix_infer(Context.from_objects([node, pod, *extra], namespace="ns"))

    assert result(_infer_fixed("nvcr.io/nvidia/cuda:12.6.2-base-ubuntu24.04"), log).passed
    assert result(_infer_fixed("nvcr.io/nvidia/cuda:13.0.1-base-ubuntu24.04"), log).passed
    too_new = result(_infer_fixed("nvcr.io/nvidia/cuda:13.1.0-base-ubuntu24.04", phase="Failed"))
    assert too_new.fraction == pytest.approx(1 / 3) and "仍然比节点驱动支持的 CUDA 版本新" in too_new.message
    assert "看不出 CUDA 版本" in result(_infer_fixed("nvcr.io/nvidia/cuda:latest"), log).message
    assert "1 张卡" in result(_infer_fixed("nvcr.io/nvidia/cuda:12.6.2-base-ubuntu24.04", gpus=2), log).message
    # no node says which CUDA its driver supports: the check says so instead of assuming a version
    unlabelled = lab_08.fix_infer(Context.from_objects(
        [{"kind": "Node", "metadata": {"name": "gpu-node-1"}}, _infer_fixed("nvcr.io/nvidia/cuda:12.6.2"), log],
        namespace="ns"))
    assert unlabelled.fraction == pytest.approx(2 / 3) and "无法核对" in unlabelled.message


def test_lab08_explanations_credit_concepts_in_either_language():
    def score(pod, text):
        return lab_08._explain(Context({"explanations": {pod: text}}), pod).fraction

    assert score("train", "One GPU hit Xid 79; the device plugin reports it unhealthy, so allocatable is 1.") == 1
    assert score("train", "有张卡坏了，所以卡不够用。") == pytest.approx(1 / 3)
    assert score("infer", "The image's CUDA runtime is newer than the driver version supports.") == 1
    assert score("dev-notebook", "节点有污点，Pod 没有容忍。") == pytest.approx(2 / 3)
    assert score("dev-notebook", "不知道") == 0


def test_cli_reports_lab_drift(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from gpulab import cli, paths

    ok = CliRunner().invoke(cli.main, ["labs", "check"])
    assert ok.exit_code == 0, ok.output
    assert f"labs/ matches solutions/ and every lab follows the lab rules ({len(LABS)} labs)" in ok.output
    # A checkout whose lab was edited by hand: `labs check` names it and fails.
    root = tmp_path / "repo"
    (root / "labs").mkdir(parents=True)
    (root / "solutions").mkdir()
    shutil.copytree(HIDDEN, root / "tests" / "fixtures" / "hidden")
    for lab in LABS:
        (root / "solutions" / f"{lab}.ipynb").write_bytes((REPO / "solutions" / f"{lab}.ipynb").read_bytes())
        (root / "labs" / f"{lab}.ipynb").write_bytes((REPO / "labs" / f"{lab}.ipynb").read_bytes())
    edited = nbformat.read(root / "labs" / f"{LABS[0]}.ipynb", as_version=4)
    edited.cells[0].source += "\n手改的一行"
    nbformat.write(edited, root / "labs" / f"{LABS[0]}.ipynb")
    monkeypatch.setattr(paths, "repo_root", lambda: root)
    drift = CliRunner().invoke(cli.main, ["labs", "check"])
    assert drift.exit_code == 1 and f"drift: {LABS[0]}.ipynb: differs (cell 0 differs)" in drift.output
    fixed = CliRunner().invoke(cli.main, ["labs", "generate"])
    assert fixed.exit_code == 0 and f"wrote labs/{LABS[0]}.ipynb" in fixed.output
    assert CliRunner().invoke(cli.main, ["labs", "check"]).exit_code == 0
    # A rule broken (the example hidden checks gone): the same rules as the tests', said by the CLI.
    shutil.rmtree(root / "tests" / "fixtures" / "hidden")
    broken = CliRunner().invoke(cli.main, ["labs", "check"])
    assert broken.exit_code == 1 and f"rule: {LABS[0]}: no hidden-check directory" in broken.output
    assert f"{len(LABS)} lab rules are broken" in broken.output


# --------------------------------------------------------------------------- explanations: the solutions' texts


def solution_literal(lab: str, name: str):
    """The literal a solution notebook's answer region assigns to ``name`` (its last assignment there)."""
    import ast

    found = None
    for cell in nbformat.read(REPO / "solutions" / f"{lab}.ipynb", as_version=4).cells:
        if cell.cell_type != "code" or "BEGIN SOLUTION" not in cell.source:
            continue
        try:
            tree = ast.parse("\n".join(line for line in cell.source.splitlines() if not line.startswith("%")))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                try:
                    found = ast.literal_eval(node.value)
                except ValueError:
                    pass
    assert found is not None, f"solutions/{lab}.ipynb assigns no literal to {name}"
    return found


def test_solution_explanations_earn_full_marks_where_claims_are_checked():
    """Explanations are scored on what they claim (wrong mechanisms take credit back): the reference
    answers must assert none of them (tests/unit/test_grading_true_feedback.py has the wrong ones)."""
    from gpulab.grading.labs import lab_04

    assert lab_03.explanation(Context({"explanation": solution_literal("03-taints-tolerations", "explanation")})).passed
    assert lab_04.explanation(Context({"explanation": solution_literal("04-sharing", "explanation")})).passed
    texts = solution_literal("08-troubleshooting", "explanations")
    for pod in lab_08.SYMPTOMS:
        assert lab_08._explain(Context({"explanations": texts}), pod).passed, pod
