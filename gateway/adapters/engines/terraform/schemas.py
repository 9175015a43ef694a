"""Which attributes the providers of a Terraform stack mark sensitive, kept in the workspace so that the same
providers are asked once, not once per process.

`terraform providers schema -json` starts every provider of the stack and can write tens of megabytes; what
the gateway keeps of it is small (per resource type, its sensitive attributes) and is decided entirely by
which provider builds run: the dependency lock file pins each one by its hashes, and `init` refuses a build
that does not match them. So the kept answer is filed under the hash of what the lock file pins (each provider's
version, constraints and hashes, however the file lays them out), with the Terraform binary and its CLI
configuration beside it: another provider build, binary or configuration is another file,
never a stale answer. A CLI configuration with `dev_overrides` runs providers the lock file does not pin:
those are asked every time. A kept file that cannot be read is asked again, never trusted in part.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

LOCK_FILE = ".terraform.lock.hcl"
KEPT_DIR = "provider-schemas"
# the dependency lock file as Terraform writes it: provider blocks of string arguments and one list of hashes
_PROVIDER_BLOCK = re.compile(r'provider\s+"([^"]+)"\s*\{([^{}]*)\}')
_HASHES = re.compile(r'^\s*hashes\s*=\s*\[([^\]]*)\]', re.MULTILINE)
_STRING_ARGUMENT = re.compile(r'^\s*(\w+)\s*=\s*"([^"]*)"\s*$', re.MULTILINE)
_QUOTED = re.compile(r'"([^"]*)"')

Pins = dict[str, tuple[str | None, str | None, frozenset[str]]]  # provider -> (version, constraints, hashes)

SensitiveByType = dict[str, frozenset[str]]


def sensitive_by_type(schema_json: Mapping[str, Any]) -> SensitiveByType:
    """From `providers schema -json`: each resource type's attributes marked sensitive."""
    found: SensitiveByType = {}
    for provider in (schema_json.get("provider_schemas") or {}).values():
        for rtype, schema in (provider.get("resource_schemas") or {}).items():
            attributes = (schema.get("block") or {}).get("attributes") or {}
            found[rtype] = frozenset(name for name, a in attributes.items() if a.get("sensitive"))
    return found


def same_pins(written: bytes, committed: bytes) -> bool:
    """Whether init left the lock file pinning what the committed one pins: each provider's version, constraints
    and hashes. Init writes the hashes sorted and its own header, so a lock file a person edited or git merged (a
    hash added first, say) is rewritten without pinning anything else; compared byte for byte, it would never be
    kept and every plan would run init. A lock file not read whole here counts only byte for byte."""
    if written == committed:
        return True
    pins = lock_pins(written)
    return pins is not None and pins == lock_pins(committed)


def lock_pins(lock: bytes) -> Pins | None:
    """Provider address -> (version, constraints, hashes), as the lock file pins them; None: not read whole (a
    block, an argument or a line that is not as Terraform writes it)."""
    try:
        text = lock.decode("utf-8")
    except UnicodeDecodeError:
        return None
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith(("#", "//")))
    if _PROVIDER_BLOCK.sub("", text).strip():
        return None
    pins: Pins = {}
    for block in _PROVIDER_BLOCK.finditer(text):
        pinned = _pinned(block[2])
        if pinned is None or block[1] in pins:
            return None
        pins[block[1]] = pinned
    return pins


def _pinned(body: str) -> tuple[str | None, str | None, frozenset[str]] | None:
    hashes = _HASHES.search(body)
    rest = _HASHES.sub("", body)
    arguments = dict(_STRING_ARGUMENT.findall(rest))
    if _STRING_ARGUMENT.sub("", rest).strip() or set(arguments) - {"version", "constraints"}:
        return None
    listed = hashes[1] if hashes else ""
    if _QUOTED.sub("", listed).replace(",", "").strip():
        return None
    return arguments.get("version"), arguments.get("constraints"), frozenset(_QUOTED.findall(listed))


def provider_identity(lock: Path, binary: Path, cli_config: Path | None) -> list[bytes] | None:
    """What decides which provider builds run: the lock file, the CLI configuration and the binary (which one,
    by path, size and time); None when the lock file cannot be read, or `dev_overrides` runs unpinned builds."""
    found = shutil.which(str(binary))
    config = cli_config or Path.home() / ".terraformrc"  # Terraform's own default when none is set
    try:
        parts = [_pinned_form(lock.read_bytes()), config.read_bytes() if config.is_file() else b""]
        if found is None:
            return None
        status = Path(found).stat()
    except OSError:
        return None
    if b"dev_overrides" in parts[1]:
        return None
    parts.append(f"{Path(found).resolve()} {status.st_size} {status.st_mtime_ns}".encode())
    return parts


def _pinned_form(lock: bytes) -> bytes:
    """What a lock file pins, the same however it is laid out (init rewrites a committed one sorted: the same
    providers, the same key); a lock file not read whole here is its bytes."""
    pins = lock_pins(lock)
    if pins is None:
        return lock
    return json.dumps(sorted((name, version, constraints, sorted(hashes))
                             for name, (version, constraints, hashes) in pins.items())).encode()


class KeptSchemas:
    """The sensitive attributes learned for each set of providers, as files under `directory`."""

    def __init__(self, directory: Path, binary: Path, cli_config: Path | None):
        self.directory = directory
        self.binary = binary
        self.cli_config = cli_config

    def key(self, run_directory: Path) -> str | None:
        """What decides the schemas of the stack initialised in `run_directory`, hashed (None: not keepable)."""
        parts = provider_identity(run_directory / LOCK_FILE, self.binary, self.cli_config)
        if parts is None:
            return None
        digest = hashlib.sha256()
        for part in parts:
            digest.update(len(part).to_bytes(8, "big") + part)
        return digest.hexdigest()

    def read(self, key: str) -> SensitiveByType | None:
        """The schemas kept under `key`; None when there are none, or they cannot be read whole."""
        try:
            kept = json.loads((self.directory / f"{key}.json").read_text())["sensitive"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not isinstance(kept, dict) or not all(isinstance(names, list) and all(isinstance(n, str) for n in names)
                                                 for names in kept.values()):
            return None
        return {rtype: frozenset(names) for rtype, names in kept.items()}

    def write(self, key: str, schemas: SensitiveByType) -> None:
        """Keep `schemas` under `key`, whole or not at all (another process may be reading it)."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        text = json.dumps({"sensitive": {rtype: sorted(names) for rtype, names in sorted(schemas.items())}})
        handle, temporary = tempfile.mkstemp(dir=self.directory, prefix=".schema-")
        try:
            with os.fdopen(handle, "w") as out:
                out.write(text)
            os.replace(temporary, self.directory / f"{key}.json")
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
