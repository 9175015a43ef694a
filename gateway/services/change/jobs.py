"""Plans and applies as jobs: queued by any process, run by a worker, followed from anywhere.

A job heart-beats while it runs. Whatever happens inside, its end is recorded (succeeded, failed,
refused), and a job whose worker died is recorded interrupted by the next worker's recovery pass,
together with the apply it was running (via the stack lock that stopped being renewed). A webhook job
that fails because GitHub cannot serve now goes back in the queue with a backoff (`job.retrying`):
its delivery was answered 202, so GitHub will not send it again, and a review must not be lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import UTC, timedelta
from typing import Any

from gateway.domain.apply_blockers import apply_blockers
from gateway.domain.errors import GatewayError, LockTimeout, NotFound, Refused, RetryLater, Unavailable
from gateway.domain.jobs import PLANNED_FROM, Job, JobKind, JobStatus, RetryPolicy, plan_failure
from gateway.domain.lifecycle import DECIDABLE, Transition, next_status
from gateway.domain.permissions import Action, require
from gateway.domain.principals import GATEWAY, Actor, Principal
from gateway.domain.proposal import Decision, Proposal
from gateway.logs import get_logger
from gateway.services.change.apply_facts import gather_apply_facts
from gateway.services.change.heartbeat import Heartbeat
from gateway.services.change.plan_failures import plan_inputs
from gateway.services.change.proposals import (
    changes_since_plans,
    decide,
    get_proposal,
    read_serials,
    sync_proposal,
)
from gateway.services.change.recovery import interrupt_stale_jobs, recover_expired_locks
from gateway.services.change.runner import ApplyReport, apply_proposal
from gateway.services.change.workers import live_workers
from gateway.services.workspace import Workspace

log = get_logger(__name__)

Progress = Callable[[str], None]
GIVE_UP_ASKED_EVERY = 2.0  # seconds between a follower's questions of whether its job can still end
WEBHOOK_RETRY = RetryPolicy()  # 2 s, 4 s, 8 s … at most 5 min apart, for up to an hour or 20 attempts


def enqueue_job(ws: Workspace, actor: Actor, kind: JobKind, proposal_id: int) -> Job:
    """Queue a plan or apply of a proposal (one unfinished job of a kind per proposal) and return at once."""
    proposal = get_proposal(ws, proposal_id)
    recover_abandoned_work(ws)  # a job whose worker died must not stand in for this one
    if isinstance(actor, Principal):
        require(actor, Action.APPLY if kind == JobKind.APPLY else Action.PLAN)
    with ws.store.session() as session:
        existing = session.jobs.queued(kind, proposal_id)
        if existing is not None:
            job_id = existing
        else:
            status = session.proposals.get(proposal_id).status
            if kind == JobKind.APPLY and next_status(status, Transition.START_APPLY) is None:
                # asked again after the apply ended: say so now rather than queue a job only to refuse it
                raise Refused([f"proposal {proposal_id} is {status.value}"])
            job_id = session.jobs.add(kind, proposal_id, actor)
            session.audit.append(actor, "job.queued", {"job": job_id, "kind": kind.value}, proposal_id,
                                 proposal.stacks)
    return ws.store.queue.get(job_id)


def approve_proposal(ws: Workspace, actor: Principal, proposal_id: int, comment: str, seen_sha: str | None = None,
                     auth: str = "api-token",
                     seen_digests: Mapping[str, str] | None = None) -> tuple[Proposal, Job | None]:
    """Record an approval; when gateway.yaml sets `auto_apply` and it was the last one needed, queue the apply."""
    proposal = decide(ws, actor, proposal_id, Decision.APPROVE, comment, seen_sha, auth, seen_digests)
    settings = ws.repo_settings()
    if not settings.auto_apply or apply_blockers(gather_apply_facts(ws, proposal, actor)):
        return proposal, None
    return proposal, enqueue_job(ws, actor, JobKind.APPLY, proposal_id)


def run_job(ws: Workspace, job: Job, runner: str, on_progress: Progress | None = None) -> Job:
    """Run one claimed job to its end, heart-beating meanwhile, in the workspace of the repository it works in;
    every way out is recorded."""
    try:
        ws = ws.for_job(job)
    except GatewayError as exc:  # a repository removed from under its queued job, or its folder gone
        with ws.store.session() as session:
            session.jobs.finish(job.id, JobStatus.FAILED, {}, str(exc))
        return ws.store.queue.get(job.id)

    def progress(line: str) -> None:
        ws.store.queue.add_progress(job.id, line)
        if on_progress:
            on_progress(line)

    beat = Heartbeat(f"job-{job.id}", max(0.05, min(10.0, ws.settings.lock_ttl_seconds / 3)),
                     lambda: ws.store.queue.heartbeat(job.id, runner))
    beat.start()
    started = time.monotonic()
    status, result, error = JobStatus.FAILED, {}, None
    unavailable: Unavailable | None = None
    try:
        handler = ws.job_handlers.get(job.kind)
        if handler is None:  # a workspace wired without its handlers: say so rather than guess
            raise NotFound(f"this process has no handler for {job.kind.value} jobs")
        status, result, error = handler(ws, job, runner, progress)
    except Refused as exc:
        status, result, error = JobStatus.REFUSED, {"reasons": exc.reasons}, "; ".join(exc.reasons)
    except Unavailable as exc:
        status, error, unavailable = JobStatus.FAILED, str(exc), exc
    except GatewayError as exc:
        status, error = JobStatus.FAILED, str(exc)
    except Exception as exc:  # the worker records its end whatever happens
        log.exception("job.crashed", job=job.id)
        status, error = JobStatus.FAILED, f"internal error: {type(exc).__name__}: {exc}"
    finally:
        beat.stop()
    if unavailable is not None and (job.kind == JobKind.WEBHOOK or isinstance(unavailable, RetryLater)):
        given_up = _retry_later(ws, job, runner, unavailable, progress)
        if given_up is None:
            ws.metrics.job_retried(job.kind.value)
            return ws.store.queue.get(job.id)
        error = given_up
    with ws.store.session() as session:
        finished = session.jobs.finish(job.id, status, result, error)
        if finished and _worth_recording(job, status, result):
            proposal = session.proposals.get(job.proposal_id) if job.proposal_id else None
            session.audit.append(GATEWAY, f"job.{status.value}", {
                "job": job.id, "kind": job.kind.value, "runner": runner, "error": error},
                job.proposal_id, proposal.stacks if proposal else ())
    if finished:  # how many ended, by outcome, is counted from the jobs table (gateway_jobs_finished_total)
        ws.metrics.job_ran(job.kind.value, time.monotonic() - started)
    return ws.store.queue.get(job.id)


def _retry_later(ws: Workspace, job: Job, runner: str, exc: Unavailable, progress: Progress) -> str | None:
    """Queue the job again after a backoff (None), or say why it is given up instead. A handler that raised
    `RetryLater` has judged its own retries: it runs again after the wait it asked for."""
    attempt = max(1, job.attempts)
    wait = WEBHOOK_RETRY.delay(attempt, exc.retry_after)
    created = job.created_at or ws.clock.now()
    age = ws.clock.now() - (created if created.tzinfo else created.replace(tzinfo=UTC))
    if isinstance(exc, RetryLater):
        wait = timedelta(seconds=exc.retry_after or 0.0)
    elif WEBHOOK_RETRY.gives_up(attempt, age, wait):
        return (f"gave up after {attempt} attempts over {int(age.total_seconds())} s, GitHub still failing: {exc}; "
                f"what the delivery carried was not recorded: review or comment again")
    progress(f"attempt {attempt} failed: {exc}; trying again in {wait.total_seconds():g} s")
    with ws.store.session() as session:
        if session.jobs.retry(job.id, ws.clock.now() + wait, str(exc)):
            proposal = session.proposals.get(job.proposal_id) if job.proposal_id else None
            session.audit.append(GATEWAY, "job.retrying", {
                "job": job.id, "kind": job.kind.value, "runner": runner, "attempt": attempt, "error": str(exc),
                "retry_in_seconds": wait.total_seconds()}, job.proposal_id, proposal.stacks if proposal else ())
    return None


def _worth_recording(job: Job, status: JobStatus, result: Mapping[str, Any]) -> bool:
    """Every job's end is in the trail, except the ones that only mirror it: publish and notify jobs, and deliveries
    that changed nothing (recording those would move the trail, and so the pull request, again)."""
    if job.kind in (JobKind.PUBLISH, JobKind.NOTIFY):  # a delivery's end is its notification.* event
        return False
    if job.kind == JobKind.PLAN_STACK:  # a stack's plan is in the trail as the proposal's `plan` event, with the others
        return False
    return not (job.kind == JobKind.WEBHOOK and status == JobStatus.SUCCEEDED and "ignored" in result)


def run_plan_job(ws: Workspace, job: Job, runner: str,
                 progress: Progress) -> tuple[JobStatus, dict[str, Any], str | None]:
    """A plan job: catch the proposal up with its branch, main and its stacks' state.

    A plan that fails on what it planned from (a branch that conflicts with main, a malformed declaration) records
    those inputs, so the workers plan it again only once one moves; a dependency's bad moment is not recorded so.
    """
    progress(f"re-planning proposal {job.proposal_id}")
    proposal_id = proposal_id_of(job)
    head_sha, main_sha = plan_inputs(ws, get_proposal(ws, proposal_id).branch)
    planned_from = {PLANNED_FROM: {"head_sha": head_sha, "main_sha": main_sha}}
    try:
        _, changes = sync_proposal(ws, proposal_id)
    except (Unavailable, LockTimeout):
        raise
    except Refused as exc:  # an open breaker refuses the same change the same way until it is reset
        return JobStatus.REFUSED, {"reasons": exc.reasons, **planned_from}, "; ".join(exc.reasons)
    except GatewayError as exc:
        return JobStatus.FAILED, planned_from, str(exc)
    for change in changes:
        progress(change)
    return JobStatus.SUCCEEDED, {"changes": changes}, None


def run_apply_job(ws: Workspace, job: Job, runner: str, progress: Progress) -> tuple[JobStatus, dict[str, Any], str | None]:
    """An apply job: exactly the approved plans, then the merge."""
    with ws.store.session() as session:
        actor = session.principals.get(job.requested_by)
    report = apply_proposal(ws, actor, proposal_id_of(job), runner, progress)
    error = report.unmerged or next((o.error for o in report.outcomes if o.error), None)
    return (JobStatus.SUCCEEDED if report.succeeded else JobStatus.FAILED), report_json(report), error


def report_json(report: ApplyReport) -> dict[str, Any]:
    return {"succeeded": report.succeeded, "merge_sha": report.merge_sha, "unmerged": report.unmerged,
            "outcomes": [{"stack": o.stack, "succeeded": o.succeeded, "applied": list(o.applied), "error": o.error}
                         for o in report.outcomes]}


def proposal_id_of(job: Job) -> int:
    if job.proposal_id is None:
        raise NotFound(f"job {job.id} names no proposal")
    return job.proposal_id


def follow_job(ws: Workspace, job_id: int, on_progress: Progress, poll_seconds: float = 0.2,
               timeout_seconds: float | None = None, give_up: Callable[[Job], bool] | None = None) -> Job:
    """Wait for a job to finish, passing on each progress line once; unfinished past `timeout_seconds`, or once
    `give_up` (asked every few seconds) says there is no point waiting."""
    shown = 0
    deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
    next_recovery = time.monotonic() + ws.settings.lock_ttl_seconds
    next_ask = time.monotonic() + GIVE_UP_ASKED_EVERY
    while True:
        if time.monotonic() >= next_recovery:  # the worker running it may have died: then it ends interrupted
            recover_abandoned_work(ws)
            next_recovery = time.monotonic() + ws.settings.lock_ttl_seconds
        job = ws.store.queue.get(job_id)
        for line in job.progress[shown:]:
            on_progress(line)
        shown = len(job.progress)
        if job.finished or (deadline is not None and time.monotonic() > deadline):
            return job
        if give_up is not None and time.monotonic() >= next_ask:
            if give_up(job):
                return job
            next_ask = time.monotonic() + GIVE_UP_ASKED_EVERY
        time.sleep(poll_seconds)


def require_a_worker(ws: Workspace) -> None:
    """Where workers run the jobs (PostgreSQL), a command that would wait for one queues it only while a worker is
    live: it never runs the job itself. Refused (nothing queued) when none is: a job left queued would run whenever
    one starts, long after the person who asked stopped waiting for it."""
    if runs_jobs_here(ws) or live_workers(ws):
        return
    raise Refused(["no worker is live on this database (none has beaten its heartbeat lately): nothing was "
                   "queued. Here jobs run on workers, never in this command: start one (`gateway worker`) and ask "
                   "again, or queue it for the next worker to start with --no-wait"])


def follow_on_workers(ws: Workspace, job: Job, on_progress: Progress) -> Job:
    """Follow a job the workers run to its end; it comes back unfinished if it is still queued and no worker is live
    any more (the one there when it was queued has stopped)."""
    return follow_job(ws, job.id, on_progress,
                      give_up=lambda current: current.status == JobStatus.QUEUED and not live_workers(ws))


def runs_jobs_here(ws: Workspace) -> bool:
    """The embedded default (SQLite: one machine, no worker to wait for): a command runs the jobs it queues."""
    return ws.store.dialect == "sqlite"


def run_now_or_follow(ws: Workspace, job: Job, runner: str, on_progress: Progress) -> Job:
    """The embedded default: run the queued job in this process, or follow it if a worker took it first."""
    claimed = ws.store.queue.claim(runner, job_id=job.id)
    if claimed is not None:
        return run_job(ws, claimed, runner, on_progress)
    return follow_job(ws, job.id, on_progress)


def recover_abandoned_work(ws: Workspace) -> list[str]:
    """Record what workers that stopped heart-beating left behind: their applies and their jobs."""
    recovered = recover_expired_locks(ws)  # first: an interrupted job's proposal is settled before the job ends
    recovered += interrupt_stale_jobs(ws)
    recovered += ws.reactions.recovering(ws)  # an agent turn's run follows its interrupted job
    return recovered


def enqueue_moved_proposals(ws: Workspace) -> list[int]:
    """Queue a plan job for each open proposal whose branch, main or stack state moved since its plans.

    The stacks' state serials it reads are recorded: what a read shows of a stack that moved (reads never ask)."""
    with ws.store.session(readonly=True) as session:
        bases = session.proposals.plan_bases(DECIDABLE)
        waiting = session.jobs.proposals_with_unfinished(JobKind.PLAN)
        breakers_changed = max((state.changed_at for state in session.breaker.states()), default=None)
    main_sha = ws.repo.resolve(ws.main_branch())
    bases = [basis for basis in bases if basis.proposal_id not in waiting]  # a queued plan job re-plans them
    serials = read_serials(ws, sorted({stack for basis in bases for stack in basis.plans}))
    with ws.store.session(readonly=True) as session:
        last_plans = session.jobs.latest_finished(JobKind.PLAN, [basis.proposal_id for basis in bases])
    queued = []
    for basis in bases:
        last = last_plans.get(basis.proposal_id)
        failure = plan_failure([last]) if last is not None else None
        if failure is not None and failure.holds(*plan_inputs(ws, basis.branch, main_sha), breakers_changed):
            continue  # it would fail the same way again: wait for its branch or main to move
        if changes_since_plans(ws, basis, main_sha, serials.__getitem__):
            queued.append(enqueue_job(ws, GATEWAY, JobKind.PLAN, basis.proposal_id).id)
    return queued
