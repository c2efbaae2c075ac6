"""Render a section's questions as ipywidgets, with feedback that teaches.

``show_quiz("04-sharing")`` in a notebook cell displays one card per question
(RadioButtons / Checkboxes / Text and a 提交 button). Submitting grades the
answer and saves it in the local progress store:

- a correct answer shows the explanation (解析);
- a wrong answer shows what is wrong without giving the key away (which
  option is not it, missing or extra choices, too big or too small) and a
  hint — the bank's ``hint`` or a generic "再想想" — and the learner tries
  again; a 显示答案 button appears, which shows the key and the explanation
  and records in the progress file that the answer was shown;
- an empty or unusable input ("" in a number field, nothing ticked) is not an
  answer: it is not saved and reveals nothing.

Re-running the cell (or restarting the kernel) restores the saved answers and
their feedback. Verdicts are marked with :mod:`gpulab.marks`' ✓ / × (plain symbols in
every font gpulab relies on, with no emoji presentation) plus colour — never with emoji, which
render as empty boxes where no emoji font is installed.

The display data carries, besides the widget view, a static ``text/html`` and
``text/markdown`` rendering of the questions and options (no answers) and a
short zh-CN ``text/plain`` line, so nbconvert HTML, static viewers and
untrusted notebooks show the questions instead of nothing or a ``VBox(…)``
repr.

Outside a notebook the same questions are printed as plain text and answered
with :func:`answer` (and :func:`show_answer`).

Stable CSS classes for browser tests (``add_class``):

- ``gpulab-quiz`` and ``gpulab-quiz-section-<section>`` on the outer box;
- ``gpulab-quiz-question``, ``gpulab-quiz-<qid>``, ``gpulab-quiz-type-<type>`` on each card;
- ``gpulab-quiz-input`` on the input widget, ``gpulab-quiz-option-<id>`` on each checkbox;
- ``gpulab-quiz-submit`` on the 提交 button, ``gpulab-quiz-reveal`` on the 显示答案 button;
- ``gpulab-quiz-feedback`` on the feedback, plus ``gpulab-quiz-correct`` /
  ``gpulab-quiz-wrong`` once graded and ``gpulab-quiz-revealed`` once the key is shown;
  inside it ``gpulab-quiz-verdict``, ``gpulab-quiz-hint``, ``gpulab-quiz-key``, ``gpulab-explanation``;
- ``gpulab-quiz-summary`` on the section's progress line;
- ``gpulab-quiz-static`` on the static (no-kernel) rendering.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from typing import Any

from .. import marks
from .bank import (
    Bank,
    Feedback,
    MultipleChoice,
    Numeric,
    Question,
    ShortAnswer,
    SingleChoice,
    canonical_answer,
    format_number,
    grade_answer,
    key_lines,
    load_section,
)
from .progress import ProgressStore

TYPE_LABELS = {"single": "单选", "multiple": "多选", "numeric": "数值", "short": "简答"}

MARK_CORRECT, MARK_WRONG = marks.PASS, marks.FAIL
_COLORS = {"correct": "#1a7f37", "wrong": "#cf222e", "notice": "#9a6700", "muted": "#57606a"}

WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"

# ipywidgets gives a checkbox row a fixed height (--jp-widgets-inline-height) and its label
# (.widget-label-basic) white-space: nowrap, overflow: hidden and text-overflow: ellipsis; radio labels get a
# fixed height too. A long option was therefore cut off after one line. These rules let options wrap in full.
_STYLE = """<style>
.gpulab-quiz .widget-checkbox { height: auto; min-height: var(--jp-widgets-inline-height); }
.gpulab-quiz .widget-checkbox .widget-label-basic, .gpulab-quiz .widget-radio-box label {
  display: flex; align-items: flex-start; white-space: normal; overflow: visible; text-overflow: clip;
  overflow-wrap: anywhere; height: auto; line-height: 1.5; margin-bottom: 4px; }
.gpulab-quiz .widget-checkbox .widget-label-basic input[type=checkbox],
.gpulab-quiz .widget-radio-box label input[type=radio] {
  flex: none; float: none; order: -1; align-self: flex-start; height: auto; margin-top: 0.25em; }
.gpulab-quiz-question { border: 1px solid #d0d7de; border-radius: 6px; padding: 8px 12px; margin: 6px 0; }
.gpulab-quiz-feedback .gpulab-explanation, .gpulab-quiz-feedback .gpulab-quiz-key { margin-top: 4px; }
.gpulab-quiz-feedback .gpulab-explanation { color: #57606a; }
</style>"""


# --------------------------------------------------------------------------- text helpers


def _inline_markdown(escaped: str) -> str:
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", escaped)


def markdown_to_html(text: str) -> str:
    """The small Markdown subset used in banks: ``` fences, `code`, **bold**, paragraphs."""
    parts = re.split(r"```[^\n]*\n(.*?)```", text, flags=re.S)
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(f"<pre><code>{html.escape(part.rstrip())}</code></pre>")
            continue
        escaped = _inline_markdown(html.escape(part.strip()))
        for para in re.split(r"\n\s*\n", escaped):
            if para.strip():
                out.append("<p>" + para.strip().replace("\n", "<br>") + "</p>")
    return "".join(out)


def inline_html(text: str) -> str:
    """One line of bank text (an option, a hint) as inline HTML: `code` and **bold**, no paragraphs."""
    return _inline_markdown(html.escape(text.strip())).replace("\n", "<br>")


def _option_label(option_id: str, text: str, plain: bool = False) -> str:
    # Widget labels are plain text, so inline-code backticks would show literally there.
    return f"{option_id.upper()}. {text.replace('`', '') if plain else text}"


def _div(cls: str, color: str | None, body: str) -> str:
    style = f' style="color:{_COLORS[color]}"' if color else ""
    return f'<div class="{cls}"{style}>{body}</div>'


def feedback_html(question: Question, feedback: Feedback | None, *, revealed: bool = False,
                  previous: bool = False) -> str:
    """The feedback card's HTML.

    ``feedback`` is the latest grading (None: nothing to say yet). The
    explanation is shown once the answer is correct or the key was revealed;
    a wrong answer gets its hint instead.
    """
    parts = []
    if feedback is not None and not feedback.answered:
        parts.append(_div("gpulab-quiz-notice", "notice", html.escape(feedback.message)))
    elif feedback is not None:
        prefix = "（上次的作答）" if previous else ""
        mark, color = (MARK_CORRECT, "correct") if feedback.correct else (MARK_WRONG, "wrong")
        parts.append(_div("gpulab-quiz-verdict", color,
                          f"<strong>{mark} {prefix}{html.escape(feedback.message)}</strong>"))
        if not feedback.correct:
            parts.append(_div("gpulab-quiz-hint", None, f"<strong>提示：</strong>{inline_html(feedback.hint)}"))
            if not revealed:
                parts.append(_div("gpulab-quiz-retry", "muted",
                                  "改一改答案，再点「提交」试一次；想直接看答案，可以点「显示答案」。"))
    if revealed:
        key = "<br>".join(inline_html(line) for line in key_lines(question))
        parts.append(_div("gpulab-quiz-key", None, f"<strong>正确答案：</strong>{key}"))
    if revealed or (feedback is not None and feedback.answered and feedback.correct):
        parts.append(_div("gpulab-explanation", None,
                          f"<strong>解析：</strong>{markdown_to_html(question.explanation)}"))
    return "".join(parts)


# --------------------------------------------------------------------------- static renderings


def render_html(bank: Bank) -> str:
    """Questions and options as static HTML (no answers, hints or explanations), for viewers without a kernel."""
    out = [f'<div class="gpulab-quiz-static gpulab-quiz-static-{html.escape(bank.section)}">',
           f"<h3>小测：{html.escape(bank.title)}</h3>"]
    if bank.description:
        out.append(markdown_to_html(bank.description))
    out.append(f'<p style="color:{_COLORS["muted"]}">这是静态预览：在 Jupyter 里运行这个单元格后，'
               "才能作答、看到反馈和解析。</p>")
    out.append("<ol>")
    for q in bank.questions:
        out.append(f'<li class="gpulab-quiz-static-question gpulab-quiz-static-{q.id}">')
        out.append(markdown_to_html(f"[{TYPE_LABELS[q.kind]}] " + q.prompt))
        if isinstance(q, (SingleChoice, MultipleChoice)):
            out.append('<ul style="list-style:none;padding-left:1em;margin-bottom:0.75em">')
            out += [f"<li>{inline_html(_option_label(o.id, o.text))}</li>" for o in q.options]
            out.append("</ul>")
        elif isinstance(q, Numeric):
            out.append(f"<p>填一个数值{f'（单位：{html.escape(q.unit)}）' if q.unit else ''}。</p>")
        else:
            out.append("<p>填写简短的答案。</p>")
        out.append("</li>")
    out.append("</ol></div>")
    return "\n".join(out)


def render_markdown(bank: Bank) -> str:
    """Questions and options as Markdown (no answers), the ``text/markdown`` fallback."""
    lines = [f"### 小测：{bank.title}", ""]
    if bank.description:
        lines += [bank.description, ""]
    lines += ["> 这是静态预览：在 Jupyter 里运行这个单元格后，才能作答、看到反馈和解析。", ""]
    for n, q in enumerate(bank.questions, 1):
        prompt = q.prompt.strip().splitlines()
        lines.append(f"{n}. **[{TYPE_LABELS[q.kind]}]** {prompt[0]}")
        lines += [f"   {line}" if line.strip() else "" for line in prompt[1:]]
        if isinstance(q, (SingleChoice, MultipleChoice)):
            lines.append("")
            lines += [f"   - {_option_label(o.id, o.text)}" for o in q.options]
        elif isinstance(q, Numeric) and q.unit:
            lines += ["", f"   单位：{q.unit}"]
        lines.append("")
    return "\n".join(lines)


def plain_line(bank: Bank) -> str:
    """The ``text/plain`` of the display: one zh-CN line instead of the widget's ``VBox(…)`` repr."""
    return (f"小测：{bank.title}（{len(bank.questions)} 题）。在 Jupyter 里运行这个单元格即可作答；"
            f"没有界面时可用 gpulab.quiz.answer(\"{bank.section}\", 题号, 答案)。")


# --------------------------------------------------------------------------- widget views


class QuestionView:
    """The widgets of one question; :meth:`submit` and :meth:`reveal` are what its buttons run."""

    def __init__(self, question: Question, store: ProgressStore, on_change: Callable[[], None] | None = None):
        import ipywidgets as w

        self.question = question
        self.store = store
        self._on_change = on_change
        self.graded: Feedback | None = None  # the latest real answer's grading
        self.revealed = False
        self._previous = False
        full = w.Layout(width="100%")
        type_tag = f"[{TYPE_LABELS[question.kind]}] "
        self.prompt = w.HTML(markdown_to_html(type_tag + question.prompt), layout=full)
        self.checkboxes: dict[str, Any] = {}
        if isinstance(question, SingleChoice):
            choices = [(_option_label(o.id, o.text, plain=True), o.id) for o in question.options]
            self.input = w.RadioButtons(options=choices, value=None, layout=w.Layout(width="100%", height="auto"),
                                        style={"description_width": "0px"})
        elif isinstance(question, MultipleChoice):
            for o in question.options:
                box = w.Checkbox(value=False, description=_option_label(o.id, o.text, plain=True), indent=False,
                                 layout=w.Layout(width="100%", height="auto"))
                box.add_class("gpulab-quiz-option")
                box.add_class(f"gpulab-quiz-option-{o.id}")
                self.checkboxes[o.id] = box
            self.input = w.VBox(list(self.checkboxes.values()), layout=full)
        elif isinstance(question, Numeric):
            # A Text, not a FloatText: the field starts empty (not 0) and an empty field is "not answered".
            self.input = w.Text(value="", placeholder="填一个数字", description="数值：",
                                style={"description_width": "initial"}, layout=w.Layout(width="18em"))
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
        self.reveal_button = w.Button(description="显示答案", tooltip="显示正确答案和解析（会记在学习进度里）",
                                      layout=w.Layout(display="none"))
        self.reveal_button.add_class("gpulab-quiz-reveal")
        self.reveal_button.on_click(self._reveal_clicked)
        self.feedback = w.HTML("", layout=full)
        self.feedback.add_class("gpulab-quiz-feedback")
        self.container = w.VBox([self.prompt, w.HBox(row) if len(row) > 1 else self.input,
                                 w.HBox([self.button, self.reveal_button]), self.feedback], layout=full)
        for cls in ("gpulab-quiz-question", f"gpulab-quiz-{question.id}", f"gpulab-quiz-type-{question.kind}"):
            self.container.add_class(cls)
        self.restore()

    # The answer as it is accepted by grade_answer (canonical_answer gives the stored form).
    def value(self) -> Any:
        q = self.question
        if isinstance(q, SingleChoice):
            return self.input.value
        if isinstance(q, MultipleChoice):
            return [oid for oid, box in self.checkboxes.items() if box.value]
        return self.input.value  # numeric: the text as typed; "" is "not answered"

    def set_value(self, answer: Any) -> None:
        q = self.question
        if isinstance(q, SingleChoice):
            self.input.value = answer if q.option(str(answer)) else None
        elif isinstance(q, MultipleChoice):
            chosen = set(answer or [])
            for oid, box in self.checkboxes.items():
                box.value = oid in chosen
        elif isinstance(q, Numeric):
            if isinstance(answer, (int, float)) and not isinstance(answer, bool):
                self.input.value = format_number(answer)
            else:
                self.input.value = "" if answer is None else str(answer)
        else:
            self.input.value = "" if answer is None else str(answer)

    def _show(self, shown: Feedback | None, note: str = "") -> None:
        for cls in ("gpulab-quiz-correct", "gpulab-quiz-wrong", "gpulab-quiz-revealed"):
            self.feedback.remove_class(cls)
        if shown is not None and shown.answered:
            self.feedback.add_class("gpulab-quiz-correct" if shown.correct else "gpulab-quiz-wrong")
        if self.revealed:
            self.feedback.add_class("gpulab-quiz-revealed")
        extra = _div("gpulab-quiz-note", "notice", html.escape(note)) if note else ""
        self.feedback.value = feedback_html(self.question, shown, revealed=self.revealed,
                                            previous=self._previous) + extra
        # 显示答案 is offered once an answer was wrong, until the key is shown or the answer is right.
        offer = not self.revealed and self.graded is not None and not self.graded.correct
        self.reveal_button.layout.display = "" if offer else "none"

    def restore(self) -> None:
        """Show the saved answer, re-graded against the current key (banks may have been fixed)."""
        try:
            entry = self.store.get(self.question.section, self.question.id)
            self.revealed = self.store.revealed(self.question.section, self.question.id)
        except OSError:
            entry = None
        if entry is not None:
            self.set_value(entry.answer)
            self.graded = grade_answer(self.question, entry.answer)
            self._previous = True
        if entry is not None or self.revealed:
            self._show(self.graded)

    def submit(self, answer: Any = None) -> Feedback:
        """Grade the widget's current value (or ``answer``), save it, and show the feedback."""
        if answer is not None:
            self.set_value(answer)
        value = self.value()
        feedback = grade_answer(self.question, value)
        note = ""
        if feedback.answered:
            self.graded = feedback
            self._previous = False
            try:
                self.store.record(self.question.section, self.question.id,
                                  canonical_answer(self.question, value), feedback.correct)
            except (OSError, TypeError, ValueError) as exc:
                note = f"（这次作答没能保存到本地进度：{exc}）"
        self._show(feedback, note=note)
        if self._on_change is not None:
            self._on_change()
        return feedback

    def reveal(self) -> None:
        """Show the key and the explanation, and record in the progress file that they were shown."""
        note = ""
        try:
            self.store.mark_revealed(self.question.section, self.question.id)
        except OSError as exc:
            note = f"（没能把“看过答案”记到本地进度：{exc}）"
        self.revealed = True
        self._show(self.graded, note=note)
        if self._on_change is not None:
            self._on_change()

    def _guarded(self, action: Callable[[], Any]) -> None:
        # Exceptions in widget callbacks vanish into the kernel log; show them in the card instead.
        try:
            action()
        except Exception as exc:  # noqa: BLE001
            self.feedback.value = (f'<div style="color:{_COLORS["wrong"]}">内部错误，请把这段信息告诉讲师：'
                                   f"{html.escape(repr(exc))}</div>")

    def _clicked(self, _button: Any) -> None:
        self._guarded(self.submit)

    def _reveal_clicked(self, _button: Any) -> None:
        self._guarded(self.reveal)


class QuizView:
    """All questions of one section plus a progress line; ``widget`` is what gets displayed.

    Displaying the view itself (``display(view)``) publishes the widget together
    with static ``text/html`` / ``text/markdown`` / ``text/plain`` renderings.
    """

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

    def reveal(self, qid: str) -> None:
        self.questions[qid].reveal()

    def refresh_summary(self) -> None:
        try:
            entries = self.store.entries(self.bank.section)
            revealed = sum(self.store.revealed(self.bank.section, q.id) for q in self.bank.questions)
        except OSError:
            entries, revealed = {}, 0
        graded = [grade_answer(q, entries[q.id].answer) for q in self.bank.questions if q.id in entries]
        right = sum(f.correct for f in graded)
        shown = f"，看过答案 {revealed} 题" if revealed else ""
        self.summary.value = (f"<p><strong>本节进度：</strong>已答 {len(graded)} / {len(self.bank.questions)} 题，"
                              f"答对 {right} 题{shown}。</p>")

    def mimebundle(self) -> dict[str, Any]:
        """The display data: the widget view plus static fallbacks for front ends without a kernel."""
        widget_data = self.widget._repr_mimebundle_()
        return {
            WIDGET_VIEW_MIME: widget_data[WIDGET_VIEW_MIME],
            "text/html": render_html(self.bank),
            "text/markdown": render_markdown(self.bank),
            "text/plain": plain_line(self.bank),
        }

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None, **kwargs: Any) -> dict[str, Any]:
        return self.mimebundle()


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
            shown = "，看过答案" if saved[q.id].revealed else ""
            lines.append(f"   上次作答：{saved[q.id].answer!r}（{'正确' if fb.correct else '错误'}{shown}）")
        lines.append("")
    example = bank.questions[0]
    lines.append(f'作答方式：gpulab.quiz.answer("{bank.section}", "{example.id}", <答案>)；'
                 "多选题用列表，例如 [\"a\", \"c\"]。")
    return "\n".join(lines)


def show_quiz(section: str | int, store: ProgressStore | None = None, directory: Any = None) -> None:
    """Display the quiz for ``section`` as widgets (with static fallbacks), or print it as text outside a notebook."""
    bank = load_section(section, directory)
    if _in_notebook():
        from IPython.display import display

        display(QuizView(bank, store))
    else:
        print(render_text(bank, store))


def answer(section: str | int, qid: str, value: Any, store: ProgressStore | None = None,
           directory: Any = None) -> Feedback:
    """Answer one question without widgets: grade, save, print the feedback, return it.

    Like the widgets, a wrong answer gets a hint, not the key; :func:`show_answer` shows the key.
    """
    bank = load_section(section, directory)
    question = bank.question(qid)
    feedback = grade_answer(question, value)
    if feedback.answered:
        (store or ProgressStore()).record(bank.section, qid, canonical_answer(question, value), feedback.correct)
        if feedback.correct:
            print(f"{MARK_CORRECT} {feedback.message}\n解析：{feedback.explanation}")
        else:
            print(f"{MARK_WRONG} {feedback.message}\n提示：{feedback.hint}\n"
                  f'再试一次；想直接看答案：gpulab.quiz.show_answer("{bank.section}", "{qid}")')
    else:
        print(f"提示：{feedback.message}")
    return feedback


def show_answer(section: str | int, qid: str, store: ProgressStore | None = None, directory: Any = None) -> str:
    """Print (and return) the key and explanation of one question, recording that it was shown."""
    bank = load_section(section, directory)
    question = bank.question(qid)
    (store or ProgressStore()).mark_revealed(bank.section, qid)
    text = "正确答案：" + "；".join(key_lines(question)) + f"\n解析：{question.explanation}"
    print(text)
    return text
