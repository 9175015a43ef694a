"""GitHub webhooks: verified and recorded at once, handled by a worker with the gateway's own rules.

A review or a comment on GitHub is one more way in, never a way around: an approval counts only
from a linked person with the approver role, in an allowed group whose GitHub team they are an
active member of, who neither requested nor proposed the change, on the exact commit the current
plans were made from. Whatever does not count is recorded with the reason, and the sticky comment
shows it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, NoReturn

from gateway.domain.errors import AuthError, GatewayError, InputError, MalformedDelivery, NotFound, Refused
from gateway.domain.github import (
    MIN_FINGERPRINT,
    Command,
    CommandKind,
    parse_command,
    plan_fingerprint,
    signature_valid,
)
from gateway.domain.github_rules import (
    GitHubAccount,
    Push,
    ReviewState,
    bot_refusals,
    comment_replay_refusals,
    pusher_refusals,
    review_commit_refusals,
    review_replay_refusals,
)
from gateway.domain.jobs import Job, JobKind, JobStatus
from gateway.domain.lifecycle import ACTIVE, DECIDABLE
from gateway.domain.operations import webhook_event_label
from gateway.domain.principals import GITHUB, Principal, SystemActor, not_linked
from gateway.domain.proposal import Decision, Proposal, ProposalKind, ProposalStatus, Transition
from gateway.logs import get_logger
from gateway.ports import Forge
from gateway.services.change.code_host import forge_of, require_webhook_secret, verified_groups
from gateway.services.change.jobs import enqueue_job
from gateway.services.change.proposals import decide, get_proposal, open_proposal, sync_proposal, withdraw_decisions
from gateway.services.forge.github_events import (
    CommentEvent,
    GitHubEvent,
    PullRequestEvent,
    PushEvent,
    ReviewEvent,
    parse_event,
)
from gateway.services.workspace import Workspace

log = get_logger(__name__)

MAX_BODY = 25 * 1024 * 1024  # GitHub caps payloads at 25 MB


def receive_delivery(ws: Workspace, headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
    """Verify the signature over the raw body, record the delivery once, queue its handling; nothing else.

    A missing or wrong signature is an AuthError before anything is parsed or written. A redelivery
    (the same X-GitHub-Delivery) changes nothing and says so.
    """
    event = webhook_event_label(headers.get("x-github-event", "").strip())
    try:
        received = _receive_delivery(ws, headers, body)
    except GatewayError:
        ws.metrics.webhook_received(event, "refused")
        raise
    ws.metrics.webhook_received(event, "duplicate" if received["duplicate"] else "accepted")
    return received


def _receive_delivery(ws: Workspace, headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
    secret = require_webhook_secret(ws)
    if secret is None:
        raise NotFound("no GitHub forge is configured in gateway.yaml")
    if not signature_valid(secret, body, headers.get("x-hub-signature-256")):
        raise AuthError("the webhook signature (X-Hub-Signature-256) is missing or does not match the secret")
    delivery, event = headers.get("x-github-delivery", "").strip(), headers.get("x-github-event", "").strip()
    if not delivery or not event or len(delivery) > 100 or len(event) > 60:
        raise InputError("a delivery needs the X-GitHub-Delivery and X-GitHub-Event headers")
    try:
        payload = json.loads(body)
    except ValueError as exc:
        raise InputError("the delivery's body is not JSON") from exc
    if not isinstance(payload, dict):
        raise InputError("the delivery's body is not a JSON object")
    action = payload.get("action") if isinstance(payload.get("action"), str) else None
    try:
        parsed = parse_event(event, payload)
        handle = parsed is not None and needs_handling(parsed)
    except MalformedDelivery:
        handle = True  # the worker records the refusal, naming the field, where the pull request's trail is
    with ws.store.session() as session:
        if not session.github.add_delivery(delivery, event, action, body.decode("utf-8", "replace")):
            known = session.github.delivery(delivery)
            return {"delivery": delivery, "duplicate": True, "job": known.job_id if known else None}
        job_id = None
        if handle:
            number = _pull_number(payload)
            repository = payload.get("repository")
            full_name = str(repository.get("full_name") or "") if isinstance(repository, dict) else ""
            proposal_id = session.github.proposal_for_pull_request(full_name, number) if number else None
            job_id = session.jobs.add(JobKind.WEBHOOK, proposal_id, GITHUB, {"delivery": delivery})
            session.github.set_delivery_job(delivery, job_id)
    return {"delivery": delivery, "duplicate": False, "job": job_id}


def needs_handling(event: GitHubEvent) -> bool:
    """Whether a delivery can do anything: edited comments, bots' comments (the gateway's own edits among them),
    comments on issues and comment-only reviews are recorded and left there."""
    if isinstance(event, CommentEvent):
        return (event.action == "created" and event.on_pull_request and not event.comment.user.facts().is_bot
                and parse_command(event.comment.body) is not None)
    if isinstance(event, ReviewEvent):
        return event.action == "dismissed" or event.review.state.lower() in ("approved", "changes_requested")
    return True


def handle_delivery(ws: Workspace, job: Job) -> dict[str, Any]:
    """The worker's side: act on one recorded delivery. What it records reaches the pull request through
    the housekeeping loop's publish jobs (the trail moved), refusals included.

    A malformed delivery is refused, naming each field, in `github.<event>.refused` (and the job's end)."""
    with ws.store.session(readonly=True) as session:
        delivery = session.github.delivery(str(job.args.get("delivery")))
    if delivery is None:
        raise NotFound(f"job {job.id} names no recorded delivery")
    try:
        event = parse_event(delivery.event, json.loads(delivery.payload))
    except MalformedDelivery as exc:
        with ws.store.session() as session:
            proposal = session.proposals.get(job.proposal_id) if job.proposal_id else None
            session.audit.append(GITHUB, f"github.{exc.event}.refused", {
                "delivery": delivery.id, "reasons": exc.reasons}, job.proposal_id, proposal.stacks if proposal else ())
        raise Refused(exc.reasons) from exc
    if event is None:
        return {"ignored": f"{delivery.event} deliveries are recorded, not handled"}
    forge = forge_of(ws)
    if forge is None or event.repository.full_name != forge.settings.repository:
        return {"ignored": f"a delivery for {event.repository.full_name}, which is not this gateway's repository"}
    _, result = _dispatch(ws, forge, event)
    lag = ws.clock.now() - delivery.received_at
    ws.metrics.webhook_handled(webhook_event_label(delivery.event), max(0.0, lag.total_seconds()))
    return result


Outcome = tuple[int | None, dict[str, Any]]


def _dispatch(ws: Workspace, forge: Forge, event: GitHubEvent) -> Outcome:
    if isinstance(event, PullRequestEvent):
        return _on_pull_request(ws, forge, event)
    if isinstance(event, ReviewEvent):
        return _on_review(ws, forge, event)
    if isinstance(event, CommentEvent):
        return _on_comment(ws, forge, event)
    return _on_push(ws, forge, event)


# --- pull_request ------------------------------------------------------------------------------


def _on_pull_request(ws: Workspace, forge: Forge, event: PullRequestEvent) -> Outcome:
    pr = event.pull_request
    proposal_id = _proposal_id(ws, forge, pr.number)
    if event.action in ("opened", "reopened"):
        return _on_opened(ws, forge, event, proposal_id)
    if proposal_id is None:
        return None, {"ignored": f"pull request #{pr.number} has no proposal"}
    if event.action == "synchronize":
        sender = event.sender
        with ws.store.session() as session:  # whoever pushes to the branch shares in proposing it
            session.audit.append(_actor(sender.facts()), "github.pushed", {
                "number": pr.number, "github_id": sender.id, "login": sender.login,
                "before": event.before, "head_sha": event.after or pr.head.sha}, proposal_id)
        forge.fetch_main(ws.main_branch())
        forge.sync_branch(pr.head.ref)
        _, changes = sync_proposal(ws, proposal_id)
        return proposal_id, {"changes": changes}
    if event.action == "closed":
        return proposal_id, _on_closed(ws, event, proposal_id)
    return None, {"ignored": f"pull_request {event.action}"}


def _on_opened(ws: Workspace, forge: Forge, event: PullRequestEvent, proposal_id: int | None) -> Outcome:
    pr = event.pull_request
    number, branch = pr.number, pr.head.ref
    if proposal_id is not None and get_proposal(ws, proposal_id).status in ACTIVE:
        return proposal_id, {"ignored": f"pull request #{number} is proposal {proposal_id} already"}
    head_repo = pr.head.repo.full_name if pr.head.repo else None
    reasons = []
    if head_repo != forge.settings.repository:  # checked first: a fork's branch may share a proposal's name
        reasons.append(f"pull request #{number} comes from the fork {head_repo or '(deleted)'}: the gateway plans "
                       f"only branches of {forge.settings.repository}, whose code it may run")
    if pr.base.ref != ws.main_branch():
        reasons.append(f"pull request #{number} targets {pr.base.ref}; the gateway plans changes to "
                       f"{ws.main_branch()} only")
    with ws.store.session() as session:
        ours = session.proposals.open_for_branch(branch) if not reasons else None
        if ours is not None and session.proposals.get(ours).kind == ProposalKind.DRIFT_REVERT:
            ours = None  # a revert of drift is never a pull request's proposal
        if ours is not None and session.github.pull_request_of(ours) is None:  # the gateway opened it a moment ago
            session.github.link_pull_request(ours, forge.settings.repository, number)
        author = session.principals.by_github_id(pr.user.id)
    if ours is not None:
        return ours, {"linked": ours}
    login = pr.user.login
    if author is None and not reasons:
        reasons.append(not_linked("GitHub", login))
    if not reasons:
        assert author is not None
        forge.fetch_main(ws.main_branch())
        forge.sync_branch(branch)
        reason = "\n\n".join(p for p in (pr.title, pr.body or "") if p.strip())[:4000]
        try:
            proposal = open_proposal(ws, author, branch, reason or f"pull request #{number}")
        except GatewayError as exc:
            reasons = exc.reasons if isinstance(exc, Refused) else [str(exc)]
        else:
            with ws.store.session() as session:
                session.github.link_pull_request(proposal.id, forge.settings.repository, number)
            return proposal.id, {"opened": proposal.id}
    with ws.store.session() as session:
        session.audit.append(_actor(event.sender.facts()), "github.pull_request.refused", {
            "number": number, "reasons": reasons, "head_sha": pr.head.sha})
    forge.reply(number, "The change gateway does not plan this pull request:\n\n" + "\n".join(f"- {r}" for r in reasons))
    return None, {"refused": reasons}


def _on_closed(ws: Workspace, event: PullRequestEvent, proposal_id: int) -> dict[str, Any]:
    pr, sender = event.pull_request, event.sender
    actor = _actor(sender.facts())
    with ws.store.session() as session:
        proposal = session.proposals.get(proposal_id, lock=True)
        if pr.merged:
            if proposal.status == ProposalStatus.APPLIED:
                return {"merged": pr.merge_commit_sha}
            if proposal.status == ProposalStatus.UNMERGED and pr.head.sha == proposal.head_sha:
                session.audit.append(actor, "github.merged_unmerged", {
                    "number": pr.number, "merge_commit_sha": pr.merge_commit_sha,
                    "next": f"GitHub merged the applied head; `gateway merge {proposal_id}` records it"},
                    proposal_id, proposal.stacks)
                return {"merged_after_apply": pr.merge_commit_sha}
            # someone merged on GitHub what the gateway never applied: main now describes what does not run
            warning = (f"pull request #{pr.number} was merged on GitHub by {sender.login} while proposal "
                       f"{proposal_id} is {proposal.status.value}: main now describes changes that were never applied")
            session.audit.append(actor, "github.merged_without_apply", {
                "number": pr.number, "merge_commit_sha": pr.merge_commit_sha, "warning": warning},
                proposal_id, proposal.stacks)
            log.error("github.merged_without_apply", proposal=proposal_id, number=pr.number)
            if proposal.status in DECIDABLE:
                proposal.move(Transition.ABANDON, actor, {"reason": warning})
                session.proposals.save(proposal)
            return {"merged_without_apply": warning}
        if proposal.status in DECIDABLE:
            proposal.move(Transition.ABANDON, actor, {
                "reason": f"pull request #{pr.number} closed on GitHub by {sender.login} without merging"})
            session.proposals.save(proposal)
            return {"abandoned": proposal_id}
    return {"ignored": f"proposal {proposal_id} is {proposal.status.value}"}


# --- pull_request_review -------------------------------------------------------------------------


def _on_review(ws: Workspace, forge: Forge, event: ReviewEvent) -> Outcome:
    review, number = event.review, event.pull_request.number
    proposal_id = _proposal_id(ws, forge, number)
    if proposal_id is None:
        return None, {"ignored": "no proposal for this pull request"}
    account = review.user.facts()
    auth = f"github-review:{account.login}#{review.id}"
    with ws.store.session(readonly=True) as session:
        person = session.principals.by_github_id(account.id)
    if event.action == "dismissed":
        if person is None:
            return proposal_id, {"ignored": f"{account.login} is not linked"}
        withdraw_decisions(ws, _actor(event.sender.facts()), person, proposal_id,
                           f"review {review.id} dismissed on GitHub by {event.sender.login}", made_by=auth)
        return proposal_id, {"withdrawn": person.name}
    state = review.state.lower()
    if event.action != "submitted" or state not in ("approved", "changes_requested"):
        return proposal_id, {"ignored": f"review {event.action} {state}"}
    decision = Decision.APPROVE if state == "approved" else Decision.REJECT
    seen = get_proposal(ws, proposal_id)  # the plans shown while the reviewer reviewed
    # A review of the commit the gateway planned, which GitHub said was the head when it sent the delivery, binds to
    # those plans without fetching: a later push reaches the gateway as a `synchronize` delivery, which runs before
    # this one or makes this approval stale, and main moving re-plans (new digests, stale approvals); the apply
    # fetches both again. Any other review fetches main and the branch first, and is judged against what they are.
    head = event.pull_request.head.sha if event.pull_request.head else None
    current = seen.status in DECIDABLE and seen.head_sha == review.commit_id == head
    proposal = seen if current else _catch_up(ws, forge, proposal_id)
    reasons = _identity_refusals(account, person)
    if not reasons:
        now_state, now_commit, author = forge.review(number, review.id)
        reasons = review_replay_refusals(review.id, review.as_delivered(),
                                         ReviewState(now_state.lower(), now_commit, author))
    if not reasons:
        reasons = review_commit_refusals(review.commit_id, proposal.head_sha)
    if reasons:
        _refuse(ws, account, proposal, decision, reasons, auth)
    assert person is not None
    comment = (review.body or "").strip() or ("approved on GitHub" if decision == Decision.APPROVE
                                              else "changes requested on GitHub")
    _decide_on_github(ws, forge, person, account, proposal, decision, comment, auth, seen_sha=review.commit_id,
                      seen_digests=seen.current_digests if seen.head_sha == review.commit_id else None)
    return proposal_id, {decision.value: person.name}


# --- issue_comment: /gateway commands --------------------------------------------------------------


def _on_comment(ws: Workspace, forge: Forge, event: CommentEvent) -> Outcome:
    comment, number, account = event.comment, event.issue.number, event.comment.user.facts()
    if event.action != "created" or not event.on_pull_request:
        return None, {"ignored": "not a new comment on a pull request"}
    if account.is_bot:
        return None, {"ignored": "comments by bots are not commands"}
    command = parse_command(comment.body)
    if command is None:
        return None, {"ignored": "not a /gateway command"}
    proposal_id = _proposal_id(ws, forge, number)
    if proposal_id is None:
        forge.reply(number, "This pull request has no proposal in the change gateway.")
        return None, {"ignored": "no proposal"}
    auth = f"github-comment:{account.login}#{comment.id}"
    with ws.store.session(readonly=True) as session:
        person = session.principals.by_github_id(account.id)
    proposal = get_proposal(ws, proposal_id)
    reasons = _identity_refusals(account, person)
    if not reasons:
        reasons = comment_replay_refusals(comment.id, (comment.body, account.id), forge.comment(number, comment.id))
    if reasons:
        _refuse(ws, account, proposal, command.kind, reasons, auth)
    assert person is not None
    return proposal_id, COMMANDS[command.kind](ws, forge, person, account, proposal, command, auth)


def _command_plan(ws: Workspace, forge: Forge, person: Principal, account: GitHubAccount, proposal: Proposal,
                  command: Command, auth: str) -> dict[str, Any]:
    return {"job": enqueue_job(ws, person, JobKind.PLAN, proposal.id).id}


def _command_apply(ws: Workspace, forge: Forge, person: Principal, account: GitHubAccount, proposal: Proposal,
                   command: Command, auth: str) -> dict[str, Any]:
    return {"job": enqueue_job(ws, person, JobKind.APPLY, proposal.id).id}


def _command_decide(ws: Workspace, forge: Forge, person: Principal, account: GitHubAccount, proposal: Proposal,
                    command: Command, auth: str) -> dict[str, Any]:
    decision = Decision.APPROVE if command.kind == CommandKind.APPROVE else Decision.REJECT
    seen = None
    if decision == Decision.APPROVE:
        current = plan_fingerprint(proposal.current_digests)
        prefix = command.argument.strip().lower()
        if len(prefix) < MIN_FINGERPRINT or not current.startswith(prefix):
            _refuse(ws, account, proposal, decision, [
                f"`/gateway approve {prefix or '…'}` does not name the current plan {current[:12]} (give at least "
                f"{MIN_FINGERPRINT} characters of the plan id the comment shows)"], auth)
        seen = proposal.current_digests
    _decide_on_github(ws, forge, person, account, _catch_up(ws, forge, proposal.id), decision,
                      command.argument if decision == Decision.REJECT else "approved with /gateway approve", auth,
                      seen_sha=proposal.head_sha, seen_digests=seen)
    return {decision.value: person.name}


def _command_ask(ws: Workspace, forge: Forge, person: Principal, account: GitHubAccount, proposal: Proposal,
                 command: Command, auth: str) -> dict[str, Any]:
    from gateway.services.agents.agent_requests import (
        submit_request,  # the agent (and its model client) only when asked
    )

    with ws.store.session(readonly=True) as session:
        conversation = session.conversations.of_proposal(proposal.id)
    if conversation is None or conversation.requester_id != person.id:
        _refuse(ws, account, proposal, command.kind, [
            "only the person who asked the agent for this change can ask it to revise the branch"], auth)
    assert conversation is not None
    outcome = submit_request(ws, person, command.argument, conversation.id)
    if outcome.question:  # the agent waits for an answer: ask it where the person is
        with ws.store.session(readonly=True) as session:
            pull = session.github.pull_request_of(proposal.id)
        assert pull is not None  # the command came from this proposal's pull request
        forge.reply(pull.number, f"The agent asks @{account.login}: {outcome.question}\n\n"
                    "Answer with `/gateway ask <your answer>`.")
    return {"asked": conversation.id, "stopped": outcome.stopped, "changed_files": outcome.changed_files,
            "question": outcome.question}


CommandHandler = Callable[[Workspace, Forge, Principal, GitHubAccount, Proposal, Command, str], dict[str, Any]]
COMMANDS: dict[CommandKind, CommandHandler] = {
    CommandKind.PLAN: _command_plan, CommandKind.APPLY: _command_apply, CommandKind.APPROVE: _command_decide,
    CommandKind.REJECT: _command_decide, CommandKind.ASK: _command_ask,
}


# --- push -------------------------------------------------------------------------------------------


def _on_push(ws: Workspace, forge: Forge, event: PushEvent) -> Outcome:
    """Main moved on GitHub: fetch it; the housekeeping loop re-plans the proposals whose plans it touched."""
    if event.ref != f"refs/heads/{ws.main_branch()}":
        return None, {"ignored": f"push to {event.ref}"}
    forge.fetch_main(ws.main_branch())
    before, after = event.before, event.after
    with ws.store.session() as session:
        if not session.proposals.merged_as(after):  # not the gateway's merge: main moved outside the gateway
            settings = ws.repo_settings()
            paths = ws.repo.changed_paths(before, after) if before.strip("0") else []
            stacks = settings.stacks_touched(paths, lambda path: ws.repo.module_directories(after, path)) \
                if paths else []
            session.audit.append(_actor(event.sender.facts()), "github.main_pushed", {
                "before": before, "after": after, "stacks": stacks, "changed_paths": paths[:200],
                "warning": f"{event.sender.login} pushed to {ws.main_branch()} outside the gateway"
                           + (f": stacks {', '.join(stacks)} now describe what was never applied" if stacks else "")},
                None, stacks)
    return None, {"fetched": ws.main_branch()}


# -----------------------------------------------------------------------------------------------------


def _decide_on_github(ws: Workspace, forge: Forge, person: Principal, account: GitHubAccount, proposal: Proposal,
                      decision: Decision, comment: str, auth: str, seen_sha: str | None,
                      seen_digests: Mapping[str, str] | None = None) -> None:
    """Decide as the person, counting only the groups whose GitHub team they are an active member of now."""
    reasons = pusher_refusals(account, _pushes(ws, proposal.id))
    if reasons:
        _refuse(ws, account, proposal, decision, reasons, auth)
    groups, checked = verified_groups(forge, person, account.login)
    with ws.store.session() as session:
        session.audit.append(person, "github.team_check", {
            "login": account.login, "teams": {g: forge.settings.teams[g] for g in checked}, "active": sorted(groups),
            "not_member": sorted(g for g, ok in checked.items() if not ok), "head_sha": proposal.head_sha},
            proposal.id, proposal.stacks)
    decide(ws, replace(person, groups=groups), proposal.id, decision, comment, seen_sha, auth, seen_digests)


def _pushes(ws: Workspace, proposal_id: int) -> list[Push]:
    """Every push to the pull request's branch GitHub told of (`synchronize`), from the trail, oldest first."""
    with ws.store.session(readonly=True) as session:
        events = session.audit.events(proposal_id=proposal_id, kind="github.pushed")
    return [Push(int(e.payload["github_id"]), str(e.payload.get("login")), e.payload.get("head_sha"))
            for e in events if isinstance(e.payload.get("github_id"), int)]


def _identity_refusals(account: GitHubAccount, person: Principal | None) -> list[str]:
    reasons = bot_refusals(account)
    if not reasons and person is None:
        reasons.append(not_linked("GitHub", account.login))
    return reasons


def _refuse(ws: Workspace, account: GitHubAccount, proposal: Proposal, what: Decision | CommandKind,
            reasons: list[str], auth: str) -> NoReturn:
    kind = f"{what.value}.refused"
    with ws.store.session() as session:
        session.audit.append(_actor(account), kind, {"reasons": reasons, "head_sha": proposal.head_sha,
                                                     "authenticated_by": auth}, proposal.id, proposal.stacks)
    raise Refused(reasons)


def _catch_up(ws: Workspace, forge: Forge, proposal_id: int) -> Proposal:
    """Fetch main and the branch from GitHub and re-plan if either moved, so decisions bind to what GitHub shows."""
    proposal = get_proposal(ws, proposal_id)
    if proposal.status in DECIDABLE:
        forge.fetch_main(ws.main_branch())
        forge.sync_branch(proposal.branch)
        proposal, _ = sync_proposal(ws, proposal_id)
    return proposal


def _actor(account: GitHubAccount) -> SystemActor:
    return SystemActor(f"github:{account.login}")


def _pull_number(payload: Mapping[str, Any]) -> int | None:
    """Routing only, so it reads the raw payload without trusting its shape: a malformed delivery still runs
    after the others of its pull request, and its refusal lands in that proposal's trail."""
    pr = payload.get("pull_request")
    issue = payload.get("issue")
    number = pr.get("number") if isinstance(pr, dict) else None
    if number is None and isinstance(issue, dict) and "pull_request" in issue:
        number = issue.get("number")
    return number if isinstance(number, int) and not isinstance(number, bool) else None


def _proposal_id(ws: Workspace, forge: Forge, number: int) -> int | None:
    with ws.store.session(readonly=True) as session:
        return session.github.proposal_for_pull_request(forge.settings.repository, number)


def run_webhook_job(ws: Workspace, job: Job, runner: str,
                    progress: Callable[[str], None]) -> tuple[JobStatus, dict[str, Any], None]:
    """The job handler of webhook deliveries (see gateway/composition.py)."""
    return JobStatus.SUCCEEDED, handle_delivery(ws, job), None
