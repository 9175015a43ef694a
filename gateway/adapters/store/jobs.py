"""Jobs: those a use case queues, and the queue workers claim from."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, case, func, insert, select, text, update
from sqlalchemy.exc import IntegrityError

from gateway.adapters.store.job_signal import CHANNEL, signal_for
from gateway.adapters.store.rows import (
    MAX_ID,
    Records,
    as_job,
    aware,
    now,
)
from gateway.adapters.store.schema import (
    Database,
    jobs,
)
from gateway.domain.errors import NotFound
from gateway.domain.jobs import FINISHED, Job, JobKind, JobStatus
from gateway.domain.operations import EndedJobs, QueueDepth
from gateway.domain.principals import Actor, Principal
from gateway.domain.repositories import DEFAULT_REPOSITORY

JOBS_OF_PROPOSAL = select(jobs).where(jobs.c.proposal_id == bindparam("proposal_id")).order_by(jobs.c.id)


class SqlJobs(Records):
    """Jobs queued and finished inside a use case's transaction."""

    moved = False  # a job was queued or finished here: idle workers are woken once this transaction commits

    def of_proposal(self, proposal_id: int) -> list[Job]:
        ahead = self.ahead.rows("job", proposal_id) if self.ahead else None
        if ahead is not None:
            return [as_job(r) for r in ahead]
        return [as_job(r) for r in self.conn.execute(JOBS_OF_PROPOSAL, {"proposal_id": proposal_id}).mappings()]

    def _moved(self) -> None:
        if not self.moved and self.conn.dialect.name == "postgresql":  # delivered at the commit, to every process
            self.conn.execute(text(f"SELECT pg_notify('{CHANNEL}', '')"))
        self.moved = True

    def add(
        self,
        kind: JobKind,
        proposal_id: int | None,
        requested_by: Actor,
        args: Mapping[str, Any] | None = None,
    ) -> int:
        who = requested_by.id if isinstance(requested_by, Principal) else requested_by.name
        if self.repository != DEFAULT_REPOSITORY:  # the worker that claims it works in this repository
            args = {**(args or {}), "repository": self.repository}
        result = self.conn.execute(
            insert(jobs).values(
                kind=kind.value,
                proposal_id=proposal_id,
                requested_by=who,
                status=JobStatus.QUEUED.value,
                progress=[],
                created_at=now(),
                args=dict(args or {}),
            )
        )
        self._moved()
        return int(result.inserted_primary_key[0])

    def queued(self, kind: JobKind, proposal_id: int, running_too: bool = True) -> int | None:
        """A job of this kind for this proposal that has not finished (or not started) yet, so a second is not queued."""
        waiting = [JobStatus.QUEUED.value, JobStatus.RUNNING.value] if running_too else [JobStatus.QUEUED.value]
        return self.conn.scalar(
            select(jobs.c.id)
            .where(jobs.c.kind == kind.value, jobs.c.proposal_id == proposal_id, jobs.c.status.in_(waiting))
            .limit(1)
        )

    def proposals_with_unfinished(self, kind: JobKind) -> set[int]:
        return set(
            self.conn.scalars(
                select(jobs.c.proposal_id).where(
                    jobs.c.kind == kind.value, jobs.c.status.in_([JobStatus.QUEUED.value, JobStatus.RUNNING.value])
                )
            )
        )

    def latest_finished(self, kind: JobKind, proposal_ids: Collection[int]) -> dict[int, Job]:
        """Each proposal's latest finished job of this kind (proposals with none are left out)."""
        if not proposal_ids:
            return {}
        done = [s.value for s in FINISHED]
        latest = (
            select(func.max(jobs.c.id))
            .where(jobs.c.kind == kind.value, jobs.c.status.in_(done), jobs.c.proposal_id.in_(list(proposal_ids)))
            .group_by(jobs.c.proposal_id)
        )
        rows = self.conn.execute(select(jobs).where(jobs.c.id.in_(latest))).mappings()
        return {int(r["proposal_id"]): as_job(r) for r in rows}

    def finish(
        self,
        job_id: int,
        status: JobStatus,
        result: Mapping[str, Any] | None = None,
        error: str | None = None,
        only_if_running: bool = True,
    ) -> bool:
        query = update(jobs).where(jobs.c.id == job_id)
        if only_if_running:
            query = query.where(jobs.c.status == JobStatus.RUNNING.value)
        done = self.conn.execute(
            query.values(
                status=status.value,
                result=dict(result or {}),
                error=self.scrubber.scrub(error) if error else None,
                finished_at=now(),
            )
        )
        if done.rowcount == 1:
            self._moved()  # the proposal's next job may run now
        return done.rowcount == 1

    def retry(self, job_id: int, run_after: datetime, error: str) -> bool:
        """Put a running job back in the queue, not to be claimed before `run_after`; `error` says why it waits."""
        done = self.conn.execute(
            update(jobs)
            .where(jobs.c.id == job_id, jobs.c.status == JobStatus.RUNNING.value)
            .values(
                status=JobStatus.QUEUED.value,
                runner=None,
                heartbeat_at=None,
                run_after=run_after,
                error=self.scrubber.scrub(error),
            )
        )
        return done.rowcount == 1

    def recently_failed(self, kind: JobKind, seconds: float) -> set[int]:
        """Proposals with a job of this kind that failed in the last `seconds` (their retry waits)."""
        since = now() - timedelta(seconds=seconds)
        return set(
            self.conn.scalars(
                select(jobs.c.proposal_id).where(
                    jobs.c.kind == kind.value, jobs.c.status == JobStatus.FAILED.value, jobs.c.finished_at > since
                )
            )
        )


class SqlJobQueue:
    """Jobs claimed, heart-beaten and followed in transactions of their own."""

    def __init__(self, db: Database):
        self.db = db
        self.signal = signal_for(db.engine.url.render_as_string(hide_password=False))
        self._listen = None
        if db.engine.dialect.name == "postgresql" and db.engine.dialect.driver == "psycopg":
            self._listen = db.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)

    def moves(self) -> int:
        """A count that moves whenever a job may have become claimable; read it before `claim`, pass it to `wait`."""
        return self.signal.count()

    def wait(self, seen: int, timeout: float) -> bool:
        """Until a job is queued or finished after `moves()` was `seen`, or `timeout`: in this process at once, in
        another within PostgreSQL's NOTIFY; polling after `timeout` covers the rest. Whether it moved."""
        if self._listen is not None:
            self.signal.listen(self._listen)
        return self.signal.wait(seen, timeout)

    def wake(self) -> None:
        """Wake this process's waiters (a worker stopping)."""
        self.signal.notify()

    def close(self) -> None:
        if self._listen is not None:
            self.signal.stop_listening(self._listen)

    def claim(self, runner: str, job_id: int | None = None) -> Job | None:
        """Take the oldest queued job (or `job_id`) whose proposal has no job running; None if there is none.
        Publish jobs come after every other kind.

        A job waiting for a retry is not taken before its `run_after`, and a proposal's later deliveries wait
        behind it (a proposal's deliveries run in the order GitHub sent them). PostgreSQL skips rows other
        workers are claiming (FOR UPDATE SKIP LOCKED); SQLite's BEGIN IMMEDIATE lets one claimer in at a time.
        """
        moment = now()
        running = select(jobs.c.proposal_id).where(
            jobs.c.status == JobStatus.RUNNING.value, jobs.c.proposal_id.is_not(None)
        )
        earlier = jobs.alias("earlier")
        delivery_waiting = (
            select(earlier.c.id)
            .where(
                earlier.c.kind == JobKind.WEBHOOK.value,
                earlier.c.status == JobStatus.QUEUED.value,
                earlier.c.proposal_id == jobs.c.proposal_id,
                earlier.c.id < jobs.c.id,
            )
            .exists()
        )
        query = select(jobs).where(
            jobs.c.status == JobStatus.QUEUED.value,
            jobs.c.proposal_id.not_in(running) | jobs.c.proposal_id.is_(None),
            jobs.c.run_after.is_(None) | (jobs.c.run_after <= moment),
            (jobs.c.kind != JobKind.WEBHOOK.value) | jobs.c.proposal_id.is_(None) | ~delivery_waiting,
        )
        if job_id is not None:
            query = query.where(jobs.c.id == job_id)
        # a publish only mirrors what is recorded: the work people wait for (a review's approval, a plan) goes first
        query = query.order_by(case((jobs.c.kind == JobKind.PUBLISH.value, 1), else_=0), jobs.c.id).limit(1)
        with self.db.transaction() as conn:
            if not self.db.is_sqlite:
                query = query.with_for_update(skip_locked=True)
            row = conn.execute(query).mappings().first()
            if row is None:
                return None
            try:
                with conn.begin_nested():  # the unique index refuses a second running job for one proposal
                    row = conn.execute(
                        update(jobs)
                        .where(jobs.c.id == row["id"])
                        .values(
                            status=JobStatus.RUNNING.value,
                            runner=runner,
                            started_at=now(),
                            heartbeat_at=now(),
                            attempts=jobs.c.attempts + 1,
                        )
                        .returning(*jobs.c)
                    ).mappings().one()
            except IntegrityError:
                return None
        return as_job(row)

    def heartbeat(self, job_id: int, runner: str) -> bool:
        with self.db.transaction() as conn:
            beat = conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id, jobs.c.runner == runner, jobs.c.status == JobStatus.RUNNING.value)
                .values(heartbeat_at=now())
            )
        return beat.rowcount == 1

    def add_progress(self, job_id: int, line: str) -> None:
        with self.db.transaction() as conn:
            current = conn.scalar(select(jobs.c.progress).where(jobs.c.id == job_id)) or []
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(progress=[*current, line][-200:]))

    def stale(self, older_than_seconds: float) -> list[Job]:
        """Running jobs whose worker has not heart-beaten for `older_than_seconds`."""
        cutoff = now() - timedelta(seconds=older_than_seconds)
        with self.db.transaction(readonly=True) as conn:
            rows = conn.execute(
                select(jobs).where(jobs.c.status == JobStatus.RUNNING.value, jobs.c.heartbeat_at < cutoff)
            ).mappings()
            return [as_job(r) for r in rows]

    def of_proposal(self, proposal_id: int) -> list[Job]:
        with self.db.transaction(readonly=True) as conn:
            return [as_job(r) for r in conn.execute(JOBS_OF_PROPOSAL, {"proposal_id": proposal_id}).mappings()]

    def get(self, job_id: int) -> Job:
        with self.db.transaction(readonly=True) as conn:
            row = conn.execute(select(jobs).where(jobs.c.id == job_id)).mappings().first()
        if row is None or not 0 < job_id <= MAX_ID:
            raise NotFound(f"no job {job_id}")
        return as_job(row)

    def depth(self) -> list[QueueDepth]:
        """Queued and running jobs by repository and kind, with the age of the oldest of each: a queued job's since it
        was queued (or since its retry became due), a running one's since it started."""
        unfinished = (JobStatus.QUEUED.value, JobStatus.RUNNING.value)
        # an added repository's jobs name it in their args; the default repository's name none
        repository = func.coalesce(jobs.c.args["repository"].as_string(), DEFAULT_REPOSITORY)
        query = (
            select(jobs.c.kind, jobs.c.status, func.count(), func.min(jobs.c.created_at), func.min(jobs.c.started_at),
                   func.min(jobs.c.run_after), repository)
            .where(jobs.c.status.in_(unfinished))
            .group_by(jobs.c.kind, jobs.c.status, repository)
        )
        moment = now()
        with self.db.transaction(readonly=True) as conn:
            rows = conn.execute(query).all()
        found = []
        for kind, status, count, created, started, run_after, repository_name in rows:
            since = aware(started) if status == JobStatus.RUNNING.value and started else aware(created)
            if status == JobStatus.QUEUED.value and run_after is not None and count == 1:
                since = max(since, aware(run_after))  # one job waiting for its retry: it is due only from then
            found.append(QueueDepth(kind, status, int(count), max(0.0, (moment - since).total_seconds()),
                                    str(repository_name)))
        return found

    def ended(self) -> list[EndedJobs]:
        """Jobs that ended, counted by kind and outcome (one query over the status index): whoever ran them, a
        worker, an API process or a command, and whoever settled them (recovery)."""
        query = (select(jobs.c.kind, jobs.c.status, func.count())
                 .where(jobs.c.status.in_(sorted(status.value for status in FINISHED)))
                 .group_by(jobs.c.kind, jobs.c.status))
        with self.db.transaction(readonly=True) as conn:
            return [EndedJobs(kind, status, int(count)) for kind, status, count in conn.execute(query).all()]
