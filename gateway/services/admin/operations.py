"""Running the gateway as a service: the figures read from the records when metrics are scraped, and readiness.

Queue depth and age, jobs ended by outcome, open drift, breakers, the newest checkpoint and the live workers are read
here, from the database, at each scrape, so every process (any number of API processes and workers) reports the same
truth, and what a command ran in its own process counts too. Counters of what one process did (lock waits,
deliveries) go through the `Metrics` port instead.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from gateway.domain.breaker import ALL_AGENTS
from gateway.domain.errors import GatewayError
from gateway.domain.operations import ReadinessCheck, ServiceGauges
from gateway.services.change.workers import live_workers
from gateway.services.workspace import Configured, Records, Workspace


def read_gauges(ws: Configured) -> ServiceGauges:
    """Every scrape-time figure, in one read-only transaction plus the queue's own query."""
    queue = tuple(ws.store.queue.depth())
    ended = tuple(ws.store.queue.ended())
    expired = len(ws.store.locks.expired())
    alive = len(live_workers(ws))
    with ws.store.session(readonly=True) as session:
        drift: dict[str, int] = {}
        for record in session.day_two.drift_records(only_open=True):
            drift[record.stack] = drift.get(record.stack, 0) + 1
        breakers = {"all_agents": 0, "agent": 0}
        for state in session.breaker.states():
            if state.open:
                breakers["all_agents" if state.scope == ALL_AGENTS else "agent"] += 1
        registered = session.repositories.list()
        proposals = session.proposals.unfinished_by_repository()
        checkpoints = session.audit.checkpoints()
        head = session.audit.chain_head()
        unsigned_at = session.audit.oldest_unsigned_at()
    # the label's values: the repositories served, and a removed one while it still has unfinished work (never a
    # name from elsewhere: a job's or proposal's repository is a registered one)
    busy = {d.repository for d in queue} | {repository for repository, _ in proposals}
    repositories = tuple(r.name for r in registered if r.active or r.name in busy)
    age = None if not checkpoints else _seconds_since(ws, checkpoints[-1].at)
    unsigned = 0.0 if unsigned_at is None else _seconds_since(ws, unsigned_at)
    return ServiceGauges(queue=queue, ended=ended, open_drift_by_stack=drift, breakers_open=breakers,
                         checkpoint_age_seconds=age, unsigned_seconds=unsigned,
                         checkpoint_interval_seconds=ws.settings.audit_checkpoint_minutes * 60,
                         terraform_timeout_seconds=ws.settings.terraform_timeout_seconds,
                         audit_events=head[0] if head else 0, locks_expired=expired, workers_alive=alive,
                         repositories=repositories,
                         proposals={k: n for k, n in proposals.items() if k[0] in repositories})


def _seconds_since(ws: Records, at: str) -> float:
    return max(0.0, (ws.clock.now() - datetime.fromisoformat(at)).total_seconds())


def check_readiness(ws: Workspace) -> list[ReadinessCheck]:
    """Whether this process can do its work: the database answers, its schema is this code's, the workspace's
    declaration repo reads, and the keys outside the database can be read. Each failure says what and why, never a
    secret (no URL, no key material)."""
    checks = [_database(ws)]
    checks.append(_migrations(ws) if checks[0].ok else ReadinessCheck("migrations", "not checked: no database"))
    checks.append(_declarations(ws))
    checks.append(_keys(ws))
    return checks


def _database(ws: Records) -> ReadinessCheck:
    try:
        with ws.store.session(readonly=True) as session:
            session.principals.count()
    except GatewayError as exc:
        return ReadinessCheck("database", f"{ws.store.dialect} does not answer: {exc}")
    return ReadinessCheck("database")


def _migrations(ws: Records) -> ReadinessCheck:
    try:
        pending = ws.store.pending_migrations()
    except GatewayError as exc:
        return ReadinessCheck("migrations", f"the schema version cannot be read: {exc}")
    if pending:
        return ReadinessCheck("migrations", f"the database is not at this version's schema: migration(s) "
                                            f"{', '.join(map(str, pending))} not run (`gateway migrate` runs them)")
    return ReadinessCheck("migrations")


def _declarations(ws: Workspace) -> ReadinessCheck:
    try:
        ws.repo.resolve(ws.main_branch())
    except (GatewayError, OSError) as exc:
        return ReadinessCheck("workspace", f"the declaration repo at {ws.settings.repo_path} cannot be read: {exc}")
    if not os.access(ws.settings.home, os.R_OK | os.W_OK | os.X_OK):
        return ReadinessCheck("workspace", f"the workspace {ws.settings.home} is not readable and writable")
    return ReadinessCheck("workspace")


def _keys(ws: Configured) -> ReadinessCheck:
    problems = [p for p in (_readable(ws.settings.data_key_path, "data key", must_exist=True),
                            _readable(ws.settings.signing_key_path, "audit signing key", must_exist=False)) if p]
    return ReadinessCheck("keys", "; ".join(problems) if problems else None)


def _readable(path: Path, what: str, must_exist: bool) -> str | None:
    """Why the key file cannot be used (None: it can); what is in it is never read into a message."""
    if not path.exists():
        if must_exist:
            return f"the {what} {path} is missing: sealed plans cannot be read without it"
        return None if os.access(path.parent, os.W_OK) else f"the {what} {path} is missing and cannot be made there"
    try:
        with path.open("rb") as f:
            if not f.read(1):
                return f"the {what} {path} is empty"
    except OSError as exc:
        return f"the {what} {path} cannot be read: {exc.strerror}"
    return None
