"""A proposal's pull request on GitHub: opening it, keeping its sticky comment and checks in step with
the trail, linking people's GitHub accounts, and re-checking GitHub team membership.

The pull request mirrors the gateway, never the other way round: what it shows is rendered from the
proposal's records, and a pull request is behind whenever its proposal has trail events newer than
the last ones it showed (the housekeeping loop queues a publish job for it).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

from gateway.domain.apply_blockers import standing_blockers
from gateway.domain.approvals import approver_groups, required_approvals
from gateway.domain.audit import AuditEvent
from gateway.domain.errors import GatewayError, InputError, NotFound
from gateway.domain.github import PullRequestLink, PullRequestView, not_counted, pull_request_checks, render_comment
from gateway.domain.jobs import Job, JobKind, JobStatus
from gateway.domain.lifecycle import DECIDABLE
from gateway.domain.permissions import Action, require
from gateway.domain.plan_rounds import RoundState
from gateway.domain.principals import GATEWAY, Principal
from gateway.domain.proposal import Proposal, ProposalKind
from gateway.domain.repo_settings import RepoSettings
from gateway.logs import get_logger
from gateway.ports import Forge
from gateway.services.change.apply_facts import gather_apply_facts
from gateway.services.change.breaker import open_breaker_reason
from gateway.services.change.code_host import forge_of
from gateway.services.change.proposals import claim_issues, get_proposal, pending_changes, proposal_previews
from gateway.services.workspace import Configured, MainRules, Records, Workspace

log = get_logger(__name__)

FAILURES_SHOWN = 3  # the newest distinct job failures the comment shows (each is in the trail)
PUBLISH_RETRY_SECONDS = 30.0  # after a failed publish (GitHub down, rate-limited), wait this long


def link_account(ws: Workspace, actor: Principal, name: str, login: str, github_id: int | None = None) -> tuple[int, str]:
    """Link a person to a GitHub account by its numeric id (asked of GitHub unless given)."""
    require(actor, Action.LINK_ACCOUNTS)
    if github_id is None:
        forge = forge_of(ws)
        if forge is None:
            raise InputError("no forge in gateway.yaml to look the login up; pass --github-id")
        github_id, login = forge.user_id(login)
    with ws.store.session() as session:
        principal = session.principals.by_name(name)
        if principal is None:
            raise NotFound(f"no user {name}")
        session.principals.link_github(principal, github_id, login)
        session.audit.append(actor, "principal.github_linked", {"name": name, "github_login": login,
                                                                "github_id": github_id})
    return github_id, login


# --- keeping the pull request in step --------------------------------------------------------


def queue_behind(ws: MainRules) -> list[int]:
    """Queue a publish job for every proposal whose pull request shows less than its trail (housekeeping)."""
    if ws.repo_settings().forge is None:
        return []
    queued = []
    with ws.store.session() as session:
        waiting = session.jobs.recently_failed(JobKind.PUBLISH, PUBLISH_RETRY_SECONDS)
        for pid in session.github.unpublished_proposals(DECIDABLE, PUBLISH_RETRY_SECONDS):
            if pid not in waiting and session.jobs.queued(JobKind.PUBLISH, pid, running_too=False) is None:
                queued.append(session.jobs.add(JobKind.PUBLISH, pid, GATEWAY))
    return queued


def publish(ws: Workspace, proposal_id: int) -> int | None:
    """Open the proposal's pull request if it has none, then bring its comment and checks up to date.

    Returns the pull request's number (None without a forge, or for a closed proposal that never had one).
    """
    forge = forge_of(ws)
    if forge is None:
        return None
    with ws.store.session(readonly=True) as session:
        link = session.github.pull_request_of(proposal_id)
        seq = session.audit.newest_seq(proposal_id)
    proposal = get_proposal(ws, proposal_id)
    if link is None:
        if proposal.status not in DECIDABLE or proposal.kind == ProposalKind.DRIFT_REVERT:  # nothing to review there
            return None
        link = _open_pull_request(ws, forge, proposal)
    comment_id = link.comment_id
    try:
        if proposal.proposer.is_agent and proposal.status in DECIDABLE:
            forge.sync_branch(proposal.branch)  # the agent's newest commits reach the pull request
        view = pull_request_view(ws, proposal)
        body, checks = render_comment(view), pull_request_checks(view)
        digest = hashlib.sha256(repr((proposal.head_sha, body, checks)).encode()).hexdigest()
        if digest != link.published_digest or comment_id is None:  # GitHub's rate limits: write only news
            comment_id = forge.upsert_comment(link.number, comment_id, body)
            forge.set_checks(proposal.head_sha, checks, view.page_url)
    except GatewayError as exc:
        with ws.store.session() as session:  # a comment posted before the failure stays the one to edit next time
            session.github.mark_published(proposal_id, seq, comment_id, error=str(exc))
        ws.metrics.publish_finished(failed=True, retry=bool(link.publish_error))
        raise
    with ws.store.session() as session:
        session.github.mark_published(proposal_id, seq, comment_id, digest=digest)
    ws.metrics.publish_finished(failed=False, retry=bool(link.publish_error))
    return link.number


def _open_pull_request(ws: Workspace, forge: Forge, proposal: Proposal) -> PullRequestLink:
    """Push the proposal's branch and open its pull request (or adopt the open one), asking its approver teams."""
    forge.push(proposal.branch, proposal.head_sha)
    title = proposal.reason.strip().splitlines()[0][:120]
    body = (f"{proposal.reason.strip()}\n\nOpened by the change gateway for proposal {proposal.id}, requested by "
            f"{proposal.requester.name}. Approve with a review on the latest commit or on the [review page]"
            f"({page_url(ws, proposal.id)}).")
    pull = forge.open_pull(proposal.branch, ws.main_branch(), title, body)
    settings = ws.repo_settings()
    with ws.store.session() as session:
        session.github.link_pull_request(proposal.id, forge.settings.repository, pull.number)
        session.audit.append(GATEWAY, "github.pull_request_opened", {
            "repository": forge.settings.repository, "number": pull.number, "url": pull.url,
            "head_sha": proposal.head_sha}, proposal.id, proposal.stacks)
        link = session.github.pull_request_of(proposal.id)
    forge.request_teams(pull.number, approver_teams(settings, proposal))
    assert link is not None
    return link


def approver_teams(settings: RepoSettings, proposal: Proposal) -> list[str]:
    """The teams (GitLab groups) of every group whose approval counts: the stacks' and, for a protected path, the
    config approvers'."""
    teams = settings.forge.teams if settings.forge else {}
    return sorted({teams[g] for g in approver_groups(proposal, settings).groups() if g in teams})


def page_url(ws: Configured, proposal_id: int) -> str:
    return f"{ws.settings.public_url.rstrip('/')}/proposals/{proposal_id}"


def pull_request_view(ws: Workspace, proposal: Proposal) -> PullRequestView:
    # imported late: the facts include GitHub team checks, which this module gathers

    settings = ws.repo_settings()
    moment = ws.clock.now()
    with ws.store.session(readonly=True) as session:
        events = session.audit.events(proposal_id=proposal.id)
    transitions = [e for e in events if e.kind.startswith("proposal.")]
    notices = _notices(events)
    if proposal.proposer.is_agent:
        with ws.store.session(readonly=True) as session:
            stopped = open_breaker_reason(session, proposal.proposer)
        notices += [f":octagonal_sign: {stopped}"] if stopped else []
    notices += _planning_notices(ws, proposal)
    return PullRequestView(
        proposal=proposal,
        previews=proposal_previews(ws, proposal),
        required_approvals=required_approvals(proposal, settings),
        blocked_by=standing_blockers(gather_apply_facts(ws, proposal, hash_saved_plans=False)) if proposal.status in DECIDABLE else [],
        claim_issues=claim_issues(ws, proposal),
        pending=pending_changes(ws, proposal),
        approvers=approver_groups(proposal, settings),
        teams=dict(settings.forge.teams) if settings.forge else {},
        forge=settings.forge.name if settings.forge else "GitHub",
        not_counted=not_counted(events, proposal.head_sha),
        page_url=page_url(ws, proposal.id),
        at=moment,
        outcome=_outcome(proposal, transitions[-1].payload if transitions else {}),
        notices=notices,
    )


def _planning_notices(ws: Records, proposal: Proposal) -> list[str]:
    """Its stacks being planned (how many of how many), or which stack's plan failed and why."""
    with ws.store.session(readonly=True) as session:
        current = session.plan_rounds.latest(proposal.id)
    if current is None or current.state not in (RoundState.PLANNING, RoundState.FAILED):
        return []
    if current.state == RoundState.PLANNING:
        return [f":hourglass_flowing_sand: Plans of {current.head_sha[:12]}: {current.summary()}."]
    return [f":x: Plans of {current.head_sha[:12]}: {current.summary()}. " + "; ".join(current.reasons())]


def _notices(events: list[AuditEvent]) -> list[str]:
    """Merges by hand on GitHub (every one), and the last few distinct job failures, each once."""
    warnings = [f":rotating_light: {e.payload.get('warning')}" for e in events if e.kind == "github.merged_without_apply"]
    failures = list(dict.fromkeys(f"a {e.payload.get('kind')} job failed: {e.payload.get('error')} (try again)"
                                  for e in reversed(events) if e.kind == "job.failed"))[:FAILURES_SHOWN]
    return warnings + failures[::-1]


def _outcome(proposal: Proposal, last: Mapping) -> str | None:
    status = proposal.status.value
    if proposal.merge_sha and status == "applied":
        return f"Applied and merged into main as {proposal.merge_sha[:12]}."
    detail = last.get("error") or last.get("reason")
    if status in ("failed", "unmerged", "abandoned") and detail:
        return f"{status.capitalize()}: {detail}"
    return None


# --- GitHub team membership, at approval and again at apply ---------------------------------


def run_publish_job(ws: Workspace, job: Job, runner: str,
                    progress: Callable[[str], None]) -> tuple[JobStatus, dict[str, Any], None]:
    """The job handler of publish jobs (see gateway/composition.py): bring the pull request up to date."""
    if job.proposal_id is None:
        raise NotFound(f"job {job.id} names no proposal")
    return JobStatus.SUCCEEDED, {"pull_request": publish(ws, job.proposal_id)}, None
