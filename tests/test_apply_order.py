"""An apply follows the order main's gateway.yaml declares between stacks (`after:`) and the order their
`terraform_remote_state` reads imply (a stack is applied after the stacks whose state it reads), stops at the first
failure, and says which stacks it did not start; a gateway.yaml whose orders name an unknown stack or go round in a
circle is refused, saying where, and so is an apply whose reads and `after:` go round in one."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.adapters.declarations import HclDeclarations
from gateway.adapters.gateway_yaml import parse_repo_settings
from gateway.composition import create_workspace
from gateway.config import Settings
from gateway.domain.errors import ConfigError, Refused
from gateway.domain.lifecycle import ProposalStatus
from gateway.domain.proposal import Decision
from gateway.domain.repositories import qualified
from gateway.domain.stack_order import StackDeclarations, state_reads
from gateway.services.admin.bootstrap import bootstrap_simulator
from gateway.services.change.apply_order import apply_order
from gateway.services.change.proposals import decide, get_proposal, open_proposal
from gateway.services.change.runner import apply_proposal
from gateway.services.change.views import view_proposal
from gateway.services.workspace import Workspace

from .conftest import Clone, People, add_people

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


UNORDERED = ORDERED.replace("    after: [z-net]\n", "")  # no `after:`: only what the stacks read orders them


def _reads(backend: str, config: str, extra: str = "") -> str:
    return (f'data "terraform_remote_state" "net" {{\n  backend = "{backend}"\n  config = {{\n{config}\n  }}\n'
            f'{extra}}}\n')


def _backend(kind: str, settings: str) -> str:
    return f'terraform {{\n  backend "{kind}" {{\n{settings}\n  }}\n}}\n'


def _cloud(organization: str, workspace: str) -> str:
    return (f'terraform {{\n  cloud {{\n    organization = "{organization}"\n    workspaces {{\n'
            f'      name = "{workspace}"\n    }}\n  }}\n}}\n')


S3_NET = _backend("s3", '    bucket = "acme-state"\n    key    = "net/terraform.tfstate"\n    region = "eu-west-1"')


@pytest.mark.parametrize(("reader", "net", "after_net"), [
    # local: the path (from the reading stack's directory) is the other stack's state file, or in its directory
    (_reads("local", '    path = "../z-net/terraform.tfstate"'), "", True),
    (_reads("local", '    path = "${path.module}/../z-net/terraform.tfstate"'), "", True),
    (_reads("local", '    path = "../z-net/state/prod.tfstate"'), "", True),
    (_reads("local", '    path = "../../state/net.tfstate"'),
     _backend("local", '    path = "../../state/net.tfstate"'), True),
    (_reads("local", '    path = "/srv/state/net.tfstate"'),
     _backend("local", '    path = "/srv/state/net.tfstate"'), True),
    (_reads("local", '    path = "../../state/other.tfstate"'),
     _backend("local", '    path = "../../state/net.tfstate"'), False),
    (_reads("local", '    path = "terraform.tfstate"'), "", False),  # its own state
    # s3, gcs, azurerm, http: the same backend and the settings that name a state (the region does not)
    (_reads("s3", '    bucket = "acme-state"\n    key = "net/terraform.tfstate"\n    region = "us-east-1"'),
     S3_NET, True),
    (_reads("s3", '    bucket = "acme-state"\n    key = "app/terraform.tfstate"'), S3_NET, False),
    (_reads("gcs", '    bucket = "acme-state"\n    key = "net/terraform.tfstate"'), S3_NET, False),
    (_reads("gcs", '    bucket = "acme"\n    prefix = "net"'),
     _backend("gcs", '    bucket = "acme"\n    prefix = "net"'), True),
    (_reads("azurerm", '    storage_account_name = "acme"\n    container_name = "tf"\n    key = "net.tfstate"'),
     _backend("azurerm", '    storage_account_name = "acme"\n    container_name = "tf"\n    key = "net.tfstate"\n'
                         '    resource_group_name = "rg"'), True),
    (_reads("http", '    address = "https://state.example.com/net"'),
     _backend("http", '    address = "https://state.example.com/net"\n    lock_method = "PUT"'), True),
    # HCP Terraform: a `remote` read of the organization and workspace a `cloud` block (or remote backend) names
    (_reads("remote", '    organization = "acme"\n    workspaces = { name = "net" }'), _cloud("acme", "net"), True),
    (_reads("remote", '    organization = "acme"\n    workspaces = { name = "app" }'), _cloud("acme", "net"), False),
    # what cannot be known without planning orders nothing: settings from variables, another workspace's state
    (_reads("s3", '    bucket = var.state_bucket\n    key = "net/terraform.tfstate"'), S3_NET, False),
    ('data "terraform_remote_state" "net" {\n  backend = "s3"\n  config = var.net_state\n}\n', S3_NET, False),
    (_reads("local", '    path = "../z-net/terraform.tfstate"', '  workspace = "staging"\n'), "", False),
])
def test_a_stack_is_applied_after_the_stacks_whose_state_it_reads(reader: str, net: str, after_net: bool) -> None:
    hcl = HclDeclarations()
    declared = {name: StackDeclarations(f"stacks/{name}", hcl.backend(files), hcl.remote_state_reads(files))
                for name, files in {"a-apps": {"main.tf": _queue("a") + reader},
                                    "z-net": {"main.tf": _queue("z") + net}}.items()}
    order = parse_repo_settings(UNORDERED).apply_order(["a-apps", "z-net"], state_reads(declared))
    assert order == (["z-net", "a-apps"] if after_net else ["a-apps", "z-net"])


def _workspace(tmp_path: Path, gateway_yaml: str, stacks: dict[str, str],
               files: dict[str, str] | None = None) -> Workspace:
    """A workspace whose main has `gateway_yaml`, each stack's main.tf and `files`, bootstrapped."""
    content = tmp_path / "content"
    for path, text in {**{f"stacks/{stack}/main.tf": text for stack, text in stacks.items()}, **(files or {})}.items():
        (content / path).parent.mkdir(parents=True, exist_ok=True)
        (content / path).write_text(text)
    (content / "gateway.yaml").write_text(gateway_yaml)
    ws = create_workspace(Settings(home=tmp_path / "home", token=None, lock_wait_seconds=2), content=content)
    bootstrap_simulator(ws)
    return ws


def _approved(ws: Workspace, tmp_path: Path, people: People, files: dict[str, str]) -> int:
    """A proposal changing `files` (on its branch), approved."""
    clone = Clone(ws, tmp_path / "clone").branch("change")
    for path, text in files.items():
        clone.write(path, text)
    clone.push("the change")
    proposal = open_proposal(ws, people.alice, "change", "the change")
    decide(ws, people.bob, proposal.id, Decision.APPROVE, "ok")
    return proposal.id


READS_NET = _reads("local", '    path = "../z-net/terraform.tfstate"')


@pytest.mark.parametrize(("gateway_yaml", "apps_reads"), [
    (ORDERED, ""),  # `after: [z-net]`
    (UNORDERED, READS_NET),  # main's a-apps reads nothing; the branch makes it read z-net's state: what is applied
], ids=["after", "remote-state"])
def test_an_apply_stops_at_the_first_failure_in_its_order_and_says_what_it_did_not_start(
        tmp_path: Path, gateway_yaml: str, apps_reads: str) -> None:
    ws = _workspace(tmp_path, gateway_yaml, {"a-apps": _queue("a-apps-one"), "z-net": _queue("z-net-one")})
    try:
        apps_serial = ws.engine.state_serial("a-apps")
        people = add_people(ws)
        proposal_id = _approved(ws, tmp_path, people, {"stacks/a-apps/main.tf": _queue("a-apps-two") + apps_reads,
                                                       "stacks/z-net/main.tf": _queue("z-net-two")})
        ws.simulator.inject_fault("z-net", "aws_sqs_queue.q", "the provider is down")  # the first in order fails
        lines: list[str] = []
        report = apply_proposal(ws, people.alice, proposal_id, progress=lines.append)
        assert not report.succeeded
        assert [o.stack for o in report.outcomes] == ["z-net"]  # a-apps, first by name, never started
        assert "not started: a-apps (stopped at the first failure)" in lines
        assert get_proposal(ws, proposal_id).status == ProposalStatus.FAILED
        with ws.store.session(readonly=True) as session:
            failed = [e for e in session.audit.events(proposal_id=proposal_id) if e.kind == "proposal.fail"]
        assert failed and failed[-1].payload["not_started"] == ["a-apps"]
        assert ws.engine.state_serial("a-apps") == apps_serial  # its change was never made
    finally:
        ws.close()


def test_three_stacks_reading_each_other_apply_as_a_chain(tmp_path: Path) -> None:
    """a reads b's state in s3, b reads c's local state: c, b, a, the reverse of their names."""
    b_state = '    bucket = "acme-state"\n    key = "b/terraform.tfstate"'
    b_backend = _backend("s3", b_state)
    gateway_yaml = UNORDERED.replace("  a-apps:", "  a:").replace("  z-net:", "  b:").replace(
        "stacks/a-apps", "stacks/a").replace("stacks/z-net", "stacks/b") + (
        "  c:\n    path: stacks/c\n    approvers: [platform]\n")
    ws = _workspace(tmp_path, gateway_yaml, {"a": _queue("a-one"), "b": _queue("b-one") + b_backend,
                                             "c": _queue("c-one")})
    try:
        people = add_people(ws)
        proposal_id = _approved(ws, tmp_path, people, {
            "stacks/a/main.tf": _queue("a-two") + _reads("s3", b_state),
            "stacks/b/main.tf": _queue("b-two") + b_backend + _reads("local", '    path = "../c/terraform.tfstate"'),
            "stacks/c/main.tf": _queue("c-two")})
        report = apply_proposal(ws, people.alice, proposal_id)
        assert report.succeeded, report
        assert [o.stack for o in report.outcomes] == ["c", "b", "a"]
        with ws.store.session(readonly=True) as session:
            started = [e.stacks[0] for e in session.audit.events(proposal_id=proposal_id) if e.kind == "apply.started"]
        assert started == ["c", "b", "a"]
    finally:
        ws.close()


@pytest.mark.parametrize(("gateway_yaml", "net_reads", "circle"), [
    (UNORDERED + "    after: [a-apps]\n", "",
     "a-apps is applied after z-net (data.terraform_remote_state.net reads its state); "
     "z-net is applied after a-apps (`after:` in gateway.yaml)"),
    (UNORDERED, _reads("local", '    path = "../a-apps/terraform.tfstate"'),
     "a-apps is applied after z-net (data.terraform_remote_state.net reads its state); "
     "z-net is applied after a-apps (data.terraform_remote_state.net reads its state)"),
])
def test_reads_and_orders_that_go_round_in_a_circle_refuse_the_apply(tmp_path: Path, gateway_yaml: str,
                                                                      net_reads: str, circle: str) -> None:
    ws = _workspace(tmp_path, gateway_yaml, {"a-apps": _queue("a-apps-one"), "z-net": _queue("z-net-one")})
    try:
        serials = {stack: ws.engine.state_serial(stack) for stack in ("a-apps", "z-net")}
        people = add_people(ws)
        proposal_id = _approved(ws, tmp_path, people, {"stacks/a-apps/main.tf": _queue("a-apps-two") + READS_NET,
                                                       "stacks/z-net/main.tf": _queue("z-net-two") + net_reads})
        assert circle in " ".join(view_proposal(ws, people.alice, proposal_id).apply_blockers)  # shown before
        with pytest.raises(Refused) as refused:
            apply_proposal(ws, people.alice, proposal_id)
        assert str(refused.value).count("go round in a circle among a-apps, z-net") == 1
        assert circle in str(refused.value)
        assert get_proposal(ws, proposal_id).status == ProposalStatus.OPEN  # nothing started; a fix can be pushed
        assert {stack: ws.engine.state_serial(stack) for stack in serials} == serials
        with ws.store.session(readonly=True) as session:
            kinds = [e.kind for e in session.audit.events(proposal_id=proposal_id)]
        assert "apply.refused" in kinds and "apply.started" not in kinds
    finally:
        ws.close()


def test_the_order_is_read_from_the_commit_given(tmp_path: Path) -> None:
    """Main's files read nothing; the branch's merge does: only the merge orders z-net first."""
    ws = _workspace(tmp_path, UNORDERED, {"a-apps": _queue("a-apps-one"), "z-net": _queue("z-net-one")})
    try:
        people = add_people(ws)
        proposal_id = _approved(ws, tmp_path, people, {"stacks/a-apps/main.tf": _queue("a-apps-two") + READS_NET})
        proposal = get_proposal(ws, proposal_id)
        main = ws.repo.resolve(ws.main_branch())
        assert apply_order(ws, ["a-apps", "z-net"], main) == ["a-apps", "z-net"]
        merged = ws.repo.merge_preview(main, proposal.head_sha)
        assert apply_order(ws, ["a-apps", "z-net"], merged) == ["z-net", "a-apps"]
    finally:
        ws.close()


def test_a_module_the_stack_calls_reads_state_for_it(tmp_path: Path) -> None:
    """A local module runs in its caller's directory; its `path.module` is its own. Its reads order its callers."""
    module = 'module "net" {\n  source = "../../modules/net-reader"\n}\n'
    ws = _workspace(tmp_path, UNORDERED + "    after: [a-apps]\n",
                    {"a-apps": _queue("a-apps-one") + module, "z-net": _queue("z-net-one")},
                    {"modules/net-reader/main.tf": 'variable "unused" {\n  default = 1\n}\n'})
    try:
        main = ws.repo.resolve(ws.main_branch())
        assert apply_order(ws, ["a-apps", "z-net"], main) == ["a-apps", "z-net"]  # the module reads nothing yet
        people = add_people(ws)
        reader = _reads("local", '    path = "${path.module}/../../stacks/z-net/terraform.tfstate"')
        proposal_id = _approved(ws, tmp_path, people, {"modules/net-reader/main.tf": reader})
        with pytest.raises(ConfigError, match="data.terraform_remote_state.net in modules/net-reader reads its state"):
            apply_order(ws, ["a-apps", "z-net"], get_proposal(ws, proposal_id).head_sha)
    finally:
        ws.close()
