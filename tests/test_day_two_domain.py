"""The pure rules of day two, as tables: a break-glass window's states over time, durations, and the literal
edits codify and import make to a declaration."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gateway.domain.break_glass import BreakGlassWindow, WindowState, acknowledge_refusals, open_refusals
from gateway.domain.declaration_edit import NotCodifiable, import_declaration, set_attribute
from gateway.domain.drift import check_due, parse_interval
from gateway.domain.errors import ConfigError
from gateway.domain.principals import Principal, PrincipalKind, Role
from gateway.domain.repo_settings import BreakGlassSettings, StackSettings

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
H = timedelta(hours=1)
RULES = BreakGlassSettings(frozenset({"oncall"}), codify_within=24 * H, max_window=4 * H)


def window(**changes: object) -> BreakGlassWindow:
    base: dict = {"id": 1, "stack": "s", "reason": "incident", "opened_by": "olga", "requested_at": T0,
                  "duration": 2 * H, "opened_at": T0, "ends_at": T0 + 2 * H}
    return BreakGlassWindow(**{**base, **changes})


@pytest.mark.parametrize(("case", "w", "at", "state"), [
    ("asked, not confirmed", window(opened_at=None, ends_at=None), T0 + H, WindowState.AWAITING_CONFIRMATION),
    ("cancelled before confirmation", window(opened_at=None, ends_at=None, closed_at=T0 + H), T0 + 2 * H,
     WindowState.CANCELLED),
    ("open", window(), T0 + H, WindowState.OPEN),
    ("ended by time, codify due", window(), T0 + 3 * H, WindowState.CODIFY_DUE),
    ("closed early: the clock starts then", window(closed_at=T0 + H), T0 + 25 * H - timedelta(seconds=1),
     WindowState.CODIFY_DUE),
    ("closed early, past the deadline", window(closed_at=T0 + H), T0 + 25 * H, WindowState.OVERDUE),
    ("past the deadline", window(), T0 + 26 * H, WindowState.OVERDUE),
    ("past it, acknowledged", window(acknowledged_at=T0 + 27 * H), T0 + 28 * H, WindowState.ACKNOWLEDGED),
    ("codified in time", window(codified_at=T0 + 5 * H), T0 + 48 * H, WindowState.SETTLED),
])
def test_a_windows_state_over_time(case: str, w: BreakGlassWindow, at: datetime, state: WindowState) -> None:
    assert w.state(at, RULES) == state, case


def person(name: str, groups: set[str], kind: PrincipalKind = PrincipalKind.PERSON) -> Principal:
    return Principal(name, name, kind, frozenset({Role.REQUESTER}), frozenset(groups))



@pytest.mark.parametrize(("who", "w", "refusals"), [
    (person("paul", {"oncall"}), window(), []),
    (person("paul", {"oncall"}), window(opened_by="olga", confirmed_by="paul"), []),
    (person("olga", {"oncall"}), window(),
     ["olga broke the glass of window 1; another person of the break-glass group acknowledges its uncodified drift"]),
    (person("alice", {"app"}), window(), ["alice is not in a break-glass group (oncall)"]),
    (person("bot", {"oncall"}, PrincipalKind.AGENT), window(), ["bot is an agent; only people may acknowledge"]),
])
def test_who_may_acknowledge_an_overdue_window(who: Principal, w: BreakGlassWindow, refusals: list[str]) -> None:
    assert acknowledge_refusals(who, RULES, w) == refusals

@pytest.mark.parametrize(("who", "duration", "reason", "refusals"), [
    (person("olga", {"oncall"}), 2 * H, "incident 1", []),
    (person("alice", {"app"}), 2 * H, "incident 1", ["alice is not in a break-glass group (oncall)"]),
    (person("bot", {"oncall"}, PrincipalKind.AGENT), 2 * H, "incident 1",
     ["bot is an agent; only people may break the glass"]),
    (person("olga", {"oncall"}), 5 * H, "incident 1", ["a window lasts at most 4:00:00 (break_glass.max_window)"]),
    (person("olga", {"oncall"}), 2 * H, "  ", ["say why (-m): the incident this is for"]),
])
def test_who_may_break_the_glass(who: Principal, duration: timedelta, reason: str, refusals: list[str]) -> None:
    assert open_refusals(who, StackSettings("s", "stacks/s", frozenset()), RULES, duration, reason) == refusals


@pytest.mark.parametrize(("text", "expected"), [("90s", timedelta(seconds=90)), ("15m", 15 * timedelta(minutes=1)),
                                                ("6h", 6 * H), ("1d", 24 * H), (" 1.5h ", 1.5 * H)])
def test_durations(text: str, expected: timedelta) -> None:
    assert parse_interval(text, "drift.interval") == expected


@pytest.mark.parametrize("text", ["6", "6x", "h", "-1h", "0s", "99999999999d", "366d", "9" * 400 + "s"])
def test_bad_durations_name_the_setting(text: str) -> None:
    with pytest.raises(ConfigError, match="drift.interval"):
        parse_interval(text, "drift.interval")


def test_a_check_is_due_after_its_interval() -> None:
    assert check_due(None, H, T0) and check_due(T0, H, T0 + H) and not check_due(T0, H, T0 + H / 2)


MAIN_TF = '''resource "aws_instance" "web" {
  ami           = "ami-1"
  instance_type = "t3.small" # sized for staging
  tags          = local.tags
  root_block_device {
    volume_size = 8
  }
}
'''


def test_codify_rewrites_a_literal_and_keeps_everything_else() -> None:
    edited = set_attribute(MAIN_TF, "main.tf", "aws_instance", "web", "instance_type", "t3.medium")
    assert edited == MAIN_TF.replace('"t3.small" # sized for staging', '"t3.medium"')
    added = set_attribute(MAIN_TF, "main.tf", "aws_instance", "web", "monitoring", True)
    assert added.splitlines()[-2:] == ["  monitoring = true", "}"]
    nested = set_attribute(MAIN_TF, "main.tf", "aws_instance", "web", "volume_size", 20)  # not the nested block's
    assert "    volume_size = 8" in nested and "  volume_size = 20" in nested


@pytest.mark.parametrize(("attribute", "value", "message"), [
    ("tags", "x", r"main.tf:4: aws_instance.web.tags is set by the expression local.tags"),
    ("instance_type", {"a": 1}, "not a string, number or bool"),
])
def test_codify_refuses_what_it_cannot_write(attribute: str, value: object, message: str) -> None:
    with pytest.raises(NotCodifiable, match=message):
        set_attribute(MAIN_TF, "main.tf", "aws_instance", "web", attribute, value)


def test_an_import_declaration_holds_the_block_and_literal_attributes() -> None:
    text, left_out = import_declaration("aws_security_group.admin", "sg-1", {
        "name": "admin", "tags": {"owner": "ops"}, "ports": [443], "rules": [{"x": 1}], "note": None})
    assert text.startswith('import {\n  to = aws_security_group.admin\n  id = "sg-1"\n}\n')
    assert '  tags = {"owner" = "ops"}' in text and "  ports = [443]" in text and left_out == ["rules"]
