"""Do quiz widgets build headless, teach on 提交 (hint, retry, 显示答案), restore answers, and render without a kernel?"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpulab.quiz import widgets
from gpulab.quiz.bank import GENERIC_HINTS, MultipleChoice, Numeric, SingleChoice, load_all, load_section
from gpulab.quiz.progress import ProgressStore
from gpulab.quiz.widgets import build_quiz, render_text, show_quiz

REPO = Path(__file__).resolve().parents[2]
QUIZZES = REPO / "quizzes"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# Emoji (and the emoji variation selector) render as empty boxes without an emoji font.
# Characters shown as colour emoji by default (Emoji_Presentation), and the emoji variation selector:
# what renders as an empty box without an emoji font. gpulab.marks' ✓ × ⚠ are text symbols.
EMOJI_RE = re.compile("[\U0001F000-\U0001FFFF\u231A\u231B\u23E9-\u23EC\u23F0\u23F3\u25FD\u25FE\u2614\u2615"
                      "\u2648-\u2653\u267F\u2693\u26A1\u26AA\u26AB\u26BD\u26BE\u26C4\u26C5\u26CE\u26D4\u26EA"
                      "\u26F2-\u26F5\u26FA\u26FD\u2705\u270A\u270B\u2728\u274C\u274E\u2753-\u2755\u2757"
                      "\u2795-\u2797\u27B0\u27BF\u2B1B\u2B1C\u2B50\u2B55\uFE0F]")


@pytest.fixture
def store(tmp_path):
    return ProgressStore(tmp_path / "progress.json")


def _classes(widget) -> set[str]:
    return set(widget._dom_classes)


def _shown(button) -> bool:
    return button.layout.display != "none"


@pytest.mark.parametrize("section", list(load_all(QUIZZES)))
def test_every_section_builds(section, store):
    view = build_quiz(section, store, QUIZZES)
    assert {"gpulab-quiz", f"gpulab-quiz-section-{section}"} <= _classes(view.widget)
    for qid, qv in view.questions.items():
        assert {"gpulab-quiz-question", f"gpulab-quiz-{qid}", f"gpulab-quiz-type-{qv.question.kind}"} \
            <= _classes(qv.container)
        assert qv.button.description == "提交" and "gpulab-quiz-submit" in _classes(qv.button)
        assert qv.reveal_button.description == "显示答案" and "gpulab-quiz-reveal" in _classes(qv.reveal_button)
        assert not _shown(qv.reveal_button)  # offered only after a wrong answer
        assert "gpulab-quiz-feedback" in _classes(qv.feedback) and qv.feedback.value == ""


def test_wrong_single_choice_gets_a_hint_and_another_try_not_the_key(store):
    view = build_quiz("04-sharing", store, QUIZZES)
    qv = view.questions["sh-isolation-order"]
    qv.input.value = "b"
    qv.button.click()  # runs the on_click handler, as a browser click would
    text = qv.feedback.value
    assert "回答错误：B 不是正确答案" in text and "提示：" in text
    assert widgets.inline_html(qv.question.hint) in text and GENERIC_HINTS["single"] not in text  # its own hint
    assert "解析：" not in text and "正确答案：" not in text and qv.question.explanation[:20] not in text
    assert "整卡独占 &gt; MIG" not in text  # the key's text is nowhere
    assert "gpulab-quiz-wrong" in _classes(qv.feedback) and _shown(qv.reveal_button)
    assert store.get("04-sharing", "sh-isolation-order").correct is False
    qv.input.value = "a"  # the retry
    qv.button.click()
    assert "回答正确" in qv.feedback.value and "解析" in qv.feedback.value
    assert qv.question.explanation[:20] in qv.feedback.value
    assert _classes(qv.feedback) >= {"gpulab-quiz-correct"} and "gpulab-quiz-wrong" not in _classes(qv.feedback)
    assert not _shown(qv.reveal_button)
    entry = store.get("04-sharing", "sh-isolation-order")
    assert (entry.answer, entry.correct, entry.attempts, entry.revealed) == ("a", True, 2, False)
    assert "已答 1 / 6 题，答对 1 题" in view.summary.value and "看过答案" not in view.summary.value


def test_wrong_multiple_choice_says_what_kind_of_wrong(store):
    view = build_quiz("04-sharing", store, QUIZZES)
    multi = view.questions["sh-ts-facts"]
    multi.checkboxes["a"].value = True
    multi.button.click()
    assert "漏选" in multi.feedback.value and widgets.inline_html(multi.question.hint) in multi.feedback.value
    assert "解析" not in multi.feedback.value
    for oid in ("c", "e"):
        multi.checkboxes[oid].value = True
    multi.button.click()
    assert "回答正确" in multi.feedback.value and "解析" in multi.feedback.value
    assert store.get("04-sharing", "sh-ts-facts").answer == ["a", "c", "e"]


def test_bank_hint_is_shown_instead_of_the_generic_one(tmp_path, store):
    (tmp_path / "01-demo.yaml").write_text("""
section: 01-demo
title: 演示
questions:
  - id: demo-count
    type: numeric
    prompt: 一张卡切成几份？
    answer: 7
    unit: 份
    hint: 想想 **1g.10gb** 每份占几个计算切片。
    explanation: 七份，因为计算切片只有 7 个。
""", encoding="utf-8")
    qv = build_quiz("01", store, tmp_path).questions["demo-count"]
    qv.input.value = "8"
    qv.button.click()
    assert "数值不对：偏大了" in qv.feedback.value
    assert "想想 <strong>1g.10gb</strong> 每份占几个计算切片" in qv.feedback.value
    assert GENERIC_HINTS["numeric"] not in qv.feedback.value and "解析" not in qv.feedback.value
    qv.input.value = "6"
    qv.button.click()
    assert "数值不对：偏小了" in qv.feedback.value


def test_number_field_starts_empty_and_empty_is_not_an_answer(store):
    view = build_quiz("04-sharing", store, QUIZZES)
    num = view.questions["sh-mig-count"]
    assert num.input.value == "" and num.input.placeholder  # not a 0 the learner has to delete
    num.button.click()
    assert "还没有填写数值" in num.feedback.value and "解析" not in num.feedback.value
    assert "gpulab-quiz-wrong" not in _classes(num.feedback) and not _shown(num.reveal_button)
    num.input.value = "七"
    num.button.click()
    assert "不是一个数字" in num.feedback.value
    assert store.get("04-sharing", "sh-mig-count") is None  # neither counts as an attempt
    num.input.value = " ７ "
    num.button.click()
    assert "回答正确" in num.feedback.value
    assert store.get("04-sharing", "sh-mig-count").answer == 7.0
    again = build_quiz("04-sharing", store, QUIZZES).questions["sh-mig-count"]
    assert again.input.value == "7"


def test_short_answer_normalised(store):
    short = build_quiz("04-sharing", store, QUIZZES).questions["sh-mig-resource-name"]
    short.input.value = "nvidia.com/gpu"
    short.button.click()
    assert "回答错误" in short.feedback.value and widgets.inline_html(short.question.hint) in short.feedback.value
    short.input.value = "ｎｖｉｄｉａ.com/MIG-1g.10gb"
    short.button.click()
    assert "回答正确" in short.feedback.value


def test_show_answer_reveals_key_and_explanation_and_is_recorded(store):
    view = build_quiz("04-sharing", store, QUIZZES)
    qv = view.questions["sh-ts-facts"]
    qv.checkboxes["b"].value = True
    qv.button.click()
    assert _shown(qv.reveal_button) and "显示答案" in qv.feedback.value  # the retry line points at it
    qv.reveal_button.click()
    text = qv.feedback.value
    assert "正确答案：" in text and "解析" in text and qv.question.explanation[:20] in text
    # Every key option in full (with inline code), none of the others.
    assert "A. 它改的是 device plugin 的配置" in text and "<code>devicePlugin.config.name</code>" in text
    assert "B. 每个容器只能看到" not in text
    assert "gpulab-quiz-revealed" in _classes(qv.feedback) and not _shown(qv.reveal_button)
    assert store.revealed("04-sharing", "sh-ts-facts")
    entry = store.get("04-sharing", "sh-ts-facts")
    assert (entry.answer, entry.correct, entry.revealed) == (["b"], False, True)
    assert "看过答案 1 题" in view.summary.value
    # A re-run of the cell shows the key again; answering afterwards keeps the record.
    again = build_quiz("04-sharing", store, QUIZZES).questions["sh-ts-facts"]
    assert "正确答案：" in again.feedback.value and "上次的作答" in again.feedback.value
    again.submit(["a", "c", "e"])
    entry = store.get("04-sharing", "sh-ts-facts")
    assert (entry.correct, entry.revealed, entry.attempts) == (True, True, 2)


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
    assert "gpulab-quiz-wrong" in _classes(multi.feedback) and "解析" not in multi.feedback.value
    assert "提示：" in multi.feedback.value and _shown(multi.reveal_button)
    assert "已答 2 / 6 题，答对 1 题" in again.summary.value


def test_long_options_wrap_in_full(store):
    """Option E of sh-ts-facts (140 characters) used to be cut off: fixed row height plus ellipsis."""
    view = build_quiz("04-sharing", store, QUIZZES)
    multi = view.questions["sh-ts-facts"]
    longest = max(multi.question.options, key=lambda o: len(o.text))
    box = multi.checkboxes[longest.id]
    assert box.description == f"{longest.id.upper()}. {longest.text.replace('`', '')}"  # the whole text
    assert box.layout.height == "auto" and box.layout.width == "100%"
    single = view.questions["sh-isolation-order"]
    assert single.input.layout.height == "auto"
    style = re.sub(r"\s+", " ", widgets._STYLE)
    for selector in (".gpulab-quiz .widget-checkbox .widget-label-basic", ".gpulab-quiz .widget-radio-box label"):
        assert selector in style
    for declaration in ("white-space: normal", "overflow: visible", "text-overflow: clip", "height: auto"):
        assert declaration in style
    assert ".gpulab-quiz .widget-checkbox { height: auto" in style
    assert "_STYLE" not in view.widget.children[0].value and widgets._STYLE in view.widget.children[0].value


@pytest.mark.parametrize("section", list(load_all(QUIZZES)))
def test_no_emoji_in_any_feedback(section, store, capsys):
    view = build_quiz(section, store, QUIZZES)
    for qid, qv in view.questions.items():
        q = qv.question
        qv.button.click()  # unanswered
        assert not EMOJI_RE.search(qv.feedback.value), qv.feedback.value
        if isinstance(q, SingleChoice):
            wrong, right = next(o.id for o in q.options if o.id != q.answer), q.answer
        elif isinstance(q, MultipleChoice):
            wrong, right = [next(o.id for o in q.options if o.id not in q.answer)], sorted(q.answer)
        elif isinstance(q, Numeric):
            wrong, right = q.answer + q.tolerance + 1, q.answer
        else:
            wrong, right = "完全无关的答案", (q.accept[0] if q.accept else None)
        fb = qv.submit(wrong)
        assert not fb.correct and widgets.MARK_WRONG in qv.feedback.value
        assert not EMOJI_RE.search(qv.feedback.value)
        qv.reveal()
        assert not EMOJI_RE.search(qv.feedback.value)
        if right is not None:
            assert qv.submit(right).correct, qid
            assert widgets.MARK_CORRECT in qv.feedback.value and not EMOJI_RE.search(qv.feedback.value)
        widgets.answer(section, qid, wrong, store, QUIZZES)
        widgets.show_answer(section, qid, store, QUIZZES)
    assert not EMOJI_RE.search(view.summary.value)
    out = capsys.readouterr().out
    assert widgets.MARK_WRONG in out and not EMOJI_RE.search(out)


def test_display_bundle_has_widget_and_static_fallbacks(store):
    from IPython.core.formatters import DisplayFormatter

    bank = load_section("04", QUIZZES)
    view = build_quiz("04", store, QUIZZES)
    data, _metadata = DisplayFormatter().format(view)  # what display(view) publishes
    assert set(data) >= {WIDGET_VIEW, "text/html", "text/markdown", "text/plain"}
    assert data[WIDGET_VIEW]["model_id"] == view.widget.model_id
    assert not data["text/plain"].startswith("VBox") and bank.title in data["text/plain"]
    assert "小测" in data["text/plain"] and "\n" not in data["text/plain"]
    page, markdown = data["text/html"], data["text/markdown"]
    assert "gpulab-quiz-static" in page and f"<h3>小测：{bank.title}</h3>" in page
    assert page.count('class="gpulab-quiz-static-question') == len(bank.questions)
    for q in bank.questions:
        first_line = q.prompt.strip().splitlines()[0]
        assert widgets.inline_html(first_line.split("`")[0]) in page
        assert first_line in markdown
        assert q.explanation[:20] not in page and q.explanation[:20] not in markdown
        if isinstance(q, (SingleChoice, MultipleChoice)):
            for o in q.options:
                assert widgets.inline_html(f"{o.id.upper()}. {o.text}") in page
                assert f"   - {o.id.upper()}. {o.text}" in markdown
    assert "正确答案：" not in page and "解析：" not in page
    # The learner's answers never end up in the notebook file.
    view.submit("sh-mig-count", "7")
    assert "上次" not in view.mimebundle()["text/html"]


def test_show_quiz_in_a_kernel_displays_the_bundle(store, monkeypatch):
    shown = []
    monkeypatch.setattr(widgets, "_in_notebook", lambda: True)
    monkeypatch.setattr("IPython.display.display", lambda obj, **kw: shown.append(obj))
    show_quiz("03", store, QUIZZES)
    assert len(shown) == 1 and isinstance(shown[0], widgets.QuizView)
    bundle = shown[0]._repr_mimebundle_()
    assert {WIDGET_VIEW, "text/html", "text/markdown", "text/plain"} <= set(bundle)


def test_nbconvert_html_shows_the_questions_without_widget_state(store):
    """A notebook saved without widget state (JupyterLab's default) exported to HTML: the static list shows."""
    import nbformat
    from nbconvert import HTMLExporter

    view = build_quiz("08", store, QUIZZES)
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell('from gpulab.quiz import show_quiz\nshow_quiz("08")')
    cell.outputs = [nbformat.v4.new_output("display_data", data=view.mimebundle())]
    nb.cells = [cell]
    body, _ = HTMLExporter().from_notebook_node(nb)
    assert "gpulab-quiz-static" in body and view.bank.title in body
    assert "VBox(" not in body


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


def test_text_mode_answer_hints_then_show_answer(store, capsys):
    fb = widgets.answer("04-sharing", "sh-ts-facts", "a", store, QUIZZES)
    out = capsys.readouterr().out
    assert not fb.correct and "× 还不完全对" in out and "提示：" in out and "解析" not in out
    assert 'gpulab.quiz.show_answer("04-sharing", "sh-ts-facts")' in out
    text = widgets.show_answer("04-sharing", "sh-ts-facts", store, QUIZZES)
    assert "正确答案：A. " in text and "解析：" in text and store.revealed("04-sharing", "sh-ts-facts")
    fb = widgets.answer("04-sharing", "sh-ts-facts", "a, c, e", store, QUIZZES)
    assert fb.correct and "✓ 回答正确" in capsys.readouterr().out
    assert store.get("04-sharing", "sh-ts-facts").answer == ["a", "c", "e"]
    text = render_text(build_quiz("04-sharing", store, QUIZZES).bank, store)
    assert "上次作答：['a', 'c', 'e']（正确，看过答案）" in text


def test_markdown_subset():
    html = widgets.markdown_to_html("看 `kubectl get` 的输出：\n```\n0/3 nodes <available>\n```\n**注意**")
    assert "<code>kubectl get</code>" in html
    assert "<pre><code>0/3 nodes &lt;available&gt;</code></pre>" in html
    assert "<strong>注意</strong>" in html
