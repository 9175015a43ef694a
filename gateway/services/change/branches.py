"""Branches the gateway writes itself (codify, import, rollback): a fresh name per attempt."""

from __future__ import annotations

from gateway.services.workspace import MainRules


def free_branch_name(ws: MainRules, base: str) -> str:
    """`base`, or `base-2`, `base-3`…: the first name no branch holds, so an abandoned attempt never blocks a retry."""
    if not ws.repo.branch_exists(base):
        return base
    n = 2
    while ws.repo.branch_exists(f"{base}-{n}"):
        n += 1
    return f"{base}-{n}"
