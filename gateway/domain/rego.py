"""Rego policies, as the core sees them: what they are given, and how what they say becomes findings.

Conftest's conventions: in each package, rules named `deny` and `violation` block (a deny finding, a
policy owner may override it), `warn` warns. A rule's value is a string (the message) or an object with
`msg`, an optional `id` (the finding's rule name) and an optional `address`. A policy that does not
parse, or fails while it is evaluated, is itself a deny finding naming the file and the error: nothing
is skipped in silence.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.domain.plan import iter_leaves, mask_at
from gateway.domain.policy import Finding, Severity

RULES = {"deny": Severity.DENY, "violation": Severity.DENY, "warn": Severity.WARN}
MASK = "(sensitive)"
MAX_MESSAGE = 500
_PACKAGE = re.compile(r"^\s*package\s+([A-Za-z_][\w.]*)", re.MULTILINE)
_RULE = re.compile(r"^\s*((?:deny|violation|warn)(?:_\w+)?|test_\w+)\b", re.MULTILINE)


@dataclass(frozen=True)
class RegoModule:
    path: str  # in the declaration repo, e.g. policies/s3.rego
    source: str

    @property
    def package(self) -> str | None:
        match = _PACKAGE.search(self.source)
        return match.group(1) if match else None

    @property
    def rules(self) -> frozenset[str]:
        """The conftest rules (and `test_` rules) the module defines."""
        return frozenset(_RULE.findall(self.source))


@dataclass(frozen=True)
class RegoPolicies:
    """Main's `policies/` at one commit: its Rego modules and the data beside them."""

    tree: str  # git tree id of policies/: the same id, the same policies (what the compiled set is cached by)
    modules: tuple[RegoModule, ...]
    data: Mapping[str, Any]

    @property
    def packages(self) -> dict[str, list[RegoModule]]:
        out: dict[str, list[RegoModule]] = {}
        for module in self.modules:
            if module.package:
                out.setdefault(module.package, []).append(module)
        return out

    def queries(self, packages: Sequence[str] | None) -> list[str]:
        """`data.PKG.RULE` for every conftest rule of the chosen packages (all of them when None)."""
        chosen = self.packages if packages is None else {p: m for p, m in self.packages.items() if p in packages}
        return sorted(f"data.{package}.{rule}" for package, modules in chosen.items()
                      for rule in set().union(*(m.rules for m in modules)) if severity_of(rule) is not None)

    def rule_lines(self, query: str) -> list[str]:
        """`path:line` of each definition of the rule `data.PKG.RULE` (a rule may be defined several times, in
        several files of its package); the package's files when no definition is found."""
        package, rule = query.removeprefix("data.").rsplit(".", 1)
        modules = self.packages.get(package, [])
        head = re.compile(rf"^[ \t]*{re.escape(rule)}\b", re.MULTILINE)
        found = [f"{m.path}:{m.source.count(chr(10), 0, match.start()) + 1}"
                 for m in modules for match in head.finditer(m.source)]
        return found or [m.path for m in modules]

    def located(self, query: str, error: str) -> str:
        """The interpreter's error, naming the file and line of the rule when the error does not: rego-cpp's
        runtime errors ("evaluation failed") and a crash of its process carry no location of their own."""
        if ".rego:" in error:
            return error
        where = ", ".join(self.rule_lines(query)) or "no module of its package"
        first, _, rest = error.strip().partition("\n")
        return f"{first or 'evaluation failed'} (rule {query.removeprefix('data.')} at {where})" + \
            (f"\n{rest}" if rest else "")

    def tests(self, packages: Sequence[str] | None) -> list[str]:
        chosen = self.packages if packages is None else {p: m for p, m in self.packages.items() if p in packages}
        return sorted(f"data.{package}.{rule}" for package, modules in chosen.items()
                      for rule in set().union(*(m.rules for m in modules)) if rule.startswith("test_"))


def severity_of(rule: str) -> Severity | None:
    """`deny`, `violation`, `warn`, and conftest's `deny_*` / `violation_*` / `warn_*`; other rules are helpers."""
    return next((severity for prefix, severity in RULES.items() if rule == prefix or rule.startswith(prefix + "_")),
                None)


def findings_from(stack: str, query: str, value: Any) -> list[Finding]:
    """What one rule's value says, as findings (`query` is `data.PKG.RULE`)."""
    package, rule = query.removeprefix("data.").rsplit(".", 1)
    severity = severity_of(rule)
    assert severity is not None
    items: list[Any]
    if value is None:
        items = []
    elif isinstance(value, Mapping):  # a partial set written the old way (`deny[msg] { ... }`): its keys
        items = [key for key, member in value.items() if member is True]
    elif isinstance(value, list):
        items = value
    else:
        items = [value]
    out = []
    for item in items:
        if isinstance(item, Mapping):
            message, rule_id = str(item.get("msg") or item.get("message") or item), item.get("id")
            address = str(item.get("address") or "(plan)")
        else:
            message, rule_id, address = str(item), None, "(plan)"
        out.append(Finding(str(rule_id or f"{package}.{rule}"), severity, address, message[:MAX_MESSAGE], stack))
    return sorted(set(out), key=lambda f: (f.rule, f.address, f.message))


def policy_error(stack: str, where: str, error: str) -> Finding:
    """A policy that cannot be evaluated denies: the gateway never plans on as if it had said nothing."""
    first = next((line.strip() for line in error.splitlines() if line.strip()), "unknown error")
    location = next((line.strip().removeprefix("-- ") for line in error.splitlines() if line.strip().startswith("--")
                     and ".rego:" in line), "")
    detail = f"{first} ({location})" if location else first
    return Finding("policy-error", Severity.DENY, where, f"the policy could not be evaluated: {detail}"[:MAX_MESSAGE],
                   stack)


def masked_input(document: Mapping[str, Any], secret_variables: frozenset[str]) -> dict[str, Any]:
    """The plan as the engine wrote it, with every value the plan marks sensitive replaced by a mask.

    Also masked: the values of variables that are secret by origin (the gateway supplies them, or main
    declares them sensitive), and sensitive outputs in the state and planned values.
    """
    out = dict(document)
    for key in ("resource_changes", "resource_drift"):
        out[key] = [_masked_change(rc) for rc in document.get(key) or []]
    out["output_changes"] = {name: _masked_change_body(change) for name, change in
                             (document.get("output_changes") or {}).items()}
    declared = _declared_sensitive(document)
    out["variables"] = {name: ({"value": MASK} if name in secret_variables | declared else value)
                        for name, value in (document.get("variables") or {}).items()}
    if isinstance(document.get("planned_values"), Mapping):
        out["planned_values"] = _masked_values(document["planned_values"])
    prior = document.get("prior_state")
    if isinstance(prior, Mapping) and isinstance(prior.get("values"), Mapping):  # a state: its values one level down
        out["prior_state"] = {**prior, "values": _masked_values(prior["values"])}
    return out


def _masked_change(rc: Mapping[str, Any]) -> dict[str, Any]:
    return {**rc, "change": _masked_change_body(rc.get("change") or {})}


def _masked_change_body(change: Mapping[str, Any]) -> dict[str, Any]:
    return {**change, "before": _mask(change.get("before"), change.get("before_sensitive")),
            "after": _mask(change.get("after"), change.get("after_sensitive"))}


def _mask(value: Any, sensitive: Any) -> Any:
    if sensitive is True:
        return MASK if value is not None else None
    if not sensitive or value is None:
        return value
    return _rebuild(value, {path for path, _ in iter_leaves(value) if mask_at(sensitive, path)})


def _rebuild(value: Any, masked: set[tuple[str | int, ...]], path: tuple[str | int, ...] = ()) -> Any:
    if path in masked:
        return MASK
    if isinstance(value, Mapping):
        return {k: _rebuild(v, masked, path + (k,)) for k, v in value.items()}
    if isinstance(value, list):
        return [_rebuild(v, masked, path + (i,)) for i, v in enumerate(value)]
    return value


def _masked_values(values: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(values)
    out["outputs"] = {name: ({**o, "value": MASK} if isinstance(o, Mapping) and o.get("sensitive") else o)
                      for name, o in (values.get("outputs") or {}).items()}
    if isinstance(values.get("root_module"), Mapping):
        out["root_module"] = _masked_module(values["root_module"])
    return out


def _masked_module(module: Mapping[str, Any]) -> dict[str, Any]:
    return {**module,
            "resources": [{**r, "values": _mask(r.get("values"), r.get("sensitive_values"))}
                          for r in module.get("resources") or []],
            "child_modules": [_masked_module(m) for m in module.get("child_modules") or []]}


def _declared_sensitive(document: Mapping[str, Any]) -> frozenset[str]:
    variables = (((document.get("configuration") or {}).get("root_module") or {}).get("variables") or {})
    return frozenset(name for name, v in variables.items() if isinstance(v, Mapping) and v.get("sensitive"))
