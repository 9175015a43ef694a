"""Remote modules installed as `terraform init` installs them, from a cache shared by every stack and engine.

Before an engine plans or applies a stack whose configuration (or a local module it calls) names a registry,
git or HTTP source, the stack is copied (with the local modules it calls, as the repo lays them out) and each
remote package is laid out in the copy's `.terraform/modules/<key>` with a `modules.json` manifest (Key,
Source, Version, Dir, as Terraform ≥ 1.1 writes it), nested calls included. The caller's directory (a commit's
export, or the agent's working copy) is never written to, and a `.terraform/` a branch commits is not used.

Packages are fetched once per (source, version) into the cache (the gateway's home, `modules/`), and every
install records a pin per call (key, source, version, sha256 digest of the package's files). The plan
records the pins; the apply installs exactly those and refuses if a package's digest differs from the plan's.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.adapters.modules.access import ModuleUnreachable
from gateway.adapters.modules.fetch import (
    ModuleFetcher,
    PackageSource,
    RegistrySource,
    drop_links,
    is_local,
    parse_source,
)
from gateway.adapters.modules.versions import Constraint
from gateway.domain.errors import ConfigError

if TYPE_CHECKING:
    from lark import Tree

# The HCL parser (lark, python-hcl2) is imported where a stack's files are first read, not with this module: the
# composition root makes the installer for every command, and a read plans nothing.

MAX_DEPTH = 10
MAX_CALLS = 500
PINS_KEY = "gateway_modules"  # where a plan document carries the pins of the modules it was planned with
_META = ".gateway-module.json"
_SKIPPED = shutil.ignore_patterns(".git", ".terraform")


@dataclass(frozen=True)
class ModulePin:
    """One module call's remote package, as planned: what an apply must install again."""

    key: str
    source: str
    version: str
    digest: str

    def to_json(self) -> dict[str, str]:
        return {"key": self.key, "source": self.source, "version": self.version, "digest": self.digest}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> ModulePin:
        return cls(str(value["key"]), str(value["source"]), str(value.get("version", "")), str(value["digest"]))


def pins_of(document: Mapping[str, Any]) -> dict[str, ModulePin] | None:
    """The pins a saved plan recorded, by key (None: the plan called no remote module)."""
    pins = document.get(PINS_KEY)
    if pins is None:
        return None
    return {p.key: p for p in (ModulePin.from_json(v) for v in pins)}


@dataclass(frozen=True)
class _Call:
    name: str
    source: str
    version: str | None
    where: str  # file:line: module "name"


@dataclass(frozen=True)
class _Package:
    directory: Path  # in the cache
    version: str
    digest: str


class ModuleInstaller:
    """Lays out remote modules for one stack at a time; the cache is shared (and safe to share between
    processes: a package is written beside it and renamed into place)."""

    def __init__(self, cache: Path, fetcher: ModuleFetcher):
        self.cache = cache
        self.fetcher = fetcher
        self._versions: dict[str, list[str]] = {}

    def calls_remote(self, directory: Path) -> bool:
        """Whether the stack in `directory`, or a local module it calls, names a remote source."""
        root, stack_path = _repository_of(directory)
        for folder in (stack_path, *_local_modules(root, stack_path)):
            if any(not is_local(call.source) for call in _calls(root / folder, root)):
                return True
        return False

    @contextmanager
    def installed(self, directory: Path, pins: Mapping[str, ModulePin] | None = None
                  ) -> Iterator[tuple[Path, list[ModulePin]]]:
        """A private copy of the stack with its remote modules laid out; with `pins`, exactly those packages."""
        root, stack_path = _repository_of(directory)
        with tempfile.TemporaryDirectory(prefix="gw-modules-") as tmp:
            top = Path(tmp) / "repo"
            work = top / stack_path if stack_path != "." else top
            for folder in (stack_path, *_local_modules(root, stack_path)):  # a module may hold the stack (`../..`)
                if (root / folder).is_dir():
                    shutil.copytree(root / folder, top / folder, symlinks=True, ignore=_SKIPPED, dirs_exist_ok=True)
            for marker in ("gateway.yaml",):
                if (root / marker).is_file() and not (top / marker).exists():
                    shutil.copyfile(root / marker, top / marker)
            if not (top / "gateway.yaml").exists():
                (top / "gateway.yaml").write_text("")  # marks the top a `../` source may reach
            yield work, self._lay_out(work, top, pins)

    def _lay_out(self, work: Path, top: Path, pins: Mapping[str, ModulePin] | None) -> list[ModulePin]:
        records: list[dict[str, str]] = [{"Key": "", "Source": "", "Dir": "."}]
        used: list[ModulePin] = []
        pending: list[tuple[Path, tuple[str, ...], Path | None]] = [(work, (), None)]  # folder, key path, package
        while pending:
            folder, path, package_top = pending.pop()
            if len(path) > MAX_DEPTH:
                raise ConfigError(f"{'.'.join(path)}: modules nest deeper than {MAX_DEPTH} levels (a cycle?)")
            for call in _calls(folder, top):
                key = ".".join((*path, call.name))
                if len(records) > MAX_CALLS:
                    raise ConfigError(f"{call.where}: more than {MAX_CALLS} module calls")
                if is_local(call.source):
                    target = (folder / call.source).resolve()
                    if package_top is not None and not target.is_relative_to(package_top.resolve()):
                        raise ConfigError(f"{call.where}: source \"{call.source}\" leaves its remote package")
                    if target.is_dir():
                        records.append({"Key": key, "Source": call.source, "Dir": _rel(target, work)})
                        pending.append((target, (*path, call.name), package_top))
                    continue  # the engine names a local source that is not a directory
                remote, pin = self._install(call, key, work, pins)
                used.append(pin)
                records.append({"Key": key, "Source": pin.source, **({"Version": pin.version}
                                if isinstance(remote[0], RegistrySource) else {}), "Dir": _rel(remote[1], work)})
                pending.append((remote[1], (*path, call.name), remote[2]))
        manifest = work / ".terraform" / "modules" / "modules.json"
        manifest.parent.mkdir(parents=True, exist_ok=True)
        records.sort(key=lambda r: r["Key"])  # Terraform writes them in key order
        manifest.write_text(json.dumps({"Modules": records}, indent=2))
        return sorted(used, key=lambda p: p.key)

    def _install(self, call: _Call, key: str, work: Path, pins: Mapping[str, ModulePin] | None
                 ) -> tuple[tuple[RegistrySource | PackageSource, Path, Path], ModulePin]:
        """Fetch (or take from the cache) the package of one remote call and copy it under .terraform/modules."""
        try:
            source = parse_source(call.source)
        except ValueError as exc:
            raise ConfigError(f"{call.where}: source \"{call.source}\": {exc}") from exc
        if call.version is not None and not isinstance(source, RegistrySource):
            raise ConfigError(f"{call.where}: `version` is only for registry sources, not {call.source!r}")
        pin = pins.get(key) if pins is not None else None
        if pins is not None and (pin is None or pin.source != str(source)):
            raise ConfigError(f"{call.where}: source \"{call.source}\" is not what was planned; plan again")
        try:
            with self.fetcher.bounded():  # the registry's answers and the package: one fetch, one deadline
                package = self._package(source, call, pin.version if pin else None)
        except ModuleUnreachable as exc:
            raise ConfigError(f"{call.where}: source \"{call.source}\" cannot be reached: {exc}") from exc
        if pin is not None and pin.digest != package.digest:
            raise ConfigError(f"{call.where}: source \"{call.source}\" at {pin.version or 'its address'} is not the "
                              "package that was planned (its files changed); plan again")
        installed = work / ".terraform" / "modules" / key
        shutil.copytree(package.directory, installed, ignore=shutil.ignore_patterns(_META), symlinks=True)
        drop_links(installed)  # never a link into the stack's copy (a package cached before links were dropped)
        module_dir = installed / source.subdir if source.subdir else installed
        if not module_dir.resolve().is_relative_to(installed.resolve()):
            raise ConfigError(f"{call.where}: source \"{call.source}\": the subdirectory {source.subdir!r} leaves its "
                              "package")
        if not module_dir.is_dir():
            raise ConfigError(f"{call.where}: source \"{call.source}\": the package has no folder {source.subdir!r}")
        return (source, module_dir, installed), ModulePin(key, str(source), package.version, package.digest)

    def _package(self, source: RegistrySource | PackageSource, call: _Call, pinned: str | None) -> _Package:
        if isinstance(source, RegistrySource):
            version = pinned or self._choose_version(source, call)
            cached = self._cached(f"registry {source.package} {version}")
            if cached:
                return cached
            address = self.fetcher.download_address(source, version)
            return self._fetch(f"registry {source.package} {version}", address, version)
        if not source.is_git:
            return self._fetch(f"url {source.url}", source, "")
        if pinned:  # the commit the plan used, whatever the ref points at now
            cached = self._cached(f"git {source.url} {pinned}")
            if cached:
                return cached
        with tempfile.TemporaryDirectory(prefix="gw-fetch-", dir=self._cache_root()) as tmp:
            commit = self.fetcher.fetch_package(source, Path(tmp) / "package")
            if pinned and commit != pinned:
                raise ModuleUnreachable(f"its ref now points at {commit[:12]}, not the planned {pinned[:12]}")
            return self._cached(f"git {source.url} {commit}") or self._store(
                f"git {source.url} {commit}", Path(tmp) / "package", commit)

    def _choose_version(self, source: RegistrySource, call: _Call) -> str:
        constraint = Constraint.parse(call.version)
        if source.package not in self._versions:
            self._versions[source.package] = self.fetcher.versions(source)
        available = self._versions[source.package]
        version = constraint.newest(available)
        if version is None:
            wanted = f"matching {call.version!r}" if call.version else "released"
            raise ModuleUnreachable(f"no version {wanted} (the registry lists {', '.join(available[:8]) or 'none'})")
        return version

    def _fetch(self, cache_key: str, package: PackageSource, version: str) -> _Package:
        cached = self._cached(cache_key)
        if cached:
            return cached
        with tempfile.TemporaryDirectory(prefix="gw-fetch-", dir=self._cache_root()) as tmp:
            self.fetcher.fetch_package(package, Path(tmp) / "package")
            return self._store(cache_key, Path(tmp) / "package", version)

    def _cache_root(self) -> Path:
        self.cache.mkdir(parents=True, exist_ok=True)
        return self.cache

    def _slot(self, cache_key: str) -> Path:
        return self._cache_root() / hashlib.sha256(cache_key.encode()).hexdigest()[:40]

    def _cached(self, cache_key: str) -> _Package | None:
        slot = self._slot(cache_key)
        try:
            meta = json.loads((slot / _META).read_text())
        except (OSError, ValueError):
            return None
        return _Package(slot, str(meta.get("version", "")), package_digest(slot))

    def _store(self, cache_key: str, fetched: Path, version: str) -> _Package:
        (fetched / _META).write_text(json.dumps({"key": cache_key, "version": version}))
        slot = self._slot(cache_key)
        try:
            os.rename(fetched, slot)
        except OSError:  # another process stored it first: theirs is used
            if not (slot / _META).is_file():
                raise
        return _Package(slot, version, package_digest(slot))


def package_digest(directory: Path) -> str:
    """sha256 over every file's path and content (links by their target), the cache's own note excepted."""
    digest = hashlib.sha256()
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory).as_posix()
        if rel == _META or path.is_dir() and not path.is_symlink():
            continue
        body = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
        digest.update(f"{rel}\0{len(body)}\0".encode() + body)
    return f"sha256:{digest.hexdigest()}"


def _calls(folder: Path, top: Path) -> Sequence[_Call]:
    """The module calls of one folder's .tf files, with where each is written (relative to `top`)."""
    from lark import Tree

    from gateway.adapters.hcl.reading import line_of, node_name, parse_hcl

    calls = []
    for path in sorted(folder.glob("*.tf")):
        if path.is_symlink() or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        if "module" not in text:
            continue
        shown = _shown(path, top)
        body = parse_hcl(shown, text).children[0]
        for child in body.children:
            if not (isinstance(child, Tree) and child.data == "block"):
                continue
            parts = [c for c in child.children if isinstance(c, Tree) and c.data != "new_line_or_comment"]
            if node_name(parts[0]) != "module" or len(parts) != 3:
                continue
            name = node_name(parts[1])
            where = f'{shown}:{line_of(child)}: module "{name}"'
            attributes = {node_name(a.children[0]): a.children[-1] for a in parts[-1].children
                          if isinstance(a, Tree) and a.data == "attribute"}
            source = _literal(attributes.get("source"))
            if source is None:
                continue  # the engine refuses a call without a literal source, with its line
            version = _literal(attributes.get("version")) if "version" in attributes else None
            calls.append(_Call(name, source, version, where))
    return calls


def _literal(expr: Tree | None) -> str | None:
    from gateway.adapters.modules.sources import string_literal

    return string_literal(expr) if expr is not None else None


def _shown(path: Path, top: Path) -> str:
    try:
        return path.resolve().relative_to(top.resolve()).as_posix()
    except ValueError:
        return path.name


def _rel(target: Path, work: Path) -> str:
    return Path(os.path.relpath(target.resolve(), work.resolve())).as_posix()


def _repository_of(directory: Path) -> tuple[Path, str]:
    from gateway.adapters.modules.sources import repository_root

    root = repository_root(directory)
    return root, posixpath.normpath(directory.resolve().relative_to(root).as_posix())


def _local_modules(root: Path, stack_path: str) -> tuple[str, ...]:
    from gateway.adapters.modules.sources import local_module_directories, read_directory_on_disk

    return local_module_directories(stack_path, read_directory_on_disk(root)) if stack_path != "." else ()
