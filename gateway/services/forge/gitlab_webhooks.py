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
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, NoReturn, cast

from gateway.domain.errors import AuthError, GatewayError, InputError, MalformedDelivery, NotFound, Refused
from gateway.domain.github import MIN_FINGERPRINT, Command, CommandKind, parse_command, plan_fingerprint
from gateway.domain.github_rules import Push, pusher_refusals
from gateway.domain.gitlab_rules import (
    GitLabAccount,
    approval_head_refusals,
    approval_replay_refusals,
    bot_refusals,
    note_replay_refusals,
)
from gateway.domain.jobs import Job, JobKind
from gateway.domain.lifecycle import ACTIVE, DECIDABLE
from gateway.domain.operations import webhook_event_label
from gateway.domain.principals import Principal, SystemActor, not_linked
from gateway.domain.proposal import Decision, Proposal, ProposalKind, ProposalStatus, Transition
from gateway.logs import get_logger
from gateway.ports import ApprovalForge
from gateway.services.change.code_host import forge_of, require_webhook_secret, verified_groups
from gateway.services.change.jobs import enqueue_job
from gateway.services.change.proposals import decide, get_proposal, open_proposal, sync_proposal, withdraw_decisions
from gateway.services.forge.gitlab_events import (
    EVENT_NAMES,
    GitLabEvent,
    MergeRequestEvent,
    NoteEvent,
    PushEvent,
    parse_event,
)
from gateway.services.workspace import Workspace

log = get_logger(__name__)

MAX_BODY = 25 * 1024 * 1024  # GitLab's payloads are far smaller; the route stops reading here
DELIVERY_PREFIX = "gitlab:"  # deliveries share a table with GitHub's: the id says whose it is
APPROVE_ACTIONS = frozenset({"approval", "approved"})  # a person approved (and, with `approved`, the rules are met)
UNAPPROVE_ACTIONS = frozenset({"unapproval", "unapproved"})
GITLAB = SystemActor("gitlab")


def receive_delivery(ws: Workspace, headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
    """Check X-Gitlab-Token in constant time, record the delivery once by X-Gitlab-Event-UUID, queue its handling.

    A missing or wrong token is an AuthError before anything is parsed or written. The same event again (the same
    X-Gitlab-Event-UUID, or a resend that keeps its Idempotency-Key) changes nothing and says so.
    """
    event = headers.get("x-gitlab-event", "").strip()
    label = webhook_event_label(EVENT_NAMES.get(event, "other"))
    try:
        received = _receive(ws, headers, body)
    except GatewayError:
        ws.metrics.webhook_received(label, "refused")
        raise
    ws.metrics.webhook_received(label, "duplicate" if received["duplicate"] else "accepted")
    return received


def token_valid(secret: str, header: str | None) -> bool:
    """Whether X-Gitlab-Token is the secret, compared in constant time (GitLab sends the secret itself, no HMAC)."""
    if not secret or not header:
        return False
    return hmac.compare_digest(secret.encode(), header.encode("utf-8", "replace"))


def _receive(ws: Workspace, headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
    if ws.repo_settings().gitlab is None:
        raise NotFound("no GitLab forge is configured in gateway.yaml")
    secret = require_webhook_secret(ws)
    if secret is None or not token_valid(secret, headers.get("x-gitlab-token")):
        raise AuthError("the webhook token (X-Gitlab-Token) is missing or is not the secret")
    uuid, event = headers.get("x-gitlab-event-uuid", "").strip(), headers.get("x-gitlab-event", "").strip()
    resend = headers.get("idempotency-key", "").strip()
    if not uuid or not event or len(uuid) > 80 or len(event) > 60 or len(resend) > 80:
        raise InputError("a delivery needs the X-Gitlab-Event and X-Gitlab-Event-UUID headers")
    try:
        payload = json.loads(body)
    except ValueError as exc:
        raise InputError("the delivery's body is not JSON") from exc
    if not isinstance(payload, dict):
        raise InputError("the delivery's body is not a JSON object")
    try:
        parsed = parse_event(event, payload)
        handle = parsed is not None and needs_handling(parsed)
    except MalformedDelivery:
        handle = True  # the worker records the refusal, naming the field, where the merge request's trail is
    delivery = DELIVERY_PREFIX + uuid
    action = _action(payload)
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
            project = payload.get("project")
            path = str(project.get("path_with_namespace") or "") if isinstance(project, dict) else ""
            proposal_id = session.github.proposal_for_pull_request(path, number) if number else None
            job_id = session.jobs.add(JobKind.WEBHOOK, proposal_id, GITLAB, {"delivery": delivery, "forge": "gitlab"})
            session.github.set_delivery_job(delivery, job_id)
    return {"delivery": delivery, "duplicate": False, "job": job_id}


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
    with ws.store.session(readonly=True) as session:
        delivery = session.github.delivery(str(job.args.get("delivery")))
    if delivery is None:
        raise NotFound(f"job {job.id} names no recorded delivery")
    hook = {name: hook for hook, name in EVENT_NAMES.items()}.get(delivery.event, delivery.event)
    try:
        event = parse_event(hook, json.loads(delivery.payload))
    except MalformedDelivery as exc:
        with ws.store.session() as session:
            proposal = session.proposals.get(job.proposal_id) if job.proposal_id else None
            session.audit.append(GITLAB, f"gitlab.{exc.event}.refused", {
                "delivery": delivery.id, "reasons": exc.reasons}, job.proposal_id,
                proposal.stacks if proposal else ())
        raise Refused(exc.reasons) from exc
    if event is None:
        return {"ignored": f"{delivery.event} deliveries are recorded, not handled"}
    settings = ws.repo_settings().gitlab
    if settings is None or event.project.path_with_namespace != settings.repository:
        return {"ignored": f"a delivery for {event.project.path_with_namespace}, which is not this gateway's project"}
    forge = cast(ApprovalForge, forge_of(ws))
    result = _dispatch(ws, forge, event)
    lag = ws.clock.now() - delivery.received_at
    ws.metrics.webhook_handled(webhook_event_label(delivery.event), max(0.0, lag.total_seconds()))
    return result


def _dispatch(ws: Workspace, forge: ApprovalForge, event: GitLabEvent) -> dict[str, Any]:
    if isinstance(event, MergeRequestEvent):
        return _on_merge_request(ws, forge, event)
    if isinstance(event, NoteEvent):
        return _on_note(ws, forge, event)
    return _on_push(ws, forge, event)


# --- Merge Request Hook ------------------------------------------------------------------------


def _on_merge_request(ws: Workspace, forge: ApprovalForge, event: MergeRequestEvent) -> dict[str, Any]:
    mr, action = event.object_attributes, event.object_attributes.action or ""
    proposal_id = _proposal_id(ws, forge, mr.iid)
    if action in ("open", "reopen"):
        return _on_opened(ws, forge, event, proposal_id)
    if proposal_id is None:
        return {"ignored": f"merge request !{mr.iid} has no proposal"}
    if action in APPROVE_ACTIONS:
        return _on_approval(ws, forge, event, proposal_id)
    if action in UNAPPROVE_ACTIONS:
        person = _person(ws, event.user.id)
        if person is None:
            return {"ignored": f"{event.user.username} is not linked"}
        withdraw_decisions(ws, _actor(event.user.username), person, proposal_id,
                           f"approval withdrawn on GitLab by {event.user.username}",
                           made_by=_approval_auth(event.user.username, get_proposal(ws, proposal_id).head_sha))
        return {"withdrawn": person.name}
    if action == "update" and mr.oldrev:  # commits were pushed: whoever pushed shares in proposing it
        with ws.store.session() as session:
            session.audit.append(_actor(event.user.username), "gitlab.pushed", {
                "number": mr.iid, "gitlab_id": event.user.id, "login": event.user.username, "before": mr.oldrev,
                "head_sha": mr.last_commit.id if mr.last_commit else None}, proposal_id)
        forge.fetch_main(ws.main_branch())
        forge.sync_branch(mr.source_branch)
        _, changes = sync_proposal(ws, proposal_id)
        return {"changes": changes}
    if action in ("close", "merge"):
        return _on_closed(ws, event, proposal_id)
    return {"ignored": f"merge request {action or 'event'}"}


def _on_opened(ws: Workspace, forge: ApprovalForge, event: MergeRequestEvent,
               proposal_id: int | None) -> dict[str, Any]:
    mr = event.object_attributes
    number, branch = mr.iid, mr.source_branch
    if proposal_id is not None and get_proposal(ws, proposal_id).status in ACTIVE:
        return {"ignored": f"merge request !{number} is proposal {proposal_id} already"}
    reasons = []
    if mr.source_project_id != mr.target_project_id:  # checked first: a fork's branch may share a proposal's name
        reasons.append(f"merge request !{number} comes from a fork (project {mr.source_project_id}): the gateway "
                       f"plans only branches of {forge.settings.repository}, whose code it may run")
    if mr.target_branch != ws.main_branch():
        reasons.append(f"merge request !{number} targets {mr.target_branch}; the gateway plans changes to "
                       f"{ws.main_branch()} only")
    with ws.store.session() as session:
        ours = session.proposals.open_for_branch(branch) if not reasons else None
        if ours is not None and session.proposals.get(ours).kind == ProposalKind.DRIFT_REVERT:
            ours = None
        if ours is not None and session.github.pull_request_of(ours) is None:  # the gateway opened it a moment ago
            session.github.link_pull_request(ours, forge.settings.repository, number)
        author = session.principals.by_gitlab_id(mr.author_id)
    if ours is not None:
        return {"linked": ours}
    if author is None and not reasons:
        reasons.append(f"GitLab user {mr.author_id} ({event.user.username} opened it) is not linked to a gateway "
                       f"person (an admin runs `gateway users link NAME --gitlab USERNAME`)")
    if not reasons:
        assert author is not None
        forge.fetch_main(ws.main_branch())
        forge.sync_branch(branch)
        reason = "\n\n".join(p for p in (mr.title, mr.description or "") if p.strip())[:4000]
        try:
            proposal = open_proposal(ws, author, branch, reason or f"merge request !{number}")
        except GatewayError as exc:
            reasons = exc.reasons if isinstance(exc, Refused) else [str(exc)]
        else:
            with ws.store.session() as session:
                session.github.link_pull_request(proposal.id, forge.settings.repository, number)
            return {"opened": proposal.id}
    with ws.store.session() as session:
        session.audit.append(_actor(event.user.username), "gitlab.merge_request.refused", {
            "number": number, "reasons": reasons, "head_sha": mr.last_commit.id if mr.last_commit else None})
    forge.reply(number, "The change gateway does not plan this merge request:\n\n"
                + "\n".join(f"- {r}" for r in reasons))
    return {"refused": reasons}


def _on_closed(ws: Workspace, event: MergeRequestEvent, proposal_id: int) -> dict[str, Any]:
    mr, who = event.object_attributes, event.user.username
    actor = _actor(who)
    with ws.store.session() as session:
        proposal = session.proposals.get(proposal_id, lock=True)
        if mr.action == "merge":
            head = mr.last_commit.id if mr.last_commit else None
            if proposal.status == ProposalStatus.APPLIED:
                return {"merged": mr.merge_commit_sha}
            if proposal.status == ProposalStatus.UNMERGED and head == proposal.head_sha:
                session.audit.append(actor, "gitlab.merged_unmerged", {
                    "number": mr.iid, "merge_commit_sha": mr.merge_commit_sha,
                    "next": f"GitLab merged the applied head; `gateway merge {proposal_id}` records it"},
                    proposal_id, proposal.stacks)
                return {"merged_after_apply": mr.merge_commit_sha}
            warning = (f"merge request !{mr.iid} was merged on GitLab by {who} while proposal {proposal_id} is "
                       f"{proposal.status.value}: main now describes changes that were never applied")
            session.audit.append(actor, "gitlab.merged_without_apply", {
                "number": mr.iid, "merge_commit_sha": mr.merge_commit_sha, "warning": warning},
                proposal_id, proposal.stacks)
            log.error("gitlab.merged_without_apply", proposal=proposal_id, number=mr.iid)
            if proposal.status in DECIDABLE:
                proposal.move(Transition.ABANDON, actor, {"reason": warning})
                session.proposals.save(proposal)
            return {"merged_without_apply": warning}
        if proposal.status in DECIDABLE:
            proposal.move(Transition.ABANDON, actor, {
                "reason": f"merge request !{mr.iid} closed on GitLab by {who} without merging"})
            session.proposals.save(proposal)
            return {"abandoned": proposal_id}
    return {"ignored": f"proposal {proposal_id} is {proposal.status.value}"}


def _on_approval(ws: Workspace, forge: ApprovalForge, event: MergeRequestEvent, proposal_id: int) -> dict[str, Any]:
    """An approval on GitLab: of the head the merge request had when it was given, if GitLab still lists it."""
    mr = event.object_attributes
    approved_head = mr.last_commit.id if mr.last_commit else None
    auth = _approval_auth(event.user.username, approved_head)
    seen = get_proposal(ws, proposal_id)  # the plans shown while the approver looked
    if any(d.auth == auth for d in seen.current_approvals):
        return {"ignored": f"{event.user.username}'s approval of {str(approved_head)[:12]} counts already"}
    # An approval of the head the gateway planned binds to those plans without fetching: a later push reaches the
    # gateway as an `update` delivery, which runs before this one or makes the approval stale, and the apply fetches
    # again. Any other is judged against main and the branch as GitLab has them now.
    current = seen.status in DECIDABLE and seen.head_sha == approved_head
    proposal = seen if current else _catch_up(ws, forge, proposal_id)
    account = forge.account(event.user.id)
    person = _person(ws, account.id)
    reasons = _identity_refusals(account, person)
    if not reasons:
        reasons = approval_replay_refusals(account, mr.iid, forge.approver_ids(mr.iid))
    if not reasons:
        reasons = approval_head_refusals(approved_head, proposal.head_sha)
    if reasons:
        _refuse(ws, account, proposal, Decision.APPROVE, reasons, auth)
    assert person is not None
    _decide_on_gitlab(ws, forge, person, account, proposal, Decision.APPROVE, "approved on GitLab", auth,
                      seen_sha=approved_head, seen_digests=seen.current_digests if seen.head_sha == approved_head
                      else None)
    return {Decision.APPROVE.value: person.name}


# --- Note Hook: /gateway commands ------------------------------------------------------------------


def _on_note(ws: Workspace, forge: ApprovalForge, event: NoteEvent) -> dict[str, Any]:
    note = event.object_attributes
    if not needs_handling(event) or event.merge_request is None:
        return {"ignored": "not a new /gateway note on a merge request"}
    command = parse_command(note.note)
    assert command is not None
    number = event.merge_request.iid
    proposal_id = _proposal_id(ws, forge, number)
    if proposal_id is None:
        forge.reply(number, "This merge request has no proposal in the change gateway.")
        return {"ignored": "no proposal"}
    auth = f"gitlab-note:{event.user.username}#{note.id}"
    account = forge.account(event.user.id)
    person = _person(ws, account.id)
    proposal = get_proposal(ws, proposal_id)
    reasons = _identity_refusals(account, person)
    if not reasons:
        reasons = note_replay_refusals(note.id, (note.note, account.id), forge.comment(number, note.id))
    if reasons:
        _refuse(ws, account, proposal, command.kind, reasons, auth)
    assert person is not None
    return COMMANDS[command.kind](ws, forge, person, account, proposal, command, auth)


def _command_plan(ws: Workspace, forge: ApprovalForge, person: Principal, account: GitLabAccount, proposal: Proposal,
                  command: Command, auth: str) -> dict[str, Any]:
    return {"job": enqueue_job(ws, person, JobKind.PLAN, proposal.id).id}


def _command_apply(ws: Workspace, forge: ApprovalForge, person: Principal, account: GitLabAccount,
                   proposal: Proposal, command: Command, auth: str) -> dict[str, Any]:
    return {"job": enqueue_job(ws, person, JobKind.APPLY, proposal.id).id}


def _command_decide(ws: Workspace, forge: ApprovalForge, person: Principal, account: GitLabAccount,
                    proposal: Proposal, command: Command, auth: str) -> dict[str, Any]:
    decision = Decision.APPROVE if command.kind == CommandKind.APPROVE else Decision.REJECT
    seen = None
    if decision == Decision.APPROVE:
        current = plan_fingerprint(proposal.current_digests)
        prefix = command.argument.strip().lower()
        if len(prefix) < MIN_FINGERPRINT or not current.startswith(prefix):
            _refuse(ws, account, proposal, decision, [
                f"`/gateway approve {prefix or '…'}` does not name the current plan {current[:12]} (give at least "
                f"{MIN_FINGERPRINT} characters of the plan id the note shows)"], auth)
        seen = proposal.current_digests
    _decide_on_gitlab(ws, forge, person, account, _catch_up(ws, forge, proposal.id), decision,
                      command.argument if decision == Decision.REJECT else "approved with /gateway approve", auth,
                      seen_sha=proposal.head_sha, seen_digests=seen)
    return {decision.value: person.name}


def _command_ask(ws: Workspace, forge: ApprovalForge, person: Principal, account: GitLabAccount, proposal: Proposal,
                 command: Command, auth: str) -> dict[str, Any]:
    from gateway.services.agents.agent_requests import submit_request  # the agent only when asked

    with ws.store.session(readonly=True) as session:
        conversation = session.conversations.of_proposal(proposal.id)
        link = session.github.pull_request_of(proposal.id)
    if conversation is None or conversation.requester_id != person.id:
        _refuse(ws, account, proposal, command.kind, [
            "only the person who asked the agent for this change can ask it to revise the branch"], auth)
    assert conversation is not None and link is not None
    outcome = submit_request(ws, person, command.argument, conversation.id)
    if outcome.question:
        forge.reply(link.number, f"The agent asks @{account.username}: {outcome.question}\n\n"
                    "Answer with `/gateway ask <your answer>`.")
    return {"asked": conversation.id, "stopped": outcome.stopped, "changed_files": outcome.changed_files,
            "question": outcome.question}


CommandHandler = Callable[[Workspace, ApprovalForge, Principal, GitLabAccount, Proposal, Command, str],
                          dict[str, Any]]
COMMANDS: dict[CommandKind, CommandHandler] = {
    CommandKind.PLAN: _command_plan, CommandKind.APPLY: _command_apply, CommandKind.APPROVE: _command_decide,
    CommandKind.REJECT: _command_decide, CommandKind.ASK: _command_ask,
}


# --- Push Hook ----------------------------------------------------------------------------------


def _on_push(ws: Workspace, forge: ApprovalForge, event: PushEvent) -> dict[str, Any]:
    """Main moved on GitLab: fetch it, and say so loudly when the gateway did not merge it. A push to a proposal's
    branch names its pusher, who then shares in proposing it (the merge request's `update` re-plans)."""
    branch = event.ref.removeprefix("refs/heads/")
    if event.ref != f"refs/heads/{ws.main_branch()}":
        with ws.store.session() as session:
            proposal_id = session.proposals.open_for_branch(branch) if event.ref.startswith("refs/heads/") else None
            if proposal_id is not None and event.after.strip("0"):
                session.audit.append(_actor(event.user_username), "gitlab.pushed", {
                    "gitlab_id": event.user_id, "login": event.user_username, "before": event.before,
                    "head_sha": event.after}, proposal_id)
        return {"recorded_pusher": proposal_id} if proposal_id else {"ignored": f"push to {event.ref}"}
    forge.fetch_main(ws.main_branch())
    before, after = event.before, event.after
    with ws.store.session() as session:
        if not session.proposals.merged_as(after):  # not the gateway's merge: main moved outside the gateway
            settings = ws.repo_settings()
            paths = ws.repo.changed_paths(before, after) if before.strip("0") else []
            stacks = settings.stacks_touched(paths, lambda path: ws.repo.module_directories(after, path)) \
                if paths else []
            session.audit.append(_actor(event.user_username), "gitlab.main_pushed", {
                "before": before, "after": after, "stacks": stacks, "changed_paths": paths[:200],
                "warning": f"{event.user_username} pushed to {ws.main_branch()} outside the gateway"
                           + (f": stacks {', '.join(stacks)} now describe what was never applied" if stacks else "")},
                None, stacks)
    return {"fetched": ws.main_branch()}


# -----------------------------------------------------------------------------------------------------


def _decide_on_gitlab(ws: Workspace, forge: ApprovalForge, person: Principal, account: GitLabAccount,
                      proposal: Proposal, decision: Decision, comment: str, auth: str, seen_sha: str | None,
                      seen_digests: Mapping[str, str] | None = None) -> None:
    """Decide as the person, counting only the groups whose GitLab group they are an active member of now."""
    reasons = pusher_refusals(account, _pushes(ws, proposal.id), on="merge request")
    if reasons:
        _refuse(ws, account, proposal, decision, reasons, auth)
    groups, checked = verified_groups(forge, person, account.username, account.id)
    with ws.store.session() as session:
        session.audit.append(person, "gitlab.group_check", {
            "login": account.username, "gitlab_id": account.id,
            "teams": {g: forge.settings.teams[g] for g in checked}, "active": sorted(groups),
            "not_member": sorted(g for g, ok in checked.items() if not ok), "head_sha": proposal.head_sha},
            proposal.id, proposal.stacks)
    decide(ws, replace(person, groups=groups), proposal.id, decision, comment, seen_sha, auth, seen_digests)


def _pushes(ws: Workspace, proposal_id: int) -> list[Push]:
    """Every push to the merge request's branch GitLab told of, from the trail, oldest first."""
    with ws.store.session(readonly=True) as session:
        events = session.audit.events(proposal_id=proposal_id, kind="gitlab.pushed")
    return [Push(int(e.payload["gitlab_id"]), str(e.payload.get("login")), e.payload.get("head_sha"))
            for e in events if isinstance(e.payload.get("gitlab_id"), int)]


def _identity_refusals(account: GitLabAccount, person: Principal | None) -> list[str]:
    reasons = bot_refusals(account)
    if not reasons and person is None:
        reasons.append(not_linked("GitLab", account.username))
    return reasons


def _refuse(ws: Workspace, account: GitLabAccount, proposal: Proposal, what: Decision | CommandKind,
            reasons: list[str], auth: str) -> NoReturn:
    with ws.store.session() as session:
        session.audit.append(_actor(account.username), f"{what.value}.refused", {
            "reasons": reasons, "head_sha": proposal.head_sha, "authenticated_by": auth}, proposal.id,
            proposal.stacks)
    raise Refused(reasons)


def _catch_up(ws: Workspace, forge: ApprovalForge, proposal_id: int) -> Proposal:
    """Fetch main and the branch from GitLab and re-plan if either moved, so decisions bind to what GitLab shows."""
    proposal = get_proposal(ws, proposal_id)
    if proposal.status in DECIDABLE:
        forge.fetch_main(ws.main_branch())
        forge.sync_branch(proposal.branch)
        proposal, _ = sync_proposal(ws, proposal_id)
    return proposal


def _approval_auth(username: str, head: str | None) -> str:
    return f"gitlab-approval:{username}@{(head or 'unknown')[:12]}"


def _person(ws: Workspace, gitlab_id: int) -> Principal | None:
    with ws.store.session(readonly=True) as session:
        return session.principals.by_gitlab_id(gitlab_id)


def _actor(username: str) -> SystemActor:
    return SystemActor(f"gitlab:{username}")


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


def _proposal_id(ws: Workspace, forge: ApprovalForge, number: int) -> int | None:
    with ws.store.session(readonly=True) as session:
        return session.github.proposal_for_pull_request(forge.settings.repository, number)


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

