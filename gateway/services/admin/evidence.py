"""Evidence for auditors: the change population of a period, its exceptions and checks, a reproducible sample, and
for any change a bundle a third party verifies offline (gateway/evidence_verifier.py). The CLI, the API and the
pages call these, and these call the one domain function (`build_population`), so their numbers agree."""

from __future__ import annotations

import base64
import secrets
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.domain.audit import GENESIS, AuditEvent, Checkpoint, EventQuery
from gateway.domain.audit_period import Period, period_of
from gateway.domain.change_population import (
    GLOBAL_ACTIONS,
    SAMPLE_METHOD,
    ChangeRow,
    Population,
    ReadChange,
    Sample,
    Scope,
    TrailIndex,
    change_of,
    draw_sample,
    population_of,
)
from gateway.domain.errors import Conflict, InputError, NotFound, Refused
from gateway.domain.evidence import (
    DECISION_KINDS,
    Documents,
    StoredEvent,
    assemble,
    attestation_message,
    identity_events,
)
from gateway.domain.preview import preview_from_json, render_text
from gateway.domain.principals import Principal
from gateway.domain.trail_tree import as_text
from gateway.services.admin.audit import audit_signer, require_auditor, trail_tree
from gateway.services.workspace import MainRules, Records, Signed, Workspace

MAX_SAMPLE = 1000
SPKI_ED25519 = bytes.fromhex("302a300506032b6570032100")  # DER prefix of an Ed25519 SubjectPublicKeyInfo

CATCH_UP = 20_000  # the most new events a kept period reads to catch up; past it, the period is read afresh


def resolve_period(ws: Records, period: str | None = None, since: str | None = None,
                   until: str | None = None) -> Period:
    """The period an auditor named (`2026-Q3`, `2026-07-01..2026-09-30`), or its ends, or the last 90 days."""
    try:
        return period_of(period, since, until, ws.clock.now().date())
    except ValueError as exc:
        raise InputError(str(exc)) from None


def repository_name(ws: Workspace) -> str:
    """The declaration repository a row names: its GitHub repository, or its directory's name."""
    github = ws.repo_settings().github
    return github.repository if github is not None else ws.settings.repo_path.name


def stack_environments(ws: MainRules) -> dict[str, str | None]:
    """Each stack's environment tag, as main's gateway.yaml says now."""
    return {name: stack.environment for name, stack in ws.repo_settings().stacks.items()}


def change_population(ws: Workspace, actor: Principal, period: Period, scope: Scope = Scope()) -> Population:
    """Every change applied or attempted in the period, its exceptions and checks."""
    require_auditor(actor)
    repository, environments = repository_name(ws), stack_environments(ws)
    with ws.store.session(readonly=True) as session:
        head = session.audit.chain_head() or (0, GENESIS)
        return _PERIODS.read(session, ws.settings.db_url, period, head).population(scope, repository, environments)


class PeriodEvents:
    """The events a period's population reads, kept per process and caught up with the trail when it moves: the
    trail is append-only, so a view after a few new events reads those few (and the changes they name), and reads
    again only the changes that moved. What it builds is `build_population` of the same events."""

    def __init__(self, index: TrailIndex, head: tuple[int, str]):
        self.index, self.head = index, head  # the chain's head they were read at: its seq and hash
        self.read: dict[tuple[Any, ...], ReadChange] = {}  # the changes read, by their story and what is around
        self.built: dict[tuple[Any, ...], Population] = {}  # by scope, repository and environments, at `head`

    @classmethod
    def of(cls, session: Any, period: Period, head: tuple[int, str]) -> PeriodEvents:
        """The period's applies, every event of their changes, and the trail's events about main, break-glass,
        drift and identities (few: a population reads no sign-in, job or notification)."""
        starts = session.audit.query(EventQuery(kind="apply.started", since=period.since, until=period.until))
        events = session.audit.of_proposals(sorted({e.proposal_id for e in starts if e.proposal_id}), exact=False)
        for action in GLOBAL_ACTIONS:
            events += session.audit.query(EventQuery(action=action))
        return cls(TrailIndex.of([e for e in events if e.seq <= head[0]], period), head)

    def caught_up(self, session: Any, head: tuple[int, str]) -> PeriodEvents:
        """A copy holding the events after the ones kept, up to `head`: those of kept changes, of main, break-glass,
        drift and identities, and every event of a change whose apply starts in the period (this one is left as it
        is: another request may be reading it)."""
        period, kept = self.index.period, self.index.applied_in
        taken, found = [], []
        for e in session.audit.iter(after=self.head[0], upto=head[0]):
            if e.proposal_id in kept or (e.kind.startswith(GLOBAL_ACTIONS) and e.proposal_id not in found):
                taken.append(e)
            elif e.kind == "apply.started" and e.proposal_id is not None and period.holds(e.at):
                found.append(e.proposal_id)
        older = [e for e in session.audit.of_proposals(found, exact=False) if e.seq <= head[0]] if found else []
        if any(e.seq <= self.head[0] for e in older):  # a change new to the period began before: read it all again
            index = TrailIndex.of([*(e for story in self.index.stories.values() for e in story), *self.index.around,
                                   *older, *taken], period)
        else:  # its whole story is new, as most are
            index = self.index.extended(sorted({e.seq: e for e in [*taken, *older]}.values(), key=lambda e: e.seq))
        fresh = PeriodEvents(index, head)
        fresh.read = dict(self.read)
        fresh.built = dict(self.built) if index is self.index else {}  # a sign-in, a job moves no population
        return fresh

    def population(self, scope: Scope, repository: str, environments: dict[str, str | None]) -> Population:
        key = (scope, repository, tuple(sorted(environments.items(), key=str)))
        if key not in self.built:
            self.built[key] = population_of(self.index, scope, repository, environments, self.read)
        return self.built[key]


class KeptPeriods:
    """The periods this process has read, by database, a few at a time (the newest asked kept)."""

    def __init__(self, size: int = 8):
        self.size = size
        self._kept: dict[tuple[str, Period], PeriodEvents] = {}
        self._lock = threading.Lock()

    def read(self, session: Any, database: str, period: Period, head: tuple[int, str]) -> PeriodEvents:
        """The period's events at `head`: kept ones caught up, or read afresh when none are kept, when too much
        happened since, or when the trail they were read from is not this one's (its event at their head differs)."""
        with self._lock:
            kept = self._kept.get((database, period))
        if kept is not None and kept.head != head:
            if not 0 <= head[0] - kept.head[0] <= CATCH_UP or not _still_there(session, kept.head):
                kept = None
            else:
                kept = kept.caught_up(session, head)
        if kept is None:
            kept = PeriodEvents.of(session, period, head)
        with self._lock:
            self._kept.pop((database, period), None)
            self._kept[(database, period)] = kept
            while len(self._kept) > self.size:
                self._kept.pop(next(iter(self._kept)))
        return kept


def _still_there(session: Any, head: tuple[int, str]) -> bool:
    """Whether the trail still holds the event kept events were read up to, unchanged."""
    if head[0] == 0:
        return True
    stored = session.audit.stored([head[0]])
    return bool(stored) and stored[0][3] == head[1]


_PERIODS = KeptPeriods()


def sample_changes(ws: Workspace, actor: Principal, period: Period, scope: Scope, size: int,
                   seed: str | None = None) -> Sample:
    """A reproducible sample of the population (a seed made when none is given); recorded in the trail, so every
    draw an auditor made is there to see."""
    if not 1 <= size <= MAX_SAMPLE:
        raise InputError(f"a sample is 1 to {MAX_SAMPLE} changes (--size), not {size}")
    seed = seed if seed is not None else secrets.token_hex(8)
    if not seed or len(seed) > 200:
        raise InputError("a seed is 1 to 200 characters")
    population = change_population(ws, actor, period, scope)
    sample = draw_sample(population, size, seed)
    with ws.store.session() as session:
        session.audit.append(actor, "audit.sampled", {**sample.to_json(), "method": SAMPLE_METHOD})
    return sample


def public_key(ws: Signed) -> tuple[str, str]:
    """The audit key's public half: base64 (as checkpoints name it) and PEM (what the verifier takes either of)."""
    raw = audit_signer(ws).public_key()
    der = base64.b64encode(SPKI_ED25519 + base64.b64decode(raw)).decode()
    return raw, f"-----BEGIN PUBLIC KEY-----\n{der}\n-----END PUBLIC KEY-----\n"


def evidence_bundle(ws: Workspace, actor: Principal, proposal_id: int,
                    sample: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One change's evidence, signed: its story, decisions with their identity proof, the plans as approved, the diff,
    the apply log, and every event they rest on with its audit path to the newest checkpoint that covers them all."""
    require_auditor(actor)
    key = audit_signer(ws)
    with ws.store.session(readonly=True) as session:
        trail = _change_events(session, proposal_id)
        found = change_of(trail, proposal_id, repository_name(ws), stack_environments(ws))
        if found is None:
            raise NotFound(f"no proposal {proposal_id} in the audit trail")
        row, around = found
        own = [e for e in trail if e.proposal_id == proposal_id]
        proofs = _identity_proofs(session, own)
        by_seq = {e.seq: e for e in [*trail, *(p for proof in proofs.values() for p in proof)]}
        seqs = sorted({*(e.seq for e in own), *around, *(p.seq for proof in proofs.values() for p in proof)})
        events = [by_seq[seq] for seq in seqs]
        checkpoint = _covering(session.audit.checkpoints(), key.public_key(), seqs[-1], proposal_id,
                               ws.settings.audit_checkpoint_minutes)
        stored = session.audit.stored(seqs)
    tree = trail_tree(ws, checkpoint.seq, [s - 1 for s in seqs])
    if as_text(tree.root()) != checkpoint.tree_root:
        raise Refused([f"the trail's first {checkpoint.seq} events no longer have the tree root the checkpoint "
                       "signed: the trail was rewritten (`gateway audit verify --resume` says where)"])
    proven = [StoredEvent(seq, text, prev, digest, tuple(as_text(h) for h in tree.path(seq - 1)))
              for seq, text, prev, digest in stored]
    for event in proven:
        if ws.scrubber.finds_in_json(event.canonical):
            raise Refused([f"event {event.seq} holds a value the workspace now keeps as a secret: its bytes cannot "
                           "be masked without breaking its hash, so no bundle is made"])
    unsigned = assemble(row, events, proven, checkpoint, _documents(ws, row, own), proofs,
                        ws.clock.now().isoformat(timespec="seconds"), sample)
    signature = key.sign(attestation_message(unsigned))
    return {**unsigned, "attestation": {"public_key": key.public_key(), "signature": signature}}


def _change_events(session: Any, proposal_id: int) -> list[AuditEvent]:
    events = session.audit.of_proposals([proposal_id])
    for action in GLOBAL_ACTIONS:
        events += session.audit.query(EventQuery(action=action))
    return events


def _identity_proofs(session: Any, own: Sequence[AuditEvent]) -> dict[int, list[AuditEvent]]:
    """For each decision: the events that show who made it and how they signed in."""
    decisions = [e for e in own if e.kind in DECISION_KINDS and e.actor_kind == "person"]
    if not decisions:
        return {}
    about = session.audit.query(EventQuery(action="principal")) + session.audit.query(
        EventQuery(kind="identity.linked"))
    proofs = {}
    for d in decisions:
        sign_ins = session.audit.query(EventQuery(actor=d.actor, kind="sign_in", until=d.at))
        proofs[d.seq] = identity_events(d, about + sign_ins[-1:] + list(own))
    return proofs


def _covering(checkpoints: Sequence[Checkpoint], public: str, newest: int, proposal_id: int,
              minutes: float) -> Checkpoint:
    usable = [c for c in checkpoints if c.tree_root and c.public_key == public and c.seq >= newest]
    if not usable:
        raise Conflict(f"the events of proposal {proposal_id} (up to event {newest}) are not yet covered by a signed "
                       f"checkpoint: workers sign one every {minutes:g} minutes, or `gateway audit checkpoint` "
                       "signs one now")
    return usable[-1]


def _documents(ws: Workspace, row: ChangeRow, own: Sequence[AuditEvent]) -> Documents:
    """The plans as they were approved (rendered, masked), the diff applied, the apply log; any known secret scrubbed."""
    scrub = ws.scrubber.scrub
    plan_events = {(e.stacks[0], e.payload.get("digest")): e for e in own if e.kind == "plan" and e.stacks}
    started = {e.payload.get("apply_id"): e.payload.get("digest") for e in own if e.kind == "apply.started"}
    with ws.store.session(readonly=True) as session:
        proposal = session.proposals.get(row.proposal_id)
        records = session.proposals.applies_of(row.proposal_id)
        wanted = [(r.stack, r.plan_id, started.get(r.id)) for r in records] or [
            (s, p.plan_id, p.digest) for s, p in proposal.plans.items()]
        plans, seen = [], set()
        for stack, plan_id, digest in wanted:
            event = plan_events.get((stack, digest))
            if event is None or (stack, digest) in seen:
                continue
            seen.add((stack, digest))
            text = session.proposals.plan_preview(plan_id)
            plans.append({"stack": stack, "digest": digest, "event": event.seq,
                          "risk": (event.payload.get("risk") or {}).get("level"),
                          "preview": scrub(render_text(preview_from_json(text))) if text else
                          "(no rendered preview was kept with this plan)"})
    jobs = [e.payload.get("job") for e in own if e.kind == "job.queued" and e.payload.get("kind") == "apply"]
    head = row.applied_commit if row.applied_commit and "," not in row.applied_commit else proposal.head_sha
    diff = {"base": proposal.base_sha, "head": head, "text": scrub(ws.repo.diff(proposal.base_sha, head))}
    apply_log = [{"stack": r.stack, "status": r.status.value, "runner": r.runner, "commit": r.commit_sha,
                  "started_at": r.started_at.isoformat(), "finished_at": r.finished_at.isoformat()
                  if r.finished_at else None, "applied": [scrub(a) for a in r.applied],
                  "error": scrub(r.error) if r.error else None} for r in records]
    apply_log += _job_logs(ws, jobs)
    return Documents(tuple(plans), diff, tuple(apply_log))


def _job_logs(ws: Workspace, jobs: Sequence[Any]) -> list[dict[str, Any]]:
    """The apply jobs' progress lines, as the worker said them."""
    logs = []
    for job_id in jobs:
        if not isinstance(job_id, int):
            continue
        try:
            job = ws.store.queue.get(job_id)
        except NotFound:
            continue
        logs.append({"job": job_id, "status": job.status.value, "runner": job.runner,
                     "lines": [ws.scrubber.scrub(line) for line in job.progress],
                     "error": ws.scrubber.scrub(job.error) if job.error else None})
    return logs


def sample_bundles(ws: Workspace, actor: Principal, sample: Sample) -> dict[int, dict[str, Any]]:
    """The evidence of each sampled change, each naming the sample it was drawn in."""
    return {pid: evidence_bundle(ws, actor, pid, sample.to_json()) for pid in sample.selected}
