"""A branch can never unmask a secret: the attack from the issue, its variations, and the scrubber apart.

Every attack runs with the scrubber switched off, so what keeps the password out of sight is the
masking where the value is born; the scrubber's own tests come last.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.composition import open_workspace
from gateway.domain.errors import ConfigError
from gateway.domain.principals import GATEWAY, Principal, Role
from gateway.domain.scrubbing import REDACTED, Scrubber
from gateway.logs import configure_logging, install_log_scrubber
from gateway.services.change.proposals import open_proposal
from gateway.services.workspace import Workspace, stack_secrets

from .conftest import Clone, People, run_cli
from .fakes import FakeClone, person, sandbox_workspace

NO_SCRUB = {"GATEWAY_SCRUB_KNOWN_SECRETS": "false"}
UNMASK = 'output "c" {\n  value = nonsensitive(var.db_password)\n}\n'

# (name, files to write in stacks/data, the addresses the deny finding must name); every attack but the
# schema one also deletes `sensitive = true` from main's db_password variable
ATTACKS = [
    ("output-nonsensitive", {"leak.tf": UNMASK}, {"var.db_password", "output.c"}),
    ("tag-interpolation", {"leak.tf": '''
resource "aws_s3_bucket" "leak" {
  bucket = "orders-leak"
  tags   = merge(local.tags, { note = "pw-${nonsensitive(var.db_password)}" })
}
'''}, {"var.db_password", "aws_s3_bucket.leak"}),
    ("through-a-local", {"leak.tf": '''
locals {
  plain = nonsensitive(var.db_password)
}

output "c" {
  value = local.plain
}
'''}, {"var.db_password", "local.plain", "output.c"}),
    ("unmarked-attribute", {"leak.tf": '''
resource "aws_sqs_queue" "leak" {
  name = nonsensitive(var.db_password)
  tags = local.tags
}
'''}, {"var.db_password", "aws_sqs_queue.leak"}),
    ("schema-sensitive-attribute", {"leak.tf": '''
output "c" {
  value = nonsensitive(aws_db_instance.orders.password)
}
'''}, {"output.c"}),
    ("for-expression", {"leak.tf": '''
output "c" {
  value = [for part in [nonsensitive(var.db_password)] : upper(part)]
}
'''}, {"var.db_password", "output.c"}),
]


def _attack(clone: Clone | FakeClone, name: str, files: dict[str, str], drop_sensitive: bool = True) -> str:
    clone.branch(name)
    if drop_sensitive:
        clone.edit("stacks/data/variables.tf", "  sensitive   = true\n", "")
    for filename, text in files.items():
        clone.write(f"stacks/data/{filename}", text)
    return clone.push(f"attack: {name}")


@pytest.fixture
def unscrubbed(workspace: Workspace) -> Iterator[Workspace]:
    """The same workspace with the last line of defence switched off."""
    ws = open_workspace(workspace.settings.model_copy(update={"scrub_known_secrets": False}))
    assert not ws.scrubber
    yield ws
    ws.close()


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    """The sample repo in memory (tests/fakes.py's sandbox_workspace): the real engine planning, no scrubber at all,
    no git and no database; proposals open through the same use case."""
    sample = sandbox_workspace(tmp_path / "home")
    assert not sample.scrubber
    return sample


@pytest.fixture
def alice(ws: Workspace) -> Principal:
    return person("alice", Role.REQUESTER, groups=["app"], store=ws.store)


def _password(ws: Workspace) -> str:
    return str(stack_secrets(ws.settings, "data")["db_password"])


def _fragments(password: str) -> list[str]:
    """The password, upper-cased too, and 8-character slices of both: a partly shown secret is shown."""
    return [p[i:i + 8] for p in (password, password.upper()) for i in range(0, len(p) - 7, 4)]


def _assert_hidden(password: str, *texts: str) -> None:
    for text in texts:
        for fragment in _fragments(password):
            assert fragment not in text


def test_the_attack_through_the_cli(workspace: Workspace, people: People, clone: Clone) -> None:
    password = _password(workspace)
    _attack(clone, "leak", {"leak.tf": UNMASK})
    home, token = workspace.settings.home, people.tokens["alice"]
    proposed = run_cli(["propose", "--branch", "leak", "-m", "innocent"], home, token, **NO_SCRUB)
    assert proposed.returncode == 0, proposed.stderr
    outputs = [proposed.stdout, proposed.stderr]
    for fmt in ("text", "markdown", "json"):
        shown = run_cli(["show", "1", "--format", fmt], home, people.tokens["bob"], **NO_SCRUB)
        assert shown.returncode == 0, shown.stderr
        outputs += [shown.stdout, shown.stderr]
    trail = run_cli(["audit", "export", "--format", "jsonl"], home, people.tokens["dana"], **NO_SCRUB)
    outputs.append(trail.stdout)
    _assert_hidden(password, *outputs)
    assert REDACTED not in "".join(outputs)  # nothing was scrubbed: the masking did it
    text = outputs[2]
    assert "secret-unmasked" in text and "var.db_password" in text and "output.c" in text
    document = json.loads(outputs[6])
    denied = {f["address"] for p in document["plans"] for f in p["preview"]["findings"] if f["rule"] == "secret-unmasked"}
    assert denied == {"var.db_password", "output.c"}
    approve = run_cli(["approve", "1", "-m", "looks fine"], home, people.tokens["bob"], **NO_SCRUB)
    assert approve.returncode == 1 and "secret-unmasked" in approve.stderr


def test_the_attack_through_the_api(workspace: Workspace, people: People, clone: Clone,
                                    unscrubbed: Workspace) -> None:
    password = _password(workspace)
    _attack(clone, "leak", {"leak.tf": UNMASK})
    proposal = open_proposal(unscrubbed, people.alice, "leak", "innocent")
    auth = {"Authorization": f"Bearer {people.tokens['bob']}"}
    settings = unscrubbed.settings
    with TestClient(create_app(settings)) as client:
        assert not client.app.state.workspace.scrubber  # type: ignore[attr-defined]
        bodies = [client.get(f"/api/v1/proposals/{proposal.id}", headers=auth).text]
        bodies += [client.get(f"/api/v1/proposals/{proposal.id}/preview?format={f}", headers=auth).text
                   for f in ("text", "markdown", "json")]
        bodies.append(client.get("/api/v1/audit/export?format=jsonl",
                                 headers={"Authorization": f"Bearer {people.tokens['dana']}"}).text)
        client.post("/login", data={"token": people.tokens["bob"]})
        bodies.append(client.get(f"/proposals/{proposal.id}").text)
    _assert_hidden(password, *bodies)
    assert all(REDACTED not in b for b in bodies)
    assert "secret-unmasked" in bodies[0] and "output.c" in bodies[0]
    assert "(sensitive)" in bodies[1]


@pytest.mark.parametrize(("name", "files", "addresses"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_variations_stay_masked_and_are_denied(ws: Workspace, alice: Principal, checkout: FakeClone, name: str,
                                               files: dict[str, str], addresses: set[str]) -> None:
    password = _password(ws)
    _attack(checkout, name, files, drop_sensitive=name != "schema-sensitive-attribute")
    proposal = open_proposal(ws, alice, name, "innocent")
    from gateway.domain.preview import RENDERERS
    from gateway.services.change.proposals import proposal_previews

    previews = proposal_previews(ws, proposal)
    rendered = [render(p) for p in previews.values() for render in RENDERERS.values()]
    with ws.store.session() as session:
        trail = json.dumps([e.payload for e in session.audit.events()])
    _assert_hidden(password, *rendered, trail)
    denied = {f.address for f in proposal.plans["data"].findings if f.rule == "secret-unmasked"}
    assert denied == addresses
    assert all(f.severity.value == "deny" for f in proposal.plans["data"].findings if f.rule == "secret-unmasked")


def test_adding_sensitivity_is_fine_and_declared_marks_still_follow_terraform(
        ws: Workspace, alice: Principal, checkout: FakeClone) -> None:
    """nonsensitive() of a value the branch itself marked sensitive unmasks, as in Terraform; no finding."""
    checkout.branch("own-marks").write("stacks/data/own.tf", '''
variable "region_note" {
  type      = string
  default   = "eu-west-1 primary"
  sensitive = true
}

output "note" {
  value = nonsensitive(var.region_note)
}
''').push()
    proposal = open_proposal(ws, alice, "own-marks", "a note")
    assert not [f for f in proposal.plans["data"].findings if f.rule == "secret-unmasked"]
    from gateway.services.change.proposals import proposal_previews

    preview = proposal_previews(ws, proposal)["data"]
    from gateway.domain.preview import render_text

    assert "eu-west-1 primary" in render_text(preview)


def test_removing_sensitive_alone_is_denied_and_changes_nothing_shown(
        ws: Workspace, alice: Principal, checkout: FakeClone) -> None:
    _attack(checkout, "drop-mark", {})
    proposal = open_proposal(ws, alice, "drop-mark", "tidy up")
    findings = [f for f in proposal.plans["data"].findings if f.rule == "secret-unmasked"]
    assert [f.address for f in findings] == ["var.db_password"]
    assert _password(ws) not in findings[0].message


# --- the scrubber, the last line of defence ---------------------------------------------------


def test_scrubber_replaces_every_spelling_and_leaves_short_values() -> None:
    scrubber = Scrubber(["s3cr3t\"value", "ab", 12345678])
    assert scrubber.scrub('x s3cr3t"value y') == f"x {REDACTED} y"
    assert scrubber.scrub(json.dumps({"v": 's3cr3t"value'})) == json.dumps({"v": REDACTED})
    assert scrubber.scrub("s3cr3t&quot;value") == REDACTED
    assert scrubber.scrub("ab 12345678") == f"ab {REDACTED}"
    assert scrubber.scrub_data({"k": ["s3cr3t\"value"]}) == {"k": [REDACTED]}
    assert not Scrubber(["ab"])


def test_scrubber_catches_a_secret_in_cli_errors(workspace: Workspace, people: People) -> None:
    password = _password(workspace)
    out = run_cli(["propose", "--branch", password, "-m", "x"], workspace.settings.home, people.tokens["alice"])
    assert out.returncode == 1 and password not in out.stderr and REDACTED in out.stderr
    unscrubbed = run_cli(["propose", "--branch", password, "-m", "x"], workspace.settings.home,
                         people.tokens["alice"], **NO_SCRUB)
    assert password in unscrubbed.stderr  # the echo is the user's own input: only the scrubber hides it


def test_scrubber_catches_a_secret_in_api_errors_and_the_trail(workspace: Workspace, people: People) -> None:
    password = _password(workspace)
    with TestClient(create_app(workspace.settings)) as client:
        invalid = client.get(f"/api/v1/proposals/{password}", headers={"Authorization": f"Bearer {people.tokens['bob']}"})
    assert invalid.status_code == 422 and password not in invalid.text  # a validation error never echoes the input
    with workspace.store.session() as session:
        event = session.audit.append(GATEWAY, "note", {"text": f"pasted {password} by mistake"})
    assert event.payload == {"text": f"pasted {REDACTED} by mistake"}


def test_scrubber_catches_a_secret_in_logs(workspace: Workspace, capsys: pytest.CaptureFixture[str]) -> None:
    password = _password(workspace)
    configure_logging("info")
    install_log_scrubber(workspace.scrubber)
    try:
        structlog.get_logger("test").info("oops", detail=f"value {password}")
        err = capsys.readouterr().err
    finally:
        configure_logging(logging.getLevelName(logging.WARNING).lower())
    assert password not in err and REDACTED in err



_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"
_CHAR_MAP = "{ " + ", ".join(f'"{c}" = "{c}"' for c in _ALPHABET) + " }"
SIDE_CHANNELS = [  # what a secret decides must be as secret as the secret (found in review)
    ("index-by-secret", f'output "c" {{\n  value = [for i in range(24) : {_CHAR_MAP}[substr(var.db_password, i, 1)]]\n}}\n'),
    ("secret-as-key", 'output "c" {\n  value = keys({ for x in [1] : var.db_password => x })\n}\n'),
    ("for-filter", 'output "c" {\n  value = [for c in ["a", "b", "c"] : c if startswith(var.db_password, c)]\n}\n'),
    ("template-if", 'output "c" {\n  value = "%{if length(var.db_password) > 3}long%{else}short%{endif}"\n}\n'),
]


@pytest.mark.parametrize(("name", "hcl"), SIDE_CHANNELS, ids=[c[0] for c in SIDE_CHANNELS])
def test_what_a_secret_decides_stays_masked(ws: Workspace, alice: Principal, checkout: FakeClone, name: str, hcl: str) -> None:
    password = _password(ws)
    checkout.branch(name).write("stacks/data/leak.tf", hcl).push()
    proposal = open_proposal(ws, alice, name, "innocent")
    from gateway.domain.preview import render_text
    from gateway.services.change.proposals import proposal_previews

    text = render_text(proposal_previews(ws, proposal)["data"])
    assert "c = (sensitive)" in text, text
    _assert_hidden(password, text)
    assert "output.c" in {f.address for f in proposal.plans["data"].findings if f.rule == "secret-unmasked"}


def test_a_secret_cannot_name_instances(ws: Workspace, alice: Principal, checkout: FakeClone) -> None:
    password = _password(ws)
    checkout.branch("keys").write("stacks/data/leak.tf", 'resource "aws_sqs_queue" "q" {\n'
                               '  for_each = toset([lower(var.db_password)])\n  name = "q"\n  tags = local.tags\n}\n').push()
    with pytest.raises(Exception, match="for_each cannot be derived from a sensitive value") as refused:
        open_proposal(ws, alice, "keys", "innocent")
    assert password.lower() not in str(refused.value)


def test_an_ignored_secret_attribute_stays_masked(ws: Workspace, alice: Principal, checkout: FakeClone) -> None:
    password = _password(ws)
    checkout.branch("ignore").edit("stacks/data/main.tf", "    prevent_destroy = true\n",
                                "    prevent_destroy = true\n    ignore_changes  = [password]\n")
    checkout.edit("stacks/data/main.tf", "backup_retention_period = 7", "backup_retention_period = 14")
    checkout.write("stacks/data/leak.tf", 'resource "aws_sqs_queue" "q" {\n'
                '  name = "q-${aws_db_instance.orders.password}"\n  tags = local.tags\n}\n').push()
    proposal = open_proposal(ws, alice, "ignore", "innocent")
    from gateway.domain.preview import RENDERERS
    from gateway.services.change.proposals import proposal_previews

    _assert_hidden(password, *[r(p) for p in proposal_previews(ws, proposal).values() for r in RENDERERS.values()])


@pytest.mark.parametrize(("path", "text", "says"), [
    ("stacks/data/leak.tf.json", '{"output": {"c": {"value": "${var.db_password}"}}}', "JSON configuration"),
    ("stacks/data/main_override.tf", 'variable "db_password" {\n  sensitive = false\n}\n', "override files"),
    ("stacks/data/env.tf", 'locals {\n  env = file("/proc/self/environ")\n}\n', "not a plain relative path"),
    ("stacks/data/up.tf", 'locals {\n  s = file("../../secrets/data.tfvars.json")\n}\n', "not a plain relative path"),
    ("stacks/data/m/main.tf", 'variable "x" {}\noutput "y" {\n  value = nonsensitive(var.x)\n}\n', "in a module"),
], ids=["tf-json", "override", "environ", "dotdot", "module"])
def test_what_the_checks_cannot_read_is_refused_before_planning(ws: Workspace, alice: Principal, checkout: FakeClone,
                                                               path: str, text: str, says: str) -> None:
    checkout.branch("sneaky").write(path, text).push()
    with pytest.raises(ConfigError, match=says):
        open_proposal(ws, alice, "sneaky", "innocent")
    with ws.store.session() as session:
        assert session.proposals.list() == []


def test_try_does_not_turn_a_secret_into_a_yes_or_no(ws: Workspace, alice: Principal, checkout: FakeClone) -> None:
    checkout.branch("try").write("stacks/data/leak.tf", 'output "c" {\n'
                              '  value = try(tonumber(var.db_password), "not a number")\n}\n').push()
    proposal = open_proposal(ws, alice, "try", "innocent")
    from gateway.domain.preview import render_text
    from gateway.services.change.proposals import proposal_previews

    assert "c = (sensitive)" in render_text(proposal_previews(ws, proposal)["data"])
