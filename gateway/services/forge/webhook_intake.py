"""What every forge's webhook does alike, around what only the forge knows (its signature or token, its headers, its
payloads): the route counts each delivery, reads the body as a JSON object and takes it to the repository whose
gateway.yaml names its forge repository (refusing, in the trail once, one no repository may take); the worker loads
the recorded delivery, refuses a malformed one in the trail, and counts what it handled.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from gateway.domain.errors import GatewayError, InputError, MalformedDelivery, NotFound, Refused
from gateway.domain.github import Delivery
from gateway.domain.jobs import Job
from gateway.domain.operations import webhook_event_label
from gateway.domain.principals import SystemActor
from gateway.services.forge import routing
from gateway.services.forge.review_flow import ForgeTerms
from gateway.services.workspace import Delivering, Records, Workspace

Event = TypeVar("Event")
REFUSED = "refused:"  # the id a refused delivery is recorded under, beside its own


def counted(ws: Delivering, label: str, receive: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Receive a delivery, counting it as refused, a duplicate or accepted under the event's `label`."""
    try:
        received = receive()
    except GatewayError:
        ws.metrics.webhook_received(label, "refused")
        raise
    ws.metrics.webhook_received(label, "duplicate" if received["duplicate"] else "accepted")
    return received


def json_object(body: bytes) -> dict[str, Any]:
    """The delivery's body, which must be a JSON object."""
    try:
        payload = json.loads(body)
    except ValueError as exc:
        raise InputError("the delivery's body is not JSON") from exc
    if not isinstance(payload, dict):
        raise InputError("the delivery's body is not a JSON object")
    return payload


def routed(ws: Workspace, terms: ForgeTerms, named: str | None, delivery: str, event: str, action: str | None,
           body: bytes) -> Workspace:
    """The workspace of the repository whose main gateway.yaml names `named`, the forge repository the delivery is
    about (this one when the delivery names none). A delivery no repository may take is recorded, its refusal said
    in this workspace's trail once (a redelivery is refused again, silently), and refused."""
    if named is None:
        return ws
    route = routing.route_delivery(ws, "github" if terms.prefix == "github" else "gitlab", named)
    if route.repository is not None:
        return ws.in_repository(route.repository)
    refuse_delivery(ws, terms, delivery, event, action, body, {terms.home: named}, route.refusal)


def refuse_delivery(ws: Records, terms: ForgeTerms, delivery: str, event: str, action: str | None, body: bytes,
                    about: dict[str, Any], reason: str) -> NoReturn:
    """Record the delivery as refused and, the first time, `<forge>.delivery.refused` naming what it is `about`; then
    refuse. It is kept under an id of its own: redelivered once a repository may take it, it is taken."""
    with ws.store.session() as session:
        if session.github.add_delivery(REFUSED + delivery, event, action, body.decode("utf-8", "replace")):
            session.audit.append(SystemActor(terms.prefix), f"{terms.prefix}.delivery.refused", {
                "delivery": delivery, "event": event, **about, "reasons": [reason]})
    raise Refused([reason])


def worth_a_job(parse: Callable[[], Event | None], needs_handling: Callable[[Event], bool]) -> bool:
    """Whether a worker should act on the delivery: one the gateway handles and can do something with, or one it
    cannot parse (the worker records the refusal, naming the field, where the request's trail is)."""
    try:
        parsed = parse()
        return parsed is not None and needs_handling(parsed)
    except MalformedDelivery:
        return True


def handle_recorded(ws: Workspace, job: Job, terms: ForgeTerms, parse: Callable[[Delivery], Event | None],
                    repository_of: Callable[[Event], str], act: Callable[[Event], dict[str, Any]]) -> dict[str, Any]:
    """The worker's side: load the job's delivery, `parse` it, and `act` on it if it is about this gateway's
    repository. A malformed delivery is refused, naming each field, in `<forge>.<event>.refused`."""
    with ws.store.session(readonly=True) as session:
        delivery = session.github.delivery(str(job.args.get("delivery")))
    if delivery is None:
        raise NotFound(f"job {job.id} names no recorded delivery")
    try:
        event = parse(delivery)
    except MalformedDelivery as exc:
        with ws.store.session() as session:
            proposal = session.proposals.get(job.proposal_id) if job.proposal_id else None
            session.audit.append(SystemActor(terms.prefix), f"{terms.prefix}.{exc.event}.refused", {
                "delivery": delivery.id, "reasons": exc.reasons}, job.proposal_id, proposal.stacks if proposal else ())
        raise Refused(exc.reasons) from exc
    if event is None:
        return {"ignored": f"{delivery.event} deliveries are recorded, not handled"}
    ours, theirs = terms.settings(ws.repo_settings()), repository_of(event)
    if ours is None or theirs.casefold() != ours.repository.casefold():  # main changed since it was routed here
        return {"ignored": f"a delivery for {theirs}, which is not this gateway's {terms.home}"}
    result = act(event)
    lag = ws.clock.now() - delivery.received_at
    ws.metrics.webhook_handled(webhook_event_label(delivery.event), max(0.0, lag.total_seconds()))
    return result
