"""What stands between a proposal and an apply: one rule over typed facts, for the runner and every view.

The runner refuses with exactly these sentences, and the API, the pages, `gateway show` and the pull request
show them, so what a person is told can be applied is what the runner will apply. The facts are gathered by
`services/change/apply_facts.py`; nothing here reads a database, git or GitHub.

    the proposal's status, the actor's role, a rejection       apply_refusals (approvals.py)
    policy denies, missing approvals                             approval_blockers (approvals.py)
    approvals on GitHub / GitLab whose maker left the team       lapsed_github_approvals
    pushes to main outside the gateway                           push_blockers
    break-glass windows past their codify deadline               break_glass_blockers
    drift recorded after the plan (the apply would revert it)    unseen_drift_blockers
    a saved plan that no longer hashes to its digest             altered_plan_blockers
    a branch that is gone, or no longer merges into main         merge_blockers
    remote-state reads and `after:` going round in a circle      order_blockers (the runner reads the merge again)
    the proposal moving while the runner takes it               MOVED_UNDER_LOCKS, replanned_while_checked (runner)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from gateway.domain.approvals import apply_refusals, approval_blockers, approver_groups
from gateway.domain.break_glass import BreakGlassWindow, WindowState
from gateway.domain.drift import DriftRecord
from gateway.domain.errors import ConfigError
from gateway.domain.principals import Principal
from gateway.domain.proposal import DecisionRecord, Proposal
from gateway.domain.repo_settings import RepoSettings

GITHUB_AUTH = ("github-review", "github-comment")  # how a decision made on GitHub was authenticated
GITLAB_AUTH = ("gitlab-approval", "gitlab-note")  # ... and on GitLab
FORGE_AUTH = GITHUB_AUTH + GITLAB_AUTH


@dataclass(frozen=True)
class MainPush:
    """A commit on main that the gateway did not make and no person has acknowledged yet."""

    sha: str
    author: str
    stacks: frozenset[str]  # the stacks it changes


@dataclass(frozen=True)
class TeamCheck:
    """What GitHub said of a person's team membership: asked at apply, or the last check recorded (views)."""

    login: str | None  # the GitHub account linked to the person; None: none is linked any more
    active_groups: frozenset[str]  # the person's groups whose mapped team they are an active member of


@dataclass(frozen=True)
class MergeCheck:
    """Whether the proposal's branch, as it is now, still merges into main as it is now."""

    branch_exists: bool
    conflict: str | None = None  # git's words for why it does not merge cleanly; None: it does


@dataclass(frozen=True)
class ApplyFacts:
    """Everything the apply rule looks at, gathered once, at one moment."""

    proposal: Proposal
    settings: RepoSettings  # main's gateway.yaml
    now: datetime
    actor: Principal | None = None  # who would apply; None: whoever may (the pull request, the proposal list)
    pushes: tuple[MainPush, ...] = ()  # every unacknowledged push to main (the rule picks the proposal's stacks)
    windows: tuple[BreakGlassWindow, ...] = ()  # break-glass windows on the proposal's stacks
    team_checks: Mapping[str, TeamCheck] = field(default_factory=dict)  # principal id -> check of a GitHub approver
    drift: tuple[DriftRecord, ...] = ()  # open drift records on the proposal's stacks
    # The plans and the branch as they are now; None: not looked at (a list's row: the proposal's own page, the API,
    # `gateway show`, the pull request and the runner look).
    saved_digests: Mapping[str, str] | None = None  # stack -> the digest its saved plan hashes to now
    merge: MergeCheck | None = None
    state_reads: Mapping[str, Mapping[str, str]] | None = None  # stack -> the proposal's stacks whose state it reads


def apply_blockers(facts: ApplyFacts) -> list[str]:
    """Why `facts.actor` may not apply the proposal now (empty: go). The runner refuses with exactly these."""
    if facts.actor is None:
        return standing_blockers(facts)
    own = apply_refusals(facts.actor, facts.proposal, facts.settings, facts.now)
    if facts.actor.is_agent:  # nothing else matters, and saying more would suggest it might
        return own
    return own + _beyond_approvals(facts)


def standing_blockers(facts: ApplyFacts) -> list[str]:
    """What stands before an apply whoever asks, besides the proposal's status and a rejection (shown apart)."""
    return approval_blockers(facts.proposal, facts.settings, facts.now) + _beyond_approvals(facts)


def _beyond_approvals(facts: ApplyFacts) -> list[str]:
    return (lapsed_github_approvals(facts) + push_blockers(facts) + break_glass_blockers(facts)
            + unseen_drift_blockers(facts) + altered_plan_blockers(facts) + merge_blockers(facts)
            + order_blockers(facts))


def lapsed_github_approvals(facts: ApplyFacts) -> list[str]:
    """An approval given on GitHub (GitLab) counts only while its maker is an active member of an approver team
    (group)."""
    if facts.settings.forge is None:  # no forge on main: nothing to re-check them with
        return []
    return [reason for approval in facts.proposal.current_approvals if approval.auth.startswith(FORGE_AUTH)
            for reason in _lapsed(facts, approval)]


def _lapsed(facts: ApplyFacts, approval: DecisionRecord) -> list[str]:
    # no check known fails closed: the approval does not count until GitHub says it does
    check = facts.team_checks.get(approval.principal.id, TeamCheck(None, frozenset()))
    approvers = approver_groups(facts.proposal, facts.settings)
    missing = approvers.unmet(check.active_groups)
    if not missing:
        return []
    forge, team = ("GitLab", "group") if approval.auth.startswith(GITLAB_AUTH) else ("GitHub", "team")
    return [f"{approval.principal.name}'s approval on {forge} no longer counts: "
            f"{check.login or f'their {forge} account'} is not an active member of an approver {team} of "
            f"{', '.join(missing)} any more"]


def push_blockers(facts: ApplyFacts) -> list[str]:
    """A push to main outside the gateway holds applies on the stacks it changes until a person acknowledges it."""
    mine = set(facts.proposal.stacks)
    return [f"commit {p.sha[:12]} by {p.author} was pushed to main outside the gateway and changes stack(s) "
            f"{', '.join(sorted(p.stacks & mine))}: main describes what was never applied; "
            f"an approver acknowledges it (`gateway main acknowledge {p.sha[:12]} -m why`) before an apply there"
            for p in facts.pushes if p.stacks & mine]


def break_glass_blockers(facts: ApplyFacts) -> list[str]:
    """A break-glass window past its codify deadline holds applies on its stack until the group acknowledges it."""
    settings = facts.settings.break_glass
    overdue = [w for w in facts.windows
               if w.stack in facts.proposal.stacks and w.state(facts.now, settings) == WindowState.OVERDUE]
    return [f"stack {w.stack}: break-glass window {w.id} ({w.reason}) ended at {w.ended_at:%Y-%m-%d %H:%M} UTC and its "
            f"drift was not codified by {w.codify_by(settings):%Y-%m-%d %H:%M} UTC; the break-glass group "
            f"acknowledges it (`gateway break-glass acknowledge {w.id} -m why`) before an apply there"
            for w in overdue]


def unseen_drift(facts: ApplyFacts) -> list[DriftRecord]:
    """Open drift on the proposal's stacks recorded after that stack's plan, which the plan did not show: the apply
    would silently revert it (the runner plans again, and the new plan shows it and needs approval)."""
    plans = facts.proposal.plans
    return [r for r in facts.drift if r.stack in plans and not set(r.addresses) <= set(plans[r.stack].drift)
            and (plans[r.stack].planned_at is None or r.updated_at > plans[r.stack].planned_at)]


def unseen_drift_blockers(facts: ApplyFacts) -> list[str]:
    return [f"drift record {r.id} on stack {r.stack} ({r.describe()}) was recorded after the plan was made: the "
            f"apply would revert it unseen; a new plan shows it, and needs approval (an apply plans again first)"
            for r in unseen_drift(facts)]


def altered_plans(facts: ApplyFacts) -> list[str]:
    """The stacks whose saved plan no longer hashes to the digest approvals bind to (edited where it is kept)."""
    found = facts.saved_digests or {}
    return [stack for stack, plan in facts.proposal.plans.items() if stack in found and found[stack] != plan.digest]


def altered_plan_blockers(facts: ApplyFacts) -> list[str]:
    return [f"the saved plan of stack {stack} does not hash to the approved digest "
            f"({facts.proposal.plans[stack].digest[:19]}…); it was altered after approval: only a new plan from "
            f"the approved commit can run (an apply plans again first)" for stack in altered_plans(facts)]


def merge_blockers(facts: ApplyFacts) -> list[str]:
    """The branch must still exist and merge into main: the apply runs, and then merges, exactly that merge."""
    if facts.merge is None:
        return []
    if not facts.merge.branch_exists:
        return [f"branch {facts.proposal.branch} of proposal {facts.proposal.id} no longer exists"]
    return [facts.merge.conflict] if facts.merge.conflict else []


def order_blockers(facts: ApplyFacts) -> list[str]:
    """An apply takes each stack after those it reads the state of and those its `after:` names: a circle of such
    orders leaves no stack to go first."""
    if facts.state_reads is None:
        return []
    try:
        facts.settings.apply_order(facts.proposal.stacks, facts.state_reads)
    except ConfigError as exc:
        return [str(exc)]
    return []


MOVED_UNDER_LOCKS = "the proposal changed while its locks were taken; apply again"


def replanned_while_checked(checked: Proposal, current: Proposal) -> list[str]:
    """The runner's last look, under its locks: the proposal it checked must be the one it starts (a race no view
    can show before it happens)."""
    if (current.head_sha, current.current_digests, current.stacks) != \
            (checked.head_sha, checked.current_digests, checked.stacks):
        return ["the proposal was re-planned after its approvals were checked; review it and apply again"]
    return []
