"""What blocks an apply: one rule, and everything a person looks at says what the runner will do.

The table is pure (plain dataclass facts, no repository, no database); the agreement tests use a real
workspace, the real app through its client and the real `gateway` command.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gateway.adapters.git.repo import committer_env
from gateway.api.app import create_app
from gateway.domain.apply_blockers import ApplyFacts, MainPush, TeamCheck, apply_blockers, standing_blockers
from gateway.domain.break_glass import BreakGlassWindow
from gateway.domain.errors import Refused
from gateway.domain.lifecycle import ProposalStatus
from gateway.domain.policy import Finding, Severity
from gateway.domain.principals import Principal, PrincipalKind, Role
from gateway.domain.proposal import Decision, DecisionRecord, Proposal, StackPlan
from gateway.domain.repo_settings import BreakGlassSettings, GitHubSettings, RepoSettings, StackSettings
from gateway.services.change.proposals import decide, open_proposal
from gateway.services.change.runner import apply_proposal
from gateway.services.change.views import view_proposal
from gateway.services.workspace import Workspace

from .conftest import Clone, People, run_cli, sign_in_client

# --- the rule, as a table ----------------------------------------------------------------------

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
H = timedelta(hours=1)
HEAD = "a" * 40


def person(name: str, *roles: Role, groups: frozenset[str] = frozenset({"platform"}),
           kind: PrincipalKind = PrincipalKind.PERSON) -> Principal:
    return Principal(f"id-{name}", name, kind, frozenset(roles), groups)


ALICE = person("alice", Role.REQUESTER, groups=frozenset({"app"}))
BOB = person("bob", Role.APPROVER)
PLAN = StackPlan(1, "web", HEAD, "sha256:" + "1" * 64, 3, {"update": 1}, ())
SETTINGS = RepoSettings(stacks={"web": StackSettings("web", "stacks/web", frozenset({"platform"})),
                                "db": StackSettings("db", "stacks/db", frozenset({"data"}))},
                        github=GitHubSettings("acme/infra", teams={"platform": "platform-team"}),
                        break_glass=BreakGlassSettings(frozenset({"oncall"}), codify_within=24 * H))


def approval(by: Principal, auth: str = "api-token", decision: Decision = Decision.APPROVE,
             comment: str = "ok") -> DecisionRecord:
    return DecisionRecord(1, by, decision, HEAD, {"web": PLAN.digest}, comment, auth, T0)


def proposal(*decisions: DecisionRecord, status: ProposalStatus = ProposalStatus.OPEN,
             plan: StackPlan = PLAN) -> Proposal:
    return Proposal(7, "bigger", "b" * 40, HEAD, ALICE, ALICE, "more memory", ("web",), status, {"web": plan},
                    list(decisions))


def window(stack: str = "web", **changes: object) -> BreakGlassWindow:
    base: dict = {"id": 4, "stack": stack, "reason": "incident 4", "opened_by": "olga", "requested_at": T0 - 30 * H,
                  "duration": H, "opened_at": T0 - 30 * H, "ends_at": T0 - 29 * H}
    return BreakGlassWindow(**{**base, **changes})


READY = ApplyFacts(proposal(approval(BOB)), SETTINGS, T0, actor=ALICE)
PUSH = MainPush("c" * 40, "mallory <m@example.com>", frozenset({"web", "db"}))
DENY = Finding("no-public-bucket", Severity.DENY, "aws_s3_bucket.logs", "the bucket is public", "web")


@pytest.mark.parametrize(("case", "facts", "blockers"), [
    ("an agent", replace(READY, actor=person("infra-agent", Role.REQUESTER, kind=PrincipalKind.AGENT),
                         pushes=(PUSH,)),
     ["infra-agent is an agent; agents can never apply a change"]),
    ("applied already", replace(READY, proposal=proposal(approval(BOB), status=ProposalStatus.APPLIED)),
     ["proposal 7 is applied"]),
    ("no role that applies", replace(READY, actor=person("dana", Role.AUDITOR)),
     ["dana has no role that may start an apply"]),
    ("rejected", replace(READY, proposal=proposal(approval(BOB), approval(person("carol", Role.APPROVER),
                                                                        decision=Decision.REJECT, comment="too big"))),
     ["rejected by carol: too big"]),
    ("a policy deny", replace(READY, proposal=proposal(approval(BOB), plan=replace(PLAN, findings=(DENY,)))),
     ["policy denies web:no-public-bucket:aws_s3_bucket.logs: the bucket is public (a policy owner may override it)"]),
    ("no approval", replace(READY, proposal=proposal()),
     ["needs 1 approval(s) of the current commit and plan from different approvers, has 0"]),
    ("a GitHub approver who left the team", replace(READY, proposal=proposal(approval(BOB, "github-review")),
                                                    team_checks={BOB.id: TeamCheck("bob-gh", frozenset())}),
     ["bob's approval on GitHub no longer counts: bob-gh is not an active member of an approver team of "
      "stack web any more"]),
    ("a GitHub approval with no team check known", replace(READY, proposal=proposal(approval(BOB, "github-comment"))),
     ["bob's approval on GitHub no longer counts: their GitHub account is not an active member of an approver "
      "team of stack web any more"]),
    ("a push to main on its stack", replace(READY, pushes=(PUSH,)),
     [f"commit {'c' * 12} by mallory <m@example.com> was pushed to main outside the gateway and changes stack(s) "
      f"web: main describes what was never applied; an approver acknowledges it "
      f"(`gateway main acknowledge {'c' * 12} -m why`) before an apply there"]),
    ("an overdue break-glass window on its stack", replace(READY, windows=(window(),)),
     ["stack web: break-glass window 4 (incident 4) ended at 2026-11-30 07:00 UTC and its drift was not codified "
      "by 2026-12-01 07:00 UTC; the break-glass group acknowledges it (`gateway break-glass acknowledge 4 -m why`) "
      "before an apply there"]),
    # what does not block
    ("nothing in the way", READY, []),
    ("a push to main on another stack", replace(READY, pushes=(replace(PUSH, stacks=frozenset({"db"})),)), []),
    ("an overdue window on another stack", replace(READY, windows=(window("db"),)), []),
    ("a window acknowledged", replace(READY, windows=(window(acknowledged_at=T0 - H, acknowledged_by="olga"),)), []),
    ("a window still in time to codify", replace(READY, windows=(window(),), now=T0 - 6 * H), []),
    ("a GitHub approver still in the team", replace(READY, proposal=proposal(approval(BOB, "github-review")),
                                                    team_checks={BOB.id: TeamCheck("bob-gh", frozenset({"platform"}))}),
     []),
    ("GitHub approvals with no forge on main", replace(READY, proposal=proposal(approval(BOB, "github-review")),
                                                      settings=replace(SETTINGS, github=None)), []),
])
def test_each_blocker_blocks_with_its_reason(case: str, facts: ApplyFacts, blockers: list[str]) -> None:
    assert apply_blockers(facts) == blockers, case


def test_what_stands_for_anyone_leaves_out_the_viewer_the_status_and_a_rejection() -> None:
    facts = replace(READY, actor=person("dana", Role.AUDITOR), pushes=(PUSH,),
                    proposal=proposal(approval(person("carol", Role.APPROVER), decision=Decision.REJECT,
                                               comment="no"), status=ProposalStatus.FAILED))
    standing = standing_blockers(facts)
    assert [b.split(" ", 2)[:2] for b in standing] == [["needs", "1"], ["commit", "c" * 12]]
    assert apply_blockers(facts) == ["dana has no role that may start an apply", "rejected by carol: no"] + standing
    assert apply_blockers(replace(facts, actor=None)) == standing


# --- what people see agrees with what the runner refuses ---------------------------------------

STAGING = "stacks/app-staging/main.tf"


def push_outside(ws: Workspace, tmp_path: Path) -> str:
    """mallory commits to main by hand, changing the app-staging stack."""
    pusher = Clone(ws, tmp_path / "pusher")
    pusher.edit(STAGING, '"cc-3003"', '"cc-7777"')
    pusher.repo.git.add("-A")
    pusher.repo.git.execute(["git", "commit", "-qm", "hotfix"], env=committer_env("mallory", "m@example.com"))
    pusher.repo.git.push("-q", "origin", "HEAD:main")
    return pusher.repo.head.commit.hexsha


def test_after_a_push_to_main_every_view_says_what_the_runner_refuses(workspace: Workspace, people: People,
                                                                       clone: Clone, tmp_path: Path) -> None:
    ws = workspace
    clone.branch("bigger").edit(STAGING, '"t3.small"', '"t3.medium"').push()
    pushed = push_outside(ws, tmp_path)
    proposal_id = open_proposal(ws, people.alice, "bigger", "more memory").id
    decide(ws, people.bob, proposal_id, Decision.APPROVE, "ok")  # a fresh approval, on main as it is now
    named = f"commit {pushed[:12]} by mallory <m@example.com> was pushed to main outside the gateway"

    with TestClient(create_app(ws.settings, workers=0)) as client:
        shown = client.get(f"/api/v1/proposals/{proposal_id}",
                           headers={"Authorization": f"Bearer {people.tokens['alice']}"}).json()
        sign_in_client(client, people.tokens["alice"])
        page = html.unescape(client.get(f"/proposals/{proposal_id}").text)
    cli = run_cli(["show", str(proposal_id)], ws.settings.home, people.tokens["alice"])

    assert 'id="apply"' not in page and named in page  # no Apply button, and the page says why
    assert cli.returncode == 0, cli.stderr
    assert f"blocked: {named}" in cli.stdout and "ready to apply" not in cli.stdout
    assert [b for b in shown["blocked_by"] if named in b]
    assert shown["can_apply"] is False and [b for b in shown["apply_blockers"] if named in b]
    with pytest.raises(Refused) as refused:
        apply_proposal(ws, people.alice, proposal_id)
    assert refused.value.reasons == shown["apply_blockers"]


Setup = Callable[[Workspace, People, Clone, Path], tuple[int, Principal]]


def _opened(ws: Workspace, people: People, clone: Clone) -> int:
    clone.branch("bigger").edit(STAGING, '"t3.small"', '"t3.medium"').push()
    return open_proposal(ws, people.alice, "bigger", "more memory").id


def unapproved(ws: Workspace, people: People, clone: Clone, tmp_path: Path) -> tuple[int, Principal]:
    return _opened(ws, people, clone), people.alice


def rejected(ws: Workspace, people: People, clone: Clone, tmp_path: Path) -> tuple[int, Principal]:
    proposal_id = _opened(ws, people, clone)
    decide(ws, people.bob, proposal_id, Decision.APPROVE, "ok")
    decide(ws, people.carol, proposal_id, Decision.REJECT, "not on a Friday")
    return proposal_id, people.alice


def by_an_auditor(ws: Workspace, people: People, clone: Clone, tmp_path: Path) -> tuple[int, Principal]:
    proposal_id = _opened(ws, people, clone)
    decide(ws, people.bob, proposal_id, Decision.APPROVE, "ok")
    return proposal_id, people.dana


def by_an_agent(ws: Workspace, people: People, clone: Clone, tmp_path: Path) -> tuple[int, Principal]:
    proposal_id = _opened(ws, people, clone)
    decide(ws, people.bob, proposal_id, Decision.APPROVE, "ok")
    return proposal_id, people.agent


def pushed_to_main(ws: Workspace, people: People, clone: Clone, tmp_path: Path) -> tuple[int, Principal]:
    proposal_id = _opened(ws, people, clone)
    push_outside(ws, tmp_path)
    with pytest.raises(Refused, match="changed before your decision"):  # re-planned onto main: review again
        decide(ws, people.bob, proposal_id, Decision.APPROVE, "ok")
    decide(ws, people.bob, proposal_id, Decision.APPROVE, "ok")
    return proposal_id, people.alice


@pytest.mark.parametrize("setup", [unapproved, rejected, by_an_auditor, by_an_agent, pushed_to_main])
def test_the_view_and_the_runner_agree(setup: Setup, workspace: Workspace, people: People, clone: Clone,
                                       tmp_path: Path) -> None:
    proposal_id, actor = setup(workspace, people, clone, tmp_path)
    view = view_proposal(workspace, actor, proposal_id)
    assert not view.can_apply
    with pytest.raises(Refused) as refused:
        apply_proposal(workspace, actor, proposal_id)
    assert refused.value.reasons == view.apply_blockers
