"""Every chapter notebook runs from top to bottom against the session's cluster.

Each notebook is one test: a child ``pytest --nbval-lax`` runs it in a fresh
``python3`` kernel of this environment, with ``GPULAB_HOME`` pointing at the
session cluster (tests/conftest.py). nbval fails the notebook on any error
(including a failed ``expect``) and compares, after ``sanitize.cfg``, the
outputs of the cells tagged ``nbval-check-output`` with the outputs committed
in the notebook (``make notebooks`` refreshes those).

Notebooks run one after another on the same cluster, and each must leave it
as it found it: after each one, no lesson namespace is left and no node keeps
a lesson's label or taint.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
SANITIZE = Path(__file__).with_name("sanitize.cfg")
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]-*.ipynb"))
# A notebook must finish in well under this (the course's budget is 90 s each; 06 sends real traffic
# through four experiments of 25-35 s and takes about four minutes).
NOTEBOOK_TIMEOUT = 420
CELL_TIMEOUT = 120
LESSON_KEYS = ("node-role.kubernetes.io/ai", "nvidia.com/gpu")
# The failure report: the first failing cell in full (up to this), the others by name, then the output's end.
FIRST_FAILURE_CHARS = 8000
OTHER_FAILURES_SHOWN = 40
TAIL_CHARS = 2000

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# pytest's section lines (`==== FAILURES ====`) and, inside FAILURES and ERRORS, one item's header
# (`____ notebooks/NN-x.ipynb::Cell K ____`).
_SECTION = re.compile(r"^=+ (.+?) =+$", re.M)
_ITEM = re.compile(r"^_{3,} (.+?) _{3,}$", re.M)


def run_nbval(notebook: Path, home: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pytest", str(notebook.relative_to(REPO)),
           "--nbval-lax", "--nbval-current-env", f"--nbval-sanitize-with={SANITIZE}",
           f"--nbval-cell-timeout={CELL_TIMEOUT}", "-p", "no:cacheprovider", "-q", "--no-header", "-rfE"]
    env = dict(os.environ, GPULAB_HOME=str(home), PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=NOTEBOOK_TIMEOUT,
                          check=False)


def failing_items(output: str) -> list[tuple[str, str]]:
    """The (header, text) of each item in pytest's FAILURES and ERRORS sections of ``output``, in order.

    The text is the item's whole section as pytest printed it: for an nbval cell, its header line, the
    reason, the cell's source and the traceback or the diff of its outputs.
    """
    items = []
    sections = list(_SECTION.finditer(output))
    for i, section in enumerate(sections):
        if section.group(1) not in ("FAILURES", "ERRORS"):
            continue
        end = sections[i + 1].start() if i + 1 < len(sections) else len(output)
        body = output[section.end():end]
        headers = list(_ITEM.finditer(body))
        for j, header in enumerate(headers):
            stop = headers[j + 1].start() if j + 1 < len(headers) else len(body)
            items.append((header.group(1), body[header.start():stop].rstrip() + "\n"))
    return items


def failure_report(output: str, first_chars: int = FIRST_FAILURE_CHARS, tail_chars: int = TAIL_CHARS) -> str:
    """What nbval's ``output`` says about a failed notebook, most useful first.

    The first failing cell is the cause; the cells after it often fail only because it did (a name
    it should have defined), and the output's last characters alone would show only those. So: the
    first failing item's section in full (its middle cut past ``first_chars``), the headers of the
    other failing items, then the output's last ``tail_chars`` characters. Terminal colours are removed.
    Output without a FAILURES or ERRORS section (pytest could not even collect) is shown by its end.
    """
    output = _ANSI.sub("", output)
    items = failing_items(output)
    if not items:
        return output[-(first_chars + tail_chars):]
    (first, text), others = items[0], [header for header, _ in items[1:]]
    if len(text) > first_chars:
        half = first_chars // 2
        text = f"{text[:half]}\n[... {len(text) - 2 * half} characters left out ...]\n{text[-half:]}"
    lines = [f"first failing cell: {first}", text]
    if others:
        lines.append(f"then {len(others)} more failing (often only because the first did):")
        lines += [f"  {header}" for header in others[:OTHER_FAILURES_SHOWN]]
        if len(others) > OTHER_FAILURES_SHOWN:
            lines.append(f"  ... and {len(others) - OTHER_FAILURES_SHOWN} more")
    lines += ["", f"end of nbval's output (last {tail_chars} characters):", output[-tail_chars:]]
    return "\n".join(lines)


def cluster_snapshot(kube) -> str:
    """What the cluster looks like now, for the failure report: the GPU stack's pods and recent warnings."""
    from gpulab.notebook import pod_status

    lines = ["cluster after the run:"]
    for p in kube.list("Pod", "gpu-operator"):
        lines.append(f"  pod {p['metadata']['name']}: {pod_status(p)}")
    warnings = [e for e in kube.list("Event") if e.get("type") == "Warning"]
    warnings.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    for e in warnings[-15:]:
        obj = e.get("involvedObject") or {}
        lines.append(f"  {e.get('lastTimestamp') or e.get('eventTime')} {obj.get('kind')}/{obj.get('name')} "
                     f"{e.get('reason')} (x{e.get('count', 1)}): {(e.get('message') or '')[:300]}")
    return "\n".join(lines)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_and_matches_its_checked_outputs(notebook, cluster, kube):
    proc = run_nbval(notebook, cluster.root.parent)
    if proc.returncode != 0:
        pytest.fail(f"nbval failed for {notebook.name} (exit {proc.returncode}):\n"
                    f"{failure_report(proc.stdout)}\n{proc.stderr[-3000:]}\n{cluster_snapshot(kube)}", pytrace=False)

    # The notebook cleaned up after itself.
    lessons = [ns["metadata"]["name"] for ns in kube.list("Namespace", label_selector="gpulab.io/lesson")]
    assert lessons == [], f"{notebook.name} left lesson namespaces behind: {lessons}"
    for node in kube.list("Node"):
        labels = node["metadata"].get("labels") or {}
        assert "node-role.kubernetes.io/ai" not in labels, f"{notebook.name} left a label on {node['metadata']['name']}"
        taints = [t["key"] for t in node.get("spec", {}).get("taints") or [] if t["key"] in LESSON_KEYS]
        assert not taints, f"{notebook.name} left taints {taints} on {node['metadata']['name']}"
