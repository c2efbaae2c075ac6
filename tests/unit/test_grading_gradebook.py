"""Does batch grading isolate failures, merge into an atomic CSV that never loses a row, write zh-CN
feedback, and repeat exactly?"""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import nbformat
import pytest
from click.testing import CliRunner
from grading_support import EXAMPLE_LAB, example_checks, notebook, write

import gpulab._fsutil as fsutil
from gpulab import cli
from gpulab.grading import gradebook as gb
from gpulab.grading import grader
from gpulab.grading.checks import HIDDEN_FAILED, load_lab_checks
from gpulab.grading.gradebook import (
    SUMMARY_COLUMNS,
    GradebookError,
    GradeRow,
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

T1 = datetime(2025, 3, 1, 8, 30, tzinfo=timezone.utc)
T2 = datetime(2025, 3, 2, 9, 45, 30, tzinfo=timezone.utc)

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
    result = grade_batch(submissions, "example", example_checks(), runner, tmp_path / "out", hidden=_hidden(tmp_path),
                         progress=events.append, collector=_collector(), parameters={"gpus": 1})
    rows = {r["learner"]: r for r in read_gradebook(result.gradebook)}
    assert list(rows) == ["alice", "bob", "carol", "dave", "erin"]
    header = gradebook_header(result.suite)
    assert header[0] == "learner" and header[-8:] == ["total", "max", "percent", "status", "reason", "review",
                                                      "graded-at", "lab"] == list(SUMMARY_COLUMNS)
    assert list(rows["alice"]) == header
    assert "job-gpu-limit (2)" in header and "hidden:h-secret (2)" in header
    assert rows["alice"]["status"] == "ok" and rows["alice"]["total"] == "10" and rows["alice"]["max"] == "12"
    assert rows["alice"]["percent"] == "83.33" and rows["alice"]["lab"] == "example"
    assert datetime.strptime(rows["alice"]["graded-at"], "%Y-%m-%dT%H:%M:%SZ")  # ISO 8601, UTC
    assert rows["dave"]["percent"] == "" and rows["bob"]["percent"] == "0"
    assert {r["review"] for r in rows.values()} == {""}  # nothing awaits review
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
    grade_batch(submissions, "example", example_checks(), FakeRunner(), tmp_path / "out", hidden=_hidden(tmp_path),
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
        grade_batch(submissions, "example", example_checks(), FakeRunner(), tmp_path / out, hidden=_hidden(tmp_path),
                    collector=_collector(), clock=lambda: T1)
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
        grade_batch(submissions, "example", example_checks(), FakeRunner(), tmp_path / "out", progress=stop_after_first,
                    collector=_collector())
    rows = read_gradebook(tmp_path / "out" / "gradebook.csv")
    assert [r["learner"] for r in rows] == ["alice", "bob"]


def test_a_failed_gradebook_write_keeps_the_old_file(tmp_path, monkeypatch):
    suite = example_checks()
    path = tmp_path / "gradebook.csv"
    write_gradebook(path, suite, [])
    before = path.read_bytes()
    with monkeypatch.context() as patch:
        patch.setattr(fsutil.os, "replace", lambda a, b: (_ for _ in ()).throw(OSError("power loss")))
        with pytest.raises(OSError):
            write_gradebook(path, suite, [])
    assert path.read_bytes() == before and not list(tmp_path.glob("*.tmp"))
    assert before.startswith("\ufefflearner,".encode("utf-8"))  # BOM so spreadsheets read UTF-8


# --------------------------------------------------------------------------- a gradebook that never loses a row


def _table(path: Path) -> tuple[list[str], list[list[str]]]:
    with open(path, encoding="utf-8-sig", newline="") as handle:
        header, *rows = list(csv.reader(handle))
    return header, rows


def _without_graded_at(path: Path) -> list[dict[str, str]]:
    return [{k: v for k, v in row.items() if k != "graded-at"} for row in read_gradebook(path)]


def test_grading_one_learner_into_a_class_gradebook_keeps_every_other_row(submissions, tmp_path):
    out = tmp_path / "out"
    grade_batch(submissions, "example", example_checks(), FakeRunner(), out, collector=_collector(), clock=lambda: T1)
    before = {r["learner"]: r for r in read_gradebook(out / "gradebook.csv")}
    alone = tmp_path / "late"
    _fake_submission(alone / "alice.ipynb", values={"train_log": "oops"})  # alice resubmits, worse
    result = grade_batch(alone, "example", example_checks(), FakeRunner(), out, collector=_collector(), clock=lambda: T2)
    rows = read_gradebook(out / "gradebook.csv")
    assert [r["learner"] for r in rows] == ["alice", "bob", "carol", "dave", "erin"]  # same order
    after = {r["learner"]: r for r in rows}
    for learner in ("bob", "carol", "dave", "erin"):
        assert after[learner] == before[learner]  # untouched, timestamps included
        assert (out / "feedback" / f"{learner}.md").exists()
    assert after["alice"]["total"] != before["alice"]["total"] and after["alice"]["graded-at"] == "2025-03-02T09:45:30Z"
    assert [r.learner for r in result.rows] == ["alice"] and result.gradebook_rows == 5
    assert "(5 row(s))" in result.summary_text()
    details = json.loads((out / "details.json").read_text(encoding="utf-8"))
    assert sorted(details["learners"]) == ["alice", "bob", "carol", "dave", "erin"]
    assert details["learners"]["alice"]["graded_at"] == "2025-03-02T09:45:30Z"
    assert details["learners"]["bob"]["graded_at"] == "2025-03-01T08:30:00Z"


def test_new_learners_are_appended_after_the_existing_rows(submissions, tmp_path):
    out = tmp_path / "out"
    grade_batch(submissions, "example", example_checks(), FakeRunner(), out, collector=_collector())
    late = tmp_path / "late"
    _fake_submission(late / "zoe.ipynb", values=GOOD_VALUES)
    _fake_submission(late / "aaron.ipynb", values=GOOD_VALUES)
    grade_batch(late, "example", example_checks(), FakeRunner(), out, collector=_collector())
    assert [r["learner"] for r in read_gradebook(out / "gradebook.csv")] == [
        "alice", "bob", "carol", "dave", "erin", "aaron", "zoe"]


def test_regrading_the_same_batch_is_idempotent_but_graded_at_moves(submissions, tmp_path):
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    grade_batch(submissions, "example", example_checks(), FakeRunner(), out, collector=_collector(), clock=lambda: T1)
    first = read_gradebook(out / "gradebook.csv")
    grade_batch(submissions, "example", example_checks(), FakeRunner(), out, collector=_collector(), clock=lambda: T2)
    second = read_gradebook(out / "gradebook.csv")
    assert _without_graded_at(out / "gradebook.csv") == [{k: v for k, v in r.items() if k != "graded-at"}
                                                         for r in first]
    assert {r["graded-at"] for r in first} == {"2025-03-01T08:30:00Z"}
    assert {r["graded-at"] for r in second} == {"2025-03-02T09:45:30Z"}  # the time it was (re)graded
    # ... and the file is byte for byte what grading once at that time gives
    grade_batch(submissions, "example", example_checks(), FakeRunner(), fresh, collector=_collector(), clock=lambda: T2)
    assert (out / "gradebook.csv").read_bytes() == (fresh / "gradebook.csv").read_bytes()
    assert (out / "details.json").read_bytes() == (fresh / "details.json").read_bytes()


def test_an_older_gradebook_is_merged_by_column_name(submissions, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    # the format before percent/graded-at/lab, a check that is gone and an instructor's own column
    (out / "gradebook.csv").write_text(
        "learner,retired-check (3),job-gpu-limit (2),total,max,status,reason,notes\n"
        "alice,3,2,5,13,ok,,late by a day\n"
        "mallory,1,0,1,13,ok,,\n", encoding="utf-8-sig")
    (out / "details.json").write_text(json.dumps({"lab": "example", "learners": {"mallory": {"total": 1}}}),
                                      encoding="utf-8")
    grade_batch(submissions, "example", example_checks(), FakeRunner(), out, collector=_collector(), learners=["alice"],
                clock=lambda: T1)
    header, _ = _table(out / "gradebook.csv")
    suite = example_checks()
    ours = gradebook_header(suite)
    assert header == [*ours[:-len(SUMMARY_COLUMNS)], "retired-check (3)", *SUMMARY_COLUMNS, "notes"]
    rows = {r["learner"]: r for r in read_gradebook(out / "gradebook.csv")}
    assert list(rows) == ["alice", "mallory"]
    assert rows["mallory"]["retired-check (3)"] == "1" and rows["mallory"]["total"] == "1"
    assert rows["mallory"]["graded-at"] == "" and rows["mallory"]["max"] == "13"  # kept as it was
    assert rows["alice"]["retired-check (3)"] == "" and rows["alice"]["total"] == "10"
    assert rows["alice"]["notes"] == "late by a day"  # the instructor's note survives the regrade
    assert rows["alice"]["graded-at"] == "2025-03-01T08:30:00Z" and rows["alice"]["lab"] == "example"
    assert sorted(json.loads((out / "details.json").read_text(encoding="utf-8"))["learners"]) == ["alice", "mallory"]


def test_an_answer_that_seems_to_assert_a_wrong_claim_awaits_the_instructors_review(tmp_path):
    from gpulab.grading.checks import CheckSuite
    from gpulab.grading.labs import lab_04

    suite = CheckSuite("example", (*example_checks().checks, lab_04.explanation))
    subs = tmp_path / "subs"
    right = "time-slicing 只轮流分算力，显存并没有切开，一个容器 OOM 邻居一起挂；要隔离显存用 MIG。"
    wrong = "time-slicing 把显存平均分给每个容器，大家轮流用算力，一个容器 OOM 邻居一起挂；要隔离显存用 MIG。"
    _fake_submission(subs / "alice.ipynb", values={**GOOD_VALUES, "explanation": right})
    _fake_submission(subs / "bob.ipynb", values={**GOOD_VALUES, "explanation": wrong})
    out = tmp_path / "out"
    result = grade_batch(subs, "example", suite, FakeRunner(), out, collector=_collector(), clock=lambda: T1)
    rows = {r["learner"]: r for r in read_gradebook(out / "gradebook.csv")}
    # the gradebook marks bob's answer, and only his: filter on a non-empty review
    assert rows["alice"]["review"] == "" and rows["alice"]["explanation (3)"] == "3"
    assert rows["bob"]["review"] == "explanation"
    # the concept credit stays (4 of 4 parts said); the two shares the claim would take back are withheld
    assert rows["bob"]["explanation (3)"] == "1.5"
    assert float(rows["bob"]["total"]) == sum(float(rows["bob"][gb.column_name(c)]) for c in suite.checks)
    details = json.loads((out / "details.json").read_text(encoding="utf-8"))
    explained = {c["id"]: c for c in details["learners"]["bob"]["checks"]}["explanation"]
    assert explained["review"] == ["time-slicing 把显存平均分给每个容器"] and explained["withheld"] == 1.5
    assert {c["id"]: c for c in details["learners"]["alice"]["checks"]}["explanation"]["review"] == []
    # the learner is asked, never told, and knows the points are provisional
    bob = (out / "feedback" / "bob.md").read_text(encoding="utf-8")
    assert "- 待老师复核：1 项回答，暂扣 1.5 分，复核后可能加回" in bob
    assert "1.5 / 3 分（另有 1.5 分暂扣，待老师复核）。" in bob
    assert "解释里写的「time-slicing 把显存平均分给每个容器」——是说 time-slicing 把显存分开了吗？" in bob
    assert "如果不是，这一条会交给老师复核。" in bob and "把原因说成了" not in bob
    assert "待老师复核" not in (out / "feedback" / "alice.md").read_text(encoding="utf-8")
    # the instructor's summary says how many answers wait
    assert "1 answer awaits your review" in result.summary_text()
    assert [o.check_id for o in result.rows[1].awaiting_review] == ["explanation"]
    regraded = grade_batch(subs, "example", example_checks(), FakeRunner(), tmp_path / "plain", collector=_collector())
    assert len(regraded.summary_text().splitlines()) == 3  # no explanation check, nothing to review: no line for it


def test_a_gradebook_of_another_lab_is_refused_and_kept(submissions, tmp_path):
    out = tmp_path / "out"
    grade_batch(submissions, "example", example_checks(), FakeRunner(), out, collector=_collector())
    files = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    runner = FakeRunner()
    with pytest.raises(GradebookError) as err:
        grade_batch(submissions, "01-gpu-pod-spec", None, runner, out, collector=_collector())
    message = str(err.value)
    assert "lab example, not of lab 01-gpu-pod-spec" in message and str(out / "gradebook.csv") in message
    assert "--out" in message and "nothing was changed" in message
    assert runner.calls == []  # refused before running anything
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == files
    with pytest.raises(GradebookError):  # the low-level writer refuses too
        write_gradebook(out / "gradebook.csv", load_lab_checks("01"), [GradeRow("alice", "ok")],
                        lab="01-gpu-pod-spec")
    assert (out / "gradebook.csv").read_bytes() == files[out / "gradebook.csv"]


def test_an_older_gradebook_without_a_lab_column_is_recognised_by_its_details(submissions, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "gradebook.csv").write_text("learner,total,max,status,reason\nmallory,1,13,ok,\n", encoding="utf-8-sig")
    (out / "details.json").write_text(json.dumps({"lab": "example", "learners": {}}), encoding="utf-8")
    before = (out / "gradebook.csv").read_bytes()
    with pytest.raises(GradebookError, match="lab example, not of lab 01-gpu-pod-spec"):
        grade_batch(submissions, "01-gpu-pod-spec", None, FakeRunner(), out)
    assert (out / "gradebook.csv").read_bytes() == before
    # the right lab merges into it; "03", "lab_03" and "03-taints-tolerations" are one lab
    grade_batch(submissions, "example", example_checks(), FakeRunner(), out, learners=["erin"])
    assert gb._same_lab("03", "03-taints-tolerations") and gb._same_lab("lab_03", "03")
    assert not gb._same_lab("03", "04-sharing") and not gb._same_lab("example", "01-gpu-pod-spec")
    assert [r["learner"] for r in read_gradebook(out / "gradebook.csv")] == ["mallory", "erin"]


def test_an_unreadable_gradebook_is_refused_not_overwritten(tmp_path):
    path = tmp_path / "gradebook.csv"
    path.write_bytes("learner,total\n张三,1\n".encode("gbk"))  # re-saved by a spreadsheet app
    with pytest.raises(GradebookError, match="CSV UTF-8"):
        write_gradebook(path, example_checks(), [GradeRow("alice", "ok")])
    path.write_text("name,total\nalice,1\n", encoding="utf-8")
    with pytest.raises(GradebookError, match="no 'learner' column"):
        write_gradebook(path, example_checks(), [GradeRow("alice", "ok")])
    assert path.read_text(encoding="utf-8") == "name,total\nalice,1\n"


def test_learner_selects_one_submission(submissions, tmp_path):
    out = tmp_path / "out"
    grade_batch(submissions, "example", example_checks(), FakeRunner(), out, collector=_collector(), clock=lambda: T1)
    before = {r["learner"]: r for r in read_gradebook(out / "gradebook.csv")}
    runner = FakeRunner()
    result = grade_batch(submissions, "example", example_checks(), runner, out, collector=_collector(), learners=["bob"],
                         clock=lambda: T2)
    assert [name for name, _, _ in runner.calls] == ["bob"] and [r.learner for r in result.rows] == ["bob"]
    after = {r["learner"]: r for r in read_gradebook(out / "gradebook.csv")}
    assert after["bob"]["graded-at"] == "2025-03-02T09:45:30Z"
    assert {k: v for k, v in after.items() if k != "bob"} == {k: v for k, v in before.items() if k != "bob"}


def test_an_unknown_learner_lists_the_learners_found(submissions, tmp_path):
    runner = FakeRunner()
    with pytest.raises(GradebookError) as err:
        grade_batch(submissions, "example", example_checks(), runner, tmp_path / "out", learners=["alcie"])
    assert str(err.value) == (f"{submissions}: no submission from learner 'alcie'; learners found: "
                              "alice, bob, carol, dave, erin (a learner is <name>.ipynb or a <name>/ folder)")
    assert runner.calls == [] and not (tmp_path / "out").exists()


def test_grade_submissions_refuses_before_touching_the_cluster(submissions, tmp_path, monkeypatch):
    monkeypatch.setattr(grader, "setup", lambda *a, **k: pytest.fail("set up the cluster for a doomed batch"))
    with pytest.raises(grader.GradingError, match="learners found: alice, bob"):
        grader.grade_submissions(submissions, "01", tmp_path / "out", learners=["nobody"])
    out = tmp_path / "other-lab"
    write_gradebook(out / "gradebook.csv", example_checks(), [GradeRow("alice", "ok")])
    with pytest.raises(grader.GradingError, match="not of lab 01-gpu-pod-spec"):
        grader.grade_submissions(submissions, "01", out)


def test_cli_learner_option(submissions, tmp_path, monkeypatch):
    seen = {}

    def fake(submissions_dir, lab, out, **options):
        seen.update(options, lab=lab, out=out)
        if options["learners"] == ["zed"]:
            raise grader.GradingError("no submission from learner 'zed'; learners found: alice, bob")
        return gb.BatchResult(lab, [], out / "gradebook.csv", out, example_checks(), 5)

    monkeypatch.setattr(grader, "grade_submissions", fake)
    result = CliRunner().invoke(cli.main, ["grade", str(submissions), "--lab", "03", "--out", str(tmp_path / "o"),
                                           "--learner", "alice", "--learner", "bob"])
    assert result.exit_code == 0, result.output
    assert seen["learners"] == ("alice", "bob") and "(5 row(s))" in result.output
    CliRunner().invoke(cli.main, ["grade", str(submissions), "--lab", "03"])
    assert seen["learners"] is None and seen["out"] == Path("grades") / "03"
    monkeypatch.setattr(grader, "grade_submissions", lambda *a, **k: fake(*a, **{**k, "learners": ["zed"]}))
    result = CliRunner().invoke(cli.main, ["grade", str(submissions), "--lab", "03", "--learner", "zed"])
    assert result.exit_code != 0 and "learners found: alice, bob" in result.output


def test_the_lock_is_held_from_reading_to_replacing(tmp_path, monkeypatch):
    import fcntl

    path = tmp_path / "gradebook.csv"
    held = []

    def lock_is_held() -> bool:
        with open(f"{path}.lock", "a+b") as other:  # a second open file description: flock excludes it
            try:
                fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(other.fileno(), fcntl.LOCK_UN)
            return False

    real_read, real_write = gb._read_table, gb.atomic_write_bytes
    monkeypatch.setattr(gb, "_read_table", lambda p: (held.append(("read", lock_is_held())), real_read(p))[1])
    monkeypatch.setattr(gb, "atomic_write_bytes",
                        lambda p, data: (held.append(("write", lock_is_held())), real_write(p, data))[1])
    write_gradebook(path, example_checks(), [GradeRow("alice", "ok")])
    assert held == [("read", True), ("write", True)] and not lock_is_held()


_KILLED_WRITER = textwrap.dedent('''
    import os, signal, sys
    from gpulab.grading.checks import load_lab_checks
    from gpulab.grading.gradebook import GradeRow, write_gradebook

    real_fdopen = os.fdopen

    class Stalls:
        """The temporary file's handle: writes half of the gradebook, says so, waits to be killed."""

        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.handle.__exit__(*exc)

        def write(self, data):
            self.handle.write(data[: len(data) // 2])
            self.handle.flush()
            print("half written", flush=True)
            while True:
                signal.pause()

        def __getattr__(self, name):
            return getattr(self.handle, name)

    os.fdopen = lambda fd, *args, **kwargs: Stalls(real_fdopen(fd, *args, **kwargs))
    write_gradebook(sys.argv[1], load_lab_checks(sys.argv[2]), [GradeRow("zoe", "ok", total=12.0)])
    print("finished without stalling", flush=True)
''')


def test_a_grader_killed_mid_write_leaves_the_old_gradebook(submissions, tmp_path):
    out = tmp_path / "out"
    grade_batch(submissions, "example", example_checks(), FakeRunner(), out, collector=_collector())
    path = out / "gradebook.csv"
    before = path.read_bytes()
    child = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(path), str(EXAMPLE_LAB)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "half written\n"  # blocks until the child is mid-write: no sleeps
        temps = list(out.glob(".gradebook.csv.*.tmp"))
        assert len(temps) == 1 and 0 < len(temps[0].read_bytes()) < len(before)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    assert path.read_bytes() == before
    assert [r["learner"] for r in read_gradebook(path)] == ["alice", "bob", "carol", "dave", "erin"]
    # the next writer is not blocked by the dead one's lock and sweeps its leftover
    write_gradebook(path, example_checks(), [GradeRow("zoe", "ok", total=12.0)], lab="example")
    assert [r["learner"] for r in read_gradebook(path)] == ["alice", "bob", "carol", "dave", "erin", "zoe"]
    assert not list(out.glob(".gradebook.csv.*.tmp"))


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
    result = grade_batch(subs, "example", example_checks(), Runner(cell_timeout=None, timeout=10), tmp_path / "out",
                         collector=_collector())
    rows = {r["learner"]: r for r in read_gradebook(result.gradebook)}
    assert {k: (v["status"], v["total"]) for k, v in rows.items()} == {
        "alice": ("ok", "10"), "bob": ("timeout", "1"), "carol": ("invalid-notebook", "0"),
        "dave": ("no-parameters-cell", "0")}
    assert rows["bob"]["train-log (1)"] == "1"  # partial credit for what ran before the hang
    executed = nbformat.read(tmp_path / "out" / "runs" / "alice.executed.ipynb", as_version=4)
    assert any("injected-parameters" in c.metadata.get("tags", []) for c in executed.cells)


class SlowRunner(FakeRunner):
    """A FakeRunner whose earlier submissions take longer, counting how many run at once."""

    def __init__(self, seconds: dict[str, float]):
        super().__init__()
        self.seconds = seconds
        self.running = self.most = 0
        self.lock = threading.Lock()

    def run(self, notebook_path, work_dir, parameters=None, cwd=None, env=None, name=None):
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(self.seconds.get(name, 0))
            return super().run(notebook_path, work_dir, parameters, cwd, env, name)
        finally:
            with self.lock:
                self.running -= 1


def test_parallel_grading_records_rows_in_the_submissions_order(submissions, tmp_path):
    """With jobs, submissions run side by side, finish in any order, and give the gradebook one job gives."""
    seconds = {"alice": 0.6, "bob": 0.4, "carol": 0.2}  # the first finishes last
    events = []
    runner = SlowRunner(seconds)
    grade_batch(submissions, "example", example_checks(), runner, tmp_path / "parallel", hidden=_hidden(tmp_path),
                collector=_collector(), clock=lambda: T1, progress=events.append, jobs=3)
    grade_batch(submissions, "example", example_checks(), SlowRunner({}), tmp_path / "serial",
                hidden=_hidden(tmp_path), collector=_collector(), clock=lambda: T1)
    assert runner.most == 3
    for name in ("gradebook.csv", "details.json"):
        assert (tmp_path / "parallel" / name).read_bytes() == (tmp_path / "serial" / name).read_bytes()
    assert [r["learner"] for r in read_gradebook(tmp_path / "parallel" / "gradebook.csv")] == [
        "alice", "bob", "carol", "dave", "erin"]
    done = [(e.index, e.learner) for e in events if e.phase == "done"]
    assert done == [(1, "alice"), (2, "bob"), (3, "carol"), (4, "dave"), (5, "erin")]
    assert sorted(e.learner for e in events if e.phase == "start") == ["alice", "bob", "carol", "dave", "erin"]
    with pytest.raises(gb.GradebookError, match="jobs: at least 1"):
        grade_batch(submissions, "example", example_checks(), runner, tmp_path / "none", jobs=0)


class GpuClient:
    """Lists Nodes and Pods for gpu_usage: ``free`` nvidia.com/gpu of 2 allocatable."""

    def __init__(self, free: int):
        self.free = free

    def list(self, kind, namespace=None):
        if kind == "Node":
            return NODES
        return [{"metadata": {"namespace": "other", "name": f"p{i}"},
                 "spec": {"nodeName": "gpu-node-1", "containers": [{"resources": {"limits": {"nvidia.com/gpu": 1}}}]},
                 "status": {"phase": "Running"}} for i in range(2 - self.free)]


def test_how_many_submissions_are_graded_at_once():
    from gpulab.grading.cluster import load_lab_spec

    cluster_wide, scoped = load_lab_spec("03"), load_lab_spec("01")
    assert cluster_wide.cluster_wide and not scoped.cluster_wide and scoped.gpus_free == 1
    assert grader.parallel_jobs(scoped, 1, GpuClient(2)) == (1, "")
    jobs, why = grader.parallel_jobs(cluster_wide, 4, GpuClient(2))
    assert jobs == 1 and "changes cluster-wide state" in why and "one at a time" in why
    jobs, why = grader.parallel_jobs(scoped, 4, GpuClient(2))
    assert jobs == 2 and "needs 1 free GPU(s) per submission and 2 are free: grading 2 at a time" in why
    assert grader.parallel_jobs(scoped, 2, GpuClient(2)) == (2, "grading 2 submissions at a time")
    assert grader.parallel_jobs(scoped, 3, GpuClient(0))[0] == 1  # none free yet: one, which waits for its GPU


def test_cli_jobs_option(submissions, tmp_path, monkeypatch):
    seen = {}

    def fake(submissions_dir, lab, out, **options):
        seen.update(options)
        options["say"]("grading 3 submissions at a time")
        return gb.BatchResult(lab, [], out / "gradebook.csv", out, example_checks(), 0)

    monkeypatch.setattr(grader, "grade_submissions", fake)
    result = CliRunner().invoke(cli.main, ["grade", str(submissions), "--lab", "01", "-j", "3",
                                             "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert seen["jobs"] == 3 and "gpulab: grading 3 submissions at a time" in result.stderr
    result = CliRunner().invoke(cli.main, ["grade", str(submissions), "--lab", "01", "--jobs", "0"])
    assert result.exit_code == 2 and "--jobs" in result.output
