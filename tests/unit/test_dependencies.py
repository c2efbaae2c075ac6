"""Declared dependencies against imports, and the lock (constraints.txt) against both and environment.yml.

- Every third-party module gpulab/ imports (at any depth: inside functions too) comes from
  a distribution in pyproject.toml's ``dependencies``; tests/, bench/ and tools/ may also
  use the ``dev`` extra. Module names map to distributions with
  ``importlib.metadata.packages_distributions()``; the standard library is
  ``sys.stdlib_module_names``.
- constraints.txt (tools/lock.py) pins every declared distribution within its specifier,
  grpcio and grpcio-tools alike, and matches this environment.
- environment.yml (repo2docker, Binder) agrees with constraints.txt: the Python it was
  locked with, and any pin.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
import tomllib
from functools import cache
from importlib import metadata
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
RUNTIME_TREES = ("gpulab",)
DEV_TREES = ("tests", "bench", "tools")
# Imports in gpulab/ that only a developer's command runs, each from the dev extra.
DEV_ONLY_IN_GPULAB = {
    # `python -m gpulab.fakegpu.deviceplugin.generate` regenerates the committed gRPC stubs.
    ("gpulab/fakegpu/deviceplugin/generate.py", "grpc_tools"),
}


# -- scanning imports --------------------------------------------------------------------------


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, dotted module name) of every absolute import that runs, at any depth.

    Relative imports (the package's own modules) and ``if TYPE_CHECKING:`` blocks are skipped.
    """
    out: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source, filename))
    return out


def test_the_scanner_sees_nested_imports_and_skips_type_checking_and_relative_ones() -> None:
    source = (
        "import os, yaml.constructor\n"
        "from typing import TYPE_CHECKING\n"
        "from . import sibling\n"
        "if TYPE_CHECKING:\n"
        "    import numpy\n"
        "else:\n"
        "    import click\n"
        "def f():\n"
        "    from grpc_tools import protoc\n"
        "    class C:\n"
        "        import psutil\n"
    )
    assert imports_of(source) == [(1, "os"), (1, "yaml.constructor"), (2, "typing"), (7, "click"),
                                  (9, "grpc_tools"), (11, "psutil")]


def _python_files(tree: str) -> list[Path]:
    return sorted(p for p in (REPO / tree).rglob("*.py") if "__pycache__" not in p.parts)


def _local_modules(trees: tuple[str, ...]) -> set[str]:
    """Modules of the repository itself: gpulab, and tests' helpers (pytest puts their folders on sys.path)."""
    names = {"gpulab"}
    for tree in trees:
        for path in (REPO / tree).rglob("*"):
            if "__pycache__" in path.parts:
                continue
            if path.suffix == ".py":
                names.add(path.stem)
            elif path.is_dir():
                names.add(path.name)
    return names


@cache
def _packages() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def distributions_of(module: str) -> set[str]:
    """Canonical names of the installed distributions that provide ``module`` (several for a namespace)."""
    top = module.split(".")[0]
    dists = {canonicalize_name(d) for d in _packages().get(top, [])}
    if len(dists) > 1 and "." in module:
        # A namespace package (google.*): the distribution whose files hold this module.
        prefix = "/".join(module.split(".")[:2])
        narrowed = {d for d in dists if any(str(f).startswith((prefix + "/", prefix + ".py"))
                                            for f in metadata.distribution(d).files or [])}
        dists = narrowed or dists
    return dists


def _declared(*groups: str) -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = set()
    for group in groups:
        reqs = project["dependencies"] if group == "runtime" else project["optional-dependencies"][group]
        names |= {canonicalize_name(Requirement(r).name) for r in reqs}
    return names


def undeclared_imports(trees: tuple[str, ...], declared: set[str], local: set[str],
                       allowed: set[tuple[str, str]] = frozenset()) -> list[str]:
    problems = []
    for tree in trees:
        for path in _python_files(tree):
            rel = path.relative_to(REPO).as_posix()
            for line, module in imports_of(path.read_text(), rel):
                top = module.split(".")[0]
                if top in sys.stdlib_module_names or top in local or (rel, top) in allowed:
                    continue
                dists = distributions_of(module)
                if not dists:
                    problems.append(f"{rel}:{line}: import {module}: no installed distribution provides it")
                elif not dists & declared:
                    problems.append(f"{rel}:{line}: import {module} comes from {', '.join(sorted(dists))}, "
                                    "which pyproject.toml does not declare")
    return problems


def test_everything_gpulab_imports_is_a_runtime_dependency() -> None:
    problems = undeclared_imports(RUNTIME_TREES, _declared("runtime"), {"gpulab"}, DEV_ONLY_IN_GPULAB)
    assert not problems, "add these to pyproject.toml's [project] dependencies:\n" + "\n".join(problems)


def test_gpulab_imports_dev_tools_only_where_listed_and_from_the_dev_extra() -> None:
    for rel, module in DEV_ONLY_IN_GPULAB:
        found = [m for _, m in imports_of((REPO / rel).read_text(), rel) if m.split(".")[0] == module]
        assert found, f"{rel} no longer imports {module}: drop it from DEV_ONLY_IN_GPULAB"
        assert distributions_of(module) & _declared("dev"), f"{module} ({rel}) must come from the dev extra"


def test_everything_tests_bench_and_tools_import_is_declared() -> None:
    problems = undeclared_imports(DEV_TREES, _declared("runtime", "dev"), _local_modules(DEV_TREES))
    assert not problems, "add these to pyproject.toml's dev extra:\n" + "\n".join(problems)


# -- the lock ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lock() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpulab_tools_lock", REPO / "tools" / "lock.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def constraints_text() -> str:
    return (REPO / "constraints.txt").read_text()


def test_constraints_are_exact_sorted_pins_with_their_header(lock, constraints_text) -> None:
    pins = lock.parse(constraints_text)  # raises on anything but name==version
    assert pins, "constraints.txt pins nothing"
    body = [ln for ln in constraints_text.splitlines() if ln and not ln.startswith("#")]
    assert body == sorted(body, key=lambda ln: canonicalize_name(ln.split("==")[0])), "constraints.txt is not sorted"
    assert not set(pins) & lock.EXCLUDED, f"constraints.txt must not pin {sorted(set(pins) & lock.EXCLUDED)}"
    assert lock.locked_python(constraints_text), "constraints.txt's header lacks its 'Locked with Python' line"
    assert "tools/lock.py" in constraints_text.split("\n\n")[0]


def test_constraints_pin_every_declared_dependency_within_its_specifier(lock, constraints_text) -> None:
    pins = lock.parse(constraints_text)
    for req in lock.declared():
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        assert name in pins, f"pyproject.toml declares {req}; constraints.txt does not pin it (run tools/lock.py)"
        assert req.specifier.contains(Version(pins[name]), prereleases=True), (
            f"constraints.txt pins {name}=={pins[name]}, outside pyproject.toml's {req}")


def test_constraints_pin_grpcio_and_grpcio_tools_alike(lock, constraints_text) -> None:
    pins = lock.parse(constraints_text)
    assert pins["grpcio"] == pins["grpcio-tools"], "grpcio and grpcio-tools must have the same version"
    assert lock.check_same_versions(pins) == []
    # The committed stubs require the grpcio they were generated for.
    stub = (REPO / "gpulab" / "fakegpu" / "deviceplugin" / "api_pb2_grpc.py").read_text()
    generated = re.search(r"^GRPC_GENERATED_VERSION = '([^']+)'", stub, re.M)[1]
    assert Version(pins["grpcio"]) >= Version(generated)


def test_constraints_match_this_environment(lock, constraints_text) -> None:
    python, _ = lock.locked_python(constraints_text)
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if here != python:
        pytest.skip(f"constraints.txt was locked with Python {python}; this is {here} (markers may differ)")
    try:
        current = lock.current()
    except lock.LockError as e:
        pytest.fail(f"this environment cannot be locked: {e}")
    assert current == constraints_text, (
        "constraints.txt and this environment disagree: `.venv/bin/python tools/lock.py --check` shows how; "
        "run tools/lock.py after a deliberate change, or pip install -c constraints.txt -e '.[dev]'")


# -- environment.yml against the lock ------------------------------------------------------------


def _environment() -> tuple[list[str], list[str]]:
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    pip = [r for d in env["dependencies"] if isinstance(d, dict) for r in d.get("pip", [])]
    return conda, pip


def test_environment_yml_uses_the_python_of_the_lock(lock, constraints_text) -> None:
    conda, _ = _environment()
    python = [d for d in conda if re.match(r"python\b", d)]
    assert len(python) == 1, f"environment.yml must pin python once: {python}"
    locked, _ = lock.locked_python(constraints_text)
    assert re.fullmatch(r"python\s*==?\s*" + re.escape(locked) + r"(\.\*)?", python[0].strip()), (
        f"environment.yml's {python[0]}, but constraints.txt was locked with Python {locked}")


def test_environment_yml_pins_agree_with_the_lock(lock, constraints_text) -> None:
    pins = lock.parse(constraints_text)
    conda, pip = _environment()
    problems = []
    for line in pip:
        line = line.strip()
        option = re.fullmatch(r"(-c|--constraint)[\s=]+(\S+)", line)
        if option:
            if (REPO / option[2]).resolve() != REPO / "constraints.txt":
                problems.append(f"pip {line}: the lock is constraints.txt at the repository root")
            continue
        if line.startswith("-"):  # -e . (test_repo2docker.py checks it)
            continue
        req = Requirement(line)
        name = canonicalize_name(req.name)
        if name not in pins:
            problems.append(f"pip {line}: constraints.txt does not pin {name} (add it to pyproject.toml, then lock)")
        elif not req.specifier.contains(Version(pins[name]), prereleases=True):
            problems.append(f"pip {line}: constraints.txt pins {name}=={pins[name]}")
    for dep in conda:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(.*)", dep.strip())
        name, spec = canonicalize_name(m[1]), m[2].replace(" ", "")
        if name in pins and spec.lstrip("=") != pins[name]:
            problems.append(f"conda {dep}: constraints.txt pins {name}=={pins[name]}")
    assert not problems, "environment.yml disagrees with constraints.txt:\n" + "\n".join(problems)


def test_every_pin_installs_on_the_oldest_supported_python(lock, constraints_text) -> None:
    # Debian's python3.11 is 3.11.2: a pin that needs a later patch release breaks `make lab` there.
    assert lock.oldest_python() == "3.11.0"
    assert lock.check_supported_python(lock.parse(constraints_text)) == []


def test_a_pin_needing_a_newer_python_is_refused(lock, monkeypatch) -> None:
    class Meta(dict):
        pass

    monkeypatch.setattr(lock.metadata, "metadata", lambda name: Meta({"Requires-Python": ">=3.11.5"}))
    [complaint] = lock.check_supported_python({"soupsieve": "4.1.4"})
    assert "soupsieve==4.1.4 requires Python >=3.11.5" in complaint and "3.11.0" in complaint
