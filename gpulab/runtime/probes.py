"""Startup, liveness and readiness probes, timed and worded as the kubelet's.

``exec`` probes run the command in the container's sandbox and pass on exit 0.

``httpGet``, ``tcpSocket`` and ``grpc`` probes of a container that runs
something (a command, a built-in program, an image's entrypoint: see
:mod:`gpulab.runtime.containers`) cross the pod network as the kubelet's
prober does (k8s.io/kubernetes ``pkg/probe/{http,tcp,grpc}``): the
node agent's dialer (``agent.network.dial``) connects a TCP socket to the pod's
IP inside the pod network, and the probe speaks HTTP(S), nothing, or the gRPC
health protocol over it. What the kubelet would write after "Readiness probe
failed: " is the result's output, so that events read as on a real node.

A **simulated** container (nothing runs in it, so nothing would listen) has
no server to dial: its network probes pass once it has been up for its
declared model-load time, which is what a model server's health endpoint does.
"""

from __future__ import annotations

import dataclasses
import http.client
import os
import re
import select
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from typing import Any, Callable
from urllib.parse import urljoin, urlsplit

import grpc

from .. import versions
from .network import DialError

DEFAULTS = {"initialDelaySeconds": 0, "periodSeconds": 10, "timeoutSeconds": 1,
            "successThreshold": 1, "failureThreshold": 3}
# What the kubelet sends as User-Agent (and gRPC's user agent): kube-probe/<major>.<minor>.
USER_AGENT = "kube-probe/" + ".".join(versions.KUBERNETES.lstrip("v").split(".")[:2])
# The kubelet reads at most this much of an HTTP probe's response body (maxRespBodyLength).
MAX_BODY = 10 << 10
# Go's http.Client follows at most 10 redirects; the kubelet's checker keeps that limit.
MAX_REDIRECTS = 10
# The statuses Go's client follows (with a Location); any other 3xx ends the probe as it is.
REDIRECTS = frozenset({301, 302, 303, 307, 308})
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
# grpc.health.v1.HealthCheckResponse.ServingStatus, named as Go's String() names them.
SERVING = 1
SERVING_STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}

# The kubelet's prober does not verify a pod's certificate (InsecureSkipVerify): pods serve self-signed ones.
_TLS = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
_TLS.check_hostname = False
_TLS.verify_mode = ssl.CERT_NONE


# (ip, port, timeout_seconds) -> a connected TCP socket in the pod network, or raises DialError.
Dialer = Callable[[str, int, float], socket.socket]


@dataclasses.dataclass
class Result:
    ok: bool
    output: str = ""
    # The kubelet's probe.Warning: counted as a success, reported as a ProbeWarning event
    # ("<Kind> probe warning: <output>"); an HTTP probe that ends on a redirect it does not follow.
    warning: bool = False


class _Failed(Exception):
    """A probe that failed before it had a response; the message is the kubelet's output."""


@dataclasses.dataclass
class ProbeState:
    spec: dict[str, Any]
    next_at: float
    successes: int = 0
    failures: int = 0

    def setting(self, key: str) -> int:
        value = self.spec.get(key)
        return DEFAULTS[key] if value is None else int(value)


def describe(kind: str) -> str:
    """The probe's kind as the kubelet names it in events (e.g. 'Startup')."""
    return {"startupProbe": "Startup", "livenessProbe": "Liveness", "readinessProbe": "Readiness"}[kind]


def run_handler(spec: dict[str, Any], up_for: float, load_seconds: float,
                run_exec: Callable[[list[str], float], tuple[int, str]], *, simulated: bool,
                pod_ip: str | None, dial: Dialer | None, container_ports: list[dict[str, Any]]) -> Result:
    """Run one probe. ``simulated`` containers have nothing listening: their network probes follow the
    model-load annotation; the others are dialled through ``dial`` at ``pod_ip`` (``container_ports`` names
    the ports a probe may use by name)."""
    timeout = float(spec.get("timeoutSeconds") or DEFAULTS["timeoutSeconds"])
    if "exec" in spec:
        cmd = (spec["exec"] or {}).get("command") or []
        try:
            rc, out = run_exec(cmd, timeout)
        except subprocess.TimeoutExpired:
            return Result(False, f"command timed out after {timeout:g}s")
        return Result(rc == 0, out.strip())
    if simulated:
        return _simulated(spec, up_for, load_seconds, timeout)
    try:
        if "httpGet" in spec:
            h = spec["httpGet"] or {}
            return _http_get(h, h.get("host") or pod_ip, dial, container_ports, timeout)
        if "tcpSocket" in spec:
            t = spec["tcpSocket"] or {}
            return _tcp(t.get("host") or pod_ip, resolve_port(t.get("port"), container_ports), dial, timeout)
        if "grpc" in spec:
            return _grpc(spec["grpc"] or {}, pod_ip, dial, timeout)
    except _Failed as e:
        return Result(False, str(e))
    return Result(False, "probe has no handler")


def _simulated(spec: dict[str, Any], up_for: float, load_seconds: float, timeout: float) -> Result:
    """A container with nothing listening: up once its model has loaded, refused before."""
    if up_for >= load_seconds:
        return Result(True)
    if "httpGet" in spec:
        h = spec["httpGet"]
        port = h.get("port", 80)
        return Result(False, f'Get "http://{h.get("host") or "10.244.0.1"}:{port}{h.get("path", "/")}": '
                             "dial tcp: connect: connection refused")
    if "tcpSocket" in spec:
        return Result(False, f"dial tcp :{spec['tcpSocket'].get('port')}: connect: connection refused")
    if "grpc" in spec:
        return Result(False, f"timeout: failed to connect service \":{spec['grpc'].get('port')}\" within {timeout:g}s")
    return Result(False, "probe has no handler")


def _network(host: str | None, dial: Dialer | None) -> tuple[str, Dialer]:
    """The address and dialer of a network probe; a pod without either cannot be dialled (no crash: a failure)."""
    if dial is None:
        raise _Failed("no pod network to dial: the node agent has none")
    if not host:
        raise _Failed("no pod network to dial: the pod has no IP address")
    return host, dial


def resolve_port(port: int | str | None, container_ports: list[dict[str, Any]]) -> int:
    """The kubelet's probe.ResolveContainerPort: a number, the name of one of the container's ports, or a
    number written as a string; its errors are Go's (strconv.Atoi's for an unknown name)."""
    if isinstance(port, int):
        number = port
    elif port is None:
        number = 0  # an unset IntOrString is the number 0
    else:
        named = [p.get("containerPort") for p in container_ports if p.get("name") == port]
        if named:
            number = int(named[0] or 0)
        elif re.fullmatch(r"[+-]?[0-9]+", port):
            number = int(port)
        else:
            raise _Failed(f'strconv.Atoi: parsing "{port}": invalid syntax')
    if 0 < number < 65536:
        return number
    raise _Failed(f"invalid port number: {number}")


def join_host_port(host: str, port: int) -> str:
    """Go's net.JoinHostPort: an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def go_duration(seconds: float) -> str:
    """A whole number of seconds as Go prints a time.Duration (1s, 1m30s, 1h0m0s), as the kubelet's messages do."""
    h, rest = divmod(int(seconds), 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m}m{s}s" if h else f"{m}m{s}s" if m else f"{s}s"


def _remaining(deadline: float) -> float:
    """Seconds left of a probe's timeout; the whole probe (dials, redirects, the RPC) shares one, as in Go."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("probe deadline exceeded")
    return left


def _tcp(host: str | None, port: int, dial: Dialer | None, timeout: float) -> Result:
    """pkg/probe/tcp: a connection that opens is a success; it is closed at once."""
    host, dial = _network(host, dial)
    try:
        dial(host, port, timeout).close()
    except DialError as e:
        return Result(False, f"dial tcp {join_host_port(host, port)}: {e.detail}")
    return Result(True)


def _canonical(name: str) -> str:
    """Go's textproto.CanonicalMIMEHeaderKey ("content-type" -> "Content-Type"): http.Header's keys."""
    return "-".join(part[:1].upper() + part[1:].lower() for part in name.split("-"))


def _request_headers(spec_headers: list[dict[str, Any]]) -> tuple[str | None, list[tuple[str, str]]]:
    """The Host override and the other headers of a probe request, as pkg/probe/http/request.go builds them:
    the probe's httpHeaders, User-Agent kube-probe/<major>.<minor> and Accept */* unless given (an empty
    Accept removes it; Go sends no empty User-Agent), and Connection: close (the prober keeps no connection)."""
    headers: dict[str, list[str]] = {}
    for header in spec_headers:
        headers.setdefault(_canonical(str(header.get("name", ""))), []).append(str(header.get("value", "")))
    headers.setdefault("User-Agent", [USER_AGENT])
    headers.setdefault("Accept", ["*/*"])
    headers.setdefault("Connection", ["close"])
    host = headers.pop("Host", [""])[0] or None
    if not headers["User-Agent"][0]:
        del headers["User-Agent"]
    if not headers["Accept"][0]:
        del headers["Accept"]
    return host, [(name, value) for name, values in headers.items() for value in values]


class _DialledConnection(http.client.HTTPConnection):
    """http.client over a socket from the node agent's dialer: the kubelet's transport dials the pod IP from
    the node, which only the dialer can reach here. HTTPS wraps that socket in TLS, unverified as the
    kubelet's."""

    def __init__(self, host: str, port: int, dial: Dialer, deadline: float, tls: bool):
        super().__init__(host, port)
        self._dial = dial
        self._deadline = deadline
        self._tls = tls

    def connect(self) -> None:
        sock = self._dial(self.host, self.port, _remaining(self._deadline))
        sock.settimeout(_remaining(self._deadline))
        self.sock = _TLS.wrap_socket(sock, server_hostname=self.host) if self._tls else sock


def _transport_error(e: Exception) -> str:
    """The error Go's HTTP client reports for a broken exchange, where Python's names it differently."""
    if isinstance(e, (http.client.RemoteDisconnected, http.client.IncompleteRead)):
        return "EOF"
    if isinstance(e, ConnectionResetError):
        return "read: connection reset by peer"
    if isinstance(e, ssl.SSLError) and e.reason == "WRONG_VERSION_NUMBER":
        # OpenSSL's words for a first record that is not TLS: most often a plain HTTP server's answer.
        return "http: server gave HTTP response to HTTPS client"
    if isinstance(e, http.client.BadStatusLine):
        return f"net/http: HTTP/1.x transport connection broken: malformed HTTP response {e.args[0]}"
    return str(e) or type(e).__name__


def _fetch(url: str, host_header: str | None, headers: list[tuple[str, str]], dial: Dialer,
           deadline: float) -> tuple[int, str | None, bytes]:
    """One GET of ``url`` on a connection of its own: (status, Location, at most MAX_BODY bytes of body)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise _Failed(f'Get "{url}": unsupported protocol scheme "{parts.scheme}"')
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    conn = _DialledConnection(host, port, dial, deadline, tls=parts.scheme == "https")
    try:
        conn.putrequest("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
                        skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", host_header or parts.netloc)
        for name, value in headers:
            conn.putheader(name, value)
        conn.endheaders()
        sock = conn.sock  # the connection lets go of it once a response says Connection: close
        sock.settimeout(_remaining(deadline))
        response = conn.getresponse()
        try:
            sock.settimeout(_remaining(deadline))
            body = response.read(MAX_BODY)
        except TimeoutError:
            raise _Failed("context deadline exceeded (Client.Timeout or context cancellation while reading body)")
        return response.status, response.getheader("Location"), body
    except DialError as e:
        if e.detail != "i/o timeout":
            raise _Failed(f'Get "{url}": dial tcp {join_host_port(host, port)}: {e.detail}')
        raise _Failed(f'Get "{url}": context deadline exceeded (Client.Timeout exceeded while awaiting headers)')
    except TimeoutError:
        raise _Failed(f'Get "{url}": context deadline exceeded (Client.Timeout exceeded while awaiting headers)')
    except (OSError, http.client.HTTPException, ValueError) as e:
        raise _Failed(f'Get "{url}": {_transport_error(e)}')
    finally:
        conn.close()


def _http_get(h: dict[str, Any], host: str | None, dial: Dialer | None, container_ports: list[dict[str, Any]],
              timeout: float) -> Result:
    """pkg/probe/http: GET the URL; 200-399 passes. Redirects are followed as Go's client follows them, but
    only to the same host (the kubelet's RedirectChecker): a redirect elsewhere ends the probe on the 3xx,
    which passes with a warning ("Probe terminated redirects"); the 10th redirect to the same host fails."""
    port = resolve_port(h.get("port"), container_ports)
    host, dial = _network(host, dial)
    scheme = str(h.get("scheme") or "HTTP").lower()
    path = str(h.get("path") or "/")
    url = f"{scheme}://{join_host_port(host, port)}{'' if path.startswith('/') else '/'}{path}"
    custom_host, headers = _request_headers(h.get("httpHeaders") or [])
    deadline = time.monotonic() + timeout
    host_header = custom_host
    redirects = 0
    while True:
        status, location, raw = _fetch(url, host_header, headers, dial, deadline)
        if status not in REDIRECTS or not location:
            break
        target = urljoin(url, location)
        if urlsplit(target).hostname != urlsplit(url).hostname:
            break  # http.ErrUseLastResponse: the probe judges this 3xx
        redirects += 1
        if redirects >= MAX_REDIRECTS:
            return Result(False, f'Get "{url}": stopped after {MAX_REDIRECTS} redirects')
        # Go keeps a custom Host header only through relative redirects.
        host_header = custom_host if not urlsplit(location).scheme else None
        url = target
    body = raw.decode(errors="replace")
    if not 200 <= status < 400:
        return Result(False, f"HTTP probe failed with statuscode: {status}")
    if status >= 300:
        return Result(True, f"Probe terminated redirects, Response body: {body}", warning=True)
    return Result(True, body)


class _Relay:
    """A private unix socket that hands grpcio a connection the node agent's dialer made.

    grpcio dials addresses, not sockets, and the pod IP is only reachable through the dialer; so grpcio's
    channel targets ``unix:<path>`` and a thread accepts its one connection and copies bytes both ways
    between it and the dialled socket. Closing the relay stops the thread and closes both sockets."""

    def __init__(self, upstream: socket.socket):
        self._dir = tempfile.mkdtemp(prefix="gpulab-probe-")
        path = os.path.join(self._dir, "grpc.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(1)
        self._stop_seen, self._stop = socket.socketpair()
        self.target = f"unix:{path}"
        self._thread = threading.Thread(target=self._pump, args=(upstream,), name="probe-grpc-relay", daemon=True)
        self._thread.start()

    def _pump(self, upstream: socket.socket) -> None:
        with upstream, self._listener, self._stop_seen:
            try:
                if self._listener not in select.select([self._listener, self._stop_seen], [], [])[0]:
                    return
                conn, _ = self._listener.accept()
                with conn:
                    peer = {conn: upstream, upstream: conn}
                    while True:
                        readable = select.select([conn, upstream, self._stop_seen], [], [])[0]
                        for sock in readable:
                            data = b"" if sock is self._stop_seen else sock.recv(1 << 16)
                            if not data:
                                return
                            peer[sock].sendall(data)
            except OSError:
                return  # either side gone: grpcio sees its connection close

    def __enter__(self) -> str:
        return self.target

    def __exit__(self, *exc: object) -> None:
        self._stop.close()  # the thread's end of the pair reads EOF
        self._thread.join(timeout=5)
        shutil.rmtree(self._dir, ignore_errors=True)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def _health_request(service: str) -> bytes:
    """HealthCheckRequest{service}, written by hand so that no grpcio-health-checking is needed: field 1,
    length-delimited; proto3 leaves an empty string out."""
    data = service.encode()
    return b"\x0a" + _varint(len(data)) + data if data else b""


def _health_status(data: bytes) -> int:
    """HealthCheckResponse.status (field 1, a varint; absent means UNKNOWN); any other field is skipped."""
    status, i = 0, 0
    while i < len(data):
        key, i = _read_varint(data, i)
        wire = key & 7
        if wire == 0:
            value, i = _read_varint(data, i)
            if key >> 3 == 1:
                status = value
        elif wire == 2:
            length, i = _read_varint(data, i)
            i += length
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise ValueError(f"HealthCheckResponse: unsupported wire type {wire}")
    return status


def _go_code(code: grpc.StatusCode) -> str:
    """A gRPC status code as grpc-go's codes.Code prints it (NOT_FOUND -> NotFound, CANCELLED -> Canceled)."""
    name = code.name
    return "Canceled" if name == "CANCELLED" else "".join(w.capitalize() for w in name.split("_"))


def _grpc(g: dict[str, Any], pod_ip: str | None, dial: Dialer | None, timeout: float) -> Result:
    """pkg/probe/grpc: grpc.health.v1.Health/Check of ``service`` at the pod IP, within the timeout.

    grpc-go's blocking dial retries until the deadline, so the kubelet reports a refused connection as a
    connect timeout too; here it is reported at once, with the same message."""
    host, dial = _network(pod_ip, dial)
    port = int(g.get("port") or 0)
    addr = join_host_port(host, port)
    within = go_duration(timeout)
    not_connected = Result(False, f'timeout: failed to connect service "{addr}" within {within}: '
                                  "context deadline exceeded")
    deadline = time.monotonic() + timeout
    try:
        upstream = dial(host, port, timeout)
    except DialError:
        return not_connected
    options = [("grpc.primary_user_agent", USER_AGENT), ("grpc.default_authority", addr)]
    # Closed in reverse order: the channel, then the relay (its thread done), then the dialled socket.
    with upstream, _Relay(upstream) as target, grpc.insecure_channel(target, options=options) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=max(0.0, deadline - time.monotonic()))
        except grpc.FutureTimeoutError:
            return not_connected
        check = channel.unary_unary(HEALTH_CHECK, request_serializer=_health_request,
                                    response_deserializer=_health_status)
        try:
            status = check(g.get("service") or "", timeout=max(0.0, deadline - time.monotonic()))
        except grpc.RpcError as e:
            code, details = e.code(), e.details()  # a call's RpcError is also its grpc.Call
            if code == grpc.StatusCode.UNIMPLEMENTED:
                return Result(False, "error: this server does not implement the grpc health protocol "
                                     f"(grpc.health.v1.Health): {details}")
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                return Result(False, f"timeout: health rpc did not complete within {within}")
            return Result(False, f"error: health rpc probe failed: rpc error: code = {_go_code(code)} "
                                 f"desc = {details}")
    if status != SERVING:
        return Result(False, f'service unhealthy (responded with "{SERVING_STATUS.get(status, str(status))}")')
    return Result(True, "service healthy")


class Prober:
    """The three probes of one running container."""

    def __init__(self, container_spec: dict[str, Any], started_at: float):
        self.states: dict[str, ProbeState] = {}
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            spec = container_spec.get(kind)
            if spec:
                delay = spec.get("initialDelaySeconds") or 0
                self.states[kind] = ProbeState(spec, started_at + float(delay))

    def due(self, kind: str, now: float, started: bool) -> ProbeState | None:
        st = self.states.get(kind)
        if st is None:
            return None
        # Liveness and readiness wait until the startup probe has passed.
        if kind != "startupProbe" and not started:
            return None
        if kind == "startupProbe" and started:
            return None
        return st if now >= st.next_at else None

    @staticmethod
    def record(st: ProbeState, result: Result, now: float) -> str | None:
        """Update counters; returns 'success' / 'failure' when a threshold is crossed."""
        st.next_at = now + st.setting("periodSeconds")
        if result.ok:
            st.successes += 1
            st.failures = 0
            if st.successes >= st.setting("successThreshold"):
                return "success"
        else:
            st.failures += 1
            st.successes = 0
            if st.failures >= st.setting("failureThreshold"):
                return "failure"
        return None


def now() -> float:
    return time.time()
