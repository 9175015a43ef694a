"""What a stack's HCL says about secrets, read with python-hcl2 and judged against main.

Engine-neutral: it reads declarations, not values, so the same check guards every engine. The
engines keep secret-by-origin values masked whatever a branch declares; this module finds the
branches that try to unmask one, so the attempt is a deny finding a person sees, not a silent no-op:

- a variable that main declares sensitive, declared without `sensitive = true` on the branch;
- `nonsensitive(...)` over anything that carries a secret (a secret variable, a resource with a
  schema-sensitive attribute, or a local or resource built from either);
- an output, not declared sensitive, built from a secret variable or such an unmasked value.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from lark import Tree
from lark.exceptions import UnexpectedInput

from gateway.adapters.hcl.reading import collect_references, hcl_document, node_name, parse_hcl
from gateway.domain.declarations import LiteralSecret, Unmasking
from gateway.domain.errors import ConfigError


@dataclass
class Block:
    kind: str
    labels: list[str]
    body: Tree


def declared_variables(files: Mapping[str, str]) -> frozenset[str]:
    """Every variable these files declare."""
    return frozenset(b.labels[0] for b in top_level_blocks(_mentioning(files, ("variable",))) if b.kind == "variable" and b.labels)


def declared_sensitive_variables(files: Mapping[str, str]) -> frozenset[str]:
    """The variables these files declare with `sensitive = true`."""
    return frozenset(b.labels[0] for b in top_level_blocks(_mentioning(files, ("variable",)))
                     if b.kind == "variable" and b.labels and _is_sensitive(b))


def find_unmaskings(files: Mapping[str, str], secret_variables: frozenset[str], main_sensitive: frozenset[str],
                    sensitive_attributes: Callable[[str], frozenset[str]]) -> list[Unmasking]:
    """Every place these files try to show a secret in clear, by address."""
    calls = any(_NONSENSITIVE_CALL.search(text) for text in files.values() if "nonsensitive" in text)
    if not calls:
        # no nonsensitive() anywhere: resources cannot unmask, so only variables, locals and outputs matter
        files = _mentioning(files, ("variable", "locals", "output"))
    blocks = list(top_level_blocks(files))
    found: list[Unmasking] = []
    for block in blocks:
        if block.kind == "variable" and block.labels and block.labels[0] in main_sensitive and not _is_sensitive(block):
            found.append(Unmasking(f"var.{block.labels[0]}", f"var.{block.labels[0]} is declared sensitive on main; "
                                   "a branch cannot remove that (it stays masked, and this change is denied)"))
    # what carries a secret matters only to a nonsensitive() call: without one, no resource is looked up
    tainted = _secret_carriers(blocks, secret_variables, sensitive_attributes) if calls else set()
    unmasked_locals: set[str] = set()
    for block in blocks if calls else ():
        for address, expr in _expressions(block):
            if any(collect_references(_arguments(call)) & tainted for call in _nonsensitive_calls(expr)):
                if address.startswith("local."):
                    unmasked_locals.add(address)
                found.append(Unmasking(address, f"{address} applies nonsensitive() to a secret; secrets stay "
                                       "masked whatever the configuration says, and this change is denied", True))
    # an output not declared sensitive may not carry a secret variable, directly, through locals, or unmasked
    exposing = _closure(unmasked_locals | {f"var.{name}" for name in secret_variables}, _local_references(blocks))
    for block in blocks:
        if block.kind == "output" and block.labels and not _is_sensitive(block):
            value = _attribute(block.body, "value")
            hits = sorted(collect_references(value) & exposing) if value is not None else []
            if hits:
                found.append(Unmasking(f"output.{block.labels[0]}", f"output.{block.labels[0]} is built from "
                                       f"{', '.join(hits)}, which carries a secret; declare the output sensitive"))
    return sorted(set(found), key=lambda u: (u.address, u.message))


FILE_FUNCTIONS = frozenset({"file", "filebase64", "templatefile", "fileset", "filemd5", "filesha1", "filesha256",
                            "filesha512", "filebase64sha256", "filebase64sha512", "fileexists"})


def find_outside_reads(files: Mapping[str, str]) -> list[Unmasking]:
    """Calls that read files by a path that is not a plain relative one inside the stack.

    An absolute or `..` path, or one built from values, could read the gateway's own secrets, state
    or environment (`/proc/self/environ`) into a plan that people and the agent see.
    """
    found = []
    for block in top_level_blocks({n: t for n, t in files.items() if "file" in t}):
        for address, expr in _expressions(block):
            for call in expr.iter_subtrees():
                if call.data != "function_call":
                    continue
                names = [str(c.children[0]) for c in call.children if isinstance(c, Tree) and c.data == "identifier"]
                if names and names[-1] in FILE_FUNCTIONS and not _plain_relative_path(_arguments(call)):
                    found.append(Unmasking(address, f"{address} calls {names[-1]}() with a path that is not a plain "
                                           "relative path inside the stack; only those may be read"))
    return sorted(set(found), key=lambda u: (u.address, u.message))


def _plain_relative_path(arguments: Tree) -> bool:
    """The first argument is a string literal (optionally after `${path.module}/`) with no `..`, not absolute."""
    args = [c for c in arguments.children if isinstance(c, Tree) and c.data != "new_line_or_comment"]
    if not args:
        return True
    parts = list(args[0].iter_subtrees_topdown())
    strings = [p for p in parts if p.data == "string"]
    if not strings:
        return False
    text = "".join(str(tok) for p in strings[0].iter_subtrees() for tok in p.children if not isinstance(tok, Tree))
    refs = collect_references(args[0])
    if refs - {"path.module"}:
        return False
    return not text.startswith("/") and ".." not in text and "~" not in text


def _secret_carriers(blocks: list[Block], secret_variables: frozenset[str],
                     sensitive_attributes: Callable[[str], frozenset[str]]) -> set[str]:
    """References (`var.x`, `local.y`, `aws_db_instance.z`) whose value carries a secret."""
    tainted = {f"var.{name}" for name in secret_variables}
    edges: dict[str, set[str]] = _local_references(blocks)
    for block in blocks:
        if block.kind == "resource" and len(block.labels) == 2:
            key = ".".join(block.labels)
            if sensitive_attributes(block.labels[0]):
                tainted.add(key)
            edges[key] = set().union(*(collect_references(e) for _, e in _expressions(block)))
    return _closure(tainted, edges)


def _local_references(blocks: list[Block]) -> dict[str, set[str]]:
    return {f"local.{name}": collect_references(expr)
            for block in blocks if block.kind == "locals" for name, expr in _attributes(block.body)}


def _closure(start: set[str], edges: Mapping[str, set[str]]) -> set[str]:
    """`start` plus every name that refers to one of them, transitively."""
    result = set(start)
    changed = True
    while changed:
        changed = False
        for name, refs in edges.items():
            if name not in result and refs & result:
                result.add(name)
                changed = True
    return result


_NONSENSITIVE_CALL = re.compile(r"\bnonsensitive\s*\(")


def _mentioning(files: Mapping[str, str], kinds: tuple[str, ...]) -> dict[str, str]:
    """The files that may hold a block of one of `kinds` (parsing is slow; most files hold only resources)."""
    pattern = re.compile(r"^\s*(%s)\b" % "|".join(kinds), re.MULTILINE)
    return {name: text for name, text in files.items() if pattern.search(text)}


def top_level_blocks(files: Mapping[str, str]) -> Iterator[Block]:
    """Every top-level block of these files: its type, labels and body tree."""
    for filename, text in sorted(files.items()):
        body = parse_hcl(filename, text).children[0]
        for child in body.children:
            if isinstance(child, Tree) and child.data == "block":
                parts = [c for c in child.children if isinstance(c, Tree) and c.data != "new_line_or_comment"]
                yield Block(node_name(parts[0]), [node_name(p) for p in parts[1:-1]], parts[-1])


def _expressions(block: Block) -> Iterator[tuple[str, Tree]]:
    """(address, expression) for every expression of a top-level block, nested blocks included."""
    if block.kind == "locals":
        for name, expr in _attributes(block.body):
            yield f"local.{name}", expr
        return
    address = {"output": "output.", "variable": "var.", "module": "module.", "data": "data."}.get(block.kind, "")
    address += ".".join(block.labels) if block.labels else block.kind
    for node in block.body.iter_subtrees():
        if node.data == "attribute":
            yield address, node.children[-1]


def _attributes(body: Tree) -> Iterator[tuple[str, Tree]]:
    for child in body.children:
        if isinstance(child, Tree) and child.data == "attribute":
            yield node_name(child.children[0]), child.children[-1]


def _attribute(body: Tree, name: str) -> Tree | None:
    return next((expr for n, expr in _attributes(body) if n == name), None)


def _is_sensitive(block: Block) -> bool:
    """Only the literal `true` counts: `!true`, `1 == 1` or a reference could hide a false."""
    expr = _attribute(block.body, "sensitive")
    if expr is None:
        return False
    literals = [t for t in expr.iter_subtrees() if t.data == "literal_value"]
    return len(literals) == 1 and str(literals[0].children[0]) == "true" and \
        sum(1 for t in expr.iter_subtrees() if t.data not in ("expr_term", "literal_value")) == 0


def _nonsensitive_calls(expr: Tree) -> Iterator[Tree]:
    for node in expr.iter_subtrees():
        if node.data == "function_call":
            names = [str(c.children[0]) for c in node.children if isinstance(c, Tree) and c.data == "identifier"]
            if names and names[-1] == "nonsensitive":
                yield node


def _arguments(call: Tree) -> Tree:
    return next((c for c in call.children if isinstance(c, Tree) and c.data == "arguments"), Tree("arguments", []))



_SECRET_WORD = re.compile(r"password|passwd|secret|token|api_?key|private_key|access_key", re.IGNORECASE)
_SECRET_NAME = re.compile(r"(?:^|_)(password|passwd|secret|token|api_key|apikey|private_key|access_key|secret_key)"
                          r"(?:$|_)", re.IGNORECASE)


def find_literal_secrets(files: Mapping[str, str]) -> list[LiteralSecret]:
    """Secret-like attributes (`password`, `token`, `secret_key`, ...) set from a string literal in a resource,
    data source, provider or module block, rather than from a variable the gateway supplies or a secret store.

    A file that mentions a secret-like word and cannot be read is refused (ConfigError naming it): an engine
    may accept what python-hcl2 cannot parse (Terraform takes Unicode names), and a skipped file is unchecked.
    """
    found = []
    for filename, text in sorted(files.items()):
        if not _SECRET_WORD.search(text):
            continue  # no secret-like name anywhere in it, so nothing to find
        document = _read_for_secret_check(filename, text)
        for kind in ("resource", "data"):
            for block in document.get(kind, []):
                for rtype, named in block.items():
                    for rname, body in named.items():
                        prefix = "data." if kind == "data" else ""
                        found += _literals(f"{prefix}{_unquote(rtype)}.{_unquote(rname)}", body, "")
        for kind in ("provider", "module"):
            for block in document.get(kind, []):
                for label, body in block.items():
                    found += _literals(f"{kind}.{_unquote(label)}", body, "")
    return found


def _read_for_secret_check(filename: str, text: str) -> dict[str, Any]:
    try:
        return hcl_document(text)
    except UnexpectedInput as exc:
        where = f"{filename}:{exc.line}:{exc.column}"
        cause: Exception = exc
    except Exception as exc:  # the transformer's own errors on odd input: still a file the check could not read
        where, cause = filename, exc
    # no snippet of the line: the line the parser stopped on may be the one holding the secret
    raise ConfigError(f"{where}: the gateway's secret checks cannot read this file (malformed HCL, or HCL its "
                      "parser does not take, such as a non-ASCII name), so it is refused before planning: an "
                      "unchecked file could hold a secret in git") from cause


def _literals(address: str, body: object, path: str) -> list[LiteralSecret]:
    out = []
    if isinstance(body, list):
        for item in body:
            out += _literals(address, item, path)
    elif isinstance(body, dict):
        for key, value in body.items():
            if key == "__is_block__":
                continue
            where = f"{path}.{key}" if path else key
            if isinstance(value, str) and _SECRET_NAME.search(key) and _is_literal(value):
                out.append(LiteralSecret(address, where))
            elif isinstance(value, (dict, list)):
                out += _literals(address, value, where)
    return out


def _is_literal(value: str) -> bool:
    return len(value) > 2 and value.startswith('"') and value.endswith('"') and "${" not in value


def _unquote(label: str) -> str:
    return label[1:-1] if len(label) >= 2 and label.startswith('"') and label.endswith('"') else label
