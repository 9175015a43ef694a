"""Use cases whose rules need no git, no database and no engine, run on tests/fakes.py's unit of work: who may decide
on a proposal (and what the trail says of a refusal), abandoning and withdrawing, break-glass windows from request to
acknowledgement, what stands before an apply (a rejection, risk's approvals, policy overrides, a push to main, an
overdue window), and what the notifications outbox queues for whom. The clock is a FakeClock: a deadline passes by
moving it, not by sleeping. What needs a real repository, plan, apply or receiver stays in test_change_path.py,
test_day_two.py, test_policy.py and test_notifications.py."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta

import pytest

from gateway.domain.apply_blockers import apply_blockers
from gateway.domain.audit import EventQuery
from gateway.domain.errors import InputError, NotFound, Refused
from gateway.domain.jobs import JobKind
from gateway.domain.notifications import OUTBOX_MARKER, NotificationStatus
from gateway.domain.policy import Finding, Severity
from gateway.domain.principals import GATEWAY, Principal, PrincipalKind, Role
from gateway.domain.proposal import Decision, PlanSummary, ProposalStatus
from gateway.domain.risk import Risk, RiskLevel
from gateway.services.admin import audit as audit_service
from gateway.services.change.apply_facts import gather_apply_facts
from gateway.services.change.main_watch import acknowledge_push
from gateway.services.change.proposals import (
    abandon_proposal,
    decide,
    get_proposal,
    override_finding,
    withdraw_decisions,
)
from gateway.services.change.runner import apply_proposal
from gateway.services.day_two.break_glass import (
    acknowledge_break_glass,
    close_break_glass,
    confirm_break_glass,
    open_break_glass,
    overdue_windows,
    sweep_break_glass,
)
from gateway.services.day_two.drift_records import CHECKED
from gateway.services.notifications.outbox import queue_notifications
from gateway.services.workspace import Workspace

from .fakes import SAMPLE_GATEWAY_YAML, FakeClock, FakeDeclarationRepo, fake_workspace, person


class Team:
    """The people of conftest's `people`, kept in the fake store."""

    def __init__(self, ws: Workspace):
        def add(name: str, role: Role, *groups: str, kind: PrincipalKind = PrincipalKind.PERSON) -> Principal:
            return person(name, role, groups=groups, kind=kind, store=ws.store)

        self.alice, self.bob, self.carol = add("alice", Role.REQUESTER, "app"), add("bob", Role.APPROVER, "platform"), \
            add("carol", Role.APPROVER, "platform")
        self.erin, self.dana = add("erin", Role.APPROVER, "data"), add("dana", Role.AUDITOR)
        self.agent = add("infra-agent", Role.REQUESTER, kind=PrincipalKind.AGENT)
        self.olga, self.paul = add("olga", Role.REQUESTER, "oncall"), add("paul", Role.REQUESTER, "oncall")
        self.frank = add("frank", Role.APPROVER, "security")  # a policy owner


@pytest.fixture
def ws() -> Workspace:
    return fake_workspace()


@pytest.fixture
def team(ws: Workspace) -> Team:
    return Team(ws)


AN_UPDATE = PlanSummary(counts={"update": 1})


def proposed(ws: Workspace, requester: Principal, proposer: Principal | None = None, stack: str = "app-staging",
             summary: PlanSummary = AN_UPDATE) -> int:
    """A proposal of branch `bigger` on `stack`, planned at its head onto main (what open_proposal leaves)."""
    assert isinstance(ws.repo, FakeDeclarationRepo)
    ws.repo.refs["bigger"] = "head-1"
    with ws.store.session() as session:
        pid = session.proposals.add("bigger", "main-1", "head-1", requester, proposer or requester, "more memory",
                                    [stack], [f"stacks/{stack}/main.tf"])
        session.proposals.add_plan(pid, stack, "head-1", "main-1", "sha256:plan1", "{}", 0, "lineage", summary,
                                   "preview")
    return pid


def trail(ws: Workspace, **query: object) -> list[tuple[str, str]]:
    with ws.store.session(readonly=True) as session:
        return [(e.actor, e.kind) for e in session.audit.query(EventQuery(**query))]  # type: ignore[arg-type]


# Who decides (from test_change_path.py, which built git, a database and the simulator for these)

def test_requester_cannot_approve_their_own_change(ws: Workspace, team: Team) -> None:
    pid = proposed(ws, team.alice)
    with pytest.raises(Refused) as refused:
        decide(ws, team.alice, pid, Decision.APPROVE, "")
    assert "alice requested this change and cannot approve or reject it" in refused.value.reasons
    assert trail(ws, proposal_id=pid) == [("alice", "approve.refused")]  # the refusal is in the trail


def test_requester_who_is_an_approver_still_cannot_approve(ws: Workspace, team: Team) -> None:
    pid = proposed(ws, team.bob)
    with pytest.raises(Refused, match="bob requested this change"):
        decide(ws, team.bob, pid, Decision.APPROVE, "")
    approved = decide(ws, team.carol, pid, Decision.APPROVE, "")
    [approval] = approved.current_approvals
    assert (approval.principal.name, approval.head_sha, dict(approval.digests)) == (
        "carol", "head-1", {"app-staging": "sha256:plan1"})
    assert trail(ws, proposal_id=pid) == [("bob", "approve.refused"), ("carol", "approval")]


def test_agent_can_never_approve_or_reject(ws: Workspace, team: Team) -> None:
    pid = proposed(ws, team.alice, proposer=team.agent)
    for decision in Decision:
        with pytest.raises(Refused, match="infra-agent is an agent; agents can never approve or reject"):
            decide(ws, team.agent, pid, decision, "x")
    assert get_proposal(ws, pid).decisions == []


def test_approver_outside_the_stacks_groups_is_refused(ws: Workspace, team: Team) -> None:
    pid = proposed(ws, team.alice)
    with pytest.raises(Refused, match="erin is not in an approver group of stack app-staging"):
        decide(ws, team.erin, pid, Decision.APPROVE, "")
    with pytest.raises(Refused, match="dana does not have the approver role"):
        decide(ws, team.dana, pid, Decision.APPROVE, "")


def test_a_rejection_needs_a_reason_and_stands_until_withdrawn(ws: Workspace, team: Team) -> None:
    pid = proposed(ws, team.alice)
    with pytest.raises(InputError, match="a rejection needs a reason"):
        decide(ws, team.carol, pid, Decision.REJECT, " ")
    assert decide(ws, team.carol, pid, Decision.REJECT, "wait for the freeze").current_rejection is not None
    withdrawn = withdraw_decisions(ws, GATEWAY, team.carol, pid, "review dismissed")
    assert withdrawn.current_rejection is None  # kept in the trail and the records, no longer counting
    with ws.store.session(readonly=True) as session:
        [event] = session.audit.events(kind="decision.withdrawn")
    assert event.payload["by"] == "carol" and event.payload["withdrawn"][0]["decision"] == "reject"


def test_abandoning_is_a_recorded_transition_and_only_once(ws: Workspace, team: Team) -> None:
    pid = proposed(ws, team.alice)
    with pytest.raises(InputError, match="say why the proposal is abandoned"):
        abandon_proposal(ws, team.alice, pid, "")
    assert abandon_proposal(ws, team.alice, pid, "not needed").status == ProposalStatus.ABANDONED
    with ws.store.session(readonly=True) as session:
        [event] = session.audit.events(proposal_id=pid)
    assert (event.kind, dict(event.payload)) == (
        "proposal.abandon", {"from": "open", "to": "abandoned", "reason": "not needed"})
    with pytest.raises(Refused, match="abandoned; `abandon` is not possible from there"):
        abandon_proposal(ws, team.alice, pid, "again")
    assert len(trail(ws, proposal_id=pid)) == 1  # the refused second move wrote nothing


# Break-glass windows (the rules of test_day_two.py's stories, with a clock that moves instead of sleeps)

def breakable(codify_within: str = "1h") -> Workspace:
    return fake_workspace(SAMPLE_GATEWAY_YAML + f"\nbreak_glass:\n  groups: [oncall]\n  codify_within: {codify_within}\n")


def test_only_people_of_the_break_glass_group_open_a_window_and_one_at_a_time() -> None:
    ws = breakable()
    team = Team(ws)
    with pytest.raises(Refused, match="alice is not in a break-glass group"):
        open_break_glass(ws, team.alice, "app-staging", "incident 7", timedelta(hours=2))
    with pytest.raises(Refused, match="only people may break the glass"):
        open_break_glass(ws, team.agent, "app-staging", "incident 7", timedelta(hours=2))
    window = open_break_glass(ws, team.olga, "app-staging", "incident 7", timedelta(hours=2))
    assert window.opened_at is not None  # app-staging protects nothing: no second person needed
    with pytest.raises(Refused, match="already has a break-glass window open"):
        open_break_glass(ws, team.paul, "app-staging", "incident 7 again", timedelta(hours=1))
    assert trail(ws, kind="break_glass.refused") == [("alice", "break_glass.refused"),
                                                      ("infra-agent", "break_glass.refused"),
                                                      ("paul", "break_glass.refused")]


def test_a_protected_stacks_window_opens_when_a_second_person_confirms_it() -> None:
    ws = breakable()
    team = Team(ws)
    window = open_break_glass(ws, team.olga, "app-prod", "incident 8: lb", timedelta(hours=1))
    assert window.opened_at is None
    with pytest.raises(Refused, match="olga asked for this window; a second person confirms it"):
        confirm_break_glass(ws, team.olga, window.id)
    with pytest.raises(Refused, match="bob is not in a break-glass group"):
        confirm_break_glass(ws, team.bob, window.id)
    confirmed = confirm_break_glass(ws, team.paul, window.id)
    assert confirmed.opened_at == ws.clock.now() and confirmed.confirmed_by == "paul"
    with pytest.raises(Refused, match="not waiting for a confirmation"):
        confirm_break_glass(ws, team.paul, window.id)
    assert [k for _, k in trail(ws, stack="app-prod")] == ["break_glass.requested", "break_glass.opened"]


def test_a_window_whose_drift_is_gone_settles_once_a_check_has_looked() -> None:
    ws = breakable()
    team = Team(ws)
    window = open_break_glass(ws, team.olga, "app-staging", "incident 9", timedelta(hours=1))
    assert isinstance(ws.clock, FakeClock)
    ws.clock.advance(3600)  # the window ran out
    with ws.store.session() as session:  # a worker's drift check after it found nothing
        session.main.set_marker(CHECKED + "app-staging", ws.clock.now().isoformat())
    assert sweep_break_glass(ws) == [f"window {window.id} settled"]
    assert sweep_break_glass(ws) == []  # once in the trail
    assert overdue_windows(ws) == []


def test_drift_not_codified_in_time_is_flagged_once_and_acknowledged_by_another_person() -> None:
    ws = breakable("1s")
    team = Team(ws)
    window = open_break_glass(ws, team.olga, "app-prod", "incident 8", timedelta(hours=1))
    confirm_break_glass(ws, team.paul, window.id)
    with ws.store.session() as session:  # what the window changed, as a check records it
        session.day_two.add_drift_record("app-prod", [], True, window.id)
    with pytest.raises(Refused, match="bob may not close break-glass window"):
        close_break_glass(ws, team.bob, window.id, "over")
    with ws.store.session() as session:
        session.day_two.close_break_glass(window.id, ws.clock.now())  # closed, its drift already recorded
        session.main.set_marker(CHECKED + "app-prod", ws.clock.now().isoformat())
    with pytest.raises(Refused, match="is closed, not overdue|not overdue"):
        acknowledge_break_glass(ws, team.paul, window.id, "seen")
    assert isinstance(ws.clock, FakeClock)
    ws.clock.advance(1.5)  # past the codify deadline
    assert sweep_break_glass(ws) == [f"window {window.id} overdue"]
    assert sweep_break_glass(ws) == []  # flagged once
    assert [w.id for w in overdue_windows(ws)] == [window.id]
    with ws.store.session(readonly=True) as session:
        [flag] = session.audit.events(kind="break_glass.overdue")
    assert flag.stacks == ("app-prod",) and flag.payload["drift_record"] == 1
    with pytest.raises(InputError, match="say what is being done"):
        acknowledge_break_glass(ws, team.paul, window.id, " ")
    with pytest.raises(Refused, match="bob is not in a break-glass group"):
        acknowledge_break_glass(ws, team.bob, window.id, "seen")
    with pytest.raises(Refused, match="olga broke the glass of window .*; another person"):
        acknowledge_break_glass(ws, team.olga, window.id, "meh")
    assert acknowledge_break_glass(ws, team.paul, window.id, "codify ticket OPS-12").acknowledged_by == "paul"
    assert overdue_windows(ws) == []


# What stands before an apply (from test_change_path.py and test_policy.py): the facts every view and the runner
# gather, read by the apply rule; the runner refusing with exactly these is test_apply_blockers.py's, on a workspace.

def blockers(ws: Workspace, pid: int, actor: Principal) -> list[str]:
    """What the apply rule says stands before `actor` applying the proposal now (the plans and merge aside)."""
    return apply_blockers(gather_apply_facts(ws, get_proposal(ws, pid), actor, check_plans=False))


def test_an_agent_can_never_apply(ws: Workspace, team: Team) -> None:
    pid = proposed(ws, team.alice, proposer=team.agent)
    decide(ws, team.bob, pid, Decision.APPROVE, "")
    with pytest.raises(Refused, match="agents can never apply"):
        apply_proposal(ws, team.agent, pid)
    assert get_proposal(ws, pid).status == ProposalStatus.OPEN  # refused before any lock or plan
    assert trail(ws, proposal_id=pid) == [("bob", "approval"), ("infra-agent", "apply.refused")]


def test_one_rejection_stands_before_the_apply_until_a_new_commit(ws: Workspace, team: Team) -> None:
    pid = proposed(ws, team.alice)
    decide(ws, team.bob, pid, Decision.APPROVE, "ok")
    decide(ws, team.carol, pid, Decision.REJECT, "wait for the freeze to end")
    assert "rejected by carol: wait for the freeze to end" in blockers(ws, pid, team.alice)
    with ws.store.session() as session:  # a new commit, planned (what a sync after the push leaves)
        session.proposals.update_head(pid, "head-2", ["app-staging"], ["stacks/app-staging/main.tf"])
        session.proposals.add_plan(pid, "app-staging", "head-2", "main-1", "sha256:plan2", "{}", 0, "lineage",
                                   PlanSummary(counts={"update": 1}), "preview")
    assert isinstance(ws.repo, FakeDeclarationRepo)
    ws.repo.refs["bigger"] = "head-2"
    assert get_proposal(ws, pid).current_rejection is None
    decide(ws, team.bob, pid, Decision.APPROVE, "ok now")
    assert blockers(ws, pid, team.alice) == []


def test_risk_sets_how_many_approvals_an_apply_waits_for(ws: Workspace, team: Team) -> None:
    high = PlanSummary(counts={"update": 1}, risk=Risk(RiskLevel.HIGH, ("the AMI changes",)))
    pid = proposed(ws, team.alice, summary=high)
    decide(ws, team.bob, pid, Decision.APPROVE, "")
    [waiting] = blockers(ws, pid, team.alice)
    assert "needs 2 approval(s)" in waiting and "(risk high)" in waiting
    decide(ws, team.carol, pid, Decision.APPROVE, "")
    assert blockers(ws, pid, team.alice) == []


PUBLIC_ACL = Finding("s3-public-acl", Severity.DENY, "aws_s3_bucket.open", "the bucket is public", "app-staging")
UNTAGGED = Finding("required-tags", Severity.WARN, "aws_s3_bucket.open", "no owner tag", "app-staging")


def denied(ws: Workspace, team: Team) -> int:
    return proposed(ws, team.alice, summary=PlanSummary(counts={"create": 1}, findings=(PUBLIC_ACL, UNTAGGED)))


def test_a_deny_finding_refuses_approval_until_a_policy_owner_overrides_it(ws: Workspace, team: Team) -> None:
    pid = denied(ws, team)
    key, later = PUBLIC_ACL.key, ws.clock.now() + timedelta(days=1)
    assert [f.key for f in get_proposal(ws, pid).blocking_findings(ws.clock.now())] == [key]  # a warning never blocks
    with pytest.raises(Refused, match=f"policy denies {key}"):
        decide(ws, team.bob, pid, Decision.APPROVE, "")
    with pytest.raises(Refused, match="alice requested or proposed this change and cannot override"):
        override_finding(ws, team.alice, pid, key, "I need it", later)
    with pytest.raises(Refused, match="bob is not a policy owner"):
        override_finding(ws, team.bob, pid, key, "fine", later)
    with pytest.raises(Refused, match="no deny finding 'app-staging:required-tags"):
        override_finding(ws, team.frank, pid, UNTAGGED.key, "a warning", later)
    with pytest.raises(Refused, match="an override needs a reason"):
        override_finding(ws, team.frank, pid, key, " ", later)
    override_finding(ws, team.frank, pid, key, "static website, reviewed", later)
    decide(ws, team.bob, pid, Decision.APPROVE, "")
    assert blockers(ws, pid, team.alice) == []
    with ws.store.session(readonly=True) as session:
        [override] = session.audit.events(proposal_id=pid, kind="policy.override")
    assert (override.actor, override.payload["finding"], override.payload["reason"]) == (
        "frank", key, "static website, reviewed")
    assert [k for _, k in trail(ws, proposal_id=pid)].count("override.refused") == 4


def test_an_expired_override_no_longer_counts(ws: Workspace, team: Team) -> None:
    pid = denied(ws, team)
    now = ws.clock.now()
    with pytest.raises(Refused, match="expiry must be in the future"):
        override_finding(ws, team.frank, pid, PUBLIC_ACL.key, "x", now - timedelta(minutes=1))
    override_finding(ws, team.frank, pid, PUBLIC_ACL.key, "for one hour", now + timedelta(hours=1))
    proposal = get_proposal(ws, pid)
    assert proposal.blocking_findings(now) == []
    assert [f.key for f in proposal.blocking_findings(now + timedelta(hours=2))] == [PUBLIC_ACL.key]


def test_a_push_to_main_holds_applies_on_its_stacks_until_an_approver_acknowledges_it(ws: Workspace,
                                                                                        team: Team) -> None:
    pid, other = proposed(ws, team.alice), proposed(ws, team.alice, stack="data")
    decide(ws, team.bob, pid, Decision.APPROVE, "")
    with ws.store.session() as session:  # what watching main records of a commit pushed there by hand
        session.main.add_push("0123456789abcdef", ["app-staging"], ["stacks/app-staging/main.tf"], "mallory")
    [held] = blockers(ws, pid, team.alice)
    assert held.startswith("commit 0123456789ab by mallory was pushed to main outside the gateway and changes stack(s) "
                           "app-staging") and "gateway main acknowledge 0123456789ab" in held
    assert not any("mallory" in b for b in blockers(ws, other, team.alice))  # only the stacks it changed
    with pytest.raises(Refused, match="only approvers and admins may"):
        acknowledge_push(ws, team.alice, "0123456789ab", "it was a hotfix")
    with pytest.raises(InputError, match="at least 7 characters"):
        acknowledge_push(ws, team.bob, "0123", "kept")
    with pytest.raises(InputError, match="say what was done about it"):
        acknowledge_push(ws, team.bob, "0123456789ab", " ")
    with pytest.raises(NotFound, match="no unacknowledged push to main matches fedcba9"):
        acknowledge_push(ws, team.bob, "fedcba9", "kept")
    acknowledge_push(ws, team.bob, "0123456789ab", "the hotfix is what runs; kept")
    assert blockers(ws, pid, team.alice) == []
    assert trail(ws, kind="main.push_acknowledged") == [("bob", "main.push_acknowledged")]


def test_an_overdue_break_glass_window_holds_applies_on_its_stack_until_acknowledged() -> None:
    ws = breakable("1s")
    team = Team(ws)
    pid = proposed(ws, team.alice, stack="app-prod")
    decide(ws, team.bob, pid, Decision.APPROVE, "ok")
    window = open_break_glass(ws, team.olga, "app-prod", "incident 8: lb", timedelta(hours=1))
    confirm_break_glass(ws, team.paul, window.id)
    with ws.store.session() as session:  # what the window changed, as a check records it; then it is closed
        session.day_two.add_drift_record("app-prod", [], True, window.id)
        session.day_two.close_break_glass(window.id, ws.clock.now())
    assert blockers(ws, pid, team.alice) == []  # closed, its codify deadline not passed
    assert isinstance(ws.clock, FakeClock)
    ws.clock.advance(1.5)
    [held] = blockers(ws, pid, team.alice)
    assert held.startswith(f"stack app-prod: break-glass window {window.id} (incident 8: lb) ended at ")
    assert f"`gateway break-glass acknowledge {window.id} -m why`" in held
    acknowledge_break_glass(ws, team.paul, window.id, "codify ticket OPS-12")
    assert blockers(ws, pid, team.alice) == []


# The notifications outbox (from test_notifications.py, whose stories deliver to real receivers): which trail events
# tell what to which channels, once, and what an event that cannot be told leaves.

NOTIFYING = SAMPLE_GATEWAY_YAML + """
notifications:
  channels:
    ops-slack: {slack: {}}
    platform-mail: {email: {to: [platform@example.com]}}
    audit-hook: {webhook: {}}
    app-hook: {webhook: {}}
  routes:
    - groups: [platform]
      channels: [ops-slack, platform-mail, audit-hook]
    - groups: [app]
      events: [applied]
      channels: [app-hook, audit-hook]
"""


def notifying() -> Workspace:
    ws = fake_workspace(NOTIFYING)
    assert queue_notifications(ws) == []  # the first pass places the outbox at the trail's head: it tells from now
    return ws


def queued(ws: Workspace, status: NotificationStatus | None = None) -> list[tuple[str, str, str]]:
    """(event, channel, title) of each notification, oldest first."""
    with ws.store.session(readonly=True) as session:
        return [(n.event.value, n.channel.name, n.notice.title) for n in reversed(session.notifications.list(status))]


def test_a_plan_wanting_approvers_is_told_once_to_each_channel_routed_to_them_then_a_rejection() -> None:
    ws = notifying()
    team = Team(ws)
    pid = proposed(ws, team.alice)
    with ws.store.session() as session:  # what planning writes, twice (a re-plan to the same digests)
        session.audit.append(GATEWAY, "plan", {"stack": "app-staging"}, pid, ["app-staging"])
        session.audit.append(GATEWAY, "plan", {"stack": "app-staging"}, pid, ["app-staging"])
    ids = queue_notifications(ws)
    wanted = f"Approval wanted: proposal {pid}, more memory"
    assert queued(ws) == [("approval_wanted", c, wanted) for c in ("ops-slack", "platform-mail", "audit-hook")]
    with ws.store.session(readonly=True) as session:  # each with its delivery job; app-hook is for applies only
        hook = session.notifications.get(ids[-1])
        assert [j["kind"] for j in ws.store.tables.jobs.values()] == [JobKind.NOTIFY] * 3  # type: ignore[attr-defined]
    assert hook.job_id is not None and hook.notice.link == f"http://127.0.0.1:8000/proposals/{pid}"
    assert ("Approvers", "groups app, platform") in hook.notice.facts
    decide(ws, team.carol, pid, Decision.REJECT, "wait for the freeze")
    with ws.store.session() as session:  # planned again: a rejected proposal wants no approvers
        session.audit.append(GATEWAY, "plan", {"stack": "app-staging"}, pid, ["app-staging"])
    assert len(queue_notifications(ws)) == 3 and queue_notifications(ws) == []
    assert queued(ws)[3:] == [("rejected", c, f"Rejected by carol: proposal {pid}, more memory")
                              for c in ("ops-slack", "platform-mail", "audit-hook")]


def test_an_event_that_cannot_be_told_is_skipped_once_per_channel_and_holds_back_no_other() -> None:
    ws = notifying()
    team = Team(ws)
    with ws.store.session() as session:  # a trail event the notices cannot read: it names a proposal that is not
        unreadable = session.audit.append(GATEWAY, "breaker.tripped", {"agent": "agent-x", "reason": "too many",
                                                                       "proposal": 999})
    pid = proposed(ws, team.alice)
    with ws.store.session() as session:
        session.audit.append(GATEWAY, "plan", {"stack": "app-staging"}, pid, ["app-staging"])
    assert len(queue_notifications(ws)) == 3  # the proposal's, told
    with ws.store.session(readonly=True) as session:
        skipped = session.audit.events(kind="notification.skipped")
        rows = session.notifications.list(NotificationStatus.SKIPPED)
    # the channels a route sends breaker_tripped to (whom it concerns could not be read): each once
    assert sorted(e.payload["target"] for e in skipped) == ["audit-hook", "ops-slack", "platform-mail"]  # not app-hook
    assert all(e.payload["trail_event"] == unreadable.seq and e.payload["trail_kind"] == "breaker.tripped"
               and "no proposal 999" in e.payload["reason"] for e in skipped)
    assert sorted(n.channel.name for n in rows) == sorted(e.payload["target"] for e in skipped)
    assert all(n.job_id is None and n.attempts == 0 for n in rows)
    with ws.store.session() as session:  # a pass over the whole trail again records no new skip
        session.main.set_marker(OUTBOX_MARKER, "0")
    assert queue_notifications(ws) == []
    with ws.store.session(readonly=True) as session:
        assert len(session.audit.events(kind="notification.skipped")) == 3


def test_a_skip_is_recorded_with_the_outbox_move_or_not_at_all() -> None:
    """Of two passes over one batch, one moves the place: the other records no skip (nothing rolled back is told)."""
    ws = notifying()
    with ws.store.session() as session:
        session.audit.append(GATEWAY, "breaker.tripped", {"agent": "agent-x", "reason": "r", "proposal": 999})
        place = session.main.marker(OUTBOX_MARKER)
    with ws.store.session() as session:  # another worker took the batch a moment ago
        head = session.audit.chain_head()
        assert head is not None
        assert session.main.swap_marker(OUTBOX_MARKER, place, str(head[0]))
    assert queue_notifications(ws) == []
    with ws.store.session(readonly=True) as session:
        assert session.audit.events(kind="notification.skipped") == []
        assert session.notifications.list(NotificationStatus.SKIPPED) == []


def test_destroying_a_protected_resource_waits_for_a_second_approver(ws: Workspace, team: Team) -> None:
    replaced = PlanSummary(counts={"replace": 1}, destructive=("aws_lb.web",))
    pid = proposed(ws, team.alice, stack="app-prod", summary=replaced)
    decide(ws, team.bob, pid, Decision.APPROVE, "")
    [waiting] = blockers(ws, pid, team.alice)
    assert "needs 2 approval(s)" in waiting and "protected app-prod:aws_lb.web" in waiting
    decide(ws, team.carol, pid, Decision.APPROVE, "")
    assert blockers(ws, pid, team.alice) == []


def test_a_decision_names_the_commit_its_maker_saw(ws: Workspace, team: Team) -> None:
    pid = proposed(ws, team.alice)
    with pytest.raises(Refused, match="the branch moved to .* since you looked at"):
        decide(ws, team.bob, pid, Decision.APPROVE, "", seen_sha="head-0")
    assert get_proposal(ws, pid).current_approvals == []
    approved = decide(ws, team.bob, pid, Decision.APPROVE, "", seen_sha="head-1")
    assert [a.head_sha for a in approved.current_approvals] == ["head-1"]
    assert trail(ws, proposal_id=pid) == [("bob", "approve.refused"), ("bob", "approval")]


# Reading the trail (from test_audit.py, which ran a whole change on both databases for these)

def decided(ws: Workspace, team: Team) -> int:
    """A proposal whose requester's approval was refused and an approver's taken: a trail to read."""
    pid = proposed(ws, team.alice)
    with pytest.raises(Refused):
        decide(ws, team.alice, pid, Decision.APPROVE, "")
    decide(ws, team.bob, pid, Decision.APPROVE, "looks right")
    return pid


def test_only_auditors_and_admins_read_the_trail(ws: Workspace, team: Team) -> None:
    decided(ws, team)
    with pytest.raises(Refused, match="bob is not an auditor"):
        audit_service.list_events(ws, team.bob)
    assert [e.kind for e in audit_service.list_events(ws, team.dana)] == ["approve.refused", "approval"]


def test_export_in_jsonl_and_csv_carries_the_hashes(ws: Workspace, team: Team) -> None:
    events = audit_service.list_events(ws, team.dana, proposal_id=decided(ws, team))
    lines = audit_service.export_events(events, "jsonl").splitlines()
    assert [json.loads(line)["hash"] for line in lines] == [e.hash for e in events]
    rows = list(csv.DictReader(io.StringIO(audit_service.export_events(events, "csv"))))
    assert [r["kind"] for r in rows] == [e.kind for e in events] == ["approve.refused", "approval"]
    assert rows[0]["prev_hash"] and rows[0]["hash"].startswith("sha256:")
    with pytest.raises(InputError, match="unknown export format 'xml'"):
        audit_service.export_events(events, "xml")
