"""Does lab generation strip marked answers, keep the contract, and detect drift?"""

from __future__ import annotations

import nbformat
import pytest
from grading_support import code, markdown, notebook, write

from gpulab.grading.labsource import (
    CODE_PLACEHOLDER,
    MARKDOWN_PLACEHOLDER,
    LabSourceError,
    check_drift,
    generate_all,
    generate_lab,
    lab_from_solution,
    notebook_text,
)

SOLUTION_CELLS = [
    markdown("# 实验：训练 Job\n\n在这个实验里你会……"),
    code("import json\n# BEGIN SOLUTION\njob = {'kind': 'Job'}\nprint(json.dumps(job))\n# END SOLUTION\nprint('done')"),
    code("def gpus(pod):\n    # BEGIN SOLUTION RAISE\n    return pod['limits']['nvidia.com/gpu']\n    # END SOLUTION"),
    code("replicas = 4  # SOLUTION\nnamespace_check = True"),
    code("%%bash\n# BEGIN SOLUTION\nkubectl apply -f ../manifests/gpu-train-demo.yaml\n# END SOLUTION"),
    code("### BEGIN SOLUTION NO PROMPT\nsecret_helper = 1\n### END SOLUTION\nvisible = 2"),
    markdown("为什么 Pod 会 Pending？\n\n<!-- BEGIN SOLUTION -->\n因为卡被占满了。\n<!-- END SOLUTION -->"),
    code("assert replicas == 4", tags=["solution-only"]),
]


def _solution(path):
    nb = notebook(SOLUTION_CELLS)
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", text="leaked output\n")]
    nb.cells[2].execution_count = 7
    nb.cells[2].metadata["execution"] = {"iopub.status.busy": "2025-01-01"}
    nb.metadata["papermill"] = {"parameters": {"namespace": "x"}}
    return write(nb, path)


def test_generation_replaces_every_marked_region(tmp_path):
    lab = generate_lab(_solution(tmp_path / "solutions" / "05-train.ipynb"))
    sources = [c.source for c in lab.cells]
    assert sources[0].startswith('namespace = "gpulab-default"')  # parameters cell untouched
    assert sources[2] == f"import json\n{CODE_PLACEHOLDER}\n...\nprint('done')"
    assert sources[3] == f'def gpus(pod):\n    {CODE_PLACEHOLDER}\n    raise NotImplementedError("在这里写你的答案")'
    assert sources[4] == f"replicas = ...  {CODE_PLACEHOLDER}\nnamespace_check = True"
    assert sources[5] == f"%%bash\n{CODE_PLACEHOLDER}"  # no `...` inside a cell magic
    assert sources[6] == "visible = 2"
    assert sources[7] == f"为什么 Pod 会 Pending？\n\n{MARKDOWN_PLACEHOLDER}"
    assert len(lab.cells) == len(SOLUTION_CELLS)  # the solution-only cell is gone (params cell added one)
    text = notebook_text(lab)
    for leaked in ("job = {'kind': 'Job'}", "return pod[", "replicas = 4", "kubectl apply", "secret_helper",
                   "卡被占满了", "leaked output", "assert replicas"):
        assert leaked not in text


def test_generation_keeps_tags_and_strips_run_state(tmp_path):
    lab = generate_lab(_solution(tmp_path / "solutions" / "05-train.ipynb"))
    assert lab.cells[0].metadata["tags"] == ["parameters"]
    code_cells = [c for c in lab.cells if c.cell_type == "code"]
    assert all(c.outputs == [] and c.execution_count is None for c in code_cells)
    assert all("execution" not in c.metadata for c in lab.cells)
    assert "papermill" not in lab.metadata
    assert lab.metadata["gpulab"]["generated_from"] == "solutions/05-train.ipynb"
    nbformat.validate(lab)


def test_generated_lab_is_valid_python(tmp_path):
    lab = generate_lab(_solution(tmp_path / "solutions" / "05-train.ipynb"))
    for cell in lab.cells:
        if cell.cell_type == "code" and not cell.source.startswith("%%"):
            compile(cell.source, "<cell>", "exec")


@pytest.mark.parametrize("source,fragment", [
    ("# BEGIN SOLUTION\nx = 1", "never closed"),
    ("x = 1\n# END SOLUTION", "END SOLUTION without BEGIN"),
    ("# BEGIN SOLUTION\n# BEGIN SOLUTION\n# END SOLUTION", "inside the region opened on line 1"),
    ("# BEGIN SOLUTION LATER\n# END SOLUTION", "unknown BEGIN SOLUTION option"),
])
def test_malformed_markers_name_the_cell_and_line(source, fragment):
    with pytest.raises(LabSourceError, match=fragment) as info:
        lab_from_solution(notebook([source]), "solutions/01-x.ipynb")
    assert "solutions/01-x.ipynb: cell 1" in str(info.value)


def test_a_lab_needs_a_parameters_cell():
    with pytest.raises(LabSourceError, match="parameters"):
        lab_from_solution(notebook(["x = 1"], parameters=None), "s.ipynb")


def test_drift_detection(tmp_path):
    solutions, labs = tmp_path / "solutions", tmp_path / "labs"
    _solution(solutions / "05-train.ipynb")
    write(notebook(["print('hi')  # SOLUTION"]), solutions / "06-serve.ipynb")
    assert {str(d) for d in check_drift(solutions, labs)} == {
        f"05-train.ipynb: missing (run generation to create {labs / '05-train.ipynb'})",
        f"06-serve.ipynb: missing (run generation to create {labs / '06-serve.ipynb'})"}

    written = generate_all(solutions, labs)
    assert [p.name for p in written] == ["05-train.ipynb", "06-serve.ipynb"]
    assert check_drift(solutions, labs) == []
    assert generate_all(solutions, labs) and check_drift(solutions, labs) == []  # idempotent

    edited = nbformat.read(labs / "05-train.ipynb", as_version=4)
    edited.cells[2].source += "\nprint('hand edit')"
    nbformat.write(edited, labs / "05-train.ipynb")
    write(notebook(["x = 1"]), labs / "99-stray.ipynb")
    drift = {d.name: d for d in check_drift(solutions, labs)}
    assert set(drift) == {"05-train.ipynb", "99-stray.ipynb"}
    assert drift["05-train.ipynb"].reason == "differs" and drift["05-train.ipynb"].detail == "cell 2 differs"
    assert drift["99-stray.ipynb"].reason == "orphan"


def test_solution_edit_without_regeneration_is_drift(tmp_path):
    solutions, labs = tmp_path / "solutions", tmp_path / "labs"
    _solution(solutions / "05-train.ipynb")
    generate_all(solutions, labs)
    nb = nbformat.read(solutions / "05-train.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_markdown_cell("新增的说明"))
    nbformat.write(nb, solutions / "05-train.ipynb")
    [drift] = check_drift(solutions, labs)
    assert drift.reason == "differs" and "cells" in drift.detail


def test_invalid_solution_is_reported_not_raised(tmp_path):
    solutions, labs = tmp_path / "solutions", tmp_path / "labs"
    write(notebook(["# BEGIN SOLUTION\nx = 1"]), solutions / "01-bad.ipynb")
    [drift] = check_drift(solutions, labs)
    assert drift.reason == "invalid" and "never closed" in drift.detail
    with pytest.raises(LabSourceError):
        generate_all(solutions, labs)
    assert not labs.exists()  # all-or-nothing: nothing written
