"""Control-plane binaries: found in ``GPULAB_BIN_DIR`` or built once with ``go build``.

Only the Go module proxy is reachable on the machines gpulab targets, so the
real Kubernetes (control plane and kube-proxy), etcd, KWOK, metrics-server, CoreDNS and CNI
plugin programs are compiled from their published Go modules. Each build uses a small wrapper
module kept in ``gobuild/<name>/`` (its ``go.mod`` replaces every Kubernetes staging module with
its published version, and its ``go.sum`` pins every hash; CoreDNS's also holds the ``main.go``
that picks its plugins), runs in a cache directory outside the repository, and installs into
``$GPULAB_CACHE/bin/<name>-<version>/``. A later run finds the stamp file and builds nothing.

Every program has a name that is also its path in a bin directory: ``kube-proxy``, or
``cni/bridge`` for a CNI plugin, so that the four plugins share one directory, the CNI_PATH
(``Binaries.cni_bin_dir``), both in the build cache and in ``GPULAB_BIN_DIR``.

With ``GPULAB_BIN_DIR`` set nothing is built and Go is never asked for: the
directory's binaries are checked instead (each one present and executable,
and the version it reports within the pinned major.minor; see ``VERSION_RULES``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import mmap
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from .. import paths, versions
from .._fsutil import hold_lock
from ..i18n import _
from ..runtime.images import AGNHOST_FILES

GOBUILD = Path(__file__).resolve().parent / "gobuild"

Progress = Callable[[str], None]


class BinaryError(RuntimeError):
    """A binary could not be found or built; the message says what to do."""


@dataclasses.dataclass(frozen=True)
class Build:
    """One wrapper module and the programs it produces."""

    name: str
    version: str
    # (package path, output path within bin_dir: "kube-proxy", "cni/bridge")
    programs: tuple[tuple[str, str], ...]
    ldflags: str = ""
    # The wrapper module in gobuild/ when not the build's own name (agnhost's is kubernetes's).
    module: str = ""
    # False: no cluster needs it to start (the program of an image only tests, upstream's e2e suite or an
    # add-on run); `gpulab up` leaves it to `gpulab build`, so a first `make lab` does not wait for it.
    for_up: bool = True
    # Go build tags (`go build -tags`), e.g. Prometheus' service-discovery selection.
    tags: str = ""

    @property
    def bin_dir(self) -> Path:
        return paths.cache() / "bin" / f"{self.name}-{self.version}"

    def module_dir(self) -> Path:
        return GOBUILD / (self.module or self.name)


# The CNI plugins live in this subdirectory of a bin dir (built or GPULAB_BIN_DIR): the CNI_PATH.
CNI_DIR = "cni"
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")


def _kube_ldflags() -> str:
    # The same variables Kubernetes' own hack/lib/version.sh stamps, so that
    # `kubectl version` and the /version endpoint report v1.37.2.
    v = versions.KUBERNETES
    major, minor = v.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={v}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate=1970-01-01T00:00:00Z",
        ]
    return " ".join(flags)


def _prometheus_version_ldflags(version: str, date: str) -> str:
    """What Prometheus' promu stamps into github.com/prometheus/common/version (``--version`` prints it)."""
    pkg = "github.com/prometheus/common/version"
    return (f"-s -w -X {pkg}.Version={version} -X {pkg}.Branch=HEAD -X {pkg}.BuildUser=gpulab "
            f"-X {pkg}.BuildDate={date}")


BUILDS = (
    Build(
        "kubernetes",
        versions.KUBERNETES,
        (
            ("k8s.io/kubernetes/cmd/kube-apiserver", "kube-apiserver"),
            ("k8s.io/kubernetes/cmd/kube-controller-manager", "kube-controller-manager"),
            ("k8s.io/kubernetes/cmd/kube-scheduler", "kube-scheduler"),
            ("k8s.io/kubernetes/cmd/kube-proxy", "kube-proxy"),
        ),
        _kube_ldflags(),
    ),
    Build("etcd", versions.ETCD, (("go.etcd.io/etcd/server/v3", "etcd"),), "-s -w"),
    Build(
        "kwok",
        versions.KWOK,
        (("sigs.k8s.io/kwok/cmd/kwok", "kwok"), ("sigs.k8s.io/kwok/cmd/kwokctl", "kwokctl")),
        "-s -w",
    ),
    # metrics-server stamps its version into client-go's version package (its Makefile's
    # VERSION_LDFLAGS); `metrics-server --version` prints it.
    Build(
        "metrics-server",
        versions.METRICS_SERVER,
        (("sigs.k8s.io/metrics-server/cmd/metrics-server", "metrics-server"),),
        f"-s -w -X k8s.io/client-go/pkg/version.gitVersion={versions.METRICS_SERVER} "
        "-X k8s.io/client-go/pkg/version.buildDate=1970-01-01T00:00:00Z",
    ),
    # The CNI plugins, into bin_dir/cni/: one directory, the CNI_PATH. BuildVersion is what
    # the project's build_linux.sh stamps; each plugin prints it when run without CNI_COMMAND.
    Build(
        "cni-plugins",
        versions.CNI_PLUGINS,
        tuple((f"github.com/containernetworking/plugins/plugins/{kind}/{name}", f"{CNI_DIR}/{name}")
              for kind, name in (("main", "bridge"), ("ipam", "host-local"), ("main", "loopback"),
                                 ("meta", "portmap"))),
        "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion="
        + versions.CNI_PLUGINS,
    ),
    # CoreDNS: the wrapper module's own main package (main.go imports the plugins). Its version
    # is a constant of coremain (`coredns -version` prints "CoreDNS-1.14.7"); GitCommit is not
    # stamped: the module proxy does not tell the tag's commit.
    Build("coredns", versions.COREDNS, (("gpulab.local/gobuild/coredns", "coredns"),), "-s -w"),
    # agnhost, the program of Kubernetes' e2e test image, from the same k8s.io/kubernetes module (a tool
    # of its wrapper module), stamped with its own version as its Makefile does (`agnhost --version`).
    Build(
        "agnhost",
        versions.AGNHOST,
        (("k8s.io/kubernetes/test/images/agnhost", "agnhost"),),
        f"-s -w -X main.Version={versions.AGNHOST.lstrip('v')}",
        module="kubernetes",
        for_up=False,
    ),
    # The monitoring add-on (`gpulab addon install monitoring`); no cluster needs them to start.
    # Prometheus without its web UI (the UI's assets need an npm build; the HTTP API is what lessons use)
    # and with only Kubernetes service discovery: the tags upstream's Makefile offers to shrink the build.
    Build(
        "prometheus",
        versions.PROMETHEUS,
        (("github.com/prometheus/prometheus/cmd/prometheus", "prometheus"),),
        _prometheus_version_ldflags(versions.PROMETHEUS.lstrip("v"), "19700101-00:00:00"),
        for_up=False,
        tags="remove_all_sd,enable_kubernetes_sd",
    ),
    Build(
        "prometheus-adapter",
        versions.PROMETHEUS_ADAPTER,
        (("sigs.k8s.io/prometheus-adapter/cmd/adapter", "prometheus-adapter"),),
        "-s -w",
        for_up=False,
    ),
    # kube-state-metrics stamps its version as Prometheus does, and the client-go it was built with.
    Build(
        "kube-state-metrics",
        versions.KUBE_STATE_METRICS,
        (("k8s.io/kube-state-metrics/v2", "kube-state-metrics"),),
        _prometheus_version_ldflags(versions.KUBE_STATE_METRICS, "1970-01-01T00:00:00Z")
        + " -X k8s.io/kube-state-metrics/v2/pkg/app.ClientGoVersion=v0.36.3",
        for_up=False,
    ),
)

REQUIRED = (
    "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "metrics-server",
    "kube-proxy", "coredns", *(f"{CNI_DIR}/{p}" for p in CNI_PLUGINS), "agnhost",
    "prometheus", "prometheus-adapter", "kube-state-metrics",
)
# KWOK's CRDs for per-pod logs, exec and port-forward targets; copied out of the kwok module
# at build time because the kwok controller does not install them itself.
KWOK_CRDS = ("kwok.x-k8s.io_clusterlogs.yaml", "kwok.x-k8s.io_clusterexecs.yaml",
             "kwok.x-k8s.io_clusterportforwards.yaml")


@dataclasses.dataclass(frozen=True)
class Binaries:
    # Program name ("kube-proxy", "cni/bridge") -> its path.
    paths: dict[str, Path]
    kwok_crds: tuple[Path, ...]
    # The directory holding the CNI plugins bridge, host-local, loopback and portmap: the CNI_PATH.
    cni_bin_dir: Path
    # The version of each binary: the pinned one for builds, what it reported for GPULAB_BIN_DIR.
    versions: dict[str, str] = dataclasses.field(default_factory=dict)

    def __getitem__(self, name: str) -> Path:
        return self.paths[name]


@dataclasses.dataclass(frozen=True)
class VersionRule:
    """How a ready binary in GPULAB_BIN_DIR tells its version, and which version it must be.

    The major.minor version must be the pinned one (flags, API versions, KWOK's
    stage format and etcd's data format change between minor versions: an error);
    another patch release of it is used with a warning.
    """

    args: tuple[str, ...]
    # What precedes the version in the output, e.g. "Kubernetes" in "Kubernetes v1.37.2".
    prefix: str
    wanted: str
    prints_v: bool = True  # "v1.37.2" rather than "1.37.2"
    glued: bool = False  # the version follows the prefix directly, as in "CoreDNS-1.14.7"
    # Environment variables set for the run (the CNI plugins tell their version only when
    # CNI_COMMAND is empty).
    env: tuple[tuple[str, str], ...] = ()
    # The version is read from the binary's own bytes (a module path Go recorded), not from running it.
    embedded: bool = False

    @property
    def pattern(self) -> str:
        if self.embedded:  # "...@v0.12.0/pkg/...": the version ends where the path goes on
            return re.escape(self.prefix) + r"(v?\d+\.\d+\.\d+)(?![\w.-])"
        if not self.prefix:  # the version alone, on a line of its own
            return r"(?m)^\s*(v?\d+\.\d+\.\d+\S*)\s*$"
        return re.escape(self.prefix) + ("" if self.glued else r"\s+") + r"(v?\d+\.\d+\.\d+\S*)"

    def sample(self) -> str:
        version = self.wanted if self.prints_v else self.wanted.lstrip('v')
        if not self.prefix:
            return version
        return f"{self.prefix}{'' if self.glued else ' '}{version}"

    def allowed(self) -> str:
        major, minor, _patch = _parse_version(self.wanted) or (0, 0, 0)
        return f"v{major}.{minor}.x"


VERSION_RULES = {
    # `kube-apiserver --version` prints "Kubernetes v1.37.2".
    "kube-apiserver": VersionRule(("--version",), "Kubernetes", versions.KUBERNETES),
    "kube-controller-manager": VersionRule(("--version",), "Kubernetes", versions.KUBERNETES),
    "kube-scheduler": VersionRule(("--version",), "Kubernetes", versions.KUBERNETES),
    # "etcd Version: 3.6.16", then Git SHA, Go version and OS/Arch lines.
    "etcd": VersionRule(("--version",), "etcd Version:", versions.ETCD, prints_v=False),
    # "kwok version v0.8.0 go1.26.8 (linux/amd64)".
    "kwok": VersionRule(("--version",), "kwok version", versions.KWOK),
    # "v0.8.0" and nothing else.
    "metrics-server": VersionRule(("--version",), "", versions.METRICS_SERVER),
    "kube-proxy": VersionRule(("--version",), "Kubernetes", versions.KUBERNETES),
    # "CoreDNS-1.14.7", then "linux/amd64, go1.26.8, " (OS/Arch, Go version, commit).
    "coredns": VersionRule(("-version",), "CoreDNS-", versions.COREDNS, prints_v=False, glued=True),
    # "app version 2.66.1" (cobra's version line; the root command is called "app").
    "agnhost": VersionRule(("--version",), "app version", versions.AGNHOST, prints_v=False),
    # "prometheus, version 3.16.0 (branch: HEAD, revision: ...)", then build user, date, Go version.
    "prometheus": VersionRule(("--version",), "prometheus, version", versions.PROMETHEUS, prints_v=False),
    # "kube-state-metrics, version v2.20.0 (branch: ...)", from its `version` subcommand.
    "kube-state-metrics": VersionRule(("version",), "kube-state-metrics, version", versions.KUBE_STATE_METRICS),
    # prometheus-adapter has no version flag; Go records the module it was built from in the binary
    # (the paths of its sources: "sigs.k8s.io/prometheus-adapter@v0.12.0/..."), which is read instead.
    "prometheus-adapter": VersionRule((), "sigs.k8s.io/prometheus-adapter@", versions.PROMETHEUS_ADAPTER,
                                      glued=True, embedded=True),
    # Run with no arguments and CNI_COMMAND empty, a plugin prints "CNI bridge plugin v1.9.1"
    # and "CNI protocol versions supported: 0.1.0, ..." (on stderr) and exits 0.
    **{f"{CNI_DIR}/{p}": VersionRule((), f"CNI {p} plugin", versions.CNI_PLUGINS, env=(("CNI_COMMAND", ""),))
       for p in CNI_PLUGINS},
}
VERSION_TIMEOUT_S = 30.0


def _module_files(build: Build) -> list[Path]:
    """Every regular file of the wrapper module (go.mod, go.sum, CoreDNS's main.go), sorted by name."""
    return sorted((p for p in build.module_dir().iterdir() if p.is_file()), key=lambda p: p.name)


def _stamp(build: Build) -> str:
    # The files' contents (not their names): for a module of go.mod and go.sum alone this is
    # the stamp of earlier gpulab versions, so their builds stay current.
    h = hashlib.sha256()
    for f in _module_files(build):
        h.update(f.read_bytes())
    h.update(build.ldflags.encode())
    if build.tags:  # (a build without tags keeps the stamp it had before builds had tags)
        h.update(b"tags:" + build.tags.encode())
    return h.hexdigest()


def _is_built(build: Build) -> bool:
    stamp = build.bin_dir / ".stamp"
    if not stamp.is_file():
        return False
    try:
        data = json.loads(stamp.read_text())
    except ValueError:
        return False
    return data.get("stamp") == _stamp(build) and all(
        (build.bin_dir / out).is_file() for _package, out in build.programs
    ) and (build.name != "kwok" or all((build.bin_dir / "kwok-crds" / crd).is_file() for crd in KWOK_CRDS)
           ) and (build.name != "agnhost" or all((build.bin_dir / f).is_file() for f in AGNHOST_FILES))


def _go() -> str:
    go = shutil.which("go")
    if not go:
        raise BinaryError(
            "Go toolchain not found on PATH. gpulab builds kube-apiserver, "
            "kube-controller-manager, kube-scheduler, kube-proxy, etcd, kwok, metrics-server, coredns, "
            "agnhost, prometheus, prometheus-adapter, kube-state-metrics and the CNI plugins "
            + ", ".join(CNI_PLUGINS) + " from the Go module "
            f"proxy and needs Go >= {'.'.join(map(str, versions.GO_MIN))}. Install Go, "
            "or set GPULAB_BIN_DIR to a directory holding ready binaries named "
            + ", ".join(REQUIRED)
            + " (plus kwok-crds/ with "
            + ", ".join(KWOK_CRDS)
            + "), at versions "
            + ", ".join(f"{n} {VERSION_RULES[n].allowed()}" for n in REQUIRED)
            + "."
        )
    out = subprocess.run([go, "version"], capture_output=True, text=True).stdout
    m = re.search(r"go(\d+)\.(\d+)", out)
    if m and (int(m[1]), int(m[2])) < versions.GO_MIN:
        raise BinaryError(
            f"{out.strip()} is too old: Kubernetes {versions.KUBERNETES} needs Go >= "
            f"{'.'.join(map(str, versions.GO_MIN))}. Install a newer Go or set GPULAB_BIN_DIR."
        )
    return go


def _run_go(go: str, args: list[str], cwd: Path, env: dict[str, str], what: str) -> str:
    proc = subprocess.run([go, *args], cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise _go_failure(what, proc.stderr, download=args[:2] == ["mod", "download"])
    return proc.stdout


def _go_failure(what: str, stderr: str, download: bool = False) -> BinaryError:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    tail = "\n  ".join(lines[-12:])
    hint = ""
    if download or re.search(r"(dial tcp|proxy|404 Not Found|410 Gone|no such host|unknown revision|"
                             r"reading .*: .*(refused|timeout))", stderr):
        hint = (
            "\nA Go module could not be downloaded from the module proxy "
            f"(GOPROXY={os.environ.get('GOPROXY', 'default')}). Check the proxy, or set "
            "GPULAB_BIN_DIR to a directory with ready binaries."
        )
    return BinaryError(f"{what} failed:\n  {tail}{hint}")


def _build(build: Build, go: str, progress: Progress) -> None:
    work = paths.cache() / "build" / build.name
    work.mkdir(parents=True, exist_ok=True)
    files = _module_files(build)  # go.mod, go.sum and, for CoreDNS, its main.go
    for old in work.iterdir():  # a file the module no longer has
        if old.is_file() and old.name not in {f.name for f in files}:
            old.unlink()
    for f in files:
        shutil.copyfile(f, work / f.name)
    env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=mod")
    pkgs = [p for p, _out in build.programs]
    progress(f"{build.name} {build.version}: downloading modules")
    _run_go(go, ["mod", "download"], work, env, f"go mod download for {build.name}")
    deps = _run_go(go, ["list", "-deps", *(["-tags", build.tags] if build.tags else []), *pkgs], work, env,
                   f"go list for {build.name}")
    total = len(deps.split())
    tmp = build.bin_dir.with_name(build.bin_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    started = time.monotonic()
    for pkg, out in build.programs:
        (tmp / out).parent.mkdir(parents=True, exist_ok=True)  # cni/bridge
        cmd = [go, "build", "-v", "-trimpath", *(["-tags", build.tags] if build.tags else []),
               "-ldflags", build.ldflags, "-o", str(tmp / out), pkg]
        proc = subprocess.Popen(cmd, cwd=work, env=env, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        seen = 0
        errors: list[str] = []
        last = 0.0
        for line in proc.stderr:
            line = line.rstrip()
            # `go build -v` prints each package as it compiles; anything with a
            # space or colon is a diagnostic, not a package path.
            if line and " " not in line and ":" not in line:
                seen += 1
                now = time.monotonic()
                if now - last > 5:
                    last = now
                    progress(
                        f"{build.name}: compiling {out} ({min(seen, total)}/{total} packages, "
                        f"{int(now - started)} s)"
                    )
            else:
                errors.append(line)
        if proc.wait() != 0:
            raise _go_failure(f"go build {pkg}", "\n".join(errors))
        progress(f"{build.name}: built {out} ({int(time.monotonic() - started)} s)")
    if build.name == "kwok":
        mod_dir = _run_go(
            go, ["list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kwok"], work, env, "go list -m kwok"
        ).strip()
        (tmp / "kwok-crds").mkdir()
        for crd in KWOK_CRDS:
            shutil.copyfile(Path(mod_dir) / "kustomize" / "crd" / "bases" / crd, tmp / "kwok-crds" / crd)
    if build.name == "agnhost":
        # The image's files beside its program (porter's TLS certificate and key), as its Dockerfile adds them.
        mod_dir = _run_go(go, ["list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes"], work, env,
                          "go list -m k8s.io/kubernetes").strip()
        for f in AGNHOST_FILES:
            (tmp / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(mod_dir) / "test" / "images" / "agnhost" / f, tmp / f)
    (tmp / ".stamp").write_text(json.dumps({"stamp": _stamp(build), "version": build.version}))
    shutil.rmtree(build.bin_dir, ignore_errors=True)
    tmp.rename(build.bin_dir)


def _parse_version(text: str) -> tuple[int, int, int] | None:
    m = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)\S*", text.strip())
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def _version_of(path: Path, rule: VersionRule) -> tuple[str | None, str | None]:
    """(the version ``path`` reports, None) or (None, why it could not be read)."""
    if rule.embedded:
        try:
            with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                m = re.search(rule.pattern.encode(), data)
                found = m[1].decode() if m else None
        except (OSError, ValueError) as e:
            return None, f"{path} could not be read: {e}"
        if found:
            return found, None
        return None, f"{path} names no module version (expected \"{rule.sample()}\" in the binary)"
    cmd = "`" + " ".join([*(f"{k}={v}" for k, v in rule.env), str(path), *rule.args]) + "`"
    env = dict(os.environ, **dict(rule.env)) if rule.env else None
    try:
        proc = subprocess.run([str(path), *rule.args], capture_output=True, text=True, env=env,
                              stdin=subprocess.DEVNULL, timeout=VERSION_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, f"{cmd} did not finish within {VERSION_TIMEOUT_S:g} s"
    except OSError as e:  # e.g. "Exec format error": built for another architecture
        return None, f"{cmd} could not run: {e.strerror or e}"
    out = (proc.stdout or "") + (proc.stderr or "")
    m = re.search(rule.pattern, out)
    if proc.returncode == 0 and m:
        return m[1], None
    lines = [ln.strip() for ln in out.strip().splitlines() if ln.strip()]
    said = f": {lines[0][:200]}" if lines else " and printed nothing"
    if proc.returncode != 0:
        return None, f"{cmd} failed (exit {proc.returncode}){said}"
    return None, f"{cmd} printed no version (expected a line like \"{rule.sample()}\"){said}"


def check_bin_dir(bin_dir: Path) -> tuple[Binaries, list[str]]:
    """Check a GPULAB_BIN_DIR: every binary present, executable and of the pinned version.

    Returns the binaries and the warnings (another patch release than the pinned
    one); raises :class:`BinaryError` listing every problem at once.
    """
    where = f"GPULAB_BIN_DIR={bin_dir}"
    need = (
        f"It must hold executables named {', '.join(REQUIRED)} (the CNI plugins in {CNI_DIR}/, "
        f"the CNI_PATH) and the files kwok-crds/{{{','.join(KWOK_CRDS)}}}, at versions "
        + ", ".join(f"{n} {VERSION_RULES[n].allowed()}" for n in REQUIRED)
        + " (pinned: " + ", ".join(f"{n} {VERSION_RULES[n].wanted}" for n in REQUIRED)
        + "; unset GPULAB_BIN_DIR to build them from the Go module proxy instead)."
    )
    if not bin_dir.is_dir():
        what = "is not a directory" if bin_dir.exists() else "does not exist"
        raise BinaryError(f"{where}: {bin_dir} {what}. {need}")
    problem: dict[str, str] = {}  # binary -> what is wrong with it
    runnable: list[str] = []
    for name in REQUIRED:
        path = bin_dir / name
        if not path.exists():
            problem[name] = f"missing ({path})"
        elif not path.is_file():
            problem[name] = f"{path} is not a file"
        elif not os.access(path, os.X_OK):
            mode = stat.S_IMODE(path.stat().st_mode)
            problem[name] = f"{path} is not executable (mode {mode:04o}; `chmod +x` it)"
        else:
            runnable.append(name)
    with ThreadPoolExecutor(max_workers=len(REQUIRED)) as pool:
        read = dict(zip(runnable, pool.map(lambda n: _version_of(bin_dir / n, VERSION_RULES[n]), runnable)))
    found: dict[str, str] = {}
    warnings: list[str] = []
    for name in REQUIRED:
        if name not in read:
            continue
        rule, path = VERSION_RULES[name], bin_dir / name
        version, why = read[name]
        if version is None:
            problem[name] = f"{why}; wanted version {rule.wanted}"
            continue
        have, want = _parse_version(version), _parse_version(rule.wanted)
        assert have is not None and want is not None
        if have[:2] != want[:2]:
            problem[name] = f"{path} is version {version}, wanted {rule.wanted} (allowed: {rule.allowed()})"
            continue
        found[name] = version
        if have != want or version.lstrip("v") != rule.wanted.lstrip("v"):
            warnings.append(f"warning: {where}: {name} is version {version}, pinned {rule.wanted}; "
                            f"using it (same minor version; the course is tested with {rule.wanted})")
    problems = [f"{name}: {problem[name]}" for name in REQUIRED if name in problem]
    crds = tuple(bin_dir / "kwok-crds" / c for c in KWOK_CRDS)
    problems += [f"kwok-crds/{crd.name}: missing ({crd}; it is in the kwok module, kustomize/crd/bases/)"
                 for crd in crds if not crd.is_file()]
    if problems:
        n = len(problems)
        raise BinaryError(f"{where} is not usable ({n} problem{'s' if n > 1 else ''}):\n"
                          + "\n".join(f"  {p}" for p in problems) + f"\n{need}")
    return Binaries({n: bin_dir / n for n in REQUIRED}, crds, bin_dir / CNI_DIR, found), warnings


def _from_bin_dir(bin_dir: Path, say: Progress) -> Binaries:
    found, warnings = check_bin_dir(bin_dir)
    for w in warnings:
        say(w)
    return found


def ensure(progress: Progress | None = None, for_up: bool = False) -> Binaries:
    """Return the binaries, building whatever is missing (visible progress).

    ``for_up``: build only what a cluster needs to start (see :attr:`Build.for_up`); the paths of the
    others are still given, where `gpulab build` will put them (an image whose program is not there yet
    says so when a pod uses it).
    """
    say = progress or (lambda msg: print(f"gpulab: {msg}", file=sys.stderr, flush=True))
    if os.environ.get("GPULAB_BIN_DIR"):
        # Ready binaries: checked, never built, and Go is not needed.
        return _from_bin_dir(Path(os.environ["GPULAB_BIN_DIR"]).expanduser(), say)
    todo = [b for b in BUILDS if (b.for_up or not for_up) and not _is_built(b)]
    if todo:
        _build_locked(todo, _go(), say)
    found: dict[str, Path] = {}
    built: dict[str, str] = {}
    for b in BUILDS:
        for _package, out in b.programs:
            found[out] = b.bin_dir / out
            built[out] = b.version
    kwok = next(b for b in BUILDS if b.name == "kwok")
    cni = next(b for b in BUILDS if b.name == "cni-plugins")
    return Binaries(found, tuple(kwok.bin_dir / "kwok-crds" / c for c in KWOK_CRDS), cni.bin_dir / CNI_DIR, built)


def pending() -> list[Build]:
    """What `gpulab up` does not wait for and is not built yet (nothing with GPULAB_BIN_DIR)."""
    if os.environ.get("GPULAB_BIN_DIR"):
        return []
    return [b for b in BUILDS if not b.for_up and not _is_built(b)]


def status_of(build: Build) -> bool:
    """Whether ``build`` is built and current in the cache."""
    return _is_built(build)


def ensure_build(build: Build, progress: Progress | None = None) -> Path:
    """Build one optional wrapper module (not in BUILDS, e.g. kind) once; returns its bin dir."""
    say = progress or (lambda msg: print(f"gpulab: {msg}", file=sys.stderr, flush=True))
    if not _is_built(build):
        _build_locked([build], _go(), say)
    return build.bin_dir


def build_lock_path() -> Path:
    return paths.cache() / "build.lock"


def _build_locked(todo: list[Build], go: str, say: Progress, interval: float = 5.0) -> None:
    """Build what ``todo`` still lacks, holding the build lock.

    Two `make` runs on one machine must not build into the same place; the
    second one waits, and says every few seconds whom it waits for (the lock
    file tells which program holds it and what it is compiling).
    """
    purpose = "building " + ", ".join(f"{b.name} {b.version}" for b in todo)
    with hold_lock(build_lock_path(), what="the build lock", purpose=purpose, say=say,
                   interval=interval) as lock:
        for b in todo:
            if _is_built(b):  # the process we waited for built it
                continue
            say(_("building {name} {version} from the Go module proxy (once; later runs reuse it)", name=b.name,
                  version=b.version))
            lock.note(f"building {b.name} {b.version}")

            def progress(msg: str, b: Build = b) -> None:
                say(msg)
                lock.note(f"building {b.name} {b.version}, {msg}")

            _build(b, go, progress)


def status() -> list[dict[str, object]]:
    """Which builds are present (for `gpulab versions`)."""
    if os.environ.get("GPULAB_BIN_DIR"):
        return [{"name": "GPULAB_BIN_DIR", "version": os.environ["GPULAB_BIN_DIR"], "built": True}]
    return [{"name": b.name, "version": b.version, "built": _is_built(b), "dir": str(b.bin_dir)}
            for b in BUILDS]
