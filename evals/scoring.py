"""Scores one eval case: does the proposal's plan do what the request should produce?"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.domain.plan import Plan, ResourceChange

_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


@dataclass(frozen=True)
class Score:
    passed: bool
    reasons: tuple[str, ...]


def value_at(value: Any, path: str) -> Any:
    """`tags.team` or `root_block_device[0].encrypted` inside a plan's `after` value."""
    for name, index in _STEP.findall(path):
        if index:
            value = value[int(index)] if isinstance(value, list) and int(index) < len(value) else None
        else:
            value = value.get(name) if isinstance(value, Mapping) else None
    return value


def _matches(rc: ResourceChange, stack: str, want: Mapping[str, Any]) -> list[str]:
    """Why this change does not match the expectation (empty: it matches)."""
    if want.get("stack") and want["stack"] != stack:
        return ["other stack"]
    if "address" in want and rc.address != want["address"]:
        return ["other address"]
    if "type" in want and rc.type != want["type"]:
        return ["other type"]
    problems = []
    if "actions" in want and list(rc.change.actions) != list(want["actions"]):
        problems.append(f"{rc.address}: actions {list(rc.change.actions)}, expected {want['actions']}")
    if "previous_address" in want and rc.previous_address != want["previous_address"]:
        problems.append(f"{rc.address}: moved from {rc.previous_address}, expected {want['previous_address']}")
    for path, expected in (want.get("attributes") or {}).items():
        actual = value_at(rc.change.after, path)
        if actual != expected and str(actual) != str(expected):
            problems.append(f"{rc.address}: {path} = {actual!r}, expected {expected!r}")
    return problems


def score_case(case: Mapping[str, Any], plans: Mapping[str, Plan] | None, deny_findings: list[str]) -> Score:
    """`plans` is None when no proposal was opened."""
    if case.get("expect_no_change"):
        changed = plans and any(p.has_changes for p in plans.values())
        return Score(not changed, ("expected no change, but a proposal was opened",) if changed else ())
    if plans is None:
        return Score(False, ("no proposal was opened",))
    reasons: list[str] = []
    for want in case.get("expect") or []:
        candidates = [(stack, rc) for stack, plan in plans.items() for rc in plan.resource_changes]
        attempts = [_matches(rc, stack, want) for stack, rc in candidates]
        if not any(a == [] for a in attempts):
            close = [p for a in attempts for p in a if not p.startswith("other ")]
            reasons.append(close[0] if close else f"no change matches {dict(want)}")
    allowed = set(case.get("allow_deletes") or [])
    unexpected = [rc.address for p in plans.values() for rc in p.destructive if rc.address not in allowed]
    if unexpected:
        reasons.append(f"unexpected delete or replace of {', '.join(unexpected)}")
    if case.get("policy_clean", True) and deny_findings:
        reasons.append(f"policy denies {', '.join(deny_findings)}")
    return Score(not reasons, tuple(reasons))
