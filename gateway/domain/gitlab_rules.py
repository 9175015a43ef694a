"""What makes a decision made on GitLab count, over facts the service gathers: who approved, the merge request's
head when they did, who pushed to its branch. Each rule returns the reasons a person can read (empty: it holds).

They sit beside `approvals.decision_refusals`, which every way in passes through as well, as the GitHub rules do
(`github_rules.py`). Where GitLab differs from GitHub:
- an approval is GitLab's approve action, with no commit of its own: it is of the head the merge request had
  when the approval was given (the delivery's `last_commit`), read back from the approvals API, which must still
  name the approver (an approval withdrawn since, or a replayed delivery, counts for nothing);
- people are GitLab users by numeric id, and a bot is what GitLab's users API says (`bot`: project, group and
  service account tokens act as bot users), never a name in a payload.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

from gateway.domain.github_rules import ForgeAccount

# GitLab's bot users when the API cannot say (an old instance): project and group access tokens' bots, GitLab's own
BOT_USERNAME = re.compile(r"^(project|group)_\d+_bot(_[0-9a-f]+)?$|^(ghost|support-bot|alert-bot|visual-review-bot)$")


@dataclass(frozen=True)
class GitLabAccount:
    """A GitLab user as the gateway knows them: the numeric id (usernames change), username, and whether GitLab
    says it is a bot."""

    id: int
    username: str
    bot: bool = False

    @property
    def login(self) -> str:  # the name `Push` and the trail use for an account on any forge
        return self.username

    @property
    def is_bot(self) -> bool:
        return self.bot or bool(BOT_USERNAME.match(self.username))


def approval_head_refusals(approved_head: str | None, head_sha: str) -> list[str]:
    """Only an approval given while the merge request's head was the planned commit counts: the plans are of it."""
    if approved_head is None:
        return [f"the approval names no head commit, but the current plans are of {head_sha[:12]}: approve the "
                f"merge request again"]
    if approved_head != head_sha:
        return [f"the approval was given on commit {approved_head[:12]}, but the current plans are of "
                f"{head_sha[:12]}: approve the merge request again"]
    return []


def approval_replay_refusals(account: ForgeAccount, number: int, approvers_now: Collection[int]) -> list[str]:
    """A delivery can be late or replayed: the approval counts only while GitLab's approvals API still lists it."""
    if account.id in approvers_now:
        return []
    return [f"GitLab shows no approval by {account.login} on !{number} now; only approvals as they stand count"]


def note_replay_refusals(note_id: int, delivered: tuple[str, int], now: tuple[str, int]) -> list[str]:
    """A command is the note as GitLab has it now, by its author: an edited note is not a command."""
    if delivered == now:
        return []
    return [f"note {note_id} reads differently on GitLab now; an edited note is not a command"]
