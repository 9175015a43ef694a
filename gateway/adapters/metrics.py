"""The Metrics port in Prometheus' terms (prometheus_client), and the figures read from the database at scrape time.

Counters and histograms count what this process did. Under `gateway serve --processes N` each API process writes
them to files in PROMETHEUS_MULTIPROC_DIR (prometheus_client's multiprocess mode), and a scrape of any one process
sums them all. Job ends by outcome, queue depth and age, open drift, breakers, checkpoint age, expired locks and live
workers are read from the database on every scrape (`DatabaseGauges`), so they are the same whichever process
answers, right when the process that queued a job is not the one that runs it, and complete when a job ran in a
process that serves no metrics (a command's own apply) or was settled by a worker's recovery as it started.

Imported only by the processes that serve metrics (the API, `gateway worker --metrics-port`): the CLI's one-shot
commands keep the port's no-op default and never load prometheus_client.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from gateway.domain.jobs import JobKind, JobStatus
from gateway.domain.lifecycle import ACTIVE
from gateway.domain.notifications import ChannelKind
from gateway.domain.operations import (
    LOCK_WAIT_OUTCOMES,
    NOTIFICATION_OUTCOMES,
    WEBHOOK_EVENTS,
    WEBHOOK_OUTCOMES,
    ServiceGauges,
)
from gateway.logs import get_logger

log = get_logger(__name__)

DURATION_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 15, 30, 60, 120, 300, 600, 1800, 3600)
LAG_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900)
LOCK_BUCKETS = (0.01, 0.1, 0.5, 1, 5, 15, 30, 60, 300)
ENDED_OUTCOMES = tuple(s.value for s in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.REFUSED,
                                         JobStatus.INTERRUPTED))
_LABEL = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


def bounded(value: str) -> str:
    """A label value from a caller-named set (a channel, an outcome): kept if it is a short word, else `other`."""
    value = value.strip().lower()
    return value if _LABEL.match(value) else "other"


class PrometheusMetrics:
    """The Metrics port: counters and histograms of this process, plus `DatabaseGauges` when it is exposed."""

    def __init__(self, read_gauges: Callable[[], ServiceGauges] | None = None):
        self.registry = CollectorRegistry(auto_describe=False)
        self.read_gauges = read_gauges
        r = self.registry
        self.job_duration = Histogram("gateway_job_duration_seconds", "How long jobs ran, by kind", ["kind"],
                                      buckets=DURATION_BUCKETS, registry=r)
        self.job_retries = Counter("gateway_job_retries", "Jobs put back in the queue to run again, by kind",
                                   ["kind"], registry=r)
        self.lock_wait = Histogram("gateway_lock_wait_seconds", "How long applies waited for a stack lock",
                                   ["outcome"], buckets=LOCK_BUCKETS, registry=r)
        self.lock_breaks = Counter("gateway_lock_breaks", "Stack locks of dead runners taken over by recovery",
                                   registry=r)
        self.webhooks = Counter("gateway_webhook_deliveries", "GitHub webhook deliveries, by event and outcome",
                                ["event", "outcome"], registry=r)
        self.webhook_lag = Histogram("gateway_webhook_lag_seconds",
                                     "From a delivery's arrival to its outcome recorded (a decision, a re-plan)",
                                     ["event"], buckets=LAG_BUCKETS, registry=r)
        self.publish_failures = Counter("gateway_publish_failures", "Pull request updates that failed", registry=r)
        self.publish_retries = Counter("gateway_publish_retries", "Pull request updates tried again after a failure",
                                       registry=r)
        self.notifications = Counter("gateway_notifications", "Notifications sent, by channel and outcome",
                                     ["channel", "outcome"], registry=r)
        self.audit_appends = Counter("gateway_audit_appends", "Events committed to the audit trail", registry=r)
        self._start_known_series()

    def _start_known_series(self) -> None:
        """Every series whose labels come from a known set, at 0 from the start: a first failure is then an increase
        from 0 that `increase()` and an alert see, not a series born at 1 that they cannot tell from one always there.
        (Series without labels start at 0 by themselves.)"""
        events = (*sorted(WEBHOOK_EVENTS), "other")
        for kind in JobKind:
            self.job_duration.labels(kind.value)
            self.job_retries.labels(kind.value)
        for outcome in LOCK_WAIT_OUTCOMES:
            self.lock_wait.labels(outcome)
        for event in events:
            self.webhook_lag.labels(event)
            for outcome in WEBHOOK_OUTCOMES:
                self.webhooks.labels(event, outcome)
        for channel in ChannelKind:
            for outcome in NOTIFICATION_OUTCOMES:
                self.notifications.labels(channel.value, outcome)

    # --- the port --------------------------------------------------------------------------------

    def job_ran(self, kind: str, seconds: float) -> None:
        self.job_duration.labels(bounded(kind)).observe(max(0.0, seconds))

    def job_retried(self, kind: str) -> None:
        self.job_retries.labels(bounded(kind)).inc()

    def lock_waited(self, seconds: float, taken: bool) -> None:
        self.lock_wait.labels("taken" if taken else "gave_up").observe(max(0.0, seconds))

    def lock_broken(self, count: int) -> None:
        self.lock_breaks.inc(count)

    def webhook_received(self, event: str, outcome: str) -> None:
        self.webhooks.labels(bounded(event), bounded(outcome)).inc()

    def webhook_handled(self, event: str, lag_seconds: float) -> None:
        self.webhook_lag.labels(bounded(event)).observe(max(0.0, lag_seconds))

    def publish_finished(self, failed: bool, retry: bool) -> None:
        if failed:
            self.publish_failures.inc()
        if retry:
            self.publish_retries.inc()

    def notification_delivered(self, channel: str, outcome: str) -> None:
        self.notifications.labels(bounded(channel), bounded(outcome)).inc()

    def audit_appended(self, count: int) -> None:
        self.audit_appends.inc(count)

    # --- exposing them ---------------------------------------------------------------------------

    def exposition_registry(self) -> CollectorRegistry:
        """What a scrape reads: every process's counters in multiprocess mode (else this process's), and the
        database's figures."""
        registry = CollectorRegistry(auto_describe=False)
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            MultiProcessCollector(registry)
        else:
            registry.register(_Collected(self.registry))
        if self.read_gauges is not None:
            registry.register(DatabaseGauges(self.read_gauges))
        return registry

    def exposition(self) -> tuple[bytes, str]:
        """The text format of a scrape, and its content type."""
        return generate_latest(self.exposition_registry()), CONTENT_TYPE_LATEST

    def serve(self, port: int, host: str = "0.0.0.0") -> Any:
        """Serve the scrape on its own port in a thread (workers have no HTTP API); the server, to shut down."""
        from prometheus_client import start_http_server

        server, _ = start_http_server(port, host, registry=self.exposition_registry())
        return server


class _Collected(Collector):
    """A registry's metrics, collected as one collector of another registry."""

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        return iter(self.registry.collect())


class DatabaseGauges(Collector):
    """The figures that must be the same from any process, read from the database at each scrape."""

    def __init__(self, read: Callable[[], ServiceGauges]):
        self.read = read

    def describe(self) -> list[Metric]:
        return []  # registering must not read the database

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("gateway_database_up", "Whether the scrape could read the database (1) or not (0)")
        try:
            gauges = self.read()
        except Exception as exc:  # a scrape reports the database down; it never fails as a whole
            log.warning("metrics.read_failed", error=f"{type(exc).__name__}: {exc}")
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from _queue_families(gauges)
        yield _proposal_family(gauges)
        yield _ended_family(gauges)
        drift = GaugeMetricFamily("gateway_drift_records_open", "Open drift records, by stack", labels=["stack"])
        for stack, count in sorted(gauges.open_drift_by_stack.items()):
            drift.add_metric([stack], count)
        yield drift
        breakers = GaugeMetricFamily("gateway_breakers_open", "Open circuit breakers: the one for all agents, and "
                                     "how many single agents' are open", labels=["scope"])
        for scope, count in sorted(gauges.breakers_open.items()):
            breakers.add_metric([scope], count)
        yield breakers
        yield from _audit_families(gauges)
        yield GaugeMetricFamily("gateway_stack_locks_expired", "Stack locks whose holder stopped heart-beating and "
                                "that recovery has not settled yet", value=gauges.locks_expired)
        yield GaugeMetricFamily("gateway_terraform_timeout_seconds", "The longest one Terraform run may take "
                                "(GATEWAY_TERRAFORM_TIMEOUT_SECONDS): applies' run time is alerted on near it",
                                value=gauges.terraform_timeout_seconds)
        yield GaugeMetricFamily("gateway_workers_alive", "Workers running: registered, not stopped, and heart-beating "
                                "(last beat within 3 of their beat intervals)", value=gauges.workers_alive)


def _audit_families(gauges: ServiceGauges) -> Iterator[Metric]:
    """The trail's length and how far its signing lags. What is wrong is an event left unsigned for long: a quiet
    gateway whose newest checkpoint is old has nothing to sign, and `gateway_audit_unsigned_seconds` stays 0."""
    if gauges.audit_events:
        age = gauges.checkpoint_age_seconds
        yield GaugeMetricFamily("gateway_audit_checkpoint_age_seconds",
                                "Age of the newest signed checkpoint of the audit trail (+Inf: none signed yet)",
                                value=math.inf if age is None else age)
    yield GaugeMetricFamily("gateway_audit_unsigned_seconds", "How long the oldest event of the audit trail that no "
                            "signed checkpoint covers has waited (0: every event is signed)",
                            value=gauges.unsigned_seconds)
    yield GaugeMetricFamily("gateway_audit_checkpoint_interval_seconds", "How often workers sign a checkpoint "
                            "(GATEWAY_AUDIT_CHECKPOINT_MINUTES, in seconds)", value=gauges.checkpoint_interval_seconds)
    yield GaugeMetricFamily("gateway_audit_events", "Events in the audit trail (the chain's length)",
                            value=gauges.audit_events)


def _ended_family(gauges: ServiceGauges) -> Metric:
    """Job ends by kind and outcome, counted from the jobs table: every end is recorded there, by whichever process
    ran the job (a worker, an API process, a command's own) or settled it (a worker's recovery), and is never
    undone, so the count is a counter; every kind and outcome is there from the start, at 0."""
    ended = CounterMetricFamily("gateway_jobs_finished", "Jobs that ended, by kind and outcome (succeeded, failed, "
                                "refused, interrupted), counted in the database", labels=["kind", "outcome"])
    found = {(e.kind, e.outcome): e.count for e in gauges.ended}
    for kind in JobKind:
        for outcome in ENDED_OUTCOMES:
            ended.add_metric([kind.value, outcome], found.get((kind.value, outcome), 0))
    return ended


def _queue_families(gauges: ServiceGauges) -> Iterator[Metric]:
    """The queue: every repository's together (the series alerts read), and each repository's."""
    jobs = GaugeMetricFamily("gateway_jobs", "Unfinished jobs, by kind and status (queued, running)",
                             labels=["kind", "status"])
    oldest = GaugeMetricFamily("gateway_job_oldest_seconds", "Age of the oldest unfinished job, by kind and status: "
                               "waiting since queued, or running since started (0: none)", labels=["kind", "status"])
    each = GaugeMetricFamily("gateway_repository_jobs", "Unfinished jobs of each declaration repository, by kind and "
                             "status (queued, running)", labels=["repository", "kind", "status"])
    found: dict[tuple[str, str], tuple[int, float]] = {}
    theirs = {(d.repository, d.kind, d.status): d.count for d in gauges.queue}
    for d in gauges.queue:
        count, age = found.get((d.kind, d.status), (0, 0.0))
        found[(d.kind, d.status)] = (count + d.count, max(age, d.oldest_seconds))
    for kind in JobKind:
        for status in (JobStatus.QUEUED.value, JobStatus.RUNNING.value):
            count, age = found.get((kind.value, status), (0, 0.0))
            jobs.add_metric([kind.value, status], count)
            oldest.add_metric([kind.value, status], age)
            for repository in gauges.repositories:
                each.add_metric([repository, kind.value, status], theirs.get((repository, kind.value, status), 0))
    yield jobs
    yield oldest
    yield each


def _proposal_family(gauges: ServiceGauges) -> Metric:
    """Proposals waiting for something (decisions, an apply, a way out of a failure), by repository and status: the
    registered repositories only (never a name from a request), every one of their statuses there from the start."""
    waiting = GaugeMetricFamily("gateway_proposals", "Proposals not yet applied or abandoned, by declaration "
                                "repository and status (open, applying, failed, unmerged)",
                                labels=["repository", "status"])
    for repository in gauges.repositories:
        for status in sorted(s.value for s in ACTIVE):
            waiting.add_metric([repository, status], gauges.proposals.get((repository, status), 0))
    return waiting
