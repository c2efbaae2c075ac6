"""Does the runner execute notebooks in their own process tree and classify every way they can end?

These tests start real kernels (a few seconds each), so there are only a handful.
"""

from __future__ import annotations

import os
import time

import pytest
from grading_support import notebook, write

from gpulab.grading.record import load_results
from gpulab.grading.runner import ErrorKind, Runner

RECORD = "import gpulab.grading as grading\n"


@pytest.fixture
def runner():
    return Runner(cell_timeout=20, timeout=60, start_timeout=60)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_ok_with_parameters_values_and_controlled_environment(tmp_path, runner, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", "/etc/admin.kubeconfig")
    monkeypatch.setenv("GPULAB_TEST_SECRET", "grader-only")
    runner.env = {"KUBECONFIG": "/tmp/restricted.kubeconfig"}
    nb = write(notebook([
        RECORD + "import os\n"
        "grading.record('namespace', namespace)\n"
        "grading.record('kubeconfig', os.environ.get('KUBECONFIG'))\n"
        "grading.record('secret', os.environ.get('GPULAB_TEST_SECRET'))\n"
        "grading.record('cwd', os.getcwd())",
    ]), tmp_path / "sub" / "alice.ipynb")
    work = tmp_path / "work"
    ex = runner.run(nb, work, parameters={"namespace": "grade-lab-alice"}, cwd=tmp_path)
    assert ex.ok and ex.status == "ok" and ex.error is None, ex
    assert ex.learner_summary() == "笔记本从头到尾运行成功。"
    values = load_results(ex.results_path)
    assert values == {"namespace": "grade-lab-alice", "kubeconfig": "/tmp/restricted.kubeconfig", "secret": None,
                      "cwd": str(tmp_path.resolve())}
    assert ex.output_path.exists() and ex.parameters["results_path"] == str(ex.results_path.resolve())


def test_cell_that_raises(tmp_path, runner):
    nb = write(notebook([RECORD + "grading.record('step', 1)", "pods = {}\npods['gpu-train-demo']", "x = 2"]),
               tmp_path / "raise.ipynb")
    ex = runner.run(nb, tmp_path / "work")
    assert not ex.ok and ex.error is ErrorKind.CELL_ERROR
    assert (ex.cell_index, ex.ename, ex.evalue) == (2, "KeyError", "'gpu-train-demo'")
    assert "第 3 个单元格" in ex.learner_summary() and "KeyError" in ex.learner_summary()
    assert load_results(ex.results_path) == {"step": 1}  # what was recorded before the error survives


def test_infinite_loop_hits_the_cell_timeout(tmp_path):
    nb = write(notebook(["while True:\n    pass"]), tmp_path / "loop.ipynb")
    ex = Runner(cell_timeout=2, timeout=60).run(nb, tmp_path / "work")
    assert ex.error is ErrorKind.CELL_TIMEOUT and ex.cell_index == 1
    assert "2 秒" in ex.learner_summary() and "while True" in ex.learner_summary()


def test_wall_timeout_kills_the_whole_process_tree(tmp_path):
    pids = tmp_path / "pids"
    nb = write(notebook([
        f"import os, subprocess\nchild = subprocess.Popen(['sleep', '600'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')",
        "import time\nwhile True:\n    time.sleep(0.1)",
    ]), tmp_path / "hang.ipynb")
    started = time.monotonic()
    ex = Runner(cell_timeout=None, timeout=12).run(nb, tmp_path / "work")
    assert time.monotonic() - started < 30
    assert ex.error is ErrorKind.TIMEOUT and ex.cell_index == 2, ex
    kernel_pid, sleep_pid = (int(p) for p in pids.read_text().split())
    deadline = time.monotonic() + 5
    while (_alive(kernel_pid) or _alive(sleep_pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(kernel_pid) and not _alive(sleep_pid)


@pytest.mark.parametrize("code,exit_value", [("sys.exit()", ""), ("sys.exit(3)", "3")])
def test_sys_exit_is_reported(tmp_path, runner, code, exit_value):
    nb = write(notebook([f"import sys\n{code}", "never = True"]), tmp_path / "exit.ipynb")
    ex = runner.run(nb, tmp_path / "work")
    assert ex.error is ErrorKind.SYS_EXIT and ex.cell_index == 1 and ex.evalue == exit_value
    assert "sys.exit()" in ex.learner_summary()


def test_killed_runner(tmp_path, runner):
    nb = write(notebook(["import os, signal\nos.kill(os.getppid(), signal.SIGKILL)"]), tmp_path / "kill.ipynb")
    ex = runner.run(nb, tmp_path / "work")
    assert ex.error is ErrorKind.KILLED and "SIGKILL" in ex.message


@pytest.mark.parametrize("content", ["{not json", '{"cells": 3}', "", '["a", "list"]'])
def test_invalid_notebooks_are_not_run(tmp_path, runner, content):
    path = tmp_path / "broken.ipynb"
    path.write_text(content, encoding="utf-8")
    ex = runner.run(path, tmp_path / "work")
    assert ex.error is ErrorKind.INVALID_NOTEBOOK and not ex.executed and ex.duration_s == 0
    assert "不是有效的 Jupyter 笔记本" in ex.learner_summary()


def test_missing_parameters_cell_is_not_run(tmp_path, runner):
    nb = write(notebook(["namespace = 'mine'"], parameters=None), tmp_path / "noparams.ipynb")
    ex = runner.run(nb, tmp_path / "work")
    assert ex.error is ErrorKind.NO_PARAMETERS_CELL and not ex.executed
    assert "parameters" in ex.learner_summary()


def test_child_environment_is_explicit(monkeypatch):
    monkeypatch.setenv("KUBECONFIG", "/etc/admin.kubeconfig")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "nope")
    env = Runner(env={"EXTRA": "1"}).child_env({"KUBECONFIG": "/restricted"})
    assert env["KUBECONFIG"] == "/restricted" and env["EXTRA"] == "1"
    assert "AWS_SECRET_ACCESS_KEY" not in env
    assert "KUBECONFIG" not in Runner().child_env()


def test_a_batch_loads_its_lab_once_and_looks_for_submissions_once(tmp_path, monkeypatch):
    """`gpulab grade`: the lab's settings and the submissions folder are read once per batch."""
    from gpulab.grading import gradebook, grader

    loads, looks = [], []
    real_spec, real_discover = grader.load_lab_spec, gradebook.discover_submissions
    monkeypatch.setattr(grader, "load_lab_spec", lambda lab: loads.append(lab) or real_spec(lab))
    monkeypatch.setattr(grader, "discover_submissions",
                        lambda d, lab: looks.append(d) or real_discover(d, lab))
    monkeypatch.setattr(gradebook, "discover_submissions",
                        lambda d, lab: looks.append(d) or real_discover(d, lab))

    class Ready:
        spec = real_spec("03")
        suite, runner, collector, sandbox = None, None, None, None

        def close(self):
            pass

    monkeypatch.setattr(grader, "setup", lambda spec, **kw: (loads.append("setup:" + type(spec).__name__), Ready())[1])
    monkeypatch.setattr(grader, "delete_leftovers", lambda client, prefix: None)
    seen = {}
    monkeypatch.setattr(grader, "grade_batch", lambda *a, **kw: seen.update(kw) or "result")
    subs = tmp_path / "subs"
    (subs / "ada").mkdir(parents=True)
    (subs / "ada" / "03-taints-tolerations.ipynb").write_text("{}")
    Ready.sandbox = type("S", (), {"client": None})()
    assert grader.grade_submissions(subs, "03", tmp_path / "out", progress=False) == "result"
    assert loads == ["03", "setup:LabSpec"] and len(looks) == 1
    assert [s.learner for s in seen["submissions"]] == ["ada"]
