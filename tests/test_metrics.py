"""Metrics and readiness as an operator scrapes them: the real app, its /metrics parsed by Prometheus' own parser.

What is asserted is what an alert would be written on: a failed apply raises the failure count, a queue nobody
runs raises the age of its oldest job, several API processes report one set of counters, and nothing scraped
carries a secret or a label that grows with use. Readiness says which check failed, in JSON, with a 503.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, text

from gateway.api.app import create_app
from gateway.domain.jobs import JobKind
from gateway.services.workspace import Workspace

from .conftest import Clone, People, run_cli

# every label the gateway's metrics may carry: each from a closed set (no ids, names of people or addresses)
# `repository`: a registered repository's name only (tests/test_audit_repositories.py)
BOUNDED_LABELS = {"kind", "status", "outcome", "event", "stack", "scope", "channel", "le", "repository"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def scrape(text_format: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, by name and labels."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text_format) for s in family.samples}


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def wait_for_job(client: TestClient, job_id: int, token: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/api/v1/jobs/{job_id}", headers=bearer(token)).json()
        if job["finished"]:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not finish in {timeout} s")


@pytest.fixture
def proposal_id(workspace: Workspace, people: People, clone: Clone) -> int:
    clone.branch("bigger").edit("stacks/app-staging/main.tf", '"t3.small"', '"t3.medium"').push()
    from gateway.services.change.proposals import open_proposal

    return open_proposal(workspace, people.alice, "bigger", "more memory").id


def test_a_failed_apply_raises_the_failure_count(workspace: Workspace, people: People, proposal_id: int) -> None:
    with TestClient(create_app(workspace.settings, workers=1)) as client:
        before = scrape(client.get("/metrics").text)
        assert value(before, "gateway_jobs_finished_total", kind="apply", outcome="failed") == 0
        assert value(before, "gateway_database_up") == 1
        decided = client.post(f"/api/v1/proposals/{proposal_id}/approve", json={"comment": "ok"},
                              headers=bearer(people.tokens["bob"]))
        assert decided.status_code == 200, decided.text
        workspace.simulator.inject_fault("app-staging", "aws_instance.web[0]", "InsufficientInstanceCapacity")
        queued = client.post(f"/api/v1/proposals/{proposal_id}/apply", headers=bearer(people.tokens["alice"]))
        assert queued.status_code == 202
        assert wait_for_job(client, queued.json()["id"], people.tokens["alice"])["status"] == "failed"
        after = scrape(client.get("/metrics").text)
    assert value(after, "gateway_jobs_finished_total", kind="apply", outcome="failed") == 1
    assert value(after, "gateway_jobs_finished_total", kind="apply", outcome="succeeded") == 0
    assert value(after, "gateway_job_duration_seconds_count", kind="apply") == 1
    assert value(after, "gateway_lock_wait_seconds_count", outcome="taken") >= 1
    assert value(after, "gateway_jobs", kind="apply", status="queued") == 0  # read from the database
    assert value(after, "gateway_audit_appends_total") > value(before, "gateway_audit_appends_total")
    assert value(after, "gateway_audit_events") > value(before, "gateway_audit_events")


def test_an_apply_the_cli_ran_itself_and_a_job_recovery_settled_are_counted(
        workspace: Workspace, people: People, proposal_id: int, clone: Clone) -> None:
    from gateway.domain.proposal import Decision
    from gateway.services.change.jobs import enqueue_job, recover_abandoned_work
    from gateway.services.change.proposals import decide, open_proposal

    decide(workspace, people.bob, proposal_id, Decision.APPROVE, "ok")
    workspace.simulator.inject_fault("app-staging", "aws_instance.web[0]", "InsufficientInstanceCapacity")
    applied = run_cli(["apply", str(proposal_id)], workspace.settings.home, token=people.tokens["alice"])
    assert applied.returncode != 0 and "InsufficientInstanceCapacity" in applied.stdout + applied.stderr

    clone.branch("other").edit("stacks/app-prod/main.tf", '"t3.large"', '"t3.xlarge"').push()
    other = open_proposal(workspace, people.alice, "other", "bigger prod")
    plan = enqueue_job(workspace, people.alice, JobKind.PLAN, other.id)
    assert workspace.store.queue.claim("dead-host:1", job_id=plan.id) is not None  # a worker that then died
    with create_engine(workspace.settings.db_url).begin() as conn:
        conn.execute(text("UPDATE jobs SET heartbeat_at = '2000-01-01 00:00:00' WHERE id = :id"), {"id": plan.id})
    recover_abandoned_work(workspace)  # as a worker without a metrics port settles it, starting up

    with TestClient(create_app(workspace.settings, workers=0)) as client:
        samples = scrape(client.get("/metrics").text)
    assert value(samples, "gateway_jobs_finished_total", kind="apply", outcome="failed") == 1
    assert value(samples, "gateway_jobs_finished_total", kind="plan", outcome="interrupted") == 1
    assert ("gateway_jobs_finished_total", (("kind", "notify"), ("outcome", "refused"))) in samples  # 0, not absent


def test_every_series_of_a_known_label_set_is_there_at_zero_from_the_start(workspace: Workspace) -> None:
    with TestClient(create_app(workspace.settings, workers=0)) as client:
        samples = scrape(client.get("/metrics").text)
    expected = [("gateway_lock_wait_seconds_count", {"outcome": "gave_up"}),
                ("gateway_lock_wait_seconds_count", {"outcome": "taken"}),
                ("gateway_webhook_deliveries_total", {"event": "pull_request", "outcome": "refused"}),
                ("gateway_webhook_deliveries_total", {"event": "other", "outcome": "refused"}),
                ("gateway_webhook_lag_seconds_count", {"event": "pull_request_review"}),
                ("gateway_notifications_total", {"channel": "slack", "outcome": "failed"}),
                ("gateway_notifications_total", {"channel": "email", "outcome": "retried"}),
                ("gateway_job_retries_total", {"kind": "webhook"}),
                ("gateway_job_duration_seconds_count", {"kind": "apply"}),
                ("gateway_jobs_finished_total", {"kind": "apply", "outcome": "failed"}),
                ("gateway_jobs_finished_total", {"kind": "plan", "outcome": "interrupted"}),
                ("gateway_lock_breaks_total", {}), ("gateway_publish_failures_total", {})]
    missing = [(name, labels) for name, labels in expected if (name, tuple(sorted(labels.items()))) not in samples]
    assert not missing, f"not there before their first event: {missing}"
    assert all(samples[(name, tuple(sorted(labels.items())))] == 0 for name, labels in expected)


def test_a_stuck_queue_raises_the_age_of_its_oldest_job(workspace: Workspace, people: People,
                                                         proposal_id: int) -> None:
    with TestClient(create_app(workspace.settings, workers=0)) as client:  # no worker: nothing runs the queue
        queued = client.post(f"/api/v1/proposals/{proposal_id}/plan", headers=bearer(people.tokens["alice"]))
        assert queued.status_code == 202
        first = scrape(client.get("/metrics").text)
        time.sleep(1.5)
        second = scrape(client.get("/metrics").text)
    assert value(first, "gateway_jobs", kind="plan", status="queued") == 1
    assert value(second, "gateway_jobs", kind="plan", status="queued") == 1
    age = value(second, "gateway_job_oldest_seconds", kind="plan", status="queued")
    assert age >= value(first, "gateway_job_oldest_seconds", kind="plan", status="queued") + 1.4
    assert value(second, "gateway_job_oldest_seconds", kind="apply", status="queued") == 0


def test_open_drift_is_counted_by_stack(workspace: Workspace, people: People) -> None:
    from gateway.services.day_two.drift_records import check_drift

    workspace.simulator.edit_object("network", "aws_vpc.main", {"enable_dns_hostnames": False})
    check_drift(workspace, people.admin, "network")
    with TestClient(create_app(workspace.settings, workers=0)) as client:
        samples = scrape(client.get("/metrics").text)
    assert value(samples, "gateway_drift_records_open", stack="network") == 1
    assert value(samples, "gateway_breakers_open", scope="all_agents") == 0


def test_the_unsigned_age_pages_on_an_event_left_unsigned_never_on_a_quiet_trail(workspace: Workspace,
                                                                                   people: People) -> None:
    from gateway.services.admin.audit import sign_checkpoint

    with TestClient(create_app(workspace.settings, workers=0)) as client:
        time.sleep(1.1)
        unsigned = scrape(client.get("/metrics").text)  # the sample repo's events: nothing signed yet
        sign_checkpoint(workspace)
        time.sleep(1.1)
        quiet = scrape(client.get("/metrics").text)  # everything signed; the checkpoint ages, nothing is wrong
        with workspace.store.session() as session:
            session.audit.append(people.alice, "proposal.viewed", {"note": "a new event"})
        time.sleep(1.1)
        behind = scrape(client.get("/metrics").text)
    assert value(unsigned, "gateway_audit_unsigned_seconds") >= 1.0
    assert value(quiet, "gateway_audit_unsigned_seconds") == 0
    assert value(quiet, "gateway_audit_checkpoint_age_seconds") >= 1.0  # what the old alert paged on
    assert 1.0 <= value(behind, "gateway_audit_unsigned_seconds") < 5
    interval = workspace.settings.audit_checkpoint_minutes * 60
    assert value(behind, "gateway_audit_checkpoint_interval_seconds") == interval


def test_nothing_scraped_is_secret_or_unbounded(workspace: Workspace, people: People, proposal_id: int) -> None:
    with TestClient(create_app(workspace.settings, workers=1)) as client:
        client.post(f"/api/v1/proposals/{proposal_id}/approve", json={"comment": "ok"},
                    headers=bearer(people.tokens["bob"]))
        job = client.post(f"/api/v1/proposals/{proposal_id}/apply", headers=bearer(people.tokens["alice"])).json()
        assert wait_for_job(client, job["id"], people.tokens["alice"])["status"] == "succeeded"
        scraped = client.get("/metrics").text
    secrets = [v for path in workspace.settings.secrets_path.glob("*.json") for v in json.loads(path.read_text()).values()]
    assert secrets and not any(str(secret) in scraped for secret in secrets)
    assert not any(token in scraped for token in people.tokens.values())
    assert "bigger" not in scraped and "alice" not in scraped  # no branch, no person
    labels = {name for family in text_string_to_metric_families(scraped) for s in family.samples for name in s.labels}
    assert labels <= BOUNDED_LABELS, labels - BOUNDED_LABELS
    assert value(scrape(scraped), "gateway_jobs_finished_total", kind="apply", outcome="succeeded") == 1


def test_ready_names_what_failed(workspace: Workspace) -> None:
    with TestClient(create_app(workspace.settings, workers=0)) as client:
        ready = client.get("/api/v1/ready")
        assert ready.status_code == 200 and ready.json()["status"] == "ready", ready.text

        key = workspace.settings.data_key_path
        moved = key.with_name("data.key.away")
        key.rename(moved)
        missing = client.get("/api/v1/ready")
        assert missing.status_code == 503
        assert missing.json()["failed"] == ["keys"] and "data key" in missing.json()["reason"]
        assert client.get("/api/v1/health").status_code == 200  # alive all the same: nothing to restart for
        moved.rename(key)

        engine = create_engine(workspace.settings.db_url)
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM schema_version WHERE version = (SELECT max(version) FROM schema_version)"))
        behind = client.get("/api/v1/ready")
        engine.dispose()
    assert behind.status_code == 503 and behind.json()["failed"] == ["migrations"]
    assert "not run" in behind.json()["checks"]["migrations"]


def test_ready_is_503_when_the_database_is_gone(tmp_path: Path, postgres_url: str) -> None:
    home = tmp_path / "home"
    assert run_cli(["init"], home, database_url=postgres_url).returncode == 0
    from gateway.config import Settings

    with TestClient(create_app(Settings(home=home, database_url=postgres_url), workers=0)) as client:
        assert client.get("/api/v1/ready").status_code == 200
        admin = create_engine(postgres_url.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:  # the database goes away under the running service
            conn.execute(text(f'DROP DATABASE "{postgres_url.rsplit("/", 1)[1]}" WITH (FORCE)'))
        admin.dispose()
        gone = client.get("/api/v1/ready")
        scraped = scrape(client.get("/metrics").text)
    assert gone.status_code == 503 and gone.json()["failed"][0] == "database"
    assert "postgres:" not in gone.text and "@" not in gone.json()["reason"]  # no URL, no credentials
    assert value(scraped, "gateway_database_up") == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def served(tmp_path: Path, postgres_url: str) -> Iterator[tuple[str, Path, str]]:
    """`gateway serve --processes 2` (no job loops) over a fresh workspace on PostgreSQL."""
    home, port = tmp_path / "home", _free_port()
    assert run_cli(["init"], home, database_url=postgres_url).returncode == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "PROMETHEUS_"))}
    env.update({"GATEWAY_HOME": str(home), "GATEWAY_DATABASE_URL": postgres_url})
    server = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--port", str(port), "--workers", "0",
                               "--processes", "2"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{base}/api/v1/ready", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline and server.poll() is None, "the API did not become ready"
        time.sleep(0.3)
    try:
        yield base, home, postgres_url
    finally:
        server.terminate()
        server.wait(30)


def test_several_api_processes_report_one_set_of_counters(served: tuple[str, Path, str]) -> None:
    base, _, _ = served
    fresh = scrape(httpx.get(f"{base}/metrics", timeout=10).text)  # every process's series start at 0, summed
    assert ("gateway_webhook_deliveries_total", (("event", "pull_request"), ("outcome", "refused"))) in fresh
    assert value(fresh, "gateway_webhook_deliveries_total", event="pull_request", outcome="refused") == 0
    for attempt in range(6):  # each delivery a new connection, to whichever process takes it
        refused = httpx.post(f"{base}/api/v1/github/webhook", content=b"{}", timeout=10, headers={
            "X-GitHub-Event": "pull_request", "X-GitHub-Delivery": f"d-{attempt}"})
        assert refused.status_code in (401, 404)  # no forge configured here: refused, and counted
    seen = []
    for _ in range(12):  # the scrapes land on either process too
        samples = scrape(httpx.get(f"{base}/metrics", timeout=10).text)
        seen.append(value(samples, "gateway_webhook_deliveries_total", event="pull_request", outcome="refused"))
    assert set(seen) == {6.0}, f"the processes disagree: {seen}"


def test_notifications_are_counted_by_a_bounded_channel() -> None:
    from gateway.adapters.metrics import PrometheusMetrics

    metrics = PrometheusMetrics()
    metrics.notification_delivered("email", "delivered")
    metrics.notification_delivered("email", "delivered")
    metrics.notification_delivered("https://hooks.example.com/T000/B000/secret", "failed")  # never a label
    body, content_type = metrics.exposition()
    samples = scrape(body.decode())
    assert content_type.startswith("text/plain")
    assert value(samples, "gateway_notifications_total", channel="email", outcome="delivered") == 2
    assert value(samples, "gateway_notifications_total", channel="other", outcome="failed") == 1
    assert b"hooks.example.com" not in body
