"""Literal edits of a CloudFormation template: set a resource's top-level property to a plain value.

For codify: what drifted is written into the template, the rest of the file left as it is. YAML is edited line
by line (comments, short-form tags and layout survive); JSON is rewritten whole. A property written as a block,
a flow collection or an intrinsic function (`!Ref`, `{"Fn::Sub": ...}`) is not a literal, and is refused.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gateway.domain.declaration_edit import NotCodifiable

TEMPLATE_NAMES = ("template.yaml", "template.yml", "template.json")  # a CloudFormation stack's template, one of


def set_template_property(text: str, filename: str, logical_id: str, prop: str, value: Any) -> str:
    """The template with `Resources.<logical_id>.Properties.<prop>` set to `value` (a string, number or bool)."""
    if isinstance(value, (dict, list)) or value is None:
        raise NotCodifiable(f"{filename}: {logical_id}.{prop}: not a plain value (a string, number or bool)")
    if filename.endswith(".json"):
        return _set_json(text, filename, logical_id, prop, value)
    return _set_yaml(text, filename, logical_id, prop, value)


def _set_json(text: str, filename: str, logical_id: str, prop: str, value: Any) -> str:
    document = json.loads(text)
    resource = (document.get("Resources") or {}).get(logical_id)
    if not isinstance(resource, dict):
        raise NotCodifiable(f"{filename}: no resource {logical_id}")
    properties = resource.setdefault("Properties", {})
    if isinstance(properties.get(prop), (dict, list)):
        raise NotCodifiable(f"{filename}: {logical_id}.{prop} is not a literal (an intrinsic function or a block)")
    properties[prop] = value
    return json.dumps(document, indent=2) + "\n"


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _set_yaml(text: str, filename: str, logical_id: str, prop: str, value: Any) -> str:
    lines = text.splitlines(keepends=True)
    resources = next((i for i, line in enumerate(lines) if re.match(r"^Resources:\s*(#.*)?$", line)), None)
    if resources is None:
        raise NotCodifiable(f"{filename}: no Resources section at the top of the file")
    start = next((i for i in range(resources + 1, len(lines))
                  if re.match(rf"^\s+{re.escape(logical_id)}:\s*(#.*)?$", lines[i])), None)
    if start is None:
        raise NotCodifiable(f"{filename}: no resource {logical_id} written as a block under Resources")
    depth = _indent(lines[start])
    end = next((i for i in range(start + 1, len(lines)) if lines[i].strip() and not lines[i].lstrip().startswith("#")
                and _indent(lines[i]) <= depth), len(lines))
    block = range(start + 1, end)
    props = next((i for i in block if re.match(r"^\s+Properties:\s*(#.*)?$", lines[i])), None)
    literal = json.dumps(value)
    if props is None:
        raise NotCodifiable(f"{filename}:{start + 1}: {logical_id} has no Properties block to write {prop} into")
    inner = next((_indent(lines[i]) for i in range(props + 1, end) if lines[i].strip()
                  and not lines[i].lstrip().startswith("#")), _indent(lines[props]) + 2)
    for i in range(props + 1, end):
        match = re.match(rf"^(\s{{{inner}}}){re.escape(prop)}:(\s*)(.*?)(\s+#.*)?$", lines[i].rstrip("\n"))
        if match is None:
            continue
        current = match.group(3)
        if not current or current[0] in "![{|>&*" or current.startswith(("- ", "Fn::")):
            raise NotCodifiable(f"{filename}:{i + 1}: {logical_id}.{prop} is not a literal ({current or 'a block'})")
        lines[i] = f"{match.group(1)}{prop}: {literal}{match.group(4) or ''}\n"
        return "".join(lines)
    raise NotCodifiable(f"{filename}:{props + 1}: {logical_id}.{prop} is not written in the template; add it by hand")
