"""A CloudFormation change set as Terraform's JSON plan, so preview, policy, risk and approvals are written once.

Each logical resource is an address `TYPE.LogicalId` (`AWS::S3::Bucket.Logs`). CloudFormation's actions map as
Terraform's do: Add → create, Modify → update, Remove → delete, Import → an import. CloudFormation's own answer
decides what it says: a replacement is `Replacement: True` or `Conditional` (never `False`), create-then-delete as
CloudFormation replaces, with the properties its `Details` name as `replace_paths`; what happens to the old
object is the change's `PolicyAction` (Retain: forgotten, not destroyed). Where the change set does not say
(an emulator), the templates do: a change to a property the resource's schema says is create-only is a
replacement, and `DeletionPolicy: Retain` (or, when replaced, `UpdateReplacePolicy: Retain`) forgets.
Both templates are the processed ones (macros and `Fn::ForEach` expanded), as CloudFormation plans them.

`before` and `after` are the current and proposed templates' properties with parameters resolved; a value is
sensitive where the resolver marks it secret, whatever functions it went through (template.py). Each change also
keeps CloudFormation's words under `gateway_cloudformation`: its action, replacement (True or Conditional),
policy action, and each detail's target, evaluation, change source and causing entity (never a value).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.adapters.engines.cloudformation.template import (
    NO_VALUE,
    Resolver,
    Secret,
    Unknown,
    plain,
)

PLAN_FORMAT = "1.2"
CreateOnly = Callable[[str], frozenset[str]]  # resource type -> its create-only top-level properties
RETAINED = ("Retain", "RetainExceptOnCreate")
CONDITIONAL = "replace_conditionally"  # action_reason of a replacement CloudFormation decides when it runs
_ABSENT = object()


@dataclass(frozen=True)
class _Side:
    """A resource's properties in one template: as resolved, as shown, and their unknown and sensitive marks."""

    resolved: Mapping[str, Any]
    values: Any
    unknown: Any
    sensitive: Any


def change_set_plan(changes: Sequence[Mapping[str, Any]], current: Resolver | None, proposed: Resolver,
                    secret_parameters: Collection[str], create_only: CreateOnly,
                    drift: Sequence[Mapping[str, Any]] = (), notices: Sequence[str] = (),
                    about: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The Terraform JSON plan of a change set's `Changes` (every page), read beside both (processed) templates."""
    secret = frozenset(secret_parameters)
    proposed = dataclasses.replace(proposed, secret=proposed.secret | secret)
    current = dataclasses.replace(current, secret=current.secret | secret) if current is not None else None
    resource_changes = []
    seen = set()
    for entry in changes:
        change = entry.get("ResourceChange") if entry.get("Type", "Resource") == "Resource" else None
        if not isinstance(change, Mapping):
            continue
        logical, rtype = str(change["LogicalResourceId"]), str(change["ResourceType"])
        seen.add(logical)
        resource_changes.append(_resource_change(change, logical, rtype, current, proposed, create_only))
    for logical, resource in sorted(proposed.template.resources.items()):  # unchanged resources, as no-ops
        if logical in seen or current is None or logical not in current.template.resources:
            continue
        side = _side(proposed, logical)
        resource_changes.append(_entry(logical, str(resource.get("Type", "")), ["no-op"], side, side))
    document: dict[str, Any] = {
        "format_version": PLAN_FORMAT,
        "gateway_engine": "cloudformation (change set)",
        "resource_changes": resource_changes,
        "resource_drift": [_drift_entry(d) for d in drift if d.get("StackResourceDriftStatus") in ("MODIFIED", "DELETED")],
        "configuration": {"root_module": {"resources": [
            {"address": f"{r.get('Type')}.{logical}", "mode": "managed", "type": str(r.get("Type")), "name": logical,
             "expressions": _expressions(r.get("Properties") or {}),
             **({"deletion_policy": r["DeletionPolicy"]} if "DeletionPolicy" in r else {})}
            for logical, r in sorted(proposed.template.resources.items())]}},
        "variables": {name: {"value": value} for name, value in sorted(proposed.parameters.items())
                      if name not in proposed.secret},
    }
    if notices:
        document["gateway_notices"] = list(notices)
    if about:
        document["gateway_cloudformation"] = dict(about)
    return document


def _resource_change(change: Mapping[str, Any], logical: str, rtype: str, current: Resolver | None,
                     proposed: Resolver, create_only: CreateOnly) -> dict[str, Any]:
    action, policy = change.get("Action"), change.get("PolicyAction")
    before = _side(current, logical) if current is not None and logical in current.template.resources else None
    after = _side(proposed, logical) if logical in proposed.template.resources else None
    if action == "Add":
        entry = _entry(logical, rtype, ["create"], None, after)
    elif action == "Remove":
        retained = policy == "Retain" if policy else _policy(current, logical, "DeletionPolicy") in RETAINED
        entry = _entry(logical, rtype, ["forget" if retained else "delete"], before, None)
        entry["action_reason"] = "delete_because_no_resource_config"
    elif action == "Import":
        entry = _entry(logical, rtype, ["no-op"], after, after)
        entry["change"]["importing"] = {"id": str(change.get("PhysicalResourceId") or logical)}
    else:
        entry = _modify(change, logical, rtype, (current, proposed), before, after, create_only(rtype))
    entry["gateway_cloudformation"] = _said(change)
    return entry


def _modify(change: Mapping[str, Any], logical: str, rtype: str, templates: tuple[Resolver | None, Resolver],
            before: _Side | None, after: _Side | None, create_only: frozenset[str]) -> dict[str, Any]:
    replaced, forcing = _replacement(change, before, after, create_only)
    if not replaced:
        return _entry(logical, rtype, ["update"], before, after)
    policy = change.get("PolicyAction")
    # without CloudFormation's word, the old object is kept only if both templates say so (the deployed one and
    # the one being applied): a policy changed in the same update is not trusted to save it
    retained = policy == "ReplaceAndRetain" if policy else all(
        _policy(t, logical, "UpdateReplacePolicy") == "Retain" for t in templates)
    entry = _entry(logical, rtype, ["create", "forget" if retained else "delete"], before, after)
    entry["change"]["replace_paths"] = [[p] for p in forcing]
    conditional = change.get("Replacement") == "Conditional"
    entry["action_reason"] = CONDITIONAL if conditional else "replace_because_cannot_update"
    return entry


def _replacement(change: Mapping[str, Any], before: _Side | None, after: _Side | None,
                 create_only: frozenset[str]) -> tuple[bool, list[str]]:
    """Whether the change replaces the resource, and the properties that force it.

    CloudFormation's `Replacement` wins when it gives one, with the properties its `Details` say recreate. Without
    it (moto gives none), the resource schema's create-only properties that are known to differ: a value the
    gateway cannot know on the deployed side (a NoEcho parameter DescribeStacks shows as `****`) is not."""
    named = sorted({str(d["Target"]["Name"]) for d in change.get("Details") or ()
                    if isinstance(d, Mapping) and isinstance(d.get("Target"), Mapping) and d["Target"].get("Name")
                    and d["Target"].get("RequiresRecreation") in ("Always", "Conditionally")})
    answer = change.get("Replacement")
    if answer in ("True", "Conditional", "False"):
        return answer != "False", named
    old = before.resolved if before is not None else {}
    new = after.resolved if after is not None else {}
    differing = {p for p in create_only if _known_to_differ(old.get(p, _ABSENT), new.get(p, _ABSENT))}
    return bool(named or differing), sorted(set(named) | differing)


def _known_to_differ(old: Any, new: Any) -> bool:
    if old is _ABSENT and new is _ABSENT:
        return False
    if _holds_unknown(old):  # what is deployed is not known: only CloudFormation can say
        return False
    return bool(plain(old) != plain(new))


def _holds_unknown(value: Any) -> bool:
    if isinstance(value, Secret):
        return _holds_unknown(value.value)
    if isinstance(value, Unknown):
        return True
    if isinstance(value, Mapping):
        return any(_holds_unknown(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_unknown(v) for v in value)
    return False


def _said(change: Mapping[str, Any]) -> dict[str, Any]:
    """What CloudFormation said of a change, without a value (Details' before and after values are left out)."""
    said: dict[str, Any] = {k: change[key] for key, k in (("Action", "action"), ("Replacement", "replacement"),
                                                          ("PolicyAction", "policy_action"), ("Scope", "scope"))
                            if change.get(key) is not None}
    details = []
    for detail in change.get("Details") or ():
        if not isinstance(detail, Mapping):
            continue
        target = detail.get("Target") if isinstance(detail.get("Target"), Mapping) else {}
        details.append({k: v for k, v in (
            ("attribute", target.get("Attribute")), ("name", target.get("Name")), ("path", target.get("Path")),
            ("requires_recreation", target.get("RequiresRecreation")),
            ("attribute_change_type", target.get("AttributeChangeType")), ("evaluation", detail.get("Evaluation")),
            ("change_source", detail.get("ChangeSource")), ("causing_entity", detail.get("CausingEntity")))
            if v is not None})
    if details:
        said["details"] = details
    return said


def _side(resolver: Resolver | None, logical: str) -> _Side:
    assert resolver is not None
    resolved = resolver.properties(logical)
    return _Side(resolved if isinstance(resolved, Mapping) else {}, _known(resolved), _unknown_marks(resolved),
                 _sensitive_marks(resolved) or False)


def _entry(logical: str, rtype: str, actions: list[str], before: _Side | None, after: _Side | None) -> dict[str, Any]:
    change: dict[str, Any] = {"actions": actions, "before": None, "after": None, "after_unknown": {},
                              "before_sensitive": False, "after_sensitive": False}
    if before is not None:
        change["before"], change["before_sensitive"] = before.values, before.sensitive
    if after is not None:
        change["after"], change["after_unknown"] = after.values, after.unknown
        change["after_sensitive"] = after.sensitive
    return {"address": f"{rtype}.{logical}", "mode": "managed", "type": rtype, "name": logical,
            "provider_name": "registry.cloudformation/aws", "change": change}


def _known(value: Any) -> Any:
    """The value as shown: unknowns left out (a secret not known stays, as null, so its mask has a place)."""
    if isinstance(value, Secret):
        return None if isinstance(value.value, Unknown) else _known(value.value)
    if isinstance(value, Unknown) or value is NO_VALUE:
        return None
    if isinstance(value, Mapping):
        return {k: _known(v) for k, v in value.items() if not isinstance(v, Unknown)}
    if isinstance(value, list):
        return [_known(v) for v in value]
    return value


def _unknown_marks(value: Any) -> Any:
    if isinstance(value, Secret):
        return _unknown_marks(value.value)
    if isinstance(value, Unknown):
        return True
    if isinstance(value, Mapping):
        marks = {k: _unknown_marks(v) for k, v in value.items()}
        return {k: m for k, m in marks.items() if m not in (False, {}, [])}
    if isinstance(value, list):
        marks_list = [_unknown_marks(v) for v in value]
        return marks_list if any(m not in (False, {}, []) for m in marks_list) else []
    return False


def _sensitive_marks(value: Any) -> Any:
    """True where the resolved value is secret by origin, in the value's own shape."""
    if isinstance(value, Secret):
        return True
    if isinstance(value, Mapping):
        marks = {k: _sensitive_marks(v) for k, v in value.items()}
        return {k: m for k, m in marks.items() if m is not False} or False
    if isinstance(value, list):
        marks_list = [_sensitive_marks(v) for v in value]
        return marks_list if any(m is not False for m in marks_list) else False
    return False


def _policy(resolver: Resolver | None, logical: str, key: str) -> str | None:
    if resolver is None:
        return None
    resource = resolver.template.resources.get(logical)
    return str(resource.get(key)) if isinstance(resource, Mapping) and resource.get(key) else None


def _expressions(properties: Any) -> dict[str, Any]:
    """The template's properties as Terraform's `configuration` expressions: literals as constant values, intrinsic
    functions kept as written (a policy reading the configuration sees what the template says)."""
    if not isinstance(properties, Mapping):
        return {}
    return {k: ({"constant_value": v} if not isinstance(v, Mapping) or len(v) != 1 or not _intrinsic(v)
                else {"cloudformation": v}) for k, v in properties.items()}


def _intrinsic(node: Mapping[str, Any]) -> bool:
    name = next(iter(node))
    return name == "Ref" or name.startswith("Fn::") or name == "Condition"


def _drift_entry(drift: Mapping[str, Any]) -> dict[str, Any]:
    """A resource CloudFormation found changed outside it, as Terraform's `resource_drift`."""
    logical, rtype = str(drift["LogicalResourceId"]), str(drift["ResourceType"])
    expected = json.loads(drift.get("ExpectedProperties") or "{}")
    actual = json.loads(drift.get("ActualProperties") or "{}") if drift["StackResourceDriftStatus"] != "DELETED" else None
    actions = ["delete"] if actual is None else ["update"]
    return {"address": f"{rtype}.{logical}", "mode": "managed", "type": rtype, "name": logical,
            "provider_name": "registry.cloudformation/aws",
            "change": {"actions": actions, "before": expected, "after": actual, "after_unknown": {},
                       "before_sensitive": False, "after_sensitive": False}}
