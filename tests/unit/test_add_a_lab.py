"""DEVELOPMENT.md's "A lab", done literally in a temporary copy of the checkout.

The copy holds solutions/, labs/ and tests/fixtures/hidden/; ``paths.repo_root`` points at it
(what ``gpulab labs generate`` / ``labs check`` use) and the package ``gpulab.grading.labs``
also looks in the copy's gpulab/grading/labs/ (where a new ``lab_NN.py`` is written), so the new
lab goes through exactly what a real one does. A minimal lab — one answer region, one recorded
value, one check — then passes the same structural rules as the shipped labs
(``gpulab.grading.labrules.lab_problems``), and breaking any one rule gives a message that says it.
"""

from __future__ import annotations

import importlib
import shutil
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest
from click.testing import CliRunner
from grading_support import code, markdown, notebook, write
from gpulab.grading.labrules import LAB_NAME, lab_names, lab_problems, naming_problems
from test_grading_labs import REPO

import gpulab.grading.labs as labs_package
from gpulab import cli, paths
from gpulab.grading.checks import lab_module_name
from gpulab.grading.labsource import check_drift

#: Step 1: the next free number and a slug.
NUMBER = f"{max(int(LAB_NAME.match(n)['number']) for n in lab_names(REPO / 'solutions')) + 1:02d}"
LAB = f"{NUMBER}-gpu-count"
MODULE = lab_module_name(LAB)


def solution_cells(answer: bool = True, cleanup_tag: bool = True, extra_parameter: str = "") -> list:
    """Step 2: the full notebook, answers marked, values recorded, cleanup cell last."""
    answer_cell = ("gpu_count = None\n# BEGIN SOLUTION\n"
                   'gpu_count = int(kubectl("get nodes -l nvidia.com/gpu.present=true -o name").count("node/"))\n'
                   "# END SOLUTION\n" if answer else "gpu_count = 1\n") + 'record("gpu_count", gpu_count)'
    return [
        markdown(f"# 实验 {NUMBER} · 数一数 GPU 节点\n\n用 `kubectl` 数出集群里有几台 GPU 节点。"),
        code("# parameters —— 评分器会替换这两个值，请不要修改\n"
             f'namespace = "lab-{NUMBER}"\nresults_path = ""' + extra_parameter, tags=["parameters"]),
        code("from gpulab.grading.labkit import *\n\nlab = begin(namespace)"),
        markdown("**任务 1**：数出带 `nvidia.com/gpu.present=true` 标签的节点，记录为 `gpu_count`。"),
        code(answer_cell),
        markdown("## 清理（只在手动运行时执行）"),
        code('kubectl(["delete", "namespace", namespace, "--wait=false"])',
             tags=["skip-execution"] if cleanup_tag else None),
    ]


def check_module(lab_attr: str = LAB, reads: str = "gpu_count") -> str:
    """Step 3: the lab's checks, reading only what the notebook records."""
    return textwrap.dedent(f'''\
        """Checks for ``labs/{LAB}.ipynb``: how many GPU nodes the cluster has."""

        from gpulab.grading.checks import Context, check, dig, failed, passed, quantity_int

        LAB = {lab_attr!r}


        @check("gpu-count", points=2, title="数对了 GPU 节点")
        def gpu_count(ctx: Context):
            nodes = ctx.objects("Node")
            actual = sum(1 for n in nodes if quantity_int(dig(n, "status", "capacity", "nvidia.com/gpu")))
            if ctx.value({reads!r}) == actual:
                return passed()
            return failed("数字和集群里上报 nvidia.com/gpu 的节点数不一样：看看节点的标签和 capacity。")
        ''')


HIDDEN_MODULE = textwrap.dedent(f'''\
    """Hidden check for lab {NUMBER}: the count is an int, not a string."""

    from gpulab.grading.checks import check, failed, passed

    LAB = "{LAB}"


    @check("gpu-count-is-int", points=1, title="gpu_count 是整数")
    def gpu_count_is_int(ctx):
        return passed() if isinstance(ctx.value("gpu_count", None), int) else failed("not an int")
    ''')


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """An empty checkout whose gpulab/grading/labs/ the package also searches."""
    root = tmp_path / "repo"
    for d in ("solutions", "labs", "tests/fixtures/hidden", "gpulab/grading/labs"):
        (root / d).mkdir(parents=True)
    monkeypatch.setattr(paths, "repo_root", lambda: root)
    monkeypatch.setattr(labs_package, "__path__", [*labs_package.__path__, str(root / "gpulab" / "grading" / "labs")])
    sys.modules.pop(MODULE, None)
    yield root
    sys.modules.pop(MODULE, None)
    importlib.invalidate_caches()


def add_lab(root: Path, *, cells: list | None = None, module: str | None = None, hidden: bool = True) -> None:
    """Steps 2-5 of DEVELOPMENT.md's "A lab", in ``root``."""
    write(notebook(cells or solution_cells(), parameters=None), root / "solutions" / f"{LAB}.ipynb")
    if module is not None:
        (root / "gpulab" / "grading" / "labs" / f"lab_{NUMBER}.py").write_text(module, encoding="utf-8")
    if hidden:
        (root / "tests" / "fixtures" / "hidden" / f"lab_{NUMBER}_hidden.py").write_text(HIDDEN_MODULE)
    importlib.invalidate_caches()
    generated = CliRunner().invoke(cli.main, ["labs", "generate"])  # step 5: `make labs`
    assert generated.exit_code == 0, generated.output


def test_a_new_minimal_lab_passes_the_same_rules_as_the_shipped_ones(checkout):
    # A copy of the checkout's labs, then the new one next to them.
    for d in ("solutions", "labs"):
        for f in (REPO / d).glob("*.ipynb"):
            shutil.copy(f, checkout / d / f.name)
    for f in (REPO / "tests" / "fixtures" / "hidden").glob("*.py"):
        shutil.copy(f, checkout / "tests" / "fixtures" / "hidden" / f.name)
    add_lab(checkout, module=check_module())

    names = lab_names(checkout / "solutions")
    assert LAB in names and len(names) == len(lab_names(REPO / "solutions")) + 1
    assert naming_problems(names) == []
    for lab in names:
        assert lab_problems(lab, checkout) == [], lab
    assert check_drift(checkout / "solutions", checkout / "labs") == []
    checked = CliRunner().invoke(cli.main, ["labs", "check"])
    assert checked.exit_code == 0 and f"({len(names)} labs)" in checked.output
    generated = nbformat.read(checkout / "labs" / f"{LAB}.ipynb", as_version=4)
    assert "kubectl(\"get nodes" not in nbformat.writes(generated)  # the answer is gone from the lab


@pytest.mark.parametrize(("change", "rule"), [
    ({"cells": solution_cells(cleanup_tag=False)}, "the last cell must be the cleanup cell, tagged 'skip-execution'"),
    ({"cells": solution_cells(answer=False)}, "no answer region"),
    ({"cells": solution_cells(extra_parameter="\nreplicas = 2")}, "the parameters cell assigns"),
    ({"module": check_module(reads="gpu_total")}, "checks read values the notebook never records: ['gpu_total']"),
    ({"module": check_module(lab_attr="gpu-count")}, f"expected LAB = '{LAB}'"),
    ({"module": None}, f"needs a check module gpulab/grading/labs/lab_{NUMBER}.py"),
    ({"hidden": False}, f"no example hidden check; add tests/fixtures/hidden/lab_{NUMBER}_hidden.py"),
])
def test_each_broken_rule_says_what_the_rule_is(checkout, change, rule):
    add_lab(checkout, **{"module": check_module(), **change})
    problems = lab_problems(LAB, checkout)
    assert len(problems) == 1 and rule in problems[0], problems


def test_lab_names_must_be_numbered_once():
    problems = naming_problems(["01-a", "1-b", "01-c", "02-Bad_Name"])
    assert len(problems) == 3
    assert "solutions/1-b.ipynb: a lab file is named NN-<slug>.ipynb" in problems[0]
    assert "solutions/01-c.ipynb: number 01 is already lab 01-a" in problems[1]
    assert "02-Bad_Name" in problems[2]
