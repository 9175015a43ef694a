"""The agent's summary is a claim; the engine's plan is the truth. Where they disagree, say so."""

from __future__ import annotations

import re
from collections.abc import Iterable

from gateway.domain.plan import Plan
from gateway.domain.policy import Finding

_NOTHING_DESTROYED = re.compile(
    r"\b(no(thing)?|none|zero|without|not)\b[^.]{0,40}\b(destroy|destroyed|deleted?|deletes|removed?|replaced?|replacements?)\b"
    r"|\bnon-?destructive\b|\bpurely additive\b|\bonly adds?\b", re.IGNORECASE)
_ADDRESS = re.compile(r"\b([a-z][a-z0-9]*_[a-z0-9_]+\.[a-zA-Z_][\w-]*(?:\[[^\]]+\])?)")


# What a summary may claim about a security property, and the deny rules that would make the claim false.
_SECURITY_CLAIMS: tuple[tuple[str, re.Pattern[str], frozenset[str] | None], ...] = (
    ("encryption", re.compile(r"\bencrypt(ed|ion|s)?\b", re.I), frozenset({"encryption-at-rest"})),
    ("public access", re.compile(r"\bpublic access\b[^.]{0,30}\b(block(ed|s)?|off|disabled|prevented)\b|\bblock(ed|s|ing)? "
                                 r"(all )?public access\b|\b(is|are|stays?|kept|remains?) private\b|\bnot public\b", re.I),
     frozenset({"s3-public-access-block", "s3-public-acl", "open-ingress"})),
    ("tags", re.compile(r"\btag(s|ged)?\b", re.I), frozenset({"required-tags"})),
    ("deletion protection", re.compile(r"\bdeletion[- ]protect(ed|ion)\b|\bprevent_destroy\b|"
                                       r"\bprotected (from|against) (deletion|destruction)\b", re.I),
     frozenset({"db-deletion-protection", "protected-resource"})),
    ("backups", re.compile(r"\bbackups? (are |stay |remain )?(on|enabled|kept|retained)\b", re.I), frozenset({"db-backups"})),
    ("policy compliance", re.compile(r"\b(compliant|passes (all |every )?(the )?polic(y|ies)|no (policy )?(denies|deny "
                                     r"findings|violations)|policy[- ]clean)\b", re.I), None),
)
_NEGATED = re.compile(r"\b(not|no|un|without|isn't|aren't|lacks?|missing)\W*(\w+\W+){0,2}$", re.I)


def check_claim(summary: str, plans: Iterable[Plan], findings: Iterable[Finding] = ()) -> list[str]:
    """Discrepancies between what the agent says and what its plans and their policy findings do, in words."""
    plans = list(plans)
    issues = _security_claims(summary, [f for f in findings if f.severity == "deny"])
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


def _security_claims(summary: str, denies: list[Finding]) -> list[str]:
    """A claim about encryption, public access, tags, deletion protection or policy that a deny finding refutes."""
    issues = []
    for what, claim, rules in _SECURITY_CLAIMS:
        for match in claim.finditer(summary):
            if _NEGATED.search(summary[max(0, match.start() - 25):match.start()]):
                continue  # "not encrypted" is an admission, not a claim
            refuting = [f for f in denies if rules is None or f.rule in rules]
            if refuting:
                issues.append(f"the agent claims {what} (\"{match.group(0)}\"), but the plan has policy deny finding(s): "
                              + ", ".join(f"{f.rule} on {f.address}" for f in refuting))
            break
    return issues
