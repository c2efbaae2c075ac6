"""httpGet, tcpSocket and grpc probes dialled for real, against servers on 127.0.0.1, with the kubelet's
messages; simulated containers (nothing runs in them) still follow the model-load annotation."""

from __future__ import annotations

import json
import socket
import ssl
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest

from gpulab.kube import pki
from gpulab.runtime import probes
from gpulab.runtime.probes import DialError, Result

HOST = "127.0.0.1"


def dial(ip: str, port: int, timeout: float) -> socket.socket:
    """The node agent's dialer, played by the host's network: Go's error tails for the failures."""
    try:
        return socket.create_connection((ip, port), timeout=timeout)
    except ConnectionRefusedError:
        raise DialError("connect: connection refused") from None
    except socket.timeout:
        raise DialError("i/o timeout") from None


def no_exec(cmd: list[str], timeout: float) -> tuple[int, str]:
    raise AssertionError("a network probe ran a command")


def run(spec: dict[str, Any], *, ports: list[dict[str, Any]] | None = None, pod_ip: str | None = HOST,
        dialer: probes.Dialer | None = dial, simulated: bool = False, up_for: float = 0.0,
        load_seconds: float = 0.0) -> Result:
    return probes.run_handler(spec, up_for, load_seconds, no_exec, simulated=simulated, pod_ip=pod_ip,
                              dial=dialer, container_ports=ports or [])


class Handler(BaseHTTPRequestHandler):
    """The paths a probe meets: healthy, redirected (here, elsewhere, forever), failing, slow, and an echo."""
    release: threading.Event  # set by the fixture's teardown: the slow handler stops waiting

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path == "/health":
            self.reply(200, b"ok")
        elif path == "/big":
            self.reply(200, b"x" * (probes.MAX_BODY + 100))
        elif path == "/moved":
            self.reply(302, b"", {"Location": "/health"})
        elif path == "/away":
            self.reply(302, b"gone", {"Location": "http://elsewhere.invalid:8080/health"})
        elif path == "/loop":
            self.reply(302, b"", {"Location": "/loop"})
        elif path == "/fail":
            self.reply(500, b"model not loaded")
        elif path == "/slow":
            self.release.wait(10)  # until the test is over: the probe has long given up
        elif path == "/echo":
            self.reply(200, json.dumps({"path": self.path, **dict(self.headers.items())}).encode())
        else:
            self.reply(404, b"")

    def reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve(tls: ssl.SSLContext | None = None) -> Iterator[int]:
    release = threading.Event()
    server = ThreadingHTTPServer((HOST, 0), type("H", (Handler,), {"release": release}))
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        release.set()
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def web() -> Iterator[int]:
    yield from serve()


@pytest.fixture
def tls_web(tmp_path: Path) -> Iterator[int]:
    """An HTTPS server whose certificate no probe could verify (its CA is gpulab's test one)."""
    pki.ensure(tmp_path)
    crt, key = pki.issue_server(tmp_path, "web", "web", ())
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(crt, key)
    yield from serve(ctx)


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port bound but not listening: connecting to it is refused, and no other test can take it meanwhile."""
    sock = socket.socket()
    try:
        sock.bind((HOST, 0))
        yield sock.getsockname()[1]
    finally:
        sock.close()


def http_get(port: int | str, path: str, **extra: Any) -> dict[str, Any]:
    return {"httpGet": {"port": port, "path": path, **extra}, "timeoutSeconds": 1}


def test_http_200_passes_with_the_body_as_output(web):
    assert run(http_get(web, "/health")) == Result(True, "ok")


def test_http_reads_at_most_10_kib_of_the_body(web):
    result = run(http_get(web, "/big"))
    assert result.ok and len(result.output) == probes.MAX_BODY


def test_http_sends_the_kubelets_headers_and_the_probes_own(web):
    spec = http_get(web, "/echo?q=1", httpHeaders=[{"name": "host", "value": "model.example"},
                                                   {"name": "x-probe", "value": "yes"}])
    seen = json.loads(run(spec).output)
    assert seen["path"] == "/echo?q=1"
    assert seen["User-Agent"] == "kube-probe/1.37" == probes.USER_AGENT
    assert seen["Accept"] == "*/*" and seen["Connection"] == "close"
    assert seen["Host"] == "model.example" and seen["X-Probe"] == "yes"
    default = json.loads(run(http_get(web, "/echo")).output)
    assert default["Host"] == f"{HOST}:{web}"


def test_http_follows_a_redirect_to_the_same_host(web):
    assert run(http_get(web, "/moved")) == Result(True, "ok")


def test_http_redirect_to_another_host_passes_with_the_kubelets_warning(web):
    """The kubelet does not follow it: the 3xx itself is judged, a success reported as a ProbeWarning."""
    assert run(http_get(web, "/away")) == Result(True, "Probe terminated redirects, Response body: gone",
                                                 warning=True)


def test_http_stops_after_10_redirects(web):
    assert run(http_get(web, "/loop")) == Result(False, f'Get "http://{HOST}:{web}/loop": stopped after 10 redirects')


def test_http_error_status_fails_without_the_body(web):
    assert run(http_get(web, "/fail")) == Result(False, "HTTP probe failed with statuscode: 500")


def test_http_slower_than_the_timeout_fails_as_gos_client_timeout(web):
    assert run(http_get(web, "/slow")) == Result(
        False, f'Get "http://{HOST}:{web}/slow": context deadline exceeded '
               "(Client.Timeout exceeded while awaiting headers)")


def test_http_refused(closed_port):
    assert run(http_get(closed_port, "/health")) == Result(
        False, f'Get "http://{HOST}:{closed_port}/health": dial tcp {HOST}:{closed_port}: connect: connection refused')


def test_https_is_not_verified(tls_web):
    assert run(http_get(tls_web, "/health", scheme="HTTPS")) == Result(True, "ok")


def test_https_to_a_plain_http_server_fails_as_gos_scheme_mismatch(web):
    assert run(http_get(web, "/health", scheme="HTTPS")) == Result(
        False, f'Get "https://{HOST}:{web}/health": http: server gave HTTP response to HTTPS client')


def test_a_named_port_is_the_containers_port_of_that_name(web):
    ports = [{"name": "metrics", "containerPort": 1}, {"name": "http", "containerPort": web}]
    assert run(http_get("http", "/health"), ports=ports) == Result(True, "ok")
    assert run(http_get(str(web), "/health")) == Result(True, "ok")  # a number written as a string
    assert run({"tcpSocket": {"port": "http"}}, ports=ports) == Result(True)


def test_an_unknown_port_name_fails_as_the_kubelets_port_resolution():
    assert run(http_get("http", "/health")) == Result(False, 'strconv.Atoi: parsing "http": invalid syntax')
    assert run({"tcpSocket": {"port": 70000}}) == Result(False, "invalid port number: 70000")


def test_tcp_passes_when_the_port_accepts(web):
    assert run({"tcpSocket": {"port": web}}) == Result(True)


def test_tcp_refused_and_timed_out(closed_port):
    assert run({"tcpSocket": {"port": closed_port}}) == Result(
        False, f"dial tcp {HOST}:{closed_port}: connect: connection refused")

    def unreachable(ip: str, port: int, timeout: float) -> socket.socket:
        raise DialError("i/o timeout")
    assert run({"tcpSocket": {"port": 8080}}, pod_ip="10.244.1.5", dialer=unreachable) == Result(
        False, "dial tcp 10.244.1.5:8080: i/o timeout")


def test_a_pod_without_network_fails_its_probes_without_crashing():
    for spec in (http_get(8080, "/health"), {"tcpSocket": {"port": 8080}}, {"grpc": {"port": 9000}}):
        assert run(spec, pod_ip=None) == Result(False, "no pod network to dial: the pod has no IP address")
        assert run(spec, dialer=None) == Result(False, "no pod network to dial: the node agent has none")


HEALTH = "grpc.health.v1.Health"


@pytest.fixture
def grpc_server() -> Iterator[tuple[int, list[str]]]:
    """A gRPC health service: "" is SERVING, "model" NOT_SERVING, "slow" answers after the test, anything
    else is unknown (NOT_FOUND). Yields its port and the user agents of the calls it answered."""
    agents: list[str] = []
    release = threading.Event()

    def check(request: bytes, context: grpc.ServicerContext) -> bytes:
        agents.append(dict(context.invocation_metadata()).get("user-agent", ""))
        service = request[2:].decode()  # field 1, one byte of length: the test's names are short
        if service == "slow":
            release.wait(10)
        if service not in ("", "model"):
            context.abort(grpc.StatusCode.NOT_FOUND, "unknown service")
        return b"\x08\x01" if service == "" else b"\x08\x02"

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(HEALTH, {
        "Check": grpc.unary_unary_rpc_method_handler(check, request_deserializer=bytes,
                                                     response_serializer=bytes)})])
    port = server.add_insecure_port(f"{HOST}:0")
    server.start()
    try:
        yield port, agents
    finally:
        release.set()
        server.stop(None).wait()


def relays() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "probe-grpc-relay"]


def test_grpc_serving_passes(grpc_server):
    port, agents = grpc_server
    assert run({"grpc": {"port": port}, "timeoutSeconds": 5}) == Result(True, "service healthy")
    assert agents[0].startswith("kube-probe/1.37")
    assert relays() == []


def test_grpc_not_serving_and_unknown_service_fail(grpc_server):
    port, _ = grpc_server
    assert run({"grpc": {"port": port, "service": "model"}, "timeoutSeconds": 5}) == Result(
        False, 'service unhealthy (responded with "NOT_SERVING")')
    assert run({"grpc": {"port": port, "service": "other"}, "timeoutSeconds": 5}) == Result(
        False, "error: health rpc probe failed: rpc error: code = NotFound desc = unknown service")


def test_grpc_check_slower_than_the_timeout(grpc_server):
    port, _ = grpc_server
    assert run({"grpc": {"port": port, "service": "slow"}}) == Result(
        False, "timeout: health rpc did not complete within 1s")


def test_grpc_server_without_the_health_service():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port(f"{HOST}:0")
    server.start()
    try:
        result = run({"grpc": {"port": port}, "timeoutSeconds": 5})
    finally:
        server.stop(None).wait()
    assert not result.ok
    assert result.output.startswith("error: this server does not implement the grpc health protocol "
                                    "(grpc.health.v1.Health): ")


def test_grpc_refused_and_not_grpc_fail_to_connect(closed_port, web):
    for port in (closed_port, web):
        assert run({"grpc": {"port": port}}) == Result(
            False, f'timeout: failed to connect service "{HOST}:{port}" within 1s: context deadline exceeded')
    assert relays() == []


def test_simulated_containers_follow_the_model_load_annotation():
    """Nothing is dialled (no dialer would be reached): refused until the model has loaded, as before."""
    def never(ip: str, port: int, timeout: float) -> socket.socket:
        raise AssertionError("a simulated container was dialled")
    loading = {"simulated": True, "dialer": never, "up_for": 10.0, "load_seconds": 90.0}
    assert run(http_get(8080, "/health"), **loading) == Result(
        False, 'Get "http://10.244.0.1:8080/health": dial tcp: connect: connection refused')
    assert run({"tcpSocket": {"port": 8080}}, **loading) == Result(
        False, "dial tcp :8080: connect: connection refused")
    assert run({"grpc": {"port": 9000}, "timeoutSeconds": 1}, **loading) == Result(
        False, 'timeout: failed to connect service ":9000" within 1s')
    for spec in (http_get(8080, "/health"), {"tcpSocket": {"port": 8080}}, {"grpc": {"port": 9000}}):
        assert run(spec, simulated=True, dialer=never, up_for=90.0, load_seconds=90.0) == Result(True)


def test_exec_probes_are_unchanged():
    def ran(cmd: list[str], timeout: float) -> tuple[int, str]:
        return (0 if cmd == ["true"] else 1), " out \n"
    spec = {"exec": {"command": ["true"]}}
    for simulated in (True, False):
        assert probes.run_handler(spec, 0, 90, ran, simulated=simulated, pod_ip=None, dial=None,
                                  container_ports=[]) == Result(True, "out")
