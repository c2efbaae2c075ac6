"""Logs: keep a pod's log while it runs, since a deleted pod's log is gone with it."""

from __future__ import annotations

import subprocess
import threading
import time

from .lesson import current
from .shell import REPO, Output

__all__ = ["LogFollower", "follow_logs"]


class LogFollower:
    """``kubectl logs -f`` on a background thread, made by :func:`follow_logs`.

    A deleted pod takes its logs with it — ``kubectl logs`` cannot read a pod
    that no longer exists — so a lesson that is about to delete a pod follows
    its log first, as a log collector would. ``stop()`` ends following and
    returns everything read.
    """

    def __init__(self, pod: str, container: str | None, namespace: str | None):
        argv = ["kubectl", "logs", "-f", pod, "-n", namespace or current().namespace]
        if container:
            argv += ["-c", container]
        self.pod = pod
        self._lines: list[str] = []
        self._proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      errors="replace", stdin=subprocess.DEVNULL, cwd=REPO)
        self._thread = threading.Thread(target=self._read, daemon=True, name=f"gpulab-logs-{pod}")
        self._thread.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.append(line)

    @property
    def text(self) -> str:
        return "".join(self._lines)

    def stop(self, linger: float = 0.5) -> Output:
        """Stop following (after ``linger`` s, for the last lines to arrive); return the log read."""
        time.sleep(linger)
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._thread.join(timeout=2)
        return Output(self.text)


def follow_logs(pod: str, container: str | None = None, namespace: str | None = None) -> LogFollower:
    """Start following a pod's log (``kubectl logs -f``); see :class:`LogFollower`."""
    return LogFollower(pod, container, namespace)
