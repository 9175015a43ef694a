"""`gateway demo`: the whole change path in a fresh temporary workspace, narrated for a person."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import click
import git

from agents.llm import NOT_CONFIGURED
from gateway.adapters.git.repo import committer_env
from gateway.composition import create_workspace
from gateway.config import Settings
from gateway.domain.approvals import approval_shortfall
from gateway.domain.errors import Refused
from gateway.domain.preview import render_text
from gateway.domain.principals import Principal, Role
from gateway.domain.proposal import Decision, Proposal
from gateway.services.admin import audit as audit_service
from gateway.services.admin.bootstrap import bootstrap_simulator
from gateway.services.admin.users import add_principal
from gateway.services.agents.agent_requests import submit_request
from gateway.services.change.proposals import decide, open_proposal, proposal_previews, sync_proposal
from gateway.services.change.runner import apply_proposal
from gateway.services.workspace import Workspace

BUCKET_TF = '''
resource "aws_s3_bucket" "reports" {
  bucket = "orders-reports-staging"
  tags   = local.tags
}

resource "aws_s3_bucket_versioning" "reports" {
  bucket = aws_s3_bucket.reports.id
  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_public_access_block" "reports" {
  bucket                  = aws_s3_bucket.reports.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_server_side_encryption_configuration" "reports" {
  bucket = aws_s3_bucket.reports.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "aws:kms"
    }
  }
}
'''


AGENT_REQUEST = ("In app-staging, add an encrypted, versioned S3 bucket called orders-reports-staging, and move the "
                 "web instance to AMI ami-0d5eff06f840b45e9.")
AGENT_FOLLOW_UP = "Also tag the reports bucket with purpose=reports."


def step(title: str) -> None:
    click.echo("")
    click.secho(f"── {title} ", bold=True)


def run_demo(keep: bool = False) -> None:
    in_scratch_home("gateway-demo-", _run, keep)


def in_scratch_home(prefix: str, narrate: Callable[[Path], None], keep: bool) -> None:
    """Run a narrated demo in a fresh temporary home, removed afterwards unless `keep`."""
    home = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        narrate(home)
    finally:
        if keep:
            click.echo(f"\nworkspace kept in {home / '.gateway'}")
        else:
            shutil.rmtree(home, ignore_errors=True)


@dataclass
class People:
    alice: Principal
    bob: Principal
    carol: Principal
    dana: Principal


def _run(home: Path) -> None:
    settings = Settings(home=home / ".gateway", database_url=None, token=None)
    step("1. gateway init: a workspace with the sample declaration repo (sandbox engine, SQLite)")
    ws = create_workspace(settings)
    created = bootstrap_simulator(ws)
    click.echo(f"stacks: {', '.join(sorted(ws.repo_settings().stacks))}; {created} resources live in the simulated cloud")
    people = _add_people(ws)
    change: AgentChange | HandChange = (AgentChange(ws, people.alice) if settings.openai_base_url and settings.model
                                        else HandChange(ws, people.alice, home))
    proposal = change.propose()
    for stack, preview in proposal_previews(ws, proposal).items():
        click.echo(f"[{stack}]")
        click.echo(render_text(preview), nl=False)
    proposal = _review(ws, people, proposal, change)
    _apply_and_audit(ws, people, proposal)


def _add_people(ws: Workspace) -> People:
    step("2. people: a requester, two approvers, an auditor (tokens stored hashed)")
    admin, _ = add_principal(ws, None, "admin", frozenset({Role.ADMIN}))
    people = People(
        alice=add_principal(ws, admin, "alice", frozenset({Role.REQUESTER}), frozenset({"app"}))[0],
        bob=add_principal(ws, admin, "bob", frozenset({Role.APPROVER}), frozenset({"platform"}))[0],
        carol=add_principal(ws, admin, "carol", frozenset({Role.APPROVER}), frozenset({"app"}))[0],
        dana=add_principal(ws, admin, "dana", frozenset({Role.AUDITOR}))[0],
    )
    for p in (people.alice, people.bob, people.carol, people.dana):
        click.echo(f"{p.name:6} {','.join(sorted(p.roles)):10} groups: {','.join(sorted(p.groups)) or '-'}")
    return people


class AgentChange:
    """The change asked of the agent in plain words (when a model is configured)."""

    def __init__(self, ws: Workspace, requester: Principal):
        self.ws, self.requester, self.conversation = ws, requester, None

    def propose(self) -> Proposal:
        step("3-4. gateway request: alice asks the agent in plain words; it edits a branch and proposes")
        outcome = submit_request(self.ws, self.requester, AGENT_REQUEST, progress=_progress)
        if outcome.proposal is None:
            raise SystemExit(f"the agent did not produce a proposal: {outcome.stopped or outcome.summary}")
        self.conversation = outcome.conversation_id
        click.echo(f"proposal {outcome.proposal.id}: requested by alice, proposed by {outcome.proposal.proposer.name}")
        click.echo(f"the agent claims: {outcome.summary}")
        for issue in outcome.claim_issues:
            click.echo(f"  ! the plan disagrees: {issue}")
        return outcome.proposal

    def follow_up(self) -> None:
        submit_request(self.ws, self.requester, AGENT_FOLLOW_UP, self.conversation, progress=_progress)


class HandChange:
    """The same change made by hand on a branch (no model configured)."""

    def __init__(self, ws: Workspace, requester: Principal, home: Path):
        self.ws, self.requester, self.home = ws, requester, home

    def propose(self) -> Proposal:
        click.echo(f"\n(no model configured: {NOT_CONFIGURED}; the demo uses a hand-made change)")
        step("3. alice changes app-staging on a branch: an encrypted, versioned S3 bucket, and a new AMI")
        self.clone = _hand_made_branch(self.ws.settings, self.home)
        click.echo("pushed branch reports-bucket")
        step("4. gateway propose --branch reports-bucket: the engine plans; this is the preview")
        return open_proposal(self.ws, self.requester, "reports-bucket", "Reports need their own bucket; AMI refresh")

    def follow_up(self) -> None:
        (self.home / "alice-clone" / "stacks/app-staging/reports.tf").write_text(
            BUCKET_TF.lstrip().replace("tags   = local.tags", 'tags   = merge(local.tags, { purpose = "reports" })'))
        _commit_and_push(self.clone, "Tag the reports bucket", "alice")


def _progress(step_text: str) -> None:
    click.echo(f"  … {step_text}")


def _review(ws: Workspace, people: People, proposal: Proposal, change: AgentChange | HandChange) -> Proposal:
    step("5. alice tries to approve her own change")
    _attempt(lambda: decide(ws, people.alice, proposal.id, Decision.APPROVE, "lgtm"))

    step("6. bob (approver, platform group) approves commit and plan")
    proposal = decide(ws, people.bob, proposal.id, Decision.APPROVE, "bucket is encrypted and versioned")
    click.echo(f"approved at {proposal.head_sha[:12]} for plan {proposal.plans['app-staging'].digest[:19]}…")
    click.echo(f"risk {proposal.risk.value} (the instance is replaced): {approval_shortfall(proposal, ws.repo_settings())[0]}")

    step("7. one more commit on the branch: bob's approval no longer counts")
    change.follow_up()
    proposal, changes = sync_proposal(ws, proposal.id)
    for line in changes:
        click.echo(f"gateway: {line}")
    for d in proposal.decisions:
        click.echo(f"{d.principal.name} approved {d.head_sha[:12]}: {'current' if proposal.is_current(d) else 'STALE'}")
    click.echo(f"status: {approval_shortfall(proposal, ws.repo_settings())[0]}")

    step("8. bob and carol review the new plan and approve it")
    decide(ws, people.bob, proposal.id, Decision.APPROVE, "re-checked after the tag change", seen_sha=proposal.head_sha)
    proposal = decide(ws, people.carol, proposal.id, Decision.APPROVE, "AMI is the patched one", seen_sha=proposal.head_sha)
    click.echo(f"approved at {proposal.head_sha[:12]} by {', '.join(d.principal.name for d in proposal.current_approvals)}")
    return proposal


def _apply_and_audit(ws: Workspace, people: People, proposal: Proposal) -> None:
    step("9. gateway apply: exactly the approved plan, under the stack lock; then merge")
    report = apply_proposal(ws, people.alice, proposal.id)
    for outcome in report.outcomes:
        click.echo(f"stack {outcome.stack}: {'applied' if outcome.succeeded else 'FAILED'}: {', '.join(outcome.applied)}")
    click.echo(f"merged into main as {report.merge_sha[:12] if report.merge_sha else '(not merged)'}")
    if not report.succeeded:
        raise SystemExit(1)

    step(f"10. gateway audit show {proposal.id} (as dana, the auditor)")
    for e in audit_service.proposal_story(ws, people.dana, proposal.id):
        extra = e.payload.get("digest") or e.payload.get("sha") or e.payload.get("merge_sha") or ""
        reasons = "; ".join(e.payload.get("reasons", []))
        click.echo(f"{e.seq:>4} {e.actor:8} {e.kind:18} {str(extra)[:19]} {reasons}".rstrip())

    step("11. gateway audit verify")
    count, broken = audit_service.verify_trail(ws, people.dana)
    click.echo(f"audit trail intact: {count} events, chain verified" if broken is None else f"BROKEN: {broken.reason}")
    ws.close()
    if broken is not None:
        raise SystemExit(1)


def _hand_made_branch(settings: Settings, home: Path) -> git.Repo:
    clone_dir = home / "alice-clone"
    clone = git.Repo.clone_from(str(settings.repo_path), clone_dir)
    clone.git.checkout("-b", "reports-bucket")
    main_tf = clone_dir / "stacks/app-staging/main.tf"
    main_tf.write_text(main_tf.read_text().replace("ami-0c1c30571d2dae5c9", "ami-0d5eff06f840b45e9"))
    (clone_dir / "stacks/app-staging/reports.tf").write_text(BUCKET_TF.lstrip())
    _commit_and_push(clone, "Add reports bucket; move web to the new AMI", "alice")
    return clone


def _commit_and_push(clone: git.Repo, message: str, author: str) -> None:
    clone.git.add("-A")
    clone.git.execute(["git", "commit", "-q", "-m", message], env=committer_env(author, f"{author}@example.com"))
    clone.git.push("-q", "origin", clone.active_branch.name)


def _attempt(action) -> None:  # type: ignore[no-untyped-def]
    try:
        action()
    except Refused as exc:
        for reason in exc.reasons:
            click.echo(f"refused: {reason}")
    else:
        raise SystemExit("the gateway let a requester approve their own change")
