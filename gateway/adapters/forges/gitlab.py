"""GitLab through python-gitlab, and its git over plain `git push`/`git fetch`: the forge adapter for `forge: gitlab`.

One access token from the gateway's settings (a project or group access token's bot, or a service account, with
the api scope and at least the Developer role) does everything: merge requests, notes, commit statuses, reading
approvals and group membership, merging. Git authenticates with an HTTP header passed in the environment, so the
token lands in no command line, remote or log. GitLab.com and self-managed alike: `api_url` is the instance.

Where GitLab differs from GitHub here: commit statuses are state machines (posting the state a status already has
is refused, so only a change of state is written); an approval has no commit, so the approvals API is read back;
membership is asked by the numeric user id, including members inherited from parent groups.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import gitlab
import requests
from gitlab.exceptions import GitlabAuthenticationError, GitlabError, GitlabGetError, GitlabHttpError
from gitlab.v4.objects import Project, ProjectMergeRequest, ProjectMergeRequestNote

from gateway.adapters.forges.remote import GitRemote
from gateway.domain.errors import BackendError, Conflict, NotFound, Unavailable
from gateway.domain.github import MARKER, Check, CheckState, PullInfo
from gateway.domain.gitlab_rules import GitLabAccount
from gateway.domain.repo_settings import GitLabSettings

T = TypeVar("T")
STATUS_STATES = {CheckState.PENDING: "pending", CheckState.SUCCESS: "success", CheckState.FAILURE: "failed",
                 CheckState.NEUTRAL: "canceled"}
DESCRIPTION_LIMIT = 255  # GitLab keeps a commit status's description to this many characters
TITLE_LIMIT = 255
NO_WAIT: dict[str, Any] = {"obey_rate_limit": False}  # a 429 is the job queue's to wait out, never a worker's sleep
_MARKER = re.compile(re.escape(MARKER).replace(re.escape("{id}"), r"\d+"))


class GitLabForge(GitRemote):
    """One project on GitLab. Not thread-safe: one per thread (python-gitlab's session is not shared)."""

    host = "GitLab"

    def __init__(self, settings: GitLabSettings, token: str, local_repo: Path, timeout: float = 30.0):
        self.settings = settings
        self.local_repo = local_repo
        self._token = token
        self._timeout = timeout

    @cached_property
    def gl(self) -> gitlab.Gitlab:
        return gitlab.Gitlab(self.settings.api_url, private_token=self._token, timeout=self._timeout,
                             retry_transient_errors=False, keep_base_url=True)

    @cached_property
    def project(self) -> Project:
        return self.gl.projects.get(self.settings.repository, lazy=True)  # no request: every call names the path

    def close(self) -> None:
        if "gl" in self.__dict__:
            self.gl.session.close()

    # --- git ---------------------------------------------------------------------------------

    def clone_url(self) -> str:
        return self.settings.clone_url()

    def _git_auth_env(self) -> dict[str, str]:
        if not self.settings.clone_url().startswith(("https://", "http://")):
            return {}
        basic = base64.b64encode(f"oauth2:{self._token}".encode()).decode()  # GitLab takes any user with a token
        return {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "http.extraHeader",
                "GIT_CONFIG_VALUE_0": f"Authorization: Basic {basic}"}

    # --- merge requests ----------------------------------------------------------------------

    def open_pull(self, branch: str, base: str, title: str, body: str) -> PullInfo:
        """The open merge request of `branch`, opened now if there is none."""
        existing = _call(lambda: self.project.mergerequests.list(
            state="opened", source_branch=branch, target_branch=base, get_all=True, **NO_WAIT),
            f"merge requests of {branch}")
        mr = existing[0] if existing else _call(lambda: self.project.mergerequests.create(
            {"source_branch": branch, "target_branch": base, "title": title[:TITLE_LIMIT], "description": body,
             "remove_source_branch": False}, **NO_WAIT), "open a merge request")
        return _info(mr)

    def pull(self, number: int) -> PullInfo:
        return _info(self._mr(number))

    def upsert_comment(self, number: int, comment_id: int | None, body: str) -> int:
        """Edit the sticky note in place (not when it already reads so); post it when there is none yet.

        With no id on record, a note of the gateway's own account carrying the same marker is taken up rather than
        a second one posted: a worker that died after posting, before recording the id, left it there.
        """
        mr = self._lazy_mr(number)
        note: ProjectMergeRequestNote | None = None
        if comment_id is not None:
            try:
                note = _call(lambda: mr.notes.get(comment_id, **NO_WAIT), "the gateway's note")
            except NotFound:  # deleted by someone: post it again
                note = None
        marker = _MARKER.search(body)
        if note is None and marker is not None:
            notes = _call(lambda: mr.notes.list(get_all=True, **NO_WAIT), "the merge request's notes")
            note = next((n for n in notes if marker.group(0) in (n.body or "") and n.author["id"] == self._my_id),
                        None)
        if note is None:
            return int(_call(lambda: mr.notes.create({"body": body}, **NO_WAIT), "note on the merge request").id)
        if note.body != body:
            note.body = body
            _call(lambda: note.save(**NO_WAIT), "edit the gateway's note")
        return int(note.id)

    @cached_property
    def _my_id(self) -> int:
        """The id of the account the token acts as."""
        return int(_call(lambda: self.gl.http_get("/user", **NO_WAIT), "the token's account")["id"])

    def comment(self, number: int, comment_id: int) -> tuple[str, int]:
        """A note as GitLab has it now: body and author id (an edited or deleted one is not a command)."""
        note = _call(lambda: self._lazy_mr(number).notes.get(comment_id, **NO_WAIT), f"note {comment_id} of !{number}")
        return str(note.body or ""), int(note.author["id"])

    def reply(self, number: int, body: str) -> None:
        """A one-off note, for a merge request that has no proposal (a fork, an unlinked author)."""
        mr = self._lazy_mr(number)
        _call(lambda: mr.notes.create({"body": body}, **NO_WAIT), "note on the merge request")

    def request_teams(self, number: int, teams: list[str]) -> None:
        """GitLab asks groups for review through approval rules (a paid tier): the note names the groups instead."""

    def set_checks(self, sha: str, checks: list[Check], details_url: str) -> None:
        """Commit statuses `gateway/plan`, `gateway/policy`, `gateway/approval`, `gateway/apply`.

        A GitLab status moves by state transitions and refuses to be set to the state it has, so only a status
        whose state changed is written (the note carries the details).
        """
        commit = self.project.commits.get(sha, lazy=True)
        current: dict[str, str] = {}
        for status in _call(lambda: commit.statuses.list(get_all=True, **NO_WAIT), "commit statuses"):
            current[str(status.name)] = str(status.status)  # without `all`, GitLab lists each name's latest only
        for c in checks:
            state = STATUS_STATES[c.state]
            if current.get(c.name) == state:
                continue
            _call(lambda c=c, state=state: self.project.commits.get(sha, lazy=True).statuses.create({
                "state": state, "name": c.name, "target_url": details_url,
                "description": f"{c.title}: {c.summary}"[:DESCRIPTION_LIMIT]}, **NO_WAIT), f"status {c.name}")

    def merge(self, number: int, sha: str, title: str, message: str) -> str:
        """Merge exactly `sha` (GitLab's `sha` check: it refuses with 409 if the head moved since).

        A merge request GitLab already merged at exactly `sha` (an earlier attempt whose answer was lost) counts.
        """
        mr = self._mr(number)
        if mr.state == "merged":
            if mr.sha == sha:
                return str(mr.merge_commit_sha or mr.squash_commit_sha or sha)
            raise Conflict(f"merge request !{number} was merged on GitLab at {str(mr.sha)[:12]}, not at {sha[:12]}")
        try:
            mr.merge(merge_commit_message=message, should_remove_source_branch=False, sha=sha, **NO_WAIT)
        except GitlabError as exc:
            code, why = exc.response_code, _message(exc)
            if code is not None and code >= 500:
                raise Unavailable(f"GitLab is unavailable (merge !{number}): {code} {why}") from None
            if code == 409:
                raise Conflict(f"GitLab refused the merge: the merge request's head moved from {sha[:12]} ({why})") \
                    from None
            raise Conflict(f"GitLab refused the merge ({code}: {why})") from None
        except (requests.RequestException, OSError) as exc:
            raise Unavailable(f"GitLab is unavailable (merge !{number}): {exc}") from exc
        if mr.state != "merged":
            raise Conflict(f"GitLab did not merge the merge request: it is {mr.state}")
        return str(mr.merge_commit_sha or mr.squash_commit_sha or sha)  # fast-forward merges make no merge commit

    # --- people ------------------------------------------------------------------------------

    def user_id(self, login: str) -> tuple[int, str]:
        """The numeric id and exact username of a GitLab user."""
        users = _call(lambda: self.gl.users.list(username=login, get_all=True, **NO_WAIT), f"GitLab user {login}")
        if not users:
            raise NotFound(f"GitLab has no user {login}")
        return int(users[0].id), str(users[0].username)

    def account(self, user_id: int) -> GitLabAccount:
        """A user as GitLab has them now: username, and whether GitLab says it is a bot."""
        user = _call(lambda: self.gl.users.get(user_id, **NO_WAIT), f"GitLab user {user_id}")
        return GitLabAccount(int(user.id), str(user.username), bool(getattr(user, "bot", False)))

    def is_team_member(self, team: str, login: str, account_id: int | None) -> bool:
        """An active member of the GitLab group now, directly or through a parent group (asked by the numeric id:
        usernames change); a member awaiting approval or a blocked user is not."""
        if account_id is None:
            return False
        group = self.gl.groups.get(team, lazy=True)
        try:  # one call: GitLab answers 404 for a group that does not exist and for a person not in it
            member = _call(lambda: group.members_all.get(account_id, **NO_WAIT), f"group {team} membership of {login}")
        except NotFound:
            return False
        return member.state == "active" and getattr(member, "membership_state", "active") == "active"

    def approver_ids(self, number: int) -> frozenset[int]:
        """The users whose approval the merge request has now (GitLab's approvals API, on every tier)."""
        approvals = _call(lambda: self._lazy_mr(number).approvals.get(**NO_WAIT), f"approvals of !{number}")
        try:
            return frozenset(int(entry["user"]["id"]) for entry in approvals.approved_by or ())
        except (KeyError, TypeError, ValueError) as exc:
            raise BackendError(f"GitLab: approvals of !{number}: an answer without {exc}") from None

    # -------------------------------------------------------------------------------------------

    def _mr(self, number: int) -> ProjectMergeRequest:
        return _call(lambda: self.project.mergerequests.get(number, **NO_WAIT), f"merge request !{number}")

    def _lazy_mr(self, number: int) -> ProjectMergeRequest:
        return self.project.mergerequests.get(number, lazy=True)


def _call(fn: Callable[[], T], what: str) -> T:
    """One GitLab call, its failures as the gateway's errors (a person reads them, in the trail or a job)."""
    try:
        return fn()
    except GitlabAuthenticationError as exc:
        raise BackendError(f"GitLab refused the gateway's token ({what}): {_message(exc)}") from exc
    except (GitlabHttpError, GitlabGetError, GitlabError) as exc:
        code = exc.response_code
        if code == 404:
            raise NotFound(f"GitLab has no {what}") from exc
        if code == 429 or (code is not None and code >= 500):
            raise Unavailable(f"GitLab is unavailable ({what}): {code} {_message(exc)}") from exc
        if code is None:  # no answer at all: python-gitlab wraps the connection's failure
            raise Unavailable(f"GitLab is unavailable ({what}): {_message(exc)}") from exc
        raise BackendError(f"GitLab: {what}: {code} {_message(exc)}") from exc
    except (requests.RequestException, OSError) as exc:  # connection refused or reset, DNS, TLS, a timeout
        raise Unavailable(f"GitLab is unavailable ({what}): {exc}") from exc


def _message(exc: GitlabError) -> str:
    return str(exc.error_message or exc).strip()[:500]


def _info(mr: ProjectMergeRequest) -> PullInfo:
    return PullInfo(int(mr.iid), str(mr.source_branch), str(mr.sha), str(mr.state), mr.state == "merged",
                    str(mr.web_url), mr.merge_commit_sha)
