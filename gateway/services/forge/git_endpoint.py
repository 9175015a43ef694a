"""The gateway's own git endpoint, for teams without a forge: who may clone and push, which branches a push may
not touch, and what a push does (`propose_on_push` in main's gateway.yaml: open or update its branch's proposal).

The protocol is git's own (`adapters/git/http_backend.py`); the rules here are the gateway's: a person's gateway
token is the password (HTTP basic), anyone who may read fetches, anyone who may request a change pushes branches,
nobody pushes to main or to the gateway's own refs (the hooks refuse it, naming why), and a push is recorded in the
trail as `git.pushed` by the person who made it.
"""

from __future__ import annotations

import base64
import binascii

from gateway.domain.errors import AuthError, GatewayError, Refused
from gateway.domain.jobs import JobKind
from gateway.domain.lifecycle import ACTIVE
from gateway.domain.permissions import Action, refusals
from gateway.domain.principals import Principal
from gateway.logs import get_logger
from gateway.services.admin.users import authenticate
from gateway.services.change.jobs import enqueue_job
from gateway.services.change.proposals import open_proposal
from gateway.services.workspace import Records, Workspace

log = get_logger(__name__)


def git_principal(ws: Records, authorization: str | None, pushing: bool) -> Principal:
    """The person a request's HTTP basic credentials (the gateway token as the password) belong to.

    No or unreadable credentials, an unknown or expired token, a disabled person: AuthError. Pushing needs the
    right to request changes (agents push through the gateway's own tools, never here): Refused.
    """
    token = _basic_password(authorization)
    principal = authenticate(ws, token)
    if principal.is_agent:
        raise Refused([f"{principal.name} is an agent: agents change branches through the gateway's tools, "
                       "not its git endpoint"])
    if pushing:
        reasons = refusals(principal, Action.REQUEST)
        if reasons:
            raise Refused([f"{principal.name} may not push branches: " + "; ".join(reasons)])
    return principal


def held_branches(ws: Records) -> list[str]:
    """Branches an open proposal stands on: a push may move them, never delete them."""
    with ws.store.session(readonly=True) as session:
        return sorted({basis.branch for basis in session.proposals.plan_bases(ACTIVE)})


def after_push(ws: Workspace, pusher: Principal, updates: list[tuple[str, str, str]]) -> None:
    """Record the push; with `propose_on_push`, open the proposal of each branch pushed, or re-plan its proposal."""
    main = ws.main_branch()
    settings = ws.repo_settings()
    for old, new, ref in updates:
        branch = ref.removeprefix("refs/heads/")
        with ws.store.session() as session:
            proposal_id = session.proposals.open_for_branch(branch)
            session.audit.append(pusher, "git.pushed", {"ref": ref, "before": old, "after": new,
                                                        "via": "the gateway's git endpoint"}, proposal_id)
        if not settings.propose_on_push or branch == main or not new.strip("0"):
            continue
        try:
            if proposal_id is not None:
                enqueue_job(ws, pusher, JobKind.PLAN, proposal_id)
            else:
                open_proposal(ws, pusher, branch, f"pushed to {branch} by {pusher.name}")
        except GatewayError as exc:  # the push stands; the trail says why it proposed nothing
            reasons = exc.reasons if isinstance(exc, Refused) else [str(exc)]
            with ws.store.session() as session:
                session.audit.append(pusher, "git.propose.refused", {"branch": branch, "head_sha": new,
                                                                     "reasons": reasons}, proposal_id)
            log.info("git.propose_refused", branch=branch, reasons=reasons)


def _basic_password(authorization: str | None) -> str | None:
    if not authorization or not authorization.lower().startswith("basic "):
        return None
    try:
        decoded = base64.b64decode(authorization[6:].strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise AuthError("the Authorization header is not valid HTTP basic credentials") from None
    _, _, password = decoded.partition(":")
    return password or None
