"""A person signs in with OpenID Connect in a real browser (Debian's Chromium through Playwright), sees what waits
for them, approves it from the page, and the decision records how they were authenticated."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from pydantic import SecretStr

from gateway.api.app import create_app
from gateway.services.admin.sign_in import link_identity
from gateway.services.workspace import Workspace

from .conftest import Clone, People
from .identity_providers import FakeOidcProvider, Person
from .test_pages import ARTIFACTS, browser  # noqa: F401 - the module's browser fixture

CLIENT_ID, CLIENT_SECRET = "gateway-pages", "browser-test-client-secret"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def live(workspace: Workspace, people: People) -> Iterator[tuple[str, FakeOidcProvider]]:
    """The gateway on a loopback port, signing in with a provider on another."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    with FakeOidcProvider(CLIENT_ID, CLIENT_SECRET, f"{base}/auth/oidc/callback") as idp:
        s = workspace.settings
        s.public_url, s.oidc_issuer, s.oidc_client_id = base, idp.issuer, CLIENT_ID
        s.oidc_client_secret, s.oidc_label, s.oidc_groups_claim = SecretStr(CLIENT_SECRET), "Test IdP", "groups"
        link_identity(workspace, people.admin, "bob", idp.issuer, "00u-bob")
        server = uvicorn.Server(uvicorn.Config(create_app(s, workers=0), host="127.0.0.1", port=port,
                                               log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 20
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        yield base, idp  # type: ignore[misc]
        server.should_exit = True
        thread.join(timeout=10)


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
