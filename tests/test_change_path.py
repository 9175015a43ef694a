"""The rules no part may break. Who decides, what makes a decision stale and what an apply refuses run on the sample
repo in memory (tests/fakes.py's sandbox_workspace: the real engine, policy checks and runner over a fake store and a
fake repo); an apply that merges or fails mid-way, a plan made stale by another apply (git's line merge) and
auto-apply (the job queue) run end to end on the real store (SQLite and PostgreSQL) and git."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from gateway.adapters.store.rows import now
from gateway.domain.errors import InputError, NotFound, Refused
from gateway.domain.plan import load_plan
from gateway.domain.proposal import Decision, ProposalStatus
from gateway.services.change.proposals import decide, get_proposal, open_proposal, override_finding, sync_proposal
from gateway.services.change.runner import apply_proposal
from gateway.services.workspace import Workspace

from .conftest import Clone, People, add_people
from .fakes import FakeClone, FakeStore

STAGING = "stacks/app-staging/main.tf"
EXTRA_BUCKET = '''
resource "aws_s3_bucket" "extra" {
  bucket = "extra-staging"
  tags   = local.tags
}
resource "aws_s3_bucket_public_access_block" "extra" {
  bucket                  = aws_s3_bucket.extra.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}
resource "aws_s3_bucket_server_side_encryption_configuration" "extra" {
  bucket = aws_s3_bucket.extra.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "aws:kms"
    }
  }
}
resource "aws_s3_bucket_versioning" "extra" {
  bucket = aws_s3_bucket.extra.id
  versioning_configuration {
    status = "Enabled"
  }
}
'''


@pytest.fixture
def bigger(checkout: FakeClone) -> FakeClone:
    """A branch that resizes the staging web instance."""
    checkout.branch("bigger").edit(STAGING, '"t3.small"', '"t3.medium"').push()
    return checkout


def test_new_commit_makes_approval_stale_and_blocks_apply(ws: Workspace, team: People, bigger: FakeClone) -> None:
    proposal = open_proposal(ws, team.alice, "bigger", "more memory")
    first_sha = proposal.head_sha
    decide(ws, team.bob, proposal.id, Decision.APPROVE, "ok")
    bigger.edit(STAGING, '"t3.medium"', '"t3.large"').push("even bigger")
    with pytest.raises(Refused) as refused:
        apply_proposal(ws, team.alice, proposal.id)
    assert any("needs 1 approval(s)" in r or "changed" in r for r in refused.value.reasons)
    proposal = get_proposal(ws, proposal.id)
    assert proposal.head_sha != first_sha
    [stale] = proposal.stale_decisions
    assert stale.principal.name == "bob" and stale.head_sha == first_sha
    assert ws.simulator.read_state("app-staging").resources["aws_instance.web[0]"].attributes["instance_type"] == "t3.small"


def test_approval_names_the_sha_it_saw(ws: Workspace, team: People, bigger: FakeClone) -> None:
    proposal = open_proposal(ws, team.alice, "bigger", "more memory")
    bigger.edit(STAGING, '"t3.medium"', '"t3.large"').push("even bigger")
    with pytest.raises(Refused, match="changed before your decision was recorded"):
        decide(ws, team.bob, proposal.id, Decision.APPROVE, "")
    current = get_proposal(ws, proposal.id)
    with pytest.raises(Refused, match="the branch moved"):
        decide(ws, team.bob, proposal.id, Decision.APPROVE, "", seen_sha=proposal.head_sha)
    approved = decide(ws, team.bob, proposal.id, Decision.APPROVE, "", seen_sha=current.head_sha)
    assert approved.current_approvals[0].digests == approved.current_digests


def test_one_rejection_stops_the_proposal_until_a_new_commit(
        ws: Workspace, team: People, bigger: FakeClone) -> None:
    proposal = open_proposal(ws, team.alice, "bigger", "more memory")
    decide(ws, team.bob, proposal.id, Decision.APPROVE, "ok")
    decide(ws, team.carol, proposal.id, Decision.REJECT, "wait for the freeze to end")
    with pytest.raises(Refused, match="rejected by carol: wait for the freeze to end"):
        apply_proposal(ws, team.alice, proposal.id)
    bigger.edit(STAGING, '"t3.medium"', '"t3.large"').push("after the freeze")
    sync_proposal(ws, proposal.id)
    decide(ws, team.bob, proposal.id, Decision.APPROVE, "ok now")
    assert apply_proposal(ws, team.alice, proposal.id).succeeded


def test_protected_resource_destroy_needs_two_approvers(ws: Workspace, team: People, checkout: FakeClone) -> None:
    checkout.branch("lb").edit("stacks/app-prod/main.tf", 'load_balancer_type = "application"',
                            'load_balancer_type = "network"').push()
    proposal = open_proposal(ws, team.alice, "lb", "switch to an NLB")
    with pytest.raises(Refused, match="policy denies app-prod:protected-resource:aws_lb.web"):
        decide(ws, team.bob, proposal.id, Decision.APPROVE, "")
    override_finding(ws, team.frank, proposal.id, "app-prod:protected-resource:aws_lb.web",
                     "NLB migration, change ticket CHG-1042", now() + timedelta(days=1))
    decide(ws, team.bob, proposal.id, Decision.APPROVE, "")
    with pytest.raises(Refused, match=r"needs 2 approval\(s\).*protected app-prod:aws_lb.web"):
        apply_proposal(ws, team.alice, proposal.id)
    decide(ws, team.carol, proposal.id, Decision.APPROVE, "")
    assert apply_proposal(ws, team.alice, proposal.id).succeeded


def test_tampered_saved_plan_is_refused_and_replanned(ws: Workspace, team: People, bigger: FakeClone) -> None:
    proposal = open_proposal(ws, team.alice, "bigger", "more memory")
    decide(ws, team.bob, proposal.id, Decision.APPROVE, "")
    plan_id = proposal.plans["app-staging"].plan_id
    assert isinstance(ws.store, FakeStore)
    saved = ws.store.tables.plans[plan_id]  # the saved row edited in place, behind the gateway's back
    saved["document"] = str(saved["document"]).replace("t3.medium", "x2idn.32xlarge")
    with pytest.raises(Refused, match="saved plan of stack app-staging does not hash to the approved digest"):
        apply_proposal(ws, team.alice, proposal.id)
    instance = ws.simulator.read_state("app-staging").resources["aws_instance.web[0]"]
    assert instance.attributes["instance_type"] == "t3.small"  # nothing ran
    after = get_proposal(ws, proposal.id)
    assert after.plans["app-staging"].plan_id != plan_id  # re-planned from the approved commit
    # the fresh plan is the one bob approved (same digest), so his approval holds for it, not for the forgery
    assert after.current_digests == proposal.current_digests and after.current_approvals
    assert apply_proposal(ws, team.alice, proposal.id).succeeded
    instance = ws.simulator.read_state("app-staging").resources["aws_instance.web[0]"]
    assert instance.attributes["instance_type"] == "t3.medium"


def test_state_moved_since_plan_is_refused_and_replanned(workspace: Workspace, people: People, clone: Clone) -> None:
    clone.branch("bigger").edit(STAGING, '"t3.small"', '"t3.medium"').push()
    first = open_proposal(workspace, people.alice, "bigger", "more memory")
    clone.branch("cost-centre").edit(STAGING, '"cc-3003"', '"cc-3004"').push()
    second = open_proposal(workspace, people.alice, "cost-centre", "new cost centre")
    for p in (first, second):
        decide(workspace, people.bob, p.id, Decision.APPROVE, "")
    assert apply_proposal(workspace, people.alice, first.id).succeeded
    with pytest.raises(Refused, match="state of stack app-staging moved since its plan"):
        apply_proposal(workspace, people.alice, second.id)
    replanned = get_proposal(workspace, second.id)
    assert not replanned.current_approvals  # the new plan differs (it starts from the first change): re-approve
    with workspace.store.session() as session:
        document = json.loads(session.proposals.plan_document(replanned.plans["app-staging"].plan_id))
    web = load_plan(document).find("aws_instance.web[0]").change
    # planned from the merge into the new main, the second change keeps the first one instead of reverting it
    assert web.before["instance_type"] == web.after["instance_type"] == "t3.medium"
    assert web.after["tags"]["cost-centre"] == "cc-3004"


def test_apply_merges_and_records_the_applied_commit(any_workspace: Workspace, tmp_path: Path) -> None:
    people = add_people(any_workspace)
    Clone(any_workspace, tmp_path / "c").branch("bigger").edit(STAGING, '"t3.small"', '"t3.medium"').push()
    proposal = open_proposal(any_workspace, people.alice, "bigger", "more memory")
    decide(any_workspace, people.bob, proposal.id, Decision.APPROVE, "")
    report = apply_proposal(any_workspace, people.alice, proposal.id)
    assert report.succeeded and report.merge_sha
    main_text = any_workspace.repo.read_file(any_workspace.repo.resolve("main"), STAGING)
    assert '"t3.medium"' in main_text
    after = get_proposal(any_workspace, proposal.id)
    assert after.status == ProposalStatus.APPLIED and after.merge_sha == report.merge_sha
    with any_workspace.store.session() as session:
        assert session.proposals.last_applied_commit("app-staging") == proposal.head_sha
        kinds = [e.kind for e in session.audit.events(proposal_id=proposal.id)]
    assert kinds == ["change.requested", "proposal.opened", "commit", "plan", "approval", "proposal.start_apply",
                     "apply.started", "apply.succeeded", "proposal.finish", "merged"]


def test_failed_apply_is_recorded_as_failed_and_the_lock_released(any_workspace: Workspace, tmp_path: Path) -> None:
    people = add_people(any_workspace)
    Clone(any_workspace, tmp_path / "c").branch("two").write("stacks/app-staging/extra.tf", EXTRA_BUCKET).push()
    proposal = open_proposal(any_workspace, people.alice, "two", "a bucket with versioning")
    decide(any_workspace, people.bob, proposal.id, Decision.APPROVE, "")
    any_workspace.simulator.inject_fault("app-staging", "aws_s3_bucket_versioning.extra", "AccessDenied")
    report = apply_proposal(any_workspace, people.alice, proposal.id)
    assert not report.succeeded and report.merge_sha is None
    assert get_proposal(any_workspace, proposal.id).status == ProposalStatus.FAILED
    assert any_workspace.store.locks.holder("app-staging") is None
    with any_workspace.store.session() as session:
        [record] = session.proposals.applies_of(proposal.id)
        failure = [e for e in session.audit.events(proposal_id=proposal.id) if e.kind == "apply.failed"]
    assert record.status == "failed" and "AccessDenied" in record.error
    assert record.applied[0] == "aws_s3_bucket.extra"
    assert "aws_s3_bucket_versioning.extra" not in record.applied
    assert failure and failure[0].payload["failed_address"] == "aws_s3_bucket_versioning.extra"
    with pytest.raises(NotFound):  # not merged
        any_workspace.repo.read_file(any_workspace.repo.resolve("main"), "stacks/app-staging/extra.tf")
    # the rest shows in the next plan, which needs a fresh approval
    proposal, changes = sync_proposal(any_workspace, proposal.id)
    with any_workspace.store.session() as session:
        remaining = load_plan(json.loads(session.proposals.plan_document(proposal.plans["app-staging"].plan_id)))
    planned = {"aws_s3_bucket.extra", "aws_s3_bucket_versioning.extra", "aws_s3_bucket_public_access_block.extra",
               "aws_s3_bucket_server_side_encryption_configuration.extra"}
    assert {rc.address for rc in remaining.changes} == planned - set(record.applied)
    assert not proposal.current_approvals and proposal.status == ProposalStatus.OPEN
    decide(any_workspace, people.bob, proposal.id, Decision.APPROVE, "the rest")
    assert apply_proposal(any_workspace, people.alice, proposal.id).succeeded


def test_bad_proposals_are_refused_with_nothing_written(ws: Workspace, team: People, checkout: FakeClone) -> None:
    with ws.store.session() as session:
        before = len(session.audit.events())
    with pytest.raises(NotFound, match="no branch 'nope'"):
        open_proposal(ws, team.alice, "nope", "x")
    with pytest.raises(InputError, match="needs a reason"):
        open_proposal(ws, team.alice, "main", "  ")
    checkout.branch("broken").write("stacks/app-staging/broken.tf", "resource {\n").push()
    with pytest.raises(Exception, match="malformed HCL"):
        open_proposal(ws, team.alice, "broken", "oops")
    with pytest.raises(NotFound, match="no proposal 99"):
        decide(ws, team.bob, 99, Decision.APPROVE, "")
    with ws.store.session() as session:
        assert len(session.audit.events()) == before
        assert session.proposals.list() == []


def test_auto_apply_once_the_last_approval_lands(workspace: Workspace, people: People, clone: Clone) -> None:
    from gateway.services.change.jobs import approve_proposal, run_now_or_follow

    clone.branch("main").edit("gateway.yaml", "auto_apply: false", "auto_apply: true").push("turn on auto-apply")
    clone.branch("bigger").edit(STAGING, '"t3.small"', '"t3.medium"').push()
    proposal = open_proposal(workspace, people.alice, "bigger", "more memory")
    approved, job = approve_proposal(workspace, people.bob, proposal.id, "ok")
    assert job is not None and job.kind.value == "apply"  # queued the moment the last approval landed
    done = run_now_or_follow(workspace, job, "test-runner", lambda _: None)
    assert done.status.value == "succeeded", done.error
    assert get_proposal(workspace, proposal.id).status == ProposalStatus.APPLIED
    instance = workspace.simulator.read_state("app-staging").resources["aws_instance.web[0]"]
    assert instance.attributes["instance_type"] == "t3.medium"
