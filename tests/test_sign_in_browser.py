"""A person signs in with OpenID Connect in a real browser (Debian's Chromium through Playwright), sees what waits
for them, approves it from the page, and the decision records how they were authenticated: with the in-repo
provider, and at a certified one (oidc-provider, whose login and consent pages the person fills in)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import uvicorn
from pydantic import SecretStr

from gateway.api.app import create_app
from gateway.services.admin.sign_in import link_identity
from gateway.services.workspace import Workspace

from .certified_provider import CertifiedOidcProvider
from .conftest import Clone, People
from .identity_providers import FakeOidcProvider, Person
from .test_pages import ARTIFACTS, browser  # noqa: F401 - the module's browser fixture

CLIENT_ID, CLIENT_SECRET = "gateway-pages", "browser-test-client-secret"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def served(workspace: Workspace, port: int) -> Iterator[None]:
    """The gateway's app served by uvicorn on a loopback port, in a thread."""
    server = uvicorn.Server(uvicorn.Config(create_app(workspace.settings, workers=0), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield
    server.should_exit = True
    thread.join(timeout=10)


def configure(workspace: Workspace, people: People, base: str, issuer: str, subject: str) -> None:
    s = workspace.settings
    s.public_url, s.oidc_issuer, s.oidc_client_id = base, issuer, CLIENT_ID
    s.oidc_client_secret, s.oidc_label, s.oidc_groups_claim = SecretStr(CLIENT_SECRET), "Test IdP", "groups"
    s.oidc_scopes = "openid email profile groups"
    link_identity(workspace, people.admin, "bob", issuer, subject)


@pytest.fixture
def live(workspace: Workspace, people: People) -> Iterator[tuple[str, FakeOidcProvider]]:
    """The gateway on a loopback port, signing in with a provider on another."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    with FakeOidcProvider(CLIENT_ID, CLIENT_SECRET, f"{base}/auth/oidc/callback") as idp:
        configure(workspace, people, base, idp.issuer, "00u-bob")
        with served(workspace, port):
            yield base, idp  # type: ignore[misc]


def test_sign_in_with_oidc_see_the_inbox_and_approve(browser: object, live: tuple[str, FakeOidcProvider],  # noqa: F811
                                                     workspace: Workspace, people: People, clone: Clone) -> None:
    from gateway.services.change.proposals import open_proposal

    base, idp = live
    clone.branch("bigger").edit("stacks/app-staging/main.tf", '"t3.small"', '"t3.medium"').push()
    proposal = open_proposal(workspace, people.alice, "bigger", "more memory")
    idp.sign_in_as(Person("00u-bob", "robert@example.com", username="robert", groups=["platform", "everyone"]))

    context = browser.new_context()  # type: ignore[attr-defined]
    page = context.new_page()
    page.goto(f"{base}/")
    assert page.url == f"{base}/login"
    page.click("#sign-in-oidc")  # to the provider and back
    page.wait_for_url(f"{base}/")
    assert "bob (approver)" in page.locator("header").inner_text()
    cookie = next(c for c in context.cookies() if c["name"] == "gateway_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Lax"

    inbox = page.locator(f"#inbox-{proposal.id}").inner_text()
    assert "you are in approver group platform of app-staging" in inbox and "1 approval(s) needed" in inbox
    page.click(f"#inbox-{proposal.id} a")
    page.fill("textarea[name=comment]", "bigger instance is fine")
    page.click("button.approve")
    page.wait_for_selector("#decisions .auth")
    assert page.locator("#decisions .auth").first.inner_text() == f"oidc:{idp.issuer}"
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "oidc-approval.png"), full_page=True)

    with workspace.store.session(readonly=True) as session:
        [approval] = session.audit.events(proposal_id=proposal.id, kind="approval")
        [check] = session.audit.events(proposal_id=proposal.id, kind="sign_in.group_check")
    assert approval.actor == "bob" and approval.payload["authenticated_by"] == f"oidc:{idp.issuer}"
    assert check.payload["claimed"] == ["everyone", "platform"] and check.payload["active"] == ["platform"]

    # signing out ends the session: back to the sign-in page, and the inbox is out of reach
    page.goto(f"{base}/")
    page.click("header button")
    page.wait_for_url(f"{base}/login")
    page.goto(f"{base}/")
    assert page.url == f"{base}/login"
    context.close()


def test_sign_in_at_a_certified_provider_in_a_browser(browser: object, workspace: Workspace,  # noqa: F811
                                                      people: People, clone: Clone, tmp_path: Path) -> None:
    from gateway.services.change.proposals import open_proposal

    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    accounts = {"bob": {"sub": "bob-sub", "email": "robert@example.com", "email_verified": True,
                        "preferred_username": "robert", "groups": ["platform", "everyone"]}}
    clone.branch("bigger").edit("stacks/app-staging/main.tf", '"t3.small"', '"t3.medium"').push()
    proposal = open_proposal(workspace, people.alice, "bigger", "more memory")
    with CertifiedOidcProvider(tmp_path / "op", CLIENT_ID, CLIENT_SECRET, f"{base}/auth/oidc/callback",
                               accounts) as op:
        configure(workspace, people, base, op.issuer, "bob-sub")
        with served(workspace, port):
            context = browser.new_context()  # type: ignore[attr-defined]
            page = context.new_page()
            page.goto(f"{base}/")
            page.click("#sign-in-oidc")  # to the provider's own sign-in page
            page.fill("input[name=login]", "bob")
            page.fill("input[name=password]", "any password")
            page.click("button[type=submit]")
            page.click("button[type=submit]")  # its consent page: Continue
            page.wait_for_url(f"{base}/")
            assert "bob (approver)" in page.locator("header").inner_text()
            # the groups came from the provider's userinfo, so platform counts and the proposal waits for bob
            inbox = page.locator(f"#inbox-{proposal.id}").inner_text()
            assert "you are in approver group platform of app-staging" in inbox
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "oidc-certified-provider.png"), full_page=True)
            context.close()
    with workspace.store.session(readonly=True) as session:
        signed = session.audit.events(kind="sign_in")[-1].payload
    assert signed["counted_groups"] == ["platform"] and signed["claims_from"]["groups"] == "userinfo"
