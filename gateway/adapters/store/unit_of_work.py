"""The unit of work in SQL: one transaction, one repository per aggregate.

`SqlStore.session()` is the unit of work: everything a use case writes, audit events included,
commits together or not at all. The events an aggregate raises (a proposal's transitions) are written here,
when its repository saves it: no repository writes to the trail, nor reaches a sibling. Stack locks, the job
queue and the worker registry commit on their own, since other processes must see them while an apply runs.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from sqlalchemy import Connection

from gateway.adapters.sealing import UNSEALED, Sealer
from gateway.adapters.store.audit import SqlAuditLog
from gateway.adapters.store.breaker import SqlBreakerRecords
from gateway.adapters.store.conversations import SqlConversations
from gateway.adapters.store.day_two import SqlDayTwoRecords
from gateway.adapters.store.github import SqlGitHubRecords
from gateway.adapters.store.jobs import SqlJobQueue, SqlJobs
from gateway.adapters.store.locks import SqlStackLocks
from gateway.adapters.store.main_branch import SqlMainRecords
from gateway.adapters.store.notifications import SqlNotifications
from gateway.adapters.store.plan_rounds import SqlPlanRounds
from gateway.adapters.store.principals import SqlPrincipals
from gateway.adapters.store.proposals import SqlProposals
from gateway.adapters.store.read_ahead import ReadAhead
from gateway.adapters.store.repositories import SqlRepositories
from gateway.adapters.store.schema import SCHEMA_VERSION, Database
from gateway.adapters.store.sign_in import SqlSignInRecords
from gateway.adapters.store.stacks import SqlStackRecords
from gateway.adapters.store.workers import SqlWorkerRegistry
from gateway.domain.proposal import Proposal
from gateway.domain.repositories import DEFAULT_REPOSITORY
from gateway.domain.scrubbing import Scrubber
from gateway.ports import NO_METRICS, Metrics


class SqlUnitOfWork:
    """One transaction's view of the records, a repository per aggregate."""

    def __init__(self, conn: Connection, scrubber: Scrubber | None = None, sealer: Sealer = UNSEALED,
                 readonly: bool = False, repository: str = DEFAULT_REPOSITORY):
        self.conn = conn
        # a read's snapshot cannot change while it is open: what it read ahead answers its later questions
        self.read_ahead = ReadAhead() if readonly else None
        self.scrubber = scrubber or Scrubber()
        self.sealer = sealer
        self.repository = repository
        self.repositories = SqlRepositories(self)
        self.principals = SqlPrincipals(self)
        self.proposals = SqlProposals(self, saved=self.write_new_events)
        self.conversations = SqlConversations(self)
        self.jobs = SqlJobs(self)
        self.github = SqlGitHubRecords(self)
        self.main = SqlMainRecords(self)
        self.day_two = SqlDayTwoRecords(self)
        self.breaker = SqlBreakerRecords(self)
        self.sign_in = SqlSignInRecords(self)
        self.notifications = SqlNotifications(self)
        self.stacks = SqlStackRecords(self)
        self.plan_rounds = SqlPlanRounds(self)
        self.audit = SqlAuditLog(self)

    def write_new_events(self, proposal: Proposal) -> None:
        """The events a saved proposal raised, into the trail in this transaction, in the order it raised them
        (cosmicpython's `collect_new_events`, written with the state rather than after it)."""
        moved = list(proposal.events)
        proposal.events.clear()
        self.audit.append_many([(m.actor, m.kind, m.payload, m.proposal_id, m.stacks) for m in moved])


class SqlStore:
    """Units of work over one database, and the stack locks, job queue and worker registry that commit on their own."""

    def __init__(self, db: Database, scrubber: Scrubber | None = None, sealer: Sealer = UNSEALED,
                 repository: str = DEFAULT_REPOSITORY):
        self.db = db
        self.repository = repository
        self.scrubber = scrubber or Scrubber()
        self.sealer = sealer  # saved plans hold secrets in clear: sealed at rest
        self.locks = SqlStackLocks(db)
        self.queue = SqlJobQueue(db)
        self.workers = SqlWorkerRegistry(db)
        self.dialect = db.engine.dialect.name
        self.schema_version = SCHEMA_VERSION
        self.metrics: Metrics = NO_METRICS  # the composition root sets the process's metrics

    def for_repository(self, name: str) -> SqlStore:
        """The same records, working in repository `name`: this store's connections, locks, queue and metrics."""
        if name == self.repository:
            return self
        twin = copy.copy(self)
        twin.repository = name
        return twin

    def pending_migrations(self) -> list[int]:
        return self.db.pending_migrations()

    def migrate(self) -> list[int]:
        return self.db.migrate()

    def close(self) -> None:
        self.queue.close()
        self.db.dispose()

    @contextmanager
    def session(self, readonly: bool = False) -> Iterator[SqlUnitOfWork]:
        """One transaction over the records; `readonly` for reads, which then never wait for a writer.

        A read opened inside another read of this store joins it: a view's dozen reads are one transaction and
        one snapshot, not a dozen. A write always has a transaction of its own.
        """
        outer = _READING.get()
        if readonly and outer is not None and outer[0] is self:
            yield outer[1]
            return
        with self.db.transaction(readonly) as conn:
            uow = SqlUnitOfWork(conn, self.scrubber, self.sealer, readonly, self.repository)
            joined = _READING.set((self, uow)) if readonly else None
            try:
                yield uow
            finally:
                if joined is not None:
                    _READING.reset(joined)
            uow.audit.write_chain_head()  # once, before the commit, after however many events
        if uow.audit.appended:  # committed: only now are they in the trail
            self.metrics.audit_appended(uow.audit.appended)
        if uow.jobs.moved:  # committed: a worker of this process claims the job now, not at its next poll
            self.queue.wake()


# the read unit of work open in this context (thread or task), which nested reads of the same store join
_READING: ContextVar[tuple[SqlStore, SqlUnitOfWork] | None] = ContextVar("gateway_reading", default=None)
