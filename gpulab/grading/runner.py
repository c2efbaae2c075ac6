"""Execute one submitted notebook with papermill, in its own process tree.

The parent (this module) never imports papermill. It checks the notebook is
readable and has a ``parameters`` cell, starts ``python -m
gpulab.grading._papermill_child`` in a new session with an explicit
environment, and enforces a wall-clock limit: on expiry, or when the child
leaves processes behind, every process the child started — the kernel and
anything the learner's code spawned — is killed. papermill itself enforces the
per-cell limit.

:meth:`Runner.run` never raises for a bad submission; it returns an
:class:`Execution` saying what happened.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat

import gpulab

# Enough for Python, locale and temp files; deliberately not KUBECONFIG or cloud credentials,
# which a submission must only get when the caller passes them (a restricted identity).
DEFAULT_INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "USER", "LOGNAME",
                         "SYSTEMROOT")


#: What a lab notebook's first cell imports: a kernel started ahead of its submission (Runner.warm) has them loaded.
PRELOAD = ("yaml", "kubernetes.client", "kubernetes.config", "gpulab.grading.labkit")


class ErrorKind(enum.StrEnum):
    INVALID_NOTEBOOK = "invalid-notebook"
    NO_PARAMETERS_CELL = "no-parameters-cell"
    CELL_ERROR = "cell-error"
    SYS_EXIT = "sys-exit"
    CELL_TIMEOUT = "cell-timeout"
    TIMEOUT = "timeout"
    KILLED = "killed"
    KERNEL_DIED = "kernel-died"
    RUNNER_ERROR = "runner-error"


@dataclass(frozen=True)
class Execution:
    """What happened when a notebook was run.

    ``cell_index`` is 0-based in the *submitted* notebook (the injected
    parameters cell is not counted). ``message`` is a one-line English summary
    for instructors; :meth:`learner_summary` is the zh-CN explanation.
    """

    notebook: Path
    ok: bool
    error: ErrorKind | None = None
    message: str = ""
    executed: bool = False
    cell_index: int | None = None
    cell_source: str = ""
    ename: str | None = None
    evalue: str | None = None
    traceback: str = ""
    duration_s: float = 0.0
    output_path: Path | None = None
    results_path: Path | None = None
    log_path: Path | None = None
    parameters: Mapping[str, Any] = field(default_factory=dict)
    cell_timeout: float | None = None
    timeout: float | None = None

    @property
    def status(self) -> str:
        return "ok" if self.ok else (self.error.value if self.error else "error")

    def _cell(self) -> str:
        if self.cell_index is None:
            return "某个单元格"
        first = next((ln.strip() for ln in self.cell_source.splitlines() if ln.strip()), "")
        hint = f"（以 `{first[:60]}` 开头）" if first else ""
        return f"第 {self.cell_index + 1} 个单元格{hint}"

    def learner_summary(self) -> str:
        """Why the run stopped, for the learner's feedback (zh-CN)."""
        if self.ok:
            return "笔记本从头到尾运行成功。"
        kind = self.error
        if kind is ErrorKind.CELL_ERROR:
            detail = f"{self.ename}: {self.evalue}" if self.evalue else f"{self.ename}"
            return f"笔记本在{self._cell()}出错（{detail[:300]}），后面的单元格都没有运行。"
        if kind is ErrorKind.SYS_EXIT:
            return f"笔记本在{self._cell()}调用了 sys.exit()，后面的单元格都没有运行。"
        if kind is ErrorKind.CELL_TIMEOUT:
            limit = f" {self.cell_timeout:g} 秒" if self.cell_timeout else "时间限制"
            return (f"{self._cell()}运行超过{limit}被中止：是不是有死循环，或者在等待一个永远不会就绪的资源？"
                    "后面的单元格都没有运行。")
        if kind is ErrorKind.TIMEOUT:
            limit = f" {self.timeout:g} 秒" if self.timeout else "时间限制"
            where = f"，当时正在运行{self._cell()}" if self.cell_index is not None else ""
            return f"整个笔记本运行超过{limit}被中止{where}。"
        if kind is ErrorKind.KILLED:
            return "运行笔记本的进程被系统终止了（常见原因是内存用尽）。"
        if kind is ErrorKind.KERNEL_DIED:
            return "内核在运行中意外退出（例如代码调用了 os._exit()，或内存用尽）。"
        if kind is ErrorKind.INVALID_NOTEBOOK:
            return "提交的文件不是有效的 Jupyter 笔记本（无法按 JSON 解析），因此没有运行。"
        if kind is ErrorKind.NO_PARAMETERS_CELL:
            return ("笔记本里找不到带 parameters 标签的单元格（可能被删除或去掉了标签），评分器无法注入命名空间等参数，"
                    "因此没有运行。请在 labs/ 里的原始实验笔记本上完成作答。")
        return "评分器运行笔记本时出现内部错误，这不是你的问题，请联系讲师。"


# --------------------------------------------------------------------------- process tree handling


def _descendants(pid: int) -> list[Any]:
    try:
        import psutil

        return psutil.Process(pid).children(recursive=True)
    except Exception:  # noqa: BLE001 - the child may already be gone
        return []


def _kill(proc: subprocess.Popen[bytes], tracked: dict[tuple[int, float], Any]) -> None:
    """SIGKILL the child's process group, every process group it created, and every tracked process."""
    own_group = os.getpgrp()
    groups = {proc.pid}  # the child leads its own session (start_new_session=True)
    for p in tracked.values():
        with contextlib.suppress(Exception):  # gone meanwhile
            if p.is_running():  # identity check: never look up the group of a reused pid
                groups.add(os.getpgid(p.pid))
    for group in groups - {own_group}:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    for p in tracked.values():
        with contextlib.suppress(Exception):
            p.kill()  # psutil checks the process identity, so a reused pid is never hit
    with contextlib.suppress(Exception):
        import psutil

        psutil.wait_procs(list(tracked.values()), timeout=5)


def _track(pid: int, tracked: dict[tuple[int, float], Any]) -> None:
    for p in _descendants(pid):
        try:
            tracked.setdefault((p.pid, p.create_time()), p)
        except Exception:  # noqa: BLE001 - exited between listing and inspection
            continue


# --------------------------------------------------------------------------- notebook helpers


def _has_parameters_cell(nb: nbformat.NotebookNode) -> bool:
    return any("parameters" in (c.get("metadata", {}).get("tags") or []) for c in nb.cells)


def _original_index(submitted: nbformat.NotebookNode, output_path: Path | None, index: int | None
                    ) -> int | None:
    """Map a cell index of papermill's notebook (with the injected cell) back to the submission."""
    if index is None:
        return None
    executed = None
    if output_path is not None and output_path.exists():
        try:
            executed = nbformat.read(output_path, as_version=4)
        except Exception:  # noqa: BLE001 - partially written on kill
            executed = None
    if executed is not None:
        # papermill adds a banner and an anchor cell to the saved notebook after it has computed the index.
        executed.cells = [c for c in executed.cells
                          if "papermill-error-cell-tag" not in (c.get("metadata", {}).get("tags") or [])]
    if executed is not None and 0 <= index < len(executed.cells):
        cell_id = executed.cells[index].get("id")
        ids = [c.get("id") for c in submitted.cells]
        if cell_id and cell_id in ids:
            return ids.index(cell_id)
        tags = executed.cells[index].get("metadata", {}).get("tags") or []
        if "injected-parameters" in tags:
            return None
        injected = next((i for i, c in enumerate(executed.cells)
                         if "injected-parameters" in (c.get("metadata", {}).get("tags") or [])), None)
        if injected is not None and index > injected:
            index -= 1
    return index if 0 <= index < len(submitted.cells) else None


def _last_started_cell(output_path: Path | None) -> int | None:
    """The cell that was running when execution stopped, in papermill's indexing.

    papermill saves the notebook as each cell starts (status "running") and
    marks cells it never reached "pending"; after a per-cell timeout the
    stuck cell is the last one that is not pending.
    """
    if output_path is None or not output_path.exists():
        return None
    try:
        nb = nbformat.read(output_path, as_version=4)
    except Exception:  # noqa: BLE001 - partially written when the child was killed
        return None
    cells = [c for c in nb.cells if "papermill-error-cell-tag" not in (c.get("metadata", {}).get("tags") or [])]
    started = [i for i, c in enumerate(cells)
               if c.get("metadata", {}).get("papermill", {}).get("status") in ("running", "completed", "failed")]
    return started[-1] if started else None


# --------------------------------------------------------------------------- runner


@dataclass
class Runner:
    """Runs notebooks with fixed limits and an explicit kernel environment.

    ``env`` is added to the few variables inherited from the grader
    (:data:`DEFAULT_INHERITED_ENV`); pass e.g. ``{"KUBECONFIG": restricted}``
    so that submissions talk to the cluster as a restricted identity. The
    grader's own ``KUBECONFIG`` is never inherited.

    With a ``jail`` (:class:`gpulab.grading.jail.Jail`) papermill and the
    kernel run confined: a copy of the notebook in a private run directory,
    no view of the host beyond system directories, Python, the package and the
    lab manifests (never ``solutions/``), and, in the namespaces sandbox, no
    network but the apiserver of ``KUBECONFIG``. Outputs are moved to
    ``work_dir`` afterwards, so callers see the same files either way.

    In the jail the kernel is started, and the modules of ``preload``
    imported in it, before the notebook is handed over. With ``warm`` (a
    batch), that many such *standbys* are kept started for the next
    submissions, each in a jail of its own: when a run ends, another starts
    while the grader collects, cleans up and prepares the next namespace, and
    the next run takes it. A submission never shares a jail, kernel or run
    directory with another; its wall-clock limit counts from when it is handed
    over. :meth:`close` stops the standbys left.
    """

    kernel_name: str = "python3"
    cell_timeout: float | None = 120.0
    timeout: float = 900.0
    start_timeout: float = 60.0
    env: Mapping[str, str] = field(default_factory=dict)
    inherit_env: Sequence[str] = DEFAULT_INHERITED_ENV
    python: str = sys.executable
    poll_interval: float = 0.25
    jail: Any = None
    warm: int = 0
    preload: Sequence[str] = PRELOAD
    _standbys: list[_Standby] = field(default_factory=list, init=False, repr=False)
    _standby_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _closed: bool = field(default=False, init=False, repr=False)

    def child_env(self, extra: Mapping[str, str] | None = None, runtime_dir: Path | None = None) -> dict[str, str]:
        env = {k: os.environ[k] for k in self.inherit_env if k in os.environ}
        env.update(self.env)
        env.update(extra or {})
        # The child and the kernel must import this very gpulab (record() lives in it).
        root = str(Path(gpulab.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        env.setdefault("PYTHONUNBUFFERED", "1")
        if self.python == sys.executable:
            # Resolve kernel "python3" to this interpreter's kernelspec before any user-level one.
            env["JUPYTER_PATH"] = os.pathsep.join(
                p for p in (str(Path(sys.prefix) / "share" / "jupyter"), env.get("JUPYTER_PATH", "")) if p)
        if runtime_dir is not None:
            env["JUPYTER_RUNTIME_DIR"] = str(runtime_dir)
        return env

    def run(self, notebook: str | Path, work_dir: str | Path, parameters: Mapping[str, Any] | None = None,
            cwd: str | Path | None = None, env: Mapping[str, str] | None = None, name: str | None = None
            ) -> Execution:
        """Execute ``notebook``; outputs go to ``work_dir/<name>.*``. Never raises for a bad notebook."""
        notebook = Path(notebook)
        work_dir = Path(work_dir)
        work_dir.mkdir(parents=True, exist_ok=True)
        name = name or notebook.stem
        output_path = work_dir / f"{name}.executed.ipynb"
        results_path = work_dir / f"{name}.results.json"
        log_path = work_dir / f"{name}.log"
        for stale in (output_path, results_path, log_path):
            stale.unlink(missing_ok=True)
        params = {"results_path": str(results_path.resolve()), **(parameters or {})}
        base = dict(notebook=notebook, results_path=results_path, parameters=params,
                    cell_timeout=self.cell_timeout, timeout=self.timeout)

        try:
            submitted = nbformat.reads(notebook.read_text(encoding="utf-8"), as_version=4)
            if not isinstance(submitted.get("cells"), list):
                raise ValueError("no 'cells' list")
        except Exception as exc:  # noqa: BLE001 - any unreadable file is the submission's problem
            return Execution(ok=False, error=ErrorKind.INVALID_NOTEBOOK,
                             message=f"not a readable notebook: {type(exc).__name__}: {str(exc)[:200]}", **base)
        if not _has_parameters_cell(submitted):
            return Execution(ok=False, error=ErrorKind.NO_PARAMETERS_CELL,
                             message="no cell tagged 'parameters'; refusing to run with uninjectable parameters",
                             **base)

        if self.jail is not None:
            try:
                returncode, timed_out, duration, child_result = self._run_jailed(
                    notebook, params, cwd, env, output_path, results_path, log_path)
            except Exception as exc:  # noqa: BLE001 - a jail that cannot be set up is the grader's problem
                return Execution(ok=False, error=ErrorKind.RUNNER_ERROR, executed=True,
                                 message=f"cannot start the grading jail: {type(exc).__name__}: {exc}", **base)
        else:
            runtime_dir = work_dir / f".{name}.runtime"
            runtime_dir.mkdir(exist_ok=True)
            spec_path = work_dir / f".{name}.spec.json"
            child_result = work_dir / f".{name}.result.json"
            child_result.unlink(missing_ok=True)
            spec = {"input": str(notebook.resolve()), "output": str(output_path.resolve()), "parameters": params,
                    "kernel_name": self.kernel_name, "cell_timeout": self.cell_timeout,
                    "start_timeout": self.start_timeout, "cwd": str(Path(cwd or notebook.parent).resolve()),
                    "result_path": str(child_result.resolve())}
            spec_path.write_text(json.dumps(spec), encoding="utf-8")
            returncode, timed_out, duration = self._supervise(
                [self.python, "-m", "gpulab.grading._papermill_child", str(spec_path)],
                self.child_env(env, runtime_dir), spec["cwd"], log_path)
            shutil.rmtree(runtime_dir, ignore_errors=True)
            spec_path.unlink(missing_ok=True)
        base.update(duration_s=duration, output_path=output_path if output_path.exists() else None,
                    log_path=log_path, executed=True)

        if timed_out:
            index = _original_index(submitted, output_path, _last_started_cell(output_path))
            return Execution(ok=False, error=ErrorKind.TIMEOUT, cell_index=index,
                             cell_source=submitted.cells[index].source if index is not None else "",
                             message=f"wall-clock limit of {self.timeout:g}s exceeded; process tree killed", **base)
        try:
            result = json.loads(child_result.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            result = None
        finally:
            child_result.unlink(missing_ok=True)
        if result is None:
            if returncode < 0:
                sig = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else -returncode
                return Execution(ok=False, error=ErrorKind.KILLED, message=f"runner killed by signal {sig}", **base)
            tail = log_path.read_text(encoding="utf-8", errors="replace")[-1500:] if log_path.exists() else ""
            return Execution(ok=False, error=ErrorKind.RUNNER_ERROR, traceback=tail,
                             message=f"runner exited with status {returncode} without a result", **base)
        kind = result.get("kind")
        if kind is None:
            return Execution(ok=True, message="ok", **base)
        error = ErrorKind(kind)
        index = result.get("cell_index")
        if error is ErrorKind.CELL_TIMEOUT and index is None:
            index = _last_started_cell(output_path)
        index = _original_index(submitted, output_path, index)
        ename, evalue = result.get("ename"), result.get("evalue")
        where = f"cell {index}" if index is not None else "a cell"
        messages = {
            ErrorKind.CELL_ERROR: f"{where} raised {ename}: {str(evalue)[:200]}",
            ErrorKind.SYS_EXIT: f"{where} called sys.exit({evalue})",
            ErrorKind.CELL_TIMEOUT: f"{where} exceeded the per-cell limit of {self.cell_timeout}s",
            ErrorKind.KERNEL_DIED: f"kernel died: {str(evalue)[:200]}",
            ErrorKind.RUNNER_ERROR: f"papermill failed: {ename}: {str(evalue)[:200]}",
        }
        return Execution(ok=False, error=error, cell_index=index, ename=ename, evalue=evalue,
                         cell_source=submitted.cells[index].source if index is not None else "",
                         traceback=result.get("traceback", ""), message=messages.get(error, kind), **base)


    def _supervise(self, argv: list[str], env: Mapping[str, str], cwd: str, log_path: Path
                   ) -> tuple[int, bool, float]:
        """Run ``argv`` in its own session under the wall-clock limit; kill its whole tree afterwards."""
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv, env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            return self._watch(proc, {}, time.monotonic())

    def _watch(self, proc: subprocess.Popen[bytes], tracked: dict[tuple[int, float], Any], started: float
               ) -> tuple[int, bool, float]:
        """Wait for ``proc`` until ``timeout`` seconds after ``started``; then kill its whole tree."""
        timed_out = False
        deadline = started + self.timeout
        while True:
            _track(proc.pid, tracked)
            try:
                proc.wait(timeout=self.poll_interval)
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    timed_out = True
                    break
        # Kill on timeout, and also sweep up what a finished run left behind (background processes).
        _kill(proc, tracked)
        returncode = proc.wait()
        return returncode, timed_out, round(time.monotonic() - started, 3)

    def _shape(self, cwd: str | Path | None, env: Mapping[str, str] | None, work_dir: Path) -> _Shape:
        """What a standby must have been started for to run this submission: everything but its identity."""
        extra = dict(env or {})
        kubeconfig = extra.pop("KUBECONFIG", None)
        return _Shape(str(Path(cwd).resolve()) if cwd else None, tuple(sorted(extra.items())),
                      kubeconfig is not None, self.jail.upstream(Path(kubeconfig)) if kubeconfig else None,
                      str(work_dir.resolve()))

    def _start_standby(self, shape: _Shape) -> _Standby:
        """A jail with papermill's child in it, its kernel starting, waiting for a submission (see _papermill_child)."""
        jail = self.jail
        run_dir = jail.make_run_dir()
        standby = _Standby(shape, run_dir)
        try:
            kernel_cwd = Path(shape.cwd) if shape.cwd else None
            if kernel_cwd is None or not any(kernel_cwd == k or k in kernel_cwd.parents for k in jail.kept()):
                kernel_cwd = run_dir
            kernel_env, _ = jail.kernel_env(self.child_env(dict(shape.env), run_dir / ".runtime"), run_dir)
            if shape.identity:  # whose identity it runs as is known once its submission is there
                kernel_env["KUBECONFIG"] = str(jail.place_kubeconfig(run_dir))
            child_spec = {"kernel_name": self.kernel_name, "start_timeout": self.start_timeout,
                          "cwd": str(kernel_cwd), "preload": list(self.preload), "go_path": str(standby.go_path)}
            child_spec_path = run_dir / ".spec.json"
            child_spec_path.write_text(json.dumps(child_spec), encoding="utf-8")
            jail.own(child_spec_path)
            argv = [self.python, "-m", "gpulab.grading._papermill_child", str(child_spec_path)]
            upstream = shape.upstream
            standby.spec = jail.spec(argv, kernel_env, kernel_cwd, run_dir, upstream[1] if upstream else None)
            jail_spec_path = run_dir / ".jail.json"
            jail_spec_path.write_text(json.dumps(standby.spec), encoding="utf-8")
            standby.stack.enter_context(jail.relay(run_dir / "apiserver.sock", upstream))
            standby.log_path = Path(shape.work_dir) / f".standby-{run_dir.name}.log"
            standby.log = open(standby.log_path, "wb")  # noqa: SIM115 - closed by _Standby.discard
            standby.proc = subprocess.Popen(jail.command(jail_spec_path), env={"PATH": "/usr/bin:/bin"},
                                            cwd=str(run_dir), stdin=subprocess.DEVNULL, stdout=standby.log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        except BaseException:
            standby.discard(jail)
            raise
        return standby

    def _take_standby(self, shape: _Shape) -> _Standby | None:
        """A started standby of this shape whose process is still waiting, if there is one."""
        with self._standby_lock:
            for standby in list(self._standbys):
                if standby.shape == shape:
                    self._standbys.remove(standby)
                    if standby.proc is not None and standby.proc.poll() is None:
                        return standby
                    standby.discard(self.jail)
        return None

    def _refill(self, shape: _Shape) -> None:
        """Start a standby for the next submission like this one, while ``warm`` asks for one.

        In the calling thread, which lives on (the run's, or a grading pool's): the jail's processes get
        SIGKILL when the thread that started them ends (``setpriv --pdeathsig``).
        """
        with self._standby_lock:
            if self._closed or sum(s.shape == shape for s in self._standbys) >= self.warm:
                return
        try:
            standby = self._start_standby(shape)
        except Exception:  # noqa: BLE001 - the next run starts cold then
            return
        with self._standby_lock:
            if not self._closed:
                self._standbys.append(standby)
                return
        standby.discard(self.jail)

    def close(self) -> None:
        """Stop the standbys started for submissions that never came."""
        with self._standby_lock:
            self._closed = True
            standbys, self._standbys = self._standbys, []
        for standby in standbys:
            standby.discard(self.jail)

    def _run_jailed(self, notebook: Path, params: dict[str, Any], cwd: str | Path | None,
                    env: Mapping[str, str] | None, output_path: Path, results_path: Path, log_path: Path
                    ) -> tuple[int, bool, float, Path]:
        """Run papermill inside the jail on a private copy; move what it wrote to the caller's paths."""
        jail = self.jail
        work_dir = output_path.parent
        shape = self._shape(cwd, env, work_dir)
        standby = self._take_standby(shape) or self._start_standby(shape)
        run_dir = standby.run_dir
        try:
            run_input = run_dir / "submission.ipynb"
            shutil.copyfile(notebook, run_input)
            jail.own(run_input)
            if env and env.get("KUBECONFIG"):
                jail.place_kubeconfig(run_dir, env["KUBECONFIG"])
            run_output, run_results = run_dir / "executed.ipynb", run_dir / "results.json"
            child_result = run_dir / ".result.json"
            params = dict(params)
            if params.get("results_path") == str(results_path.resolve()):
                params["results_path"] = str(run_results)
            os.replace(standby.log_path, log_path)  # the open log follows
            standby.log_path = log_path
            standby.go({"input": str(run_input), "output": str(run_output), "parameters": params,
                        "cell_timeout": self.cell_timeout, "result_path": str(child_result)}, jail)
            handed_over = time.monotonic()
            if self.warm:
                self._refill(shape)  # the next submission's kernel starts while this one runs
            assert standby.proc is not None
            returncode, timed_out, duration = self._watch(standby.proc, standby.tracked, handed_over)
            for produced, final in ((run_output, output_path), (run_results, results_path)):
                _take_regular_file(produced, final)
            kept_result = results_path.with_name(f".{results_path.stem}.child.json")
            _take_regular_file(child_result, kept_result)
            return returncode, timed_out, duration, kept_result
        finally:
            standby.discard(jail)


@dataclass(frozen=True)
class _Shape:
    """What a jailed run is started with before its submission is known (see Runner.warm)."""

    cwd: str | None               # the kernel's working directory asked for (None: the run directory)
    env: tuple[tuple[str, str], ...]  # the caller's environment for the kernel, but KUBECONFIG
    identity: bool                # it runs with a KUBECONFIG (written into the jail when the submission comes)
    upstream: tuple[str, int] | None  # the apiserver the jail relays to
    work_dir: str                 # where the run's files go


@dataclass
class _Standby:
    """One jailed papermill child, its kernel started, waiting for a submission (see Runner.warm)."""

    shape: _Shape
    run_dir: Path
    spec: dict[str, Any] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    log: Any = None
    log_path: Path | None = None
    tracked: dict[tuple[int, float], Any] = field(default_factory=dict)
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    @property
    def go_path(self) -> Path:
        return self.run_dir / ".go.json"

    def go(self, submission: Mapping[str, Any], jail: Any) -> None:
        """Hand the submission over (atomically: the child reads the file once it is there)."""
        tmp = self.run_dir / ".go.json.tmp"
        tmp.write_text(json.dumps(dict(submission)), encoding="utf-8")
        jail.own(tmp)
        os.replace(tmp, self.go_path)

    def discard(self, jail: Any) -> None:
        """Kill what it runs, stop its relay, remove its jail and run directory. Idempotent."""
        if self.proc is not None:
            _track(self.proc.pid, self.tracked)
            _kill(self.proc, self.tracked)
            with contextlib.suppress(Exception):
                self.proc.wait(timeout=10)
            self.proc = None
        self.stack.close()
        if self.log is not None:
            self.log.close()
            self.log = None
        if self.log_path is not None and self.log_path.name.startswith(".standby-"):
            self.log_path.unlink(missing_ok=True)  # never handed a submission: nothing to keep
        if self.spec:
            jail.cleanup(self.spec)
            self.spec = {}
        shutil.rmtree(self.run_dir, ignore_errors=True)


# A submission controls every file in its run directory: take only regular files, never what a link points at.
_MAX_TAKEN_BYTES = 64 << 20


def _take_regular_file(source: Path, target: Path) -> None:
    import stat

    target.unlink(missing_ok=True)
    try:
        st = os.lstat(source)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_TAKEN_BYTES:
        return
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as src, open(target, "wb") as dst:
        shutil.copyfileobj(src, dst)


def execute_notebook(notebook: str | Path, work_dir: str | Path, parameters: Mapping[str, Any] | None = None,
                     **runner_options: Any) -> Execution:
    """One-off convenience: ``Runner(**runner_options).run(notebook, work_dir, parameters)``."""
    return Runner(**runner_options).run(notebook, work_dir, parameters)
