"""A signed delivery of the wrong shape, through the real app and worker: accepted, then refused in the trail
with the field it lacks, never an internal error."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway import worker as worker_module
from gateway.services.change.proposals import get_proposal

from .test_github import World, github_world, open_pull_on_github, proposal_of, wait_for


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    monkeypatch.setattr(worker_module, "HOUSEKEEPING_SECONDS", 0.2)
    with github_world(tmp_path) as w:
        yield w


def finished_job(world: World, job_id: int) -> Any:
    return wait_for(f"job {job_id}", lambda: (lambda j: j if j.finished else None)(world.ws.store.queue.get(job_id)))


def test_a_delivery_missing_a_field_is_a_recorded_refusal_naming_it(world: World) -> None:
    number = open_pull_on_github(world)
    pid = proposal_of(world, number)
    review = world.gh.review_event(world.gh.add_review(number, "carol", "APPROVED"))
    del review["review"]["user"]["id"]  # who reviewed, by the only name that cannot be renamed

    answer = world.deliver("pull_request_review", review)
    assert answer.status_code == 202  # acknowledged: GitHub would otherwise redeliver the same thing
    job = finished_job(world, answer.json()["job"])
    assert job.status.value == "refused"
    assert "field review.user.id is missing" in job.error and "internal error" not in job.error
    [refusal] = world.events(pid, kind="github.pull_request_review.refused")
    assert refusal.payload["delivery"] == answer.json()["delivery"]
    assert refusal.payload["reasons"] == ["field review.user.id is missing"]
    [ended] = [e for e in world.events(pid, kind="job.refused") if e.payload["job"] == job.id]
    assert "field review.user.id is missing" in ended.payload["error"]
    assert not get_proposal(world.ws, pid).current_approvals


def test_a_pull_request_delivery_with_a_mistyped_field_opens_nothing(world: World) -> None:
    world.gh.push_commit("feature/odd", {"stacks/app-staging/odd.tf": "# nothing\n"}, "odd", author_login="alice")
    number = world.gh.open_pull("feature/odd", "Odd", "", "alice")
    payload = world.gh.pull_request_event(number, "opened", sender="alice")
    payload["pull_request"]["head"]["sha"] = 12345  # a number where GitHub sends a commit's hex

    answer = world.deliver("pull_request", payload)
    assert answer.status_code == 202
    job = finished_job(world, answer.json()["job"])
    assert job.status.value == "refused"
    [refusal] = [e for e in world.events(kind="github.pull_request.refused")
                 if e.payload.get("delivery") == answer.json()["delivery"]]
    assert refusal.payload["reasons"] == ["field pull_request.head.sha is not valid (input should be a valid string)"]
    with world.ws.store.session(readonly=True) as session:
        assert session.github.proposal_for_pull_request(world.gh.full_name, number) is None
