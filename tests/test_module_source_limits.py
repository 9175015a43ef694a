"""A branch names its modules' sources, so every byte a source's server sends is the branch's: archive bombs built
here (tests/module_bombs.py), servers in a thread that send too much or send it too slowly. Each is refused with
the one-line error naming the module, within the bounds, and leaves nothing behind (peak memory is measured by
benchmarks/module_archive_bombs.py)."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import git
import pytest

from gateway.adapters.modules.access import ArchiveLimits, ModuleAccess
from gateway.adapters.modules.fetch import ModuleFetcher
from gateway.adapters.modules.installer import ModuleInstaller
from gateway.domain.errors import ConfigError

from .module_bombs import MiB, tar_gz_bomb, zip_bomb
from .module_registry import pack

Behaviour = Callable[[BaseHTTPRequestHandler], None]


class Server:
    """An HTTP server on loopback answering each path as the test says; it counts the body bytes it got out."""

    def __init__(self) -> None:
        self.routes: dict[str, Behaviour] = {}
        self.sent = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, format: str, *args: object) -> None:
                return

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                route = owner.routes.get(self.path)
                if route is None:
                    self.send_error(404)
                    return
                try:
                    route(self)
                except OSError:
                    return  # the client went away

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.http.owner = self  # type: ignore[attr-defined]
        self.port = self.http.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def file(self, path: str, body: bytes) -> str:
        def send(handler: BaseHTTPRequestHandler) -> None:
            handler.send_response(200)
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            self.write(handler, body)
        self.routes[path] = send
        return self.url + path

    def write(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        for start in range(0, len(body), 64 * 1024):
            handler.wfile.write(body[start:start + 64 * 1024])
            self.sent += min(64 * 1024, len(body) - start)

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def server() -> Iterator[Server]:
    served = Server()
    yield served
    served.close()


def stack_calling(tmp_path: Path, source: str) -> Path:
    repo = tmp_path / "repo"
    (repo / "stacks" / "app").mkdir(parents=True)
    (repo / "gateway.yaml").write_text("")
    (repo / "stacks" / "app" / "main.tf").write_text(f'module "net" {{\n  source = "{source}"\n}}\n')
    return repo / "stacks" / "app"


def modules(cache: Path, port: int, **overrides: object) -> ModuleInstaller:
    """An installer whose sources may reach 127.0.0.1 at `port` (a test server's)."""
    values: dict[str, object] = {"allowed_hosts": (f"127.0.0.1:{port}",), "timeout": 30.0}
    values.update(overrides)
    return ModuleInstaller(cache, ModuleFetcher(ModuleAccess(**values)))  # type: ignore[arg-type]


def refused(installer: ModuleInstaller, stack: Path) -> str:
    with pytest.raises(ConfigError) as refusal:
        with installer.installed(stack):
            pass
    message = str(refusal.value)
    assert "\n" not in message
    return message


def nothing_left(cache: Path) -> bool:
    """The cache holds no package, no partial download, no unpacked file."""
    return not cache.exists() or not any(cache.iterdir())


# --- what an archive unpacks to ---------------------------------------------------------------

@pytest.fixture(scope="module")
def bombs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    folder = tmp_path_factory.mktemp("bombs")
    return {"bomb.tar.gz": tar_gz_bomb(folder / "bomb.tar.gz").read_bytes(),  # 1 MiB -> one 1 GiB file
            "bomb.zip": zip_bomb(folder / "bomb.zip").read_bytes(),  # 1 MiB -> one 1 GiB member
            "pax.tar.gz": tar_gz_bomb(folder / "pax.tar.gz", kind=tarfile.XHDTYPE).read_bytes(),  # a 1 GiB header
            "files.tar.gz": tar_gz_bomb(folder / "files.tar.gz", members=64, mib_each=1).read_bytes()}


@pytest.mark.parametrize(("name", "why"), [
    ("bomb.tar.gz", "archive unpacks to more than 256 MiB"),
    ("bomb.zip", "archive unpacks to more than 256 MiB"),
    ("pax.tar.gz", "archive holds a tar record larger than 1 MiB"),
])
def test_an_archive_that_unpacks_to_a_gigabyte_is_refused_before_it_is_written(
        server: Server, tmp_path: Path, bombs: dict[str, bytes], name: str, why: str) -> None:
    assert len(bombs[name]) < 1.1 * MiB
    url = server.file(f"/{name}", bombs[name])
    started = time.monotonic()
    message = refused(modules(tmp_path / "cache", server.port), stack_calling(tmp_path, url))
    assert message == f'stacks/app/main.tf:1: module "net": source "{url}" cannot be reached: {url}: {why}'
    assert time.monotonic() - started < 10  # its header says 1 GiB: nothing of it is unpacked
    assert nothing_left(tmp_path / "cache")


def test_many_members_are_refused_once_what_they_unpack_to_passes_the_limit(
        server: Server, tmp_path: Path, bombs: dict[str, bytes]) -> None:
    url = server.file("/files.tar.gz", bombs["files.tar.gz"])  # 64 files of 1 MiB, each under the limit alone
    small = modules(tmp_path / "cache", server.port, limits=ArchiveLimits(unpacked_bytes=8 * MiB))
    message = refused(small, stack_calling(tmp_path, url))
    assert message.endswith(f"cannot be reached: {url}: archive unpacks to more than 8 MiB")
    assert nothing_left(tmp_path / "cache")
    with modules(tmp_path / "cache", server.port).installed(stack_calling(tmp_path / "ok", url)) as (work, _):
        assert len(list((work / ".terraform" / "modules" / "net").iterdir())) == 64  # within the default limit


def test_an_archive_of_more_members_than_the_limit_is_refused(server: Server, tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for i in range(501):
            archive.writestr(f"m/{i}.tf", "")
    zip_url = server.file("/many.zip", buffer.getvalue())
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for i in range(250):
            archive.addfile(tarfile.TarInfo(f"m/{i}.tf"))
            link = tarfile.TarInfo(f"m/{i}.link")
            link.type, link.linkname = tarfile.SYMTYPE, f"{i}.tf"
            archive.addfile(link)  # links count as members too (they are never written)
        archive.addfile(tarfile.TarInfo("m/last.tf"))
    tar_url = server.file("/many.tar.gz", buffer.getvalue())
    for url in (zip_url, tar_url):
        few = modules(tmp_path / "cache", server.port, limits=ArchiveLimits(members=500))
        message = refused(few, stack_calling(tmp_path / url[-6:], url))
        assert message.endswith(f"cannot be reached: {url}: archive holds more than 500 members")
        assert nothing_left(tmp_path / "cache")
    assert ArchiveLimits().members == 20_000


# --- what a server sends ----------------------------------------------------------------------

def send_random(mib: int, declared: bool) -> Behaviour:
    def send(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        if declared:
            handler.send_header("Content-Length", str(mib * MiB))
        handler.end_headers()  # HTTP/1.0 without Content-Length: the body ends when the connection does
        block = bytes(range(256)) * 4096
        for _ in range(mib):
            server_of(handler).write(handler, block)
    return send


def server_of(handler: BaseHTTPRequestHandler) -> Server:
    return handler.server.owner  # type: ignore[attr-defined, no-any-return]


def test_a_download_larger_than_the_limit_is_refused_as_it_arrives(server: Server, tmp_path: Path) -> None:
    server.routes["/declared.tar.gz"] = send_random(160, declared=True)
    server.routes["/undeclared.tar.gz"] = send_random(160, declared=False)
    url = f"{server.url}/declared.tar.gz"
    message = refused(modules(tmp_path / "cache", server.port), stack_calling(tmp_path / "a", url))
    assert message.endswith(f"cannot be reached: {url}: answers 160 MiB, more than the 100 MiB a module source may "
                            "send")
    assert server.sent < 32 * MiB  # refused on its Content-Length: the body was never read (only what buffers hold)
    server.sent = 0
    url = f"{server.url}/undeclared.tar.gz"
    message = refused(modules(tmp_path / "cache", server.port), stack_calling(tmp_path / "b", url))
    assert message.endswith(f"cannot be reached: {url}: sends more than the 100 MiB a module source may send")
    assert server.sent < 132 * MiB  # read as it came, and no further than the limit
    assert nothing_left(tmp_path / "cache")


# --- how long it may take ---------------------------------------------------------------------

def trickle(body: bytes, every: float) -> Behaviour:
    """Answer `body` a byte at a time, `every` seconds apart (each read the client makes gets a byte in time)."""
    def send(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        for byte in body:
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()
            time.sleep(every)
    return send


def late(body: bytes, delay: float) -> Behaviour:
    """Answer `body` whole, after `delay` seconds."""
    def send(handler: BaseHTTPRequestHandler) -> None:
        time.sleep(delay)
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
    return send


def test_a_body_sent_a_byte_at_a_time_ends_at_the_fetchs_time_limit(server: Server, tmp_path: Path) -> None:
    package = tmp_path / "package"
    package.mkdir()
    (package / "main.tf").write_text("# a module\n")
    server.routes["/slow.tar.gz"] = trickle(pack(package), every=0.2)  # a minute of bytes, 0.2 s apart
    url = f"{server.url}/slow.tar.gz"
    started = time.monotonic()
    message = refused(modules(tmp_path / "cache", server.port, timeout=2.0), stack_calling(tmp_path, url))
    assert time.monotonic() - started < 4.5
    assert message.endswith(f"cannot be reached: {url}: the fetch took longer than 2 s "
                            "(GATEWAY_MODULE_FETCH_TIMEOUT_SECONDS)")
    assert nothing_left(tmp_path / "cache")


def test_a_registrys_slow_answers_add_up_to_one_fetchs_time_limit(server: Server, tmp_path: Path) -> None:
    # each answer comes within the limit; together (discovery, versions, download, package) they do not
    package = tmp_path / "package"
    package.mkdir()
    (package / "main.tf").write_text("# a module\n")
    versions = {"modules": [{"versions": [{"version": "1.0.0"}]}]}
    server.routes["/.well-known/terraform.json"] = late(json.dumps({"modules.v1": "/v1/modules/"}).encode(), 0.9)
    server.routes["/v1/modules/acme/net/aws/versions"] = late(json.dumps(versions).encode(), 0.9)

    def download(handler: BaseHTTPRequestHandler) -> None:
        time.sleep(0.9)
        handler.send_response(204)
        handler.send_header("X-Terraform-Get", "/net.tar.gz")
        handler.end_headers()
    server.routes["/v1/modules/acme/net/aws/1.0.0/download"] = download
    server.routes["/net.tar.gz"] = late(pack(package), 0.9)
    stack = stack_calling(tmp_path, "registry.example/acme/net/aws")
    hosts = {"registry.example": server.url}
    message = refused(modules(tmp_path / "cache", server.port, hosts=hosts, timeout=2.5), stack)
    assert message.endswith("the fetch took longer than 2.5 s (GATEWAY_MODULE_FETCH_TIMEOUT_SECONDS)")
    with modules(tmp_path / "cache", server.port, hosts=hosts, timeout=10.0).installed(stack) as (work, pins):
        assert [p.version for p in pins] == ["1.0.0"]


def test_a_git_server_that_trickles_is_stopped_at_the_fetchs_time_limit(tmp_path: Path) -> None:
    work = tmp_path / "module"
    work.mkdir()
    (work / "main.tf").write_text("# a module\n" * 2000)
    repo = git.Repo.init(work)
    repo.git.add("-A")
    repo.git.execute(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "v1"])
    bare = tmp_path / "net.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)
    subprocess.run(["git", "-C", str(bare), "update-server-info"], check=True)  # git's dumb HTTP: static files

    class Slow(SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=str(tmp_path), **kwargs)  # type: ignore[arg-type]

        def log_message(self, format: str, *args: object) -> None:
            return

        def copyfile(self, source: object, outputfile: object) -> None:  # every file a byte every 0.2 s
            try:
                while byte := source.read(1):  # type: ignore[attr-defined]
                    outputfile.write(byte)  # type: ignore[attr-defined]
                    outputfile.flush()  # type: ignore[attr-defined]
                    time.sleep(0.2)
            except OSError:
                return

    http = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    http.daemon_threads = True
    threading.Thread(target=http.serve_forever, daemon=True).start()
    try:
        url = f"git::http://127.0.0.1:{http.server_address[1]}/net.git"
        started = time.monotonic()
        message = refused(modules(tmp_path / "cache", http.server_address[1], timeout=2.0),
                          stack_calling(tmp_path, url))
        assert time.monotonic() - started < 4.5  # git, and the helper it runs for HTTP, are stopped
        assert message.endswith("the fetch took longer than 2 s (GATEWAY_MODULE_FETCH_TIMEOUT_SECONDS)")
        assert nothing_left(tmp_path / "cache")
    finally:
        http.shutdown()
        http.server_close()
