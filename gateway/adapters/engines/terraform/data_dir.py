"""What `terraform init` makes in a stack's copy (its `.terraform` directory), kept and laid out again while nothing
that decides it has changed, so that a plan need not run `init` again.

In a fresh copy of a stack that calls no module the gateway has not laid out, `init` does two things: it installs
the providers (with a plugin cache, one link per provider package) and it records the backend
(`.terraform/terraform.tfstate`). Which packages it installs is decided by the dependency lock file when one is
committed: the lock pins each provider's version and the hashes its package must match, and init installs nothing
else. So what init makes is decided by the committed lock file, the Terraform binary, its CLI configuration
(mirrors, plugin cache), the backend the gateway writes (the stack's local state path) and the `TF_` settings of
the environment: all of them, hashed, name the kept directory.

A kept directory is made only from an init that was decided by those alone: a lock file was committed (not a
link) and init left it pinning what it pinned (every provider the configuration asks for; init may only have
written it in its own layout, the hashes sorted, as it rewrites one a person edited or git merged), the CLI
configuration has no `dev_overrides`, and init made nothing but the providers and the backend record (no modules
of its own, no workspace). Without a committed lock file, every plan runs `init`, as before.

Laid out again, the backend record is copied and each provider package linked where init links it. Terraform
itself checks, at every plan, that each package matches the lock file's hashes; the gateway checks first that the
kept directory is whole and as it was written (its manifest). A plan that still asks for `terraform init` (a
branch that asks for a provider its lock file does not pin, or whose kept package does not match) has the kept
directory dropped, and the plan is made again after a real `init` (see `TerraformEngine._plan`).

Layout, under the workspace's Terraform directory (0700):

    terraform-data-dirs/<key>/terraform.tfstate                       the backend record init wrote
    terraform-data-dirs/<key>/providers/HOST/NAMESPACE/TYPE/VERSION/PLATFORM   a link init made (plugin cache),
                                                                      or the package directory it installed
    terraform-data-dirs/<key>/kept.json                               the key and each entry, written last

A kept directory is made beside its place and renamed into it, so a reader finds it whole or not at all, and two
runs that keep the same one at once keep one of the two; one is dropped by renaming it away before removing it.

Each one laid out is marked used (its manifest's time). When a new one is kept (a lock file changed, most often),
those no run has used for `UNUSED_DAYS` are dropped, with what a run that crashed left half made: a package copied
in (no plugin cache) is a provider's whole size, and every lock file bump would otherwise keep another for good. A
run laying one out as it is dropped finds it gone, or its plan asks for init: either way init runs, as without it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gateway.adapters.engines.terraform.schemas import LOCK_FILE, provider_identity, same_pins

KEPT_DATA_DIRS = "terraform-data-dirs"
DATA_DIR = ".terraform"
BACKEND_RECORD = "terraform.tfstate"
PROVIDERS = "providers"
MODULES = "modules"
MANIFEST = "kept.json"
_PACKAGE_DEPTH = 5  # providers/HOST/NAMESPACE/TYPE/VERSION/PLATFORM
UNUSED_DAYS = 14
_LEFT_BEHIND = 24 * 3600  # seconds: a `.partial-` or `.dropped-` directory this old belongs to no running init
_MODULE_CALL = re.compile(r'^\s*module\s+["\w]', re.MULTILINE)  # a label may be quoted or not


class KeptDataDirs:
    """The `.terraform` directories init made, by what decides them (see the module docstring)."""

    def __init__(self, directory: Path, binary: Path, cli_config: Path | None):
        self.directory = directory
        self.binary = binary
        self.cli_config = cli_config

    def key(self, work: Path, backend_file: Path, env: Mapping[str, str]) -> str | None:
        """What decides what init makes in the stack's copy `work`, hashed; None: init must run (nothing pins it)."""
        lock = work / LOCK_FILE
        if lock.is_symlink() or not lock.is_file() or (work / DATA_DIR).is_symlink():
            return None
        if not _modules_laid_out(work) and _calls_modules(work):
            return None  # init installs the modules it finds: those are the configuration's, not the lock file's
        parts = provider_identity(lock, self.binary, self.cli_config)
        if parts is None:
            return None
        try:
            parts.append(backend_file.read_bytes())
        except OSError:
            return None
        parts.append(json.dumps(sorted((k, v) for k, v in env.items()
                                       if k.startswith("TF_") and not k.startswith("TF_VAR_"))).encode())
        digest = hashlib.sha256()
        for part in parts:
            digest.update(len(part).to_bytes(8, "big") + part)
        return digest.hexdigest()

    def lay_out(self, key: str, work: Path) -> bool:
        """Lay the kept directory `key` out in `work/.terraform` as init would leave it; False (and nothing laid
        out) when there is none, or it is not whole and as it was written."""
        kept = self.directory / key
        if not kept.exists():
            return False
        entries = _verified_entries(kept, key)
        if entries is None:  # not as it was written: never used, and made again by the next init
            self.drop(key)
            return False
        try:
            os.utime(kept / MANIFEST)  # used now: `prune` leaves it
        except OSError:
            pass
        data = work / DATA_DIR
        try:
            (data / PROVIDERS).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(kept / BACKEND_RECORD, data / BACKEND_RECORD)
            for package, entry in entries.items():
                target = data / PROVIDERS / package
                target.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(entry["link"] if "link" in entry else kept / PROVIDERS / package, target)
        except OSError:
            clear_laid_out(work)
            return False
        return True

    def keep(self, key: str, work: Path, committed_lock: bytes) -> bool:
        """Keep what init just made in `work`, when it was decided by `key` alone (see the module docstring)."""
        data = work / DATA_DIR
        try:
            if not same_pins((work / LOCK_FILE).read_bytes(), committed_lock):
                return False  # init added to the lock file: the configuration asks for more than it pins
            names = {p.name for p in data.iterdir()} - {MODULES}  # modules: the gateway's layout, read-only here
            if names != {PROVIDERS, BACKEND_RECORD} or (data / MODULES).is_symlink():
                return False
            packages = _packages(data / PROVIDERS)
        except OSError:
            return False
        if packages is None or (self.directory / key).exists():
            return False
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        partial = Path(tempfile.mkdtemp(dir=self.directory, prefix=".partial-"))
        try:
            shutil.copyfile(data / BACKEND_RECORD, partial / BACKEND_RECORD)
            entries: dict[str, dict[str, Any]] = {}
            for package, path in packages.items():
                target = partial / PROVIDERS / package
                target.parent.mkdir(parents=True, exist_ok=True)
                if path.is_symlink():  # the plugin cache's package: linked to, as init links it
                    link = os.path.normpath(os.path.join(path.parent, os.readlink(path)))
                    os.symlink(link, target)
                    entries[package] = {"link": link}
                else:
                    shutil.copytree(path, target, symlinks=True)
                    entries[package] = {"files": _listing(target)}
            record = hashlib.sha256((partial / BACKEND_RECORD).read_bytes()).hexdigest()
            (partial / MANIFEST).write_text(json.dumps({"key": key, "backend_record": record, "packages": entries},
                                                       sort_keys=True))
            os.rename(partial, self.directory / key)
        except OSError:
            shutil.rmtree(partial, ignore_errors=True)  # another run kept it first, or the disk refused
            return False
        self.prune(time.time())
        return True

    def prune(self, now: float) -> None:
        """Drop the kept directories no run has laid out for `UNUSED_DAYS`, and what crashed runs left half made."""
        try:
            found = list(self.directory.iterdir())
        except OSError:
            return
        for path in found:
            try:
                if path.name.startswith("."):
                    if now - path.stat().st_mtime > _LEFT_BEHIND:
                        shutil.rmtree(path, ignore_errors=True)
                elif now - (path / MANIFEST).stat().st_mtime > UNUSED_DAYS * 86400:
                    self.drop(path.name)
            except OSError:
                continue  # dropped meanwhile by another run

    def drop(self, key: str) -> None:
        """Forget the kept directory `key` (renamed away first: no reader finds half of it)."""
        kept = self.directory / key
        if not kept.exists():
            return
        gone = Path(tempfile.mkdtemp(dir=self.directory, prefix=".dropped-"))
        try:
            os.rename(kept, gone / key)
        except OSError:
            pass  # another run dropped it first
        shutil.rmtree(gone, ignore_errors=True)


def clear_laid_out(work: Path) -> None:
    """Remove from `work/.terraform` what `lay_out` put there (the modules the gateway laid out stay)."""
    data = work / DATA_DIR
    shutil.rmtree(data / PROVIDERS, ignore_errors=True)
    (data / BACKEND_RECORD).unlink(missing_ok=True)


def _modules_laid_out(work: Path) -> bool:
    return (work / DATA_DIR / MODULES / "modules.json").is_file()


def _calls_modules(work: Path) -> bool:
    """Whether the stack's own files may call a module (a JSON file is not read here: it counts as calling). OpenTofu
    reads `.tofu` files as Terraform reads `.tf` ones."""
    for path in work.iterdir():
        if path.name.endswith((".tf.json", ".tofu.json")):
            return True
        if path.name.endswith((".tf", ".tofu")):
            try:
                if _MODULE_CALL.search(path.read_text(encoding="utf-8", errors="replace")):
                    return True
            except OSError:
                return True
    return False


def _packages(providers: Path) -> dict[str, Path] | None:
    """Each provider package under `providers` by its relative path; None when the tree is not init's shape."""
    found: dict[str, Path] = {}
    level = [providers]
    for depth in range(_PACKAGE_DEPTH):
        deeper = []
        for directory in level:
            for path in directory.iterdir():
                if depth == _PACKAGE_DEPTH - 1:
                    if not (path.is_symlink() or path.is_dir()):
                        return None
                    found[path.relative_to(providers).as_posix()] = path
                elif path.is_symlink() or not path.is_dir():
                    return None
                else:
                    deeper.append(path)
        level = deeper
    return found


def _listing(directory: Path) -> dict[str, int]:
    """Each file under `directory` and its size (Terraform checks the content against the lock file's hashes)."""
    listing = {}
    for path in sorted(directory.rglob("*")):
        if path.is_symlink() or not path.is_dir():
            listing[path.relative_to(directory).as_posix()] = -1 if path.is_symlink() else path.stat().st_size
    return listing


def _verified_entries(kept: Path, key: str) -> dict[str, dict[str, Any]] | None:
    """The kept directory's packages, when it is whole and as its manifest says; else None."""
    try:
        manifest = json.loads((kept / MANIFEST).read_text())
        if manifest.get("key") != key or not isinstance(manifest.get("packages"), dict):
            return None
        if hashlib.sha256((kept / BACKEND_RECORD).read_bytes()).hexdigest() != manifest.get("backend_record"):
            return None
        packages = _packages(kept / PROVIDERS)
        entries: dict[str, dict[str, Any]] = manifest["packages"]
        if packages is None or set(packages) != set(entries):
            return None
        for package, path in packages.items():
            entry = entries[package]
            if "link" in entry:
                if not path.is_symlink() or os.readlink(path) != entry["link"]:
                    return None
            elif path.is_symlink() or _listing(path) != entry.get("files"):
                return None
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    return entries
