"""Signing in to the pages with OpenID Connect and GitHub: a real provider on loopback, the real app, the trail.

Each refusal a person can meet (a forged or replayed state, a wrong nonce, a token for another audience, an
expired one, a key not in the provider's JWKS, a disabled person, an unlinked identity) is a clear page, never a
500, and is recorded in the audit trail with the check that failed.
"""

from __future__ import annotations

import json
import re
import ssl
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from gateway.api.app import create_app
from gateway.composition import identity_providers
from gateway.config import Settings
from gateway.domain.errors import ConfigError
from gateway.domain.sign_in import (
    REFUSALS_PER_WINDOW,
    AdmissionRule,
    Identity,
    PendingSignIn,
    RefusalTally,
    WebSession,
    combined_claims,
    counted_groups,
    state_refusal,
    tally_refusal,
)
from gateway.services.admin.sign_in import link_identity
from gateway.services.admin.users import disable_principal
from gateway.services.workspace import Workspace

from .conftest import Clone, People, add_people, make_workspace, run_cli
from .identity_providers import FakeGitHubOAuth, FakeOidcProvider, Person

CLIENT_ID, CLIENT_SECRET = "gateway-pages", "pages-client-secret-7f3a"
BASE = "http://testserver"


@pytest.fixture
def idp() -> Iterator[FakeOidcProvider]:
    with FakeOidcProvider(CLIENT_ID, CLIENT_SECRET, f"{BASE}/auth/oidc/callback") as provider:
        yield provider  # type: ignore[misc]


def configure_oidc(ws: Workspace, idp: FakeOidcProvider, **more: object) -> None:
    s = ws.settings
    s.public_url, s.oidc_issuer, s.oidc_client_id = BASE, idp.issuer, CLIENT_ID
    s.oidc_client_secret, s.oidc_label = SecretStr(CLIENT_SECRET), "Test IdP"
    for name, value in more.items():
        setattr(s, name, value)


@pytest.fixture
def app_client(workspace: Workspace, idp: FakeOidcProvider, people: People) -> Iterator[TestClient]:
    configure_oidc(workspace, idp)
    link_identity(workspace, people.admin, "bob", idp.issuer, "bob-sub")
    with TestClient(create_app(workspace.settings, workers=0)) as client:
        yield client


def csrf_of(html: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', html).group(1)  # type: ignore[union-attr]


def start(client: TestClient, provider: str = "oidc") -> str:
    """Press the provider's button on the sign-in page: the URL the browser is sent to."""
    page = client.get("/login")
    assert f'action="/login/{provider}"' in page.text
    sent = client.post(f"/login/{provider}", data={"csrf": csrf_of(page.text)}, follow_redirects=False)
    assert sent.status_code == 303, sent.text
    return sent.headers["location"]


def at_provider(url: str, verify: object = True) -> str:
    """What the provider sends the browser back to (the callback's path and query)."""
    answer = httpx.get(url, follow_redirects=False, verify=verify)  # type: ignore[arg-type]
    assert answer.status_code == 302, answer.text
    return answer.headers["location"].removeprefix(BASE)


def sign_in(client: TestClient, provider: str = "oidc") -> tuple[httpx.Response, str]:
    callback = at_provider(start(client, provider))
    return client.get(callback, follow_redirects=False), callback


def events(ws: Workspace, kind: str) -> list[dict]:
    with ws.store.session(readonly=True) as session:
        return [{"actor": e.actor, **e.payload} for e in session.audit.events(kind=kind)]


def refused(ws: Workspace) -> list[str]:
    return [e["check"] for e in events(ws, "sign_in.refused")]


def test_a_linked_person_signs_in_with_oidc_and_signs_out(app_client: TestClient, idp: FakeOidcProvider,
                                                          workspace: Workspace) -> None:
    idp.sign_in_as(Person("bob-sub", "bob@example.com", username="bob"))
    url = start(app_client)
    assert url.startswith(f"{idp.issuer}/authorize?")
    for part in ("code_challenge_method=S256", "code_challenge=", "state=", "nonce=", f"client_id={CLIENT_ID}"):
        assert part in url
    answer = app_client.get(at_provider(url), follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/"
    cookie = answer.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=lax" in cookie and "secure" not in cookie  # plain http here
    home = app_client.get("/")
    assert home.status_code == 200 and "bob (approver)" in home.text
    assert events(workspace, "sign_in")[-1]["auth_method"] == f"oidc:{idp.issuer}"
    assert "POST /token" in idp.requests and "GET /jwks" in idp.requests
    with workspace.store.session(readonly=True) as session:
        trail = [json.dumps(e.payload) for e in session.audit.events()]
    assert trail and not any(CLIENT_SECRET in e or "code_verifier" in e for e in trail)

    kept = dict(app_client.cookies)
    app_client.post("/logout", data={"csrf": csrf_of(home.text)}, follow_redirects=False)
    assert events(workspace, "sign_out")[-1]["actor"] == "bob"
    # a copy of the cookie taken before signing out signs no one in: the session ended server-side
    copy = TestClient(app_client.app)  # another browser (no second lifespan: the app runs already)
    copy.cookies.update(kept)
    assert copy.get("/", follow_redirects=False).headers["location"] == "/login"


def test_a_forged_state_is_refused_and_recorded(app_client: TestClient, idp: FakeOidcProvider,
                                                workspace: Workspace) -> None:
    idp.sign_in_as(Person("bob-sub"))
    callback = at_provider(start(app_client))
    forged = re.sub(r"state=[^&]+", "state=forged-by-someone", callback)
    page = app_client.get(forged, follow_redirects=False)
    assert page.status_code == 401 and "its state is unknown" in page.text and 'data-check="state"' in page.text
    assert refused(workspace) == ["state"]
    assert app_client.get("/", follow_redirects=False).status_code == 303  # not signed in
    assert "POST /token" not in idp.requests  # the code was never redeemed
    real = app_client.get(callback, follow_redirects=False)
    assert real.status_code == 303, real.text  # the real answer still signs in


def test_a_replayed_callback_is_refused(app_client: TestClient, idp: FakeOidcProvider, workspace: Workspace) -> None:
    idp.sign_in_as(Person("bob-sub"))
    first, callback = sign_in(app_client)
    assert first.status_code == 303
    again = app_client.get(callback, follow_redirects=False)  # the same browser, the same callback
    assert again.status_code == 401 and "already used" in again.text
    # ... and in another browser, which never started a sign-in
    stolen = TestClient(app_client.app).get(callback, follow_redirects=False)
    assert stolen.status_code == 401 and "not started in this browser" in stolen.text
    assert refused(workspace) == ["state", "state"]


@pytest.mark.parametrize(("spoil", "check", "says"), [
    ({"nonce": "someone-elses-nonce"}, "nonce", "nonce is not valid"),
    ({"aud": "another-client"}, "audience", "audience is not valid"),
    ({"exp_offset": -3600}, "expired", "has expired"),
    ({"foreign_key": True}, "signature", "could not be verified"),
])
def test_an_id_token_that_fails_a_check_is_refused(app_client: TestClient, idp: FakeOidcProvider,
                                                  workspace: Workspace, spoil: dict, check: str, says: str) -> None:
    idp.sign_in_as(Person("bob-sub"))
    idp.spoil(**spoil)
    page, _ = sign_in(app_client)
    assert page.status_code == 401 and says in page.text, page.text
    assert "Traceback" not in page.text
    assert refused(workspace) == [check]
    assert app_client.get("/", follow_redirects=False).status_code == 303


def test_an_unlinked_identity_gets_no_access_until_an_admin_links_it(
        app_client: TestClient, idp: FakeOidcProvider, workspace: Workspace, people: People) -> None:
    # the e-mail is carol's, but identities map by issuer and subject, never by e-mail
    idp.sign_in_as(Person("carol-sub", "carol@example.com", username="carol"))
    page, _ = sign_in(app_client)
    assert page.status_code == 403 and "not linked to a gateway user" in page.text
    assert "gateway users link-identity NAME" in page.text and "carol-sub" in page.text
    assert refused(workspace) == ["unlinked"]
    assert events(workspace, "sign_in.refused")[0]["subject"] == "carol-sub"

    linked = run_cli(["users", "link-identity", "carol", "--issuer", idp.issuer, "--subject", "carol-sub"],
                     workspace.settings.home, people.tokens["admin"])
    assert linked.returncode == 0, linked.stderr
    listed = run_cli(["users", "list"], workspace.settings.home, people.tokens["admin"]).stdout
    assert f"signs in as carol-sub at {idp.issuer}" in listed
    denied = run_cli(["users", "link-identity", "alice", "--issuer", idp.issuer, "--subject", "x"],
                     workspace.settings.home, people.tokens["bob"])
    assert denied.returncode == 1 and "only admins link accounts" in denied.stderr
    page, _ = sign_in(app_client)
    assert page.status_code == 303 and "carol (approver)" in app_client.get("/").text


def test_a_disabled_persons_session_ends_and_they_cannot_sign_in_again(
        app_client: TestClient, idp: FakeOidcProvider, workspace: Workspace, people: People) -> None:
    idp.sign_in_as(Person("bob-sub"))
    assert sign_in(app_client)[0].status_code == 303
    assert app_client.get("/").status_code == 200
    disable_principal(workspace, people.admin, "bob", "left the company")
    gone = app_client.get("/", follow_redirects=False)
    assert gone.status_code == 303 and gone.headers["location"] == "/login"
    assert "your account is disabled" in app_client.get("/login").text
    ended = events(workspace, "sign_in.sessions_ended")  # at once, by the admin's disable
    assert ended == [{"actor": "admin", "name": "bob", "sessions": 1, "reason": "the principal was disabled"}]
    page, _ = sign_in(app_client)
    assert page.status_code == 403 and "bob is disabled" in page.text
    assert refused(workspace) == ["disabled"]


def test_a_session_expires(workspace: Workspace, idp: FakeOidcProvider, people: People) -> None:
    configure_oidc(workspace, idp, web_session_hours=1 / 3600)  # one second
    link_identity(workspace, people.admin, "bob", idp.issuer, "bob-sub")
    idp.sign_in_as(Person("bob-sub"))
    with TestClient(create_app(workspace.settings, workers=0)) as client:
        assert sign_in(client)[0].status_code == 303
        assert client.get("/").status_code == 200
        time.sleep(1.2)
        assert client.get("/", follow_redirects=False).status_code == 303
        assert "your session expired" in client.get("/login").text


def test_starting_a_sign_in_needs_the_forms_csrf_token(app_client: TestClient) -> None:
    app_client.get("/login")
    forged = app_client.post("/login/oidc", data={"csrf": "not-the-token"}, follow_redirects=False)
    assert forged.status_code == 403 and "CSRF" in forged.text
    unknown = app_client.post("/login/okta", data={"csrf": csrf_of(app_client.get("/login").text)})
    assert unknown.status_code == 404 and "no sign-in provider &#39;okta&#39;" in unknown.text


def test_an_admission_rule_lets_a_verified_domain_in_as_a_requester(
        workspace: Workspace, idp: FakeOidcProvider, people: People, clone: Clone) -> None:
    configure_oidc(workspace, idp, admit_domains="example.org")
    with TestClient(create_app(workspace.settings, workers=0)) as client:
        idp.sign_in_as(Person("new-sub", "nina@example.org", email_verified=False))
        page, _ = sign_in(client)
        assert page.status_code == 403  # an unverified address admits no one
        idp.sign_in_as(Person("new-sub", "nina@example.org", username="nina"))
        assert sign_in(client)[0].status_code == 303
        assert "nina (requester)" in client.get("/").text
    admitted = events(workspace, "principal.admitted")
    assert admitted[0]["because"] == "verified e-mail domain example.org" and admitted[0]["actor"] == "gateway"


def test_groups_from_the_claim_narrow_what_a_decision_counts_for(
        workspace: Workspace, idp: FakeOidcProvider, people: People, clone: Clone) -> None:
    from gateway.services.change.proposals import open_proposal

    configure_oidc(workspace, idp, oidc_groups_claim="groups")
    link_identity(workspace, people.admin, "bob", idp.issuer, "bob-sub")
    clone.branch("bigger").edit("stacks/app-staging/main.tf", '"t3.small"', '"t3.medium"').push()
    proposal = open_proposal(workspace, people.alice, "bigger", "more memory")
    with TestClient(create_app(workspace.settings, workers=0)) as client:
        idp.sign_in_as(Person("bob-sub", groups=["engineering"]))  # the provider no longer puts bob in platform
        assert sign_in(client)[0].status_code == 303
        home = client.get("/").text
        assert 'id="inbox"' not in home
        form = client.get(f"/proposals/{proposal.id}").text
        head = re.search(r'id="head-sha"[^>]*>([0-9a-f]+)<', form).group(1)  # type: ignore[union-attr]
        denied = client.post(f"/proposals/{proposal.id}/decide", data={
            "csrf": csrf_of(form), "decision": "approve", "sha": head})
        assert denied.status_code == 403 and "not in an approver group of stack app-staging" in denied.text
        check = events(workspace, "sign_in.group_check")[-1]
        assert check["claimed"] == ["engineering"] and check["active"] == [] and check["not_member"] == ["platform"]

        idp.sign_in_as(Person("bob-sub", groups=["platform"]))
        assert sign_in(client)[0].status_code == 303
        assert f'id="inbox-{proposal.id}"' in client.get("/").text
        form = client.get(f"/proposals/{proposal.id}").text
        approved = client.post(f"/proposals/{proposal.id}/decide", data={
            "csrf": csrf_of(form), "decision": "approve", "sha": head}, follow_redirects=False)
        assert approved.status_code == 303, approved.text
    approval = events(workspace, "approval")[-1]
    assert approval["actor"] == "bob" and approval["authenticated_by"] == f"oidc:{idp.issuer}"
    assert events(workspace, "sign_in.group_check")[-1]["active"] == ["platform"]


def test_oidc_over_tls_with_the_configured_ca_bundle(workspace: Workspace, people: People, tmp_path: Path) -> None:
    with FakeOidcProvider(CLIENT_ID, CLIENT_SECRET, f"{BASE}/auth/oidc/callback", tls=True,
                          tmp=tmp_path / "tls") as idp:
        configure_oidc(workspace, idp)
        link_identity(workspace, people.admin, "bob", idp.issuer, "bob-sub")
        idp.sign_in_as(Person("bob-sub"))
        with TestClient(create_app(workspace.settings, workers=0)) as client:
            # without the CA bundle the provider's certificate is not trusted: a clear refusal, no 500
            page = client.post("/login/oidc", data={"csrf": csrf_of(client.get("/login").text)})
            assert page.status_code == 401 and "could not be reached" in page.text
        workspace.settings.sign_in_ca_bundle = idp.ca_file
        with TestClient(create_app(workspace.settings, workers=0)) as client:
            callback = at_provider(start(client), verify=ssl.create_default_context(cafile=str(idp.ca_file)))
            assert client.get(callback, follow_redirects=False).status_code == 303
    assert refused(workspace) == ["provider_unreachable"]


def test_a_secure_cookie_behind_tls(workspace: Workspace, people: People) -> None:
    workspace.settings.public_url = "https://gateway.example.com"
    with TestClient(create_app(workspace.settings, workers=0), base_url="https://gateway.example.com") as client:
        form = client.get("/login").text
        signed = client.post("/login", data={"token": people.tokens["bob"], "csrf": csrf_of(form)},
                             follow_redirects=False)
        assert signed.status_code == 303
        cookie = signed.headers["set-cookie"].lower()
        assert "secure" in cookie and "httponly" in cookie and "samesite=lax" in cookie


# --- GitHub ---------------------------------------------------------------------------------------


@pytest.fixture
def github() -> Iterator[FakeGitHubOAuth]:
    with FakeGitHubOAuth("Iv1.gateway", "gh-oauth-secret", f"{BASE}/auth/github/callback") as fake:
        yield fake  # type: ignore[misc]


def test_signing_in_with_github_maps_by_the_numeric_id(workspace: Workspace, github: FakeGitHubOAuth,
                                                       people: People) -> None:
    s = workspace.settings
    s.public_url, s.github_oauth_client_id = BASE, "Iv1.gateway"
    s.github_oauth_client_secret = SecretStr("gh-oauth-secret")
    s.github_oauth_url = s.github_oauth_api_url = github.url
    with workspace.store.session() as session:
        session.principals.link_github(people.bob, 4242, "bob-gh")
        session.principals.link_github(people.agent, 777, "infra-bot")
    with TestClient(create_app(s, workers=0)) as client:
        assert "Sign in with GitHub" in client.get("/login").text
        github.sign_in_as(4242, "renamed-bob")  # a renamed login is still bob: the id maps
        page, callback = sign_in(client, "github")
        assert page.status_code == 303
        assert "bob (approver)" in client.get("/").text
        assert client.get(callback, follow_redirects=False).status_code == 401  # replayed
        github.sign_in_as(999, "bob-gh")  # another account that took bob's old login: no access
        page, _ = sign_in(TestClient(client.app), "github")
        assert page.status_code == 403 and "not linked to a gateway user" in page.text
        github.sign_in_as(777, "infra-bot")  # an agent's account opens no session
        page, _ = sign_in(TestClient(client.app), "github")
        assert page.status_code == 403 and "agents cannot sign in to the review pages" in page.text
    assert events(workspace, "sign_in")[-1]["auth_method"] == "github"
    assert refused(workspace) == ["state", "unlinked", "not_a_person"]


def test_a_provider_that_says_no_or_a_callback_without_a_code_is_a_clear_page(
        app_client: TestClient, idp: FakeOidcProvider, workspace: Workspace) -> None:
    url = start(app_client)
    state = re.search(r"state=([^&]+)", url).group(1)  # type: ignore[union-attr]
    denied = app_client.get(f"/auth/oidc/callback?error=access_denied&error_description=the+user+said+no&state={state}")
    assert denied.status_code == 401 and "the identity provider refused the sign-in: the user said no" in denied.text
    start(app_client)
    bare = app_client.get("/auth/oidc/callback")
    assert bare.status_code == 401 and "carries no state" in bare.text
    unknown = app_client.get("/auth/okta/callback?code=x&state=y")
    assert unknown.status_code == 404
    assert refused(workspace) == ["provider_error", "state"]  # the unknown provider is a 404, not a sign-in


@pytest.mark.parametrize(("issuer", "accepted"), [
    ("https://idp.example.com", True),
    ("http://127.0.0.1:9000", True),  # a provider on this machine: nothing crosses a network
    ("http://127.8.9.10", True),
    ("http://localhost:9000", True),
    ("http://[::1]:9000", True),
    ("http://idp.example.com", False),  # the client secret and the tokens would cross the network in clear
    ("http://10.0.0.5:8080", False),
    ("http://127.0.0.1.example.com", False),
    ("ftp://idp.example.com", False),
])
def test_an_http_issuer_is_accepted_only_on_loopback(tmp_path: Path, issuer: str, accepted: bool) -> None:
    settings = Settings(home=tmp_path, oidc_issuer=issuer, oidc_client_id=CLIENT_ID,
                        oidc_client_secret=SecretStr(CLIENT_SECRET))
    if accepted:
        assert "oidc" in identity_providers(settings)
    else:
        with pytest.raises(ConfigError, match="GATEWAY_OIDC_ISSUER .* must be an https URL"):
            identity_providers(settings)
    github = Settings(home=tmp_path, github_oauth_client_id="Iv1.x", github_oauth_client_secret=SecretStr("s"),
                      github_oauth_url=issuer, github_oauth_api_url=issuer)
    if accepted:
        assert "github" in identity_providers(github)
    else:
        with pytest.raises(ConfigError, match="GATEWAY_GITHUB_OAUTH_URL .* must be an https URL"):
            identity_providers(github)


@pytest.mark.parametrize(("said", "says"), [
    ({"token_endpoint": "http://idp.example.com/token"}, "token_endpoint http://idp.example.com/token is not https"),
    ({"issuer": "https://someone-else.example.com"}, "names issuer https://someone-else.example.com"),
])
def test_a_discovery_document_that_would_send_secrets_elsewhere_is_refused(
        app_client: TestClient, idp: FakeOidcProvider, workspace: Workspace, said: dict, says: str) -> None:
    idp.discovery_overrides = said
    page = app_client.post("/login/oidc", data={"csrf": csrf_of(app_client.get("/login").text)},
                           follow_redirects=False)
    assert page.status_code == 401 and says in page.text, page.text
    assert refused(workspace) == ["provider_answer"]


def test_an_answer_naming_another_issuer_is_refused(app_client: TestClient, idp: FakeOidcProvider,
                                                   workspace: Workspace) -> None:
    idp.sign_in_as(Person("bob-sub"))
    callback = at_provider(start(app_client))  # RFC 9207: a mix-up, an answer from another provider
    page = app_client.get(f"{callback}&iss=https%3A%2F%2Fidp.attacker.example", follow_redirects=False)
    assert page.status_code == 401 and "comes from https://idp.attacker.example" in page.text
    assert refused(workspace) == ["issuer"] and "POST /token" not in idp.requests


# --- the rules, as tables (no server, no database) ------------------------------------------------

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


@pytest.mark.parametrize(("identity", "admitted"), [
    (Identity("oidc", "https://idp", "1", "nina", "nina@example.org", True), "verified e-mail domain example.org"),
    (Identity("oidc", "https://idp", "1", "nina", "nina@EXAMPLE.org", True), "verified e-mail domain example.org"),
    (Identity("oidc", "https://idp", "1", "nina", "nina@example.org", False), None),  # unverified
    (Identity("oidc", "https://idp", "1", "nina", "nina@example.org.evil.com", True), None),
    (Identity("oidc", "https://idp", "1", "nina", None, False, frozenset({"staff"})), "group staff"),
    (Identity("oidc", "https://idp", "1", "nina", None, False, frozenset({"Staff"})), None),  # groups are exact
])
def test_who_an_admission_rule_lets_in(identity: Identity, admitted: str | None) -> None:
    assert AdmissionRule(frozenset({"example.org"}), frozenset({"staff"})).admits(identity) == admitted


@pytest.mark.parametrize(("mine", "claimed", "counted"), [
    ({"platform", "data"}, None, {"platform", "data"}),  # the provider says nothing of groups
    ({"platform", "data"}, {"platform", "everyone"}, {"platform"}),  # it can narrow ...
    ({"platform"}, {"platform", "admins"}, {"platform"}),  # ... never widen
    ({"platform"}, set(), set()),
])
def test_the_groups_a_session_counts(mine: set, claimed: set | None, counted: set) -> None:
    assert counted_groups(mine, claimed) == counted


@pytest.mark.parametrize(("ended", "disabled", "at", "reason"), [
    (None, False, NOW, None),
    (None, False, NOW + timedelta(hours=8), "your session expired; sign in again"),
    (NOW, False, NOW, "your session has ended (signed out); sign in again"),
    (NOW, True, NOW, "your account is disabled; your session has ended"),
])
def test_when_a_session_stops_signing_anyone_in(ended: datetime | None, disabled: bool, at: datetime,
                                               reason: str | None) -> None:
    session = WebSession("p1", "oidc:https://idp", None, NOW, NOW + timedelta(hours=8), ended)
    assert session.refusal(at, disabled) == reason


def test_refusals_are_recorded_a_few_a_minute_and_the_rest_counted() -> None:
    tally, recorded = tally_refusal(None, NOW)
    made = [recorded]
    for second in range(1, 20):  # twenty in twenty seconds: five recorded, fifteen counted
        tally, recorded = tally_refusal(tally, NOW + timedelta(seconds=second))
        made.append(recorded)
    assert made == [{}] * REFUSALS_PER_WINDOW + [None] * (20 - REFUSALS_PER_WINDOW)
    assert tally.unrecorded == 15 and tally.unrecorded_since == NOW + timedelta(seconds=5)
    tally, recorded = tally_refusal(tally, NOW + timedelta(minutes=3))  # the next one recorded says so
    assert recorded == {"unrecorded_before": 15, "unrecorded_since": (NOW + timedelta(seconds=5)).isoformat()}
    assert tally == RefusalTally(NOW + timedelta(minutes=3), 1)
    assert tally_refusal(tally, NOW + timedelta(minutes=3, seconds=1))[1] == {}


FLOW = PendingSignIn("oidc", "browser-a", {"nonce": "n"}, NOW, NOW + timedelta(minutes=10))


@pytest.mark.parametrize(("flow", "provider", "browser", "at", "says"), [
    (FLOW, "oidc", "browser-a", NOW + timedelta(minutes=9), None),
    (None, "oidc", "browser-a", NOW, "was not started here, or ended long ago"),
    (FLOW, "oidc", "browser-b", NOW, "not started in this browser"),
    (FLOW, "oidc", None, NOW, "not started in this browser"),  # a cookie without the browser's key
    (FLOW, "github", "browser-a", NOW, "started with oidc, not github"),
    (replace(FLOW, used_at=NOW), "oidc", "browser-a", NOW, "already used"),
    (FLOW, "oidc", "browser-a", NOW + timedelta(minutes=10), "took longer than 10 minutes"),
])
def test_when_a_callback_may_finish_a_sign_in(flow: PendingSignIn | None, provider: str, browser: str | None,
                                              at: datetime, says: str | None) -> None:
    reason = state_refusal(flow, provider, browser, at)
    assert (reason is None) if says is None else (says in (reason or "") and "forged" not in (reason or ""))


@pytest.mark.parametrize(("id_token", "userinfo", "claims", "sources"), [
    ({"sub": "1", "email": "a@x", "email_verified": True}, None,
     {"email": "a@x", "email_verified": True}, {"email": "id_token", "email_verified": "id_token"}),
    ({"sub": "1"}, {"sub": "1", "email": "a@x", "email_verified": True, "groups": ["g"]},
     {"email": "a@x", "email_verified": True, "groups": ["g"]},
     {"email": "userinfo", "email_verified": "userinfo", "groups": "userinfo"}),
    # the signed ID token wins, and an address's verification comes with it, never from the other source
    ({"sub": "1", "email": "a@x"}, {"sub": "1", "email": "b@x", "email_verified": True, "groups": []},
     {"email": "a@x", "groups": []}, {"email": "id_token", "groups": "userinfo"}),
])
def test_where_each_claim_comes_from(id_token: dict, userinfo: dict | None, claims: dict, sources: dict) -> None:
    assert combined_claims(id_token, userinfo, [("email", "email_verified"), ("groups",)]) == (claims, sources)


def test_sign_in_sessions_on_postgresql(tmp_path: Path, postgres_url: str, idp: FakeOidcProvider) -> None:
    ws = make_workspace(tmp_path / "pg-home", postgres_url)
    try:
        people = add_people(ws)
        configure_oidc(ws, idp, oidc_groups_claim="groups")
        link_identity(ws, people.admin, "bob", idp.issuer, "bob-sub")
        idp.sign_in_as(Person("bob-sub", groups=["platform"]))
        with TestClient(create_app(ws.settings, workers=0)) as client:
            signed, callback = sign_in(client)
            assert signed.status_code == 303
            assert "already used" in client.get(callback, follow_redirects=False).text
            home = client.get("/")
            assert home.status_code == 200 and "bob (approver)" in home.text
            client.post("/logout", data={"csrf": csrf_of(home.text)})
            assert client.get("/", follow_redirects=False).status_code == 303
        assert events(ws, "sign_in")[-1]["counted_groups"] == ["platform"]
        assert refused(ws) == ["state"]
    finally:
        ws.close()
