"""Signing in, as the use cases decide it, on tests/fakes.py's unit of work: the sign-in in progress used once in the
browser that started it, a session that ends on sign-out, on expiry and when the person is disabled, identities
mapped by issuer and subject (never by e-mail) and linked by admins only, admission rules, the groups a session
counts, and refusals recorded a few a minute with the rest counted. The identity provider is a fake that vouches
for whom a test says; the clock is a FakeClock. What only the real flow shows (PKCE, the ID token's checks, the
cookie, the pages, TLS, PostgreSQL) stays in test_sign_in.py."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from gateway.domain.errors import AuthError, InputError, NotFound, Refused, SignInRefused
from gateway.domain.principals import Principal, PrincipalKind, Role
from gateway.domain.proposal import Decision, PlanSummary
from gateway.domain.sign_in import GITHUB_ISSUER, REFUSALS_PER_WINDOW
from gateway.services.admin.sign_in import (
    SignedIn,
    decide_signed_in,
    finish_sign_in,
    link_identity,
    provider_choices,
    sign_out,
    signed_in,
    start_sign_in,
)
from gateway.services.admin.users import disable_principal, enable_principal
from gateway.services.workspace import Workspace

from .fakes import FakeClock, FakeDeclarationRepo, FakeIdentityProvider, fake_workspace, person

ISSUER = "https://idp.example.com"
CALLBACK = "https://gateway.example.com/auth/oidc/callback"


@pytest.fixture
def idp() -> FakeIdentityProvider:
    return FakeIdentityProvider("oidc", ISSUER)


@pytest.fixture
def ws(idp: FakeIdentityProvider) -> Workspace:
    ws = fake_workspace()
    ws.identity_providers = {"oidc": idp}
    return ws


@pytest.fixture
def admin(ws: Workspace) -> Principal:
    return person("admin", Role.ADMIN, store=ws.store)


@pytest.fixture
def bob(ws: Workspace, admin: Principal) -> Principal:
    """An approver of the platform group whose identity at the provider is linked."""
    bob = person("bob", Role.APPROVER, groups=["platform", "data"], store=ws.store)
    link_identity(ws, admin, "bob", ISSUER, "bob-sub")
    return bob


def signed(ws: Workspace, browser: str = "browser-a",
           callback: Mapping[str, str] | None = None) -> tuple[str, SignedIn]:
    """Press the provider's button in `browser` and come back with the provider's answer: (session id, who)."""
    start_sign_in(ws, "oidc", CALLBACK, browser)
    idp = ws.identity_providers["oidc"]
    assert isinstance(idp, FakeIdentityProvider)
    return finish_sign_in(ws, "oidc", browser, callback or idp.callback())


def events(ws: Workspace, kind: str) -> list[dict]:
    with ws.store.session(readonly=True) as session:
        return [{"actor": e.actor, **e.payload} for e in session.audit.events(kind=kind)]


def refused(ws: Workspace) -> list[str]:
    return [e["check"] for e in events(ws, "sign_in.refused")]


def test_a_linked_person_signs_in_and_a_signed_out_session_signs_no_one_in(
        ws: Workspace, idp: FakeIdentityProvider, bob: Principal) -> None:
    assert provider_choices(ws) == [("oidc", "Test oidc")]
    idp.sign_in_as("bob-sub", "bob@example.com")
    session_id, who = signed(ws)
    assert (who.principal.name, who.auth_method, who.claimed_groups) == ("bob", f"oidc:{ISSUER}", None)
    assert signed_in(ws, session_id).principal.name == "bob"
    [opened] = events(ws, "sign_in")
    assert (opened["actor"], opened["auth_method"], opened["subject"]) == ("bob", f"oidc:{ISSUER}", "bob-sub")
    assert "nonce" not in str(opened) and "state-1" not in str(opened)  # what the answer is checked with stays out

    sign_out(ws, session_id)
    assert events(ws, "sign_out") == [{"actor": "bob", "auth_method": f"oidc:{ISSUER}"}]
    with pytest.raises(AuthError, match="your session has ended"):  # a copy of the cookie: ended server-side
        signed_in(ws, session_id)
    sign_out(ws, session_id)  # twice: nothing more recorded
    assert len(events(ws, "sign_out")) == 1
    with pytest.raises(AuthError, match="sign in first"):
        signed_in(ws, None)
    with pytest.raises(AuthError, match="no longer valid"):
        signed_in(ws, "a-cookie-never-issued")


def test_a_forged_state_is_refused_and_recorded_and_the_real_answer_still_signs_in(
        ws: Workspace, idp: FakeIdentityProvider, bob: Principal) -> None:
    idp.sign_in_as("bob-sub")
    start_sign_in(ws, "oidc", CALLBACK, "browser-a")
    with pytest.raises(SignInRefused, match="was not started here") as forged:
        finish_sign_in(ws, "oidc", "browser-a", idp.callback("forged-by-someone"))
    assert forged.value.check == "state"
    assert refused(ws) == ["state"] and events(ws, "sign_in") == []
    session_id, _ = finish_sign_in(ws, "oidc", "browser-a", idp.callback())
    assert signed_in(ws, session_id).principal.name == "bob"


def test_a_callback_is_used_once_and_only_in_the_browser_that_started_it(
        ws: Workspace, idp: FakeIdentityProvider, bob: Principal) -> None:
    idp.sign_in_as("bob-sub")
    signed(ws, "browser-a")
    with pytest.raises(SignInRefused, match="already used"):  # the same browser, the same callback
        finish_sign_in(ws, "oidc", "browser-a", idp.callback())
    start_sign_in(ws, "oidc", CALLBACK, "browser-a")
    with pytest.raises(SignInRefused, match="not started in this browser"):  # a stolen callback
        finish_sign_in(ws, "oidc", "browser-b", idp.callback())
    with pytest.raises(SignInRefused, match="not started in this browser"):  # a cookie without the browser's key
        finish_sign_in(ws, "oidc", None, idp.callback())
    with pytest.raises(SignInRefused, match="carries no state"):
        finish_sign_in(ws, "oidc", "browser-a", {"code": "x"})
    assert refused(ws) == ["state"] * 4 and len(events(ws, "sign_in")) == 1


def test_a_sign_in_left_too_long_is_refused_and_forgotten(ws: Workspace, idp: FakeIdentityProvider,
                                                         bob: Principal) -> None:
    idp.sign_in_as("bob-sub")
    start_sign_in(ws, "oidc", CALLBACK, "browser-a")
    late = idp.callback()
    assert isinstance(ws.clock, FakeClock)
    ws.clock.advance(10 * 60)
    with pytest.raises(SignInRefused, match="took longer than 10 minutes"):
        finish_sign_in(ws, "oidc", "browser-a", late)
    start_sign_in(ws, "oidc", CALLBACK, "browser-a")  # a new start forgets the expired one
    with pytest.raises(SignInRefused, match="was not started here, or ended long ago"):
        finish_sign_in(ws, "oidc", "browser-a", late)


def test_an_answer_the_provider_refuses_is_recorded_with_its_check_and_opens_no_session(
        ws: Workspace, idp: FakeIdentityProvider, bob: Principal) -> None:
    idp.refuse("audience", "the ID token's audience is not valid")
    with pytest.raises(SignInRefused, match="audience is not valid"):
        signed(ws)
    assert refused(ws) == ["audience"] and events(ws, "sign_in") == []
    with pytest.raises(NotFound, match="no sign-in provider 'okta' is configured"):
        start_sign_in(ws, "okta", CALLBACK, "browser-a")
    assert refused(ws) == ["audience"]  # an unknown provider is not a refused sign-in


def test_an_unlinked_identity_gets_no_access_until_an_admin_links_it(ws: Workspace, idp: FakeIdentityProvider,
                                                                    admin: Principal, bob: Principal) -> None:
    carol = person("carol", Role.APPROVER, groups=["platform"], store=ws.store)
    idp.sign_in_as("carol-sub", "carol@example.com")  # carol's e-mail: identities map by issuer and subject only
    with pytest.raises(SignInRefused, match="not linked to a gateway user") as unlinked:
        signed(ws)
    assert "gateway users link-identity NAME --issuer" in str(unlinked.value) and "carol-sub" in str(unlinked.value)
    [recorded] = events(ws, "sign_in.refused")
    assert (recorded["check"], recorded["subject"], recorded["issuer"]) == ("unlinked", "carol-sub", ISSUER)

    with pytest.raises(Refused, match="only admins link accounts"):
        link_identity(ws, bob, "carol", ISSUER, "carol-sub")
    with pytest.raises(InputError, match="needs its issuer URL"):
        link_identity(ws, admin, "carol", ISSUER, "  ")
    with pytest.raises(NotFound, match="no person dave"):
        link_identity(ws, admin, "dave", ISSUER, "dave-sub")
    link_identity(ws, admin, "carol", ISSUER, "carol-sub")
    with ws.store.session(readonly=True) as session:
        assert session.sign_in.identities_of(carol.id) == [(ISSUER, "carol-sub")]
    assert signed(ws)[1].principal.name == "carol"
    assert events(ws, "identity.linked")[-1] == {"actor": "admin", "name": "carol", "issuer": ISSUER,
                                                 "subject": "carol-sub"}


def test_an_agents_identity_opens_no_session(ws: Workspace, idp: FakeIdentityProvider, admin: Principal) -> None:
    agent = person("infra-agent", Role.REQUESTER, kind=PrincipalKind.AGENT, store=ws.store)
    with ws.store.session() as session:  # linked underneath: link_identity itself links people only
        session.sign_in.link_identity(agent, ISSUER, "bot-sub", "bot")
    with pytest.raises(NotFound, match="no person infra-agent"):
        link_identity(ws, admin, "infra-agent", ISSUER, "bot-sub")
    idp.sign_in_as("bot-sub")
    with pytest.raises(SignInRefused, match="agents cannot sign in"):
        signed(ws)
    assert refused(ws) == ["not_a_person"]


def test_a_disabled_persons_sessions_end_at_once_and_they_cannot_sign_in_again(
        ws: Workspace, idp: FakeIdentityProvider, admin: Principal, bob: Principal) -> None:
    idp.sign_in_as("bob-sub")
    first, _ = signed(ws, "browser-a")
    second, _ = signed(ws, "browser-b")  # another tab, another device
    disable_principal(ws, admin, "bob", "left the company")
    assert events(ws, "sign_in.sessions_ended") == [
        {"actor": "admin", "name": "bob", "sessions": 2, "reason": "the principal was disabled"}]
    for session_id in (first, second):
        with pytest.raises(AuthError, match="your account is disabled|your session has ended"):
            signed_in(ws, session_id)
    with pytest.raises(SignInRefused, match="bob is disabled"):
        signed(ws)
    assert refused(ws) == ["disabled"]


def test_a_session_expires_and_its_end_is_recorded_once(ws: Workspace, idp: FakeIdentityProvider,
                                                        bob: Principal) -> None:
    ws.settings.web_session_hours = 1
    idp.sign_in_as("bob-sub")
    session_id, _ = signed(ws)
    assert isinstance(ws.clock, FakeClock)
    ws.clock.advance(3599)
    assert signed_in(ws, session_id).principal.name == "bob"
    ws.clock.advance(1)
    with pytest.raises(AuthError, match="your session expired"):
        signed_in(ws, session_id)
    with pytest.raises(AuthError, match="your session has ended"):  # ended there: the next read finds it ended
        signed_in(ws, session_id)
    [ended] = events(ws, "sign_in.session_ended")
    assert (ended["actor"], ended["reason"]) == ("bob", "your session expired; sign in again")


def test_an_admission_rule_lets_a_verified_domain_in_as_a_requester(ws: Workspace,
                                                                    idp: FakeIdentityProvider) -> None:
    ws.settings.admit_domains = "example.org"
    idp.sign_in_as("nina-sub", "nina@example.org", verified=False)
    with pytest.raises(SignInRefused, match="not linked"):  # an unverified address admits no one
        signed(ws)
    idp.sign_in_as("nina-sub", "nina@example.org", display="nina")
    _, who = signed(ws)
    assert (who.principal.name, who.principal.roles, who.principal.groups) == (
        "nina", frozenset({Role.REQUESTER}), frozenset())
    [admitted] = events(ws, "principal.admitted")
    assert (admitted["actor"], admitted["because"], admitted["subject"]) == (
        "gateway", "verified e-mail domain example.org", "nina-sub")
    assert signed(ws)[1].principal.id == who.principal.id  # linked now: the same person the next time
    assert len(events(ws, "principal.admitted")) == 1


def test_groups_the_provider_names_narrow_what_a_session_counts_never_widen(
        ws: Workspace, idp: FakeIdentityProvider, bob: Principal) -> None:
    idp.sign_in_as("bob-sub", groups=["engineering", "platform", "admins"])
    session_id, who = signed(ws)
    assert who.principal.groups == frozenset({"platform"})  # data is not claimed; admins is not bob's
    assert signed_in(ws, session_id).principal.groups == frozenset({"platform"})
    [opened] = events(ws, "sign_in")
    assert (opened["claimed_groups"], opened["counted_groups"]) == (["admins", "engineering", "platform"], ["platform"])
    idp.sign_in_as("bob-sub")  # a provider that names no groups leaves bob's own
    assert signed(ws)[1].principal.groups == frozenset({"platform", "data"})


def test_refusals_are_recorded_a_few_a_minute_and_the_rest_counted_into_the_next(
        ws: Workspace, idp: FakeIdentityProvider) -> None:
    assert isinstance(ws.clock, FakeClock)
    idp.sign_in_as("nobody-sub")
    for _ in range(20):  # twenty unlinked sign-ins in twenty seconds
        with pytest.raises(SignInRefused):
            signed(ws)
        ws.clock.advance(1)
    assert refused(ws) == ["unlinked"] * REFUSALS_PER_WINDOW
    start_sign_in(ws, "oidc", CALLBACK, "browser-a")
    with pytest.raises(SignInRefused):  # another check is another tally: recorded at once
        finish_sign_in(ws, "oidc", "browser-a", idp.callback("forged"))
    assert refused(ws) == ["unlinked"] * REFUSALS_PER_WINDOW + ["state"]
    ws.clock.advance(3 * 60)
    with pytest.raises(SignInRefused):
        signed(ws)
    last = events(ws, "sign_in.refused")[-1]
    assert (last["check"], last["unrecorded_before"]) == ("unlinked", 20 - REFUSALS_PER_WINDOW)



def test_a_github_account_signs_in_by_its_numeric_id_never_its_login(ws: Workspace, admin: Principal) -> None:
    github = FakeIdentityProvider("github", GITHUB_ISSUER)
    ws.identity_providers = {"github": github}
    bob = person("bob", Role.APPROVER, groups=["platform"], store=ws.store)
    agent = person("infra-agent", Role.REQUESTER, kind=PrincipalKind.AGENT, store=ws.store)
    with ws.store.session() as session:
        session.principals.link_github(bob, 4242, "bob-gh")
        session.principals.link_github(agent, 777, "infra-bot")

    def as_github(github_id: int, login: str, email: str | None = None) -> tuple[str, SignedIn]:
        github.sign_in_as(str(github_id), email, display=login)
        start_sign_in(ws, "github", CALLBACK, "browser-a")
        return finish_sign_in(ws, "github", "browser-a", github.callback())

    _, who = as_github(4242, "renamed-bob")  # a renamed login is still bob: the id maps
    assert (who.principal.name, who.auth_method) == ("bob", "github")
    with pytest.raises(SignInRefused, match="not linked to a gateway user.*gateway users link NAME LOGIN --github-id"):
        as_github(999, "bob-gh")  # another account that took bob's old login: no access
    with pytest.raises(SignInRefused, match="agents cannot sign in to the review pages"):
        as_github(777, "infra-bot")
    ws.settings.admit_domains = "example.com"  # admission rules are for OIDC identities, never GitHub accounts
    with pytest.raises(SignInRefused, match="not linked"):
        as_github(555, "newcomer", "newcomer@example.com")
    assert refused(ws) == ["unlinked", "not_a_person", "unlinked"]


def test_a_decision_made_in_a_session_counts_the_groups_the_provider_named(ws: Workspace, idp: FakeIdentityProvider,
                                                                          bob: Principal) -> None:
    alice = person("alice", Role.REQUESTER, groups=["app"], store=ws.store)
    assert isinstance(ws.repo, FakeDeclarationRepo)
    ws.repo.refs["bigger"] = "head-1"
    with ws.store.session() as session:  # what opening a proposal leaves: planned at its head
        pid = session.proposals.add("bigger", "main-1", "head-1", alice, alice, "more memory", ["app-staging"], [])
        session.proposals.add_plan(pid, "app-staging", "head-1", "main-1", "sha256:p", "{}", 0, "lineage",
                                   PlanSummary(counts={"update": 1}), "preview")
    idp.sign_in_as("bob-sub", groups=["engineering"])  # the provider no longer puts bob in platform
    _, narrowed = signed(ws)
    with pytest.raises(Refused, match="not in an approver group of stack app-staging"):
        decide_signed_in(ws, narrowed, pid, Decision.APPROVE, "ok", "head-1", None)
    check = events(ws, "sign_in.group_check")[-1]
    assert (check["claimed"], check["active"], check["not_member"]) == (["engineering"], [], ["data", "platform"])

    idp.sign_in_as("bob-sub", groups=["platform"])
    _, counted = signed(ws)
    decide_signed_in(ws, counted, pid, Decision.APPROVE, "ok", "head-1", None)
    approval = events(ws, "approval")[-1]
    assert (approval["actor"], approval["authenticated_by"]) == ("bob", f"oidc:{ISSUER}")
    assert events(ws, "sign_in.group_check")[-1]["active"] == ["platform"]


def test_a_provider_that_cannot_be_reached_is_a_recorded_refusal_and_leaves_no_sign_in_waiting(
        ws: Workspace, idp: FakeIdentityProvider) -> None:
    idp.unreachable = True
    with pytest.raises(SignInRefused, match="could not be reached"):
        start_sign_in(ws, "oidc", CALLBACK, "browser-a")
    assert refused(ws) == ["provider_unreachable"]
    with ws.store.session(readonly=True) as session:
        assert session.sign_in.get_flow("anything") is None
    assert events(ws, "sign_in.refused")[0]["provider"] == "oidc"


def test_an_admission_rule_by_group_makes_a_new_person_under_a_name_not_taken(ws: Workspace,
                                                                              idp: FakeIdentityProvider) -> None:
    ws.settings.admit_groups = "staff"
    person("nina", Role.APPROVER, store=ws.store)  # another nina, who signs in otherwise
    idp.sign_in_as("nina-sub", "nina@elsewhere.example", verified=False, groups=["Staff"], display="nina@elsewhere")
    with pytest.raises(SignInRefused, match="not linked"):  # groups are matched exactly
        signed(ws)
    idp.sign_in_as("nina-sub", "nina@elsewhere.example", verified=False, groups=["staff"], display="nina@elsewhere")
    _, who = signed(ws)
    assert (who.principal.name, who.principal.roles) == ("nina-2", frozenset({Role.REQUESTER}))
    assert events(ws, "principal.admitted")[0]["because"] == "group staff"


def test_a_person_may_sign_in_in_several_tabs_at_once(ws: Workspace, idp: FakeIdentityProvider,
                                                      bob: Principal) -> None:
    idp.sign_in_as("bob-sub")
    start_sign_in(ws, "oidc", CALLBACK, "browser-a")
    first = idp.callback()
    start_sign_in(ws, "oidc", CALLBACK, "browser-a")  # another tab, before the first came back
    second = idp.callback()
    tab_two, _ = finish_sign_in(ws, "oidc", "browser-a", second)
    tab_one, _ = finish_sign_in(ws, "oidc", "browser-a", first)
    assert tab_one != tab_two
    sign_out(ws, tab_one)  # each session ends on its own
    assert signed_in(ws, tab_two).principal.name == "bob"


def test_an_identity_is_linked_by_its_exact_issuer_and_subject_and_moves_when_linked_again(
        ws: Workspace, idp: FakeIdentityProvider, admin: Principal, bob: Principal) -> None:
    carol = person("carol", Role.APPROVER, store=ws.store)
    with pytest.raises(InputError, match="GitHub accounts are linked with `gateway users link NAME LOGIN`"):
        link_identity(ws, admin, "carol", GITHUB_ISSUER, "4242")
    with pytest.raises(InputError, match="at most 255"):
        link_identity(ws, admin, "carol", ISSUER, "s" * 256)
    link_identity(ws, admin, "carol", f"  {ISSUER} ", " bob-sub ")  # bob's subject, now carol's
    with ws.store.session(readonly=True) as session:
        assert session.sign_in.identities_of(bob.id) == []
        assert session.sign_in.identities_of(carol.id) == [(ISSUER, "bob-sub")]
    idp.sign_in_as("bob-sub")
    assert signed(ws)[1].principal.name == "carol"


def test_a_person_enabled_again_signs_in_again_and_their_old_sessions_stay_ended(
        ws: Workspace, idp: FakeIdentityProvider, admin: Principal, bob: Principal) -> None:
    idp.sign_in_as("bob-sub")
    old, _ = signed(ws)
    disable_principal(ws, admin, "bob", "on leave")
    enable_principal(ws, admin, "bob", "back from leave")
    with pytest.raises(AuthError, match="your session has ended"):
        signed_in(ws, old)
    new, _ = signed(ws)
    assert signed_in(ws, new).principal.name == "bob"
