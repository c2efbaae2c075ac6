"""The shell: run a command as a terminal in the repository root would, and see its output as it comes.

``sh`` is how a lesson runs ``kubectl``, ``gpulab`` and pipes; unlike a
``!cmd`` cell it fails the cell when the command fails. ``REPO`` is the
directory every command (and every manifest path) is relative to.

kubectl's "The connection to the server 127.0.0.1:… was refused" never stands
alone: ``sh`` follows it with what to run (:func:`_unreachable_note`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading

from .. import paths

__all__ = ["REPO", "Output", "CommandFailed", "have", "sh"]

REPO = paths.repo_root()


class Output(str):
    """What :func:`sh` returns: the command's output as a ``str``, which a notebook does not echo a second time."""

    def _ipython_display_(self) -> None:  # already printed while the command ran
        pass


class CommandFailed(RuntimeError):
    """Raised by :func:`sh` when a command exits non-zero and ``check`` is true."""

    def __init__(self, cmd: str, returncode: int, output: str, note: str | None = None):
        self.cmd, self.returncode, self.output = cmd, returncode, output
        super().__init__(f"命令失败（退出码 {returncode}）：{cmd}" + (f"\n{note}" if note else ""))


#: The cell that starts the cluster, as a lesson's notes name it.
FIRST_CELL = "本 notebook 的第一个代码格 setup()"


def _unreachable_note(output: str) -> str | None:
    """What to run when ``output`` has kubectl's connection error (a stopped cluster, or an old address); else None."""
    from ..cluster import backend

    return backend.unreachable_note(FIRST_CELL) if backend.UNREACHABLE.search(output) else None


def have(program: str) -> bool:
    """Whether ``program`` is on PATH (e.g. ``have("jq")``)."""
    return shutil.which(program) is not None


def sh(cmd: str, check: bool = True, timeout: float = 120, echo: bool = True, quiet: bool = False,
       tail: int | None = None) -> Output:
    """Run ``cmd`` with bash, as a terminal would, and return its output (stdout and stderr together).

    Prints ``$ cmd`` and then the output line by line while it runs (``quiet``
    prints nothing; ``tail=N`` prints only the last N lines, once the command
    has ended — for chatty commands such as ``kubectl rollout status``; the
    whole output is still returned). A non-zero exit raises :class:`CommandFailed` unless
    ``check=False`` — so a lesson cell cannot fail silently, as a failing
    ``!cmd`` would. Pipes behave as in a terminal: the exit status is the last
    command's (``... | grep x`` is 1 when nothing matched).
    """
    if echo and not quiet:
        print(f"$ {cmd}", flush=True)
    proc = subprocess.Popen(["bash", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, errors="replace", cwd=REPO,
                            start_new_session=True)
    timed_out = threading.Event()

    def kill() -> None:
        timed_out.set()
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass

    timer = threading.Timer(timeout, kill)
    timer.start()
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if not quiet and tail is None:
                print(line, end="", flush=True)
        proc.wait()
    finally:
        timer.cancel()
    out = "".join(lines)
    if tail is not None and not quiet:
        print("".join(lines[-tail:]), end="", flush=True)
    if timed_out.is_set():
        raise TimeoutError(f"命令 {timeout:g} 秒还没结束，已终止：{cmd}")
    note = _unreachable_note(out)
    if note and not quiet:
        print(f"⚠ {note}", flush=True)
    if check and proc.returncode != 0:
        raise CommandFailed(cmd, proc.returncode, out, note)
    return Output(out)
