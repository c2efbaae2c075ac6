"""Cluster bring-up benchmark: warm `gpulab up`, `gpulab down`, RSS, and kwokctl as the anchor.

    .venv/bin/python bench/cluster_bench.py [--runs 5] [--cold]

--cold also measures a build from nothing (fresh Go module and build caches
and a fresh gpulab cache, all in a temp dir): tens of minutes on 2 cores.
Results print as a Markdown table for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpulab.cluster import binaries  # noqa: E402
from gpulab.cluster.embedded import EmbeddedCluster  # noqa: E402


def tree_rss(pids: list[int]) -> int:
    total = 0
    seen = set()
    for pid in pids:
        try:
            procs = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        for p in procs:
            if p.pid in seen:
                continue
            seen.add(p.pid)
            try:
                total += p.memory_info().rss
            except psutil.NoSuchProcess:
                pass
    return total


#: The core of issue "A 1000-node fleet" item 3: the control plane, KWOK, and the node agent with the GPU stack (its
#: programs are threads of the node agent). Its children are the pods' processes (CoreDNS) and the pod network's
#: namespace holder: counted with everything `up` starts, not here.
CORE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "node-agent")


def core_rss(running: dict[str, int]) -> int:
    total = 0
    for name in CORE:
        try:
            total += psutil.Process(running[name]).memory_info().rss
        except (KeyError, psutil.NoSuchProcess):
            pass
    return total


def quiet(msg: str) -> None:
    pass


def progress_clock(out: dict[str, list[float]], stage: str, t0: float):
    """A progress callback noting when `up` reports the nodes Ready (before the GPU stack) and, on a fresh state,
    the GPU Operator ready: ``out[stage + "_nodes"]``, ``out[stage + "_gpu"]``."""

    def say(msg: str) -> None:
        if "nodes Ready after" in msg:
            out[f"{stage}_nodes"].append(time.monotonic() - t0)
        elif "GPU Operator ready in" in msg and f"{stage}_gpu" in out:
            out[f"{stage}_gpu"].append(time.monotonic() - t0)

    return say


def gpulab_run(out: dict[str, list[float]]) -> None:
    """One fresh `gpulab up`, `down`, and `up` again on the state it left; into ``out``."""
    home = Path(tempfile.mkdtemp(prefix="glb-", dir="/tmp"))
    c = EmbeddedCluster(home / "cluster")
    try:
        t = time.monotonic()
        c.up(say=progress_clock(out, "fresh", t))
        out["fresh_up"].append(time.monotonic() - t)
        out["gpu_after_nodes"].append(out["fresh_gpu"][-1] - out["fresh_nodes"][-1])
        time.sleep(5)  # let the controllers settle before measuring memory
        running = c.running()
        out["rss_mib"].append(tree_rss(list(running.values())) / 2**20)
        out["core_mib"].append(core_rss(running) / 2**20)
        t = time.monotonic()
        c.down()
        out["down"].append(time.monotonic() - t)
        t = time.monotonic()
        c.up(say=progress_clock(out, "restart", t))
        out["restart_up"].append(time.monotonic() - t)
    finally:
        c.down(purge=True)
        shutil.rmtree(home, ignore_errors=True)
    print(f"gpulab: fresh up {out['fresh_up'][-1]:.2f} s (nodes Ready {out['fresh_nodes'][-1]:.2f} s, "
          f"GPU Operator {out['gpu_after_nodes'][-1]:.2f} s after), restart up {out['restart_up'][-1]:.2f} s, "
          f"down {out['down'][-1]:.2f} s, RSS {out['rss_mib'][-1]:.0f} MiB (core {out['core_mib'][-1]:.0f})",
          file=sys.stderr)


def kwokctl_run(bins: binaries.Binaries, out: dict[str, list[float]], i: int) -> None:
    """One `kwokctl create cluster --runtime binary` with the same binaries, the anchor; into ``out``."""
    kwokctl = bins["kwokctl"]
    work = Path(tempfile.mkdtemp(prefix="kwb-", dir="/tmp"))
    cfg = work / "kwokctl.yaml"
    cfg.write_text(
        "kind: KwokctlConfiguration\napiVersion: config.kwok.x-k8s.io/v1alpha1\noptions:\n"
        "  runtime: binary\n  bindAddress: 127.0.0.1\n"
        f"  kubeApiserverBinary: {bins['kube-apiserver']}\n"
        f"  kubeControllerManagerBinary: {bins['kube-controller-manager']}\n"
        f"  kubeSchedulerBinary: {bins['kube-scheduler']}\n"
        f"  kwokControllerBinary: {bins['kwok']}\n"
        f"  etcdBinary: {bins['etcd']}\n"
    )
    env = dict(os.environ, KWOK_WORKDIR=str(work / "kwok"),
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    name = f"bench{i}"
    try:
        t = time.monotonic()
        subprocess.run([str(kwokctl), "-c", str(cfg), "create", "cluster", "--name", name, "--runtime", "binary",
                        "--wait", "2m", "--kubeconfig", str(work / "kubeconfig")],
                       env=env, check=True, capture_output=True)
        out["create"].append(time.monotonic() - t)
        time.sleep(5)
        pids = []
        for pidfile in (work / "kwok" / "clusters" / name / "pids").glob("*.pid"):
            try:
                pids.append(int(pidfile.read_text().strip()))
            except ValueError:
                pass
        out["rss_mib"].append(tree_rss(pids) / 2**20)
    finally:
        subprocess.run([str(kwokctl), "delete", "cluster", "--name", name, "--kubeconfig", str(work / "kubeconfig")],
                       env=env, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    print(f"kwokctl: create {out['create'][-1]:.2f} s, RSS {out['rss_mib'][-1]:.0f} MiB", file=sys.stderr)


def bench_cold() -> float:
    tmp = Path(tempfile.mkdtemp(prefix="glcold-", dir="/tmp"))
    env = dict(os.environ, GPULAB_CACHE=str(tmp / "cache"), GOCACHE=str(tmp / "gocache"),
               GOMODCACHE=str(tmp / "gomod"))
    env.pop("GPULAB_BIN_DIR", None)
    t = time.monotonic()
    subprocess.run([sys.executable, "-m", "gpulab.cli", "build"], env=env, check=True, cwd=REPO)
    took = time.monotonic() - t
    subprocess.run(["chmod", "-R", "u+w", str(tmp)], check=False)
    shutil.rmtree(tmp, ignore_errors=True)
    return took


def fmt(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} (min {min(values):.2f}, max {max(values):.2f})"


def main() -> int:
    os.environ["LANGUAGE"] = "en"  # progress_clock reads gpulab's progress lines in English (gpulab/i18n.py)
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cold", action="store_true")
    args = ap.parse_args()
    cold = bench_cold() if args.cold else None
    g: dict[str, list[float]] = {name: [] for name in ("fresh_up", "fresh_nodes", "fresh_gpu", "gpu_after_nodes",
                                                        "restart_up", "restart_nodes", "down", "rss_mib", "core_mib")}
    k: dict[str, list[float]] = {"create": [], "rss_mib": []}
    bins = binaries.ensure(quiet)
    for i in range(args.runs):
        # Taken in turns, so that what else the machine does weighs on both alike.
        print(f"run {i + 1}/{args.runs}", file=sys.stderr)
        gpulab_run(g)
        kwokctl_run(bins, k, i)
    ratio = statistics.median(g["fresh_nodes"]) / statistics.median(k["create"])
    ratio_full = statistics.median(g["fresh_up"]) / statistics.median(k["create"])
    print(f"\n| measure ({args.runs} runs, median (min, max)) | value |\n|---|---|")
    if cold is not None:
        print(f"| cold build of all binaries (empty Go caches) | {cold / 60:.1f} min |")
    print(f"| warm `gpulab up`, fresh state, until 3 nodes Ready | {fmt(g['fresh_nodes'])} s |")
    print(f"| warm `gpulab up`, fresh state, the GPU Operator ready after the nodes | {fmt(g['gpu_after_nodes'])} s |")
    print(f"| warm `gpulab up`, fresh state, command returns (GPU Operator, then cluster DNS ready) "
          f"| {fmt(g['fresh_up'])} s |")
    print(f"| warm `gpulab up`, existing state, until nodes Ready | {fmt(g['restart_nodes'])} s |")
    print(f"| warm `gpulab up`, existing state, command returns | {fmt(g['restart_up'])} s |")
    print(f"| `gpulab down` | {fmt(g['down'])} s |")
    print(f"| RSS of all cluster processes, default topology | {fmt(g['rss_mib'])} MiB |")
    print(f"| RSS of the core ({', '.join(CORE)}; not the pods' processes) | {fmt(g['core_mib'])} MiB |")
    print(f"| `kwokctl create cluster --runtime binary`, same binaries | {fmt(k['create'])} s |")
    print(f"| kwokctl cluster RSS | {fmt(k['rss_mib'])} MiB |")
    print(f"| gpulab nodes Ready / kwokctl create | {ratio:.2f} |")
    print(f"| gpulab up incl. GPU stack / kwokctl create | {ratio_full:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
