"""The review pages in a real browser (Debian's Chromium driven by Playwright) against a live server."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from gateway.api.app import create_app
from gateway.services.workspace import Workspace

from .conftest import People
from .model_stub import ModelStub, tool_call

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
QUEUE = 'resource "aws_sqs_queue" "refunds" {\n  name = "refunds-staging"\n  tags = local.tags\n}\n'

playwright_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail("Chromium is not installed; .ci/run installs Debian's chromium package")
        pytest.skip("Chromium is not installed")
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        yield browser
        browser.close()


@pytest.fixture
def server(workspace: Workspace, people: People) -> Iterator[tuple[str, ModelStub]]:
    with ModelStub([tool_call("read_file", path="stacks/app-staging/main.tf"),
                    tool_call("write_file", path="stacks/app-staging/queue.tf", content=QUEUE),
                    tool_call("run_preview", stack="app-staging"),
                    tool_call("finish", summary="Added aws_sqs_queue.refunds; nothing is destroyed.")]) as stub:
        workspace.settings.openai_base_url, workspace.settings.model = stub.base_url, "stub-model"
        with _serving(workspace) as base:
            yield base, stub


@contextlib.contextmanager
def _serving(workspace: Workspace) -> Iterator[str]:
    """The gateway's app of `workspace`, served by uvicorn in a thread on a free port: its base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(create_app(workspace.settings), host="127.0.0.1", port=port, log_level="warning")
    live = uvicorn.Server(config)
    thread = threading.Thread(target=live.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not live.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        live.should_exit = True
        thread.join(timeout=10)


def sign_in(browser: object, base: str, token: str):  # type: ignore[no-untyped-def]
    context = browser.new_context(accept_downloads=True)  # type: ignore[attr-defined]
    page = context.new_page()
    page.goto(f"{base}/login")
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")
    return context, page


def test_request_review_apply_and_audit_in_the_browser(browser: object, server: tuple[str, ModelStub],
                                                       people: People, workspace: Workspace) -> None:
    base, _ = server
    # a requester signs in and submits a change; the agent's progress shows, then the proposal
    alice_ctx, alice = sign_in(browser, base, people.tokens["alice"])
    cookie = next(c for c in alice_ctx.cookies() if c["name"] == "gateway_session")
    # Lax, not Strict: the identity provider sends people back with a top-level GET from its own site
    assert cookie["httpOnly"] and cookie["sameSite"] == "Lax"
    alice.goto(f"{base}/requests/new")
    alice.fill("textarea[name=text]", "Add a refunds queue to staging")
    alice.click("button[type=submit]")
    alice.wait_for_selector("#proposal-link", timeout=60_000)
    assert alice.locator("#run-status").inner_text() == "done"
    assert alice.locator("#progress li").count() >= 4
    alice.click("#proposal-link")
    assert "aws_sqs_queue.refunds" in alice.content()
    proposal_url = alice.url
    # ... she sees no Approve button, and a forged approve POST is refused
    assert alice.locator("button.approve").count() == 0
    csrf = alice.locator("input[name=csrf]").first.get_attribute("value")
    head = alice.locator("#head-sha").inner_text()
    forged = alice.request.post(f"{proposal_url}/decide", form={"csrf": csrf, "decision": "approve", "sha": head})
    assert forged.status == 403 and "alice requested this change" in forged.text()
    no_csrf = alice.request.post(f"{proposal_url}/decide", form={"csrf": "forged", "decision": "approve", "sha": head})
    assert no_csrf.status == 403 and "CSRF" in no_csrf.text()
    ARTIFACTS.mkdir(exist_ok=True)
    alice.screenshot(path=str(ARTIFACTS / "proposal-page-requester.png"), full_page=True)

    # an approver signs in, approves, applies and sees it applied
    bob_ctx, bob = sign_in(browser, base, people.tokens["bob"])
    bob.goto(proposal_url)
    bob.fill("textarea[name=comment]", "queue is tagged and encrypted by default")
    bob.click("button.approve")
    bob.wait_for_selector("#apply")
    assert "current" in bob.locator("#decisions").inner_text()
    bob.screenshot(path=str(ARTIFACTS / "proposal-page.png"), full_page=True)
    bob.click("#apply")
    bob.wait_for_selector("#applied")
    assert "Applied and merged" in bob.locator("#applied").inner_text()

    # an auditor finds the change by resource address and exports it
    dana_ctx, dana = sign_in(browser, base, people.tokens["dana"])
    dana.goto(f"{base}/audit/events")
    assert "Chain verified" in dana.locator("#verify").inner_text()
    dana.fill("input[name=address]", "aws_sqs_queue.refunds")
    dana.click("form button[type=submit]")
    table = dana.locator("#events").inner_text()
    assert "approval" in table and "apply.succeeded" in table and "merged" in table
    with dana.expect_download() as download_info:
        dana.click("#export-csv")
    exported = Path(download_info.value.path()).read_text()
    assert exported.startswith("seq,id,at,actor") and "aws_sqs_queue.refunds" in exported and "merged" in exported
    # auditors get no buttons on proposals either
    dana.goto(proposal_url)
    assert dana.locator("button.approve").count() == 0 and dana.locator("button.reject").count() == 0
    for ctx in (alice_ctx, bob_ctx, dana_ctx):
        ctx.close()


def test_signing_out_and_a_wrong_token(browser: object, server: tuple[str, ModelStub], people: People) -> None:
    base, _ = server
    context = browser.new_context()  # type: ignore[attr-defined]
    page = context.new_page()
    page.goto(f"{base}/")
    assert page.url.endswith("/login")
    page.fill("input[name=token]", "gw_wrong")
    page.click("button[type=submit]")
    assert "the token is not valid" in page.content()
    page.fill("input[name=token]", people.tokens["bob"])
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")
    page.click("text=Sign out")
    page.wait_for_url(f"{base}/login")
    page.goto(f"{base}/audit")
    assert page.url.endswith("/login")
    context.close()


def test_an_agent_token_opens_no_session(browser: object, server: tuple[str, ModelStub], people: People) -> None:
    base, _ = server
    context = browser.new_context()  # type: ignore[attr-defined]
    page = context.new_page()
    page.goto(f"{base}/login")
    page.fill("input[name=token]", people.tokens["infra-agent"])
    page.click("button[type=submit]")
    assert "agents cannot sign in" in page.content()
    page.goto(f"{base}/")
    assert page.url.endswith("/login")
    context.close()


def test_the_repository_picker_and_the_inbox_across_repositories_in_the_browser(browser: object,
                                                                                tmp_path: Path) -> None:
    from .test_pages_repositories import _propose
    from .test_repositories import _two

    two = _two(tmp_path / "home", tmp_path)
    theirs = _propose(two, two.data, "network", "data-browser")
    try:
        with _serving(two.ws) as base:
            context, erin = sign_in(browser, base, two.people.tokens["erin"])
            erin.click("#repositories >> text=data")  # the picker: the same page in repository data
            erin.wait_for_url(f"{base}/repos/data/")
            assert erin.locator("#repositories [aria-current=page]").inner_text() == "data"
            with erin.expect_navigation() as opened:
                erin.click(f"#inbox-{theirs} a")
            assert opened.value.request.redirected_from is None and erin.url == f"{base}/repos/data/proposals/{theirs}"
            assert erin.locator("#repository").inner_text() == "data"
            ARTIFACTS.mkdir(exist_ok=True)
            erin.screenshot(path=str(ARTIFACTS / "proposal-page-repository.png"), full_page=True)
            erin.click("header >> text=Drift")  # the header's links stay in data
            erin.wait_for_url(f"{base}/repos/data/drift")
            context.close()
    finally:
        two.ws.close()
