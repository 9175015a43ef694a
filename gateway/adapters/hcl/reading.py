"""Reading HCL: python-hcl2's grammar, parsed trees cached by content, and small readers of those trees.

Engine-neutral: the sandbox reads whole stacks with it (`sandbox/config.py`), and the checks that
judge a branch's declarations whatever engine plans it (`hcl_sensitivity.py`, `module_sources.py`)
read the same trees. It knows HCL's syntax only, nothing of Terraform's meaning or of any engine.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

import hcl2.parser
from lark import Lark, Token, Tree
from lark.exceptions import LarkError, UnexpectedInput

from gateway.adapters.collector import collector_paused
from gateway.adapters.hcl.parsed_trees import load_tree, save_tree
from gateway.domain.errors import ConfigError

PARSE_CACHE_BYTES = 64 * 1024 * 1024  # of source text; trees take a small multiple of it


@functools.lru_cache(maxsize=1)
def _parser() -> Lark:
    """python-hcl2's grammar without position tracking (lines come from the tokens): faster to parse."""
    return Lark.open("hcl2.lark", parser="lalr", rel_to=hcl2.parser.__file__, propagate_positions=False,
                     cache=True, postlex=hcl2.parser.PostLexer())


class _ParseCache:
    """Trees by content, least recently used dropped first, capped by the text's bytes.

    Keyed by the text alone: a tree holds no file name (errors name the file from the caller), so the
    same module installed twice (`terraform init` copies a registry module once per call) is parsed once.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self.parses = 0  # how many texts were parsed rather than found: what the speed test watches
        self._trees: OrderedDict[str, tuple[Tree, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> Tree | None:
        with self._lock:
            hit = self._trees.get(key)
            if hit is None:
                return None
            self._trees.move_to_end(key)
            return hit[0]

    def put(self, key: str, tree: Tree, size: int) -> None:
        with self._lock:
            self.parses += 1
            if key in self._trees or size > self.max_bytes:
                return
            self._trees[key] = (tree, size)
            self.size += size
            while self.size > self.max_bytes:
                _, (_, dropped) = self._trees.popitem(last=False)
                self.size -= dropped


    def clear(self) -> None:
        with self._lock:
            self._trees.clear()
            self.size = 0


_CACHE = _ParseCache(PARSE_CACHE_BYTES)


@atexit.register
def _drop_trees_at_exit() -> None:
    """Free the cached trees before the interpreter's teardown, which runs the cycle collector over every live
    object several times: with a module tree's half a million nodes still cached, that was half a second of
    every `gateway plan`. The trees hold no cycles, so dropping them frees them at once."""
    _CACHE.clear()


def parse_tree(text: str, keep: bool = True) -> Tree:
    """Parse HCL text (lark's errors raised as they are); trees are cached by content.

    Parsing dominates planning time, and one plan reads each file several times (the secret checks,
    the backend, the engine), as do apply and re-plans of one commit: each text is parsed once, and
    nothing mutates a tree. Across processes, trees of files are kept on disk by content (`parsed_trees.py`):
    a text another process parsed is read back, not parsed. Without `keep`, the text is not written there: a
    text made while planning (a template given as a value) may hold a secret, and the disk holds none.
    """
    key = hashlib.sha256(text.encode()).hexdigest()
    tree = _CACHE.get(key)
    if tree is not None:
        return tree
    with collector_paused():
        tree = load_tree(key) if keep else None
        if tree is None:
            tree = _parser().parse(text if text.endswith("\n") else text + "\n")
            if keep:
                save_tree(key, tree)
    _CACHE.put(key, tree, len(text))
    return tree


def parse_hcl(filename: str, text: str) -> Tree:
    """Parse HCL text, turning the parser's errors into one readable line naming file and line."""
    try:
        return parse_tree(text)
    except UnexpectedInput as exc:
        raise ConfigError(
            f"{filename}:{exc.line}:{exc.column}: malformed HCL near {_snippet(text, exc)!r}"
        ) from None
    except LarkError as exc:
        raise ConfigError(f"{filename}: malformed HCL: {str(exc).splitlines()[0]}") from None


def hcl_document(text: str) -> dict[str, Any]:
    """What `hcl2.loads` makes of the text (python-hcl2's dict form), built from the cached tree: the text is not
    parsed again. Parser errors are raised as `hcl2.loads` raises them."""
    from hcl2.api import serialize, transform

    return serialize(transform(parse_tree(text)))


def documents_mentioning(files: Mapping[str, str], *words: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each of `files` (name -> text) whose text mentions one of `words`, as `hcl_document` makes it, by name: the
    others are not parsed at all. Text that is not HCL is a ConfigError naming its file."""
    for name, text in sorted(files.items()):
        if not any(word in text for word in words):
            continue
        try:
            document = hcl_document(text)
        except Exception as exc:  # python-hcl2 raises lark's errors
            raise ConfigError(f"{name}: not valid HCL: {str(exc).splitlines()[0]}") from None
        yield name, document


def _snippet(text: str, exc: UnexpectedInput) -> str:
    line = text.splitlines()[exc.line - 1] if 0 < exc.line <= len(text.splitlines()) else ""
    return line.strip()[:60]


def line_of(node: Tree) -> int:
    """The line a subtree starts on (trees carry no positions; their first token does)."""
    for token in node.scan_values(lambda v: isinstance(v, Token)):
        line = getattr(token, "line", None)
        if line:
            return int(line)
    return 0


def first_term(expr: Tree) -> Tree | None:
    subtrees = [c for c in expr.children if isinstance(c, Tree) and c.data != "new_line_or_comment"]
    return subtrees[0] if expr.data == "expr_term" and subtrees else None


def node_name(node: Tree) -> str:
    if node.data == "string":
        return "".join(str(p.children[0]) for p in node.children if isinstance(p, Tree))
    token = node.children[0]
    return str(token.children[0]) if isinstance(token, Tree) else str(token)


def collect_references(expr: Tree) -> set[str]:
    """Root-and-first-attribute pairs an expression refers to: `aws_vpc.main`, `local.x`, `var.y`."""
    refs: set[str] = set()
    for node in expr.iter_subtrees():
        if node.data != "get_attr_expr_term":
            continue
        base, attr = [c for c in node.children if isinstance(c, Tree)]
        inner = first_term(base)
        if inner is not None and inner.data == "identifier":
            attr_name = [c for c in attr.children if isinstance(c, Tree)][0].children[0]
            refs.add(f"{inner.children[0]}.{attr_name if not isinstance(attr_name, Token) else str(attr_name)}")
    return refs
