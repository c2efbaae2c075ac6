"""A grader killed mid-run is cleaned up after by the next command (the grading journal), on the real cluster.

``gpulab grade`` runs in a subprocess until lab 02's (lab 08's) ``SETUP`` has
broken the GPU node and the submission's notebook runs; then it is SIGKILLed,
so its ``TEARDOWN`` never runs. While it ran, a recovery left its journal alone;
after it, ``gpulab up`` (lab 02) and a lesson notebook's ``setup()`` (lab 08)
find the journal of a dead grader, put the cluster back — no fault, no GPU
taint, every card allocatable, the stack ready, the grading namespace gone —
and say what they restored, in English and in zh-CN.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import nbformat
import psutil
import pytest

from gpulab.fakegpu import faults, operator
from gpulab.grading import cluster as grading_cluster
from gpulab.grading import journal, secret
from gpulab.grading.fixtures import broken_layer
from helpers import wait_for
from lab_support import from_solution

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
GPU_NODE = "gpu-node-1"


def _gpulab() -> list[str]:
    exe = Path(sys.executable).parent / "gpulab"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "gpulab.cli"]


def _running_journal(cluster) -> dict | None:
    """The journal of a run whose SETUP has finished (the fault is applied, the notebook runs)."""
    for path in journal.journal_dir(cluster.root).glob("*.json"):
        record = json.loads(path.read_text())
        if record.get("phase") == "running":
            return record
    return None


def _start_and_kill_grader(cluster, tmp_path: Path, lab: str, learner: str) -> tuple[dict, subprocess.Popen]:
    """Grade one solution of ``lab``; SIGKILL the grader once its SETUP has run. Returns its journal and process."""
    subs = tmp_path / "submissions"
    subs.mkdir()
    nbformat.write(from_solution(lab), subs / f"{learner}.ipynb")
    log_path = tmp_path / "grader.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([*_gpulab(), "grade", str(subs), "--lab", lab[:2], "--out", str(tmp_path / "out")],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def set_up() -> dict | None:
        if proc.poll() is not None:
            pytest.fail(f"the grader ended ({proc.returncode}) before it was killed:\n{log_path.read_text()}")
        return _running_journal(cluster)

    try:
        record = wait_for(set_up, 240, interval=0.5, what=f"lab {lab[:2]}'s SETUP to finish")
        assert record["owner"]["pid"] == proc.pid and record["owner"]["command"].startswith("gpulab grade")
        assert "faults" in record["changes"] and record["before"]["faults"] == {}
        assert faults.list_all(cluster.root, [GPU_NODE]), "SETUP broke nothing"
        # A recovery while the grader lives leaves its run alone, and says so.
        alive = grading_cluster.recover(cluster)
        assert [o.status for o in alive] == ["alive"]
        assert "still running" in journal.report(alive)[0] and faults.list_all(cluster.root, [GPU_NODE])
    finally:
        try:
            started = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            started = []
        proc.send_signal(signal.SIGKILL)
        # Its papermill child leads a session of its own and would run on; it and the kernel go too.
        for child in started:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
    # Not waited for yet: until its parent reaps it, the killed grader is a zombie, which counts as dead.
    return record, proc


def _assert_put_back(cluster, kube, namespace: str) -> None:
    assert faults.list_all(cluster.root, [GPU_NODE]) == []
    node = kube.get("Node", GPU_NODE)
    assert not [t for t in node["spec"].get("taints") or [] if t["key"] == "nvidia.com/gpu"]
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == node["status"]["capacity"]["nvidia.com/gpu"] == "2"
    assert operator.stack_ready(kube) is None
    ns = kube.get("Namespace", namespace)
    assert ns is None or ns["status"].get("phase") == "Terminating"
    assert list(journal.journal_dir(cluster.root).glob("*.json")) == []


def test_gpulab_up_restores_what_a_killed_lab_02_grader_broke(cluster, kube, tmp_path):
    # A learner for whom lab 02 breaks the "gpu" layer (one card falls off the bus) under this
    # GPULAB_HOME's grading secret, which the grader's subprocess reads too.
    key = secret.ensure()
    learner = next(f"ben{i}" for i in range(500)
                   if broken_layer.scenario(f"grade-02-ben{i}", {GPU_NODE: 2}, key)[1] == "gpu")
    record, grader = _start_and_kill_grader(cluster, tmp_path, "02-layered-verification", learner)
    pid = grader.pid
    fault = record["applied"][0]["faults"][0]
    assert fault["kind"] == "gpu-unhealthy"
    try:
        up = subprocess.run([*_gpulab(), "up"], capture_output=True, text=True, timeout=300)
    finally:
        grader.wait()
    print(up.stderr)
    assert up.returncode == 0, up.stderr
    lines = up.stderr.splitlines()
    head = next(i for i, line in enumerate(lines) if "interrupted grader" in line)
    assert f"(pid {pid} (gpulab grade" in lines[head] and "lab 02-layered-verification" in lines[head]
    assert lines[head].endswith(f"set up for grade-02-{learner}; restored:")
    restored = [line.strip() for line in lines[head + 1:] if line.startswith("  ")]
    assert f"namespace grade-02-{learner} deleted" in restored
    assert f"{GPU_NODE}: fault gpu-unhealthy (GPU {fault['gpu']}) cleared" in restored
    assert f"ClusterRole gpulab:grading:grade-02-{learner} deleted" in restored
    _assert_put_back(cluster, kube, f"grade-02-{learner}")


def test_a_notebooks_setup_restores_what_a_killed_lab_08_grader_broke(cluster, kube, tmp_path):
    record, grader = _start_and_kill_grader(cluster, tmp_path, "08-troubleshooting", "amy")
    assert kube.get("Node", GPU_NODE)["spec"]["taints"]  # SETUP's GPU taint is on
    gpu = record["applied"][0]["faults"][0]["gpu"]
    script = ("from gpulab.notebook import setup\n"
              "lab = setup('99-journal', topology=None)\n"
              "lab.reset(quiet=True)\n")
    try:
        run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                             cwd=REPO)
    finally:
        grader.wait()
    print(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if "被中断" in line)
    assert "08-troubleshooting" in lines[head] and "grade-08-amy" in lines[head]
    restored = [line.strip() for line in lines[head + 1:] if line.startswith("  ↩")]
    assert "↩ 删除了评分用的命名空间 grade-08-amy" in restored
    assert f"↩ {GPU_NODE}：清除了故障 gpu-unhealthy (GPU {gpu})" in restored
    assert f"↩ {GPU_NODE}：污点 nvidia.com/gpu=true:NoSchedule 已去掉" in restored
    _assert_put_back(cluster, kube, "grade-08-amy")
