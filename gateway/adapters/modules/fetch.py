"""Fetching remote module packages the way `terraform init` does: module registries, git, HTTP archives.

Source addresses, as Terraform reads them:

- `./x`, `../x`: a local path (not fetched here).
- `[host/]namespace/name/provider[//subdir]`: a module registry (default host registry.terraform.io). The
  host's `/.well-known/terraform.json` names its `modules.v1` base; `GET <base><ns>/<name>/<provider>/versions`
  lists versions, `GET …/<version>/download` answers 204 with `X-Terraform-Get`: where the package is, itself
  a git or HTTP source below (relative to the download URL).
- `git::<url>[//subdir][?ref=<ref>]`, and the shorthands `github.com/org/repo` and `git@host:org/repo.git`.
- `http(s)://…/x.zip|.tar.gz|.tgz[//subdir]` (or `?archive=zip|tar.gz`): an archive; any other HTTP URL must
  answer with `X-Terraform-Get` naming one of the above.

Credentials come from the gateway's settings (registry tokens by host, a CA bundle) and git's own
configuration on the gateway's host, never from the declaration repo. `file://` git URLs are refused unless the
settings allow them: a branch could otherwise read any repository on the gateway's host.

Which hosts and ports a source may reach is the settings' too (`ModuleAccess.admit`, module_access.py). Every
request is checked, the redirects httpx follows and each X-Terraform-Get target included, and every git clone, on
its host name and port and on the addresses the name resolves to. The connection then goes to an address that was
checked, never to the name resolved again (a name that answers the check with a public address and the connect
with an internal one, DNS rebinding): HTTP through `module_http.py`'s client, git over HTTP(S) through curl's
pinned resolution. git is told not to follow HTTP redirects, so the checked host is the one it reaches.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urljoin, urlsplit, urlunsplit

from gateway.adapters.modules.access import (
    DEFAULT_PORTS,
    IPAddress,
    MiB,
    ModuleAccess,
    ModuleUnreachable,
    literal_address,
    one_line,
)
from gateway.adapters.modules.archives import ArchiveRefused, extract_archive

if TYPE_CHECKING:
    import httpx

DEFAULT_REGISTRY = "registry.terraform.io"
TIMEOUT_SETTING = "GATEWAY_MODULE_FETCH_TIMEOUT_SECONDS"
MAX_ANSWER_BYTES = 4 * MiB  # a registry's JSON, or what a URL answering X-Terraform-Get sends with it
_PART = re.compile(r"^[0-9A-Za-z][0-9A-Za-z_-]*$")
_HOST = re.compile(r"^[0-9A-Za-z.-]+\.[0-9A-Za-z-]+(:\d+)?$|^localhost(:\d+)?$|^\d+\.\d+\.\d+\.\d+(:\d+)?$")
_ARCHIVES = (".zip", ".tar.gz", ".tgz", ".tar")
_UNSUPPORTED = ("s3::", "gcs::", "hg::", "oci::")


@dataclass(frozen=True)
class RegistrySource:
    host: str
    namespace: str
    name: str
    provider: str
    subdir: str = ""

    @property
    def package(self) -> str:
        """The package address as Terraform writes it in modules.json (host included)."""
        return f"{self.host}/{self.namespace}/{self.name}/{self.provider}"

    def __str__(self) -> str:
        return self.package + (f"//{self.subdir}" if self.subdir else "")


@dataclass(frozen=True)
class PackageSource:
    """A git or HTTP package in go-getter's forced form (`git::https://…?ref=v1`, `https://…/x.tar.gz`)."""

    url: str
    subdir: str = ""

    @property
    def is_git(self) -> bool:
        return self.url.startswith("git::")

    def __str__(self) -> str:
        if not self.subdir:
            return self.url
        base, _, query = self.url.partition("?")
        return f"{base}//{self.subdir}" + (f"?{query}" if query else "")


def is_local(source: str) -> bool:
    return source.startswith(("./", "../"))


def parse_source(source: str) -> RegistrySource | PackageSource:
    """A remote source address as Terraform reads it; a `ValueError` says why one is not understood."""
    if source.startswith(_UNSUPPORTED):
        raise ValueError(f"{source.split('::')[0]}:: sources are not fetched by the gateway (use git, HTTP or a "
                         "registry)")
    if source.startswith("git::"):
        return _package("git::", source[5:])
    if source.startswith("git@"):  # scp-like: git@github.com:org/repo.git
        host, _, path = source[4:].partition(":")
        return _package("git::", f"ssh://git@{host}/{path}")
    if re.match(r"^(github\.com|gitlab\.com|bitbucket\.org)/", source):
        base, _, query = source.partition("?")
        parts = base.split("//", 1)
        repo = parts[0] if parts[0].endswith(".git") else parts[0] + ".git"
        return _package("git::", f"https://{repo}" + (f"//{parts[1]}" if len(parts) > 1 else "")
                        + (f"?{query}" if query else ""))
    if source.startswith(("http://", "https://")):
        return _package("", source)
    if "::" in source or "://" in source or source.startswith("/"):
        raise ValueError("not a source address the gateway understands (local path, registry, git:: or HTTP)")
    address, _, subdir = source.partition("//")
    parts = address.split("/")
    if len(parts) == 4 and _HOST.match(parts[0]):
        host, parts = parts[0].lower(), parts[1:]
    elif len(parts) == 3:
        host = DEFAULT_REGISTRY
    else:
        raise ValueError("not a registry address (`namespace/name/provider`, optionally after a host)")
    if not all(_PART.match(p) for p in parts):
        raise ValueError("not a registry address (`namespace/name/provider`, optionally after a host)")
    return RegistrySource(host, parts[0], parts[1], parts[2], _subdir(subdir))


def _subdir(text: str) -> str:
    """A `//subdir` inside a package: it may name a folder of the package, never one outside it."""
    subdir = text.strip("/")
    if any(part == ".." for part in re.split(r"[/\\]", subdir)):
        raise ValueError(f"the subdirectory {subdir!r} leaves its package (`..` is not allowed after `//`)")
    return subdir


def _package(prefix: str, text: str) -> PackageSource:
    """Split go-getter's `//subdir` (after the scheme's `://`) out of `url[//subdir][?query]`."""
    base, _, query = text.partition("?")
    scheme, sep, rest = base.partition("://")
    if not sep:
        raise ValueError("a git or HTTP source needs a URL with a scheme")
    path, _, subdir = rest.partition("//")
    ref = dict(parse_qsl(query)).get("ref", "")
    if prefix == "git::" and ref.startswith("-"):
        raise ValueError(f"the ref {ref!r} begins with '-' (git would read it as an option)")
    url = f"{prefix}{scheme}://{path}" + (f"?{query}" if query else "")
    return PackageSource(url, _subdir(subdir))


@dataclass(frozen=True)
class _Answer:
    """What an HTTP GET answered: its status, the URL it came from after redirects, its headers, and its body when
    the body was read into memory (JSON, or what comes with an X-Terraform-Get)."""

    status: int
    url: str
    headers: Mapping[str, str]
    body: bytes = b""


class ModuleFetcher:
    """Reaches registries over HTTPS and packages over git or HTTP, with the settings' credentials.

    One module's fetch (discovery, versions, download address, package; or a git clone) is bounded as a whole
    by the settings' timeout, however slowly a server sends: every read and every git command gets what is left of
    it (`bounded`). What a server sends is counted as it arrives and refused past its limit."""

    def __init__(self, access: ModuleAccess):
        self.access = access
        self._client: httpx.Client | None = None
        self._discovered: dict[str, str] = {}
        self._fetch = threading.local()  # .deadline: when the current thread's fetch must have ended

    @contextmanager
    def bounded(self) -> Iterator[None]:
        """Everything inside is one fetch, ending by one deadline (the settings' timeout from the outermost
        entry): the installer puts a module's registry calls and its package in one."""
        if self.deadline() is not None:
            yield
            return
        self._fetch.deadline = time.monotonic() + self.access.timeout
        try:
            yield
        finally:
            self._fetch.deadline = None

    def deadline(self) -> float | None:
        """When the current fetch must have ended (time.monotonic), or None outside one."""
        return getattr(self._fetch, "deadline", None)

    def _remaining(self, what: str) -> float:
        deadline = self.deadline()
        left = self.access.timeout if deadline is None else deadline - time.monotonic()
        if left <= 0:
            raise self._late(what)
        return left

    def _late(self, what: str) -> ModuleUnreachable:
        return ModuleUnreachable(f"{what}: the fetch took longer than {self.access.timeout:g} s ({TIMEOUT_SETTING})")

    # --- registry ---------------------------------------------------------------------------

    def versions(self, source: RegistrySource) -> list[str]:
        """The versions the registry lists for a module."""
        with self.bounded():
            url = f"{self._modules_base(source.host)}{source.namespace}/{source.name}/{source.provider}/versions"
            answer = self._get(url)
        if answer.status == 404:
            raise ModuleUnreachable(f"the registry {source.host} has no module {source.package}")
        body = self._json(answer, url)
        try:
            return [str(v["version"]) for m in body["modules"] for v in m["versions"]]
        except (KeyError, TypeError) as exc:
            raise ModuleUnreachable(f"{url}: not a module registry answer (no modules[].versions[].version)") from exc

    def download_address(self, source: RegistrySource, version: str) -> PackageSource:
        """Where the registry says the package of `version` is (its X-Terraform-Get, made absolute)."""
        with self.bounded():
            base = self._modules_base(source.host)
            url = f"{base}{source.namespace}/{source.name}/{source.provider}/{version}/download"
            answer = self._get(url)
        location = answer.headers.get("X-Terraform-Get")
        if answer.status not in (200, 204) or not location:
            raise ModuleUnreachable(f"{url} answered {answer.status} without X-Terraform-Get")
        return _located(location, answer.url)

    def _modules_base(self, host: str) -> str:
        if host not in self._discovered:
            root = self.access.hosts.get(host, f"https://{host}").rstrip("/") + "/"
            url = urljoin(root, ".well-known/terraform.json")
            services = self._json(self._get(url), url)
            base = services.get("modules.v1") if isinstance(services, dict) else None
            if not isinstance(base, str):
                raise ModuleUnreachable(f"{host} offers no module registry (no modules.v1 in {url})")
            self._discovered[host] = urljoin(url, base).rstrip("/") + "/"
        return self._discovered[host]

    # --- HTTP -------------------------------------------------------------------------------

    def _http(self) -> httpx.Client:
        if self._client is None:
            from gateway.adapters.modules.http import checked_client  # only where a stack calls a remote module

            context = ssl.create_default_context(cafile=str(self.access.ca_bundle) if self.access.ca_bundle else None)
            self._client = checked_client(self.access, context, self.deadline)
        return self._client

    def _get(self, url: str, into: IO[bytes] | None = None, limit: int = MAX_ANSWER_BYTES) -> _Answer:
        """GET `url`; a 200's body is written to `into` (else kept in the answer), refused once it passes `limit`
        bytes (before a byte is read when Content-Length says so)."""
        import httpx

        shown = _without_secrets(url)
        # identity: the bytes counted are the bytes sent (no gzip inflating past the count inside a single read)
        headers = {"User-Agent": "change-gateway", "Accept-Encoding": "identity"}
        token = self._token_for(url)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            with self._http().stream("GET", url, headers=headers, timeout=self._remaining(shown)) as response:
                _refuse_status(response.status_code, shown)
                kept = io.BytesIO()
                if response.status_code == 200:
                    self._read(response, kept if into is None else into, limit, shown)
                return _Answer(response.status_code, str(response.url), response.headers, kept.getvalue())
        except httpx.HTTPError as exc:
            deadline = self.deadline()
            if deadline is not None and time.monotonic() >= deadline:
                raise self._late(shown) from exc
            raise ModuleUnreachable(f"{shown}: {type(exc).__name__}: {one_line(exc)}") from exc

    def _read(self, response: httpx.Response, into: IO[bytes], limit: int, shown: str) -> None:
        declared = response.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > limit:
            raise ModuleUnreachable(f"{shown}: answers {int(declared) // MiB} MiB, more than the {limit // MiB} MiB a "
                              "module source may send")
        count = 0
        for chunk in response.iter_raw():
            count += len(chunk)
            if count > limit:
                raise ModuleUnreachable(f"{shown}: sends more than the {limit // MiB} MiB a module source may send")
            self._remaining(shown)  # a server that trickles bytes still ends by the deadline
            into.write(chunk)

    def _token_for(self, url: str) -> str | None:
        """The token of the registry host this URL is on (a host served elsewhere counts as itself there)."""
        host = (urlsplit(url).netloc or "").lower()
        for registry, served in self.access.hosts.items():
            if host == urlsplit(served).netloc.lower():
                host = registry
        return self.access.tokens.get(host)

    def _json(self, answer: _Answer, url: str) -> Any:
        if answer.status != 200:
            raise ModuleUnreachable(f"{_without_secrets(url)} answered {answer.status}")
        try:
            return json.loads(answer.body)
        except ValueError as exc:
            raise ModuleUnreachable(f"{_without_secrets(url)}: not JSON") from exc

    # --- packages ---------------------------------------------------------------------------

    def fetch_package(self, package: PackageSource, dest: Path, depth: int = 0) -> str:
        """Fetch the package (not its subdir) into the empty directory `dest`; returns the version fetched (a
        git commit, else ""). Nothing is left in `dest` when it is refused."""
        with self.bounded():
            if package.is_git:
                return self._fetch_git(package.url[5:], dest)
            base, _, query = package.url.partition("?")
            params = dict(parse_qsl(query))
            kind = params.pop("archive", None) or next((a.lstrip(".") for a in _ARCHIVES if base.endswith(a)), None)
            if kind is None:  # go-getter's HTTP form: the URL answers where the package really is
                if depth > 3:
                    raise ModuleUnreachable(f"{_without_secrets(package.url)}: X-Terraform-Get redirects too many times")
                answer = self._get(package.url)
                location = answer.headers.get("X-Terraform-Get")
                if not location:
                    raise ModuleUnreachable(f"{_without_secrets(package.url)} is not an archive and answers no "
                                      "X-Terraform-Get")
                return self.fetch_package(_located(location, answer.url), dest, depth + 1)
            url = urlunsplit(urlsplit(base)._replace(query=urlencode(params))) if params else base
            self._fetch_archive(url, kind, dest)
            return ""

    def _fetch_archive(self, url: str, kind: str, dest: Path) -> None:
        """Download to a file no one else can see (gone when closed, whatever happens) beside `dest`, and unpack."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=dest.parent) as archive:
            answer = self._get(url, archive, self.access.limits.archive_bytes)
            if answer.status != 200:
                raise ModuleUnreachable(f"{_without_secrets(url)} answered {answer.status}")
            try:
                extract_archive(archive, kind, dest, self.access.limits)
            except ArchiveRefused as exc:
                raise ModuleUnreachable(f"{_without_secrets(url)}: {exc}") from exc

    def _fetch_git(self, url: str, dest: Path) -> str:
        base, _, query = url.partition("?")
        params = dict(parse_qsl(query))
        ref = params.get("ref")
        scheme = urlsplit(base).scheme
        if scheme == "file" and not self.access.allow_file_urls:
            raise ModuleUnreachable("file:// git sources are refused (GATEWAY_MODULE_FILE_SOURCES allows them)")
        if scheme not in ("https", "http", "ssh", "file"):
            raise ModuleUnreachable(f"git over {scheme or 'a local path'} is not fetched by the gateway")
        allowed = ["https", "http", "ssh"] + (["file"] if self.access.allow_file_urls else [])
        # no ext:: or other transports a branch could name; no redirect to a host that was not checked
        config = ["-c", "protocol.allow=never", "-c", "http.followRedirects=false"]
        if scheme != "file":
            parts = urlsplit(base)
            config += _pinned_resolution(base, self.access.admit(parts.hostname or "", parts.port or
                                                                 DEFAULT_PORTS[scheme]))
        for protocol in allowed:
            config += ["-c", f"protocol.{protocol}.allow=always"]
        env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true"}
        if self.access.ca_bundle:
            env["GIT_SSL_CAINFO"] = str(self.access.ca_bundle)
        with tempfile.TemporaryDirectory(prefix="gw-git-") as tmp:
            clone = Path(tmp) / "clone"
            # a branch writes the URL and the ref: after --end-of-options git reads neither as an option
            self._git(["git", *config, "clone", "--quiet", "--no-checkout", "--end-of-options", base, str(clone)],
                      env, base)
            commit = self._commit(clone, ref, env, base)
            self._git(["git", "-C", str(clone), "checkout", "--quiet", "--detach", commit, "--"], env, base)
            shutil.rmtree(clone / ".git")
            drop_links(clone)  # a link could point anywhere on this host: packages hold files and folders only
            shutil.copytree(clone, dest, dirs_exist_ok=True, symlinks=True)
        return commit

    def _commit(self, clone: Path, ref: str | None, env: dict[str, str], url: str) -> str:
        """The commit `ref` names in the clone (a tag, a commit, or one of the remote's branches; HEAD without one).
        `parse_source` refuses a ref beginning with '-', and after --end-of-options git reads any ref as a value."""
        for name in ([ref, f"refs/remotes/origin/{ref}"] if ref else ["HEAD"]):
            try:
                return self._git(["git", "-C", str(clone), "rev-parse", "--verify", "--quiet", "--end-of-options",
                                  f"{name}^{{commit}}"], env, url).strip()
            except _GitFailed:
                continue
        raise ModuleUnreachable(f"git {_without_secrets(url)}: has no ref {ref!r}" if ref else
                          f"git {_without_secrets(url)}: the repository has no commit")

    def _git(self, args: list[str], env: dict[str, str], url: str) -> str:
        """Run git with what is left of the fetch's time; past it, git and every process it started are killed."""
        shown = f"git {_without_secrets(url)}"
        try:
            process = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, start_new_session=True)
        except OSError as exc:
            raise ModuleUnreachable(f"{shown}: {type(exc).__name__}") from exc
        with process:
            try:
                out, err = process.communicate(timeout=self._remaining(shown))
            except (subprocess.TimeoutExpired, ModuleUnreachable) as exc:
                with suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)  # its session: git-remote-https and the like with it
                process.communicate()
                raise self._late(shown) from exc
        if process.returncode != 0:
            detail = next((line.removeprefix("fatal: ") for line in err.splitlines() if line.startswith("fatal:")),
                          err.strip().splitlines()[-1:] or "failed")
            raise _GitFailed(f"{shown}: {one_line(detail)}")
        return out


class _GitFailed(ModuleUnreachable):
    """git ran and said no (not: it took too long)."""


def _refuse_status(status: int, shown: str) -> None:
    if status in (401, 403):
        raise ModuleUnreachable(f"{shown} answered {status}: set a token for its host in GATEWAY_MODULE_REGISTRY_TOKENS")
    if status >= 400 and status != 404:
        raise ModuleUnreachable(f"{shown} answered {status}")


def _pinned_resolution(url: str, checked: list[IPAddress] | None) -> list[str]:
    """git's options that make curl connect to the addresses the guard checked, not to what the name resolves to
    at the clone (`http.curloptResolve`, curl's CURLOPT_RESOLVE; git ≥ 2.37). Over ssh, ssh resolves the name
    itself and verifies the host key against it: see docs/ARCHITECTURE.md, Remote modules."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if checked is None or parts.scheme not in ("https", "http") or literal_address(host) is not None:
        return []
    port = parts.port or (443 if parts.scheme == "https" else 80)
    addresses = ",".join(f"[{a}]" if a.version == 6 else str(a) for a in checked)
    return ["-c", f"http.curloptResolve={host}:{port}:{addresses}"]


def _located(location: str, answered_by: str) -> PackageSource:
    """The package an X-Terraform-Get names (relative to the URL that answered it); the server is a branch's to
    choose, so anything the source parser refuses is the one-line refusal, naming the header."""
    address = _absolute(location, answered_by)
    try:
        package = parse_source(address)
    except ValueError as exc:
        raise ModuleUnreachable(f"{_without_secrets(answered_by)}: X-Terraform-Get {_without_secrets(address)}: "
                          f"{exc}") from exc
    if not isinstance(package, PackageSource):
        raise ModuleUnreachable(f"{_without_secrets(answered_by)}: X-Terraform-Get names a registry address ({address})")
    return package


def _absolute(location: str, base: str) -> str:
    """X-Terraform-Get relative to the URL that answered it; a forced or scheme-full address as it is."""
    if "::" in location.split("/")[0] or "://" in location or re.match(r"^(github\.com|git@)", location):
        return location
    return urljoin(base, location)


def _without_secrets(url: str) -> str:
    """A URL as messages may show it: no user or password, no query (tokens travel in both)."""
    forced, _, rest = url.rpartition("::")
    parts = urlsplit(rest)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    shown = urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    return f"{forced}::{shown}" if forced else shown


def drop_links(root: Path) -> None:
    """Remove every symbolic link under `root` (as archives are unpacked: links are skipped), never following one."""
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder, name)
            if path.is_symlink():
                path.unlink()
