"""A proposal's stacks planned as jobs of their own: any worker plans any stack, the last one writes the plans.

Whoever asks for the plans (a plan job, a decision catching up, the opening of a proposal, the CLI with no worker)
starts a round, a `plan_stack` job per stack, then plans its round's stacks itself, claiming them one by one like
any worker, while other workers claim the rest; with no worker at all it plans every stack, as it always did. The
job that ends a round's last stack finishes the round: a proposal's plans are written together from the staged
ones (`assemble_round`, compare-and-set on the round, under the proposal's row lock), so two workers ending the last
two stacks at once write them once. Each stack's job stages its plan as the proposal records it (`stage`: the
canonical document, its summary and masked preview), so that last job, which no other worker can help, parses and
renders nothing: it writes. A stack whose plan fails fails the round: the proposal keeps the plans it had
and says which stack failed and why. A worker killed mid-plan leaves its stack running; recovery queues its job
again (a worker's housekeeping, or the round's own asker), and the stack is planned again from the start.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.domain import errors
from gateway.domain.breaker import CapacityChange
from gateway.domain.errors import GatewayError, Refused
from gateway.domain.jobs import Job, JobKind, JobStatus
from gateway.domain.lifecycle import DECIDABLE
from gateway.domain.plan import canonical_json, load_plan
from gateway.domain.plan_rounds import UNFINISHED, PlanRound, RoundState, StackStatus, StagedPlan
from gateway.domain.preview import preview_to_json
from gateway.domain.principals import GATEWAY, Actor, SystemActor
from gateway.domain.proposal import Proposal, ProposalStatus, Transition
from gateway.fault_points import reach
from gateway.logs import get_logger
from gateway.ports import EnginePlan, UnitOfWork
from gateway.services.change.breaker import guard_agent_change
from gateway.services.change.heartbeat import Heartbeat
from gateway.services.change.locks import runner_name
from gateway.services.change.planning import ChangeOrigin, StackPlanResult, plan_stack
from gateway.services.workspace import Workspace

log = get_logger(__name__)

POLL_SECONDS = 0.2
STACK_ATTEMPTS = 3  # a stack whose planning killed its worker this often fails the round instead


def plan_in_round(ws: Workspace, stacks: Sequence[str], head: str, main_sha: str, merged: str, origin: ChangeOrigin,
                  proposal_id: int | None = None, changes: Sequence[str] = ()) -> PlanRound:
    """Plan `stacks` at `merged` as a round of jobs, planning here what no worker has taken; the round as it ended."""
    round_id = start_round(ws, stacks, head, main_sha, merged, origin, proposal_id, changes)
    return help_and_wait(ws, round_id)


def start_round(ws: Workspace, stacks: Sequence[str], head: str, main_sha: str, merged: str, origin: ChangeOrigin,
                proposal_id: int | None, changes: Sequence[str]) -> int:
    """A round and a queued job per stack, in one transaction (a newer round of the proposal ends older ones)."""
    spec = {"changed_paths": list(origin.changed_paths), "changes": list(changes), "by_agent": origin.by_agent,
            "requester": origin.requester}
    with ws.store.session() as session:
        if proposal_id is not None:
            session.plan_rounds.supersede(proposal_id)  # their queued jobs find it so and end without planning
        round_id = session.plan_rounds.add(proposal_id, head, main_sha, merged, stacks, spec)
        session.plan_rounds.link_jobs(round_id, {
            stack: session.jobs.add(JobKind.PLAN_STACK, None, GATEWAY,
                                    {"round": round_id, "stack": stack, "proposal": proposal_id})
            for stack in stacks})
    return round_id


def help_and_wait(ws: Workspace, round_id: int) -> PlanRound:
    """Plan the round's stacks no worker has claimed, then wait for the others; the round once it has ended."""
    runner = f"{runner_name()}/plan-{threading.get_ident()}"
    finished_since: float | None = None
    next_check = time.monotonic() + ws.settings.lock_ttl_seconds
    while True:
        seen = ws.store.queue.moves()
        with ws.store.session(readonly=True) as session:
            current = session.plan_rounds.get(round_id)
        if current.finished:
            return current
        checking = time.monotonic() >= next_check
        if checking:  # a worker planning one of them may have died: its job is queued again, and claimable here
            requeue_stale_stacks(ws, current)
            next_check = time.monotonic() + ws.settings.lock_ttl_seconds
        if _plan_queued_stacks(ws, current, runner, also_running=checking):
            continue
        if current.remaining == 0:  # its last job ended the stacks; give it the time to end the round, or its place
            finished_since = finished_since or time.monotonic()
            if time.monotonic() - finished_since > ws.settings.lock_ttl_seconds:
                finish_round(ws, round_id)
        ws.store.queue.wait(seen, POLL_SECONDS)


def _plan_queued_stacks(ws: Workspace, current: PlanRound, runner: str, also_running: bool = False) -> bool:
    """Claim and plan, here, each queued stack of the round that no worker took first; whether any was. A stack still
    marked running may have had its job queued again (its worker died, or stopped and handed it back)."""
    planned = False
    wanted = UNFINISHED if also_running else {StackStatus.QUEUED}
    for stack in current.stacks:
        if stack.status in wanted and stack.job_id is not None:
            job = ws.store.queue.claim(runner, job_id=stack.job_id)
            if job is None and planned and not also_running:  # workers took the next ones while this one planned:
                return True  # read the round again rather than try, one claim each, the rest of a list read a plan ago
            if job is not None:
                run_stack_job_here(ws, job, runner)
                planned = True
    return planned


def run_stack_job_here(ws: Workspace, job: Job, runner: str) -> None:
    """Run a claimed `plan_stack` job in this process, heart-beating, and record its end (as a worker's would be)."""
    beat = Heartbeat(f"job-{job.id}", max(0.05, min(10.0, ws.settings.lock_ttl_seconds / 3)),
                     lambda: ws.store.queue.heartbeat(job.id, runner))
    beat.start()
    started = time.monotonic()
    try:
        status, result, error = run_plan_stack_job(ws, job, runner, lambda _line: None)
    finally:
        beat.stop()
    with ws.store.session() as session:
        finished = session.jobs.finish(job.id, status, result, error)
    if finished:
        ws.metrics.job_ran(job.kind.value, time.monotonic() - started)


def run_plan_stack_job(ws: Workspace, job: Job, runner: str,
                       progress: Callable[[str], None]) -> tuple[JobStatus, dict[str, Any], str | None]:
    """A `plan_stack` job: plan one stack of its round and record it there; the job ending the round finishes it."""
    round_id, stack = int(job.args["round"]), str(job.args["stack"])
    with ws.store.session() as session:
        started = session.plan_rounds.start_stack(round_id, stack)
        current = session.plan_rounds.get(round_id, with_stacks=False)
    if not started:
        return JobStatus.SUCCEEDED, {"round": round_id, "stack": stack,
                                     "skipped": f"round {round_id} is {current.state.value}"}, None
    staged, error, kind = None, None, None
    try:
        staged = stage(plan_stack(ws, stack, current.merged_sha,
                                  ChangeOrigin(current.by_agent, current.requester, current.changed_paths)))
    except GatewayError as exc:
        error, kind = str(exc), type(exc).__name__
    except Exception as exc:  # recorded as this stack's failure, as a job's end is whatever happens
        log.exception("plan_stack.crashed", job=job.id, stack=stack)
        error, kind = f"internal error: {type(exc).__name__}: {exc}", "internal"
    reach(f"plan.after_stack:{stack}")
    remaining = record_stack_end(ws, round_id, stack, staged, error, kind)
    return (JobStatus.FAILED if error else JobStatus.SUCCEEDED), \
        {"round": round_id, "stack": stack, "remaining": remaining}, error


def record_stack_end(ws: Workspace, round_id: int, stack: str, staged: StagedPlan | None,
                     error: str | None = None, error_kind: str | None = None) -> int | None:
    """Record one stack's plan (or its failure) in its round; if it was the round's last, finish the round."""
    with ws.store.session() as session:
        remaining = session.plan_rounds.finish_stack(round_id, stack, staged, error, error_kind)
        finished = remaining == 0 and _end_without_plans(session, round_id)
    if remaining == 0 and not finished:
        assemble_round(ws, round_id)
    return remaining


def finish_round(ws: Workspace, round_id: int) -> None:
    """End a round whose stacks have all ended (its last job's process died before it could)."""
    with ws.store.session() as session:
        if session.plan_rounds.get(round_id).remaining or _end_without_plans(session, round_id):
            return
    assemble_round(ws, round_id)


def _end_without_plans(session: UnitOfWork, round_id: int) -> bool:
    """End the round, every stack ended, unless its plans are to be written to a proposal: failed when a stack
    failed, planned when its opener writes them. Whether it ended here (or had ended)."""
    current = session.plan_rounds.get(round_id)
    if current.finished:
        return True
    if current.failed:
        session.plan_rounds.close(round_id, RoundState.FAILED, {"reasons": current.reasons()})
        return True
    if current.proposal_id is None:
        session.plan_rounds.close(round_id, RoundState.PLANNED)
        return True
    return False


def assemble_round(ws: Workspace, round_id: int) -> None:
    """Write a proposal's plans from its round, once (compare-and-set on the round, under the proposal's row lock):
    a new head's commits, the plans, a failed proposal back to open, the decisions the new plans made stale."""
    with ws.store.session(readonly=True) as session:
        current = session.plan_rounds.get(round_id)
        staged = session.plan_rounds.staged(round_id)
        proposal = session.proposals.get(current.proposal_id) if current.proposal_id is not None else None
    if current.finished or current.remaining or proposal is None:
        return  # ended already, or a stack still planning: its end comes back here
    new_agent_work = current.head_sha != proposal.head_sha and proposal.proposer.is_agent
    try:  # only an agent's new work has its plans read again here (what it adds and destroys)
        capacity = guard_agent_change(ws, proposal.proposer, proposal.id, [unstage(p) for p in staged]) \
            if new_agent_work else None
    except Refused as exc:
        with ws.store.session() as session:
            session.plan_rounds.close(round_id, RoundState.FAILED, {"reasons": exc.reasons})
        return
    with ws.store.session() as session:
        locked = session.proposals.get(proposal.id, lock=True)
        if locked.status not in DECIDABLE:
            session.plan_rounds.close(round_id, RoundState.SUPERSEDED,
                                      {"reasons": [f"proposal {proposal.id} is {locked.status.value}"]})
            return
        if not session.plan_rounds.close(round_id, RoundState.ASSEMBLED):
            return  # another job of the round wrote them
        basis = Replanned(current.head_sha, current.main_sha, tuple(s.stack for s in current.stacks),
                          current.changed_paths)
        changes = write_replan(ws, session, locked, basis, staged, capacity, list(current.changes))
        session.plan_rounds.set_result(round_id, {"changes": changes})


@dataclass(frozen=True)
class Replanned:
    """What a re-plan planned: the branch's head merged onto main, and the stacks and paths that head changes."""

    head_sha: str
    main_sha: str
    stacks: tuple[str, ...]
    changed_paths: tuple[str, ...]


def write_replan(ws: Workspace, session: UnitOfWork, locked: Proposal, basis: Replanned,
                 plans: Sequence[StagedPlan], capacity: CapacityChange | None, changes: list[str]) -> list[str]:
    """What a re-plan writes, in the transaction that holds the proposal's row (planned in one job or in a round);
    what changed, in words."""
    pid, head, stacks = locked.id, basis.head_sha, basis.stacks
    if capacity is not None:
        session.breaker.record_change(capacity)
    if head != locked.head_sha:
        record_commits(ws, session, pid, locked.head_sha, head, stacks)
        session.proposals.update_head(pid, head, stacks, basis.changed_paths)
    record_plans(session, pid, head, basis.main_sha, plans)
    updated = session.proposals.get(pid)
    if updated.status == ProposalStatus.FAILED:
        updated.move(Transition.REPLAN, GATEWAY, {"because": changes})
        session.proposals.save(updated)
    newly_stale = [d for d in updated.stale_decisions if locked.is_current(d)]
    if newly_stale:
        session.audit.append(GATEWAY, "decisions.stale", {
            "decisions": [{"id": d.id, "by": d.principal.name, "decision": d.decision.value,
                           "head_sha": d.head_sha, "digests": dict(d.digests)} for d in newly_stale],
            "because": changes, "head_sha": head, "digests": updated.current_digests,
        }, pid, stacks)
        changes.append(f"{len(newly_stale)} earlier decision(s) are now stale")
    return changes


def requeue_stale_stacks(ws: Workspace, current: PlanRound) -> None:
    """Queue again the round's stack jobs whose worker stopped heart-beating (what recovery does for every job)."""
    jobs = {s.job_id for s in current.stacks if s.status == StackStatus.RUNNING}
    for job in ws.store.queue.stale(ws.settings.lock_ttl_seconds):
        if job.id in jobs:
            requeue_stack_job(ws, job)


def requeue_stack_job(ws: Workspace, job: Job) -> str | None:
    """A `plan_stack` job whose worker died: queued again, or after `STACK_ATTEMPTS` its stack fails the round.
    What was done, in words (None if another recoverer got there first)."""
    why = f"worker {job.runner} stopped heart-beating while planning stack {job.args.get('stack')}"
    if job.attempts < STACK_ATTEMPTS:
        with ws.store.session() as session:
            if not session.jobs.retry(job.id, ws.clock.now(), why):
                return None
        ws.metrics.job_retried(job.kind.value)
        return f"job {job.id} of worker {job.runner}, queued again"
    with ws.store.session() as session:
        if not session.jobs.finish(job.id, JobStatus.INTERRUPTED, error=why):
            return None
    record_stack_end(ws, int(job.args["round"]), str(job.args["stack"]), None,
                     f"{why} ({job.attempts} times); not planned", "interrupted")
    return f"job {job.id} of worker {job.runner}, its stack failed after {job.attempts} attempts"


def round_error(current: PlanRound) -> GatewayError:
    """The error a failed round raises to whoever waited for it: its first failed stack's, as that stack raised it."""
    failed = current.failed
    if not failed:
        return Refused(current.reasons() or [f"plan round {current.id} failed"])
    first = failed[0]
    kind = getattr(errors, first.error_kind or "", None)
    message = first.error or f"stack {first.stack}: its plan failed"
    more = [f"; {len(failed) - 1} other stack(s) failed too: {', '.join(s.stack for s in failed[1:])}"] \
        if len(failed) > 1 else []
    if kind is Refused:
        return Refused([message, *more])
    if isinstance(kind, type) and issubclass(kind, GatewayError) and kind not in (Refused,):
        try:
            return kind(message + "".join(more))
        except TypeError:  # an error whose constructor takes more than a message
            pass
    return errors.PlanError(message + "".join(more))


def stage(result: StackPlanResult) -> StagedPlan:
    """A stack's plan as a proposal records it, made where it was planned: its canonical document (the bytes its
    digest is of), its judgement, its summary and its masked preview."""
    return StagedPlan(result.stack, result.sha, result.digest, result.document_text, result.engine_plan.state_serial,
                      result.engine_plan.state_lineage, result.engine_plan.artifact, result.findings, result.risk,
                      result.read_at, result.summary(), preview_to_json(result.preview()), _engine_label(result))


def unstage(staged: StagedPlan) -> StackPlanResult:
    """The plan a round held, as the process that planned it had it."""
    document = json.loads(staged.document)
    engine_plan = EnginePlan(document, staged.state_serial, staged.state_lineage, staged.artifact)
    return StackPlanResult(staged.stack, staged.sha, engine_plan, load_plan(document), staged.digest,
                           canonical_json(document).decode(), staged.findings, staged.risk, staged.read_at)


def recordable(staged: StagedPlan) -> StagedPlan:
    """`staged` with its summary and preview (made from its document if it was staged without them)."""
    return staged if staged.summary is not None and staged.preview is not None else stage(unstage(staged))


def record_commits(ws: Workspace, session: UnitOfWork, pid: int, base: str, head: str, stacks: Sequence[str]) -> None:
    """Each commit between `base` and `head`, in the trail under its author."""
    for commit in ws.repo.commits(base, head):
        session.audit.append(SystemActor(commit.author_name), "commit", {
            "sha": commit.sha, "author": f"{commit.author_name} <{commit.author_email}>",
            "message": commit.message.strip()[:500]}, pid, stacks)


def record_plans(session: UnitOfWork, pid: int, head: str, main_sha: str, plans: Sequence[StagedPlan]) -> None:
    """The proposal's plans, each with its `plan` event (the events written together, in the plans' order)."""
    events: list[tuple[Actor, str, dict[str, Any], int | None, Sequence[str]]] = []
    for staged in plans:
        p = recordable(staged)
        assert p.summary is not None and p.preview is not None
        if p.read_at is not None:  # what the engine said of the stack's state: reads compare plans with it
            session.stacks.record_serials({p.stack: p.state_serial}, p.read_at)
        session.proposals.add_plan(pid, p.stack, head, main_sha, p.digest, p.document, p.state_serial,
                                   p.state_lineage, p.summary, p.preview, p.artifact)
        events.append((GATEWAY, "plan", {
            "head_sha": head, "main_sha": main_sha, "merged_sha": p.sha, "digest": p.digest, "engine": p.engine,
            "state_serial": p.state_serial, **p.summary.to_json()}, pid, [p.stack]))
    if events:  # none: the trail's head is not even locked
        session.audit.append_many(events)


def _engine_label(result: StackPlanResult) -> str:
    return str(result.engine_plan.document.get("gateway_engine") or result.plan.terraform_version or "terraform")
