"""Checks: a lesson's claims about the cluster, verified as the notebook runs."""

from __future__ import annotations

from typing import Any

__all__ = ["expect"]

# Plain symbols, not emoji (✅ ❌ need a colour emoji font, and show as boxes without one): both are in
# Noto Sans CJK and DejaVu Sans Mono, the fonts a notebook's output is shown with (tests/notebooks checks it).
PASS, FAIL = "✓", "×"


def expect(ok: Any, what: str, hint: str = "") -> None:
    """A lesson's self-check: print ``✓ what`` when ``ok`` is truthy, else fail the cell with ``× what``.

    The lesson's claims about the cluster are written this way, so running the
    notebook (by a learner, or by the test suite) also checks that the cluster
    still behaves as the text says.
    """
    if ok:
        print(f"{PASS} {what}", flush=True)
        return
    raise AssertionError(f"{FAIL} {what}" + (f"：{hint}" if hint else ""))
