"""What a proposal's previews show before the plan, added when they are read (the stored previews never change):
the stack's open drift record (what this apply would revert), and what a rollback or an import must say first."""

from __future__ import annotations

import json
from typing import Any

from gateway.domain.drift import entries_to_json, open_drift_notice
from gateway.domain.lifecycle import DECIDABLE
from gateway.domain.preview import DriftEntry, OpenDrift
from gateway.domain.proposal import Proposal
from gateway.services.drift_records import open_drift_by_stack
from gateway.services.workspace import Workspace

ROLLBACK_OF = "rollback_of:"  # marker: proposal id -> the proposal it rolls back, and why
IMPORT_OF = "import_of:"  # marker: proposal id -> the address and id it imports


def annotate_previews(ws: Workspace, proposal: Proposal, previews: dict[str, str]) -> dict[str, str]:
    """Each stack's stored preview (public JSON) with what must be read first put in front."""
    with ws.store.session(readonly=True) as session:
        rollback_of = session.marker(f"{ROLLBACK_OF}{proposal.id}")
        rollback = session.get_proposal(int(rollback_of)) if rollback_of else None
        importing = session.marker(f"{IMPORT_OF}{proposal.id}")
    drift = open_drift_by_stack(ws, list(previews)) if proposal.status in DECIDABLE else {}
    if not (rollback or importing or drift):
        return previews
    out = {}
    for stack, text in previews.items():
        # the stored preview stays plain JSON: only what goes in front is built (a large plan's preview is big)
        document = json.loads(text)
        notices = list(document.get("notices", []))
        record = drift.get(stack)
        if record is not None:
            plan_drift = [DriftEntry(d["address"], d["summary"], d["reverted_by_apply"], ()) for d in document["drift"]]
            document["open_drift"] = [_open_drift_json(open_drift_notice(record, plan_drift))]
        if rollback:
            notices += rollback_notices(rollback, [d["address"] for d in document["danger"]])
        if importing:
            notices += import_notices(importing, document["changes"])
        document["notices"] = notices
        out[stack] = json.dumps(document, separators=(",", ":"), ensure_ascii=False, default=str)
    return out


def _open_drift_json(notice: OpenDrift) -> dict[str, Any]:
    return {"record_id": notice.record_id, "since": notice.since, "expected": notice.expected,
            "reverts": entries_to_json(notice.reverts), "keeps": entries_to_json(notice.keeps)}


def rollback_notices(of: Proposal, doomed: list[str]) -> list[str]:
    """A rollback names what it undoes, and first what it destroys (`doomed`: the plan's deletes and replaces)."""
    lines = [f"this rolls back proposal {of.id} ({of.reason.splitlines()[0][:80]}; merged as "
             f"{(of.merge_sha or '?')[:12]}): the declaration returns to what it was before it"]
    if doomed:
        lines.insert(0, f"THIS ROLLBACK DESTROYS {', '.join(doomed)}: what proposal {of.id} created goes, "
                        "with any data in it")
    return lines


def import_notices(address: str, changes: list[dict[str, Any]]) -> list[str]:
    """Whether the plan imports `address` with zero diff (`changes`: the preview's entries, public JSON)."""
    entry = next((e for e in changes if e["address"] == address), None)
    if entry is None or not entry.get("importing_id"):
        return [f"imports {address}: the plan no longer shows the import"]
    if entry["attributes"]:
        return [f"imports {address} (id {entry['importing_id']}) but NOT zero-diff: the plan would also change "
                f"{', '.join(a['path'] for a in entry['attributes'])}"]
    return [f"imports {address} (id {entry['importing_id']}) with zero diff: the plan shows the import and no other "
            "change for that address"]
