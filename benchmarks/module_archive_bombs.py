"""Peak memory, time and disk of fetching hostile module packages over HTTP, beside the floor of a tiny package.

A branch names the URL of a module's package, so the server, and every byte it sends, is the branch's to choose.
This script builds the archives (tests/module_bombs.py: nothing is downloaded), serves them from a real HTTP
server on loopback, and fetches each in a fresh Python process (`ModuleFetcher.fetch_package`, as the installer
calls it), which prints its own peak RSS (getrusage's ru_maxrss), the wall time, what became of the fetch, and
the bytes it left on disk at its end:

  floor           a .tar.gz of one small file (what any fetch costs: Python, httpx, the fetcher)
  tar.gz bomb     1 MiB that unpacks to one 1 GiB file
  1,024 files     1 MiB that unpacks to 1,024 files of 1 MiB
  pax header      1 MiB whose first member is a 1 GiB pax header (tarfile reads a header whole)
  zip bomb        1 MiB whose one member unpacks to 1 GiB
  160 MiB         an archive of 160 MiB of random bytes, its Content-Length sent
  160 MiB, no length   the same, sent without Content-Length (the end of the body is the connection's)

The tree whose code runs is the current directory's unless `--tree` names another (say, an older commit's
`git archive` unpacked somewhere, for a before/after).
Usage: python benchmarks/module_archive_bombs.py [--tree PATH] [--only NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.module_bombs import MiB, tar_gz_bomb, zip_bomb  # noqa: E402 (the repository's tests are no package path)
from tests.module_registry import pack  # noqa: E402

FETCH = """
import json, resource, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from gateway.adapters.modules.fetch import ModuleAccess, ModuleFetcher, PackageSource, ModuleUnreachable  # in every tree
url, port = sys.argv[2], sys.argv[3]
# listed both ways: an older tree admits a host at every port, the newer one a host:port
access = ModuleAccess(allowed_hosts=("127.0.0.1", f"127.0.0.1:{port}"), timeout=600.0)
start = time.monotonic()
with tempfile.TemporaryDirectory(prefix="bomb-") as tmp:
    try:
        ModuleFetcher(access).fetch_package(PackageSource(url), Path(tmp) / "package")
        outcome = "accepted"
    except ModuleUnreachable as exc:
        outcome = "refused: " + str(exc).split(": ", 1)[-1]
    left = sum(p.stat().st_size for p in Path(tmp).rglob("*") if p.is_file())
seconds = time.monotonic() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"outcome": outcome, "peak_mib": peak, "seconds": seconds, "left_mib": left / 2**20}))
"""

CASES = {  # name -> path on the server
    "floor": "/floor.tar.gz",
    "tar.gz bomb": "/bomb.tar.gz",
    "1,024 files": "/files.tar.gz",
    "pax header": "/pax.tar.gz",
    "zip bomb": "/bomb.zip",
    "160 MiB": "/big.tar.gz",
    "160 MiB, no length": "/big-unsized.tar.gz",
}


class Files(BaseHTTPRequestHandler):
    """Serves the built archives, and 160 MiB of random bytes made as they are sent."""

    protocol_version = "HTTP/1.0"  # a body without Content-Length ends when the connection does

    def log_message(self, format: str, *args: object) -> None:
        return

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        root: Path = self.server.root  # type: ignore[attr-defined]
        if self.path.startswith("/big"):
            self.send_response(200)
            if self.path == "/big.tar.gz":
                self.send_header("Content-Length", str(160 * MiB))
            self.end_headers()
            block = os.urandom(MiB)
            try:
                for _ in range(160):
                    self.wfile.write(block)
            except OSError:
                return  # the client stopped reading
            return
        path = root / self.path.lstrip("/")
        body = path.read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--only", choices=sorted(CASES))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bombs-") as tmp:
        root = Path(tmp)
        small = root / "small"
        small.mkdir()
        (small / "main.tf").write_text('resource "aws_sqs_queue" "q" {}\n')
        (root / "floor.tar.gz").write_bytes(pack(small))
        tar_gz_bomb(root / "bomb.tar.gz")
        tar_gz_bomb(root / "files.tar.gz", members=1024, mib_each=1)
        tar_gz_bomb(root / "pax.tar.gz", kind=tarfile.XHDTYPE)
        zip_bomb(root / "bomb.zip")
        server = ThreadingHTTPServer(("127.0.0.1", 0), Files)
        server.daemon_threads = True
        server.root = root  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port = server.server_address[1]
        print(f"tree: {args.tree}")
        print(f"{'case':<20} {'peak RSS':>10} {'seconds':>8} {'left':>9}  outcome")
        try:
            for name, path in CASES.items():
                if args.only and name not in (args.only, "floor"):
                    continue
                done = subprocess.run([sys.executable, "-c", FETCH, str(args.tree), f"http://127.0.0.1:{port}{path}",
                                       str(port)], capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    print(f"{name:<20} failed: {done.stderr.strip().splitlines()[-1:]}")
                    continue
                result = json.loads(done.stdout)
                print(f"{name:<20} {result['peak_mib']:>6.0f} MiB {result['seconds']:>8.2f} {result['left_mib']:>5.0f} MiB"
                      f"  {result['outcome'][:90]}")
        finally:
            server.shutdown()
            server.server_close()


if __name__ == "__main__":
    main()
