"""The inside half of the pod network: the process that holds the cluster's network namespace.

:mod:`gpulab.runtime.network` (the host half) starts it as
``unshare [--user --map-root-user] --net -- python -m gpulab.runtime.netholder DIR API NODES``:
a network namespace of gpulab's own — and, for an ordinary account, a user
namespace that owns it, as rootless Kubernetes does. The namespace plays the
nodes' shared host network: the CNI plugins put each node's bridge (the
node's ``podCIDR``) in it, kube-proxy programs its nftables there, and every
pod's own namespace hangs off a bridge by a veth pair. Nothing in it reaches
the host's network: it has no interface to it.

What this process does, besides keeping the namespace alive:

- brings ``lo`` up, turns forwarding on (pods of different nodes reach each
  other through the bridges' routes) and gives ``lo`` the address at which
  the ``kubernetes`` Service's endpoint, the apiserver, is advertised;
  makes the nodes' addresses (``NODES``, a CIDR: each node's InternalIP) local
  here, as a node's address is on its machine: NodePorts and hostPorts
  answer at them;
- relays the apiserver: a TCP listener on that port inside forwards each
  connection to a unix socket in ``DIR``, where the host half connects it to
  the real apiserver on the host's 127.0.0.1 (kube-proxy and pods reach the
  control plane this way, and nothing else of the host);
- dials on behalf of the host (``DIR/dial.sock``): given an address, and
  optionally a pod's network namespace, it connects a TCP socket there and
  hands the connected socket back over the unix socket (``SCM_RIGHTS``). The
  node agent's probes, ``kubectl port-forward`` and readiness checks use it:
  a socket made in a namespace keeps talking there, whoever holds it;
- listens on behalf of the host: for a pod whose containers are the node
  agent's built-in programs (no namespace of its own), its IP becomes an
  address here and a socket listening on it is handed back; ``release``
  takes the address away when the pod goes.

Standard library only; one thread per connection.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

from .sandbox_init import pump

CLONE_NEWNET = 0x40000000
DIAL_SOCKET = "dial.sock"
API_SOCKET = "apiserver.sock"
READY_FILE = "holder.ready"
UPLINK = "uplink0"

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)

#: Go's net package words for a failed connect, which the kubelet's messages quote.
_GO_ERRORS = {
    errno.ECONNREFUSED: "connect: connection refused",
    errno.EHOSTUNREACH: "connect: no route to host",
    errno.ENETUNREACH: "connect: network is unreachable",
    errno.ETIMEDOUT: "i/o timeout",
    errno.ECONNRESET: "connect: connection reset by peer",
}


def go_error(e: OSError) -> str:
    """``e`` as Go's dialer would end its message (``connect: connection refused``)."""
    if isinstance(e, TimeoutError) or isinstance(e, socket.timeout):
        return "i/o timeout"
    if e.errno in _GO_ERRORS:
        return _GO_ERRORS[e.errno]
    return f"connect: {os.strerror(e.errno).lower()}" if e.errno else str(e)


def splice(a: socket.socket, b: socket.socket) -> None:
    """Relay both directions between ``a`` and ``b``; each socket is closed when both directions end."""

    def one_way(src: socket.socket, dst: socket.socket, done: threading.Event, other: threading.Event) -> None:
        pump(src, dst)
        done.set()
        if other.is_set():
            a.close()
            b.close()

    ab, ba = threading.Event(), threading.Event()
    threading.Thread(target=one_way, args=(a, b, ab, ba), daemon=True).start()
    threading.Thread(target=one_way, args=(b, a, ba, ab), daemon=True).start()


def _setns(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _run(argv: list[str]) -> None:
    subprocess.run(argv, check=True, capture_output=True, env={"PATH": "/usr/sbin:/sbin:/usr/bin:/bin"})


class Holder:
    def __init__(self, directory: Path, api_address: str, node_cidr: str):
        self.dir = directory
        self.api_address = api_address
        self.node_cidr = node_cidr
        self.relays: dict[int, socket.socket] = {}
        self.lock = threading.Lock()

    # -- the namespace -----------------------------------------------------------

    def configure(self) -> None:
        _run(["ip", "link", "set", "lo", "up"])
        _run(["ip", "addr", "replace", f"{self.api_address}/32", "dev", "lo"])
        # Every node address is this namespace's own (a local route: however many nodes there are).
        _run(["ip", "route", "replace", "local", self.node_cidr, "dev", "lo"])
        # A node has a default route. Here it leads nowhere (a veth whose other end stays down: what
        # leaves is dropped, as on a node with no way out), but with it a ClusterIP is routable from the
        # nodes' own network, for kube-proxy's rules to rewrite. (A dummy link needs a kernel module
        # that a user namespace cannot load.)
        _run(["ip", "link", "add", UPLINK, "type", "veth", "peer", "name", UPLINK + "-peer"])
        _run(["ip", "link", "set", UPLINK, "up"])
        _run(["ip", "route", "replace", "default", "dev", UPLINK])
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")

    # -- the apiserver relay ------------------------------------------------------

    def relay(self, port: int) -> None:
        """Listen on ``port`` in this namespace; each connection goes to the host half's apiserver socket."""
        with self.lock:
            if port in self.relays:
                return
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("0.0.0.0", port))
            server.listen(128)
            self.relays[port] = server
        threading.Thread(target=self._accept_relay, args=(server,), daemon=True, name=f"relay-{port}").start()

    def _accept_relay(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                upstream.connect(str(self.dir / API_SOCKET))
            except OSError:
                client.close()
                upstream.close()
                continue
            splice(client, upstream)

    # -- dialling for the host ------------------------------------------------------

    def serve(self) -> None:
        path = self.dir / DIAL_SOCKET
        path.unlink(missing_ok=True)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(path))
        path.chmod(0o600)
        server.listen(128)
        (self.dir / READY_FILE).write_text(str(os.getpid()))
        while True:
            conn, _ = server.accept()
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                request = json.loads(conn.makefile("r").readline() or "{}")
            except ValueError:
                return
            op = request.get("op", "dial")
            if op == "ping":
                conn.sendall(b'{"ok": true}\n')
            elif op == "relay":
                try:
                    self.relay(int(request["port"]))
                    conn.sendall(b'{"ok": true}\n')
                except OSError as e:
                    conn.sendall(json.dumps({"ok": False, "error": str(e)}).encode() + b"\n")
            elif op == "dial":
                self._dial(conn, request)
            elif op == "listen":
                self._listen(conn, request)
            elif op == "release":
                # Best effort: the address may be gone already (a holder restarted, a second release).
                with contextlib.suppress(OSError, subprocess.CalledProcessError):
                    _run(["ip", "addr", "del", f"{request['ip']}/32", "dev", "lo"])
                conn.sendall(b'{"ok": true}\n')

    def _listen(self, conn: socket.socket, request: dict) -> None:
        """A listening socket at ``ip:port`` in this namespace, for a pod that has no namespace of its own (a
        built-in program of the node agent serving a port): the pod's IP becomes an address of ``lo`` here,
        so pods and Services reach it as any pod; the socket is handed to the host, which serves on it."""
        try:
            _run(["ip", "addr", "replace", f"{request['ip']}/32", "dev", "lo"])
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((request["ip"], int(request["port"])))
            sock.listen(128)
        except (OSError, subprocess.CalledProcessError) as e:
            conn.sendall(json.dumps({"ok": False, "error": str(e)}).encode() + b"\n")
            return
        with sock:
            socket.send_fds(conn, [b'{"ok": true}\n'], [sock.fileno()])

    def _dial(self, conn: socket.socket, request: dict) -> None:
        # A thread's network namespace is its own: entering a pod's leaves the rest of this process alone,
        # and the thread ends with the request.
        try:
            if request.get("netns"):
                _setns(request["netns"])
            family = socket.AF_INET6 if ":" in request["ip"] else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.settimeout(float(request.get("timeout") or 1.0))
            sock.connect((request["ip"], int(request["port"])))
        except OSError as e:
            conn.sendall(json.dumps({"ok": False, "error": go_error(e)}).encode() + b"\n")
            return
        with sock:
            socket.send_fds(conn, [b'{"ok": true}\n'], [sock.fileno()])


def main(argv: list[str]) -> int:
    directory, api_address, node_cidr = Path(argv[1]), argv[2], argv[3]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    holder = Holder(directory, api_address, node_cidr)
    try:
        holder.configure()
    except (OSError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", b"") or b""
        print(f"gpulab pod network: cannot configure the cluster network namespace: {e} "
              f"{detail.decode(errors='replace').strip()}", file=sys.stderr)
        return 1
    holder.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
