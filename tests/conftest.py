"""Shared test material: real git repos in tmp_path, real SQLite files and a real PostgreSQL; and the same sample
repo and people in memory (tests/fakes.py) for the rules that need neither git nor a database."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import git
import pytest
from sqlalchemy import create_engine, text

from gateway.adapters.git.repo import committer_env
from gateway.composition import create_workspace
from gateway.config import Settings
from gateway.domain.principals import Principal, PrincipalKind, Role
from gateway.services.admin.bootstrap import bootstrap_simulator
from gateway.services.admin.users import add_principal
from gateway.services.workspace import Workspace

from .fakes import FakeClone, People, sample_people, sandbox_workspace

FIXTURES = Path(__file__).parent / "fixtures"
PG_URL = os.environ.get("GATEWAY_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def _postgres_reachable() -> bool:
    try:
        engine = create_engine(PG_URL)
        with engine.connect() as conn:
            conn.execute(text("select 1"))
        engine.dispose()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def postgres_admin_url() -> str:
    if not _postgres_reachable():
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL is not reachable at {PG_URL}; CI must run the PostgreSQL tests")
        pytest.skip("PostgreSQL is not reachable at 127.0.0.1:5432")
    return PG_URL


@pytest.fixture
def postgres_url(postgres_admin_url: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    name = f"gw_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(postgres_admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield postgres_admin_url.rsplit("/", 1)[0] + f"/{name}"
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'gateway.db'}"
    return str(request.getfixturevalue("postgres_url"))


TERRAFORM = Path(__file__).resolve().parent.parent / ".tools" / "terraform"  # what `make terraform` installs


@pytest.fixture
def tf_workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Workspace]:
    """A workspace of the Terraform sample on SQLite, run by the real Terraform (modules may override it)."""
    if not (TERRAFORM / "bin" / "terraform").exists():
        if os.environ.get("CI"):
            pytest.fail("Terraform is not installed: .ci/run must run `make terraform` first")
        pytest.skip("Terraform is not installed here: run `make terraform` to run the contract tests")
    monkeypatch.delenv("SIM_PROVIDER_DIR", raising=False)
    ws = create_workspace(Settings(home=tmp_path / "home", lock_wait_seconds=5), sample="terraform")
    bootstrap_simulator(ws)
    yield ws
    ws.close()


def make_workspace(home: Path, database_url: str | None = None) -> Workspace:
    ws = create_workspace(Settings(home=home, database_url=database_url, token=None, lock_wait_seconds=2))
    bootstrap_simulator(ws)
    return ws


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[Workspace]:
    """A workspace on SQLite with the sample repo, its stacks applied to the simulator."""
    ws = make_workspace(tmp_path / "home")
    yield ws
    ws.close()


@pytest.fixture
def pg_workspace(tmp_path: Path, postgres_url: str) -> Iterator[Workspace]:
    """A workspace on PostgreSQL with the sample repo, its stacks applied to the simulator."""
    ws = make_workspace(tmp_path / "home", postgres_url)
    yield ws
    ws.close()


@pytest.fixture
def any_workspace(tmp_path: Path, database_url: str) -> Iterator[Workspace]:
    """The same workspace, once on SQLite and once on PostgreSQL."""
    ws = make_workspace(tmp_path / "home", database_url)
    yield ws
    ws.close()


def add_people(ws: Workspace) -> People:
    tokens = {}

    def add(name: str, roles: set[Role], groups: frozenset[str] = frozenset(), kind: PrincipalKind = PrincipalKind.PERSON,
            actor: Principal | None = None) -> Principal:
        principal, token = add_principal(ws, actor, name, frozenset(roles), frozenset(groups), kind)
        tokens[name] = token
        return principal

    admin = add("admin", {Role.ADMIN})
    return People(
        admin=admin,
        alice=add("alice", {Role.REQUESTER}, {"app"}, actor=admin),
        bob=add("bob", {Role.APPROVER}, {"platform"}, actor=admin),
        carol=add("carol", {Role.APPROVER}, {"platform"}, actor=admin),
        erin=add("erin", {Role.APPROVER}, {"data"}, actor=admin),
        dana=add("dana", {Role.AUDITOR}, actor=admin),
        frank=add("frank", {Role.APPROVER}, {"security"}, actor=admin),
        agent=add("infra-agent", {Role.REQUESTER}, kind=PrincipalKind.AGENT, actor=admin),
        tokens=tokens,
    )


@pytest.fixture
def people(workspace: Workspace) -> People:
    return add_people(workspace)


class Clone:
    """A developer's clone of the declaration repo: edit, commit, push."""

    def __init__(self, ws: Workspace, path: Path):
        self.path = path
        self.repo = git.Repo.clone_from(str(ws.settings.repo_path), path)

    def branch(self, name: str) -> Clone:
        self.repo.git.checkout("-B", name, "origin/main")
        return self

    def write(self, relative: str, content: str) -> Clone:
        target = self.path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        return self

    def edit(self, relative: str, old: str, new: str) -> Clone:
        target = self.path / relative
        text_before = target.read_text()
        assert old in text_before, f"{old!r} not in {relative}"
        target.write_text(text_before.replace(old, new))
        return self

    def remove(self, relative: str) -> Clone:
        (self.path / relative).unlink()
        return self

    def read(self, relative: str) -> str:
        return (self.path / relative).read_text()

    def push(self, message: str = "change", author: str = "alice") -> str:
        self.repo.git.add("-A")
        self.repo.git.execute(["git", "commit", "-q", "-m", message], env=committer_env(author, f"{author}@example.com"))
        self.repo.git.push("-q", "--force", "origin", self.repo.active_branch.name)
        return self.repo.head.commit.hexsha


@pytest.fixture
def clone(workspace: Workspace, tmp_path: Path) -> Clone:
    return Clone(workspace, tmp_path / "clone")


# The sample repo in memory: `ws`, `team` and `checkout` are `workspace`, `people` and `clone` over tests/fakes.py's
# sandbox_workspace (the real engine, policy checks and runner over a fake store and a fake repo, no git and no
# database). A module whose workspace needs more (reactions, a clock of its own) overrides `ws`.


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    """The sample repo in memory, main's stacks applied to the simulated cloud."""
    return sandbox_workspace(tmp_path / "home")


@pytest.fixture
def team(ws: Workspace) -> People:
    """The sample's people in `ws`'s fake store, with no tokens."""
    return sample_people(ws.store)


@pytest.fixture
def checkout(ws: Workspace) -> FakeClone:
    """A developer's clone of `ws`'s fake repo: branch, edit, push."""
    return FakeClone(ws.repo)  # type: ignore[arg-type]


def run_cli(args: list[str], home: Path, token: str | None = None, database_url: str | None = None,
            timeout: float = 120, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the real `gateway` command in a subprocess."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    environment.pop("PYTHONDONTWRITEBYTECODE", None)  # each run would compile the whole gateway again
    environment.update({"GATEWAY_HOME": str(home), **env})
    if token:
        environment["GATEWAY_TOKEN"] = token
    if database_url:
        environment["GATEWAY_DATABASE_URL"] = database_url
    return subprocess.run([sys.executable, "-m", "gateway.cli", *args], capture_output=True, text=True,
                          env=environment, timeout=timeout, input=stdin)


@pytest.fixture(scope="module")
def front() -> Iterator[Any]:
    """moto's server mode behind the CloudFormation front (what AWS answers where moto does not), per test module."""
    from .cloudformation_server import cloudformation_front, moto_server

    with moto_server() as url, cloudformation_front(url) as served:
        yield served


@pytest.fixture
def aws(front: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """The worker's AWS environment pointed at the emulator's front, and the emulator emptied."""
    from .cloudformation_server import reset_moto

    reset_moto(front.moto)
    front.reset()
    for name, value in {"AWS_ENDPOINT_URL": front.url, "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "eu-west-1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return str(front.url)


@pytest.fixture(autouse=True, scope="session")
def _quiet_logs() -> None:
    from gateway.logs import configure_logging

    configure_logging("warning")


def sign_in_client(client: Any, token: str) -> None:
    """Sign a TestClient in on the pages, as the login form does (with its CSRF field)."""
    form = client.get("/login").text
    csrf = re.search(r'name="csrf" value="([^"]+)"', form).group(1)  # type: ignore[union-attr]
    signed_in = client.post("/login", data={"token": token, "csrf": csrf}, follow_redirects=False)
    assert signed_in.status_code == 303, signed_in.text
