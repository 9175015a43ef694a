"""The HTTP client module sources are fetched with: it connects only to an address the host guard checked.

The guard (`ModuleAccess.admit`) resolves a host and checks every address before a connection is made; were the
client to resolve the name again, a name that answered a public address to the check could answer a loopback or
metadata address to the connect (DNS rebinding). So the connect is the check's: httpcore's network backend is
where a connection to a host is opened, and this one resolves the host once through the guard and opens the
connection to one of the addresses it checked, never by name. TLS is unchanged above it: the handshake names
the host (SNI) and the certificate is verified against the host name, as httpcore does for any connection.

The same backend bounds time: httpx's timeouts are per read, so a server sending a byte a second would keep a
fetch going as long as it liked; every connect, read and write on its connections waits at most until the
current fetch's deadline (`ModuleFetcher.bounded`).
Imported only where a stack calls a remote module (httpx and httpcore are not loaded for a read).
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import httpcore
import httpx

from gateway.adapters.modules.access import DEFAULT_PORTS

if TYPE_CHECKING:
    import ssl

    from gateway.adapters.modules.access import ModuleAccess


Deadline = Callable[[], "float | None"]  # when the current fetch must have ended (time.monotonic), None: no fetch


def _bounded(timeout: float | None, deadline: Deadline, late: type[Exception]) -> float | None:
    """`timeout`, shortened to what is left before the deadline; `late` once nothing is."""
    end = deadline()
    if end is None:
        return timeout
    left = end - time.monotonic()
    if left <= 0:
        raise late("the module fetch's time is up")
    return left if timeout is None else min(timeout, left)


class DeadlineStream(httpcore.NetworkStream):
    """A connection whose every wait (read, write, TLS handshake) ends by the current fetch's deadline."""

    def __init__(self, stream: httpcore.NetworkStream, deadline: Deadline):
        self.stream = stream
        self.deadline = deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self.stream.read(max_bytes, _bounded(timeout, self.deadline, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.stream.write(buffer, _bounded(timeout, self.deadline, httpcore.WriteTimeout))

    def close(self) -> None:
        self.stream.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        secured = self.stream.start_tls(ssl_context, server_hostname,
                                        _bounded(timeout, self.deadline, httpcore.ConnectTimeout))
        return DeadlineStream(secured, self.deadline)

    def get_extra_info(self, info: str) -> Any:
        return self.stream.get_extra_info(info)


class CheckedAddressBackend(httpcore.NetworkBackend):
    """Opens TCP connections to the addresses the guard checked for the host, in the order it resolved them, each
    bounded by the current fetch's deadline."""

    def __init__(self, access: ModuleAccess, deadline: Deadline):
        self.access = access
        self.deadline = deadline
        self.tcp = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None) -> httpcore.NetworkStream:
        checked = self.access.admit(host, port)  # ModuleUnreachable (not an httpcore error): httpx passes it on as it is
        addresses = [host] if checked is None else [str(a) for a in checked]  # None: listed, any address
        failure: httpcore.ConnectError | httpcore.ConnectTimeout | None = None
        for address in addresses:
            try:
                stream = self.tcp.connect_tcp(address, port, _bounded(timeout, self.deadline, httpcore.ConnectTimeout),
                                              local_address, socket_options)
                return DeadlineStream(stream, self.deadline)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        raise failure or httpcore.ConnectError(f"{host}: no address to connect to")

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("module sources are not fetched over a unix socket")

    def sleep(self, seconds: float) -> None:
        self.tcp.sleep(seconds)


class CheckedAddressTransport(httpx.HTTPTransport):
    """httpx's transport over a connection pool whose connections go to checked addresses only (no proxy: see
    `checked_client`)."""

    def __init__(self, access: ModuleAccess, tls: ssl.SSLContext, deadline: Deadline):
        super().__init__(verify=tls, trust_env=False)
        # httpx builds its pool with no way to name a network backend: the pool it sends through is replaced
        # (the one attribute of HTTPTransport read here; tests/test_remote_modules.py fails if that ever changes)
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=5.0)  # httpx's
        self._pool = httpcore.ConnectionPool(ssl_context=tls, max_connections=limits.max_connections,
                                             max_keepalive_connections=limits.max_keepalive_connections,
                                             keepalive_expiry=limits.keepalive_expiry,
                                             network_backend=CheckedAddressBackend(access, deadline))


def checked_client(access: ModuleAccess, tls: ssl.SSLContext, deadline: Deadline = lambda: None) -> httpx.Client:
    """A client for module sources: every request's host and port checked by name before it is sent (each redirect
    httpx follows included), every connection opened to an address checked for it, and every wait on it ended
    by `deadline`.

    Where the environment names an HTTP(S) proxy (an egress proxy the operator runs), requests go through it, as
    they must to leave such a network: each host is still checked, name and every address it resolves to here,
    but the proxy resolves the name again when it connects, so the address is the proxy's to hold; and its
    connections are httpx's own, so a read there may outlast the deadline by one read's timeout (the fetcher
    checks it between reads)."""
    if any(urllib.request.getproxies().get(scheme) for scheme in ("https", "http", "all")):
        return httpx.Client(verify=tls, timeout=access.timeout, follow_redirects=True, trust_env=True,
                            event_hooks={"request": [lambda request: access.admit(request.url.host, _port(request))]})
    return httpx.Client(transport=CheckedAddressTransport(access, tls, deadline), timeout=access.timeout,
                        follow_redirects=True, trust_env=False,
                        event_hooks={"request": [lambda request: access.admit_name(request.url.host, _port(request))]})


def _port(request: httpx.Request) -> int:
    return request.url.port or DEFAULT_PORTS.get(request.url.scheme, 443)
