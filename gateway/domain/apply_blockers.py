"""What stands between a proposal and an apply: one rule over typed facts, for the runner and every view.

The runner refuses with exactly these sentences, and the API, the pages, `gateway show` and the pull request
show them, so what a person is told can be applied is what the runner will apply. The facts are gathered by
`services/change/apply_facts.py`; nothing here reads a database, git or GitHub.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from gateway.domain.approvals import apply_refusals, approval_blockers, approver_groups
from gateway.domain.break_glass import BreakGlassWindow, WindowState
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
class ApplyFacts:
    """Everything the apply rule looks at, gathered once, at one moment."""

    proposal: Proposal
    settings: RepoSettings  # main's gateway.yaml
    now: datetime
    actor: Principal | None = None  # who would apply; None: whoever may (the pull request, the proposal list)
    pushes: tuple[MainPush, ...] = ()  # every unacknowledged push to main (the rule picks the proposal's stacks)
    windows: tuple[BreakGlassWindow, ...] = ()  # break-glass windows on the proposal's stacks
    team_checks: Mapping[str, TeamCheck] = field(default_factory=dict)  # principal id -> check of a GitHub approver


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
    return lapsed_github_approvals(facts) + push_blockers(facts) + break_glass_blockers(facts)


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
