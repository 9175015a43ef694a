"""The agent's summary is a claim; the engine's plan is the truth. Where they disagree, say so."""

from __future__ import annotations

import re
from collections.abc import Iterable

from gateway.domain.plan import Plan

_NOTHING_DESTROYED = re.compile(
    r"\b(no(thing)?|none|zero|without|not)\b[^.]{0,40}\b(destroy|destroyed|deleted?|deletes|removed?|replaced?|replacements?)\b"
    r"|\bnon-?destructive\b|\bpurely additive\b|\bonly adds?\b", re.IGNORECASE)
_ADDRESS = re.compile(r"\b([a-z][a-z0-9]*_[a-z0-9_]+\.[a-zA-Z_][\w-]*(?:\[[^\]]+\])?)")


def check_claim(summary: str, plans: Iterable[Plan]) -> list[str]:
    """Discrepancies between what the agent says and what its plans do, in words."""
    plans = list(plans)
    issues = []
    destroyed = [rc.address for p in plans for rc in p.destructive]
    if destroyed and _NOTHING_DESTROYED.search(summary):
        issues.append(f"the agent says nothing is destroyed, but the plan deletes or replaces {', '.join(destroyed)}")
    changed = {rc.address for p in plans for rc in p.changes} | {rc.address.split("[", 1)[0] for p in plans for rc in p.changes}
    known = {rc.address for p in plans for rc in p.resource_changes} | {
        rc.address.split("[", 1)[0] for p in plans for rc in p.resource_changes}
    for address in sorted(set(_ADDRESS.findall(summary))):
        if address in known and address not in changed:
            issues.append(f"the agent mentions {address}, which this plan does not change")
        elif address not in known and "." in address and not address.startswith(("var.", "local.")):
            issues.append(f"the agent mentions {address}, which is not in the plan")
    return issues
