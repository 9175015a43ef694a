"""The circuit breaker's rules on tests/fakes.py's unit of work: each agent change judged against a sliding window (the
clock is a FakeClock: the window slides by moving it), tripping at the right change with the figures, an open
breaker refusing every later change of the agent until a person of a resetter group resets it, and the kill switch
stopping agent requests. Each change is what planning hands the breaker (a plan of an autoscaling group); how a
proposal, an agent request and a worker meet the breaker on a real repository stays in test_breaker.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.domain.agent_runs import AgentRunStatus
from gateway.domain.audit import EventQuery
from gateway.domain.breaker import ALL_AGENTS
from gateway.domain.errors import InputError, NotFound, Refused
from gateway.domain.plan import load_plan
from gateway.domain.principals import BUILTIN_AGENT_NAME, Principal, PrincipalKind, Role
from gateway.ports import EnginePlan
from gateway.services.agents.agent_runs import get_agent_run, start_agent_run
from gateway.services.change.breaker import (
    agent_stop_reason,
    breaker_status,
    guard_agent_change,
    open_breaker,
    reset_breaker,
)
from gateway.services.change.planning import StackPlanResult
from gateway.services.workspace import Workspace

from .fakes import SAMPLE_GATEWAY_YAML, event_kinds, fake_workspace, later, person

BREAKER = "\nbreaker:\n  window_minutes: 5\n  max_growth_percent: 20\n  max_destroy_count: 3\n  resetters: [platform]\n"


class Team:
    def __init__(self, ws: Workspace):
        self.admin = person("admin", Role.ADMIN, store=ws.store)
        self.bob = person("bob", Role.APPROVER, groups=["platform"], store=ws.store)  # a resetter
        self.erin = person("erin", Role.APPROVER, groups=["data"], store=ws.store)
        self.agent = person("infra-agent", Role.REQUESTER, kind=PrincipalKind.AGENT, store=ws.store)
        self.other = person("ci-bot", Role.REQUESTER, kind=PrincipalKind.AGENT, store=ws.store)
        self.builtin = person(BUILTIN_AGENT_NAME, Role.REQUESTER, kind=PrincipalKind.AGENT, store=ws.store)


@pytest.fixture
def ws() -> Workspace:
    return fake_workspace(SAMPLE_GATEWAY_YAML + BREAKER)


@pytest.fixture
def team(ws: Workspace) -> Team:
    return Team(ws)


def workers_plan(desired: int) -> StackPlanResult:
    """app-staging's autoscaling group from 10 (of at most 40: capacity 50 as the breaker counts it) to `desired`."""
    before = {"name": "workers", "min_size": 1, "max_size": 40, "desired_capacity": 10}
    document = {"format_version": "1.2", "resource_changes": [{
        "address": "aws_autoscaling_group.workers", "type": "aws_autoscaling_group", "name": "workers",
        "change": {"actions": ["update"], "before": before, "after": {**before, "desired_capacity": desired}}}]}
    return StackPlanResult("app-staging", "head", EnginePlan(document, 1, "lineage"), load_plan(document),
                           "sha256:x", "{}")


def agent_change(ws: Workspace, agent: Principal, n: int, desired: int = 12) -> None:
    """Agent change (proposal) n, let through by the breaker and recorded with its figures, as planning does."""
    change = guard_agent_change(ws, agent, n, [workers_plan(desired)])
    with ws.store.session() as session:
        session.breaker.record_change(replace(change, proposal_id=n))


def test_small_agent_changes_trip_the_breaker_at_the_right_one_and_it_stays_open(ws: Workspace, team: Team) -> None:
    for n in range(1, 6):  # +2 each: 10 added to 50 after five changes, not over 20%
        agent_change(ws, team.agent, n)
        later(ws, 10)
    with pytest.raises(Refused, match=r"circuit breaker: 6 change\(s\) by this agent in 5 minutes add 12 capacity "
                                      r"to 50 \(24%, limit 20%\)"):
        agent_change(ws, team.agent, 6)
    later(ws, 600)  # the window has passed: an open breaker stays open until a person resets it
    with pytest.raises(Refused, match="the circuit breaker for infra-agent is open since 2026-12-01 12:00 UTC: "
                                      "circuit breaker: 6 change"):
        agent_change(ws, team.agent, 7, desired=11)  # however small: the agent is stopped
    assert agent_stop_reason(ws, team.agent) is not None  # and a request of it stops between its steps
    agent_change(ws, team.other, 8, desired=11)  # another agent is not
    assert event_kinds(ws, "breaker.") == ["breaker.tripped", "breaker.refused"]
    with ws.store.session(readonly=True) as session:
        [tripped] = session.audit.query(EventQuery(kind="breaker.tripped"))
    assert (tripped.actor, tripped.payload["scope"], tripped.payload["agent"]) == ("gateway", team.agent.id,
                                                                                    "infra-agent")


def test_only_a_person_of_a_resetter_group_resets_it_and_the_window_starts_again(ws: Workspace, team: Team) -> None:
    with pytest.raises(InputError, match="the breaker for infra-agent is not open"):
        reset_breaker(ws, team.bob, "infra-agent", "nothing to reset")
    for n in range(1, 6):
        agent_change(ws, team.agent, n)
    with pytest.raises(Refused):
        agent_change(ws, team.agent, 6)
    with pytest.raises(Refused, match=r"erin is not in a resetter group \(platform\)"):
        reset_breaker(ws, team.erin, "infra-agent", "looks fine")
    with pytest.raises(Refused, match="agents never reset the breaker"):
        reset_breaker(ws, team.agent, "infra-agent", "let me go")
    with pytest.raises(InputError, match="say why"):
        reset_breaker(ws, team.bob, "infra-agent", "  ")
    later(ws, 1)
    reset_breaker(ws, team.bob, "infra-agent", "the growth was planned: scaling for the sale")
    for n in range(7, 12):  # the five changes before the reset no longer count: five more fit
        agent_change(ws, team.agent, n)
    assert event_kinds(ws, "breaker.") == ["breaker.tripped", "breaker.reset"]
    [state] = breaker_status(ws)
    assert (state["agent"], state["open"], state["changed_by"], state["reason"]) == (
        "infra-agent", False, "bob", "the growth was planned: scaling for the sale")


def test_the_window_slides_past_old_changes(ws: Workspace, team: Team) -> None:
    for n in range(1, 6):
        agent_change(ws, team.agent, n)
    later(ws, 5 * 60 + 1)
    for n in range(6, 11):
        agent_change(ws, team.agent, n)  # the first five left the window
    with pytest.raises(Refused, match=r"6 change\(s\) by this agent"):
        agent_change(ws, team.agent, 11)


def test_a_re_planned_change_counts_once_with_its_latest_figures(ws: Workspace, team: Team) -> None:
    for _ in range(10):  # the same proposal planned again and again
        agent_change(ws, team.agent, 1, desired=20)  # +10: at the limit, not over it
    with pytest.raises(Refused, match=r"2 change\(s\) by this agent in 5 minutes add 11 capacity"):
        agent_change(ws, team.agent, 2, desired=11)


def test_agents_together_trip_the_breaker_of_every_agent(ws: Workspace, team: Team) -> None:
    for n, agent in enumerate([team.agent, team.other, team.agent, team.other, team.agent], start=1):
        agent_change(ws, agent, n)
    with pytest.raises(Refused, match=r"6 change\(s\) by all agents together in 5 minutes add 12 capacity"):
        agent_change(ws, team.other, 6)
    with pytest.raises(Refused, match="the circuit breaker for every agent is open"):
        agent_change(ws, team.builtin, 7, desired=11)
    with pytest.raises(InputError, match="the breaker for ci-bot is not open"):  # the agent's own never tripped
        reset_breaker(ws, team.bob, "ci-bot", "fine")
    later(ws, 1)
    reset_breaker(ws, team.bob, None, "planned growth")
    agent_change(ws, team.builtin, 8, desired=11)
    assert [s["agent"] for s in breaker_status(ws)] == ["every agent"]


def test_the_kill_switch_is_an_admins_and_stops_every_agent_request(ws: Workspace, team: Team) -> None:
    with ws.store.session() as session:
        for run_id in ("queued", "running", "done"):
            session.conversations.add_run(run_id, team.bob, "add a queue", "c-1", 1)
        session.conversations.begin_run("running")
        session.conversations.begin_run("done")
        session.conversations.stop_runs("an earlier stop")  # "done" and the others are stopped ...
        session.conversations.add_run("later", team.bob, "add a queue", "c-2", 2)  # ... and these two are not
        session.conversations.add_run("later-running", team.bob, "add a topic", "c-3", 3)
        session.conversations.begin_run("later-running")
    with pytest.raises(Refused, match="only admins open the breaker"):
        open_breaker(ws, team.bob, None, "panic")
    with pytest.raises(InputError, match="say why"):
        open_breaker(ws, team.admin, None, "")
    assert open_breaker(ws, team.admin, None, "incident 42: agents off") == ALL_AGENTS
    with ws.store.session(readonly=True) as session:
        [opened] = session.audit.query(EventQuery(kind="breaker.opened"))
        stopped = session.conversations.run("later-running")
    assert (opened.actor, opened.payload["agent"], sorted(opened.payload["stopped_requests"])) == (
        "admin", "every agent", ["later", "later-running"])
    assert stopped is not None and stopped.status == AgentRunStatus.STOPPED
    assert stopped.message == "the circuit breaker was opened by admin: incident 42: agents off"
    for agent in (team.agent, team.builtin):
        assert "the circuit breaker for every agent is open" in (agent_stop_reason(ws, agent) or "")
        with pytest.raises(Refused, match="opened by admin: incident 42"):
            agent_change(ws, agent, 9)


def test_another_agents_breaker_leaves_the_built_in_agents_requests_running(ws: Workspace, team: Team) -> None:
    with ws.store.session() as session:
        session.conversations.add_run("r1", team.bob, "add a queue", "c-1", 1)
        session.conversations.begin_run("r1")
    open_breaker(ws, team.admin, "ci-bot", "ci-bot misbehaves")
    with ws.store.session(readonly=True) as session:
        [opened] = session.audit.query(EventQuery(kind="breaker.opened"))
        run = session.conversations.run("r1")
    assert opened.payload["agent"] == "ci-bot" and opened.payload["stopped_requests"] == []
    assert run is not None and run.status == AgentRunStatus.RUNNING
    assert agent_stop_reason(ws, team.builtin) is None and agent_stop_reason(ws, team.other) is not None
    open_breaker(ws, team.admin, BUILTIN_AGENT_NAME, "the built-in agent misbehaves")
    with ws.store.session(readonly=True) as session:
        run = session.conversations.run("r1")
    assert run is not None and run.status == AgentRunStatus.STOPPED
    with pytest.raises(NotFound, match="no agent bob"):  # a person has no breaker
        open_breaker(ws, team.admin, "bob", "why not")


def test_the_kill_switch_stops_a_queued_agent_request_and_refuses_new_ones(ws: Workspace, team: Team) -> None:
    ws.settings.openai_base_url, ws.settings.model = "http://127.0.0.1:9/v1", "stub"  # never called here
    alice = person("alice", Role.REQUESTER, groups=["app"], store=ws.store)
    queued = start_agent_run(ws, alice, "add a queue")  # no worker has taken it yet
    assert queued.status == AgentRunStatus.QUEUED and queued.job_id is not None
    open_breaker(ws, team.admin, None, "incident 43: agents off")
    run = get_agent_run(ws, alice, queued.id)
    assert run.status == AgentRunStatus.STOPPED and "incident 43" in (run.message or "")
    with ws.store.session() as session:
        [opened] = session.audit.query(EventQuery(kind="breaker.opened"))
        assert not session.conversations.begin_run(queued.id)  # a worker that takes its job now does not start it
    assert opened.payload["stopped_requests"] == [queued.id]
    with pytest.raises(Refused, match="the circuit breaker for every agent is open since .*incident 43"):
        start_agent_run(ws, alice, "anything")
    later(ws, 1)
    reset_breaker(ws, team.bob, None, "incident over")
    assert start_agent_run(ws, alice, "add a queue, now").status == AgentRunStatus.QUEUED


def test_an_agents_deletions_trip_the_breaker_too(ws: Workspace, team: Team) -> None:
    def teardown(n: int) -> StackPlanResult:
        document = {"format_version": "1.2", "resource_changes": [{
            "address": f"aws_sqs_queue.q{i}", "type": "aws_sqs_queue", "name": f"q{i}",
            "change": {"actions": ["delete"], "before": {"name": f"q{i}"}, "after": None}} for i in range(n)]}
        return StackPlanResult("app-staging", "head", EnginePlan(document, 1, "lineage"), load_plan(document),
                               "sha256:x", "{}")

    for n, count in ((1, 2), (2, 1)):
        change = guard_agent_change(ws, team.agent, n, [teardown(count)])
        with ws.store.session() as session:
            session.breaker.record_change(change)
    with pytest.raises(Refused, match=r"3 change\(s\) by this agent in 5 minutes delete or replace 4 resources "
                                      r"\(limit 3\)"):
        guard_agent_change(ws, team.agent, 3, [teardown(1)])
    with pytest.raises(Refused, match="the circuit breaker for infra-agent is open"):
        guard_agent_change(ws, team.agent, 4, [teardown(0)])


def test_a_trip_of_the_built_in_agents_breaker_stops_its_running_requests(ws: Workspace, team: Team) -> None:
    with ws.store.session() as session:
        session.conversations.add_run("r1", team.bob, "add workers", "c-1", 1)
        session.conversations.begin_run("r1")
    for n in range(1, 6):
        agent_change(ws, team.builtin, n)
    with pytest.raises(Refused, match=r"6 change\(s\) by this agent"):
        agent_change(ws, team.builtin, 6)
    with ws.store.session(readonly=True) as session:
        [tripped] = session.audit.query(EventQuery(kind="breaker.tripped"))
        run = session.conversations.run("r1")
    assert tripped.payload["stopped_requests"] == ["r1"]
    assert run is not None and run.status == AgentRunStatus.STOPPED and (run.message or "").startswith(
        "circuit breaker: 6 change(s)")


def test_the_status_names_every_breaker_ever_opened_tripped_or_reset(ws: Workspace, team: Team) -> None:
    assert breaker_status(ws) == []
    open_breaker(ws, team.admin, "ci-bot", "ci-bot misbehaves")
    open_breaker(ws, team.admin, None, "incident 44")
    later(ws, 1)
    reset_breaker(ws, team.bob, "ci-bot", "fixed")
    status = {s["agent"]: (s["open"], s["changed_by"], s["reason"]) for s in breaker_status(ws)}
    assert status == {"every agent": (True, "admin", "opened by admin: incident 44"),
                      "ci-bot": (False, "bob", "fixed")}
    assert "ci-bot" not in (agent_stop_reason(ws, team.other) or "")  # its own is reset; every agent's is open
    assert "for every agent" in (agent_stop_reason(ws, team.other) or "")
