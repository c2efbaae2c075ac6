"""port_is_free binds the way the cluster's servers do (SO_REUSEADDR), so TIME_WAIT does not count as taken."""

from __future__ import annotations

import socket

from gpulab.cluster.processes import free_port, port_is_free


def _listener(port: int = 0) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Go's net.Listen
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def test_a_listening_port_is_taken_even_by_a_reuseaddr_listener():
    with _listener() as server:
        port = server.getsockname()[1]
        assert not port_is_free(port)
        assert free_port(port) != port


def test_a_port_whose_server_exited_is_free_despite_time_wait():
    """The server closes an accepted connection first, as an HTTP server does: TIME_WAIT is on its port."""
    server = _listener()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()
    conn.close()  # server side closes first: this end goes to TIME_WAIT once the client closes
    client.recv(1)  # EOF
    client.close()
    server.close()
    assert port_is_free(port)
    assert free_port(port) == port
    # A listener with SO_REUSEADDR (any Go server, or a test's) gets the port at once.
    with _listener(port):
        pass


def test_a_port_the_kernel_hands_out_twice_is_drawn_again(tmp_path, monkeypatch):
    """Ports are free until their components listen: the same free port twice is not a collision to report."""
    from gpulab.cluster import embedded

    handed = iter([41000, 41000, 41001, 41002, 41003, 41004, 41005, 41006, 41007, 41008, 41009, 41010, 41011])
    monkeypatch.setattr(embedded, "free_port", lambda: next(handed))
    ports = embedded.EmbeddedCluster(tmp_path / "cluster")._ports({}, {})
    assert len(set(ports.values())) == len(ports) == len(embedded.PORTS)
