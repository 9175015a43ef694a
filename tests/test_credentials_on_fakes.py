"""Credentials with a lifecycle, on tests/fakes.py's unit of work: adding people and agents, disable, enable, rotate,
revoke, change access, expiry and last use; every change by an admin and in the trail; the last admin stays; a
token signs only people in to the pages. The clock is a FakeClock. What the command line, the pages and an apply
show of these stays in test_credentials.py."""

from __future__ import annotations

import re
from collections.abc import Collection
from datetime import timedelta

import pytest

from gateway.domain.apply_blockers import apply_blockers
from gateway.domain.audit import EventQuery
from gateway.domain.errors import AuthError, InputError, NotFound, Refused
from gateway.domain.principals import Principal, PrincipalKind, Role
from gateway.domain.proposal import Decision, PlanSummary
from gateway.services.admin.sign_in import sign_in_with_token, signed_in
from gateway.services.admin.users import (
    add_principal,
    authenticate,
    disable_principal,
    enable_principal,
    list_users,
    revoke_token,
    rotate_token,
    set_access,
)
from gateway.services.change.apply_facts import gather_apply_facts
from gateway.services.change.proposals import decide, get_proposal
from gateway.services.workspace import Workspace

from .fakes import FakeDeclarationRepo, event_kinds, fake_workspace, later


class Team:
    """conftest's people, added through the use case (each with a token), on the fake store."""

    def __init__(self, ws: Workspace):
        self.tokens: dict[str, str] = {}
        self.admin = self.add(ws, None, "admin", {Role.ADMIN})
        self.alice = self.add(ws, self.admin, "alice", {Role.REQUESTER}, {"app"})
        self.bob = self.add(ws, self.admin, "bob", {Role.APPROVER}, {"platform"})
        self.carol = self.add(ws, self.admin, "carol", {Role.APPROVER}, {"platform"})
        self.dana = self.add(ws, self.admin, "dana", {Role.AUDITOR})
        self.agent = self.add(ws, self.admin, "infra-agent", {Role.REQUESTER}, kind=PrincipalKind.AGENT)

    def add(self, ws: Workspace, actor: Principal | None, name: str, roles: set[Role], groups: Collection[str] = (),
            kind: PrincipalKind = PrincipalKind.PERSON) -> Principal:
        principal, self.tokens[name] = add_principal(ws, actor, name, frozenset(roles), frozenset(groups), kind)
        return principal


@pytest.fixture
def ws() -> Workspace:
    return fake_workspace()


@pytest.fixture
def team(ws: Workspace) -> Team:
    return Team(ws)


def test_each_credential_operation_works_and_is_recorded(ws: Workspace, team: Team) -> None:
    bob_token = team.tokens["bob"]
    assert authenticate(ws, bob_token).name == "bob"
    with pytest.raises(Refused, match="only admins change users"):
        disable_principal(ws, team.carol, "bob", "no")
    with pytest.raises(InputError, match="say why"):
        disable_principal(ws, team.admin, "bob", " ")
    with pytest.raises(NotFound, match="no user zed"):
        disable_principal(ws, team.admin, "zed", "who?")
    disable_principal(ws, team.admin, "bob", "left the company")
    with pytest.raises(AuthError, match="bob is disabled"):
        authenticate(ws, bob_token)
    enable_principal(ws, team.admin, "bob", "came back")
    assert authenticate(ws, bob_token).name == "bob"
    new = rotate_token(ws, team.admin, "bob")
    with pytest.raises(AuthError, match="not valid"):
        authenticate(ws, bob_token)
    assert authenticate(ws, new).name == "bob"
    revoke_token(ws, team.admin, "bob", "laptop lost")
    with pytest.raises(AuthError, match="not valid"):
        authenticate(ws, new)
    changed = set_access(ws, team.admin, "carol", frozenset({Role.APPROVER}), frozenset({"data"}))
    assert changed.groups == frozenset({"data"}) and changed.roles == frozenset({Role.APPROVER})
    with pytest.raises(Refused, match="the last enabled admin"):
        disable_principal(ws, team.admin, "admin", "oops")
    with pytest.raises(Refused, match="the last enabled admin"):
        set_access(ws, team.admin, "admin", frozenset({Role.AUDITOR}), None)
    assert authenticate(ws, team.tokens["admin"]).roles == frozenset({Role.ADMIN})  # both refusals wrote nothing
    assert [k for k in event_kinds(ws, "principal.") if k != "principal.added"] == [
        "principal.disabled", "principal.enabled", "principal.token_rotated", "principal.token_revoked",
        "principal.access_changed"]
    with ws.store.session(readonly=True) as session:
        [changed_event] = session.audit.query(EventQuery(kind="principal.access_changed"))
    assert changed_event.payload["was"] == {"roles": ["approver"], "groups": ["platform"]}


def test_a_token_expires_after_the_configured_days_and_last_use_is_kept_to_the_minute(ws: Workspace,
                                                                                       team: Team) -> None:
    with ws.store.session(readonly=True) as session:
        assert session.principals.credentials(team.dana.id).token_expires_at == ws.clock.now() + timedelta(
            days=ws.settings.token_ttl_days)
        assert session.principals.credentials(team.dana.id).last_used_at is None
    first = ws.clock.now()
    authenticate(ws, team.tokens["dana"])
    later(ws, 30)
    authenticate(ws, team.tokens["dana"])  # within the minute: not written again
    with ws.store.session(readonly=True) as session:
        assert session.principals.credentials(team.dana.id).last_used_at == first
    later(ws, 31)
    authenticate(ws, team.tokens["dana"])
    with ws.store.session(readonly=True) as session:
        assert session.principals.credentials(team.dana.id).last_used_at == first + timedelta(seconds=61)
    later(ws, ws.settings.token_ttl_days * 86400)
    with pytest.raises(AuthError, match="the token of dana expired at .*`gateway users rotate-token dana`"):
        authenticate(ws, team.tokens["dana"])
    assert authenticate(ws, rotate_token(ws, team.admin, "dana")).name == "dana"  # a new token works again
    with pytest.raises(AuthError, match="no token"):
        authenticate(ws, None)


def test_only_auditors_and_admins_list_users_with_their_expiry_and_identities(ws: Workspace, team: Team) -> None:
    for who in (team.carol, team.alice, team.agent):
        with pytest.raises(Refused, match=f"{who.name} is not an auditor; the audit trail is for auditors and admins"):
            list_users(ws, who)
    with ws.store.session() as session:
        session.sign_in.link_identity(team.carol, "https://idp", "carol-sub", "carol")
    listed = {r.principal.name: r for r in list_users(ws, team.dana)}
    assert list(listed) == ["admin", "alice", "bob", "carol", "dana", "infra-agent"]
    carol = listed["carol"]
    assert carol.principal.groups == frozenset({"platform"}) and carol.identities == (("https://idp", "carol-sub"),)
    assert carol.token_expires_at is not None and carol.last_used_at is None


def test_only_an_admin_adds_users_after_the_first_and_an_agent_acts_for_a_person_only(ws: Workspace,
                                                                                     team: Team) -> None:
    with pytest.raises(AuthError, match="set GATEWAY_TOKEN to an admin's token"):
        add_principal(ws, None, "eve", frozenset({Role.REQUESTER}))
    with pytest.raises(Refused, match="only admins add users"):
        add_principal(ws, team.bob, "eve", frozenset({Role.REQUESTER}))
    with pytest.raises(InputError, match="only an agent acts for a person"):
        add_principal(ws, team.admin, "eve", frozenset({Role.REQUESTER}), acting_for="alice")
    with pytest.raises(NotFound, match="no person infra-agent for the agent to act for"):
        add_principal(ws, team.admin, "ci-bot", frozenset({Role.REQUESTER}), kind=PrincipalKind.AGENT,
                      acting_for="infra-agent")
    with pytest.raises(Refused, match="dana may not request changes, so no agent may act for them"):
        add_principal(ws, team.admin, "ci-bot", frozenset({Role.REQUESTER}), kind=PrincipalKind.AGENT,
                      acting_for="dana")
    bot, token = add_principal(ws, team.admin, "ci-bot", frozenset({Role.REQUESTER}), kind=PrincipalKind.AGENT,
                               acting_for="alice")
    assert bot.acting_for == team.alice.id and authenticate(ws, token) == bot
    with pytest.raises(Exception, match="already exists"):
        add_principal(ws, team.admin, "ci-bot", frozenset({Role.REQUESTER}), kind=PrincipalKind.AGENT)
    with ws.store.session(readonly=True) as session:
        [added] = session.audit.query(EventQuery(kind="principal.added"))[-1:]
    assert (added.actor, added.payload["name"], added.payload["acting_for"]) == ("admin", "ci-bot", "alice")


def test_a_token_signs_people_in_to_the_pages_and_a_disabled_persons_session_ends_at_once(ws: Workspace,
                                                                                         team: Team) -> None:
    with pytest.raises(Refused, match="agents cannot sign in"):
        sign_in_with_token(ws, team.tokens["infra-agent"])
    session_id, who = sign_in_with_token(ws, team.tokens["bob"])
    assert (who.principal.name, who.auth_method) == ("bob", "web-session")
    assert signed_in(ws, session_id).principal.name == "bob"
    disable_principal(ws, team.admin, "bob", "left the company")
    with pytest.raises(AuthError, match="your account is disabled; your session has ended"):
        signed_in(ws, session_id)
    assert event_kinds(ws, "sign_in") == ["sign_in", "sign_in.sessions_ended"]  # ended by the disable, not by the read


def test_what_a_user_change_refuses_before_it_writes(ws: Workspace, team: Team) -> None:
    with pytest.raises(InputError, match="an agent cannot hold the admin role"):
        set_access(ws, team.admin, "infra-agent", frozenset({Role.ADMIN}), None)
    with pytest.raises(InputError, match="a principal needs at least one role"):
        set_access(ws, team.admin, "carol", frozenset(), None)
    with pytest.raises(NotFound, match="no user zed"):
        set_access(ws, team.admin, "zed", None, frozenset({"data"}))
    with pytest.raises(NotFound, match="no user zed"):
        rotate_token(ws, team.admin, "zed")
    with pytest.raises(InputError, match="say why"):
        enable_principal(ws, team.admin, "bob", "")
    with pytest.raises(InputError, match="invalid name 'two words'"):
        add_principal(ws, team.admin, "two words", frozenset({Role.REQUESTER}))
    with pytest.raises(InputError, match="'gateway' is the gateway's own name"):
        add_principal(ws, team.admin, "gateway", frozenset({Role.REQUESTER}))
    assert set_access(ws, team.admin, "carol", None, frozenset({"data"})).roles == frozenset({Role.APPROVER})
    assert [k for k in event_kinds(ws, "principal.") if k != "principal.added"] == ["principal.access_changed"]


def test_a_disabled_approvers_approval_stops_counting_until_they_are_enabled(ws: Workspace, team: Team) -> None:
    assert isinstance(ws.repo, FakeDeclarationRepo)
    ws.repo.refs["tags"] = "head-1"
    with ws.store.session() as session:  # what opening the proposal leaves: planned at its head
        pid = session.proposals.add("tags", "main-1", "head-1", team.alice, team.alice, "cost centre moved",
                                    ["app-staging"], [])
        session.proposals.add_plan(pid, "app-staging", "head-1", "main-1", "sha256:p", "{}", 0, "lineage",
                                   PlanSummary(counts={"update": 1}), "preview")
    decide(ws, team.bob, pid, Decision.APPROVE, "ok")

    def blockers() -> list[str]:
        return apply_blockers(gather_apply_facts(ws, get_proposal(ws, pid), team.alice, check_plans=False))

    assert blockers() == []
    disable_principal(ws, team.admin, "bob", "left the company")
    assert any(re.search(r"needs 1 approval\(s\).*has 0", b) for b in blockers()), blockers()
    enable_principal(ws, team.admin, "bob", "back")
    assert blockers() == []


def test_the_first_principal_is_added_without_a_token_and_is_its_own_actor() -> None:
    ws = fake_workspace()
    first, token = add_principal(ws, None, "root", frozenset({Role.ADMIN}))
    assert authenticate(ws, token) == first
    with ws.store.session(readonly=True) as session:
        [added] = session.audit.query(EventQuery(kind="principal.added"))
    assert (added.actor, added.payload["name"], added.payload["roles"]) == ("root", "root", ["admin"])
    with pytest.raises(AuthError, match="set GATEWAY_TOKEN to an admin's token to add users"):
        add_principal(ws, None, "second", frozenset({Role.ADMIN}))
