"""The code host (GitHub, GitLab): pull or merge requests, reviews or approvals, checks, teams, merges."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from gateway.domain.github import Check, PullInfo
from gateway.domain.gitlab_rules import GitLabAccount
from gateway.domain.repo_settings import ForgeSettings, GitHubSettings, GitLabSettings


class Forge(Protocol):
    """The code host of the declaration repo (GitHub or GitLab): pull (merge) requests, notes, checks, team (group)
    membership, merges. What only one host has is in `ReviewForge` (GitHub) and `ApprovalForge` (GitLab)."""

    settings: ForgeSettings

    def close(self) -> None: ...

    def fetch_main(self, main: str) -> None:
        """Make the gateway's main exactly the forge's (with a forge, its main is the truth)."""
        ...

    def clone_main(self, into: Path) -> None:
        """A clone of the forge's default branch as it is now, in the new folder `into` (a repository to add)."""
        ...

    def sync_branch(self, branch: str) -> str:
        """Bring a pull request's branch and the gateway's copy together; returns the head both now have."""
        ...

    def push(self, branch: str, sha: str) -> None:
        """Publish a branch the gateway made (never forced: a branch someone else moved is not overwritten)."""
        ...

    def open_pull(self, branch: str, base: str, title: str, body: str) -> PullInfo:
        """The open pull request of `branch`, opened now if there is none."""
        ...

    def pull(self, number: int) -> PullInfo: ...

    def upsert_comment(self, number: int, comment_id: int | None, body: str) -> int:
        """Edit the sticky comment in place (not when it already reads so); post it when there is none yet."""
        ...

    def comment(self, number: int, comment_id: int) -> tuple[str, int]:
        """A comment as the forge has it now: body and author id (an edited or deleted one is not a command)."""
        ...

    def reply(self, number: int, body: str) -> None:
        """A one-off comment, for a pull request that has no proposal (a fork, an unlinked author)."""
        ...

    def request_teams(self, number: int, teams: list[str]) -> None: ...

    def set_checks(self, sha: str, checks: list[Check], details_url: str) -> None:
        """The four checks on the commit (check runs or commit statuses)."""
        ...

    def merge(self, number: int, sha: str, title: str, message: str) -> str:
        """Merge exactly `sha`: the forge refuses if the head moved since (a push that slipped in is never merged)."""
        ...

    def user_id(self, login: str) -> tuple[int, str]:
        """The numeric id and exact login (username) of a user."""
        ...

    def is_team_member(self, team: str, login: str, account_id: int | None) -> bool:
        """An active member of the team (group) now (a pending invitation does not count); GitHub asks by login,
        GitLab by the numeric id."""
        ...


class ReviewForge(Forge, Protocol):
    """GitHub: decisions are reviews, each of one commit."""

    settings: GitHubSettings  # type: ignore[misc]

    def review(self, number: int, review_id: int) -> tuple[str, str | None, int]:
        """A review as GitHub has it now: state (upper-case), commit, author id. Deliveries can be late or replayed."""
        ...


class ApprovalForge(Forge, Protocol):
    """GitLab: decisions are approvals of the merge request as it is, and bots are what the users API says."""

    settings: GitLabSettings  # type: ignore[misc]

    def approver_ids(self, number: int) -> frozenset[int]:
        """The numeric ids of the users whose approval the merge request has now (GitLab's approvals API)."""
        ...

    def account(self, user_id: int) -> GitLabAccount:
        """A GitLab user as its users API has them now (username, bot)."""
        ...
