"""The population's checks find what must never be there, read from the trail alone (no git, no database): an apply
whose approvals were not of what it ran, a change approved by its requester through another identity; the sample
is the documented rule; periods and long lists read as people write and read them."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import date
from typing import Any

import pytest

from gateway.domain.audit import AuditEvent
from gateway.domain.audit_period import Period, parse_period, period_of
from gateway.domain.change_population import Scope, build_population, draw_sample
from gateway.domain.story import event_details, summary_lines

HEAD, OTHER = "a" * 40, "b" * 40
PLAN, REPLANNED = "sha256:" + "1" * 64, "sha256:" + "2" * 64
ALL_TIME = Period(None, None, "all time")


class Trail:
    """Events as the gateway writes them, numbered and timed in order."""

    def __init__(self) -> None:
        self.events: list[AuditEvent] = []

    def add(self, actor: str, kind: str, payload: Mapping[str, Any], proposal: int | None = None,
            stacks: tuple[str, ...] = (), actor_kind: str = "person") -> AuditEvent:
        seq = len(self.events) + 1
        event = AuditEvent(seq, f"id-{seq}", f"2026-11-{1 + seq // 100:02d}T10:{seq // 60 % 60:02d}:{seq % 60:02d}"
                                             ".000000+00:00", actor, actor_kind, kind, proposal, stacks, payload, "", "")
        self.events.append(event)
        return event

    def change(self, pid: int, requester: str = "alice", proposer: str | None = None, proposer_kind: str = "person",
               stack: str = "web") -> None:
        self.add(requester, "change.requested", {"reason": f"change {pid}", "branch": f"b{pid}"}, pid, (stack,))
        self.add(proposer or requester, "proposal.opened", {"head_sha": HEAD, "requester": requester}, pid, (stack,),
                 proposer_kind)
        self.add("gateway", "plan", {"head_sha": HEAD, "digest": PLAN, "risk": {"level": "low", "reasons": []},
                                     "findings": []}, pid, (stack,), "system")

    def approve(self, pid: int, by: str, head: str = HEAD, digest: str = PLAN, stack: str = "web",
                auth: str = "api-token") -> None:
        self.add(by, "approval", {"head_sha": head, "digests": {stack: digest}, "authenticated_by": auth,
                                  "required_approvals": 1, "comment": "ok"}, pid, (stack,))

    def apply(self, pid: int, head: str = HEAD, digest: str = PLAN, stack: str = "web", ok: bool = True) -> None:
        self.add("admin", "proposal.start_apply", {"from": "open", "to": "applying"}, pid, (stack,))
        self.add("admin", "apply.started", {"apply_id": pid, "head_sha": head, "digest": digest}, pid, (stack,))
        self.add("admin", "apply.succeeded" if ok else "apply.failed",
                 {"apply_id": pid, "applied": ["aws_instance.web"] if ok else [], "head_sha": head, "digest": digest,
                  "error": None if ok else "AccessDenied", "failed_address": None if ok else "aws_instance.web"},
                 pid, (stack,))
        self.add("admin", "proposal.finish" if ok else "proposal.fail", {}, pid, (stack,))


def test_an_apply_whose_approval_was_of_another_commit_plan_or_was_withdrawn_is_found() -> None:
    trail = Trail()
    for pid in (1, 2, 3, 4):
        trail.change(pid)
    trail.approve(1, "bob")
    trail.apply(1)  # as it should be
    trail.approve(2, "bob", head=OTHER)  # an approval of another commit
    trail.apply(2)
    trail.approve(3, "bob", digest=REPLANNED)  # of another plan
    trail.apply(3)
    trail.approve(4, "bob")
    trail.add("bob", "decision.withdrawn", {"by": "bob", "head_sha": HEAD, "reason": "not yet"}, 4, ("web",))
    trail.apply(4)  # after the only approval was withdrawn
    population = build_population(trail.events, ALL_TIME)
    check = population.checks[0]
    assert check.name == "approvals-of-what-ran" and check.checked == 4 and not check.passed
    assert [v.proposal_id for v in check.violations] == [2, 3, 4]
    assert check.violations[0].summary.startswith("proposal 2: the apply of web at ") and (
        f"counted 0 of 1 approval(s) of commit {HEAD[:12]} and plan {PLAN[:19]}…" in check.violations[0].summary)
    assert [x.kind for x in population.exceptions] == ["unapproved-apply"] * 3  # the auditor sees them first


def test_a_change_approved_by_its_requester_through_another_identity_is_found() -> None:
    trail = Trail()
    for name, subject in (("alice", "sub-17"), ("alice-admin", "sub-17"), ("bob", "sub-2")):
        trail.add("admin", "identity.linked", {"name": name, "issuer": "https://idp.example", "subject": subject})
    trail.add("admin", "principal.added", {"name": "infra-agent", "kind": "agent", "acting_for": "carol"})
    trail.add("admin", "principal.github_linked", {"name": "dave", "github_login": "d", "github_id": 7})
    trail.add("admin", "principal.github_linked", {"name": "dave2", "github_login": "D2", "github_id": 7})
    trail.change(1)
    trail.approve(1, "alice-admin", auth="oidc:https://idp.example")  # the requester, signed in as her other user
    trail.apply(1)
    trail.change(2, requester="carol", proposer="infra-agent", proposer_kind="agent")
    trail.approve(2, "carol")  # the person the agent acts for
    trail.apply(2)
    trail.change(3, requester="dave")
    trail.approve(3, "dave2")  # the same GitHub account
    trail.apply(3)
    trail.change(4)
    trail.approve(4, "bob")  # somebody else
    trail.apply(4)
    check = build_population(trail.events, ALL_TIME).checks[1]
    assert check.name == "requester-is-not-approver" and check.checked == 4
    assert [(v.proposal_id, v.details["approver"], v.details["through"]) for v in check.violations] == [
        (1, "alice-admin", "oidc:https://idp.example#sub-17"), (2, "carol", "the same principal"),
        (3, "dave2", "github:7")]
    assert "approved by alice-admin, the same person as its requester alice" in check.violations[0].summary


def test_the_population_is_the_period_s_applies_and_the_scope_asked() -> None:
    trail = Trail()
    trail.change(1, stack="web")
    trail.approve(1, "bob")
    trail.apply(1)
    trail.change(2, requester="erin", stack="db")
    trail.approve(2, "bob", stack="db")
    trail.apply(2, stack="db", ok=False)
    trail.change(3)  # never applied: not in the population
    population = build_population(trail.events, ALL_TIME, environments={"db": "production"})
    assert [(r.proposal_id, r.outcome) for r in population.rows] == [(1, "applied"), (2, "failed")]
    assert population.rows[1].flags == ("failed",) and population.rows[1].environments == ("production",)
    assert [r.proposal_id for r in build_population(trail.events, ALL_TIME, Scope(stack="db")).rows] == [2]
    assert [r.proposal_id for r in build_population(trail.events, ALL_TIME, Scope(person="erin")).rows] == [2]
    assert [r.proposal_id for r in build_population(trail.events, ALL_TIME, Scope(environment="production"),
                                                    environments={"db": "production"}).rows] == [2]
    assert build_population(trail.events, Period("2027-01-01", None, "2027")).rows == ()
    [failed] = build_population(trail.events, ALL_TIME).exceptions
    assert failed.kind == "failed-apply" and "failed at aws_instance.web" in failed.summary


def test_a_sample_is_the_documented_rule_for_any_tool_to_redo() -> None:
    trail = Trail()
    for pid in range(1, 41):
        trail.change(pid)
        trail.approve(pid, "bob")
        trail.apply(pid)
    population = build_population(trail.events, ALL_TIME)
    sample = draw_sample(population, 5, "soc2-q4")
    redone = sorted(sorted(range(1, 41), key=lambda p: hashlib.sha256(f"soc2-q4:{p}".encode()).hexdigest())[:5])
    assert list(sample.selected) == redone and sample.population == 40
    assert draw_sample(population, 5, "soc2-q4") == sample and draw_sample(population, 5, "other").selected != redone
    assert sample.to_json()["population_digest"] == population.digest()
    assert len(draw_sample(population, 100, "x").selected) == 40  # never more than the population
    with pytest.raises(ValueError, match="needs a seed"):
        draw_sample(population, 5, "")


@pytest.mark.parametrize("text, since, until", [
    ("2026", "2026-01-01", "2027-01-01"),
    ("2026-Q4", "2026-10-01", "2027-01-01"),
    ("2026-02", "2026-02-01", "2026-03-01"),
    ("2026-07-01..2026-09-30", "2026-07-01", "2026-10-01"),
    ("2026-07..2026-09", "2026-07-01", "2026-10-01"),
    ("2026-07..", "2026-07-01", None),
    ("..2026-09-30T10:00", None, "2026-09-30T10:00"),
])
def test_periods_read_as_auditors_write_them(text: str, since: str | None, until: str | None) -> None:
    period = parse_period(text)
    assert (period.since or "")[:len(since or "")] == (since or "") and (period.since is None) == (since is None)
    assert (period.until or "")[:len(until or "")] == (until or "") and (period.until is None) == (until is None)


@pytest.mark.parametrize("text, said", [("2026-13", "month must be in 1..12"), ("soon", "say 2026, 2026-Q3"),
                                        ("2026-10..2026-09", "its end is not after its start")])
def test_a_period_that_is_not_one_is_a_clear_error(text: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        parse_period(text)


def test_a_named_period_with_ends_is_the_part_between_them() -> None:
    today = date(2026, 12, 7)
    assert period_of("2026-Q3", "2026-08-01", None, today).since == "2026-08-01T00:00:00.000000+00:00"
    assert period_of("2026-Q3", None, "2026-08", today).until == "2026-09-01T00:00:00.000000+00:00"
    assert period_of(None, None, None, today).since == "2026-09-08T00:00:00.000000+00:00"  # the last 90 days
    backwards = period_of(None, "2026-09-01", "2026-08-01", today)
    assert not backwards.holds("2026-08-15T00:00:00+00:00") and not backwards.holds("2026-09-15T00:00:00+00:00")
    with pytest.raises(ValueError, match="'soon' is not a date or a time"):
        period_of(None, "soon", None, today)


def test_a_long_list_shows_its_count_its_first_items_and_how_many_more() -> None:
    changed = [f"aws_security_group.g{i}" for i in range(300)]
    payload = {"changed": changed, "risk": {"level": "medium", "reasons": [f"{a}: opens network access" for a in changed]},
               "digest": PLAN, "message": "first line\nsecond\nthird", "empty": []}
    lines = summary_lines(payload)
    assert lines[0] == ("changed: 300: aws_security_group.g0, aws_security_group.g1, aws_security_group.g2, "
                        "aws_security_group.g3, aws_security_group.g4, and 295 more")
    assert lines[1] == "risk.level: medium" and lines[2].startswith("risk.reasons: 300: ") and "and 295 more" in lines[2]
    assert lines[4] == "message: first line (and 2 more line(s))" and not any("empty" in line for line in lines)
    full = summary_lines(payload, full=True)
    assert full.count("  aws_security_group.g299") == 1 and "changed: 300" in full
    details = {d.key: d for d in event_details(payload)}
    assert details["changed"].count == 300 and len(details["changed"].rest) == 295  # the rest is there, on demand
