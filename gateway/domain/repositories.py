"""The declaration repositories one gateway serves, and how a stack is named across them.

The repository a workspace was made with is the default one, `declarations`: its stacks keep the names its
gateway.yaml gives them, so a workspace made before there were several repositories reads the same. Every repository
added later names its stacks `repo/stack` wherever the gateway keeps or shows them (locks, plans, drift, break-glass,
the trail), so two repositories may both have a `network` stack and no record of one is ever read as the other's;
its gateway.yaml and policies still say `network`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING

from gateway.domain.errors import InputError

if TYPE_CHECKING:
    from gateway.domain.repo_settings import RepoSettings

DEFAULT_REPOSITORY = "declarations"
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


@dataclass(frozen=True)
class Repository:
    """A declaration repository the gateway serves (removed ones are kept: their proposals and trail stay)."""

    name: str
    added_at: datetime
    added_by: str
    removed_at: datetime | None = None
    removed_by: str | None = None

    @property
    def active(self) -> bool:
        return self.removed_at is None


def check_name(name: str) -> str:
    """A repository's name: lower case letters, digits, `.`, `_` and `-`, as a folder and a URL segment take it."""
    if not NAME.match(name) or name.endswith(".git") or name in (".", ".."):
        raise InputError(f"repository name {name!r}: use 1-63 lower case letters, digits, '.', '_' or '-' "
                         "(starting with a letter or digit, not ending in .git)")
    return name


def stack_prefix(repository: str) -> str:
    """What the repository's stack names begin with in the gateway's records ('' for the default repository)."""
    return "" if repository == DEFAULT_REPOSITORY else f"{repository}/"


def qualified(settings: RepoSettings, repository: str) -> RepoSettings:
    """`settings` as the gateway keeps them for `repository`: each stack named `repository/stack` (the default
    repository's names are unchanged). Paths stay the repository's own."""
    prefix = stack_prefix(repository)
    if not prefix:
        return settings
    stacks = {prefix + name: replace(stack, name=prefix + name, after=tuple(prefix + a for a in stack.after))
              for name, stack in settings.stacks.items()}
    return replace(settings, stacks=stacks, repository=repository)


def unqualified(stack: str, repository: str) -> str:
    """The name the repository's own files give `stack` (its gateway.yaml, its policies)."""
    return stack.removeprefix(stack_prefix(repository))


def holds_stack(repository: str, stack: str) -> bool:
    """Whether `stack`, as the gateway names it, is one of `repository`'s (the default one's have no `repo/`)."""
    prefix = stack_prefix(repository)
    return stack.startswith(prefix) if prefix else "/" not in stack
