"""GitHub webhooks: verified and recorded at once, handled by a worker with the gateway's own rules.

A review or a comment on GitHub is one more way in, never a way around: an approval counts only
from a linked person with the approver role, in an allowed group whose GitHub team they are an
active member of, who neither requested nor proposed the change, on the exact commit the current
plans were made from. Whatever does not count is recorded with the reason, and the sticky comment
shows it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

from gateway.domain.errors import AuthError, InputError, NotFound
from gateway.domain.github import parse_command, repository_allowed, signature_valid
from gateway.domain.github_rules import (
    ForgeAccount,
    ReviewState,
    comment_replay_refusals,
    review_commit_refusals,
    review_replay_refusals,
)
from gateway.domain.jobs import Job, JobKind, JobStatus
from gateway.domain.operations import webhook_event_label
from gateway.domain.principals import GITHUB, not_linked
from gateway.domain.proposal import Decision
from gateway.ports import ReviewForge
from gateway.services.change.code_host import forge_of, require_webhook_secret
from gateway.services.forge import installed, review_flow, webhook_intake
from gateway.services.forge.github_events import (
    CommentEvent,
    GitHubEvent,
    PullRequestEvent,
    ReviewEvent,
    parse_delivery,
    parse_event,
    repository_of,
)
from gateway.services.workspace import Workspace

MAX_BODY = 25 * 1024 * 1024  # GitHub caps payloads at 25 MB
TERMS = review_flow.ForgeTerms(
    name="GitHub", settings=lambda repo: repo.github, home="repository", prefix="github", request="pull request",
    sign="#", note="comment", membership_check="github.team_check", members_by_id=False, names_branch_pushers=False,
    person=lambda session, github_id: session.principals.by_github_id(github_id),
    commit_refusals=review_commit_refusals, note_replay_refusals=comment_replay_refusals)


def receive_delivery(ws: Workspace, headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
    """Verify the signature over the raw body, record the delivery once, queue its handling; nothing else.

    A missing or wrong signature is an AuthError before anything is parsed or written. A redelivery
    (the same X-GitHub-Delivery) changes nothing and says so.
    """
    label = webhook_event_label(headers.get("x-github-event", "").strip())
    return webhook_intake.counted(ws, label, lambda: _receive_delivery(ws, headers, body))


def _receive_delivery(ws: Workspace, headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
    secret = _webhook_secret(ws)
    if not signature_valid(secret, body, headers.get("x-hub-signature-256")):
        raise AuthError("the webhook signature (X-Hub-Signature-256) is missing or does not match the secret")
    delivery, event = headers.get("x-github-delivery", "").strip(), headers.get("x-github-event", "").strip()
    if not delivery or not event or len(delivery) > 100 or len(event) > 60:
        raise InputError("a delivery needs the X-GitHub-Delivery and X-GitHub-Event headers")
    payload = webhook_intake.json_object(body)
    action = payload.get("action")
    action = action[:60] if isinstance(action, str) else None
    if event in installed.EVENTS:
        return _record_installation(ws, delivery, event, action, payload, body)
    repository = payload.get("repository")
    full_name = repository.get("full_name") if isinstance(repository, dict) else None
    full_name = full_name if isinstance(full_name, str) and full_name else None
    ws = webhook_intake.routed(ws, TERMS, full_name, delivery, event, action, body)
    handle = webhook_intake.worth_a_job(lambda: parse_event(event, payload), needs_handling)
    with ws.store.session() as session:
        if not session.github.add_delivery(delivery, event, action, body.decode("utf-8", "replace")):
            known = session.github.delivery(delivery)
            return {"delivery": delivery, "duplicate": True, "job": known.job_id if known else None}
        job_id = None
        if handle:
            number = _pull_number(payload)
            proposal_id = session.github.proposal_for_pull_request(full_name or "", number) if number else None
            job_id = session.jobs.add(JobKind.WEBHOOK, proposal_id, GITHUB, {"delivery": delivery})
            session.github.set_delivery_job(delivery, job_id)
    return {"delivery": delivery, "duplicate": False, "job": job_id}


def _webhook_secret(ws: Workspace) -> str:
    """GATEWAY_GITHUB_WEBHOOK_SECRET, one for every repository (one App, or one secret on each repository's hook)."""
    secret = ws.settings.github_webhook_secret
    if secret is not None and secret.get_secret_value().strip():
        return secret.get_secret_value()
    require_webhook_secret(ws)  # main says forge: github: the missing secret is a ConfigError that says so
    raise NotFound("no GitHub forge is configured in gateway.yaml")


def _record_installation(ws: Workspace, delivery: str, event: str, action: str | None, payload: Mapping[str, Any],
                         body: bytes) -> dict[str, Any]:
    """The App was installed, removed, or given or denied repositories: recorded (which ones, those outside
    GATEWAY_GITHUB_REPOSITORIES, and those the gateway will add); a job adds them (`installed.add_installed`)."""
    installation = _object(payload.get("installation"))
    account = _object(installation.get("account"))
    added, removed = installed.added_and_removed(event, action, payload)
    allowed = ws.settings.github_repositories
    adding = installed.to_add(ws, added)
    with ws.store.session() as session:
        if not session.github.add_delivery(delivery, event, action, body.decode("utf-8", "replace")):
            known = session.github.delivery(delivery)
            return {"delivery": delivery, "duplicate": True, "job": known.job_id if known else None}
        session.audit.append(GITHUB, f"github.{event}", {
            "delivery": delivery, "action": action, "installation": installation.get("id"),
            "account": account.get("login"), "added": added, "removed": removed,
            "not_allowed": [] if allowed is None else [r for r in added if not repository_allowed(allowed, r)],
            "to_add": adding})
        job_id = session.jobs.add(JobKind.WEBHOOK, None, GITHUB, {"delivery": delivery}) if adding else None
        if job_id is not None:
            session.github.set_delivery_job(delivery, job_id)
    return {"delivery": delivery, "duplicate": False, "job": job_id}


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


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

    A malformed delivery is refused, naming each field, in `github.<event>.refused` (and the job's end). An
    installation delivery adds the repositories it gave the App that the gateway takes on."""
    with ws.store.session(readonly=True) as session:
        delivery = session.github.delivery(str(job.args.get("delivery")))
    if delivery is not None and delivery.event in installed.EVENTS:
        return installed.add_installed(ws, delivery)
    return webhook_intake.handle_recorded(ws, job, TERMS, parse_delivery, repository_of,
                                          lambda event: _dispatch(ws, cast(ReviewForge, forge_of(ws)), event))


def _dispatch(ws: Workspace, forge: ReviewForge, event: GitHubEvent) -> dict[str, Any]:
    if isinstance(event, PullRequestEvent):
        return _on_pull_request(ws, forge, event)
    if isinstance(event, ReviewEvent):
        return _on_review(ws, forge, event)
    if isinstance(event, CommentEvent):
        return _on_comment(ws, forge, event)
    sender = event.sender
    pushed = review_flow.Pushed(event.ref, event.before, event.after, sender.id, sender.login)
    return review_flow.on_push(ws, forge, TERMS, pushed)


def _on_pull_request(ws: Workspace, forge: ReviewForge, event: PullRequestEvent) -> dict[str, Any]:
    pr, sender = event.pull_request, event.sender
    proposal_id = review_flow.proposal_of(ws, forge, pr.number)
    if event.action in ("opened", "reopened"):
        head_repo = pr.head.repo.full_name if pr.head.repo else None
        fork = None if head_repo == forge.settings.repository else f"the fork {head_repo or '(deleted)'}"
        return review_flow.on_opened(ws, forge, TERMS, proposal_id, review_flow.Opened(
            pr.number, pr.head.ref, pr.base.ref, fork, pr.user.id, not_linked("GitHub", pr.user.login), pr.title,
            pr.body or "", pr.head.sha, sender.login))
    if proposal_id is None:
        return {"ignored": f"pull request #{pr.number} has no proposal"}
    if event.action == "synchronize":  # whoever pushes to the branch shares in proposing it
        return review_flow.on_branch_pushed(ws, forge, TERMS, proposal_id, review_flow.BranchPushed(
            pr.number, pr.head.ref, sender.id, sender.login, event.before, event.after or pr.head.sha))
    if event.action == "closed":
        return review_flow.on_closed(ws, TERMS, proposal_id, review_flow.Closed(
            pr.number, pr.merged, pr.head.sha, pr.merge_commit_sha, sender.login))
    return {"ignored": f"pull_request {event.action}"}


def _on_review(ws: Workspace, forge: ReviewForge, event: ReviewEvent) -> dict[str, Any]:
    """A review is a decision of the commit it names, if GitHub still shows it as delivered."""
    review, number = event.review, event.pull_request.number
    proposal_id = review_flow.proposal_of(ws, forge, number)
    if proposal_id is None:
        return {"ignored": "no proposal for this pull request"}
    account = review.user.facts()
    auth = f"github-review:{account.login}#{review.id}"
    if event.action == "dismissed":
        return review_flow.on_withdrawn(ws, TERMS, proposal_id, review_flow.Withdrawn(
            account.id, account.login, event.sender.login,
            f"review {review.id} dismissed on GitHub by {event.sender.login}", lambda _: auth))
    state = review.state.lower()
    if event.action != "submitted" or state not in ("approved", "changes_requested"):
        return {"ignored": f"review {event.action} {state}"}
    decision = Decision.APPROVE if state == "approved" else Decision.REJECT
    comment = (review.body or "").strip() or ("approved on GitHub" if decision == Decision.APPROVE
                                              else "changes requested on GitHub")

    def replay_refusals(_: ForgeAccount) -> list[str]:
        now_state, now_commit, author = forge.review(number, review.id)
        return review_replay_refusals(review.id, review.as_delivered(), ReviewState(now_state.lower(), now_commit,
                                                                                    author))

    head = event.pull_request.head.sha if event.pull_request.head else None
    return review_flow.on_decided(ws, forge, TERMS, proposal_id,
                                  review_flow.Decided(number, decision, review.commit_id, head, comment, auth),
                                  lambda: account, replay_refusals)


def _on_comment(ws: Workspace, forge: ReviewForge, event: CommentEvent) -> dict[str, Any]:
    comment, account = event.comment, event.comment.user.facts()
    if event.action != "created" or not event.on_pull_request:
        return {"ignored": "not a new comment on a pull request"}
    if account.is_bot:
        return {"ignored": "comments by bots are not commands"}
    command = parse_command(comment.body)
    if command is None:
        return {"ignored": "not a /gateway command"}
    return review_flow.on_commented(ws, forge, TERMS, review_flow.Commented(
        event.issue.number, command, comment.id, comment.body, f"github-comment:{account.login}#{comment.id}"),
        lambda: account)


def _pull_number(payload: Mapping[str, Any]) -> int | None:
    """Routing only, so it reads the raw payload without trusting its shape: a malformed delivery still runs
    after the others of its pull request, and its refusal lands in that proposal's trail."""
    pr = payload.get("pull_request")
    issue = payload.get("issue")
    number = pr.get("number") if isinstance(pr, dict) else None
    if number is None and isinstance(issue, dict) and "pull_request" in issue:
        number = issue.get("number")
    return number if isinstance(number, int) and not isinstance(number, bool) else None


def run_webhook_job(ws: Workspace, job: Job, runner: str,
                    progress: Callable[[str], None]) -> tuple[JobStatus, dict[str, Any], None]:
    """The job handler of webhook deliveries (see gateway/composition.py)."""
    return JobStatus.SUCCEEDED, handle_delivery(ws, job), None
