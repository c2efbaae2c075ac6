"""Quizzes: the section's quiz at the end of a lesson (the widgets and answers are :mod:`gpulab.quiz`'s)."""

from __future__ import annotations

__all__ = ["show_quiz"]


def show_quiz(section: str | int) -> None:
    """Display the section's quiz (see :mod:`gpulab.quiz`); answers are saved under ``GPULAB_HOME``.

    The display carries the widgets plus a static HTML/Markdown list of the questions, so that a notebook
    viewed without a kernel (nbconvert, a static viewer, an untrusted notebook) still shows them.
    """
    from ..quiz import show_quiz as _show

    _show(section)
