"""A CloudFormation change set as Terraform's JSON plan, so preview, policy, risk and approvals are written once.

Each logical resource is an address `TYPE.LogicalId` (`AWS::S3::Bucket.Logs`). CloudFormation's actions map as
Terraform's do: Add → create, Modify → update, Remove → delete, Import → an import; a replacement
(`Replacement: True` or `Conditional`, or a change to a property the resource's schema says is create-only)
is create-then-delete, as CloudFormation replaces, with those properties as `replace_paths`. A resource kept by
`DeletionPolicy: Retain` (or, when replaced, `UpdateReplacePolicy: Retain`) is forgotten, not destroyed.
`before` and `after` are the current and proposed templates' properties with parameters resolved; values from
NoEcho parameters, from the gateway's secrets and from dynamic references (`{{resolve:secretsmanager:...}}`)
are sensitive by origin.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from gateway.adapters.cloudformation.template import (
    NO_VALUE,
    Resolver,
    Unknown,
    has_dynamic_reference,
)

PLAN_FORMAT = "1.2"
CreateOnly = Callable[[str], frozenset[str]]  # resource type -> its create-only top-level properties


def change_set_plan(changes: Sequence[Mapping[str, Any]], current: Resolver | None, proposed: Resolver,
                    secret_parameters: Collection[str], create_only: CreateOnly,
                    drift: Sequence[Mapping[str, Any]] = (), notices: Sequence[str] = (),
                    about: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The Terraform JSON plan of a change set's `Changes` (every page), read beside both templates."""
    resource_changes = []
    seen = set()
    for entry in changes:
        change = entry.get("ResourceChange") if entry.get("Type", "Resource") == "Resource" else None
        if not isinstance(change, Mapping):
            continue
        logical, rtype = str(change["LogicalResourceId"]), str(change["ResourceType"])
        seen.add(logical)
        resource_changes.append(_resource_change(change, logical, rtype, current, proposed, secret_parameters,
                                                 create_only))
    for logical, resource in sorted(proposed.template.resources.items()):  # unchanged resources, as no-ops
        if logical in seen or current is None or logical not in current.template.resources:
            continue
        rtype = str(resource.get("Type", ""))
        values = _side(proposed, logical, secret_parameters)
        resource_changes.append(_entry(logical, rtype, ["no-op"], values, values))
    document: dict[str, Any] = {
        "format_version": PLAN_FORMAT,
        "gateway_engine": "cloudformation (change set)",
        "resource_changes": resource_changes,
        "resource_drift": [_drift_entry(d) for d in drift if d.get("StackResourceDriftStatus") in ("MODIFIED", "DELETED")],
        "configuration": {"root_module": {"resources": [
            {"address": f"{r.get('Type')}.{logical}", "mode": "managed", "type": str(r.get("Type")), "name": logical,
             "expressions": _expressions(r.get("Properties") or {}),
             **({"deletion_policy": r["DeletionPolicy"]} if "DeletionPolicy" in r else {})}
            for logical, r in sorted(proposed.template.resources.items()) if isinstance(r, Mapping)]}},
        "variables": {name: {"value": value} for name, value in sorted(proposed.parameters.items())
                      if name not in secret_parameters},
    }
    if notices:
        document["gateway_notices"] = list(notices)
    if about:
        document["gateway_cloudformation"] = dict(about)
    return document


def _resource_change(change: Mapping[str, Any], logical: str, rtype: str, current: Resolver | None,
                     proposed: Resolver, secret: Collection[str], create_only: CreateOnly) -> dict[str, Any]:
    action = change.get("Action")
    before = _side(current, logical, secret) if current is not None and logical in current.template.resources else None
    after = _side(proposed, logical, secret) if logical in proposed.template.resources else None
    if action == "Add":
        return _entry(logical, rtype, ["create"], None, after)
    if action == "Remove":
        retained = _policy(current, logical, "DeletionPolicy") in ("Retain", "RetainExceptOnCreate")
        entry = _entry(logical, rtype, ["forget" if retained else "delete"], before, None)
        entry["action_reason"] = "delete_because_no_resource_config"
        return entry
    if action == "Import":
        entry = _entry(logical, rtype, ["no-op"], after, after)
        entry["change"]["importing"] = {"id": str(change.get("PhysicalResourceId") or logical)}
        return entry
    forcing = _forcing_paths(change, before, after, create_only(rtype))
    if change.get("Replacement") in ("True", "Conditional") or forcing:
        retained = _policy(current, logical, "UpdateReplacePolicy") == "Retain"
        entry = _entry(logical, rtype, ["create", "forget" if retained else "delete"], before, after)
        entry["change"]["replace_paths"] = [[p] for p in forcing] or [[]]
        entry["action_reason"] = "replace_because_cannot_update"
        return entry
    return _entry(logical, rtype, ["update"], before, after)


def _forcing_paths(change: Mapping[str, Any], before: Any, after: Any, create_only: frozenset[str]) -> list[str]:
    """The properties whose change forces a replacement: CloudFormation's `Details` when it gives them (moto does
    not), and always the resource schema's create-only properties that differ."""
    named = {str(d["Target"]["Name"]) for d in change.get("Details") or ()
             if isinstance(d, Mapping) and isinstance(d.get("Target"), Mapping)
             and d["Target"].get("RequiresRecreation") in ("Always", "Conditionally") and d["Target"].get("Name")}
    old = before[0] if isinstance(before, tuple) else {}
    new = after[0] if isinstance(after, tuple) else {}
    differing = {p for p in create_only if old.get(p) != new.get(p) and (p in old or p in new)}
    return sorted(named | differing)


def _side(resolver: Resolver | None, logical: str, secret: Collection[str]) -> tuple[dict[str, Any], Any, Any]:
    """(values, unknown marks, sensitive marks) of a resource's properties in one template."""
    assert resolver is not None
    raw = (resolver.template.resources.get(logical) or {}).get("Properties") or {}
    values = resolver.properties(logical)
    return _known(values), _unknown_marks(values), _sensitive_marks(raw, secret)


def _entry(logical: str, rtype: str, actions: list[str], before: Any, after: Any) -> dict[str, Any]:
    change: dict[str, Any] = {"actions": actions, "before": None, "after": None, "after_unknown": {},
                              "before_sensitive": False, "after_sensitive": False}
    if before is not None:
        change["before"], _, change["before_sensitive"] = before
    if after is not None:
        change["after"], change["after_unknown"], change["after_sensitive"] = after
    return {"address": f"{rtype}.{logical}", "mode": "managed", "type": rtype, "name": logical,
            "provider_name": "registry.cloudformation/aws", "change": change}


def _known(value: Any) -> Any:
    if isinstance(value, Unknown) or value is NO_VALUE:
        return None
    if isinstance(value, Mapping):
        return {k: _known(v) for k, v in value.items() if not isinstance(v, Unknown)}
    if isinstance(value, list):
        return [_known(v) for v in value]
    return value


def _unknown_marks(value: Any) -> Any:
    if isinstance(value, Unknown):
        return True
    if isinstance(value, Mapping):
        marks = {k: _unknown_marks(v) for k, v in value.items()}
        return {k: m for k, m in marks.items() if m not in (False, {}, [])}
    if isinstance(value, list):
        marks_list = [_unknown_marks(v) for v in value]
        return marks_list if any(m not in (False, {}, []) for m in marks_list) else []
    return False


_SUB_NAMES = re.compile(r"\$\{([^}!.]+)\}")


def _sensitive_marks(raw: Any, secret: Collection[str]) -> Any:
    """True where a property's template node reads a secret parameter or a dynamic reference (by origin)."""
    if _reads_secret(raw, secret):
        return True
    if isinstance(raw, Mapping):
        marks = {k: _sensitive_marks(v, secret) for k, v in raw.items()}
        marks = {k: m for k, m in marks.items() if m not in (False, {}, [])}
        return marks or False
    if isinstance(raw, list):
        marks_list = [_sensitive_marks(v, secret) for v in raw]
        return marks_list if any(m not in (False, {}, []) for m in marks_list) else False
    return False


def _reads_secret(node: Any, secret: Collection[str]) -> bool:
    if isinstance(node, str):
        return has_dynamic_reference(node)
    if isinstance(node, Mapping) and len(node) == 1:
        (name, argument), = node.items()
        if name == "Ref":
            return argument in secret
        if name == "Fn::Sub":
            text = argument if isinstance(argument, str) else argument[0]
            return has_dynamic_reference(text) or any(n in secret for n in _SUB_NAMES.findall(str(text))) or (
                not isinstance(argument, str) and _reads_secret(argument[1], secret))
        if name.startswith("Fn::") or name == "Condition":
            return _reads_secret(argument, secret)
    if isinstance(node, list) and node and all(not isinstance(v, (Mapping, list)) for v in node):
        return any(_reads_secret(v, secret) for v in node)
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
