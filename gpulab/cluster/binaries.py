"""Control-plane binaries: found in ``GPULAB_BIN_DIR`` or built once with ``go build``.

Only the Go module proxy is reachable on the machines gpulab targets, so the
real Kubernetes, etcd and KWOK programs are compiled from their published Go
modules. Each build uses a small wrapper module kept in ``gobuild/<name>/``
(its ``go.mod`` replaces every Kubernetes staging module with its published
version, and its ``go.sum`` pins every hash), runs in a cache directory outside
the repository, and installs into ``$GPULAB_CACHE/bin/<name>-<version>/``. A
later run finds the stamp file and builds nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from .. import paths, versions
from .._fsutil import hold_lock

GOBUILD = Path(__file__).resolve().parent / "gobuild"

Progress = Callable[[str], None]


class BinaryError(RuntimeError):
    """A binary could not be found or built; the message says what to do."""


@dataclasses.dataclass(frozen=True)
class Build:
    """One wrapper module and the programs it produces."""

    name: str
    version: str
    # (package path, output file name)
    programs: tuple[tuple[str, str], ...]
    ldflags: str = ""

    @property
    def bin_dir(self) -> Path:
        return paths.cache() / "bin" / f"{self.name}-{self.version}"

    def module_dir(self) -> Path:
        return GOBUILD / self.name


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


BUILDS = (
    Build(
        "kubernetes",
        versions.KUBERNETES,
        (
            ("k8s.io/kubernetes/cmd/kube-apiserver", "kube-apiserver"),
            ("k8s.io/kubernetes/cmd/kube-controller-manager", "kube-controller-manager"),
            ("k8s.io/kubernetes/cmd/kube-scheduler", "kube-scheduler"),
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
)

REQUIRED = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
# KWOK's CRDs for per-pod logs and exec targets; copied out of the kwok module
# at build time because the kwok controller does not install them itself.
KWOK_CRDS = ("kwok.x-k8s.io_clusterlogs.yaml", "kwok.x-k8s.io_clusterexecs.yaml")


@dataclasses.dataclass(frozen=True)
class Binaries:
    paths: dict[str, Path]
    kwok_crds: tuple[Path, ...]

    def __getitem__(self, name: str) -> Path:
        return self.paths[name]


def _stamp(build: Build) -> str:
    h = hashlib.sha256()
    for f in ("go.mod", "go.sum"):
        h.update((build.module_dir() / f).read_bytes())
    h.update(build.ldflags.encode())
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
        (build.bin_dir / out).is_file() for _, out in build.programs
    )


def _go() -> str:
    go = shutil.which("go")
    if not go:
        raise BinaryError(
            "Go toolchain not found on PATH. gpulab builds kube-apiserver, "
            "kube-controller-manager, kube-scheduler, etcd and kwok from the Go module "
            f"proxy and needs Go >= {'.'.join(map(str, versions.GO_MIN))}. Install Go, "
            "or set GPULAB_BIN_DIR to a directory holding ready binaries named "
            + ", ".join(REQUIRED)
            + " (plus kwok-crds/ with "
            + ", ".join(KWOK_CRDS)
            + ")."
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
    for f in ("go.mod", "go.sum"):
        shutil.copyfile(build.module_dir() / f, work / f)
    env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=mod")
    pkgs = [p for p, _ in build.programs]
    progress(f"{build.name} {build.version}: downloading modules")
    _run_go(go, ["mod", "download"], work, env, f"go mod download for {build.name}")
    deps = _run_go(go, ["list", "-deps", *pkgs], work, env, f"go list for {build.name}")
    total = len(deps.split())
    tmp = build.bin_dir.with_name(build.bin_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    started = time.monotonic()
    for pkg, out in build.programs:
        cmd = [go, "build", "-v", "-trimpath", "-ldflags", build.ldflags, "-o", str(tmp / out), pkg]
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
    (tmp / ".stamp").write_text(json.dumps({"stamp": _stamp(build), "version": build.version}))
    shutil.rmtree(build.bin_dir, ignore_errors=True)
    tmp.rename(build.bin_dir)


def _from_bin_dir(bin_dir: Path) -> Binaries:
    missing = [n for n in REQUIRED if not os.access(bin_dir / n, os.X_OK)]
    crds = tuple(bin_dir / "kwok-crds" / c for c in KWOK_CRDS)
    missing += [str(c.relative_to(bin_dir)) for c in crds if not c.is_file()]
    if missing:
        raise BinaryError(
            f"GPULAB_BIN_DIR={bin_dir} lacks {', '.join(missing)}. It must hold executables "
            f"named {', '.join(REQUIRED)} and kwok-crds/{{{','.join(KWOK_CRDS)}}} "
            "(unset GPULAB_BIN_DIR to build them from the Go module proxy instead)."
        )
    return Binaries({n: bin_dir / n for n in REQUIRED}, crds)


def ensure(progress: Progress | None = None) -> Binaries:
    """Return the binaries, building whatever is missing (visible progress)."""
    say = progress or (lambda msg: print(f"gpulab: {msg}", file=sys.stderr, flush=True))
    if os.environ.get("GPULAB_BIN_DIR"):
        return _from_bin_dir(Path(os.environ["GPULAB_BIN_DIR"]).expanduser())
    todo = [b for b in BUILDS if not _is_built(b)]
    if todo:
        _build_locked(todo, _go(), say)
    found: dict[str, Path] = {}
    for b in BUILDS:
        for _, out in b.programs:
            found[out] = b.bin_dir / out
    kwok = next(b for b in BUILDS if b.name == "kwok")
    return Binaries(found, tuple(kwok.bin_dir / "kwok-crds" / c for c in KWOK_CRDS))


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
            say(f"building {b.name} {b.version} from the Go module proxy (once; later runs reuse it)")
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
