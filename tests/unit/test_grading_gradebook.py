"""Does batch grading isolate failures, write an atomic CSV and zh-CN feedback, and repeat exactly?"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import nbformat
import pytest
from grading_support import notebook, write

import gpulab._fsutil as fsutil
from gpulab.grading.checks import HIDDEN_FAILED, load_lab_checks
from gpulab.grading.gradebook import (
    RecordedCollector,
    default_namespace,
    discover_submissions,
    grade_batch,
    gradebook_header,
    k8s_name,
    read_gradebook,
    write_gradebook,
)
from gpulab.grading.runner import ErrorKind, Execution, Runner

NODES = [{"kind": "Node", "metadata": {"name": "gpu-node-1"}, "status": {"allocatable": {"nvidia.com/gpu": "2"}}}]


def _job(namespace: str) -> dict:
    return {
        "kind": "Job", "metadata": {"name": "gpu-train-demo", "namespace": namespace},
        "spec": {"backoffLimit": 2, "activeDeadlineSeconds": 600, "template": {"spec": {
            "restartPolicy": "Never", "nodeSelector": {"node-role.kubernetes.io/ai": "true"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "train", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}},
        "status": {"succeeded": 1}}


GOOD_VALUES = {"allocatable_gpus": {"gpu-node-1": 2}, "train_log": "train step done"}


class FakeRunner:
    """Stands in for papermill: each notebook's metadata says how its run 'ends'."""

    def __init__(self):
        self.calls = []

    def run(self, notebook_path, work_dir, parameters=None, cwd=None, env=None, name=None):
        self.calls.append((name, dict(parameters or {}), dict(env or {})))
        work_dir.mkdir(parents=True, exist_ok=True)
        results = work_dir / f"{name}.results.json"
        base = dict(notebook=notebook_path, results_path=results, parameters=parameters or {}, executed=True)
        try:
            nb = json.loads(notebook_path.read_text(encoding="utf-8"))
        except ValueError:
            return Execution(ok=False, error=ErrorKind.INVALID_NOTEBOOK, message="bad json",
                             **{**base, "executed": False})
        fake = nb["metadata"].get("fake", {})
        if fake.get("crash"):
            raise RuntimeError("grader machine hiccup")
        results.write_text(json.dumps(fake.get("values", {})), encoding="utf-8")
        if fake.get("timeout"):
            return Execution(ok=False, error=ErrorKind.TIMEOUT, message="wall-clock limit of 5s exceeded",
                             timeout=5, **base)
        return Execution(ok=True, message="ok", **base)


def _fake_submission(path: Path, **fake) -> Path:
    nb = notebook(["x = 1"])
    nb.metadata["fake"] = fake
    return write(nb, path)


@pytest.fixture
def submissions(tmp_path):
    d = tmp_path / "submissions"
    _fake_submission(d / "alice.ipynb", values=GOOD_VALUES)
    _fake_submission(d / "bob" / "example-lab.ipynb", values={"train_log": "oops"}, timeout=True)
    (d / "carol.ipynb").write_text("{definitely not json", encoding="utf-8")
    _fake_submission(d / "dave.ipynb", crash=True)
    (d / "erin").mkdir()
    (d / ".ipynb_checkpoints").mkdir()
    return d


def _collector():
    return RecordedCollector({default_namespace("example", "alice"): NODES + [_job(default_namespace("example",
                                                                                                     "alice"))],
                              "*": NODES})


def _hidden(tmp_path: Path) -> Path:
    d = tmp_path / "hidden"
    d.mkdir(exist_ok=True)
    (d / "h.py").write_text(textwrap.dedent('''
        from gpulab.grading.checks import check, failed
        LAB = "example"

        @check("h-secret", points=2, title="秘密标题：Pod 必须叫 trainer")
        def secret(ctx):
            return failed("秘密消息：名字应为 trainer")
    '''), encoding="utf-8")
    return d


def test_discovery_rules(submissions):
    subs = {s.learner: s for s in discover_submissions(submissions, "example")}
    assert list(subs) == ["alice", "bob", "carol", "dave", "erin"]
    assert subs["bob"].notebook.name == "example-lab.ipynb"
    assert subs["erin"].problem == "no-notebook"


def test_ambiguous_submissions_are_rows_not_guesses(tmp_path):
    d = tmp_path / "subs"
    _fake_submission(d / "frank.ipynb")
    _fake_submission(d / "frank" / "anything.ipynb")
    _fake_submission(d / "gina" / "draft.ipynb")
    _fake_submission(d / "gina" / "final.ipynb")
    _fake_submission(d / "hana" / "notes.ipynb")
    _fake_submission(d / "hana" / "03-scheduling.ipynb")
    subs = {s.learner: s for s in discover_submissions(d, "03-scheduling")}
    assert subs["frank"].problem == "ambiguous-submission" and "frank.ipynb" in subs["frank"].reason
    assert subs["gina"].problem == "ambiguous-submission"
    assert subs["hana"].notebook.name == "03-scheduling.ipynb"


def test_batch_isolates_every_failure(submissions, tmp_path):
    events = []
    runner = FakeRunner()
    result = grade_batch(submissions, "example", None, runner, tmp_path / "out", hidden=_hidden(tmp_path),
                         progress=events.append, collector=_collector(), parameters={"gpus": 1})
    rows = {r["learner"]: r for r in read_gradebook(result.gradebook)}
    assert list(rows) == ["alice", "bob", "carol", "dave", "erin"]
    header = gradebook_header(result.suite)
    assert header[0] == "learner" and header[-4:] == ["total", "max", "status", "reason"]
    assert "job-gpu-limit (2)" in header and "hidden:h-secret (2)" in header
    assert rows["alice"]["status"] == "ok" and rows["alice"]["total"] == "10" and rows["alice"]["max"] == "12"
    assert rows["alice"]["hidden:h-secret (2)"] == "0" and rows["alice"]["job-gpu-limit (2)"] == "2"
    assert rows["bob"]["status"] == "timeout" and rows["bob"]["total"] == "0"
    assert "wall-clock" in rows["bob"]["reason"]
    assert rows["carol"]["status"] == "invalid-notebook" and rows["carol"]["total"] == "0"
    assert rows["dave"]["status"] == "grader-error" and rows["dave"]["total"] == ""
    assert "grader machine hiccup" in rows["dave"]["reason"]
    assert rows["erin"]["status"] == "no-notebook" and rows["erin"]["total"] == "0"
    # per-submission parameters: their own namespace, plus the batch's extra parameters
    assert runner.calls[0][1] == {"gpus": 1, "namespace": default_namespace("example", "alice")}
    assert [e.phase for e in events] == ["start", "done"] * 5 and events[-1].index == events[-1].total == 5
    for learner in rows:
        assert (tmp_path / "out" / "feedback" / f"{learner}.md").exists()
    assert result.summary_text().startswith("lab example: 5 submission(s) (grader-error 1, invalid-notebook 1, "
                                            "no-notebook 1, ok 1, timeout 1), mean 2.5/12")


def test_feedback_is_chinese_and_never_reveals_hidden_checks(submissions, tmp_path):
    grade_batch(submissions, "example", None, FakeRunner(), tmp_path / "out", hidden=_hidden(tmp_path),
                collector=_collector())
    alice = (tmp_path / "out" / "feedback" / "alice.md").read_text(encoding="utf-8")
    assert "得分：**10 / 12**" in alice and "笔记本从头到尾运行成功" in alice
    assert f"隐藏检查 1：0 / 2 分。{HIDDEN_FAILED}" in alice
    for secret in ("秘密标题", "秘密消息", "trainer", "h-secret"):
        assert secret not in alice
    bob = (tmp_path / "out" / "feedback" / "bob.md").read_text(encoding="utf-8")
    assert "被中止" in bob and "没有找到笔记本记录的结果 `allocatable_gpus`" in bob
    carol = (tmp_path / "out" / "feedback" / "carol.md").read_text(encoding="utf-8")
    assert "不是有效的 Jupyter 笔记本" in carol and "都记 0 分" in carol
    dave = (tmp_path / "out" / "feedback" / "dave.md").read_text(encoding="utf-8")
    assert "内部错误" in dave and "得分：暂无" in dave
    details = json.loads((tmp_path / "out" / "details.json").read_text(encoding="utf-8"))
    hidden = [c for c in details["learners"]["alice"]["checks"] if c["hidden"]][0]
    assert hidden["detail"] == "秘密消息：名字应为 trainer"  # instructors can still see why


def test_grading_twice_gives_identical_files(submissions, tmp_path):
    for out in ("first", "second"):
        grade_batch(submissions, "example", None, FakeRunner(), tmp_path / out, hidden=_hidden(tmp_path),
                    collector=_collector())
    first, second = tmp_path / "first", tmp_path / "second"
    assert (first / "gradebook.csv").read_bytes() == (second / "gradebook.csv").read_bytes()
    for md in (first / "feedback").iterdir():
        assert md.read_bytes() == (second / "feedback" / md.name).read_bytes()
    assert (first / "details.json").read_bytes() == (second / "details.json").read_bytes()


def test_gradebook_is_consistent_if_the_batch_dies(submissions, tmp_path):
    def stop_after_first(event):
        if event.phase == "done" and event.index == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        grade_batch(submissions, "example", None, FakeRunner(), tmp_path / "out", progress=stop_after_first,
                    collector=_collector())
    rows = read_gradebook(tmp_path / "out" / "gradebook.csv")
    assert [r["learner"] for r in rows] == ["alice", "bob"]


def test_a_failed_gradebook_write_keeps_the_old_file(tmp_path, monkeypatch):
    suite = load_lab_checks("example")
    path = tmp_path / "gradebook.csv"
    write_gradebook(path, suite, [])
    before = path.read_bytes()
    with monkeypatch.context() as patch:
        patch.setattr(fsutil.os, "replace", lambda a, b: (_ for _ in ()).throw(OSError("power loss")))
        with pytest.raises(OSError):
            write_gradebook(path, suite, [])
    assert path.read_bytes() == before and not list(tmp_path.glob("*.tmp"))
    assert before.startswith("\ufefflearner,".encode("utf-8"))  # BOM so spreadsheets read UTF-8


def test_namespaces_are_valid_and_distinct():
    names = {default_namespace("03-scheduling", who) for who in ("alice", "Alice", "张三", "李四", "a_b", "a-b")}
    assert len(names) == 6
    for name in names:
        assert len(name) <= 63 and name == name.lower() and name[0].isalnum() and name[-1].isalnum()
        assert all(ch.isalnum() or ch == "-" for ch in name)
    assert k8s_name("grade", "x" * 100).startswith("grade-x")


def test_real_runner_batch_with_a_hanging_and_an_invalid_submission(tmp_path):
    """End to end with kernels: one good, one hanging, one invalid, one without parameters cell."""
    subs = tmp_path / "subs"
    write(notebook([
        "import gpulab.grading as grading\n"
        "grading.record('allocatable_gpus', {'gpu-node-1': 2})\n"
        "grading.record('train_log', 'GPU 0\\ntrain step done')",
    ]), subs / "alice.ipynb")
    write(notebook(["import gpulab.grading as grading\ngrading.record('train_log', 'train step done')",
                    "while True:\n    pass"]), subs / "bob.ipynb")
    (subs / "carol.ipynb").write_text('{"cells": [', encoding="utf-8")
    write(notebook(["x = 1"], parameters=None), subs / "dave.ipynb")
    result = grade_batch(subs, "example", None, Runner(cell_timeout=None, timeout=10), tmp_path / "out",
                         collector=_collector())
    rows = {r["learner"]: r for r in read_gradebook(result.gradebook)}
    assert {k: (v["status"], v["total"]) for k, v in rows.items()} == {
        "alice": ("ok", "10"), "bob": ("timeout", "1"), "carol": ("invalid-notebook", "0"),
        "dave": ("no-parameters-cell", "0")}
    assert rows["bob"]["train-log (1)"] == "1"  # partial credit for what ran before the hang
    executed = nbformat.read(tmp_path / "out" / "runs" / "alice.executed.ipynb", as_version=4)
    assert any("injected-parameters" in c.metadata.get("tags", []) for c in executed.cells)
