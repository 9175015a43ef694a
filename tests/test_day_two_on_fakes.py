"""Day two's rules that need no repository, plan or simulated cloud, on tests/fakes.py's unit of work: what a
rollback refuses before it writes a branch, what codify, import and a drift check refuse before they plan, who
reads drift records, and break-glass windows asked for, closed and told as a story. The clock is a FakeClock.
Drift found by a refresh, a codify or import proven by a plan, and a rollback applied stay in test_day_two.py
(test_use_cases_on_fakes.py holds break-glass from request to acknowledgement)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gateway.domain.drift import DriftStatus
from gateway.domain.errors import InputError, NotFound, Refused
from gateway.domain.preview import DriftEntry
from gateway.domain.principals import GATEWAY, Principal, PrincipalKind, Role
from gateway.domain.proposal import PlanSummary, ProposalKind, ProposalStatus, Transition
from gateway.services.change.apply_facts import windows_of
from gateway.services.day_two.break_glass import (
    acknowledge_break_glass,
    break_glass_story,
    close_break_glass,
    confirm_break_glass,
    get_window,
    open_break_glass,
    overdue_windows,
    sweep_break_glass,
)
from gateway.services.day_two.codify import codify_drift
from gateway.services.day_two.drift import revert_drift
from gateway.services.day_two.drift_records import CHECKED, check_drift, list_drift_records
from gateway.services.day_two.imports import import_resource
from gateway.services.day_two.rollback import rollback_proposal
from gateway.services.workspace import Workspace

from .fakes import SAMPLE_GATEWAY_YAML, FakeClock, FakeDeclarationRepo, fake_workspace, person

BREAK_GLASS = "\nbreak_glass:\n  groups: [oncall]\n  codify_within: 1h\n  max_window: 4h\n"


class Team:
    def __init__(self, ws: Workspace):
        self.alice = person("alice", Role.REQUESTER, groups=["app"], store=ws.store)
        self.bob = person("bob", Role.APPROVER, groups=["platform"], store=ws.store)
        self.dana = person("dana", Role.AUDITOR, store=ws.store)
        self.agent = person("infra-agent", Role.REQUESTER, kind=PrincipalKind.AGENT, store=ws.store)
        self.olga = person("olga", Role.REQUESTER, groups=["oncall"], store=ws.store)
        self.paul = person("paul", Role.REQUESTER, groups=["oncall"], store=ws.store)


@pytest.fixture
def ws() -> Workspace:
    return fake_workspace(SAMPLE_GATEWAY_YAML + BREAK_GLASS)


@pytest.fixture
def team(ws: Workspace) -> Team:
    return Team(ws)


def applied(ws: Workspace, requester: Principal, kind: ProposalKind = ProposalKind.CHANGE,
            counts: dict[str, int] | None = None) -> int:
    """A proposal on app-staging applied and merged (what the runner leaves), planned with `counts`."""
    with ws.store.session() as session:
        pid = session.proposals.add("bigger", "main-1", "head-1", requester, requester, "bigger web",
                                    ["app-staging"], ["stacks/app-staging/main.tf"], kind=kind)
        session.proposals.add_plan(pid, "app-staging", "head-1", "main-1", "sha256:p", "{}", 0, "lineage",
                                   PlanSummary(counts=counts or {"update": 1}), "preview")
        proposal = session.proposals.get(pid, lock=True)
        proposal.move(Transition.START_APPLY, GATEWAY, {}, applied_sha="merged-1")
        proposal.move(Transition.FINISH, GATEWAY, {}, merge_sha="merge-1")
        session.proposals.save(proposal)
    return pid


def get_proposal_status(ws: Workspace, pid: int) -> ProposalStatus:
    with ws.store.session(readonly=True) as session:
        return session.proposals.get(pid).status


def branches(ws: Workspace) -> set[str]:
    assert isinstance(ws.repo, FakeDeclarationRepo)
    return set(ws.repo.refs)


def test_only_an_applied_merged_change_is_rolled_back_and_a_refusal_writes_no_branch(ws: Workspace,
                                                                                      team: Team) -> None:
    before = branches(ws)
    with ws.store.session() as session:
        waiting = session.proposals.add("other", "main-1", "head-2", team.alice, team.alice, "not yet", ["app-staging"],
                                        [])
    with pytest.raises(Refused, match=f"proposal {waiting} is open; only an applied, merged change is rolled back"):
        rollback_proposal(ws, team.alice, waiting, "changed my mind")
    done = applied(ws, team.alice)
    assert get_proposal_status(ws, done) == ProposalStatus.APPLIED
    with pytest.raises(InputError, match="say why it is rolled back"):
        rollback_proposal(ws, team.alice, done, "  ")
    with pytest.raises(NotFound, match="no proposal 99"):
        rollback_proposal(ws, team.alice, 99, "why")
    assert branches(ws) == before


def test_a_rollback_of_an_import_or_of_a_drift_revert_is_refused(ws: Workspace, team: Team) -> None:
    imported = applied(ws, team.alice, counts={"import": 1})
    with pytest.raises(Refused, match=rf"proposal {imported} imported objects that existed before it \(stack "
                                      r"app-staging\): a rollback would destroy them"):
        rollback_proposal(ws, team.alice, imported, "wrong stack")
    revert = applied(ws, team.alice, kind=ProposalKind.DRIFT_REVERT)
    with pytest.raises(Refused, match=f"proposal {revert} reverted drift by applying main as it was: it changed no "
                                      "declaration, so there is nothing to roll back"):
        rollback_proposal(ws, team.alice, revert, "undo")


def test_codify_needs_a_known_stack_and_its_open_drift_record(ws: Workspace, team: Team) -> None:
    with pytest.raises(NotFound, match="unknown stack 'nowhere'"):
        codify_drift(ws, team.alice, "nowhere")
    with pytest.raises(InputError, match="stack app-staging has no open drift record .*gateway drift check "
                                         "--stack app-staging"):
        codify_drift(ws, team.alice, "app-staging")
    with ws.store.session() as session:  # a record closed already is nothing to codify either
        rid = session.day_two.add_drift_record("app-staging", [], False, None)
        session.day_two.close_drift_record(rid, "gateway", "a check finds no drift any more", None)
    with pytest.raises(InputError, match="has no open drift record"):
        codify_drift(ws, team.alice, "app-staging")
    assert branches(ws) == {"main"}


def test_an_import_names_a_resource_address_of_a_known_stack(ws: Workspace, team: Team) -> None:
    with pytest.raises(InputError, match="'admin' is not a resource address of the form TYPE.NAME"):
        import_resource(ws, team.alice, "app-staging", "admin", "sg-1")
    with pytest.raises(NotFound, match="unknown stack 'nowhere'"):
        import_resource(ws, team.alice, "nowhere", "aws_security_group.admin", "sg-1")
    assert branches(ws) == {"main"}


def test_an_agent_and_an_auditor_start_no_drift_check_or_revert(ws: Workspace, team: Team) -> None:
    for who in (team.agent, team.dana):
        with pytest.raises(Refused, match=f"{who.name} may not start a drift check"):
            check_drift(ws, who, "app-staging")
        with pytest.raises(Refused, match=f"{who.name} may not start a drift check"):
            revert_drift(ws, who, "app-staging")
    with ws.store.session(readonly=True) as session:
        assert session.day_two.drift_records() == [] and session.main.marker("drift_checked:app-staging") is None


def test_drift_records_are_listed_newest_first_by_stack_and_open_or_all(ws: Workspace, team: Team) -> None:
    entry = DriftEntry("aws_instance.web[0]", "instance_type changed", True, ())
    with ws.store.session() as session:
        first = session.day_two.add_drift_record("app-staging", [entry], False, None)
        session.day_two.close_drift_record(first, "gateway", "a check finds no drift any more", None)
        second = session.day_two.add_drift_record("app-staging", [entry], False, None)
        third = session.day_two.add_drift_record("data", [], True, None)
    assert [r.id for r in list_drift_records(ws, team.dana)] == [third, second, first]
    assert [r.id for r in list_drift_records(ws, team.alice, only_open=True)] == [third, second]
    [staging] = list_drift_records(ws, team.bob, "app-staging", only_open=True)
    assert (staging.id, staging.status, staging.addresses) == (second, DriftStatus.OPEN, ["aws_instance.web[0]"])


def test_a_window_needs_a_reason_a_length_within_the_limit_and_a_known_stack(ws: Workspace, team: Team) -> None:
    with pytest.raises(Refused) as refused:
        open_break_glass(ws, team.olga, "app-staging", "  ", timedelta(hours=5))
    assert refused.value.reasons == ["say why (-m): the incident this is for",
                                     "a window lasts at most 4:00:00 (break_glass.max_window)"]
    with pytest.raises(NotFound, match="unknown stack 'nowhere'"):
        open_break_glass(ws, team.olga, "nowhere", "incident", timedelta(hours=1))
    with pytest.raises(NotFound, match="no break-glass window 7"):
        get_window(ws, 7)
    with ws.store.session(readonly=True) as session:
        [recorded] = session.audit.events(kind="break_glass.refused")
    assert (recorded.actor, recorded.stacks, len(recorded.payload["reasons"])) == ("olga", ("app-staging",), 2)


def test_nobody_breaks_the_glass_where_gateway_yaml_names_no_group() -> None:
    ws = fake_workspace()
    olga = person("olga", Role.REQUESTER, groups=["oncall"], store=ws.store)
    with pytest.raises(Refused, match="gateway.yaml names no break_glass.groups: nobody may break the glass"):
        open_break_glass(ws, olga, "app-staging", "incident", timedelta(hours=1))


def test_a_window_asked_for_is_closed_by_its_people_or_the_group_and_only_once(ws: Workspace, team: Team) -> None:
    window = open_break_glass(ws, team.olga, "app-prod", "incident 12", timedelta(hours=1))
    assert window.opened_at is None  # a protected stack: waiting for a second person
    with pytest.raises(Refused, match="alice may not close break-glass window"):
        close_break_glass(ws, team.alice, window.id, "not mine")
    closed = close_break_glass(ws, team.paul, window.id, "the incident is over")  # the group acts for its people
    assert closed.closed_at == ws.clock.now()
    with pytest.raises(Refused, match=f"break-glass window {window.id} has already ended"):
        close_break_glass(ws, team.olga, window.id, "again")
    with pytest.raises(Refused, match="not waiting for a confirmation"):
        confirm_break_glass(ws, team.paul, window.id)
    with ws.store.session(readonly=True) as session:
        [event] = session.audit.events(kind="break_glass.closed")
    assert (event.actor, event.payload["note"], event.payload["break_glass"]) == ("paul", "the incident is over",
                                                                                   window.id)


def test_a_window_that_ran_out_is_not_closed_again(ws: Workspace, team: Team) -> None:
    window = open_break_glass(ws, team.olga, "app-staging", "incident 13", timedelta(minutes=30))
    assert isinstance(ws.clock, FakeClock)
    ws.clock.advance(31 * 60)
    with pytest.raises(Refused, match=f"break-glass window {window.id} has already ended"):
        close_break_glass(ws, team.olga, window.id, "late")


def test_listing_break_glass_windows_writes_nothing(ws: Workspace, team: Team) -> None:
    window = open_break_glass(ws, team.olga, "app-staging", "incident 10", timedelta(minutes=1))
    assert isinstance(ws.clock, FakeClock)
    ws.clock.advance(3 * 3600)  # ended, never settled: a sweep would check and record; a list must not
    with ws.store.session(readonly=True) as session:
        before = len(session.audit.events())
    assert [w.id for w in windows_of(ws)] == [window.id] == [w.id for w in windows_of(ws, "app-staging")]
    assert windows_of(ws, "data") == [] and [w.id for w in overdue_windows(ws)] == [window.id]  # shown, not flagged
    with ws.store.session(readonly=True) as session:  # a read unit of work: a write would have been refused
        assert len(session.audit.events()) == before and session.day_two.break_glass(window.id).codified_at is None


def test_the_story_of_a_window_is_its_events_its_drift_and_what_settled_it_for_trail_readers(
        ws: Workspace, team: Team) -> None:
    window = open_break_glass(ws, team.olga, "app-staging", "incident 14", timedelta(hours=1))
    with ws.store.session() as session:  # what a check during it and a codify after it record
        rid = session.day_two.add_drift_record("app-staging", [], True, window.id)
        session.audit.append(GATEWAY, "drift.opened", {"record": rid, "break_glass": window.id}, None, ["app-staging"])
        session.audit.append(GATEWAY, "drift.opened", {"record": 99}, None, ["data"])  # another stack's
        session.day_two.close_drift_record(rid, "gateway", "a codify was applied", 7)
        session.audit.append(GATEWAY, "merged", {}, 7, ["app-staging"])
        session.audit.append(GATEWAY, "merged", {}, 8, ["app-staging"])  # a proposal that settled nothing of it
    with pytest.raises(Refused, match="olga is not an auditor"):
        break_glass_story(ws, team.olga, window.id)
    story = [(e.kind, e.proposal_id) for e in break_glass_story(ws, team.dana, window.id)]
    assert story == [("break_glass.opened", None), ("drift.opened", None), ("merged", 7)]


def test_time_runs_on_for_open_windows_by_the_last_gateway_yaml_on_main_that_parsed(ws: Workspace,
                                                                                     team: Team) -> None:
    window = open_break_glass(ws, team.olga, "app-staging", "incident 15", timedelta(minutes=10))
    with ws.store.session() as session:  # the window's drift, as a check during it records it
        session.day_two.add_drift_record("app-staging", [], True, window.id)
    assert isinstance(ws.repo, FakeDeclarationRepo) and isinstance(ws.clock, FakeClock)
    ws.repo.set_main("stacks: [this is not what gateway.yaml holds\n")  # pushed outside the gateway
    ws.clock.advance(10 * 60 + 3600 + 1)  # past the window's end and its codify deadline (1h)
    with ws.store.session() as session:
        session.main.set_marker(CHECKED + "app-staging", ws.clock.now().isoformat())
    assert sweep_break_glass(ws) == [f"window {window.id} overdue"]


def test_an_import_is_refused_where_the_engine_cannot_prove_it() -> None:
    ws = fake_workspace(SAMPLE_GATEWAY_YAML.replace("engine: sandbox ", "engine: terraform", 1))
    alice = person("alice", Role.REQUESTER, groups=["app"], store=ws.store)
    with pytest.raises(InputError, match="stack app-staging runs on the terraform engine: Terraform 1.0.3 has no "
                                         "import blocks"):
        import_resource(ws, alice, "app-staging", "aws_security_group.admin", "sg-1")
    assert branches(ws) == {"main"}


def test_agents_neither_confirm_close_nor_acknowledge_a_window(ws: Workspace, team: Team) -> None:
    window = open_break_glass(ws, team.olga, "app-prod", "incident 16", timedelta(hours=1))
    with pytest.raises(Refused, match="infra-agent is an agent; only people may confirm a break-glass window"):
        confirm_break_glass(ws, team.agent, window.id)
    with pytest.raises(Refused, match="infra-agent may not close break-glass window"):
        close_break_glass(ws, team.agent, window.id, "over")
    with pytest.raises(Refused, match="infra-agent is an agent; only people may acknowledge"):
        acknowledge_break_glass(ws, team.agent, window.id, "seen")
    assert get_window(ws, window.id).opened_at is None and get_window(ws, window.id).closed_at is None
