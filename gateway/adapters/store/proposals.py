"""Proposals, plans, decisions, overrides and applies."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ARRAY,
    ColumnElement,
    Integer,
    Select,
    Text,
    and_,
    any_,
    bindparam,
    func,
    insert,
    literal_column,
    null,
    select,
    type_coerce,
    union_all,
    update,
)

from gateway.adapters.store.day_two import OPEN_DRIFT_LISTED, WINDOWS
from gateway.adapters.store.jobs import JOBS_OF_PROPOSAL
from gateway.adapters.store.main_branch import MARKER, UNACKNOWLEDGED
from gateway.adapters.store.read_ahead import Parts, Row
from gateway.adapters.store.rows import (
    MAX_ID,
    Records,
    as_principal,
    aware,
    now,
)
from gateway.adapters.store.schema import (
    applies,
    decisions,
    overrides,
    plans,
    principals,
    proposals,
    stack_serials,
)
from gateway.domain.applies import ApplyRecord, ApplyStatus
from gateway.domain.errors import Conflict, InAnotherRepository, NotFound
from gateway.domain.lifecycle import ACTIVE, INITIAL
from gateway.domain.plan import decode_plan_bytes, plan_digest
from gateway.domain.policy import Override
from gateway.domain.principals import Principal
from gateway.domain.proposal import (
    Decision,
    DecisionRecord,
    ListedProposal,
    PlanBasis,
    PlanSummary,
    Proposal,
    ProposalKind,
    ProposalStatus,
    StackPlan,
)
from gateway.domain.repositories import stack_prefix

if TYPE_CHECKING:
    from gateway.adapters.store.unit_of_work import SqlUnitOfWork

# Everyone a proposal names comes with the row that names them (a join, not a lookup per person: on PostgreSQL
# each statement is a round trip, and a proposal with an agent, its requester and two approvers named four).
_PERSON = ("id", "name", "kind", "roles", "groups", "acting_for", "disabled_at")  # what `as_principal` reads


def _with_person(query: Select[Any], by: Any, prefix: str) -> Select[Any]:
    """`query` with the principal whose id is `by` beside each row, its columns as `prefix` + name (an outer join:
    a row naming a principal that is gone still comes, and says so)."""
    person = principals.alias(prefix + "person")
    return query.add_columns(*(person.c[c].label(prefix + c) for c in _PERSON)).outerjoin(person, person.c.id == by)


def _person(row: Mapping[str, Any], prefix: str, named: str) -> Principal:
    """The principal `_with_person` put beside the row; `named` is the row's column that names them."""
    if row[prefix + "id"] is None:
        raise NotFound(f"unknown principal {row[named]}")
    return as_principal({c: row[prefix + c] for c in _PERSON})


# A read of a proposal runs these on every request: built once, so each execution skips building the statement and
# its cache key (a statement built afresh costs five times as much to execute as the query itself takes).
_PROPOSAL = _with_person(_with_person(select(proposals), proposals.c.requester_id, "requester__"),
                         proposals.c.proposer_id, "proposer__").where(proposals.c.id == bindparam("id"))
_PROPOSAL_LOCKED = _PROPOSAL.with_for_update(of=proposals)  # the proposal's row only, never its people's
# Which plans are current (the plans part of `_CHILDREN` below): only columns stored before `document`. SQLite
# reaches a column stored after a big one by walking that one's overflow pages (a 2,000-resource plan's document is
# megabytes): reading `summary` or `main_sha` of every current plan on every read cost most of a big proposal's read;
# those are read once per saved plan, by its id.
_PLAN_BODIES = select(
    plans.c.id, plans.c.state_serial, plans.c.main_sha, plans.c.created_at, type_coerce(plans.c.summary, Text)
).where(plans.c.id.in_(bindparam("ids", expanding=True)))
# What hangs off a proposal, in one statement (on PostgreSQL each statement is a round trip): its decisions and
# overrides, each with the person who made it, and its plans at its head (which are current), as the parts of one
# union, in a shape they share; the columns' types are the first part's (a decision's). Each part oldest first.
_NO_PERSON = [null().label("by__" + c) for c in _PERSON]
_CHILDREN = union_all(
    _with_person(select(
        literal_column("'decision'").label("part"), decisions.c.id.label("id"), decisions.c.principal_id,
        decisions.c.decision.label("c1"), decisions.c.head_sha.label("c2"), decisions.c.comment.label("c3"),
        decisions.c.auth.label("c4"), decisions.c.digests, decisions.c.created_at.label("at"),
    ), decisions.c.principal_id, "by__").where(decisions.c.proposal_id == bindparam("proposal_id")),
    _with_person(select(
        literal_column("'override'"), overrides.c.id, overrides.c.principal_id, overrides.c.finding_key,
        overrides.c.reason, null(), null(), null(), overrides.c.expires_at,
    ), overrides.c.principal_id, "by__").where(overrides.c.proposal_id == bindparam("proposal_id")),
    select(  # the plans at the head the proposal's row says (read just before)
        literal_column("'plan'"), plans.c.id, null(), plans.c.stack, plans.c.head_sha, plans.c.digest, null(),
        null(), null(), *_NO_PERSON,
    ).where(plans.c.proposal_id == bindparam("proposal_id"), plans.c.head_sha == bindparam("head_sha")),
).order_by(literal_column("part"), literal_column("id"))
_PLAN_PREVIEW = select(plans.c.preview).where(plans.c.id == bindparam("id"))

# What a view of a proposal asks next, read with it in a read unit of work (`read_ahead.py`): one statement where a
# view made a dozen. The plans at the head its row says are found by a subquery here (nothing needs reading first).
ROLLBACK_OF = "rollback_of:"  # the marker a rollback proposal has (services/change/annotations.py): a view asks it
_HEAD = select(proposals.c.head_sha).where(proposals.c.id == bindparam("proposal_id")).scalar_subquery()
_CURRENT_STACKS = select(plans.c.stack).where(plans.c.proposal_id == bindparam("proposal_id"),
                                              plans.c.head_sha == _HEAD)
_PROPOSAL_ROW = _with_person(_with_person(select(proposals), proposals.c.requester_id, "requester__"),
                             proposals.c.proposer_id, "proposer__")
_DECISION_ROWS = _with_person(select(
    decisions.c.proposal_id, decisions.c.id, decisions.c.principal_id, decisions.c.decision.label("c1"),
    decisions.c.head_sha.label("c2"), decisions.c.comment.label("c3"), decisions.c.auth.label("c4"),
    decisions.c.digests, decisions.c.created_at.label("at"),
), decisions.c.principal_id, "by__")
_OVERRIDE_ROWS = _with_person(select(
    overrides.c.proposal_id, overrides.c.id, overrides.c.principal_id, overrides.c.finding_key.label("c1"),
    overrides.c.reason.label("c2"), overrides.c.expires_at.label("at"),
), overrides.c.principal_id, "by__")
_PLAN_ROWS = select(plans.c.proposal_id, plans.c.id, plans.c.stack.label("c1"), plans.c.head_sha.label("c2"),
                    plans.c.digest.label("c3"))
_OF_PROPOSAL: list[tuple[str, Select[Any]]] = [
    ("proposal", _PROPOSAL_ROW.where(proposals.c.id == bindparam("proposal_id"))),
    ("decision", _DECISION_ROWS.where(decisions.c.proposal_id == bindparam("proposal_id"))),
    ("override", _OVERRIDE_ROWS.where(overrides.c.proposal_id == bindparam("proposal_id"))),
    ("plan", _PLAN_ROWS.where(plans.c.proposal_id == bindparam("proposal_id"), plans.c.head_sha == _HEAD)),
    ("job", JOBS_OF_PROPOSAL),
    ("marker", MARKER),
    ("serial", select(stack_serials.c.stack, stack_serials.c.serial).where(stack_serials.c.stack.in_(_CURRENT_STACKS))),
]
_OF_ALL = [("push", UNACKNOWLEDGED), ("window", WINDOWS), ("drift", OPEN_DRIFT_LISTED)]  # once per unit of work
_ORDER: dict[str, Callable[[Row], Any]] = {
    "decision": itemgetter("id"), "override": itemgetter("id"), "plan": itemgetter("id"), "job": itemgetter("id"),
    "push": itemgetter("detected_at"), "window": itemgetter("id"), "drift": itemgetter("id")}
_AHEAD = Parts(_OF_PROPOSAL + _OF_ALL, _ORDER, descending=frozenset({"window", "drift"}))
_AHEAD_OF_PROPOSAL = Parts(_OF_PROPOSAL, _ORDER)


def _of_proposals(asked: Callable[[Any], ColumnElement[bool]]) -> list[tuple[str, Select[Any]]]:
    """Many proposals read whole at once (an inbox, a list): the rows `get` reads of one, each naming its proposal,
    for the ids asked (`asked(column)`: the column holds one of them); each proposal's plans at the head its own row
    says (a join: there is no one head). Not what a view of one proposal asks next (its jobs, rollback marker,
    serials): a list asks none of them."""
    return [
        ("proposal", _PROPOSAL_ROW.where(asked(proposals.c.id))),
        ("decision", _DECISION_ROWS.where(asked(decisions.c.proposal_id))),
        ("override", _OVERRIDE_ROWS.where(asked(overrides.c.proposal_id))),
        ("plan", _PLAN_ROWS.join(proposals, and_(proposals.c.id == plans.c.proposal_id,
                                                 proposals.c.head_sha == plans.c.head_sha))
         .where(asked(plans.c.proposal_id))),
    ]


# on PostgreSQL the ids are one array parameter, the statement's text the same for any number of them: ids bound one
# by one made a text of its own for each count, parsed again by the driver and planned again by the server each time
_MANY_OF = {"postgresql": _of_proposals(lambda column: column == any_(bindparam("ids", type_=ARRAY(Integer)))),
            "sqlite": _of_proposals(lambda column: column.in_(bindparam("ids", expanding=True)))}
_MANY = {dialect: Parts(parts, _ORDER) for dialect, parts in _MANY_OF.items()}
_MANY_AHEAD = {dialect: Parts(parts + _OF_ALL, _ORDER, descending=frozenset({"window", "drift"}))
               for dialect, parts in _MANY_OF.items()}
MANY_AT_ONCE = 500  # proposals a statement reads (SQLite binds each id, four times: well within its parameters)
_Parts = Mapping[str, Sequence[Mapping[str, Any]]]  # a proposal's decisions, overrides and plans at its head, by part
_Read = tuple[Mapping[str, Any], _Parts, dict[str, StackPlan]]  # a proposal's row, its parts and its current plans


class SqlProposals(Records):
    """Proposals with their plans, decisions, policy overrides and apply records. A status changes in the domain
    (`Proposal.move`) and is written by `save`, which hands the moves' events to `saved` (the unit of work's)."""

    def __init__(self, uow: SqlUnitOfWork, saved: Callable[[Proposal], None]):
        super().__init__(uow)
        self.saved = saved

    def add(
        self,
        branch: str,
        base_sha: str,
        head_sha: str,
        requester: Principal,
        proposer: Principal,
        reason: str,
        stacks: Sequence[str],
        changed_paths: Sequence[str],
        agent_claim: str | None = None,
        prompt_version: str | None = None,
        model: str | None = None,
        kind: ProposalKind = ProposalKind.CHANGE,
    ) -> int:
        result = self.conn.execute(
            insert(proposals).values(
                kind=kind.value,
                repository=self.repository,
                branch=branch,
                base_sha=base_sha,
                head_sha=head_sha,
                requester_id=requester.id,
                proposer_id=proposer.id,
                reason=reason,
                status=INITIAL.value,
                stacks=list(stacks),
                changed_paths=list(changed_paths),
                agent_claim=agent_claim,
                prompt_version=prompt_version,
                model=model,
                created_at=now(),
                updated_at=now(),
            )
        )
        return int(result.inserted_primary_key[0])

    def open_for_branch(self, branch: str) -> int | None:
        return self.conn.scalar(
            select(proposals.c.id).where(
                proposals.c.repository == self.repository, proposals.c.branch == branch,
                proposals.c.status.in_([s.value for s in ACTIVE])
            )
        )

    def plan_bases(self, statuses: Collection[ProposalStatus]) -> list[PlanBasis]:
        """For each proposal in `statuses`: branch, head, stacks, and each stack's newest plan at that head
        (main commit and state serial), in two queries: what a worker's staleness scan needs."""
        rows = (
            self.conn.execute(
                select(proposals.c.id, proposals.c.branch, proposals.c.head_sha, proposals.c.stacks).where(
                    proposals.c.repository == self.repository, proposals.c.status.in_([s.value for s in statuses])
                )
            )
            .mappings()
            .all()
        )
        newest: dict[int, dict[str, tuple[str | None, int]]] = {r["id"]: {} for r in rows}
        heads = {r["id"]: r["head_sha"] for r in rows}
        if newest:
            marks = self.conn.execute(
                select(plans.c.proposal_id, plans.c.stack, plans.c.head_sha, plans.c.main_sha, plans.c.state_serial)
                .where(plans.c.proposal_id.in_(list(newest)))
                .order_by(plans.c.id)
            ).mappings()
            for m in marks:  # the newest plan of each stack at the proposal's head wins
                if m["head_sha"] == heads[m["proposal_id"]]:
                    newest[m["proposal_id"]][m["stack"]] = (m["main_sha"], m["state_serial"])
        return [PlanBasis(r["id"], r["branch"], r["head_sha"], tuple(r["stacks"]), newest[r["id"]]) for r in rows]

    def get(self, proposal_id: int, lock: bool = False) -> Proposal:
        if not 0 < proposal_id <= MAX_ID:
            raise NotFound(f"no proposal {proposal_id}")
        row, parts = self._read_ahead(proposal_id) if self.ahead and not lock else self._read(proposal_id, lock)
        return self._proposal(row, parts, self._current_plans({proposal_id: parts["plan"]})[proposal_id])

    def get_many(self, proposal_ids: Sequence[int]) -> list[Proposal]:
        """The proposals `proposal_ids` names, in that order, each as `get` would read it (unlocked): two statements
        for every `MANY_AT_ONCE` of them, where `get` takes two each (on PostgreSQL each statement is a round trip).
        In a read unit of work the pushes to main, break-glass windows and open drift are read ahead with them, as
        `get` reads them ahead."""
        for proposal_id in proposal_ids:
            if not 0 < proposal_id <= MAX_ID:
                raise NotFound(f"no proposal {proposal_id}")
        wanted = list(dict.fromkeys(proposal_ids))
        read: dict[int, _Read] = {}
        for start in range(0, len(wanted), MANY_AT_ONCE):
            read.update(self._read_many(wanted[start:start + MANY_AT_ONCE]))
        return [self._proposal(*read[proposal_id]) for proposal_id in proposal_ids]

    def _read_many(self, proposal_ids: Sequence[int]) -> dict[int, _Read]:
        """Each proposal's row, its decisions, overrides and plans at its head, and its current plans, in one statement
        (and one more for the plans no read has kept yet)."""
        ahead = self.ahead is not None and self.ahead.rows("push") is None
        parts = (_MANY_AHEAD if ahead else _MANY)[self.conn.dialect.name]
        found = parts.read(self.conn, {"ids": list(proposal_ids), "repository": self.repository})
        if ahead:
            assert self.ahead is not None
            for part in ("push", "window", "drift"):
                self.ahead.keep(part, None, found[part])
        rows = {row["id"]: row for row in found["proposal"]}
        missing = [proposal_id for proposal_id in proposal_ids if proposal_id not in rows]
        if missing:
            raise NotFound(f"no proposal {missing[0]}")
        parts: dict[int, dict[str, list[Mapping[str, Any]]]] = {
            proposal_id: {"decision": [], "override": [], "plan": []} for proposal_id in proposal_ids}
        for part in ("decision", "override", "plan"):
            for row in found[part]:  # each part oldest first
                parts[row["proposal_id"]][part].append(row)
        current = self._current_plans({proposal_id: of["plan"] for proposal_id, of in parts.items()})
        return {proposal_id: (rows[proposal_id], parts[proposal_id], current[proposal_id])
                for proposal_id in proposal_ids}

    def _proposal(self, row: Mapping[str, Any], parts: _Parts, plans_now: dict[str, StackPlan]) -> Proposal:
        """The proposal its row, its decisions and overrides (`parts`) and its current plans say."""
        if row["repository"] != self.repository:  # another repository's: as if it were not there
            raise InAnotherRepository(f"no proposal {row['id']} in repository {self.repository} (it is in "
                                      f"{row['repository']}: --repo {row['repository']})", row["repository"])
        proposal = Proposal(
            id=row["id"],
            branch=row["branch"],
            base_sha=row["base_sha"],
            head_sha=row["head_sha"],
            requester=_person(row, "requester__", "requester_id"),
            proposer=_person(row, "proposer__", "proposer_id"),
            reason=row["reason"],
            stacks=tuple(row["stacks"]),
            status=ProposalStatus(row["status"]),
            merge_sha=row["merge_sha"],
            agent_claim=row["agent_claim"],
            changed_paths=tuple(row["changed_paths"]),
            applied_sha=row["applied_sha"],
            kind=ProposalKind(row["kind"] or ProposalKind.CHANGE.value),
            repository=row["repository"],
        )
        proposal.plans = dict(plans_now)
        proposal.decisions = [_decision(r, _person(r, "by__", "principal_id")) for r in parts["decision"]]
        proposal.overrides = [
            Override(r["c1"], _person(r, "by__", "principal_id").name, r["c2"], aware(r["at"]))
            for r in parts["override"]
        ]
        return proposal

    def _read(self, proposal_id: int, lock: bool) -> tuple[Mapping[str, Any], _Parts]:
        """The proposal's row (with its people), then its decisions, overrides and plans at its head."""
        row = self.conn.execute(_PROPOSAL_LOCKED if lock else _PROPOSAL, {"id": proposal_id}).mappings().first()
        if row is None:
            raise NotFound(f"no proposal {proposal_id}")
        parts: dict[str, list[Mapping[str, Any]]] = {"decision": [], "override": [], "plan": []}
        for child in self.conn.execute(_CHILDREN, {"proposal_id": proposal_id, "head_sha": row["head_sha"]}).mappings():
            parts[child["part"]].append(child)
        return row, parts

    def _read_ahead(self, proposal_id: int) -> tuple[Mapping[str, Any], _Parts]:
        """What `_read` reads, and with it what a view asks next (kept for the repositories that answer it)."""
        assert self.ahead is not None
        marker = f"{stack_prefix(self.repository)}{ROLLBACK_OF}{proposal_id}"  # as SqlMainRecords names it
        parts = (_AHEAD_OF_PROPOSAL if self.ahead.rows("push") is not None else _AHEAD).read(
            self.conn, {"proposal_id": proposal_id, "name": marker, "repository": self.repository})
        if not parts["proposal"]:
            raise NotFound(f"no proposal {proposal_id}")
        self.ahead.keep("job", proposal_id, parts["job"])
        self.ahead.keep("marker", marker, parts["marker"])
        self.ahead.keep_serials({r["c1"] for r in parts["plan"]}, parts["serial"])
        for part in ("push", "window", "drift"):
            if part in parts:
                self.ahead.keep(part, None, parts[part])
        return parts["proposal"][0], parts

    def list(self, status: str | None = None) -> list[ListedProposal]:
        query = select(proposals.c.id, proposals.c.status, proposals.c.created_at, proposals.c.model,
                       proposals.c.prompt_version).where(proposals.c.repository == self.repository)\
            .order_by(proposals.c.id.desc())
        if status:
            query = query.where(proposals.c.status == status)
        return [ListedProposal(r["id"], ProposalStatus(r["status"]), aware(r["created_at"]), r["model"],
                               r["prompt_version"]) for r in self.conn.execute(query).mappings()]

    def update_head(self, proposal_id: int, head_sha: str, stacks: Sequence[str], changed_paths: Sequence[str]) -> None:
        self.conn.execute(
            update(proposals)
            .where(proposals.c.id == proposal_id)
            .values(head_sha=head_sha, stacks=list(stacks), changed_paths=list(changed_paths), updated_at=now())
        )

    def set_agent_details(
        self, proposal_id: int, prompt_version: str, model: str, agent_claim: str | None = None
    ) -> None:
        """The prompt version and model an agent's proposal was written with (and its latest claim)."""
        values: dict[str, Any] = {"prompt_version": prompt_version, "model": model, "updated_at": now()}
        if agent_claim is not None:
            values["agent_claim"] = agent_claim
        self.conn.execute(update(proposals).where(proposals.c.id == proposal_id).values(**values))

    def save(self, proposal: Proposal) -> None:
        """Persist the transitions the proposal took since it was last saved (its status, the commits they merged
        or applied) and hand their events to the unit of work, which writes them to the trail in this transaction.

        The row changes only if it is still in the state the first of them started from: a concurrent
        writer that moved it first makes this one a Conflict, never a silent overwrite.
        """
        if not proposal.events:
            return
        first = proposal.events[0]
        values: dict[str, Any] = {"status": proposal.status.value, "updated_at": now()}
        for moved in proposal.events:
            if moved.merge_sha:
                values["merge_sha"] = moved.merge_sha
            if moved.applied_sha:
                values["applied_sha"] = moved.applied_sha
        written = self.conn.execute(
            update(proposals).where(proposals.c.id == proposal.id, proposals.c.status == first.before.value)
            .values(**values)
        )
        if written.rowcount != 1:
            raise Conflict(f"proposal {proposal.id} changed while it was being moved from {first.before.value}; "
                           "try again")
        self.saved(proposal)

    def add_plan(
        self,
        proposal_id: int,
        stack: str,
        head_sha: str,
        main_sha: str,
        digest: str,
        document: str,
        state_serial: int,
        state_lineage: str,
        summary: PlanSummary,
        preview: str,
        artifact: bytes | None = None,
    ) -> int:
        result = self.conn.execute(
            insert(plans).values(
                proposal_id=proposal_id,
                stack=stack,
                head_sha=head_sha,
                main_sha=main_sha,
                digest=digest,
                document=self.sealer.seal_text(document),
                state_serial=state_serial,
                state_lineage=state_lineage,
                summary=summary.to_json(),
                preview=preview,
                artifact=self.sealer.seal_bytes(artifact) if artifact is not None else None,
                created_at=now(),
            )
        )
        return int(result.inserted_primary_key[0])

    def plan_preview(self, plan_id: int) -> str | None:
        """The stored masked preview of a plan (None for plans saved before previews were stored)."""
        return self.conn.scalar(_PLAN_PREVIEW, {"id": plan_id})

    def plan_artifact(self, plan_id: int) -> bytes | None:
        """The engine's own saved plan (Terraform's plan file), if the engine keeps one."""
        value = self.conn.scalar(select(plans.c.artifact).where(plans.c.id == plan_id))
        return self.sealer.open_bytes(bytes(value)) if value is not None else None

    def saved_plan_digests(self, plan_ids: Collection[int]) -> dict[int, str]:
        """Plan id -> the digest its saved plan (the JSON plan and the plan file, as stored now) hashes to, in one
        statement. Unsealing and hashing a big plan again costs tens of milliseconds, so each answer is kept by the
        stored bytes' own hash: a row edited in place is a different key, and is hashed again."""
        if not plan_ids:
            return {}
        rows = self.conn.execute(select(plans.c.id, plans.c.document, plans.c.artifact)
                                 .where(plans.c.id.in_(list(plan_ids)))).all()
        found = {}
        for row in rows:
            document, artifact = str(row.document), bytes(row.artifact) if row.artifact is not None else None
            stored = hashlib.sha256(document.encode())
            stored.update(b"\0" + hashlib.sha256(artifact).digest() if artifact is not None else b"")
            digest = _DIGESTS.get(stored.digest())
            if digest is None:
                digest = plan_digest(decode_plan_bytes(self.sealer.open_text(document).encode()),
                                     self.sealer.open_bytes(artifact) if artifact is not None else None)
                _DIGESTS.put(stored.digest(), digest)
            found[int(row.id)] = digest
        return found

    def plan_document(self, plan_id: int) -> str:
        document = self.conn.scalar(select(plans.c.document).where(plans.c.id == plan_id))
        if document is None:
            raise NotFound(f"no saved plan {plan_id}")
        return self.sealer.open_text(str(document))

    def _current_plans(self, heads: Mapping[int, Sequence[Mapping[str, Any]]]) -> dict[int, dict[str, StackPlan]]:
        """Each proposal's current plans from its plans at its head (rows of id, stack c1, head c2, digest c3, oldest
        first): those no read has kept yet are read in one statement for all the proposals."""
        newest = {proposal_id: {r["c1"]: (r["id"], r["c1"], r["c2"], r["c3"]) for r in rows}  # the last of a stack wins
                  for proposal_id, rows in heads.items()}
        # a value, not the engine: the cache keeps no engine (nor its pool) alive; its text once (a URL renders itself
        # to be hashed, which each of a list's hundred plans did)
        database = str(self.conn.engine.url)
        current = {proposal_id: {stack: _SAVED_PLANS.find((database, *key)) for stack, key in stacks.items()}
                   for proposal_id, stacks in newest.items()}
        missing = {newest[proposal_id][stack][0]: (proposal_id, newest[proposal_id][stack])
                   for proposal_id, plans_now in current.items() for stack, plan in plans_now.items() if plan is None}
        if missing:
            for plan_id, serial, main_sha, created_at, summary in self.conn.execute(_PLAN_BODIES, {"ids": list(missing)}):
                proposal_id, key = missing[plan_id]
                _, stack, head, digest = key
                plan = current[proposal_id][stack] = _stack_plan(plan_id, stack, head, digest, serial, main_sha,
                                                                 created_at, summary)
                _SAVED_PLANS.put((database, *key), plan)
        return {proposal_id: {stack: plan for stack, plan in plans_now.items() if plan is not None}
                for proposal_id, plans_now in current.items()}

    def add_decision(
        self,
        proposal_id: int,
        principal: Principal,
        decision: Decision,
        head_sha: str,
        digests: Mapping[str, str],
        comment: str,
        auth: str,
    ) -> int:
        result = self.conn.execute(
            insert(decisions).values(
                proposal_id=proposal_id,
                principal_id=principal.id,
                decision=decision.value,
                head_sha=head_sha,
                digests=dict(digests),
                comment=comment,
                auth=auth,
                created_at=now(),
            )
        )
        return int(result.inserted_primary_key[0])

    def add_override(
        self, proposal_id: int, finding_key: str, principal: Principal, reason: str, expires_at: datetime
    ) -> int:
        result = self.conn.execute(
            insert(overrides).values(
                proposal_id=proposal_id,
                finding_key=finding_key,
                principal_id=principal.id,
                reason=reason,
                expires_at=expires_at,
                created_at=now(),
            )
        )
        return int(result.inserted_primary_key[0])

    def merged_as(self, sha: str) -> int | None:
        """The proposal whose merge made commit `sha` (None: the gateway did not make it)."""
        return self.conn.scalar(select(proposals.c.id).where(proposals.c.repository == self.repository,
                                                             proposals.c.merge_sha == sha).limit(1)) if sha else None

    def repository_of(self, proposal_id: int) -> str | None:
        if not 0 < proposal_id <= MAX_ID:
            return None
        return self.conn.scalar(select(proposals.c.repository).where(proposals.c.id == proposal_id))

    def unfinished_by_repository(self) -> Mapping[tuple[str, str], int]:
        p = proposals.c
        rows = self.conn.execute(select(p.repository, p.status, func.count())
                                 .where(p.status.in_(sorted(s.value for s in ACTIVE))).group_by(p.repository, p.status))
        return {(repository, status): int(count) for repository, status, count in rows}

    def start_apply(self, proposal_id: int, stack: str, plan_id: int, runner: str, commit_sha: str) -> int:
        result = self.conn.execute(
            insert(applies).values(
                proposal_id=proposal_id,
                stack=stack,
                plan_id=plan_id,
                status=ApplyStatus.RUNNING.value,
                runner=runner,
                applied=[],
                commit_sha=commit_sha,
                started_at=now(),
            )
        )
        return int(result.inserted_primary_key[0])

    def finish_apply(self, apply_id: int, status: ApplyStatus, applied: Sequence[str], error: str | None) -> None:
        self.conn.execute(
            update(applies)
            .where(applies.c.id == apply_id)
            .values(status=status.value, applied=list(applied), error=error, finished_at=now())
        )

    def get_apply(self, apply_id: int) -> ApplyRecord | None:
        row = self.conn.execute(select(applies).where(applies.c.id == apply_id)).mappings().first()
        return _apply_record(row) if row else None

    def applies_of(self, proposal_id: int) -> list[ApplyRecord]:
        rows = self.conn.execute(select(applies).where(applies.c.proposal_id == proposal_id).order_by(applies.c.id))
        return [_apply_record(r) for r in rows.mappings()]

    def last_applied_commit(self, stack: str) -> str | None:
        return self.conn.scalar(
            select(applies.c.commit_sha)
            .where(applies.c.stack == stack, applies.c.status == ApplyStatus.SUCCEEDED.value)
            .order_by(applies.c.id.desc())
            .limit(1)
        )


def _decision(row: Mapping[str, Any], principal: Principal) -> DecisionRecord:
    """A decision from its part of `_CHILDREN` (c1..c4: decision, head, comment, how it was authenticated)."""
    return DecisionRecord(
        id=row["id"],
        principal=principal,
        decision=Decision(row["c1"]),
        head_sha=row["c2"],
        digests=row["digests"],
        comment=row["c3"],
        auth=row["c4"],
        at=aware(row["at"]),
    )


class _SavedPlans:
    """Saved plans as a read shows them, kept by the row's identity and content: the plans table is only ever
    inserted into, never updated, so (database, id, stack, commit SHA, plan digest) names one plan for good. A plan
    a row does not hold yet cannot be asked for: which plans are current is read from the store on every read."""

    def __init__(self, size: int):
        self.size = size
        self._plans: OrderedDict[tuple[Any, ...], StackPlan] = OrderedDict()
        self._lock = threading.Lock()

    def find(self, key: tuple[Any, ...]) -> StackPlan | None:
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
            return plan

    def put(self, key: tuple[Any, ...], plan: StackPlan) -> None:
        with self._lock:
            self._plans[key] = plan
            while len(self._plans) > self.size:
                self._plans.popitem(last=False)


_SAVED_PLANS = _SavedPlans(256)  # a 2,000-resource plan's brief is some 200 KB in memory


class _Digests:
    """Plan digests by the hash of the stored bytes they were computed from (a few thousand, some 100 bytes each)."""

    def __init__(self, size: int):
        self.size = size
        self._digests: OrderedDict[bytes, str] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, stored: bytes) -> str | None:
        with self._lock:
            digest = self._digests.get(stored)
            if digest is not None:
                self._digests.move_to_end(stored)
            return digest

    def put(self, stored: bytes, digest: str) -> None:
        with self._lock:
            self._digests[stored] = digest
            while len(self._digests) > self.size:
                self._digests.popitem(last=False)


_DIGESTS = _Digests(4096)


def _stack_plan(plan_id: int, stack: str, head_sha: str, digest: str, state_serial: int, main_sha: str | None,
                created_at: datetime, summary_json: str | Mapping[str, Any]) -> StackPlan:
    # a driver that decodes JSON itself (psycopg) hands over the data, not the text
    summary = PlanSummary.from_json(json.loads(summary_json) if isinstance(summary_json, str) else summary_json)
    return StackPlan(
        plan_id=plan_id,
        stack=stack,
        head_sha=head_sha,
        digest=digest,
        state_serial=state_serial,
        counts=summary.counts,
        destructive=summary.destructive,
        risk=summary.risk.level,
        risk_reasons=summary.risk.reasons,
        findings=summary.findings,
        main_sha=main_sha,
        changed=summary.changed,
        drift=summary.drift,
        planned_at=aware(created_at),
    )


def _apply_record(row: Any) -> ApplyRecord:
    return ApplyRecord(
        id=row["id"],
        proposal_id=row["proposal_id"],
        stack=row["stack"],
        plan_id=row["plan_id"],
        status=ApplyStatus(row["status"]),
        runner=row["runner"],
        applied=tuple(row["applied"]),
        error=row["error"],
        commit_sha=row["commit_sha"],
        started_at=aware(row["started_at"]),
        finished_at=aware(row["finished_at"]) if row["finished_at"] else None,
    )
