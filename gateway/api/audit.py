"""Evidence for auditors over HTTP: the change population of a period (JSON, CSV), its exceptions and checks, samples,
and each change's signed evidence bundle (JSON for tools, HTML for people); and the auditor's pages, which open on
the exceptions. Thin routes over services/admin/evidence.py: the CLI prints what these serve."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from importlib.resources import files
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, Response
from pydantic import BaseModel, Field

from gateway.api.deps import ActorDep, PageActorDep, ProposalId, WorkspaceDep
from gateway.api.evidence_html import evidence_context
from gateway.api.pages import check_csrf, render
from gateway.api.routes import ERRORS
from gateway.domain.change_population import (
    CSV_FIELDS,
    EXCEPTION_CSV_FIELDS,
    EXCEPTION_KINDS,
    Population,
    Sample,
    Scope,
    to_csv,
    to_json_text,
)
from gateway.domain.evidence import bundle_bytes
from gateway.domain.principals import Principal
from gateway.domain.review_page import Bounded
from gateway.services.admin import audit as audit_service
from gateway.services.admin.evidence import (
    MAX_SAMPLE,
    change_population,
    evidence_bundle,
    public_key,
    resolve_period,
    sample_changes,
)
from gateway.services.workspace import Workspace

api = APIRouter(prefix="/api/v1", responses=ERRORS, tags=["audit"])
pages = APIRouter(include_in_schema=False)

JSON_OR_CSV = {200: {"content": {"application/json": {"schema": {"type": "object"}},
                                 "text/csv": {"schema": {"type": "string"}}}}}
JSON_OR_HTML = {200: {"content": {"application/json": {"schema": {"type": "object"}},
                                  "text/html": {"schema": {"type": "string"}}}}}
FIRST_EXCEPTIONS = 50  # the exceptions on the first screen; the rest a click away
ROWS_PER_PAGE = 100
QUESTION = ("period", "since", "until", "repository", "stack", "environment", "person")


@dataclass(frozen=True)
class Question:
    """Which period and which changes of it an auditor asks about (as the CLI's --period ... --person)."""

    period: str | None = None
    since: str | None = None
    until: str | None = None
    repository: str | None = None
    stack: str | None = None
    environment: str | None = None
    person: str | None = None

    @property
    def scope(self) -> Scope:
        return Scope(self.repository or None, self.stack or None, self.environment or None, self.person or None)

    def population(self, ws: Workspace, actor: Principal) -> Population:
        return change_population(ws, actor, resolve_period(ws, self.period or None, self.since or None,
                                                           self.until or None), self.scope)

    def query(self) -> dict[str, str]:
        return {k: v for k in QUESTION if (v := getattr(self, k))}


Text = Annotated[str | None, Query(max_length=200)]


def question(period: Annotated[str | None, Query(max_length=60, description="2026, 2026-Q3, 2026-07 or "
                                                 "2026-07-01..2026-09-30; the last 90 days when neither it nor "
                                                 "since/until is given")] = None,
             since: Annotated[str | None, Query(max_length=40, description="the period's start")] = None,
             until: Annotated[str | None, Query(max_length=40, description="its end (a date: that whole day)")] = None,
             repository: Text = None, stack: Text = None,
             environment: Annotated[str | None, Query(max_length=40, description="a stack's environment tag")] = None,
             person: Text = None) -> Question:
    return Question(period, since, until, repository, stack, environment, person)


QuestionDep = Annotated[Question, Depends(question)]
NAMED_PERIOD = r"^(19|2[0-9])[0-9]{2}(-[Qq][1-4]|-(0[1-9]|1[0-2]))?$"  # a year, a quarter or a month


def api_question(period: Annotated[str | None, Query(pattern=NAMED_PERIOD, description="2026, 2026-Q3 or 2026-07; "
                                                     "with since and/or until, the part of it between them; the last "
                                                     "90 days when none of them is given")] = None,
                 since: Annotated[datetime | None, Query(description="the period's start")] = None,
                 until: Annotated[datetime | None, Query(description="its end (exclusive)")] = None,
                 repository: Text = None, stack: Text = None,
                 environment: Annotated[str | None, Query(max_length=40, description="a stack's environment tag")] = None,
                 person: Text = None) -> Question:
    return Question(period, since and since.isoformat(), until and until.isoformat(), repository, stack, environment,
                    person)


ApiQuestionDep = Annotated[Question, Depends(api_question)]


def population_response(population: Population, format: str, part: Literal["population", "exceptions"]) -> Response:
    """The population (or its exceptions and checks) as JSON, or one CSV row per change (per exception)."""
    if format == "csv":
        rows = ([r.csv_row() for r in population.rows] if part == "population"
                else [e.csv_row() for e in population.exceptions])
        return PlainTextResponse(to_csv(rows, CSV_FIELDS if part == "population" else EXCEPTION_CSV_FIELDS),
                                 media_type="text/csv",
                                 headers={"Content-Disposition": f'attachment; filename="{part}.csv"'})
    body = population.to_json()
    if part == "exceptions":
        body = {k: body[k] for k in ("period", "scope", "counts", "checks", "exceptions")}
    return Response(to_json_text(body), media_type="application/json")


Format = Annotated[Literal["json", "csv"], Query()]


@api.get("/audit/population", response_model=None, responses=JSON_OR_CSV)
def read_population(ws: WorkspaceDep, actor: ActorDep, asked: ApiQuestionDep, format: Format = "json") -> Response:
    """Every change applied (or attempted) in the period, with its checks and exceptions (CSV: one row a change)."""
    return population_response(asked.population(ws, actor), format, "population")


@api.get("/audit/exceptions", response_model=None, responses=JSON_OR_CSV)
def read_exceptions(ws: WorkspaceDep, actor: ActorDep, asked: ApiQuestionDep, format: Format = "json") -> Response:
    """What to sample first in the period, and the checks that must find nothing (CSV: one row an exception)."""
    return population_response(asked.population(ws, actor), format, "exceptions")


class SampleCreate(BaseModel):
    period: str | None = Field(default=None, pattern=NAMED_PERIOD, description="2026, 2026-Q3 or 2026-07")
    since: datetime | None = None
    until: datetime | None = Field(default=None, description="exclusive")
    repository: str | None = Field(default=None, max_length=200)
    stack: str | None = Field(default=None, max_length=200)
    environment: str | None = Field(default=None, max_length=40)
    person: str | None = Field(default=None, max_length=200)
    size: int = Field(ge=1, le=MAX_SAMPLE, description="how many changes")
    seed: str | None = Field(default=None, min_length=1, max_length=200, description="made up when not given")


class SamplePublic(BaseModel):
    seed: str
    size: int
    population: int
    population_digest: str
    selected: list[int]
    period: dict[str, Any]
    scope: dict[str, Any]
    method: str
    evidence: list[str] = Field(description="each sampled change's evidence bundle")

    @classmethod
    def of(cls, sample: Sample) -> SamplePublic:
        return cls(**sample.to_json(), evidence=[f"/api/v1/audit/evidence/{pid}" for pid in sample.selected])


@api.post("/audit/samples", response_model=SamplePublic, status_code=201)
def create_sample(body: SampleCreate, ws: WorkspaceDep, actor: ActorDep) -> SamplePublic:
    """Draw a reproducible sample of the population (recorded in the trail with its seed)."""
    asked = Question(body.period, body.since and body.since.isoformat(), body.until and body.until.isoformat(),
                     body.repository, body.stack, body.environment, body.person)
    period = resolve_period(ws, asked.period or None, asked.since or None, asked.until or None)
    return SamplePublic.of(sample_changes(ws, actor, period, asked.scope, body.size, body.seed))


@api.get("/audit/evidence/{proposal_id}", response_model=None, responses=JSON_OR_HTML)
def read_evidence(proposal_id: ProposalId, ws: WorkspaceDep, actor: ActorDep,
                  format: Annotated[Literal["json", "html"], Query()] = "json") -> Response:
    """The change's evidence bundle, signed: the file `verify_evidence.py` verifies offline (or its HTML)."""
    bundle = evidence_bundle(ws, actor, proposal_id)
    if format == "html":
        from gateway.api.evidence_html import evidence_html

        return HTMLResponse(evidence_html(bundle))
    return Response(bundle_bytes(bundle), media_type="application/json",
                    headers={"Content-Disposition": f'attachment; filename="evidence-{proposal_id}.json"'})


class PublicKeyPublic(BaseModel):
    public_key: str = Field(description="base64 of the raw Ed25519 key, as checkpoints name it")
    pem: str


@api.get("/audit/public-key", response_model=PublicKeyPublic)
def read_public_key(ws: WorkspaceDep, actor: ActorDep) -> PublicKeyPublic:
    """The audit key's public half (better still: obtain it apart from the gateway you audit)."""
    audit_service.require_auditor(actor)
    raw, pem = public_key(ws)
    return PublicKeyPublic(public_key=raw, pem=pem)


# --- the auditor's pages ---------------------------------------------------------------------------------------------


def _verified(ws: Workspace, actor: Principal) -> dict[str, Any]:
    count, broken, checkpoint = audit_service.verify_from_checkpoint(ws, actor)
    return {"intact": broken is None, "events": count, "seq": broken.seq if broken else None,
            "reason": broken.reason if broken else None, "checkpoint": checkpoint}


@pages.get("/audit")
def audit_report(request: Request, ws: WorkspaceDep, actor: PageActorDep, asked: QuestionDep,
                 exceptions: Annotated[Literal["first", "all"], Query()] = "first") -> HTMLResponse:
    """The auditor's page: the period's exceptions first, then the checks, the population's figures, a sample."""
    population = asked.population(ws, actor)
    shown = Bounded.of(population.exceptions, len(population.exceptions) if exceptions == "all" else FIRST_EXCEPTIONS)
    kinds = Counter(x.kind for x in population.exceptions)
    return render(request, "audit_report.html", actor, population=population, counts=population.counts(),
                  shown=shown, kinds=[(k, kinds[k]) for k in EXCEPTION_KINDS if kinds[k]], asked=asked,
                  query=urlencode(asked.query()), verify=_verified(ws, actor))


@pages.get("/audit/changes")
def audit_changes(request: Request, ws: WorkspaceDep, actor: PageActorDep, asked: QuestionDep,
                  page: Annotated[int, Query(ge=1, le=2**31 - 1)] = 1) -> HTMLResponse:
    """The population, a hundred changes a page."""
    population = asked.population(ws, actor)
    pages_count = max(1, -(-len(population.rows) // ROWS_PER_PAGE))
    number = min(page, pages_count)
    rows = population.rows[(number - 1) * ROWS_PER_PAGE:number * ROWS_PER_PAGE]
    return render(request, "audit_changes.html", actor, population=population, rows=rows, page=number,
                  pages=pages_count, asked=asked, query=urlencode(asked.query()))


@pages.get("/audit/population.{format}")
def audit_population_file(ws: WorkspaceDep, actor: PageActorDep, asked: QuestionDep,
                          format: Literal["csv", "json"]) -> Response:
    return population_response(asked.population(ws, actor), format, "population")


@pages.get("/audit/exceptions.{format}")
def audit_exceptions_file(ws: WorkspaceDep, actor: PageActorDep, asked: QuestionDep,
                          format: Literal["csv", "json"]) -> Response:
    return population_response(asked.population(ws, actor), format, "exceptions")


@pages.post("/audit/sample")
def audit_sample(request: Request, ws: WorkspaceDep, actor: PageActorDep, csrf: Annotated[str, Form()],
                 size: Annotated[int, Form(ge=1, le=MAX_SAMPLE)], seed: Annotated[str, Form(max_length=200)] = "",
                 period: Annotated[str, Form(max_length=60)] = "", since: Annotated[str, Form(max_length=40)] = "",
                 until: Annotated[str, Form(max_length=40)] = "", repository: Annotated[str, Form(max_length=200)] = "",
                 stack: Annotated[str, Form(max_length=200)] = "", environment: Annotated[str, Form(max_length=40)] = "",
                 person: Annotated[str, Form(max_length=200)] = "") -> HTMLResponse:
    """Draw a sample (recorded in the trail) and list its changes, each with its evidence."""
    check_csrf(request, csrf)
    asked = Question(period, since, until, repository, stack, environment, person)
    sample = sample_changes(ws, actor, resolve_period(ws, period or None, since or None, until or None),
                            asked.scope, size, seed.strip() or None)
    return render(request, "audit_sample.html", actor, sample=sample, asked=asked, status_code=201)


@pages.get("/audit/evidence/{proposal_id}.json")
def audit_evidence_file(proposal_id: ProposalId, ws: WorkspaceDep, actor: PageActorDep) -> Response:
    return Response(bundle_bytes(evidence_bundle(ws, actor, proposal_id)), media_type="application/json",
                    headers={"Content-Disposition": f'attachment; filename="evidence-{proposal_id}.json"'})


@pages.get("/audit/evidence/{proposal_id}")
def audit_evidence(request: Request, proposal_id: ProposalId, ws: WorkspaceDep, actor: PageActorDep) -> HTMLResponse:
    return render(request, "audit_evidence.html", actor, **evidence_context(evidence_bundle(ws, actor, proposal_id)))


@pages.get("/audit/verifier.py")
def audit_verifier(actor: PageActorDep) -> Response:
    """The standalone verifier, to hand to whoever checks the evidence."""
    return Response(files("gateway").joinpath("evidence_verifier.py").read_bytes(), media_type="text/x-python",
                    headers={"Content-Disposition": 'attachment; filename="verify_evidence.py"'})


@pages.get("/audit/public-key.pem")
def audit_public_key(ws: WorkspaceDep, actor: PageActorDep) -> Response:
    audit_service.require_auditor(actor)
    return Response(public_key(ws)[1], media_type="application/x-pem-file",
                    headers={"Content-Disposition": 'attachment; filename="gateway-audit.pub"'})
