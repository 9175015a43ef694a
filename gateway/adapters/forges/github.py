"""GitHub through PyGithub, and its git over plain `git push`/`git fetch`: the gateway's one forge adapter.

Credentials come from the gateway's settings: a GitHub App installation (preferred; only an App
writes check runs) or a token (then commit statuses stand in for checks). Git authenticates with an
HTTP header passed in the environment, so no token lands in a command line, a remote or a log.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

from github import Auth, Github, GithubException, GithubIntegration, RateLimitExceededException, UnknownObjectException
from github.IssueComment import IssueComment
from github.PullRequest import PullRequest
from github.Repository import Repository

from gateway.adapters.forges.remote import GitRemote
from gateway.domain.errors import BackendError, Conflict, NotConfigured, NotFound, Unavailable
from gateway.domain.github import MARKER, Check, CheckState, PullInfo
from gateway.domain.repo_settings import GitHubSettings

T = TypeVar("T")
STATUS_STATES = {CheckState.PENDING: "pending", CheckState.SUCCESS: "success", CheckState.FAILURE: "failure",
                 CheckState.NEUTRAL: "error"}


_MARKER = re.compile(re.escape(MARKER).replace(re.escape("{id}"), r"\d+"))

@dataclass(frozen=True)
class GitHubCredentials:
    token: str | None = None
    app_id: int | None = None
    private_key: str | None = None
    installation_id: int | None = None  # None: each repository's own installation, asked of GitHub
    write_interval_seconds: float = 1.0

    @property
    def is_app(self) -> bool:
        return bool(self.app_id and self.private_key)

    def auth(self, repository: GitHubSettings) -> Auth.Auth:
        """What the gateway's calls on `repository` authenticate with: the App's installation there, else the token."""
        if self.app_id and self.private_key:
            app = Auth.AppAuth(self.app_id, self.private_key)
            return app.get_installation_auth(self.installation_id or _installation_of(app, repository))
        if self.token:
            return Auth.Token(self.token)
        raise NotConfigured("GitHub has no credentials: set GATEWAY_GITHUB_APP_ID and GATEWAY_GITHUB_APP_PRIVATE_KEY "
                            "(or _FILE), or GATEWAY_GITHUB_TOKEN")


def _installation_of(app: Auth.AppAuth, repository: GitHubSettings) -> int:
    """The id of the App's installation that holds `repository` (one App may be installed in several organisations
    and serve every repository they give it)."""
    owner, name = repository.repository.split("/", 1)
    integration = GithubIntegration(auth=app, base_url=repository.api_url, retry=None)
    try:
        return _call(lambda: integration.get_repo_installation(owner, name).id,
                     f"installation of the App on {repository.repository}")
    except NotFound as exc:
        raise NotConfigured(f"the GitHub App {app.app_id} is not installed on {repository.repository}: install it "
                            f"there (or give its installation as GATEWAY_GITHUB_INSTALLATION_ID)") from exc
    finally:
        integration.close()


class GitHubForge(GitRemote):
    """One repository on GitHub. Not thread-safe: one per thread (PyGithub's sessions are not shared)."""

    host = "GitHub"

    def __init__(self, settings: GitHubSettings, credentials: GitHubCredentials, local_repo: Path):
        self.settings = settings
        self.credentials = credentials
        self.local_repo = local_repo

    @cached_property
    def _auth(self) -> Auth.Auth:
        return self.credentials.auth(self.settings)

    @cached_property
    def gh(self) -> Github:
        interval = self.credentials.write_interval_seconds or None
        return Github(auth=self._auth, base_url=self.settings.api_url, retry=None, seconds_between_requests=None,
                      seconds_between_writes=interval)

    @cached_property
    def repo(self) -> Repository:
        return _call(lambda: self.gh.get_repo(self.settings.repository), f"repository {self.settings.repository}")

    def close(self) -> None:
        if "gh" in self.__dict__:
            self.gh.close()

    # --- git ---------------------------------------------------------------------------------

    def clone_url(self) -> str:
        return self.settings.clone_url()

    def _git_auth_env(self) -> dict[str, str]:
        if not self.settings.clone_url().startswith("https://"):
            return {}
        self.gh  # an App's installation token is fetched through the client's requester  # noqa: B018
        token = getattr(self._auth, "token", None)
        if not token:
            return {}
        basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
        return {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "http.extraHeader",
                "GIT_CONFIG_VALUE_0": f"Authorization: Basic {basic}"}

    # --- pull requests -----------------------------------------------------------------------

    def open_pull(self, branch: str, base: str, title: str, body: str) -> PullInfo:
        """The open pull request of `branch`, opened now if there is none."""
        existing = _call(lambda: list(self.repo.get_pulls(state="open", head=f"{self.settings.owner}:{branch}",
                                                               base=base)), f"pull requests of {branch}")
        pr = existing[0] if existing else _call(
            lambda: self.repo.create_pull(base=base, head=branch, title=title[:250], body=body), "open a pull request")
        return _info(pr)

    def pull(self, number: int) -> PullInfo:
        return _info(self._pr(number))

    def upsert_comment(self, number: int, comment_id: int | None, body: str) -> int:
        """Edit the sticky comment in place (not when it already reads so); post it when there is none yet.

        With no id on record, a comment of the gateway's own carrying the same marker is taken up rather than a
        second one posted: a worker that died after posting, before recording the id, left it there.
        """
        pr = self._pr(number)
        comment = None
        if comment_id is not None:
            try:
                comment = _call(lambda: pr.get_issue_comment(comment_id), "the gateway's comment")
            except NotFound:  # deleted by someone: post it again
                comment = None
        marker = _MARKER.search(body)
        if comment is None and marker is not None:
            comment = next((c for c in _call(lambda: list(pr.get_issue_comments()), "the pull request's comments")
                            if marker.group(0) in (c.body or "") and self._posted_by_me(c)), None)
        if comment is None:
            return int(_call(lambda: pr.create_issue_comment(body), "comment on the pull request").id)
        if comment.body != body:
            _call(lambda: comment.edit(body), "edit the gateway's comment")
        return int(comment.id)

    def _posted_by_me(self, comment: IssueComment) -> bool:
        """Written by the gateway's own App installation, or by the account its token belongs to."""
        if self.credentials.is_app:
            app = comment.performed_via_github_app
            return app is not None and int(app.id) == int(self.credentials.app_id or 0)
        return bool(comment.user and comment.user.login == self._login)

    @cached_property
    def _login(self) -> str:
        return str(_call(lambda: self.gh.get_user().login, "the token's account"))

    def review(self, number: int, review_id: int) -> tuple[str, str | None, int]:
        """A review as GitHub has it now: state (upper-case), commit, author id. Deliveries can be late or replayed."""
        what = f"review {review_id} of #{number}"
        review = self._get(f"/repos/{self.settings.repository}/pulls/{number}/reviews/{review_id}", what)
        user = review.get("user") if isinstance(review.get("user"), dict) else {}
        try:
            return str(review["state"]), review.get("commit_id"), int(user["id"])
        except (KeyError, TypeError, ValueError) as exc:
            raise BackendError(f"GitHub: {what}: an answer without {exc}") from None

    def comment(self, number: int, comment_id: int) -> tuple[str, int]:
        """A comment as GitHub has it now: body and author id (an edited or deleted one is not a command)."""
        comment = _call(lambda: self._pr(number).get_issue_comment(comment_id), f"comment {comment_id} of #{number}")
        return str(comment.body or ""), int(comment.user.id)

    def reply(self, number: int, body: str) -> None:
        """A one-off comment, for a pull request that has no proposal (a fork, an unlinked author)."""
        pr = self._pr(number)
        _call(lambda: pr.create_issue_comment(body), "comment on the pull request")

    def request_teams(self, number: int, teams: list[str]) -> None:
        if teams:
            _call(lambda: self._pr(number).create_review_request(team_reviewers=teams), "request reviews")

    def set_checks(self, sha: str, checks: list[Check], details_url: str) -> None:
        """Check runs with an App; commit statuses with a token (GitHub lets only Apps write check runs)."""
        commit = _call(lambda: self.repo.get_commit(sha), f"commit {sha[:12]}")
        if not self.credentials.is_app:
            for c in checks:
                _call(lambda c=c: commit.create_status(
                    state=STATUS_STATES[c.state], target_url=details_url, description=f"{c.title}: {c.summary}"[:140],
                    context=c.name), f"status {c.name}")
            return
        existing = {run.name: run for run in _call(lambda: list(commit.get_check_runs()), "check runs")}
        for c in checks:
            fields = _check_run_fields(c, details_url)
            if c.name in existing:
                _call(lambda c=c, f=fields: existing[c.name].edit(**f), f"check {c.name}")
            else:
                _call(lambda c=c, f=fields: self.repo.create_check_run(name=c.name, head_sha=sha, **f),
                           f"check {c.name}")

    def merge(self, number: int, sha: str, title: str, message: str) -> str:
        """Merge exactly `sha`: GitHub refuses if the head moved since (a push that slipped in is never merged).

        A pull request GitHub already merged at exactly `sha` (an earlier attempt whose answer was lost) counts.
        """
        pr = self._pr(number)
        if pr.merged:
            if pr.head.sha == sha and pr.merge_commit_sha:
                return str(pr.merge_commit_sha)
            raise Conflict(f"pull request #{number} was merged on GitHub at {pr.head.sha[:12]}, not at {sha[:12]}")
        try:
            status = pr.merge(merge_method=self.settings.merge_method, sha=sha, commit_title=title[:250],
                              commit_message=message)
        except GithubException as exc:
            why = _message(exc)
            if exc.status == 409:
                raise Conflict(f"GitHub refused the merge: the pull request's head moved from {sha[:12]} ({why})") \
                    from None
            raise Conflict(f"GitHub refused the merge ({exc.status}: {why})") from None
        if not status.merged:
            raise Conflict(f"GitHub did not merge the pull request: {status.message}")
        return str(status.sha)

    # --- people ------------------------------------------------------------------------------

    def user_id(self, login: str) -> tuple[int, str]:
        """The numeric id and exact login of a GitHub user."""
        user = _call(lambda: self.gh.get_user(login), f"GitHub user {login}")
        return int(user.id), str(user.login)

    def is_team_member(self, team_slug: str, login: str, account_id: int | None = None) -> bool:
        """An active member of the team now (a pending invitation does not count)."""
        path = f"/orgs/{quote(self.settings.owner)}/teams/{quote(team_slug)}/memberships/{quote(login)}"
        try:  # one call: GitHub answers 404 for a team that does not exist and for a person not in it
            return str(self._get(path, f"team {team_slug} membership of {login}").get("state")) == "active"
        except NotFound:
            return False

    # -------------------------------------------------------------------------------------------

    def _get(self, path: str, what: str) -> dict:
        """One GET of a REST path, its JSON object (no object built around it, nothing fetched to reach it)."""
        _, data = _call(lambda: self.gh.requester.requestJsonAndCheck("GET", path), what)
        return data if isinstance(data, dict) else {}

    def _pr(self, number: int) -> PullRequest:
        return _call(lambda: self.repo.get_pull(number), f"pull request #{number}")



def _call(fn: Callable[[], T], what: str) -> T:
    """One GitHub call, its failures as the gateway's errors (a person reads them, in the trail or a job)."""
    try:
        return fn()
    except UnknownObjectException as exc:
        raise NotFound(f"GitHub has no {what}") from exc
    except GithubException as exc:
        raise _error(exc, what) from exc
    except OSError as exc:  # connection refused or reset, DNS, TLS, a timeout (requests' errors are OSErrors)
        raise Unavailable(f"GitHub is unavailable ({what}): {exc}") from exc


def _error(exc: GithubException, what: str) -> BackendError:
    """GitHub's error answer as the gateway's: a 5xx or a spent rate limit is Unavailable (the same call later may
    succeed), anything else a BackendError."""
    headers = {k.lower(): v for k, v in (exc.headers or {}).items()}
    rate_limited = exc.status == 429 or (exc.status == 403 and (
        isinstance(exc, RateLimitExceededException) or headers.get("x-ratelimit-remaining") == "0"
        or "retry-after" in headers))
    if rate_limited:
        return Unavailable(f"GitHub's rate limit is spent ({what}): {exc.status} {_message(exc)}",
                           _asked_wait(headers))
    if exc.status >= 500:
        return Unavailable(f"GitHub is unavailable ({what}): {exc.status} {_message(exc)}", _asked_wait(headers))
    return BackendError(f"GitHub: {what}: {exc.status} {_message(exc)}")


def _asked_wait(headers: dict[str, str]) -> float | None:
    """The seconds GitHub asked us to wait: `Retry-After`, else until `X-RateLimit-Reset` when none are left."""
    try:
        if "retry-after" in headers:
            return max(0.0, float(headers["retry-after"]))
        if headers.get("x-ratelimit-remaining") == "0" and "x-ratelimit-reset" in headers:
            return max(0.0, float(headers["x-ratelimit-reset"]) - time.time())
    except ValueError:  # a header GitHub never sends this way: wait as for any other failure
        return None
    return None


def _info(pr: PullRequest) -> PullInfo:
    return PullInfo(pr.number, pr.head.ref, pr.head.sha, pr.state, bool(pr.merged), pr.html_url, pr.merge_commit_sha)


def _check_run_fields(check: Check, details_url: str) -> dict:
    output = {"title": check.title[:250], "summary": check.summary[:60000] or check.title}
    if check.text:
        output["text"] = check.text
    if check.state == CheckState.PENDING:
        return {"status": "in_progress", "details_url": details_url, "output": output}
    return {"status": "completed", "conclusion": check.state.value, "details_url": details_url, "output": output}


def _message(exc: GithubException) -> str:
    data = exc.data if isinstance(exc.data, dict) else {}
    return str(data.get("message") or exc.message or exc)
