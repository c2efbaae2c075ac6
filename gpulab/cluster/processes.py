"""Starting, finding and stopping the cluster's host processes.

Each component is started detached (its own session, output to
``logs/<name>.log``) so it outlives the ``gpulab up`` that started it; its pid
and command line are recorded under ``pids/``. A pid alone is not trusted:
a process counts as ours only if its command line still matches, so a reused
pid is never signalled.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Callable, Iterable

from .. import _poll, _proc, i18n


@dataclasses.dataclass
class Component:
    name: str
    argv: list[str]
    # A callable that returns True once the component serves.
    ready: Callable[[], bool]
    env: dict[str, str] | None = None
    # What its command line starts with once it runs, when argv[0] is a wrapper that execs the program
    # (nsenter): the record must name the program, or the running process would not be recognised.
    argv0: str | None = None


#: A component just spawned, and its process.
Started = tuple[Component, subprocess.Popen]


class StartError(RuntimeError):
    pass


class _TimedOut(Exception):
    """A wait whose timeout is not an error: :meth:`ProcessTable.stop`'s grace running out."""


def free_port(preferred: int | None = None) -> int:
    """``preferred`` if it can be bound on 127.0.0.1, else any free port."""
    if preferred and port_is_free(preferred):
        return preferred
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    """Whether a server could listen on 127.0.0.1:``port`` now.

    Binds as the servers themselves do: Go's net.Listen (etcd, the Kubernetes
    components, kwok) and Python's http.server set SO_REUSEADDR. A port whose
    last listener just exited still has its accepted connections in TIME_WAIT
    for a minute; they do not stop such a server, so they must not make
    `gpulab up` move the port. A socket listening on it does.
    """
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def who_listens(port: int) -> str:
    """Best effort: the program holding a TCP port (for error messages)."""
    try:
        import psutil

        for c in psutil.net_connections("tcp"):
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
                return f"{psutil.Process(c.pid).name()} (pid {c.pid})"
    except Exception:
        pass
    return "another program"


class ProcessTable:
    """The pid files of one cluster directory."""

    def __init__(self, root: Path):
        self.pids = root / "pids"
        self.logs = root / "logs"

    def _record(self, name: str) -> Path:
        return self.pids / f"{name}.json"

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def pid(self, name: str) -> int | None:
        """The live pid of ``name``, or None if it is not running."""
        try:
            rec = json.loads(self._record(name).read_text())
        except (OSError, ValueError):
            return None
        pid = rec.get("pid")
        if not isinstance(pid, int) or not _alive(pid):
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        if not cmdline or os.fsdecode(cmdline[0]) != rec.get("argv0"):
            return None
        return pid

    def running(self) -> dict[str, int]:
        out = {}
        if self.pids.is_dir():
            for rec in sorted(self.pids.glob("*.json")):
                pid = self.pid(rec.stem)
                if pid:
                    out[rec.stem] = pid
        return out

    def spawn(self, comp: Component) -> subprocess.Popen:
        """Start ``comp`` detached; see :meth:`wait_ready`."""
        self.pids.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.log(comp.name), "ab") as log:
            log.write(f"\n==== gpulab: starting {comp.name} at {time.strftime('%F %T')} ====\n".encode())
            log.flush()
            proc = subprocess.Popen(
                comp.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # Components log in English, whatever the language of the `gpulab up` that starts them:
                # LANGUAGE is what gettext reads first (gpulab/i18n.py), and it moves nothing but messages.
                env={**(comp.env or os.environ), "LANGUAGE": i18n.ENGLISH},
                close_fds=True,
            )
        self._record(comp.name).write_text(json.dumps({"pid": proc.pid, "argv0": comp.argv0 or comp.argv[0]}))
        return proc

    def wait_ready(self, started: list[Started], timeout: float) -> None:
        """Wait until every component serves; stop the ones that do not and raise."""
        pending = list(started)

        def all_ready() -> bool:
            for comp, proc in list(pending):
                self._check_alive(comp, proc)
                if comp.ready():
                    pending.remove((comp, proc))
            return not pending

        def timed_out(_last: object) -> StartError:
            comp = pending[0][0]
            for c, _ in pending:
                self.stop(c.name, grace=3)
            return StartError(
                f"{comp.name} did not become ready within {timeout:.0f} s; "
                f"last lines of {self.log(comp.name)}:\n{tail(self.log(comp.name))}"
            )

        _poll.until(all_ready, timeout, timed_out, interval=0.05)

    def wait_for(self, what: str, done: Callable[[], bool], by: Started,
                 timeout: float) -> None:
        """Wait until ``done()``: something the starting component ``by`` makes before it serves (the node
        agent's pod network). Its exit ends the wait at once, as in :meth:`wait_ready`."""
        comp, proc = by

        def made() -> bool:
            self._check_alive(comp, proc)
            return done()

        def timed_out(_last: object) -> StartError:
            return StartError(f"{comp.name} did not make {what} within {timeout:.0f} s; "
                              f"last lines of {self.log(comp.name)}:\n{tail(self.log(comp.name))}")

        _poll.until(made, timeout, timed_out, interval=0.05)

    def _check_alive(self, comp: Component, proc: subprocess.Popen) -> None:
        if proc.poll() is not None:
            raise StartError(
                f"{comp.name} exited with code {proc.returncode} while starting; "
                f"last lines of {self.log(comp.name)}:\n{tail(self.log(comp.name))}"
            )

    def stop(self, name: str, grace: float = 10.0) -> bool:
        """Stop ``name`` (SIGTERM, SIGKILL after ``grace``); whether it ran."""
        return bool(self.stop_all([name], grace))

    def stop_all(self, names: Iterable[str], grace: float = 10.0) -> list[str]:
        """Stop ``names`` together: each gets SIGTERM at once, and whichever still runs ``grace`` seconds later
        SIGKILL. Returns the names that ran, in the order given."""
        signalled = []
        for name in names:
            pid = self.pid(name)
            self._record(name).unlink(missing_ok=True)
            if pid:
                _signal_group(pid, signal.SIGTERM)
                signalled.append((name, pid))
        deadline = time.monotonic() + grace
        for _name, pid in signalled:
            try:
                _poll.until(lambda pid=pid: _exited(pid), max(0.0, deadline - time.monotonic()),
                            lambda _: _TimedOut(), interval=0.05)
            except _TimedOut:
                pass
            if _alive(pid):
                _signal_group(pid, signal.SIGKILL)
                # No deadline, on purpose (not a _poll.until wait): stop_all() returns once each process is gone,
                # and its callers then say it stopped, delete its state (`down --purge`) or start it again on
                # the same ports and data. A SIGKILLed process outlives the signal only in uninterruptible
                # sleep (hung I/O); a bounded wait would return while it still runs, a new behaviour.
                while _alive(pid):
                    _reap(pid)
                    time.sleep(0.02)
        return [name for name, _pid in signalled]


def _signal_group(pid: int, sig: int) -> None:
    # Components run in their own session; signalling the group also reaches
    # anything they started (the node agent's pod processes).
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _alive(pid: int) -> bool:
    return _proc.alive(pid)


def _exited(pid: int) -> bool:
    """Whether ``pid`` is gone; while it runs, each look also reaps it (a no-op unless it is our exited child)."""
    if not _alive(pid):
        return True
    _reap(pid)
    return False


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def tail(path: Path, lines: int = 15) -> str:
    try:
        data = path.read_bytes()[-8192:].decode(errors="replace").splitlines()
    except OSError:
        return "  (no log)"
    return "\n".join("  " + ln for ln in data[-lines:])


# -- readiness probes -------------------------------------------------------

def https_ok(url: str, ca: Path | None = None, cert: tuple[Path, Path] | None = None) -> Callable[[], bool]:
    def probe() -> bool:
        ctx = ssl.create_default_context(cafile=str(ca)) if ca else ssl._create_unverified_context()
        if cert:
            ctx.load_cert_chain(str(cert[0]), str(cert[1]))
        try:
            with urllib.request.urlopen(url, context=ctx, timeout=2) as r:
                return r.status == 200
        except Exception:
            return False

    return probe


def http_ok(url: str) -> Callable[[], bool]:
    def probe() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status == 200
        except Exception:
            return False

    return probe
