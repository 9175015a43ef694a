"""The declaration repository: trees at exact commits, merges, the branches the gateway writes, and the
clones where agents edit."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gateway.domain.repo_settings import RepoSettings


@dataclass(frozen=True)
class CommitInfo:
    sha: str
    author_name: str
    author_email: str
    message: str


class DeclarationRepo(Protocol):
    """The declaration repo. Reads name exact commits (what is at a commit never changes); refs are resolved fresh."""

    path: Path
    repository: str  # the repository's name among the gateway's (its stacks are `repository/stack` but the default's)

    def reopen(self) -> DeclarationRepo:
        """A handle of its own on the same repo, for another thread."""
        ...

    def pinned(self) -> DeclarationRepo:
        """A handle for one read: each ref resolved once, then the same for the rest of the read."""
        ...

    def main_branch(self) -> str: ...

    def resolve(self, ref: str) -> str:
        """The commit SHA a branch, tag or SHA names (NotFound when none)."""
        ...

    def branch_exists(self, branch: str) -> bool: ...

    def repo_settings(self, sha: str) -> RepoSettings:
        """gateway.yaml as of commit `sha`, its stacks named as the gateway keeps them (`repository/stack`)."""
        ...

    def merge_base(self, a: str, b: str) -> str: ...

    def changed_paths(self, base: str, head: str) -> list[str]: ...

    def diff(self, base: str, head: str) -> str: ...

    def commits(self, base: str, head: str) -> list[CommitInfo]:
        """The commits in `base..head`, oldest first."""
        ...

    def read_file(self, sha: str, path: str) -> str: ...

    def read_files(self, sha: str, subdir: str, suffix: str) -> Mapping[str, str]: ...

    def read_tree(self, sha: str, subdir: str) -> Mapping[str, str]: ...

    def module_directories(self, sha: str, stack_path: str) -> tuple[str, ...]: ...

    def export_stack(self, sha: str, stack_path: str, dest: Path) -> Path:
        """Write a stack and the local modules it calls under `dest`; returns the stack's directory."""
        ...

    def merge_preview(self, main_sha: str, head_sha: str) -> str: ...

    def merge_conflict(self, main_sha: str, head_sha: str) -> str | None:
        """Why `head_sha` does not merge cleanly into `main_sha` (None: it merges); writes nothing."""
        ...

    def first_parent_commits(self, since: str, until: str) -> list[tuple[str, str | None, str]]: ...

    def is_ancestor(self, older: str, newer: str) -> bool: ...

    def merged_as(self, sha: str, ref: str) -> str | None: ...

    def last_commit_touching(self, ref: str, path: str) -> str | None: ...

    def commits_touching(self, ref: str, path: str, limit: int = 20) -> list[str]: ...

    def tree_of(self, sha: str, subdir: str) -> str | None: ...

    def merge(self, main_sha: str, head_sha: str, into: str, message: str,
              before_moving: Callable[[str], None] | None = None) -> str: ...

    def set_branch(self, branch: str, sha: str) -> None:
        """Point `branch` at `sha` (created if missing)."""
        ...

    def commit_to_new_branch(self, base_sha: str, branch: str, files: Mapping[str, str], message: str,
                             author: str) -> str: ...

    def revert_merge_to_new_branch(self, merge_sha: str, onto_sha: str, branch: str, message: str,
                                   author: str) -> str: ...

    def delete_branch(self, branch: str) -> None: ...


class WorkingCopy(Protocol):
    """A clone of the declaration repo on disk. Only what is committed and pushed leaves it."""

    root: Path

    def is_dirty(self) -> bool:
        """Edited, added or removed files (untracked ones too)."""
        ...

    def new_branch(self, branch: str) -> None:
        """Start `branch` at the commit checked out."""
        ...

    def commit_and_push(self, message: str, author: str, ref: str, force: bool = False) -> None:
        """Commit every change as `author` and push the commit to `ref` of the declaration repo."""
        ...

    def fetch(self, ref: str) -> tuple[str, str | None] | None:
        """(commit, its parent) of `ref` in the declaration repo, fetched here; None when it does not exist."""
        ...

    def head(self) -> str: ...

    def uncommit_onto(self, ref: str) -> list[str]:
        """Move the current branch to `ref` and undo its last commit, keeping its edits: the files they change."""
        ...

    def delete_remote(self, ref: str) -> None: ...


class WorkingCopies(Protocol):
    def clone(self, dest: Path, branch: str | None = None, at: str | None = None) -> WorkingCopy:
        """A clone at `dest` on `branch` (made from main when it does not exist yet), or detached `at` a ref."""
        ...
