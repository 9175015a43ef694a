"""The rulebook as tables: who may do what, the approval rules, and the lifecycle.

Every case is plain dataclasses from `gateway.domain` (no git repository, no database, no engine), and
every assertion is on what a person is told: the refusal sentences, or that nothing stands in the way.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

import gateway.domain.permissions as permissions
from gateway.domain.approvals import (
    apply_refusals,
    approval_shortfall,
    auto_revert_refusals,
    decision_refusals,
    override_refusals,
    required_approvals,
)
from gateway.domain.errors import Refused
from gateway.domain.lifecycle import TRANSITIONS, ProposalStatus, Transition, next_status
from gateway.domain.permissions import RULES, Action, Agents, OwnChange, may, refusals, request_refusals, require
from gateway.domain.policy import Finding, Override, PolicySettings, Severity
from gateway.domain.principals import Principal, PrincipalKind, Role
from gateway.domain.proposal import Decision, DecisionRecord, Proposal, ProposalKind, StackPlan
from gateway.domain.repo_settings import RepoSettings, StackSettings
from gateway.domain.repositories import Repository
from gateway.domain.risk import RiskLevel

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HEAD, OLD_HEAD, BASE = "a" * 40, "9" * 40, "b" * 40
DIGEST, OLD_DIGEST = "sha256:" + "1" * 64, "sha256:" + "0" * 64


def principal(name: str, *roles: Role, groups: frozenset[str] = frozenset({"platform"}),
              kind: PrincipalKind = PrincipalKind.PERSON, disabled: bool = False) -> Principal:
    return Principal(f"id-{name}", name, kind, frozenset(roles), groups, disabled=disabled)


def agent(name: str, *roles: Role) -> Principal:
    return principal(name, *roles, groups=frozenset(), kind=PrincipalKind.AGENT)


ALICE = principal("alice", Role.REQUESTER, groups=frozenset({"app"}))  # the requester of the change below
BOB = principal("bob", Role.APPROVER)
CAROL = principal("carol", Role.APPROVER)
ERIN = principal("erin", Role.APPROVER, groups=frozenset({"data"}))
PLAN = StackPlan(1, "web", HEAD, DIGEST, 3, {"update": 1}, (), changed=("aws_instance.web",))
SETTINGS = RepoSettings(stacks={"web": StackSettings("web", "stacks/web", frozenset({"platform"}),
                                                     protected=frozenset({"aws_db_instance.main"}))},
                        config_approver_groups=frozenset({"admins"}),
                        policy=PolicySettings(owner_groups=frozenset({"policy-owners"})))
DENY = Finding("no-public-bucket", Severity.DENY, "aws_s3_bucket.logs", "the bucket is public", "web")


def decision(by: Principal, kind: Decision = Decision.APPROVE, head: str = HEAD, digest: str = DIGEST,
             comment: str = "ok", record: int = 1) -> DecisionRecord:
    return DecisionRecord(record, by, kind, head, {"web": digest}, comment, "api-token", T0)


def change(*decisions: DecisionRecord, status: ProposalStatus = ProposalStatus.OPEN, plan: StackPlan = PLAN,
           proposer: Principal = ALICE, **fields: object) -> Proposal:
    proposal = Proposal(7, "bigger", BASE, HEAD, ALICE, proposer, "more memory", ("web",), status, {"web": plan},
                        list(decisions), changed_paths=("stacks/web/main.tf",))
    return replace(proposal, **fields) if fields else proposal


# --- permissions: the table ------------------------------------------------------------------

CAST = {  # nobody here is the requester or proposer of the change the own-change rules look at
    "requester": principal("rita", Role.REQUESTER),
    "approver": principal("bob", Role.APPROVER),
    "admin": principal("adam", Role.ADMIN),
    "auditor": principal("dana", Role.AUDITOR),
    "agent": agent("infra-agent", Role.REQUESTER),
    "auditing agent": agent("audit-agent", Role.AUDITOR),
    "disabled approver": principal("dora", Role.APPROVER, disabled=True),
    "system": principal("gateway", Role.REQUESTER, kind=PrincipalKind.SYSTEM),
}
CHANGERS = {"requester", "approver", "admin", "system"}
PEOPLE = {"requester", "approver", "admin", "auditor", "system"}
ALLOWED: dict[Action, set[str]] = {
    Action.REQUEST: CHANGERS,
    Action.PROPOSE: CHANGERS | {"agent", "auditing agent"},
    Action.PLAN: CHANGERS | {"agent"},
    Action.CHECK_DRIFT: CHANGERS,
    Action.DECIDE: {"approver"},
    Action.OVERRIDE: PEOPLE,
    Action.APPLY: CHANGERS,
    Action.MERGE: {"approver", "admin"},
    Action.ACKNOWLEDGE_PUSH: {"approver", "admin"},
    Action.ABANDON: {"approver", "admin"},
    Action.OPEN_BREAK_GLASS: PEOPLE,
    Action.CONFIRM_BREAK_GLASS: PEOPLE,
    Action.ACKNOWLEDGE_BREAK_GLASS: CHANGERS,
    Action.RESET_BREAKER: PEOPLE,
    Action.OPEN_BREAKER: {"admin"},
    Action.ADD_USERS: {"admin"},
    Action.MANAGE_REPOSITORIES: {"admin"},
    Action.CHANGE_USERS: {"admin"},
    Action.LINK_ACCOUNTS: {"admin"},
    Action.EDIT_SIMULATOR: {"admin"},
    Action.READ_TRAIL: {"admin", "auditor", "auditing agent"},
    Action.SIGN_IN: PEOPLE,
}
OTHER_CHANGE = change(proposer=principal("pat", Role.REQUESTER))  # rita, bob... are neither of its people


def test_every_action_has_a_row_here_and_in_the_table() -> None:
    assert set(ALLOWED) == set(Action) == set(RULES)


@pytest.mark.parametrize("action", list(Action))
@pytest.mark.parametrize("who", list(CAST))
def test_who_may_take_each_action(action: Action, who: str) -> None:
    actor = CAST[who]
    reasons = refusals(actor, action, OTHER_CHANGE)
    assert (not reasons) == (who in ALLOWED[action]), reasons
    assert may(actor, action, OTHER_CHANGE) == (not reasons)
    assert all(reason.startswith(actor.name) for reason in reasons), reasons  # each says whom it is about
    if actor.disabled:
        assert reasons[0] == "dora is disabled"


@pytest.mark.parametrize(("actor", "action", "expected"), [
    (CAST["agent"], Action.APPLY, ["infra-agent is an agent; agents can never apply a change"]),
    (CAST["agent"], Action.DECIDE, ["infra-agent is an agent; agents can never approve or reject a change"]),
    (CAST["agent"], Action.OVERRIDE, ["infra-agent is an agent; agents can never override a policy finding"]),
    (CAST["agent"], Action.MERGE, ["infra-agent is an agent; agents can never merge or acknowledge a change"]),
    (CAST["agent"], Action.REQUEST, ["infra-agent is an agent; the requester of a change must be a person"]),
    (CAST["agent"], Action.CHECK_DRIFT, ["infra-agent may not start a drift check"]),
    (CAST["agent"], Action.OPEN_BREAK_GLASS, ["infra-agent is an agent; only people may break the glass"]),
    (CAST["agent"], Action.RESET_BREAKER, ["infra-agent is an agent; agents never reset the breaker"]),
    (CAST["agent"], Action.SIGN_IN, ["infra-agent is an agent; agents cannot sign in to the review pages"]),
    (CAST["agent"], Action.CHANGE_USERS, ["infra-agent is not an admin; only admins change users"]),
    (CAST["auditor"], Action.APPLY, ["dana has no role that may start an apply"]),
    (CAST["auditor"], Action.PLAN, ["dana has no role that may start a plan"]),
    (CAST["auditor"], Action.REQUEST, ["dana has no role that may request changes"]),
    (CAST["auditor"], Action.PROPOSE, ["dana has no role that may propose changes"]),
    (CAST["auditor"], Action.DECIDE, ["dana does not have the approver role"]),
    (CAST["requester"], Action.MERGE, ["rita may not merge or acknowledge: only approvers and admins may"]),
    (CAST["requester"], Action.ACKNOWLEDGE_PUSH,
     ["rita may not acknowledge a push to main: only approvers and admins may"]),
    (CAST["requester"], Action.ABANDON,
     ["rita may not abandon proposal 7: only its requester, an approver or an admin may"]),
    (CAST["requester"], Action.ADD_USERS, ["rita is not an admin; only admins add users"]),
    (CAST["requester"], Action.READ_TRAIL, ["rita is not an auditor; the audit trail is for auditors and admins"]),
    (CAST["disabled approver"], Action.DECIDE, ["dora is disabled"]),
    (replace(CAST["auditor"], disabled=True), Action.APPLY, ["dana is disabled", "dana has no role that may start an apply"]),
    (replace(CAST["agent"], disabled=True), Action.PROPOSE, ["infra-agent is disabled"]),
])
def test_each_refusal_says_why(actor: Principal, action: Action, expected: list[str]) -> None:
    assert refusals(actor, action, OTHER_CHANGE) == expected


@pytest.mark.parametrize(("actor", "action", "proposal", "expected"), [
    (ALICE, Action.DECIDE, change(), ["alice requested this change and cannot approve or reject it",
                                      "alice does not have the approver role"]),
    (replace(ALICE, roles=frozenset({Role.APPROVER})), Action.DECIDE, change(),
     ["alice requested this change and cannot approve or reject it"]),  # once, though she proposed it too
    (BOB, Action.DECIDE, change(proposer=BOB), ["bob proposed this change and cannot approve or reject it"]),
    (BOB, Action.OVERRIDE, change(proposer=BOB),
     ["bob requested or proposed this change and cannot override its findings"]),
    (ALICE, Action.OVERRIDE, change(), ["alice requested or proposed this change and cannot override its findings"]),
    (ALICE, Action.ABANDON, change(), []),  # its requester, though no approver
    (BOB, Action.ABANDON, change(proposer=BOB), []),  # an approver
    (principal("pat", Role.REQUESTER), Action.ABANDON, change(proposer=principal("pat", Role.REQUESTER)),
     ["pat may not abandon proposal 7: only its requester, an approver or an admin may"]),  # proposing is not enough
    (ALICE, Action.APPLY, change(), []),  # the requester applies her own approved change
])
def test_the_change_s_own_people(actor: Principal, action: Action, proposal: Proposal, expected: list[str]) -> None:
    assert refusals(actor, action, proposal) == expected


def test_require_refuses_with_the_same_sentences() -> None:
    with pytest.raises(Refused) as refused:
        require(CAST["auditor"], Action.APPLY)
    assert refused.value.reasons == ["dana has no role that may start an apply"]
    require(CAST["requester"], Action.APPLY)  # allowed: nothing raised


DATA = Repository("data", T0, "admin")


@pytest.mark.parametrize(("person", "repository", "expected"), [
    (CAST["requester"], DATA, []),  # people are the gateway's: whoever may request may in every repository
    (CAST["requester"], Repository("declarations", T0, "gateway"), []),
    (CAST["requester"], replace(DATA, removed_at=T0, removed_by="admin"),
     ["repository data was removed from the gateway by admin"]),
    (CAST["auditor"], DATA, ["dana has no role that may request changes"]),
    (replace(CAST["requester"], disabled=True), replace(DATA, removed_at=T0, removed_by="admin"),
     ["rita is disabled", "repository data was removed from the gateway by admin"]),
])
def test_in_which_repositories_a_person_may_request(person: Principal, repository: Repository,
                                                    expected: list[str]) -> None:
    assert request_refusals(person, repository) == expected


def test_a_rule_about_the_change_s_people_needs_the_change() -> None:
    with pytest.raises(ValueError, match="pass the change"):
        refusals(BOB, Action.DECIDE)


def test_the_table_in_the_docstring_is_the_table() -> None:
    """The module's drawn table is what a reader trusts; it must say what RULES enforces."""
    assert permissions.__doc__ is not None
    rows = {}
    for line in permissions.__doc__.splitlines():
        cells = [c.strip() for c in line.strip().split("  ") if c.strip()]
        if cells and cells[0] in {a.value for a in Action}:
            rows[Action(cells[0])] = cells[1:]
    assert set(rows) == set(Action)
    for action, (roles, agents, own) in rows.items():
        rule = RULES[action]
        named = frozenset(Role) if roles == "any" else frozenset(Role(r) for r in roles.split(", "))
        assert (named, Agents(agents), OwnChange(own.split(" ")[0])) == (rule.roles, rule.agents, rule.own_change), action


# --- approvals: who may decide ---------------------------------------------------------------

@pytest.mark.parametrize(("case", "actor", "proposal", "kwargs", "expected"), [
    ("an approver of the stack", BOB, change(), {}, []),
    ("an agent", agent("editor-agent", Role.REQUESTER), change(), {},
     ["editor-agent is an agent; agents can never approve or reject a change"]),
    ("the requester", ALICE, change(), {},
     ["alice requested this change and cannot approve or reject it", "alice does not have the approver role",
      "alice is not in an approver group of stack web (allowed: platform)"]),
    ("the proposer", BOB, change(proposer=BOB), {}, ["bob proposed this change and cannot approve or reject it"]),
    ("no approver role", principal("dana", Role.AUDITOR), change(), {}, ["dana does not have the approver role"]),
    ("another team's approver", ERIN, change(), {},
     ["erin is not in an approver group of stack web (allowed: platform)"]),
    ("a protected path", BOB, change(changed_paths=("stacks/web/main.tf", "gateway.yaml")), {},
     ["bob is not in a group allowed to approve changes to protected paths (gateway.yaml; allowed: admins)"]),
    ("a protected path, by a config approver", principal("bob", Role.APPROVER, groups=frozenset({"platform", "admins"})),
     change(changed_paths=("gateway.yaml",)), {}, []),
    ("a stale head sha", BOB, change(), {"seen_sha": OLD_HEAD},
     [f"the branch moved to {HEAD[:12]} since you looked at {OLD_HEAD[:12]}; review the new plan"]),
    ("the head it saw", BOB, change(), {"seen_sha": HEAD, "seen_digests": {"web": DIGEST}}, []),
    ("a stale digest", BOB, change(), {"seen_digests": {"web": OLD_DIGEST}},
     ["the plan changed since you looked at it (re-planned at the same commit); review the new plan"]),
    ("approved already", BOB, change(decision(BOB)), {}, ["bob already approved this commit and plan"]),
    ("approved an older commit", BOB, change(decision(BOB, head=OLD_HEAD)), {}, []),
    ("a policy deny blocks an approval", BOB, change(plan=replace(PLAN, findings=(DENY,))), {},
     ["policy denies web:no-public-bucket:aws_s3_bucket.logs: the bucket is public (a policy owner may override it)"]),
    ("a policy deny does not block a rejection", BOB, change(plan=replace(PLAN, findings=(DENY,))),
     {"decision": Decision.REJECT}, []),
    ("an overridden deny", BOB, change(plan=replace(PLAN, findings=(DENY,)),
                                       overrides=[Override(DENY.key, "olivia", "accepted", T0 + timedelta(days=1))]),
     {}, []),
    ("an applied change", BOB, change(status=ProposalStatus.APPLIED), {},
     ["proposal 7 is applied; it takes no more decisions"]),
    ("a failed change still takes decisions", BOB, change(status=ProposalStatus.FAILED), {}, []),
])
def test_who_may_decide(case: str, actor: Principal, proposal: Proposal, kwargs: dict, expected: list[str]) -> None:
    assert decision_refusals(actor, proposal, SETTINGS, T0, **kwargs) == expected, case


# --- approvals: how many, and which count ----------------------------------------------------

NEEDS_TWO = replace(SETTINGS, required_approvals=2)
HIGH_NEEDS_TWO = replace(SETTINGS, risk_approvals={"high": 2})
RISKY = replace(PLAN, risk=RiskLevel.HIGH)
DELETES_DB = replace(PLAN, destructive=("aws_db_instance.main",), counts={"delete": 1})


@pytest.mark.parametrize(("case", "settings", "proposal", "expected"), [
    ("one approval of one", SETTINGS, change(decision(BOB)), []),
    ("none", SETTINGS, change(), ["needs 1 approval(s) of the current commit and plan from different approvers, has 0"]),
    ("a quorum of two, one given", NEEDS_TWO, change(decision(BOB)),
     ["needs 2 approval(s) of the current commit and plan from different approvers, has 1"]),
    ("a quorum of two, met", NEEDS_TWO, change(decision(BOB), decision(CAROL, record=2)), []),
    ("one person twice is one approver", NEEDS_TWO, change(decision(BOB), decision(BOB, record=2)),
     ["needs 2 approval(s) of the current commit and plan from different approvers, has 1"]),
    ("a high-risk plan needs its tier", HIGH_NEEDS_TWO, change(decision(BOB), plan=RISKY),
     ["needs 2 approval(s) of the current commit and plan from different approvers, has 1 (risk high)"]),
    ("a low-risk plan does not", HIGH_NEEDS_TWO, change(decision(BOB)), []),
    ("deleting a protected resource", SETTINGS, change(decision(BOB), plan=DELETES_DB),
     ["needs 2 approval(s) of the current commit and plan from different approvers, has 1 "
      "(the plan deletes or replaces protected web:aws_db_instance.main)"]),
    ("an approval of an older commit is stale", SETTINGS, change(decision(BOB, head=OLD_HEAD)),
     ["needs 1 approval(s) of the current commit and plan from different approvers, has 0; "
      "1 earlier decision(s) are stale after a new commit or plan"]),
    ("an approval of an older plan is stale", SETTINGS, change(decision(BOB, digest=OLD_DIGEST)),
     ["needs 1 approval(s) of the current commit and plan from different approvers, has 0; "
      "1 earlier decision(s) are stale after a new commit or plan"]),
    ("a disabled approver's approval stops counting", SETTINGS, change(decision(replace(BOB, disabled=True))),
     ["needs 1 approval(s) of the current commit and plan from different approvers, has 0"]),
    ("a withdrawn approval stops counting", SETTINGS,
     change(decision(BOB), decision(BOB, Decision.WITHDRAW, record=2)),
     ["needs 1 approval(s) of the current commit and plan from different approvers, has 0; "
      "1 earlier decision(s) are stale after a new commit or plan"]),
])
def test_how_many_approvals_count(case: str, settings: RepoSettings, proposal: Proposal, expected: list[str]) -> None:
    assert approval_shortfall(proposal, settings) == expected, case


def test_the_strictest_tier_sets_the_quorum() -> None:
    settings = replace(SETTINGS, required_approvals=1, risk_approvals={"high": 3}, protected_required_approvals=2)
    assert required_approvals(change(plan=replace(DELETES_DB, risk=RiskLevel.HIGH)), settings) == 3
    assert required_approvals(change(plan=DELETES_DB), settings) == 2
    assert required_approvals(change(), settings) == 1


@pytest.mark.parametrize(("case", "actor", "proposal", "expected"), [
    ("approved, by its requester", ALICE, change(decision(BOB)), []),
    ("an agent", agent("infra-agent", Role.REQUESTER), change(decision(BOB)),
     ["infra-agent is an agent; agents can never apply a change"]),
    ("an auditor", principal("dana", Role.AUDITOR), change(decision(BOB)), ["dana has no role that may start an apply"]),
    ("rejected", ALICE, change(decision(BOB), decision(CAROL, Decision.REJECT, comment="too big", record=2)),
     ["rejected by carol: too big"]),
    ("a rejection of an older commit is stale", ALICE,
     change(decision(BOB), decision(CAROL, Decision.REJECT, head=OLD_HEAD, comment="too big", record=2)), []),
    ("a rejection stands after a re-plan at the same commit", ALICE,
     change(decision(CAROL, Decision.REJECT, digest=OLD_DIGEST, comment="no")),
     ["rejected by carol: no", "needs 1 approval(s) of the current commit and plan from different approvers, has 0"]),
    ("applying already", ALICE, change(decision(BOB), status=ProposalStatus.APPLYING), ["proposal 7 is applying"]),
    ("a failed apply is retried", ALICE, change(decision(BOB), status=ProposalStatus.FAILED), []),
])
def test_who_may_apply_and_when(case: str, actor: Principal, proposal: Proposal, expected: list[str]) -> None:
    assert apply_refusals(actor, proposal, SETTINGS, T0) == expected, case


OWNER = principal("olivia", Role.APPROVER, groups=frozenset({"policy-owners"}))
WITH_DENY = change(plan=replace(PLAN, findings=(DENY,)))


@pytest.mark.parametrize(("case", "actor", "key", "reason", "expires", "expected"), [
    ("a policy owner", OWNER, DENY.key, "accepted for the demo", T0 + timedelta(days=1), []),
    ("an agent", agent("infra-agent", Role.REQUESTER), DENY.key, "x", T0 + timedelta(days=1),
     ["infra-agent is an agent; agents can never override a policy finding"]),
    ("the requester", replace(ALICE, groups=frozenset({"policy-owners"})), DENY.key, "x", T0 + timedelta(days=1),
     ["alice requested or proposed this change and cannot override its findings"]),
    ("not a policy owner", BOB, DENY.key, "x", T0 + timedelta(days=1),
     ["bob is not a policy owner (groups: policy-owners)"]),
    ("no such deny", OWNER, "web:other:aws_s3_bucket.x", "x", T0 + timedelta(days=1),
     [f"no deny finding 'web:other:aws_s3_bucket.x' on the current plans (deny findings: {DENY.key})"]),
    ("no reason, expired", OWNER, DENY.key, "  ", T0,
     ["an override needs a reason", "an override's expiry must be in the future"]),
])
def test_who_may_override_a_finding(case: str, actor: Principal, key: str, reason: str, expires: datetime,
                                    expected: list[str]) -> None:
    assert override_refusals(actor, WITH_DENY, SETTINGS, key, reason, expires, T0) == expected, case


AUTO = replace(SETTINGS, stacks={"web": replace(SETTINGS.stacks["web"], auto_revert_drift=True)})
DRIFTED = replace(PLAN, drift=("aws_instance.web",))


@pytest.mark.parametrize(("case", "settings", "proposal", "expected"), [
    ("a revert of drift, in place, opted in", AUTO,
     change(plan=DRIFTED, kind=ProposalKind.DRIFT_REVERT, head_sha=BASE, changed_paths=()), []),
    ("an ordinary change", AUTO, change(plan=DRIFTED), ["only a revert of drift is ever applied without approval"]),
    ("a stack that did not opt in", SETTINGS,
     change(plan=DRIFTED, kind=ProposalKind.DRIFT_REVERT, head_sha=BASE, changed_paths=()),
     ["stack web does not set drift.auto_revert"]),
    ("a revert that deletes", AUTO,
     change(plan=replace(DRIFTED, counts={"delete": 1}), kind=ProposalKind.DRIFT_REVERT, head_sha=BASE,
            changed_paths=()),
     ["stack web: the revert would delete, not only update in place"]),
])
def test_when_a_revert_of_drift_needs_nobody(case: str, settings: RepoSettings, proposal: Proposal,
                                             expected: list[str]) -> None:
    assert auto_revert_refusals(proposal, settings) == expected, case
    if not expected:  # and then it needs no approval at all
        assert approval_shortfall(proposal, settings) == []


# --- the lifecycle ---------------------------------------------------------------------------

@pytest.mark.parametrize(("start", "transition"), list(TRANSITIONS))
def test_every_allowed_transition_is_taken(start: ProposalStatus, transition: Transition) -> None:
    proposal = change(status=start)
    assert proposal.take(transition) == TRANSITIONS[(start, transition)] == proposal.status
    assert next_status(start, transition) == TRANSITIONS[(start, transition)]


@pytest.mark.parametrize(("start", "transition", "sentence"), [
    (ProposalStatus.APPLIED, Transition.START_APPLY,
     "proposal 7 is applied; `start_apply` is not possible from there (allowed: nothing: it is final)"),
    (ProposalStatus.ABANDONED, Transition.ABANDON,
     "proposal 7 is abandoned; `abandon` is not possible from there (allowed: nothing: it is final)"),
    (ProposalStatus.OPEN, Transition.FINISH,
     "proposal 7 is open; `finish` is not possible from there (allowed: start_apply, abandon)"),
    (ProposalStatus.UNMERGED, Transition.ABANDON,
     "proposal 7 is unmerged; `abandon` is not possible from there (allowed: merge, acknowledge_merge)"),
    (ProposalStatus.APPLYING, Transition.START_APPLY,
     "proposal 7 is applying; `start_apply` is not possible from there (allowed: finish, fail, interrupt, block_merge)"),
])
def test_a_forbidden_transition_is_refused_and_changes_nothing(start: ProposalStatus, transition: Transition,
                                                               sentence: str) -> None:
    proposal = change(status=start)
    assert next_status(start, transition) is None
    with pytest.raises(Refused) as refused:
        proposal.take(transition)
    assert refused.value.reasons == [sentence]
    assert proposal.status == start
