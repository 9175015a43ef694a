"""`gateway demo --day-two`: drift found on a schedule and codified, then a break-glass window codified in time,
in a fresh temporary workspace on the simulator, narrated for a person."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import click
import git

from gateway.adapters.git.repo import committer_env
from gateway.adapters.store.rows import now
from gateway.composition import create_workspace
from gateway.config import Settings
from gateway.demo import in_scratch_home, step
from gateway.domain.preview import render_text
from gateway.domain.principals import Principal, Role
from gateway.domain.proposal import Decision, Proposal
from gateway.services.admin import audit as audit_service
from gateway.services.admin.bootstrap import bootstrap_simulator
from gateway.services.admin.users import add_principal
from gateway.services.change.proposals import decide, open_proposal, proposal_previews
from gateway.services.change.runner import apply_proposal
from gateway.services.day_two.break_glass import (
    break_glass_story,
    close_break_glass,
    confirm_break_glass,
    open_break_glass,
    sweep_break_glass,
)
from gateway.services.day_two.codify import codify_drift
from gateway.services.day_two.drift_records import check_drift, check_scheduled_drift, list_drift_records
from gateway.services.workspace import Workspace

RULES = "\nbreak_glass:\n  groups: [oncall]\n  codify_within: 24h\n"


def run_day_two_demo(keep: bool = False) -> None:
    in_scratch_home("gateway-day-two-", _run, keep)


def _run(home: Path) -> None:
    settings = Settings(home=home / ".gateway", database_url=None, token=None)
    step("1. a workspace on the simulator; main's gateway.yaml checks app-staging for drift every 6h and names "
         "an on-call break-glass group")
    ws = create_workspace(settings)
    bootstrap_simulator(ws)
    clone = git.Repo.clone_from(str(settings.repo_path), home / "admin-clone")
    yaml = home / "admin-clone" / "gateway.yaml"
    yaml.write_text(yaml.read_text().replace("    path: stacks/app-staging\n",
                                             "    path: stacks/app-staging\n    drift: {interval: 6h}\n") + RULES)
    clone.git.add("-A")
    clone.git.execute(["git", "commit", "-q", "-m", "drift checks and break-glass"], env=committer_env("admin"))
    clone.git.push("-q", "origin", "main")
    people = _add_people(ws)
    _drift_then_codify(ws, people, home)
    _break_glass_then_codify(ws, people)
    step("13. gateway audit verify")
    count, broken = audit_service.verify_trail(ws, people["dana"])
    click.echo(f"audit trail intact: {count} events, chain verified" if broken is None else f"BROKEN: {broken.reason}")
    ws.close()
    if broken is not None:
        raise SystemExit(1)


def _add_people(ws: Workspace) -> dict[str, Principal]:
    admin, _ = add_principal(ws, None, "admin", frozenset({Role.ADMIN}))
    people = {"admin": admin}
    for name, roles, groups in (("alice", {Role.REQUESTER}, {"app"}), ("bob", {Role.APPROVER}, {"platform"}),
                                ("carol", {Role.APPROVER}, {"platform"}), ("olga", {Role.REQUESTER}, {"oncall"}),
                                ("paul", {Role.REQUESTER}, {"oncall"}), ("dana", {Role.AUDITOR}, set())):
        people[name] = add_principal(ws, admin, name, frozenset(roles), frozenset(groups))[0]
    click.echo("alice (requester), bob and carol (approvers), olga and paul (on call: break-glass), dana (auditor)")
    return people


def _drift_then_codify(ws: Workspace, people: dict[str, Principal], home: Path) -> None:
    step("2. someone resizes the staging web instance in the console (the simulated cloud), outside the gateway")
    ws.simulator.edit_object("app-staging", "aws_instance.web[0]", {"instance_type": "t3.medium"})
    click.echo("aws_instance.web[0]: instance_type t3.small -> t3.medium")

    step("3. a worker's scheduled drift check (drift.interval 6h) finds it and opens a drift record")
    for check in check_scheduled_drift(ws, now()):
        if check.record is not None:
            click.echo(f"stack {check.stack}: drift record {check.record.id} {check.outcome}: {check.record.describe()}")

    step("4. alice proposes an unrelated change on app-staging: its preview shows the open drift first")
    clone = git.Repo.clone_from(str(ws.settings.repo_path), home / "alice-clone")
    clone.git.checkout("-b", "cost-centre")
    main_tf = home / "alice-clone" / "stacks/app-staging/main.tf"
    main_tf.write_text(main_tf.read_text().replace('"cc-3003"', '"cc-3004"'))
    clone.git.add("-A")
    clone.git.execute(["git", "commit", "-q", "-m", "new cost centre"], env=committer_env("alice"))
    clone.git.push("-q", "origin", "cost-centre")
    change = open_proposal(ws, people["alice"], "cost-centre", "staging moves to cost centre cc-3004")
    click.echo("\n".join(render_text(proposal_previews(ws, change)["app-staging"]).splitlines()[:4]))
    click.echo("  …")

    step("5. the bigger instance is wanted: gateway drift codify --stack app-staging writes it into the declaration")
    codify = codify_drift(ws, people["alice"], "app-staging")
    click.echo(f"proposal {codify.id} on {codify.branch}: {ws.repo.diff(codify.base_sha, codify.head_sha).count(chr(10))} "
               f"diff lines; plan: {render_text(proposal_previews(ws, codify)['app-staging']).splitlines()[-1]}")
    _approve_and_apply(ws, people, codify)

    step("6. gateway drift list: the record closed when the codify was applied")
    for record in list_drift_records(ws, people["bob"]):
        click.echo(f"drift record {record.id} on {record.stack}: {record.status.value}; {record.closed_reason}")
    click.echo(f"alice's proposal {change.id} re-plans on the next sync: it no longer reverts anything")


def _break_glass_then_codify(ws: Workspace, people: dict[str, Principal]) -> None:
    step("7. incident: olga opens a break-glass window on app-prod (protected: a second person confirms)")
    window = open_break_glass(ws, people["olga"], "app-prod", "incident 4711: web tier saturated", timedelta(hours=2))
    click.echo(f"break-glass window {window.id} waits for confirmation")
    window = confirm_break_glass(ws, people["paul"], window.id)
    click.echo(f"paul confirms: open until {window.ends_at:%H:%M} UTC")

    step("8. during the incident olga scales the production instances up by hand")
    for address in ("aws_instance.web[0]", "aws_instance.web[1]"):
        ws.simulator.edit_object("app-prod", address, {"instance_type": "t3.xlarge"})
        click.echo(f"{address}: instance_type t3.large -> t3.xlarge")

    step("9. the incident is over: olga closes the window; its drift is recorded as expected")
    window = close_break_glass(ws, people["olga"], window.id, "load back to normal")
    deadline = window.codify_by(ws.repo_settings().break_glass)
    [record] = list_drift_records(ws, people["bob"], "app-prod", only_open=True)
    click.echo(f"drift record {record.id}: {record.describe()} (expected: {record.expected}); codify by "
               f"{deadline:%Y-%m-%d %H:%M} UTC or the stack is flagged and applies wait")

    step("10. olga codifies it; bob approves; applied")
    codify = codify_drift(ws, people["olga"], "app-prod")
    _approve_and_apply(ws, people, codify)
    click.echo(f"a check after the apply: {check_drift(ws, people['olga'], 'app-prod').outcome}")

    step("11. the worker's sweep settles the window")
    for line in sweep_break_glass(ws):
        click.echo(line)

    step(f"12. gateway audit show --break-glass {window.id} (as dana): the episode as one story")
    for e in break_glass_story(ws, people["dana"], window.id):
        target = f" proposal {e.proposal_id}" if e.proposal_id else ""
        click.echo(f"{e.seq:>4} {e.actor:8} {e.kind:22}{target}")


def _approve_and_apply(ws: Workspace, people: dict[str, Principal], proposal: Proposal) -> None:
    decide(ws, people["bob"], proposal.id, Decision.APPROVE, "matches what runs")
    report = apply_proposal(ws, people["olga"] if proposal.requester.name == "olga" else people["alice"], proposal.id)
    click.echo(f"proposal {proposal.id} applied and merged as {report.merge_sha[:12] if report.merge_sha else '?'}")
    if not report.succeeded:
        raise SystemExit(1)
