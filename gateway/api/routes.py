"""The versioned JSON API: thin routes over the same services as the CLI."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from gateway.api.deps import ActorDep, BearerDep, JobId, ProposalId, WorkspaceDep, read_as_api_actor, repository_asked
from gateway.api.schemas import (
    DecisionCreate,
    DeliveryPublic,
    ErrorPublic,
    EventPublic,
    Health,
    InboxEntry,
    JobPublic,
    OverrideCreate,
    ProposalPublic,
    ProposalSummary,
    Readiness,
    RejectionCreate,
    RequestCreate,
    RequestPublic,
    VerifyPublic,
)
from gateway.api.scrubbing import ScrubbedResponse
from gateway.domain.audit import AuditEvent, Checkpoint
from gateway.domain.errors import InputError
from gateway.domain.jobs import JobKind
from gateway.domain.operations import failed_checks
from gateway.domain.preview import RENDERERS
from gateway.domain.proposal import Decision
from gateway.services.admin import audit as audit_service
from gateway.services.admin.operations import check_readiness
from gateway.services.agents.agent_runs import get_agent_run, start_agent_run
from gateway.services.change.inbox_all import RepositoryInboxItem, inbox_everywhere
from gateway.services.change.jobs import approve_proposal, enqueue_job
from gateway.services.change.proposals import decide, get_proposal, override_finding, proposal_previews
from gateway.services.change.views import inbox, list_proposal_rows, view_proposal
from gateway.services.forge.github_webhooks import MAX_BODY, receive_delivery
from gateway.services.forge.gitlab_webhooks import MAX_BODY as GITLAB_MAX_BODY
from gateway.services.forge.gitlab_webhooks import receive_delivery as receive_gitlab_delivery

ERRORS = {status: {"model": ErrorPublic} for status in (401, 403, 404, 409, 422, 503)}
TEXT = {200: {"content": {"text/plain": {"schema": {"type": "string"}}}}}
CSV_OR_JSONL = {200: {"content": {"text/csv": {"schema": {"type": "string"}},
                                  "application/x-ndjson": {"schema": {"type": "string"}}}}}
router = APIRouter(prefix="/api/v1", responses=ERRORS)
ProposalQuery = Annotated[int | None, Query(ge=1, le=2**31 - 1, description="only this proposal's events")]


@router.get("/health", response_model=Health, tags=["service"])
def health(ws: WorkspaceDep) -> Health:
    """Liveness: the process answers. It touches nothing else (a database outage is /ready's to report)."""
    return Health(status="ok", database=ws.store.dialect, engine=ws.engine.name)


@router.get("/ready", response_model=Readiness, tags=["service"], responses={503: {"model": Readiness}})
def ready(ws: WorkspaceDep) -> Response:
    """Readiness: the database answers at this version's schema, the workspace and the keys read (else 503)."""
    checks = check_readiness(ws)
    failed = failed_checks(checks)
    body = Readiness(status="not ready" if failed else "ready", checks={c.name: c.failure or "ok" for c in checks},
                     failed=[c.name for c in failed],
                     reason="; ".join(f"{c.name}: {c.failure}" for c in failed) or None)
    return JSONResponse(body.model_dump(), status_code=503 if failed else 200)


@router.post("/requests", response_model=RequestPublic, status_code=202, tags=["agent"])
def create_request(body: RequestCreate, ws: WorkspaceDep, actor: ActorDep) -> RequestPublic:
    """Ask the agent for a change; follow its progress at /requests/{id}."""
    return RequestPublic.of(start_agent_run(ws, actor, body.text, body.conversation_id))


@router.get("/requests/{run_id}", response_model=RequestPublic, tags=["agent"])
def read_request(run_id: str, ws: WorkspaceDep, actor: ActorDep) -> RequestPublic:
    """Where the request is: queued, running, or how it ended (poll until `finished`)."""
    return RequestPublic.of(get_agent_run(ws, actor, run_id))


@router.get("/proposals", response_model=list[ProposalSummary], tags=["proposals"])
def list_proposals(ws: WorkspaceDep, actor: ActorDep, status: str | None = None) -> list[ProposalSummary]:
    """Proposals waiting for your approval first, then newest first."""
    return [ProposalSummary(id=r.id, branch=r.branch, status=r.status, stacks=r.stacks, reason=r.reason,
                            requester=r.requester, proposer=r.proposer, risk=r.risk, blocked_by=r.blocked_by,
                            created_at=r.created_at, waiting_for_you=r.waiting_for_you)
            for r in list_proposal_rows(ws, actor, status)]


EveryRepository = Annotated[bool, Query(description="what waits in every active repository of the gateway, not "
                                                  "only in the one asked")]


@router.get("/inbox", response_model=list[InboxEntry], tags=["proposals"])
def read_inbox(ws: WorkspaceDep, actor: ActorDep, all_repositories: EveryRepository = False) -> list[InboxEntry]:
    """Waiting for you: what you can approve or reject now, and why each needs you (group, risk tier, quorum)."""
    items = (inbox_everywhere(ws, actor) if all_repositories
             else [RepositoryInboxItem(ws.repository, item) for item in inbox(ws, actor)])
    return [InboxEntry(**item.to_public()) for item in items]


def proposal_document(ws: WorkspaceDep, actor: ActorDep, proposal_id: int) -> Response:
    """The ProposalPublic document, served as the view writes it (its stored previews are never re-encoded), already
    scrubbed: the middleware would scrub a big one's megabyte again on every read."""
    return ScrubbedResponse(view_proposal(ws, actor, proposal_id).public_body(ws.scrubber), ws.scrubber)


@router.get("/proposals/{proposal_id}", response_model=ProposalPublic, tags=["proposals"])
async def read_proposal(request: Request, proposal_id: ProposalId, ws: WorkspaceDep,
                        credentials: BearerDep) -> Response:
    # the token's check and the read in one hop to the read lane (each hop costs a small read as much as its
    # queries) and one read unit of work: one transaction, one snapshot
    return await read_as_api_actor(request, ws, credentials, lambda actor: proposal_document(ws, actor, proposal_id))


@router.get("/proposals/{proposal_id}/preview", response_model=None, responses=TEXT, tags=["proposals"])
def read_preview(proposal_id: ProposalId, ws: WorkspaceDep, actor: ActorDep,
                 format: Annotated[Literal["text", "markdown", "json"], Query()] = "markdown") -> PlainTextResponse:
    proposal = get_proposal(ws, proposal_id)
    return PlainTextResponse("\n".join(f"## {stack}\n\n{RENDERERS[format](preview)}"
                                       for stack, preview in proposal_previews(ws, proposal).items()))


@router.get("/proposals/{proposal_id}/diff", response_model=None, responses=TEXT, tags=["proposals"])
def read_diff(proposal_id: ProposalId, ws: WorkspaceDep, actor: ActorDep) -> PlainTextResponse:
    proposal = get_proposal(ws, proposal_id)
    return PlainTextResponse(ws.repo.diff(proposal.base_sha, proposal.head_sha))


@router.post("/proposals/{proposal_id}/approve", response_model=ProposalPublic, tags=["decisions"])
def approve(proposal_id: ProposalId, body: DecisionCreate, ws: WorkspaceDep, actor: ActorDep) -> Response:
    approve_proposal(ws, actor, proposal_id, body.comment, body.sha, seen_digests=body.digests)
    return proposal_document(ws, actor, proposal_id)


@router.post("/proposals/{proposal_id}/reject", response_model=ProposalPublic, tags=["decisions"])
def reject(proposal_id: ProposalId, body: RejectionCreate, ws: WorkspaceDep, actor: ActorDep) -> Response:
    decide(ws, actor, proposal_id, Decision.REJECT, body.comment)
    return proposal_document(ws, actor, proposal_id)


@router.post("/proposals/{proposal_id}/overrides", response_model=ProposalPublic, tags=["decisions"])
def override(proposal_id: ProposalId, body: OverrideCreate, ws: WorkspaceDep, actor: ActorDep) -> Response:
    override_finding(ws, actor, proposal_id, body.finding, body.reason, body.expires_at)
    return proposal_document(ws, actor, proposal_id)


@router.post("/proposals/{proposal_id}/apply", response_model=JobPublic, status_code=202, tags=["apply"])
def apply(proposal_id: ProposalId, ws: WorkspaceDep, actor: ActorDep) -> JobPublic:
    """Queue the apply; a worker runs it. Poll `/jobs/{id}` for its progress and end."""
    return JobPublic.of(enqueue_job(ws, actor, JobKind.APPLY, proposal_id))


@router.post("/proposals/{proposal_id}/plan", response_model=JobPublic, status_code=202, tags=["proposals"])
def replan(proposal_id: ProposalId, ws: WorkspaceDep, actor: ActorDep) -> JobPublic:
    """Queue a re-plan (after the branch, main or a stack's state moved); reads never re-plan."""
    return JobPublic.of(enqueue_job(ws, actor, JobKind.PLAN, proposal_id))


@router.get("/jobs/{job_id}", response_model=JobPublic, tags=["jobs"])
def read_job(job_id: JobId, ws: WorkspaceDep, actor: ActorDep) -> JobPublic:
    return JobPublic.of(ws.store.queue.get(job_id))


@router.post("/github/webhook", response_model=DeliveryPublic, status_code=202, tags=["github"])
async def github_webhook(request: Request, ws: WorkspaceDep) -> DeliveryPublic:
    """GitHub's deliveries: the signature is checked over the raw body first; the work is a job's."""
    body = bytearray()
    async for chunk in request.stream():  # counted as it comes: a chunked body has no Content-Length
        body += chunk
        if len(body) > MAX_BODY:
            raise InputError(f"a delivery is at most {MAX_BODY // (1024 * 1024)} MB")
    return DeliveryPublic(**await run_in_threadpool(receive_delivery, ws, request.headers, bytes(body)))


@router.post("/gitlab/webhook", response_model=DeliveryPublic, status_code=202, tags=["gitlab"])
async def gitlab_webhook(request: Request, ws: WorkspaceDep) -> DeliveryPublic:
    """GitLab's deliveries: X-Gitlab-Token is checked first (constant time); the work is a job's."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > GITLAB_MAX_BODY:
            raise InputError(f"a delivery is at most {GITLAB_MAX_BODY // (1024 * 1024)} MB")
    return DeliveryPublic(**await run_in_threadpool(receive_gitlab_delivery, ws, request.headers, bytes(body)))


# The trail is the gateway's, one for every repository: a request that names one (`?repo=NAME`, or the path's
# `/api/v1/repos/NAME/` prefix) lists that repository's events only.
RepoFilter = Annotated[str | None, Query(description="a declaration repository: its events only (as the "
                                                     "/api/v1/repos/NAME/ prefix)")]


@router.get("/audit/events", response_model=list[EventPublic], tags=["audit"])
def audit_events(request: Request, response: Response, ws: WorkspaceDep, actor: ActorDep,
                 proposal: ProposalQuery = None,
                 person: str | None = None, stack: str | None = None, since: datetime | None = None,
                 until: datetime | None = None,
                 address: Annotated[str | None, Query(description="exact, or a prefix ending in *")] = None,
                 action: str | None = None, outcome: str | None = None,
                 after: Annotated[int, Query(ge=0, le=2**62, description="only events after this one")] = 0,
                 limit: Annotated[int, Query(ge=1, le=10_000)] = 1000, repo: RepoFilter = None) -> list[EventPublic]:
    """A page of events, oldest first; when it is full, `X-Next-After` says where the next page starts."""
    events = audit_service.list_events(ws, actor, proposal, person, stack, since and since.isoformat(),
                                       until and until.isoformat(), address, action, outcome, after, limit,
                                       repository_asked(request))
    if len(events) == limit:
        response.headers["X-Next-After"] = str(events[-1].seq)
    return [EventPublic(**e.content(), prev_hash=e.prev_hash, hash=e.hash) for e in events]


@router.get("/audit/export", response_model=None, responses=CSV_OR_JSONL, tags=["audit"])
def audit_export(request: Request, ws: WorkspaceDep, actor: ActorDep, format: Literal["jsonl", "csv"] = "jsonl",
                 proposal: ProposalQuery = None, address: str | None = None,
                 repo: RepoFilter = None) -> PlainTextResponse:
    repository = repository_asked(request)
    with ws.store.session(readonly=True) as session:  # the checkpoints sign the whole trail: with it whole only
        checkpoints = session.audit.checkpoints() if proposal is None and address is None and not repository else []
    return export_response(audit_service.list_events(ws, actor, proposal, address=address, repository=repository),
                           format, checkpoints)


def export_response(events: list[AuditEvent], format: str, checkpoints: Sequence[Checkpoint] = ()) -> PlainTextResponse:
    """Events as a CSV or JSONL download (the API and the audit page serve the same file)."""
    media = "text/csv" if format == "csv" else "application/x-ndjson"
    return PlainTextResponse(audit_service.export_events(events, format, checkpoints), media_type=media,
                             headers={"Content-Disposition": f'attachment; filename="audit.{format}"'})


@router.get("/audit/verify", response_model=VerifyPublic, tags=["audit"])
def audit_verify(ws: WorkspaceDep, actor: ActorDep) -> VerifyPublic:
    count, broken = audit_service.verify_trail(ws, actor)
    if broken is None:
        return VerifyPublic(intact=True, events=count)
    return VerifyPublic(intact=False, events=count, broken_at=broken.seq, reason=broken.reason)
