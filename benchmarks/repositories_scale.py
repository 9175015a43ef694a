"""Many repositories at scale (issue #42): 20 declaration repositories × 50 stacks, 2,000 proposals and 1,000,000
audit events in one gateway; then the reads that must not grow with them, each printed beside its goal and a floor
measured in the same run, and the machine's load.

The world:
- a workspace whose own repository and 19 added ones (`add_repository`, generated content) hold 50 small sandbox
  stacks each, named alike across repositories (s00..s49; an added repository's are `repo/s00`...);
- one real proposal a repository (`open_proposal`: planned in this process, its rows as the gateway writes them),
  then the rest as copies of it, bulk-inserted: its `proposals` row under a new id and a branch of its own (a git ref
  at the same head, so the branch exists), its `plans` rows and its `plan_rounds`/`plan_round_stacks` rows, nothing
  else (its jobs are finished and no read looks at them). Every copy is open and waiting for approval;
- the audit trail through the real append path (`append_many`, 2,000 events a transaction, as
  benchmarks/audit_trail.py does), its events spread over the 2,000 proposals and the 1,000 stacks.

The reads, through `gateway serve --workers 0` (one API process, as benchmarks/reads.py), at 1 and 8 clients:
`GET /api/v1/repos/{repo}/proposals/{id}` (goal p95 ≤ 20 ms), the inbox of an approver of every stack
(`GET /api/v1/repos/{repo}/inbox`: the repository's ~100 open proposals), and the audit filters by stack, by
proposal and by repository (migration 33), one page of 100 from a random `after` (goal p95 ≤ 50 ms). Floors: a 404
of the same app (routing, HTTP, no work) and `SELECT 1` through the store's engine. A webhook's route to its
repository, in this process: `route_delivery` for a GitHub repository (the generated gateway.yaml names none, so
every repository is read, as for a hit; where main has no routing function, `ws.in_repository(name)` plus its main
gateway.yaml instead), warm and on a new process's first call to each repository. Then the
proposal read and the inbox in this process, without HTTP: statements and CPU a call, and the slowest statements of
one call (figures the machine's load moves less than the latencies).

Full size takes about 5 minutes on PostgreSQL and 17 on SQLite (appending 1M events is most of it) on 2 loaded
cores; --small about 35 seconds.

Usage: python benchmarks/repositories_scale.py [sqlite | POSTGRES_ADMIN_URL] [--small]
       (default the local PostgreSQL; --small: 3 repositories, 200 proposals, 50,000 events)
It is not a test.
"""

from __future__ import annotations

import inspect
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import git
import httpx
from audit_trail import BATCH, KINDS, PEOPLE, payload  # siblings: this script's directory is on the path
from reads import load, wait_until_up
from scratch_db import scratch_database
from sqlalchemy import event, func, insert, select, text

from gateway.adapters.git.repo import committer_env
from gateway.adapters.store.schema import plan_round_stacks, plan_rounds, plans, proposals
from gateway.composition import add_repository, create_workspace, open_workspace
from gateway.config import Settings
from gateway.domain.principals import PrincipalKind, Role
from gateway.logs import configure_logging
from gateway.services.admin import audit as audit_service
from gateway.services.admin.users import add_principal, token_read
from gateway.services.change.proposals import open_proposal
from gateway.services.change.views import inbox, view_proposal
from gateway.services.workspace import Workspace

STACKS = 50
CLIENTS = (1, 8)
READ_GOAL, FILTER_GOAL = 20.0, 50.0  # ms, p95
PAGE = 100
FULL = {"repositories": 20, "proposals": 2000, "events": 1_000_000, "seconds": 3}
SMALL = {"repositories": 3, "proposals": 200, "events": 50_000, "seconds": 1}  # seconds of GETs a figure


def declarations(directory: Path) -> Path:
    """50 small sandbox stacks, approved by platform (and app, the requester's group)."""
    directory.mkdir(parents=True)
    stacks = "\n".join(f"  s{i:02}:\n    path: stacks/s{i:02}\n    approvers: [platform, app]" for i in range(STACKS))
    (directory / "gateway.yaml").write_text(f"engine: sandbox\napprovals:\n  required: 1\nstacks:\n{stacks}\n"
                                            "policy:\n  required_tags: []\n")
    for i in range(STACKS):
        stack = directory / "stacks" / f"s{i:02}"
        stack.mkdir(parents=True)
        stack.joinpath("main.tf").write_text(
            "".join(f'resource "aws_sqs_queue" "q{n}" {{\n  name = "s{i:02}-q{n}"\n}}\n' for n in range(3)))
    return directory


def build(ws: Workspace, names: list[str], total: int, alice: Any, tmp: Path) -> dict[str, list[int]]:
    """One real proposal a repository, then copies of it up to `total` in all; the proposal ids by repository."""
    ids: dict[str, list[int]] = {}
    per = total // len(names)
    started = time.perf_counter()
    for n, name in enumerate(names):
        rws = ws.in_repository(name)
        clone = git.Repo.clone_from(str(rws.settings.repo_path), tmp / f"clone-{name}")
        branch = f"change-{name}"
        clone.git.checkout("-q", "-B", branch, "origin/main")
        stack = f"s{n % STACKS:02}"
        Path(clone.working_dir, "stacks", stack, "extra.tf").write_text(
            f'resource "aws_sqs_queue" "extra" {{\n  name = "{name}-{stack}-extra"\n}}\n')
        clone.git.add("-A")
        clone.git.execute(["git", "commit", "-qm", f"a queue in {stack}"], env=committer_env())
        clone.git.push("-q", "origin", branch)
        ids[name] = [open_proposal(rws, alice, branch, f"a queue in {stack} of {name}").id]
    real = time.perf_counter() - started
    started = time.perf_counter()
    for name in names:
        ids[name] += copy_proposal(ws, ids[name][0], per - 1)
    print(f"proposals: {len(names)} opened and planned for real in {real:.1f} s, "
          f"{sum(map(len, ids.values())) - len(names):,} copies of them inserted in "
          f"{time.perf_counter() - started:.1f} s; {load()}")
    return ids


def copy_proposal(ws: Workspace, template: int, count: int) -> list[int]:
    """`count` copies of proposal `template`: its row under new ids with branches of their own (refs at its head in
    its repository), its plans and its plan rounds."""
    with ws.store.db.transaction() as conn:
        row = dict(conn.execute(select(proposals).where(proposals.c.id == template)).mappings().one())
        its_plans = [dict(r) for r in conn.execute(select(plans).where(plans.c.proposal_id == template)).mappings()]
        rounds = [dict(r) for r in conn.execute(select(plan_rounds).where(plan_rounds.c.proposal_id == template)
                                                ).mappings()]
        round_stacks = {r["id"]: [dict(s) for s in conn.execute(
            select(plan_round_stacks).where(plan_round_stacks.c.round_id == r["id"])).mappings()] for r in rounds}
        first = int(conn.scalar(select(func.max(proposals.c.id))) or 0) + 1
        first_round = int(conn.scalar(select(func.max(plan_rounds.c.id))) or 0) + 1
        new_ids = list(range(first, first + count))
        conn.execute(insert(proposals), [row | {"id": i, "branch": f"{row['branch']}-copy-{i}"} for i in new_ids])
        conn.execute(insert(plans), [{k: v for k, v in p.items() if k != "id"} | {"proposal_id": i}
                                     for i in new_ids for p in its_plans])
        round_rows, stack_rows = [], []
        next_round = first_round
        for i in new_ids:
            for r in rounds:
                round_rows.append(r | {"id": next_round, "proposal_id": i})
                stack_rows += [s | {"round_id": next_round} for s in round_stacks[r["id"]]]
                next_round += 1
        if round_rows:
            conn.execute(insert(plan_rounds), round_rows)
        if stack_rows:
            conn.execute(insert(plan_round_stacks), stack_rows)
        if not ws.store.db.is_sqlite:  # explicit ids: the sequences move past them
            for table in ("proposals", "plan_rounds"):
                conn.execute(text(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM "
                                  f"{table}))"))
    repo = ws.in_repository(row["repository"]).settings.repo_path
    refs = "".join(f"create refs/heads/{row['branch']}-copy-{i} {row['head_sha']}\n" for i in new_ids)
    subprocess.run(["git", "--git-dir", str(repo), "update-ref", "--stdin"], input=refs.encode(), check=True)
    return new_ids


def append_trail(ws: Workspace, events: int, stacks: list[str], last_proposal: int) -> None:
    """The trail through the real append path, as benchmarks/audit_trail.py builds it."""
    rng = random.Random(7)
    started = time.perf_counter()
    for first in range(0, events, BATCH):
        batch = [(rng.choice(PEOPLE), rng.choice(KINDS), payload(i), 1 + i % last_proposal, [stacks[i % len(stacks)]])
                 for i in range(first, min(first + BATCH, events))]
        with ws.store.session() as session:
            session.audit.append_many(batch)
    wall = time.perf_counter() - started
    with ws.store.db.transaction() as conn:
        conn.execute(text("ANALYZE"))
    print(f"audit trail: {events:,} events appended in {wall:.1f} s ({events / wall:,.0f}/s), then ANALYZE; {load()}")


def timings(url: str, token: str, clients: int, seconds: float,
            params: Callable[[], dict[str, Any]] | None = None) -> list[float]:
    """Latencies (ms) of GETs of `url` by `clients` threads for `seconds`."""
    latencies: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client() -> None:
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
            while time.monotonic() < stop:
                asked = params() if params else None
                t0 = time.perf_counter()
                response = http.get(url, params=asked)
                elapsed = (time.perf_counter() - t0) * 1000
                assert response.status_code in (200, 404), response.text[:200]
                with lock:
                    latencies.append(elapsed)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies


def figure(label: str, latencies: list[float], goal: float | None, floor: dict[int, float] | None = None,
           clients: int = 1) -> None:
    q = statistics.quantiles(latencies, n=20)
    met = "" if goal is None else f" goal p95 ≤ {goal:.0f} ms: {'met' if q[-1] <= goal else 'MISSED'};"
    beside = f" floor p95 {floor[clients]:.1f} ms;" if floor else ""
    print(f"  {label:46} {clients} client(s): p50 {statistics.median(latencies):6.1f} ms, p95 {q[-1]:6.1f} ms;"
          f"{met}{beside} {len(latencies)} requests; {load()}")


def select_one(ws: Workspace) -> float:
    """The median round trip of `SELECT 1` through the store's engine (ms)."""
    with ws.store.db.engine.connect() as conn:
        samples = []
        for _ in range(200):
            t0 = time.perf_counter()
            conn.execute(text("SELECT 1")).scalar()
            samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


def route_cost(ws: Workspace, names: list[str]) -> None:
    """A webhook's route to its repository: where main has no routing function, what any route must do: the
    repository's workspace and its main gateway.yaml (kept per process once opened: the first one costs more)."""
    fresh = open_workspace(ws.settings, migrate=False)  # a process's first route to each repository opens it
    cold = []
    for name in names:
        t0 = time.perf_counter()
        fresh.in_repository(name).repo_settings()
        cold.append((time.perf_counter() - t0) * 1000)
    fresh.close()
    rng = random.Random(5)
    samples = []
    try:
        from gateway.services.forge.routing import route_delivery
    except ImportError:
        route_delivery = None
    for _ in range(200):
        name = rng.choice(names)
        t0 = time.perf_counter()
        if route_delivery is None:
            ws.in_repository(name).repo_settings()
        else:  # the generated gateway.yaml names no forge repository: every repository is read, as for a hit
            route_delivery(ws, "github", f"example/{name}")
        samples.append((time.perf_counter() - t0) * 1000)
    samples.sort()
    how = ("route_delivery of a GitHub repository, every one of the gateway's read" if route_delivery else
           "no routing function on main: ws.in_repository(name) + its main gateway.yaml")
    print(f"webhook route ({how}, in this process): p50 {statistics.median(samples):.2f} ms, p95 {statistics.quantiles(samples, n=20)[-1]:.2f} ms "
          f"(goal p95 ≤ {READ_GOAL:.0f} ms); the first to each repository in a new process: median "
          f"{statistics.median(cold):.1f} ms, most {max(cold):.1f} ms; {load()}")


def in_process(ws: Workspace, name: str, proposal_id: int, token: str) -> None:
    """The proposal read and the inbox in this process, as the API runs them (the token's check, then the view, in
    one read unit of work), without HTTP: statements per call and CPU per call, figures the machine's load moves
    less than latencies."""
    request = ws.in_repository(name).for_request()

    def read() -> object:
        with token_read(request, token) as (actor, _):
            return view_proposal(request, actor, proposal_id).public_body(request.scrubber)

    def queue() -> object:
        with token_read(request, token) as (actor, _):
            return inbox(request, actor)

    for label, call in ((f"proposal {proposal_id} of {name}", read), (f"inbox of {name}", queue)):
        call()
        statements: list[tuple[str, float]] = []  # each statement, and the wall time from its start to the next's
        started = time.perf_counter()

        def counted(conn: object, cursor: object, statement: str, *_: object,
                    seen: list[tuple[str, float]] = statements) -> None:
            now = time.perf_counter()
            seen.append((" ".join(statement.split())[:90], now))

        event.listen(ws.store.db.engine, "before_cursor_execute", counted)
        call()
        ended = time.perf_counter()
        event.remove(ws.store.db.engine, "before_cursor_execute", counted)
        starts = [at for _, at in statements] + [ended]
        slowest = sorted(((starts[n + 1] - at, text) for n, (text, at) in enumerate(statements)), reverse=True)[:3]
        print(f"in process, {label}: {(ended - started) * 1000:.1f} ms wall once; its slowest statements (start to "
              f"the next's): " + "; ".join(f"{ms * 1000:.1f} ms {text}" for ms, text in slowest))
        rounds = []
        for _ in range(5):
            cpu = time.process_time()
            for _ in range(10):
                call()
            rounds.append((time.process_time() - cpu) / 10 * 1000)
        print(f"in process, {label}: {len(statements)} statements, CPU {statistics.median(rounds):.1f} ms a call "
              f"(median of 5 rounds of 10); {load()}")


def main() -> None:
    configure_logging("warning")
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    size = SMALL if "--small" in sys.argv else FULL
    target = args[0] if args else "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    with tempfile.TemporaryDirectory() as tmp, scratch_database(None if target == "sqlite" else target, "repos") as url:
        run(Path(tmp), url, size)


def run(tmp: Path, url: str | None, size: dict[str, int]) -> None:
    home = tmp / "home"
    started = time.perf_counter()
    content = declarations(tmp / "content")
    ws = create_workspace(Settings(home=home, database_url=url), content)
    print(f"{size['repositories']} repositories × {STACKS} stacks, {size['proposals']:,} proposals, "
          f"{size['events']:,} audit events on {ws.store.db.engine.dialect.name}; {os.cpu_count()} cores, {load()}")
    admin, _ = add_principal(ws, None, "admin", frozenset({Role.ADMIN}), frozenset(), PrincipalKind.PERSON)
    alice, _ = add_principal(ws, admin, "alice", frozenset({Role.REQUESTER}), frozenset({"app"}), PrincipalKind.PERSON)
    _, bob = add_principal(ws, admin, "bob", frozenset({Role.APPROVER}), frozenset({"platform"}), PrincipalKind.PERSON)
    _, dana = add_principal(ws, admin, "dana", frozenset({Role.AUDITOR}), frozenset(), PrincipalKind.PERSON)
    names = [ws.repository] + [f"repo{i:02}" for i in range(1, size["repositories"])]
    for name in names[1:]:
        add_repository(ws, admin, name, content)
    print(f"repositories: {len(names)} in {time.perf_counter() - started:.1f} s; {load()}")
    ids = build(ws, names, size["proposals"], alice, tmp)
    stacks = [f"s{i:02}" if name == ws.repository else f"{name}/s{i:02}" for name in names for i in range(STACKS)]
    append_trail(ws, size["events"], stacks, max(max(v) for v in ids.values()))
    measure(ws, home, url, names, ids, stacks, bob, dana, size["events"], size["seconds"])
    ws.close()


def measure(ws: Workspace, home: Path, url: str | None, names: list[str], ids: dict[str, list[int]],
            stacks: list[str], approver: str, auditor: str, events: int, seconds: float) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}, "GATEWAY_HOME": str(home)}
    if url:
        env["GATEWAY_DATABASE_URL"] = url
    server = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--port", str(port), "--workers", "0"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rng = random.Random(3)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until_up(base)
        print(f"floors: SELECT 1 through the store's engine, median {select_one(ws):.2f} ms; {load()}")
        floor = {}
        for clients in CLIENTS:
            latencies = timings(f"{base}/api/v1/no-such-route", approver, clients, seconds)
            floor[clients] = statistics.quantiles(latencies, n=20)[-1]
            figure("floor: a 404 of the same app", latencies, None, None, clients)
        last, first = names[-1], names[0]
        reads = [(f"GET /api/v1/repos/{last}/proposals/{{id}} (real)", f"/api/v1/repos/{last}/proposals/{ids[last][0]}"),
                 (f"GET /api/v1/repos/{last}/proposals/{{id}} (a copy)",
                  f"/api/v1/repos/{last}/proposals/{ids[last][-1]}"),
                 (f"GET /api/v1/proposals/{{id}} ({first}, a copy)", f"/api/v1/proposals/{ids[first][-1]}")]
        for label, path in reads:
            for clients in CLIENTS:
                figure(label, timings(base + path, approver, clients, seconds), READ_GOAL, floor, clients)
        waiting = httpx.get(f"{base}/api/v1/repos/{last}/inbox", headers={"Authorization": f"Bearer {approver}"})
        assert waiting.status_code == 200, waiting.text[:200]
        inbox_url = f"{base}/api/v1/repos/{last}/inbox"
        for clients in CLIENTS:
            figure(f"inbox of {last} ({len(waiting.json())} waiting)", timings(inbox_url, approver, clients, seconds),
                   None, floor, clients)
        route_cost(ws, names)
        in_process(ws, last, ids[last][-1], approver)
        last_id = max(max(v) for v in ids.values())
        cases: dict[str, Callable[[], dict[str, Any]]] = {
            "audit filter: stack": lambda: {"stack": rng.choice(stacks)},
            "audit filter: proposal": lambda: {"proposal": 1 + rng.randrange(last_id)},
            "audit filter: stack + proposal": lambda: {"stack": rng.choice(stacks), "proposal": 1 + rng.randrange(last_id)},
        }
        if "repository" in inspect.signature(audit_service.list_events).parameters:  # the filter of migration 33
            cases["audit filter: repository"] = lambda: {"repo": rng.choice(names)}
            cases["audit filter: repository + stack"] = lambda: {"repo": (name := rng.choice(names)),
                                                                 "stack": f"{name}/s{rng.randrange(STACKS):02}"
                                                                 if name != names[0] else f"s{rng.randrange(STACKS):02}"}
        for label, make in cases.items():
            for clients in CLIENTS:
                figure(label, timings(f"{base}/api/v1/audit/events", auditor, clients, seconds,
                                      lambda make=make: make() | {"after": rng.randrange(events), "limit": PAGE}),
                       FILTER_GOAL, floor, clients)
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
