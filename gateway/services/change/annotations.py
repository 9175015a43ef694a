"""What a proposal's previews show before the plan, added when they are read (the stored previews never change):
the stack's open drift record (what this apply would revert), and what a rollback must say first (an import's
zero-diff statement is the preview's own: `build_preview` writes it)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gateway.domain.drift import DriftRecord, entries_to_json, open_drift_notice
from gateway.domain.lifecycle import DECIDABLE
from gateway.domain.preview import DriftEntry, OpenDrift
from gateway.domain.proposal import Proposal
from gateway.services.workspace import Records

ROLLBACK_OF = "rollback_of:"  # marker: proposal id -> the proposal it rolls back, and why


def annotate_previews(ws: Records, proposal: Proposal, previews: dict[str, str]) -> dict[str, str]:
    """Each stack's stored preview (public JSON) with what must be read first put in front."""
    with ws.store.session(readonly=True) as session:
        rollback_of = session.main.marker(f"{ROLLBACK_OF}{proposal.id}")
        rollback = session.proposals.get(int(rollback_of)) if rollback_of else None
    drift = open_drift_by_stack(ws, list(previews)) if proposal.status in DECIDABLE else {}
    if not (rollback or drift):
        return previews
    out = {}
    for stack, text in previews.items():
        # the stored preview stays plain JSON: only what goes in front is built (a large plan's preview is big)
        document = json.loads(text)
        notices = list(document.get("notices", []))
        record = drift.get(stack)
        if record is not None:
            plan_drift = [DriftEntry(d["address"], d["summary"], d["reverted_by_apply"], ()) for d in document["drift"]]
            plan = proposal.plans.get(stack)
            notice = open_drift_notice(record, plan_drift, plan.planned_at if plan else None)
            document["open_drift"] = [_open_drift_json(notice)]
        if rollback:
            notices += rollback_notices(rollback, [d["address"] for d in document["danger"]])
        document["notices"] = notices
        out[stack] = json.dumps(document, separators=(",", ":"), ensure_ascii=False, default=str)
    return out


def _open_drift_json(notice: OpenDrift) -> dict[str, Any]:
    return {"record_id": notice.record_id, "since": notice.since, "expected": notice.expected,
            "reverts": entries_to_json(notice.reverts), "keeps": entries_to_json(notice.keeps),
            "unseen": entries_to_json(notice.unseen)}


def rollback_notices(of: Proposal, doomed: list[str]) -> list[str]:
    """A rollback names what it undoes, and first what it destroys (`doomed`: the plan's deletes and replaces)."""
    lines = [f"this rolls back proposal {of.id} ({of.reason.splitlines()[0][:80]}; merged as "
             f"{(of.merge_sha or '?')[:12]}): the declaration returns to what it was before it"]
    if doomed:
        lines.insert(0, f"THIS ROLLBACK DESTROYS {', '.join(doomed)}: what proposal {of.id} created goes, "
                        "with any data in it")
    return lines


def open_drift_by_stack(ws: Records, stacks: Sequence[str]) -> dict[str, DriftRecord]:
    """The open drift record of each of `stacks` that has one."""
    with ws.store.session(readonly=True) as session:
        found = session.day_two.open_drift_records(stacks)
    return {s: found[s] for s in stacks if s in found}

