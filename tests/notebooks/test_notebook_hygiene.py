"""The chapter notebooks' conventions, checked without a cluster.

- every notebook starts with ``setup(...)``, resets what it changed and ends
  with its section's quiz;
- manifests are real files: every path a notebook names exists, every file in
  a lesson's manifest folder is used by that lesson, and no YAML is pasted
  into code cells;
- committed notebooks carry the outputs of one clean top-to-bottom run
  (``make notebooks``): every code cell executed, in order, without errors;
  all notebooks by the same run, in order, on a cluster made fresh for it
  (``metadata.gpulab``, written by ``tools/run_notebooks.py``);
- outputs name only the namespaces the notebook created (its ``setup()``
  namespace and ``extra_namespaces``, Namespaces in the manifests it applies,
  ``kubectl create namespace``) and the cluster's own;
- learners' Python uses the official kubernetes client, never ``lab.kube``.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import nbformat
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]-*.ipynb"))
MANIFEST_PATH = re.compile(r"""["'](manifests/[^"'\s]+\.ya?ml)["']""")
CHECK, IGNORE = "nbval-check-output", "nbval-ignore-output"


def code_cells(path: Path) -> list:
    nb = nbformat.read(path, as_version=4)
    return [c for c in nb.cells if c.cell_type == "code"]


@pytest.fixture(params=NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def notebook(request) -> Path:
    return request.param


def test_there_are_chapter_notebooks():
    stems = {p.stem for p in NOTEBOOKS}
    assert {"00-orientation", "03-scheduling", "05-training", "06-inference"} <= stems


def test_notebook_is_valid_and_uses_the_python3_kernel(notebook):
    nb = nbformat.read(notebook, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"


def test_every_notebook_stores_the_kernelspec_make_install_installs():
    """JupyterLab writes the running kernel's spec into a notebook when it connects: a lesson, lab or solution
    storing another display name opens marked modified (tests/browser/test_first_hour_browser.py opens one)."""
    from jupyter_client.kernelspec import get_kernel_spec

    spec = get_kernel_spec("python3")
    installed = {"name": "python3", "display_name": spec.display_name, "language": spec.language}
    assert installed["display_name"] == "Python 3 (gpulab)", f"not make install's kernelspec: {spec.resource_dir}"
    stored = {f"{path.parent.name}/{path.name}": dict(nbformat.read(path, as_version=4).metadata.get("kernelspec", {}))
              for folder in ("notebooks", "labs", "solutions") for path in sorted((REPO / folder).glob("*.ipynb"))}
    wrong = {name: spec for name, spec in stored.items() if spec != installed}
    assert len(stored) >= 28 and not wrong, f"kernelspec should be {installed}: {wrong}"


def test_first_code_cell_sets_up_the_lesson_by_its_own_stem(notebook):
    first = code_cells(notebook)[0].source
    assert "from gpulab.notebook import" in first
    assert f'setup("{notebook.stem}"' in first


def test_lesson_resets_the_cluster_and_ends_with_its_quiz(notebook):
    cells = code_cells(notebook)
    assert any(c.source.strip() == "lab.reset()" for c in cells), "no `lab.reset()` cell"
    number = notebook.stem.split("-", 1)[0]
    last = cells[-1].source.strip()
    if number == "00":  # the orientation shows how a quiz looks; it has no bank of its own
        assert any("show_quiz(" in c.source for c in cells)
    else:
        assert last == f'show_quiz("{number}")', f"last code cell is {last!r}"


def test_manifests_named_by_a_notebook_exist(notebook):
    for cell in code_cells(notebook):
        for rel in MANIFEST_PATH.findall(cell.source):
            assert (REPO / rel).is_file(), f"{notebook.name} names {rel}, which does not exist"


def test_every_manifest_of_a_lesson_is_used_by_it(notebook):
    folder = REPO / "manifests" / notebook.stem
    named = {rel for c in code_cells(notebook) for rel in MANIFEST_PATH.findall(c.source)}
    for path in sorted(folder.glob("*.y*ml")):
        rel = str(path.relative_to(REPO))
        assert rel in named, f"{rel} is not used by {notebook.name}"


def test_no_yaml_is_pasted_into_code_cells(notebook):
    for cell in code_cells(notebook):
        assert not re.search(r"^\s*apiVersion:", cell.source, re.MULTILINE), \
            f"{notebook.name} cell {cell.get('id')} has inline YAML; put it in manifests/{notebook.stem}/"


def test_each_code_cell_is_either_checked_or_ignored_by_nbval(notebook):
    for cell in code_cells(notebook):
        tags = set(cell.metadata.get("tags", []))
        assert len(tags & {CHECK, IGNORE}) == 1, f"cell {cell.get('id')} of {notebook.name}: tags {sorted(tags)}"


def test_committed_outputs_come_from_one_clean_run(notebook):
    cells = code_cells(notebook)
    counts = [c.execution_count for c in cells]
    assert counts == list(range(1, len(cells) + 1)), \
        f"{notebook.name} was not executed top to bottom in one run (`make notebooks`): {counts}"
    for cell in cells:
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert not errors, f"{notebook.name} cell {cell.get('id')} was saved with an error: {errors[0].get('evalue')}"


# -- one clean run, on one fresh cluster; only the lesson's own namespaces; the official client ------------
#
# `make notebooks` (tools/run_notebooks.py without names) runs 00..09 in order on a cluster made fresh for
# the run and records the run in each notebook's metadata. The checks below are functions, so that each is
# shown to bite on small synthetic notebooks as well as applied to the committed ones.

SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease", "default"})
# Where a namespace is named in output text: kubectl's `namespace/x`, JSON and YAML fields, `-n x` in an
# echoed command (`$ kubectl -n x ...`), the lesson library's zh-CN lines (删除了命名空间 x, 默认命名空间：x),
# and any name of the lesson-NN[-suffix] form gpulab gives lesson namespaces.
NAMESPACE_IN_OUTPUT = (
    re.compile(r"\bnamespaces?/([a-z0-9][a-z0-9-]*)"),
    re.compile(r"""["']namespace["']\s*:\s*["']([a-z0-9][a-z0-9-]*)["']"""),
    re.compile(r"^\s*namespace:\s*([a-z0-9][a-z0-9-]*)\s*$", re.MULTILINE),
    re.compile(r"(?:^|\s)(?:-n|--namespace(?:=|\s+))\s*([a-z][a-z0-9-]*)"),
    re.compile(r"命名空间\s*[：:]?\s*([a-z0-9][a-z0-9-]*)"),
    re.compile(r"\b(lesson-\d\d(?:-[a-z0-9]+)*)\b"),
)
CREATE_NAMESPACE = re.compile(r"\bcreate\s+(?:namespace|ns)\s+([a-z0-9][a-z0-9-]*)")
PRIVATE_CLIENT = re.compile(r"\blab\.kube\b|\bcurrent\(\)\.kube\b|\bgpulab\.kube\b|\bapi\.Client\(")


def gpulab_run(nb) -> dict:
    return dict(nb.metadata.get("gpulab") or {})


def one_clean_run(notebooks: list[tuple[str, object]]) -> list[str]:
    """Problems with the claim that ``notebooks`` (in order) were executed by one run on one fresh cluster."""
    problems = []
    runs = {}
    for name, nb in notebooks:
        meta = gpulab_run(nb)
        if not meta.get("run"):
            problems.append(f"{name}: no record of the run that produced its outputs (metadata.gpulab.run)")
            continue
        runs[name] = meta
        if not meta["run"].get("fresh_cluster"):
            problems.append(f"{name}: executed on a cluster that was not made fresh for the run")
    distinct = {json.dumps(m["run"], sort_keys=True) for m in runs.values()}
    if len(distinct) > 1:
        problems.append("outputs come from different clusters or runs: "
                        + "; ".join(f"{n}: cluster {m['run'].get('cluster')} run {m['run'].get('started')}"
                                    for n, m in runs.items()))
    elif runs:
        positions = [m.get("position") for m in runs.values()]
        finished = [m.get("finished") or "" for m in runs.values()]
        if len(runs) == len(notebooks) and positions != list(range(len(notebooks))):
            problems.append(f"the run did not execute the notebooks in order, each once: positions {positions}")
        if finished != sorted(finished):
            problems.append(f"the notebooks did not finish in their order: {finished}")
    return problems


def _setup_call(source: str):
    from IPython.core.inputtransformer2 import TransformerManager

    tree = ast.parse(TransformerManager().transform_cell(source))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setup":
            return node
    return None


def _namespaces_in_manifest(path: Path) -> set[str]:
    try:
        docs = list(yaml.safe_load_all(path.read_text()))
    except (OSError, yaml.YAMLError):
        return set()
    return {d["metadata"]["name"] for d in docs if isinstance(d, dict) and d.get("kind") == "Namespace"}


def cluster_namespaces(repo: Path = REPO) -> set[str]:
    """Namespaces the cluster itself creates: the Namespace manifests of its own folders (not lessons', not labs')."""
    from gpulab.kube.names import OPERATOR_NAMESPACE

    found = set(SYSTEM_NAMESPACES) | {OPERATOR_NAMESPACE}
    for folder in (repo / "manifests").iterdir():
        if folder.is_dir() and not folder.name[:1].isdigit() and folder.name != "labs":
            for path in folder.rglob("*.y*ml"):
                found |= _namespaces_in_manifest(path)
    return found


def lesson_namespaces(nb, stem: str, repo: Path = REPO) -> set[str]:
    """What the notebook creates itself: setup()'s namespace and extra_namespaces, Namespace objects of the
    manifests it names, ``kubectl create namespace`` in its cells."""
    cells = [c for c in nb.cells if c.cell_type == "code"]
    call = _setup_call(cells[0].source) if cells else None
    assert call is not None, f"{stem}: its first code cell does not call setup(...)"
    kwargs = {k.arg: k.value for k in call.keywords}
    own = {ast.literal_eval(kwargs["namespace"]) if "namespace" in kwargs else f"lesson-{stem.split('-', 1)[0]}"}
    if "extra_namespaces" in kwargs:
        own |= set(ast.literal_eval(kwargs["extra_namespaces"]))
    for cell in cells:
        for rel in MANIFEST_PATH.findall(cell.source):
            own |= _namespaces_in_manifest(repo / rel)
        own |= set(CREATE_NAMESPACE.findall(cell.source))
    return own


def _output_texts(nb):
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                yield cell.get("id"), out.get("text", "")
            elif out.get("output_type") == "error":
                yield cell.get("id"), f"{out.get('ename')}: {out.get('evalue')}"
            else:
                for mime, value in (out.get("data") or {}).items():
                    if mime.startswith("text/") or mime.endswith("json"):
                        text = value if isinstance(value, str) else json.dumps(value)
                        yield cell.get("id"), re.sub(r"<[^>]+>", " ", text) if mime == "text/html" else text


def namespaces_named(nb) -> dict[str, set[str]]:
    """Every namespace an output names, with the cells that name it (NAMESPACE columns of tables too)."""
    named: dict[str, set[str]] = {}
    for cell_id, text in _output_texts(nb):
        found = {m for pattern in NAMESPACE_IN_OUTPUT for m in pattern.findall(text)}
        column = None
        for line in text.splitlines():
            if re.match(r"\s*NAMESPACE\s{2,}\S", line):
                column = True
            elif not line.strip():
                column = None
            elif column:
                found.add(line.split()[0])
        for ns in found:
            named.setdefault(ns, set()).add(str(cell_id))
    return named


def foreign_namespaces(nb, stem: str, repo: Path = REPO) -> dict[str, set[str]]:
    allowed = cluster_namespaces(repo) | lesson_namespaces(nb, stem, repo)
    return {ns: cells for ns, cells in namespaces_named(nb).items() if ns not in allowed}


def private_client_uses(nb) -> list[str]:
    return [f"cell {c.get('id')}: {line.strip()}" for c in nb.cells if c.cell_type == "code"
            for line in c.source.splitlines() if PRIVATE_CLIENT.search(line)]


REAL_RUN_HINT = ("regenerate the committed outputs with one clean run: `make notebooks` "
                 "(tools/run_notebooks.py without names: all notebooks, in order, on a fresh cluster)")


def test_committed_notebooks_come_from_one_run_on_one_fresh_cluster():
    problems = one_clean_run([(p.stem, nbformat.read(p, as_version=4)) for p in NOTEBOOKS])
    assert not problems, "\n".join(problems) + "\n" + REAL_RUN_HINT


def test_outputs_name_only_namespaces_the_notebook_created(notebook):
    foreign = foreign_namespaces(nbformat.read(notebook, as_version=4), notebook.stem)
    assert not foreign, (f"{notebook.name}'s outputs name namespaces it did not create: "
                         + ", ".join(f"{ns} (cells {', '.join(sorted(c))})" for ns, c in sorted(foreign.items()))
                         + "\n" + REAL_RUN_HINT)


def test_notebook_uses_the_official_client_not_lab_kube(notebook):
    uses = private_client_uses(nbformat.read(notebook, as_version=4))
    assert not uses, (f"{notebook.name} uses gpulab's private API client; use the official kubernetes client "
                      "(client.CoreV1Api() ...):\n" + "\n".join(uses))


# Table headers with no Chinese in them: what a Kubernetes or CUDA learner reads as is.
HEADER_TERMS = {"POD", "Pod", "GPU", "CPU", "OOM", "enabled", "failureThreshold", "periodSeconds"}


def english_headers(nb) -> dict[str, set[str]]:
    """Column headers of the tables in ``nb``'s outputs that have no Chinese and are not HEADER_TERMS."""
    found: dict[str, set[str]] = {}
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            markup = "".join(out.get("data", {}).get("text/html", ""))
            for th in re.findall(r"<th[^>]*>(.*?)</th>", markup, re.S):
                text = re.sub(r"<[^>]+>", " ", th).strip()
                if text and not re.search("[\u4e00-\u9fff]", text) and text not in HEADER_TERMS:
                    found.setdefault(text, set()).add(str(i))
    return found


def test_table_headers_are_chinese(notebook):
    found = english_headers(nbformat.read(notebook, as_version=4))
    assert not found, (f"{notebook.name} shows tables with English-only column headers (give the key a Chinese "
                       "name in gpulab/notebook/table.py HEADINGS, or use a Chinese key): "
                       + ", ".join(f"{k!r} (cells {', '.join(sorted(c))})" for k, c in sorted(found.items())))


def python_booleans(nb) -> list[str]:
    """Cells whose outputs show a learner Python's True/False: a bare result, or a table cell."""
    found = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            bare = "".join(data.get("text/plain", "")).strip() in ("True", "False")
            in_table = re.search(r"<td[^>]*>(True|False)</td>", "".join(data.get("text/html", "")))
            if (out.get("output_type") == "execute_result" and bare) or in_table:
                found.append(str(i))
    return found


def test_outputs_show_no_python_booleans(notebook):
    found = python_booleans(nbformat.read(notebook, as_version=4))
    assert not found, (f"{notebook.name} shows a learner Python's True/False in cells {', '.join(found)}: a Table "
                       "shows a bool as 是/否; a cell that ends in a call whose result is not the point ends in ';'")


OBJECT_REPR = re.compile(r"<[\w.]+ (object )?at 0x[0-9a-f]+>")


def object_reprs(nb) -> list[str]:
    """Code cells whose outputs show a Python object's default repr (``<pkg.Thing at 0x7f…>``) or end in a bare
    Python value (a str, list, dict or tuple repr: what a call returned, not what the lesson shows)."""
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for out in cell.get("outputs", []):
            text = "".join(out.get("text", "")) + "".join((out.get("data") or {}).get("text/plain", ""))
            bare = out.get("output_type") == "execute_result" and text.strip()[:1] in ("'", '"', "[", "{", "(")
            if (OBJECT_REPR.search(text) and "IPython.core.display" not in text) or bare:
                found.append(str(i))
                break
    return found


def test_outputs_show_no_object_reprs(notebook):
    found = object_reprs(nbformat.read(notebook, as_version=4))
    assert not found, (f"{notebook.name} shows a Python repr (<... at 0x...>, '', [...], {{...}}) in cells {', '.join(found)}: "
                       "end the cell in what the learner should see, or in ';'")


#: A path of the machine that ran the notebook, different on every run: a temporary directory.
TEMPORARY_PATH = re.compile(r"(?<![\w.$~-])/(?:tmp|var/tmp|var/folders|private/var/folders)/\S*")


def temporary_paths(nb) -> list[str]:
    """``cell: path`` for each code cell whose outputs (or echoed commands) show a temporary path."""
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        text = "".join("".join(out.get("text", "")) + "".join((out.get("data") or {}).get("text/plain", ""))
                       for out in cell.get("outputs", []))
        match = TEMPORARY_PATH.search(text)
        if match:
            found.append(f"{i}: {match.group(0)}")
    return found


def test_outputs_show_no_temporary_paths(notebook):
    found = temporary_paths(nbformat.read(notebook, as_version=4))
    assert not found, (f"{notebook.name} shows a temporary path (different on every run, meaningless to the "
                       f"learner) in cells {'; '.join(found)}: name it by a variable ($GPULAB_HOME, $NODE_ROOT) or "
                       "a relative path")


# The same checks on synthetic notebooks: each bites, and passes on a good one.

def _synthetic(setup_source: str, *outputs: str, sources: tuple[str, ...] = (), run: dict | None = None):
    nb = nbformat.v4.new_notebook()
    cells = [nbformat.v4.new_code_cell(setup_source)]
    cells += [nbformat.v4.new_code_cell(s) for s in sources]
    cells.append(nbformat.v4.new_code_cell("sh('kubectl get pods -A')"))
    cells[-1].outputs = [nbformat.v4.new_output("stream", name="stdout", text=t) for t in outputs]
    nb.cells = cells
    if run is not None:
        nb.metadata["gpulab"] = run
    return nb


def _run(position: int, cluster: str = "0b6f-uid", started: str = "2026-12-03T22:00:00+00:00",
         fresh: bool = True) -> dict:
    return {"run": {"cluster": cluster, "started": started, "fresh_cluster": fresh}, "position": position,
            "finished": f"2026-12-03T22:{10 + position:02d}:00+00:00", "seconds": 30.0}


def test_one_clean_run_passes_for_one_fresh_run_in_order():
    nbs = [(f"0{i}-x", _synthetic('lab = setup("0%d-x")' % i, run=_run(i))) for i in range(3)]
    assert one_clean_run(nbs) == []


@pytest.mark.parametrize("change, problem", [
    (lambda runs: runs[1].update(run={**runs[1]["run"], "cluster": "another-cluster"}), "different clusters"),
    (lambda runs: runs[2].update(run={**runs[2]["run"], "started": "2026-12-04T08:00:00+00:00"}), "different"),
    (lambda runs: [r["run"].update(fresh_cluster=False) for r in runs], "not made fresh"),
    (lambda runs: runs[0].clear(), "no record of the run"),
    (lambda runs: (runs[0].update(position=1), runs[1].update(position=0)), "in order"),
])
def test_one_clean_run_bites(change, problem):
    runs = [_run(i) for i in range(3)]
    change(runs)
    nbs = [(f"0{i}-x", _synthetic('lab = setup("0%d-x")' % i, run=r)) for i, r in enumerate(runs)]
    problems = one_clean_run(nbs)
    assert any(problem in p for p in problems), problems


def test_foreign_namespaces_derives_what_the_notebook_created(tmp_path):
    (tmp_path / "manifests" / "addons" / "monitoring").mkdir(parents=True)
    (tmp_path / "manifests" / "addons" / "monitoring" / "ns.yaml").write_text(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: monitoring\n")
    (tmp_path / "manifests" / "05-x").mkdir()
    (tmp_path / "manifests" / "05-x" / "teams.yaml").write_text(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team-blue\n---\n"
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  namespace: team-blue\n")
    good = _synthetic(
        'from gpulab.notebook import *\n\nlab = setup("05-x",\n            extra_namespaces=["lesson-05-team-a"])',
        "$ kubectl -n gpu-operator get pods\n",
        "NAMESPACE         NAME    READY\nlesson-05         train   1/1\nlesson-05-team-a  eval    1/1\n"
        "monitoring        prometheus 1/1\nteam-blue         p       1/1\nqa                q       1/1\n\nfoo bar\n",
        "namespace/qa created\n↩ 删除了命名空间 lesson-05\n",
        '{"metadata": {"namespace": "kube-system"}}\n',
        sources=("apply('manifests/05-x/teams.yaml')", "!kubectl create namespace qa"))
    assert foreign_namespaces(good, "05-x", tmp_path) == {}
    bad = _synthetic('lab = setup("05-x")',
                     "NAMESPACE   NAME\nlesson-03   leftover\n",
                     "lesson-04/gpu-pod-a   gpu-node-1\n",
                     "$ kubectl -n team-red get pods\n",
                     "namespace: lesson-09\n")
    assert set(foreign_namespaces(bad, "05-x", tmp_path)) == {"lesson-03", "lesson-04", "team-red", "lesson-09"}


def test_private_client_uses_are_found():
    bad = _synthetic('lab = setup("05-x")', sources=(
        'node = lab.kube.get("Node", "gpu-node-1")', "path = lab.kubeconfig",
        "from gpulab.kube import api"))
    assert [u.split(": ", 1)[1] for u in private_client_uses(bad)] == [
        'node = lab.kube.get("Node", "gpu-node-1")', "from gpulab.kube import api"]
    good = _synthetic('lab = setup("05-x")', sources=(
        "from kubernetes import client, config\nconfig.load_kube_config()\ncore = client.CoreV1Api()",
        "path = lab.kubeconfig"))
    assert private_client_uses(good) == []


def test_english_table_headers_are_found():
    nb = _synthetic("lab = setup('00-x')", sources=())
    nb.cells[0].outputs = [nbformat.v4.new_output("execute_result", data={
        "text/plain": "x", "text/html": "<table><thead><tr><th>节点<br><code>NODE</code></th><th><code>POD</code></th>"
                                        "<th>LAST LOG LINE</th></tr></thead></table>"}, execution_count=1)]
    assert english_headers(nb) == {"LAST LOG LINE": {"0"}}


def test_python_booleans_are_found():
    nb = _synthetic("lab = setup('00-x')", sources=("wait_for(ok)", "t", "print(True)"))
    nb.cells[1].outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "True"}, execution_count=1)]
    nb.cells[2].outputs = [nbformat.v4.new_output("execute_result", data={
        "text/plain": "x", "text/html": "<table><tr><td style=\"text-align:left\">False</td></tr></table>"},
        execution_count=2)]
    nb.cells[3].outputs = [nbformat.v4.new_output("stream", name="stdout", text="True\n")]
    assert python_booleans(nb) == ["1", "2"]


def test_object_reprs_are_found():
    nb = _synthetic("lab = setup('00-x')", sources=("t = watch_pods()", "t.plot()", "wait_pods('app=x')", "sh('x')"))
    nb.cells[1].outputs = [nbformat.v4.new_output("execute_result", execution_count=1,
                                                  data={"text/plain": "<gpulab.notebook.timeline.Timeline at 0x7f68>"})]
    nb.cells[2].outputs = [nbformat.v4.new_output("display_data",
                                                  data={"text/plain": "<IPython.core.display.Markdown object>"})]
    nb.cells[3].outputs = [nbformat.v4.new_output("execute_result", execution_count=3,
                                                  data={"text/plain": "[{'metadata': {'name': 'x'}}]"})]
    nb.cells[4].outputs = [nbformat.v4.new_output("stream", name="stdout", text="['printed on purpose']\n")]
    assert object_reprs(nb) == ["1", "3"]


def test_temporary_paths_are_found():
    nb = _synthetic("lab = setup('00-x')", sources=("sh('ls -l $NODE_ROOT/var/lib/kubelet/device-plugins/')",
                                                    "sh('gpulab up')", "sh('cat /etc/os-release')"))
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="srwxr-xr-x 1 u u 0 kubelet.sock\n")]
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", name="stdout",
                                                  text="集群已启动；kubeconfig：/tmp/gpulab-03-fupq87e7/cluster/kubeconfig\n")]
    nb.cells[3].outputs = [nbformat.v4.new_output("stream", name="stdout", text="see $GPULAB_HOME/tmp/x, ./tmp/y\n")]
    assert temporary_paths(nb) == ["2: /tmp/gpulab-03-fupq87e7/cluster/kubeconfig"]
