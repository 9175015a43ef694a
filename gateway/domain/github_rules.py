"""What makes a decision made on GitHub count, over facts the service gathers: who reviewed, which commit,
who pushed to the pull request. Each rule returns the reasons a person can read (empty: the rule holds).

These sit beside `approvals.decision_refusals`, which every way in passes through as well: GitHub adds
what only GitHub can tell (an account's type, the commit a review was made on, the authenticated pusher
of each commit); it never replaces the gateway's own rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

BOT_TYPE = "Bot"
BOT_SUFFIX = "[bot]"  # GitHub Apps act as `name[bot]`, whatever `type` a payload gives them


@dataclass(frozen=True)
class GitHubAccount:
    """A GitHub account as a delivery names it: the numeric id (logins can be renamed), login and type."""

    id: int
    login: str
    type: str  # "User", "Bot", "Organization"

    @property
    def is_bot(self) -> bool:
        return self.type == BOT_TYPE or self.login.endswith(BOT_SUFFIX)


class ForgeAccount(Protocol):
    """An account on any forge: its numeric id, the name it goes by, and whether it is a bot."""

    @property
    def id(self) -> int: ...

    @property
    def login(self) -> str: ...

    @property
    def is_bot(self) -> bool: ...


@dataclass(frozen=True)
class Push:
    """Someone GitHub authenticated moved the pull request's branch to `head_sha` (a `synchronize`)."""

    account_id: int
    login: str
    head_sha: str | None


@dataclass(frozen=True)
class ReviewState:
    """A review as one source has it: the delivery, or GitHub's API now. `commit_id` is None when GitHub
    no longer has the reviewed commit (garbage-collected after a force-push)."""

    state: str  # lower-case: approved, changes_requested, commented, dismissed
    commit_id: str | None
    author_id: int


def bot_refusals(account: ForgeAccount) -> list[str]:
    """Bots never count: an App, a bot account or an access token's bot user can be driven by whatever drives it,
    agents included."""
    if account.is_bot:
        return [f"{account.login} is a bot account; bots never approve, reject or command changes"]
    return []


def pusher_refusals(account: ForgeAccount, pushes: Sequence[Push], on: str = "pull request") -> list[str]:
    """Whoever pushed to the pull request proposed part of it, so they decide nothing on it."""
    theirs = [p for p in pushes if p.account_id == account.id]
    if not theirs:
        return []
    return [f"{account.login} pushed commit {(theirs[-1].head_sha or '(unknown)')[:12]} to this {on} "
            f"and cannot approve or reject it"]


def review_commit_refusals(commit_reviewed: str | None, head_sha: str) -> list[str]:
    """Only a review of the head commit counts: the current plans are of that commit and no other."""
    if commit_reviewed is None:
        return [f"the review names no commit (GitHub no longer has the one reviewed), but the current plans are "
                f"of {head_sha[:12]}: review the latest commit"]
    if commit_reviewed != head_sha:
        return [f"the review is of commit {commit_reviewed[:12]}, but the current plans are of {head_sha[:12]}: "
                f"review the latest commit"]
    return []


def review_replay_refusals(review_id: int, delivered: ReviewState, now: ReviewState) -> list[str]:
    """A delivery can be late or replayed: only the review as GitHub has it now counts."""
    if delivered == now:
        return []
    return [f"GitHub shows review {review_id} as {now.state} on commit {str(now.commit_id)[:12]} now; "
            f"only the review as it stands counts"]


def comment_replay_refusals(comment_id: int, delivered: tuple[str, int], now: tuple[str, int]) -> list[str]:
    """A command is the comment as GitHub has it now, by its author: an edited comment is not a command."""
    if delivered == now:
        return []
    return [f"comment {comment_id} reads differently on GitHub now; an edited comment is not a command"]
