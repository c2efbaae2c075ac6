"""The pod network: the real CNI plugins, called the way a CRI runtime calls them.

Three pieces, one module:

- :class:`ClusterNetwork` — the cluster's network namespace, which stands for
  the nodes' host network. A process of its own holds it
  (:mod:`gpulab.runtime.netholder`): for an ordinary account inside a user
  namespace that owns it, as rootless Kubernetes (Usernetes) does; as root in
  a network namespace of gpulab's own. The host's network is never touched,
  and nothing in the namespace can reach the host's loopback except the
  apiserver, through one relay. The host half (:class:`ApiRelay`, run by the
  node agent) starts or adopts the holder and serves that relay.
- :class:`PodNetwork` — what the node agent does per pod sandbox, as
  containerd does: a sandbox process (``sleep``, the pause container) in a
  network namespace of its own, the CNI plugins' ADD on it with the node's
  config (``<node host>/etc/cni/net.d``: bridge + host-local IPAM from the
  node's ``podCIDR``, portmap), the result's IP as ``status.podIP``, and DEL
  when the sandbox is torn down. Containers join the sandbox's namespace, so
  the containers of a pod share ``localhost``.
- dialling into the network from the host (:meth:`ClusterNetwork.dial`):
  probes, port-forwards and readiness checks get a TCP socket connected
  inside the namespace; so does kube-apiserver, through its egress
  selector (:class:`EgressProxy`, an HTTP CONNECT server the host half
  serves): ``pods/proxy``, ``services/proxy``, webhooks on a ClusterIP.

Where namespaces cannot be made (``GPULAB_SANDBOX=process``) there is no pod
network: the CNI IPAM plugin still gives each pod its IP from the node's
``podCIDR`` (host-local, the same allocator), but nothing carries traffic to
it, and containers share the host's network.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from .. import _poll, _proc
from .._fsutil import atomic_write_json, socket_home
from ..kube.names import API_ADDRESS, LOOPBACK_NODE_ADDRESS, NODE_CIDR, POD_CIDR, SERVICE_CIDR
from . import netholder
from .netholder import splice

log = logging.getLogger("gpulab.runtime")

NETWORK_NAME = "gpulab"
CNI_CONF = "10-gpulab.conflist"
CNI_VERSION = "1.0.0"
HOLDER_FILE = "holder.json"
#: A pod's record of its sandbox: the sandbox process, the CNI result (the cache libcni keeps for DEL).
POD_FILE = "network.json"
TOOL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
START_TIMEOUT = 15.0
#: kube-apiserver's egress to the cluster (``--egress-selector-config-file``): an HTTP CONNECT server on
#: this unix socket in the network's directory, served by the host half (:class:`EgressProxy`).
EGRESS_SOCKET = "egress.sock"


class NetworkError(RuntimeError):
    """The pod network could not be set up or used; the message says what failed and where."""


class DialError(OSError):
    """A dial into the pod network failed; ``detail`` is Go's wording (``connect: connection refused``)."""

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


def rootless() -> bool:
    return os.geteuid() != 0


def _which(name: str, package: str) -> str:
    path = shutil.which(name, path=f"{os.environ.get('PATH', '')}:{TOOL_PATH}")
    if not path:
        raise NetworkError(f"`{name}` ({package}) is not installed; gpulab's pod network needs it")
    return path


def enter_argv(pid: int, net: bool = True) -> list[str]:
    """``nsenter`` into the namespaces of ``pid`` (a holder or a pod sandbox): its user namespace when not
    root (credentials kept: the caller's uid is root there), and its network namespace."""
    argv = [_which("nsenter", "util-linux"), f"--target={pid}"]
    if rootless():
        argv += ["--user", "--preserve-credentials"]
    if net:
        argv.append("--net")
    return argv + ["--"]


# -- the cluster's network namespace ------------------------------------------------------


class ClusterNetwork:
    """The cluster's network namespace as the host sees it: its holder, dialling into it."""

    def __init__(self, cluster_dir: Path):
        self.cluster_dir = Path(cluster_dir)
        # Unix sockets live here: a short real directory under a long GPULAB_HOME.
        self.dir = socket_home(self.cluster_dir / "network", len(netholder.API_SOCKET) + 8)

    def holder(self) -> int | None:
        """The holder's pid, if it runs."""
        try:
            info = json.loads((self.dir / HOLDER_FILE).read_text())
        except (OSError, ValueError):
            return None
        pid = info.get("pid")
        return pid if pid and _proc.alive(pid, info.get("start")) else None

    def available(self) -> bool:
        return self.holder() is not None

    def request(self, message: dict[str, Any], timeout: float = 5.0) -> tuple[dict[str, Any], list[int]]:
        """One request to the holder; its JSON answer and any file descriptors it passed."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(timeout)
        try:
            conn.connect(str(self.dir / netholder.DIAL_SOCKET))
            conn.sendall(json.dumps(message).encode() + b"\n")
            data, fds, _, _ = socket.recv_fds(conn, 4096, 1)
        except OSError as e:
            raise NetworkError(f"the pod network's holder does not answer ({self.dir}): {e}") from None
        finally:
            conn.close()
        try:
            return json.loads(data.decode().splitlines()[0]), fds
        except (ValueError, IndexError):
            for fd in fds:
                os.close(fd)
            raise NetworkError(f"the pod network's holder answered nonsense: {data[:200]!r}") from None

    def listen(self, ip: str, port: int) -> socket.socket:
        """A socket listening at ``ip:port`` inside the network (the holder makes ``ip`` one of its own)."""
        answer, fds = self.request({"op": "listen", "ip": ip, "port": int(port)})
        if not answer.get("ok") or not fds:
            for fd in fds:
                os.close(fd)
            raise NetworkError(f"cannot listen at {ip}:{port} in the pod network: {answer.get('error')}")
        return socket.socket(fileno=fds[0])

    def release(self, ip: str) -> None:
        """Take back an address :meth:`listen` gave the network."""
        self.request({"op": "release", "ip": ip})

    def ping(self) -> bool:
        try:
            return bool(self.request({"op": "ping"}, timeout=1.0)[0].get("ok"))
        except NetworkError:
            return False

    def dial(self, ip: str, port: int, timeout: float, netns: str | None = None) -> socket.socket:
        """A TCP socket connected to ``ip:port`` inside the network (inside ``netns``, a pod's, if given).

        Raises :class:`DialError` with Go's wording when the connection fails.
        """
        answer, fds = self.request({"op": "dial", "ip": ip, "port": int(port), "timeout": timeout,
                                    "netns": netns}, timeout=timeout + 5.0)
        if not answer.get("ok") or not fds:
            for fd in fds:
                os.close(fd)
            raise DialError(answer.get("error") or "connect: unknown error")
        sock = socket.socket(fileno=fds[0])
        sock.settimeout(None)
        return sock

    # -- the holder's life ------------------------------------------------------------

    def start_holder(self) -> int:
        """Start the holder (a new, empty network namespace); returns its pid once it serves."""
        (self.dir / netholder.READY_FILE).unlink(missing_ok=True)
        argv = [_which("unshare", "util-linux")]
        if rootless():
            argv += ["--user", "--map-root-user"]
        argv += ["--net", "--", sys.executable, "-m", "gpulab.runtime.netholder", str(self.dir), API_ADDRESS,
                 NODE_CIDR]
        with open(self.dir / "holder.log", "ab") as out:
            # A session of its own, and no parent-death signal: the namespace outlives the host half
            # (a crash of it loses no pod's network) until `gpulab down` stops it.
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    start_new_session=True, close_fds=True,
                                    env=dict(os.environ, PATH=f"{os.environ.get('PATH', '')}:{TOOL_PATH}"))
        # Recorded at once, not once it serves: a node agent stopped while it waits here (a failed
        # `gpulab up` stops it) leaves a holder that `gpulab down` finds and stops.
        atomic_write_json(self.dir / HOLDER_FILE, {"pid": proc.pid, "start": _proc.started(proc.pid)})

        def serving() -> bool:
            if proc.poll() is not None:
                lines = (self.dir / "holder.log").read_text(errors="replace").strip().splitlines()
                raise NetworkError("the pod network's namespace could not be made: "
                                   + (lines[-1] if lines else f"unshare exited {proc.returncode}"))
            return (self.dir / netholder.READY_FILE).exists() and self.ping()

        def timed_out(_: object) -> NetworkError:
            proc.kill()
            return NetworkError(f"the pod network's holder did not start within {START_TIMEOUT:g} s "
                                f"(log: {self.dir / 'holder.log'})")

        _poll.until(serving, START_TIMEOUT, timed_out, interval=0.02)
        return proc.pid

    def stop_holder(self) -> bool:
        pid = self.holder()
        if pid is None:
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
        (self.dir / HOLDER_FILE).unlink(missing_ok=True)
        return True


def dial_host(host: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection on the host's own network (its loopback: the apiserver, KWOK, metrics servers),
    blocking once connected; raises :class:`DialError` with Go's wording."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as e:
        raise DialError(netholder.go_error(e)) from None
    sock.settimeout(None)
    return sock


class StreamServer:
    """A listening socket; a thread of its own handles each connection. Subclasses say where it listens."""

    def __init__(self, handle: Callable[[socket.socket], None], name: str):
        self.handle = handle
        self.name = name
        self._server: socket.socket | None = None

    def _listen(self) -> socket.socket:
        raise NotImplementedError

    def start(self) -> None:
        server = self._listen()
        server.listen(128)
        self._server = server
        threading.Thread(target=self._serve, args=(server,), daemon=True, name=self.name).start()

    def _serve(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return  # stopped
            threading.Thread(target=self._one, args=(client,), daemon=True, name=f"{self.name}-conn").start()

    def _one(self, client: socket.socket) -> None:
        try:
            self.handle(client)
        except Exception:  # one connection's trouble never ends the server
            log.exception("%s: a connection failed", self.name)
            client.close()

    def stop(self) -> None:
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)
            self._server.close()
            self._server = None


class UnixServer(StreamServer):
    """On a unix socket (mode 0600) in the network's directory."""

    def __init__(self, path: Path, handle: Callable[[socket.socket], None], name: str):
        super().__init__(handle, name)
        self.path = path

    def _listen(self) -> socket.socket:
        self.path.unlink(missing_ok=True)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(self.path))
        self.path.chmod(0o600)
        return server

    def stop(self) -> None:
        super().stop()
        self.path.unlink(missing_ok=True)


class LoopbackServer(StreamServer):
    """On a TCP port of the host's 127.0.0.1 (0: any free one; :attr:`port` says which once started)."""

    def __init__(self, port: int, handle: Callable[[socket.socket], None], name: str):
        super().__init__(handle, name)
        self.port = port

    def _listen(self) -> socket.socket:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        self.port = server.getsockname()[1]
        return server


class EgressRefused(ValueError):
    """An egress destination that is neither in the cluster network nor the host's loopback."""


class NotConnect(ValueError):
    """An HTTP request other than CONNECT (answered 405)."""


#: What the egress dials inside the pod network: pods, Services, the nodes' addresses, and the apiserver's.
EGRESS_NETWORK = tuple(ipaddress.ip_network(c) for c in (POD_CIDR, SERVICE_CIDR, NODE_CIDR, f"{API_ADDRESS}/32"))
NODE_NETWORK = ipaddress.ip_network(NODE_CIDR)
EGRESS_HOST, EGRESS_POD_NETWORK = "host", "pod network"


def egress_route(host: str, port: int, kubelet_ports: frozenset[int] = frozenset()) -> tuple[str, str]:
    """Where the egress dials ``host:port``, and the address.

    (``"host"``, its loopback) for ``localhost`` and 127.0.0.0/8 (the metrics servers behind ``localhost``
    ExternalName Services), and for a node's InternalIP on a kubelet port (``kubelet_ports``: KWOK's
    kubelet API and the node agent's resource metrics, one host endpoint for every node, as a node's
    kubelet is on its machine); (``"pod network"``, the IP) for pod and Service addresses and a node's
    other ports (NodePorts, hostPorts). Raises :class:`EgressRefused` for anything else: a name is never
    resolved, the host's network is not the cluster's.
    """
    if host.lower() == "localhost":
        return EGRESS_HOST, "127.0.0.1"
    reached = (f"only localhost, 127.0.0.0/8 and the pod, Service and node networks {POD_CIDR}, "
               f"{SERVICE_CIDR}, {NODE_CIDR} are reached")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise EgressRefused(f"{host} is not an address of the cluster ({reached})") from None
    if ip.is_loopback:
        return EGRESS_HOST, str(ip)
    if ip in NODE_NETWORK and port in kubelet_ports:
        return EGRESS_HOST, "127.0.0.1"
    if any(ip in net for net in EGRESS_NETWORK):
        return EGRESS_POD_NETWORK, str(ip)
    raise EgressRefused(f"{ip} is outside the cluster ({reached})")


def parse_connect(head: bytes) -> tuple[str, int]:
    """``CONNECT host:port HTTP/1.1`` (the first line of ``head``) → (host, port); ValueError says why not."""
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise ValueError(f"not an HTTP/1 request line: {line[:100]!r}")
    method, target, _ = parts
    if method != "CONNECT":
        raise NotConnect(f"only CONNECT is served, not {method}")
    host, sep, port = target.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not host:port: {target[:100]!r}")
    return host, int(port)


def _answer(code: int, reason: str = "") -> bytes:
    """A CONNECT answer; a refusal's reason is on its status line too, which kube-apiserver's error quotes."""
    phrase = {200: "Connection established", 400: "Bad Request", 403: "Forbidden", 405: "Method Not Allowed",
              502: "Bad Gateway"}[code]
    if code == 200:
        return f"HTTP/1.1 200 {phrase}\r\n\r\n".encode()
    reason = " ".join(reason.split())  # one line
    body = f"{reason}\n".encode()
    return (f"HTTP/1.1 {code} {phrase} ({reason})\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


class EgressProxy:
    """kube-apiserver's egress to the cluster: the egress selection ``cluster`` (``HTTPConnect`` over a unix
    socket), for everything the apiserver dials in the cluster — ``pods/proxy`` and ``services/proxy``, the
    kubelet API (logs, exec, port-forward), aggregated APIs and webhooks.

    kube-apiserver is a host process; the pod network is gpulab's own namespace, which it cannot reach.
    This is how a control plane reaches a cluster network it is not on (Konnectivity's HTTP CONNECT mode):
    each connection is ``CONNECT host:port HTTP/1.1`` and headers; pod, Service and node addresses are
    dialled inside the pod network (``dial_network``: the holder's dial), ``localhost``, 127.0.0.0/8 and the
    nodes' kubelet ports on the host (:func:`egress_route`); then ``200 Connection established`` and the
    bytes both ways. Anything else gets 403, a failed dial 502, each with a one-line reason.

    The same proxy serves host programs that reach the nodes as a cluster's own components do
    (metrics-server scrapes the kubelets at their InternalIPs): on a port of the host's 127.0.0.1, as an
    ``HTTPS_PROXY``.
    """

    HEAD_LIMIT = 16384
    HEAD_TIMEOUT = 10.0
    DIAL_TIMEOUT = 10.0

    def __init__(self, dial_network: Callable[[str, int, float], socket.socket],
                 dial_host: Callable[[str, int, float], socket.socket] = dial_host,
                 kubelet_ports: frozenset[int] = frozenset()):
        self.dial_network = dial_network
        self.dial_host = dial_host
        self.kubelet_ports = kubelet_ports

    def handle(self, client: socket.socket) -> None:
        """Serve one connection: the CONNECT request, the dial, then the splice (or a refusal)."""
        client.settimeout(self.HEAD_TIMEOUT)
        head, rest = b"", b""
        try:
            while b"\r\n\r\n" not in head:
                data = client.recv(4096)
                if not data:
                    client.close()
                    return
                head += data
                if len(head) > self.HEAD_LIMIT and b"\r\n\r\n" not in head:
                    raise ValueError(f"no end of the request's headers within {self.HEAD_LIMIT} bytes")
            head, rest = head.split(b"\r\n\r\n", 1)
            host, port = parse_connect(head)
        except (OSError, ValueError) as e:
            self._refuse(client, 405 if isinstance(e, NotConnect) else 400, str(e))
            return
        try:
            where, address = egress_route(host, port, self.kubelet_ports)
        except EgressRefused as e:
            log.info("egress: refused CONNECT %s:%d: %s", host, port, e)
            self._refuse(client, 403, str(e))
            return
        dial = self.dial_host if where == EGRESS_HOST else self.dial_network
        try:
            upstream = dial(address, port, self.DIAL_TIMEOUT)
        except (DialError, NetworkError, OSError) as e:
            detail = e.detail if isinstance(e, DialError) else str(e)
            self._refuse(client, 502, f"dial tcp {host}:{port} ({where}): {detail}")
            return
        try:
            client.settimeout(None)
            client.sendall(_answer(200))
            if rest:  # (a client speaks after the answer; should one not wait, nothing is lost)
                upstream.sendall(rest)
        except OSError:
            client.close()
            upstream.close()
            return
        splice(client, upstream)

    @staticmethod
    def _refuse(client: socket.socket, code: int, reason: str) -> None:
        with contextlib.suppress(OSError):
            client.sendall(_answer(code, reason))
        client.close()


class ApiRelay:
    """The host half of the pod network, run by the node agent: it starts (or adopts) the holder, relays
    the apiserver into the namespace, as the ``kubernetes`` Service's endpoint, and serves the apiserver's
    way into it (:class:`EgressProxy`, on ``EGRESS_SOCKET``).

    The namespace outlives the node agent (a crash of it loses no pod's network: the next one adopts
    the holder it finds); ``gpulab down`` stops the pods' sandboxes and the holder after the agent.
    While no node agent runs, the apiserver still serves; what it dials in the cluster (logs, exec,
    proxies, aggregated APIs) fails until the egress socket is back.
    """

    def __init__(self, cluster_dir: Path, api_port: int, kubelet_ports: frozenset[int] = frozenset(),
                 egress_port: int | None = None):
        self.network = ClusterNetwork(cluster_dir)
        self.api_port = api_port
        egress = EgressProxy(self.network.dial, kubelet_ports=kubelet_ports).handle
        self.servers: list[StreamServer] = [
            UnixServer(self.network.dir / netholder.API_SOCKET, self._relay, "apiserver-relay"),
            UnixServer(self.network.dir / EGRESS_SOCKET, egress, "apiserver-egress")]
        if egress_port is not None:
            # For host programs that reach the nodes as components do (metrics-server's HTTPS_PROXY).
            self.servers.append(LoopbackServer(egress_port, egress, "egress"))

    def start(self) -> None:
        network = self.network
        pid = network.holder()
        if pid is None or not network.ping():
            network.stop_holder()
            pid = network.start_holder()
            log.info("pod network: new namespace, holder pid %d", pid)
        else:
            log.info("pod network: adopted the namespace of holder pid %d", pid)
        answer, _ = network.request({"op": "relay", "port": self.api_port})
        if not answer.get("ok"):
            raise NetworkError(f"cannot relay the apiserver into the pod network: {answer.get('error')}")
        for server in self.servers:
            server.start()

    def _relay(self, client: socket.socket) -> None:
        try:
            upstream = dial_host("127.0.0.1", self.api_port, 5)
        except DialError:
            client.close()
            return
        splice(client, upstream)

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


def stop_sandboxes(cluster_dir: Path) -> int:
    """Stop every pod sandbox process of a cluster that goes down; returns how many."""
    stopped = 0
    for record in Path(cluster_dir).glob(f"pods/*/{POD_FILE}"):
        try:
            info = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        pid = info.get("sandbox_pid")
        if pid and _proc.alive(pid, info.get("sandbox_start")):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                stopped += 1
    return stopped


# -- per pod: the sandbox and the CNI plugins -------------------------------------------------


@dataclasses.dataclass
class PodSandbox:
    """A pod's network as set up: its IP, and the process whose namespaces its containers join."""

    ip: str | None
    # The process whose network (and, without root, user) namespace the pod's containers join: the pod's
    # own sandbox process, or for a hostNetwork pod the holder of the nodes' network. None: no namespace.
    sandbox_pid: int | None = None
    sandbox_start: float | None = None
    # The namespace is the nodes' own (a hostNetwork pod's): not the pod's to forward into.
    shared: bool = False

    @property
    def netns(self) -> str | None:
        return f"/proc/{self.sandbox_pid}/ns/net" if self.sandbox_pid else None

    def alive(self) -> bool:
        return self.sandbox_pid is None or _proc.alive(self.sandbox_pid, self.sandbox_start)


def conflist(node_host: Path, pod_cidr: str, bridge: str) -> dict[str, Any]:
    """A node's CNI network configuration: what a cluster's network add-on writes into /etc/cni/net.d."""
    return {
        "cniVersion": CNI_VERSION,
        "name": NETWORK_NAME,
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": True,
                # Pods never leave for the outside: there is none. kube-proxy masquerades Service traffic.
                "ipMasq": False,
                # A pod that calls a Service which picks the pod itself gets its packets back on its own port.
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(node_host / "var" / "lib" / "cni" / "networks"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}, "backend": "nftables"},
        ],
    }


def bridge_name(pod_cidr: str) -> str:
    """A bridge per node, named by its podCIDR's place in POD_CIDR: 10.244.3.0/24 → ``cni3``, 10.245.3.0/24 →
    ``cni259`` (within the 15 bytes of a Linux interface name)."""
    offset = int(ipaddress.ip_network(pod_cidr).network_address) - int(ipaddress.ip_network(POD_CIDR).network_address)
    return f"cni{offset >> 8}"


class PodNetwork:
    """The node agent's side: pod sandboxes on the cluster network, through the CNI plugins."""

    def __init__(self, cluster_dir: Path, nodes_dir: Path, cni_bin: Path | None, isolated: bool):
        self.cluster = ClusterNetwork(cluster_dir)
        self.nodes_dir = nodes_dir
        self.cni_bin = cni_bin
        # isolated: pods get namespaces of their own (the namespaces sandbox); else IPs only.
        self.isolated = isolated
        self.cidrs: dict[str, str] = {}
        self.addresses: dict[str, str] = {}
        self.lock = threading.Lock()

    # -- per node ------------------------------------------------------------------------

    def conf_path(self, node: str) -> Path:
        return self.nodes_dir / node / "host" / "etc" / "cni" / "net.d" / CNI_CONF

    def set_node(self, node: str, pod_cidr: str | None, address: str | None = None) -> None:
        """The node as registered: its InternalIP (``address``) and, once node IPAM gave it one, its podCIDR,
        for which its CNI config is written."""
        if address:
            self.addresses[node] = address
        if not pod_cidr or self.cidrs.get(node) == pod_cidr:
            return
        path = self.conf_path(node)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, conflist(self.nodes_dir / node / "host", pod_cidr, bridge_name(pod_cidr)))
        self.cidrs[node] = pod_cidr

    def node_address(self, node: str) -> str:
        """The node's InternalIP: a pod's ``status.hostIP``, a hostNetwork pod's IP."""
        return self.addresses.get(node, LOOPBACK_NODE_ADDRESS)

    def ready_for(self, node: str) -> bool:
        return self.conf_path(node).is_file()

    # -- per pod -------------------------------------------------------------------------

    def setup(self, pod: dict[str, Any], node: str, pod_dir: Path, processes: bool = True) -> PodSandbox:
        """Create the pod's sandbox and run the CNI ADDs on it; raises NetworkError.

        ``processes``: some container runs a process. A pod whose containers are all built-in programs
        of the node agent (the GPU stack's) gets its IP from IPAM alone, and no namespace: nothing of it
        runs where one would be.
        """
        if self.cni_bin is None:
            raise NetworkError("the CNI plugins are not installed (gpulab build makes them)")
        found = self.adopt(pod_dir)
        if found is not None and found.alive():
            return found
        if found is not None:
            self.teardown(pod, node, pod_dir)  # a sandbox that died (the node went down): a new one
        conf = self._conf(node)
        host_network = bool((pod.get("spec") or {}).get("hostNetwork"))
        if self.isolated and host_network:
            # The node's own network, the namespace the holder keeps, and the node's address: no CNI.
            holder = self.cluster.holder()
            if holder is None:
                raise NetworkError("the pod network is not running (its holder is gone); `gpulab up` starts it")
            record: dict[str, Any] = {"ip": self.node_address(node), "host_network": True, "join_pid": holder,
                                      "join_start": _proc.started(holder)}
            atomic_write_json(pod_dir / POD_FILE, record)
            return PodSandbox(record["ip"], holder, record["join_start"], shared=True)
        if not self.isolated or not processes:
            try:
                result = self._cni_ipam(pod, conf, "ADD")
            except NetworkError:
                with contextlib.suppress(NetworkError):
                    self._cni_ipam(pod, conf, "DEL")
                raise
            record = {"ip": _first_ip(result), "result": result, "ipam_only": True}
            atomic_write_json(pod_dir / POD_FILE, record)
            return PodSandbox(record["ip"], shared=True)
        if not self.cluster.available():
            raise NetworkError("the pod network is not running (its holder is gone); `gpulab up` starts it")
        pid, start = self._start_sandbox(pod_dir)
        record: dict[str, Any] = {"sandbox_pid": pid, "sandbox_start": start}
        atomic_write_json(pod_dir / POD_FILE, record)
        netns = f"/proc/{pid}/ns/net"
        try:
            self._exec(pod, {"cniVersion": CNI_VERSION, "name": "cni-loopback", "type": "loopback"}, "ADD",
                       netns)
            result = self._add_list(pod, conf, netns)
        except NetworkError:
            # Undo what got done (an address reserved, a veth made), as a runtime does after a failed ADD.
            for plugin in reversed(conf["plugins"]):
                with contextlib.suppress(NetworkError):
                    self._exec(pod, _plugin_conf(conf, plugin, None), "DEL", netns)
            self._kill(pid, start)
            (pod_dir / POD_FILE).unlink(missing_ok=True)
            raise
        ip = _first_ip(result)
        record.update(ip=ip, result=result)
        atomic_write_json(pod_dir / POD_FILE, record)
        return PodSandbox(ip, pid, start)

    def adopt(self, pod_dir: Path) -> PodSandbox | None:
        """The sandbox an earlier node agent set up for this pod, if it left a record."""
        try:
            info = json.loads((pod_dir / POD_FILE).read_text())
        except (OSError, ValueError):
            return None
        if info.get("ip") is None and not info.get("sandbox_pid"):
            return None
        if info.get("ipam_only") or info.get("host_network"):
            return PodSandbox(info.get("ip"), info.get("join_pid"), info.get("join_start"), shared=True)
        return PodSandbox(info.get("ip"), info.get("sandbox_pid"), info.get("sandbox_start"))

    def teardown(self, pod: dict[str, Any], node: str, pod_dir: Path) -> None:
        """CNI DEL (the plugins in reverse, with the cached ADD result) and stop the sandbox process."""
        try:
            info = json.loads((pod_dir / POD_FILE).read_text())
        except (OSError, ValueError):
            return
        if info.get("host_network"):
            (pod_dir / POD_FILE).unlink(missing_ok=True)  # nothing of the node's network was the pod's
            return
        try:
            conf = self._conf(node)
            if info.get("ipam_only"):
                if self.isolated and info.get("ip") and self.cluster.available():
                    with contextlib.suppress(NetworkError):  # in case a built-in program listened at it
                        self.cluster.release(info["ip"])
                self._cni_ipam(pod, conf, "DEL")
            else:
                sb = PodSandbox(info.get("ip"), info.get("sandbox_pid"), info.get("sandbox_start"))
                netns = sb.netns if sb.alive() else ""
                for plugin in reversed(conf["plugins"]):
                    self._exec(pod, _plugin_conf(conf, plugin, info.get("result")), "DEL", netns or "")
                if info.get("sandbox_pid"):
                    self._kill(info["sandbox_pid"], info.get("sandbox_start"))
        except NetworkError as e:
            log.warning("CNI DEL for %s failed: %s", pod["metadata"].get("name"), e)
        (pod_dir / POD_FILE).unlink(missing_ok=True)

    def listen(self, pod: dict[str, Any], ip: str | None, port: int) -> socket.socket | None:
        """A socket listening at the pod's ``ip:port`` on the pod network, for a built-in program that serves
        a port in a pod without a namespace of its own (DCGM exporter's metrics); None where there is no pod
        network (the program then listens on the host's loopback alone)."""
        if not self.isolated or not ip or (pod.get("spec") or {}).get("hostNetwork"):
            return None
        return self.cluster.listen(ip, port)

    def dial(self, ip: str, port: int, timeout: float) -> socket.socket:
        """Dial a pod from the node's side (a kubelet's prober does), through the cluster network."""
        if not self.isolated:
            # No namespaces: containers listen on the host's network itself.
            try:
                return socket.create_connection(("127.0.0.1", port), timeout=timeout)
            except OSError as e:
                raise DialError(netholder.go_error(e)) from None
        try:
            return self.cluster.dial(ip, port, timeout)
        except NetworkError as e:
            raise DialError(str(e)) from None

    # -- the CNI protocol -------------------------------------------------------------------

    def _conf(self, node: str) -> dict[str, Any]:
        try:
            return json.loads(self.conf_path(node).read_text())
        except (OSError, ValueError):
            raise NetworkError(f"node {node} has no CNI config yet ({self.conf_path(node)}): "
                               "it has no podCIDR") from None

    def _add_list(self, pod: dict[str, Any], conf: dict[str, Any], netns: str) -> dict[str, Any]:
        result: dict[str, Any] | None = None
        for plugin in conf["plugins"]:
            out = self._exec(pod, _plugin_conf(conf, plugin, result, _runtime_config(pod, plugin)), "ADD", netns)
            result = out or result
        return result or {}

    def _cni_ipam(self, pod: dict[str, Any], conf: dict[str, Any], command: str) -> dict[str, Any]:
        """Only the IPAM plugin of the node's bridge config (no namespace to put an interface in)."""
        bridge = conf["plugins"][0]
        ipam_conf = {"cniVersion": conf["cniVersion"], "name": conf["name"], "type": bridge["ipam"]["type"],
                     "ipam": bridge["ipam"]}
        return self._exec(pod, ipam_conf, command, "/proc/self/ns/net", plugin=bridge["ipam"]["type"], host=True)

    def _exec(self, pod: dict[str, Any], conf: dict[str, Any], command: str, netns: str,
              plugin: str | None = None, host: bool = False) -> dict[str, Any]:
        """Run one CNI plugin as libcni does: environment, config on stdin, result (or error) on stdout."""
        assert self.cni_bin is not None
        md = pod["metadata"]
        name = plugin or conf["type"]
        binary = self.cni_bin / name
        env = {
            "CNI_COMMAND": command, "CNI_CONTAINERID": md["uid"], "CNI_NETNS": netns, "CNI_IFNAME": "eth0",
            "CNI_PATH": str(self.cni_bin), "PATH": TOOL_PATH,
            "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={md['namespace']};K8S_POD_NAME={md['name']};"
                        f"K8S_POD_INFRA_CONTAINER_ID={md['uid']};K8S_POD_UID={md['uid']}",
        }
        if host:
            # IPAM alone, in the caller's own namespace: no interface goes anywhere, so the plugin is told
            # not to refuse the namespace it runs in (the libcni knob for exactly this).
            env["CNI_NETNS_OVERRIDE"] = "1"
        holder = None if host or not self.isolated else self.cluster.holder()
        if not host and self.isolated and holder is None:
            raise NetworkError("the pod network is not running (its holder is gone)")
        argv = (enter_argv(holder) if holder else []) + [str(binary)]
        proc = subprocess.run(argv, input=json.dumps(conf).encode(), env=env, capture_output=True, timeout=60)
        out = proc.stdout.decode(errors="replace").strip()
        if proc.returncode != 0:
            try:
                err = json.loads(out)
                why = err.get("msg", out) + (f": {err['details']}" if err.get("details") else "")
            except ValueError:
                why = out or proc.stderr.decode(errors="replace").strip() or f"exit {proc.returncode}"
            raise NetworkError(f"CNI {command} ({name}) failed for pod {md['namespace']}/{md['name']}: {why}")
        if command != "ADD" or not out:
            return {}
        try:
            return json.loads(out)
        except ValueError:
            raise NetworkError(f"CNI {command} ({name}) printed no result: {out[:200]}") from None

    # -- the sandbox process -------------------------------------------------------------------

    def _start_sandbox(self, pod_dir: Path) -> tuple[int, float | None]:
        """The pause process: a new network namespace in the cluster's user namespace, holding still.

        As a container runtime does for every sandbox, unprivileged ports start at 0 in it
        (``net.ipv4.ip_unprivileged_port_start``), so a container's server binds port 80 as any user.
        """
        holder = self.cluster.holder()
        assert holder is not None
        script = "echo 0 > /proc/sys/net/ipv4/ip_unprivileged_port_start && exec sleep infinity"
        argv = enter_argv(holder, net=False) + [_which("unshare", "util-linux"), "--net", "--",
                                                 "/bin/sh", "-c", script]
        with open(pod_dir / "sandbox.log", "ab") as err:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                    start_new_session=True, close_fds=True)

        def holding() -> bool:
            # Its namespace is the new one once it is `sleep`: before that CNI would configure the holder's.
            if proc.poll() is not None:
                why = (pod_dir / "sandbox.log").read_text(errors="replace").strip().splitlines()
                raise NetworkError(f"the pod's sandbox did not start: {why[-1] if why else proc.returncode}")
            try:
                return Path(f"/proc/{proc.pid}/comm").read_text().strip() == "sleep"
            except OSError:
                return False

        def timed_out(_: object) -> NetworkError:
            proc.kill()
            return NetworkError(f"the pod's sandbox did not start within {START_TIMEOUT:g} s")

        _poll.until(holding, START_TIMEOUT, timed_out, interval=0.005)
        return proc.pid, _proc.started(proc.pid)

    @staticmethod
    def _kill(pid: int, start: float | None) -> None:
        if _proc.alive(pid, start):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _plugin_conf(conf: dict[str, Any], plugin: dict[str, Any], prev: dict[str, Any] | None,
                 runtime_config: dict[str, Any] | None = None) -> dict[str, Any]:
    """One plugin's config from a list, as libcni builds it: the list's name and version, the previous result."""
    out = dict(plugin, cniVersion=conf["cniVersion"], name=conf["name"])
    out.pop("capabilities", None)
    if prev:
        out["prevResult"] = prev
    if runtime_config:
        out["runtimeConfig"] = runtime_config
    return out


def _runtime_config(pod: dict[str, Any], plugin: dict[str, Any]) -> dict[str, Any] | None:
    """The capability args a runtime passes: hostPort mappings for portmap."""
    if not (plugin.get("capabilities") or {}).get("portMappings"):
        return None
    mappings = []
    for c in (pod.get("spec") or {}).get("containers") or []:
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                mappings.append({"hostPort": int(p["hostPort"]), "containerPort": int(p["containerPort"]),
                                 "protocol": (p.get("protocol") or "TCP").lower(),
                                 "hostIP": p.get("hostIP", "")})
    return {"portMappings": mappings} if mappings else None


def _first_ip(result: dict[str, Any]) -> str | None:
    for entry in result.get("ips") or []:
        address = entry.get("address", "")
        if address:
            return address.split("/")[0]
    return None
