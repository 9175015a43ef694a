"""What one approving review on GitHub costs before its approval is recorded: the review read back once and each
approver team's membership asked once, no git fetch when the review is of the head the gateway planned; and the
approval still binds to that head and its plans, with the team check in the trail."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway import worker as worker_module
from gateway.adapters.forges import github as github_forge
from gateway.services.change.proposals import get_proposal

from .test_github import World, github_world, open_pull_on_github, proposal_of, wait_for


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    monkeypatch.setattr(worker_module, "HOUSEKEEPING_SECONDS", 0.2)
    with github_world(tmp_path) as w:
        yield w


def quiet(world: World) -> bool:
    return not any(d.count for d in world.ws.store.queue.depth())


def test_an_approving_review_costs_two_github_calls_and_no_fetch(world: World,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    number = open_pull_on_github(world)
    pid = proposal_of(world, number)
    wait_for("the pull request published and the queue empty", lambda: world.sticky(number) and quiet(world))
    monkeypatch.setattr(worker_module, "HOUSEKEEPING_SECONDS", 3600)  # no publish job runs meanwhile
    time.sleep(0.5)  # the housekeeping loop's current pause ends; the next is an hour
    wait_for("the queue empty", lambda: quiet(world))
    git_commands: Counter[str] = Counter()
    original = github_forge.GitHubForge._git

    def counted(forge: Any, *args: str) -> None:
        git_commands[args[0]] += 1
        original(forge, *args)

    monkeypatch.setattr(github_forge.GitHubForge, "_git", counted)
    head = world.gh.pull(number)["head"]["sha"]
    review = world.gh.add_review(number, "carol", "APPROVED")
    before = len(world.gh.request_log)

    assert world.deliver("pull_request_review", world.gh.review_event(review)).status_code == 202
    proposal = wait_for("carol's approval", lambda: (lambda p: p if p.current_approvals else None)(
        get_proposal(world.ws, pid)))

    calls = [f"{r.method} {r.path}" for r in world.gh.request_log[before:]]
    assert calls == [f"GET /repos/{world.gh.full_name}/pulls/{number}/reviews/{review['id']}",
                     f"GET /orgs/{world.gh.owner}/teams/platform-team/memberships/carol"]
    assert not git_commands  # the review is of the head the gateway planned: nothing to fetch
    [approval] = proposal.current_approvals
    assert approval.principal.name == "carol" and approval.head_sha == head == proposal.head_sha
    assert dict(approval.digests) == dict(proposal.current_digests)
    [check] = world.events(pid, kind="github.team_check")
    assert check.payload["active"] == ["platform"] and check.payload["head_sha"] == head


def test_a_review_of_a_head_github_has_moved_past_fetches_and_is_refused(world: World) -> None:
    """The delivery says GitHub's head moved (its `synchronize` not handled yet): the gateway fetches, re-plans and
    refuses an approval of the old commit rather than binding it."""
    number = open_pull_on_github(world)
    pid = proposal_of(world, number)
    old = get_proposal(world.ws, pid).head_sha
    world.gh.push_commit("feature/refunds", {"stacks/app-staging/more.tf": "# more\n"}, "more", author_login="alice")
    review = world.gh.add_review(number, "carol", "APPROVED", commit_id=old)

    assert world.deliver("pull_request_review", world.gh.review_event(review)).status_code == 202
    refusal = wait_for("the refusal", lambda: world.events(pid, kind="approve.refused"))[0]
    assert f"the review is of commit {old[:12]}" in "; ".join(refusal.payload["reasons"])
    assert get_proposal(world.ws, pid).head_sha == world.gh.pull(number)["head"]["sha"] != old
    assert not get_proposal(world.ws, pid).current_approvals
