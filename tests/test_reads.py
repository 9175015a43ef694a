"""Reads stay cheap: no git process per read, and a big proposal's review page shows what matters first, in pages."""

from __future__ import annotations

import dataclasses
import html
import re
import sqlite3
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import git
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event

from gateway.api import deps, routes
from gateway.api.app import create_app
from gateway.domain.errors import InputError
from gateway.domain.proposal import Decision
from gateway.domain.review_page import CHANGES_PER_PAGE, paged
from gateway.services.change.proposals import decide, open_proposal, pending_changes
from gateway.services.change.runner import apply_proposal
from gateway.services.change.views import view_proposal
from gateway.services.workspace import Workspace

from .conftest import Clone, People
from .fakes import FakeClone

QUEUE = 'resource "aws_sqs_queue" "orders" {\n  name = "orders-staging"\n  tags = local.tags\n}\n'
CHANGE = re.compile(r"<summary><code>([^<]+)</code>")


def sign_in(client: TestClient, token: str) -> None:
    csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/login").text)
    assert csrf is not None
    assert client.post("/login", data={"token": token, "csrf": csrf.group(1)}, follow_redirects=False).status_code == 303


def test_reading_a_proposal_spawns_no_git_process(workspace: Workspace, people: People, clone: Clone,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    clone.branch("orders").write("stacks/app-staging/orders.tf", QUEUE).push("an orders queue")
    proposal = open_proposal(workspace, people.alice, "orders", "an orders queue")
    spawned: list[Any] = []
    popen_init = subprocess.Popen.__init__

    def counting(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        spawned.append(args)
        popen_init(self, args, *rest, **kwargs)

    def refuse(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("a read ran the git command")

    with TestClient(create_app(workspace.settings, workers=0)) as client:
        sign_in(client, people.tokens["bob"])
        monkeypatch.setattr(subprocess.Popen, "__init__", counting)
        monkeypatch.setattr(git.cmd.Git, "execute", refuse)
        auth = {"Authorization": f"Bearer {people.tokens['bob']}"}
        document = client.get(f"/api/v1/proposals/{proposal.id}", headers=auth)
        diff = client.get(f"/api/v1/proposals/{proposal.id}/diff", headers=auth)
        page = client.get(f"/proposals/{proposal.id}")
        diff_page = client.get(f"/proposals/{proposal.id}/diff")
        listing = client.get("/api/v1/proposals", headers=auth)

    assert spawned == []
    assert document.status_code == 200 and document.json()["pending"] == []
    assert '+  name = "orders-staging"' in diff.text and "aws_sqs_queue.orders" in page.text
    assert 'orders-staging' in html.unescape(diff_page.text) and listing.status_code == 200


class RefusingEngine:
    """An engine a read must never reach: any call fails the test."""

    name = "sandbox"

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a read asked the engine ({name})")


# `ws` and `team` are conftest's: the sample repo in memory, for what a read says; what a read costs (git processes,
# transactions, lanes) is measured on a real workspace.


def test_a_read_never_asks_the_engine_and_shows_the_state_an_apply_moved(ws: Workspace, team: People) -> None:
    checkout = FakeClone(ws.repo)  # type: ignore[arg-type]
    checkout.branch("bigger").edit("stacks/app-staging/main.tf", '"t3.small"', '"t3.medium"').push()
    first = open_proposal(ws, team.alice, "bigger", "more memory")
    checkout.branch("orders").write("stacks/app-staging/orders.tf", QUEUE).push()  # the same stack, another file
    second = open_proposal(ws, team.alice, "orders", "an orders queue")
    decide(ws, team.bob, first.id, Decision.APPROVE, "")
    assert apply_proposal(ws, team.alice, first.id).succeeded  # the stack's state moves under the second

    reader = dataclasses.replace(ws, engine=RefusingEngine())  # type: ignore[arg-type]
    view = view_proposal(reader, team.bob, second.id)
    assert "state of stack app-staging moved since its plan" in view.pending  # beside main, which the merge moved
    assert pending_changes(reader, view.proposal) == view.pending


def test_an_api_read_of_a_proposal_is_one_read_transaction_and_still_checks_the_token(
        workspace: Workspace, people: People, clone: Clone) -> None:
    """The token's check, the proposal's records and the sandbox's state serial: one BEGIN .. COMMIT, one snapshot
    (they were three). The token's last use is still recorded, after the read and at most once a minute."""
    clone.branch("orders").write("stacks/app-staging/orders.tf", QUEUE).push("an orders queue")
    proposal = open_proposal(workspace, people.alice, "orders", "an orders queue")
    begun: list[bool] = []  # one per transaction: True for a read (SQLite: BEGIN; a write's is BEGIN IMMEDIATE)
    with TestClient(create_app(workspace.settings, workers=0)) as client:
        event.listen(client.app.state.workspace.store.db.engine, "before_cursor_execute",  # type: ignore[attr-defined]
                     lambda _c, _cur, sql, *_: sql.startswith("BEGIN") and begun.append(sql == "BEGIN"))

        def read(token: str, pid: int = proposal.id) -> tuple[int, list[bool]]:
            begun.clear()
            status = client.get(f"/api/v1/proposals/{pid}", headers={"Authorization": f"Bearer {token}"}).status_code
            return status, list(begun)

        first, again = read(people.tokens["bob"]), read(people.tokens["bob"])
        missing, forged = read(people.tokens["bob"], proposal.id + 1), read("not-a-token")
        with workspace.store.session() as session:
            session.principals.touch(people.bob.id, workspace.clock.now() - timedelta(minutes=2))
        a_minute_on = read(people.tokens["bob"])

    assert first == (200, [True, False])  # the read, then the token's first use written
    assert again == (200, [True])
    assert missing == (404, [True]) and forged == (401, [True])
    assert a_minute_on == (200, [True, False])
    with workspace.store.session(readonly=True) as session:
        used = session.principals.credentials(people.bob.id).last_used_at
    assert workspace.clock.now() - used < timedelta(minutes=1)


def test_the_database_engine_has_no_statement_listeners(workspace: Workspace) -> None:
    """A listener on the engine's connection events (begin, before_execute, ...) makes every statement run
    SQLAlchemy's event dispatch, a fifth of a small query's cost: `Database` sends its BEGIN itself."""
    assert not workspace.store.db.engine._has_events  # type: ignore[attr-defined]


def test_the_api_is_served_by_the_c_http_parser_on_uvloop() -> None:
    """`gateway serve` leaves uvicorn to choose: with httptools and uvloop installed it takes them, and a request's
    floor (a 404) costs 15-20 % less CPU than on h11 and asyncio's loop. Uninstalled, it would fall back silently
    and every request would cost more."""
    import uvicorn
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    async def app(scope: Any, receive: Any, send: Any) -> None: ...

    config = uvicorn.Config(app)  # what `gateway serve` gives uvicorn, but for the app
    config.load()
    assert config.http_protocol_class is HttpToolsProtocol
    loop = config.get_loop_factory()
    assert loop is not None and loop.__module__.startswith("uvloop")


def test_a_pinned_read_sees_one_moment_of_the_refs_and_the_next_read_sees_the_push(workspace: Workspace,
                                                                                  clone: Clone) -> None:
    pinned = workspace.repo.pinned()
    main, tip = pinned.main_branch(), pinned.resolve("main")
    assert not pinned.branch_exists("orders")
    clone.branch("main").write("README.md", "moved").push("main moves")
    clone.branch("orders").write("stacks/app-staging/orders.tf", QUEUE).push("an orders queue")

    assert (pinned.main_branch(), pinned.resolve(main), pinned.branch_exists("orders")) == ("main", tip, False)
    again = workspace.for_read().repo
    assert again.resolve(main) != tip and again.branch_exists("orders")
    assert workspace.repo.resolve(main) == again.resolve(main)  # an unpinned handle reads fresh every time


def test_a_big_proposal_shows_destroys_first_and_pages_every_change(workspace: Workspace, people: People,
                                                                     clone: Clone) -> None:
    buckets = "".join(f'resource "aws_s3_bucket" "bench{i}" {{\n  bucket = "bench-{i}"\n}}\n' for i in range(2000))
    # a new description replaces the security group (and its rule); their addresses sort after every bucket's
    (clone.branch("big").write("stacks/app-staging/buckets.tf", buckets)
     .edit("stacks/app-staging/main.tf", '"HTTPS to the orders web tier"', '"HTTPS to the web tier"')
     .push("2,000 buckets"))
    proposal = open_proposal(workspace, people.alice, "big", "2,000 buckets")
    with TestClient(create_app(workspace.settings, workers=0)) as client:
        document = client.get(f"/api/v1/proposals/{proposal.id}",
                              headers={"Authorization": f"Bearer {people.tokens['bob']}"}).json()
        every = [c["address"] for plan in document["plans"] for c in plan["preview"]["changes"]]
        sign_in(client, people.tokens["bob"])
        first = client.get(f"/proposals/{proposal.id}").text
        pages = -(-len(every) // CHANGES_PER_PAGE)
        listed = CHANGE.findall(first)
        for number in range(2, pages + 1):
            listed += CHANGE.findall(client.get(f"/proposals/{proposal.id}?page={number}").text)
        past_the_end = client.get(f"/proposals/{proposal.id}?page={pages + 1}")
        diff = client.get(f"/proposals/{proposal.id}/diff?page=2")

    assert len(every) > 2000 and "aws_security_group.web" in every[-5:]
    assert len(first) < 100_000  # the whole review was 832 KB
    changes_at = first.index("<h3>Changes</h3>")
    assert first.index("aws_security_group.web</code>: ") < changes_at  # the replace, before any change
    assert f"page 1 of {pages}" in first and f'href="/proposals/{proposal.id}?page=2"' in first
    assert listed == every  # each change once, in plan order, across the pages
    assert past_the_end.status_code == 422 and f"there are {pages}" in html.unescape(past_the_end.text)
    assert diff.status_code == 200 and "bench-" in diff.text and 'rel="prev"' in diff.text


def test_pages_of_a_list() -> None:
    assert [paged(range(5), n, 2, "x").items for n in (1, 2, 3)] == [(0, 1), (2, 3), (4,)]
    empty = paged([], 1, 50, "the proposal's changes")
    assert (empty.count, empty.total, empty.items) == (1, 0, ())
    with pytest.raises(InputError, match="there is no page 4 of x: there are 3"):
        paged(range(5), 4, 2, "x")


def test_reads_of_a_proposal_run_a_few_at_a_time_on_the_read_lane_and_every_one_is_answered(
        workspace: Workspace, people: People, clone: Clone, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight clients at once: the reads that serve a proposal run at most `read_lane_threads` at a time (1 on SQLite,
    2 on PostgreSQL), not one per pool thread passing the GIL between them; none is refused or lost."""
    clone.branch("orders").write("stacks/app-staging/orders.tf", QUEUE).push("an orders queue")
    proposal = open_proposal(workspace, people.alice, "orders", "an orders queue")
    lock, running, most = threading.Lock(), [0], [0]
    document = routes.proposal_document

    def counted(*args: Any) -> Any:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            time.sleep(0.02)
            return document(*args)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(routes, "proposal_document", counted)
    monkeypatch.setattr(deps, "LANE_WAIT_SECONDS", 60.0)  # a queue this long is served by the lane alone
    auth = {"Authorization": f"Bearer {people.tokens['bob']}"}
    with TestClient(create_app(workspace.settings, workers=0)) as client, ThreadPoolExecutor(8) as clients:
        answers = list(clients.map(lambda _: client.get(f"/api/v1/proposals/{proposal.id}", headers=auth), range(24)))

    assert [a.status_code for a in answers] == [200] * 24
    assert {a.json()["id"] for a in answers} == {proposal.id}
    assert most[0] == workspace.settings.read_lane_threads == (1 if workspace.settings.db_url.startswith("sqlite")
                                                               else 2)


def test_a_read_whose_token_use_waits_for_the_write_lock_holds_up_no_other_read(
        workspace: Workspace, people: People, clone: Clone) -> None:
    """Bob's read is due to record his token's use, and another process holds the database's write lock: his answer
    waits for it, Carol's read of the same proposal does not (the lane is let go before the token's use is written)."""
    clone.branch("orders").write("stacks/app-staging/orders.tf", QUEUE).push("an orders queue")
    proposal = open_proposal(workspace, people.alice, "orders", "an orders queue")
    url = f"/api/v1/proposals/{proposal.id}"
    bob, carol = ({"Authorization": f"Bearer {people.tokens[name]}"} for name in ("bob", "carol"))
    with TestClient(create_app(workspace.settings, workers=0)) as client, ThreadPoolExecutor(1) as other:
        assert client.get(url, headers=carol).status_code == client.get(url, headers=bob).status_code == 200
        with workspace.store.session() as session:
            session.principals.touch(people.bob.id, workspace.clock.now() - timedelta(minutes=2))
        writer = sqlite3.connect(workspace.settings.db_url.removeprefix("sqlite:///"), isolation_level=None)
        writer.execute("BEGIN IMMEDIATE")
        try:
            bobs = other.submit(client.get, url, headers=bob)
            time.sleep(1.5)  # bob's read is done (a loaded machine too); his token's use waits for the write lock
            started = time.monotonic()
            carols = client.get(url, headers=carol)
            took = time.monotonic() - started
            bob_waited = not bobs.done()
        finally:
            writer.execute("ROLLBACK")
            writer.close()
        assert carols.status_code == 200 and took < 1.0, took
        assert bob_waited and bobs.result().status_code == 200


def test_a_read_that_holds_the_lane_long_does_not_hold_up_the_next(workspace: Workspace, people: People,
                                                                   clone: Clone, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read that waits (a declared backend's state pull, say) keeps the lane: the next read runs on the pool once it
    has waited `LANE_WAIT_SECONDS`, and is answered while the slow one still runs."""
    clone.branch("orders").write("stacks/app-staging/orders.tf", QUEUE).push("an orders queue")
    proposal = open_proposal(workspace, people.alice, "orders", "an orders queue")
    document, slow = routes.proposal_document, threading.Event()

    def first_is_slow(*args: Any) -> Any:
        if not slow.is_set():
            slow.set()
            time.sleep(3)
        return document(*args)

    monkeypatch.setattr(routes, "proposal_document", first_is_slow)
    auth = {"Authorization": f"Bearer {people.tokens['bob']}"}
    url = f"/api/v1/proposals/{proposal.id}"
    with TestClient(create_app(workspace.settings, workers=0)) as client, ThreadPoolExecutor(1) as other:
        client.get(url, headers=auth)  # the token's first use recorded
        slow.clear()
        held = other.submit(client.get, url, headers=auth)
        assert slow.wait(5)
        started = time.monotonic()
        quick = client.get(url, headers=auth)
        took, still_held = time.monotonic() - started, not held.done()
    assert quick.status_code == 200 and took < 2.0 and still_held
    assert held.result().status_code == 200
