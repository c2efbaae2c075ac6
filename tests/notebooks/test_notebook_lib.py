"""gpulab.notebook's pure parts: tables, pod states, GPU counting, sh, expect, node reset; the package's shape."""

from __future__ import annotations

import types

import pytest

from gpulab import notebook as nb
from gpulab import paths
from gpulab.notebook import plots, timeline
from gpulab.notebook import pod as nb_pod
from gpulab.kube.topology import NodeSpec, Taint, Topology


def pod(phase="Pending", node=None, containers=None, init=None, statuses=None, init_statuses=None,
        conditions=None, deleting=False, reason=None):
    p = {"metadata": {"name": "p", "namespace": "ns"},
         "spec": {"containers": containers or [{"name": "c"}], **({"nodeName": node} if node else {})},
         "status": {"phase": phase}}
    if init:
        p["spec"]["initContainers"] = init
    if statuses:
        p["status"]["containerStatuses"] = statuses
    if init_statuses:
        p["status"]["initContainerStatuses"] = init_statuses
    if conditions:
        p["status"]["conditions"] = conditions
    if deleting:
        p["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    if reason:
        p["status"]["reason"] = reason
    return p


def gpus(n):
    return {"name": "c", "resources": {"limits": {"nvidia.com/gpu": n}}}


# -- tables -------------------------------------------------------------------------


def test_table_aligns_columns_counting_cjk_as_double_width():
    t = nb.Table([{"方案": "整卡独占", "N": 2}, {"方案": "MIG", "N": 4}])
    lines = str(t).splitlines()
    assert lines[0] == "方案       N"
    assert lines[1] == "整卡独占   2"
    assert lines[2] == "MIG        4"


def test_table_shows_missing_values_as_dash_and_empty_tables_say_so():
    assert str(nb.Table([{"A": None, "B": []}])).splitlines()[1] == "-   -"
    assert str(nb.Table([], ["POD", "NODE"])).splitlines() == ["POD   节点 NODE", "(无)"]


def test_table_shows_booleans_in_chinese_and_keeps_them_for_code():
    t = nb.Table([{"POD": "a", "READY": True}, {"POD": "b", "READY": False}])
    assert [line.split()[-1] for line in str(t).splitlines()[1:]] == ["是", "否"]
    assert "<td style=\"text-align:left\">是</td>" in t._repr_html_()
    assert t.column("READY") == [True, False]


def test_table_headers_show_the_chinese_name_over_the_key_code_reads():
    t = nb.Table([{"NODE": "gpu-node-1", "POD": "a", "STATUS": "Running"}])
    assert str(t).splitlines()[0] == "节点 NODE    POD   状态 STATUS"
    assert t.column("NODE") == ["gpu-node-1"]  # rows keep the key
    html = t._repr_html_()
    assert "节点<br><code" in html and ">NODE</code>" in html and ">POD</code>" in html


def test_table_html_escapes_cells():
    html = nb.Table([{"MESSAGE": "<b>&"}])._repr_html_()
    assert "&lt;b&gt;&amp;" in html and "<b>&" not in html


def test_table_is_a_list_of_its_rows():
    t = nb.Table([{"POD": "a"}, {"POD": "b"}])
    assert len(t) == 2 and t.column("POD") == ["a", "b"]


# -- pods -------------------------------------------------------------------------------


def test_pod_gpus_counts_like_the_scheduler():
    p = pod(containers=[gpus(1), gpus(2)], init=[gpus(2)])
    assert nb.pod_gpus(p) == 3
    p = pod(containers=[gpus(1)], init=[gpus(4)])
    assert nb.pod_gpus(p) == 4
    assert nb.pod_gpus(pod()) == 0


@pytest.mark.parametrize("p, want", [
    (pod(), "Pending"),
    (pod("Pending", "n1", statuses=[{"state": {"waiting": {"reason": "ContainerCreating"}}}]), "ContainerCreating"),
    (pod("Running", "n1", statuses=[{"state": {"running": {}}}]), "Running"),
    (pod("Running", "n1", statuses=[{"state": {"waiting": {"reason": "CrashLoopBackOff"}}}]), "CrashLoopBackOff"),
    (pod("Succeeded", "n1", statuses=[{"state": {"terminated": {"reason": "Completed", "exitCode": 0}}}]),
     "Completed"),
    (pod("Failed", "n1", statuses=[{"state": {"terminated": {"reason": "Error", "exitCode": 1}}}]), "Error"),
    (pod("Failed", "n1", reason="DeadlineExceeded"), "DeadlineExceeded"),
    (pod("Pending", "n1", init=[{"name": "fetch"}], init_statuses=[{"name": "fetch", "state": {"running": {}}}]),
     "Init:0/1"),
    (pod("Pending", "n1", init=[{"name": "a"}, {"name": "b"}],
         init_statuses=[{"name": "a", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
                        {"name": "b", "state": {"waiting": {"reason": "PodInitializing"}}}]), "Init:1/2"),
    (pod("Pending", "n1", init=[{"name": "a"}],
         init_statuses=[{"name": "a", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]), "Init:CrashLoopBackOff"),
    (pod("Pending", "n1", init=[{"name": "a"}],
         init_statuses=[{"name": "a", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]), "Init:Error"),
    (pod("Pending", "n1", init=[{"name": "a"}],
         init_statuses=[{"name": "a", "state": {"terminated": {"exitCode": 137}}}]), "Init:ExitCode:137"),
    (pod("Running", "n1", deleting=True), "Terminating"),
])
def test_pod_status_reads_like_kubectl(p, want):
    assert nb.pod_status(p) == want


@pytest.mark.parametrize("p, want", [
    (pod(), "Pending"),
    (pod("Pending", "n1"), "Creating"),
    (pod("Pending", "n1", init=[{"name": "i"}], init_statuses=[{"name": "i", "state": {"running": {}}}]), "Init"),
    (pod("Running", "n1", conditions=[{"type": "Ready", "status": "False"}]), "Running"),
    (pod("Running", "n1", conditions=[{"type": "Ready", "status": "True"}]), "Ready"),
    (pod("Running", "n1", statuses=[{"state": {"waiting": {"reason": "CrashLoopBackOff"}}}]), "BackOff"),
    (pod("Failed", "n1"), "Failed"),
    (pod("Running", "n1", deleting=True), "Terminating"),
])
def test_timeline_state(p, want):
    assert timeline.timeline_state(p) == want


def test_unschedulable_needs_the_schedulers_verdict():
    waiting = pod(conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                               "message": "0/3 nodes are available"}])
    assert nb_pod._POD_TESTS["Unschedulable"](waiting)
    assert not nb_pod._POD_TESTS["Unschedulable"](pod())


# -- sh and expect ------------------------------------------------------------------------


def test_sh_echoes_the_command_and_returns_its_output(capsys):
    out = nb.sh("echo hello; echo err >&2")
    assert isinstance(out, nb.Output) and out == "hello\nerr\n"
    assert capsys.readouterr().out == "$ echo hello; echo err >&2\nhello\nerr\n"


def test_sh_raises_on_failure_unless_told_not_to(capsys):
    with pytest.raises(nb.CommandFailed) as err:
        nb.sh("echo no; exit 3")
    assert err.value.returncode == 3 and err.value.output == "no\n"
    assert nb.sh("exit 1", check=False, quiet=True) == ""


def test_sh_tail_prints_only_the_last_lines(capsys):
    out = nb.sh("seq 1 5", tail=2)
    assert out == "1\n2\n3\n4\n5\n"
    assert capsys.readouterr().out == "$ seq 1 5\n4\n5\n"


def test_sh_times_out():
    with pytest.raises(TimeoutError):
        nb.sh("sleep 5", timeout=0.5, quiet=True)


def test_sh_runs_in_the_repository_root():
    assert nb.sh("pwd", quiet=True).strip() == str(nb.REPO)


def test_expect(capsys):
    nb.expect(True, "it holds")
    assert capsys.readouterr().out == "✓ it holds\n"
    with pytest.raises(AssertionError, match="× it does not：why"):
        nb.expect(False, "it does not", "why")


def test_wait_for_returns_the_value_or_times_out():
    values = iter([0, None, 7])
    assert nb.wait_for(lambda: next(values), 5, interval=0.01) == 7
    with pytest.raises(TimeoutError, match="never"):
        nb.wait_for(lambda: False, 0.05, interval=0.01, what="never")


# -- reset of node labels and taints ---------------------------------------------------------


class FakeKube:
    def __init__(self, nodes):
        self.nodes = nodes
        self.patches = []

    def get(self, kind, name, namespace=None):
        return self.nodes.get(name) if kind == "Node" else None

    def list(self, kind, namespace=None, **_):
        return [{**n, "metadata": {**n["metadata"], "name": name}} for name, n in self.nodes.items()] \
            if kind == "Node" else []

    def patch(self, kind, name, patch, namespace=None, **_):
        self.patches.append((name, patch))


def lab_for(nodes, topo_nodes, labels=(), taints=()):
    lab = object.__new__(nb.Lab)
    lab.kube = FakeKube(nodes)
    lab.node_labels, lab.node_taints = tuple(labels), tuple(taints)
    topo = Topology("t", None, tuple(topo_nodes))
    lab.cluster = types.SimpleNamespace(topology=lambda: topo)
    return lab


def spec(name, labels=None, taints=()):
    return NodeSpec(name, "pool", "1", "1Gi", 110, None, 0, labels or {}, tuple(taints))


def test_restore_removes_lesson_label_and_taint_and_keeps_others():
    node = {"metadata": {"labels": {"node-role.kubernetes.io/ai": "true", "other": "x"}},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"},
                                {"key": "keep", "effect": "NoExecute"}]}}
    lab = lab_for({"n1": node}, [spec("n1")], ["node-role.kubernetes.io/ai"], ["nvidia.com/gpu"])
    done = lab._restore_nodes()
    assert lab.kube.patches == [("n1", {"metadata": {"labels": {"node-role.kubernetes.io/ai": None}},
                                        "spec": {"taints": [{"key": "keep", "effect": "NoExecute"}]}})]
    assert len(done) == 2


def test_restore_puts_back_what_the_topology_declares():
    node = {"metadata": {"labels": {}}, "spec": {}}
    topo_taint = Taint("nvidia.com/gpu", "true", "NoSchedule")
    lab = lab_for({"n1": node}, [spec("n1", {"node-role.kubernetes.io/ai": "true"}, [topo_taint])],
                  ["node-role.kubernetes.io/ai"], ["nvidia.com/gpu"])
    lab._restore_nodes()
    assert lab.kube.patches == [("n1", {"metadata": {"labels": {"node-role.kubernetes.io/ai": "true"}},
                                        "spec": {"taints": [topo_taint.to_api()]}})]


def test_restore_leaves_a_clean_node_alone():
    node = {"metadata": {"labels": {"x": "y"}}, "spec": {"taints": [{"key": "keep", "effect": "NoSchedule"}]}}
    lab = lab_for({"n1": node}, [spec("n1")], ["node-role.kubernetes.io/ai"], ["nvidia.com/gpu"])
    assert lab._restore_nodes() == [] and lab.kube.patches == []


# -- the GPU stack ------------------------------------------------------------------------


class FakeStackKube:
    """Just enough of api.Client for Lab._undo_gpu_stack."""

    def __init__(self, objects):
        self.objects = objects  # (kind, name, namespace) -> object
        self.calls = []

    def get(self, kind, name, namespace=None):
        return self.objects.get((kind, name, namespace))

    def list(self, kind, namespace=None, **_):
        return [o for (k, _, ns), o in self.objects.items() if k == kind and ns == namespace]

    def delete(self, kind, name, namespace=None, **_):
        self.calls.append(("delete", kind, name, namespace))
        self.objects.pop((kind, name, namespace), None)

    def patch(self, kind, name, patch, namespace=None, **_):
        self.calls.append(("patch", kind, name, patch))

    @staticmethod
    def path(kind, name=None, namespace=None):
        return f"{kind}/{name}"

    def request(self, method, path, body=None, **_):
        self.calls.append((method, path, body["spec"]))


def test_undo_gpu_stack_puts_back_what_the_lesson_changed(tmp_path, monkeypatch):
    import yaml as yamlmod

    from gpulab.cluster import baseline
    from gpulab.fakegpu import faults, operator

    manifests = tmp_path / "manifests"
    (manifests / "04-sharing").mkdir(parents=True)
    (manifests / "gpu-operator").mkdir()
    (manifests / "gpu-operator" / "30-cluster-policy.yaml").write_text(
        (operator.manifests_dir() / "30-cluster-policy.yaml").read_text())
    (manifests / "04-sharing" / "ts.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ts\n  namespace: gpu-operator\ndata: {}\n---\n"
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n")
    monkeypatch.setattr(paths, "manifests", lambda: manifests)
    installed = yamlmod.safe_load((operator.manifests_dir() / "30-cluster-policy.yaml").read_text())["spec"]
    changed = {**installed, "mig": {"strategy": "mixed"}}
    node = {"metadata": {"name": "gpu-node-1", "labels": {"nvidia.com/device-plugin.config": "any",
                                                          "nvidia.com/mig.config": "all-1g.10gb",
                                    "nvidia.com/mig.config.state": "success"}}}
    crashing = {"metadata": {"name": "nvidia-device-plugin-daemonset-x", "ownerReferences": [{"kind": "DaemonSet"}]},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}}
    healthy = {"metadata": {"name": "gpu-feature-discovery-y", "ownerReferences": [{"kind": "DaemonSet"}]},
               "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    kube = FakeStackKube({
        ("ConfigMap", "ts", "gpu-operator"): {"metadata": {"name": "ts"}},
        ("ClusterPolicy", "cluster-policy", None): {"metadata": {"name": "cluster-policy"}, "spec": changed},
        ("Node", "gpu-node-1", None): node,
        ("Pod", "nvidia-device-plugin-daemonset-x", "gpu-operator"): crashing,
        ("Pod", "gpu-feature-discovery-y", "gpu-operator"): healthy,
    })
    gpu = NodeSpec("gpu-node-1", "gpu", "32", "256Gi", 110, "h100-80gb", 2, {}, ())
    lab = object.__new__(nb.Lab)
    lab.lesson, lab.namespace, lab.kube = "04-sharing", "lesson-04", kube
    lab.cluster = types.SimpleNamespace(root=tmp_path / "cluster", topology=lambda: Topology("t", None, (gpu,)))
    faults.save(lab.cluster.root, "gpu-node-1", [faults.Fault("no-devices")])
    monkeypatch.setattr(faults, "wait_applied", lambda *a, **k: True)

    done = lab._undo_gpu_stack()

    assert faults.load(lab.cluster.root, "gpu-node-1").faults == ()
    assert ("delete", "ConfigMap", "ts", "gpu-operator") in kube.calls
    # A merge patch to the installed spec, never a GET-then-PUT (which races the operator's status writes).
    assert ("patch", "ClusterPolicy", "cluster-policy", {"spec": baseline.merge_patch(changed, installed)}) in kube.calls
    assert not [c for c in kube.calls if c[0] == "PUT"]
    assert ("patch", "Node", "gpu-node-1", {"metadata": {"labels": {
        "nvidia.com/device-plugin.config": None, "nvidia.com/mig.config": "all-disabled",
        "nvidia.com/mig.config.state": None}}}) in kube.calls
    deleted_pods = [c[2] for c in kube.calls if c[:2] == ("delete", "Pod")]
    assert deleted_pods == ["nvidia-device-plugin-daemonset-x"]
    assert len(done) == 5


def test_undo_gpu_stack_leaves_an_untouched_stack_alone(tmp_path, monkeypatch):
    import yaml as yamlmod

    from gpulab.fakegpu import operator

    installed = yamlmod.safe_load((operator.manifests_dir() / "30-cluster-policy.yaml").read_text())["spec"]
    (tmp_path / "gpu-operator").mkdir()
    (tmp_path / "gpu-operator" / "30-cluster-policy.yaml").write_text(yamlmod.safe_dump({"spec": installed}))
    monkeypatch.setattr(paths, "manifests", lambda: tmp_path)
    kube = FakeStackKube({
        ("ClusterPolicy", "cluster-policy", None): {"metadata": {"name": "cluster-policy"}, "spec": installed},
        ("Node", "gpu-node-1", None): {"metadata": {"name": "gpu-node-1",
                                                    "labels": {"nvidia.com/mig.config": "all-disabled"}}},
    })
    gpu = NodeSpec("gpu-node-1", "gpu", "32", "256Gi", 110, "h100-80gb", 2, {}, ())
    lab = object.__new__(nb.Lab)
    lab.lesson, lab.namespace, lab.kube = "02-gpu-operator", "lesson-02", kube
    lab.cluster = types.SimpleNamespace(root=tmp_path / "cluster", topology=lambda: Topology("t", None, (gpu,)))
    assert lab._undo_gpu_stack() == [] and kube.calls == []


# -- plots: CJK fonts -----------------------------------------------------------------


def test_the_cjk_font_is_the_packaged_one_even_where_matplotlib_knows_no_cjk_font(monkeypatch):
    """No system CJK font (a learner without root): the noto-cjk-sans-otc dependency's font is registered."""
    from matplotlib import font_manager

    import noto_cjk_sans_otc

    monkeypatch.setattr(font_manager.fontManager, "ttflist",
                        [f for f in font_manager.fontManager.ttflist if "CJK" not in f.name])
    plots.cjk_font.cache_clear()
    try:
        assert plots.cjk_font() == "Noto Sans CJK SC"
        faces = [f for f in font_manager.fontManager.ttflist if f.name == "Noto Sans CJK SC"]
        assert [str(f.fname) for f in faces] == [str(noto_cjk_sans_otc.FONT_PATH)]
        plots.cjk_font()  # registered once
        assert len([f for f in font_manager.fontManager.ttflist if f.name == "Noto Sans CJK SC"]) == 1
    finally:
        plots.cjk_font.cache_clear()


def test_the_packaged_cjk_font_has_the_self_check_symbols():
    """expect()'s ✓ and ×, and ⚠, are in the font gpulab ships (emoji like ✅ ❌ ⚠️ are not: they show as boxes)."""
    from matplotlib.ft2font import FT2Font

    from gpulab.notebook import checks

    font = FT2Font(plots.cjk_font_file(), face_index=2)
    assert font.family_name == "Noto Sans CJK SC"
    charmap = font.get_charmap()
    for symbol in (checks.PASS, checks.FAIL, "⚠"):
        assert ord(symbol) in charmap, f"{symbol!r} (U+{ord(symbol):04X}) is not in {font.family_name}"
    for emoji in ("✅", "❌"):
        assert ord(emoji) not in charmap  # why expect() does not print them


def _fake_timeline():
    line = object.__new__(timeline.Timeline)
    line.t0, line.t_end, line.deleted = 100.0, 130.0, {"train-1": 125.0}
    line.samples = {"train-0": [(100.5, "Pending", 0), (101.0, "Creating", 0), (102.0, "Running", 0),
                                (104.0, "Ready", 0), (110.0, "BackOff", 1), (112.0, "Ready", 1),
                                (120.0, "Succeeded", 1)],
                    "train-1": [(101.0, "Pending", 0), (103.0, "Init", 0), (105.0, "Failed", 0),
                                (124.0, "Terminating", 0)]}
    return line


def _fake_hpa():
    from gpulab.notebook import hpa

    line = object.__new__(hpa.HpaTimeline)
    line.name, line.namespace = "llm", "lesson-07"
    line.samples = [(0.0, 1, 1, 5.0), (10.0, 2, 1, 85.0), (20.0, 2, 2, 60.0), (30.0, 1, 1, None)]
    line.marks = [(5.0, "负载 80%")]
    return line


def _cjk_figures(monkeypatch):
    """Every figure of gpulab.notebook, drawn with Chinese text wherever the lesson gives some."""
    monkeypatch.setattr(plots, "gpu_allocation", lambda: {
        "gpu-node-1": {"allocatable": 4, "pods": [("lesson-03/训练-a", 2), ("lesson-03/train-b", 1)]},
        "gpu-node-2": {"allocatable": 4, "pods": []}})
    monkeypatch.setattr(plots, "gpu_pods", lambda: [{"POD": "lesson-03/大作业", "NODE": "", "STATUS": "Pending",
                                                     "GPUS": 8}])
    yield "plot_allocation", nb.plot_allocation(title="各节点 GPU 分配（调度之后）", show=False)
    yield "plot_card_memory", nb.plot_card_memory(81559, 16384, [("整卡独占", 1, None), ("时间切片 ×4", 4, None),
                                                                 ("MIG 1g.10gb", 7, 9856), ("MIG 3g.40gb", 2, 40192)],
                                                  show=False)
    yield "plot_latency", nb.plot_latency([("整卡独占", 81.2, 84.0), ("MIG 3g.40gb，邻居满载", 180.3, 186.9)],
                                          show=False)
    yield "plot_gpu_memory", nb.plot_gpu_memory([{"GPU": "GPU 0", "POD": "推理-a", "MIB": 16384, "FAILED": False},
                                                 {"GPU": "GPU 0", "POD": "greedy", "MIB": 70000, "FAILED": True}],
                                                81559, show=False)
    yield "plot_free_gpus", nb.plot_free_gpus({"默认调度器": {"h100-node-1": 5, "h100-node-2": 5},
                                               "gpu-binpack": {"h100-node-1": 0, "h100-node-2": 8}}, 8, 8, show=False)
    yield "Timeline.plot", _fake_timeline().plot(labels={"train-0": "训练 0"}, show=False)
    yield "HpaTimeline.plot", _fake_hpa().plot(show=False)
    usage = _fake_usage_report()
    yield "UsageReport.plot_utilization", usage.plot_utilization(show=False)
    yield "UsageReport.plot_allocation", usage.plot_allocation(show=False)


def _fake_usage_report():
    """A usage report of 4 steps, as Prometheus answers its queries: lesson-07 holds gpu0 at 50 %, gpu1 is
    time-sliced between two namespaces (in use, DCGM names no pod) and computes nothing."""
    from gpulab.usage import report

    t = [1_800_000_000.0 + 5 * i for i in range(4)]

    def rows(*items):
        return [{"metric": labels, "value": [t[-1], str(v)]} for labels, v in items]

    def over_time(labels, value):
        return {"metric": labels, "values": [[x, str(value)] for x in t]}

    gpu0, gpu1 = {"node": "gpu-node-1", "gpu": "0"}, {"node": "gpu-node-1", "gpu": "1"}
    h100 = {"node": "gpu-node-1", "modelName": "NVIDIA H100 80GB HBM3"}
    results = {
        "gpus_now": rows(({"namespace": "lesson-07", "node": "gpu-node-1", "resource": "nvidia_com_gpu"}, 1),
                         ({"namespace": "team-b", "node": "gpu-node-1", "resource": "nvidia_com_gpu"}, 0.5)),
        "allocated_h": rows(({"namespace": "lesson-07", "node": "gpu-node-1", "resource": "nvidia_com_gpu"}, 0.0167),
                            ({"namespace": "team-b", "node": "gpu-node-1", "resource": "nvidia_com_gpu"}, 0.0083)),
        "computing_h": rows(({**h100, "namespace": "lesson-07"}, 0.0083), (h100, 0)),
        "gpu_nodes": rows((h100, 1)),
        "scrapes": rows(({}, 4)),
        "utilization": [over_time(gpu0, 50), over_time(gpu1, 0)],
        "holders": [over_time({**gpu0, "namespace": "lesson-07"}, 1000), over_time(gpu1, 2000)],
    }
    events = [{"reason": "Preempted", "involvedObject": {"namespace": "team-b", "name": "batch"},
               "message": "Preempted by pod uid-x on node gpu-node-1", "lastTimestamp": "2026-12-04T10:00:00Z"}]
    return nb.UsageReport(report.build(results, t[0] - 5, t[-1], 5, queries=report.queries(20, 5),
                                       preempted=report.preemptions(events, [])))


def test_every_plot_draws_all_its_text_with_the_cjk_font(monkeypatch):
    """Each text artist of each figure resolves to Noto Sans CJK SC, which has every character it shows."""
    import io
    import warnings

    from matplotlib import font_manager
    from matplotlib.text import Text

    plots.cjk_font.cache_clear()
    seen = 0
    for name, fig in _cjk_figures(monkeypatch):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fig.savefig(io.BytesIO(), format="png")
        missing = [str(w.message) for w in caught if "missing from font" in str(w.message) or "Glyph" in str(w.message)]
        assert not missing, f"{name}: {missing}"
        texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
        assert any(any("\u4e00" <= ch <= "\u9fff" for ch in t.get_text()) for t in texts), f"{name}: no Chinese text"
        for text in texts:
            font = font_manager.get_font(font_manager.findfont(text.get_fontproperties(), fallback_to_default=False))
            assert font.family_name == "Noto Sans CJK SC", f"{name}: {text.get_text()!r} drawn with {font.family_name}"
            charmap = font.get_charmap()
            lacking = {ch for ch in text.get_text() if ch.strip() and ord(ch) not in charmap}
            assert not lacking, f"{name}: {text.get_text()!r}: {sorted(lacking)} not in {font.family_name}"
            seen += 1
    assert seen > 30


def test_a_usage_report_reads_in_chinese_and_keeps_the_numbers_of_gpulab_report():
    usage = _fake_usage_report()
    text, html = repr(usage), usage._repr_html_()
    for words in ("GPU 用量", "按命名空间", "按节点", "命名空间 NAMESPACE", "分配 GPU 小时 GPU-H ALLOCATED",
                  "合计：", "抢占：team-b/batch（在 gpu-node-1 上）"):
        assert words in text, f"{words!r} not in:\n{text}"
    assert "命名空间<br><code" in html and "抢占：" in html
    cli = usage.report.text()  # gpulab report's English text: same numbers
    row = usage.namespace("lesson-07")
    assert f"{row.allocated_h:.3f}" in text and f"{row.allocated_h:.3f}" in cli
    assert "GPU usage since" in cli and "GPU 用量" not in cli
    # The PromQL behind the numbers, each query named in the chapter's terms.
    queries = usage.queries()
    assert queries.columns == ["QUERY", "PROMQL"] and len(queries) == len(usage.report.queries)
    assert any(r["QUERY"] == "分配的 GPU 小时（allocated_h）" and "kube_pod_container_resource_requests" in r["PROMQL"]
               for r in queries)


def test_a_figure_not_made_by_new_figure_is_drawn_with_the_cjk_font_too():
    """Usage reports make their own Figure; show_figure draws them after making the CJK font the sans-serif one."""
    import matplotlib
    from matplotlib import font_manager
    from matplotlib.figure import Figure

    matplotlib.rcParams["font.sans-serif"] = [f for f in matplotlib.rcParams["font.sans-serif"]
                                              if f != "Noto Sans CJK SC"]
    fig = Figure()
    title = fig.add_subplot().set_title("GPU 利用率")
    assert plots.show_figure(fig, show=False) is fig
    plots.show_figure(fig, show=True)  # outside IPython: nothing displayed, but the font is set
    font = font_manager.get_font(font_manager.findfont(title.get_fontproperties()))
    assert font.family_name == "Noto Sans CJK SC"


def test_plot_gpu_memory_stacks_pods_per_gpu_and_marks_the_card():
    rows = [{"GPU": "GPU 0", "POD": "a", "MIB": 16384, "FAILED": True},
            {"GPU": "GPU 1", "POD": "b", "MIB": 16384, "FAILED": False},
            {"GPU": "GPU 0", "POD": "greedy", "MIB": 61440, "FAILED": True}]
    fig = nb.plot_gpu_memory(rows, 81559, show=False)
    ax = fig.axes[0]
    bars = [(round(b.get_y() + b.get_height() / 2), b.get_x(), b.get_width()) for b in ax.patches]
    assert bars == [(0, 0, 16384), (0, 16384, 61440), (1, 0, 16384)]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["GPU 0", "GPU 1"]
    assert ax.lines[0].get_xdata()[0] == 81559  # the card's memory
    assert ax.get_xlim()[1] > 16384 + 61440


def test_plot_free_gpus_stacks_given_out_and_free_per_node_and_marks_where_a_big_pod_fits():
    free = {"默认调度器": {"h100-node-10": 5, "h100-node-2": 5, "h100-node-1": 6},
            "gpu-binpack": {"h100-node-10": 8, "h100-node-2": 0, "h100-node-1": 8}}
    fig = nb.plot_free_gpus(free, 8, 8, show=False)
    spread, packed = fig.axes[:2]
    # Nodes in name order, numbers as numbers.
    assert [t.get_text() for t in spread.get_xticklabels()] == ["h100-node-1", "h100-node-2", "h100-node-10"]
    heights = [(round(b.get_x() + b.get_width() / 2), b.get_y(), b.get_height()) for b in packed.patches]
    assert heights == [(0, 0, 0), (1, 0, 8), (2, 0, 0), (0, 0, 8), (1, 8, 0), (2, 0, 8)]
    assert spread.get_title() == "默认调度器：空闲 16 张，能放下 8 卡 Pod 的节点 0 台"
    assert packed.get_title() == "gpu-binpack：空闲 16 张，能放下 8 卡 Pod 的节点 2 台"
    assert spread.lines[0].get_ydata()[0] == 8  # the big pod's request


# -- the package's shape -------------------------------------------------------------------

# The modules of gpulab.notebook, bottom first: each imports (at the top or in a function) only modules before it.
LAYERS = ["table", "shell", "wait", "quantity", "checks", "quiz", "manifest", "lesson", "pod", "job", "event",
          "service", "logs", "gpus", "images", "plots", "timeline", "hpa", "metrics", "usage", "__init__"]
# What gpulab.notebook may import from the rest of gpulab: the packages below it, never cli.
def _layers_below(package: str) -> set[str]:
    """What pyproject.toml's import-linter layers put below ``package`` (one list, read here, not copied)."""
    import re
    import tomllib
    from pathlib import Path

    config = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    layers = next(c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers")["layers"]
    below = layers[layers.index(package) + 1:]
    return {name for layer in below for name in re.split(r"\s*[|:]\s*", layer)}


BELOW = _layers_below("notebook")


def _imports(path):
    """(sibling modules, other gpulab packages) that ``path`` imports anywhere, function bodies included."""
    import ast

    siblings, others = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names = node.module.split(".")[:1] if node.module else [a.name for a in node.names]
            if node.level == 1:
                siblings.update(names)
            elif node.level == 2:
                others.update(names)
            elif node.level == 0 and node.module and node.module.split(".")[0] == "gpulab":
                others.add(node.module.split(".")[1] if "." in node.module else "")
        elif isinstance(node, ast.Import):
            others.update(a.name.split(".")[1] if "." in a.name else "" for a in node.names
                          if a.name.split(".")[0] == "gpulab")
    return siblings, others


def test_notebook_modules_import_only_downwards():
    from pathlib import Path

    folder = Path(nb.__file__).parent
    assert sorted(p.stem for p in folder.glob("*.py")) == sorted(LAYERS)
    for i, name in enumerate(LAYERS):
        siblings, others = _imports(folder / f"{name}.py")
        assert siblings <= set(LAYERS[:i]), f"gpulab.notebook.{name} imports {sorted(siblings - set(LAYERS[:i]))}"
        assert others <= BELOW, f"gpulab.notebook.{name} imports gpulab.{sorted(others - BELOW)}"


def test_the_package_exports_what_notebooks_import_and_no_module_hides_a_name():
    star = {}
    exec("from gpulab.notebook import *", star)
    assert set(star) - {"__builtins__"} == set(nb.__all__)
    assert len(nb.__all__) == len(set(nb.__all__))
    # A submodule named like a helper (pods, nodes, events) would be shadowed by it, or shadow it.
    assert not set(LAYERS) & set(nb.__all__)


def test_importing_the_package_is_light_and_changes_no_other_module():
    import subprocess
    import sys

    script = ("import sys\nfrom gpulab.kube import api\nkinds = dict(api.KINDS)\nimport gpulab.notebook\n"
              "assert api.KINDS == kinds, 'gpulab.notebook changed api.KINDS'\n"
              "heavy = [m for m in ('matplotlib', 'IPython', 'ipywidgets', 'gpulab.quiz', 'gpulab.grading',"
              " 'gpulab.usage') if m in sys.modules]\n"
              "assert not heavy, heavy\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr


def test_every_column_the_library_prints_has_a_chinese_heading():
    """Each column key a gpulab.notebook table is built with is in HEADINGS (POD and GPU read the same)."""
    import ast
    from pathlib import Path

    from gpulab.notebook.table import HEADINGS

    same_in_chinese = {"POD", "GPU"}
    folder = Path(nb.__file__).parent
    keys: set[str] = set()
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Table" and len(node.args) > 1:
                cols = node.args[1]
                if isinstance(cols, ast.List):
                    keys |= {e.value for e in cols.elts if isinstance(e, ast.Constant)}
    from gpulab.notebook import metrics

    keys |= set(metrics.DCGM_COLUMNS.values())
    assert len(keys) > 15, keys
    missing = sorted(keys - set(HEADINGS) - same_in_chinese)
    assert not missing, f"columns without a Chinese heading in gpulab/notebook/table.py HEADINGS: {missing}"
