"""Guards on runaway automation. The circuit breaker on agent changes: cumulative over a sliding window, it
trips at the right change with the figures, stops agents (requests in flight included) until a resetter
resets it, and the kill switch stops every agent. Automatic drift correction: only where a stack opted in,
only in-place updates of unprotected resources; anything else is a revert that needs approval."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.adapters.store.rows import now
from gateway.domain.agent_runs import AgentRun
from gateway.domain.breaker import ALL_AGENTS, BreakerSettings, CapacityChange, trip_reason
from gateway.domain.errors import Refused
from gateway.domain.principals import PrincipalKind, Role
from gateway.domain.proposal import Decision
from gateway.services.admin.bootstrap import bootstrap_simulator
from gateway.services.admin.users import add_principal
from gateway.services.agents.agent_runs import get_agent_run, start_agent_run
from gateway.services.change.breaker import breaker_status, open_breaker, reset_breaker
from gateway.services.change.jobs import run_now_or_follow
from gateway.services.change.proposals import decide, get_proposal, open_proposal
from gateway.services.change.runner import apply_proposal
from gateway.services.day_two.drift import revert_drift
from gateway.services.workspace import Workspace
from gateway.worker import Worker

from .conftest import Clone, People
from .model_stub import ModelStub, tool_call

ASG = '''resource "aws_autoscaling_group" "workers" {
  name             = "workers"
  min_size         = 1
  max_size         = 40
  desired_capacity = DESIRED
}
'''
BREAKER = "\nbreaker:\n  window_minutes: WINDOW\n  max_growth_percent: 20\n  max_destroy_count: 3\n  resetters: [platform]\n"


def with_workers(ws: Workspace, clone: Clone, window: float = 5) -> None:
    """Main gets an autoscaling group (10 of 40; with the web instance, capacity 51 as the breaker counts it)
    and breaker settings."""
    clone.write("stacks/app-staging/asg.tf", ASG.replace("DESIRED", "10"))
    clone.write("gateway.yaml", clone.read("gateway.yaml") + BREAKER.replace("WINDOW", str(window)))
    clone.push("workers and a breaker", author="admin")
    bootstrap_simulator(ws)  # the group exists before any agent touches it


def agent_change(ws: Workspace, people: People, clone: Clone, n: int, desired: int = 12) -> Any:
    clone.branch(f"grow-{n}").write("stacks/app-staging/asg.tf", ASG.replace("DESIRED", str(desired))).push()
    return open_proposal(ws, people.agent, f"grow-{n}", f"more workers ({n})", requester=people.alice)


@pytest.fixture
def stub() -> Iterator[ModelStub]:
    with ModelStub() as server:
        yield server


def test_small_agent_changes_trip_the_breaker_at_the_right_one_until_a_resetter_resets_it(
        workspace: Workspace, people: People, clone: Clone) -> None:
    with_workers(workspace, clone)
    for n in range(1, 6):  # +2 each: 10 of 51 added after five changes, under 20%
        agent_change(workspace, people, clone, n)
    with pytest.raises(Refused, match=r"circuit breaker: 6 change\(s\) by this agent in 5 minutes add 12 capacity "
                                      r"to 51 \(24%, limit 20%\)"):
        agent_change(workspace, people, clone, 6)
    with pytest.raises(Refused, match="the circuit breaker for infra-agent is open since"):
        agent_change(workspace, people, clone, 7, desired=11)  # however small: the agent is stopped
    clone.branch("by-hand").write("stacks/app-staging/asg.tf", ASG.replace("DESIRED", "12")).push()
    assert open_proposal(workspace, people.alice, "by-hand", "a person still may")  # people are not stopped

    with pytest.raises(Refused, match="erin is not in a resetter group"):
        reset_breaker(workspace, people.erin, "infra-agent", "looks fine")
    with pytest.raises(Refused, match="agents never reset the breaker"):
        reset_breaker(workspace, people.agent, "infra-agent", "let me go")
    reset_breaker(workspace, people.bob, "infra-agent", "the growth was planned: scaling for the sale")
    assert agent_change(workspace, people, clone, 8)  # the window starts again at the reset
    with workspace.store.session(readonly=True) as session:
        kinds = [e.kind for e in session.audit.events() if e.kind.startswith("breaker.")]
    assert kinds == ["breaker.tripped", "breaker.refused", "breaker.reset"]
    [state] = breaker_status(workspace)
    assert (state["agent"], state["open"], state["changed_by"]) == ("infra-agent", False, "bob")


def _run_to_its_end(workspace: Workspace, people: People, stub: ModelStub, text: str, timeout: float) -> AgentRun:
    """Queue alice's request and let a worker run it, as `gateway serve` does."""
    workspace.settings.openai_base_url, workspace.settings.model = stub.base_url, "stub"
    worker = Worker(workspace, loops=1, poll_seconds=0.05).start()
    try:
        run = start_agent_run(workspace, people.alice, text)
        deadline = time.monotonic() + timeout
        while not (run := get_agent_run(workspace, people.alice, run.id)).finished:
            assert time.monotonic() < deadline, run
            time.sleep(0.1)
    finally:
        worker.stop()
    return run


def test_the_kill_switch_stops_every_agent_and_a_request_in_flight(workspace: Workspace, people: People,
                                                                   stub: ModelStub, tmp_path: Path) -> None:
    with pytest.raises(Refused, match="only admins open the breaker"):
        open_breaker(workspace, people.bob, None, "panic")

    def meanwhile_an_admin_pulls_the_switch(body: dict[str, Any]) -> dict[str, Any]:
        open_breaker(workspace, people.admin, None, "incident 42: agents off")
        return tool_call("write_file", path="stacks/app-staging/q.tf", content='resource "aws_sqs_queue" "q" {}\n')

    stub.turns = [meanwhile_an_admin_pulls_the_switch, tool_call("finish", summary="done")]
    run = _run_to_its_end(workspace, people, stub, "add a queue", 30)
    assert run.status == "stopped" and "incident 42: agents off" in (run.message or "") and run.proposal_id is None
    assert len(stub.requests) == 1  # it never asked the model again
    with pytest.raises(Refused, match="the circuit breaker for every agent is open"):
        start_agent_run(workspace, people.alice, "anything")


def test_the_kill_switch_stops_a_queued_request_before_it_runs(workspace: Workspace, people: People,
                                                                stub: ModelStub) -> None:
    workspace.settings.openai_base_url, workspace.settings.model = stub.base_url, "stub"
    queued = start_agent_run(workspace, people.alice, "add a queue")  # no worker has taken it yet
    open_breaker(workspace, people.admin, None, "incident 43: agents off")
    worker = Worker(workspace, loops=1, poll_seconds=0.05).start()
    try:
        deadline = time.monotonic() + 30
        while workspace.store.queue.get(queued.job_id or 0).status != "succeeded":
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        worker.stop()
    run = get_agent_run(workspace, people.alice, queued.id)
    assert run.status == "stopped" and "incident 43" in (run.message or "") and stub.requests == []  # never ran


def test_another_agents_breaker_leaves_the_built_in_agents_requests_running(workspace: Workspace, people: People,
                                                                            stub: ModelStub) -> None:
    add_principal(workspace, people.admin, "ci-bot", frozenset({Role.REQUESTER}), kind=PrincipalKind.AGENT,
                  acting_for="alice")

    def meanwhile_an_admin_stops_ci_bot(body: dict[str, Any]) -> dict[str, Any]:
        open_breaker(workspace, people.admin, "ci-bot", "ci-bot misbehaves")
        return tool_call("write_file", path="stacks/app-staging/q.tf",
                         content='resource "aws_sqs_queue" "q" {\n  name = "q-${local.env}"\n  tags = local.tags\n}\n')

    stub.turns = [meanwhile_an_admin_stops_ci_bot, tool_call("run_preview", stack="app-staging"),
                  tool_call("finish", summary="Added aws_sqs_queue.q; the plan only creates it.")]
    run = _run_to_its_end(workspace, people, stub, "add a queue", 60)
    assert run.status == "done" and run.proposal_id is not None, run.progress[-4:]
    with workspace.store.session(readonly=True) as session:
        opened = [e for e in session.audit.events() if e.kind == "breaker.opened"]
    assert opened[-1].payload["agent"] == "ci-bot" and opened[-1].payload["stopped_requests"] == []


# --- automatic drift correction -------------------------------------------------------------------


def opt_in(ws: Workspace, clone: Clone, stacks: list[str]) -> str:
    yaml = clone.read("gateway.yaml")
    for stack in stacks:
        yaml = yaml.replace(f"    path: stacks/{stack}\n", f"    path: stacks/{stack}\n    drift: {{auto_revert: true}}\n")
    clone.write("gateway.yaml", yaml)
    return clone.push("revert drift alone on " + ", ".join(stacks), author="admin")


def test_the_gateway_reverts_in_place_drift_alone_only_where_allowed(workspace: Workspace, people: People,
                                                                     clone: Clone) -> None:
    switch = opt_in(workspace, clone, ["app-staging", "app-prod", "network"])
    sim = workspace.simulator
    sim.edit_object("app-staging", "aws_instance.web[0]", {"tags": {"Name": "renamed-in-console"}})
    reverted = revert_drift(workspace, people.admin, "app-staging")
    assert reverted.automatic and reverted.proposal is not None and reverted.job is not None
    assert reverted.proposal.proposer.name == "gateway" and reverted.proposal.current_approvals == []
    done = run_now_or_follow(workspace, reverted.job, "test", lambda _: None)
    assert done.status.value == "succeeded", done.error
    assert get_proposal(workspace, reverted.proposal.id).status.value == "applied"
    assert revert_drift(workspace, people.admin, "app-staging").reasons == ["no drift to revert"]  # the console edit is undone
    with workspace.store.session(readonly=True) as session:
        [authority] = [e.payload["authority"] for e in session.audit.events(kind="drift.auto_revert")]
    assert authority == switch  # the commit that set the switch decided it

    sim.edit_object("network", "aws_security_group_rule.internal_ingress", {"cidr_blocks": ["0.0.0.0/0"]})
    replace_ = revert_drift(workspace, people.admin, "network")
    assert not replace_.automatic and "the revert would replace, not only update in place" in replace_.reasons[0]
    sim.edit_object("app-prod", "aws_lb.web", {"tags": {"owner": "someone"}})
    protected = revert_drift(workspace, people.admin, "app-prod")
    assert not protected.automatic and "changes protected aws_lb.web" in protected.reasons[0]
    sim.edit_object("data", "aws_db_instance.orders", {"tags": {"owner": "someone"}})
    elsewhere = revert_drift(workspace, people.admin, "data")
    assert not elsewhere.automatic and elsewhere.reasons == ["stack data does not set drift.auto_revert"]
    with pytest.raises(Refused, match="needs 1 approval"):  # a revert that needs a person waits for one
        apply_proposal(workspace, people.admin, elsewhere.proposal.id)
    decide(workspace, people.bob, elsewhere.proposal.id, Decision.APPROVE, "revert the console edit")
    assert apply_proposal(workspace, people.alice, elsewhere.proposal.id).succeeded


def test_deletions_by_agents_count_too() -> None:
    def change(pid: int, destroyed: int) -> CapacityChange:
        return CapacityChange(pid, "agent-1", {"s": 10.0}, 0.0, destroyed, now())

    settings = BreakerSettings(max_destroy_count=3)
    history = [change(1, 1), change(2, 2)]
    assert trip_reason(history, change(3, 0), settings, "agent-1") is None
    assert trip_reason(history, change(3, 1), settings, "agent-1") == (
        "circuit breaker: 3 change(s) by this agent in 5 minutes delete or replace 4 resources (limit 3)")
    assert trip_reason(history, change(2, 0), settings, ALL_AGENTS) is None  # a proposal counts once: its latest


def test_a_revert_of_drift_cannot_carry_a_change_or_what_main_never_applied(workspace: Workspace, people: People,
                                                                            clone: Clone, tmp_path: Path) -> None:
    opt_in(workspace, clone, ["app-staging"])
    workspace.simulator.edit_object("data", "aws_db_instance.orders", {"tags": {"owner": "someone"}})
    waiting = revert_drift(workspace, people.admin, "data")
    assert waiting.proposal is not None and not waiting.automatic
    hijack = Clone(workspace, tmp_path / "hijack")
    hijack.repo.git.checkout("-q", "-B", "drift/data", "origin/drift/data")
    hijack.write("policies/evil.rego", "package evil\n").push("ride along")
    with pytest.raises(Refused):
        apply_proposal(workspace, people.admin, waiting.proposal.id)
    after = get_proposal(workspace, waiting.proposal.id)
    assert after.status.value == "abandoned" and after.merge_sha is None
    assert "evil.rego" not in workspace.repo.read_tree(workspace.repo.resolve("main"), "policies")

    clone.repo.git.pull("-q", "origin", "main")
    clone.edit("stacks/app-staging/main.tf", '"cc-3003"', '"cc-9999"').push("pushed to main, never applied",
                                                                          author="admin")
    workspace.simulator.edit_object("app-staging", "aws_instance.web[0]", {"tags": {"Name": "renamed-in-console"}})
    mixed = revert_drift(workspace, people.admin, "app-staging")
    assert not mixed.automatic and any("which did not drift" in r for r in mixed.reasons), mixed.reasons
