"""The agent's tools, confined to one working copy of the declaration repo.

Paths are resolved inside the repo root: absolute paths, `..`, symlinks and `.git` are refused,
and protected paths (gateway.yaml, policies/, ...) cannot be written. A refused call returns an
error string the model can read; it never raises into the graph.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

MAX_READ = 20_000
MAX_WRITE = 100_000
MAX_RESULT = 12_000


class ToolRefused(Exception):
    """A tool call the rules do not allow; its message goes back to the model."""


TOOL_SCHEMAS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "list_files", "description": "List files under a directory of the repository.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string", "default": "."}}}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a text file of the repository.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the repository's text files for a regular expression.",
        "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}}, "required": ["pattern"]}}},
    {"type": "function", "function": {
        "name": "write_file", "description": "Create or replace a file with the given content.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                       "required": ["path", "content"]}}},
    {"type": "function", "function": {
        "name": "patch_file", "description": "Replace one exact occurrence of `old` with `new` in a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "old": {"type": "string"},
                                                        "new": {"type": "string"}}, "required": ["path", "old", "new"]}}},
    {"type": "function", "function": {
        "name": "run_preview", "description": "Plan one stack with the engine and return the preview, "
                                             "policy findings and any error.",
        "parameters": {"type": "object", "properties": {"stack": {"type": "string"}}, "required": ["stack"]}}},
    {"type": "function", "function": {
        "name": "finish", "description": "Finish: summarise what changed, why, and what the plan does.",
        "parameters": {"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]}}},
]

PreviewFn = Callable[[str, Path], str]


class RepoTools:
    def __init__(self, root: Path, protected_paths: tuple[str, ...], preview: PreviewFn):
        self.root = root.resolve()
        self.protected_paths = protected_paths
        self._preview = preview
        self.written: set[str] = set()
        self.summary: str | None = None

    def call(self, name: str, raw_arguments: str) -> str:
        """Run one tool call; every refusal or error comes back as text for the model."""
        try:
            arguments = json.loads(raw_arguments or "{}")
            if not isinstance(arguments, dict):
                raise ToolRefused("arguments must be a JSON object")
            handler = getattr(self, f"tool_{name}", None)
            if handler is None:
                raise ToolRefused(f"there is no tool named {name!r}")
            result = str(handler(**arguments))
        except ToolRefused as exc:
            result = f"refused: {exc}"
        except json.JSONDecodeError as exc:
            result = f"error: the arguments are not valid JSON ({exc})"
        except TypeError as exc:
            result = f"error: wrong arguments for {name}: {exc}"
        except Exception as exc:  # whatever a tool meets, the model reads it as the tool's error; the run goes on
            result = f"error: {exc.__class__.__name__}: {exc}"
        return result if len(result) <= MAX_RESULT else result[:MAX_RESULT] + "\n… (truncated)"

    # --- confinement -------------------------------------------------------------------------

    def resolve(self, path: str, for_write: bool = False) -> Path:
        if not isinstance(path, str) or not path.strip():
            raise ToolRefused("a path is required")
        pure = PurePosixPath(path.strip())
        if pure.is_absolute() or path.startswith("~"):
            raise ToolRefused(f"{path}: absolute paths are outside the repository")
        if ".." in pure.parts:
            raise ToolRefused(f"{path}: '..' would leave the repository")
        if pure.parts and pure.parts[0] == ".git":
            raise ToolRefused(f"{path}: the git directory is not part of the declarations")
        target = self.root.joinpath(*pure.parts)
        current = self.root
        for part in pure.parts:  # no symlink anywhere on the way, even one pointing inside
            current = current / part
            if current.is_symlink():
                raise ToolRefused(f"{path}: symlinks are not followed")
        if not target.resolve().is_relative_to(self.root):
            raise ToolRefused(f"{path}: outside the repository")
        relative = pure.as_posix()  # PurePosixPath has already dropped any leading "./"
        if for_write and self._protected(relative):
            raise ToolRefused(f"{relative} is a protected path; only people change it, through its own proposal")
        return target

    def _protected(self, relative: str) -> bool:
        return any(relative == p.rstrip("/") or (p.endswith("/") and relative.startswith(p)) for p in self.protected_paths)

    # --- tools -------------------------------------------------------------------------------

    def tool_list_files(self, path: str = ".") -> str:
        directory = self.resolve(path)
        if not directory.is_dir():
            raise ToolRefused(f"{path} is not a directory")
        files = sorted(p.relative_to(self.root).as_posix() for p in directory.rglob("*")
                       if p.is_file() and ".git" not in p.relative_to(self.root).parts and not p.is_symlink())
        return "\n".join(files) or "(empty)"

    def tool_read_file(self, path: str) -> str:
        target = self.resolve(path)
        if not target.is_file():
            raise ToolRefused(f"{path} does not exist")
        text = target.read_text(encoding="utf-8")
        return text if len(text) <= MAX_READ else text[:MAX_READ] + "\n… (truncated)"

    def tool_search(self, pattern: str) -> str:
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise ToolRefused(f"invalid regular expression: {exc}") from None
        hits = []
        for file in sorted(self.root.rglob("*")):
            relative = file.relative_to(self.root)
            if not file.is_file() or file.is_symlink() or ".git" in relative.parts:
                continue
            try:
                lines = file.read_text(encoding="utf-8").splitlines()
            except UnicodeDecodeError:
                continue
            hits += [f"{relative.as_posix()}:{n}: {line.strip()}" for n, line in enumerate(lines, 1) if regex.search(line)]
        return "\n".join(hits[:200]) or "(no matches)"

    def tool_write_file(self, path: str, content: str) -> str:
        if len(content) > MAX_WRITE:
            raise ToolRefused(f"content is too large ({len(content)} characters, at most {MAX_WRITE})")
        target = self.resolve(path, for_write=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        self.written.add(target.relative_to(self.root).as_posix())
        return f"wrote {path} ({len(content)} characters)"

    def tool_patch_file(self, path: str, old: str, new: str) -> str:
        target = self.resolve(path, for_write=True)
        if not target.is_file():
            raise ToolRefused(f"{path} does not exist")
        text = target.read_text(encoding="utf-8")
        count = text.count(old)
        if count != 1:
            raise ToolRefused(f"`old` occurs {count} times in {path}; it must occur exactly once")
        target.write_text(text.replace(old, new), encoding="utf-8")
        self.written.add(target.relative_to(self.root).as_posix())
        return f"patched {path}"

    def tool_run_preview(self, stack: str) -> str:
        return self._preview(stack, self.root)

    def tool_finish(self, summary: str) -> str:
        if not summary.strip():
            raise ToolRefused("the summary must say what changed and why")
        self.summary = summary.strip()
        return "finished"
