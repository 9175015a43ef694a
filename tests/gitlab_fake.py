"""A fake GitLab for tests: a stateful HTTP server on 127.0.0.1 that python-gitlab talks to through its URL.

    with FakeGitLab(tmp_path) as gl:
        client = gitlab.Gitlab(gl.url, private_token=gl.token)
        ...

State lives in memory (users, groups and their members, merge requests, notes, approvals, commit statuses) and in
a real bare git repository (``git_url``), "GitLab's git" for the one project ``acme/infra``: branches and real
merge commits (``git merge-tree``).

Fidelity rules, in the style of the fake GitHub:
- every JSON object answered is checked against GitLab's documented example of its kind
  (tests/fixtures/gitlab/api/): each documented field present, of the documented JSON type; a mismatch goes to
  ``schema_errors``;
- request bodies of creations are checked against python-gitlab's own managers (their required and optional
  attributes): a request python-gitlab would not send, or a field it does not know, goes to ``request_errors``
  and gets GitLab's 400;
- a route the fake does not serve gets 404 and is recorded in ``unhandled``; no PRIVATE-TOKEN, or an unknown one:
  401;
- GitLab's behaviours the gateway relies on: a merge with ``sha`` that is not the head is 409 ("SHA does not
  match HEAD of source branch"); approving with ``sha`` likewise; a commit status set to the state it has is 400
  (GitLab's state machine refuses the transition); group membership includes members of parent groups;
- webhook payloads are built from the live state in the shape of GitLab's documented examples
  (tests/fixtures/gitlab/webhooks/) and checked against them before they are returned.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from gitlab.v4.objects.commits import ProjectCommitStatusManager
from gitlab.v4.objects.merge_requests import ProjectMergeRequestManager
from gitlab.v4.objects.notes import ProjectMergeRequestNoteManager

from tests.github_fake import ZERO_SHA, _Git

log = logging.getLogger(__name__)

JsonObj = dict[str, Any]
FIXTURES = Path(__file__).parent / "fixtures" / "gitlab"
STATUS_STATES = ("pending", "running", "success", "failed", "canceled", "skipped")
TRANSITION = {"pending": "enqueue", "running": "run", "success": "succeed", "failed": "drop", "canceled": "cancel",
              "skipped": "skip"}
# python-gitlab's managers: what it sends when creating each kind (checked on every POST the fake serves)
CREATE_ATTRS = {"merge_request": ProjectMergeRequestManager._create_attrs,
                "note": ProjectMergeRequestNoteManager._create_attrs,
                "commit_status": ProjectCommitStatusManager._create_attrs}


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def documented(kind: str) -> JsonObj:
    """GitLab's documented example of an object (api/) or a webhook payload (webhooks/)."""
    return json.loads((FIXTURES / f"{kind}.json").read_text())


def shape_errors(example: Any, value: Any, where: str = "") -> list[str]:
    """Where `value` lacks a field the documented `example` has, or has it with another JSON type (null in the
    example allows anything; lists are checked by their first element)."""
    if example is None:
        return []
    if isinstance(example, bool) or isinstance(value, bool):
        return [] if isinstance(example, bool) == isinstance(value, bool) or value is None else \
            [f"{where or '(root)'}: {type(value).__name__} where GitLab documents {type(example).__name__}"]
    if isinstance(example, dict):
        if not isinstance(value, dict):
            return [f"{where or '(root)'}: {type(value).__name__} where GitLab documents an object"]
        errors = [f"{where}.{key}".lstrip(".") + ": missing" for key in example if key not in value]
        for key, inner in example.items():
            if key in value:
                errors += shape_errors(inner, value[key], f"{where}.{key}".lstrip("."))
        return errors
    if isinstance(example, list):
        if not isinstance(value, list):
            return [f"{where}: {type(value).__name__} where GitLab documents a list"]
        return shape_errors(example[0], value[0], f"{where}[0]") if example and value else []
    if value is None:
        return []
    numbers = (int, float)
    if isinstance(example, numbers) and isinstance(value, numbers):
        return []
    if type(example) is not type(value):
        return [f"{where}: {type(value).__name__} where GitLab documents {type(example).__name__}"]
    return []


class _HTTPError(Exception):
    def __init__(self, status: int, message: Any):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class _User:
    id: int
    username: str
    name: str
    bot: bool = False
    state: str = "active"


@dataclass
class _Group:
    id: int
    path: str
    members: dict[int, str] = field(default_factory=dict)  # user id -> membership_state (active, awaiting)


@dataclass
class _MergeRequest:
    iid: int
    id: int
    source_branch: str
    target_branch: str
    title: str
    description: str
    author_id: int
    source_project_id: int
    state: str = "opened"
    approvals: list[int] = field(default_factory=list)
    created_at: str = field(default_factory=now_iso)
    head_at_close: str | None = None
    merge_commit_sha: str | None = None
    merged_by: int | None = None


@dataclass
class _Note:
    id: int
    iid: int
    body: str
    author_id: int
    system: bool = False
    created_at: str = field(default_factory=now_iso)
    updated_at: str = field(default_factory=now_iso)


@dataclass
class _Fault:
    status: int
    times: int | None
    method: str | None
    path: re.Pattern[str] | None

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and (self.path is None or bool(self.path.search(path)))


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    params: dict[str, str]
    user: _User


class FakeGitLab:
    """One group ``acme`` with one project ``acme/infra``, served over HTTP at ``url`` (the API at ``url``/api/v4)."""

    def __init__(self, root: Path, namespace: str = "acme", name: str = "infra", *,
                 bot_username: str = "project_7_bot_4f2a") -> None:
        self.root = Path(root)
        self.namespace = namespace
        self.full_name = f"{namespace}/{name}"
        self.project_id = 7
        self.git_url = str(self.root / "gitlab.git")
        self.requests: list[tuple[str, str, Any]] = []
        self.schema_errors: list[str] = []
        self.request_errors: list[str] = []
        self.unhandled: list[str] = []
        self.faults_served: list[tuple[str, str, int]] = []
        self._faults: list[_Fault] = []
        self._lock = threading.RLock()
        self._ids = itertools.count(101)
        self._iids = itertools.count(1)
        self._git = _Git(Path(self.git_url))
        self._git.init("main")
        self._users: dict[int, _User] = {}
        self._tokens: dict[str, int] = {}
        self._groups: dict[str, _Group] = {}
        self._mrs: dict[int, _MergeRequest] = {}
        self._notes: dict[int, _Note] = {}
        self._statuses: dict[str, list[JsonObj]] = {}
        self.token = "glpat-gateway-test-token"
        self.bot_id = self.add_user(bot_username, bot=True)  # the gateway's own account: a project token's bot
        self._tokens[self.token] = self.bot_id
        self._routes = self._build_routes()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), type("_Handler", (_Handler,), {"fake": self}))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread: threading.Thread | None = None

    # --- lifecycle ------------------------------------------------------------------------------------

    def __enter__(self) -> FakeGitLab:
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        name="fake-gitlab", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server.server_close()

    def fail_requests(self, status: int = 500, *, times: int | None = None, method: str | None = None,
                      path: str | None = None) -> None:
        """GitLab having a bad moment: answer `status` to matching API requests (all until `recover`)."""
        with self._lock:
            self._faults.append(_Fault(status, times, method, re.compile(path) if path else None))

    def recover(self) -> None:
        with self._lock:
            self._faults.clear()

    # --- people and groups ----------------------------------------------------------------------------

    def add_user(self, username: str, *, bot: bool = False) -> int:
        with self._lock:
            user = _User(next(self._ids), username, username.replace("_", " ").title(), bot)
            self._users[user.id] = user
            return user.id

    def user(self, username: str) -> _User:
        return next(u for u in self._users.values() if u.username == username)

    def add_group(self, path: str, members: Iterable[str] = ()) -> int:
        with self._lock:
            group = _Group(next(self._ids), path)
            self._groups[path] = group
            for username in members:
                group.members[self.user(username).id] = "active"
            return group.id

    def add_member(self, path: str, username: str, state: str = "active") -> None:
        with self._lock:
            self._groups[path].members[self.user(username).id] = state

    def remove_member(self, path: str, username: str) -> None:
        with self._lock:
            self._groups[path].members.pop(self.user(username).id, None)

    # --- git --------------------------------------------------------------------------------------------

    def push_commit(self, branch: str, files: Mapping[str, str | None], message: str, author: str = "someone") -> str:
        """Commit `files` on top of `branch` (created from main if missing), as a person pushing; returns the sha."""
        with self._lock:
            parent = self._git.rev(f"refs/heads/{branch}")
            start = parent or self._git.rev("refs/heads/main")
            sha = self._git.commit(start, files, message, (author, f"{author}@example.com"))
            self._git.update_ref(f"refs/heads/{branch}", sha, parent or ZERO_SHA)
            return sha

    def branch_sha(self, branch: str) -> str | None:
        with self._lock:
            return self._git.rev(f"refs/heads/{branch}")

    # --- merge requests, approvals, notes ---------------------------------------------------------------

    def open_merge_request(self, branch: str, title: str, description: str, author: str, *,
                           target: str = "main", fork: bool = False) -> int:
        with self._lock:
            return self._create_mr(branch, target, title, description, self.user(author).id, fork).iid

    def _create_mr(self, branch: str, target: str, title: str, description: str, author_id: int,
                   fork: bool = False) -> _MergeRequest:
        if self._git.rev(f"refs/heads/{branch}") is None:
            raise _HTTPError(400, {"message": ["Source branch is invalid"]})
        if any(m.state == "opened" and m.source_branch == branch and m.target_branch == target
               for m in self._mrs.values()):
            raise _HTTPError(409, {"message": ["Another open merge request already exists for this source branch"]})
        mr = _MergeRequest(next(self._iids), next(self._ids), branch, target, title, description, author_id,
                           next(self._ids) if fork else self.project_id)
        self._mrs[mr.iid] = mr
        return mr

    def merge_request(self, iid: int) -> JsonObj:
        with self._lock:
            return self._mr_json(self._mrs[iid])

    def merge_requests(self) -> list[JsonObj]:
        with self._lock:
            return [self._mr_json(m) for m in self._mrs.values()]

    def head(self, iid: int) -> str:
        with self._lock:
            mr = self._mrs[iid]
            return mr.head_at_close or self._git.rev(f"refs/heads/{mr.source_branch}") or ZERO_SHA

    def approve(self, iid: int, username: str) -> None:
        """A person clicks Approve (GitLab records it whatever the gateway later says)."""
        with self._lock:
            user_id = self.user(username).id
            if user_id not in self._mrs[iid].approvals:
                self._mrs[iid].approvals.append(user_id)

    def unapprove(self, iid: int, username: str) -> None:
        with self._lock:
            user_id = self.user(username).id
            if user_id in self._mrs[iid].approvals:
                self._mrs[iid].approvals.remove(user_id)

    def add_note(self, iid: int, username: str, body: str) -> JsonObj:
        with self._lock:
            note = _Note(next(self._ids), iid, body, self.user(username).id)
            self._notes[note.id] = note
            return self._note_json(note)

    def edit_note(self, note_id: int, body: str) -> None:
        with self._lock:
            self._notes[note_id].body = body

    def notes(self, iid: int) -> list[JsonObj]:
        with self._lock:
            return [self._note_json(n) for n in self._notes.values() if n.iid == iid]

    def close_merge_request(self, iid: int) -> None:
        with self._lock:
            mr = self._mrs[iid]
            mr.head_at_close, mr.state = self.head(iid), "closed"

    def statuses(self, sha: str) -> dict[str, str]:
        """The latest state of each commit status on `sha`."""
        with self._lock:
            return {s["name"]: s["status"] for s in self._statuses.get(sha, [])}

    # --- webhook payloads ---------------------------------------------------------------------------------

    def merge_request_event(self, iid: int, action: str, by: str, *, oldrev: str | None = None) -> JsonObj:
        """A `Merge Request Hook` payload as GitLab sends it now, in its documented shape."""
        with self._lock:
            mr, user = self._mrs[iid], self.user(by)
            payload = documented("webhooks/merge_request")
            payload["user"] = self._hook_user(user)
            payload["project"] = self._hook_project()
            attrs = payload["object_attributes"]
            head = self.head(iid)
            attrs.update({"id": mr.id, "iid": mr.iid, "target_branch": mr.target_branch,
                          "source_branch": mr.source_branch, "source_project_id": mr.source_project_id,
                          "target_project_id": self.project_id, "author_id": mr.author_id, "title": mr.title,
                          "description": mr.description, "state": mr.state, "action": action,
                          "url": f"{self.url}/{self.full_name}/-/merge_requests/{mr.iid}",
                          "source": self._hook_project(), "target": self._hook_project()})
            attrs["last_commit"].update({"id": head, "url": f"{self.url}/{self.full_name}/-/commit/{head}"})
            if oldrev is not None:
                attrs["oldrev"] = oldrev
            if mr.merge_commit_sha:
                attrs["merge_commit_sha"] = mr.merge_commit_sha
            payload["changes"] = {}
            return self._checked("webhooks/merge_request", payload)

    def note_event(self, note: JsonObj) -> JsonObj:
        """A `Note Hook` payload for a note on a merge request."""
        with self._lock:
            stored = self._notes[note["id"]]
            mr = self._mrs[stored.iid]
            payload = documented("webhooks/note_merge_request")
            payload["user"] = self._hook_user(self._users[stored.author_id])
            payload["project_id"] = self.project_id
            payload["project"] = self._hook_project()
            payload["object_attributes"].update({
                "id": note["id"], "note": note["body"], "author_id": stored.author_id, "project_id": self.project_id,
                "noteable_id": mr.id, "system": stored.system, "action": "create",
                "url": f"{self.url}/{self.full_name}/-/merge_requests/{mr.iid}#note_{note['id']}"})
            payload["merge_request"].update({
                "id": mr.id, "iid": mr.iid, "source_branch": mr.source_branch, "target_branch": mr.target_branch,
                "source_project_id": mr.source_project_id, "target_project_id": self.project_id,
                "author_id": mr.author_id, "title": mr.title, "state": mr.state, "description": mr.description,
                "source": self._hook_project(), "target": self._hook_project()})
            payload["merge_request"]["last_commit"]["id"] = self.head(mr.iid)
            return self._checked("webhooks/note_merge_request", payload)

    def push_event(self, branch: str, before: str, after: str, by: str) -> JsonObj:
        with self._lock:
            user = self.user(by)
            payload = documented("webhooks/push")
            payload.update({"before": before, "after": after, "ref": f"refs/heads/{branch}", "checkout_sha": after,
                            "user_id": user.id, "user_name": user.name, "user_username": user.username,
                            "project_id": self.project_id, "project": self._hook_project(), "commits": [],
                            "total_commits_count": 0})
            return self._checked("webhooks/push", payload)

    def _checked(self, kind: str, payload: JsonObj) -> JsonObj:
        example = documented(kind)
        if "changes" in example:  # which fields changed depends on the action (GitLab: "can be empty")
            example["changes"] = {}
        errors = shape_errors(example, payload)
        if errors:
            self.schema_errors += [f"{kind}: {e}" for e in errors]
        return payload

    def _hook_user(self, user: _User) -> JsonObj:
        return {"id": user.id, "name": user.name, "username": user.username,
                "avatar_url": f"{self.url}/uploads/-/system/user/avatar/{user.id}/avatar.png",
                "email": "[REDACTED]"}

    def _hook_project(self) -> JsonObj:
        project = documented("webhooks/merge_request")["project"]
        project.update({"id": self.project_id, "name": "infra", "path_with_namespace": self.full_name,
                        "web_url": f"{self.url}/{self.full_name}", "default_branch": "main",
                        "git_http_url": f"{self.url}/{self.full_name}.git", "namespace": self.namespace,
                        "http_url": f"{self.url}/{self.full_name}.git", "homepage": f"{self.url}/{self.full_name}",
                        "url": f"{self.url}/{self.full_name}.git"})
        return project

    # --- JSON of the API ------------------------------------------------------------------------------------

    def _user_json(self, user: _User) -> JsonObj:
        return {"id": user.id, "username": user.username, "name": user.name, "state": user.state, "locked": False,
                "avatar_url": f"{self.url}/uploads/-/system/user/avatar/{user.id}/avatar.png",
                "web_url": f"{self.url}/{user.username}", "created_at": "2024-01-01T00:00:00Z", "bio": "",
                "bot": user.bot, "location": None, "public_email": None}

    def _author_json(self, user_id: int) -> JsonObj:
        user = self._users[user_id]
        return {"id": user.id, "username": user.username, "name": user.name, "state": user.state,
                "avatar_url": f"{self.url}/uploads/-/system/user/avatar/{user.id}/avatar.png",
                "web_url": f"{self.url}/{user.username}", "email": "[REDACTED]", "created_at": "2024-01-01T00:00:00Z"}

    def _mr_json(self, mr: _MergeRequest) -> JsonObj:
        head = self.head(mr.iid)
        return {"id": mr.id, "iid": mr.iid, "project_id": self.project_id, "title": mr.title,
                "description": mr.description, "state": mr.state, "created_at": mr.created_at,
                "updated_at": now_iso(), "target_branch": mr.target_branch, "source_branch": mr.source_branch,
                "upvotes": 0, "downvotes": 0, "author": self._author_json(mr.author_id), "assignee": None,
                "source_project_id": mr.source_project_id, "target_project_id": self.project_id, "labels": [],
                "work_in_progress": False, "draft": False, "milestone": None, "merge_when_pipeline_succeeds": False,
                "merge_status": "can_be_merged", "detailed_merge_status": "mergeable", "sha": head,
                "merge_commit_sha": mr.merge_commit_sha, "squash_commit_sha": None, "user_notes_count": 0,
                "discussion_locked": None, "should_remove_source_branch": None, "force_remove_source_branch": False,
                "web_url": f"{self.url}/{self.full_name}/-/merge_requests/{mr.iid}",
                "merged_by": self._author_json(mr.merged_by) if mr.merged_by else None,
                "time_stats": {"time_estimate": 0, "total_time_spent": 0, "human_time_estimate": None,
                               "human_total_time_spent": None}}

    def _note_json(self, note: _Note) -> JsonObj:
        return {"id": note.id, "body": note.body, "author": self._author_json(note.author_id),
                "created_at": note.created_at, "updated_at": note.updated_at, "system": note.system,
                "noteable_id": self._mrs[note.iid].id, "noteable_type": "MergeRequest",
                "project_id": self.project_id, "noteable_iid": note.iid, "resolvable": False, "confidential": False,
                "internal": False, "imported": False, "imported_from": "none"}

    def _approvals_json(self, mr: _MergeRequest) -> JsonObj:
        return {"id": mr.id, "iid": mr.iid, "project_id": self.project_id, "title": mr.title,
                "description": mr.description, "state": mr.state, "created_at": mr.created_at,
                "updated_at": now_iso(), "merge_status": "can_be_merged", "approvals_required": 0,
                "approvals_left": 0, "approved": bool(mr.approvals),
                "approved_by": [{"user": {k: v for k, v in self._author_json(u).items()
                                          if k not in ("email", "created_at")}} for u in mr.approvals]}

    # --- routes -----------------------------------------------------------------------------------------

    def _build_routes(self) -> list[tuple[str, re.Pattern[str], str | None, Callable[[Request], tuple[int, Any]]]]:
        project = r"/api/v4/projects/(?P<project>[^/]+)"
        mr = project + r"/merge_requests/(?P<iid>\d+)"
        table: list[tuple[str, str, str | None, Callable[[Request], tuple[int, Any]]]] = [
            ("GET", r"/api/v4/user", "user", self._get_me),
            ("GET", r"/api/v4/users/(?P<id>\d+)", "user", self._get_user),
            ("GET", r"/api/v4/users", None, self._list_users),
            ("GET", r"/api/v4/groups/(?P<group>[^/]+)/members/all/(?P<id>\d+)", "member", self._get_member),
            ("GET", project + r"/merge_requests", None, self._list_mrs),
            ("POST", project + r"/merge_requests", "merge_request", self._post_mr),
            ("GET", mr, "merge_request", self._get_mr),
            ("PUT", mr + r"/merge", "merge_request", self._merge),
            ("GET", mr + r"/approvals", "approvals", self._get_approvals),
            ("POST", mr + r"/approve", "approvals", self._post_approve),
            ("GET", mr + r"/notes", None, self._list_notes),
            ("POST", mr + r"/notes", "note", self._post_note),
            ("GET", mr + r"/notes/(?P<note>\d+)", "note", self._get_note),
            ("PUT", mr + r"/notes/(?P<note>\d+)", "note", self._put_note),
            ("GET", project + r"/repository/commits/(?P<sha>[0-9a-f]{40})/statuses", None, self._list_statuses),
            ("POST", project + r"/statuses/(?P<sha>[0-9a-f]{40})", "commit_status", self._post_status),
        ]
        return [(method, re.compile(pattern), kind, handler) for method, pattern, kind, handler in table]

    def respond(self, method: str, raw_path: str, headers: Mapping[str, str], raw_body: bytes) -> tuple[int, Any]:
        split = urlsplit(raw_path)
        path = "/".join(unquote(part).replace("/", "%2F") for part in split.path.split("/"))  # keep %2F in ids
        query = {k: v[0] for k, v in parse_qs(split.query).items()}
        try:
            body = json.loads(raw_body) if raw_body else {}
        except ValueError:
            body = {}
        with self._lock:
            self.requests.append((method, path, {**query, **body} if isinstance(body, dict) else body))
            fault = next((f for f in self._faults if f.matches(method, path)), None)
            if fault is not None:
                if fault.times is not None:
                    fault.times -= 1
                    if fault.times <= 0:
                        self._faults.remove(fault)
                self.faults_served.append((method, path, fault.status))
                return fault.status, {"message": f"{fault.status} {HTTPStatus(fault.status).phrase}"}
            user_id = self._tokens.get(headers.get("PRIVATE-TOKEN") or "")
            if user_id is None:
                return 401, {"message": "401 Unauthorized"}
            for route_method, pattern, kind, handler in self._routes:
                match = pattern.fullmatch(path)
                if match and route_method == method:
                    params = {k: v.replace("%2F", "/") for k, v in match.groupdict().items()}
                    try:
                        status, answer = handler(Request(method, path, query, body, params, self._users[user_id]))
                    except _HTTPError as error:
                        return error.status, {"message": error.message}
                    except Exception as error:  # a bug in the fake: answer 500, and fail the test
                        log.exception("fake GitLab failed on %s %s", method, raw_path)
                        self.unhandled.append(f"{method} {raw_path}: {error!r}")
                        return 500, {"message": repr(error)}
                    self._check_answer(kind, answer, f"{method} {path}")
                    return status, answer
            self.unhandled.append(f"{method} {raw_path}")
            return 404, {"message": "404 Not Found"}

    def _check_answer(self, kind: str | None, answer: Any, where: str) -> None:
        objects = answer if isinstance(answer, list) else [answer]
        route_kind = kind or {"/notes": "note", "/statuses": "commit_status", "/merge_requests": "merge_request",
                              "/users": "user"}.get(next((s for s in ("/notes", "/statuses", "/merge_requests",
                                                                       "/users") if where.endswith(s)), ""))
        if route_kind is None:
            return
        for obj in objects:
            errors = shape_errors(documented(f"api/{route_kind}"), obj)
            self.schema_errors += [f"{where}: {e}" for e in errors]

    def _check_create(self, kind: str, body: Mapping[str, Any]) -> None:
        attrs = CREATE_ATTRS[kind]
        missing = [a for a in attrs.required if a not in body]
        unknown = [k for k in body if k not in attrs.required and k not in attrs.optional]
        if missing or unknown:
            error = f"{kind}: python-gitlab would not send this (missing {missing}, unknown {unknown})"
            self.request_errors.append(error)
            raise _HTTPError(400, error)

    def _project(self, request: Request) -> None:
        if request.params["project"] not in (self.full_name, str(self.project_id)):
            raise _HTTPError(404, "404 Project Not Found")

    def _mr(self, request: Request) -> _MergeRequest:
        self._project(request)
        mr = self._mrs.get(int(request.params["iid"]))
        if mr is None:
            raise _HTTPError(404, "404 Not found")
        return mr

    # --- handlers -----------------------------------------------------------------------------------------

    def _get_me(self, request: Request) -> tuple[int, Any]:
        return 200, self._user_json(request.user)

    def _get_user(self, request: Request) -> tuple[int, Any]:
        user = self._users.get(int(request.params["id"]))
        if user is None:
            raise _HTTPError(404, "404 User Not Found")
        return 200, self._user_json(user)

    def _list_users(self, request: Request) -> tuple[int, Any]:
        wanted = request.query.get("username")
        return 200, [self._user_json(u) for u in self._users.values() if wanted in (None, u.username)]

    def _get_member(self, request: Request) -> tuple[int, Any]:
        path, user_id = request.params["group"], int(request.params["id"])
        # members of this group and of each parent group (`members/all` includes inherited members)
        parents = [p for p in self._groups if path == p or path.startswith(p + "/")]
        state = next((self._groups[p].members[user_id] for p in parents if user_id in self._groups[p].members), None)
        if path not in self._groups or state is None:
            raise _HTTPError(404, "404 Not found")
        user = self._users[user_id]
        return 200, {**{k: v for k, v in self._user_json(user).items() if k in documented("api/member")},
                     "access_level": 30, "email": "[REDACTED]", "expires_at": None, "group_saml_identity": None,
                     "membership_state": state}

    def _list_mrs(self, request: Request) -> tuple[int, Any]:
        self._project(request)
        q = request.query
        state = {"opened": "opened", "closed": "closed", "merged": "merged"}.get(q.get("state", ""))
        return 200, [self._mr_json(m) for m in self._mrs.values()
                     if (state is None or m.state == state) and q.get("source_branch") in (None, m.source_branch)
                     and q.get("target_branch") in (None, m.target_branch)]

    def _post_mr(self, request: Request) -> tuple[int, Any]:
        self._project(request)
        self._check_create("merge_request", request.body)
        b = request.body
        mr = self._create_mr(b["source_branch"], b["target_branch"], b["title"], b.get("description") or "",
                             request.user.id)
        return 201, self._mr_json(mr)

    def _get_mr(self, request: Request) -> tuple[int, Any]:
        return 200, self._mr_json(self._mr(request))

    def _merge(self, request: Request) -> tuple[int, Any]:
        mr = self._mr(request)
        params = {**request.query, **request.body}  # GitLab reads parameters from the query string or the body
        if mr.state != "opened":
            raise _HTTPError(405, "405 Method Not Allowed")
        head = self.head(mr.iid)
        if params.get("sha") and params["sha"] != head:
            raise _HTTPError(409, "SHA does not match HEAD of source branch: " + head)
        main = self._git.rev(f"refs/heads/{mr.target_branch}")
        assert main is not None
        tree = self._git.merge_tree(main, head)
        if tree is None:
            raise _HTTPError(422, "Branch cannot be merged")
        message = params.get("merge_commit_message") or f"Merge branch '{mr.source_branch}' into '{mr.target_branch}'"
        merge = self._git.commit_tree(tree, [main, head], message, (request.user.username, "gitlab@example.com"))
        self._git.update_ref(f"refs/heads/{mr.target_branch}", merge, main)
        mr.state, mr.merge_commit_sha, mr.head_at_close, mr.merged_by = "merged", merge, head, request.user.id
        return 200, self._mr_json(mr)

    def _get_approvals(self, request: Request) -> tuple[int, Any]:
        return 200, self._approvals_json(self._mr(request))

    def _post_approve(self, request: Request) -> tuple[int, Any]:
        mr = self._mr(request)
        if request.body.get("sha") and request.body["sha"] != self.head(mr.iid):
            raise _HTTPError(409, "SHA does not match HEAD of source branch")
        if request.user.id in mr.approvals:
            raise _HTTPError(401, "401 Unauthorized")  # GitLab answers so when you approved already
        mr.approvals.append(request.user.id)
        return 201, self._approvals_json(mr)

    def _list_notes(self, request: Request) -> tuple[int, Any]:
        mr = self._mr(request)
        return 200, [self._note_json(n) for n in self._notes.values() if n.iid == mr.iid]

    def _post_note(self, request: Request) -> tuple[int, Any]:
        mr = self._mr(request)
        self._check_create("note", request.body)
        if len(request.body["body"]) > 1_000_000:
            raise _HTTPError(400, {"message": {"note": ["is too long (maximum is 1000000 characters)"]}})
        note = _Note(next(self._ids), mr.iid, request.body["body"], request.user.id)
        self._notes[note.id] = note
        return 201, self._note_json(note)

    def _note(self, request: Request) -> _Note:
        mr = self._mr(request)
        note = self._notes.get(int(request.params["note"]))
        if note is None or note.iid != mr.iid:
            raise _HTTPError(404, "404 Note Not Found")
        return note

    def _get_note(self, request: Request) -> tuple[int, Any]:
        return 200, self._note_json(self._note(request))

    def _put_note(self, request: Request) -> tuple[int, Any]:
        note = self._note(request)
        if note.author_id != request.user.id:
            raise _HTTPError(403, "403 Forbidden")
        note.body, note.updated_at = str(request.body.get("body", note.body)), now_iso()
        return 200, self._note_json(note)

    def _list_statuses(self, request: Request) -> tuple[int, Any]:
        self._project(request)
        return 200, list(reversed(self._statuses.get(request.params["sha"], [])))

    def _post_status(self, request: Request) -> tuple[int, Any]:
        self._project(request)
        self._check_create("commit_status", request.body)
        sha, b = request.params["sha"], request.body
        if self._git.rev(sha) is None:
            raise _HTTPError(404, "404 Commit Not Found")
        if b["state"] not in STATUS_STATES:
            raise _HTTPError(400, "state does not have a valid value")
        name = b.get("name") or b.get("context") or "default"
        if len(b.get("description") or "") > 255:
            raise _HTTPError(400, {"message": {"description": ["is too long (maximum is 255 characters)"]}})
        statuses = self._statuses.setdefault(sha, [])
        current = next((s for s in statuses if s["name"] == name), None)
        if current is not None and current["status"] == b["state"]:  # GitLab's state machine: no such transition
            raise _HTTPError(400, f"Cannot transition status via :{TRANSITION[b['state']]} from :{b['state']} "
                                  f"(Reason(s): Status cannot transition via \"{TRANSITION[b['state']]}\")")
        status = {"id": next(self._ids), "sha": sha, "ref": None, "status": b["state"], "name": name,
                  "target_url": b.get("target_url"), "description": b.get("description"),
                  "created_at": now_iso(), "started_at": None, "finished_at": now_iso(), "allow_failure": False,
                  "coverage": None, "author": self._author_json(request.user.id)}
        if current is not None:
            statuses.remove(current)
        statuses.append(status)
        return 201, status

    # --- deliveries ---------------------------------------------------------------------------------------

    @staticmethod
    def delivery_headers(event: str, token: str | None, event_uuid: str | None = None,
                         idempotency_key: str | None = None) -> dict[str, str]:
        """The headers GitLab sends with a webhook (its "Delivery headers")."""
        headers = {"Content-Type": "application/json", "User-Agent": "GitLab/17.5.0", "X-Gitlab-Event": event,
                   "X-Gitlab-Instance": "https://gitlab.example.com", "X-Gitlab-Webhook-UUID": str(uuid.uuid4()),
                   "X-Gitlab-Event-UUID": event_uuid or str(uuid.uuid4()),
                   "Idempotency-Key": idempotency_key or str(uuid.uuid4())}
        if token is not None:
            headers["X-Gitlab-Token"] = token
        return headers


class _Handler(BaseHTTPRequestHandler):
    fake: FakeGitLab
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        status, body = self.fake.respond(self.command, self.path, self.headers, raw)
        data = json.dumps(body).encode()
        self.send_response(status, HTTPStatus(status).phrase)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("fake GitLab: " + format, *args)
