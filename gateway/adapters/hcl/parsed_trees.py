"""Parsed HCL trees kept on disk, keyed by the sha256 of the text and of the parser that made them.

A tree is a pure function of the text's bytes and the parser (python-hcl2's grammar and post-lexer, lark, the
options `hcl.py` gives it), so an entry cannot go stale: a changed file has another key, and a new parser
another tag. Reading an entry back (marshal, then one walk that rebuilds lark's trees and tokens with every
attribute the parser set) takes a fifth of parsing the text again. Every process that plans reads the same
module packages and stacks, so the second plan of a tree parses nothing.

An entry carries the sha256 of its key and payload: one that is truncated, altered or unreadable is ignored
(the text is parsed again and the entry rewritten), never trusted. Entries are written beside their place and
renamed into it, so concurrent processes never read half an entry. Nothing here imports lark at start-up:
the composition root names the folder for every command, and a read parses nothing.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lark import Tree

FORMAT = b"gw-hcl-tree-1\n"  # change it when the encoding below changes
_DIGEST = 32
_directory: Path | None = None
_tag: bytes | None = None


def keep_parsed_trees_in(directory: Path | None) -> None:
    """Where parsed trees are kept from now on (None: nowhere, every process parses again)."""
    global _directory
    _directory = directory


def load_tree(text_key: str) -> Tree | None:
    """The tree kept for the text whose sha256 is `text_key`, or None (none kept, or the entry is not sound)."""
    if _directory is None:
        return None
    name = _entry_name(text_key)
    try:
        data = (_directory / name[:2] / name).read_bytes()
    except OSError:
        return None
    head, digest, payload = data[:len(FORMAT)], data[len(FORMAT):len(FORMAT) + _DIGEST], data[len(FORMAT) + _DIGEST:]
    if head != FORMAT or digest != _checksum(name, payload):
        return None
    try:
        return _rebuild(marshal.loads(payload))
    except (ValueError, EOFError, TypeError, IndexError, RecursionError):
        return None


def save_tree(text_key: str, tree: Tree) -> None:
    """Keep the tree for the text whose sha256 is `text_key`; a tree that cannot be kept (or a full disk) is
    simply not kept."""
    if _directory is None:
        return
    try:
        payload = marshal.dumps(_flatten(tree))
    except (ValueError, RecursionError):
        return
    name = _entry_name(text_key)
    folder = _directory / name[:2]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=folder, prefix=".tmp-")
        with os.fdopen(handle, "wb") as out:
            out.write(FORMAT + _checksum(name, payload) + payload)
        os.replace(temporary, folder / name)
    except OSError:
        return


def _entry_name(text_key: str) -> str:
    return hashlib.sha256(_parser_tag() + b"\0" + text_key.encode()).hexdigest()


def _checksum(name: str, payload: bytes) -> bytes:
    return hashlib.sha256(name.encode() + b"\0" + payload).digest()


def _parser_tag() -> bytes:
    """What the parse depends on besides the text: the grammar and post-lexer's sources, the versions, this format."""
    global _tag
    if _tag is None:
        import hcl2
        import hcl2.parser
        import lark

        folder = Path(hcl2.parser.__file__).parent
        parts = [FORMAT, f"python {sys.version_info[:2]} lark {lark.__version__} hcl2 {hcl2.__version__}".encode(),
                 b"lalr, no positions, cache, hcl2 PostLexer",  # the options hcl.py's _parser gives lark
                 (folder / "hcl2.lark").read_bytes(), (folder / "postlexer.py").read_bytes()]
        _tag = hashlib.sha256(b"\0".join(parts)).digest()
    return _tag


def _flatten(node: Any) -> Any:
    """A tree as nested tuples marshal can write: (rule, [children]) and tokens with all their fields."""
    from lark import Token, Tree

    if type(node) is Token and type(node.value) is str:
        return (node.type, node.value, node.start_pos, node.line, node.column, node.end_line, node.end_column,
                node.end_pos)
    if type(node) is Tree and type(node.data) is str:
        return (node.data, [_flatten(child) for child in node.children])
    raise ValueError(f"not kept: a {type(node).__name__} in the tree")  # nothing the grammar makes today


def _rebuild(flat: Any) -> Tree:
    from lark import Token, Tree

    new_str = str.__new__

    def rebuild(node: tuple[Any, ...]) -> Any:
        if len(node) == 2:
            return Tree(node[0], [rebuild(child) for child in node[1]])
        token = new_str(Token, node[1])
        (token.type, token.value, token.start_pos, token.line, token.column, token.end_line, token.end_column,
         token.end_pos) = node
        return token

    tree = rebuild(flat)
    if type(tree) is not Tree:
        raise TypeError("an entry holds no tree")
    return tree
