"""A fake GitHub for tests: a stateful HTTP server on 127.0.0.1 that PyGithub talks to through its base URL.

    with FakeGitHub(tmp_path) as gh:
        gh.seed_main({"stacks/app/main.tf": "..."})
        client = Github(auth=Auth.Token("t"), base_url=gh.url, retry=None,
                        seconds_between_requests=None, seconds_between_writes=None)
        ...

State lives in memory (users, teams, pull requests, comments, reviews, statuses, check runs) and in a real bare git
repository (``git_url``), "GitHub's git" for the one repository ``owner/name``: branches, pull request heads
(``refs/pull/N/head``, kept in step with the head branch) and real merge commits.

Fidelity rules:
- every JSON response is checked against GitHub's REST description (tests/fixtures/github/rest-subset.json); a
  mismatch is appended to ``schema_errors`` and logged, so a malformed fake shows up in tests;
- request bodies are checked too: an invalid one gets GitHub's 422 and is recorded in ``request_errors``;
- a request to a route the fake does not serve gets 404 and is recorded in ``unhandled``;
- no ``Authorization`` header: 401. Any ``token X`` / ``Bearer X`` is accepted for the repository, user and
  organisation endpoints (and recorded); App endpoints need an RS256 JWT signed with ``app_private_key_pem``;
  check runs can only be written with an App installation token (403 otherwise, as on GitHub);
- webhook payloads built from the live state are checked against the webhook description before being returned.

Besides the brief's API: ``pulls()``, ``close_pull``, ``dismiss_review``, ``edit_comment``, ``reviews``,
``branch_sha``, ``add_token`` (a token acting as a given user; other tokens act as ``default_login``),
``set_permission``, ``protect_branch`` (required contexts/approvals: 405 on merge), ``ping_event``, ``delivery``
(signed body and headers), ``request_log``, ``fail_requests``/``recover`` (GitHub having a bad moment: 5xx or a
rate limit, on every API request or on the matching ones, for a number of requests or until ``recover``). The App
key is generated once per test process.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import logging
import os
import re
import secrets
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from tests.github_schemas import validate_rest_request, validate_rest_response, validate_webhook

log = logging.getLogger(__name__)

JsonObj = dict[str, Any]
_REPOSITORY_PATH = re.compile(r"/repos/([^/]+/[^/]+)(?:/|$)")
HTML_BASE = "https://github.com"
DOCS_URL = "https://docs.github.com/rest"
ZERO_SHA = "0" * 40
REVIEW_STATES = ("APPROVED", "CHANGES_REQUESTED", "COMMENTED", "DISMISSED", "PENDING")
REVIEW_EVENTS = {"APPROVE": "APPROVED", "REQUEST_CHANGES": "CHANGES_REQUESTED", "COMMENT": "COMMENTED"}
PERMISSION_RANKS = ("none", "read", "triage", "write", "maintain", "admin")
CHECK_OUTPUT_LIMIT = 65535  # characters of a check run's output title, summary or text
COMMENT_LIMIT = 65536  # characters of an issue comment
CHECK_ANNOTATIONS_LIMIT = 50
APP_PERMISSIONS = {"checks": "write", "contents": "write", "issues": "write", "metadata": "read",
                   "members": "read", "pull_requests": "write", "statuses": "write"}  # fmt: skip
APP_EVENTS = ["issue_comment", "pull_request", "pull_request_review", "push"]


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def sign_webhook(secret: str | bytes, body: bytes) -> str:
    """The ``X-Hub-Signature-256`` header GitHub sends for ``body``: ``sha256=<hex HMAC-SHA256>``."""
    key = secret.encode() if isinstance(secret, str) else secret
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


def webhook_delivery(
    event: str, payload: JsonObj, secret: str | bytes | None, *, delivery: str | None = None, hook_id: int = 1,
    app_id: int | None = None,
) -> tuple[bytes, dict[str, str]]:
    """The raw body and headers of a webhook delivery as GitHub sends it (signed when ``secret`` is given).

    ``delivery`` is the X-GitHub-Delivery id (a new one by default; a redelivery repeats it); ``app_id`` marks the
    hook as a GitHub App's.
    """
    body = json.dumps(payload, separators=(",", ":")).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "GitHub-Hookshot/fake",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-GitHub-Hook-ID": str(hook_id),
    }
    if app_id is not None:
        headers["X-GitHub-Hook-Installation-Target-Type"] = "integration"
        headers["X-GitHub-Hook-Installation-Target-ID"] = str(app_id)
    if secret is not None:
        headers["X-Hub-Signature-256"] = sign_webhook(secret, body)
    return body, headers


@cache
def _app_key() -> rsa.RSAPrivateKey:
    """The App's RSA key: generated once per test process (2048-bit generation takes ~50 ms)."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _node_id(kind: str, number: int) -> str:
    return base64.b64encode(f"0{len(kind)}:{kind}{number}".encode()).decode().rstrip("=")


def _b64url_decode(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


# --------------------------------------------------------------------------------------------------------------------
# git


class _Git:
    """Plumbing commands on the bare repository, isolated from the user's git configuration."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.env = {
            **os.environ,
            "GIT_DIR": str(path),
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_CONFIG_NOSYSTEM": "1",
            "TZ": "UTC",
        }

    def run(self, *args: str, stdin: str | bytes | None = None, env: Mapping[str, str] | None = None,
            check: bool = True) -> subprocess.CompletedProcess[bytes]:  # fmt: skip
        data = stdin.encode() if isinstance(stdin, str) else stdin
        result = subprocess.run(
            ["git", *args], input=data, capture_output=True, env={**self.env, **(env or {})}, check=False
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)} failed: {result.stderr.decode(errors='replace').strip()}")
        return result

    def out(self, *args: str, **kwargs: Any) -> str:
        return self.run(*args, **kwargs).stdout.decode().strip()

    def init(self, default_branch: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "init", "--quiet", "--bare", f"--initial-branch={default_branch}", str(self.path)],
                       check=True, capture_output=True, env={**self.env, "GIT_DIR": ""})  # fmt: skip

    def rev(self, ref: str) -> str | None:
        result = self.run("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
        return result.stdout.decode().strip() if result.returncode == 0 else None

    def is_ancestor(self, older: str, newer: str) -> bool:
        return self.run("merge-base", "--is-ancestor", older, newer, check=False).returncode == 0

    def update_ref(self, ref: str, new: str, old: str | None = None) -> None:
        self.run("update-ref", ref, new, *([old] if old is not None else []))

    def delete_ref(self, ref: str) -> None:
        self.run("update-ref", "-d", ref)

    def commit(self, parent: str | None, files: Mapping[str, str | bytes | None], message: str,
               author: tuple[str, str], *, replace: bool = False) -> str:  # fmt: skip
        """A commit of ``parent``'s tree (or an empty tree if ``replace``) with ``files`` written (None: deleted)."""
        with tempfile.TemporaryDirectory() as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            if parent is not None and not replace:
                self.run("read-tree", parent, env=env)
            lines = []
            for path, content in files.items():
                if content is None:
                    lines.append(f"0 {ZERO_SHA}\t{path}")
                else:
                    blob = self.out("hash-object", "-w", "--stdin", stdin=content)
                    lines.append(f"100644 {blob}\t{path}")
            if lines:
                self.run("update-index", "--index-info", stdin="\n".join(lines) + "\n", env=env)
            tree = self.out("write-tree", env=env)
        return self.commit_tree(tree, [parent] if parent else [], message, author)

    def commit_tree(self, tree: str, parents: list[str], message: str, author: tuple[str, str]) -> str:
        name, email = author
        env = {"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email,
               "GIT_COMMITTER_NAME": "GitHub", "GIT_COMMITTER_EMAIL": "noreply@github.com"}  # fmt: skip
        args = ["commit-tree", tree]
        for parent in parents:
            args += ["-p", parent]
        return self.out(*args, stdin=message, env=env)

    def merge_tree(self, ours: str, theirs: str) -> str | None:
        """The tree of merging ``theirs`` into ``ours``, or None on a conflict (``git merge-tree --write-tree``)."""
        result = self.run("merge-tree", "--write-tree", ours, theirs, check=False)
        if result.returncode == 1:
            return None
        if result.returncode != 0:
            raise RuntimeError(f"git merge-tree failed: {result.stderr.decode(errors='replace').strip()}")
        return result.stdout.decode().split()[0]

    def commit_info(self, sha: str) -> JsonObj:
        fields = self.out("log", "-1", "--format=%H%x00%T%x00%P%x00%an%x00%ae%x00%aI%x00%cn%x00%ce%x00%cI%x00%B", sha)
        full, tree, parents, an, ae, ad, cn, ce, cd, message = fields.split("\0", 9)
        return {"sha": full, "tree": tree, "parents": parents.split(), "message": message.strip(),
                "author": {"name": an, "email": ae, "date": _utc(ad)},
                "committer": {"name": cn, "email": ce, "date": _utc(cd)}}  # fmt: skip

    def rev_list(self, base: str | None, head: str) -> list[str]:
        """Commits reachable from ``head`` but not ``base``, oldest first."""
        args = ["rev-list", "--reverse", head] + ([f"^{base}"] if base else [])
        return self.out(*args).split()

    def diff(self, base: str | None, head: str) -> list[JsonObj]:
        """Changed files between two commits: filename, status, blob sha, additions, deletions."""
        base = base or self.out("hash-object", "-t", "tree", "/dev/null")
        raw = self.out("diff", "--raw", "--no-abbrev", "--no-renames", base, head)
        numstat = self.out("diff", "--numstat", "--no-renames", base, head)
        counts: dict[str, tuple[int, int]] = {}
        for line in numstat.splitlines():
            added, deleted, path = line.split("\t", 2)
            counts[path] = (int(added) if added != "-" else 0, int(deleted) if deleted != "-" else 0)
        files = []
        for line in raw.splitlines():
            meta, path = line.split("\t", 1)
            _, _, old_sha, new_sha, status = meta.split()
            additions, deletions = counts.get(path, (0, 0))
            files.append({"filename": path, "additions": additions, "deletions": deletions,
                          "status": {"A": "added", "D": "removed"}.get(status[0], "modified"),
                          "sha": old_sha if status[0] == "D" else new_sha})  # fmt: skip
        return files


def _utc(iso: str) -> str:
    return datetime.fromisoformat(iso).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------------------------------------------------
# state


@dataclass
class _User:
    id: int
    login: str
    type: str  # "User" | "Bot" | "Organization"
    created_at: str = field(default_factory=now_iso)


@dataclass
class _Team:
    id: int
    slug: str
    name: str
    members: dict[str, tuple[str, str]] = field(default_factory=dict)  # login -> (role, state)
    created_at: str = field(default_factory=now_iso)


@dataclass
class _Pull:
    number: int
    id: int
    title: str
    body: str | None
    user: str
    head_ref: str
    base_ref: str
    fork: bool
    draft: bool = False
    maintainer_can_modify: bool = False
    state: str = "open"
    merged: bool = False
    merged_at: str | None = None
    merged_by: str | None = None
    merge_commit_sha: str | None = None
    closed_at: str | None = None
    base_sha_at_close: str | None = None
    requested_users: list[str] = field(default_factory=list)
    requested_teams: list[str] = field(default_factory=list)
    created_at: str = field(default_factory=now_iso)
    updated_at: str = field(default_factory=now_iso)


@dataclass
class _Comment:
    id: int
    number: int
    user: str
    body: str
    via_app: bool
    created_at: str = field(default_factory=now_iso)
    updated_at: str = field(default_factory=now_iso)
    previous_body: str | None = None


@dataclass
class _Review:
    id: int
    number: int
    user: str
    state: str
    body: str
    commit_id: str
    submitted_at: str | None = field(default_factory=now_iso)


@dataclass
class _Identity:
    """Who a request is from: a person/machine user's token, an App installation token, or the App's JWT."""

    kind: str  # "token" | "installation" | "app"
    login: str | None = None
    installation: int | None = None  # an installation token's installation: it reaches that installation's repositories


@dataclass
class _Request:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    params: dict[str, str]
    identity: _Identity | None


@dataclass
class RecordedRequest:
    """One request the fake received (``requests`` keeps the (method, path, body) triple of each)."""

    method: str
    path: str
    query: dict[str, str]
    body: Any
    identity_kind: str | None
    login: str | None
    status: int = 0


class _HTTPError(Exception):
    def __init__(self, status: int, message: str, errors: list[JsonObj] | list[str] | None = None) -> None:
        super().__init__(f"{status} {message}" + (f" {errors}" if errors else ""))
        self.status = status
        self.message = message
        self.errors = errors


def _validation_failed(summary: str = "Validation Failed", /, **error: Any) -> _HTTPError:
    """GitHub's 422: ``summary`` is the body's message, ``error`` (resource, field, code, message) one error."""
    return _HTTPError(422, summary, [error] if error else None)


@dataclass
class _Fault:
    """GitHub answering an error instead of serving: for matching requests, ``remaining`` times (None: until told)."""

    status: int
    message: str
    method: str | None
    path: re.Pattern[str] | None
    headers: dict[str, str]
    remaining: int | None

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and (self.path is None or bool(self.path.search(path)))


@dataclass
class _Route:
    method: str
    pattern: re.Pattern[str]
    template: str | None  # the operation in the REST description the response is checked against
    handler: Callable[[_Request], tuple[int, Any]]
    auth: str = "token"  # "token": any credentials; "app": the App's JWT; "installation": an installation token


# --------------------------------------------------------------------------------------------------------------------
# the fake


class FakeGitHub:
    """One organisation ``owner`` with one repository ``owner/name``, a GitHub App installed on it, served over HTTP.

    ``add_repository`` puts more repositories on the same server, with the same people, teams, App and tokens.
    """

    installed = True  # the App is installed on the repository (``add_repository(..., installed=False)``: not)

    def __init__(self, root: Path, owner: str = "acme", name: str = "infra", *, app_id: int = 4242,
                 installation_id: int = 77, app_slug: str = "change-gateway",
                 default_login: str = "gateway-bot", host: FakeGitHub | None = None) -> None:  # fmt: skip
        self.root = Path(root)
        self.owner = owner
        self.name = name
        self.full_name = f"{owner}/{name}"
        self.app_id = app_id
        self.installation_id = installation_id
        self.app_slug = app_slug
        self.default_login = default_login
        self.default_branch = "main"
        self.git_url = str(self.root / "github.git")
        self.requests: list[tuple[str, str, Any]] = []
        self.request_log: list[RecordedRequest] = []
        self.schema_errors: list[str] = []
        self.request_errors: list[str] = []
        self.unhandled: list[str] = []  # requests the fake could not serve: no such route (404) or a fake bug (500)
        self.faults_served: list[RecordedRequest] = []  # requests answered by a fault from ``fail_requests``
        self._faults: list[_Fault] = []

        self._host = host
        self._lock = threading.RLock() if host is None else host._lock
        self._ids = itertools.count(1001) if host is None else host._ids
        self._numbers = itertools.count(1)
        self._git = _Git(Path(self.git_url))
        self._git.init(self.default_branch)
        key = _app_key()
        self.app_private_key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
        self._app_public_key = key.public_key()

        # People, teams and tokens are GitHub's, not a repository's: shared with the host's other repositories.
        self._users: dict[str, _User] = {} if host is None else host._users
        self._teams: dict[str, _Team] = {} if host is None else host._teams
        self._pulls: dict[int, _Pull] = {}
        self._comments: dict[int, _Comment] = {}
        self._reviews: dict[int, _Review] = {}
        self._statuses: dict[str, list[JsonObj]] = {}
        self._check_runs: dict[int, JsonObj] = {}
        self._tokens: dict[str, _Identity] = {} if host is None else host._tokens
        self._permissions: dict[str, str] = {}
        self._protection: dict[str, tuple[tuple[str, ...], int]] = {}
        self.org_id = self._add_account(owner, "Organization").id
        self.repo_id = next(self._ids)
        self._fork_ids: dict[str, int] = {}
        self.bot_login = f"{app_slug}[bot]"
        self._add_account(self.bot_login, "Bot")
        self._add_account(default_login, "User")
        self._created_at = now_iso()
        self._routes = self._build_routes()
        self._repositories: dict[str, FakeGitHub] = {self.full_name: self} if host is None else host._repositories
        self._repositories[self.full_name] = self
        self._thread: threading.Thread | None = None
        if host is not None:  # served by the host's server
            self._server, self.url = host._server, host.url
            return
        # Bound now, so that ``url`` (which every API URL in responses and payloads starts with) is known at once.
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), type("_Handler", (_Handler,), {"fake": self}))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def add_repository(self, name: str, *, owner: str | None = None, installation_id: int | None = None,
                       installed: bool = True) -> FakeGitHub:  # fmt: skip
        """Another repository ``owner/name`` on this server (this one's owner unless given), with its own pull
        requests, reviews and git (``root/owner/name``), in the App's installation ``installation_id`` (this one's
        unless given: one organisation is one installation), or in none (``installed=False``). An installation token
        reaches only its installation's repositories (404 elsewhere, as on GitHub). Returns the repository's fake, to
        seed and drive as this one."""
        with self._lock:
            owner = owner or self.owner
            if f"{owner}/{name}" in self._repositories:
                raise ValueError(f"{owner}/{name} is already on this server")
            repository = FakeGitHub(self.root / owner / name, owner, name, app_id=self.app_id,
                                    installation_id=installation_id or self.installation_id, app_slug=self.app_slug,
                                    default_login=self.default_login, host=self._host or self)
            repository.installed = installed
            return repository

    # ---------------------------------------------------------------------------------------------- lifecycle

    def start(self) -> FakeGitHub:
        """Serve HTTP on ``url`` from a background thread."""
        if self._host is not None:
            self._host.start()
        elif self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                            name="fake-github", daemon=True)  # fmt: skip
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket (the bare repository stays)."""
        if self._host is not None:
            return
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> FakeGitHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------------------------------------- faults

    def fail_requests(self, status: int = 500, *, times: int | None = None, method: str | None = None,
                      path: str | None = None, rate_limited: bool = False) -> None:
        """Answer ``status`` to API requests (``method`` and the ``path`` regex narrow which) instead of serving them.

        ``times`` bounds how many requests fail (None: until ``recover``). ``rate_limited`` answers as GitHub does
        when the rate limit is spent: ``status`` (403 or 429) with the ``X-RateLimit-*`` headers and ``Retry-After``.
        Git over the bare repository is not affected. Faults are checked in the order they were added.
        """
        headers: dict[str, str] = {}
        message = HTTPStatus(status).phrase
        if rate_limited:
            headers = {"X-RateLimit-Limit": "5000", "X-RateLimit-Remaining": "0", "X-RateLimit-Used": "5000",
                       "X-RateLimit-Reset": str(int(time.time()) + 1), "X-RateLimit-Resource": "core",
                       "Retry-After": "1"}
            message = "API rate limit exceeded for installation ID %d." % self.installation_id
        with self._lock:
            self._faults.append(_Fault(status, message, method, re.compile(path) if path else None, headers, times))

    def recover(self) -> None:
        """Serve every request again."""
        with self._lock:
            self._faults.clear()

    def _fault_for(self, method: str, path: str) -> _Fault | None:
        for fault in self._faults:
            if fault.matches(method, path):
                if fault.remaining is not None:
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        self._faults.remove(fault)
                return fault
        return None

    # --------------------------------------------------------------------------------------- people and teams

    def add_user(self, login: str, *, user_type: str = "User") -> int:
        """Add a user, or set the type of an existing one; returns its numeric id (stable for the login)."""
        with self._lock:
            user = self._add_account(login, user_type)
            user.type = user_type
            return user.id

    def _add_account(self, login: str, user_type: str) -> _User:
        if login not in self._users:
            self._users[login] = _User(next(self._ids), login, user_type)
        return self._users[login]

    def _user(self, login: str) -> _User:
        return self._add_account(login, "User") if login not in self._users else self._users[login]

    def add_token(self, token: str, login: str) -> None:
        """Requests made with ``token`` act as ``login`` (other unknown tokens act as ``default_login``)."""
        with self._lock:
            self._user(login)
            self._tokens[token] = _Identity("token", login)

    def add_team(self, slug: str, members: Iterable[str] = ()) -> int:
        with self._lock:
            team = self._teams.get(slug)
            if team is None:
                team = self._teams[slug] = _Team(next(self._ids), slug, slug.replace("-", " ").title())
            for login in members:
                self.add_member(slug, login)
            return team.id

    def add_member(self, slug: str, login: str, *, role: str = "member", state: str = "active") -> None:
        """Put ``login`` in team ``slug`` (role member|maintainer, state active|pending)."""
        with self._lock:
            self._user(login)
            self._teams[slug].members[login] = (role, state)

    def remove_member(self, slug: str, login: str) -> None:
        with self._lock:
            self._teams[slug].members.pop(login, None)

    def set_permission(self, login: str, permission: str) -> None:
        """The collaborator permission of ``login`` on the repository: admin|maintain|write|triage|read|none."""
        with self._lock:
            self._user(login)
            self._permissions[login] = permission

    def protect_branch(self, branch: str = "main", *, required_contexts: Iterable[str] = (),
                       required_approving_reviews: int = 0) -> None:  # fmt: skip
        """Branch protection: merging into ``branch`` needs these statuses/check runs green and approvals (405)."""
        with self._lock:
            self._protection[branch] = (tuple(required_contexts), required_approving_reviews)

    # ------------------------------------------------------------------------------------------------- git

    def _author(self, login: str | None) -> tuple[str, str]:
        if login is None:
            return ("Fake GitHub", "noreply@github.com")
        user = self._user(login)
        return (login, f"{user.id}+{login}@users.noreply.github.com")

    def seed_main(self, files: Mapping[str, str] | Path, message: str = "Initial") -> str:
        """Commit exactly ``files`` (or a directory tree) as the new tip of main; returns the commit sha."""
        if isinstance(files, Path):
            tree = {
                path.relative_to(files).as_posix(): path.read_bytes()
                for path in sorted(files.rglob("*"))
                if path.is_file() and ".git" not in path.relative_to(files).parts
            }
        else:
            tree = dict(files)
        with self._lock:
            parent = self._git.rev(f"refs/heads/{self.default_branch}")
            sha = self._git.commit(parent, tree, message, self._author(None), replace=True)
            self._git.update_ref(f"refs/heads/{self.default_branch}", sha, parent or ZERO_SHA)
            return sha

    def push_commit(self, branch: str, files: Mapping[str, str | None], message: str,
                    author_login: str | None = None) -> str:  # fmt: skip
        """Commit ``files`` (None deletes a file) on top of ``branch`` (created from main if missing); returns sha."""
        with self._lock:
            parent = self._git.rev(f"refs/heads/{branch}")
            start = parent or self._git.rev(f"refs/heads/{self.default_branch}")
            sha = self._git.commit(start, files, message, self._author(author_login))
            self._git.update_ref(f"refs/heads/{branch}", sha, parent or ZERO_SHA)
            for pull in self._pulls.values():
                if pull.state == "open" and pull.head_ref == branch:
                    self._git.update_ref(f"refs/pull/{pull.number}/head", sha)
                    pull.updated_at = now_iso()
            return sha

    def branch_sha(self, branch: str) -> str | None:
        with self._lock:
            return self._git.rev(f"refs/heads/{branch}")

    def _head_sha(self, pull: _Pull) -> str:
        """Open pull requests follow their head branch live; closed ones keep the head they had."""
        pull_ref = f"refs/pull/{pull.number}/head"
        if pull.state == "open":
            live = self._git.rev(f"refs/heads/{pull.head_ref}")
            if live is not None:
                if self._git.rev(pull_ref) != live:
                    self._git.update_ref(pull_ref, live)
                return live
        sha = self._git.rev(pull_ref)
        assert sha is not None, f"pull request #{pull.number} has no head"
        return sha

    def _base_sha(self, pull: _Pull) -> str:
        if pull.base_sha_at_close is not None:
            return pull.base_sha_at_close
        sha = self._git.rev(f"refs/heads/{pull.base_ref}")
        assert sha is not None, f"base branch {pull.base_ref} is missing"
        return sha

    def _resolve(self, ref: str) -> str | None:
        if re.fullmatch(r"[0-9a-f]{40}", ref):
            return self._git.rev(ref)
        for candidate in (f"refs/heads/{ref}", f"refs/tags/{ref}", ref):
            sha = self._git.rev(candidate)
            if sha is not None:
                return sha
        return None

    # ------------------------------------------------------------------------------------------ pull requests

    def open_pull(self, head: str, title: str, body: str, user: str, *, base: str = "main",
                  fork: bool = False, draft: bool = False) -> int:  # fmt: skip
        """A person opens a pull request on GitHub; ``fork=True`` makes head.repo ``user``'s fork of the repo.

        The head branch is read from this repository either way (a fork's head is also ``refs/pull/N/head``).
        """
        with self._lock:
            self._user(user)
            try:
                return self._create_pull(head, base, title, body, user, fork=fork, draft=draft).number
            except _HTTPError as error:
                raise ValueError(f"GitHub would refuse this pull request: {error}") from None

    def _create_pull(self, head: str, base: str, title: str, body: str | None, user: str, *, fork: bool,
                     draft: bool = False, maintainer_can_modify: bool = False) -> _Pull:  # fmt: skip
        head_sha = self._git.rev(f"refs/heads/{head}")
        base_sha = self._git.rev(f"refs/heads/{base}")
        if head_sha is None:
            raise _validation_failed(resource="PullRequest", field="head", code="invalid")
        if base_sha is None:
            raise _validation_failed(resource="PullRequest", field="base", code="invalid")
        if not self._git.rev_list(base_sha, head_sha):
            raise _validation_failed(resource="PullRequest", code="custom",
                                     message=f"No commits between {base} and {head}")  # fmt: skip
        for other in self._pulls.values():
            if other.state == "open" and (other.head_ref, other.base_ref, other.fork) == (head, base, fork):
                label = f"{other.user if fork else self.owner}:{head}"
                raise _validation_failed(
                    resource="PullRequest", code="custom", message=f"A pull request already exists for {label}."
                )
        pull = _Pull(next(self._numbers), next(self._ids), title, body, user, head, base, fork, draft=draft,
                     maintainer_can_modify=maintainer_can_modify)  # fmt: skip
        self._pulls[pull.number] = pull
        self._git.update_ref(f"refs/pull/{pull.number}/head", head_sha)
        return pull

    def _pull(self, number: int | str) -> _Pull:
        pull = self._pulls.get(int(number))
        if pull is None:
            raise _HTTPError(404, "Not Found")
        return pull

    def pulls(self, state: str = "all") -> list[JsonObj]:
        """The REST shapes of the pull requests (open|closed|all), oldest first."""
        with self._lock:
            return [self._pull_json(p) for p in self._pulls.values() if state in ("all", p.state)]

    def pull(self, number: int) -> JsonObj:
        """The current REST shape of the pull request (head.sha read live from the head branch)."""
        with self._lock:
            return self._pull_json(self._pull(number))

    def close_pull(self, number: int) -> JsonObj:
        """A person closes the pull request without merging it."""
        with self._lock:
            pull = self._pull(number)
            self._close(pull)
            return self._pull_json(pull)

    def _close(self, pull: _Pull) -> None:
        pull.base_sha_at_close = None
        head, base = self._head_sha(pull), self._base_sha(pull)
        pull.state, pull.closed_at, pull.updated_at = "closed", now_iso(), now_iso()
        pull.base_sha_at_close = base
        self._git.update_ref(f"refs/pull/{pull.number}/head", head)

    def add_review(self, number: int, login: str, state: str = "APPROVED", *, commit_id: str | None = None,
                   body: str = "") -> JsonObj:  # fmt: skip
        """A person reviews the pull request (REST shape returned); ``commit_id`` defaults to its current head.

        Unlike GitHub (and the fake's own REST endpoint, 422), this lets the author approve their own pull request,
        so that tests can check the gateway refuses such an approval too.
        """
        if state not in REVIEW_STATES:
            raise ValueError(f"review state must be one of {REVIEW_STATES}")
        with self._lock:
            pull = self._pull(number)
            self._user(login)
            review = self._add_review(pull, login, state, body, commit_id or self._head_sha(pull))
            return self._review_json(review)

    def _add_review(self, pull: _Pull, login: str, state: str, body: str, commit_id: str) -> _Review:
        review = _Review(next(self._ids), pull.number, login, state, body, commit_id,
                         None if state == "PENDING" else now_iso())  # fmt: skip
        self._reviews[review.id] = review
        if state != "PENDING" and login in pull.requested_users:
            pull.requested_users.remove(login)
        pull.updated_at = now_iso()
        return review

    def dismiss_review(self, number: int, review_id: int, message: str = "Dismissed") -> JsonObj:
        """Dismiss an approval or a change request (the review's state becomes DISMISSED)."""
        with self._lock:
            return self._review_json(self._dismiss(self._pull(number), review_id))

    def _dismiss(self, pull: _Pull, review_id: int | str) -> _Review:
        review = self._reviews.get(int(review_id))
        if review is None or review.number != pull.number:
            raise _HTTPError(404, "Not Found")
        if review.state not in ("APPROVED", "CHANGES_REQUESTED"):
            raise _validation_failed(f"Can not dismiss a {review.state.lower()} pull request review")
        review.state = "DISMISSED"
        return review

    def reviews(self, number: int) -> list[JsonObj]:
        with self._lock:
            return [self._review_json(r) for r in self._reviews.values() if r.number == int(number)]

    def add_comment(self, number: int, login: str, body: str) -> JsonObj:
        """A person comments on the pull request's conversation (an issue comment)."""
        with self._lock:
            self._pull(number)
            self._user(login)
            comment = _Comment(next(self._ids), int(number), login, body, via_app=False)
            self._comments[comment.id] = comment
            return self._comment_json(comment)

    def edit_comment(self, comment_id: int, body: str) -> JsonObj:
        """The comment's author edits it (``comment_event(..., "edited")`` then reports the old body)."""
        with self._lock:
            comment = self._comments[comment_id]
            comment.previous_body, comment.body, comment.updated_at = comment.body, body, now_iso()
            return self._comment_json(comment)

    def comments(self, number: int) -> list[JsonObj]:
        with self._lock:
            return [self._comment_json(c) for c in self._comments.values() if c.number == int(number)]

    def statuses(self, sha: str) -> list[JsonObj]:
        """Commit statuses on ``sha``, oldest first (the REST API lists them newest first)."""
        with self._lock:
            return [dict(s) for s in self._statuses.get(sha, [])]

    def check_runs(self, sha: str) -> list[JsonObj]:
        with self._lock:
            return [self._check_run_json(r) for r in self._check_runs.values() if r["head_sha"] == sha]

    def review_requests(self, number: int) -> JsonObj:
        """``{"users": [logins], "teams": [slugs]}`` still requested on the pull request."""
        with self._lock:
            pull = self._pull(number)
            return {"users": list(pull.requested_users), "teams": list(pull.requested_teams)}

    # -------------------------------------------------------------------------------------------- JSON shapes

    def _api(self, path: str) -> str:
        return f"{self.url}{path}"

    def _repo_api(self, path: str = "") -> str:
        return self._api(f"/repos/{self.full_name}{path}")

    def _user_json(self, login: str) -> JsonObj:
        user = self._user(login)
        api, html = self._api(f"/users/{quote(login)}"), f"{HTML_BASE}/{quote(login)}"
        if user.type == "Bot":
            html = f"{HTML_BASE}/apps/{login.removesuffix('[bot]')}"
        return {
            "login": login, "id": user.id, "node_id": _node_id(user.type, user.id),
            "avatar_url": f"https://avatars.githubusercontent.com/u/{user.id}?v=4", "gravatar_id": "",
            "url": api, "html_url": html, "followers_url": f"{api}/followers",
            "following_url": f"{api}/following{{/other_user}}", "gists_url": f"{api}/gists{{/gist_id}}",
            "starred_url": f"{api}/starred{{/owner}}{{/repo}}", "subscriptions_url": f"{api}/subscriptions",
            "organizations_url": f"{api}/orgs", "repos_url": f"{api}/repos", "events_url": f"{api}/events{{/privacy}}",
            "received_events_url": f"{api}/received_events", "type": user.type, "user_view_type": "public",
            "site_admin": False,
        }  # fmt: skip

    def _public_user_json(self, login: str) -> JsonObj:
        user = self._user(login)
        return {**self._user_json(login), "name": login, "company": None, "blog": "", "location": None,
                "email": None, "hireable": None, "bio": None, "twitter_username": None, "public_repos": 0,
                "public_gists": 0, "followers": 0, "following": 0, "created_at": user.created_at,
                "updated_at": user.created_at}  # fmt: skip

    def _org_json(self, *, full: bool = False) -> JsonObj:
        api = self._api(f"/orgs/{self.owner}")
        org = {
            "login": self.owner, "id": self.org_id, "node_id": _node_id("Organization", self.org_id), "url": api,
            "repos_url": f"{api}/repos", "events_url": f"{api}/events", "hooks_url": f"{api}/hooks",
            "issues_url": f"{api}/issues", "members_url": f"{api}/members{{/member}}",
            "public_members_url": f"{api}/public_members{{/member}}",
            "avatar_url": f"https://avatars.githubusercontent.com/u/{self.org_id}?v=4", "description": None,
        }  # fmt: skip
        if full:
            org |= {"name": self.owner, "html_url": f"{HTML_BASE}/{self.owner}", "has_organization_projects": True,
                    "has_repository_projects": True, "public_repos": 0, "public_gists": 0, "followers": 0,
                    "following": 0, "type": "Organization", "created_at": self._created_at,
                    "updated_at": self._created_at, "archived_at": None}  # fmt: skip
        return org

    def _repo_json(self, fork_owner: str | None = None) -> JsonObj:
        owner = fork_owner or self.owner
        full_name = f"{owner}/{self.name}"
        repo_id = self.repo_id if fork_owner is None else self._fork_ids.setdefault(fork_owner, next(self._ids))
        api, html = self._api(f"/repos/{full_name}"), f"{HTML_BASE}/{full_name}"
        pushed = self._created_at
        return {
            "id": repo_id, "node_id": _node_id("Repository", repo_id), "name": self.name, "full_name": full_name,
            "private": True, "owner": self._user_json(owner), "html_url": html, "description": None,
            "fork": fork_owner is not None, "url": api,
            "archive_url": f"{api}/{{archive_format}}{{/ref}}", "assignees_url": f"{api}/assignees{{/user}}",
            "blobs_url": f"{api}/git/blobs{{/sha}}", "branches_url": f"{api}/branches{{/branch}}",
            "collaborators_url": f"{api}/collaborators{{/collaborator}}",
            "comments_url": f"{api}/comments{{/number}}", "commits_url": f"{api}/commits{{/sha}}",
            "compare_url": f"{api}/compare/{{base}}...{{head}}", "contents_url": f"{api}/contents/{{+path}}",
            "contributors_url": f"{api}/contributors", "deployments_url": f"{api}/deployments",
            "downloads_url": f"{api}/downloads", "events_url": f"{api}/events", "forks_url": f"{api}/forks",
            "git_commits_url": f"{api}/git/commits{{/sha}}", "git_refs_url": f"{api}/git/refs{{/sha}}",
            "git_tags_url": f"{api}/git/tags{{/sha}}", "git_url": f"git://github.com/{full_name}.git",
            "issue_comment_url": f"{api}/issues/comments{{/number}}",
            "issue_events_url": f"{api}/issues/events{{/number}}", "issues_url": f"{api}/issues{{/number}}",
            "keys_url": f"{api}/keys{{/key_id}}", "labels_url": f"{api}/labels{{/name}}",
            "languages_url": f"{api}/languages", "merges_url": f"{api}/merges",
            "milestones_url": f"{api}/milestones{{/number}}",
            "notifications_url": f"{api}/notifications{{?since,all,participating}}",
            "pulls_url": f"{api}/pulls{{/number}}", "releases_url": f"{api}/releases{{/id}}",
            "ssh_url": f"git@github.com:{full_name}.git", "stargazers_url": f"{api}/stargazers",
            "statuses_url": f"{api}/statuses/{{sha}}", "subscribers_url": f"{api}/subscribers",
            "subscription_url": f"{api}/subscription", "tags_url": f"{api}/tags", "teams_url": f"{api}/teams",
            "trees_url": f"{api}/git/trees{{/sha}}", "clone_url": f"{html}.git", "mirror_url": None,
            "hooks_url": f"{api}/hooks", "svn_url": html, "homepage": None, "language": "HCL",
            "forks_count": 0, "forks": 0, "stargazers_count": 0, "watchers_count": 0, "watchers": 0, "size": 1,
            "default_branch": self.default_branch, "open_issues_count": self._open_count(),
            "open_issues": self._open_count(), "is_template": False, "topics": [], "has_issues": True,
            "has_projects": False, "has_wiki": False, "has_pages": False, "has_downloads": True,
            "has_discussions": False, "archived": False, "disabled": False, "visibility": "private",
            "pushed_at": pushed, "created_at": self._created_at, "updated_at": pushed,
            "permissions": {"admin": False, "maintain": False, "push": True, "triage": True, "pull": True},
            "allow_rebase_merge": True, "allow_squash_merge": True, "allow_merge_commit": True,
            "allow_auto_merge": False, "delete_branch_on_merge": False, "allow_update_branch": False,
            "allow_forking": True, "web_commit_signoff_required": False, "license": None,
            "custom_properties": {},
        }  # fmt: skip

    def _full_repo_json(self) -> JsonObj:
        return {**self._repo_json(), "network_count": 0, "subscribers_count": 0,
                "organization": self._user_json(self.owner), "temp_clone_token": ""}  # fmt: skip

    def _open_count(self) -> int:
        return sum(1 for p in self._pulls.values() if p.state == "open")

    def _team_json(self, team: _Team, *, full: bool = False) -> JsonObj:
        api = self._api(f"/organizations/{self.org_id}/team/{team.id}")
        data = {
            "id": team.id, "node_id": _node_id("Team", team.id), "url": api,
            "html_url": f"{HTML_BASE}/orgs/{self.owner}/teams/{team.slug}", "name": team.name, "slug": team.slug,
            "description": None, "privacy": "closed", "notification_setting": "notifications_enabled",
            "permission": "pull", "members_url": f"{api}/members{{/member}}", "repositories_url": f"{api}/repos",
            "type": "organization", "organization_id": self.org_id,
        }  # fmt: skip
        if full:
            data |= {"members_count": len(team.members), "repos_count": 1, "created_at": team.created_at,
                     "updated_at": team.created_at, "organization": self._org_json(full=True)}  # fmt: skip
        else:
            data["parent"] = None
        return data

    def _app_json(self) -> JsonObj:
        return {
            "id": self.app_id, "slug": self.app_slug, "node_id": _node_id("Integration", self.app_id),
            "client_id": f"Iv1.{self.app_id:016x}", "owner": self._user_json(self.owner),
            "name": self.app_slug.replace("-", " ").title(), "description": "The change gateway",
            "external_url": "https://gateway.example.com", "html_url": f"{HTML_BASE}/apps/{self.app_slug}",
            "created_at": self._created_at, "updated_at": self._created_at,
            "permissions": dict(APP_PERMISSIONS), "events": list(APP_EVENTS),
            "installations_count": len({r.installation_id for r in self._repositories.values() if r.installed}),
        }  # fmt: skip

    def _installation_json(self) -> JsonObj:
        api = self._api(f"/app/installations/{self.installation_id}")
        return {
            "id": self.installation_id, "account": self._user_json(self.owner), "repository_selection": "selected",
            "access_tokens_url": f"{api}/access_tokens", "repositories_url": self._api("/installation/repositories"),
            "html_url": f"{HTML_BASE}/organizations/{self.owner}/settings/installations/{self.installation_id}",
            "app_id": self.app_id, "app_slug": self.app_slug, "target_id": self.org_id,
            "target_type": "Organization", "permissions": dict(APP_PERMISSIONS), "events": list(APP_EVENTS),
            "created_at": self._created_at, "updated_at": self._created_at, "single_file_name": None,
            "suspended_by": None, "suspended_at": None,
        }  # fmt: skip

    def _author_association(self, login: str) -> str:
        if self._users[login].type == "Bot":
            return "NONE"
        if any(login in team.members for team in self._teams.values()):
            return "MEMBER"
        if self._permissions.get(login, "none") not in ("none", "read"):
            return "COLLABORATOR"
        return "NONE"

    def _branch_json(self, pull: _Pull, ref: str, sha: str, *, head: bool) -> JsonObj:
        owner = pull.user if head and pull.fork else self.owner
        return {"label": f"{owner}:{ref}", "ref": ref, "sha": sha, "user": self._user_json(owner),
                "repo": self._repo_json(owner if owner != self.owner else None)}  # fmt: skip

    def _pull_links(self, pull: _Pull, head_sha: str) -> JsonObj:
        api, html = self._repo_api(f"/pulls/{pull.number}"), f"{HTML_BASE}/{self.full_name}/pull/{pull.number}"
        issue = self._repo_api(f"/issues/{pull.number}")
        return {"url": api, "html_url": html, "diff_url": f"{html}.diff", "patch_url": f"{html}.patch",
                "issue_url": issue, "commits_url": f"{api}/commits", "review_comments_url": f"{api}/comments",
                "review_comment_url": self._repo_api("/pulls/comments{/number}"),
                "comments_url": f"{issue}/comments",
                "statuses_url": self._repo_api(f"/statuses/{head_sha}")}  # fmt: skip

    def _pull_simple_json(self, pull: _Pull, head_sha: str | None = None, base_sha: str | None = None) -> JsonObj:
        head_sha, base_sha = head_sha or self._head_sha(pull), base_sha or self._base_sha(pull)
        links = self._pull_links(pull, head_sha)
        return {
            **links, "id": pull.id, "node_id": _node_id("PullRequest", pull.id), "number": pull.number,
            "state": pull.state, "locked": False, "title": pull.title, "user": self._user_json(pull.user),
            "body": pull.body, "labels": [], "milestone": None, "active_lock_reason": None,
            "created_at": pull.created_at, "updated_at": pull.updated_at, "closed_at": pull.closed_at,
            "merged_at": pull.merged_at, "merge_commit_sha": pull.merge_commit_sha, "assignee": None,
            "assignees": [], "requested_reviewers": [self._user_json(u) for u in pull.requested_users],
            "requested_teams": [self._team_json(self._teams[t]) for t in pull.requested_teams],
            "head": self._branch_json(pull, pull.head_ref, head_sha, head=True),
            "base": self._branch_json(pull, pull.base_ref, base_sha, head=False),
            "_links": {
                "self": {"href": links["url"]}, "html": {"href": links["html_url"]},
                "issue": {"href": links["issue_url"]}, "comments": {"href": links["comments_url"]},
                "review_comments": {"href": links["review_comments_url"]},
                "review_comment": {"href": links["review_comment_url"]},
                "commits": {"href": links["commits_url"]}, "statuses": {"href": links["statuses_url"]},
            },
            "author_association": self._author_association(pull.user), "auto_merge": None, "draft": pull.draft,
        }  # fmt: skip

    def _pull_json(self, pull: _Pull) -> JsonObj:
        head_sha, base_sha = self._head_sha(pull), self._base_sha(pull)
        merge_base = self._git.out("merge-base", base_sha, head_sha)
        files = self._git.diff(merge_base, head_sha)
        mergeable, mergeable_state = None, "unknown"
        if pull.state == "open":
            mergeable = self._git.merge_tree(base_sha, head_sha) is not None
            if not mergeable:
                mergeable_state = "dirty"
            elif self._protection_failure(pull, head_sha):
                mergeable_state = "blocked"
            else:
                mergeable_state = "clean"
        return {
            **self._pull_simple_json(pull, head_sha, base_sha), "merged": pull.merged, "mergeable": mergeable,
            "rebaseable": mergeable, "mergeable_state": mergeable_state,
            "merged_by": self._user_json(pull.merged_by) if pull.merged_by else None,
            "comments": sum(1 for c in self._comments.values() if c.number == pull.number), "review_comments": 0,
            "maintainer_can_modify": pull.maintainer_can_modify,
            "commits": len(self._git.rev_list(merge_base, head_sha)),
            "additions": sum(f["additions"] for f in files), "deletions": sum(f["deletions"] for f in files),
            "changed_files": len(files),
        }  # fmt: skip

    def _review_json(self, review: _Review) -> JsonObj:
        pull_api = self._repo_api(f"/pulls/{review.number}")
        html = f"{HTML_BASE}/{self.full_name}/pull/{review.number}#pullrequestreview-{review.id}"
        data = {
            "id": review.id, "node_id": _node_id("PullRequestReview", review.id),
            "user": self._user_json(review.user), "body": review.body, "state": review.state, "html_url": html,
            "pull_request_url": pull_api, "commit_id": review.commit_id,
            "_links": {"html": {"href": html}, "pull_request": {"href": pull_api}},
            "author_association": self._author_association(review.user),
        }  # fmt: skip
        if review.submitted_at is not None:
            data["submitted_at"] = review.submitted_at
        return data

    def _comment_json(self, comment: _Comment) -> JsonObj:
        api = self._repo_api(f"/issues/comments/{comment.id}")
        return {
            "id": comment.id, "node_id": _node_id("IssueComment", comment.id), "url": api,
            "html_url": f"{HTML_BASE}/{self.full_name}/pull/{comment.number}#issuecomment-{comment.id}",
            "body": comment.body, "user": self._user_json(comment.user), "created_at": comment.created_at,
            "updated_at": comment.updated_at, "issue_url": self._repo_api(f"/issues/{comment.number}"),
            "author_association": self._author_association(comment.user),
            "performed_via_github_app": self._app_json() if comment.via_app else None,
            "reactions": {"url": f"{api}/reactions", "total_count": 0, "+1": 0, "-1": 0, "laugh": 0,
                          "hooray": 0, "confused": 0, "heart": 0, "rocket": 0, "eyes": 0},
        }  # fmt: skip

    def _commit_json(self, sha: str) -> JsonObj:
        info = self._git.commit_info(sha)
        api, html = self._repo_api(f"/commits/{sha}"), f"{HTML_BASE}/{self.full_name}/commit/{sha}"
        files = self._git.diff(info["parents"][0] if info["parents"] else None, sha)
        return {
            "url": api, "sha": sha, "node_id": _node_id("Commit", int(sha[:7], 16)), "html_url": html,
            "comments_url": f"{api}/comments",
            "commit": {
                "url": self._repo_api(f"/git/commits/{sha}"), "author": info["author"],
                "committer": info["committer"], "message": info["message"], "comment_count": 0,
                "tree": {"sha": info["tree"], "url": self._repo_api(f"/git/trees/{info['tree']}")},
                "verification": {"verified": False, "reason": "unsigned", "signature": None, "payload": None,
                                 "verified_at": None},
            },
            "author": self._login_of_email(info["author"]["email"]),
            "committer": self._login_of_email(info["committer"]["email"]),
            "parents": [{"sha": p, "url": self._repo_api(f"/commits/{p}"),
                         "html_url": f"{HTML_BASE}/{self.full_name}/commit/{p}"} for p in info["parents"]],
            "stats": {"additions": sum(f["additions"] for f in files), "deletions": sum(f["deletions"] for f in files),
                      "total": sum(f["additions"] + f["deletions"] for f in files)},
            "files": [self._file_json(f, sha) for f in files],
        }  # fmt: skip

    def _file_json(self, entry: JsonObj, ref: str) -> JsonObj:
        path = entry["filename"]
        return {**entry, "changes": entry["additions"] + entry["deletions"],
                "blob_url": f"{HTML_BASE}/{self.full_name}/blob/{ref}/{path}",
                "raw_url": f"{HTML_BASE}/{self.full_name}/raw/{ref}/{path}",
                "contents_url": self._repo_api(f"/contents/{path}?ref={ref}")}  # fmt: skip

    def _login_of_email(self, email: str) -> JsonObj | None:
        match = re.fullmatch(r"(\d+)\+(.+)@users\.noreply\.github\.com", email)
        if match and match.group(2) in self._users and self._users[match.group(2)].id == int(match.group(1)):
            return self._user_json(match.group(2))
        return None

    def _check_run_json(self, run: JsonObj) -> JsonObj:
        api = self._repo_api(f"/check-runs/{run['id']}")
        head_sha = run["head_sha"]
        pulls = [p for p in self._pulls.values() if p.state == "open" and self._head_sha(p) == head_sha]
        return {
            "id": run["id"], "node_id": _node_id("CheckRun", run["id"]), "head_sha": head_sha,
            "external_id": run.get("external_id") or "", "url": api,
            "html_url": f"{HTML_BASE}/{self.full_name}/runs/{run['id']}",
            "details_url": run.get("details_url") or f"{HTML_BASE}/{self.full_name}/runs/{run['id']}",
            "status": run["status"], "conclusion": run.get("conclusion"), "started_at": run["started_at"],
            "completed_at": run.get("completed_at"), "name": run["name"],
            "output": {"title": run["output"].get("title"), "summary": run["output"].get("summary"),
                       "text": run["output"].get("text"), "annotations_count": run["annotations_count"],
                       "annotations_url": f"{api}/annotations"},
            "check_suite": {"id": run["check_suite_id"]}, "app": self._app_json(),
            "pull_requests": [self._pull_minimal_json(p) for p in pulls],
        }  # fmt: skip

    def _pull_minimal_json(self, pull: _Pull) -> JsonObj:
        def side(ref: str, sha: str, owner: str | None) -> JsonObj:
            repo = self._repo_json(owner)
            return {"ref": ref, "sha": sha, "repo": {"id": repo["id"], "url": repo["url"], "name": repo["name"]}}

        return {"id": pull.id, "number": pull.number, "url": self._repo_api(f"/pulls/{pull.number}"),
                "head": side(pull.head_ref, self._head_sha(pull), pull.user if pull.fork else None),
                "base": side(pull.base_ref, self._base_sha(pull), None)}  # fmt: skip

    def _membership_json(self, team: _Team, login: str) -> JsonObj:
        role, state = team.members[login]
        url = self._api(f"/organizations/{self.org_id}/team/{team.id}/memberships/{quote(login)}")
        return {"url": url, "role": role, "state": state}

    # -------------------------------------------------------------------------------------------- webhooks

    def _webhook_base(self, sender: str) -> JsonObj:
        return {
            "repository": self._repo_json(),
            "organization": self._org_json(),
            "sender": self._user_json(sender),
            "installation": {"id": self.installation_id, "node_id": _node_id("Installation", self.installation_id)},
        }

    def _webhook_pull(self, pull: _Pull) -> JsonObj:
        data = self._pull_json(pull)
        repo = self._repo_json()
        data |= {key: repo[key] for key in ("allow_auto_merge", "allow_update_branch", "delete_branch_on_merge")}
        data |= {"merge_commit_message": "PR_TITLE", "merge_commit_title": "MERGE_MESSAGE",
                 "squash_merge_commit_message": "COMMIT_MESSAGES", "squash_merge_commit_title": "COMMIT_OR_PR_TITLE",
                 "use_squash_pr_title_as_default": False}  # fmt: skip
        return data

    def _checked(self, event: str, action: str | None, payload: JsonObj) -> JsonObj:
        validate_webhook(event, action, payload)
        return payload

    def pull_request_event(self, number: int, action: str, sender: str, **extra: Any) -> JsonObj:
        """A ``pull_request`` payload (opened|reopened|synchronize|closed) from the pull request's live state.

        ``synchronize`` takes ``before``/``after`` (defaults: the head's parent and the head).
        """
        with self._lock:
            pull = self._pull(number)
            payload = {"action": action, "number": pull.number, **self._webhook_base(sender)}
            payload["pull_request"] = self._webhook_pull(pull)
            if action == "synchronize":
                after = extra.pop("after", None) or self._head_sha(pull)
                before = extra.pop("before", None) or self._git.out("rev-parse", f"{after}^")
                payload |= {"before": before, "after": after}
            payload |= extra
            return self._checked("pull_request", action, payload)

    def review_event(self, review: JsonObj, action: str = "submitted", sender: str | None = None) -> JsonObj:
        """A ``pull_request_review`` payload for a review returned by ``add_review`` (state lower-case)."""
        with self._lock:
            current = self._reviews[review["id"]]
            pull = self._pull(current.number)
            data = self._review_json(current)
            data["state"] = current.state.lower()
            data.setdefault("submitted_at", None)
            data["updated_at"] = data["submitted_at"]
            payload = {"action": action, "review": data, "pull_request": self._webhook_pull(pull),
                       **self._webhook_base(sender or current.user)}  # fmt: skip
            return self._checked("pull_request_review", action, payload)

    def comment_event(self, comment: JsonObj, action: str = "created", **extra: Any) -> JsonObj:
        """An ``issue_comment`` payload for a pull request comment (``issue.pull_request`` present).

        ``edited`` reports ``changes.body.from`` (the body before ``edit_comment``) unless ``changes`` is given;
        ``sender`` defaults to the comment's author.
        """
        with self._lock:
            current = self._comments[comment["id"]]
            pull = self._pull(current.number)
            sender = extra.pop("sender", None) or current.user
            payload = {"action": action, "issue": self._issue_json(pull), "comment": self._comment_json(current),
                       **self._webhook_base(sender)}  # fmt: skip
            if action == "edited" and "changes" not in extra:
                payload["changes"] = {"body": {"from": current.previous_body or current.body}}
            payload |= extra
            return self._checked("issue_comment", action, payload)

    def _issue_json(self, pull: _Pull) -> JsonObj:
        links = self._pull_links(pull, self._head_sha(pull))
        api = links["issue_url"]
        return {
            "url": api, "repository_url": self._repo_api(), "labels_url": f"{api}/labels{{/name}}",
            "comments_url": f"{api}/comments", "events_url": f"{api}/events", "html_url": links["html_url"],
            "id": pull.id, "node_id": _node_id("PullRequest", pull.id), "number": pull.number, "title": pull.title,
            "user": self._user_json(pull.user), "labels": [], "state": pull.state, "locked": False,
            "assignee": None, "assignees": [], "milestone": None,
            "comments": sum(1 for c in self._comments.values() if c.number == pull.number),
            "created_at": pull.created_at, "updated_at": pull.updated_at, "closed_at": pull.closed_at,
            "author_association": self._author_association(pull.user), "active_lock_reason": None,
            "draft": pull.draft, "body": pull.body, "performed_via_github_app": None,
            "timeline_url": f"{api}/timeline", "state_reason": None,
            "reactions": {"url": f"{api}/reactions", "total_count": 0, "+1": 0, "-1": 0, "laugh": 0,
                          "hooray": 0, "confused": 0, "heart": 0, "rocket": 0, "eyes": 0},
            "pull_request": {"url": links["url"], "html_url": links["html_url"], "diff_url": links["diff_url"],
                             "patch_url": links["patch_url"], "merged_at": pull.merged_at},
        }  # fmt: skip

    def push_event(self, branch: str, before: str, after: str, sender: str) -> JsonObj:
        """A ``push`` payload for ``branch`` moving ``before`` -> ``after`` (all-zero shas: created/deleted)."""
        with self._lock:
            created, deleted = before == ZERO_SHA, after == ZERO_SHA
            shas = [] if deleted else self._git.rev_list(None if created else before, after)[-20:]
            commits = [self._push_commit_json(sha) for sha in shas]
            repo = self._repo_json()
            repo |= {"created_at": int(datetime.fromisoformat(self._created_at).timestamp()),
                     "pushed_at": int(time.time()), "stargazers": 0, "master_branch": self.default_branch,
                     "organization": self.owner}  # fmt: skip
            payload = {
                "ref": f"refs/heads/{branch}", "before": before, "after": after, "created": created,
                "deleted": deleted,
                "forced": not (created or deleted) and not self._git.is_ancestor(before, after),
                "base_ref": None, "compare": f"{HTML_BASE}/{self.full_name}/compare/{before[:12]}...{after[:12]}",
                "commits": commits, "head_commit": commits[-1] if commits else None,
                **self._webhook_base(sender), "repository": repo,
                "pusher": {"name": sender, "email": self._author(sender)[1]},
            }  # fmt: skip
            return self._checked("push", None, payload)

    def _push_commit_json(self, sha: str) -> JsonObj:
        info = self._git.commit_info(sha)
        files = self._git.diff(info["parents"][0] if info["parents"] else None, sha)
        return {
            "id": sha, "tree_id": info["tree"], "distinct": True, "message": info["message"],
            "timestamp": info["committer"]["date"], "url": f"{HTML_BASE}/{self.full_name}/commit/{sha}",
            "author": {"name": info["author"]["name"], "email": info["author"]["email"]},
            "committer": {"name": info["committer"]["name"], "email": info["committer"]["email"]},
            "added": [f["filename"] for f in files if f["status"] == "added"],
            "removed": [f["filename"] for f in files if f["status"] == "removed"],
            "modified": [f["filename"] for f in files if f["status"] == "modified"],
        }  # fmt: skip

    def delivery(self, event: str, payload: JsonObj, secret: str | bytes | None,
                 delivery: str | None = None) -> tuple[bytes, dict[str, str]]:  # fmt: skip
        """Body and headers of this App's webhook delivery of ``payload`` (see ``webhook_delivery``)."""
        return webhook_delivery(event, payload, secret, delivery=delivery, app_id=self.app_id)

    def ping_event(self, hook_id: int = 1) -> JsonObj:
        """The ``ping`` payload GitHub sends when the App's webhook is created."""
        with self._lock:
            created = self._created_at
            payload = {
                "zen": "Keep it logically awesome.", "hook_id": hook_id,
                "hook": {"type": "App", "id": hook_id, "name": "web", "active": True, "events": list(APP_EVENTS),
                         "config": {"content_type": "json", "insecure_ssl": "0", "url": "https://gateway.example.com/"},
                         "updated_at": created, "created_at": created, "app_id": self.app_id,
                         "deliveries_url": self._api("/app/hook/deliveries")},
            }  # fmt: skip
            return self._checked("ping", None, payload)

    # --------------------------------------------------------------------------------------------- HTTP API

    def _build_routes(self) -> list[_Route]:
        repo = r"/repos/(?P<owner>[^/]+)/(?P<repo>[^/]+)"
        pulls = repo + r"/pulls/(?P<number>\d+)"
        membership = "/orgs/{org}/teams/{team_slug}/memberships/{username}"
        team_member = "/teams/{team_id}/members/{username}"
        org_team = r"/organizations/(?P<org_id>\d+)/team/(?P<team_id>\d+)"
        table: list[tuple[str, str, str | None, Callable[[_Request], tuple[int, Any]], str]] = [
            ("GET", r"/app", "/app", self._get_app, "app"),
            ("POST", r"/app/installations/(?P<id>\d+)/access_tokens",
             "/app/installations/{installation_id}/access_tokens", self._create_access_token, "app"),
            ("GET", repo + r"/installation", "/repos/{owner}/{repo}/installation", self._get_repo_installation, "app"),
            ("GET", r"/user", "/user", self._get_authenticated_user, "token"),
            ("GET", r"/users/(?P<login>[^/]+)", "/users/{username}", self._get_user, "token"),
            ("GET", r"/orgs/(?P<org>[^/]+)", "/orgs/{org}", self._get_org, "token"),
            ("GET", r"/orgs/(?P<org>[^/]+)/teams/(?P<slug>[^/]+)", "/orgs/{org}/teams/{team_slug}",
             self._get_team, "token"),
            ("GET", r"/orgs/(?P<org>[^/]+)/teams/(?P<slug>[^/]+)/memberships/(?P<login>[^/]+)", membership,
             self._get_membership, "token"),
            ("GET", org_team + r"/memberships/(?P<login>[^/]+)", membership, self._get_membership, "token"),
            ("GET", r"/teams/(?P<team_id>\d+)/memberships/(?P<login>[^/]+)", membership, self._get_membership,
             "token"),
            ("GET", r"/orgs/(?P<org>[^/]+)/teams/(?P<slug>[^/]+)/members", "/orgs/{org}/teams/{team_slug}/members",
             self._list_members, "token"),
            ("GET", org_team + r"/members", "/orgs/{org}/teams/{team_slug}/members", self._list_members, "token"),
            ("GET", org_team + r"/members/(?P<login>[^/]+)", team_member, self._get_team_member, "token"),
            ("GET", r"/teams/(?P<team_id>\d+)/members/(?P<login>[^/]+)", team_member, self._get_team_member, "token"),
            ("GET", repo, "/repos/{owner}/{repo}", self._get_repo, "token"),
            ("GET", repo + r"/collaborators/(?P<login>[^/]+)/permission",
             "/repos/{owner}/{repo}/collaborators/{username}/permission", self._get_permission, "token"),
            ("GET", repo + r"/git/ref/(?P<ref>.+)", "/repos/{owner}/{repo}/git/ref/{ref}", self._get_ref, "token"),
            ("DELETE", repo + r"/git/refs/(?P<ref>.+)", "/repos/{owner}/{repo}/git/refs/{ref}", self._delete_ref,
             "token"),
            ("GET", repo + r"/pulls", "/repos/{owner}/{repo}/pulls", self._list_pulls, "token"),
            ("POST", repo + r"/pulls", "/repos/{owner}/{repo}/pulls", self._post_pull, "token"),
            ("GET", pulls, "/repos/{owner}/{repo}/pulls/{pull_number}", self._get_pull, "token"),
            ("PATCH", pulls, "/repos/{owner}/{repo}/pulls/{pull_number}", self._patch_pull, "token"),
            ("GET", pulls + r"/files", "/repos/{owner}/{repo}/pulls/{pull_number}/files", self._pull_files, "token"),
            ("GET", pulls + r"/commits", "/repos/{owner}/{repo}/pulls/{pull_number}/commits", self._pull_commits,
             "token"),
            ("GET", pulls + r"/merge", "/repos/{owner}/{repo}/pulls/{pull_number}/merge", self._is_merged, "token"),
            ("PUT", pulls + r"/merge", "/repos/{owner}/{repo}/pulls/{pull_number}/merge", self._merge, "token"),
            ("GET", pulls + r"/reviews", "/repos/{owner}/{repo}/pulls/{pull_number}/reviews", self._list_reviews,
             "token"),
            ("POST", pulls + r"/reviews", "/repos/{owner}/{repo}/pulls/{pull_number}/reviews", self._post_review,
             "token"),
            ("GET", pulls + r"/reviews/(?P<review_id>\d+)",
             "/repos/{owner}/{repo}/pulls/{pull_number}/reviews/{review_id}", self._get_review, "token"),
            ("PUT", pulls + r"/reviews/(?P<review_id>\d+)/dismissals",
             "/repos/{owner}/{repo}/pulls/{pull_number}/reviews/{review_id}/dismissals", self._put_dismissal,
             "token"),
            ("GET", pulls + r"/requested_reviewers", "/repos/{owner}/{repo}/pulls/{pull_number}/requested_reviewers",
             self._get_requested, "token"),
            ("POST", pulls + r"/requested_reviewers",
             "/repos/{owner}/{repo}/pulls/{pull_number}/requested_reviewers", self._post_requested, "token"),
            ("GET", repo + r"/issues/(?P<number>\d+)/comments", "/repos/{owner}/{repo}/issues/{issue_number}/comments",
             self._list_comments, "token"),
            ("POST", repo + r"/issues/(?P<number>\d+)/comments",
             "/repos/{owner}/{repo}/issues/{issue_number}/comments", self._post_comment, "token"),
            ("GET", repo + r"/issues/comments/(?P<id>\d+)", "/repos/{owner}/{repo}/issues/comments/{comment_id}",
             self._get_comment, "token"),
            ("PATCH", repo + r"/issues/comments/(?P<id>\d+)", "/repos/{owner}/{repo}/issues/comments/{comment_id}",
             self._patch_comment, "token"),
            ("DELETE", repo + r"/issues/comments/(?P<id>\d+)", "/repos/{owner}/{repo}/issues/comments/{comment_id}",
             self._delete_comment, "token"),
            ("GET", repo + r"/commits/(?P<ref>[^/]+)", "/repos/{owner}/{repo}/commits/{ref}", self._get_commit,
             "token"),
            ("GET", repo + r"/commits/(?P<ref>[^/]+)/statuses", "/repos/{owner}/{repo}/commits/{ref}/statuses",
             self._list_statuses, "token"),
            # PyGithub's Commit.get_statuses() uses this older spelling, which GitHub still serves.
            ("GET", repo + r"/statuses/(?P<ref>[^/]+)", "/repos/{owner}/{repo}/commits/{ref}/statuses",
             self._list_statuses, "token"),
            ("GET", repo + r"/commits/(?P<ref>[^/]+)/status", "/repos/{owner}/{repo}/commits/{ref}/status",
             self._combined_status, "token"),
            ("GET", repo + r"/commits/(?P<ref>[^/]+)/check-runs", "/repos/{owner}/{repo}/commits/{ref}/check-runs",
             self._list_check_runs, "token"),
            ("POST", repo + r"/statuses/(?P<sha>[^/]+)", "/repos/{owner}/{repo}/statuses/{sha}", self._post_status,
             "token"),
            ("POST", repo + r"/check-runs", "/repos/{owner}/{repo}/check-runs", self._post_check_run, "installation"),
            ("GET", repo + r"/check-runs/(?P<id>\d+)", "/repos/{owner}/{repo}/check-runs/{check_run_id}",
             self._get_check_run, "token"),
            ("PATCH", repo + r"/check-runs/(?P<id>\d+)", "/repos/{owner}/{repo}/check-runs/{check_run_id}",
             self._patch_check_run, "installation"),
        ]  # fmt: skip
        return [_Route(m, re.compile(p + r"/?"), t, h, a) for m, p, t, h, a in table]

    def _identify(self, authorization: str | None) -> _Identity | None:
        if not authorization:
            return None
        scheme, _, credential = authorization.partition(" ")
        credential = credential.strip()
        if scheme.lower() not in ("token", "bearer") or not credential:
            return None
        if credential in self._tokens:
            return self._tokens[credential]
        if scheme.lower() == "bearer" and credential.count(".") == 2:
            return _Identity("app", None) if self._jwt_error(credential) is None else _Identity("bad-jwt")
        return _Identity("token", self.default_login)

    def _jwt_error(self, token: str) -> str | None:
        """Why ``token`` is not a valid App JWT (RS256, signed with the App's key, iss = app id), or None."""
        try:
            header_b64, payload_b64, signature_b64 = token.split(".")
            header = json.loads(_b64url_decode(header_b64))
            claims = json.loads(_b64url_decode(payload_b64))
            if header.get("alg") != "RS256":
                return "A JSON web token could not be decoded"
            self._app_public_key.verify(_b64url_decode(signature_b64), f"{header_b64}.{payload_b64}".encode(),
                                        padding.PKCS1v15(), hashes.SHA256())  # fmt: skip
        except (ValueError, InvalidSignature):
            return "A JSON web token could not be decoded"
        now = time.time()
        if str(claims.get("iss")) != str(self.app_id):
            return "'Issuer' claim ('iss') must be the App's id"
        if not isinstance(claims.get("exp"), int) or claims["exp"] <= now:
            return "'Expiration time' claim ('exp') must be a numeric value representing the future time"
        if not isinstance(claims.get("iat"), int) or claims["iat"] > now + 60:
            return "'Issued at' claim ('iat') must be an Integer representing a time in the past"
        if claims["exp"] - claims["iat"] > 600:
            return "'Expiration time' claim ('exp') is too far in the future"
        return None

    def handle(self, method: str, raw_path: str, headers: Mapping[str, str], raw_body: bytes) -> tuple[int, Any]:
        """One HTTP request: returns (status, JSON body or None)."""
        status, body, _ = self.respond(method, raw_path, headers, raw_body)
        return status, body

    def respond(self, method: str, raw_path: str, headers: Mapping[str, str],
                raw_body: bytes) -> tuple[int, Any, dict[str, str]]:
        """One HTTP request: (status, JSON body or None, extra headers). Used by the HTTP handler."""
        split = urlsplit(raw_path)
        path = unquote(split.path)
        query = {k: v[0] for k, v in parse_qs(split.query).items()}
        named = _REPOSITORY_PATH.match(path)
        other = self._repositories.get(named.group(1)) if named else None
        if other is not None and other is not self:
            return other.respond(method, raw_path, headers, raw_body)
        try:
            body = json.loads(raw_body) if raw_body else None
        except ValueError:
            body = None
            raw_body = b""
        with self._lock:
            identity = self._identify(headers.get("Authorization"))
            record = RecordedRequest(method, path, query, body, identity.kind if identity else None,
                                     identity.login if identity else None)  # fmt: skip
            self.requests.append((method, path, body))
            self.request_log.append(record)
            fault = self._fault_for(method, path)
            if fault is not None:  # GitHub having a bad moment: nothing is served, nothing changes
                record.status = fault.status
                self.faults_served.append(record)
                return fault.status, {"message": fault.message, "documentation_url": DOCS_URL}, dict(fault.headers)
            route, params = self._match(method, path)
            try:
                if route is None:
                    self.unhandled.append(f"{method} {raw_path}")
                    log.warning("fake GitHub does not serve %s %s", method, raw_path)
                    raise _HTTPError(404, "Not Found")
                request = _Request(method, path, query, body, params, identity)
                self._authorize(route, request)
                if method in ("POST", "PATCH", "PUT") and route.template is not None:
                    self._check_request(route, body)
                if "owner" in params and identity is not None and identity.kind == "installation" \
                        and (identity.installation != self.installation_id or not self.installed):
                    raise _HTTPError(404, "Not Found")  # the App is not installed here through that installation
                if "owner" in params and (params["owner"], params["repo"]) != (self.owner, self.name):
                    if not (route.template == "/repos/{owner}/{repo}" and params["repo"] == self.name
                            and params["owner"] in self._fork_ids):  # fmt: skip
                        raise _HTTPError(404, "Not Found")
                status, response = route.handler(request)
            except _HTTPError as error:
                status, response = error.status, {"message": error.message, "documentation_url": DOCS_URL,
                                                  "status": str(error.status)}  # fmt: skip
                if error.errors is not None:
                    response["errors"] = error.errors
            except Exception as error:  # a bug in the fake: answer 500 rather than drop the connection
                log.exception("fake GitHub failed on %s %s", method, raw_path)
                self.unhandled.append(f"{method} {raw_path}: 500 {error!r}")
                status, response = 500, {"message": f"fake GitHub error: {error!r}", "documentation_url": DOCS_URL}
            record.status = status
            if route is not None and route.template is not None:
                self._check_response(route, status, response)
            return status, response, {}

    def _match(self, method: str, path: str) -> tuple[_Route | None, dict[str, str]]:
        for route in self._routes:
            if route.method == method:
                match = route.pattern.fullmatch(path)
                if match:
                    return route, match.groupdict()
        return None, {}

    def _authorize(self, route: _Route, request: _Request) -> None:
        identity = request.identity
        if identity is None:
            raise _HTTPError(401, "Requires authentication")
        if route.auth == "app":
            if identity.kind != "app":
                raise _HTTPError(401, "A JSON web token could not be decoded")
        elif identity.kind == "bad-jwt":
            raise _HTTPError(401, "Bad credentials")
        elif route.auth == "installation" and identity.kind != "installation":
            raise _HTTPError(403, "You must authenticate via a GitHub App.")

    def _check_request(self, route: _Route, body: Any) -> None:
        assert route.template is not None
        try:
            validate_rest_request(route.method, route.template, body)
        except AssertionError as error:
            self.request_errors.append(str(error))
            log.warning("invalid request body: %s", error)
            raise _validation_failed("Invalid request.", code="invalid", message=str(error).splitlines()[-1]) from None

    def _check_response(self, route: _Route, status: int, body: Any) -> None:
        assert route.template is not None
        try:
            validate_rest_response(route.method, route.template, status, body)
        except AssertionError as error:
            self.schema_errors.append(str(error))
            log.error("fake GitHub answered outside GitHub's REST description: %s", error)

    def _actor(self, request: _Request) -> str:
        identity = request.identity
        assert identity is not None
        if identity.kind == "installation":
            return self.bot_login
        return identity.login or self.default_login

    # --- App

    def _get_app(self, request: _Request) -> tuple[int, Any]:
        return 200, self._app_json()

    def _create_access_token(self, request: _Request) -> tuple[int, Any]:
        installation = int(request.params["id"])
        if installation not in {r.installation_id for r in self._repositories.values() if r.installed}:
            raise _HTTPError(404, "Not Found")
        token = "ghs_" + secrets.token_urlsafe(27)[:36]
        self._tokens[token] = _Identity("installation", self.bot_login, installation)
        expires = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        permissions = (request.body or {}).get("permissions") or dict(APP_PERMISSIONS)
        return 201, {"token": token, "expires_at": expires, "permissions": permissions,
                     "repository_selection": "selected"}  # fmt: skip

    def _get_repo_installation(self, request: _Request) -> tuple[int, Any]:
        if not self.installed:
            raise _HTTPError(404, "Not Found")
        return 200, self._installation_json()

    # --- users, organisation, teams

    def _get_authenticated_user(self, request: _Request) -> tuple[int, Any]:
        if request.identity is not None and request.identity.kind == "installation":
            raise _HTTPError(403, "Resource not accessible by integration")
        login = self._actor(request)
        if login not in self._users:
            self._add_account(login, "User")
        return 200, self._public_user_json(login)

    def _get_user(self, request: _Request) -> tuple[int, Any]:
        login = request.params["login"]
        if login not in self._users:
            raise _HTTPError(404, "Not Found")
        return 200, self._public_user_json(login)

    def _get_org(self, request: _Request) -> tuple[int, Any]:
        if request.params["org"] != self.owner:
            raise _HTTPError(404, "Not Found")
        return 200, self._org_json(full=True)

    def _team_of(self, params: Mapping[str, str]) -> _Team:
        if "slug" in params:
            team = self._teams.get(params["slug"]) if params.get("org") == self.owner else None
        else:
            if "org_id" in params and int(params["org_id"]) != self.org_id:
                raise _HTTPError(404, "Not Found")
            team = next((t for t in self._teams.values() if t.id == int(params["team_id"])), None)
        if team is None:
            raise _HTTPError(404, "Not Found")
        return team

    def _get_team(self, request: _Request) -> tuple[int, Any]:
        return 200, self._team_json(self._team_of(request.params), full=True)

    def _get_membership(self, request: _Request) -> tuple[int, Any]:
        team = self._team_of(request.params)
        login = request.params["login"]
        if login not in team.members:
            raise _HTTPError(404, "Not Found")
        return 200, self._membership_json(team, login)

    def _list_members(self, request: _Request) -> tuple[int, Any]:
        team = self._team_of(request.params)
        role = request.query.get("role", "all")
        return 200, [self._user_json(login) for login, (r, state) in team.members.items()
                     if state == "active" and role in ("all", r)]  # fmt: skip

    def _get_team_member(self, request: _Request) -> tuple[int, Any]:
        team = self._team_of(request.params)
        member = team.members.get(request.params["login"])
        if member is None or member[1] != "active":
            raise _HTTPError(404, "Not Found")
        return 204, None

    # --- repository

    def _get_repo(self, request: _Request) -> tuple[int, Any]:
        owner = request.params["owner"]
        return 200, self._full_repo_json() if owner == self.owner else {**self._repo_json(owner),
                                                                          "network_count": 0, "subscribers_count": 0}

    def _get_permission(self, request: _Request) -> tuple[int, Any]:
        login = request.params["login"]
        if login not in self._users:
            raise _HTTPError(404, "Not Found")
        role = self._permissions.get(login, "none")
        rank = PERMISSION_RANKS.index(role)
        flags = {"pull": "read", "triage": "triage", "push": "write", "maintain": "maintain", "admin": "admin"}
        permissions = {flag: rank >= PERMISSION_RANKS.index(level) for flag, level in flags.items()}
        user = self._user_json(login) | {"permissions": permissions, "role_name": role}
        # The legacy "permission" field knows only admin/write/read/none.
        legacy = {"maintain": "write", "triage": "read"}.get(role, role)
        return 200, {"permission": legacy, "role_name": role, "user": user}

    def _get_ref(self, request: _Request) -> tuple[int, Any]:
        ref = "refs/" + request.params["ref"]
        sha = self._git.rev(ref)
        if sha is None:
            raise _HTTPError(404, "Not Found")
        commit_url = self._repo_api(f"/git/commits/{sha}")
        return 200, {"ref": ref, "node_id": _node_id("Ref", int(sha[:7], 16)), "url": self._repo_api(f"/git/{ref}"),
                     "object": {"type": "commit", "sha": sha, "url": commit_url}}  # fmt: skip

    def _delete_ref(self, request: _Request) -> tuple[int, Any]:
        ref = "refs/" + request.params["ref"]
        if self._git.rev(ref) is None:
            raise _validation_failed("Reference does not exist")
        for pull in self._pulls.values():
            if pull.state == "open" and f"refs/heads/{pull.head_ref}" == ref:
                self._head_sha(pull)  # pin refs/pull/N/head before the branch goes away
        self._git.delete_ref(ref)
        return 204, None

    # --- pull requests

    def _list_pulls(self, request: _Request) -> tuple[int, Any]:
        state = request.query.get("state", "open")
        if state not in ("open", "closed", "all"):
            raise _validation_failed(resource="PullRequest", field="state", code="invalid")
        head = request.query.get("head")
        base = request.query.get("base")
        found = []
        for pull in sorted(self._pulls.values(), key=lambda p: p.number, reverse=True):
            if state != "all" and pull.state != state:
                continue
            if base and pull.base_ref != base:
                continue
            if head:
                owner, _, ref = head.rpartition(":")
                pull_owner = pull.user if pull.fork else self.owner
                if ref != pull.head_ref or (owner and owner != pull_owner):
                    continue
            found.append(self._pull_simple_json(pull))
        return 200, found

    def _post_pull(self, request: _Request) -> tuple[int, Any]:
        body = request.body
        owner, _, head = str(body["head"]).rpartition(":")
        if owner and owner != self.owner:
            raise _validation_failed(resource="PullRequest", field="head", code="invalid")
        if not body.get("title") and not body.get("issue"):
            raise _validation_failed(resource="PullRequest", field="title", code="missing_field")
        pull = self._create_pull(head, body["base"], body["title"], body.get("body"), self._actor(request),
                                 fork=False, draft=bool(body.get("draft")),
                                 maintainer_can_modify=bool(body.get("maintainer_can_modify")))  # fmt: skip
        return 201, self._pull_json(pull)

    def _get_pull(self, request: _Request) -> tuple[int, Any]:
        return 200, self._pull_json(self._pull(request.params["number"]))

    def _patch_pull(self, request: _Request) -> tuple[int, Any]:
        pull = self._pull(request.params["number"])
        body = request.body or {}
        for key in ("title", "body", "maintainer_can_modify"):
            if key in body:
                setattr(pull, key, body[key])
        if "base" in body:
            if self._git.rev(f"refs/heads/{body['base']}") is None:
                raise _validation_failed(resource="PullRequest", field="base", code="invalid")
            pull.base_ref = body["base"]
        if body.get("state") == "closed" and pull.state == "open":
            self._close(pull)
        elif body.get("state") == "open" and pull.state == "closed":
            if pull.merged:
                raise _validation_failed("Validation Failed", resource="PullRequest", code="custom",
                                         message="Cannot reopen a merged pull request")  # fmt: skip
            if self._git.rev(f"refs/heads/{pull.head_ref}") is None:
                raise _validation_failed(resource="PullRequest", field="state", code="invalid")
            pull.state, pull.closed_at, pull.base_sha_at_close = "open", None, None
        pull.updated_at = now_iso()
        return 200, self._pull_json(pull)

    def _pull_files(self, request: _Request) -> tuple[int, Any]:
        pull = self._pull(request.params["number"])
        head = self._head_sha(pull)
        base = self._git.out("merge-base", self._base_sha(pull), head)
        return 200, [self._file_json(f, head) for f in self._git.diff(base, head)]

    def _pull_commits(self, request: _Request) -> tuple[int, Any]:
        pull = self._pull(request.params["number"])
        head = self._head_sha(pull)
        base = self._git.out("merge-base", self._base_sha(pull), head)
        commits = []
        for sha in self._git.rev_list(base, head)[:250]:
            commit = self._commit_json(sha)
            del commit["stats"], commit["files"]
            commits.append(commit)
        return 200, commits

    def _is_merged(self, request: _Request) -> tuple[int, Any]:
        if not self._pull(request.params["number"]).merged:
            raise _HTTPError(404, "Not Found")
        return 204, None

    def _protection_failure(self, pull: _Pull, head_sha: str) -> str | None:
        contexts, approvals = self._protection.get(pull.base_ref, ((), 0))
        for context in contexts:
            if self._context_state(head_sha, context) != "success":
                return f'Required status check "{context}" is expected.'
        if approvals:
            latest: dict[str, str] = {}
            for review in self._reviews.values():
                if review.number == pull.number and review.state not in ("COMMENTED", "PENDING"):
                    latest[review.user] = review.state
            if list(latest.values()).count("APPROVED") < approvals or "CHANGES_REQUESTED" in latest.values():
                return f"At least {approvals} approving review is required by reviewers with write access."
        return None

    def _context_state(self, sha: str, context: str) -> str | None:
        for status in reversed(self._statuses.get(sha, [])):
            if status["context"] == context:
                return status["state"]
        runs = [r for r in self._check_runs.values() if r["head_sha"] == sha and r["name"] == context]
        if runs:
            run = runs[-1]
            if run["status"] == "completed" and run.get("conclusion") in ("success", "neutral", "skipped"):
                return "success"
            return "pending" if run["status"] != "completed" else "failure"
        return None

    def _merge(self, request: _Request) -> tuple[int, Any]:
        pull = self._pull(request.params["number"])
        body = request.body or {}
        if pull.state != "open":
            raise _HTTPError(405, "Pull Request is not mergeable")
        head_sha, base_sha = self._head_sha(pull), self._base_sha(pull)
        if body.get("sha") and body["sha"] != head_sha:
            raise _HTTPError(409, "Head branch was modified. Review and try the merge again.")
        method = body.get("merge_method", "merge")
        if method == "rebase":
            raise _HTTPError(405, "The fake GitHub does not do rebase merges")
        tree = self._git.merge_tree(base_sha, head_sha)
        if tree is None:
            raise _HTTPError(405, "Pull Request is not mergeable")
        blocked = self._protection_failure(pull, head_sha)
        if blocked:
            raise _HTTPError(405, blocked)
        actor = self._actor(request)
        if method == "squash":
            title = body.get("commit_title") or f"{pull.title} (#{pull.number})"
            commits = self._git.rev_list(base_sha, head_sha)
            default = "\n".join(f"* {self._git.commit_info(sha)['message']}" for sha in commits)
            parents = [base_sha]
        else:
            head_owner = pull.user if pull.fork else self.owner
            title = body.get("commit_title") or f"Merge pull request #{pull.number} from {head_owner}/{pull.head_ref}"
            default = pull.title
            parents = [base_sha, head_sha]
        message = f"{title}\n\n{body.get('commit_message', default)}".rstrip() + "\n"
        sha = self._git.commit_tree(tree, parents, message, self._author(actor))
        self._git.update_ref(f"refs/heads/{pull.base_ref}", sha, base_sha)
        self._close(pull)
        pull.base_sha_at_close = base_sha
        pull.merged, pull.merged_at, pull.merged_by, pull.merge_commit_sha = True, now_iso(), actor, sha
        return 200, {"sha": sha, "merged": True, "message": "Pull Request successfully merged"}

    # --- reviews and review requests

    def _list_reviews(self, request: _Request) -> tuple[int, Any]:
        pull = self._pull(request.params["number"])
        actor = self._actor(request)
        return 200, [self._review_json(r) for r in self._reviews.values()
                     if r.number == pull.number and (r.state != "PENDING" or r.user == actor)]  # fmt: skip

    def _post_review(self, request: _Request) -> tuple[int, Any]:
        pull = self._pull(request.params["number"])
        body = request.body or {}
        actor = self._actor(request)
        event = body.get("event")
        state = REVIEW_EVENTS.get(event, "PENDING") if event else "PENDING"
        if event and event not in REVIEW_EVENTS:
            raise _validation_failed(resource="PullRequestReview", field="event", code="invalid")
        if actor == pull.user and state in ("APPROVED", "CHANGES_REQUESTED"):
            verb = "approve" if state == "APPROVED" else "request changes on"
            # This endpoint's 422 is "validation-error-simple": its errors are plain strings.
            raise _HTTPError(422, "Unprocessable Entity", [f"Can not {verb} your own pull request"])
        commit_id = body.get("commit_id") or self._head_sha(pull)
        review = self._add_review(pull, actor, state, body.get("body", ""), commit_id)
        return 200, self._review_json(review)

    def _get_review(self, request: _Request) -> tuple[int, Any]:
        review = self._reviews.get(int(request.params["review_id"]))
        if review is None or review.number != int(request.params["number"]):
            raise _HTTPError(404, "Not Found")
        return 200, self._review_json(review)

    def _put_dismissal(self, request: _Request) -> tuple[int, Any]:
        pull = self._pull(request.params["number"])
        return 200, self._review_json(self._dismiss(pull, request.params["review_id"]))

    def _get_requested(self, request: _Request) -> tuple[int, Any]:
        pull = self._pull(request.params["number"])
        return 200, {"users": [self._user_json(u) for u in pull.requested_users],
                     "teams": [self._team_json(self._teams[t]) for t in pull.requested_teams]}  # fmt: skip

    def _post_requested(self, request: _Request) -> tuple[int, Any]:
        pull = self._pull(request.params["number"])
        body = request.body or {}
        users, teams = list(body.get("reviewers", [])), list(body.get("team_reviewers", []))
        if pull.user in users:
            raise _validation_failed("Review cannot be requested from pull request author.")
        unknown = [u for u in users if u not in self._users] + [t for t in teams if t not in self._teams]
        if unknown:
            raise _validation_failed(
                "Reviews may only be requested from collaborators. One or more of the users or teams you specified "
                f"is not a collaborator of the {self.full_name} repository."
            )
        pull.requested_users += [u for u in users if u not in pull.requested_users]
        pull.requested_teams += [t for t in teams if t not in pull.requested_teams]
        pull.updated_at = now_iso()
        return 201, self._pull_simple_json(pull)

    # --- comments

    def _list_comments(self, request: _Request) -> tuple[int, Any]:
        pull = self._pull(request.params["number"])
        return 200, [self._comment_json(c) for c in self._comments.values() if c.number == pull.number]

    def _post_comment(self, request: _Request) -> tuple[int, Any]:
        pull = self._pull(request.params["number"])
        body = request.body["body"]
        if len(body) > COMMENT_LIMIT:
            raise _validation_failed(resource="IssueComment", field="data", code="custom",
                                     message="Body is too long (maximum is 65536 characters)")  # fmt: skip
        identity = request.identity
        comment = _Comment(next(self._ids), pull.number, self._actor(request), body,
                           via_app=identity is not None and identity.kind == "installation")  # fmt: skip
        self._comments[comment.id] = comment
        return 201, self._comment_json(comment)

    def _comment(self, request: _Request) -> _Comment:
        comment = self._comments.get(int(request.params["id"]))
        if comment is None:
            raise _HTTPError(404, "Not Found")
        return comment

    def _get_comment(self, request: _Request) -> tuple[int, Any]:
        return 200, self._comment_json(self._comment(request))

    def _patch_comment(self, request: _Request) -> tuple[int, Any]:
        comment = self._comment(request)
        if len(request.body["body"]) > COMMENT_LIMIT:
            raise _validation_failed(resource="IssueComment", field="data", code="custom",
                                     message="Body is too long (maximum is 65536 characters)")  # fmt: skip
        comment.previous_body, comment.body, comment.updated_at = comment.body, request.body["body"], now_iso()
        return 200, self._comment_json(comment)

    def _delete_comment(self, request: _Request) -> tuple[int, Any]:
        del self._comments[self._comment(request).id]
        return 204, None

    # --- commits, statuses, check runs

    def _commit_or_404(self, ref: str) -> str:
        sha = self._resolve(ref)
        if sha is None:
            raise _validation_failed(f"No commit found for SHA: {ref}")
        return sha

    def _get_commit(self, request: _Request) -> tuple[int, Any]:
        return 200, self._commit_json(self._commit_or_404(request.params["ref"]))

    def _post_status(self, request: _Request) -> tuple[int, Any]:
        sha = self._git.rev(request.params["sha"]) if re.fullmatch(r"[0-9a-f]{40}", request.params["sha"]) else None
        if sha is None:
            raise _validation_failed(f"No commit found for SHA: {request.params['sha']}")
        body = request.body
        status_id = next(self._ids)
        creator = self._actor(request)
        stamp = now_iso()
        status = {
            "url": self._repo_api(f"/statuses/{sha}"), "avatar_url": self._user_json(creator)["avatar_url"],
            "id": status_id, "node_id": _node_id("StatusContext", status_id), "state": body["state"],
            "description": body.get("description"), "target_url": body.get("target_url"),
            "context": body.get("context", "default"), "created_at": stamp, "updated_at": stamp,
            "creator": self._user_json(creator),
        }  # fmt: skip
        self._statuses.setdefault(sha, []).append(status)
        return 201, dict(status)

    def _list_statuses(self, request: _Request) -> tuple[int, Any]:
        sha = self._commit_or_404(request.params["ref"])
        return 200, [dict(s) for s in reversed(self._statuses.get(sha, []))]

    def _combined_status(self, request: _Request) -> tuple[int, Any]:
        sha = self._resolve(request.params["ref"])
        if sha is None:
            raise _HTTPError(404, "Not Found")
        latest: dict[str, JsonObj] = {}
        for status in reversed(self._statuses.get(sha, [])):
            latest.setdefault(status["context"], status)
        states = {s["state"] for s in latest.values()}
        if states & {"failure", "error"}:
            state = "failure"
        elif not states or "pending" in states:
            state = "pending"
        else:
            state = "success"
        statuses = [{k: v for k, v in s.items() if k != "creator"} for s in latest.values()]
        return 200, {"state": state, "statuses": statuses, "sha": sha, "total_count": len(statuses),
                     "repository": {k: v for k, v in self._repo_json().items() if k in _MINIMAL_REPO_KEYS},
                     "commit_url": self._repo_api(f"/commits/{sha}"),
                     "url": self._repo_api(f"/commits/{sha}/status")}  # fmt: skip

    def _check_output(self, output: Mapping[str, Any] | None) -> tuple[JsonObj, int]:
        output = dict(output or {})
        for key in ("title", "summary", "text"):
            if len(output.get(key) or "") > CHECK_OUTPUT_LIMIT:
                raise _validation_failed(resource="CheckRun", field=f"output.{key}", code="custom",
                                         message=f"Only {CHECK_OUTPUT_LIMIT} characters are allowed; "
                                                 f"{len(output[key])} were supplied.")  # fmt: skip
        annotations = output.get("annotations") or []
        if len(annotations) > CHECK_ANNOTATIONS_LIMIT:
            raise _validation_failed(resource="CheckRun", field="output.annotations", code="custom",
                                     message=f"Only {CHECK_ANNOTATIONS_LIMIT} annotations are allowed per request")
        return output, len(annotations)

    def _post_check_run(self, request: _Request) -> tuple[int, Any]:
        body = request.body
        sha = self._git.rev(body["head_sha"]) if re.fullmatch(r"[0-9a-f]{40}", body["head_sha"]) else None
        if sha is None:
            raise _validation_failed(resource="CheckRun", field="head_sha", code="invalid")
        output, annotations = self._check_output(body.get("output"))
        run_id = next(self._ids)
        conclusion = body.get("conclusion")
        status = "completed" if conclusion else body.get("status", "queued")
        if status == "completed" and not conclusion:
            raise _validation_failed(resource="CheckRun", field="conclusion", code="missing_field")
        suite = next((r["check_suite_id"] for r in self._check_runs.values() if r["head_sha"] == sha), next(self._ids))
        run = {
            "id": run_id, "head_sha": sha, "name": body["name"], "status": status, "conclusion": conclusion,
            "details_url": body.get("details_url"), "external_id": body.get("external_id"),
            "started_at": body.get("started_at") or now_iso(),
            "completed_at": (body.get("completed_at") or now_iso()) if status == "completed" else None,
            "output": output, "annotations_count": annotations, "check_suite_id": suite,
            "actions": body.get("actions", []),
        }  # fmt: skip
        self._check_runs[run_id] = run
        return 201, self._check_run_json(run)

    def _check_run(self, request: _Request) -> JsonObj:
        run = self._check_runs.get(int(request.params["id"]))
        if run is None:
            raise _HTTPError(404, "Not Found")
        return run

    def _get_check_run(self, request: _Request) -> tuple[int, Any]:
        return 200, self._check_run_json(self._check_run(request))

    def _patch_check_run(self, request: _Request) -> tuple[int, Any]:
        run = self._check_run(request)
        body = request.body or {}
        if "output" in body:
            output, annotations = self._check_output(body["output"])
            run["output"] = {**run["output"], **output}
            run["annotations_count"] += annotations
        for key in ("name", "details_url", "external_id", "started_at", "actions"):
            if key in body:
                run[key] = body[key]
        if body.get("conclusion"):
            run["conclusion"], run["status"] = body["conclusion"], "completed"
        elif "status" in body:
            run["status"] = body["status"]
        if run["status"] == "completed":
            if not run.get("conclusion"):
                raise _validation_failed(resource="CheckRun", field="conclusion", code="missing_field")
            run["completed_at"] = body.get("completed_at") or run.get("completed_at") or now_iso()
        return 200, self._check_run_json(run)

    def _list_check_runs(self, request: _Request) -> tuple[int, Any]:
        sha = self._commit_or_404(request.params["ref"])
        runs = [r for r in self._check_runs.values() if r["head_sha"] == sha]
        if "check_name" in request.query:
            runs = [r for r in runs if r["name"] == request.query["check_name"]]
        if "status" in request.query:
            runs = [r for r in runs if r["status"] == request.query["status"]]
        if request.query.get("filter", "latest") == "latest":
            latest: dict[str, JsonObj] = {}
            for run in runs:
                latest[run["name"]] = run
            runs = list(latest.values())
        runs.sort(key=lambda r: r["id"], reverse=True)
        return 200, {"total_count": len(runs), "check_runs": [self._check_run_json(r) for r in runs]}


_MINIMAL_REPO_KEYS = frozenset(
    {"id", "node_id", "name", "full_name", "owner", "private", "html_url", "description", "fork", "url",
     "archive_url", "assignees_url", "blobs_url", "branches_url", "collaborators_url", "comments_url", "commits_url",
     "compare_url", "contents_url", "contributors_url", "deployments_url", "downloads_url", "events_url", "forks_url",
     "git_commits_url", "git_refs_url", "git_tags_url", "git_url", "issue_comment_url", "issue_events_url",
     "issues_url", "keys_url", "labels_url", "languages_url", "merges_url", "milestones_url", "notifications_url",
     "pulls_url", "releases_url", "ssh_url", "stargazers_url", "statuses_url", "subscribers_url", "subscription_url",
     "tags_url", "teams_url", "trees_url", "hooks_url"}
)  # fmt: skip


class _Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 keep-alive front of ``FakeGitHub.handle`` (the class attribute ``fake`` is set per server)."""

    fake: FakeGitHub
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are written separately: no 40 ms delayed-ACK stall
    server_version = "FakeGitHub/1.0"

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        status, body, extra = self.fake.respond(self.command, self.path, self.headers, raw)
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status, HTTPStatus(status).phrase)
        if body is not None:
            self.send_header("Content-Type", "application/json; charset=utf-8")
        for name, value in extra.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-GitHub-Media-Type", "github.v3; format=json")
        self.send_header("X-GitHub-Request-Id", uuid.uuid4().hex[:16].upper())
        self.end_headers()
        if data:
            self.wfile.write(data)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("fake GitHub: " + format, *args)
