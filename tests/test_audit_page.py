"""The auditor's page in Chromium for a period of 1,000 changes: it opens on the exceptions, within the first screen,
the population a click away, a page at a time, and a change's evidence verifiable from the page. The 1,000 changes
are written straight into the trail through the store's append path (tests/audit_period.py), since this is about
reading them; test_audit_evidence.py builds its changes through the real path. Screenshots go to test-artifacts/."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
import uvicorn

from gateway import evidence_verifier
from gateway.adapters.store.rows import now
from gateway.api.app import create_app
from gateway.domain.audit_period import parse_period
from gateway.domain.change_population import Scope, build_population
from gateway.domain.principals import GATEWAY
from gateway.services.admin import audit as audit_service
from gateway.services.admin.evidence import KeptPeriods, change_population, public_key, resolve_period
from gateway.services.workspace import Workspace

from .audit_period import around_entries, change_entries, write_period
from .conftest import People, add_people, make_workspace
from .test_audit import run_one_change
from .test_pages import ARTIFACTS, browser  # noqa: F401 - the module's browser fixture

CHANGES = 1000


def test_a_kept_population_caught_up_with_the_trail_is_the_one_read_afresh(workspace: Workspace,
                                                                            people: People) -> None:
    """The page keeps a period's events and reads only what the trail added since: whatever was added (a change's
    next event, a new change, one that began before and applies now, a push, a window, a sign-in), it shows what a
    fresh read shows."""
    ws = workspace
    written = write_period(ws, 120)
    started_before = 500  # requested, proposed and planned now; applied after the page was first read
    early = [e for e in change_entries(started_before, written) if not e[1].startswith(("proposal.start", "apply.",
                                                                                        "proposal.finish", "merged"))]
    late = [e for e in change_entries(started_before, written) if e not in early]
    with ws.store.session() as session:
        session.audit.append_many(early)
    period = resolve_period(ws, "2000..2999")
    before = change_population(ws, people.dana, period)
    with ws.store.session() as session:
        session.audit.append_many([*change_entries(121, written), *late, *around_entries(300, 1), *around_entries(100),
                                   (GATEWAY, "sign_in", {"auth_method": "web-session"}, None, [])])
    caught_up = change_population(ws, people.dana, period)
    with ws.store.session(readonly=True) as session:
        afresh = KeptPeriods().read(session, ws.settings.db_url, period, session.audit.chain_head()).population(
            Scope(), caught_up.rows[0].repository, {name: None for name in ws.repo_settings().stacks})
        everything = list(session.audit.iter())
    assert len(caught_up.rows) == len(before.rows) + 2 and started_before in {r.proposal_id for r in caught_up.rows}
    assert caught_up.to_json() == afresh.to_json()
    assert caught_up.to_json() == build_population(everything, period, Scope(), caught_up.rows[0].repository,
                                                   {name: None for name in ws.repo_settings().stacks}).to_json()
    assert len(caught_up.exceptions) > len(before.exceptions)  # the new push and window are among them


@contextmanager
def served(ws: Workspace) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(ws.settings, workers=0), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture
def thousand(tmp_path: Path) -> Iterator[tuple[Workspace, People, int]]:
    """One change made through the real path (its evidence is real), then 1,000 written into the trail."""
    ws = make_workspace(tmp_path / "home")
    people = add_people(ws)
    real = run_one_change(ws, people, tmp_path)
    write_period(ws, CHANGES, first=real + 1)
    audit_service.sign_checkpoint(ws, people.dana)  # as workers do every few minutes
    yield ws, people, real
    ws.close()


def test_the_auditor_s_page_for_1000_changes_opens_on_the_exceptions(browser: object,  # noqa: F811
                                                                      thousand: tuple[Workspace, People, int]) -> None:
    ws, people, real = thousand
    today = now().date()
    period = f"{today - timedelta(days=1)}..{today + timedelta(days=1)}"
    population = change_population(ws, people.dana, parse_period(period))
    assert len(population.rows) == CHANGES + 1
    ARTIFACTS.mkdir(exist_ok=True)
    with served(ws) as base:
        context = browser.new_context(viewport={"width": 1280, "height": 800},  # type: ignore[attr-defined]
                                      accept_downloads=True)
        page = context.new_page()
        page.goto(f"{base}/login")
        page.fill("input[name=token]", people.tokens["dana"])
        page.click("button[type=submit]")
        page.wait_for_url(f"{base}/")
        page.click("header >> text=Audit")
        page.goto(f"{base}/audit?period={period}")
        page.screenshot(path=str(ARTIFACTS / "audit-first-screen.png"))
        page.screenshot(path=str(ARTIFACTS / "audit-page.png"), full_page=True)

        heading = page.locator("#exceptions-heading")
        assert heading.inner_text() == f"Exceptions: sample these first ({len(population.exceptions)})"
        box = heading.bounding_box()
        assert box is not None and box["y"] < 300  # the first thing below the figures, on the first screen
        first_rows = page.locator("#exceptions tr.exception")
        assert first_rows.count() == min(50, len(population.exceptions))
        assert first_rows.nth(0).bounding_box()["y"] < 800  # type: ignore[index]
        assert [first_rows.nth(i).locator("td").nth(3).inner_text() for i in range(3)] == [
            x.summary for x in population.exceptions[:3]]
        assert page.locator("#counts strong").inner_text() == str(CHANGES + 1)
        kinds = page.locator("#exception-kinds").inner_text()
        assert kinds.startswith("25 override, 3 break-glass, 5 pushed-outside, 10 drift-revert")
        assert "PASS (1001 applies)" in kinds
        assert page.locator("#check-approvals-of-what-ran td").first.inner_text() == "PASS"
        assert page.locator("#check-requester-is-not-approver td").first.inner_text() == "PASS"
        assert (page.locator("#exceptions-section").bounding_box()["y"]  # type: ignore[index]
                < page.locator("#checks").bounding_box()["y"] < page.locator("#period-form").bounding_box()["y"])

        page.click("#more-exceptions a")  # every one, on demand
        assert page.locator("#exceptions tr.exception").count() == len(population.exceptions)
        page.click("#population-link")
        assert page.locator("#population tr").count() == 101  # a header and a hundred changes
        assert "Page 1 of 11" in page.locator("#pager").inner_text()
        page.click("#next-page")
        assert "Page 2 of 11" in page.locator("#pager").inner_text()
        page.screenshot(path=str(ARTIFACTS / "audit-population.png"))

        page.goto(f"{base}/audit/evidence/{real}")
        assert page.locator("#evidence-title").inner_text() == f"Evidence: proposal {real}"
        assert "python3 verify_evidence.py" in page.locator("#how-to-verify").inner_text()
        page.screenshot(path=str(ARTIFACTS / "audit-evidence.png"), full_page=True)
        with page.expect_download() as download:
            page.click("#download-json")
        bundle = Path(download.value.path()).read_bytes()
        context.close()
    assert evidence_verifier.verify(bundle, public_key(ws)[1])[0].endswith("VERIFIED")
    assert json.loads(bundle)["change"]["proposal"] == real
