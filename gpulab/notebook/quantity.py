"""Quantities: a Kubernetes resource quantity (``"2"``, ``"500m"``, ``"16Gi"``) as a number."""

from __future__ import annotations

from typing import Any

__all__ = ["parse"]


def parse(v: Any) -> float:
    """``v`` as a float; 0.0 for what is not a quantity (None, garbage)."""
    from kubernetes.utils import parse_quantity

    try:
        return float(parse_quantity(v))
    except (ValueError, TypeError):
        return 0.0
