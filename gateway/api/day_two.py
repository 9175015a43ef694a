"""Day two over HTTP: drift records (API list and page) and break-glass windows (on the same page)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from pydantic import BaseModel

from gateway.adapters.store.rows import now
from gateway.api.deps import ActorDep, PageActorDep, WorkspaceDep
from gateway.api.pages import render
from gateway.api.routes import ERRORS
from gateway.services.day_two.break_glass import windows_of
from gateway.services.day_two.drift_records import list_drift_records

api = APIRouter(prefix="/api/v1", responses=ERRORS)
pages = APIRouter(include_in_schema=False)


class DriftAttributePublic(BaseModel):
    path: str
    before: str | None  # what the gateway recorded (masked)
    after: str | None  # reality now (masked)


class DriftResourcePublic(BaseModel):
    address: str
    summary: str
    reverted_by_apply: bool
    attributes: list[DriftAttributePublic]


class DriftRecordPublic(BaseModel):
    id: int
    stack: str
    status: str
    expected: bool
    opened_at: str
    updated_at: str
    closed_at: str | None
    closed_by: str | None
    closed_reason: str | None
    closed_by_proposal: int | None
    break_glass_id: int | None
    resources: list[DriftResourcePublic]


class BreakGlassPublic(BaseModel):
    id: int
    stack: str
    state: str  # awaiting confirmation | open | codify due | overdue | acknowledged | settled | cancelled
    reason: str
    opened_by: str
    confirmed_by: str | None
    opened_at: str | None
    ended_at: str | None
    codify_by: str | None
    acknowledged_by: str | None
    acknowledgement: str | None


StackQuery = Annotated[str | None, Query(max_length=100, description="only this stack's records")]


@api.get("/drift", response_model=list[DriftRecordPublic], tags=["drift"])
def drift_records(ws: WorkspaceDep, actor: ActorDep, stack: StackQuery = None,
                  open: Annotated[bool, Query(description="only open records")] = False) -> list[DriftRecordPublic]:
    """Drift records, newest first: what changed outside the gateway per stack, masked, and how each ended."""
    return [DriftRecordPublic(**r.to_public()) for r in list_drift_records(ws, actor, stack, open)]


@api.get("/break-glass", response_model=list[BreakGlassPublic], tags=["drift"])
def break_glass_windows(ws: WorkspaceDep, actor: ActorDep) -> list[BreakGlassPublic]:
    """Break-glass windows, newest first, with where each stands (an overdue one holds applies on its stack)."""
    del actor  # any signed-in principal may read them
    settings = ws.repo_settings().break_glass
    moment = now()
    return [BreakGlassPublic(
        id=w.id, stack=w.stack, state=w.state(moment, settings).value, reason=w.reason, opened_by=w.opened_by,
        confirmed_by=w.confirmed_by, opened_at=_iso(w.opened_at), ended_at=_iso(w.ended_at),
        codify_by=_iso(w.codify_by(settings)), acknowledged_by=w.acknowledged_by, acknowledgement=w.acknowledgement)
        for w in windows_of(ws)]


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


@pages.get("/drift")
def drift_page(request: Request, ws: WorkspaceDep, actor: PageActorDep) -> HTMLResponse:
    settings = ws.repo_settings().break_glass
    moment = now()
    windows = [(w, w.state(moment, settings).value, w.codify_by(settings)) for w in windows_of(ws)]
    return render(request, "drift.html", actor, records=list_drift_records(ws, actor), windows=windows)
