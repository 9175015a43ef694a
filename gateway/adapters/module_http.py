"""The HTTP client module sources are fetched with: it connects only to an address the host guard checked.

The guard (`ModuleAccess.admit`) resolves a host and checks every address before a connection is made; were the
client to resolve the name again, a name that answered a public address to the check could answer a loopback or
metadata address to the connect (DNS rebinding). So the connect is the check's: httpcore's network backend is
where a connection to a host is opened, and this one resolves the host once through the guard and opens the
connection to one of the addresses it checked, never by name. TLS is unchanged above it: the handshake names
the host (SNI) and the certificate is verified against the host name, as httpcore does for any connection.
Imported only where a stack calls a remote module (httpx and httpcore are not loaded for a read).
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable
from typing import TYPE_CHECKING

import httpcore
import httpx

if TYPE_CHECKING:
    import ssl

    from gateway.adapters.module_fetch import ModuleAccess


class CheckedAddressBackend(httpcore.NetworkBackend):
    """Opens TCP connections to the addresses the guard checked for the host, in the order it resolved them."""

    def __init__(self, access: ModuleAccess):
        self.access = access
        self.tcp = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None) -> httpcore.NetworkStream:
        checked = self.access.admit(host)  # Unreachable (not an httpcore error): httpx passes it on as it is
        if checked is None:  # the setting lists the host itself: any address it resolves to
            return self.tcp.connect_tcp(host, port, timeout, local_address, socket_options)
        failure: httpcore.ConnectError | httpcore.ConnectTimeout | None = None
        for address in checked:
            try:
                return self.tcp.connect_tcp(str(address), port, timeout, local_address, socket_options)
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

    def __init__(self, access: ModuleAccess, tls: ssl.SSLContext):
        super().__init__(verify=tls, trust_env=False)
        # httpx builds its pool with no way to name a network backend: the pool it sends through is replaced
        # (the one attribute of HTTPTransport read here; tests/test_remote_modules.py fails if that ever changes)
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=5.0)  # httpx's
        self._pool = httpcore.ConnectionPool(ssl_context=tls, max_connections=limits.max_connections,
                                             max_keepalive_connections=limits.max_keepalive_connections,
                                             keepalive_expiry=limits.keepalive_expiry,
                                             network_backend=CheckedAddressBackend(access))


def checked_client(access: ModuleAccess, tls: ssl.SSLContext) -> httpx.Client:
    """A client for module sources: every request's host checked by name before it is sent (each redirect httpx
    follows included), and every connection opened to an address checked for it.

    Where the environment names an HTTP(S) proxy (an egress proxy the operator runs), requests go through it, as
    they must to leave such a network: each host is still checked, name and every address it resolves to here,
    but the proxy resolves the name again when it connects, so the address is the proxy's to hold."""
    if any(urllib.request.getproxies().get(scheme) for scheme in ("https", "http", "all")):
        return httpx.Client(verify=tls, timeout=access.timeout, follow_redirects=True, trust_env=True,
                            event_hooks={"request": [lambda request: access.admit(request.url.host)]})
    return httpx.Client(transport=CheckedAddressTransport(access, tls), timeout=access.timeout,
                        follow_redirects=True, trust_env=False,
                        event_hooks={"request": [lambda request: access.admit_name(request.url.host)]})
