"""Checks: a lesson's claims about the cluster, verified as the notebook runs."""

from __future__ import annotations

from typing import Any

from .. import marks

__all__ = ["expect"]

# gpulab.marks' plain symbols, not emoji (tests/notebooks checks they are in the fonts outputs use).
PASS, FAIL = marks.PASS, marks.FAIL


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
