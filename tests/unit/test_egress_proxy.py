"""kube-apiserver's egress into the pod network (``network.EgressProxy``), without a cluster.

The apiserver's egress selection ``cluster`` speaks HTTP CONNECT over a unix socket: ``CONNECT host:port
HTTP/1.1``, headers, then it reads one HTTP response and uses the connection as the TCP stream to
``host:port`` when it says 200 (k8s.io/apiserver's egressselector.tunnelHTTPConnect). Here fake dialers
stand in for the holder's dial (pod and Service addresses) and the host's loopback.
"""

from __future__ import annotations

import socket
import stat
import threading

import pytest
import yaml

from gpulab.cluster import embedded
from gpulab.runtime import network, sandbox
from gpulab.runtime.network import DialError, EgressProxy, EgressRefused, NetworkError


class FakeDialer:
    """Records each dial; answers with one end of a socket pair whose other end echoes in upper case."""

    def __init__(self, fail: Exception | None = None):
        self.calls: list[tuple[str, int, float]] = []
        self.fail = fail

    def __call__(self, ip: str, port: int, timeout: float) -> socket.socket:
        self.calls.append((ip, port, timeout))
        if self.fail is not None:
            raise self.fail
        ours, theirs = socket.socketpair()

        def serve() -> None:
            with theirs:
                while data := theirs.recv(4096):
                    theirs.sendall(data.upper())

        threading.Thread(target=serve, daemon=True).start()
        return ours


#: The nodes' kubelet endpoints in these tests (KWOK's kubelet API, the node agent's resource metrics).
KUBELET_PORTS = frozenset({10250, 10255})


def _proxy(**dialers: FakeDialer) -> tuple[EgressProxy, FakeDialer, FakeDialer]:
    pod, host = dialers.get("pod", FakeDialer()), dialers.get("host", FakeDialer())
    return EgressProxy(pod, host, KUBELET_PORTS), pod, host


def _ask(proxy: EgressProxy, request: bytes) -> tuple[socket.socket, bytes]:
    """Send ``request`` as the apiserver does; the client's socket and what came until the answer's head ended
    (a refusal's body may come with it)."""
    client, server = socket.socketpair()
    threading.Thread(target=proxy.handle, args=(server,), daemon=True).start()
    client.settimeout(5)
    client.sendall(request)
    answer = b""
    while b"\r\n\r\n" not in answer:
        data = client.recv(4096)
        if not data:
            break
        answer += data
    return client, answer


def _rest(client: socket.socket, answer: bytes) -> bytes:
    """A refusal's body: what followed its head, up to the end of the connection."""
    out = answer.partition(b"\r\n\r\n")[2]
    while data := client.recv(4096):
        out += data
    return out


def connect(target: str) -> bytes:
    # Byte for byte what kube-apiserver sends.
    return f"CONNECT {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()


def test_a_pod_address_is_dialled_in_the_pod_network_and_spliced_both_ways():
    proxy, pod, host = _proxy()
    client, answer = _ask(proxy, connect("10.244.1.5:8080"))
    assert answer == b"HTTP/1.1 200 Connection established\r\n\r\n"
    assert pod.calls == [("10.244.1.5", 8080, EgressProxy.DIAL_TIMEOUT)] and host.calls == []
    client.sendall(b"GET / HTTP/1.1\r\n\r\n")
    assert client.recv(4096) == b"GET / HTTP/1.1\r\n\r\n".upper()
    client.close()


@pytest.mark.parametrize("target,dialled", [("10.96.0.10:53", ("10.96.0.10", 53)),  # a Service's ClusterIP
                                            ("10.255.0.1:6443", ("10.255.0.1", 6443)),  # the apiserver there
                                            ("10.240.0.3:30080", ("10.240.0.3", 30080)),  # a node's NodePort
                                            ("10.240.0.2:8080", ("10.240.0.2", 8080))])  # a node's hostPort
def test_service_addresses_go_to_the_pod_network_too(target, dialled):
    proxy, pod, host = _proxy()
    client, answer = _ask(proxy, connect(target))
    assert answer.startswith(b"HTTP/1.1 200 ") and [c[:2] for c in pod.calls] == [dialled] and not host.calls
    client.close()


@pytest.mark.parametrize("target,dialled", [("localhost:10250", ("127.0.0.1", 10250)),  # an ExternalName Service
                                            ("127.0.0.1:10250", ("127.0.0.1", 10250)),  # a node at the loopback
                                            # A node's kubelet (KWOK) and resource metrics, at its InternalIP.
                                            ("10.240.0.2:10250", ("127.0.0.1", 10250)),
                                            ("10.240.3.231:10255", ("127.0.0.1", 10255)),
                                            ("127.0.0.2:443", ("127.0.0.2", 443)),
                                            ("[::1]:443", ("::1", 443))])
def test_localhost_and_the_loopback_are_dialled_on_the_host(target, dialled):
    proxy, pod, host = _proxy()
    client, answer = _ask(proxy, connect(target))
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert [c[:2] for c in host.calls] == [dialled] and not pod.calls
    client.sendall(b"ping")
    assert client.recv(4096) == b"PING"
    client.close()


@pytest.mark.parametrize("target,why", [("8.8.8.8:53", "8.8.8.8 is outside the cluster"),
                                        ("10.248.0.1:80", "10.248.0.1 is outside the cluster"),
                                        ("metrics.example.com:443", "metrics.example.com is not an address of "
                                                                     "the cluster")])
def test_anything_else_is_refused_with_403_and_its_reason(target, why):
    proxy, pod, host = _proxy()
    client, answer = _ask(proxy, connect(target))
    status, _, rest = answer.partition(b"\r\n")
    assert status.startswith(b"HTTP/1.1 403 Forbidden (" + why.encode())
    body = _rest(client, answer)
    assert body.decode().startswith(why) and body.endswith(b"\n") and body.count(b"\n") == 1
    assert b"Content-Length: %d" % len(body) in rest
    assert not pod.calls and not host.calls


def test_a_failed_dial_is_502_with_go_s_words():
    proxy, pod, _ = _proxy(pod=FakeDialer(fail=DialError("connect: connection refused")))
    client, answer = _ask(proxy, connect("10.244.1.5:8080"))
    assert answer.split(b"\r\n")[0] == (b"HTTP/1.1 502 Bad Gateway (dial tcp 10.244.1.5:8080 (pod network): "
                                        b"connect: connection refused)")
    assert _rest(client, answer) == b"dial tcp 10.244.1.5:8080 (pod network): connect: connection refused\n"
    # The holder gone (no node agent's network) and the host refusing are 502s as well.
    for proxy in (_proxy(pod=FakeDialer(fail=NetworkError("the pod network's holder does not answer")))[0],
                  _proxy(host=FakeDialer(fail=DialError("connect: connection refused")))[0]):
        target = "10.244.1.5:80" if proxy.dial_host.fail is None else "localhost:1"
        _, answer = _ask(proxy, connect(target))
        assert answer.startswith(b"HTTP/1.1 502 Bad Gateway ("), answer


@pytest.mark.parametrize("request_,code", [(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 405),
                                           (b"CONNECT 10.244.1.5 HTTP/1.1\r\n\r\n", 400),
                                           (b"CONNECT 10.244.1.5:99999 HTTP/1.1\r\n\r\n", 400),
                                           (b"CONNECT :80 HTTP/1.1\r\n\r\n", 400),
                                           (b"hello\r\n\r\n", 400)])
def test_what_is_not_a_connect_request_gets_4xx(request_, code):
    proxy, pod, host = _proxy()
    _, answer = _ask(proxy, request_)
    assert answer.startswith(b"HTTP/1.1 %d " % code), answer
    assert not pod.calls and not host.calls


def test_parse_connect_and_the_route():
    assert network.parse_connect(b"CONNECT 10.244.0.7:80 HTTP/1.1\r\nHost: 127.0.0.1") == ("10.244.0.7", 80)
    assert network.parse_connect(b"CONNECT [::1]:8443 HTTP/1.0") == ("::1", 8443)
    with pytest.raises(ValueError):  # (kube-apiserver resolves a Service's named ports before it dials)
        network.parse_connect(b"CONNECT 10.244.0.7:http HTTP/1.1")
    assert network.egress_route("LOCALHOST", 443) == ("host", "127.0.0.1")
    assert network.egress_route("10.244.255.254", 80) == ("pod network", "10.244.255.254")
    # A node's address: its kubelet's ports on the host, everything else on the nodes' network.
    assert network.egress_route("10.240.0.9", 10250, KUBELET_PORTS) == ("host", "127.0.0.1")
    assert network.egress_route("10.240.0.9", 10250) == ("pod network", "10.240.0.9")
    assert network.egress_route("10.240.0.9", 22, KUBELET_PORTS) == ("pod network", "10.240.0.9")
    with pytest.raises(EgressRefused):
        network.egress_route("192.168.1.1", 80)


def test_the_egress_socket_serves_connect_for_anyone_with_mode_0600_only(tmp_path):
    proxy, pod, _ = _proxy()
    path = tmp_path / network.EGRESS_SOCKET
    server = network.UnixServer(path, proxy.handle, "egress-test")
    server.start()
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        for _ in range(2):  # one connection after another, each its own tunnel
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(5)
                conn.connect(str(path))
                conn.sendall(connect("10.244.2.3:8080"))
                assert conn.recv(4096) == b"HTTP/1.1 200 Connection established\r\n\r\n"
                conn.sendall(b"abc")
                assert conn.recv(4096) == b"ABC"
        assert len(pod.calls) == 2
    finally:
        server.stop()
    assert not path.exists()


def test_the_egress_port_on_the_loopback_serves_host_programs_as_a_proxy():
    proxy, pod, host = _proxy()
    server = network.LoopbackServer(0, proxy.handle, "egress-test")
    server.start()
    try:
        assert server.port > 0
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as conn:
            conn.sendall(connect("10.240.0.2:10255"))  # metrics-server, to a node's resource metrics
            assert conn.recv(4096) == b"HTTP/1.1 200 Connection established\r\n\r\n"
            conn.sendall(b"tls")
            assert conn.recv(4096) == b"TLS"
        assert [c[:2] for c in host.calls] == [("127.0.0.1", 10255)] and not pod.calls
    finally:
        server.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1)


def test_the_apiserver_gets_the_egress_config_only_with_a_pod_network(tmp_path, monkeypatch):
    cluster = embedded.EmbeddedCluster(tmp_path / "cluster")
    monkeypatch.setattr(sandbox, "kind", lambda: "process")
    assert cluster._egress_selector() == []
    monkeypatch.setattr(sandbox, "kind", lambda: "namespaces")
    flags = cluster._egress_selector()
    assert flags == [f"--egress-selector-config-file={tmp_path / 'cluster' / 'egress-selector.yaml'}"]
    config = yaml.safe_load((tmp_path / "cluster" / "egress-selector.yaml").read_text())
    uds = network.ClusterNetwork(tmp_path / "cluster").dir / network.EGRESS_SOCKET
    assert config == {"apiVersion": "apiserver.k8s.io/v1beta1", "kind": "EgressSelectorConfiguration",
                      "egressSelections": [{"name": "cluster", "connection": {
                          "proxyProtocol": "HTTPConnect", "transport": {"uds": {"udsName": str(uds)}}}}]}
