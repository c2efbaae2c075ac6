"""Do quiz widgets build headless, give feedback on 提交, and restore saved answers?"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulab.quiz import widgets
from gpulab.quiz.bank import load_all
from gpulab.quiz.progress import ProgressStore
from gpulab.quiz.widgets import build_quiz, render_text, show_quiz

REPO = Path(__file__).resolve().parents[2]
QUIZZES = REPO / "quizzes"


@pytest.fixture
def store(tmp_path):
    return ProgressStore(tmp_path / "progress.json")


def _classes(widget) -> set[str]:
    return set(widget._dom_classes)


@pytest.mark.parametrize("section", list(load_all(QUIZZES)))
def test_every_section_builds(section, store):
    view = build_quiz(section, store, QUIZZES)
    assert {"gpulab-quiz", f"gpulab-quiz-section-{section}"} <= _classes(view.widget)
    for qid, qv in view.questions.items():
        assert {"gpulab-quiz-question", f"gpulab-quiz-{qid}", f"gpulab-quiz-type-{qv.question.kind}"} \
            <= _classes(qv.container)
        assert qv.button.description == "提交" and "gpulab-quiz-submit" in _classes(qv.button)
        assert "gpulab-quiz-feedback" in _classes(qv.feedback) and qv.feedback.value == ""


def test_single_choice_click_gives_feedback_and_saves(store):
    view = build_quiz("04-sharing", store, QUIZZES)
    qv = view.questions["sh-isolation-order"]
    qv.input.value = "b"
    qv.button.click()  # runs the on_click handler, as a browser click would
    assert "回答错误" in qv.feedback.value and "解析" in qv.feedback.value
    assert "gpulab-quiz-wrong" in _classes(qv.feedback)
    qv.input.value = "a"
    qv.button.click()
    assert "回答正确" in qv.feedback.value
    assert _classes(qv.feedback) >= {"gpulab-quiz-correct"} and "gpulab-quiz-wrong" not in _classes(qv.feedback)
    entry = store.get("04-sharing", "sh-isolation-order")
    assert (entry.answer, entry.correct, entry.attempts) == ("a", True, 2)
    assert "已答 1 / 6 题，答对 1 题" in view.summary.value


def test_multiple_numeric_and_short_inputs(store):
    view = build_quiz("04-sharing", store, QUIZZES)
    multi = view.questions["sh-ts-facts"]
    for oid in ("a", "c", "e"):
        multi.checkboxes[oid].value = True
    assert "gpulab-quiz-option-a" in _classes(multi.checkboxes["a"])
    multi.button.click()
    assert "回答正确" in multi.feedback.value
    num = view.questions["sh-mig-count"]
    num.input.value = 7
    num.button.click()
    assert "回答正确" in num.feedback.value
    short = view.questions["sh-mig-resource-name"]
    short.input.value = "ｎｖｉｄｉａ.com/MIG-1g.10gb"
    short.button.click()
    assert "回答正确" in short.feedback.value
    assert store.get("04-sharing", "sh-ts-facts").answer == ["a", "c", "e"]
    assert store.get("04-sharing", "sh-mig-count").answer == 7.0


def test_empty_submission_is_not_saved_and_reveals_nothing(store):
    view = build_quiz("01-resource-model", store, QUIZZES)
    qv = view.questions["rm-why-separate"]
    qv.button.click()
    assert "还没有选择" in qv.feedback.value and "解析" not in qv.feedback.value
    assert store.get("01-resource-model", "rm-why-separate") is None


def test_rerender_restores_saved_answers(store):
    first = build_quiz("04-sharing", store, QUIZZES)
    first.submit("sh-isolation-order", "a")
    first.submit("sh-ts-facts", ["a", "b"])
    again = build_quiz("04-sharing", store, QUIZZES)
    single = again.questions["sh-isolation-order"]
    assert single.input.value == "a" and "上次的作答" in single.feedback.value and "回答正确" in single.feedback.value
    multi = again.questions["sh-ts-facts"]
    assert [o for o, box in multi.checkboxes.items() if box.value] == ["a", "b"]
    assert "gpulab-quiz-wrong" in _classes(multi.feedback)
    assert "已答 2 / 6 题，答对 1 题" in again.summary.value


def test_handler_errors_are_shown_in_the_card(store, monkeypatch):
    view = build_quiz("04-sharing", store, QUIZZES)
    qv = view.questions["sh-isolation-order"]
    qv.input.value = "a"
    monkeypatch.setattr(widgets, "grade_answer", lambda q, a: 1 / 0)
    qv.button.click()
    assert "内部错误" in qv.feedback.value


def test_outside_a_notebook_show_quiz_prints_text(store, capsys):
    show_quiz("03", store, QUIZZES)
    out = capsys.readouterr().out
    assert "【03-scheduling】" in out and "sch-two-directions" in out and "A. " in out
    assert 'gpulab.quiz.answer("03-scheduling"' in out


def test_text_mode_answer_saves_and_render_text_shows_it(store, capsys):
    fb = widgets.answer("04-sharing", "sh-ts-facts", "a, c, e", store, QUIZZES)
    assert fb.correct
    assert store.get("04-sharing", "sh-ts-facts").answer == ["a", "c", "e"]
    text = render_text(build_quiz("04-sharing", store, QUIZZES).bank, store)
    assert "上次作答：['a', 'c', 'e']（正确）" in text


def test_markdown_subset():
    html = widgets.markdown_to_html("看 `kubectl get` 的输出：\n```\n0/3 nodes <available>\n```\n**注意**")
    assert "<code>kubectl get</code>" in html
    assert "<pre><code>0/3 nodes &lt;available&gt;</code></pre>" in html
    assert "<strong>注意</strong>" in html
