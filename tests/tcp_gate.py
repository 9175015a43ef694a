"""A TCP forwarder in a thread that a test opens and cuts: a database that is down, then back, then gone again.

Real sockets both ways: a client behind the gate sees exactly what it sees when the server's host goes away (its
connections reset, new ones refused) and when it comes back.
"""

from __future__ import annotations

import socket
import threading


class TcpGate:
    """Listens on 127.0.0.1:`port`; while open, each connection is forwarded to `target`; `cut` drops them all and
    refuses new ones until `open` again."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._open = threading.Event()
        self._lock = threading.Lock()
        self._live: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="tcp-gate").start()

    def open(self) -> None:
        self._open.set()

    def cut(self) -> None:
        self._open.clear()
        with self._lock:
            live, self._live = self._live, []
        for sock in live:
            _close(sock)

    def close(self) -> None:
        self._closed = True
        self.cut()
        _close(self._listener)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self._open.is_set():
                _close(client)  # refused, as by a host whose server is down
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(client)
                continue
            server.settimeout(None)
            with self._lock:
                self._live += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        _close(source)
        _close(sink)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
