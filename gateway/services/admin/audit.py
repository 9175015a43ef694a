"""Auditors' queries over the trail: list, one change's story, export, verify, signed checkpoints."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Sequence
from contextlib import closing
from dataclasses import replace
from datetime import datetime, timedelta

from gateway.domain.audit import GENESIS, AuditEvent, ChainBreak, Checkpoint, EventQuery, verify_against, verify_chain
from gateway.domain.errors import ConfigError, InputError, NotFound, Refused
from gateway.domain.permissions import Action, require
from gateway.domain.principals import Principal
from gateway.domain.trail_tree import BLOCK, TrailTree, as_text, from_text, leaf_hash, leaves_wanted, subtree_root
from gateway.ports import AuditLog, Signer
from gateway.services.workspace import Records, Signed


def require_auditor(actor: Principal) -> None:
    require(actor, Action.READ_TRAIL)


def list_events(ws: Records, actor: Principal, proposal_id: int | None = None, actor_name: str | None = None,
                stack: str | None = None, since: str | None = None, until: str | None = None,
                address: str | None = None, action: str | None = None, outcome: str | None = None,
                after: int = 0, limit: int | None = None, repository: str | None = None) -> list[AuditEvent]:
    """Events, oldest first, after event `after` (keyset pagination), at most `limit`. `address` is a resource
    address, exact or a prefix ending in `*`, and brings the events of the proposals that name it; `action` is a
    kind or kind prefix (e.g. `apply`), `outcome` a kind's outcome (`refused`, `failed`, `succeeded`); `repository`
    a registered declaration repository (removed ones too), whose events only are listed."""
    require_auditor(actor)
    query = EventQuery(proposal_id=proposal_id, actor=actor_name, stack=stack,
                       since=_iso(since, "--since") if since else None, until=_iso(until, "--until") if until else None,
                       action=action, outcome=outcome, address=address, repository=repository or None)
    with ws.store.session(readonly=True) as session:
        if query.repository and session.repositories.get(query.repository) is None:
            raise NotFound(f"no repository {query.repository} (gateway repos list shows them)")
        return session.audit.query(query, after, limit)


def _iso(value: str, name: str) -> str:
    try:
        return datetime.fromisoformat(value).isoformat(timespec="microseconds")
    except ValueError:
        raise InputError(f"{name} {value!r} is not an ISO 8601 time such as 2026-11-29T10:00") from None


def proposal_story(ws: Records, actor: Principal, proposal_id: int) -> list[AuditEvent]:
    """The change's events, with the agent's work for it (its conversation's requests, model and tool calls)."""
    events = list_events(ws, actor, proposal_id=proposal_id)
    if not events:
        raise NotFound(f"no proposal {proposal_id} in the audit trail")
    with ws.store.session(readonly=True) as session:
        conversation = session.conversations.of_proposal(proposal_id)
        agent_work = session.audit.query(EventQuery(action="agent")) if conversation else []
    ours = [e for e in agent_work if conversation and e.payload.get("conversation") == conversation.id]
    return sorted({e.seq: e for e in events + ours}.values(), key=lambda e: e.seq)


def verify_trail(ws: Records, actor: Principal) -> tuple[int, ChainBreak | None]:
    """The whole chain, streamed: memory stays flat however long the trail. Returns the events proven."""
    require_auditor(actor)
    with ws.store.session(readonly=True) as session:
        return _verify(session.audit, session.audit.chain_head(), (0, GENESIS))


def _verify(audit: AuditLog, head: tuple[int, str] | None, start: tuple[int, str]) -> tuple[int, ChainBreak | None]:
    """Hash each event's stored bytes in order, and check that the columns the filters search agree with those bytes
    (so no edit can hide an event from a filter; the repository is an index outside the bytes, not checked: see the
    store's migration 33): one pass over one stream."""
    upto = head[0] if head else start[0]
    with closing(audit.links(after=start[0])) as links:  # closed even when verify raises: the stream lets go at once
        broken = verify_chain(links, head, start=start, decode=audit.decode)
    if broken is None:
        return upto - start[0], None
    return max(0, (broken.seq or upto + 1) - start[0] - 1), broken


def audit_signer(ws: Signed) -> Signer:
    """The key that signs checkpoints and evidence (a clear error when none is configured)."""
    if ws.signer is None:
        raise ConfigError("no audit signing key is configured for this workspace")
    return ws.signer


def sign_checkpoint(ws: Signed, actor: Principal | None = None) -> Checkpoint:
    """Sign the chain's head now, with the root of the trail's Merkle tree, and keep the checkpoint (an auditor keeps
    the printed copy, too). The tree's new complete blocks are kept first, each batch in a transaction of its own:
    the head's write lock is never held while the trail is hashed."""
    if actor is not None:
        require_auditor(actor)
    key = audit_signer(ws)
    with ws.store.session(readonly=True) as session:
        seq, head = session.audit.chain_head() or (0, GENESIS)
    root = as_text(trail_tree(ws, seq, keep=True).root()) if seq else None
    unsigned = Checkpoint(seq, head, ws.clock.now().isoformat(timespec="seconds"), key.public_key(), "", root)
    checkpoint = replace(unsigned, signature=key.sign(unsigned.message()))
    with ws.store.session() as session:
        session.audit.add_checkpoint(checkpoint)
    return checkpoint


TREE_BATCH = 1024  # blocks hashed and kept per transaction when a checkpoint extends the tree


def trail_tree(ws: Records, size: int, leaves: Iterable[int] = (), keep: bool = False) -> TrailTree:
    """The Merkle tree of the first `size` events, able to give the paths of the `leaves` asked (0-based). Blocks
    not kept yet are hashed from their events: kept (`keep`, when a checkpoint is signed) or only used (a read)."""
    wanted = size // BLOCK
    with ws.store.session(readonly=True) as session:
        roots = [from_text(r) for r in session.audit.tree_blocks(wanted)]
    while len(roots) < wanted:
        first, last = len(roots), min(wanted, len(roots) + TREE_BATCH)
        leaves_read = _leaves(ws, first * BLOCK, last * BLOCK)
        new = [subtree_root(leaves_read[i * BLOCK:(i + 1) * BLOCK]) for i in range(last - first)]
        if keep:
            with ws.store.session() as session:
                session.audit.add_tree_blocks(first, [as_text(r) for r in new])
        roots += new
    known: dict[int, bytes] = {}
    for lo, hi in leaves_wanted(size, leaves):
        known.update(zip(range(lo, hi), _leaves(ws, lo, hi), strict=True))
    return TrailTree(size, roots, known)


def _leaves(ws: Records, lo: int, hi: int) -> list[bytes]:
    """The leaf hashes of events lo+1..hi (leaves lo..hi-1); a missing event is refused, never hashed around."""
    with ws.store.session(readonly=True) as session:
        hashes = session.audit.hashes(lo, hi)
    if len(hashes) != hi - lo:
        raise Refused([f"events {lo + 1} to {hi} of the trail are not all there ({len(hashes)} of {hi - lo}): "
                       "the trail is broken (`gateway audit verify` says where)"])
    return [leaf_hash(h) for h in hashes]


def verify_from_checkpoint(ws: Signed, actor: Principal) -> tuple[int, ChainBreak | None, Checkpoint | None]:
    """Resume: prove the chain after the newest checkpoint this gateway signed (its signature checked with the
    gateway's key), and that the checkpoint's event still ends in the signed hash. Returns events verified."""
    require_auditor(actor)
    key = audit_signer(ws)
    with ws.store.session(readonly=True) as session:
        kept = [c for c in session.audit.checkpoints() if c.public_key == key.public_key()
                and key.valid(c.public_key, c.message(), c.signature)]
        checkpoint = None
        start = (0, GENESIS)
        if kept:
            checkpoint = kept[-1]
            anchor = session.audit.query(EventQuery(), after=checkpoint.seq - 1, limit=1)
            if not anchor or anchor[0].seq != checkpoint.seq or anchor[0].hash != checkpoint.hash:
                return 0, ChainBreak(checkpoint.seq, f"event {checkpoint.seq} no longer ends in the hash its "
                                                     "checkpoint signed: the trail was rewritten"), checkpoint
            start = (checkpoint.seq, checkpoint.hash)
        count, broken = _verify(session.audit, session.audit.chain_head(), start)
    return count, broken, checkpoint


def verify_checkpoint(ws: Signed, actor: Principal, checkpoint: Checkpoint) -> tuple[int, ChainBreak | None]:
    """The trail up to a checkpoint an auditor kept: its signature, and the chain ending where it signed."""
    require_auditor(actor)
    if not audit_signer(ws).valid(checkpoint.public_key, checkpoint.message(), checkpoint.signature):
        return 0, ChainBreak(checkpoint.seq, "the checkpoint's signature does not verify: it is not the one signed")
    with ws.store.session(readonly=True) as session:
        with closing(session.audit.links(upto=checkpoint.seq)) as links:
            return checkpoint.seq, verify_against(links, checkpoint, session.audit.decode)


def checkpoint_if_due(ws: Signed) -> Checkpoint | None:
    """For workers: sign a checkpoint when the newest is older than the interval and the chain moved since."""
    with ws.store.session(readonly=True) as session:
        kept = session.audit.checkpoints()
        head = session.audit.chain_head()
    if head is None or (kept and kept[-1].seq == head[0]):
        return None
    if kept and ws.clock.now() - datetime.fromisoformat(kept[-1].at) < timedelta(minutes=ws.settings.audit_checkpoint_minutes):
        return None
    return sign_checkpoint(ws)


EXPORT_FIELDS = ("seq", "id", "at", "actor", "actor_kind", "kind", "proposal_id", "stacks", "payload", "prev_hash", "hash")


def export_events(events: Sequence[AuditEvent], fmt: str, checkpoints: Sequence[Checkpoint] = ()) -> str:
    """Events with their hashes; the JSONL export ends with the signed checkpoints, one `{"checkpoint": ...}` a line."""
    rows = [{**e.content(), "prev_hash": e.prev_hash, "hash": e.hash} for e in events]
    if fmt == "jsonl":
        return ("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
                + "".join(json.dumps({"checkpoint": c.to_json()}, sort_keys=True) + "\n" for c in checkpoints))
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=EXPORT_FIELDS)
        writer.writeheader()
        for r in rows:
            writer.writerow({**r, "stacks": " ".join(r["stacks"]), "payload": json.dumps(r["payload"], sort_keys=True)})
        return out.getvalue()
    raise InputError(f"unknown export format {fmt!r} (jsonl or csv)")
