"""Round trips to PostgreSQL: what a read costs on the wire, the lock timeout every transaction has, the one snapshot
every read is (SQLite too), and a pool that survives the server dropping its connections (a restart) without pinging
on every checkout."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, event, text

from gateway.adapters.store.schema import Database
from gateway.adapters.store.unit_of_work import SqlStore, SqlUnitOfWork
from gateway.api.app import create_app
from gateway.domain.errors import BackendError
from gateway.domain.jobs import JobKind
from gateway.domain.principals import PrincipalKind, Role
from gateway.domain.proposal import Decision, PlanSummary
from gateway.services.change.proposals import open_proposal
from gateway.services.workspace import Workspace

from .conftest import Clone, People, add_people, make_workspace
from .round_trips import RoundTrips

# what a read of a proposal over the API costs: the token lookup and the read (the sandbox's state serial too) in
# one transaction of BEGIN (with the lock timeout) .. COMMIT, however many people it names (each comes with the row
# that names them); raise it only with a reason. 15: what the runner checks before an apply is read too, so the view
# offers Apply only when the runner would run it: the open drift on its stacks, the saved plans (hashed again), one
# statement each. 13: a proposal's decisions, overrides and current plans are one statement with it. 5: BEGIN, the
# token, the proposal with everything its view asks next (read ahead: its jobs, the pushes to main, the break-glass
# windows, the open drift, its rollback marker, its stacks' serials), who pushed its commits, COMMIT
PROPOSAL_READ_ROUND_TRIPS = 5


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _proposal(ws: Workspace, tmp_path: Path) -> tuple[People, int]:
    people = add_people(ws)
    Clone(ws, tmp_path / "clone").branch("bigger").edit("stacks/app-staging/main.tf", '"t3.small"', '"t3.medium"').push()
    return people, open_proposal(ws, people.alice, "bigger", "more memory").id


def test_a_read_of_a_proposal_costs_at_most_its_round_trips(pg_workspace: Workspace, tmp_path: Path) -> None:
    people, pid = _proposal(pg_workspace, tmp_path)
    with TestClient(create_app(pg_workspace.settings, workers=0)) as client:
        approved = client.post(f"/api/v1/proposals/{pid}/approve", json={}, headers=bearer(people.tokens["bob"]))
        assert approved.status_code == 200, approved.text  # the proposal names alice and bob now
        trips = RoundTrips(client.app.state.workspace.store.db.engine)  # type: ignore[attr-defined]
        read = client.get(f"/api/v1/proposals/{pid}", headers=bearer(people.tokens["carol"]))
        assert read.status_code == 200 and [d["by"] for d in read.json()["decisions"]] == ["bob"]
        trips.messages()  # the first read also marks the token used and warms the caches
        assert client.get(f"/api/v1/proposals/{pid}", headers=bearer(people.tokens["carol"])).status_code == 200
        sent = trips.messages()
    print(f"\n{len(sent)} round trips:", *RoundTrips.summary(sent).most_common(), sep="\n  ")
    assert not [m for m in sent if m.startswith('Query  "SELECT 1')], "no ping on checkout"
    assert len(sent) <= PROPOSAL_READ_ROUND_TRIPS, RoundTrips.summary(sent)


def test_a_read_of_a_proposal_on_two_stacks_costs_what_one_on_one_stack_does(pg_workspace: Workspace,
                                                                              tmp_path: Path) -> None:
    """What a read asks of each stack (its open drift, its plan, its state serial) is one statement for all of them."""
    people = add_people(pg_workspace)
    clone = Clone(pg_workspace, tmp_path / "clone")
    clone.branch("one").edit("stacks/app-staging/main.tf", '"t3.small"', '"t3.medium"').push()
    one = open_proposal(pg_workspace, people.alice, "one", "one stack").id
    clone.branch("two").edit("stacks/app-staging/main.tf", '"t3.small"', '"t3.large"')
    clone.edit("stacks/app-prod/main.tf", '"t3.large"', '"t3.xlarge"').push()
    two = open_proposal(pg_workspace, people.alice, "two", "two stacks").id
    with TestClient(create_app(pg_workspace.settings, workers=0)) as client:
        trips = RoundTrips(client.app.state.workspace.store.db.engine)  # type: ignore[attr-defined]
        sent = {}
        for pid, stacks in ((one, ["app-staging"]), (two, ["app-prod", "app-staging"])):
            first = client.get(f"/api/v1/proposals/{pid}", headers=bearer(people.tokens["carol"]))
            assert first.status_code == 200 and sorted(first.json()["stacks"]) == stacks, first.text
            trips.messages()  # the first read warms the caches
            assert client.get(f"/api/v1/proposals/{pid}", headers=bearer(people.tokens["carol"])).status_code == 200
            sent[len(stacks)] = trips.messages()
    assert len(sent[2]) == len(sent[1]) <= PROPOSAL_READ_ROUND_TRIPS, (RoundTrips.summary(sent[1]),
                                                                      RoundTrips.summary(sent[2]))


def test_every_transaction_waits_on_a_lock_at_most_30_seconds(pg_workspace: Workspace) -> None:
    db = pg_workspace.store.db
    for readonly in (True, False, True, False):  # the same pooled connections again: it holds on each
        with db.transaction(readonly) as conn:
            assert conn.execute(text("SHOW lock_timeout")).scalar() == "30s"


def test_a_statement_waiting_on_a_lock_fails_instead_of_waiting_forever(pg_workspace: Workspace) -> None:
    db = pg_workspace.store.db
    with db.transaction() as holder:
        holder.execute(text("LOCK TABLE schema_version IN ACCESS EXCLUSIVE MODE"))
        with db.transaction(readonly=True) as waiter:
            # the timeout is what BEGIN set; a shorter one here, in the same transaction, keeps the test quick
            assert waiter.execute(text("SHOW lock_timeout")).scalar() == "30s"
            waiter.execute(text("SET LOCAL lock_timeout = '200ms'"))
            with pytest.raises(Exception, match="lock timeout"):
                waiter.execute(text("SELECT count(*) FROM schema_version"))


def test_a_read_is_one_snapshot_and_refuses_to_write(database_url: str) -> None:
    """A read transaction sees one moment: a commit made while it is open shows in the next read, not in this one;
    and a read that writes is refused ("reads never write"), not committed. SQLite as PostgreSQL."""
    db = Database(database_url)
    db.migrate()
    count = text("SELECT count(*) FROM schema_version")
    with db.transaction(readonly=True) as read:
        before = read.execute(count).scalar()
        with db.transaction() as write:
            write.execute(text("INSERT INTO schema_version (version, applied_at) VALUES (9999, CURRENT_TIMESTAMP)"))
        assert read.execute(count).scalar() == before
    with db.transaction(readonly=True) as read:
        assert read.execute(count).scalar() == before + 1
    with pytest.raises(BackendError, match="read-only transaction|readonly database"):
        with db.transaction(readonly=True) as read:
            read.execute(text("DELETE FROM schema_version WHERE version = 9999"))
    with db.transaction() as write:  # the same pooled connection writes again once it is a write's
        write.execute(text("DELETE FROM schema_version WHERE version = 9999"))
    with db.transaction(readonly=True) as read:
        assert read.execute(count).scalar() == before
    db.dispose()


def _what_a_view_asks(session: SqlUnitOfWork, pid: int) -> list[object]:
    """Everything a view of proposal `pid` asks of the store, as it asks it (the proposal first)."""
    proposal = session.proposals.get(pid)
    stacks = list(proposal.plans)
    return [proposal, session.jobs.of_proposal(pid), session.main.unacknowledged_pushes(),
            session.day_two.break_glass_windows(), session.day_two.drift_records(only_open=True),
            session.day_two.open_drift_records(stacks), session.main.marker(f"rollback_of:{pid}"),
            session.main.marker("rollback_of:999"), session.stacks.serials(stacks), session.stacks.serials(["other"])]


def test_a_read_unit_of_work_answers_a_views_questions_from_one_statement_as_the_queries_would(
        database_url: str) -> None:
    """What a read unit of work reads ahead with a proposal (its jobs, pushes to main, break-glass windows, open drift,
    rollback marker, stacks' serials) is what each repository's own query returns: the same records, in the same
    order, on SQLite as on PostgreSQL; a question it did not read ahead is asked of the database."""
    db = Database(database_url)
    db.migrate()
    store, summary = SqlStore(db), PlanSummary(counts={"update": 1})
    with store.session() as session:
        alice = session.principals.add("alice", PrincipalKind.PERSON, frozenset({Role.REQUESTER}), frozenset(), "h1")
        bob = session.principals.add("bob", PrincipalKind.PERSON, frozenset({Role.APPROVER}), frozenset(), "h2")
        pid = session.proposals.add("change", "base", "head1", alice, alice, "why", ["app", "data"], ["a.tf"])
        other = session.proposals.add("other", "base", "head9", alice, alice, "why", ["app"], ["a.tf"])
        session.proposals.add_plan(pid, "app", "head0", "main1", "sha256:old", "{}", 3, "l", summary, "p0")
        for stack, serial in (("app", 4), ("data", 8), ("app", 5)):
            session.proposals.add_plan(pid, stack, "head1", "main1", f"sha256:{serial}", "{}", serial, "l", summary, "p")
        session.proposals.add_decision(pid, bob, Decision.APPROVE, "head1", {"app": "sha256:5"}, "ok", "api-token")
        session.proposals.add_decision(pid, bob, Decision.REJECT, "head0", {}, "no", "review-page")
        session.proposals.add_override(pid, "rule:addr", bob, "accepted", datetime(2099, 1, 1, tzinfo=UTC))
        for kind in (JobKind.PLAN, JobKind.APPLY):
            session.jobs.add(kind, pid, alice, {"stacks": ["app"]})
        session.jobs.add(JobKind.PLAN, other, alice)
        for sha in ("c1", "c2"):
            session.main.add_push(sha, ["app"], ["stacks/app/main.tf"], "mallory")
        session.main.acknowledge_push("c1", "bob", "reverted")
        session.day_two.add_break_glass("app", "incident", "olga", 60, confirmed=True)
        session.day_two.add_break_glass("data", "incident", "olga", 60, confirmed=False)
        for stack in ("app", "net"):
            session.day_two.add_drift_record(stack, [], stack == "net", None)
        session.main.set_marker(f"rollback_of:{pid}", str(other))
        session.stacks.record_serials({"app": 6, "net": 2}, datetime.now(UTC))
    with store.session() as session:  # a write reads nothing ahead: every question is its own query
        asked = _what_a_view_asks(session, pid)
    statements: list[str] = []
    event.listen(db.engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    with store.session(readonly=True) as session:
        ahead = _what_a_view_asks(session, pid)
        sent = [s for s in statements if s.startswith("SELECT")]  # not the BEGIN (SQLite: nor its pragma)
        again = _what_a_view_asks(session, other)  # a second proposal: the pushes, windows, drift are not read again
    # the proposal and what its view asks, in one statement; the marker and serial nobody read ahead, one each
    assert ahead == asked and len(sent) == 3 and sum("UNION" in s for s in sent) == 1, sent
    assert [r.stack for r in ahead[4]] == ["net", "app"] and ahead[6] == str(other) and ahead[8] == {"app": 6}  # type: ignore
    second = [s for s in statements if "UNION" in s][1]
    assert "proposals" in second and "main_pushes" not in second and "break_glass_windows" not in second
    with store.session() as session:
        assert again == _what_a_view_asks(session, other)
    db.dispose()


def _drop_connections(url: str) -> int:
    """What a server restart does to a pool: every session of the database ends."""
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    name = url.rsplit("/", 1)[1]
    with admin.connect() as conn:
        ended = conn.execute(text("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                  "WHERE datname = :name AND pid <> pg_backend_pid()"), {"name": name}).scalar()
    admin.dispose()
    return int(ended or 0)


def test_the_pool_survives_the_server_dropping_its_connections(tmp_path: Path, postgres_url: str) -> None:
    ws = make_workspace(tmp_path / "home", postgres_url)
    people, pid = _proposal(ws, tmp_path)
    with TestClient(create_app(ws.settings, workers=0)) as client:
        read = client.get(f"/api/v1/proposals/{pid}", headers=bearer(people.tokens["bob"]))
        assert read.status_code == 200
        assert _drop_connections(postgres_url) >= 1
        again = client.get(f"/api/v1/proposals/{pid}", headers=bearer(people.tokens["bob"]))
        assert again.status_code == 200, again.text
        assert again.json() == read.json()
        assert _drop_connections(postgres_url) >= 1
        approved = client.post(f"/api/v1/proposals/{pid}/approve", json={}, headers=bearer(people.tokens["bob"]))
        assert approved.status_code == 200, approved.text
    assert _drop_connections(postgres_url) >= 1
    with ws.store.session() as session:  # the worker's side too: a write unit of work
        assert session.proposals.get(pid) is not None
    ws.close()
