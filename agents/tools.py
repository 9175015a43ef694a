"""The agent's tools, confined to one working copy of the declaration repo.

Paths are resolved inside the repo root: absolute paths, `..`, symlinks and `.git` are refused,
and protected paths (gateway.yaml, policies/, ...) cannot be written. A refused call returns an
error string the model can read; it never raises into the graph.
"""

from __future__ import annotations

import difflib
import json
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import regex

from gateway.domain.errors import ToolRefused

MAX_READ = 20_000
MAX_WRITE = 100_000
MAX_RESULT = 12_000
MAX_DIFF = 6_000
SEARCH_SECONDS = 3.0  # one search's budget for matching, over every line of every file
# A summary explains a remaining policy deny only when one of its sentences says the request cannot be met
# (or is refused) and why: "I cannot make this change: the open-ingress policy denies …". Mentioning a policy
# is not enough ("it no longer violates the policy" is a claim of success, not a refusal).
_REFUSAL = re.compile(
    r"\b(?:cannot|can ?not|can't|could not|couldn't|unable to|not able to|will not|won't)\s+(?:\w+\s+){0,3}?"
    r"(?:meet|be met|do|be done|make|be made|fulfil|fulfill|satisfy|be satisfied|comply|complete|carry out|"
    r"implement|apply|grant)\b"
    r"|\b(?:I|we) (?:refuse|decline)\b|\b(?:is|was|are|were|has been|have been) (?:refused|declined)\b"
    r"|\b(?:is|are|was|were) (?:not possible|impossible)\b", re.IGNORECASE)
_REASON = re.compile(
    r":\s*\S|\b(?:because|since|due to|as it|as the|polic(?:y|ies)|den(?:y|ies|ied)|violat\w*|forbidden|"
    r"not allowed|protected|requires?|needs?)\b", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


def explains_cannot_be_met(summary: str) -> bool:
    """The summary says, in one sentence, that the request cannot be met (or is refused) and why."""
    for sentence in _SENTENCE_END.split(summary):
        refusal = _REFUSAL.search(sentence)
        if refusal and _REASON.search(f"{sentence[:refusal.start()]} {sentence[refusal.end():]}"):
            return True
    return False


def _tool(name: str, description: str, **parameters: tuple[str | list[str], str]) -> dict[str, Any]:
    """A function schema valid in strict mode: every parameter required, optional ones nullable, nothing else allowed."""
    properties = {p: {"type": kind, "description": text} for p, (kind, text) in parameters.items()}
    return {"type": "function", "function": {
        "name": name, "description": description, "strict": True,
        "parameters": {"type": "object", "properties": properties, "required": list(parameters),
                       "additionalProperties": False}}}


TOOL_SCHEMAS: list[dict[str, Any]] = [
    _tool("list_files", "List the files under a directory of the repository.",
          path=(["string", "null"], "directory relative to the repository root; null for the whole repository")),
    _tool("read_file", "Read a text file of the repository; every line comes back prefixed with its number "
                       "(`12| text`), the numbers are not part of the file.",
          path=("string", "file path relative to the repository root, e.g. stacks/data/main.tf"),
          start_line=(["integer", "null"], "first line to read (1-based); null for the start of the file"),
          end_line=(["integer", "null"], "last line to read, inclusive; null for the end of the file")),
    _tool("read_module", "Read a file of a registry, git or HTTP module a stack calls, as `terraform init` installs "
                         "it (read-only: change the module call's version or source instead). Lines come numbered.",
          stack=("string", "a stack name from gateway.yaml"),
          path=(["string", "null"], "a file under .terraform/modules/, e.g. .terraform/modules/vpc/variables.tf; "
                                    "null lists the stack's installed modules and their files")),
    _tool("search", "Search the repository's text files for a regular expression; answers path:line: text.",
          pattern=("string", "a Python regular expression, matched against each line")),
    _tool("write_file", "Create a new file, or replace a whole file; answers with the diff it made. "
                        "To change part of an existing file use patch_file.",
          path=("string", "file path relative to the repository root"),
          content=("string", "the complete new content of the file")),
    _tool("patch_file", "Edit an existing file: replace one exact occurrence of `old` with `new`; answers with the "
                        "diff it made.",
          path=("string", "file path relative to the repository root"),
          old=("string", "the exact text to replace (without line numbers); it must occur exactly once"),
          new=("string", "the text to put in its place")),
    _tool("delete_file", "Delete a file of the repository (e.g. to undo a file you created); answers with the diff.",
          path=("string", "file path relative to the repository root")),
    _tool("run_preview", "Plan one stack with the engine; answers with the preview, the policy findings and any "
                         "engine error. Required after your last edit of a stack, before finish.",
          stack=("string", "a stack name from gateway.yaml, e.g. app-staging")),
    _tool("ask_user", "Ask the person who made the request a question and end this turn; their answer comes back "
                      "as their next message. Use it when the request is ambiguous or needs a decision only they "
                      "can make; never guess.",
          question=("string", "one clear question, with the options you see")),
    _tool("finish", "Finish the turn: summarise what changed, why, and what the plan does. Refused while a stack "
                    "you changed is unpreviewed or has engine errors or policy denies, unless the summary explains "
                    "why the request cannot be met.",
          summary=("string", "what you changed and why, what the plan does (say plainly what is deleted or "
                             "replaced), or why the request cannot be met")),
]


@dataclass(frozen=True)
class PreviewReport:
    """What a preview told the agent: the text it read, and what stands in the way of finishing."""
    text: str
    error: bool = False
    denies: tuple[str, ...] = ()


PreviewFn = Callable[[str, Path], PreviewReport]
# a stack's directory -> a private copy of it with its remote modules under .terraform/modules (gateway.ports.RemoteModules)
InstallModules = Callable[[Path], AbstractContextManager[tuple[Path, Sequence[Any]]]]


class RepoTools:
    def __init__(self, root: Path, protected_paths: tuple[str, ...], preview: PreviewFn,
                 stacks: Mapping[str, str] | None = None, modules: InstallModules | None = None):
        self.root = root.resolve()
        self._modules = modules
        self.protected_paths = protected_paths
        self._preview = preview
        self.stacks = {name: PurePosixPath(path).as_posix().strip("/") for name, path in (stacks or {}).items()}
        self.written: set[str] = set()
        self.touched: set[str] = set()  # stacks this turn wrote to
        self.unpreviewed: set[str] = set()  # stacks written since their last preview
        self.previews: dict[str, PreviewReport] = {}  # each stack's last preview
        self.summary: str | None = None
        self.question: str | None = None

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
        if for_write and ".terraform" in pure.parts:
            raise ToolRefused(f"{path}: .terraform/ is what `terraform init` installs, never committed; remote modules "
                              "are read with read_module and changed through the module call's version or source")
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

    def tool_list_files(self, path: str | None = ".") -> str:
        directory = self.resolve(path or ".")
        if not directory.is_dir():
            raise ToolRefused(f"{path} is not a directory")
        files = sorted(p.relative_to(self.root).as_posix() for p in directory.rglob("*")
                       if p.is_file() and ".git" not in p.relative_to(self.root).parts and not p.is_symlink())
        return "\n".join(files) or "(empty)"

    def read_text(self, path: str) -> str:
        """A file's text as it is (for callers that write whole files back, e.g. external agents)."""
        target = self.resolve(path)
        if not target.is_file():
            raise ToolRefused(f"{path} does not exist")
        text = target.read_text(encoding="utf-8")
        return text if len(text) <= MAX_READ else text[:MAX_READ] + "\n… (truncated)"

    def tool_read_file(self, path: str, start_line: int | None = None, end_line: int | None = None) -> str:
        target = self.resolve(path)
        if not target.is_file():
            raise ToolRefused(f"{path} does not exist")
        lines = target.read_text(encoding="utf-8").splitlines()
        first = max(1, start_line or 1)
        last = min(len(lines), end_line or len(lines))
        if lines and first > len(lines):
            raise ToolRefused(f"{path} has {len(lines)} lines; line {first} is past its end")
        numbered, size = [], 0
        for number in range(first, last + 1):
            line = f"{number}| {lines[number - 1]}"
            size += len(line) + 1
            if size > MAX_READ:
                numbered.append(f"… (truncated at line {number - 1} of {len(lines)}; read on with start_line={number})")
                break
            numbered.append(line)
        return "\n".join(numbered) or f"({path} is empty)"

    def tool_read_module(self, stack: str, path: str | None = None) -> str:
        """A remote module's file as the engines plan it; the copy is gone after the call, so nothing can edit it."""
        if stack not in self.stacks:
            raise ToolRefused(f"there is no stack {stack!r}; the stacks are {', '.join(sorted(self.stacks))}")
        if self._modules is None:
            raise ToolRefused("this gateway resolves no remote modules")
        pure = PurePosixPath((path or ".terraform/modules").strip())
        if pure.is_absolute() or ".." in pure.parts or pure.parts[:2] != (".terraform", "modules"):
            raise ToolRefused(f"{path}: a module file's path starts with .terraform/modules/")
        with self._modules(self.root / self.stacks[stack]) as (work, pins):
            target = work.joinpath(*pure.parts)
            if any(p.is_symlink() for p in (target, *target.parents) if p.is_relative_to(work)):
                raise ToolRefused(f"{path}: symlinks are not followed")
            if path is None or target.is_dir():
                return self._module_listing(work, target, pins)
            if not target.is_file():
                raise ToolRefused(f"{path} is not a file of the modules {stack} calls")
            lines = target.read_text(encoding="utf-8", errors="replace").splitlines()
            numbered = [f"{n}| {line}" for n, line in enumerate(lines, 1)]
            text = "\n".join(numbered)
            return text if len(text) <= MAX_READ else text[:MAX_READ] + "\n… (truncated)"

    @staticmethod
    def _module_listing(work: Path, folder: Path, pins: Sequence[Any]) -> str:
        calls = [f"{getattr(p, 'key', '?')}: {getattr(p, 'source', '?')} {getattr(p, 'version', '')}".rstrip()
                 for p in pins]
        files = sorted(p.relative_to(work).as_posix() for p in folder.rglob("*")
                       if p.is_file() and not p.is_symlink() and p.name != "modules.json")
        return "\n".join(["modules: " + ("; ".join(calls) or "(none)"), *files])

    def tool_search(self, pattern: str) -> str:
        try:
            compiled = regex.compile(pattern)
        except regex.error as exc:
            raise ToolRefused(f"invalid regular expression: {exc}") from exc
        # The pattern is the caller's: a backtracking one ((a|aa)+$) could run for ever on one line. The
        # `regex` engine stops a match at a timeout and lets other threads run meanwhile (concurrent), so a
        # search holds no worker and no API process longer than its budget, whatever it is asked.
        deadline = time.monotonic() + SEARCH_SECONDS
        hits = []
        try:
            for relative, lines in self._text_files():
                for n, line in enumerate(lines, 1):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError
                    if compiled.search(line, timeout=left, concurrent=True):
                        hits.append(f"{relative}:{n}: {line.strip()}")
        except TimeoutError as exc:
            raise ToolRefused(f"the search took too long (its budget is {SEARCH_SECONDS:g} s) and was stopped: a "
                              "pattern with nested or overlapping repetition, such as (a+)+ or (a|aa)+, backtracks "
                              "without end on some lines; search for a plainer pattern") from exc
        return "\n".join(hits[:200]) or "(no matches)"

    def _text_files(self) -> Iterator[tuple[str, list[str]]]:
        """(path, lines) of every UTF-8 text file of the working copy, outside .git and symlinks."""
        for file in sorted(self.root.rglob("*")):
            relative = file.relative_to(self.root)
            if not file.is_file() or file.is_symlink() or ".git" in relative.parts:
                continue
            try:
                yield relative.as_posix(), file.read_text(encoding="utf-8").splitlines()
            except UnicodeDecodeError:
                continue

    def tool_write_file(self, path: str, content: str) -> str:
        if len(content) > MAX_WRITE:
            raise ToolRefused(f"content is too large ({len(content)} characters, at most {MAX_WRITE})")
        target = self.resolve(path, for_write=True)
        before = target.read_text(encoding="utf-8") if target.is_file() else None
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        verb = "created" if before is None else "wrote"
        return f"{verb} {path} ({len(content)} characters)\n{self._wrote(target, before, content)}"

    def tool_patch_file(self, path: str, old: str, new: str) -> str:
        target = self.resolve(path, for_write=True)
        if not target.is_file():
            raise ToolRefused(f"{path} does not exist; create it with write_file")
        text = target.read_text(encoding="utf-8")
        count = text.count(old) if old else 0
        if count != 1:
            hint = " (copy it without the line numbers read_file shows)" if count == 0 else ""
            raise ToolRefused(f"`old` occurs {count} times in {path}; it must occur exactly once{hint}")
        patched = text.replace(old, new)
        target.write_text(patched, encoding="utf-8")
        return f"patched {path}\n{self._wrote(target, text, patched)}"

    def restore(self, paths: list[str]) -> None:
        """Files an earlier turn of the conversation edited and kept (not yet committed): this turn's work too."""
        for relative in paths:
            self._note_write(relative)

    def tool_delete_file(self, path: str) -> str:
        target = self.resolve(path, for_write=True)
        if not target.is_file():
            raise ToolRefused(f"{path} does not exist")
        before = target.read_text(encoding="utf-8")
        target.unlink()
        return f"deleted {path}\n{self._wrote(target, before, None)}"

    def _note_write(self, relative: str) -> None:
        self.written.add(relative)
        stacks = {name for name, directory in self.stacks.items()
                  if relative == directory or relative.startswith(directory + "/")}
        self.touched |= stacks
        self.unpreviewed |= stacks  # its stack now needs a preview

    def _wrote(self, target: Path, before: str | None, after: str | None) -> str:
        """Note a write and answer with the diff it made (`before` None: it created the file; `after` None: it
        deleted it)."""
        relative = target.relative_to(self.root).as_posix()
        self._note_write(relative)
        diff = "".join(difflib.unified_diff((before or "").splitlines(keepends=True),
                                            (after or "").splitlines(keepends=True), f"a/{relative}", f"b/{relative}"))
        if not diff:  # no line changed: an empty file came or went, or the file was written back as it was
            if before is None:
                return "(an empty file)"
            return "(it was empty)" if after is None else "(no change: the file already had this content)"
        return diff if len(diff) <= MAX_DIFF else diff[:MAX_DIFF] + "\n… (diff truncated)"

    def tool_run_preview(self, stack: str) -> str:
        report = self._preview(stack, self.root)
        if stack in self.stacks:
            self.previews[stack] = report
            self.unpreviewed.discard(stack)
        return report.text

    def tool_ask_user(self, question: str) -> str:
        if not question.strip():
            raise ToolRefused("the question is empty")
        self.question = question.strip()
        return "your question goes to the person; this turn ends here and their answer arrives as their next message"

    def tool_finish(self, summary: str) -> str:
        if not summary.strip():
            raise ToolRefused("the summary must say what changed and why")
        blockers = self.finish_blockers(summary)
        if blockers:
            raise ToolRefused("cannot finish yet: " + "; ".join(blockers))
        self.summary = summary.strip()
        return "finished"

    def finish_blockers(self, summary: str) -> list[str]:
        """What stands between the edits made and a finished turn (empty: nothing)."""
        explained = explains_cannot_be_met(summary)
        blockers = [f"stack {s} changed since its last preview: call run_preview for {s}" for s in sorted(self.unpreviewed)]
        for stack, report in sorted(self.previews.items()):
            if stack in self.unpreviewed or stack not in self.touched:  # what it only looked at is not its work
                continue
            if report.error:
                blockers.append(f"the last preview of stack {stack} failed: fix the error (or undo your edit) and "
                                f"preview again")
            elif report.denies and not explained:
                blockers.append(f"the last preview of stack {stack} has policy denies ({', '.join(report.denies)}): "
                                f"fix them and preview again, or say in the summary that the request cannot be "
                                f"met and why (\"I cannot make this change: <policy> denies ...\")")
        return blockers
