"""Verdict marks: the one set of symbols every learner-facing output uses.

``expect()`` in lessons, the quiz widget, a lab's self-check and feedback
files, and ``gpulab check`` all mark a verdict with these. They are plain
symbols, not emoji: ✅ ❌ ⚠️ need a colour emoji font and show as empty boxes
where none is installed, while these three are in Noto Sans CJK (the font
gpulab ships for its plots) and DejaVu Sans Mono (JupyterLab's output font).
"""

from __future__ import annotations

__all__ = ["PASS", "PARTIAL", "FAIL", "verdict"]

PASS = "✓"
PARTIAL = "⚠"
FAIL = "×"


def verdict(passed: bool, earned: float = 0.0) -> str:
    """The mark of a graded check: passed, partly earned, or failed."""
    return PASS if passed else (PARTIAL if earned > 0 else FAIL)
