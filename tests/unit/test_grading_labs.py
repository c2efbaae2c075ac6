"""The labs as files, and their checks on hand-made objects (no cluster, no notebook runs)."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from gpulab.grading.checks import Context, load_hidden_checks, load_lab_checks
from gpulab.grading.cluster import load_lab_spec
from gpulab.grading.labs import lab_01, lab_02, lab_03, lab_05, lab_07, lab_08
from gpulab.grading.labsource import check_drift

REPO = Path(__file__).resolve().parents[2]
HIDDEN = REPO / "tests" / "fixtures" / "hidden"
LABS = sorted(p.stem for p in (REPO / "solutions").glob("*.ipynb"))


def test_labs_are_generated_from_solutions():
    assert check_drift(REPO / "solutions", REPO / "labs") == []


def test_lab_numbering_leaves_room_for_the_gpu_stack_labs():
    assert LABS == ["01-gpu-pod-spec", "02-layered-verification", "03-taints-tolerations", "04-sharing",
                    "05-training-job", "06-inference-sizing", "07-quota-priority", "08-troubleshooting"]


@pytest.mark.parametrize("lab", LABS)
def test_each_lab_has_a_parameters_cell_checks_and_answer_regions(lab):
    solution = nbformat.read(REPO / "solutions" / f"{lab}.ipynb", as_version=4)
    generated = nbformat.read(REPO / "labs" / f"{lab}.ipynb", as_version=4)
    params = [c for c in generated.cells if "parameters" in (c.metadata.get("tags") or [])]
    assert len(params) == 1
    assigned = set(re.findall(r"^(\w+) = ", params[0].source, re.M))
    assert assigned == {"namespace", "results_path", *load_lab_spec(lab).parameters}  # PARAMETERS: the grader's
    assert sum("BEGIN SOLUTION" in c.source for c in solution.cells) >= 3
    assert not any("BEGIN SOLUTION" in c.source for c in generated.cells)
    # The cleanup cell runs by hand only: the grader collects what the notebook leaves behind.
    assert "skip-execution" in (generated.cells[-1].metadata.get("tags") or [])
    suite = load_lab_checks(lab)
    spec = load_lab_spec(lab)
    assert spec.lab == lab and suite.max_points > 0
    recorded = set(re.findall(r'record\("(\w+)"', "\n".join(c.source for c in solution.cells)))
    module_source = Path(lab_01.__file__).with_name(f"lab_{lab[:2]}.py")
    used = set(re.findall(r'ctx\.value\("(\w+)"', module_source.read_text(encoding="utf-8")))
    assert used <= recorded, f"checks read values the notebook never records: {used - recorded}"


@pytest.mark.parametrize("lab", LABS)
def test_hidden_examples_are_found_for_their_lab_only(lab):
    hidden = load_hidden_checks(HIDDEN, lab)
    assert len(hidden) == 1 and hidden[0].hidden
    assert not set(c.id for c in hidden) & set(c.id for c in load_lab_checks(lab).checks)


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


def test_lab02_scenarios_are_fixed_per_namespace_and_cover_every_layer():
    nodes = {"gpu-node-1": 2, "gpu-node-2": 8}
    picked = {lab_02.scenario(f"grade-02-l{i}", nodes) for i in range(40)}
    assert {layer for _, layer, _ in picked} == set(lab_02.LAYERS)
    assert {node for node, _, _ in picked} == set(nodes)
    assert all((gpu is None) == (layer != "gpu") and (gpu is None or 0 <= gpu < nodes[node])
               for node, layer, gpu in picked)
    assert lab_02.scenario("grade-02-amy", nodes) == lab_02.scenario("grade-02-amy", nodes)
    assert {node for node, layer, _ in picked if layer == "container-toolkit"} == {"gpu-node-1"}


class _Nodes:
    """The one call ``_resources_whole`` makes of a client, answered from recorded Node statuses."""

    def __init__(self, **statuses):
        self.statuses = statuses

    def get(self, kind, name):
        cap, alloc = self.statuses[name]
        return {"status": {"capacity": cap, "allocatable": alloc}}


def test_lab02_repair_waits_for_the_advertised_resources_only():
    whole = lab_02._resources_whole
    # After MIG: the kubelet keeps the slices' capacity at allocatable 0 through its stop grace period.
    lingering = ({"nvidia.com/gpu": "2", "nvidia.com/mig-3g.40gb": "4"},
                 {"nvidia.com/gpu": "2", "nvidia.com/mig-3g.40gb": "0"})
    assert whole(_Nodes(**{"gpu-node-1": lingering}), {"gpu-node-1": 2})
    one_unhealthy = ({"nvidia.com/gpu": "2"}, {"nvidia.com/gpu": "1"})
    assert not whole(_Nodes(**{"gpu-node-1": one_unhealthy}), {"gpu-node-1": 2})
    plugin_gone = ({"nvidia.com/gpu": "2"}, {"nvidia.com/gpu": "0"})
    assert not whole(_Nodes(**{"gpu-node-1": plugin_gone}), {"gpu-node-1": 2})
    assert not whole(_Nodes(**{"gpu-node-1": ({}, {})}), {"gpu-node-1": 2})


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


# --------------------------------------------------------------------------- lab 08


def test_lab08_cause_hints_never_name_the_cause():
    for pod, truth in lab_08.TRUTH.items():
        for wrong in lab_08.CAUSES:
            if wrong == truth:
                continue
            result = lab_08._cause_check(Context({"causes": {pod: wrong}}), pod)
            assert result.fraction == 0 and truth not in result.message, (pod, wrong)


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
    assert ok.exit_code == 0 and f"labs/ matches solutions/ ({len(LABS)} labs)" in ok.output
    # A checkout whose lab was edited by hand: `labs check` names it and fails.
    root = tmp_path / "repo"
    (root / "labs").mkdir(parents=True)
    (root / "solutions").mkdir()
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
