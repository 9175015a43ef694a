"""Sealing at rest: what holds secrets in clear (saved plans, Terraform's plan files, the simulated cloud's state
and objects) is stored encrypted with Fernet (the `cryptography` package: AES-128-CBC with an HMAC), under a key
kept outside the database. Digests are computed over the plaintext, so approvals do not change."""

from __future__ import annotations

import base64
import binascii
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.adapters.keyfiles import private_key_file
from gateway.domain.errors import BackendError, ConfigError

if TYPE_CHECKING:
    from cryptography.fernet import Fernet

TEXT_MARK = "sealed:v1:"
BYTES_MARK = b"sealed:v1:"


class Sealer:
    """Seals and opens values; values written before sealing existed (no mark) are read as they are."""

    def __init__(self, key: bytes | None):
        self._key = _checked(key) if key else None
        self._made: Fernet | None = None

    @property
    def _fernet(self) -> Fernet | None:
        """Made on the first value sealed or opened: `cryptography` is imported then, not by a command that reads
        nothing sealed (`gateway show` reads masked previews)."""
        if self._key is not None and self._made is None:
            from cryptography.fernet import Fernet

            self._made = Fernet(self._key)
        return self._made

    @classmethod
    def from_key_file(cls, path: Path) -> Sealer:
        """The key in `path` (made there, 0600, the first time); a key readable by others is refused."""
        key = private_key_file(path, _new_key, "data key")
        try:
            return cls(key)
        except ValueError as exc:
            raise ConfigError(f"{path} is not a Fernet key: {exc}") from None

    def seal_text(self, value: str) -> str:
        if self._fernet is None:
            return value
        return TEXT_MARK + self._fernet.encrypt(value.encode()).decode()

    def open_text(self, value: str) -> str:
        if not value.startswith(TEXT_MARK):
            return value
        return self._open(value[len(TEXT_MARK):].encode()).decode()

    def seal_bytes(self, value: bytes) -> bytes:
        if self._fernet is None:
            return value
        return BYTES_MARK + self._fernet.encrypt(value)

    def open_bytes(self, value: bytes) -> bytes:
        if not value.startswith(BYTES_MARK):
            return value
        return self._open(value[len(BYTES_MARK):])

    def _open(self, token: bytes) -> bytes:
        if self._fernet is None:
            raise ConfigError("a sealed value was found but no data key is configured (GATEWAY_DATA_KEY_FILE)")
        from cryptography.fernet import InvalidToken

        try:
            return self._fernet.decrypt(token)
        except InvalidToken:
            raise BackendError("a sealed value does not open with this data key (wrong key, or altered)") from None


def _new_key() -> bytes:
    from cryptography.fernet import Fernet

    return Fernet.generate_key()


def _checked(key: bytes) -> bytes:
    """What Fernet checks of a key (32 bytes in URL-safe base64), checked when the workspace opens: a bad key file
    is found then, not at the first value sealed."""
    try:
        raw = base64.urlsafe_b64decode(key)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 32:
        raise ValueError("a Fernet key is 32 bytes in URL-safe base64")
    return key


UNSEALED = Sealer(None)  # for stores built without a key (tests of one part): values stay as they are
