"""Terraform's version constraints for module calls (`version = "~> 5.0, != 5.1.0"`), as go-version reads them.

A constraint is a comma list of `op version` terms, all of which must hold; the operators are `=` (also a bare
version), `!=`, `>`, `>=`, `<`, `<=` and `~>` (pessimistic: only the rightmost segment written may grow, so `~> 1.2`
allows 1.2 up to but not 2.0, `~> 1.2.3` allows 1.2.3 up to but not 1.3.0, and `~> 5` allows 5.0 and every later
version). Versions are semantic versions (`1.2.3`, `1.2.3-beta.1`, `v1.2`); missing segments are zeros. A
prerelease is chosen only when a term names it exactly (the registry's rule: the newest matching *release*
otherwise).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from gateway.domain.errors import ConfigError

_VERSION = re.compile(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$")
_TERM = re.compile(r"^\s*(~>|>=|<=|!=|=|>|<)?\s*(\S+)\s*$")


@dataclass(frozen=True, order=False)
class Version:
    """A semantic version; `segments` says how many of major.minor.patch were written (for `~>`)."""

    release: tuple[int, int, int]
    prerelease: str = ""
    segments: int = 3

    @classmethod
    def parse(cls, text: str) -> Version:
        match = _VERSION.match(text.strip())
        if not match:
            raise ValueError(f"{text!r} is not a version")
        major, minor, patch, pre = match.groups()
        written = 1 + (minor is not None) + (patch is not None)
        return cls((int(major), int(minor or 0), int(patch or 0)), pre or "", written)

    def _key(self) -> tuple[tuple[int, int, int], int, tuple[tuple[int, int | str], ...]]:
        # a release sorts after its prereleases; prerelease identifiers compare numerically when numeric
        ids = tuple((0, int(p)) if p.isdigit() else (1, p) for p in self.prerelease.split(".")) if self.prerelease else ()
        return self.release, 0 if self.prerelease else 1, ids

    def __lt__(self, other: Version) -> bool:
        return self._key() < other._key()

    def __le__(self, other: Version) -> bool:
        return self._key() <= other._key()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Version) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        return ".".join(map(str, self.release)) + (f"-{self.prerelease}" if self.prerelease else "")


@dataclass(frozen=True)
class _Term:
    op: str
    version: Version

    def allows(self, v: Version) -> bool:
        w = self.version
        if self.op == "=":
            return v == w
        if self.op == "!=":
            return v != w
        if self.op == ">":
            return w < v
        if self.op == ">=":
            return w <= v
        if self.op == "<":
            return v < w
        if self.op == "<=":
            return v <= w
        # ~>: at least w, and the segments before the last one written stay the same (none for `~> 5`)
        if v < w:
            return False
        fixed = w.segments - 1
        return v.release[:fixed] == w.release[:fixed]


@dataclass(frozen=True)
class Constraint:
    """A parsed constraint string; the empty constraint allows every release."""

    text: str
    terms: tuple[_Term, ...]

    @classmethod
    def parse(cls, text: str | None) -> Constraint:
        terms = []
        for part in (text or "").split(","):
            if not part.strip():
                if text and text.strip():
                    raise ConfigError(f"version constraint {text!r}: an empty term")
                continue
            match = _TERM.match(part)
            try:
                version = Version.parse(match.group(2)) if match else None
            except ValueError:
                version = None
            if match is None or version is None:
                raise ConfigError(f"version constraint {text!r}: {part.strip()!r} is not `operator version`")
            terms.append(_Term(match.group(1) or "=", version))
        return cls(text or "", tuple(terms))

    def allows(self, version: Version) -> bool:
        if version.prerelease and not any(t.op == "=" and t.version == version for t in self.terms):
            return False
        return all(term.allows(version) for term in self.terms)

    def newest(self, available: Iterable[str]) -> str | None:
        """The newest of `available` (version strings as the registry lists them) this allows; unparsable ones
        are passed over."""
        best: tuple[Version, str] | None = None
        for text in available:
            try:
                version = Version.parse(text)
            except ValueError:
                continue
            if self.allows(version) and (best is None or best[0] < version):
                best = (version, text)
        return best[1] if best else None
