"""Container logs in the CRI format that kubelets (and KWOK's log server) read.

Each line: ``<RFC3339Nano timestamp> <stdout|stderr> <F|P> <text>``; ``P``
marks a partial line split at 16 KiB, as container runtimes do.
"""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path
from typing import BinaryIO

MAX_LINE = 16 * 1024


def timestamp() -> str:
    now = dt.datetime.now(dt.timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond:06d}000Z"


class LogWriter:
    """Serialises stdout and stderr of one container run into one file."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._f = open(path, "ab", buffering=0)
        self._lock = threading.Lock()

    def write_line(self, stream: str, text: bytes, partial: bool = False) -> None:
        tag = b"P" if partial else b"F"
        with self._lock:
            self._f.write(timestamp().encode() + b" " + stream.encode() + b" " + tag + b" " + text + b"\n")

    def pump(self, pipe: BinaryIO, stream: str) -> threading.Thread:
        """Copy a pipe into the log on a daemon thread until EOF."""

        def run() -> None:
            buf = b""
            while True:
                chunk = pipe.read1(65536) if hasattr(pipe, "read1") else pipe.read(65536)
                if not chunk:
                    break
                buf += chunk
                while True:
                    nl = buf.find(b"\n")
                    if nl < 0:
                        break
                    line, buf = buf[:nl], buf[nl + 1:]
                    self._emit(stream, line)
                while len(buf) > MAX_LINE:
                    self.write_line(stream, buf[:MAX_LINE], partial=True)
                    buf = buf[MAX_LINE:]
            if buf:
                self._emit(stream, buf)
            pipe.close()

        t = threading.Thread(target=run, daemon=True, name=f"log-{self.path.name}-{stream}")
        t.start()
        return t

    def _emit(self, stream: str, line: bytes) -> None:
        line = line.rstrip(b"\r")
        while len(line) > MAX_LINE:
            self.write_line(stream, line[:MAX_LINE], partial=True)
            line = line[MAX_LINE:]
        self.write_line(stream, line)

    def close(self) -> None:
        with self._lock:
            self._f.close()


def read_text(path: Path) -> str:
    """The plain text of a CRI log (what ``kubectl logs`` prints)."""
    out: list[str] = []
    pending = ""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for raw in lines:
        parts = raw.split(" ", 3)
        if len(parts) < 3:
            continue
        text = parts[3] if len(parts) == 4 else ""
        if parts[2] == "P":
            pending += text
        else:
            out.append(pending + text)
            pending = ""
    return "\n".join(out) + ("\n" if out else "")
