"""Render a section's questions as ipywidgets, with immediate feedback.

``show_quiz("04-sharing")`` in a notebook cell displays one card per question
(RadioButtons / Checkboxes / FloatText / Text and a 提交 button). Submitting
grades the answer, shows why it is right or wrong, and saves it in the local
progress store; re-running the cell (or restarting the kernel) restores the
saved answers and their feedback.

Outside a notebook the same questions are printed as plain text and answered
with :func:`answer`.

Stable CSS classes for browser tests (``add_class``):

- ``gpulab-quiz`` and ``gpulab-quiz-section-<section>`` on the outer box;
- ``gpulab-quiz-question``, ``gpulab-quiz-<qid>``, ``gpulab-quiz-type-<type>`` on each card;
- ``gpulab-quiz-input`` on the input widget, ``gpulab-quiz-option-<id>`` on each checkbox;
- ``gpulab-quiz-submit`` on the button (description ``提交``);
- ``gpulab-quiz-feedback`` on the feedback, plus ``gpulab-quiz-correct`` /
  ``gpulab-quiz-wrong`` once graded;
- ``gpulab-quiz-summary`` on the section's progress line.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from typing import Any

from .bank import (
    Bank,
    Feedback,
    MultipleChoice,
    Numeric,
    Question,
    ShortAnswer,
    SingleChoice,
    canonical_answer,
    grade_answer,
    load_section,
)
from .progress import ProgressStore

TYPE_LABELS = {"single": "单选", "multiple": "多选", "numeric": "数值", "short": "简答"}

_STYLE = """<style>
.gpulab-quiz .widget-radio-box label, .gpulab-quiz .widget-checkbox label { white-space: normal; height: auto; }
.gpulab-quiz .widget-radio-box label { line-height: 1.5; margin-bottom: 4px; }
.gpulab-quiz-question { border: 1px solid #d0d7de; border-radius: 6px; padding: 8px 12px; margin: 6px 0; }
.gpulab-quiz-feedback .gpulab-explanation { color: #57606a; margin-top: 4px; }
</style>"""


# --------------------------------------------------------------------------- text helpers


def markdown_to_html(text: str) -> str:
    """The small Markdown subset used in banks: ``` fences, `code`, **bold**, paragraphs."""
    parts = re.split(r"```[^\n]*\n(.*?)```", text, flags=re.S)
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(f"<pre><code>{html.escape(part.rstrip())}</code></pre>")
            continue
        escaped = html.escape(part.strip())
        escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)
        escaped = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", escaped)
        for para in re.split(r"\n\s*\n", escaped):
            if para.strip():
                out.append("<p>" + para.strip().replace("\n", "<br>") + "</p>")
    return "".join(out)


def _feedback_html(feedback: Feedback, previous: bool = False) -> str:
    if not feedback.answered:
        return f'<div style="color:#9a6700">⚠️ {html.escape(feedback.message)}</div>'
    mark, color = ("✅", "#1a7f37") if feedback.correct else ("❌", "#cf222e")
    prefix = "（上次的作答）" if previous else ""
    return (f'<div style="color:{color}"><strong>{mark} {prefix}{html.escape(feedback.message)}</strong></div>'
            f'<div class="gpulab-explanation"><strong>解析：</strong>{markdown_to_html(feedback.explanation)}</div>')


def _option_label(option_id: str, text: str, plain: bool = False) -> str:
    # Widget labels are plain text, so inline-code backticks would show literally there.
    return f"{option_id.upper()}. {text.replace('`', '') if plain else text}"


# --------------------------------------------------------------------------- widget views


class QuestionView:
    """The widgets of one question; :meth:`submit` is what the 提交 button runs."""

    def __init__(self, question: Question, store: ProgressStore, on_change: Callable[[], None] | None = None):
        import ipywidgets as w

        self.question = question
        self.store = store
        self._on_change = on_change
        full = w.Layout(width="100%")
        type_tag = f"[{TYPE_LABELS[question.kind]}] "
        self.prompt = w.HTML(markdown_to_html(type_tag + question.prompt), layout=full)
        self.checkboxes: dict[str, Any] = {}
        if isinstance(question, SingleChoice):
            choices = [(_option_label(o.id, o.text, plain=True), o.id) for o in question.options]
            self.input = w.RadioButtons(options=choices, value=None, layout=full, style={"description_width": "0px"})
        elif isinstance(question, MultipleChoice):
            for o in question.options:
                box = w.Checkbox(value=False, description=_option_label(o.id, o.text, plain=True), indent=False,
                                 layout=full)
                box.add_class("gpulab-quiz-option")
                box.add_class(f"gpulab-quiz-option-{o.id}")
                self.checkboxes[o.id] = box
            self.input = w.VBox(list(self.checkboxes.values()), layout=full)
        elif isinstance(question, Numeric):
            self.input = w.FloatText(value=0.0, description="数值：", style={"description_width": "initial"})
        elif isinstance(question, ShortAnswer):
            self.input = w.Text(value="", placeholder="在这里输入答案", description="答案：",
                                style={"description_width": "initial"}, layout=w.Layout(width="60%"))
        else:  # pragma: no cover - bank.py only builds the four types
            raise TypeError(f"unsupported question type {question.kind!r}")
        self.input.add_class("gpulab-quiz-input")
        row = [self.input]
        if isinstance(question, Numeric) and question.unit:
            row.append(w.Label(question.unit))
        self.button = w.Button(description="提交", button_style="primary", tooltip="提交这道题的答案")
        self.button.add_class("gpulab-quiz-submit")
        self.button.on_click(self._clicked)
        self.feedback = w.HTML("")
        self.feedback.add_class("gpulab-quiz-feedback")
        self.container = w.VBox([self.prompt, w.HBox(row) if len(row) > 1 else self.input, self.button,
                                 self.feedback], layout=full)
        for cls in ("gpulab-quiz-question", f"gpulab-quiz-{question.id}", f"gpulab-quiz-type-{question.kind}"):
            self.container.add_class(cls)
        self.restore()

    # The answer as it is stored in progress.json and accepted by grade_answer.
    def value(self) -> Any:
        q = self.question
        if isinstance(q, SingleChoice):
            return self.input.value
        if isinstance(q, MultipleChoice):
            return [oid for oid, box in self.checkboxes.items() if box.value]
        if isinstance(q, Numeric):
            return float(self.input.value)
        return self.input.value

    def set_value(self, answer: Any) -> None:
        q = self.question
        if isinstance(q, SingleChoice):
            self.input.value = answer if q.option(str(answer)) else None
        elif isinstance(q, MultipleChoice):
            chosen = set(answer or [])
            for oid, box in self.checkboxes.items():
                box.value = oid in chosen
        elif isinstance(q, Numeric):
            try:
                self.input.value = float(answer)
            except (TypeError, ValueError):
                self.input.value = 0.0
        else:
            self.input.value = "" if answer is None else str(answer)

    def _show(self, feedback: Feedback, previous: bool = False, note: str = "") -> None:
        self.feedback.remove_class("gpulab-quiz-correct")
        self.feedback.remove_class("gpulab-quiz-wrong")
        if feedback.answered:
            self.feedback.add_class("gpulab-quiz-correct" if feedback.correct else "gpulab-quiz-wrong")
        extra = f'<div style="color:#9a6700">{html.escape(note)}</div>' if note else ""
        self.feedback.value = _feedback_html(feedback, previous) + extra

    def restore(self) -> None:
        """Show the saved answer, re-graded against the current key (banks may have been fixed)."""
        try:
            entry = self.store.get(self.question.section, self.question.id)
        except OSError:
            entry = None
        if entry is None:
            return
        self.set_value(entry.answer)
        self._show(grade_answer(self.question, entry.answer), previous=True)

    def submit(self, answer: Any = None) -> Feedback:
        """Grade the widget's current value (or ``answer``), save it, and show the feedback."""
        if answer is not None:
            self.set_value(answer)
        value = self.value()
        feedback = grade_answer(self.question, value)
        note = ""
        if feedback.answered:
            try:
                self.store.record(self.question.section, self.question.id,
                                  canonical_answer(self.question, value), feedback.correct)
            except (OSError, TypeError, ValueError) as exc:
                note = f"（这次作答没能保存到本地进度：{exc}）"
        self._show(feedback, note=note)
        if self._on_change is not None:
            self._on_change()
        return feedback

    def _clicked(self, _button: Any) -> None:
        # Exceptions in widget callbacks vanish into the kernel log; show them in the card instead.
        try:
            self.submit()
        except Exception as exc:  # noqa: BLE001
            self.feedback.value = ('<div style="color:#cf222e">内部错误，请把这段信息告诉讲师：'
                                   f"{html.escape(repr(exc))}</div>")


class QuizView:
    """All questions of one section plus a progress line; ``widget`` is what gets displayed."""

    def __init__(self, bank: Bank, store: ProgressStore | None = None):
        import ipywidgets as w

        self.bank = bank
        self.store = store or ProgressStore()
        header = w.HTML(_STYLE + f"<h3>小测：{html.escape(bank.title)}</h3>"
                        + (markdown_to_html(bank.description) if bank.description else ""))
        self.summary = w.HTML("")
        self.summary.add_class("gpulab-quiz-summary")
        self.questions = {q.id: QuestionView(q, self.store, self.refresh_summary) for q in bank.questions}
        self.widget = w.VBox([header, *(v.container for v in self.questions.values()), self.summary])
        self.widget.add_class("gpulab-quiz")
        self.widget.add_class(f"gpulab-quiz-section-{bank.section}")
        self.refresh_summary()

    def submit(self, qid: str, answer: Any = None) -> Feedback:
        return self.questions[qid].submit(answer)

    def refresh_summary(self) -> None:
        try:
            entries = self.store.entries(self.bank.section)
        except OSError:
            entries = {}
        graded = [grade_answer(q, entries[q.id].answer) for q in self.bank.questions if q.id in entries]
        right = sum(f.correct for f in graded)
        self.summary.value = (f"<p><strong>本节进度：</strong>已答 {len(graded)} / {len(self.bank.questions)} 题，"
                              f"答对 {right} 题。</p>")


# --------------------------------------------------------------------------- entry points


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def build_quiz(section: str | int, store: ProgressStore | None = None, directory: Any = None) -> QuizView:
    """Build (but do not display) the widgets for ``section``."""
    return QuizView(load_section(section, directory), store)


def render_text(bank: Bank, store: ProgressStore | None = None) -> str:
    """Plain-text rendering for terminals and non-widget front ends."""
    store = store or ProgressStore()
    try:
        saved = store.entries(bank.section)
    except OSError:
        saved = {}
    lines = [f"【{bank.section}】小测：{bank.title}", ""]
    if bank.description:
        lines += [bank.description, ""]
    for n, q in enumerate(bank.questions, 1):
        lines.append(f"{n}. [{TYPE_LABELS[q.kind]}] ({q.id}) {q.prompt.strip()}")
        if isinstance(q, (SingleChoice, MultipleChoice)):
            lines += [f"   {_option_label(o.id, o.text)}" for o in q.options]
        if isinstance(q, Numeric) and q.unit:
            lines.append(f"   单位：{q.unit}")
        if q.id in saved:
            fb = grade_answer(q, saved[q.id].answer)
            lines.append(f"   上次作答：{saved[q.id].answer!r}（{'正确' if fb.correct else '错误'}）")
        lines.append("")
    example = bank.questions[0]
    lines.append(f'作答方式：gpulab.quiz.answer("{bank.section}", "{example.id}", <答案>)；'
                 "多选题用列表，例如 [\"a\", \"c\"]。")
    return "\n".join(lines)


def show_quiz(section: str | int, store: ProgressStore | None = None, directory: Any = None) -> None:
    """Display the quiz for ``section`` as widgets, or print it as text outside a notebook."""
    bank = load_section(section, directory)
    if _in_notebook():
        from IPython.display import display

        display(QuizView(bank, store).widget)
    else:
        print(render_text(bank, store))


def answer(section: str | int, qid: str, value: Any, store: ProgressStore | None = None,
           directory: Any = None) -> Feedback:
    """Answer one question without widgets: grade, save, print the feedback, return it."""
    bank = load_section(section, directory)
    question = bank.question(qid)
    feedback = grade_answer(question, value)
    if feedback.answered:
        (store or ProgressStore()).record(bank.section, qid, canonical_answer(question, value), feedback.correct)
        verdict = "✅" if feedback.correct else "❌"
        print(f"{verdict} {feedback.message}\n解析：{feedback.explanation}")
    else:
        print(f"⚠️ {feedback.message}")
    return feedback
