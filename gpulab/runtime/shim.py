"""The container shim: what keeps a container's process alive while the node agent restarts.

A real node runs each container under a shim of its runtime
(``containerd-shim``), not under the kubelet: the kubelet may crash or be
restarted and find its containers still running. gpulab does the same. For
each run of a container with a command the node agent starts

    python -m gpulab.runtime.shim RUN_DIR LOG_FILE

in a session of its own. The shim starts the sandboxed process
(:func:`gpulab.runtime.sandbox.launch`, spec in ``RUN_DIR/sandbox.json``),
copies its stdout and stderr into the CRI log, and when the process ends
writes its exit status. Files in ``RUN_DIR``:

- ``shim.json``: ``{"shim_pid", "shim_start", "pid", "started_at"}``, written
  once the process runs (``pid`` is the sandbox's, the leader of its own
  process group; ``shim_start`` the shim's start time, so a reused pid is
  never mistaken for the shim, see :mod:`gpulab._proc`);
- ``exit.json``: ``{"returncode", "finished_at"}`` (``returncode`` as
  :attr:`subprocess.Popen.returncode`: negative for a signal);
- ``stop-reason``: written by the agent before it stops the process on
  purpose (see :meth:`ShimHandle.stop`), so that an agent started later can
  tell "stopped with the node" from "crashed".

The sandbox dies with its shim (parent-death signal), so stopping a shim
stops its container. :func:`stop_orphans` does that for every shim under a
cluster's pod directory when the cluster goes down.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .. import _poll, _proc
from .._fsutil import atomic_write_json
from . import logs, sandbox

SHIM_FILE = "shim.json"
EXIT_FILE = "exit.json"
STOP_REASON_FILE = "stop-reason"
SPEC_FILE = "sandbox.json"
# How long the agent waits for a new shim to report its process.
START_TIMEOUT = 15.0


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class ShimError(OSError):
    """The shim could not start the container's process."""


class _TimedOut(Exception):
    """:meth:`ShimHandle.wait`'s timeout, which it answers with None."""


class ShimHandle:
    """The node agent's view of one container run kept by a shim (started now or found after a restart)."""

    def __init__(self, run_dir: Path, popen: subprocess.Popen | None = None):
        self.run_dir = Path(run_dir)
        self._popen = popen  # set only for a shim this agent started: reaped through it
        info = _read_json(self.run_dir / SHIM_FILE) or {}
        self.shim_pid: int | None = info.get("shim_pid")
        self.shim_start: int | None = info.get("shim_start")
        self.pid: int | None = info.get("pid")
        self.started_at: float | None = info.get("started_at")
        self._sent: int | None = None  # the last signal this handle sent the container

    # -- starting and finding ----------------------------------------------------

    @classmethod
    def start(cls, spec: sandbox.SandboxSpec, run_dir: Path, log_path: Path) -> "ShimHandle":
        """Start a shim for ``spec``; returns once its process runs. Raises ShimError."""
        run_dir.mkdir(parents=True, exist_ok=True)
        for name in (SHIM_FILE, EXIT_FILE, STOP_REASON_FILE):
            (run_dir / name).unlink(missing_ok=True)
        sandbox.write_spec(spec, run_dir / SPEC_FILE)
        with open(run_dir / "shim.log", "ab") as err:
            popen = subprocess.Popen(
                [sys.executable, "-m", "gpulab.runtime.shim", str(run_dir), str(log_path)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                start_new_session=True, close_fds=True,
            )

        def failed(_last: object = None) -> ShimError:
            if popen.poll() is None:
                popen.kill()
                popen.wait()
            why = (run_dir / "shim.log").read_text(errors="replace").strip().splitlines()
            return ShimError(f"the container's shim did not start its process: {why[-1] if why else 'no output'}")

        def started() -> bool:
            if (run_dir / SHIM_FILE).exists():
                return True
            if popen.poll() is not None:
                raise failed()
            return False

        _poll.until(started, START_TIMEOUT, failed, interval=0.01)
        return cls(run_dir, popen)

    @classmethod
    def find(cls, run_dir: Path) -> "ShimHandle | None":
        """The shim of an earlier agent, if it left a record in ``run_dir``."""
        handle = cls(run_dir)
        return handle if handle.shim_pid is not None else None

    # -- state -----------------------------------------------------------------

    def shim_alive(self) -> bool:
        if self._popen is not None:
            return self._popen.poll() is None
        return self.shim_pid is not None and _proc.alive(self.shim_pid, self.shim_start)

    def exit_status(self) -> dict[str, Any] | None:
        """``{"returncode", "finished_at"}`` once the process ended, else None."""
        status = _read_json(self.run_dir / EXIT_FILE)
        if status is not None and self._popen is not None:
            self._popen.poll()  # reap the shim, which exits right after writing
        return status

    def lost(self) -> bool:
        """The shim is gone without an exit status: the process died with it."""
        return not self.shim_alive() and self.exit_status() is None

    def stop_reason(self) -> str:
        try:
            return (self.run_dir / STOP_REASON_FILE).read_text().strip()
        except OSError:
            return ""

    # -- stopping ----------------------------------------------------------------

    def signal(self, sig: int) -> None:
        """Signal the container's processes (:func:`gpulab.runtime.sandbox.signal_sandbox`)."""
        if self.pid is None:
            return
        self._sent = sig
        sandbox.signal_sandbox(self.run_dir / SPEC_FILE, self.pid, sig)

    def wait(self, timeout: float) -> dict[str, Any] | None:
        """Wait up to ``timeout`` seconds for the exit status; None if it did not come (or the shim died)."""
        def ended() -> tuple[dict[str, Any] | None] | None:
            # In a tuple: a shim that died without a status ends the wait too, with None.
            status = self.exit_status()
            if status is not None:
                return (status,)
            if not self.shim_alive():
                return (self.exit_status(),)
            return None

        try:
            return _poll.until(ended, max(timeout, 0.0), lambda _: _TimedOut(), interval=0.02)[0]
        except _TimedOut:
            return None

    def stop(self, grace: float, why: str = "") -> dict[str, Any] | None:
        """SIGTERM, SIGKILL after ``grace`` seconds; the exit status, or None if the shim vanished."""
        if why:
            try:
                (self.run_dir / STOP_REASON_FILE).write_text(why)
            except OSError:
                pass
        if self.exit_status() is None:
            self.signal(signal.SIGTERM)
            if self.wait(grace or 0.01) is None:
                self.signal(signal.SIGKILL)
                if self.wait(5) is None:
                    self.kill_shim()
        status = self.exit_status()
        if status is not None:
            status = dict(status, returncode=sandbox.signalled_status(self.run_dir / SPEC_FILE,
                                                                      status["returncode"], self._sent))
        return status

    def kill_shim(self) -> None:
        """Kill the shim itself (its sandbox follows through the parent-death signal)."""
        if self.shim_alive() and self.shim_pid is not None:
            try:
                os.kill(self.shim_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.signal(signal.SIGKILL)
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)  # the sandbox's leader too
        if self._popen is not None:
            self._popen.wait()


def stop_orphans(pods_dir: Path) -> int:
    """Stop every shim still running under ``pods_dir`` (the node agent is gone); returns how many."""
    stopped = 0
    for info in Path(pods_dir).glob(f"*/run/*/{SHIM_FILE}"):
        handle = ShimHandle(info.parent)
        if handle.shim_alive():
            handle.kill_shim()
            stopped += 1
    return stopped


# -- the shim process ------------------------------------------------------------


def main(argv: list[str]) -> int:
    run_dir, log_path = Path(argv[1]), Path(argv[2])
    # The node agent stops a container by signalling its process group, never the
    # shim; a stray SIGTERM or SIGINT (a terminal's Ctrl-C) must not orphan the log.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    writer = logs.LogWriter(log_path)
    proc = sandbox.launch_spec_file(run_dir / SPEC_FILE, subprocess.PIPE, subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    pumps = [writer.pump(proc.stdout, "stdout"), writer.pump(proc.stderr, "stderr")]
    atomic_write_json(run_dir / SHIM_FILE, {
        "shim_pid": os.getpid(), "shim_start": _proc.started(os.getpid()),
        "pid": proc.pid, "started_at": time.time(),
    })
    rc = proc.wait()
    for t in pumps:
        t.join(timeout=5)
    writer.close()
    atomic_write_json(run_dir / EXIT_FILE, {"returncode": rc, "finished_at": time.time()})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
