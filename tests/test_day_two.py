"""Day two on the simulator: drift found on a schedule and recorded, shown first on later proposals, and
closed by a revert or a codify; rollback of an applied change; import proven by a plan with no changes;
break-glass windows with a codify deadline."""

from __future__ import annotations

import html
import json
import re
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.exc import IntegrityError

from agents.llm import ChatModel
from gateway.adapters.store.rows import now
from gateway.api.app import create_app
from gateway.composition import known_secret_values, reactions
from gateway.domain.declaration_edit import import_declaration
from gateway.domain.errors import GatewayError, Refused
from gateway.domain.preview import render_json, render_markdown, render_text
from gateway.domain.principals import Principal, Role
from gateway.domain.proposal import Decision
from gateway.services.admin.users import add_principal
from gateway.services.agents.agent_requests import submit_request
from gateway.services.change.proposals import abandon_proposal, decide, get_proposal, open_proposal, proposal_previews
from gateway.services.change.runner import apply_proposal
from gateway.services.change.views import view_proposal
from gateway.services.day_two.break_glass import (
    acknowledge_break_glass,
    break_glass_story,
    close_break_glass,
    confirm_break_glass,
    open_break_glass,
    overdue_windows,
    sweep_break_glass,
)
from gateway.services.day_two.codify import codify_drift
from gateway.services.day_two.drift import revert_drift
from gateway.services.day_two.drift_records import check_drift, check_scheduled_drift, list_drift_records
from gateway.services.day_two.imports import import_resource
from gateway.services.day_two.rollback import rollback_proposal
from gateway.services.workspace import Workspace
from gateway.worker import Worker

from .conftest import Clone, People, add_people, run_cli
from .fakes import FakeClone, sandbox_workspace
from .model_stub import ModelStub, tool_call


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    """The sample repo in memory (tests/fakes.py's sandbox_workspace): the real engine and simulated cloud over a
    fake store and a fake repo, for the rules of day two; the commands, pages, workers and databases below run on
    a real workspace. Its clock is a FakeClock: a window runs out when the test moves the clock, not after a sleep."""
    sample = sandbox_workspace(tmp_path / "home")
    sample.reactions = reactions()  # an applied revert or codify settles the stack's drift, as in the gateway
    return sample


def every(ws: Workspace, clone: Clone | FakeClone, stack: str, interval: str) -> None:
    """Main's gateway.yaml asks workers to check `stack` for drift every `interval`."""
    clone.branch("main")
    yaml = clone.read("gateway.yaml").replace(f"    path: stacks/{stack}\n",
                                              f"    path: stacks/{stack}\n    drift: {{interval: {interval}}}\n")
    clone.write("gateway.yaml", yaml).push(f"check {stack} for drift every {interval}", author="admin")


def console_edit(ws: Workspace) -> None:
    ws.simulator.edit_object("app-staging", "aws_instance.web[0]", {"instance_type": "t3.medium"})


def approve_and_apply(ws: Workspace, people: People, proposal_id: int) -> None:
    decide(ws, people.bob, proposal_id, Decision.APPROVE, "ok")
    report = apply_proposal(ws, people.admin, proposal_id)
    assert report.succeeded, report


def test_the_scheduled_check_records_drift_and_a_later_proposal_shows_it_first(ws: Workspace, team: People,
                                                                               checkout: FakeClone) -> None:
    every(ws, checkout, "app-staging", "6h")
    start = now()
    assert [c.outcome for c in check_scheduled_drift(ws, start)] == ["clean"]  # first check: nothing yet
    console_edit(ws)
    assert check_scheduled_drift(ws, start + timedelta(hours=1)) == []  # not due yet
    [check] = check_scheduled_drift(ws, start + timedelta(hours=7))
    assert check.outcome == "opened" and check.record is not None
    [entry] = check.record.resources
    assert entry.address == "aws_instance.web[0]"
    assert [(a.path, a.before, a.after) for a in entry.attributes] == [("instance_type", '"t3.small"', '"t3.medium"')]
    [record] = list_drift_records(ws, team.bob, only_open=True)
    assert record.id == check.record.id and not record.expected

    checkout.branch("more-tags").edit("stacks/app-staging/main.tf", '"cc-3003"', '"cc-3004"').push()
    proposal = open_proposal(ws, team.alice, "more-tags", "new cost centre")
    preview = proposal_previews(ws, proposal)["app-staging"]
    text = render_text(preview)
    assert text.startswith(f"OPEN DRIFT on this stack (drift record {record.id}")
    assert 'this apply would revert: aws_instance.web[0] (instance_type: now "t3.medium", declared "t3.small")' in text
    assert text.index("OPEN DRIFT") < text.index("Plan (")
    assert render_markdown(preview).startswith("> :warning: **Open drift on this stack**")
    assert json.loads(render_json(preview))["open_drift"][0]["reverts"][0]["address"] == "aws_instance.web[0]"


def test_workers_run_the_check_on_the_schedule(workspace: Workspace, people: People, clone: Clone) -> None:
    every(workspace, clone, "app-staging", "1s")
    console_edit(workspace)
    worker = Worker(workspace, loops=1, poll_seconds=0.1).start()
    try:
        deadline = time.monotonic() + 30
        while not list_drift_records(workspace, people.bob) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        worker.stop()
    [record] = list_drift_records(workspace, people.bob)
    assert record.stack == "app-staging" and record.addresses == ["aws_instance.web[0]"]
    with workspace.store.session(readonly=True) as session:
        [opened] = session.audit.events(kind="drift.opened")
    assert opened.actor == "gateway" and opened.payload["drifted"] == {"aws_instance.web[0]": ["instance_type"]}


def test_a_revert_closes_the_drift_record(ws: Workspace, team: People) -> None:
    console_edit(ws)
    record = check_drift(ws, team.admin, "app-staging").record
    assert record is not None
    revert = revert_drift(ws, team.admin, "app-staging")
    assert revert.proposal is not None
    preview = render_text(proposal_previews(ws, revert.proposal)["app-staging"])
    assert preview.startswith(f"OPEN DRIFT on this stack (drift record {record.id}")
    approve_and_apply(ws, team, revert.proposal.id)
    [closed] = list_drift_records(ws, team.bob)
    assert closed.status.value == "closed" and closed.closed_by_proposal == revert.proposal.id
    assert "a revert of the drift" in (closed.closed_reason or "")
    assert ws.simulator.get_object("aws_instance", _instance_id(ws))["instance_type"] == "t3.small"


def test_codify_writes_the_declaration_proves_it_with_no_changes_and_closes_the_record(
        ws: Workspace, team: People, checkout: FakeClone) -> None:
    console_edit(ws)
    record = check_drift(ws, team.admin, "app-staging").record
    assert record is not None
    proposal = codify_drift(ws, team.alice, "app-staging")
    assert proposal.branch == f"codify/app-staging-{record.id}"
    assert not proposal.plans["app-staging"].has_changes  # the proof: the declaration now matches reality
    assert 'instance_type          = "t3.medium"' in ws.repo.diff(proposal.base_sha, proposal.head_sha)
    approve_and_apply(ws, team, proposal.id)
    [closed] = list_drift_records(ws, team.bob)
    assert closed.status.value == "closed" and closed.closed_by_proposal == proposal.id
    assert "a codify" in (closed.closed_reason or "")
    assert ws.simulator.get_object("aws_instance", _instance_id(ws))["instance_type"] == "t3.medium"
    assert check_drift(ws, team.admin, "app-staging").outcome == "clean"


def test_codify_refuses_what_it_cannot_write_and_names_it(ws: Workspace, team: People) -> None:
    ws.simulator.edit_object("app-staging", "aws_instance.web[0]", {"tags": {"Name": "renamed"}})
    check_drift(ws, team.admin, "app-staging")
    with pytest.raises(Refused, match=r"aws_instance.web\[0\].tags.Name: not a top-level attribute"):
        codify_drift(ws, team.alice, "app-staging")
    assert not ws.repo.branch_exists("codify/app-staging-1")


def test_drift_commands(workspace: Workspace, people: People) -> None:
    console_edit(workspace)
    home = workspace.settings.home
    checked = run_cli(["drift", "check", "--stack", "app-staging"], home, people.tokens["alice"])
    assert checked.returncode == 0, checked.stderr
    assert "app-staging: drift record 1 opened" in checked.stdout
    assert 'instance_type: "t3.small" (recorded) -> "t3.medium" (now)' in checked.stdout
    listed = run_cli(["drift", "list", "--open"], home, people.tokens["dana"])
    assert listed.returncode == 0 and "app-staging" in listed.stdout and "OPEN" in listed.stdout
    agent = run_cli(["drift", "check"], home, people.tokens["infra-agent"])
    assert agent.returncode == 1 and "infra-agent may not start a drift check" in agent.stderr


def _instance_id(ws: Workspace) -> str:
    state = ws.simulator.read_state("app-staging")
    assert state is not None
    return state.resources["aws_instance.web[0]"].id


def sign_in(client: TestClient, token: str) -> None:
    form = client.get("/login").text
    csrf = re.search(r'name="csrf" value="([^"]+)"', form)
    assert csrf is not None
    assert client.post("/login", data={"token": token, "csrf": csrf.group(1)}, follow_redirects=False).status_code == 303


def test_drift_over_http_and_on_the_pages(workspace: Workspace, people: People, clone: Clone) -> None:
    console_edit(workspace)
    record = check_drift(workspace, people.admin, "app-staging").record
    assert record is not None
    clone.branch("more-tags").edit("stacks/app-staging/main.tf", '"cc-3003"', '"cc-3004"').push()
    proposal = open_proposal(workspace, people.alice, "more-tags", "new cost centre")
    with TestClient(create_app(workspace.settings, workers=0)) as client:
        listed = client.get("/api/v1/drift?open=true", headers={"Authorization": f"Bearer {people.tokens['dana']}"})
        assert listed.status_code == 200
        [public] = listed.json()
        assert public["id"] == record.id and public["status"] == "open"
        assert public["resources"][0]["attributes"] == [{"path": "instance_type", "before": '"t3.small"',
                                                         "after": '"t3.medium"'}]
        assert client.get("/api/v1/drift").status_code == 401
        document = client.get(f"/api/v1/proposals/{proposal.id}",
                              headers={"Authorization": f"Bearer {people.tokens['bob']}"}).json()
        assert document["plans"][0]["preview"]["open_drift"][0]["record_id"] == record.id
        sign_in(client, people.tokens["bob"])
        page = client.get("/drift").text
        assert "aws_instance.web[0]" in page and "instance_type" in page and "open" in page
        shown = client.get(f"/proposals/{proposal.id}").text
        assert "Open drift on this stack" in shown and "This apply would revert:" in shown
        assert shown.index("Open drift on this stack") < shown.index("<h3>Changes</h3>")



def test_page_views_at_once_each_read_git_through_their_own_handle(workspace: Workspace, people: People) -> None:
    """Every signed-in page reads the break-glass settings from git; concurrent views must not share one handle."""
    with TestClient(create_app(workspace.settings, workers=0)) as client:
        sign_in(client, people.tokens["bob"])
        finished: list[int] = []

        def view() -> None:
            for _ in range(10):
                assert client.get("/drift").status_code == 200
            finished.append(1)

        threads = [threading.Thread(target=view, daemon=True) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert len(finished) == len(threads)


def test_drift_recorded_after_an_approved_plan_is_not_reverted_by_its_apply(ws: Workspace, team: People,
                                                                            checkout: FakeClone) -> None:
    checkout.branch("tags").edit("stacks/app-staging/main.tf", '"cc-3003"', '"cc-3004"').push()
    proposal = open_proposal(ws, team.alice, "tags", "new cost centre")
    decide(ws, team.bob, proposal.id, Decision.APPROVE, "ok")
    assert view_proposal(ws, team.admin, proposal.id).can_apply
    ws.clock.advance(60)  # type: ignore[attr-defined]  # a minute later
    ws.simulator.edit_object("app-staging", "aws_instance.web[0]", {"instance_type": "t3.large"})  # incident
    record = check_drift(ws, team.admin, "app-staging").record
    assert record is not None
    before = render_text(proposal_previews(ws, get_proposal(ws, proposal.id))["app-staging"])
    assert "the plan predates this drift (recorded after it): the apply refuses and re-plans: aws_instance.web[0]" in (
        before) and "this apply keeps" not in before
    row = (f"drift record {record.id} on stack app-staging (aws_instance.web[0] (instance_type)) was recorded after "
           f"the plan was made: the apply would revert it unseen; a new plan shows it, and needs approval (an apply "
           f"plans again first)")
    assert view_proposal(ws, team.admin, proposal.id).apply_blockers == [row]
    with pytest.raises(Refused) as refused:
        apply_proposal(ws, team.admin, proposal.id)
    assert refused.value.reasons == [row]
    live = ws.simulator.get_object("aws_instance", _instance_id(ws))
    assert live is not None and live["instance_type"] == "t3.large"
    text = render_text(proposal_previews(ws, get_proposal(ws, proposal.id))["app-staging"])
    assert "this apply would revert: aws_instance.web[0]" in text
    with pytest.raises(Refused, match="approval"):  # the new plan reverts the drift: it needs its own approval
        apply_proposal(ws, team.admin, proposal.id)


def test_the_page_offers_no_apply_over_drift_recorded_after_the_plan(workspace: Workspace, people: People,
                                                                    clone: Clone) -> None:
    clone.branch("tags").edit("stacks/app-staging/main.tf", '"cc-3003"', '"cc-3004"').push()
    proposal = open_proposal(workspace, people.alice, "tags", "new cost centre")
    decide(workspace, people.bob, proposal.id, Decision.APPROVE, "ok")
    workspace.simulator.edit_object("app-staging", "aws_instance.web[0]", {"instance_type": "t3.large"})  # incident
    record = check_drift(workspace, people.admin, "app-staging").record
    assert record is not None
    row = (f"drift record {record.id} on stack app-staging (aws_instance.web[0] (instance_type)) was recorded after "
           f"the plan was made: the apply would revert it unseen; a new plan shows it, and needs approval (an apply "
           f"plans again first)")
    with TestClient(create_app(workspace.settings, workers=0)) as client:  # in the runner's words
        sign_in(client, people.tokens["admin"])
        page = client.get(f"/proposals/{proposal.id}").text
    assert 'id="apply"' not in page and "Not ready to apply" in page and html.escape(row, quote=False) in page


def test_a_refused_or_abandoned_codify_or_import_never_blocks_the_next_attempt(ws: Workspace,
                                                                                team: People) -> None:
    console_edit(ws)
    record = check_drift(ws, team.admin, "app-staging").record
    assert record is not None
    with pytest.raises(GatewayError):  # an auditor may not propose: no branch is left behind
        codify_drift(ws, team.dana, "app-staging")
    assert not ws.repo.branch_exists(f"codify/app-staging-{record.id}")
    first = codify_drift(ws, team.alice, "app-staging")
    abandon_proposal(ws, team.alice, first.id, "redo")
    again = codify_drift(ws, team.alice, "app-staging")
    assert (first.branch, again.branch) == (f"codify/app-staging-{record.id}", f"codify/app-staging-{record.id}-2")
    ws.simulator.edit_object("app-staging", "aws_instance.web[0]", {"instance_type": "t3.small"})  # put back
    rid = made_in_the_console(ws)
    imported = import_resource(ws, team.alice, "app-staging", "aws_security_group.admin", rid)
    abandon_proposal(ws, team.alice, imported.id, "wrong name tag, redo")
    retried = import_resource(ws, team.alice, "app-staging", "aws_security_group.admin", rid)
    assert retried.branch == "import/app-staging-admin-2"


def test_codify_and_import_are_judged_by_the_policy_rules_on_what_they_declare(ws: Workspace,
                                                                               team: People) -> None:
    ws.simulator.edit_object("app-staging", "aws_instance.web[0]", {"instance_type": "x1e.32xlarge"})
    check_drift(ws, team.admin, "app-staging")
    codify = codify_drift(ws, team.alice, "app-staging")
    assert [f.address for f in codify.findings if "instance" in f.rule] == ["aws_instance.web[0]"]
    abandon_proposal(ws, team.alice, codify.id, "not this size")
    ws.simulator.edit_object("app-staging", "aws_instance.web[0]", {"instance_type": "t3.small"})  # put back
    rid = made_in_the_console(ws)
    held = ws.simulator.get_object("aws_security_group", rid)
    ws.simulator.put_object("aws_security_group", rid, {**held, "tags": {}})  # no owner, no cost centre
    imported = import_resource(ws, team.alice, "app-staging", "aws_security_group.admin", rid)
    assert [f.address for f in imported.findings if "tag" in f.rule] == ["aws_security_group.admin"]


def test_an_apply_never_absorbs_into_state_a_console_edit_made_after_its_plan(ws: Workspace, team: People,
                                                                              checkout: FakeClone) -> None:
    checkout.branch("ttl").edit("stacks/app-staging/main.tf", "ttl     = 300", "ttl     = 600").push()
    proposal = open_proposal(ws, team.alice, "ttl", "longer ttl")
    decide(ws, team.bob, proposal.id, Decision.APPROVE, "ok")
    console_edit(ws)  # after the approval, before the apply, on a resource the plan leaves alone
    assert apply_proposal(ws, team.admin, proposal.id).succeeded
    check = check_drift(ws, team.admin, "app-staging")
    assert check.outcome == "opened" and [d.address for d in check.found] == ["aws_instance.web[0]"]

# --- rollback ---------------------------------------------------------------------------------------

EXPORTS = '''
resource "aws_security_group" "exports" {
  name        = "orders-exports-staging"
  description = "exports"
  vpc_id      = var.vpc_id
  tags        = local.tags
}
'''


def live_state(ws: Workspace, stack: str) -> dict[str, dict]:
    """Each resource of the stack's state with what the simulated cloud holds for it."""
    state = ws.simulator.read_state(stack)
    assert state is not None
    return {address: ws.simulator.get_object(r.type, r.id) or {} for address, r in state.resources.items()}


def test_a_rollback_of_an_applied_change_ends_with_the_state_before_it(ws: Workspace, team: People,
                                                                       checkout: FakeClone) -> None:
    before = live_state(ws, "app-staging")
    checkout.branch("bigger").edit("stacks/app-staging/main.tf", '"t3.small"', '"t3.medium"')
    checkout.write("stacks/app-staging/exports.tf", EXPORTS).push("bigger web, and an exports bucket")
    change = open_proposal(ws, team.alice, "bigger", "bigger web and an exports bucket")
    approve_and_apply(ws, team, change.id)
    assert live_state(ws, "app-staging") != before

    rollback = rollback_proposal(ws, team.alice, change.id, "the bucket was not wanted after all")
    assert rollback.branch == f"rollback/{change.id}" and rollback.stacks == ("app-staging",)
    text = render_text(proposal_previews(ws, rollback)["app-staging"])
    first, second = text.splitlines()[:2]
    assert first == ("NOTE: THIS ROLLBACK DESTROYS aws_security_group.exports: what proposal "
                     f"{change.id} created goes, with any data in it")
    assert second.startswith(f"NOTE: this rolls back proposal {change.id} (bigger web and an exports bucket; merged as")
    with pytest.raises(Refused, match=r"needs 2 approval\(s\).*risk high"):  # approved like any other
        apply_proposal(ws, team.admin, rollback.id)
    decide(ws, team.carol, rollback.id, Decision.APPROVE, "yes, it destroys the group")
    approve_and_apply(ws, team, rollback.id)
    assert live_state(ws, "app-staging") == before
    assert "exports.tf" not in str(ws.repo.read_files(ws.repo.resolve("main"), "stacks/app-staging", ".tf"))
    with ws.store.session(readonly=True) as session:
        [opened] = session.audit.events(kind="rollback.opened")
    assert opened.payload["rolls_back"] == change.id and opened.payload["destroys"] == {
        "app-staging": ["aws_security_group.exports"]}


def test_only_an_applied_change_is_rolled_back(ws: Workspace, team: People, checkout: FakeClone) -> None:
    checkout.branch("bigger").edit("stacks/app-staging/main.tf", '"t3.small"', '"t3.medium"').push()
    waiting = open_proposal(ws, team.alice, "bigger", "bigger web")
    branches = dict(ws.repo.refs)  # type: ignore[attr-defined]
    with pytest.raises(Refused, match=f"proposal {waiting.id} is open; only an applied, merged change"):
        rollback_proposal(ws, team.alice, waiting.id, "changed my mind")
    assert ws.repo.refs == branches  # type: ignore[attr-defined]  # nothing half-written


def test_the_rollback_command_refuses_what_was_not_applied_in_one_line(workspace: Workspace, people: People,
                                                                       clone: Clone) -> None:
    clone.branch("bigger").edit("stacks/app-staging/main.tf", '"t3.small"', '"t3.medium"').push()
    waiting = open_proposal(workspace, people.alice, "bigger", "bigger web")
    done = run_cli(["rollback", str(waiting.id), "-m", "why"], workspace.settings.home, people.tokens["alice"])
    assert done.returncode == 1 and "only an applied, merged change is rolled back" in done.stderr


# --- import -----------------------------------------------------------------------------------------


def made_in_the_console(ws: Workspace) -> str:
    """A security group someone made by hand in the (simulated) console: no stack manages it."""
    state = ws.simulator.read_state("app-staging")
    assert state is not None
    web = ws.simulator.get_object("aws_security_group", state.resources["aws_security_group.web"].id)
    assert web is not None
    ws.simulator.put_object("aws_security_group", "sg-0console000000001", {
        **web, "id": "sg-0console000000001", "name": "orders-admin-staging", "description": "made by hand",
        "arn": "arn:aws:ec2:eu-west-1:123456789012:security-group/sg-0console000000001"})
    return "sg-0console000000001"


def test_an_import_with_zero_diff_is_proposed_and_applied(ws: Workspace, team: People) -> None:
    rid = made_in_the_console(ws)
    before = ws.simulator.get_object("aws_security_group", rid)
    proposal = import_resource(ws, team.alice, "app-staging", "aws_security_group.admin", rid)
    assert proposal.branch == "import/app-staging-admin"
    assert dict(proposal.plans["app-staging"].counts) == {"import": 1}
    text = render_text(proposal_previews(ws, proposal)["app-staging"])
    assert text.startswith(f"NOTE: imports aws_security_group.admin (id {rid}) with zero diff: the plan shows the "
                           "import and no other change for that address")
    diff = ws.repo.diff(proposal.base_sha, proposal.head_sha)
    assert "to = aws_security_group.admin" in diff and f'id = "{rid}"' in diff and '"orders-admin-staging"' in diff
    approve_and_apply(ws, team, proposal.id)
    state = ws.simulator.read_state("app-staging")
    assert state is not None and state.resources["aws_security_group.admin"].id == rid
    assert ws.simulator.get_object("aws_security_group", rid) == before  # brought under management as it was


def test_an_import_with_a_diff_is_refused_naming_the_attributes(ws: Workspace, team: People) -> None:
    rid = made_in_the_console(ws)
    with pytest.raises(Refused, match=r"not zero-diff: the plan would also update it, changing tags.owner "
                                      r'\("app-team" -> "someone-else"\)'):
        import_resource(ws, team.alice, "app-staging", "aws_security_group.admin", rid,
                        {"tags": {"owner": "someone-else", "cost-centre": "cc-3003", "stack": "app-staging"}})
    assert not ws.repo.branch_exists("import/app-staging-admin")  # nothing half-written


def test_the_import_command_names_an_object_that_does_not_exist(workspace: Workspace, people: People) -> None:
    missing = run_cli(["import", "--stack", "app-staging", "aws_security_group.other", "sg-nope"],
                      workspace.settings.home, people.tokens["alice"])
    assert missing.returncode == 1 and "no aws_security_group with id 'sg-nope' exists" in missing.stderr



def test_an_import_of_an_object_another_stack_manages_is_refused_naming_that_stack(ws: Workspace,
                                                                                   team: People) -> None:
    prod = ws.simulator.read_state("app-prod")
    assert prod is not None
    lb = prod.resources["aws_lb.web"].id
    with pytest.raises(Refused, match=rf"aws_lb {lb} is already managed by stack app-prod as aws_lb.web"):
        import_resource(ws, team.alice, "app-staging", "aws_lb.prod_web", lb)
    assert not ws.repo.branch_exists("import/app-staging-prod_web")
    assert ws.simulator.get_object("aws_lb", lb) is not None


def test_a_rollback_of_an_import_is_refused_it_would_destroy_what_existed_before(ws: Workspace,
                                                                                  team: People) -> None:
    rid = made_in_the_console(ws)
    imported = import_resource(ws, team.alice, "app-staging", "aws_security_group.admin", rid)
    approve_and_apply(ws, team, imported.id)
    with pytest.raises(Refused, match=rf"proposal {imported.id} imported objects that existed before it .* a "
                                      r"rollback would destroy them"):
        rollback_proposal(ws, team.alice, imported.id, "wrong stack")
    assert not ws.repo.branch_exists(f"rollback/{imported.id}")
    assert ws.simulator.get_object("aws_security_group", rid) is not None

# --- break-glass ------------------------------------------------------------------------------------


def break_glass_rules(clone: Clone | FakeClone, codify_within: str) -> None:
    clone.branch("main")
    clone.write("gateway.yaml", clone.read("gateway.yaml")
                + f"\nbreak_glass:\n  groups: [oncall]\n  codify_within: {codify_within}\n")
    clone.push("on-call may break the glass", author="admin")


def on_call(ws: Workspace, people: People, name: str) -> tuple[Principal, str]:
    return add_principal(ws, people.admin, name, frozenset({Role.REQUESTER}), frozenset({"oncall"}))


def test_a_break_glass_window_codified_in_time_is_one_clean_story(ws: Workspace, team: People,
                                                                   checkout: FakeClone) -> None:
    break_glass_rules(checkout, "1h")
    olga, _ = on_call(ws, team, "olga")
    with pytest.raises(Refused, match="alice is not in a break-glass group"):
        open_break_glass(ws, team.alice, "app-staging", "incident 7", timedelta(hours=2))
    with pytest.raises(Refused, match="only people may break the glass"):
        open_break_glass(ws, team.agent, "app-staging", "incident 7", timedelta(hours=2))
    window = open_break_glass(ws, olga, "app-staging", "incident 7: web tier saturated", timedelta(hours=2))
    assert window.opened_at is not None  # app-staging protects nothing: no second person needed
    ws.simulator.edit_object("app-staging", "aws_instance.web[0]", {"instance_type": "t3.large"})
    close_break_glass(ws, olga, window.id, "load is back to normal")
    [record] = list_drift_records(ws, team.bob, only_open=True)
    assert record.expected and record.break_glass_id == window.id
    codify = codify_drift(ws, olga, "app-staging")
    assert "expected: made during a break-glass window" in render_text(proposal_previews(ws, codify)["app-staging"])
    approve_and_apply(ws, team, codify.id)
    assert sweep_break_glass(ws) == [f"window {window.id} settled"]
    assert overdue_windows(ws) == []

    kinds = [e.kind for e in break_glass_story(ws, team.dana, window.id)]  # `gateway audit show --break-glass`
    for kind in ("break_glass.opened", "drift.opened", "break_glass.closed", "proposal.opened", "approval",
                 "apply.succeeded", "merged", "drift.closed", "break_glass.settled"):
        assert kind in kinds, (kind, kinds)
    assert kinds.index("break_glass.opened") < kinds.index("drift.opened") < kinds.index("drift.closed")


def test_break_glass_drift_not_codified_is_flagged_and_blocks_applies_until_acknowledged(
        workspace: Workspace, people: People, clone: Clone) -> None:
    break_glass_rules(clone, "1s")
    olga, _ = on_call(workspace, people, "olga")
    paul, paul_token = on_call(workspace, people, "paul")
    window = open_break_glass(workspace, olga, "app-prod", "incident 8: lb", timedelta(hours=1))
    assert window.opened_at is None  # app-prod is protected: a second person confirms
    with pytest.raises(Refused, match="olga asked for this window; a second person confirms it"):
        confirm_break_glass(workspace, olga, window.id)
    assert confirm_break_glass(workspace, paul, window.id).opened_at is not None
    workspace.simulator.edit_object("app-prod", "aws_instance.web[0]", {"instance_type": "t3.xlarge"})
    close_break_glass(workspace, olga, window.id, "over")
    time.sleep(1.2)  # past the codify deadline
    assert sweep_break_glass(workspace) == [f"window {window.id} overdue"]
    with workspace.store.session(readonly=True) as session:
        [flag] = session.audit.events(kind="break_glass.overdue")
    assert flag.payload["drifted"] == ["aws_instance.web[0]"] and tuple(flag.stacks) == ("app-prod",)

    clone.branch("tags").edit("stacks/app-prod/main.tf", '"cc-3003"', '"cc-3004"').push()
    change = open_proposal(workspace, people.alice, "tags", "new cost centre")
    decide(workspace, people.bob, change.id, Decision.APPROVE, "ok")
    with pytest.raises(Refused, match=f"break-glass window {window.id} .* acknowledges it"):
        apply_proposal(workspace, people.alice, change.id)
    with TestClient(create_app(workspace.settings, workers=0)) as client:
        sign_in(client, people.tokens["bob"])
        assert f'id="break-glass-{window.id}"' in client.get("/").text
        assert "overdue" in client.get("/drift").text
        [listed] = client.get("/api/v1/break-glass", headers={"Authorization": f"Bearer {people.tokens['dana']}"}).json()
        assert (listed["id"], listed["state"], listed["confirmed_by"]) == (window.id, "overdue", "paul")
    with pytest.raises(Refused, match="bob is not in a break-glass group"):
        acknowledge_break_glass(workspace, people.bob, window.id, "seen")
    with pytest.raises(Refused, match="olga broke the glass of window .*; another person"):  # not the opener alone
        acknowledge_break_glass(workspace, olga, window.id, "meh")
    acknowledged = run_cli(["break-glass", "acknowledge", str(window.id), "-m", "codify ticket OPS-12"],
                           workspace.settings.home, paul_token)
    assert acknowledged.returncode == 0, acknowledged.stderr
    assert apply_proposal(workspace, people.alice, change.id).succeeded
    story = run_cli(["audit", "show", "--break-glass", str(window.id)], workspace.settings.home, people.tokens["dana"])
    assert story.returncode == 0, story.stderr
    kinds = [line.split()[3] for line in story.stdout.splitlines() if line[:5].strip().isdigit()]
    assert kinds.index("break_glass.opened") < kinds.index("break_glass.overdue"), story.stdout



def test_a_window_that_runs_out_unclosed_still_reaches_its_codify_deadline(ws: Workspace, team: People,
                                                                          checkout: FakeClone) -> None:
    break_glass_rules(checkout, "4s")
    olga, _ = on_call(ws, team, "olga")
    window = open_break_glass(ws, olga, "app-staging", "incident 9", timedelta(seconds=2))
    ws.simulator.edit_object("app-staging", "aws_instance.web[0]", {"instance_type": "t3.large"})
    ws.clock.advance(2.2)  # type: ignore[attr-defined]  # the window runs out; nobody closes it, no check is due
    assert sweep_break_glass(ws) == []  # the sweep checks the stack first: the drift is the window's
    [record] = list_drift_records(ws, team.bob, only_open=True)
    assert record.expected and record.break_glass_id == window.id
    ws.clock.advance(4.2)  # type: ignore[attr-defined]  # past the codify deadline (4 s after the window's end)
    assert sweep_break_glass(ws) == [f"window {window.id} overdue"]
    assert [w.id for w in overdue_windows(ws)] == [window.id]


def test_a_huge_break_glass_duration_is_a_clear_error(workspace: Workspace, people: People, clone: Clone) -> None:
    break_glass_rules(clone, "1h")
    _, token = on_call(workspace, people, "olga")
    result = run_cli(["break-glass", "open", "--stack", "app-staging", "-m", "incident", "--for", "99999999999d"],
                     workspace.settings.home, token)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "--for: '99999999999d' is longer than the longest duration the gateway takes (365d)" in result.stderr


def test_listing_break_glass_windows_writes_nothing(workspace: Workspace, people: People, clone: Clone) -> None:
    break_glass_rules(clone, "1h")
    olga, _ = on_call(workspace, people, "olga")
    window = open_break_glass(workspace, olga, "app-staging", "incident 10", timedelta(seconds=1))
    time.sleep(1.2)  # ended, never settled: a sweep would check and record; a list must not
    with workspace.store.session(readonly=True) as session:
        before = len(session.audit.events())
    listed = run_cli(["break-glass", "list"], workspace.settings.home, people.tokens["dana"])
    assert listed.returncode == 0 and f"{window.id:>4} app-staging" in listed.stdout
    with workspace.store.session(readonly=True) as session:
        assert len(session.audit.events()) == before and session.day_two.break_glass(window.id).codified_at is None


def test_drift_found_before_a_window_is_never_relabelled_as_the_windows(ws: Workspace, team: People,
                                                                         checkout: FakeClone) -> None:
    break_glass_rules(checkout, "1s")
    olga, _ = on_call(ws, team, "olga")
    console_edit(ws)  # nobody broke the glass
    first = check_drift(ws, team.admin, "app-staging").record
    assert first is not None and not first.expected
    window = open_break_glass(ws, olga, "app-staging", "incident 11", timedelta(hours=1))
    again = check_drift(ws, team.admin, "app-staging").record
    assert again is not None and (again.id, again.expected, again.break_glass_id) == (first.id, False, None)
    ws.simulator.edit_object("app-staging", "aws_security_group.web", {"description": "incident 11"})
    close_break_glass(ws, olga, window.id, "over")  # its drift joins the open record, still unexpected
    ws.clock.advance(1.2)  # type: ignore[attr-defined]  # past the codify deadline: the window's drift is not
    # settled just because the record is older
    assert sweep_break_glass(ws) == [f"window {window.id} overdue"]

def test_the_day_two_demo_narrates_drift_and_break_glass_to_codify(tmp_path: Path) -> None:
    result = run_cli(["demo", "--day-two"], tmp_path / "unused", timeout=300)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "drift record 1 opened: aws_instance.web[0] (instance_type)" in out
    assert "OPEN DRIFT on this stack (drift record 1" in out and "this apply would revert: aws_instance.web[0]" in out
    assert "drift record 1 on app-staging: closed; proposal 2 (a codify) was applied" in out
    assert "break-glass window 1 waits for confirmation" in out and "window 1 settled" in out
    assert out.index("break_glass.opened") < out.index("drift.opened") < out.index("break_glass.settled")
    assert "audit trail intact" in out


def test_drift_records_and_windows_on_both_databases(any_workspace: Workspace) -> None:
    ws = any_workspace
    people = add_people(ws)
    console_edit(ws)
    opened = check_drift(ws, people.admin, "app-staging")
    assert opened.outcome == "opened" and check_drift(ws, people.admin, "app-staging").outcome == "unchanged"
    with ws.store.session() as session, pytest.raises(IntegrityError):  # one open record per stack, whoever races
        session.day_two.add_drift_record("app-staging", [], False, None)
    ws.simulator.edit_object("app-staging", "aws_instance.web[0]", {"instance_type": "t3.small"})  # put back
    closed = check_drift(ws, people.admin, "app-staging")
    assert closed.outcome == "closed" and closed.record is not None and closed.record.closed_reason == (
        "a check finds no drift any more")
    with ws.store.session() as session:
        wid = session.day_two.add_break_glass("app-staging", "incident", "olga", 3600, confirmed=True)
        window = session.day_two.break_glass(wid)
    assert window.ends_at is not None and window.opened_at is not None
    assert window.ends_at - window.opened_at == timedelta(hours=1)
    with ws.store.session() as session:  # workers racing for a scheduled check: one claim wins
        assert session.main.swap_marker("drift_claimed:app-staging", None, "t1")
        assert not session.main.swap_marker("drift_claimed:app-staging", None, "t2")
        assert session.main.swap_marker("drift_claimed:app-staging", "t1", "t3")
        assert not session.main.swap_marker("drift_claimed:app-staging", "t1", "t4")
    with ws.store.session() as session:  # workers racing on a sweep: only one flags (and records) the window
        assert session.day_two.mark_break_glass(wid, "flagged_at", now())
        assert not session.day_two.mark_break_glass(wid, "flagged_at", now())
        assert session.day_two.mark_break_glass(wid, "codified_at", now())
        assert not session.day_two.mark_break_glass(wid, "codified_at", now())


def test_drift_of_a_secret_stays_masked_in_the_record_and_the_trail(ws: Workspace, team: People) -> None:
    leaked = "console-typed-Pa55word-9172"
    ws.simulator.edit_object("data", "aws_db_instance.orders", {"password": leaked})
    record = check_drift(ws, team.admin, "data").record
    assert record is not None
    [attribute] = record.resources[0].attributes
    assert (attribute.path, attribute.before, attribute.after) == ("password", "(sensitive)", "(sensitive)")
    with pytest.raises(Refused, match=r"aws_db_instance.orders.password: its value is sensitive"):
        codify_drift(ws, team.alice, "data")
    with ws.store.session(readonly=True) as session:
        kept = [session.day_two.drift_records(), [e.payload for e in session.audit.events()]]
    assert leaked not in str(kept)


def test_drift_of_a_secret_stays_masked_in_the_command_and_the_database(workspace: Workspace,
                                                                        people: People) -> None:
    leaked = "console-typed-Pa55word-9172"
    workspace.simulator.edit_object("data", "aws_db_instance.orders", {"password": leaked})
    assert check_drift(workspace, people.admin, "data").record is not None
    listed = run_cli(["drift", "list"], workspace.settings.home, people.tokens["dana"])
    assert listed.returncode == 0 and leaked not in listed.stdout
    with workspace.store.db.engine.connect() as conn:
        for table in ("drift_records", "audit_events"):
            rows = conn.exec_driver_sql(f"select * from {table}").fetchall()
            assert leaked not in str(rows), table



def test_a_workspace_secret_typed_into_a_plain_attribute_reaches_neither_the_database_nor_git(
        workspace: Workspace, people: People) -> None:
    secret = str(known_secret_values(workspace.settings)[0])
    workspace.simulator.edit_object("app-staging", "aws_instance.web[0]", {"instance_type": secret})
    record = check_drift(workspace, people.admin, "app-staging").record
    assert record is not None
    [attribute] = record.resources[0].attributes
    assert (attribute.path, attribute.after) == ("instance_type", "(sensitive)")
    with workspace.store.db.engine.connect() as conn:
        assert secret not in str(conn.exec_driver_sql("select * from drift_records").fetchall())
    with pytest.raises(Refused, match=r"aws_instance.web\[0\].instance_type: its value is sensitive"):
        codify_drift(workspace, people.alice, "app-staging")
    assert not workspace.repo.branch_exists(f"codify/app-staging-{record.id}")
    rid = made_in_the_console(workspace)
    held = workspace.simulator.get_object("aws_security_group", rid)
    workspace.simulator.put_object("aws_security_group", rid, {**held, "description": secret})
    with pytest.raises(Refused, match="description hold\\(s\\) a secret of the workspace"):
        import_resource(workspace, people.alice, "app-staging", "aws_security_group.admin", rid)
    assert not workspace.repo.branch_exists("import/app-staging-admin")


def test_a_pushed_import_with_a_diff_is_denied_until_a_policy_owner_overrides_it(
        ws: Workspace, team: People, checkout: FakeClone) -> None:
    rid = made_in_the_console(ws)
    checkout.branch("adopt").write("stacks/app-staging/admin.tf", f'''import {{
  to = aws_security_group.admin
  id = "{rid}"
}}

resource "aws_security_group" "admin" {{
  name        = "orders-admin-staging"
  description = "made by hand"
  vpc_id      = var.vpc_id
  tags        = merge(local.tags, {{ imported = "yes" }})
}}
''').push("adopt the admin group")
    proposal = open_proposal(ws, team.alice, "adopt", "adopt the console's admin group")
    [finding] = [f for f in proposal.findings if f.rule == "import-zero-diff"]
    assert finding.address == "aws_security_group.admin" and "changing tags" in finding.message
    text = render_text(proposal_previews(ws, proposal)["app-staging"])
    assert text.startswith(f"NOTE: imports aws_security_group.admin (id {rid}) but NOT with zero diff: the plan "
                           "would also change it (update in place): tags.imported")
    with pytest.raises(Refused, match="policy denies app-staging:import-zero-diff:aws_security_group.admin"):
        decide(ws, team.bob, proposal.id, Decision.APPROVE, "ok")


def test_the_agent_codifies_drift_on_request(workspace: Workspace, people: People) -> None:
    console_edit(workspace)
    record = check_drift(workspace, people.admin, "app-staging").record
    assert record is not None
    seen: list[str] = []

    def after_preview(next_turn: dict) -> Callable[[dict], dict]:
        def turn(body: dict) -> dict:
            seen.append(next(m["content"] for m in reversed(body["messages"]) if m["role"] == "tool"))
            return next_turn
        return turn

    with ModelStub() as stub:
        stub.turns = [
            tool_call("run_preview", stack="app-staging"),
            after_preview(tool_call("patch_file", path="stacks/app-staging/main.tf",
                                    old='instance_type          = "t3.small"', new='instance_type          = "t3.medium"')),
            tool_call("run_preview", stack="app-staging"),
            after_preview(tool_call("finish", summary="Codified the console change: the web instance is t3.medium "
                                                      "in the declaration; the plan has no changes.")),
        ]
        outcome = submit_request(workspace, people.alice, "Codify the drift on app-staging: keep what runs",
                                 model=ChatModel(stub.base_url, "k", "stub"))
    assert 'instance_type: "t3.small" (recorded) -> "t3.medium" (now)' in seen[0]  # the drift, as the agent saw it
    assert "No changes" in seen[1]
    proposal = outcome.proposal
    assert proposal is not None and proposal.proposer.is_agent and not proposal.plans["app-staging"].has_changes
    approve_and_apply(workspace, people, proposal.id)
    [closed] = list_drift_records(workspace, people.bob)
    assert closed.closed_by_proposal == proposal.id and "a codify" in (closed.closed_reason or "")


def test_the_agent_imports_on_request_held_to_zero_diff(workspace: Workspace, people: People) -> None:
    rid = made_in_the_console(workspace)
    live = workspace.simulator.get_object("aws_security_group", rid) or {}
    declaration, _ = import_declaration("aws_security_group.admin", rid, {
        k: v for k, v in live.items() if k not in ("id", "arn", "owner_id")})
    seen: list[str] = []

    def after_preview(next_turn: dict) -> Callable[[dict], dict]:
        def turn(body: dict) -> dict:
            seen.append(next(m["content"] for m in reversed(body["messages"]) if m["role"] == "tool"))
            return next_turn
        return turn

    with ModelStub() as stub:
        stub.turns = [
            tool_call("write_file", path="stacks/app-staging/admin.tf", content=declaration),
            tool_call("run_preview", stack="app-staging"),
            after_preview(tool_call("finish", summary=f"Imported the console's admin security group {rid}.")),
        ]
        outcome = submit_request(workspace, people.alice, f"Bring security group {rid} under management in staging",
                                 model=ChatModel(stub.base_url, "k", "stub"))
    assert f"NOTE: imports aws_security_group.admin (id {rid}) with zero diff" in seen[0]
    proposal = outcome.proposal
    assert proposal is not None and dict(proposal.plans["app-staging"].counts) == {"import": 1}
    assert not [f for f in proposal.findings if f.rule == "import-zero-diff"]
