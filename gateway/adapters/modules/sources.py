"""The local modules a stack calls: the directories besides its own that its plan depends on.

A stack that calls `module "x" { source = "../../modules/vpc" }` is planned from those files too, so they
are exported with it, checked for secrets with it, and a change to them is a change to the stack. Terraform
requires `source` to be a literal string; a local one starts with `./` or `../` (anything else is a registry
or git source, read from `.terraform/modules` by the engines).

Directories are repository-relative POSIX paths; one that would leave the repository is left out (the
engine refuses the call itself, naming its file and line).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping
from pathlib import Path

from lark import Tree

from gateway.adapters.hcl.reading import node_name
from gateway.adapters.hcl.sensitivity import top_level_blocks
from gateway.domain.errors import ConfigError

ReadDirectory = Callable[[str], Mapping[str, str]]  # repo-relative directory -> {file name: text} of its .tf files
MAX_MODULE_DIRECTORIES = 200
_LOCAL_SOURCE = re.compile(r"""\bsource\s*=\s*"\.\.?/""")


def local_module_directories(stack_path: str, read: ReadDirectory) -> tuple[str, ...]:
    """Every local module directory the stack at `stack_path` calls, directly or through other modules, sorted."""
    start = posixpath.normpath(stack_path)
    found: set[str] = set()
    pending = [start]
    while pending:
        directory = pending.pop()
        try:
            sources = _local_sources(read(directory))
        except ConfigError:  # a file that does not parse: the plan itself reports it, with its line
            continue
        for source in sources:
            target = posixpath.normpath(posixpath.join(directory, source))
            if target.startswith("../") or target == ".." or target in found or target == start:
                continue
            found.add(target)
            if len(found) > MAX_MODULE_DIRECTORIES:
                raise ConfigError(f"{stack_path}: calls more than {MAX_MODULE_DIRECTORIES} local module directories")
            pending.append(target)
    return tuple(sorted(found))


def read_directory_on_disk(root: Path) -> ReadDirectory:
    """Read .tf files from a checkout or an export rooted at `root` (links are never followed)."""
    def read(directory: str) -> dict[str, str]:
        folder = root / directory
        if not folder.is_dir() or folder.is_symlink():
            return {}
        return {p.name: p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.tf"))
                if p.is_file() and not p.is_symlink()}
    return read


def _local_sources(files: Mapping[str, str]) -> list[str]:
    """The `./` and `../` sources of this directory's module blocks (only files that can hold one are parsed)."""
    candidates = {name: text for name, text in files.items() if _LOCAL_SOURCE.search(text)}
    sources = []
    for block in top_level_blocks(candidates):
        if block.kind != "module":
            continue
        for child in block.body.children:
            if isinstance(child, Tree) and child.data == "attribute" and node_name(child.children[0]) == "source":
                text = string_literal(child.children[-1])
                if text is not None and text.startswith(("./", "../")):
                    sources.append(text)
    return sources


def string_literal(expr: Tree) -> str | None:
    """The text of a plain string literal expression (no interpolation), or None."""
    strings = [node for node in expr.iter_subtrees_topdown() if node.data == "string"]
    if len(strings) != 1 or any(node.data != "string_part" and node is not strings[0]
                                for node in strings[0].iter_subtrees_topdown()):
        return None
    return "".join(str(token) for node in strings[0].iter_subtrees_topdown() for token in node.children
                   if not isinstance(token, Tree)).strip('"')


REPOSITORY_MARKERS = (".git", "gateway.yaml")  # a checkout, or a stack the gateway exported with its modules


def repository_root(root: Path) -> Path:
    """The top of the checkout or export holding `root`, which local module sources may reach up to (the stack
    alone if none is marked)."""
    resolved = root.resolve()
    for candidate in (resolved, *resolved.parents):
        if any((candidate / marker).exists() for marker in REPOSITORY_MARKERS):
            return candidate
    return resolved
