"""The gateway's own git endpoint, for teams without a forge: the real `git clone` and `git push` against the real
`gateway serve` (a process of its own), which answers through Debian's `git http-backend`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from gateway.composition import create_workspace
from gateway.config import Settings
from gateway.domain.errors import Refused
from gateway.domain.principals import Role
from gateway.domain.proposal import Decision
from gateway.services.admin.bootstrap import bootstrap_simulator
from gateway.services.admin.users import add_principal, disable_principal
from gateway.services.change.proposals import decide, get_proposal
from gateway.services.change.views import view_proposal
from gateway.services.workspace import Workspace

from .conftest import Clone, People, add_people

QUEUE = 'resource "aws_sqs_queue" "refunds" {\n  name = "refund-events"\n  tags = { owner = "payments", ' \
        '"cost-centre" = "cc-42" }\n}\n'
pytestmark = pytest.mark.skipif(not os.access("/usr/lib/git-core/git-http-backend", os.X_OK),
                                reason="git http-backend (Debian's git) is not installed")


@dataclass
class Served:
    ws: Workspace
    people: People
    base: str
    root: Path

    def url(self, name: str | None, token: str | None = None) -> str:
        host = self.base.removeprefix("http://")
        credentials = f"{name}:{token or self.people.tokens[name]}@" if name else ""
        return f"http://{credentials}{host}/git/declarations.git"

    def git(self, *args: str, cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
               "GIT_AUTHOR_NAME": "Alice", "GIT_AUTHOR_EMAIL": "alice@example.com", "GIT_COMMITTER_NAME": "Alice",
               "GIT_COMMITTER_EMAIL": "alice@example.com"}
        result = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"git {' '.join(args)} failed: {result.stderr}")
        return result

    def clone(self, name: str | None, where: str, token: str | None = None) -> Path:
        target = self.root / where
        self.git("clone", "-q", self.url(name, token), str(target))
        return target

    def commit(self, clone: Path, path: str, content: str, message: str) -> str:
        (clone / path).parent.mkdir(parents=True, exist_ok=True)
        (clone / path).write_text(content)
        self.git("add", "-A", cwd=clone)
        self.git("commit", "-q", "-m", message, cwd=clone)
        return self.git("rev-parse", "HEAD", cwd=clone).stdout.strip()

    def in_repo(self, sha: str) -> bool:
        return subprocess.run(["git", "--git-dir", str(self.ws.settings.repo_path), "cat-file", "-e", sha],
                              capture_output=True).returncode == 0

    def events(self, kind: str) -> list:
        with self.ws.store.session(readonly=True) as session:
            return session.audit.events(kind=kind)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    settings = Settings(home=tmp_path / "home", token=None)
    ws = create_workspace(settings)
    bootstrap_simulator(ws)
    people = add_people(ws)
    main = Clone(ws, tmp_path / "admin-clone")  # an admin turns propose_on_push on, on main
    main.write("gateway.yaml", main.read("gateway.yaml") + "\npropose_on_push: true\n")
    main.push("Pushes propose", author="admin")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "OPENAI_"))}
    env["GATEWAY_HOME"] = str(settings.home)
    server = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--port",
                               str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/api/v1/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and server.poll() is None, "gateway serve did not start"
            time.sleep(0.2)
        yield Served(ws, people, base, tmp_path)
    finally:
        server.terminate()
        server.wait(30)
        ws.close()


def wait_for(what: str, probe, timeout: float = 60):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_team_clones_and_pushes_a_branch_with_a_token_and_the_push_opens_its_proposal(served: Served) -> None:
    clone = served.clone("alice", "alice")
    assert (clone / "gateway.yaml").is_file()
    served.git("checkout", "-q", "-b", "feature/refunds", cwd=clone)
    head = served.commit(clone, "stacks/app-staging/queue.tf", QUEUE, "Add a refunds queue")
    pushed = served.git("push", "-q", "origin", "feature/refunds", cwd=clone)
    assert pushed.returncode == 0

    def proposal() -> dict | None:
        with served.ws.store.session(readonly=True) as session:
            pid = session.proposals.open_for_branch("feature/refunds")
            return session.proposals.get(pid) if pid else None
    opened = wait_for("the proposal of the pushed branch", proposal)
    assert (opened.requester.name, opened.head_sha, opened.stacks) == ("alice", head, ("app-staging",))
    [event] = served.events("git.pushed")
    assert event.actor == "alice" and event.payload["after"] == head
    assert event.payload["ref"] == "refs/heads/feature/refunds"

    # a second push re-plans that proposal (a plan job), it opens no other
    second = served.commit(clone, "stacks/app-staging/dlq.tf", QUEUE.replace("refunds", "dlq"), "and a DLQ")
    served.git("push", "-q", "origin", "feature/refunds", cwd=clone)
    wait_for("the re-plan", lambda: (lambda p: p.head_sha == second)(proposal()))
    assert len(served.events("proposal.opened")) == 1

    fetched = served.clone("dana", "dana")  # an auditor reads: clone and fetch
    served.git("fetch", "-q", "origin", cwd=fetched)
    assert served.git("rev-parse", "origin/feature/refunds", cwd=fetched).stdout.strip() == second


def test_nobody_pushes_to_main_or_the_gateways_refs_and_a_refused_push_writes_nothing(served: Served) -> None:
    clone = served.clone("admin", "admin")  # not even an admin
    main_before = served.git("--git-dir", str(served.ws.settings.repo_path), "rev-parse", "main").stdout.strip()
    sneaky = served.commit(clone, "stacks/app-staging/queue.tf", QUEUE, "straight to main")
    refused = served.git("push", "origin", "HEAD:main", cwd=clone, check=False)
    assert refused.returncode != 0
    assert "only the change gateway merges into main" in refused.stderr, refused.stderr
    assert "[remote rejected] HEAD -> main" in refused.stderr
    own = served.git("push", "origin", "HEAD:refs/gateway/wip/x", cwd=clone, check=False)
    assert own.returncode != 0 and "refs/gateway/wip/x is the gateway's own" in own.stderr, own.stderr
    assert served.git("--git-dir", str(served.ws.settings.repo_path), "rev-parse", "main").stdout.strip() \
        == main_before
    assert not served.in_repo(sneaky)  # the quarantined objects went with the refusal
    assert not served.events("git.pushed")


def test_an_unauthenticated_or_disabled_persons_push_is_refused_and_writes_nothing(served: Served) -> None:
    clone = served.clone("alice", "alice")
    served.git("checkout", "-q", "-b", "feature/x", cwd=clone)
    sha = served.commit(clone, "stacks/app-staging/queue.tf", QUEUE, "queue")
    anonymous = served.git("push", served.url(None), "feature/x", cwd=clone, check=False)
    assert anonymous.returncode != 0 and "could not read Username" in anonymous.stderr, anonymous.stderr
    wrong = served.git("push", served.url("alice", "gw_not_a_token"), "feature/x", cwd=clone, check=False)
    assert wrong.returncode != 0 and "Authentication failed" in wrong.stderr, wrong.stderr
    reader = served.git("push", served.url("dana"), "feature/x", cwd=clone, check=False)
    assert reader.returncode != 0 and "403" in reader.stderr, reader.stderr
    forbidden = httpx.get(f"{served.base}/git/declarations.git/info/refs?service=git-receive-pack",
                          auth=("dana", served.people.tokens["dana"]))
    assert forbidden.status_code == 403 and "dana may not push branches" in forbidden.text
    disable_principal(served.ws, served.people.admin, "alice", "left the team")
    disabled = served.git("push", served.url("alice"), "feature/x", cwd=clone, check=False)
    assert disabled.returncode != 0 and "Authentication failed" in disabled.stderr, disabled.stderr
    assert httpx.get(f"{served.base}/git/declarations.git/info/refs?service=git-upload-pack",
                     auth=("alice", served.people.tokens["alice"])).status_code == 401
    assert not served.in_repo(sha)
    assert served.git("--git-dir", str(served.ws.settings.repo_path), "branch", "--list", "feature/x").stdout == ""
    assert not served.events("git.pushed")


def test_the_branch_of_an_open_proposal_is_not_deleted(served: Served) -> None:
    clone = served.clone("alice", "alice")
    served.git("checkout", "-q", "-b", "feature/keep", cwd=clone)
    served.commit(clone, "stacks/app-staging/queue.tf", QUEUE, "queue")
    served.git("push", "-q", "origin", "feature/keep", cwd=clone)
    wait_for("the proposal", lambda: served.events("proposal.opened"))
    deleted = served.git("push", "origin", "--delete", "feature/keep", cwd=clone, check=False)
    assert deleted.returncode != 0 and "an open proposal stands on it" in deleted.stderr, deleted.stderr


def test_whoever_pushed_commits_of_a_change_through_the_endpoint_cannot_approve_it(served: Served) -> None:
    paul, token = add_principal(served.ws, served.people.admin, "paul", frozenset({Role.REQUESTER, Role.APPROVER}),
                                frozenset({"platform"}))
    clone = served.clone("alice", "alice")
    served.git("checkout", "-q", "-b", "feature/refunds", cwd=clone)
    served.commit(clone, "stacks/app-staging/queue.tf", QUEUE, "Add a refunds queue")
    served.git("push", "-q", "origin", "feature/refunds", cwd=clone)

    def opened() -> int | None:
        with served.ws.store.session(readonly=True) as session:
            return session.proposals.open_for_branch("feature/refunds")
    pid = wait_for("the proposal of the pushed branch", opened)

    helping = served.clone("paul", "paul", token)  # an approver who may also request adds a commit to alice's change
    served.git("checkout", "-q", "feature/refunds", cwd=helping)
    his = served.commit(helping, "stacks/app-staging/dlq.tf", QUEUE.replace("refunds", "dlq"), "and a DLQ")
    served.git("push", "-q", "origin", "feature/refunds", cwd=helping)
    wait_for("the re-plan of paul's commit", lambda: get_proposal(served.ws, pid).head_sha == his)

    page = view_proposal(served.ws, paul, pid)  # his page offers him no decision, and bob's does
    assert (page.can_approve, page.can_reject) == (False, False)
    assert view_proposal(served.ws, served.people.bob, pid).can_approve
    with pytest.raises(Refused, match=f"paul pushed commit {his[:12]} of this change through the gateway's git "
                                      "endpoint and cannot approve or reject it"):
        decide(served.ws, paul, pid, Decision.APPROVE, "looks good")
    [refused] = served.events("approve.refused")
    assert refused.actor == "paul" and any("pushed commit" in r for r in refused.payload["reasons"])
    approved = decide(served.ws, served.people.bob, pid, Decision.APPROVE, "")  # who only reviewed still may
    assert [d.principal.name for d in approved.current_approvals] == ["bob"]
