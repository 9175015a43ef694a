"""The audit trail and the metrics with several declaration repositories: each repository's events by the `repo`
filter (CLI, API, the audit page), an old trail still verifying once its events have a repository, and the metrics'
`repository` label (the registered repositories only)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text, update

from gateway.adapters.store.schema import _audit_by_repository, audit_events
from gateway.api.app import create_app
from gateway.domain.audit import AuditEvent
from gateway.domain.errors import NotFound
from gateway.domain.jobs import JobKind
from gateway.services.admin.audit import list_events, verify_trail
from gateway.services.admin.operations import read_gauges
from gateway.services.change.jobs import enqueue_job

from .conftest import run_cli, sign_in_client
from .test_repositories import Two, _propose, _two


def _of(events: list[AuditEvent]) -> list[int]:
    return [e.seq for e in events]


def _check_each_repository_s_events(two: Two) -> tuple[int, int]:
    mine = _propose(two, two.ws, "audit", "orders-audit")
    theirs = _propose(two, two.data, "audit", "data-audit")
    dana = two.people.dana
    everything = list_events(two.ws, dana)
    ours, data = list_events(two.ws, dana, repository="declarations"), list_events(two.ws, dana, repository="data")

    assert sorted(_of(ours) + _of(data)) == _of(everything)  # each event is one repository's
    assert {e.proposal_id for e in data if e.proposal_id} == {theirs}
    assert set(_of(list_events(two.ws, dana, proposal_id=theirs))) <= set(_of(data))  # its proposal's, every one
    assert all(s.startswith("data/") for e in data for s in e.stacks) and any(e.stacks for e in data)
    assert [e.payload["repository"] for e in data if e.kind == "repository.added"] == ["data"]
    assert {e.proposal_id for e in ours if e.proposal_id} == {mine}
    assert set(_of(list_events(two.ws, dana, proposal_id=mine))) <= set(_of(ours))
    assert not any("/" in s for e in ours for s in e.stacks) and any(e.stacks for e in ours)
    assert not any(e.kind == "repository.added" for e in ours)  # the one that added data is data's

    # with another filter (the sparser drives), and a page at a time
    proposal_events = list_events(two.ws, dana, action="proposal", repository="data")
    assert proposal_events and _of(proposal_events) == [e.seq for e in data if e.kind.startswith("proposal.")]
    first = list_events(two.ws, dana, repository="data", limit=2)
    rest = list_events(two.ws, dana, repository="data", after=first[-1].seq)
    assert _of(first + rest) == _of(data)
    with pytest.raises(NotFound, match="no repository nope"):
        list_events(two.ws, dana, repository="nope")
    assert verify_trail(two.ws, dana)[1] is None  # the repository is beside the hashed bytes: the chain is as ever
    return mine, theirs


def test_the_trail_lists_each_repository_s_events_on_sqlite_and_postgres(tmp_path: Path, database_url: str) -> None:
    two = _two(tmp_path / "home", tmp_path, database_url)
    try:
        _check_each_repository_s_events(two)
    finally:
        two.ws.close()


def test_the_repo_filter_in_the_api_the_page_and_the_cli(tmp_path: Path) -> None:
    two = _two(tmp_path / "home", tmp_path)
    try:
        mine, theirs = _check_each_repository_s_events(two)
        token = {"Authorization": f"Bearer {two.people.tokens['dana']}"}
        with TestClient(create_app(two.ws.settings, workers=0)) as client:
            for url in ("/api/v1/audit/events?repo=data", "/api/v1/repos/data/audit/events"):
                listed = client.get(url, headers=token).json()
                assert {e["proposal_id"] for e in listed if e["proposal_id"]} == {theirs}, url
            assert {e["proposal_id"] for e in client.get("/api/v1/audit/events", headers=token).json()
                    if e["proposal_id"]} == {mine, theirs}  # no repository named: the whole trail
            exported = client.get("/api/v1/audit/export?repo=declarations", headers=token).text
            assert f'"proposal_id": {mine}' in exported and f'"proposal_id": {theirs}' not in exported
            assert '"checkpoint"' not in exported  # checkpoints sign the whole trail, not one repository's part
            assert client.get("/api/v1/audit/events?repo=nope", headers=token).status_code == 404

            sign_in_client(client, two.people.tokens["dana"])
            page = client.get("/audit/events?repo=data")
            assert page.status_code == 200 and 'name="repo" value="data"' in page.text
            assert f'?proposal={theirs}"' in page.text and f'?proposal={mine}"' not in page.text
            assert "repo=data" in page.text.split('id="export-csv"')[1].split(">")[0]  # the export keeps the filter

        listed = run_cli(["audit", "list", "--repo", "data"], two.ws.settings.home, two.people.tokens["dana"])
        assert listed.returncode == 0, listed.stderr
        assert "repository.added" in listed.stdout and "data/network" in listed.stdout
        assert " network" not in listed.stdout.replace("data/network", "")
        exported = run_cli(["--repo", "data", "audit", "export"], two.ws.settings.home, two.people.tokens["dana"])
        assert exported.returncode == 0 and f'"proposal_id": {theirs}' in exported.stdout
        assert f'"proposal_id": {mine}' not in exported.stdout
    finally:
        two.ws.close()


def test_an_old_trail_gets_its_repositories_and_still_verifies(tmp_path: Path, database_url: str) -> None:
    """Migration 33 on a trail written before it (every event's repository reset to the default, as the column's
    default leaves it): each event is given its repository from what it says, and no hash changes."""
    two = _two(tmp_path / "home", tmp_path, database_url)
    try:
        mine, theirs = _check_each_repository_s_events(two)
        dana = two.people.dana
        data = _of(list_events(two.ws, dana, repository="data"))
        hashes = [e.hash for e in list_events(two.ws, dana)]
        with two.ws.store.db.transaction() as conn:
            conn.execute(update(audit_events).values(repository="declarations"))
            conn.execute(text("DROP INDEX audit_events_by_repository"))
            _audit_by_repository(conn)
        assert _of(list_events(two.ws, dana, repository="data")) == data
        assert [e.hash for e in list_events(two.ws, dana)] == hashes
        assert verify_trail(two.ws, dana)[1] is None
    finally:
        two.ws.close()


def test_the_metrics_show_each_repository_s_proposals_and_queue(tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from gateway.adapters.metrics import PrometheusMetrics

    two = _two(tmp_path / "home", tmp_path)
    try:
        mine = _propose(two, two.ws, "metrics", "orders-metrics")
        _propose(two, two.data, "metrics", "data-metrics")
        theirs = _propose(two, two.data, "metrics-2", "data-metrics-2")
        enqueue_job(two.data, two.people.alice, JobKind.PLAN, theirs)
        enqueue_job(two.ws, two.people.alice, JobKind.PLAN, mine)
        scrape = PrometheusMetrics(lambda: read_gauges(two.ws)).exposition()[0].decode()
        assert 'gateway_proposals{repository="declarations",status="open"} 1.0' in scrape
        assert 'gateway_proposals{repository="data",status="open"} 2.0' in scrape
        assert 'gateway_proposals{repository="data",status="failed"} 0.0' in scrape
        assert 'gateway_repository_jobs{kind="plan",repository="data",status="queued"} 1.0' in scrape
        assert 'gateway_repository_jobs{kind="plan",repository="declarations",status="queued"} 1.0' in scrape
        assert 'gateway_jobs{kind="plan",status="queued"} 2.0' in scrape  # every repository's, as before
        named = {s.labels["repository"] for family in text_string_to_metric_families(scrape) for s in family.samples
                 if "repository" in s.labels}
        assert named == {"declarations", "data"}  # the registered repositories, no other name
    finally:
        two.ws.close()
