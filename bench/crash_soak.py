"""Crash soak: kill each component of a running embedded cluster with SIGKILL, bring it back, lose nothing.

    .venv/bin/python bench/crash_soak.py [--cycles 20] [--component node-agent ...] [--fresh]

On the cluster in $GPULAB_HOME (or, with --fresh, a throwaway one) it sets up
a workload in a namespace of its own:

- a Deployment of two (simulated) replicas;
- a GPU pod holding one ``nvidia.com/gpu``;
- a Job whose real process writes a checkpoint (a step counter) every second
  to a hostPath on its node and finishes when told to;
- a time-sliced GPU node (the chapter's time-slicing ConfigMap: 2 cards
  advertised as 8);
- 20 ConfigMaps.

Then, for each component in turn and N cycles each, it kills the component
with SIGKILL, runs ``gpulab up`` and waits until everything checks out:
every object is there, every pod that was Running still is (same UID, no
restart counted: the workload's containers never stopped, as on a real node
whose kubelet or control plane restarts), the Job's checkpoint advanced, the
GPU node's allocatable is what time-slicing makes it, and metrics-server
serves the Job's node through ``metrics.k8s.io`` again (``kubectl top``). At the end the Job
is told to finish and must complete. It prints a table (per component: cycles
passed, time for ``gpulab up`` to return, time until all checks pass) for
BENCHMARKS.md. The GPU stack is put back as found, the namespace deleted.

tests/cluster/test_crash_soak.py runs two cycles of each component in ``make test``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpulab import paths  # noqa: E402
from gpulab.kube import api
from gpulab.cluster.embedded import COMPONENTS, EmbeddedCluster  # noqa: E402
from gpulab.cluster import baseline  # noqa: E402
from gpulab.kube.names import CLUSTER_POLICY, DEVICE_PLUGIN_CONFIG_LABEL  # noqa: E402

GPU_NODE = "gpu-node-1"
JOB_NODE = "cpu-node-1"
CUDA_IMAGE = "nvcr.io/nvidia/cuda:12.6.2-base-ubuntu24.04"
TIME_SLICING = paths.manifests() / "04-sharing" / "time-slicing-config.yaml"
CHECKPOINT_DIR = "/var/lib/gpulab-soak"
CONFIGMAPS = 20


class SoakFailure(AssertionError):
    pass


def _wait(check: Callable[[], str | None], timeout: float, interval: float = 0.25) -> str | None:
    """Until ``check`` returns None (all good); returns the last complaint it gave before that (what the
    wait was on; None if all was good at once), raises SoakFailure with it when the time runs out."""
    deadline = time.monotonic() + timeout
    problem: str | None = "not checked"
    last: str | None = None
    while time.monotonic() < deadline:
        try:
            problem = check()
        except (api.ApiError, OSError) as e:  # the apiserver may still be coming back
            problem = f"API not answering: {e}"
        if problem is None:
            return last
        last = problem
        time.sleep(interval)
    raise SoakFailure(problem)


def _pod_facts(pod: dict[str, Any]) -> tuple:
    st = pod.get("status") or {}
    return (st.get("phase"), [(c["name"], c.get("restartCount"), c.get("containerID"))
                              for c in st.get("containerStatuses") or []])


@dataclasses.dataclass
class Workload:
    """What the soak puts on the cluster and checks after every crash."""

    client: api.Client
    cluster_dir: Path
    ns: str = dataclasses.field(default_factory=lambda: f"soak-{uuid.uuid4().hex[:6]}")
    pods: dict[str, tuple] = dataclasses.field(default_factory=dict)   # uid -> facts while Running
    stack: dict[str, Any] = dataclasses.field(default_factory=dict)
    allocatable: str = ""
    step: int = 0

    # -- set-up ----------------------------------------------------------------

    @property
    def checkpoint(self) -> Path:
        return self.cluster_dir / "nodes" / JOB_NODE / "host" / CHECKPOINT_DIR.lstrip("/") / self.ns

    def _gpu_allocatable(self) -> str | None:
        node = self.client.get("Node", GPU_NODE) or {}
        return ((node.get("status") or {}).get("allocatable") or {}).get("nvidia.com/gpu")

    def time_slice(self, timeout: float = 120) -> None:
        """The chapter's time-slicing: ConfigMap, ClusterPolicy devicePlugin.config, node label."""
        self.stack = baseline.capture(self.client)
        cards = int(self._gpu_allocatable() or 0)
        cm = yaml.safe_load(TIME_SLICING.read_text())
        replicas = yaml.safe_load(cm["data"]["any"])["sharing"]["timeSlicing"]["resources"][0]["replicas"]
        self.client.apply(cm, manager="gpulab-soak")
        self.client.patch("ClusterPolicy", CLUSTER_POLICY, {"spec": {"devicePlugin": {"config": {
            "name": cm["metadata"]["name"], "default": "any"}}}})
        self.client.patch("Node", GPU_NODE, {"metadata": {"labels": {DEVICE_PLUGIN_CONFIG_LABEL: "any"}}})
        self.allocatable = str(cards * replicas)
        _wait(lambda: None if self._gpu_allocatable() == self.allocatable
              else f"{GPU_NODE} allocatable nvidia.com/gpu {self._gpu_allocatable()}, want {self.allocatable}",
              timeout)

    def create(self, timeout: float = 90) -> None:
        c, ns = self.client, self.ns
        c.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        _wait(lambda: None if c.get("ServiceAccount", "default", ns) else "no default ServiceAccount yet", 30)
        for i in range(CONFIGMAPS):
            c.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm-{i:02d}", "namespace": ns},
                      "data": {"i": str(i)}})
        c.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": ns},
                  "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                           "template": {"metadata": {"labels": {"app": "web"}},
                                        "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}}}})
        c.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu", "namespace": ns},
                  "spec": {"nodeSelector": {"kubernetes.io/hostname": GPU_NODE},
                           "containers": [{"name": "cuda", "image": CUDA_IMAGE,
                                           "resources": {"limits": {"nvidia.com/gpu": 1}}}]}})
        script = ("i=$(cat /ckpt/step 2>/dev/null || echo 0); "
                  "while [ ! -e /ckpt/stop ]; do i=$((i+1)); echo $i > /ckpt/step.tmp; mv /ckpt/step.tmp /ckpt/step; "
                  "sleep 1; done; echo \"finished at step $i\"")
        c.create({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": ns},
                  "spec": {"backoffLimit": 2, "template": {"spec": {
                      "restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": JOB_NODE},
                      "containers": [{"name": "train", "image": "python:3.12-slim",
                                      "command": ["sh", "-c", script],
                                      "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}]}],
                      "volumes": [{"name": "ckpt", "hostPath": {"path": f"{CHECKPOINT_DIR}/{ns}",
                                                                "type": "DirectoryOrCreate"}}]}}}})

        def all_running() -> str | None:
            pods = c.list("Pod", ns)
            if len(pods) != 4:
                return f"{len(pods)} pods in {ns}, want 4"
            waiting = [p["metadata"]["name"] for p in pods if (p.get("status") or {}).get("phase") != "Running"]
            return f"not Running yet: {waiting}" if waiting else None

        _wait(all_running, timeout)
        _wait(lambda: None if self._step() > 0 else "no checkpoint written yet", 30)
        self.pods = {p["metadata"]["uid"]: _pod_facts(p) for p in c.list("Pod", ns)}
        self.step = self._step()

    def _step(self) -> int:
        try:
            return int((self.checkpoint / "step").read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    # -- the check after each crash ------------------------------------------------

    def problem(self) -> str | None:
        """None when nothing was lost; else what is wrong (the first thing found)."""
        c, ns = self.client, self.ns
        cms = [cm for cm in c.list("ConfigMap", ns) if cm["metadata"]["name"].startswith("cm-")]
        if len(cms) != CONFIGMAPS:
            return f"{len(cms)} of {CONFIGMAPS} ConfigMaps"
        if sorted(int(cm["data"]["i"]) for cm in cms) != list(range(CONFIGMAPS)):
            return "ConfigMap data changed"
        pods = {p["metadata"]["uid"]: p for p in c.list("Pod", ns)}
        if set(pods) != set(self.pods):
            return f"pods replaced: {sorted(set(self.pods) ^ set(pods))}"
        for uid, facts in self.pods.items():
            now = _pod_facts(pods[uid])
            if now != facts:
                return f"pod {pods[uid]['metadata']['name']}: {now}, was {facts}"
        dep = c.get("Deployment", "web", ns) or {}
        if (dep.get("status") or {}).get("readyReplicas") != 2:
            return f"Deployment web ready {(dep.get('status') or {}).get('readyReplicas')}/2"
        if self._gpu_allocatable() != self.allocatable:
            return f"{GPU_NODE} allocatable nvidia.com/gpu {self._gpu_allocatable()}, want {self.allocatable}"
        try:
            c.request("GET", f"/apis/metrics.k8s.io/v1beta1/nodes/{JOB_NODE}")
        except (api.ApiError, api.NotFound) as e:
            return f"metrics.k8s.io has no metrics of {JOB_NODE} (kubectl top nodes): {e}"
        step = self._step()
        if step <= self.step:
            return f"checkpoint at step {step}, not past {self.step}"
        self.step = step
        return None

    # -- the end -------------------------------------------------------------------

    def finish(self, timeout: float = 60) -> None:
        (self.checkpoint / "stop").touch()

        def done() -> str | None:
            job = self.client.get("Job", "train", self.ns) or {}
            st = job.get("status") or {}
            return None if st.get("succeeded") == 1 else f"Job train: {st}"

        _wait(done, timeout)

    def remove(self) -> None:
        try:
            self.client.delete("Namespace", self.ns)
        finally:
            if self.stack:
                baseline.restore(self.client, self.stack)


@dataclasses.dataclass
class Cycle:
    component: str
    up_s: float
    recover_s: float
    problem: str | None
    waited_on: str | None = None  # the last check that was not yet true before all were


def gpulab_up(home: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpulab.cli", "up"], capture_output=True, text=True,
                          env=dict(os.environ, GPULAB_HOME=str(home)), timeout=300)


def crash(cluster: EmbeddedCluster, home: Path, work: Workload, component: str, timeout: float = 90) -> Cycle:
    """Kill ``component`` with SIGKILL, run ``gpulab up``, wait until the workload checks out."""
    pid = cluster.running()[component]
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while component in cluster.running() and time.monotonic() < deadline:
        time.sleep(0.02)
    proc = gpulab_up(home)
    up_s = time.monotonic() - t0
    if proc.returncode != 0:
        return Cycle(component, up_s, float("nan"), f"gpulab up failed: {proc.stderr.strip()[-300:]}")
    try:
        waited_on = _wait(work.problem, timeout)
    except SoakFailure as e:
        return Cycle(component, up_s, float("nan"), str(e))
    return Cycle(component, up_s, time.monotonic() - t0, None, waited_on)


def soak(cluster: EmbeddedCluster, home: Path, cycles: int, components: list[str],
         say: Callable[[str], None] = print) -> tuple[list[Cycle], Workload]:
    """The whole soak on a running cluster; the workload is removed and the GPU stack restored after."""
    work = Workload(api.Client(cluster.kubeconfig), cluster.root)
    results: list[Cycle] = []
    try:
        say("soak: time-slicing the GPU node")
        work.time_slice()
        say(f"soak: workload in namespace {work.ns}")
        work.create()
        for component in components:
            for i in range(cycles):
                cycle = crash(cluster, home, work, component)
                results.append(cycle)
                state = "ok" if cycle.problem is None else f"FAILED: {cycle.problem}"
                if cycle.problem is None and cycle.recover_s - cycle.up_s > 5:
                    state += f" (the last wait was on: {cycle.waited_on})"
                say(f"soak: {component} {i + 1}/{cycles}: up {cycle.up_s:.1f} s, "
                    f"recovered {cycle.recover_s:.1f} s, {state}")
                if cycle.problem is not None:
                    return results, work
        work.finish()
        say(f"soak: Job completed at checkpoint step {work._step()}")
    finally:
        work.remove()
    return results, work


def table(results: list[Cycle]) -> str:
    lines = ["| component | cycles ok | `gpulab up` p50 / max (s) | all checks pass p50 / max (s) |",
             "|---|---|---|---|"]
    for component in dict.fromkeys(r.component for r in results):
        rows = [r for r in results if r.component == component]
        ok = [r for r in rows if r.problem is None]
        ups = [r.up_s for r in rows]
        rec = [r.recover_s for r in ok] or [float("nan")]
        lines.append(f"| {component} | {len(ok)}/{len(rows)} | {statistics.median(ups):.1f} / {max(ups):.1f} | "
                     f"{statistics.median(rec):.1f} / {max(rec):.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=20, help="kills per component (default 20)")
    parser.add_argument("--component", action="append", choices=COMPONENTS,
                        help="only these components (repeatable; default: all, in start order)")
    parser.add_argument("--fresh", action="store_true",
                        help="start a throwaway cluster in a temp GPULAB_HOME instead of using the running one")
    args = parser.parse_args(argv)
    components = args.component or list(COMPONENTS)
    if args.fresh:
        home = Path(tempfile.mkdtemp(prefix="gl-soak-", dir="/tmp"))
        home.chmod(0o755)
        os.environ["GPULAB_HOME"] = str(home)
    home = paths.home()
    cluster = EmbeddedCluster(home / "cluster")
    if args.fresh:
        cluster.up()
    elif not cluster.is_up():
        print(f"crash_soak: no running cluster in {home}; start one with `gpulab up`, or pass --fresh",
              file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        results, _ = soak(cluster, home, args.cycles, components)
    finally:
        if args.fresh:
            cluster.down(purge=True)
    print()
    print(table(results))
    failed = [r for r in results if r.problem]
    print(f"\n{len(results) - len(failed)}/{len(results)} cycles ok in {time.monotonic() - started:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
