"""Which hosts and ports module sources may reach, and with what credentials: the settings' to say, never a branch's.

A branch names its modules' sources, so without a guard it could make the gateway fetch from its own network (a
cloud's metadata service, an internal host, a database's port on a mirror's host). An endpoint is a host and a
port, and `GATEWAY_MODULE_ALLOWED_HOSTS` lists endpoints: `git.internal`, `10.1.0.0/16`, `127.0.0.1:8443`,
`[::1]:8443`, `[fd00::/8]:443`; an entry without a port admits port 443 only. Without the setting:
registry.terraform.io and github.com over HTTPS (443) and github.com over ssh (22). The configured registry hosts
(`GATEWAY_MODULE_REGISTRY_TOKENS`, `GATEWAY_MODULE_REGISTRY_HOSTS`) are always admitted at their own ports (443
when a host names none; a served URL's port, or its scheme's).

Every endpoint is checked on its name and on each address the name resolves to: a loopback, link-local, private or
otherwise non-public address only when an entry lists it (or a network holding it) with that port, or lists the
name itself with it (then any address it resolves to).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from gateway.domain.errors import ConfigError, ModuleUnreachable

MiB = 2**20
ALLOWED_HOSTS_SETTING = "GATEWAY_MODULE_ALLOWED_HOSTS"
HTTPS = 443
DEFAULT_ALLOWED_HOSTS = ("registry.terraform.io", "github.com", "github.com:22")
DEFAULT_PORTS = {"https": HTTPS, "http": 80, "ssh": 22}

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class ArchiveLimits:
    """How much of a package a branch may make the gateway download, unpack and write (module_archives.py)."""

    archive_bytes: int = 100 * MiB
    unpacked_bytes: int = 256 * MiB
    members: int = 20_000
    directory_bytes: int = 16 * MiB  # a zip's central directory (read whole by zipfile)
    record_bytes: int = 1 * MiB  # one read tarfile makes (a pax or long-name header is read whole)


@dataclass(frozen=True)
class Endpoint:
    """One entry of the allow-list: a host name, or an address or network, at one port."""

    host: str  # a lower-case name; "" for an address or a network
    network: IPNetwork | None
    port: int

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        """`name[:port]`, `address[:port]`, `network[:port]`, IPv6 in brackets before a port; ValueError else."""
        text = text.strip().lower()
        bare = _network(text)  # an address or network written without a port (IPv6 included)
        if bare is not None:
            return cls("", bare, HTTPS)
        host, port = _split_port(text)
        network = _network(host)
        if network is None and not _NAME.match(host):
            raise ValueError(f"{text!r} is not a host, an address or a network, with an optional `:port`")
        return cls("" if network is not None else host, network, port)

    def admits(self, host: str, address: IPAddress | None, port: int) -> bool:
        return port == self.port and (host == self.host if self.network is None else
                                      address is not None and address in self.network)


_NAME = re.compile(r"^[0-9a-z_]([0-9a-z_-]*[0-9a-z_])?(\.[0-9a-z_]([0-9a-z_-]*[0-9a-z_])?)*$")


def _split_port(text: str) -> tuple[str, int]:
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise ValueError(f"{text!r}: only `:port` may follow `]`")
        port = rest[1:] if rest else str(HTTPS)
    else:
        host, sep, port = text.rpartition(":") if ":" in text else (text, "", str(HTTPS))
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r}: {port!r} is not a port")
    return host, int(port)


def resolve_host(host: str) -> list[IPAddress]:
    """Every address `host` resolves to (IPv4-mapped IPv6 as IPv4), in the resolver's order."""
    try:
        found = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as exc:
        raise ModuleUnreachable(f"{host}: the name does not resolve ({one_line(exc)})") from exc
    addresses = []
    for *_, sockaddr in found:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%")[0])
        mapped = getattr(address, "ipv4_mapped", None)
        addresses.append(mapped or address)
    return addresses


@dataclass(frozen=True)
class ModuleAccess:
    """What the gateway may use to reach module sources; built from the settings, never from a branch."""

    tokens: dict[str, str] = field(default_factory=dict)  # registry host -> bearer token
    hosts: dict[str, str] = field(default_factory=dict)  # registry host -> where its service discovery is served
    ca_bundle: Path | None = None
    allow_file_urls: bool = False
    timeout: float = 60.0  # the longest one module's fetch may take, start to end
    allowed_hosts: tuple[str, ...] | None = None  # GATEWAY_MODULE_ALLOWED_HOSTS (None: DEFAULT_ALLOWED_HOSTS)
    resolve: Callable[[str], list[IPAddress]] = field(default=resolve_host, compare=False, repr=False)
    limits: ArchiveLimits = ArchiveLimits()

    @classmethod
    def from_settings(cls, tokens: str | None, hosts: str | None, ca_bundle: Path | None, allow_file_urls: bool,
                      timeout: float = 60.0, allowed_hosts: str | None = None) -> ModuleAccess:
        listed = None if allowed_hosts is None else tuple(h.strip().lower() for h in allowed_hosts.split(",")
                                                          if h.strip())
        for entry in listed or ():
            try:
                Endpoint.parse(entry)
            except ValueError as exc:
                raise ConfigError(f"{ALLOWED_HOSTS_SETTING}: {exc}") from exc
        return cls(_pairs(tokens), _pairs(hosts), ca_bundle, allow_file_urls, timeout, listed)

    def admit(self, host: str, port: int) -> list[IPAddress] | None:
        """Refuse (ModuleUnreachable, naming the setting) an endpoint the settings do not let module sources reach; else
        the addresses it was checked at (resolved once: connect to these, never to the name), or None when the
        setting lists the host itself at that port (whatever address it resolves to)."""
        return self._check(host, port, resolve=True)

    def admit_name(self, host: str, port: int) -> None:
        """The part of `admit` that needs no resolution: the name, or an address written as the host."""
        self._check(host, port, resolve=False)

    def _check(self, host: str, port: int, resolve: bool) -> list[IPAddress] | None:
        host = host.strip("[]").lower()
        listed = self._listed()
        literal = literal_address(host)
        if any(entry.admits(host, literal, port) for entry in listed):
            return None  # listed in the setting: whatever address it is
        shown = _endpoint(host, port)
        if (host, port) not in self._named() and (literal is None or literal.is_global):
            raise ModuleUnreachable(f"{shown} is not a host module sources may reach ({ALLOWED_HOSTS_SETTING} admits it)")
        if literal is None and not resolve:
            return None
        addresses = [literal] if literal is not None else self.resolve(host)
        for address in addresses:
            if not address.is_global and not any(entry.admits("", address, port) for entry in listed):
                at = "" if literal is not None else f"at {address}, "
                raise ModuleUnreachable(f"{shown} is {at}a {_kind(address)} address, which module sources may not reach "
                                  f"unless {ALLOWED_HOSTS_SETTING} lists it")
        return addresses

    def _listed(self) -> list[Endpoint]:
        entries = []
        for text in self.allowed_hosts or ():
            try:
                entries.append(Endpoint.parse(text))
            except ValueError:
                continue  # admits nothing (from_settings refuses it at start)
        return entries

    def _named(self) -> set[tuple[str, int]]:
        """The endpoints admitted by name without being listed: the defaults (when nothing is listed) and the
        configured registries, where their discovery is served included."""
        named = {(e.host, e.port) for e in map(Endpoint.parse, DEFAULT_ALLOWED_HOSTS if self.allowed_hosts is None
                                               else ())}
        for host in (*self.hosts, *self.tokens):  # a registry host as a source address writes it: name[:port]
            try:
                named.add(_split_port(host))
            except ValueError:
                continue
        for url in self.hosts.values():
            parts = urlsplit(url)
            named.add(((parts.hostname or "").lower(), parts.port or DEFAULT_PORTS.get(parts.scheme, HTTPS)))
        return named


def _endpoint(host: str, port: int) -> str:
    """How a message names an endpoint: the host alone at 443."""
    if port == HTTPS:
        return host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def literal_address(text: str) -> IPAddress | None:
    """The address `text` is written as, or None for a name."""
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _network(text: str) -> IPNetwork | None:
    try:
        return ipaddress.ip_network(text.strip("[]"), strict=False)
    except ValueError:
        return None


def _kind(address: IPAddress) -> str:
    for kind in ("loopback", "link_local", "private", "multicast", "reserved", "unspecified"):
        if getattr(address, f"is_{kind}"):
            return kind.replace("_", "-")
    return "non-public"


def _pairs(text: str | None) -> dict[str, str]:
    """`host=value,host2=value2` (the form of GATEWAY_MODULE_REGISTRY_TOKENS) as a mapping."""
    out = {}
    for item in (text or "").split(","):
        host, sep, value = item.strip().partition("=")
        if sep and host.strip() and value.strip():
            out[host.strip().lower()] = value.strip()
    return out


def one_line(value: object) -> str:
    """A value (an exception, say) as one line of at most 200 characters."""
    text = " ".join(str(value).split())
    return text[:200] or type(value).__name__
