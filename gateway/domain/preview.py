"""What a person reads before approving: a plan rendered with destroys and drift-reverts first.

`build_preview` turns a Plan into a Preview, the one place where values are masked; the three
renderers only format it. Sensitive values print as `(sensitive)` and unknown ones as
`(known after apply)`, whatever `before`/`after` hold in clear.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.domain.plan import Change, ChangeKind, Plan, ResourceChange, format_path
from gateway.domain.policy import Finding
from gateway.domain.risk import Risk, RiskLevel

SENSITIVE = "(sensitive)"
UNKNOWN = "(known after apply)"

_UNKNOWN_RAW = object()  # compares unequal to every real value
# json.dumps(value, ensure_ascii=False), made once: dumps builds an encoder per call when given an option, and a big
# plan's preview writes one leaf text per attribute (a third of `gateway plan` of 2,001 resources went there)
_leaf_text = json.JSONEncoder(ensure_ascii=False).encode

DANGER_KINDS = frozenset({ChangeKind.DELETE, ChangeKind.REPLACE, ChangeKind.REPLACE_CREATE_FIRST})
# listed first, with the attribute that forces it: what destroys, and a replacement that keeps the old object
# (CloudFormation's UpdateReplacePolicy: Retain): a new, empty database in its place is no plain change
FIRST_KINDS = DANGER_KINDS | {ChangeKind.CREATE_FORGET}
MAY_REPLACE = "replace_conditionally"  # an engine's action_reason: it decides whether to replace when it runs

KIND_LABELS: dict[ChangeKind, str] = {
    ChangeKind.CREATE: "create",
    ChangeKind.UPDATE: "update in place",
    ChangeKind.DELETE: "delete",
    ChangeKind.REPLACE: "replace (destroy, then create)",
    ChangeKind.REPLACE_CREATE_FIRST: "replace (create, then destroy)",
    ChangeKind.FORGET: "forget (removed from state, object kept)",
    ChangeKind.CREATE_FORGET: "replace (create a new one; the old object is kept, no longer managed)",
    ChangeKind.READ: "read",
    ChangeKind.NO_OP: "no change",
}

SYMBOLS: dict[ChangeKind, str] = {
    ChangeKind.CREATE: "+",
    ChangeKind.UPDATE: "~",
    ChangeKind.DELETE: "-",
    ChangeKind.REPLACE: "-/+",
    ChangeKind.REPLACE_CREATE_FIRST: "+/-",
    ChangeKind.FORGET: ".",
    ChangeKind.CREATE_FORGET: "+/.",
    ChangeKind.READ: "<=",
    ChangeKind.NO_OP: "=",  # listed only when the resource moves or is imported
}

_REASONS = {
    "replace_because_tainted": "the object is tainted (a previous apply failed part way)",
    "replace_by_request": "replacement was requested explicitly",
    "replace_by_triggers": "a replace_triggered_by reference changed",
    "delete_because_no_resource_config": "removed from the configuration",
    "delete_because_wrong_repetition": "count/for_each was added or removed",
    "delete_because_count_index": "count no longer includes this index",
    "delete_because_each_key": "for_each no longer includes this key",
    "delete_because_no_module": "its module was removed from the configuration",
    "delete_because_no_move_target": "a moved block points at an address with no configuration",
}


@dataclass(frozen=True)
class AttributeDiff:
    path: str
    before: str | None  # display text; None when the side does not exist
    after: str | None


@dataclass(frozen=True)
class ResourceEntry:
    address: str
    kind: ChangeKind
    label: str
    reason: str | None
    attributes: tuple[AttributeDiff, ...]
    previous_address: str | None = None
    importing_id: str | None = None

    @property
    def destroys(self) -> bool:
        """Whether the change destroys an object (a delete or either replace)."""
        return self.kind in DANGER_KINDS

    @property
    def first(self) -> bool:
        """Whether a person reads it before the other changes: it destroys, or replaces what it keeps."""
        return self.kind in FIRST_KINDS


@dataclass(frozen=True)
class DriftEntry:
    address: str
    summary: str
    reverted_by_apply: bool
    attributes: tuple[AttributeDiff, ...]  # before = what the gateway recorded, after = reality now


@dataclass(frozen=True)
class OpenDrift:
    """An open drift record as a proposal's preview shows it, first: what the apply would revert, what it keeps."""

    record_id: int
    since: str  # ISO time the record was opened
    expected: bool
    reverts: tuple[DriftEntry, ...]
    keeps: tuple[DriftEntry, ...]
    unseen: tuple[DriftEntry, ...] = ()  # recorded after the plan: it cannot say; the apply refuses and re-plans


@dataclass(frozen=True)
class ModuleVersion:
    """A remote module the plan was made with (its `gateway_modules` pin): what an approval also approves."""

    key: str
    source: str  # without a URL's user, password or query other than `ref` (a branch may write a token there)
    version: str  # a registry version, a git commit, or "" for an HTTP archive (then `digest` tells it)
    digest: str = ""

    @property
    def shown(self) -> str:
        if re.fullmatch(r"[0-9a-f]{40}", self.version):
            return f"{self.key} {self.source} @{self.version[:12]}"
        return f"{self.key} {self.source} {self.version or self.digest[:19]}".rstrip()


@dataclass(frozen=True)
class Preview:
    engine: str
    counts: Mapping[str, int]
    danger: tuple[ResourceEntry, ...]
    drift: tuple[DriftEntry, ...]
    changes: tuple[ResourceEntry, ...]
    outputs: tuple[AttributeDiff, ...]
    risk: Risk | None = None
    findings: tuple[Finding, ...] = ()
    open_drift: tuple[OpenDrift, ...] = ()  # the stack's open drift record, shown first (added when read)
    notices: tuple[str, ...] = ()  # what a person must read first: a rollback's target and what it destroys, an import's proof
    modules: tuple[ModuleVersion, ...] = ()  # the remote modules' resolved pins, by key

    @property
    def has_changes(self) -> bool:
        return bool(self.changes or self.outputs)


def build_preview(plan: Plan, engine: str | None = None, findings: tuple[Finding, ...] = (),
                  risk: Risk | None = None) -> Preview:
    """Mask, classify and order a plan for a person (with its policy findings and risk, if judged)."""
    changes = tuple(_entry(rc) for rc in plan.changes)
    imports = tuple(_import_notice(e) for e in changes if e.importing_id)
    return Preview(
        engine=engine or _engine_label(plan),
        counts={**{kind.value: n for kind, n in plan.counts().items()}, **plan.moves_and_imports()},
        danger=tuple(e for e in changes if e.first),
        drift=tuple(_drift_entry(d, plan.find(d.address)) for d in plan.resource_drift),
        changes=changes,
        outputs=tuple(
            diff
            for name, ch in sorted(plan.output_changes.items())
            if ch.kind != ChangeKind.NO_OP
            for diff in _output_diffs(name, ch)
        ),
        risk=risk,
        findings=tuple(findings),
        notices=imports + _engine_notices(plan),
        modules=module_versions(plan.raw),
    )


def module_versions(document: Mapping[str, Any]) -> tuple[ModuleVersion, ...]:
    """The pins a plan document carries under `gateway_modules` (adapters/modules/installer.py writes them)."""
    pins = document.get("gateway_modules")
    if not isinstance(pins, list):
        return ()
    return tuple(sorted((ModuleVersion(str(p.get("key", "")), _shown_source(str(p.get("source", ""))),
                                       str(p.get("version", "")), str(p.get("digest", "")))
                         for p in pins if isinstance(p, Mapping)), key=lambda m: m.key))


def _shown_source(source: str) -> str:
    """A source address without credentials: no `user:password@`, no query parameter but `ref`."""
    source = re.sub(r"(://)[^/@?#]*@", r"\1", source)
    base, sep, query = source.partition("?")
    kept = "&".join(q for q in query.split("&") if q.startswith("ref="))
    return base + (f"?{kept}" if sep and kept else "")


def _engine_notices(plan: Plan) -> tuple[str, ...]:
    """What the engine says the plan could not see (e.g. drift it could not check), shown first."""
    notices = plan.raw.get("gateway_notices")
    return tuple(str(n) for n in notices) if isinstance(notices, list) else ()


def _import_notice(e: ResourceEntry) -> str:
    if e.kind == ChangeKind.NO_OP:
        return (f"imports {e.address} (id {e.importing_id}) with zero diff: the plan shows the import and no other "
                "change for that address")
    return (f"imports {e.address} (id {e.importing_id}) but NOT with zero diff: the plan would also change it "
            f"({e.label}): {', '.join(a.path for a in e.attributes) or 'the object'}")


def _engine_label(plan: Plan) -> str:
    engine = plan.raw.get("gateway_engine")
    if engine:
        return str(engine)
    return f"terraform {plan.terraform_version}" if plan.terraform_version else "terraform"


# --- masking -------------------------------------------------------------------------------


def masked_leaves(value: Any, sensitive: Any, unknown: Any = False) -> dict[str, tuple[str, Any]]:
    """Flatten a value to {path: (display text, raw value for comparison)}, masks applied."""
    out: dict[str, tuple[str, Any]] = {}
    _walk(value, sensitive, unknown, "", out)
    return out


def _walk(value: Any, sens: Any, unk: Any, key: str, out: dict) -> None:
    """Add the leaves under `key` (its path, as `format_path` writes it) to `out`."""
    if sens is True:
        out[key] = (SENSITIVE, value)
        return
    if unk is True:
        out[key] = (UNKNOWN, _UNKNOWN_RAW)
        return
    if _is_mapping(value) or value is None and _is_mapping(unk):
        value = value or {}
        names = list(value) + [k for k in (unk if _is_mapping(unk) else {}) if k not in value]
        if not names:
            out[key] = ("{}", {})
        for name in names:
            _walk(value.get(name), _sub(sens, name), _sub(unk, name), f"{key}.{name}" if key else name, out)
    elif isinstance(value, list):
        length = max(len(value), len(unk) if isinstance(unk, list) else 0)
        if not length:
            out[key] = ("[]", [])
        for i in range(length):
            item = value[i] if i < len(value) else None
            _walk(item, _sub(sens, i), _sub(unk, i), f"{key}[{i}]", out)
    elif value is not None:
        out[key] = (_leaf_text(value), value)


def _is_mapping(value: Any) -> bool:
    return type(value) is dict or isinstance(value, Mapping)  # a plan's JSON is dicts: no ABC check for them


def _sub(mask: Any, step: str | int) -> Any:
    if mask is False:
        return False
    if _is_mapping(mask) and isinstance(step, str):
        return mask.get(step, False)
    if isinstance(mask, list) and isinstance(step, int) and step < len(mask):
        return mask[step]
    return False


def _attribute_diffs(change: Change) -> tuple[AttributeDiff, ...]:
    before = masked_leaves(change.before, change.before_sensitive) if change.before is not None else {}
    after = (
        masked_leaves(change.after, change.after_sensitive, change.after_unknown)
        if change.after is not None or change.after_unknown not in (False, None)
        else {}
    )
    if change.kind in (ChangeKind.DELETE, ChangeKind.FORGET):
        return ()  # the whole object goes (or is let go); listing every attribute hides the point
    diffs = []
    for path in sorted(set(before) | set(after), key=_path_sort_key):
        b, a = before.get(path), after.get(path)
        if b is not None and a is not None and b[1] == a[1] and a[1] is not _UNKNOWN_RAW:
            continue
        if not path and all(side is None or side[0] == "{}" for side in (b, a)):
            continue  # an object with no attributes at all: nothing to list, not a line ` = {}`
        diffs.append(AttributeDiff(path, b[0] if b else None, a[0] if a else None))
    return tuple(diffs)


def _path_sort_key(path: str) -> tuple:
    return (path.count(".") + path.count("["), path)


# --- entries ---------------------------------------------------------------------------------


def _entry(rc: ResourceChange) -> ResourceEntry:
    importing = rc.change.importing or {}
    label = KIND_LABELS[rc.kind]
    if rc.kind == ChangeKind.NO_OP:  # listed only when it moves or is imported: say which, not "no change"
        label = "imported, nothing else changes" if rc.change.importing is not None else "moved, nothing else changes"
    return ResourceEntry(
        address=rc.address,
        kind=rc.kind,
        label=label,
        reason=danger_reason(rc) if rc.kind in FIRST_KINDS else None,
        attributes=_attribute_diffs(rc.change),
        previous_address=rc.previous_address,
        importing_id=str(importing["id"]) if "id" in importing else None,
    )


def danger_reason(rc: ResourceChange) -> str:
    """Why a resource is destroyed or replaced, in words."""
    paths = [p for p in rc.change.replace_paths if p]
    if paths:
        names = ", ".join(f"`{format_path(p)}`" for p in paths)
        if rc.action_reason == MAY_REPLACE:
            return f"{names} may force replacement (the engine decides when it runs)"
        verb = "forces" if len(paths) == 1 else "force"
        return f"{names} {verb} replacement"
    if rc.action_reason in _REASONS:
        return _REASONS[rc.action_reason]
    if rc.action_reason == "replace_because_cannot_update":
        return "an attribute that cannot be updated in place changed"
    if rc.action_reason == MAY_REPLACE:
        return "it may be replaced (the engine decides when it runs)"
    return "the engine gave no reason"


def _drift_entry(drift: ResourceChange, planned: ResourceChange | None) -> DriftEntry:
    if drift.kind == ChangeKind.DELETE:
        recreated = planned is not None and "create" in planned.change.actions
        return DriftEntry(
            address=drift.address,
            summary="deleted outside the gateway"
            + ("; this apply creates it again" if recreated else ""),
            reverted_by_apply=recreated,
            attributes=(),
        )
    drifted = _attribute_diffs(drift.change)
    reverted = False
    if planned is not None and planned.kind not in (ChangeKind.NO_OP, ChangeKind.READ):
        planned_after = masked_leaves(
            planned.change.after, planned.change.after_sensitive, planned.change.after_unknown
        )
        reality = masked_leaves(drift.change.after, drift.change.after_sensitive)
        reverted = any(
            path in reality and planned_after.get(path, (None, None))[1] != reality[path][1]
            for path in (d.path for d in drifted)
        )
    summary = "changed outside the gateway; " + (
        "this apply would revert it" if reverted else "this apply keeps it"
    )
    return DriftEntry(drift.address, summary, reverted, drifted)


def _output_diffs(name: str, change: Change) -> tuple[AttributeDiff, ...]:
    diffs = _attribute_diffs(change)
    return tuple(
        AttributeDiff(f"{name}{'.' if d.path and not d.path.startswith('[') else ''}{d.path}",
                      d.before, d.after)
        for d in diffs
    ) or (AttributeDiff(name, None, None),)


# --- renderers -------------------------------------------------------------------------------


def _count_line(preview: Preview) -> str:
    c = preview.counts
    replaced = c.get("replace", 0) + c.get("replace-create-first", 0)
    parts = [
        f"{c.get('create', 0)} to create",
        f"{c.get('update', 0)} to update",
        f"{replaced} to replace",
        f"{c.get('delete', 0)} to delete",
    ]
    for kind in ("forget", "create-forget"):
        if c.get(kind):
            parts.append(f"{c[kind]} to {kind}")
    if c.get("import"):
        parts.insert(0, f"{c['import']} to import")
    if c.get("moved"):
        parts.append(f"{c['moved']} moved")
    return ", ".join(parts)


UNSEEN = "the plan predates this drift (recorded after it): the apply refuses and re-plans"
NO_CHANGES = "No changes: the infrastructure matches the configuration."


def _open_drift_lines(preview: Preview) -> list[str]:
    """The stack's open drift record, before anything else: what this apply would silently undo."""
    lines = []
    for o in preview.open_drift:
        why = " (expected: made during a break-glass window; codify it)" if o.expected else ""
        lines.append(f"OPEN DRIFT on this stack (drift record {o.record_id}, since {o.since[:16]}){why}")
        if o.reverts:
            lines.append("  this apply would revert: " + "; ".join(_drift_summary(d) for d in o.reverts))
        if o.keeps:
            lines.append("  this apply keeps (the drift stays): " + "; ".join(_drift_summary(d) for d in o.keeps))
        if o.unseen:
            lines.append(f"  {UNSEEN}: " + "; ".join(_drift_summary(d) for d in o.unseen))
    lines += [f"NOTE: {n}" for n in preview.notices]
    return lines + [""] if lines else []


def _drift_summary(d: DriftEntry) -> str:
    attrs = ", ".join(f"{a.path}: now {a.after or '(unset)'}, declared {a.before or '(unset)'}" for a in d.attributes)
    return f"{d.address} ({attrs or d.summary})"


def _modules_line(preview: Preview) -> list[str]:
    return ["Modules: " + "; ".join(m.shown for m in preview.modules)] if preview.modules else []


def render_text(preview: Preview) -> str:
    first = _open_drift_lines(preview)
    if not preview.has_changes and not preview.drift:
        head = [*first, *_modules_line(preview), ""] if preview.modules else first
        return "\n".join(head) + NO_CHANGES + "\n"
    lines = first + [f"Plan ({preview.engine}): {_count_line(preview)}", *_modules_line(preview)]
    if preview.risk:
        lines.append(f"Risk: {preview.risk.level.value}" + (f" ({'; '.join(preview.risk.reasons[:3])})" if preview.risk.reasons else ""))
    lines.append("")
    if preview.danger:
        lines.append("DESTROYS AND REPLACEMENTS")
        for e in preview.danger:
            lines.append(f"  {SYMBOLS[e.kind]} {e.address}  {e.label}: {e.reason}")
        lines.append("")
    if preview.findings:
        lines.append("POLICY")
        lines.extend(f"  {f.severity.value.upper():4} {f.rule} {f.address}: {f.message}" for f in preview.findings)
        lines.append("")
    if preview.drift:
        lines.append("DRIFT (changed outside the gateway)")
        for d in preview.drift:
            lines.append(f"  ! {d.address}: {d.summary}")
            for a in d.attributes:
                lines.append(f"      {a.path}: {a.before or '(unset)'} (recorded) -> {a.after or '(unset)'} (now)")
        lines.append("")
    if preview.changes:
        lines.append("CHANGES")
        for e in preview.changes:
            lines.append(f"  {SYMBOLS[e.kind]} {e.address}  ({e.label})" + _entry_note(e))
            lines.extend(f"      {_diff_text(a)}" for a in e.attributes)
        lines.append("")
    if preview.outputs:
        lines.append("OUTPUTS")
        lines.extend(f"  {_diff_text(a)}" for a in preview.outputs)
        lines.append("")
    if not preview.has_changes:
        lines.append(NO_CHANGES)
    return "\n".join(lines).rstrip() + "\n"


def _entry_note(e: ResourceEntry) -> str:
    notes = []
    if e.previous_address:
        notes.append(f"moved from {e.previous_address}")
    if e.importing_id:
        notes.append(f"importing id {e.importing_id}")
    return f"  [{'; '.join(notes)}]" if notes else ""


def _diff_text(a: AttributeDiff) -> str:
    if a.before is None and a.after is None:
        return f"{a.path}"
    if a.before is None:
        return f"{a.path} = {a.after}"
    if a.after is None:
        return f"{a.path}: {a.before} -> (removed)"
    return f"{a.path}: {a.before} -> {a.after}"


def render_markdown(preview: Preview) -> str:
    first = []
    for o in preview.open_drift:
        why = " (expected: made during a break-glass window; codify it)" if o.expected else ""
        first += [f"> :warning: **Open drift on this stack** (drift record {o.record_id}, since {o.since[:16]}){why}", ">"]
        if o.reverts:
            first.append("> **this apply would revert:** " + "; ".join(f"`{_drift_summary(d)}`" for d in o.reverts))
        if o.keeps:
            first.append("> this apply keeps (the drift stays): " + "; ".join(f"`{_drift_summary(d)}`" for d in o.keeps))
        if o.unseen:
            first.append(f"> **{UNSEEN}:** " + "; ".join(f"`{_drift_summary(d)}`" for d in o.unseen))
        first.append("")
    for n in preview.notices:
        first += [f"> **Note:** {n}", ""]
    if not preview.has_changes and not preview.drift:
        head = [*first, *_modules_markdown(preview), ""] if preview.modules else first
        return "\n".join(head) + f"**{NO_CHANGES}**\n"
    lines = first + [f"### Plan ({preview.engine})", "", f"**{_count_line(preview)}**", ""]
    lines += _modules_markdown(preview)
    if preview.risk:
        lines += [f"**Risk: {preview.risk.level.value}**" + (f": {'; '.join(preview.risk.reasons[:3])}" if preview.risk.reasons else ""), ""]
    if preview.danger:
        lines += ["#### :warning: Destroys and replacements", ""]
        lines += [f"- `{SYMBOLS[e.kind]}` **`{e.address}`**: {e.label}. {e.reason}" for e in preview.danger]
        lines.append("")
    if preview.findings:
        lines += ["#### Policy", "", "| | rule | resource | finding |", "|---|---|---|---|"]
        lines += [f"| {'⛔ deny' if f.severity == 'deny' else '⚠️ warn'} | `{f.rule}` | `{f.address}` | {f.message} |"
                  for f in preview.findings]
        lines.append("")
    if preview.drift:
        lines += ["#### Drift (changed outside the gateway)", ""]
        for d in preview.drift:
            lines.append(f"- **`{d.address}`**: {d.summary}")
            lines += [f"  - `{a.path}`: {_md(a.before)} (recorded) → {_md(a.after)} (now)" for a in d.attributes]
        lines.append("")
    if preview.changes:
        lines += ["#### Changes", ""]
        for e in preview.changes:
            lines.append(f"<details><summary><code>{SYMBOLS[e.kind]} {e.address}</code> ({e.label}){_entry_note(e)}</summary>")
            lines += ["", "```diff"]
            lines += [_diff_markdown(a) for a in e.attributes] or ["  (no attribute changes)"]
            lines += ["```", "</details>", ""]
    if preview.outputs:
        lines += ["#### Outputs", ""]
        lines += [f"- `{_diff_text(a)}`" for a in preview.outputs]
    return "\n".join(lines).rstrip() + "\n"


def _modules_markdown(preview: Preview) -> list[str]:
    return ["Modules: " + "; ".join(f"`{m.shown}`" for m in preview.modules), ""] if preview.modules else []


def _md(text: str | None) -> str:
    return f"`{text}`" if text is not None else "(unset)"


def _diff_markdown(a: AttributeDiff) -> str:
    if a.before is None:
        return f"+ {a.path} = {a.after}"
    if a.after is None:
        return f"- {a.path} = {a.before}"
    return f"! {a.path}: {a.before} -> {a.after}"


def preview_to_json(preview: Preview) -> str:
    """The preview as stored with its plan and served as is: already masked, so safe at rest and cheap to read.

    The same document `render_json` prints, without the indentation.
    """
    return json.dumps(_public(preview), separators=(",", ":"), ensure_ascii=False, default=str)


def _public(preview: Preview) -> dict[str, Any]:
    """The preview as plain JSON values, each dataclass as a dict of its fields in order (what `asdict` gives, tuples
    left as tuples: JSON writes them as lists). Written out by hand: `asdict` deep-copies every leaf, and a big
    plan's preview has tens of thousands of them (tests/test_preview_json.py holds the two equal)."""
    risk = preview.risk
    return {
        "engine": preview.engine,
        "counts": dict(preview.counts),
        "danger": [_public_entry(e) for e in preview.danger],
        "drift": [_public_drift(d) for d in preview.drift],
        "changes": [_public_entry(e) for e in preview.changes],
        "outputs": _public_diffs(preview.outputs),
        "risk": None if risk is None else {"level": risk.level, "reasons": risk.reasons},
        "findings": [{"rule": f.rule, "severity": f.severity, "address": f.address, "message": f.message,
                      "stack": f.stack} for f in preview.findings],
        "open_drift": [{"record_id": o.record_id, "since": o.since, "expected": o.expected,
                        "reverts": [_public_drift(d) for d in o.reverts], "keeps": [_public_drift(d) for d in o.keeps],
                        "unseen": [_public_drift(d) for d in o.unseen]} for o in preview.open_drift],
        "notices": preview.notices,
        "modules": [{"key": m.key, "source": m.source, "version": m.version, "digest": m.digest}
                    for m in preview.modules],
        "has_changes": preview.has_changes,
        "summary": _count_line(preview) if preview.has_changes else NO_CHANGES,
    }


def _public_diffs(diffs: tuple[AttributeDiff, ...]) -> list[dict[str, Any]]:
    return [{"path": a.path, "before": a.before, "after": a.after} for a in diffs]


def _public_entry(e: ResourceEntry) -> dict[str, Any]:
    return {"address": e.address, "kind": e.kind, "label": e.label, "reason": e.reason,
            "attributes": _public_diffs(e.attributes), "previous_address": e.previous_address,
            "importing_id": e.importing_id}


def _public_drift(d: DriftEntry) -> dict[str, Any]:
    return {"address": d.address, "summary": d.summary, "reverted_by_apply": d.reverted_by_apply,
            "attributes": _public_diffs(d.attributes)}


def preview_from_json(text: str) -> Preview:
    """The inverse of `preview_to_json`."""
    return preview_from_data(json.loads(text))


def preview_from_data(data: Mapping[str, Any], changes: slice = slice(None), first: int | None = None) -> Preview:
    """A preview from its decoded JSON: `changes` keeps only a slice of the changes (a page of them), `first` only
    the first items of the destroys, the drift and the findings (a first screen); a big plan's preview is 80,000
    attribute lines, and a page needs fifty resources of them."""

    def diffs(items: list[dict[str, Any]]) -> tuple[AttributeDiff, ...]:
        return tuple(AttributeDiff(a["path"], a["before"], a["after"]) for a in items)

    def entries(items: list[dict[str, Any]]) -> tuple[ResourceEntry, ...]:
        return tuple(ResourceEntry(**{**e, "kind": ChangeKind(e["kind"]), "attributes": diffs(e["attributes"])})
                     for e in items)

    def drift_entries(items: list[dict[str, Any]]) -> tuple[DriftEntry, ...]:
        return tuple(DriftEntry(**{**d, "attributes": diffs(d["attributes"])}) for d in items)

    risk = data.get("risk")
    return Preview(
        engine=data["engine"], counts=data["counts"], danger=entries(data["danger"][:first]),
        drift=drift_entries(data["drift"][:first]),
        changes=entries(data["changes"][changes]), outputs=diffs(data["outputs"]),
        risk=Risk(RiskLevel(risk["level"]), tuple(risk["reasons"])) if risk else None,
        findings=tuple(Finding.from_json(f) for f in data.get("findings", [])[:first]),
        open_drift=tuple(OpenDrift(o["record_id"], o["since"], o["expected"], drift_entries(o["reverts"]),
                                   drift_entries(o["keeps"]), drift_entries(o.get("unseen", [])))
                          for o in data.get("open_drift", [])),
        notices=tuple(data.get("notices", [])),
        modules=tuple(ModuleVersion(**m) for m in data.get("modules", [])),
    )


def render_json(preview: Preview) -> str:
    return json.dumps(_public(preview), indent=2, ensure_ascii=False, default=str) + "\n"


RENDERERS = {"text": render_text, "markdown": render_markdown, "json": render_json}
