"""An evidence bundle: one change, everything an auditor tests it with, in a file a third party verifies offline.

The format is written down in `gateway/evidence_verifier.py` (the standalone verifier) and docs/AUDIT_EVIDENCE.md;
this module assembles it. Every event the bundle rests on travels as the trail stores it, with its audit path in the
Merkle tree a signed checkpoint covers; the documents people read (story, decisions, rendered plans, diff, apply
log) name those events, and the gateway's key signs the whole bundle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.domain.audit import AuditEvent, Checkpoint
from gateway.domain.change_population import ChangeRow
from gateway.domain.plan import canonical_json
from gateway.domain.story import summary_lines

FORMAT = "change-gateway-evidence/1"
ATTESTATION_PREFIX = b"change-gateway evidence bundle v1\n"
DECISION_KINDS = ("approval", "rejection", "decision.withdrawn")


@dataclass(frozen=True)
class StoredEvent:
    """An event exactly as the trail stores it, and its audit path in the checkpoint's tree."""

    seq: int
    canonical: str
    prev_hash: str
    hash: str
    path: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "canonical": self.canonical, "prev_hash": self.prev_hash, "hash": self.hash,
                "path": list(self.path)}


@dataclass(frozen=True)
class Documents:
    """What people read beside the events: the rendered plans, the diff, the apply log (secrets masked)."""

    plans: tuple[Mapping[str, Any], ...]  # {stack, digest, event, risk, preview}
    diff: Mapping[str, Any]  # {base, head, text}
    apply_log: tuple[Mapping[str, Any], ...]  # {stack, status, applied, error, lines, ...}


def bundle_bytes(bundle: Mapping[str, Any]) -> bytes:
    """The bundle's file: its canonical JSON and a newline (the verifier refuses any other spelling of it)."""
    return canonical_json(bundle) + b"\n"


def attestation_message(unsigned: Mapping[str, Any]) -> bytes:
    """What the gateway's key signs: a fixed prefix (no checkpoint message starts so) and the bundle without its
    attestation, in canonical form."""
    return ATTESTATION_PREFIX + canonical_json({k: v for k, v in unsigned.items() if k != "attestation"})


def story(events: Sequence[AuditEvent]) -> list[dict[str, Any]]:
    """The events in order, each with every detail (nothing summarised away: JSON is for tools)."""
    return [{"seq": e.seq, "at": e.at, "actor": e.actor, "kind": e.kind, "proposal": e.proposal_id,
             "lines": summary_lines(e.payload, full=True)} for e in events]


def identity_events(decision: AuditEvent, candidates: Sequence[AuditEvent]) -> list[AuditEvent]:
    """What shows who made a decision and how they signed in: the person's record (added, their access then), the
    identity their sign-in maps to (an OIDC subject or a GitHub account, linked by an admin or admitted), the
    session's sign-in, and the group or team check made for the decision. `candidates` are the trail's events about
    principals, identities and sign-ins; only those before the decision count."""
    name, method = decision.actor, str(decision.payload.get("authenticated_by", ""))
    before = [e for e in candidates if e.seq < decision.seq]
    about = [e for e in before if e.payload.get("name") == name and e.kind.startswith(("principal.", "identity."))]
    picked = [e for e in about if e.kind in ("principal.added", "principal.admitted")]
    picked += [e for e in about if e.kind == "principal.access_changed"][-1:]
    if method.startswith("oidc:"):
        issuer = method.removeprefix("oidc:")
        picked += [e for e in about if e.kind in ("identity.linked", "principal.admitted")
                   and e.payload.get("issuer") == issuer]
    if method == "github" or method.startswith("github-review:"):
        picked += [e for e in about if e.kind == "principal.github_linked"][-1:]
    picked += [e for e in before if e.actor == name and e.kind == "sign_in"
               and e.payload.get("auth_method") == method][-1:]
    picked += [e for e in before if e.actor == name and e.proposal_id == decision.proposal_id
               and e.kind in ("sign_in.group_check", "github.team_check")][-1:]
    return sorted({e.seq: e for e in picked}.values(), key=lambda e: e.seq)


def how_signed_in(decision: AuditEvent, proof: Sequence[AuditEvent]) -> str:
    """The identity proof in words."""
    method = str(decision.payload.get("authenticated_by", "")) or "unknown"
    said = [f"{decision.actor} decided through {method}"]
    for e in proof:
        p = e.payload
        if e.kind == "sign_in":
            said.append(f"signed in at {e.at[:19]} (subject {p.get('subject', '-')}, session until "
                        f"{str(p.get('expires_at', '-'))[:19]})")
        elif e.kind in ("identity.linked", "principal.admitted"):
            said.append(f"identity {p.get('issuer')} subject {p.get('subject')} linked to {p.get('name')} by "
                        f"{e.actor} at {e.at[:19]}")
        elif e.kind == "principal.github_linked":
            said.append(f"GitHub account {p.get('github_login')} (id {p.get('github_id')}) linked by {e.actor} at "
                        f"{e.at[:19]}")
        elif e.kind in ("sign_in.group_check", "github.team_check"):
            said.append(f"groups counted for this decision: {', '.join(p.get('active') or []) or 'none'}"
                        + (f" (not a member of {', '.join(p['not_member'])})" if p.get("not_member") else ""))
        elif e.kind in ("principal.added", "principal.access_changed"):
            roles = p.get("roles") or []
            said.append(f"{'added' if e.kind == 'principal.added' else 'access set'} by {e.actor} at {e.at[:19]} "
                        f"with roles {', '.join(roles) or '-'} and groups {', '.join(p.get('groups') or []) or '-'}")
    return "; ".join(said)


def decisions(events: Sequence[AuditEvent], row: ChangeRow,
              proofs: Mapping[int, Sequence[AuditEvent]]) -> list[dict[str, Any]]:
    """Each decision on the change, which applies it counted for, and its identity proof."""
    counted_for = {a.seq: [s.seq for s in row.applies if a.by in s.counted and a.seq < s.seq
                           and a.head_sha == s.head_sha and a.digests.get(s.stack) == s.digest]
                   for a in row.approvals}
    return [{"event": e.seq, "kind": e.kind, "by": e.actor, "at": e.at,
             "authenticated_by": e.payload.get("authenticated_by"), "head_sha": e.payload.get("head_sha"),
             "digests": e.payload.get("digests") or {}, "comment": e.payload.get("comment") or e.payload.get("reason"),
             "counted_for_applies": counted_for.get(e.seq, []),
             "identity": how_signed_in(e, proofs.get(e.seq, ())),
             "identity_events": [p.seq for p in proofs.get(e.seq, ())]}
            for e in events if e.kind in DECISION_KINDS]


def assemble(row: ChangeRow, events: Sequence[AuditEvent], stored: Sequence[StoredEvent], checkpoint: Checkpoint,
             documents: Documents, proofs: Mapping[int, Sequence[AuditEvent]], generated_at: str,
             sample: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The bundle without its attestation (the caller signs `attestation_message` of it)."""
    return {
        "format": FORMAT,
        "generated_at": generated_at,
        "change": row.to_json(),
        "sample": dict(sample) if sample is not None else None,
        "story": story(events),
        "decisions": decisions(events, row, proofs),
        "plans": [dict(p) for p in documents.plans],
        "diff": dict(documents.diff),
        "apply_log": [dict(a) for a in documents.apply_log],
        "events": [s.to_json() for s in stored],
        "checkpoint": {k: v for k, v in checkpoint.to_json().items()},
    }
