"""gpulab._httpserve: many HTTP servers accepted by one thread, each stopped by shutdown()."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler

import pytest

from gpulab._httpserve import SharedHTTPServer


def _handler(body: bytes, entered: threading.Event | None = None, release: threading.Event | None = None):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if entered is not None:
                entered.set()
                release.wait(5)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    return Handler


def _get(server: SharedHTTPServer, timeout: float = 5) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/", timeout=timeout) as resp:
        return resp.read()


@pytest.fixture
def servers():
    started: list[SharedHTTPServer] = []

    def make(body: bytes, **kwargs) -> SharedHTTPServer:
        server = SharedHTTPServer(("127.0.0.1", 0), _handler(body, **kwargs))
        started.append(server)
        server.start()
        return server

    yield make
    for server in started:
        server.shutdown()
        server.server_close()


def test_many_servers_answer_without_a_thread_each(servers):
    first = servers(b"server 0")
    assert _get(first) == b"server 0"  # the accept thread exists from here on
    before = threading.active_count()
    many = [first] + [servers(f"server {i}".encode()) for i in range(1, 20)]
    for i, server in enumerate(many):
        assert _get(server) == f"server {i}".encode()
    # Other tests' threads may come and go meanwhile: no thread per server is the point.
    assert threading.active_count() - before < len(many) - 1
    assert [t.name for t in threading.enumerate() if t.name == "http-accept"] == ["http-accept"]


def test_a_shut_down_server_accepts_no_more_and_the_others_go_on(servers):
    gone, kept = servers(b"gone"), servers(b"kept")
    assert _get(gone) == b"gone"
    gone.shutdown()
    with pytest.raises((urllib.error.URLError, TimeoutError, OSError)):
        _get(gone, timeout=0.5)
    assert _get(kept) == b"kept"


def test_a_slow_request_holds_up_neither_the_other_servers_nor_shutdown(servers):
    entered, release = threading.Event(), threading.Event()
    slow, fast = servers(b"slow", entered=entered, release=release), servers(b"fast")
    answers: list[bytes] = []
    waiting = threading.Thread(target=lambda: answers.append(_get(slow)))
    waiting.start()
    try:
        assert entered.wait(5)
        assert _get(fast) == b"fast"  # each request runs in a thread of its own
        started = time.monotonic()
        slow.shutdown()
        assert time.monotonic() - started < 1
    finally:
        release.set()
        waiting.join(5)
    assert answers == [b"slow"]  # a request accepted before shutdown is answered
