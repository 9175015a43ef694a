"""What routing a webhook delivery to its repository costs, with 20 repositories in the gateway.

Prints p50/p95 (microseconds) of:
- route: `route_delivery` for a GitHub repository the last repository names (every repository's main is read; what
  each main's gateway.yaml names comes from the cache, kept by main commit);
- cold: the same with nothing cached (each gateway.yaml read and parsed again: the first delivery after a restart;
  after a merge only that repository's is);
- floor: what a route cannot do without: the registry read (one read-only session listing the repositories) and
  each active repository's main commit read (its workspace, its ref);
- registry: the registry read alone.

The workspace is a real one (SQLite in a temporary directory, or PostgreSQL with --postgres URL: a scratch database),
its repositories real bare git repositories made by `gateway repos add`. It is not a test.

Usage: python benchmarks/webhook_route.py [--postgres postgresql+psycopg://postgres@127.0.0.1:5432/postgres]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scratch_db import scratch_database  # noqa: E402

from gateway.adapters.git import repo as git_repo  # noqa: E402
from gateway.composition import add_repository, create_workspace  # noqa: E402
from gateway.config import Settings  # noqa: E402
from gateway.services.forge import routing  # noqa: E402
from gateway.services.workspace import Workspace  # noqa: E402
from tests.conftest import add_people  # noqa: E402

REPOSITORIES, ROUNDS, COLD_ROUNDS = 20, 2000, 30
GATEWAY_YAML = """\
engine: sandbox
approvals:
  required: 1
stacks:
  network:
    path: stacks/network
    approvers: [platform]
forge: github
github:
  repository: acme/{name}
  teams: {{platform: platform-team}}
"""


def percentiles(samples: list[float]) -> str:
    cuts = statistics.quantiles(samples, n=100)
    return f"p50 {cuts[49] * 1e6:8.0f} µs   p95 {cuts[94] * 1e6:8.0f} µs   ({len(samples)} runs)"


def timed(work: Callable[[], object], rounds: int, before: Callable[[], object] = lambda: None) -> list[float]:
    samples = []
    for _ in range(rounds):
        before()
        start = time.perf_counter()
        work()
        samples.append(time.perf_counter() - start)
    return samples


def build(root: Path, database_url: str | None) -> Workspace:
    ws = create_workspace(Settings(home=root / "home", database_url=database_url, token=None,
                                   github_webhook_secret="s", github_repositories=["acme/*"]))
    admin = add_people(ws).admin
    for n in range(1, REPOSITORIES):  # with the workspace's own: 20
        folder = root / f"repo-{n}"
        (folder / "stacks" / "network").mkdir(parents=True)
        (folder / "stacks" / "network" / "main.tf").write_text('resource "aws_sqs_queue" "q" { name = "q" }\n')
        (folder / "gateway.yaml").write_text(GATEWAY_YAML.format(name=f"repo-{n}"))
        add_repository(ws, admin, f"repo-{n}", folder)
    return ws


def forget(ws: Workspace) -> None:
    """Nothing cached: routing's names by main commit, and the git adapter's parsed gateway.yaml by blob."""
    ws.forge_names.clear()
    git_repo._SETTINGS._values.clear()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--postgres", help="a PostgreSQL server's URL (a scratch database is made on it)")
    args = parser.parse_args()
    last = f"acme/repo-{REPOSITORIES - 1}"
    with tempfile.TemporaryDirectory() as tmp, scratch_database(args.postgres, "webhook_route") as url:
        ws = build(Path(tmp), url)
        ws = ws.for_request()  # as a request sees it
        assert routing.route_delivery(ws, "github", last).repository == f"repo-{REPOSITORIES - 1}"
        assert routing.route_delivery(ws, "github", "acme/unknown").repository is None
        assert routing.route_delivery(ws, "github", "evil/repo-1").repository is None  # outside the allow-list

        def registry() -> list[str]:
            with ws.store.session(readonly=True) as session:
                return [r.name for r in session.repositories.list() if r.active]

        def floor() -> list[str]:
            return [(lambda w: w.repo.resolve(w.main_branch()))(ws.in_repository(name)) for name in registry()]

        print(f"{REPOSITORIES} repositories, {'PostgreSQL' if url else 'SQLite'}")
        print("route    ", percentiles(timed(lambda: routing.route_delivery(ws, "github", last), ROUNDS)))
        print("cold     ", percentiles(timed(lambda: routing.route_delivery(ws, "github", last), COLD_ROUNDS,
                                             before=lambda: forget(ws))))
        print("floor    ", percentiles(timed(floor, ROUNDS)))
        print("registry ", percentiles(timed(registry, ROUNDS)))
        ws.close()


if __name__ == "__main__":
    main()
