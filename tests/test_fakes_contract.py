"""The fake unit of work answers as the SQL one does: the same assertions run on tests/fakes.py's FakeStore and on
the real SqlStore (SQLite), for everything the fake implements, so a use-case test on the fake cannot pass on an
answer the database would never give."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import IntegrityError

from gateway.adapters.engines.sandbox.applier import DELAY_PREFIX
from gateway.adapters.engines.sandbox.state import SandboxStore, StackState, StateResource
from gateway.adapters.engines.sandbox.store import SqlSandboxStore
from gateway.adapters.git.repo import GitDeclarationRepo
from gateway.adapters.store.schema import Database
from gateway.adapters.store.unit_of_work import SqlStore
from gateway.domain.agent_runs import AgentRunStatus
from gateway.domain.audit import GENESIS, EventQuery, event_hash
from gateway.domain.breaker import CapacityChange
from gateway.domain.drift import DriftStatus
from gateway.domain.errors import BackendError, Conflict, NotFound, Refused
from gateway.domain.jobs import JobKind
from gateway.domain.notifications import Channel, ChannelKind, Notice, NotificationEvent, NotificationStatus
from gateway.domain.principals import GATEWAY, Credentials, Principal, PrincipalKind, Role
from gateway.domain.proposal import Decision, PlanSummary, ProposalStatus, Transition
from gateway.domain.sign_in import PendingSignIn, RefusalTally, WebSession
from gateway.ports import DeclarationRepo, Store

from .fakes import SAMPLE_REPO, FakeFilesRepo, FakeIntegrityError, FakeSandboxStore, FakeStore, ReadOnlyWrite

SUMMARY = PlanSummary(counts={"update": 1})
FAR = datetime(2099, 1, 1, tzinfo=UTC)


@pytest.fixture(params=["fake", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "fake":
        yield FakeStore()
        return
    db = Database(f"sqlite:///{tmp_path / 'gateway.db'}")
    db.migrate()
    yield SqlStore(db)
    db.dispose()


def _proposal(store: Store, stacks: tuple[str, ...] = ("app",)) -> int:
    with store.session() as session:
        alice = session.principals.add("alice", PrincipalKind.PERSON, frozenset({Role.REQUESTER}), frozenset(), "h1")
        return session.proposals.add("change", "base", "head1", alice, alice, "why", stacks, ["stacks/app/main.tf"])


def test_people_are_found_by_name_and_id_and_named_once(store: Store) -> None:
    with store.session() as session:
        bob = session.principals.add("bob", PrincipalKind.PERSON, frozenset({Role.APPROVER}), frozenset({"app"}), "h")
        with pytest.raises(Conflict, match="a principal named 'bob' already exists"):
            session.principals.add("bob", PrincipalKind.PERSON, frozenset(), frozenset(), "h2")
    with store.session(readonly=True) as session:
        assert session.principals.by_name("bob") == bob == session.principals.get(bob.id)
        assert session.principals.by_name("nobody") is None and session.principals.count() == 1
        with pytest.raises(NotFound, match="unknown principal"):
            session.principals.get("no-such-id")


def test_a_saved_move_is_the_status_and_its_event_in_the_trail(store: Store) -> None:
    pid = _proposal(store, ("app", "data"))
    with store.session() as session:
        proposal = session.proposals.get(pid, lock=True)
        assert proposal.status == ProposalStatus.OPEN and proposal.requester.name == "alice"
        proposal.move(Transition.START_APPLY, GATEWAY, {"runner": "r1"}, applied_sha="merged1")
        session.proposals.save(proposal)
        assert proposal.events == []  # handed to the unit of work
        session.audit.append(GATEWAY, "apply.started", {"stack": "app"}, pid, ["app"])
    with store.session(readonly=True) as session:
        saved = session.proposals.get(pid)
        moved, started = session.audit.events(proposal_id=pid)
    assert (saved.status, saved.applied_sha) == (ProposalStatus.APPLYING, "merged1")
    assert (moved.kind, moved.actor, moved.stacks) == ("proposal.start_apply", "gateway", ("app", "data"))
    assert dict(moved.payload) == {"from": "open", "to": "applying", "runner": "r1"}
    assert started.kind == "apply.started"  # written after the move, as the use case asked


def test_a_move_from_a_state_the_row_has_left_is_a_conflict_and_writes_nothing(store: Store) -> None:
    pid = _proposal(store)
    with store.session(readonly=True) as session:
        stale = session.proposals.get(pid)
    with store.session() as session:
        current = session.proposals.get(pid, lock=True)
        current.move(Transition.ABANDON, GATEWAY, {"reason": "first"})
        session.proposals.save(current)
    stale.move(Transition.START_APPLY, GATEWAY, {})
    with pytest.raises(Conflict, match=f"proposal {pid} changed while it was being moved from open"):
        with store.session() as session:
            session.proposals.save(stale)
    with store.session(readonly=True) as session:
        assert session.proposals.get(pid).status == ProposalStatus.ABANDONED
        assert [e.kind for e in session.audit.events(proposal_id=pid)] == ["proposal.abandon"]
    with pytest.raises(Refused, match="`start_apply` is not possible from there"):
        current.move(Transition.START_APPLY, GATEWAY, {})


def test_a_unit_of_work_that_raises_leaves_nothing_behind(store: Store) -> None:
    pid = _proposal(store)
    with pytest.raises(RuntimeError), store.session() as session:
        proposal = session.proposals.get(pid, lock=True)
        proposal.move(Transition.ABANDON, GATEWAY, {"reason": "r"})
        session.proposals.save(proposal)
        session.day_two.add_break_glass("app", "incident", "olga", 60, confirmed=True)
        raise RuntimeError("the use case fails after writing")
    with store.session(readonly=True) as session:
        assert session.proposals.get(pid).status == ProposalStatus.OPEN
        assert session.audit.events(proposal_id=pid) == [] and session.day_two.break_glass_windows() == []


def test_a_read_unit_of_work_writes_nothing(store: Store) -> None:
    with pytest.raises((ReadOnlyWrite, Exception)), store.session(readonly=True) as session:
        session.main.set_marker("m", "v")
    with store.session(readonly=True) as session:
        assert session.main.marker("m") is None


def test_plans_at_the_head_and_decisions_on_them_make_the_proposal(store: Store) -> None:
    pid = _proposal(store)
    with store.session() as session:
        bob = session.principals.add("bob", PrincipalKind.PERSON, frozenset({Role.APPROVER}), frozenset(), "h2")
        session.proposals.add_plan(pid, "app", "head0", "main1", "sha256:old", "{}", 3, "l", SUMMARY, "p0")
        plan_id = session.proposals.add_plan(pid, "app", "head1", "main1", "sha256:d1", "{}", 4, "l", SUMMARY, "p1")
        session.proposals.add_decision(pid, bob, Decision.APPROVE, "head1", {"app": "sha256:d1"}, "ok", "api-token")
        session.proposals.add_override(pid, "rule:addr", bob, "accepted", FAR)
    with store.session(readonly=True) as session:
        proposal = session.proposals.get(pid)
        assert session.proposals.get_many([pid, pid]) == [proposal, proposal]  # a list's read: each as `get` reads it
        with pytest.raises(NotFound, match=f"no proposal {pid + 100}"):
            session.proposals.get_many([pid, pid + 100])
        assert session.proposals.plan_document(plan_id) == "{}" and session.proposals.plan_preview(plan_id) == "p1"
        with pytest.raises(NotFound):
            session.proposals.plan_document(plan_id + 100)
    plan = proposal.plans["app"]
    assert (plan.plan_id, plan.digest, plan.state_serial, plan.main_sha, dict(plan.counts)) == (
        plan_id, "sha256:d1", 4, "main1", {"update": 1})
    [approval] = proposal.current_approvals
    assert (approval.principal.name, approval.auth, approval.comment) == ("bob", "api-token", "ok")
    assert [(o.finding_key, o.by) for o in proposal.overrides] == [("rule:addr", "bob")]
    with store.session() as session:  # a new commit: the decision goes stale
        session.proposals.update_head(pid, "head2", ["app"], ["stacks/app/main.tf"])
    with store.session(readonly=True) as session:
        moved_on = session.proposals.get(pid)
        assert moved_on.plans == {} and moved_on.current_approvals == [] and len(moved_on.stale_decisions) == 1
        assert session.proposals.open_for_branch("change") == pid and session.proposals.open_for_branch("x") is None


def test_one_open_drift_record_per_stack_updated_then_closed(store: Store) -> None:
    with store.session() as session:
        rid = session.day_two.add_drift_record("app", [], False, None)
    with store.session() as session, pytest.raises((IntegrityError, FakeIntegrityError)):  # whoever races
        session.day_two.add_drift_record("app", [], False, None)
    with store.session() as session:
        session.day_two.update_drift_record(rid, [], True, 7)
        assert session.day_two.open_drift_record("app").expected is True  # type: ignore[union-attr]
        session.day_two.close_drift_record(rid, "gateway", "a check finds no drift any more", None)
        assert session.day_two.add_drift_record("app", [], False, None) == rid + 1  # a new one may open now
    with store.session(readonly=True) as session:
        newest, closed = session.day_two.drift_records("app")
        assert (newest.status, closed.status, closed.closed_reason, closed.break_glass_id) == (
            DriftStatus.OPEN, DriftStatus.CLOSED, "a check finds no drift any more", 7)
        assert session.day_two.drift_records("data") == [] and len(session.day_two.drift_records(only_open=True)) == 1
        assert session.day_two.open_drift_records(["data", "app"]) == {"app": newest}  # the open one, of each stack
        assert session.day_two.open_drift_records([]) == {}


def test_windows_open_at_once_or_on_confirmation_and_are_marked_once(store: Store) -> None:
    with store.session() as session:
        wid = session.day_two.add_break_glass("app", "incident", "olga", 3600, confirmed=True)
        asked = session.day_two.add_break_glass("data", "incident", "olga", 60, confirmed=False)
        window, waiting = session.day_two.break_glass(wid), session.day_two.break_glass(asked)
    assert window.opened_at is not None and window.ends_at is not None
    assert window.ends_at - window.opened_at == timedelta(hours=1)
    assert (waiting.opened_at, waiting.ends_at, waiting.confirmed_by) == (None, None, None)
    with store.session() as session:
        session.day_two.confirm_break_glass(asked, "paul", window.opened_at, window.ends_at)
        assert session.day_two.mark_break_glass(wid, "flagged_at", window.opened_at)
        assert not session.day_two.mark_break_glass(wid, "flagged_at", window.opened_at)
        session.day_two.acknowledge_break_glass(wid, "paul", window.opened_at, "seen")
        assert not session.day_two.mark_break_glass(wid, "codified_at", window.opened_at)  # acknowledged: done
        with pytest.raises(NotFound, match="no break-glass window 99"):
            session.day_two.break_glass(99)
    with store.session(readonly=True) as session:
        assert [w.id for w in session.day_two.break_glass_windows()] == [asked, wid]
        assert [w.id for w in session.day_two.break_glass_windows("data")] == [asked]
        assert session.day_two.break_glass(asked).confirmed_by == "paul"


def test_a_marker_is_claimed_by_one_worker(store: Store) -> None:
    with store.session() as session:
        assert session.main.swap_marker("drift_claimed:app", None, "t1")
        assert not session.main.swap_marker("drift_claimed:app", None, "t2")
        assert session.main.swap_marker("drift_claimed:app", "t1", "t3")
        assert not session.main.swap_marker("drift_claimed:app", "t1", "t4")
        session.main.set_marker("seen", "a")
        session.main.set_marker("seen", "b")
    with store.session(readonly=True) as session:
        assert (session.main.marker("drift_claimed:app"), session.main.marker("seen")) == ("t3", "b")


def test_the_trail_is_chained_and_filtered_alike(store: Store) -> None:
    with store.session() as session:
        session.audit.append(GATEWAY, "plan", {"n": 1}, 1, ["app"])
        session.audit.append_many([(GATEWAY, "apply.failed", {"n": 2}, 1, ["data"]),
                                   (GATEWAY, "apply.succeeded", {"n": 3}, 2, ["app"])])
    with store.session(readonly=True) as session:
        events = session.audit.events()
        assert session.audit.chain_head() == (3, events[-1].hash) and session.audit.newest_seq(1) == 2
        assert [e.seq for e in session.audit.events(stack="app")] == [1, 3]
        assert [e.seq for e in session.audit.query(EventQuery(action="apply"))] == [2, 3]
        assert [e.seq for e in session.audit.query(EventQuery(outcome="failed"))] == [2]
        assert [e.seq for e in session.audit.query(EventQuery(), after=1, limit=1)] == [2]
        assert session.audit.count(EventQuery(proposal_id=1)) == 2
        assert session.audit.query(EventQuery(repository="ops")) == []
    with store.session() as session:  # an added repository's stacks, and its repository.added, are its events
        session.audit.append_many([(GATEWAY, "repository.added", {"repository": "ops"}, None, []),
                                   (GATEWAY, "plan", {"n": 5}, None, ["ops/app"]),
                                   (GATEWAY, "plan", {"n": 6}, None, [])])
    with store.session(readonly=True) as session:
        assert [e.seq for e in session.audit.query(EventQuery(repository="ops"))] == [4, 5]
        assert [e.seq for e in session.audit.query(EventQuery(repository="declarations", stack="app"))] == [1, 3]
        assert [e.seq for e in session.audit.query(EventQuery(repository="declarations"), after=3)] == [6]
    previous = GENESIS
    for event in events:
        assert event.prev_hash == previous and event.hash == event_hash(previous, event.content())
        previous = event.hash


def test_a_stacks_serial_is_the_newest_reading(store: Store) -> None:
    with store.session() as session:
        session.stacks.record_serials({"app": 3, "data": 1}, FAR)
        session.stacks.record_serials({"app": 2}, FAR - timedelta(hours=1))  # an older reading, finished later
    with store.session(readonly=True) as session:
        assert session.stacks.serials(["app", "data", "network"]) == {"app": 3, "data": 1}
        assert session.stacks.serials([]) == {}


def test_a_push_to_main_is_acknowledged_once_by_an_unambiguous_prefix(store: Store) -> None:
    with store.session() as session:
        assert session.main.add_push("abc1230000", ["app"], ["stacks/app/main.tf"], "mallory")
        assert not session.main.add_push("abc1230000", ["app"], [], "mallory")  # seen once
        session.main.add_push("abc1240000", ["data"], ["stacks/data/main.tf"], "mallory")
    with store.session() as session:
        assert session.main.acknowledge_push("abc12", "bob", "kept") is None  # names two pushes
        assert session.main.acknowledge_push("fff", "bob", "kept") is None
        push = session.main.acknowledge_push("abc123", "bob", "kept")
        assert push is not None
        assert (push.sha, push.author, push.stacks) == ("abc1230000", "mallory", frozenset({"app"}))
        assert session.main.acknowledge_push("abc123", "bob", "again") is None  # acknowledged already
    with store.session(readonly=True) as session:
        assert [p.sha for p in session.main.unacknowledged_pushes()] == ["abc1240000"]


def test_a_notification_is_queued_or_skipped_once_per_dedupe_key_and_names_its_job(store: Store) -> None:
    mail = Channel("platform-mail", ChannelKind.EMAIL, ("platform@example.com",))
    notice = Notice(NotificationEvent.APPROVAL_WANTED, "Approval wanted", (("Stacks", "app"),), "https://g/p/1", 1,
                    ("app",))
    with store.session() as session:
        queued = session.notifications.add("approval_wanted:plans-1:platform-mail", mail, notice, 3)
        assert queued is not None
        assert session.notifications.add("approval_wanted:plans-1:platform-mail", mail, notice, 4) is None
        skipped = session.notifications.skip("breaker_tripped:trail-2-skipped:platform-mail", mail, notice, 2,
                                             "no proposal 999")
        assert skipped is not None and skipped != queued
        assert session.notifications.skip("breaker_tripped:trail-2-skipped:platform-mail", mail, notice, 2, "x") is None
        job = session.jobs.add(JobKind.NOTIFY, None, GATEWAY, {"notification": queued})
        session.notifications.set_job(queued, job)
    with store.session(readonly=True) as session:
        sent = session.notifications.get(queued)
        assert (sent.status, sent.job_id, sent.attempts, sent.channel, sent.notice) == (
            NotificationStatus.QUEUED, job, 0, mail, notice)
        assert (session.notifications.get(skipped).status, session.notifications.get(skipped).error) == (
            NotificationStatus.SKIPPED, "no proposal 999")
        assert [n.id for n in session.notifications.list()] == [skipped, queued]  # newest first
        assert [n.id for n in session.notifications.list(NotificationStatus.SKIPPED)] == [skipped]
        with pytest.raises(NotFound, match="no notification 99"):
            session.notifications.get(99)


def test_a_queued_job_is_found_for_its_proposal_and_kind(store: Store) -> None:
    pid = _proposal(store)
    with store.session() as session:
        plan = session.jobs.add(JobKind.PLAN, pid, GATEWAY)
        assert session.jobs.add(JobKind.NOTIFY, None, GATEWAY, {"notification": 1}) != plan
    with store.session(readonly=True) as session:
        assert session.jobs.queued(JobKind.PLAN, pid) == plan and session.jobs.queued(JobKind.APPLY, pid) is None


# forges: webhook deliveries, each proposal's pull request, linked GitHub and GitLab accounts

def test_a_delivery_is_recorded_once_by_its_id_and_names_its_job(store: Store) -> None:
    with store.session() as session:
        assert session.github.add_delivery("d-1", "pull_request_review", "submitted", '{"a": 1}')
        assert not session.github.add_delivery("d-1", "pull_request_review", "submitted", '{"a": 2}')  # redelivered
        assert session.github.add_delivery("gitlab:d-2", "merge_request", None, "{}")
        job = session.jobs.add(JobKind.WEBHOOK, None, GATEWAY, {"delivery": "d-1"})
        session.github.set_delivery_job("d-1", job)
    with store.session(readonly=True) as session:
        first, second = session.github.delivery("d-1"), session.github.delivery("gitlab:d-2")
        assert first is not None and second is not None and session.github.delivery("d-3") is None
        assert (first.id, first.event, first.action, first.payload, first.job_id) == (
            "d-1", "pull_request_review", "submitted", '{"a": 1}', job)  # the first body is kept
        assert (second.action, second.job_id) == (None, None)


def test_a_proposal_has_one_pull_request_and_a_pull_request_names_its_newest_proposal(store: Store) -> None:
    first = _proposal(store)
    with store.session() as session:
        alice = session.principals.by_name("alice")
        assert alice is not None
        second = session.proposals.add("change", "base", "head2", alice, alice, "again", ["app"], [])
        session.github.link_pull_request(first, "acme/infra", 7)
        session.github.link_pull_request(first, "acme/infra", 8)  # linked already: nothing changes
        session.github.link_pull_request(second, "acme/infra", 7)  # the pull request reopened
    with store.session(readonly=True) as session:
        link = session.github.pull_request_of(first)
        assert link is not None and session.github.pull_request_of(999) is None
        assert (link.repository, link.number, link.comment_id, link.published_seq, link.publish_error) == (
            "acme/infra", 7, None, 0, None)
        assert session.github.proposal_for_pull_request("acme/infra", 7) == second
        assert session.github.proposal_for_pull_request("acme/infra", 8) is None
        assert session.github.proposal_for_pull_request("acme/other", 7) is None


def test_a_person_is_linked_to_one_forge_account_and_an_account_to_one_person(store: Store) -> None:
    with store.session() as session:
        bob = session.principals.add("bob", PrincipalKind.PERSON, frozenset({Role.APPROVER}), frozenset(), "h1")
        carol = session.principals.add("carol", PrincipalKind.PERSON, frozenset({Role.APPROVER}), frozenset(), "h2")
        session.principals.link_github(bob, 11, "bob-gh")
        session.principals.link_github(bob, 12, "bob-new")  # bob's new account replaces the old one
        session.principals.link_github(carol, 11, "carol-gh")  # the old account is carol's now
        session.principals.link_gitlab(bob, 21, "bob-gl")
    with store.session(readonly=True) as session:
        found = session.principals.by_github_id(12)
        assert found is not None and found.name == "bob" and session.principals.github_login_of(bob.id) == "bob-new"
        again = session.principals.by_github_id(11)
        assert again is not None and again.name == "carol"
        assert session.principals.by_github_id(13) is None and session.principals.github_login_of("nobody") is None
        gitlab = session.principals.by_gitlab_id(21)
        assert gitlab is not None and gitlab.name == "bob"
        assert session.principals.gitlab_account_of(bob.id) == (21, "bob-gl")
        assert session.principals.gitlab_account_of(carol.id) is None and session.principals.by_gitlab_id(11) is None


# --- day two, breaker, sign-in ---------------------------------------------------------------------------------

T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)


def _people(store: Store) -> tuple[Principal, Principal]:
    with store.session() as session:
        return (session.principals.add("bob", PrincipalKind.PERSON, frozenset({Role.APPROVER}), frozenset(), "hb"),
                session.principals.add("admin", PrincipalKind.PERSON, frozenset({Role.ADMIN}), frozenset(), "ha"))


def test_a_proposals_capacity_figures_are_its_latest_and_read_by_agent_and_time(store: Store) -> None:
    with store.session() as session:
        session.breaker.record_change(CapacityChange(1, "agent-a", {"app": 50.0}, 2.0, 0, T0))
        session.breaker.record_change(CapacityChange(2, "agent-b", {"app": 50.0}, 3.0, 1, T0 + timedelta(seconds=2)))
        session.breaker.record_change(CapacityChange(1, "agent-a", {"app": 50.0}, 5.0, 0, T0 + timedelta(seconds=3)))
    with store.session(readonly=True) as session:
        assert session.breaker.changes(None, T0) == [
            CapacityChange(2, "agent-b", {"app": 50.0}, 3.0, 1, T0 + timedelta(seconds=2)),
            CapacityChange(1, "agent-a", {"app": 50.0}, 5.0, 0, T0 + timedelta(seconds=3))]  # a re-plan replaces
        assert [c.proposal_id for c in session.breaker.changes("agent-b", T0)] == [2]
        assert session.breaker.changes(None, T0 + timedelta(seconds=4)) == []


def test_a_breakers_state_is_its_last_setting(store: Store) -> None:
    with store.session() as session:
        assert session.breaker.state("*") is None and session.breaker.states() == []
        session.breaker.set("agent-a", True, "tripped", "gateway")
        session.breaker.set("*", True, "kill switch", "admin")
        session.breaker.set("agent-a", False, "planned", "bob")
    with store.session(readonly=True) as session:
        assert [(s.scope, s.open, s.reason, s.changed_by) for s in session.breaker.states()] == [
            ("*", True, "kill switch", "admin"), ("agent-a", False, "planned", "bob")]
        state = session.breaker.state("agent-a")
        assert state is not None and state.changed_at.tzinfo is not None


def test_an_identity_maps_to_one_person_and_a_new_link_replaces_the_old(store: Store) -> None:
    bob, admin = _people(store)
    with store.session() as session:
        session.sign_in.link_identity(bob, "https://idp", "sub-1", "bob")
        session.sign_in.link_identity(bob, "https://other", "sub-9", "bob")
        session.sign_in.link_identity(admin, "https://idp", "sub-1", "admin")  # the subject moves to admin
    with store.session(readonly=True) as session:
        assert session.sign_in.principal_of("https://idp", "sub-1") == admin
        assert session.sign_in.principal_of("https://idp", "sub-2") is None
        assert session.sign_in.identities_of(bob.id) == [("https://other", "sub-9")]
        assert session.sign_in.identities_of(admin.id) == [("https://idp", "sub-1")]


def test_a_session_is_found_by_its_hash_and_ends_once(store: Store) -> None:
    bob, admin = _people(store)
    opened = WebSession(bob.id, "oidc:https://idp", frozenset({"platform"}), T0, T0 + timedelta(hours=8))
    with store.session() as session:
        session.sign_in.open_session("h1", opened)
        session.sign_in.open_session("h2", WebSession(bob.id, "web-session", None, T0, T0 + timedelta(hours=8)))
        session.sign_in.open_session("h3", WebSession(admin.id, "github", None, T0, T0 + timedelta(hours=8)))
    with store.session() as session, pytest.raises((IntegrityError, FakeIntegrityError)):  # one session per id
        session.sign_in.open_session("h1", opened)
    with store.session() as session:
        assert session.sign_in.get_session("h1") == opened and session.sign_in.get_session("nope") is None
        session.sign_in.end_session("h1", T0 + timedelta(minutes=1))
        session.sign_in.end_session("h1", T0 + timedelta(minutes=2))  # ended already: kept as it was
        assert session.sign_in.end_sessions_of(bob.id, T0 + timedelta(minutes=3)) == 1  # h2 only
        assert session.sign_in.end_sessions_of(bob.id, T0 + timedelta(minutes=4)) == 0
    with store.session(readonly=True) as session:
        assert session.sign_in.get_session("h1") == replace(opened, ended_at=T0 + timedelta(minutes=1))
        assert [session.sign_in.get_session(h).ended_at for h in ("h2", "h3")] == [T0 + timedelta(minutes=3), None]


def test_a_sign_in_in_progress_is_used_once_and_forgotten_when_expired(store: Store) -> None:
    flow = PendingSignIn("oidc", "browser", {"nonce": "n", "code_verifier": "v"}, T0, T0 + timedelta(minutes=10))
    with store.session() as session:
        session.sign_in.add_flow("s1", flow)
        session.sign_in.add_flow("s2", replace(flow, expires_at=T0 + timedelta(minutes=20)))
    with store.session() as session:
        assert session.sign_in.get_flow("s1") == flow and session.sign_in.get_flow("nope") is None
        assert session.sign_in.use_flow("s1", T0 + timedelta(minutes=1))
        assert not session.sign_in.use_flow("s1", T0 + timedelta(minutes=2))
        assert not session.sign_in.use_flow("nope", T0)
        used = session.sign_in.get_flow("s1")
        assert used is not None and used.used_at == T0 + timedelta(minutes=1) and dict(used.secrets) == {}
        assert session.sign_in.forget_flows(T0 + timedelta(minutes=10)) == 1
    with store.session(readonly=True) as session:
        assert session.sign_in.get_flow("s1") is None and session.sign_in.get_flow("s2") is not None


def test_a_refusal_tally_is_none_until_one_is_saved(store: Store) -> None:
    with store.session() as session:
        assert session.sign_in.refusal_tally("oidc:state") is None
        session.sign_in.save_refusal_tally("oidc:state", RefusalTally(T0, 5, 2, T0 + timedelta(seconds=5)))
        session.sign_in.save_refusal_tally("oidc:nonce", RefusalTally(T0, 1))  # never read: nothing to update
    with store.session() as session:
        assert session.sign_in.refusal_tally("oidc:state") == RefusalTally(T0, 5, 2, T0 + timedelta(seconds=5))
        assert session.sign_in.refusal_tally("oidc:nonce") is None


def test_sign_in_rows_written_by_a_unit_of_work_that_raises_are_not_kept(store: Store) -> None:
    with pytest.raises(RuntimeError), store.session() as session:  # the store's very first write
        session.breaker.set("*", True, "kill switch", "admin")
        raise RuntimeError("the use case fails after writing")
    bob, _ = _people(store)
    with store.session() as session:
        session.sign_in.open_session("h1", WebSession(bob.id, "github", None, T0, T0 + timedelta(hours=8)))
    with pytest.raises(RuntimeError), store.session() as session:
        session.sign_in.end_sessions_of(bob.id, T0)
        session.breaker.set("*", True, "kill switch", "admin")
        raise RuntimeError("the use case fails after writing")
    with store.session(readonly=True) as session:
        found = session.sign_in.get_session("h1")
        assert found is not None and found.ended_at is None and session.breaker.states() == []


def test_the_breaker_stops_queued_and_running_agent_requests_only(store: Store) -> None:
    bob, _ = _people(store)
    with store.session() as session:
        for run_id in ("q", "r", "s"):
            session.conversations.add_run(run_id, bob, "add a queue", "c-1", 1)
        assert session.conversations.begin_run("r") and session.conversations.begin_run("s")
        assert not session.conversations.begin_run("r")  # running already
        assert sorted(session.conversations.stop_runs("first")) == ["q", "r", "s"]
        session.conversations.add_run("later", bob, "add a topic", "c-2", 2)
    with store.session() as session:
        assert session.conversations.stop_runs("second") == ["later"]  # the stopped ones are not stopped again
        assert not session.conversations.begin_run("q")  # a stopped request never starts
        stopped = session.conversations.run("q")
        assert session.conversations.run("nope") is None
    assert stopped is not None and (stopped.status, stopped.message, stopped.requester_id, stopped.job_id) == (
        AgentRunStatus.STOPPED, "first", bob.id, 1)


def test_the_enabled_admins_are_the_admins_not_disabled(store: Store) -> None:
    bob, admin = _people(store)
    with store.session() as session:
        other = session.principals.add("root", PrincipalKind.PERSON, frozenset({Role.ADMIN}), frozenset(), "hr")
        assert sorted(session.principals.enabled_admins()) == sorted([admin.id, other.id])
        session.principals.set_disabled(other.id, T0)
        assert session.principals.enabled_admins() == [admin.id]


def test_a_principals_credentials_follow_each_change_and_its_token_finds_it(store: Store) -> None:
    with store.session() as session:
        eve = session.principals.add("eve", PrincipalKind.PERSON, frozenset({Role.REQUESTER}), frozenset({"app"}), "h1")
        assert session.principals.credentials(eve.id) == Credentials()
        session.principals.set_token_expiry(eve.id, T0)
        session.principals.touch(eve.id, T0 - timedelta(hours=1))
    with store.session() as session:
        assert session.principals.token_holder("h1") == (eve, Credentials(None, T0, T0 - timedelta(hours=1)))
        session.principals.set_token(eve.id, "h2", None)
        session.principals.set_disabled(eve.id, T0)
        session.principals.set_access(eve.id, frozenset({Role.APPROVER}), frozenset({"data"}))
        session.principals.touch("no-such-id", T0)  # no row: nothing changes
    with store.session(readonly=True) as session:
        assert session.principals.token_holder("h1") is None
        holder = session.principals.token_holder("h2")
        assert holder is not None and holder[1] == Credentials(T0, None, T0 - timedelta(hours=1))
        assert (holder[0].disabled, holder[0].roles, holder[0].groups) == (True, frozenset({Role.APPROVER}),
                                                                          frozenset({"data"}))
        with pytest.raises(NotFound, match="unknown principal"):
            session.principals.credentials("no-such-id")


def test_a_delivery_attempt_keeps_it_queued_and_it_ends_once(store: Store) -> None:
    hook = Channel("audit-hook", ChannelKind.WEBHOOK)
    notice = Notice(NotificationEvent.BREAKER_TRIPPED, "Breaker tripped", (), None, None, ())
    with store.session() as session:
        nid = session.notifications.add("breaker_tripped:trail-1:audit-hook", hook, notice, 1)
        other = session.notifications.add("breaker_tripped:trail-1:ops", replace(hook, name="ops"), notice, 1)
        assert nid is not None and other is not None
        session.notifications.record_attempt(nid, 1, "HTTP 503")
    with store.session() as session:
        waiting = session.notifications.get(nid)
        assert (waiting.status, waiting.attempts, waiting.error) == (NotificationStatus.QUEUED, 1, "HTTP 503")
        assert session.notifications.finish(nid, NotificationStatus.FAILED, 3, error="gave up")
        assert not session.notifications.finish(nid, NotificationStatus.DELIVERED, 4, receipt="late")
        session.notifications.record_attempt(nid, 9, "after the end")  # an ended one keeps its end
        assert session.notifications.finish(other, NotificationStatus.DELIVERED, 1, receipt="200")
    with store.session(readonly=True) as session:
        failed, delivered = session.notifications.get(nid), session.notifications.get(other)
    assert (failed.status, failed.attempts, failed.error, failed.delivered_at) == (
        NotificationStatus.FAILED, 3, "gave up", None)
    assert (delivered.status, delivered.attempts, delivered.error) == (NotificationStatus.DELIVERED, 1, None)
    assert delivered.delivered_at is not None


def test_a_conversation_is_found_by_its_id(store: Store) -> None:
    bob, _ = _people(store)
    with store.session() as session:
        session.conversations.add("c-1", bob, "agent/c-1")
    with store.session(readonly=True) as session:
        found = session.conversations.get("c-1")
        assert session.conversations.get("c-2") is None
    assert found is not None and (found.id, found.requester_id, found.branch, found.proposal_id) == (
        "c-1", bob.id, "agent/c-1", None)


def test_a_github_account_links_one_person_by_its_id(store: Store) -> None:
    bob, admin = _people(store)
    with store.session() as session:
        session.principals.link_github(bob, 4242, "bob-gh")
        session.principals.link_github(bob, 4343, "bob-new")  # bob's new account replaces the old
        session.principals.link_github(admin, 777, "root-gh")
        session.principals.link_github(admin, 4343, "taken-over")  # the account moves to admin
    with store.session(readonly=True) as session:
        assert session.principals.by_github_id(4242) is None and session.principals.by_github_id(4343) == admin
        assert session.principals.github_login_of(bob.id) is None
        assert session.principals.github_login_of(admin.id) == "taken-over"
# --- sandbox ----------------------------------------------------------------------------------------------------


@pytest.fixture(params=["fake", "sqlite"])
def sandbox_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FakeSandboxStore | SqlSandboxStore]:
    if request.param == "fake":
        yield FakeSandboxStore()
        return
    db = Database(f"sqlite:///{tmp_path / 'gateway.db'}")
    db.migrate()
    yield SqlSandboxStore(db)
    db.dispose()


def _state(store: SandboxStore, stack: str = "app") -> StackState:
    state = store.read_state(stack)
    assert state is not None
    return state


def _resource(rid: str, **attributes: Any) -> StateResource:
    return StateResource("aws_sqs_queue", rid, None, rid, dict(attributes), ["secret"], ["aws_vpc.main"])


def test_a_stack_state_is_written_on_its_serial_and_read_back_whole(sandbox_store: SandboxStore) -> None:
    assert sandbox_store.read_state("app") is None and sandbox_store.read_serial("app") == 0
    first = StackState("lin-1", 1, {"aws_sqs_queue.a": _resource("a", name="a"), "aws_sqs_queue.b": _resource("b")},
                       {"url": "https://a"})
    sandbox_store.write_state("app", first, 0)
    assert sandbox_store.read_serial("app") == 1 and sandbox_store.read_serial("data") == 0
    assert sandbox_store.read_state("app") == first
    first.resources["aws_sqs_queue.a"].attributes["name"] = "edited after the write"
    assert _state(sandbox_store).resources["aws_sqs_queue.a"].attributes == {"name": "a"}
    with pytest.raises(BackendError, match="state of stack app changed underneath this write"):
        sandbox_store.write_state("app", StackState("lin-1", 2), 0)
    with pytest.raises(BackendError, match="expected serial 5"):
        sandbox_store.write_state("data", StackState("lin-2", 6), 5)
    assert sandbox_store.read_state("data") is None and sandbox_store.read_serial("app") == 1


def test_a_write_of_some_addresses_keeps_the_others(sandbox_store: SandboxStore) -> None:
    sandbox_store.write_state("app", StackState("lin", 1, {"aws_sqs_queue.a": _resource("a"),
                                                           "aws_sqs_queue.b": _resource("b")}), 0)
    second = StackState("lin", 2, {"aws_sqs_queue.b": _resource("b", name="b2"), "aws_sqs_queue.c": _resource("c")},
                        {"o": 1})
    sandbox_store.write_state("app", second, 1, changed=["aws_sqs_queue.b", "aws_sqs_queue.c"])
    kept = _state(sandbox_store)
    assert (kept.serial, kept.outputs) == (2, {"o": 1})
    assert sorted(kept.resources) == ["aws_sqs_queue.a", "aws_sqs_queue.b", "aws_sqs_queue.c"]
    assert kept.resources["aws_sqs_queue.b"].attributes == {"name": "b2"}
    sandbox_store.write_state("app", StackState("lin", 3, {"aws_sqs_queue.a": _resource("a")}), 2,
                              changed=["aws_sqs_queue.b"])  # b removed from the state, c untouched
    assert sorted(_state(sandbox_store).resources) == ["aws_sqs_queue.a", "aws_sqs_queue.c"]
    sandbox_store.write_state("app", StackState("lin", 4, {"aws_sqs_queue.a": _resource("a")}), 3)  # every address
    assert sorted(_state(sandbox_store).resources) == ["aws_sqs_queue.a"]


def test_objects_and_the_state_of_an_apply_are_written_together_or_not_at_all(sandbox_store: SandboxStore) -> None:
    sandbox_store.put_object("aws_sqs_queue", "old", {"name": "old"})
    sandbox_store.put_object("aws_sqs_queue", "gone", {"name": "gone"})
    sandbox_store.write_apply("app", StackState("lin", 1, {"aws_sqs_queue.a": _resource("a")}), 0, ["aws_sqs_queue.a"],
                              {("aws_sqs_queue", "a"): {"name": "a", "tags": {"x": "1"}},
                               ("aws_sqs_queue", "gone"): None, ("aws_sqs_queue", "old"): {"name": "new"}})
    assert sandbox_store.get_objects([("aws_sqs_queue", "a"), ("aws_sqs_queue", "gone"), ("aws_sqs_queue", "old"),
                                      ("aws_vpc", "a")]) == {("aws_sqs_queue", "a"): {"name": "a", "tags": {"x": "1"}},
                                                             ("aws_sqs_queue", "old"): {"name": "new"}}
    assert sandbox_store.read_serial("app") == 1
    with pytest.raises(BackendError, match="changed underneath"):
        sandbox_store.write_apply("app", StackState("lin", 2), 0, [], {("aws_sqs_queue", "b"): {"name": "b"},
                                                                       ("aws_sqs_queue", "a"): None})
    assert sandbox_store.get_object("aws_sqs_queue", "b") is None  # the refused write left no object behind
    assert sandbox_store.get_object("aws_sqs_queue", "a") == {"name": "a", "tags": {"x": "1"}}


def test_objects_are_put_read_and_deleted_by_type_and_id(sandbox_store: SandboxStore) -> None:
    attributes = {"name": "q", "nested": [{"a": 1}]}
    sandbox_store.put_object("aws_sqs_queue", "q", attributes)
    attributes["name"] = "edited after the put"
    sandbox_store.put_object("aws_sns_topic", "q", {"name": "topic"})
    read = sandbox_store.get_object("aws_sqs_queue", "q")
    assert read == {"name": "q", "nested": [{"a": 1}]}
    assert read is not None
    read["name"] = "edited after the read"
    assert sandbox_store.get_object("aws_sqs_queue", "q") == {"name": "q", "nested": [{"a": 1}]}
    sandbox_store.put_object("aws_sqs_queue", "q", {"name": "replaced"})
    sandbox_store.delete_object("aws_sqs_queue", "q")
    sandbox_store.delete_object("aws_sqs_queue", "never-there")
    assert sandbox_store.get_object("aws_sqs_queue", "q") is None
    assert sandbox_store.get_object("aws_sns_topic", "q") == {"name": "topic"}


def test_a_fault_waits_for_its_stack_and_address_and_is_taken_once(
        sandbox_store: FakeSandboxStore | SqlSandboxStore) -> None:
    sandbox_store.inject_fault("app", "aws_sqs_queue.a", "first")
    sandbox_store.inject_fault("app", "aws_sqs_queue.a", "the provider timed out")
    sandbox_store.inject_delay("app", "aws_sqs_queue.b", 0.5)
    sandbox_store.inject_fault("data", "aws_sqs_queue.a", "elsewhere")
    assert sandbox_store.fault_addresses("app") == {"aws_sqs_queue.a", "aws_sqs_queue.b"}
    assert sandbox_store.take_fault("app", "aws_sqs_queue.a") == "the provider timed out"
    assert sandbox_store.take_fault("app", "aws_sqs_queue.a") is None
    assert sandbox_store.take_fault("app", "aws_sqs_queue.b") == f"{DELAY_PREFIX}0.5"
    assert sandbox_store.fault_addresses("app") == frozenset() and sandbox_store.fault_addresses("data") == {
        "aws_sqs_queue.a"}


@pytest.fixture(params=["fake", "git"])
def declaration_repo(request: pytest.FixtureRequest, tmp_path: Path) -> DeclarationRepo:
    if request.param == "fake":
        return FakeFilesRepo({str(p.relative_to(SAMPLE_REPO)): p.read_bytes()
                              for p in sorted(SAMPLE_REPO.rglob("*")) if p.is_file()})
    return GitDeclarationRepo.create(tmp_path / "declarations.git", SAMPLE_REPO)


QUEUES = {"stacks/app-staging/queues.tf": 'module "net" {\n  source = "../network"\n}\n',  # into folders that exist:
          "stacks/network/queue.tf": 'resource "aws_sqs_queue" "q" {\n  name = "q"\n}\n'}  # as the gateway commits


def test_a_branch_commit_reads_back_as_files_and_history(declaration_repo: DeclarationRepo) -> None:
    main = declaration_repo.resolve("main")
    head = declaration_repo.commit_to_new_branch(main, "queues", QUEUES, "add queues", "alice")
    assert declaration_repo.branch_exists("queues") and declaration_repo.resolve("queues") == head
    assert declaration_repo.read_file(head, "stacks/network/queue.tf") == QUEUES["stacks/network/queue.tf"]
    with pytest.raises(NotFound, match="stacks/network/queue.tf does not exist at"):
        declaration_repo.read_file(main, "stacks/network/queue.tf")
    own = declaration_repo.read_files(head, "stacks/app-staging", ".tf")
    assert "stacks/app-staging/queues.tf" in own and "stacks/app-staging/main.tf" in own
    assert "policies/data/classification.json" not in declaration_repo.read_files(main, "policies", ".json")
    assert "policies/data/classification.json" in declaration_repo.read_tree(main, "policies")  # and below it
    assert declaration_repo.read_files(head, "stacks/nowhere", ".tf") == {}
    assert declaration_repo.changed_paths(main, head) == sorted(QUEUES)
    assert declaration_repo.merge_base(main, head) == main
    [commit] = declaration_repo.commits(main, head)
    assert (commit.sha, commit.author_name, commit.author_email, commit.message.strip()) == (
        head, "alice", "alice@gateway", "add queues")
    assert declaration_repo.tree_of(head, "stacks/data") == declaration_repo.tree_of(main, "stacks/data")
    assert declaration_repo.tree_of(head, "stacks/network") != declaration_repo.tree_of(main, "stacks/network")
    assert declaration_repo.tree_of(main, "modules") is None
    with pytest.raises(Conflict, match="branch queues already exists in the declaration repo"):
        declaration_repo.commit_to_new_branch(main, "queues", QUEUES, "again", "alice")


def test_a_stack_export_holds_the_stack_its_local_modules_and_gateway_yaml(declaration_repo: DeclarationRepo,
                                                                          tmp_path: Path) -> None:
    head = declaration_repo.commit_to_new_branch(declaration_repo.resolve("main"), "queues", QUEUES, "queues", "bob")
    assert declaration_repo.module_directories(head, "stacks/app-staging") == ("stacks/network",)
    directory = declaration_repo.export_stack(head, "stacks/app-staging", tmp_path / "export")
    assert directory == tmp_path / "export" / "stacks" / "app-staging"
    assert (directory / "queues.tf").read_text() == QUEUES["stacks/app-staging/queues.tf"]
    assert (directory / "main.tf").is_file()
    assert (tmp_path / "export" / "stacks" / "network" / "queue.tf").read_text() == QUEUES["stacks/network/queue.tf"]
    assert (tmp_path / "export" / "gateway.yaml").read_text() == declaration_repo.read_file(head, "gateway.yaml")
    assert not (tmp_path / "export" / "stacks" / "data").exists() and not (tmp_path / "export" / "policies").exists()


def test_a_merge_preview_holds_both_sides_or_names_the_conflict(declaration_repo: DeclarationRepo) -> None:
    base = declaration_repo.resolve("main")
    staging = declaration_repo.read_file(base, "stacks/app-staging/main.tf")
    head = declaration_repo.commit_to_new_branch(base, "bigger", {
        "stacks/app-staging/main.tf": staging.replace('"t3.small"', '"t3.medium"')}, "bigger", "alice")
    moved = declaration_repo.commit_to_new_branch(base, "elsewhere", {"stacks/network/extra.tf": "# main moved\n"},
                                                  "main moves", "bob")
    declaration_repo.set_branch("main", moved)
    merged = declaration_repo.merge_preview(moved, head)
    assert declaration_repo.read_file(merged, "stacks/network/extra.tf") == "# main moved\n"
    assert '"t3.medium"' in declaration_repo.read_file(merged, "stacks/app-staging/main.tf")
    assert declaration_repo.merge_base(moved, head) == base and declaration_repo.resolve("main") == moved
    clash = declaration_repo.commit_to_new_branch(base, "smaller", {
        "stacks/app-staging/main.tf": staging.replace('"t3.small"', '"t3.micro"')}, "smaller", "carol")
    declaration_repo.set_branch("main", head)
    with pytest.raises(Conflict, match=r"does not merge cleanly into main \(conflicts in stacks/app-staging/main.tf\)"):
        declaration_repo.merge_preview(head, clash)
    assert declaration_repo.merge_conflict(head, clash) == (
        "the branch does not merge cleanly into main (conflicts in stacks/app-staging/main.tf); rebase it on main and "
        "push again")
    assert declaration_repo.merge_conflict(moved, head) is None


# --- more: what an apply reaches on the store and on the repo -------------------------------------------------------


def test_a_saved_plan_hashes_to_its_document_and_artifact_as_stored(store: Store) -> None:
    from gateway.domain.plan import plan_digest

    pid = _proposal(store)
    document = '{"format_version": "1.2", "resource_changes": []}'
    with store.session() as session:
        bare = session.proposals.add_plan(pid, "app", "head1", "main1", "sha256:d", document, 1, "l", SUMMARY, "p")
        kept = session.proposals.add_plan(pid, "app", "head1", "main1", "sha256:d", document, 1, "l", SUMMARY, "p",
                                          artifact=b"the engine's plan file")
    with store.session(readonly=True) as session:
        digests = session.proposals.saved_plan_digests([bare, kept, kept + 100])
        assert (session.proposals.plan_artifact(bare), session.proposals.plan_artifact(kept)) == (
            None, b"the engine's plan file")
    assert digests == {bare: plan_digest({"format_version": "1.2", "resource_changes": []}),
                       kept: plan_digest({"format_version": "1.2", "resource_changes": []}, b"the engine's plan file")}
    assert digests[bare] != digests[kept]


def test_a_merge_moves_main_only_from_where_it_was_and_reverts_cleanly(declaration_repo: DeclarationRepo) -> None:
    from gateway.domain.errors import RefMoved

    base = declaration_repo.resolve("main")
    staging = declaration_repo.read_file(base, "stacks/app-staging/main.tf")
    head = declaration_repo.commit_to_new_branch(base, "bigger", {
        "stacks/app-staging/main.tf": staging.replace('"t3.small"', '"t3.medium"')}, "bigger", "alice")
    assert '+  instance_type          = "t3.medium"' in declaration_repo.diff(base, head).splitlines()
    told: list[str] = []
    merged = declaration_repo.merge(base, head, "main", "Merge proposal 1", before_moving=told.append)
    assert told == [merged] and declaration_repo.resolve("main") == merged
    assert declaration_repo.is_ancestor(head, merged) and declaration_repo.is_ancestor(base, merged)
    assert not declaration_repo.is_ancestor(merged, head) and declaration_repo.is_ancestor(head, head)
    assert [(sha, parent) for sha, parent, _ in declaration_repo.first_parent_commits(base, merged)] == [(merged, base)]
    assert '"t3.medium"' in declaration_repo.read_file("main", "stacks/app-staging/main.tf")
    other = declaration_repo.commit_to_new_branch(base, "other", {"stacks/network/extra.tf": "# extra\n"}, "x", "bob")
    with pytest.raises(RefMoved, match="main moved while merging"):
        declaration_repo.merge(base, other, "main", "Merge proposal 2")  # main is no longer at base
    assert declaration_repo.resolve("main") == merged

    undone = declaration_repo.revert_merge_to_new_branch(merged, merged, "rollback/1", "Roll back 1", "alice")
    assert declaration_repo.resolve("rollback/1") == undone
    assert declaration_repo.read_file(undone, "stacks/app-staging/main.tf") == staging
    assert declaration_repo.changed_paths(merged, undone) == ["stacks/app-staging/main.tf"]
    with pytest.raises(Conflict, match="already exists"):
        declaration_repo.revert_merge_to_new_branch(merged, merged, "rollback/1", "again", "alice")
    declaration_repo.delete_branch("rollback/1")
    assert not declaration_repo.branch_exists("rollback/1")
    pinned = declaration_repo.pinned()
    assert pinned.resolve("main") == merged
    declaration_repo.set_branch("main", other)  # a push while the read goes on
    assert pinned.resolve("main") == merged and declaration_repo.resolve("main") == other


def test_a_proposals_jobs_are_listed_oldest_first_and_queued(store: Store) -> None:
    from gateway.domain.jobs import JobStatus

    pid, other = _proposal(store), None
    with store.session() as session:
        plan = session.jobs.add(JobKind.PLAN, pid, GATEWAY)
        apply = session.jobs.add(JobKind.APPLY, pid, GATEWAY, {"runner": "r"})
        other = session.jobs.add(JobKind.NOTIFY, None, GATEWAY)
    with store.session(readonly=True) as session:
        jobs = session.jobs.of_proposal(pid)
        assert session.jobs.of_proposal(pid + 100) == []
    assert [(j.id, j.kind, j.proposal_id, j.status, j.args) for j in jobs] == [
        (plan, JobKind.PLAN, pid, JobStatus.QUEUED, {}), (apply, JobKind.APPLY, pid, JobStatus.QUEUED, {"runner": "r"})]
    assert other not in [j.id for j in jobs]
