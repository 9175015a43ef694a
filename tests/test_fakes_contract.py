"""The fake unit of work answers as the SQL one does: the same assertions run on tests/fakes.py's FakeStore and on
the real SqlStore (SQLite), for everything the fake implements, so a use-case test on the fake cannot pass on an
answer the database would never give."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy.exc import IntegrityError

from gateway.adapters.store.schema import Database
from gateway.adapters.store.unit_of_work import SqlStore
from gateway.domain.agent_runs import AgentRunStatus
from gateway.domain.audit import GENESIS, EventQuery, event_hash
from gateway.domain.breaker import CapacityChange
from gateway.domain.drift import DriftStatus
from gateway.domain.errors import Conflict, NotFound, Refused
from gateway.domain.jobs import JobKind
from gateway.domain.notifications import Channel, ChannelKind, Notice, NotificationEvent, NotificationStatus
from gateway.domain.principals import GATEWAY, Credentials, Principal, PrincipalKind, Role
from gateway.domain.proposal import Decision, PlanSummary, ProposalStatus, Transition
from gateway.domain.sign_in import PendingSignIn, RefusalTally, WebSession
from gateway.ports import Store

from .fakes import FakeIntegrityError, FakeStore, ReadOnlyWrite

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
