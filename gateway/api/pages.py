"""Server-rendered pages: sign-in, requests, the proposal page (the built-in pull request), audit."""

from __future__ import annotations

import functools
import json
import secrets
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, PackageLoader
from markupsafe import Markup

from gateway.api.deps import (
    BROWSER_KEY,
    PageActorDep,
    ProposalId,
    SignedInDep,
    WorkspaceDep,
    clear_session,
    in_read_lane,
    page_actor,
    repository_asked,
    request_workspace,
    signed_in_person,
)
from gateway.api.repositories import page_root
from gateway.api.routes import export_response
from gateway.domain.errors import AuthError, InputError, Refused, SignInRefused
from gateway.domain.jobs import JobKind
from gateway.domain.permissions import Action, may
from gateway.domain.principals import Principal
from gateway.domain.proposal import Decision
from gateway.domain.review_page import FIRST_SCREEN_LINES, Bounded, diff_page, review_page
from gateway.domain.story import event_details
from gateway.services.admin import audit as audit_service
from gateway.services.admin.sign_in import (
    decide_signed_in,
    finish_sign_in,
    provider_choices,
    sign_in_with_token,
    sign_out,
    start_sign_in,
)
from gateway.services.agents.agent_runs import get_agent_run, start_agent_run
from gateway.services.change.breaker import breaker_status
from gateway.services.change.inbox_all import active_repositories, inbox_everywhere
from gateway.services.change.jobs import enqueue_job
from gateway.services.change.main_watch import unacknowledged
from gateway.services.change.proposals import get_proposal
from gateway.services.change.views import list_proposal_rows, view_proposal
from gateway.services.day_two.break_glass import overdue_windows
from gateway.services.workspace import Workspace

# package data, found by the package loader: an installed wheel carries them (a path beside the source would not)
templates = Jinja2Templates(env=Environment(loader=PackageLoader("gateway.api", "templates"), autoescape=True))
templates.env.globals["page_root"] = page_root  # a link into another repository's pages: page_root(name) ~ "/..."
router = APIRouter(include_in_schema=False)
CsrfField = Annotated[str, Form()]


def csrf_token(request: Request) -> str:
    if "csrf" not in request.session:
        request.session["csrf"] = secrets.token_urlsafe(32)
    return str(request.session["csrf"])


def check_csrf(request: Request, token: str) -> None:
    expected = request.session.get("csrf")
    if not expected or not secrets.compare_digest(str(expected), token):
        raise Refused(["the form is stale or was not sent from this site (CSRF check failed); reload the page"])


def render(request: Request, name: str, actor: Principal | None, status_code: int = 200, **context: Any) -> HTMLResponse:
    # Never the app-wide workspace here: its git handle is shared by every thread of the pool and hangs for good
    # when two pages read git at once; each request gets its own.
    ws = getattr(request.state, "workspace", None) or request_workspace(request)
    pushes = unacknowledged(ws) if actor else []  # on every page: main moved outside
    overdue = overdue_windows(ws) if actor else []  # and break-glass drift not codified
    return templates.TemplateResponse(request, name, {
        "actor": actor, "csrf": csrf_token(request), "pushes": pushes, "overdue_break_glass": overdue,
        "can_audit": bool(actor and may(actor, Action.READ_TRAIL)), "repository": ws.repository,
        "root": page_root(ws.repository), "repositories": _picker(request, ws) if actor else [], **context},
        status_code=status_code)


# pages that are the same in every repository; the picker sends any other (one proposal, one request) to the front page
SAME_IN_EACH = frozenset({"/", "/drift", "/requests/new", "/audit", "/audit/events", "/audit/changes"})


def _picker(request: Request, ws: Workspace) -> list[tuple[str, str]]:
    """Each active repository and where this page is in it, when the gateway serves more than one (else none)."""
    names = active_repositories(ws)
    path = request.url.path if request.url.path in SAME_IN_EACH else "/"
    return [(name, page_root(name) + path) for name in names] if len(names) > 1 else []


@router.get("/login")
def login_page(request: Request, ws: WorkspaceDep) -> HTMLResponse:
    return render(request, "login.html", None, providers=provider_choices(ws), error=request.session.pop("flash", None))


@router.post("/login")
def login(request: Request, ws: WorkspaceDep, token: Annotated[str, Form()], csrf: CsrfField) -> Response:
    check_csrf(request, csrf)
    try:
        session_id, _ = sign_in_with_token(ws, token)
    except (AuthError, Refused) as exc:
        return render(request, "login.html", None, status_code=401 if isinstance(exc, AuthError) else 403,
                      error=str(exc), providers=provider_choices(ws))
    _start_session(request, session_id)
    return RedirectResponse("/", status_code=303)


@router.post("/login/{provider}")
def login_with(request: Request, provider: str, ws: WorkspaceDep, csrf: CsrfField) -> Response:
    """Off to the provider; the sign-in's state, nonce and PKCE verifier wait server-side, for this browser."""
    check_csrf(request, csrf)
    redirect_uri = f"{ws.settings.public_url.rstrip('/')}/auth/{provider}/callback"
    try:
        url = start_sign_in(ws, provider, redirect_uri, _browser_key(request))
    except SignInRefused as exc:
        return _refused_page(request, ws, exc)
    return RedirectResponse(url, status_code=303)


@router.get("/auth/{provider}/callback")
def sign_in_callback(request: Request, provider: str, ws: WorkspaceDep) -> Response:
    """The provider sends the person back here; the sign-in its state names is used once, whatever the outcome."""
    callback = {k: v for k, v in request.query_params.items() if k in CALLBACK_PARAMS}
    try:
        session_id, _ = finish_sign_in(ws, provider, request.session.get(BROWSER_KEY), callback)
    except SignInRefused as exc:
        return _refused_page(request, ws, exc)
    _start_session(request, session_id)
    return RedirectResponse("/", status_code=303)


CALLBACK_PARAMS = ("code", "state", "iss", "error", "error_description")
NOT_LINKED = ("unlinked", "disabled", "not_a_person")  # the provider vouched for them; the gateway says no


def _browser_key(request: Request) -> str:
    if BROWSER_KEY not in request.session:
        request.session[BROWSER_KEY] = secrets.token_urlsafe(32)
    return str(request.session[BROWSER_KEY])


def _refused_page(request: Request, ws: WorkspaceDep, exc: SignInRefused) -> HTMLResponse:
    return render(request, "login.html", None, status_code=403 if exc.check in NOT_LINKED else 401,
                  error=f"Sign-in refused: {exc}", refused_check=exc.check, providers=provider_choices(ws))


def _start_session(request: Request, session_id: str) -> None:
    clear_session(request)  # a new session id and a new CSRF token: nothing carries over but the browser's key
    request.session["sid"] = session_id


@router.post("/logout")
def logout(request: Request, ws: WorkspaceDep, csrf: CsrfField) -> Response:
    check_csrf(request, csrf)
    sign_out(ws, request.session.get("sid"))
    clear_session(request)
    return RedirectResponse("/login", status_code=303)


@router.get("/")
def index(request: Request, ws: WorkspaceDep, actor: PageActorDep) -> HTMLResponse:
    proposals = list_proposal_rows(ws, actor)
    breakers = [b for b in breaker_status(ws) if b["open"]]
    return render(request, "index.html", actor, proposals=proposals, breakers=breakers,
                  inbox=inbox_everywhere(ws, actor))


@router.get("/requests/new")
def new_request(request: Request, actor: PageActorDep, conversation: str | None = None) -> HTMLResponse:
    return render(request, "request_new.html", actor, conversation=conversation)


@router.post("/requests")
def create_request(request: Request, ws: WorkspaceDep, actor: PageActorDep, text: Annotated[str, Form()],
                   csrf: CsrfField, conversation: Annotated[str | None, Form()] = None) -> Response:
    check_csrf(request, csrf)
    if not text.strip():
        raise InputError("the request is empty: say what you want changed")
    run = start_agent_run(ws, actor, text, conversation or None)
    return RedirectResponse(f"{page_root(ws.repository)}/requests/{run.id}", status_code=303)


@router.get("/requests/{run_id}")
def request_status(request: Request, run_id: str, ws: WorkspaceDep, actor: PageActorDep) -> HTMLResponse:
    return render(request, "request_status.html", actor, run=get_agent_run(ws, actor, run_id))


PageNumber = Annotated[int, Query(ge=1, le=2**31 - 1, description="which page, from 1")]


@router.get("/proposals/{proposal_id}")
async def proposal_page(request: Request, proposal_id: ProposalId, ws: WorkspaceDep,
                        page: PageNumber = 1) -> HTMLResponse:
    """What blocks, destroys and drifts first, then page `page` of the changes, then the first page of the diff."""
    # the session's check and the page in one hop to the read lane (each hop costs as much as a query)
    return await in_read_lane(request, _proposal_page, request, proposal_id, ws, page)


def _proposal_page(request: Request, proposal_id: int, ws: Workspace, page: int) -> HTMLResponse:
    actor = page_actor(request, signed_in_person(request, ws))
    view = view_proposal(ws, actor, proposal_id)
    review = review_page(view.preview_json, page)
    return render(request, "proposal.html", actor, p=view.proposal, view=view, summaries=review.summaries,
                  changes=review.changes, diff=diff_page(view.diff, 1),
                  changes_html=_changes_html(tuple(view.preview_json.items()), page, proposal_id,
                                             page_root(ws.repository)),
                  blocked=Bounded.of(view.blocked_by, FIRST_SCREEN_LINES),
                  refusals=Bounded.of(view.apply_blockers, FIRST_SCREEN_LINES))


@functools.lru_cache(maxsize=32)
def _changes_html(previews: tuple[tuple[str, str], ...], page: int, proposal_id: int, root: str) -> Markup:
    """A page of the changes as HTML: a pure function of the stored previews' text (kept by it), the page and where
    the repository's pages are, rendered once per them (fifty changes and their attributes were most of a big
    proposal's page)."""
    changes = review_page(dict(previews), page).changes
    template = templates.get_template("proposal_changes.html")
    return Markup(template.render(changes=changes, proposal_id=proposal_id, root=root))


@router.get("/proposals/{proposal_id}/diff")
def diff_lines_page(request: Request, proposal_id: ProposalId, ws: WorkspaceDep, actor: PageActorDep,
                    page: PageNumber = 1) -> HTMLResponse:
    """Page `page` of the proposal's diff."""
    proposal = get_proposal(ws, proposal_id)
    return render(request, "diff.html", actor, p=proposal, diff=diff_page(ws.repo.diff(proposal.base_sha,
                                                                                         proposal.head_sha), page))


@router.post("/proposals/{proposal_id}/decide")
def decide_form(request: Request, proposal_id: ProposalId, ws: WorkspaceDep, who: SignedInDep, csrf: CsrfField,
                decision: Annotated[Decision, Form()], sha: Annotated[str, Form()],
                comment: Annotated[str, Form()] = "", digests: Annotated[str, Form(max_length=20000)] = "") -> Response:
    check_csrf(request, csrf)
    decide_signed_in(ws, who, proposal_id, decision, comment, sha, _seen_digests(digests))
    return RedirectResponse(f"{page_root(ws.repository)}/proposals/{proposal_id}", status_code=303)


@router.post("/proposals/{proposal_id}/apply")
def apply_form(request: Request, proposal_id: ProposalId, ws: WorkspaceDep, actor: PageActorDep, csrf: CsrfField) -> Response:
    check_csrf(request, csrf)
    enqueue_job(ws, actor, JobKind.APPLY, proposal_id)  # a worker applies; the page shows the job's progress
    return RedirectResponse(f"{page_root(ws.repository)}/proposals/{proposal_id}", status_code=303)


def _seen_digests(text: str) -> dict[str, str] | None:
    """The plan digests the page showed (a form field); a malformed one is a clear error."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise InputError("the form's plan digests are not readable; reload the page") from None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise InputError("the form's plan digests are not readable; reload the page")
    return value


PAGE_EVENTS = 500  # events per audit page; the next page starts after the last one shown
AUDIT_FILTERS = ("since", "until", "stack", "address", "person", "action", "outcome", "proposal")


def _audit_query(request: Request) -> dict[str, str]:
    """The page's filters; `repo` is the repository the request names (`?repo=NAME` or the `/repos/NAME/` prefix)."""
    q = {k: v for k in AUDIT_FILTERS if (v := request.query_params.get(k, "").strip())}
    repository = repository_asked(request)
    return {**q, "repo": repository} if repository else q


@router.get("/audit/events")
def audit_page(request: Request, ws: WorkspaceDep, actor: PageActorDep) -> HTMLResponse:
    """The trail's events, filtered; with a proposal, its story (long lists summarised, the rest on demand)."""
    q = _audit_query(request)
    after = request.query_params.get("after", "0")
    if not after.isdigit():
        raise InputError(f"after {after!r} is not an event number")
    events = _filtered_events(ws, actor, q, int(after), PAGE_EVENTS)
    # from the newest signed checkpoint on (workers sign one every few minutes), so a view costs the same at 10M
    # events as at 10; `gateway audit verify` proves the whole chain
    count, broken, checkpoint = audit_service.verify_from_checkpoint(ws, actor)
    verify = {"intact": broken is None, "events": count, "seq": broken.seq if broken else None,
              "reason": broken.reason if broken else None, "checkpoint": checkpoint}
    following = urlencode({**q, "after": events[-1].seq}) if len(events) == PAGE_EVENTS else None
    return render(request, "audit.html", actor, events=events, q=q, query=urlencode(q), verify=verify,
                  following=following, details={e.seq: event_details(e.payload) for e in events})


@router.get("/audit/export")
def audit_export(request: Request, ws: WorkspaceDep, actor: PageActorDep, format: str = "csv") -> Response:
    return export_response(_filtered_events(ws, actor, _audit_query(request)), format)


def _filtered_events(ws: WorkspaceDep, actor: Principal, q: dict[str, str], after: int = 0,
                     limit: int | None = None) -> list[Any]:
    proposal = q.get("proposal")
    if proposal is not None and not proposal.isdigit():
        raise InputError(f"proposal {proposal!r} is not a number")
    return audit_service.list_events(ws, actor, int(proposal) if proposal else None, q.get("person"), q.get("stack"),
                                     q.get("since"), q.get("until"), q.get("address"), q.get("action"), q.get("outcome"),
                                     after, limit, q.get("repo"))
