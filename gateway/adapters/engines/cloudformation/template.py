"""A CloudFormation template read as CloudFormation reads it, and its properties resolved for a preview.

Templates are YAML (with the short-form tags `!Ref`, `!Sub`, `!GetAtt`, ...) or JSON, parsed by cfn-lint's
decoder, the one AWS keeps. Resolving is for showing what a change does, never for deciding it: the change set
is CloudFormation's own answer. A value that depends on a resource (`!Ref Bucket`, `!GetAtt Role.Arn`) or on
anything this reader cannot know is *unknown*, as Terraform says "known after apply".

A value secret by origin (a NoEcho parameter, one the gateway supplies, a dynamic reference to Secrets Manager or
SSM SecureString) comes out of the resolver as `Secret`, and every function that takes one in gives one out
(`Fn::If`, `Fn::Join`, `Fn::Sub` and its variables, `Fn::Select`, `Fn::Split`, `Fn::FindInMap`, `Fn::Base64`...).
What the resolver cannot trace is secret when a secret could flow into it: a function it does not evaluate, or
one it cannot, over anything that names a secret.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.domain.errors import ConfigError
from gateway.domain.template_edit import TEMPLATE_NAMES

PARAMETER_NAMES = ("parameters.json",)
DYNAMIC_REFERENCE = re.compile(r"\{\{resolve:(secretsmanager|ssm-secure):")


class Unknown:
    """A value known only after the apply."""

    def __repr__(self) -> str:
        return "(known after apply)"


UNKNOWN = Unknown()
NO_VALUE = object()  # AWS::NoValue: the property is left out


@dataclass(frozen=True)
class Secret:
    """A resolved value that is secret by origin (it may itself be unknown, or a list)."""

    value: Any


def secret(value: Any) -> Any:
    """`value` marked secret (once; AWS::NoValue stays what it is: the property is left out)."""
    return value if isinstance(value, Secret) or value is NO_VALUE else Secret(value)


def revealed(value: Any) -> tuple[Any, bool]:
    """The value under one Secret mark, and whether it had one."""
    return (value.value, True) if isinstance(value, Secret) else (value, False)


def holds_secret(value: Any) -> bool:
    """Whether a resolved value is, or contains, a secret."""
    if isinstance(value, Secret):
        return True
    if isinstance(value, Mapping):
        return any(holds_secret(v) for v in value.values())
    if isinstance(value, list):
        return any(holds_secret(v) for v in value)
    return False


def plain(value: Any) -> Any:
    """The value with every Secret mark taken off (for comparing two sides, never for showing)."""
    if isinstance(value, Secret):
        return plain(value.value)
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


@dataclass(frozen=True)
class Template:
    body: str  # exactly what CloudFormation is given
    document: Mapping[str, Any]
    file: str

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.body.encode()).hexdigest()

    @property
    def resources(self) -> Mapping[str, Mapping[str, Any]]:
        """The template's resources; a macro's entry (`Fn::ForEach::Loop: [...]`) is none until it is processed."""
        resources = self.document.get("Resources")
        if not isinstance(resources, Mapping):
            return {}
        return {name: r for name, r in resources.items() if isinstance(r, Mapping)}

    @property
    def transforms(self) -> bool:
        """Whether CloudFormation processes the template before it plans (`Transform:` macros, Fn::ForEach)."""
        return bool(self.document.get("Transform"))

    @property
    def parameters(self) -> Mapping[str, Mapping[str, Any]]:
        parameters = self.document.get("Parameters")
        return parameters if isinstance(parameters, Mapping) else {}

    def no_echo(self) -> frozenset[str]:
        return frozenset(name for name, p in self.parameters.items()
                         if isinstance(p, Mapping) and str(p.get("NoEcho", "")).lower() == "true")


def parse_template(body: str, file: str) -> Template:
    """Parse a template; a malformed one is a ConfigError naming the file and line."""
    from cfnlint.decode import cfn_json, cfn_yaml  # cfn-lint only where a CloudFormation stack is planned

    try:
        if file.endswith(".json"):
            document = cfn_json.loads(body)
        else:
            document = cfn_yaml.loads(body)
    except Exception as exc:  # cfn-lint raises its own and yaml's errors, with the line in the message
        raise ConfigError(f"{file}: not a readable CloudFormation template: {_first_line(exc)}") from None
    if not isinstance(document, Mapping) or not isinstance(document.get("Resources"), Mapping):
        raise ConfigError(f"{file}: a CloudFormation template needs a Resources section")
    return Template(body, _plain(document), file)


def read_stack_files(directory: Path) -> tuple[Template, dict[str, str]]:
    """The stack directory's template and its parameters file (optional)."""
    found = [directory / name for name in TEMPLATE_NAMES if (directory / name).is_file()]
    if not found:
        raise ConfigError(f"{directory.name}: no CloudFormation template ({', '.join(TEMPLATE_NAMES)})")
    if len(found) > 1:
        raise ConfigError(f"{directory.name}: more than one template ({', '.join(p.name for p in found)}); keep one")
    template = parse_template(found[0].read_text(encoding="utf-8"), f"{directory.name}/{found[0].name}")
    parameters: dict[str, str] = {}
    for name in PARAMETER_NAMES:
        path = directory / name
        if path.is_file():
            parameters = parse_parameters(path.read_text(encoding="utf-8"), f"{directory.name}/{name}")
    return template, parameters


def parse_parameters(text: str, file: str) -> dict[str, str]:
    """`{"Name": "value"}` or the CLI's `[{"ParameterKey": ..., "ParameterValue": ...}]`."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{file}: not JSON ({exc})") from None
    if isinstance(data, Mapping):
        return {str(k): _parameter_text(v) for k, v in data.items()}
    if isinstance(data, list) and all(isinstance(p, Mapping) and "ParameterKey" in p for p in data):
        return {str(p["ParameterKey"]): _parameter_text(p.get("ParameterValue", "")) for p in data}
    raise ConfigError(f"{file}: parameters are an object of name to value, or a list of ParameterKey/ParameterValue")


@dataclass
class Resolver:
    """Resolves intrinsic functions over known parameters; anything else is unknown.

    `parameters` are the values given (a value may be UNKNOWN: a NoEcho value DescribeStacks hides); `secret`
    names the parameters secret by origin besides the template's NoEcho ones, which always are.
    """

    template: Template
    parameters: Mapping[str, Any]
    region: str
    account: str = "123456789012"
    stack_name: str = ""
    conditions: dict[str, bool | None] = field(default_factory=dict)
    secret: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        self.secret = frozenset(self.secret) | self.template.no_echo()

    def properties(self, logical_id: str) -> Any:
        resource = self.template.resources.get(logical_id) or {}
        properties = resource.get("Properties") if isinstance(resource, Mapping) else None
        resolved = self.value(properties or {})
        return {} if resolved is NO_VALUE else resolved

    def value(self, node: Any) -> Any:
        if isinstance(node, str):
            return secret(node) if has_dynamic_reference(node) else node
        if isinstance(node, list):
            items = [self.value(v) for v in node]
            return [v for v in items if v is not NO_VALUE]
        if not isinstance(node, Mapping):
            return node
        if len(node) == 1:
            (name, argument), = node.items()
            function = _FUNCTIONS.get(name)
            if function is None and name.startswith("Fn::"):
                return self._untraced(node)
            if function is not None:
                try:
                    return function(self, argument)
                except (TypeError, ValueError, KeyError, IndexError, AttributeError):
                    return self._untraced(node)
        out = {k: self.value(v) for k, v in node.items()}
        return {k: v for k, v in out.items() if v is not NO_VALUE}

    def _untraced(self, node: Any) -> Any:
        """A function this resolver does not evaluate, or cannot here: unknown, and secret if it names a secret."""
        return secret(UNKNOWN) if self.names_secret(node) else UNKNOWN

    def names_secret(self, node: Any) -> bool:
        """Whether a template node reads a secret anywhere (a Ref, a Fn::Sub name, a dynamic reference)."""
        if isinstance(node, str):
            return has_dynamic_reference(node) or any(n in self.secret for n in _SUB_NAMES.findall(node))
        if isinstance(node, Mapping):
            if isinstance(node.get("Ref"), str) and node["Ref"] in self.secret:
                return True
            return any(self.names_secret(v) for v in node.values())
        if isinstance(node, list):
            return any(self.names_secret(v) for v in node)
        return False

    def ref(self, name: str) -> Any:
        pseudo = {"AWS::Region": self.region, "AWS::AccountId": self.account, "AWS::StackName": self.stack_name,
                  "AWS::Partition": "aws", "AWS::URLSuffix": "amazonaws.com", "AWS::NoValue": NO_VALUE}
        if name in pseudo:
            return pseudo[name] if (name != "AWS::StackName" or self.stack_name) else UNKNOWN
        if name in self.template.parameters:
            if name in self.parameters:
                value = self.parameters[name]
            else:
                default = self.template.parameters[name].get("Default")
                value = _parameter_text(default) if default is not None else UNKNOWN
            return secret(value) if name in self.secret or has_dynamic_reference(value) else value
        return UNKNOWN  # a resource's physical id: known after apply

    def condition(self, name: str) -> bool | None:
        if name not in self.conditions:
            self.conditions[name] = None  # a cycle reads as unknown
            conditions = self.template.document.get("Conditions") or {}
            value = self.value(conditions.get(name)) if isinstance(conditions, Mapping) else UNKNOWN
            self.conditions[name] = value if isinstance(value, bool) else None
        return self.conditions[name]


def _sub(r: Resolver, argument: Any) -> Any:
    text, names = (argument, {}) if isinstance(argument, str) else (argument[0], r.value(argument[1]))
    names, read_secret = revealed(names)
    text, text_secret = revealed(r.value(text) if not isinstance(text, str) else text)
    if not isinstance(text, str) or not isinstance(names, Mapping):
        raise TypeError("Fn::Sub takes a string and a map")
    unknown = False
    read_secret = read_secret or text_secret or has_dynamic_reference(text)

    def replace(match: re.Match[str]) -> str:
        nonlocal unknown, read_secret
        inner = match.group(1)
        if inner.startswith("!"):
            return "${" + inner[1:] + "}"
        value = names[inner] if inner in names else (r.ref(inner) if "." not in inner else UNKNOWN)
        value, was_secret = revealed(value)
        read_secret = read_secret or was_secret
        if isinstance(value, Unknown) or value is NO_VALUE or isinstance(value, (Mapping, list)):
            unknown = True
            return ""
        return str(value)

    out = re.sub(r"\$\{([^}]+)\}", replace, text)
    result = UNKNOWN if unknown else out
    return secret(result) if read_secret else result


def _join(r: Resolver, argument: Any) -> Any:
    separator, items = argument[0], r.value(argument[1])
    items, read_secret = revealed(items)
    if not isinstance(items, list):
        return secret(UNKNOWN) if read_secret else UNKNOWN
    shown = [revealed(v) for v in items]
    read_secret = read_secret or any(was for _, was in shown)
    values = [v for v, _ in shown]
    result = UNKNOWN if any(isinstance(v, (Unknown, Mapping, list)) for v in values) else \
        str(separator).join(str(v) for v in values)
    return secret(result) if read_secret else result


def _select(r: Resolver, argument: Any) -> Any:
    (index, index_secret), (items, items_secret) = revealed(r.value(argument[0])), revealed(r.value(argument[1]))
    if isinstance(index, Unknown) or not isinstance(items, list):
        result = UNKNOWN
    else:
        result = items[int(index)]
    return secret(result) if index_secret or items_secret else result


def _split(r: Resolver, argument: Any) -> Any:
    separator, (text, read_secret) = argument[0], revealed(r.value(argument[1]))
    result = text.split(separator) if isinstance(text, str) else UNKNOWN
    return secret(result) if read_secret else result


def _find_in_map(r: Resolver, argument: Any) -> Any:
    mappings = r.template.document.get("Mappings") or {}
    keys = [revealed(r.value(k)) for k in argument[:3]]
    read_secret = any(was for _, was in keys)
    if any(isinstance(k, Unknown) for k, _ in keys):
        return secret(UNKNOWN) if read_secret else UNKNOWN
    result = r.value(mappings[keys[0][0]][keys[1][0]][keys[2][0]])
    return secret(result) if read_secret else result


def _if(r: Resolver, argument: Any) -> Any:
    chosen = r.condition(argument[0])
    if chosen is None:  # either branch may be the one: secret if either reads a secret
        return r._untraced(argument[1:])
    return r.value(argument[1] if chosen else argument[2])


def _equals(r: Resolver, argument: Any) -> Any:
    a, b = plain(r.value(argument[0])), plain(r.value(argument[1]))
    if isinstance(a, Unknown) or isinstance(b, Unknown):
        return UNKNOWN
    return str(a) == str(b)


def _logic(combine: Any) -> Any:
    def run(r: Resolver, argument: Any) -> Any:
        values = [plain(r.value(v)) for v in argument]
        if any(not isinstance(v, bool) for v in values):
            return UNKNOWN
        return combine(values)
    return run


def _condition(r: Resolver, argument: Any) -> Any:
    value = r.condition(argument)
    return UNKNOWN if value is None else value


def _get_azs(r: Resolver, argument: Any) -> Any:
    return [f"{r.region}{zone}" for zone in "abc"]


def _base64(r: Resolver, argument: Any) -> Any:
    value, read_secret = revealed(r.value(argument))
    result = value if isinstance(value, str) else UNKNOWN  # shown as the text it encodes
    return secret(result) if read_secret else result


_FUNCTIONS = {
    "Ref": lambda r, a: r.ref(a),
    "Fn::GetAtt": lambda r, a: UNKNOWN,
    "Fn::ImportValue": lambda r, a: r._untraced(a),
    "Fn::GetAZs": _get_azs,
    "Fn::Sub": _sub,
    "Fn::Join": _join,
    "Fn::Select": _select,
    "Fn::Split": _split,
    "Fn::FindInMap": _find_in_map,
    "Fn::If": _if,
    "Fn::Equals": _equals,
    "Fn::And": _logic(all),
    "Fn::Or": _logic(any),
    "Fn::Not": _logic(lambda values: not values[0]),
    "Condition": _condition,
    "Fn::Base64": _base64,
}
_SUB_NAMES = re.compile(r"\$\{([^}!.]+)\}")


def has_dynamic_reference(value: Any) -> bool:
    """A `{{resolve:secretsmanager:...}}` or `{{resolve:ssm-secure:...}}` anywhere in the value: a secret by origin."""
    if isinstance(value, str):
        return bool(DYNAMIC_REFERENCE.search(value))
    if isinstance(value, Mapping):
        return any(has_dynamic_reference(v) for v in value.values())
    if isinstance(value, list):
        return any(has_dynamic_reference(v) for v in value)
    return False


def _parameter_text(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _plain(node: Any) -> Any:
    """cfn-lint's node types (str_node, dict_node) as plain Python values."""
    if isinstance(node, Mapping):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    return str(node)


def _first_line(exc: Exception) -> str:
    """The parser's complaint with its line: YAML's marks, cfn-lint's matches, or JSON's position."""
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        return f"line {mark.line + 1}: {getattr(exc, 'problem', None) or type(exc).__name__}"
    matches = getattr(exc, "matches", None)
    if matches:
        first = matches[0]
        return f"line {getattr(first, 'linenumber', '?')}: {getattr(first, 'message', first)}"[:300]
    if isinstance(exc, json.JSONDecodeError):
        return f"line {exc.lineno}: {exc.msg}"
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
