"""Self-test quizzes: YAML question banks, ipywidgets rendering, local progress.

In a notebook::

    from gpulab.quiz import show_quiz
    show_quiz("04-sharing")

The widget layer (and ipywidgets) is imported only when first used, so the
CLI's ``gpulab progress`` stays fast.
"""

from __future__ import annotations

from typing import Any

from .bank import (
    Bank,
    BankError,
    Feedback,
    MultipleChoice,
    Numeric,
    Option,
    Question,
    ShortAnswer,
    SingleChoice,
    canonical_answer,
    grade_answer,
    hint_for,
    key_lines,
    load_all,
    load_bank,
    load_section,
    normalize,
    quiz_dir,
)
from .progress import Entry, ProgressStore, SectionProgress, format_summary, gpulab_home, progress_path, summary

_WIDGET_NAMES = {"show_quiz", "build_quiz", "answer", "show_answer", "render_text", "render_html",
                 "render_markdown", "QuizView", "QuestionView"}

__all__ = [
    "Bank", "BankError", "Feedback", "MultipleChoice", "Numeric", "Option", "Question", "ShortAnswer",
    "SingleChoice", "canonical_answer", "grade_answer", "hint_for", "key_lines", "load_all", "load_bank",
    "load_section", "normalize", "quiz_dir", "Entry", "ProgressStore", "SectionProgress", "format_summary",
    "gpulab_home", "progress_path", "summary", *sorted(_WIDGET_NAMES),
]


def __getattr__(name: str) -> Any:
    if name in _WIDGET_NAMES:
        from . import widgets

        return getattr(widgets, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
