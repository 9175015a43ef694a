"""Prompts are the `.md` files beside this module, loaded by name; the version in their front matter is recorded.

They are package data (read through `importlib.resources`), so an installed wheel carries them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from string import Template

from gateway.domain.repo_settings import RepoSettings

PROMPTS_DIR = resources.files(__name__)


@dataclass(frozen=True)
class Prompt:
    name: str
    version: str
    text: str


def load_prompt(name: str, directory: Traversable = PROMPTS_DIR) -> Prompt:
    raw = (directory / f"{name}.md").read_text(encoding="utf-8")
    version = "sha-" + hashlib.sha256(raw.encode()).hexdigest()[:12]
    text = raw
    if raw.startswith("---\n"):
        header, _, text = raw[4:].partition("\n---\n")
        for line in header.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "version":
                version = f"{value.strip()}+{version}"
    return Prompt(name, version, text.strip())


def fill_conventions(text: str, settings: RepoSettings) -> str:
    """The prompt's `$stacks`, `$required_tags`, ... from the repo's own gateway.yaml (on main), not the sample's."""
    policy = settings.policy
    protected = [f"{address} ({name})" for name, stack in sorted(settings.stacks.items()) for address in sorted(stack.protected)]
    return Template(text).safe_substitute(
        stacks=", ".join(f"{name} (`{stack.path}/`)" for name, stack in sorted(settings.stacks.items())) or "(none)",
        required_tags=", ".join(f"`{t}`" for t in policy.required_tags) or "(none required)",
        instance_types=", ".join(sorted(policy.approved_instance_types)) or "(any: the repo names no approved list)",
        protected_paths=", ".join(f"`{p}`" for p in settings.protected_paths),
        protected_resources=", ".join(protected) or "(none)",
        capacity_growth=str(policy.agent_capacity_growth_percent),
        max_deletes=str(policy.max_deletes),
    )
