"""Building and grading lab submissions on the real cluster, shared by the lab tests.

A lab's tests grade one batch per lab with ``grade``: the solution, the untouched
generated lab and submissions with typical mistakes made from the solution by
small edits (``from_solution``), then assert scores and messages check by check.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import nbformat

from gpulab.kube import api
from gpulab.grading import grader
from gpulab.grading.gradebook import GradeRow

REPO = Path(__file__).resolve().parents[2]
HIDDEN = REPO / "tests" / "fixtures" / "hidden"


# --------------------------------------------------------------------------- building submissions


def from_solution(lab: str, *edits: tuple[str, str]) -> nbformat.NotebookNode:
    """The solution notebook of ``lab`` with each ``old`` text (which must occur exactly once) replaced."""
    nb = nbformat.read(REPO / "solutions" / f"{lab}.ipynb", as_version=4)
    for old, new in edits:
        hits = [c for c in nb.cells if old in c.source]
        assert len(hits) == 1 and hits[0].source.count(old) == 1, f"edit target not unique in {lab}: {old!r}"
        hits[0].source = hits[0].source.replace(old, new)
    return nb


def untouched(lab: str) -> nbformat.NotebookNode:
    return nbformat.read(REPO / "labs" / f"{lab}.ipynb", as_version=4)


@dataclass
class Batch:
    rows: dict[str, GradeRow]
    gradebook: Path
    out: Path

    def earned(self, learner: str) -> dict[str, float]:
        return {o.check_id: o.earned for o in self.rows[learner].outcomes}

    def message(self, learner: str, check_id: str) -> str:
        return next(o.message for o in self.rows[learner].outcomes if o.check_id == check_id)

    def feedback(self, learner: str) -> str:
        return (self.out / "feedback" / f"{learner}.md").read_text(encoding="utf-8")


def grade(cluster, root: Path, lab: str, submissions: dict[str, nbformat.NotebookNode], out_name: str = "out",
          **options) -> Batch:
    subs = root / "submissions"
    if not subs.exists():
        for learner, nb in submissions.items():
            subs.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, subs / f"{learner}.ipynb")
    out = root / out_name
    result = grader.grade_submissions(subs, lab, out, hidden=HIDDEN, cluster=cluster, progress=False, **options)
    return Batch({r.learner: r for r in result.rows}, result.gradebook, out)


def assert_untouched_scores_zero(batch: Batch, learner: str = "bob") -> None:
    row = batch.rows[learner]
    assert row.total == 0, {o.check_id: o.earned for o in row.outcomes}
    for o in row.outcomes:
        assert o.message.strip(), f"{o.check_id} gives no feedback"


def gpu_stack_state(kube: api.Client, node_name: str = "gpu-node-1") -> dict:
    """What a lab that reconfigures the GPU stack must leave as it found it."""
    node = kube.get("Node", node_name)
    labels = node["metadata"]["labels"]
    return {"policy": kube.get("ClusterPolicy", "cluster-policy")["spec"],
            "configmaps": sorted(cm["metadata"]["name"] for cm in kube.list("ConfigMap", "gpu-operator")),
            "resources": {k: v for k, v in node["status"]["allocatable"].items()
                          if k.startswith("nvidia.com/") and v != "0"},
            "labels": {k: labels.get(k) for k in ("nvidia.com/mig.config", "nvidia.com/mig.config.state",
                                                  "nvidia.com/device-plugin.config", "nvidia.com/mig.strategy",
                                                  "nvidia.com/gpu.replicas", "nvidia.com/gpu.product")}}


def assert_no_grading_leftovers(kube: api.Client) -> None:
    """Grading namespaces are gone (or going); per-submission ClusterRoles and bindings are deleted."""
    for ns in kube.list("Namespace", label_selector="gpulab.io/grading=true"):
        assert ns.get("status", {}).get("phase") == "Terminating", ns["metadata"]["name"]
    for kind in ("ClusterRole", "ClusterRoleBinding"):
        names = [o["metadata"]["name"] for o in kube.list(kind, label_selector="gpulab.io/grading=true")]
        assert names in ([], ["gpulab:grading:read-nodes"]), names
