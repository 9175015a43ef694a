"""GitLab webhooks: verified by their token and recorded at once, handled by a worker with the gateway's own rules.

An approval or a note on GitLab is one more way in, never a way around: an approval counts only from a linked
person (by GitLab's numeric user id) with the approver role, in an allowed group whose GitLab group they are an
active member of, who is no bot, neither requested nor proposed the change nor pushed to its branch, given while
the merge request's head was the commit the current plans were made from, and still listed by GitLab's approvals
API. Whatever does not count is recorded with the reason, and the sticky note shows it.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping
from typing import Any, cast

from gateway.domain.errors import AuthError, ConfigError, InputError, NotFound
from gateway.domain.github import parse_command
from gateway.domain.gitlab_rules import (
    approval_head_refusals,
    approval_replay_refusals,
    note_replay_refusals,
)
from gateway.domain.jobs import Job, JobKind
from gateway.domain.operations import webhook_event_label
from gateway.domain.principals import Principal, SystemActor
from gateway.domain.proposal import Decision
from gateway.ports import ApprovalForge
from gateway.services.change.code_host import forge_of, require_webhook_secret
from gateway.services.change.proposals import get_proposal
from gateway.services.forge import review_flow, webhook_intake
from gateway.services.forge.gitlab_events import (
    EVENT_NAMES,
    GitLabEvent,
    MergeRequestEvent,
    NoteEvent,
    parse_delivery,
    parse_event,
    repository_of,
)
from gateway.services.workspace import Workspace

MAX_BODY = 25 * 1024 * 1024  # GitLab's payloads are far smaller; the route stops reading here
DELIVERY_PREFIX = "gitlab:"  # deliveries share a table with GitHub's: the id says whose it is
APPROVE_ACTIONS = frozenset({"approval", "approved"})  # a person approved (and, with `approved`, the rules are met)
UNAPPROVE_ACTIONS = frozenset({"unapproval", "unapproved"})
GITLAB = SystemActor("gitlab")
TERMS = review_flow.ForgeTerms(
    name="GitLab", settings=lambda repo: repo.gitlab, home="project", prefix="gitlab", request="merge request",
    sign="!", note="note", membership_check="gitlab.group_check", members_by_id=True, names_branch_pushers=True,
    person=lambda session, gitlab_id: session.principals.by_gitlab_id(gitlab_id),
    commit_refusals=approval_head_refusals, note_replay_refusals=note_replay_refusals)


def receive_delivery(ws: Workspace, headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
    """Check X-Gitlab-Token in constant time, record the delivery once by X-Gitlab-Event-UUID, queue its handling.

    A missing or wrong token is an AuthError before anything is parsed or written. The same event again (the same
    X-Gitlab-Event-UUID, or a resend that keeps its Idempotency-Key) changes nothing and says so.
    """
    label = webhook_event_label(EVENT_NAMES.get(headers.get("x-gitlab-event", "").strip(), "other"))
    return webhook_intake.counted(ws, label, lambda: _receive(ws, headers, body))


def token_valid(secret: str, header: str | None) -> bool:
    """Whether X-Gitlab-Token is the secret, compared in constant time (GitLab sends the secret itself, no HMAC)."""
    if not secret or not header:
        return False
    return hmac.compare_digest(secret.encode(), header.encode("utf-8", "replace"))


def _receive(ws: Workspace, headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
    secret = _webhook_secret(ws)
    if not token_valid(secret, headers.get("x-gitlab-token")):
        raise AuthError("the webhook token (X-Gitlab-Token) is missing or is not the secret")
    uuid, event = headers.get("x-gitlab-event-uuid", "").strip(), headers.get("x-gitlab-event", "").strip()
    resend = headers.get("idempotency-key", "").strip()
    if not uuid or not event or len(uuid) > 80 or len(event) > 60 or len(resend) > 80:
        raise InputError("a delivery needs the X-Gitlab-Event and X-Gitlab-Event-UUID headers")
    payload = webhook_intake.json_object(body)
    handle = webhook_intake.worth_a_job(lambda: parse_event(event, payload), needs_handling)
    delivery = DELIVERY_PREFIX + uuid
    action = _action(payload)
    project = payload.get("project")
    path = project.get("path_with_namespace") if isinstance(project, dict) else None
    path = path if isinstance(path, str) and path else None
    ws = webhook_intake.routed(ws, TERMS, path, delivery, EVENT_NAMES.get(event, event), action, body)
    with ws.store.session() as session:
        # a resend from GitLab's UI carries a new X-Gitlab-Event-UUID but the first one's Idempotency-Key: both count
        aliases = [f"{DELIVERY_PREFIX}resend:{resend}"] if resend else []
        first = session.github.add_delivery(delivery, EVENT_NAMES.get(event, event), action,
                                            body.decode("utf-8", "replace"))
        again = [a for a in aliases if not session.github.add_delivery(a, "resend", None, json.dumps(
            {"delivery": delivery}))]
        if not first or again:
            known = session.github.delivery(delivery if not first else _resent(session, again[0]))
            return {"delivery": delivery, "duplicate": True, "job": known.job_id if known else None}
        job_id = None
        if handle:
            number = _merge_request_number(payload)
            proposal_id = session.github.proposal_for_pull_request(path or "", number) if number else None
            job_id = session.jobs.add(JobKind.WEBHOOK, proposal_id, GITLAB, {"delivery": delivery, "forge": "gitlab"})
            session.github.set_delivery_job(delivery, job_id)
    return {"delivery": delivery, "duplicate": False, "job": job_id}


def _webhook_secret(ws: Workspace) -> str:
    """GATEWAY_GITLAB_WEBHOOK_SECRET, one for every repository's project hook."""
    secret = ws.settings.gitlab_webhook_secret
    if secret is not None and secret.get_secret_value().strip():
        return secret.get_secret_value()
    try:
        main_names_gitlab = ws.repo_settings().gitlab is not None
    except ConfigError:  # a broken gateway.yaml is reported where it is used
        main_names_gitlab = False
    if main_names_gitlab:
        require_webhook_secret(ws)  # the missing secret is a ConfigError that says so
    raise NotFound("no GitLab forge is configured in gateway.yaml")


def _resent(session: Any, alias: str) -> str:
    """The delivery an Idempotency-Key was first seen with."""
    row = session.github.delivery(alias)
    try:
        return str(json.loads(row.payload if row else "{}").get("delivery") or alias)
    except ValueError:
        return alias


def needs_handling(event: GitLabEvent) -> bool:
    """Whether a delivery can do anything: GitLab's own system notes, edited notes, notes on issues and notes that
    are no `/gateway` command are recorded and left there."""
    if isinstance(event, NoteEvent):
        attributes = event.object_attributes
        return (event.on_merge_request and not attributes.system and attributes.action in (None, "create")
                and parse_command(attributes.note) is not None)
    return True


def handle_delivery(ws: Workspace, job: Job) -> dict[str, Any]:
    """The worker's side: act on one recorded delivery. What it records reaches the merge request through the
    housekeeping loop's publish jobs; a malformed delivery is refused, naming each field, in
    `gitlab.<event>.refused`."""
    return webhook_intake.handle_recorded(ws, job, TERMS, parse_delivery, repository_of,
                                          lambda event: _dispatch(ws, cast(ApprovalForge, forge_of(ws)), event))


def _dispatch(ws: Workspace, forge: ApprovalForge, event: GitLabEvent) -> dict[str, Any]:
    if isinstance(event, MergeRequestEvent):
        return _on_merge_request(ws, forge, event)
    if isinstance(event, NoteEvent):
        return _on_note(ws, forge, event)
    pushed = review_flow.Pushed(event.ref, event.before, event.after, event.user_id, event.user_username)
    return review_flow.on_push(ws, forge, TERMS, pushed)


def _on_merge_request(ws: Workspace, forge: ApprovalForge, event: MergeRequestEvent) -> dict[str, Any]:
    mr, action, user = event.object_attributes, event.object_attributes.action or "", event.user
    head = mr.last_commit.id if mr.last_commit else None
    proposal_id = review_flow.proposal_of(ws, forge, mr.iid)
    if action in ("open", "reopen"):
        fork = None if mr.source_project_id == mr.target_project_id else f"a fork (project {mr.source_project_id})"
        return review_flow.on_opened(ws, forge, TERMS, proposal_id, review_flow.Opened(
            mr.iid, mr.source_branch, mr.target_branch, fork, mr.author_id,
            f"GitLab user {mr.author_id} ({user.username} opened it) is not linked to a gateway person (an admin "
            f"runs `gateway users link NAME --gitlab USERNAME`)", mr.title, mr.description or "", head, user.username))
    if proposal_id is None:
        return {"ignored": f"merge request !{mr.iid} has no proposal"}
    if action in APPROVE_ACTIONS:
        return _on_approval(ws, forge, event, proposal_id)
    if action in UNAPPROVE_ACTIONS:
        return review_flow.on_withdrawn(ws, TERMS, proposal_id, review_flow.Withdrawn(
            user.id, user.username, user.username, f"approval withdrawn on GitLab by {user.username}",
            lambda proposal: _approval_auth(user.username, proposal.head_sha)))
    if action == "update" and mr.oldrev:  # commits were pushed: whoever pushed shares in proposing it
        return review_flow.on_branch_pushed(ws, forge, TERMS, proposal_id, review_flow.BranchPushed(
            mr.iid, mr.source_branch, user.id, user.username, mr.oldrev, head))
    if action in ("close", "merge"):
        return review_flow.on_closed(ws, TERMS, proposal_id, review_flow.Closed(
            mr.iid, action == "merge", head, mr.merge_commit_sha, user.username))
    return {"ignored": f"merge request {action or 'event'}"}


def _on_approval(ws: Workspace, forge: ApprovalForge, event: MergeRequestEvent, proposal_id: int) -> dict[str, Any]:
    """An approval on GitLab: of the head the merge request had when it was given, if GitLab still lists it."""
    mr = event.object_attributes
    approved_head = mr.last_commit.id if mr.last_commit else None
    auth = _approval_auth(event.user.username, approved_head)
    if any(d.auth == auth for d in get_proposal(ws, proposal_id).current_approvals):
        return {"ignored": f"{event.user.username}'s approval of {str(approved_head)[:12]} counts already"}
    return review_flow.on_decided(
        ws, forge, TERMS, proposal_id,
        review_flow.Decided(mr.iid, Decision.APPROVE, approved_head, approved_head, "approved on GitLab", auth),
        lambda: forge.account(event.user.id),
        lambda account: approval_replay_refusals(account, mr.iid, forge.approver_ids(mr.iid)))


def _on_note(ws: Workspace, forge: ApprovalForge, event: NoteEvent) -> dict[str, Any]:
    note = event.object_attributes
    if not needs_handling(event) or event.merge_request is None:
        return {"ignored": "not a new /gateway note on a merge request"}
    command = parse_command(note.note)
    assert command is not None
    return review_flow.on_commented(ws, forge, TERMS, review_flow.Commented(
        event.merge_request.iid, command, note.id, note.note, f"gitlab-note:{event.user.username}#{note.id}"),
        lambda: forge.account(event.user.id))


def _approval_auth(username: str, head: str | None) -> str:
    return f"gitlab-approval:{username}@{(head or 'unknown')[:12]}"


def _action(payload: Mapping[str, Any]) -> str | None:
    attributes = payload.get("object_attributes")
    action = attributes.get("action") if isinstance(attributes, dict) else None
    return action[:60] if isinstance(action, str) else None


def _merge_request_number(payload: Mapping[str, Any]) -> int | None:
    """Routing only, so it reads the raw payload without trusting its shape: a malformed delivery still runs after
    the others of its merge request, and its refusal lands in that proposal's trail."""
    kind = payload.get("object_kind")
    holder = payload.get("object_attributes") if kind == "merge_request" else payload.get("merge_request")
    number = holder.get("iid") if isinstance(holder, dict) else None
    return number if isinstance(number, int) and not isinstance(number, bool) else None


def link_account(ws: Workspace, actor: Principal, name: str, username: str,
                 gitlab_id: int | None = None) -> tuple[int, str]:
    """Link a person to a GitLab account by its numeric user id (asked of GitLab unless given)."""
    from gateway.domain.permissions import Action, require

    require(actor, Action.LINK_ACCOUNTS)
    if gitlab_id is None:
        forge = forge_of(ws)
        if forge is None or ws.repo_settings().gitlab is None:
            raise InputError("no GitLab forge in gateway.yaml to look the username up; pass --gitlab-id")
        gitlab_id, username = forge.user_id(username)
    with ws.store.session() as session:
        principal = session.principals.by_name(name)
        if principal is None:
            raise NotFound(f"no user {name}")
        session.principals.link_gitlab(principal, gitlab_id, username)
        session.audit.append(actor, "principal.gitlab_linked", {"name": name, "gitlab_username": username,
                                                                "gitlab_id": gitlab_id})
    return gitlab_id, username

