"""The package's layers: imports only point down, and no package's modules import each other in a circle.

The contracts live in pyproject.toml (``[tool.importlinter]``) and are checked
by import-linter, which sees imports inside functions too, and (the contracts
do not exclude them) imports under ``if TYPE_CHECKING:``. The second test
shows the contracts are not toothless: the same two contract types fail on a
small package with an upward import hidden in a function, a circle of two
siblings through an import in a function, and one through a type-only import.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def lint(config: Path, cwd: Path, pythonpath: Path) -> subprocess.CompletedProcess:
    code = ("import sys; from importlinter.cli import lint_imports; "
            f"sys.exit(lint_imports(config_filename={str(config)!r}, no_cache=True, no_logo=True))")
    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_gpulab_imports_only_point_down_and_have_no_cycles() -> None:
    result = lint(REPO / "pyproject.toml", REPO, REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 2 kept, 0 broken." in result.stdout
    # Type-only imports count: no module hides half of a circle behind TYPE_CHECKING.
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert config.get("exclude_type_checking_imports", False) is False


def test_the_contracts_catch_an_upward_import_in_a_function_and_cycles(tmp_path: Path) -> None:
    pkg = tmp_path / "layered"
    (pkg / "low").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "top.py": "from layered.low import a\n",
        "low/__init__.py": "",
        # An upward import, only inside a function: still an import.
        "low/a.py": "def later():\n    from layered import top\n    return top\n",
        # Two siblings that import each other.
        "low/b.py": "from layered.low import c\n",
        "low/c.py": "def later():\n    from layered.low import b\n    return b\n",
        # Two more, the circle closed by an import for type hints only.
        "low/d.py": "from layered.low import e\n",
        "low/e.py": ("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from layered.low import d\n\n\n"
                     "def f(x: 'd.Thing') -> None:\n    pass\n"),
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    config = tmp_path / "contracts.toml"
    config.write_text(textwrap.dedent("""
        [tool.importlinter]
        root_package = "layered"

        [[tool.importlinter.contracts]]
        name = "layers"
        type = "layers"
        layers = ["top", "low"]
        containers = ["layered"]

        [[tool.importlinter.contracts]]
        name = "cycles"
        type = "acyclic_siblings"
        ancestors = ["layered.**"]
    """))
    result = lint(config, tmp_path, tmp_path)
    assert result.returncode == 1
    assert "Contracts: 0 kept, 2 broken." in result.stdout, result.stdout
    assert "layered.low.a -> layered.top" in result.stdout
    cycles = result.stdout.split("No cycles are allowed in layered.low.")[1]
    assert "It could be made acyclic by removing 2 dependencies" in cycles, result.stdout
    assert (".b -> .c" in cycles or ".c -> .b" in cycles) and (".d -> .e" in cycles or ".e -> .d" in cycles)
