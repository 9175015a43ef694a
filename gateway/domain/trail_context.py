"""What the trail says happened around the changes, as facts: break-glass windows (who opened and confirmed them,
the drift they made, how it was settled), commits pushed to main outside the gateway (and who acknowledged them),
and which principal names are one person. The population judges them (domain/change_population.py)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.domain.audit import AuditEvent


class Identities:
    """Which principal names are one person: linked to the same OIDC subject or GitHub account, or an agent and the
    person it acts for (union-find over what the trail says)."""

    def __init__(self) -> None:
        self._parent: dict[str, str] = {}
        self._why: dict[frozenset[str], str] = {}
        self._owner: dict[str, str] = {}  # identity key -> the first name seen with it

    def _find(self, name: str) -> str:
        root = self._parent.setdefault(name, name)
        while root != self._parent[root]:
            root = self._parent[root]
        self._parent[name] = root
        return root

    def link(self, name: str, identity: str) -> None:
        owner = self._owner.setdefault(identity, name)
        if owner != name:
            self._parent[self._find(name)] = self._find(owner)
            self._why.setdefault(frozenset((name, owner)), identity)

    def same(self, a: str, b: str) -> str | None:
        """How a and b are one person (`the name itself`, or the identity that joins them), or None."""
        if a == b:
            return "the same principal"
        if self._find(a) != self._find(b):
            return None
        return self._why.get(frozenset((a, b)), "identities linked in the trail")

    @classmethod
    def of(cls, events: Iterable[AuditEvent]) -> Identities:
        known = cls()
        for e in events:
            p = e.payload
            if e.kind == "principal.added" and p.get("acting_for"):
                known.link(str(p["name"]), f"person:{p['acting_for']}")
                known.link(str(p["acting_for"]), f"person:{p['acting_for']}")
            elif e.kind == "principal.github_linked":
                known.link(str(p.get("name")), f"github:{p.get('github_id')}")
                known.link(str(p.get("name")), f"github-login:{str(p.get('github_login')).lower()}")
            elif e.kind in ("identity.linked", "principal.admitted") and p.get("issuer"):
                known.link(str(p.get("name")), f"oidc:{p['issuer']}#{p.get('subject')}")
            elif e.kind == "sign_in" and p.get("subject"):
                method = str(p.get("auth_method", ""))
                issuer = "github" if method == "github" else method.removeprefix("oidc:")
                known.link(e.actor, f"github:{p['subject']}" if issuer == "github" else f"oidc:{issuer}#{p['subject']}")
            elif e.kind == "github.team_check" and p.get("login"):
                known.link(e.actor, f"github-login:{str(p['login']).lower()}")
        return known


@dataclass
class Window:
    """A break-glass episode as the trail tells it, and how its drift was settled (or not)."""

    id: int
    stack: str
    reason: str = ""
    asked_by: str = ""
    confirmed_by: str | None = None
    requested_at: str = ""
    opened_at: str | None = None
    ends_at: str | None = None
    closed_at: str | None = None
    drifted: set[str] = field(default_factory=set)
    settled_by: list[tuple[int | None, str, str]] = field(default_factory=list)  # (proposal, how, at)
    settled_at: str | None = None
    overdue_at: str | None = None
    acknowledged: tuple[str, str, str] | None = None  # (by, at, note)
    seqs: list[int] = field(default_factory=list)

    @property
    def ended_at(self) -> str | None:
        return min(filter(None, (self.closed_at, self.ends_at)), default=None) if self.opened_at else None

    def covers(self, at: str) -> bool:
        ended = self.ended_at
        return self.opened_at is not None and self.opened_at <= at and (ended is None or at < ended)

    def resolution(self) -> str:
        """How its drift was codified, reverted or let stand, in words."""
        if self.opened_at is None:
            return "asked for, never confirmed: nothing was opened"
        ways = [f"{how} by proposal {pid}" if pid else how for pid, how, _ in self.settled_by]
        said = []
        if self.drifted:
            said.append(f"drift on {len(self.drifted)} resource(s): {_first(sorted(self.drifted))}")
        else:
            said.append("no drift recorded")
        if ways:
            said.append("; ".join(ways))
        if self.overdue_at:
            said.append(f"overdue since {self.overdue_at[:19]} (not codified by the deadline)")
        if self.acknowledged:
            by, at, note = self.acknowledged
            said.append(f"acknowledged by {by} at {at[:19]}: {note}")
        if self.settled_at:
            said.append(f"settled at {self.settled_at[:19]}")
        elif self.overdue_at and not self.acknowledged:
            said.append("NOT codified and not acknowledged")
        elif not self.overdue_at:
            said.append("not settled yet (codify due)")
        return "; ".join(said)


def _first(items: Sequence[str], shown: int = 3) -> str:
    more = f", and {len(items) - shown} more" if len(items) > shown else ""
    return ", ".join(items[:shown]) + more


def windows_of(events: Iterable[AuditEvent]) -> dict[int, Window]:
    """Every break-glass window the events tell of, by id, with its drift records and how each was closed."""
    windows: dict[int, Window] = {}
    records: dict[Any, int] = {}  # drift record -> its window
    for e in events:
        if not e.kind.startswith(("break_glass.", "drift.")):
            continue
        p = e.payload
        wid = p.get("break_glass")
        if e.kind.startswith("break_glass.") and isinstance(wid, int):
            w = windows.setdefault(wid, Window(wid, str(p.get("stack", "")), requested_at=e.at))
            w.seqs.append(e.seq)
            if e.kind in ("break_glass.requested", "break_glass.opened") and not w.asked_by:
                w.asked_by, w.reason = str(p.get("asked_by") or e.actor), str(p.get("reason", ""))
            if e.kind == "break_glass.opened":
                w.opened_at, w.ends_at = e.at, p.get("ends_at")
                w.confirmed_by = p.get("confirmed_by")
            elif e.kind == "break_glass.closed":
                w.closed_at = w.closed_at or e.at
            elif e.kind == "break_glass.settled":
                w.settled_at = e.at
            elif e.kind == "break_glass.overdue":
                w.overdue_at = e.at
                w.drifted.update(p.get("drifted") or ())
            elif e.kind == "break_glass.acknowledged":
                w.acknowledged = (e.actor, e.at, str(p.get("note", "")))
        elif e.kind in ("drift.opened", "drift.updated") and isinstance(wid, int) and wid in windows:
            records[p.get("record")] = wid
            windows[wid].drifted.update(p.get("drifted") or {})
            windows[wid].seqs.append(e.seq)
        elif e.kind == "drift.closed" and (isinstance(wid, int) or p.get("record") in records):
            w = windows.get(wid if isinstance(wid, int) else records[p.get("record")])
            if w is not None:
                reason = str(p.get("reason", ""))
                how = ("reverted" if "revert" in reason else "codified" if "codify" in reason
                       else "settled by a change" if e.proposal_id else "no drift left at a later check")
                w.settled_by.append((e.proposal_id, how, e.at))
                w.seqs.append(e.seq)
    return windows


@dataclass(frozen=True)
class Push:
    """A commit on main the gateway did not merge, and who acknowledged it."""

    sha: str
    author: str
    stacks: tuple[str, ...]
    at: str
    seq: int
    acknowledged: tuple[str, str, str, int] | None = None  # (by, at, reason, seq)


def pushes_of(events: Iterable[AuditEvent]) -> list[Push]:
    """Every commit on main the gateway did not merge that the events tell of, with its acknowledgement."""
    pushes: dict[str, Push] = {}
    for e in events:
        if not e.kind.startswith("main."):
            continue
        sha = str(e.payload.get("sha", ""))
        if e.kind == "main.pushed_outside":
            pushes[sha] = Push(sha, str(e.payload.get("author", "")), tuple(e.payload.get("stacks") or ()), e.at, e.seq)
        elif e.kind == "main.push_acknowledged" and sha in pushes:
            pushes[sha] = replace(pushes[sha], acknowledged=(e.actor, e.at, str(e.payload.get("reason", "")), e.seq))
    return list(pushes.values())
