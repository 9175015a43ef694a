"""The auditor's first screen (/audit?period=...: the exceptions, the checks, the population's figures) for a period of
N changes (default 1,000), through a real API process (`gateway serve --workers 0`), beside a floor: a trivial page
of the same app (/requests/new: the same sign-in, page chrome and template engine, no work).

The period is written straight into the trail through the store's append path (tests/audit_period.py: each change's
events as the services write them, plus overrides, failed applies, drift reverts, rollbacks, pushes to main and
break-glass windows), since planning and applying 1,000 changes would take an hour; a checkpoint is signed after it,
as workers do every few minutes (the page verifies the chain from the newest checkpoint on).

Prints p50 and p95 of, in one run:
- the floor;
- the first screen when the trail has not moved since the last view (the period's population is kept per process);
- the first screen when the trail moved before each view, by an event of no change of the period (a sign-in, a
  job, a notification: the new events are read, and the population stays as it was);
- the first screen when a change of the period was applied before each view (its events read, the population built
  again from the rows kept and the new one);
- the first view of the period in a fresh process (nothing kept: the period read whole), over a few restarts.
Goal: p95 of the first screen <= 300 ms. It is not a test.

Usage: python benchmarks/audit_page.py [N] [POSTGRES_ADMIN_URL]   (a scratch database of its own on that server,
dropped after; SQLite in a temporary directory when none is given)
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scratch_db import scratch_database  # noqa: E402  (a sibling: this script's directory is on the path)

from gateway.adapters.store.rows import now  # noqa: E402
from gateway.composition import create_workspace  # noqa: E402
from gateway.config import Settings  # noqa: E402
from gateway.domain.principals import GATEWAY, PrincipalKind, Role  # noqa: E402
from gateway.logs import configure_logging  # noqa: E402
from gateway.services.admin import audit as audit_service  # noqa: E402
from gateway.services.admin.bootstrap import bootstrap_simulator  # noqa: E402
from gateway.services.admin.users import add_principal  # noqa: E402
from tests.audit_period import change_entries, write_period  # noqa: E402

REQUESTS = 60
RESTARTS = 3
GOAL_MS = 300


def main() -> None:
    configure_logging("warning")
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    admin_url = sys.argv[2] if len(sys.argv) > 2 else None
    print(f"the auditor's first screen, a period of {count} changes, on {'PostgreSQL' if admin_url else 'SQLite'}; "
          f"{load()}")
    with tempfile.TemporaryDirectory() as tmp, scratch_database(admin_url, "audit_page") as url:
        home = Path(tmp) / "home"
        ws = create_workspace(Settings(home=home, database_url=url))
        bootstrap_simulator(ws)
        admin, _ = add_principal(ws, None, "admin", frozenset({Role.ADMIN}), frozenset(), PrincipalKind.PERSON)
        dana, token = add_principal(ws, admin, "dana", frozenset({Role.AUDITOR}), frozenset(), PrincipalKind.PERSON)
        started = time.perf_counter()
        written = write_period(ws, count)
        audit_service.sign_checkpoint(ws, dana)
        print(f"{count} changes written to the trail in {time.perf_counter() - started:.1f} s "
              f"({sum(len(v) for v in written.kinds.values())} of them exceptions)")
        today = now().date()
        period = f"{today - timedelta(days=1)}..{today + timedelta(days=1)}"
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}, "GATEWAY_HOME": str(home)}
        if url:
            env["GATEWAY_DATABASE_URL"] = url

        def move() -> None:  # one more event in the trail, as a busy gateway writes them
            with ws.store.session() as session:
                session.audit.append(GATEWAY, "benchmark.tick", {"at": time.time()})

        applied = iter(range(count + 1, count + 1 + REQUESTS))

        def apply_one() -> None:  # one more change of the period, applied
            with ws.store.session() as session:
                session.audit.append_many(change_entries(next(applied), written))

        firsts = []
        for restart in range(RESTARTS):
            with served(env) as base:
                browser = sign_in(base, token)
                firsts.append(timed(lambda: get(browser, f"/audit?period={period}")))
                if restart:
                    browser.close()
                    continue
                page = get(browser, f"/audit?period={period}")
                assert page.index('id="exceptions"') < page.index('id="checks"'), "the exceptions come first"
                print(f"first screen: {len(page.encode()) / 1024:.0f} KB")
                floor = [timed(lambda: get(browser, "/requests/new")) for _ in range(REQUESTS)]
                kept = [timed(lambda: get(browser, f"/audit?period={period}")) for _ in range(REQUESTS)]
                moved, grown = [], []
                for _ in range(REQUESTS):
                    move()
                    moved.append(timed(lambda: get(browser, f"/audit?period={period}")))
                for _ in range(REQUESTS):
                    apply_one()
                    grown.append(timed(lambda: get(browser, f"/audit?period={period}")))
                browser.close()
        report("floor: /requests/new, a trivial page of the same app", floor)
        report("first screen, the trail as at the last view", kept)
        report("first screen, the trail moved before each view (no change of the period)", moved)
        report("first screen, a change of the period applied before each view", grown)
        print(f"first view of the period in a fresh process (nothing kept), {RESTARTS} restarts: "
              + ", ".join(f"{f * 1000:.0f} ms" for f in firsts))
        worst = max(statistics.quantiles(views, n=20)[-1] for views in (kept, moved, grown)) * 1000
        print(f"goal: p95 <= {GOAL_MS} ms: {'met' if worst <= GOAL_MS else 'NOT met'} (worst p95 {worst:.0f} ms); "
              f"{load()}")
        ws.close()


class served:
    """`gateway serve --workers 0` on a free port, until the block ends."""

    def __init__(self, env: dict[str, str]):
        self.env = env

    def __enter__(self) -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.server = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--port", str(port), "--workers",
                                        "0"], env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/api/v1/health").status_code == 200:
                    return base
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the server did not start")
            time.sleep(0.2)

    def __exit__(self, *exc: object) -> None:
        self.server.terminate()
        self.server.wait(30)


def sign_in(base: str, token: str) -> httpx.Client:
    """A browser's connection: signed in, kept alive between views."""
    http = httpx.Client(base_url=base, timeout=120)
    form = http.get("/login").text
    csrf = form.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    http.post("/login", data={"token": token, "csrf": csrf})
    return http


def get(http: httpx.Client, path: str) -> str:
    answer = http.get(path)
    assert answer.status_code == 200, answer.text[:300]
    return answer.text


def timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def report(label: str, seconds: list[float]) -> None:
    p95 = statistics.quantiles(seconds, n=20)[-1]
    print(f"{label}: p50 {statistics.median(seconds) * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms ({len(seconds)} views)")


def load() -> str:
    return "load %.2f %.2f %.2f" % os.getloadavg()


if __name__ == "__main__":
    main()
