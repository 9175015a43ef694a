"""`gateway demo`: the whole change path in a fresh temporary workspace, narrated for a person."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import click
import git

from agents.llm import NOT_CONFIGURED
from gateway.adapters.git_repo import committer_env
from gateway.config import Settings
from gateway.domain.approvals import approval_shortfall
from gateway.domain.errors import Refused
from gateway.domain.preview import render_text
from gateway.domain.principals import Role
from gateway.domain.proposal import Decision
from gateway.services import audit as audit_service
from gateway.services.agent_requests import submit_request
from gateway.services.bootstrap import bootstrap_simulator
from gateway.services.proposals import decide, open_proposal, proposal_previews, sync_proposal
from gateway.services.runner import apply_proposal
from gateway.services.users import add_principal
from gateway.services.workspace import create_workspace

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
    home = Path(tempfile.mkdtemp(prefix="gateway-demo-"))
    try:
        _run(home)
    finally:
        if keep:
            click.echo(f"\nworkspace kept in {home / '.gateway'}")
        else:
            shutil.rmtree(home, ignore_errors=True)


def _run(home: Path) -> None:
    settings = Settings(home=home / ".gateway", database_url=None, token=None)
    step("1. gateway init: a workspace with the sample declaration repo (sandbox engine, SQLite)")
    ws = create_workspace(settings)
    created = bootstrap_simulator(ws)
    click.echo(f"stacks: {', '.join(sorted(ws.repo_settings().stacks))}; {created} resources live in the simulated cloud")

    step("2. people: a requester, two approvers, an auditor (tokens stored hashed)")
    admin, _ = add_principal(ws, None, "admin", frozenset({Role.ADMIN}))
    alice, _ = add_principal(ws, admin, "alice", frozenset({Role.REQUESTER}), frozenset({"app"}))
    bob, _ = add_principal(ws, admin, "bob", frozenset({Role.APPROVER}), frozenset({"platform"}))
    carol, _ = add_principal(ws, admin, "carol", frozenset({Role.APPROVER}), frozenset({"app"}))
    dana, _ = add_principal(ws, admin, "dana", frozenset({Role.AUDITOR}))
    for p in (alice, bob, carol, dana):
        click.echo(f"{p.name:6} {','.join(sorted(p.roles)):10} groups: {','.join(sorted(p.groups)) or '-'}")

    by_agent = bool(settings.openai_base_url and settings.model)
    if by_agent:
        step("3-4. gateway request: alice asks the agent in plain words; it edits a branch and proposes")
        outcome = submit_request(ws, alice, AGENT_REQUEST, progress=lambda s: click.echo(f"  … {s}"))
        if outcome.proposal is None:
            raise SystemExit(f"the agent did not produce a proposal: {outcome.stopped or outcome.summary}")
        proposal = outcome.proposal
        click.echo(f"proposal {proposal.id}: requested by alice, proposed by {proposal.proposer.name}")
        click.echo(f"the agent claims: {outcome.summary}")
        for issue in outcome.claim_issues:
            click.echo(f"  ! the plan disagrees: {issue}")
    else:
        click.echo(f"\n(no model configured: {NOT_CONFIGURED}; the demo uses a hand-made change)")
        step("3. alice changes app-staging on a branch: an encrypted, versioned S3 bucket, and a new AMI")
        clone = _hand_made_branch(settings, home)
        click.echo("pushed branch reports-bucket")
        step("4. gateway propose --branch reports-bucket: the engine plans; this is the preview")
        proposal = open_proposal(ws, alice, "reports-bucket", "Reports need their own bucket; AMI refresh")
    for stack, preview in proposal_previews(ws, proposal).items():
        click.echo(f"[{stack}]")
        click.echo(render_text(preview), nl=False)

    step("5. alice tries to approve her own change")
    _attempt(lambda: decide(ws, alice, proposal.id, Decision.APPROVE, "lgtm"))

    step("6. bob (approver, platform group) approves commit and plan")
    proposal = decide(ws, bob, proposal.id, Decision.APPROVE, "bucket is encrypted and versioned")
    click.echo(f"approved at {proposal.head_sha[:12]} for plan {proposal.plans['app-staging'].digest[:19]}…")
    click.echo(f"risk {proposal.risk.value} (the instance is replaced): {approval_shortfall(proposal, ws.repo_settings())[0]}")

    step("7. one more commit on the branch: bob's approval no longer counts")
    if by_agent:
        submit_request(ws, alice, AGENT_FOLLOW_UP, outcome.conversation_id, progress=lambda s: click.echo(f"  … {s}"))
    else:
        (home / "alice-clone" / "stacks/app-staging/reports.tf").write_text(
            BUCKET_TF.lstrip().replace("tags   = local.tags", 'tags   = merge(local.tags, { purpose = "reports" })'))
        _commit_and_push(clone, "Tag the reports bucket", "alice")
    proposal, changes = sync_proposal(ws, proposal.id)
    for change in changes:
        click.echo(f"gateway: {change}")
    for d in proposal.decisions:
        click.echo(f"{d.principal.name} approved {d.head_sha[:12]}: {'current' if proposal.is_current(d) else 'STALE'}")
    click.echo(f"status: {approval_shortfall(proposal, ws.repo_settings())[0]}")

    step("8. bob and carol review the new plan and approve it")
    decide(ws, bob, proposal.id, Decision.APPROVE, "re-checked after the tag change", seen_sha=proposal.head_sha)
    proposal = decide(ws, carol, proposal.id, Decision.APPROVE, "AMI is the patched one", seen_sha=proposal.head_sha)
    click.echo(f"approved at {proposal.head_sha[:12]} by {', '.join(d.principal.name for d in proposal.current_approvals)}")

    step("9. gateway apply: exactly the approved plan, under the stack lock; then merge")
    report = apply_proposal(ws, alice, proposal.id)
    for outcome in report.outcomes:
        click.echo(f"stack {outcome.stack}: {'applied' if outcome.succeeded else 'FAILED'}: {', '.join(outcome.applied)}")
    click.echo(f"merged into main as {report.merge_sha[:12] if report.merge_sha else '(not merged)'}")
    if not report.succeeded:
        raise SystemExit(1)

    step(f"10. gateway audit show {proposal.id} (as dana, the auditor)")
    for e in audit_service.proposal_story(ws, dana, proposal.id):
        extra = e.payload.get("digest") or e.payload.get("sha") or e.payload.get("merge_sha") or ""
        reasons = "; ".join(e.payload.get("reasons", []))
        click.echo(f"{e.seq:>4} {e.actor:8} {e.kind:18} {str(extra)[:19]} {reasons}".rstrip())

    step("11. gateway audit verify")
    count, broken = audit_service.verify_trail(ws, dana)
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
