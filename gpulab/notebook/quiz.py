"""Quizzes: the section's quiz at the end of a lesson (the widgets and answers are :mod:`gpulab.quiz`'s)."""

from __future__ import annotations

__all__ = ["show_quiz"]


def show_quiz(section: str | int) -> None:
    """Display the section's quiz (see :mod:`gpulab.quiz`); answers are saved under ``GPULAB_HOME``."""
    from ..quiz import show_quiz as _show

    _show(section)
