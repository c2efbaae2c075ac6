"""Is quiz progress stored atomically, durable across processes, and safe with concurrent writers?"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys

import pytest

import gpulab._fsutil as fsutil
from gpulab.quiz.bank import parse_bank
from gpulab.quiz.progress import ProgressStore, format_summary, progress_path, summary


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _bank(section: str, ids: list[str], title: str = "测试"):
    return parse_bank({"section": section, "title": title, "questions": [
        {"id": i, "type": "short", "prompt": "p", "accept": ["x"], "explanation": "e"} for i in ids]},
        f"{section}.yaml")


def test_default_location_follows_gpulab_home(home):
    assert progress_path() == home / "progress.json"
    ProgressStore().record("01-a", "q1", "x", True)
    data = json.loads((home / "progress.json").read_text(encoding="utf-8"))
    entry = data["sections"]["01-a"]["q1"]
    assert entry["answer"] == "x" and entry["correct"] is True and entry["attempts"] == 1


def test_attempts_count_and_latest_answer_wins(home):
    store = ProgressStore()
    store.record("01-a", "q1", "wrong", False)
    store.record("01-a", "q1", "x", True)
    entry = ProgressStore().get("01-a", "q1")
    assert (entry.answer, entry.correct, entry.attempts) == ("x", True, 2)


def test_survives_a_new_process(home):
    """A kernel restart is a new process reading the same file."""
    ProgressStore().record("01-a", "q1", ["a", "c"], True)
    code = ("from gpulab.quiz.progress import ProgressStore; e = ProgressStore().get('01-a', 'q1'); "
            "print(e.answer, e.correct)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "GPULAB_HOME": str(home)})
    assert out.stdout.strip() == "['a', 'c'] True"


def test_a_failed_write_leaves_the_previous_file_intact(home, monkeypatch):
    store = ProgressStore()
    store.record("01-a", "q1", "x", True)
    before = store.path.read_bytes()

    def crash(src, dst):
        raise OSError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr(fsutil.os, "replace", crash)
        with pytest.raises(OSError, match="disk full"):
            store.record("01-a", "q2", "y", False)
    assert store.path.read_bytes() == before
    assert [p.name for p in store.path.parent.iterdir() if p.suffix == ".tmp"] == []


def test_unreadable_file_is_set_aside_not_fatal(home):
    home.mkdir(parents=True)
    (home / "progress.json").write_text("{not json", encoding="utf-8")
    store = ProgressStore()
    assert store.get("01-a", "q1") is None
    store.record("01-a", "q1", "x", True)
    assert store.get("01-a", "q1").correct
    assert list(home.glob("progress.json.corrupt-*"))


def _writer(path: str, worker: int, count: int) -> None:
    store = ProgressStore(path)
    for n in range(count):
        store.record("01-a", f"w{worker}-q{n}", n, n % 2 == 0)


def test_concurrent_writers_lose_nothing(tmp_path):
    path = tmp_path / "progress.json"
    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=_writer, args=(str(path), w, 15)) for w in range(4)]
    for p in workers:
        p.start()
    for p in workers:
        p.join(60)
        assert p.exitcode == 0
    entries = ProgressStore(path).entries("01-a")
    assert len(entries) == 4 * 15
    assert json.loads(path.read_text(encoding="utf-8"))["version"] == 1


def test_summary_counts_only_current_questions(home, monkeypatch):
    banks = {"01-a": _bank("01-a", ["q1", "q2", "q3"], "资源模型"), "02-b": _bank("02-b", ["r1"], "安装")}
    store = ProgressStore()
    store.record("01-a", "q1", "x", True)
    store.record("01-a", "q2", "y", False)
    store.record("01-a", "removed-question", "x", True)
    result = summary(banks, store)
    assert (result["01-a"].answered, result["01-a"].correct, result["01-a"].total) == (2, 1, 3)
    assert (result["02-b"].answered, result["02-b"].correct, result["02-b"].total) == (0, 0, 1)
    monkeypatch.setenv("LANGUAGE", "zh_CN")  # as a lesson shows it
    table = format_summary(result)
    lines = table.splitlines()
    assert lines[0].split() == ["章节", "标题", "已答", "答对", "题数"]
    assert lines[2].split() == ["01-a", "资源模型", "2", "1", "3"]
    assert lines[-1].split() == ["合计", "2", "1", "4"]
    monkeypatch.setenv("LANGUAGE", "en")
    lines = format_summary(result).splitlines()
    assert lines[0].split() == ["SECTION", "TITLE", "ANSWERED", "CORRECT", "QUESTIONS"]
    assert lines[-1].split() == ["TOTAL", "2", "1", "4"]


def test_summary_of_shipped_banks_without_progress(home):
    table = format_summary()
    assert "09-self-test" in table and "TOTAL" in table


def test_reset(home):
    store = ProgressStore()
    store.record("01-a", "q1", "x", True)
    store.record("02-b", "q1", "x", True)
    store.reset("01-a")
    assert store.entries("01-a") == {} and store.entries("02-b")
    store.reset()
    assert store.load()["sections"] == {}


def test_revealed_is_recorded_and_survives_new_answers(home):
    store = ProgressStore()
    store.record("01-a", "q1", "wrong", False)
    assert not store.revealed("01-a", "q1") and not store.get("01-a", "q1").revealed
    store.mark_revealed("01-a", "q1")
    entry = store.get("01-a", "q1")
    assert (entry.answer, entry.correct, entry.attempts, entry.revealed) == ("wrong", False, 1, True)
    raw = json.loads(store.path.read_text(encoding="utf-8"))["sections"]["01-a"]["q1"]
    assert raw["revealed"] is True and raw["revealed_at"].endswith("Z")
    entry = store.record("01-a", "q1", "x", True)
    assert (entry.correct, entry.attempts, entry.revealed) == (True, 2, True)
    assert store.get("01-a", "q1").revealed


def test_revealed_without_an_answer_is_not_counted_as_answered(home):
    banks = {"01-a": _bank("01-a", ["q1", "q2"])}
    store = ProgressStore()
    store.mark_revealed("01-a", "q2")
    assert store.revealed("01-a", "q2") and store.get("01-a", "q2") is None
    assert store.entries("01-a") == {}
    result = summary(banks, store)["01-a"]
    assert (result.answered, result.correct, result.total, result.revealed) == (0, 0, 2, 1)
    assert store.record("01-a", "q2", "x", True).attempts == 1
