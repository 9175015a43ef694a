"""Terraform's filesystem functions: file, fileset, templatefile and friends, confined to the checkout."""

from __future__ import annotations

import base64
import json
import posixpath
import re
from typing import Any

from gateway.adapters.engines.sandbox.functions.registry import (
    VIRTUAL_ROOT,
    CallContext,
    FunctionError,
    expand_home,
    file_scope,
    function,
    read_bytes,
    read_text,
    render_template,
)


@function()
def _abspath(context: CallContext, path: str) -> str:
    if posixpath.isabs(path):
        return posixpath.normpath(path)
    base = context.files.virtual_directory() if context.files else VIRTUAL_ROOT
    return posixpath.normpath(posixpath.join(base, path))


@function()
def _basename(path: str) -> str:
    stripped = path.rstrip("/")
    return posixpath.basename(stripped) if stripped else ("/" if path else ".")


@function()
def _dirname(path: str) -> str:
    if not path:
        return "."
    head = posixpath.dirname(path)  # as Go's filepath.Dir: "a/b/" is in "a/b"
    return posixpath.normpath(head) if head else "."


@function()
def _pathexpand(path: str) -> str:
    return expand_home(path)


@function("file")
def _file(context: CallContext, path: str) -> str:
    return read_text(context, path)


@function()
def _fileexists(context: CallContext, path: str) -> bool:
    target = file_scope(context).resolve(path)
    if target.exists() and not target.is_file():
        raise FunctionError(f"{json.dumps(path)} is not a regular file, but a directory", 0)
    return target.is_file()


@function()
def _filebase64(context: CallContext, path: str) -> str:
    return base64.b64encode(read_bytes(context, path)).decode()


@function()
def _fileset(context: CallContext, path: str, pattern: str) -> list[str]:
    base = file_scope(context).resolve(path)
    regex = _glob_regex(pattern)
    if not base.is_dir():
        return []
    found = [p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file() and not p.is_symlink()]
    return sorted(f for f in found if regex.fullmatch(f))


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """fileset()'s patterns: `*`, `**` (any depth), `?`, `[class]`, `{a,b}`."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                raise FunctionError("invalid pattern: unclosed [", 1)
            out.append("[" + pattern[i + 1:end].replace("!", "^", 1) + "]")
            i = end
        elif c == "{":
            end = pattern.find("}", i)
            if end < 0:
                raise FunctionError("invalid pattern: unclosed {", 1)
            out.append("(?:" + "|".join(re.escape(a) for a in pattern[i + 1:end].split(",")) + ")")
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out))


@function()
def _templatefile(context: CallContext, path: str, vars_: dict) -> Any:
    if context.in_template:
        raise FunctionError("cannot recursively call templatefile from inside another template")
    text = read_text(context, path)
    return render_template(context, text, path, vars_)
