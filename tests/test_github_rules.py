"""GitHub's rules for a decision to count, as tables over facts: no git, no database, no GitHub."""

from __future__ import annotations

import pytest

from gateway.domain.github_rules import (
    GitHubAccount,
    Push,
    ReviewState,
    bot_refusals,
    comment_replay_refusals,
    pusher_refusals,
    review_commit_refusals,
    review_replay_refusals,
)

HEAD, OLDER = "b" * 40, "a" * 40
CAROL = GitHubAccount(3, "carol", "User")


def holds_or_says(reasons: list[str], refusal: str | None) -> bool:
    """The rule holds (no reason) when no refusal is expected, else its one reason says the expected words."""
    return reasons == [] if refusal is None else (len(reasons) == 1 and refusal in reasons[0])


@pytest.mark.parametrize(
    ("account", "refusal"),
    [
        (GitHubAccount(3, "carol", "User"), None),
        (GitHubAccount(9, "gateway-bot", "Bot"), "gateway-bot is a bot account; bots never approve"),
        (GitHubAccount(10, "renovate[bot]", "User"), "renovate[bot] is a bot account"),  # an App, whatever the type
        (GitHubAccount(11, "bot-lover", "User"), None),  # a person whose login merely mentions bots
        (GitHubAccount(12, "acme", "Organization"), None),
    ],
)
def test_bots_never_count(account: GitHubAccount, refusal: str | None) -> None:
    assert holds_or_says(bot_refusals(account), refusal)


@pytest.mark.parametrize(
    ("pushes", "refusal"),
    [
        ((), None),
        ((Push(4, "dana", HEAD),), None),
        ((Push(3, "carol", HEAD),), f"carol pushed commit {HEAD[:12]} to this pull request and cannot approve"),
        ((Push(3, "carol", OLDER), Push(4, "dana", HEAD), Push(3, "carol", HEAD)), f"pushed commit {HEAD[:12]}"),
        ((Push(3, "carol-old-login", OLDER),), f"carol pushed commit {OLDER[:12]}"),  # accounts by id: renames count
        ((Push(3, "carol", None),), "carol pushed commit (unknown)"),
    ],
)
def test_whoever_pushed_to_the_pull_request_decides_nothing_on_it(pushes: tuple[Push, ...],
                                                                   refusal: str | None) -> None:
    assert holds_or_says(pusher_refusals(CAROL, pushes), refusal)


@pytest.mark.parametrize(
    ("commit_reviewed", "refusal"),
    [
        (HEAD, None),
        (OLDER, f"the review is of commit {OLDER[:12]}, but the current plans are of {HEAD[:12]}"),
        (None, "the review names no commit"),  # GitHub garbage-collected the commit after a force-push
    ],
)
def test_only_a_review_of_the_head_commit_counts(commit_reviewed: str | None, refusal: str | None) -> None:
    assert holds_or_says(review_commit_refusals(commit_reviewed, HEAD), refusal)


@pytest.mark.parametrize(
    ("now", "refused"),
    [
        (ReviewState("approved", HEAD, 3), False),
        (ReviewState("dismissed", HEAD, 3), True),  # dismissed after it was delivered
        (ReviewState("approved", OLDER, 3), True),
        (ReviewState("approved", HEAD, 4), True),  # a replayed delivery naming someone else's review
    ],
)
def test_only_the_review_as_github_has_it_now_counts(now: ReviewState, refused: bool) -> None:
    reasons = review_replay_refusals(77, ReviewState("approved", HEAD, 3), now)
    assert bool(reasons) == refused
    if refused:
        assert reasons == [f"GitHub shows review 77 as {now.state} on commit {str(now.commit_id)[:12]} now; "
                           "only the review as it stands counts"]


@pytest.mark.parametrize(
    ("now", "refused"),
    [
        (("/gateway apply", 3), False),
        (("/gateway apply please, once the cost is known", 3), True),  # edited since it was delivered
        (("/gateway apply", 4), True),
    ],
)
def test_a_command_is_the_comment_as_github_has_it_now(now: tuple[str, int], refused: bool) -> None:
    reasons = comment_replay_refusals(5, ("/gateway apply", 3), now)
    assert reasons == ([] if not refused else
                       ["comment 5 reads differently on GitHub now; an edited comment is not a command"])
