"""The kubelet's streaming side for simulated nodes: ``kubectl exec`` and ``kubectl port-forward`` into a pod.

KWOK serves each simulated node's kubelet API. For exec it runs a command on
its host (a ClusterExec); for port-forward, a command whose stdin and stdout
are the stream (a ClusterPortForward). gpulab gives it commands that reach into
the pod as a CRI runtime's streaming server does:

- **exec**: KWOK resolves the program on its PATH, which starts with
  ``<cluster>/exec-path``: one link per program the host has, each to a
  dispatcher (:mod:`gpulab.runtime.execclient`) that hands its stdin, stdout and stderr to the
  node agent over a unix socket (``SCM_RIGHTS``). The node agent
  (:class:`ExecServer`) runs the command in the container's sandbox — its
  pod's network namespace, its volumes, the kubelet's ``/etc/resolv.conf``,
  its user — and answers with the exit status, which the dispatcher exits
  with. ``kubectl exec web -- python3 -c …`` thus calls Services by name.
  A program given by absolute path (``/bin/sh``) is not looked up on the
  PATH: KWOK runs it on its host, as a plain process, as before.
- **port-forward**: the command (:func:`forward`) connects to
  ``127.0.0.1:<port>`` inside the pod's network namespace (through the pod
  network's holder, :mod:`gpulab.runtime.network`) and relays its stdin and
  stdout — what the CRI does. KWOK matches forwards by port, so the ports
  are those the pod's containers declare (``containerPort``). KWOK ends a
  forwarded connection when the client closes it: a server that marks the end
  of its answer only by closing (HTTP/1.0 without ``Content-Length``) leaves
  the client waiting for more.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import shutil
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from .._fsutil import remove_tree, socket_home
from . import execclient, sandbox

log = logging.getLogger("gpulab.runtime")

EXEC_SOCKET = "exec.sock"
SOCKET_ENV = execclient.SOCKET_ENV
TARGET_ENV = execclient.TARGET_ENV  # "<pod uid>/<container>"
FARM = execclient.FARM
DISPATCHER = ".dispatch"
#: How often the node agent adds links for programs installed on the host since it started.
FARM_REFRESH_S = 30.0


def socket_path(cluster_dir: Path) -> Path:
    # Others may pass through: in root mode KWOK runs the dispatcher as nobody.
    return socket_home(Path(cluster_dir) / "exec", len(EXEC_SOCKET) + 1, mode=0o711) / EXEC_SOCKET


# -- the node agent's side ------------------------------------------------------------


class ExecContainer(Protocol):
    """A container as :class:`ExecServer` needs it (:class:`gpulab.runtime.containers.Container`)."""

    name: str
    state: str


class ExecTarget(Protocol):
    """A pod as :class:`ExecServer` needs it (:class:`gpulab.runtime.pod.PodWorker`)."""

    dir: Path

    @property
    def init(self) -> Sequence[ExecContainer]: ...

    @property
    def main(self) -> Sequence[ExecContainer]: ...

    def exec_spec(self, c: Any, argv: list[str], run: Path) -> sandbox.SandboxSpec:
        """The sandbox of ``argv`` in container ``c``, to be run from ``run``."""


class ExecHost(Protocol):
    """What :class:`ExecServer` needs of the node agent (:class:`gpulab.runtime.agent.NodeAgent`)."""

    cluster_dir: Path

    @property
    def workers(self) -> Mapping[str, ExecTarget]:
        """The running pods by UID."""


class ExecServer:
    """Runs ``kubectl exec`` commands in their container's sandbox, for the dispatcher."""

    def __init__(self, agent: ExecHost):
        self.agent = agent
        self.path = socket_path(agent.cluster_dir)

    def start(self) -> None:
        self.path.unlink(missing_ok=True)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(self.path))
        self.path.chmod(0o666)  # who may ask is checked per connection (its uid)
        server.listen(64)
        threading.Thread(target=self._accept, args=(server,), daemon=True, name="exec-server").start()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True, name="exec").start()

    def _serve(self, conn: socket.socket) -> None:
        fds: list[int] = []
        with conn:
            try:
                uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
                data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                request = json.loads(data.decode())
                if uid not in (os.getuid(), sandbox.NOBODY):
                    raise PermissionError(f"uid {uid} may not exec into pods")
                if len(fds) != 3:
                    raise ValueError("expected stdin, stdout and stderr")
                rc = self._run(conn, request, fds)
            except Exception as e:  # the client gets the reason; the node agent carries on
                log.warning("kubectl exec failed: %s", e)
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps({"exit": 126, "error": str(e)}).encode() + b"\n")
                return
            finally:
                for fd in fds:
                    os.close(fd)
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"exit": rc}).encode() + b"\n")

    def _run(self, conn: socket.socket, request: dict[str, Any], fds: list[int]) -> int:
        uid, _, name = str(request.get("target", "")).partition("/")
        worker = self.agent.workers.get(uid)
        if worker is None:
            raise LookupError("the pod is not running on this node")
        container = next((c for c in worker.init + worker.main if c.name == name), None)
        if container is None or container.state != "running":
            raise LookupError(f'container "{name}" is not running')
        argv = [str(a) for a in request.get("argv") or []]
        if not argv:
            raise ValueError("no command")
        run = worker.dir / "run" / f"{name}-exec-{threading.get_ident()}"
        spec = worker.exec_spec(container, argv, run)
        sandbox.write_spec(spec, run / "sandbox.json")
        proc = subprocess.Popen(sandbox.command(run / "sandbox.json"), stdin=fds[0], stdout=fds[1], stderr=fds[2],
                                env={"PATH": sandbox.DEFAULT_PATH}, start_new_session=True, close_fds=True)
        try:
            # The client going away (kubectl interrupted, KWOK ended the stream) ends the command.
            while proc.poll() is None:
                readable, _, _ = select.select([conn], [], [], 0.2)
                if readable and not conn.recv(1, socket.MSG_PEEK):
                    sandbox.signal_sandbox(run / "sandbox.json", proc.pid, 9)
                    break
            return proc.wait()
        finally:
            remove_tree(run)


def write_farm(cluster_dir: Path) -> Path:
    """``<cluster>/exec-path``: a link to the dispatcher for every program a container's PATH offers."""
    farm = Path(cluster_dir) / FARM
    farm.mkdir(parents=True, exist_ok=True)
    farm.chmod(0o755)
    dispatcher = farm / DISPATCHER
    tmp = farm / ".dispatch.tmp"
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    tmp.write_text(f"#!{python} -IS\n" + Path(execclient.__file__).read_text())
    tmp.chmod(0o755)
    os.replace(tmp, dispatcher)
    names = {"nvidia-smi"}
    for directory in sandbox.DEFAULT_PATH.split(":"):
        with contextlib.suppress(OSError):
            names.update(e.name for e in os.scandir(directory) if os.access(e.path, os.X_OK) and not e.is_dir())
    for name in sorted(names):
        link = farm / name
        if not link.is_symlink():
            with contextlib.suppress(OSError):
                link.symlink_to(DISPATCHER)
    return farm


def keep_farm(cluster_dir: Path, stop: threading.Event, interval: float = FARM_REFRESH_S) -> None:
    """Rewrite the farm every ``interval`` seconds until ``stop`` is set.

    A program installed on the host after the node agent started (``apt-get install netcat-openbsd``)
    gets its link too: without one, KWOK finds the host's copy further down its PATH, and
    ``kubectl exec POD -- nc ...`` (or ``nc`` in ``/bin/sh -c``) would run on the host, in the host's
    network, instead of in the container.
    """
    while not stop.wait(interval):
        try:
            write_farm(cluster_dir)
        except OSError as e:
            log.warning("cannot refresh %s: %s", Path(cluster_dir) / FARM, e)


# -- the commands KWOK runs -------------------------------------------------------------


def forward(cluster_dir: Path, sandbox_pid: int, port: int) -> int:
    """``kubectl port-forward``: relay stdin/stdout to 127.0.0.1:``port`` inside the pod's network namespace."""
    # Imported here, not at the top: KWOK starts this module for every exec too, which needs no network.
    from .network import ClusterNetwork, DialError, NetworkError

    try:
        sock = ClusterNetwork(cluster_dir).dial("127.0.0.1", port, 5.0, netns=f"/proc/{sandbox_pid}/ns/net")
    except (DialError, NetworkError) as e:
        print(f"error forwarding port {port} to pod: dial tcp 127.0.0.1:{port}: {e}", file=sys.stderr)
        return 1

    def up() -> None:
        with contextlib.suppress(OSError):
            while data := os.read(0, 65536):
                sock.sendall(data)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)

    threading.Thread(target=up, daemon=True).start()
    with contextlib.suppress(OSError):
        while data := sock.recv(65536):
            os.write(1, data)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["forward"] and len(argv) == 4:
        return forward(Path(argv[1]), int(argv[2]), int(argv[3]))
    print("usage: python -m gpulab.runtime.streaming forward CLUSTER_DIR SANDBOX_PID PORT", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
