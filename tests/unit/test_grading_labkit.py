"""The notebook side of labs: kubectl in the lab's namespace, expected failures as values, the self-check."""

from __future__ import annotations

import functools
import importlib
import stat
import sys
import types
from pathlib import Path

import nbformat
import pytest
from grading_support import FakeClient

from gpulab.grading import checks, grader, labkit
from gpulab.grading.checks import Check, allocatable_by_node, check, failed, passed, ratio


@pytest.fixture
def fake_kubectl(tmp_path, monkeypatch):
    """A kubectl that prints its arguments, and fails (like the apiserver would) for `apply -f bad.yaml`."""
    exe = tmp_path / "kubectl"
    exe.write_text("#!/bin/sh\n"
                   "case \"$*\" in *bad.yaml*) echo 'The Pod \"x\" is invalid: must be an integer' >&2; exit 1;; esac\n"
                   "echo \"args: $*\"\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(labkit, "_kubectl_exe", lambda: str(exe))
    monkeypatch.setattr(labkit, "_lab", labkit.Lab("lab-01", tmp_path / "work", False, "kc"))
    return exe


def test_commands_run_in_the_labs_namespace_unless_told_otherwise(fake_kubectl, capsys):
    out = labkit.kubectl("get pods")
    assert out == "args: get pods -n lab-01\n"
    assert capsys.readouterr().out == "$ kubectl get pods -n lab-01\nargs: get pods -n lab-01\n"
    assert labkit.kubectl(["kubectl", "get", "pods", "-A"], quiet=True) == "args: get pods -A\n"
    assert labkit.kubectl("get pods --namespace=team-a", quiet=True) == "args: get pods --namespace=team-a\n"
    assert labkit.kubectl("get pods", namespace="other", quiet=True) == "args: get pods -n other\n"


def test_expected_rejections_are_values_and_unexpected_ones_raise(fake_kubectl):
    outcome = labkit.try_kubectl("apply -f bad.yaml", quiet=True)
    assert not outcome.ok and outcome.code == 1 and "must be an integer" in outcome.output
    with pytest.raises(labkit.KubectlFailed, match="must be an integer") as err:
        labkit.kubectl("apply -f bad.yaml", quiet=True)
    assert err.value.code == 1


def test_output_is_not_echoed_twice_in_a_notebook(fake_kubectl):
    out = labkit.kubectl("get nodes", quiet=True)
    assert isinstance(out, str) and out._ipython_display_() is None


def test_wait_until_says_what_did_not_happen():
    with pytest.raises(TimeoutError, match="Pod 运行起来"):
        labkit.wait_until(lambda: False, timeout=0.2, interval=0.05, what="Pod 运行起来")
    assert labkit.wait_until(lambda: "ready", timeout=1) == "ready"


def test_manifest_paths_are_absolute_and_checked():
    path = labkit.manifest("01-gpu-pod-spec/half-gpu.yaml")
    assert path.is_absolute() and path.exists()
    with pytest.raises(FileNotFoundError, match="manifests/labs/nope.yaml"):
        labkit.manifest("nope.yaml")


# --------------------------------------------------------------------------- check(): the in-notebook self-check

record_module = importlib.import_module("gpulab.grading.record")  # gpulab.grading.record is the function
LAB97 = "gpulab.grading.labs.lab_97"


def lab_97(monkeypatch, hidden=True, **settings) -> types.ModuleType:
    """A made-up lab 97 (its check module, importable by number), so no real lab's answers or messages are used."""
    module = types.ModuleType(LAB97)
    module.LAB, module.NAMESPACES = "97-self-check", ("team",)

    @check("count", points=1, title="数对了 GPU 节点")
    def count(ctx):
        return passed() if ctx.value("count") == len(allocatable_by_node(ctx)) else failed("数得不对。")

    @check("pods", points=2, title="两个 Pod 都在")
    def pods(ctx):
        here = {p["metadata"]["name"] for p in ctx.objects("Pod", ctx.namespace)}
        return ratio(len(here & {"a", "b"}), 2, [f"命名空间里少了 Pod {n}" for n in sorted({"a", "b"} - here)])

    @check("quota", points=3, title="团队命名空间 <team> 有配额")
    def quota(ctx):
        ctx.require("ResourceQuota", "gpu", f"{ctx.namespace}-team")
        return passed()

    module.count, module.pods, module.quota = count, pods, quota
    if hidden:  # a module may declare hidden checks too; the self-check never runs them
        module.secret = Check("secret", 1, lambda ctx: pytest.fail("a hidden check ran"), "不公开的检查", hidden=True)
    for name, value in settings.items():
        setattr(module, name, value)
    monkeypatch.setitem(sys.modules, LAB97, module)
    return module


def cluster_objects(namespace):
    """One GPU node; Pod a in the lab's namespace, Pod b elsewhere; no ResourceQuota in <namespace>-team."""
    return [{"kind": "Node", "metadata": {"name": "gpu-node-1"}, "status": {"allocatable": {"nvidia.com/gpu": "2"}}},
            {"kind": "Node", "metadata": {"name": "cpu-node-1"}, "status": {"allocatable": {"cpu": "4"}}},
            {"kind": "Pod", "metadata": {"name": "a", "namespace": namespace}},
            {"kind": "Pod", "metadata": {"name": "b", "namespace": "someone-else"}},
            {"kind": "ResourceQuota", "metadata": {"name": "gpu", "namespace": "someone-else-team"}}]


@pytest.fixture
def self_check(tmp_path, monkeypatch):
    """A kernel that ran lab 97 by hand up to some cell: its lab, a recorded value, a cluster; a spy on the checks."""
    lab_97(monkeypatch)
    monkeypatch.setattr(labkit, "_lab", labkit.Lab("lab-97", tmp_path / "work", False, "kc"))
    monkeypatch.setattr(record_module, "_memory", {})
    monkeypatch.setattr(record_module, "_explicit_path", None)
    monkeypatch.setattr(grader, "check_kernel",
                        functools.partial(grader.check_kernel, client=FakeClient(cluster_objects("lab-97"))))

    def no_hidden(*_a, **_k):
        raise AssertionError("the self-check loaded hidden checks")

    monkeypatch.setattr(grader, "load_hidden_checks", no_hidden)
    monkeypatch.setattr(checks, "load_hidden_checks", no_hidden)
    ran = []
    run_check = checks.run_check
    monkeypatch.setattr(checks, "run_check", lambda chk, ctx, label=None: ran.append(chk) or run_check(chk, ctx, label))
    labkit.record("count", 1)
    return ran


def test_check_shows_each_visible_check_and_the_total(self_check, capsys):
    before = record_module.recorded()
    assert labkit.check() is None
    out = capsys.readouterr().out
    assert out.startswith("自查：97-self-check\n")
    assert "gpulab check labs/97-self-check.ipynb" in out
    lines = out.splitlines()
    for verdict, points, title in (("通过", "1 / 1", "数对了 GPU 节点"), ("部分", "1 / 2", "两个 Pod 都在"),
                                   ("未通过", "0 / 3", "团队命名空间 <team> 有配额")):
        assert any(ln.startswith(verdict) and ln.endswith(f"{points}  {title}") for ln in lines), (title, out)
    # Each message under its check: the Pod in another namespace does not count, nor the quota elsewhere.
    assert "命名空间里少了 Pod b" in out and "命名空间 lab-97-team 里没有找到 ResourceQuota `gpu`" in out
    assert out.endswith("合计：2 / 6 分。评分时还有隐藏检查。\n")
    assert "不公开" not in out and "隐藏检查 1" not in out
    # Only the lab's own visible checks ran, each once; the check recorded nothing itself.
    assert [c.id for c in self_check] == ["count", "pods", "quota"]
    assert record_module.recorded() == before


def test_check_grades_like_gpulab_check_through_the_same_step(self_check, tmp_path, monkeypatch):
    """`gpulab check` (check_notebook) and check() (check_kernel) both grade through grader.grade_visible:
    the same values and objects give the same outcomes."""
    lab_97(monkeypatch, hidden=False)
    calls = []
    grade_visible = grader.grade_visible
    monkeypatch.setattr(grader, "grade_visible", lambda *a, **k: calls.append(a[3]) or grade_visible(*a, **k))
    values = record_module.recorded()
    mine = grader.check_kernel("97", "lab-97", values)

    spec, suite = grader._spec("97"), checks.load_lab_checks("97")
    namespace = grader.namespace_for(spec, "check")(spec.lab, "alice")
    client = FakeClient(cluster_objects(namespace))

    class Sandbox:
        def prepare(self, namespace, learner):
            return {}

        def release(self, namespace):
            pass

        def close(self):
            pass

    ready = grader.Setup(spec, suite, grader.KernelRun(values), grader.ClusterCollector(client, spec), Sandbox())
    monkeypatch.setattr(grader, "setup", lambda *a, **k: ready)
    notebook = tmp_path / "97-self-check.ipynb"
    notebook.write_text("{}", encoding="utf-8")
    theirs = grader.check_notebook(notebook, out_dir=tmp_path / "out", learner="alice")

    assert [type(runner).__name__ for runner in calls] == ["KernelRun", "KernelRun"]
    assert [(o.check_id, o.earned, o.message.replace(namespace, "NS")) for o in theirs.row.outcomes] == \
        [(o.check_id, o.earned, o.message.replace("lab-97", "NS")) for o in mine.row.outcomes]
    assert mine.row.total == theirs.row.total == 2 and mine.out_dir is None


def test_check_in_a_kernel_displays_a_table(self_check, monkeypatch):
    import IPython
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython, "get_ipython", lambda: object())
    monkeypatch.setattr(IPython.display, "display", lambda data, raw=False: shown.append((data, raw)))
    labkit.check()
    [(data, raw)] = shown
    assert raw and set(data) == {"text/plain", "text/html"} and data["text/plain"].startswith("自查：97-self-check")
    page = data["text/html"]
    assert "<table>" in page and all(f">{h}</th>" in page for h in ("检查", "得分", "结果", "说明"))
    assert ">团队命名空间 &lt;team&gt; 有配额</td>" in page  # escaped
    assert "✓ 通过" in page and "⚠ 部分" in page and "× 未通过" in page
    assert "合计：2 / 6 分" in page and "评分时还有隐藏检查" in page and "不公开" not in page


def test_check_is_skipped_under_the_grader(self_check, capsys, monkeypatch):
    monkeypatch.setattr(grader, "check_kernel", lambda *a, **k: pytest.fail("a graded run must not self-check"))
    labkit._lab.graded = True
    before = record_module.recorded()
    labkit.check()
    assert capsys.readouterr().out == labkit.SKIPPED_WHEN_GRADED + "\n"
    assert self_check == [] and record_module.recorded() == before


def test_check_says_what_is_missing_in_one_line(self_check, capsys, monkeypatch):
    monkeypatch.setattr(labkit._lab, "namespace", "my-own-namespace")
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    labkit.check()
    assert capsys.readouterr().out == "认不出这是哪个实验：请写明实验编号，例如 check(\"01\")。\n"
    monkeypatch.setenv("JPY_SESSION_NAME", "/home/me/labs/97-self-check.ipynb")
    labkit.check()
    assert capsys.readouterr().out.startswith("自查：97-self-check\n")

    monkeypatch.setattr(labkit, "_lab", None)
    labkit.check()
    assert capsys.readouterr().out == "自查之前先运行笔记本开头调用 begin(namespace) 的单元格。\n"


def test_check_without_a_running_cluster_says_so(self_check, capsys, monkeypatch):
    def down(cluster=None):
        raise grader.GradingError("the cluster in /x is not running: start it with `gpulab up`")

    monkeypatch.setattr(grader, "check_kernel", grader.check_kernel.func)  # the local cluster's own client
    monkeypatch.setattr(grader, "_cluster", down)
    labkit.check()
    assert capsys.readouterr().out == "自查没能进行：the cluster in /x is not running: start it with `gpulab up`\n"


def test_a_lab_the_grader_sets_up_says_the_self_check_cannot_see_that(self_check, capsys, monkeypatch):
    lab_97(monkeypatch, CLUSTER_WIDE=True, SETUP=lambda env: pytest.fail("the self-check ran SETUP"))
    labkit.check()
    out = capsys.readouterr().out
    assert out.startswith("自查：97-self-check\n") and out.endswith(labkit.SETUP_NOTE + "\n")


LABS = sorted((Path(__file__).resolve().parents[2] / "labs").glob("[0-9][0-9]-*.ipynb"))


@pytest.mark.parametrize("path", LABS, ids=[p.stem for p in LABS])
def test_each_lab_has_a_self_check_cell_the_grader_and_nbval_leave_alone(path):
    cells = nbformat.read(path, as_version=4).cells
    found = [i for i, c in enumerate(cells) if c.cell_type == "code" and c.source.strip() == "check()"]
    assert len(found) == 1, f"{path.name}: expected one `check()` cell"
    i = found[0]
    assert {"skip-execution", "nbval-ignore-output"} <= set(cells[i].metadata.get("tags") or [])
    assert cells[i - 1].cell_type == "markdown" and cells[i - 1].source.startswith("## 自查")
    assert f"gpulab check labs/{path.name}" in cells[i - 1].source
    assert i < len(cells) - 1, "the cleanup cell stays last"


def test_a_lab_kernel_finds_the_kubeconfig_without_loading_a_backend(tmp_path):
    """labkit is what a lab notebook imports: the kubeconfig's path comes from the state directory alone."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from gpulab.grading import labkit\n"
            "from gpulab.cluster import backend\n"
            "backend.kubeconfig()\n"
            "loaded = [m for m in ('gpulab.cluster.embedded', 'gpulab.cluster.kind', 'kubernetes') if m in sys.modules]\n"
            "assert not loaded, loaded\n")
    env = {"GPULAB_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr


def test_the_state_directory_is_the_backends_own(tmp_path, monkeypatch):
    from gpulab.cluster import backend
    from gpulab.cluster.embedded import EmbeddedCluster
    from gpulab.cluster.kind import KindCluster

    monkeypatch.setenv("GPULAB_HOME", str(tmp_path))
    assert backend.state_dir("embedded") == EmbeddedCluster().root
    assert backend.state_dir("kind") == KindCluster().root
    backend.choose("kind")
    assert backend.kubeconfig() == KindCluster().kubeconfig
    backend.forget()
    assert backend.kubeconfig() == EmbeddedCluster().kubeconfig
