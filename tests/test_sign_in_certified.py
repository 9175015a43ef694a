"""Signing in against a certified OpenID Provider (oidc-provider, from npm) that nobody here wrote: the whole
authorization-code flow over real HTTP, its login and consent forms posted as a browser would.

A conformant provider puts `email`, `preferred_username` and `groups` in its userinfo answer, not in the ID token,
when it issues an access token: the gateway reads userinfo (for the ID token's own subject) and the trail says
where each claim came from. The flow's state, nonce and PKCE verifier wait server-side, keyed by state and bound
to the browser that started it, and are used once.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from gateway.api.app import create_app
from gateway.services.admin.sign_in import link_identity
from gateway.services.workspace import Workspace

from .certified_provider import CertifiedOidcProvider
from .conftest import Clone, People
from .test_sign_in import BASE, csrf_of, events, refused, start

CLIENT_ID, CLIENT_SECRET = "gateway-pages", "certified-provider-client-secret-0c9d2e"
ACCOUNTS = {
    "bob": {"sub": "bob-sub", "email": "robert@example.com", "email_verified": True, "preferred_username": "robert",
            "name": "Robert", "groups": ["platform", "everyone"]},
    "nina": {"sub": "nina-sub", "email": "nina@example.org", "email_verified": True, "preferred_username": "nina"},
    "mallory": {"sub": "mallory-sub", "email": "mallory@example.org", "email_verified": True},
}


@pytest.fixture(scope="module")
def op(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CertifiedOidcProvider]:
    """One provider for the module; each test signs in with a browser of its own."""
    with CertifiedOidcProvider(tmp_path_factory.mktemp("oidc-provider"), CLIENT_ID, CLIENT_SECRET,
                               f"{BASE}/auth/oidc/callback", ACCOUNTS,
                               userinfo_sub={"mallory": "bob-sub"}) as provider:  # its userinfo names bob
        yield provider


def configure(ws: Workspace, op: CertifiedOidcProvider, **more: object) -> None:
    s = ws.settings
    s.public_url, s.oidc_issuer, s.oidc_client_id = BASE, op.issuer, CLIENT_ID
    s.oidc_client_secret, s.oidc_label = SecretStr(CLIENT_SECRET), "Certified IdP"
    s.oidc_scopes = "openid email profile groups"
    for name, value in more.items():
        setattr(s, name, value)


@pytest.fixture
def client(workspace: Workspace, op: CertifiedOidcProvider, people: People) -> Iterator[TestClient]:
    configure(workspace, op, oidc_groups_claim="groups")
    link_identity(workspace, people.admin, "bob", op.issuer, "bob-sub")
    with TestClient(create_app(workspace.settings, workers=0)) as app_client:
        yield app_client


def state_of(url: str) -> str:
    return re.search(r"[?&]state=([^&]+)", url).group(1)  # type: ignore[union-attr]


def test_groups_email_and_username_from_userinfo_count(client: TestClient, op: CertifiedOidcProvider,
                                                      workspace: Workspace, people: People, clone: Clone) -> None:
    from gateway.services.change.proposals import open_proposal

    clone.branch("bigger").edit("stacks/app-staging/main.tf", '"t3.small"', '"t3.medium"').push()
    proposal = open_proposal(workspace, people.alice, "bigger", "more memory")
    answer = client.get(op.sign_in(start(client), "bob"), follow_redirects=False)
    assert answer.status_code == 303, answer.text
    signed = events(workspace, "sign_in")[-1]
    assert signed["claimed_groups"] == ["everyone", "platform"] and signed["counted_groups"] == ["platform"]
    assert signed["claims_from"] == {"email": "userinfo", "email_verified": "userinfo", "groups": "userinfo",
                                     "name": "userinfo", "preferred_username": "userinfo"}
    form = client.get(f"/proposals/{proposal.id}").text
    head = re.search(r'id="head-sha"[^>]*>([0-9a-f]+)<', form).group(1)  # type: ignore[union-attr]
    approved = client.post(f"/proposals/{proposal.id}/decide", data={
        "csrf": csrf_of(form), "decision": "approve", "sha": head}, follow_redirects=False)
    assert approved.status_code == 303, approved.text
    assert events(workspace, "approval")[-1]["authenticated_by"] == f"oidc:{op.issuer}"


def test_a_verified_domain_from_userinfo_is_admitted(workspace: Workspace, op: CertifiedOidcProvider,
                                                    people: People) -> None:
    configure(workspace, op, admit_domains="example.org")
    with TestClient(create_app(workspace.settings, workers=0)) as client:
        answer = client.get(op.sign_in(start(client), "nina"), follow_redirects=False)
        assert answer.status_code == 303, answer.text
        assert "nina (requester)" in client.get("/").text
    [admitted] = events(workspace, "principal.admitted")
    assert admitted["because"] == "verified e-mail domain example.org" and admitted["subject"] == "nina-sub"
    assert events(workspace, "sign_in")[-1]["claims_from"]["email"] == "userinfo"


def test_userinfo_that_names_another_subject_is_refused(client: TestClient, op: CertifiedOidcProvider,
                                                       workspace: Workspace, people: People) -> None:
    link_identity(workspace, people.admin, "carol", op.issuer, "mallory-sub")
    page = client.get(op.sign_in(start(client), "mallory"), follow_redirects=False)
    assert page.status_code == 401 and "userinfo" in page.text and "bob-sub" in page.text, page.text
    assert refused(workspace) == ["userinfo"]
    assert client.get("/", follow_redirects=False).headers["location"] == "/login"  # nobody signed in
    assert events(workspace, "sign_in") == []


def test_the_provider_saying_no_is_shown_and_a_forged_no_is_not(client: TestClient, op: CertifiedOidcProvider,
                                                                workspace: Workspace) -> None:
    url = start(client)  # the person's sign-in, in progress at the provider
    # a page elsewhere makes the person's browser fetch a forged refusal, with and without a made-up state
    for forged in ("/auth/oidc/callback?error=access_denied&error_description=Call+0800+FRAUD+to+unlock",
                   "/auth/oidc/callback?error=access_denied&error_description=Call+0800+FRAUD+to+unlock&state=x"):
        page = client.get(forged, follow_redirects=False)
        assert page.status_code == 401 and "FRAUD" not in page.text and "access_denied" not in page.text
    # ... and the person's own sign-in goes on, undisturbed
    assert client.get(op.sign_in(url, "bob"), follow_redirects=False).status_code == 303
    assert refused(workspace) == ["state", "state"]

    # the provider's own refusal, with the sign-in's state, is believed and shown
    cancelled = client.get(op.sign_in(start(client), "bob", abort=True), follow_redirects=False)
    assert cancelled.status_code == 401
    assert "the identity provider refused the sign-in: End-User aborted interaction" in cancelled.text
    assert refused(workspace) == ["state", "state", "provider_error"]


def test_unauthenticated_refusals_append_a_bounded_number_of_events(client: TestClient, workspace: Workspace) -> None:
    for n in range(20):
        page = client.get(f"/auth/oidc/callback?error=access_denied&error_description=spam+{n}",
                          follow_redirects=False)
        assert page.status_code == 401
    assert refused(workspace) == ["state"] * 5  # the rest are counted, and the next one recorded says how many


def test_a_copied_cookie_cannot_replay_the_state(client: TestClient, op: CertifiedOidcProvider,
                                                 workspace: Workspace) -> None:
    url = start(client)
    copy = TestClient(client.app)  # another browser with a copy of the cookie as it was before the callback
    copy.cookies.update(dict(client.cookies))
    callback = op.sign_in(url, "bob")
    assert client.get(callback, follow_redirects=False).status_code == 303
    replayed = copy.get(callback, follow_redirects=False)
    assert replayed.status_code == 401 and "already used" in replayed.text
    assert refused(workspace) == ["state"]  # refused here: the provider was not asked to redeem the code again
    assert copy.get("/", follow_redirects=False).headers["location"] == "/login"


def test_two_tabs_sign_in_at_once(client: TestClient, op: CertifiedOidcProvider, workspace: Workspace) -> None:
    tabs = []
    for _ in range(2):  # two tabs of one browser: each opened the gateway, was sent to sign in, and pressed it
        assert client.get("/", follow_redirects=False).headers["location"] == "/login"
        tabs.append(start(client))
    first, second = tabs
    assert state_of(first) != state_of(second)
    with httpx.Client() as browser:  # one browser at the provider too
        second_callback = op.sign_in(second, "bob", browser)
        first_callback = op.sign_in(first, "bob", browser)
    for callback in (second_callback, first_callback):
        page = client.get(callback, follow_redirects=False)
        assert page.status_code == 303, page.text
    assert "bob (approver)" in client.get("/").text
    assert refused(workspace) == [] and len(events(workspace, "sign_in")) == 2


def test_a_spent_or_unknown_state_says_so_without_blaming_the_person(client: TestClient, op: CertifiedOidcProvider,
                                                                     workspace: Workspace) -> None:
    callback = op.sign_in(start(client), "bob")
    assert client.get(callback, follow_redirects=False).status_code == 303
    again = client.get(callback, follow_redirects=False)
    assert again.status_code == 401 and "already used" in again.text and "forged" not in again.text
    stranger = TestClient(client.app).get(callback, follow_redirects=False)
    assert stranger.status_code == 401 and "not started in this browser" in stranger.text
    assert refused(workspace) == ["state", "state"]

