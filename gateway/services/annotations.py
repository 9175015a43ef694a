"""What a proposal's previews show before the plan, added when they are read (the stored previews never change):
the stack's open drift record (what this apply would revert), and what a rollback or an import must say first."""

from __future__ import annotations

from dataclasses import replace

from gateway.domain.lifecycle import DECIDABLE
from gateway.domain.preview import DANGER_KINDS, Preview, preview_from_json, preview_to_json
from gateway.domain.proposal import Proposal
from gateway.services.drift_records import open_drift_by_stack, with_open_drift
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
        preview = with_open_drift(preview_from_json(text), drift.get(stack))
        notices = list(preview.notices)
        if rollback:
            notices += rollback_notices(rollback, preview)
        if importing:
            notices += import_notices(importing, preview)
        out[stack] = preview_to_json(replace(preview, notices=tuple(notices)))
    return out


def rollback_notices(of: Proposal, preview: Preview) -> list[str]:
    lines = [f"this rolls back proposal {of.id} ({of.reason.splitlines()[0][:80]}; merged as "
             f"{(of.merge_sha or '?')[:12]}): the declaration returns to what it was before it"]
    doomed = [e.address for e in preview.danger if e.kind in DANGER_KINDS]
    if doomed:
        lines.insert(0, f"THIS ROLLBACK DESTROYS {', '.join(doomed)}: what proposal {of.id} created goes, "
                        "with any data in it")
    return lines


def import_notices(address: str, preview: Preview) -> list[str]:
    entry = next((e for e in preview.changes if e.address == address), None)
    if entry is None or not entry.importing_id:
        return [f"imports {address}: the plan no longer shows the import"]
    if entry.attributes:
        return [f"imports {address} (id {entry.importing_id}) but NOT zero-diff: the plan would also change "
                f"{', '.join(a.path for a in entry.attributes)}"]
    return [f"imports {address} (id {entry.importing_id}) with zero diff: the plan shows the import and no other "
            "change for that address"]
