"""Proposals read together: `get_many` returns what reading each with `get` returns, on SQLite as on PostgreSQL, in a
few statements however many there are; and the inbox, which reads every waiting proposal, costs the same round trips
for one proposal as for several."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event

from gateway.adapters.store.proposals import MANY_AT_ONCE
from gateway.adapters.store.schema import Database
from gateway.adapters.store.unit_of_work import SqlStore, SqlUnitOfWork
from gateway.api.app import create_app
from gateway.domain.errors import InAnotherRepository, NotFound
from gateway.domain.principals import PrincipalKind, Role
from gateway.domain.proposal import Decision, PlanSummary
from gateway.services.change.proposals import open_proposal
from gateway.services.workspace import Workspace

from .conftest import Clone, add_people
from .round_trips import RoundTrips


@pytest.fixture
def store(database_url: str) -> Iterator[SqlStore]:
    db = Database(database_url)
    db.migrate()
    yield SqlStore(db)
    db.dispose()


def _proposals(store: SqlStore) -> dict[str, int]:
    """Proposals with what a read has to get right: people, current and stale decisions, an override, plans at an
    older head and a stack planned twice (the newer plan counts), one with no plans, one whose head moved past its
    plans; and one in another repository."""
    summary = PlanSummary(counts={"update": 1})
    with store.session() as session:
        alice = session.principals.add("alice", PrincipalKind.PERSON, frozenset({Role.REQUESTER}), frozenset(), "h1")
        bob = session.principals.add("bob", PrincipalKind.PERSON, frozenset({Role.APPROVER}), frozenset({"p"}), "h2")
        agent = session.principals.add("agent", PrincipalKind.AGENT, frozenset({Role.REQUESTER}), frozenset(), "h3",
                                       alice.id)
        decided = session.proposals.add("decided", "base", "head1", alice, agent, "why", ["app", "data"], ["a.tf"])
        session.proposals.add_plan(decided, "app", "head0", "main1", "sha256:old", "{}", 3, "l", summary, "p0")
        for stack, serial in (("app", 4), ("data", 8), ("app", 5)):
            session.proposals.add_plan(decided, stack, "head1", "main1", f"sha256:{serial}", "{}", serial, "l",
                                       summary, "p")
        session.proposals.add_decision(decided, bob, Decision.APPROVE, "head1", {"app": "sha256:5"}, "ok", "api-token")
        session.proposals.add_decision(decided, bob, Decision.REJECT, "head0", {}, "no", "review-page")
        session.proposals.add_override(decided, "rule:addr", bob, "accepted", datetime(2099, 1, 1, tzinfo=UTC))
        bare = session.proposals.add("bare", "base", "head7", alice, alice, "nothing yet", ["app"], ["a.tf"])
        moved = session.proposals.add("moved", "base", "head1", alice, alice, "pushed again", ["data"], ["d.tf"])
        session.proposals.add_plan(moved, "data", "head1", "main1", "sha256:9", "{}", 9, "l", summary, "p")
        session.proposals.add_decision(moved, bob, Decision.APPROVE, "head1", {"data": "sha256:9"}, "ok", "api-token")
        session.proposals.update_head(moved, "head2", ["data"], ["d.tf"])
        session.main.add_push("c1", ["app"], ["stacks/app/main.tf"], "mallory")
        session.day_two.add_break_glass("app", "incident", "olga", 60, confirmed=True)
        session.day_two.add_drift_record("app", [], False, None)
    with store.for_repository("other").session() as session:
        elsewhere = session.proposals.add("elsewhere", "base", "head1", alice, alice, "why", ["app"], ["a.tf"])
    return {"decided": decided, "bare": bare, "moved": moved, "elsewhere": elsewhere}


def _statements(store: SqlStore) -> list[str]:
    """The statements sent on the store's engine from now on (BEGIN and SQLite's pragmas not among them)."""
    sent: list[str] = []
    event.listen(store.db.engine, "before_cursor_execute",
                 lambda *args: sent.append(args[2]) if args[2].lstrip().startswith("SELECT") else None)
    return sent


def _around(session: SqlUnitOfWork) -> list[object]:
    """What a list of proposals asks besides the proposals: the pushes to main, break-glass windows and open drift."""
    return [session.main.unacknowledged_pushes(), session.day_two.break_glass_windows(),
            session.day_two.drift_records(only_open=True)]


@pytest.mark.parametrize("readonly", [True, False], ids=["read", "write"])
def test_a_batch_read_returns_what_reading_each_proposal_returns(store: SqlStore, readonly: bool) -> None:
    made = _proposals(store)
    ids = [made["moved"], made["decided"], made["bare"], made["decided"]]  # any order, one asked twice
    sent = _statements(store)
    with store.session(readonly=readonly) as session:  # first: no saved plan is kept from an earlier read
        together = session.proposals.get_many(ids)
        read = len(sent)
        around = _around(session)
        asked_around = len(sent) - read
        assert session.proposals.get_many([]) == []
    with store.session() as session:
        one_by_one = [session.proposals.get(proposal_id) for proposal_id in ids]
        assert around == _around(session)
    assert together == one_by_one and [p.id for p in together] == ids
    assert together[1] is not together[3]  # each its own object, as two reads give
    decided = together[1]
    assert {stack: plan.digest for stack, plan in decided.plans.items()} == {"app": "sha256:5", "data": "sha256:8"}
    assert [(d.principal.name, d.head_sha) for d in decided.decisions] == [("bob", "head1"), ("bob", "head0")]
    assert decided.proposer.name == "agent" and [o.finding_key for o in decided.overrides] == ["rule:addr"]
    assert together[0].plans == {} and len(together[0].decisions) == 1 and together[2].plans == {}
    assert read <= 2, sent  # the proposals with their parts, then the saved plans' bodies
    # a read unit of work read the pushes, windows and drift with the proposals, as a single read does
    assert asked_around == (0 if readonly else 3) and [len(found) for found in around] == [1, 1, 1]


def test_a_batch_read_refuses_what_a_single_read_refuses(store: SqlStore) -> None:
    made = _proposals(store)
    for readonly in (True, False):
        with store.session(readonly=readonly) as session:
            for missing in (999, 0, -1, 2**40):
                with pytest.raises(NotFound, match=f"no proposal {missing}$"):
                    session.proposals.get_many([made["decided"], missing])
            with pytest.raises(InAnotherRepository, match=f"no proposal {made['elsewhere']} in repository "):
                session.proposals.get_many([made["bare"], made["elsewhere"]])


def test_a_batch_read_of_more_than_one_statement_holds_returns_them_all(store: SqlStore) -> None:
    made = _proposals(store)
    with store.session() as session:
        person = session.principals.by_name("alice")
        assert person is not None
        more = [session.proposals.add(f"b{n}", "base", "head1", person, person, "why", ["app"], ["a.tf"])
                for n in range(MANY_AT_ONCE)]
        session.proposals.add_plan(more[-1], "app", "head1", "main1", "sha256:last", "{}", 1, "l",
                                   PlanSummary(counts={"create": 1}), "p")
    ids = [made["decided"], *more, made["bare"]]
    sent = _statements(store)
    with store.session(readonly=True) as session:
        together = session.proposals.get_many(ids)
    statements = len(sent)
    with store.session() as session:
        assert together == [session.proposals.get(proposal_id) for proposal_id in ids]
    assert [p.id for p in together] == ids and together[-2].plans["app"].digest == "sha256:last"
    assert statements <= 4, sent  # two statements each time `MANY_AT_ONCE` proposals are read


# reads before the one counted: the caches are warm, and psycopg has prepared every statement it will (it prepares a
# statement on its fifth execution, one round trip more that once)
WARM_UP = 6


def test_the_inbox_costs_the_same_round_trips_for_one_proposal_as_for_several(pg_workspace: Workspace,
                                                                              tmp_path: Path) -> None:
    people = add_people(pg_workspace)
    clone = Clone(pg_workspace, tmp_path / "clone")
    edits = [("stacks/app-staging/main.tf", '"t3.small"', '"t3.medium"'),
             ("stacks/app-prod/main.tf", '"t3.large"', '"t3.xlarge"'),
             ("stacks/app-staging/main.tf", '"t3.small"', '"t3.large"')]
    bob = {"Authorization": f"Bearer {people.tokens['bob']}"}
    reads = {"inbox": "/api/v1/inbox", "inbox of every repository": "/api/v1/inbox?all_repositories=true",
             "proposals list": "/api/v1/proposals"}
    sent: dict[tuple[str, int], list[str]] = {}
    with TestClient(create_app(pg_workspace.settings, workers=0)) as client:
        trips = RoundTrips(client.app.state.workspace.store.db.engine)  # type: ignore[attr-defined]
        for n, (path, old, new) in enumerate(edits, start=1):
            clone.branch(f"change-{n}").edit(path, old, new).push()
            open_proposal(pg_workspace, people.alice, f"change-{n}", f"change {n}")
            if n == 2:
                continue
            for _ in range(WARM_UP):
                for url in reads.values():
                    assert len(client.get(url, headers=bob).json()) == n, url
            for read, url in reads.items():
                trips.messages()
                answer = client.get(url, headers=bob).json()
                sent[read, n] = trips.messages()
                assert len(answer) == n and all(p.get("waiting_for_you", True) for p in answer), answer
    for read in reads:
        print(f"\n{read} of 1 proposal: {len(sent[read, 1])} round trips, of 3: {len(sent[read, 3])}",
              *RoundTrips.summary(sent[read, 3]).most_common(), sep="\n  ")
        assert len(sent[read, 3]) == len(sent[read, 1]), (read, RoundTrips.summary(sent[read, 1]),
                                                          RoundTrips.summary(sent[read, 3]))
