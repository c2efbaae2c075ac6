#!/usr/bin/env bash
# Upstream Kubernetes' own e2e conformance specs for networking, against a fresh gpulab cluster.
#
# What it does, in one command:
#   1. builds e2e.test from k8s.io/kubernetes@<versions.KUBERNETES>/test/e2e, and the ginkgo CLI
#      (the version k8s.io/kubernetes requires), in a copy of gpulab's wrapper module
#      (gpulab/cluster/gobuild/kubernetes: it replaces each staging module by its published
#      version) under $GPULAB_CACHE/build/e2e, into $GPULAB_CACHE/bin/e2e-<version>/ — never into
#      the repository. Skipped when both binaries are there (delete that directory to rebuild).
#      Uses Go's default GOCACHE/GOMODCACHE, the same as `gpulab build`, so it starts warm.
#   2. starts a cluster of its own (GPULAB_HOME=$(mktemp -d)), runs the specs with ginkgo in
#      parallel, and always ends with `gpulab down --purge`.
#   3. prints passed / failed / skipped and each failed spec with the first line of its failure;
#      the full log, ginkgo's JSON and JUnit reports are in $OUT (printed at the end).
#
# Usage:  bench/e2e_network.sh [--build-only] [--procs N] [--focus REGEX] [--skip REGEX]
#   default focus: '\[sig-network\].*\[Conformance\]' (47 specs at v1.37.2); default procs: 6.
#   Env: GPULAB_CACHE (default ~/.cache/gpulab), OUT (default /tmp/gpulab-e2e-<date>).
#
# Needs: Go >= 1.26, and on the host the programs the e2e test image agnhost has and the specs
# call in pods (containers with a `command` run the host's programs): dig and nslookup (Debian's
# bind9-dnsutils), nc (netcat-openbsd). The script stops if one is missing.
# Timing (2026-12-04, 2-core machine under load average ~8, warm Go cache from `gpulab build`):
# go get 11 s, `go test -c` 606 s, ginkgo CLI 152 s. Result on 2026-12-05 with the apiserver's
# egress into the pod network and nodes' own addresses: 47 selected, 46 passed, 1 failed, ginkgo 100 s
# (before them: 34 passed, 22 min) — BENCHMARKS.md, "Upstream e2e: [sig-network] Conformance", says why.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$REPO/.venv/bin/python}
GPULAB=${GPULAB:-$REPO/.venv/bin/gpulab}
KUBECTL=${KUBECTL:-$REPO/.venv/bin/kubectl}
PROCS=6
FOCUS='\[sig-network\].*\[Conformance\]'
SKIP=''
BUILD_ONLY=0
while [ $# -gt 0 ]; do
    case "$1" in
        --build-only) BUILD_ONLY=1 ;;
        --procs) PROCS=$2; shift ;;
        --focus) FOCUS=$2; shift ;;
        --skip) SKIP=$2; shift ;;
        -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done

KVER=$("$PY" -c 'import sys; sys.path.insert(0, sys.argv[1]); from gpulab import versions; print(versions.KUBERNETES)' "$REPO")
CACHE=${GPULAB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpulab}
BIN=$CACHE/bin/e2e-$KVER
WORK=$CACHE/build/e2e
OUT=${OUT:-/tmp/gpulab-e2e-$(date -u +%Y%m%dT%H%M%S)}
mkdir -p "$OUT"

# -- 1. build -------------------------------------------------------------------------------
if [ -x "$BIN/e2e.test" ] && [ -x "$BIN/ginkgo" ]; then
    echo "e2e: using $BIN/e2e.test and $BIN/ginkgo (delete $BIN to rebuild)"
else
    command -v go >/dev/null || { echo "e2e: Go is needed to build e2e.test" >&2; exit 1; }
    mkdir -p "$WORK" "$BIN"
    cp "$REPO/gpulab/cluster/gobuild/kubernetes/go.mod" "$REPO/gpulab/cluster/gobuild/kubernetes/go.sum" "$WORK/"
    sed -i 's#^module .*#module gpulab.local/gobuild/e2e#' "$WORK/go.mod"
    export CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false"
    t0=$(date +%s)
    (cd "$WORK" && nice -n 10 go get "k8s.io/kubernetes/test/e2e@$KVER")
    t1=$(date +%s)
    (cd "$WORK" && nice -n 10 go test -c -vet=off -trimpath -o "$BIN/e2e.test.tmp" k8s.io/kubernetes/test/e2e)
    mv "$BIN/e2e.test.tmp" "$BIN/e2e.test"
    t2=$(date +%s)
    (cd "$WORK" && nice -n 10 go build -trimpath -o "$BIN/ginkgo.tmp" github.com/onsi/ginkgo/v2/ginkgo)
    mv "$BIN/ginkgo.tmp" "$BIN/ginkgo"
    t3=$(date +%s)
    echo "e2e: built in $((t3 - t0)) s (go get $((t1 - t0)) s, e2e.test $((t2 - t1)) s, ginkgo $((t3 - t2)) s)" | tee "$OUT/build.txt"
fi
[ "$BUILD_ONLY" = 1 ] && exit 0

# -- 2. run ---------------------------------------------------------------------------------
missing=()
for prog in dig:bind9-dnsutils nslookup:bind9-dnsutils nc:netcat-openbsd; do
    command -v "${prog%%:*}" >/dev/null || missing+=("${prog%%:*} (Debian's ${prog##*:})")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "e2e: the specs run these in pods, and pods run the host's programs; missing: ${missing[*]}" >&2
    exit 1
fi

export GPULAB_HOME
GPULAB_HOME=$(mktemp -d /tmp/gpulab-e2e-home.XXXXXX)
trap '"$GPULAB" down --purge >"$OUT/down.log" 2>&1; rm -f "$GPULAB_HOME/.cluster.lock"; rmdir "$GPULAB_HOME" 2>/dev/null || true' EXIT
"$GPULAB" up 2>&1 | tee "$OUT/up.log"

args=(--procs="$PROCS" --timeout=90m --no-color -v --focus="$FOCUS"
      --json-report=report.json --junit-report=junit.xml --output-dir="$OUT")
[ -n "$SKIP" ] && args+=(--skip="$SKIP")
t0=$(date +%s)
set +e
PATH=$(dirname "$KUBECTL"):$PATH nice -n 5 "$BIN/ginkgo" "${args[@]}" "$BIN/e2e.test" -- \
    --kubeconfig="$GPULAB_HOME/cluster/kubeconfig" --provider=local \
    --kubectl-path="$KUBECTL" --report-dir="$OUT" >"$OUT/run.log" 2>&1
rc=$?
set -e
echo "e2e: ginkgo exited $rc after $(( $(date +%s) - t0 )) s; log: $OUT/run.log"

# -- 3. summary -----------------------------------------------------------------------------
"$PY" - "$OUT/report.json" <<'EOF'
import json, sys
suites = json.load(open(sys.argv[1]))
counts, failed = {}, []
for suite in suites:
    for spec in suite.get("SpecReports") or []:
        if spec.get("LeafNodeType") != "It":
            continue
        state = spec["State"]
        if state == "skipped" and not (spec.get("Failure") or {}).get("Message"):
            state = "not selected"  # filtered out by --focus/--skip; a spec that skips itself says why
        counts[state] = counts.get(state, 0) + 1
        if state not in ("passed", "skipped", "pending", "not selected"):
            name = " ".join(spec.get("ContainerHierarchyTexts") or []) + " " + spec["LeafNodeText"]
            msg = (spec.get("Failure") or {}).get("Message", "").strip().splitlines()
            failed.append((name, msg[0] if msg else ""))
ran = sum(n for s, n in counts.items() if s not in ("skipped", "pending", "not selected"))
print(f"selected {ran + counts.get('skipped', 0)}: passed {counts.get('passed', 0)}, "
      f"failed {ran - counts.get('passed', 0)}, skipped {counts.get('skipped', 0)} "
      f"({counts.get('not selected', 0)} other specs not selected)")
for name, msg in sorted(failed):
    print(f"FAIL {name}\n     {msg[:300]}")
EOF
echo "e2e: reports in $OUT"
