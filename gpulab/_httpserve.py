"""Many small HTTP servers, accepted by one thread.

``serve_forever`` gives every server a thread that wakes every ``poll_interval``
whether or not anyone connects. An exporter per simulated node makes that a
thousand threads waking a few times a second. :class:`SharedHTTPServer` is a
``ThreadingHTTPServer`` whose listening socket one process-wide thread watches
with a selector instead; each request is still handled in a thread of its own,
and ``shutdown()`` stops the server as it stops a ``serve_forever`` loop.

Only for servers whose accept does not block: a TLS server's handshake runs in
``accept`` and would hold every other server up.
"""

from __future__ import annotations

import selectors
import socket
import threading
from http.server import ThreadingHTTPServer


class _Acceptor:
    """The thread that accepts for every :class:`SharedHTTPServer` of the process."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Condition()
        self._handling: SharedHTTPServer | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._run, name="http-accept", daemon=True)
        self._thread.start()

    def add(self, server: SharedHTTPServer) -> None:
        with self._lock:
            self._selector.register(server.socket, selectors.EVENT_READ, server)
        self._wake()

    def remove(self, server: SharedHTTPServer) -> None:
        """Stop accepting for ``server``; returns once no request of it is being accepted."""
        with self._lock:
            try:
                self._selector.unregister(server.socket)
            except (KeyError, ValueError):
                pass
            if threading.current_thread() is not self._thread:
                self._lock.wait_for(lambda: self._handling is not server)
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except BlockingIOError:
            pass  # already awake

    def _run(self) -> None:
        while True:
            for key, _ in self._selector.select():
                server = key.data
                if server is None:
                    try:
                        while self._wake_r.recv(4096):
                            pass
                    except BlockingIOError:
                        pass
                    continue
                with self._lock:
                    if self._selector.get_map().get(key.fd) is not key:
                        continue  # removed since select returned
                    self._handling = server
                try:
                    server.handle_ready()
                finally:
                    with self._lock:
                        self._handling = None
                        self._lock.notify_all()


_acceptor: _Acceptor | None = None
_acceptor_lock = threading.Lock()


def _shared() -> _Acceptor:
    global _acceptor
    with _acceptor_lock:
        if _acceptor is None:
            _acceptor = _Acceptor()
        return _acceptor


class SharedHTTPServer(ThreadingHTTPServer):
    """A ``ThreadingHTTPServer`` served by the process's accept thread: ``start()``, then ``shutdown()``."""

    daemon_threads = True

    def start(self) -> None:
        """Serve in the background (what a thread running ``serve_forever`` would do)."""
        self.socket.setblocking(False)
        _shared().add(self)

    def handle_ready(self) -> None:
        # Accepts one connection and hands it to a thread; a client gone before the accept is skipped.
        self._handle_request_noblock()

    def get_request(self) -> tuple[socket.socket, object]:
        conn, address = super().get_request()
        conn.setblocking(True)  # accepted sockets inherit the listener's non-blocking mode
        return conn, address

    def shutdown(self) -> None:
        _shared().remove(self)
