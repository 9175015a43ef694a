"""An apply follows the order main's gateway.yaml declares between stacks (`after:`), stops at the first failure,
and says which stacks it did not start; a gateway.yaml whose orders name an unknown stack or go round in a circle
is refused, saying where."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.adapters.gateway_yaml import parse_repo_settings
from gateway.composition import create_workspace
from gateway.config import Settings
from gateway.domain.errors import ConfigError
from gateway.domain.lifecycle import ProposalStatus
from gateway.domain.proposal import Decision
from gateway.domain.repositories import qualified
from gateway.services.admin.bootstrap import bootstrap_simulator
from gateway.services.change.proposals import decide, get_proposal, open_proposal
from gateway.services.change.runner import apply_proposal

from .conftest import Clone, add_people

ORDERED = """\
engine: sandbox
approvals: {required: 1}
policy: {required_tags: []}
stacks:
  a-apps:                      # first by name, but it reads what z-net makes: applied after it
    path: stacks/a-apps
    approvers: [platform]
    after: [z-net]
  z-net:
    path: stacks/z-net
    approvers: [platform]
"""


def _queue(name: str) -> str:
    return f'resource "aws_sqs_queue" "q" {{\n  name = "{name}"\n}}\n'


def test_the_order_follows_after_then_names() -> None:
    settings = parse_repo_settings(ORDERED)
    assert settings.apply_order(["a-apps", "z-net"]) == ["z-net", "a-apps"]
    assert settings.apply_order(["a-apps"]) == ["a-apps"]  # an order only binds the stacks a change has
    assert qualified(settings, "data").apply_order(["data/a-apps", "data/z-net"]) == ["data/z-net", "data/a-apps"]


@pytest.mark.parametrize(("after", "refusal"), [
    ("[nowhere]", "stacks.a-apps.after: 'nowhere' is not another stack of this file"),
    ("[a-apps]", "stacks.a-apps.after: 'a-apps' is not another stack"),
])
def test_an_order_naming_no_other_stack_is_refused(after: str, refusal: str) -> None:
    with pytest.raises(ConfigError, match=refusal):
        parse_repo_settings(ORDERED.replace("after: [z-net]", f"after: {after}"))


def test_orders_that_go_round_in_a_circle_are_refused() -> None:
    circle = ORDERED + "    after: [a-apps]\n"  # z-net, the last stack, after a-apps, which is after z-net
    with pytest.raises(ConfigError, match="go round in a circle among a-apps, z-net"):
        parse_repo_settings(circle)


def test_an_apply_stops_at_the_first_failure_in_its_order_and_says_what_it_did_not_start(tmp_path: Path) -> None:
    content = tmp_path / "content"
    for stack in ("a-apps", "z-net"):
        (content / "stacks" / stack).mkdir(parents=True)
        (content / "stacks" / stack / "main.tf").write_text(_queue(f"{stack}-one"))
    (content / "gateway.yaml").write_text(ORDERED)
    ws = create_workspace(Settings(home=tmp_path / "home", token=None, lock_wait_seconds=2), content=content)
    try:
        bootstrap_simulator(ws)
        apps_serial = ws.engine.state_serial("a-apps")
        people = add_people(ws)
        clone = Clone(ws, tmp_path / "clone").branch("both")
        clone.write("stacks/a-apps/main.tf", _queue("a-apps-two")).write("stacks/z-net/main.tf", _queue("z-net-two"))
        clone.push("both stacks")
        proposal = open_proposal(ws, people.alice, "both", "both stacks")
        decide(ws, people.bob, proposal.id, Decision.APPROVE, "ok")
        ws.simulator.inject_fault("z-net", "aws_sqs_queue.q", "the provider is down")  # the first in order fails
        lines: list[str] = []
        report = apply_proposal(ws, people.alice, proposal.id, progress=lines.append)
        assert not report.succeeded
        assert [o.stack for o in report.outcomes] == ["z-net"]  # a-apps, first by name, never started
        assert "not started: a-apps (stopped at the first failure)" in lines
        assert get_proposal(ws, proposal.id).status == ProposalStatus.FAILED
        with ws.store.session(readonly=True) as session:
            failed = [e for e in session.audit.events(proposal_id=proposal.id) if e.kind == "proposal.fail"]
        assert failed and failed[-1].payload["not_started"] == ["a-apps"]
        assert ws.engine.state_serial("a-apps") == apps_serial  # its change was never made
    finally:
        ws.close()
