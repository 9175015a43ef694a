"""Prompts are files in `prompts/`, loaded by name; the version in their front matter is recorded."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

PROMPTS_DIR = Path(__file__).resolve().parent.parent / "prompts"


@dataclass(frozen=True)
class Prompt:
    name: str
    version: str
    text: str


def load_prompt(name: str, directory: Path = PROMPTS_DIR) -> Prompt:
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
