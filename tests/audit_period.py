"""A period of N changes written straight into the trail through the store's append path (the hash chain, its
indexes), as the gateway's services write them, without planning or applying anything: for the tests and the
benchmark that are about reading a big population (the auditor's page), where building 1,000 changes through the
real path would take an hour. tests/test_audit_evidence.py builds its period through the real path.

Every 40th change is applied with an override, every 50th fails part-way, every 100th is a drift revert (every
other one by the gateway alone), every 100th (offset) a rollback; five commits reach main outside the gateway (three
acknowledged) and three break-glass windows open (one codified, one overdue and acknowledged, one overdue)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.domain.principals import GATEWAY, SystemActor
from gateway.services.workspace import Workspace

STACKS = ("network", "data", "platform", "app-prod", "app-staging")
Entry = tuple[Any, str, dict[str, Any], int | None, Sequence[str]]


@dataclass
class WrittenPeriod:
    changes: list[int] = field(default_factory=list)
    kinds: dict[str, list[int]] = field(default_factory=dict)  # exception kind -> the changes of it


def _sha(*parts: object) -> str:
    return hashlib.sha1(":".join(map(str, parts)).encode()).hexdigest()


def _digest(*parts: object) -> str:
    return "sha256:" + hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()


def change_entries(pid: int, written: WrittenPeriod) -> list[Entry]:
    """One change's events, in the order the services write them."""
    stack, head = STACKS[pid % len(STACKS)], _sha("head", pid)
    requester, approver = SystemActor(f"dev{pid % 23}"), SystemActor(f"approver{pid % 7}")
    digest = _digest("plan", pid)
    changed = [f"aws_instance.web{pid}_{i}" for i in range(3)]
    kind = ("override" if pid % 40 == 0 else "partial" if pid % 50 == 25 else "revert" if pid % 100 == 10
            else "rollback" if pid % 100 == 60 else "plain")
    if kind != "plain":
        written.kinds.setdefault(kind, []).append(pid)
    entries: list[Entry] = []
    if kind == "revert":
        entries.append((GATEWAY, "proposal.opened", {"branch": f"drift/{stack}", "base_sha": head, "head_sha": head,
                                                      "kind": "drift_revert"}, pid, [stack]))
    else:
        entries += [(requester, "change.requested", {"reason": f"change {pid}", "branch": f"change-{pid}"}, pid, [stack]),
                    (requester, "proposal.opened", {"branch": f"change-{pid}", "base_sha": _sha("base", pid),
                                                     "head_sha": head, "requester": requester.name,
                                                     "proposer": requester.name,
                                                     "changed_paths": [f"stacks/{stack}/main.tf"]},
                     pid, [stack]),
                    (SystemActor(requester.name), "commit", {"sha": head, "author": f"{requester.name} <d@x.io>",
                                                             "message": f"change {pid}"}, pid, [stack])]
    findings = [{"rule": "protected-resource", "severity": "deny", "address": changed[0], "message": "destroys",
                 "stack": stack}] if kind == "override" else []
    entries.append((GATEWAY, "plan", {"head_sha": head, "main_sha": _sha("main", pid), "digest": digest,
                                      "engine": "sandbox", "state_serial": pid, "counts": {"update": 3},
                                      "destructive": [], "changed": changed, "drift": [],
                                      "risk": {"level": "medium", "reasons": [f"{a}: update" for a in changed]},
                                      "findings": findings}, pid, [stack]))
    if kind == "rollback":
        entries.append((requester, "rollback.opened", {"rolls_back": pid - 50, "merge_sha": _sha("merge", pid - 50),
                                                        "reason": "it broke", "branch": f"rollback/{pid - 50}",
                                                        "destroys": {}}, pid, [stack]))
    if kind == "override":
        entries.append((SystemActor("security-lead"), "policy.override", {
            "finding": f"{stack}:protected-resource:{changed[0]}", "reason": f"ticket CHG-{pid}",
            "expires_at": "2099-01-01T00:00:00+00:00", "head_sha": head, "digests": {stack: digest}}, pid, [stack]))
    auto = kind == "revert" and pid % 200 == 10
    if auto:
        entries.append((GATEWAY, "drift.auto_revert", {"stack": stack, "changes": changed, "authority": _sha("yaml")},
                        pid, [stack]))
    else:
        entries.append((approver, "approval", {"head_sha": head, "digests": {stack: digest}, "comment": "ok",
                                               "authenticated_by": "oidc:https://idp.example",
                                               "required_approvals": 1}, pid, [stack]))
    failed = kind == "partial"
    entries += [(approver, "proposal.start_apply", {"from": "open", "to": "applying"}, pid, [stack]),
                (approver, "apply.started", {"apply_id": pid, "runner": "bench", "head_sha": head, "digest": digest,
                                             "state_serial": pid}, pid, [stack]),
                (approver, "apply.failed" if failed else "apply.succeeded", {
                    "apply_id": pid, "applied": changed[:1] if failed else changed,
                    "failed_address": changed[1] if failed else None, "error": "AccessDenied" if failed else None,
                    "state_serial": pid + 1, "digest": digest, "head_sha": head}, pid, [stack])]
    if failed:
        entries.append((approver, "proposal.fail", {"from": "applying", "to": "failed", "stack": stack,
                                                     "error": "AccessDenied"}, pid, [stack]))
    else:
        entries += [(approver, "proposal.finish", {"from": "applying", "to": "applied", "merge_sha": _sha("merge", pid)},
                     pid, [stack]),
                    (approver, "merged", {"branch": f"change-{pid}", "into": "main", "merge_sha": _sha("merge", pid),
                                          "on": "gateway", "applied_commit": {stack: head}}, pid, [stack])]
    return entries


def around_entries(n: int, first: int = 1) -> list[Entry]:
    """Pushes to main outside the gateway and break-glass windows, spread over the period (the n-th change's turn;
    the period's changes are numbered from `first`)."""
    entries: list[Entry] = []
    if n % 200 == 100:  # five pushes, three acknowledged
        sha = _sha("push", n)
        entries.append((GATEWAY, "main.pushed_outside", {"sha": sha, "author": "mallory <m@x.io>", "stacks": ["network"],
                                                         "changed_paths": ["stacks/network/main.tf"]}, None, ["network"]))
        if n < 600:
            entries.append((SystemActor("approver1"), "main.push_acknowledged", {
                "sha": sha, "stacks": ["network"], "reason": "a hotfix, kept"}, None, ["network"]))
    if n in (300, 500, 700):
        wid, stack = n // 100, "app-staging"
        entries += [(SystemActor("oncall1"), "break_glass.opened", {"break_glass": wid, "stack": stack,
                                                                    "reason": f"incident {wid}", "for_seconds": 3600},
                     None, [stack]),
                    (GATEWAY, "drift.opened", {"stack": stack, "record": wid, "break_glass": wid, "expected": True,
                                               "drifted": {"aws_instance.web[0]": ["instance_type"]}}, None, [stack]),
                    (SystemActor("oncall1"), "break_glass.closed", {"break_glass": wid, "stack": stack, "note": "over"},
                     None, [stack])]
        if n == 300:
            codify = first + 300
            entries += [(GATEWAY, "drift.closed", {"stack": stack, "record": wid, "break_glass": wid,
                                                   "reason": f"proposal {codify} (a codify) was applied"}, codify,
                         [stack]),
                        (GATEWAY, "break_glass.settled", {"break_glass": wid, "stack": stack}, None, [stack])]
        else:
            entries.append((GATEWAY, "break_glass.overdue", {"break_glass": wid, "stack": stack, "drift_record": wid,
                                                             "drifted": ["aws_instance.web[0]"]}, None, [stack]))
        if n == 500:
            entries.append((SystemActor("oncall2"), "break_glass.acknowledged", {
                "break_glass": wid, "stack": stack, "note": "codify ticket OPS-5"}, None, [stack]))
    return entries


def write_period(ws: Workspace, changes: int = 1000, first: int = 1, batch: int = 2000) -> WrittenPeriod:
    """N changes' stories (numbered from `first`), and what happened around them, appended to the trail in order, a
    batch a transaction."""
    written, pending = WrittenPeriod(), []
    for n, pid in enumerate(range(first, first + changes), start=1):
        pending += around_entries(n, first) + change_entries(pid, written)
        written.changes.append(pid)
        if len(pending) >= batch:
            _append(ws, pending)
            pending = []
    _append(ws, pending)
    return written


def _append(ws: Workspace, entries: list[Entry]) -> None:
    if entries:
        with ws.store.session() as session:
            session.audit.append_many(entries)
