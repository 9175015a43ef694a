"""Small, exact edits of Terraform declarations: set a top-level attribute of one resource block to a literal.

Used to codify drift (the declaration takes the value reality has) and to write the configuration of an import.
Only literals are rewritten: an attribute set by an expression (a variable, a local, a function) is left to a
person, and the refusal names the file and line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from gateway.domain.errors import InputError

_LITERAL = re.compile(r'^(?:"(?:[^"\\$%]|\\.)*"|-?\d+(?:\.\d+)?|true|false|null)$')


class NotCodifiable(InputError):
    """An attribute the gateway cannot rewrite alone; the message says where and why."""


def hcl_literal(value: Any, nested: bool = False) -> str | None:
    """`value` as an HCL literal, or None when it is not of a simple type (string, number, bool).

    With `nested`, lists and maps of simple values are literals too (for an import's configuration).
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, str):
        return json.dumps(value).replace("${", "$${").replace("%{", "%%{")
    if nested and isinstance(value, list):
        items = [hcl_literal(v) for v in value]
        return None if None in items else "[" + ", ".join(str(i) for i in items) + "]"
    if nested and isinstance(value, Mapping):
        pairs = [(json.dumps(str(k)), hcl_literal(v)) for k, v in value.items()]
        if any(v is None for _, v in pairs):
            return None
        return "{" + ", ".join(f"{k} = {v}" for k, v in pairs) + "}"
    return None


def find_resource_block(text: str, rtype: str, name: str) -> tuple[int, int] | None:
    """The first and last line index of `resource "rtype" "name" { ... }` (braces counted outside strings)."""
    lines = text.splitlines()
    start = re.compile(rf'^\s*resource\s+"{re.escape(rtype)}"\s+"{re.escape(name)}"\s*\{{')
    for i, line in enumerate(lines):
        if start.match(line):
            depth = 0
            for j in range(i, len(lines)):
                depth += _brace_delta(lines[j])
                if depth == 0:
                    return i, j
            return None
    return None


def _brace_delta(line: str) -> int:
    code = re.sub(r'"(?:[^"\\]|\\.)*"', '""', line.split("#", 1)[0])
    return code.count("{") - code.count("}")


def set_attribute(text: str, filename: str, rtype: str, name: str, attribute: str, value: Any) -> str:
    """`text` with `attribute = value` in the resource block (replacing a literal, or added at its end)."""
    literal = hcl_literal(value)
    if literal is None:
        raise NotCodifiable(f"{rtype}.{name}.{attribute}: the value is not a string, number or bool")
    block = find_resource_block(text, rtype, name)
    if block is None:
        raise NotCodifiable(f"{filename}: no resource \"{rtype}\" \"{name}\" block")
    first, last = block
    lines = text.splitlines()
    depth = 0
    assignment = re.compile(rf"^(\s*){re.escape(attribute)}(\s*)=\s*(.*?)\s*$")
    for i in range(first, last + 1):
        if depth == 1 and (m := assignment.match(lines[i])):
            current = m.group(3).split(" #", 1)[0].strip()
            if not _LITERAL.match(current):
                raise NotCodifiable(f"{filename}:{i + 1}: {rtype}.{name}.{attribute} is set by the expression "
                                    f"{current[:60]}; codify it by hand (push a branch and propose it)")
            lines[i] = f"{m.group(1)}{attribute}{m.group(2)}= {literal}"
            return "\n".join(lines) + "\n"
        depth += _brace_delta(lines[i])
    indent = "  "
    lines.insert(last, f"{indent}{attribute} = {literal}")
    return "\n".join(lines) + "\n"


def import_declaration(address: str, rid: str, attributes: Mapping[str, Any]) -> tuple[str, list[str]]:
    """An `import` block and a resource block for `address` (type.name) whose attributes are literals; also the
    attributes left out (not literals), so the plan can show whether the configuration still matches."""
    rtype, name = address.split(".", 1)
    body, left_out = [], []
    for key, value in sorted(attributes.items()):
        if value is None:
            continue
        literal = hcl_literal(value, nested=True)
        if literal is None:
            left_out.append(key)
        else:
            body.append(f"  {key} = {literal}")
    text = (f'import {{\n  to = {address}\n  id = {hcl_literal(rid)}\n}}\n\n'
            f'resource "{rtype}" "{name}" {{\n' + "\n".join(body) + "\n}\n")
    return text, left_out
