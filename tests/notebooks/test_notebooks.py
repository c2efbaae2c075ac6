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


def run_nbval(notebook: Path, home: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pytest", str(notebook.relative_to(REPO)),
           "--nbval-lax", "--nbval-current-env", f"--nbval-sanitize-with={SANITIZE}",
           f"--nbval-cell-timeout={CELL_TIMEOUT}", "-p", "no:cacheprovider", "-q", "--no-header", "-rfE"]
    env = dict(os.environ, GPULAB_HOME=str(home), PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=NOTEBOOK_TIMEOUT,
                          check=False)


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
                    f"{proc.stdout[-12000:]}\n{proc.stderr[-3000:]}\n{cluster_snapshot(kube)}", pytrace=False)

    # The notebook cleaned up after itself.
    lessons = [ns["metadata"]["name"] for ns in kube.list("Namespace", label_selector="gpulab.io/lesson")]
    assert lessons == [], f"{notebook.name} left lesson namespaces behind: {lessons}"
    for node in kube.list("Node"):
        labels = node["metadata"].get("labels") or {}
        assert "node-role.kubernetes.io/ai" not in labels, f"{notebook.name} left a label on {node['metadata']['name']}"
        taints = [t["key"] for t in node.get("spec", {}).get("taints") or [] if t["key"] in LESSON_KEYS]
        assert not taints, f"{notebook.name} left taints {taints} on {node['metadata']['name']}"
