"""Two cycles of bench/crash_soak.py: every component killed with SIGKILL, nothing lost.

The soak itself (20 cycles of each component) is a benchmark; see BENCHMARKS.md.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.cluster


def _soak_module():
    spec = importlib.util.spec_from_file_location("crash_soak", REPO / "bench" / "crash_soak.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_component_survives_sigkill_twice(cluster, gpulab_home):
    soak = _soak_module()
    lines: list[str] = []
    results, work = soak.soak(cluster, gpulab_home, cycles=2, components=list(soak.COMPONENTS), say=lines.append)
    failed = [r for r in results if r.problem]
    assert not failed, "\n".join(lines)
    assert len(results) == 2 * len(soak.COMPONENTS), "\n".join(lines)
    assert any("Job completed" in line for line in lines), "\n".join(lines)
    print(soak.table(results))
