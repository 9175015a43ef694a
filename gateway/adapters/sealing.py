"""Sealing at rest: what holds secrets in clear (saved plans, Terraform's plan files, the simulated cloud's state
and objects) is stored encrypted with Fernet (the `cryptography` package: AES-128-CBC with an HMAC), under a key
kept outside the database. Digests are computed over the plaintext, so approvals do not change."""

from __future__ import annotations

from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from gateway.adapters.keyfiles import private_key_file
from gateway.domain.errors import BackendError, ConfigError

TEXT_MARK = "sealed:v1:"
BYTES_MARK = b"sealed:v1:"


class Sealer:
    """Seals and opens values; values written before sealing existed (no mark) are read as they are."""

    def __init__(self, key: bytes | None):
        self._fernet = Fernet(key) if key else None

    @classmethod
    def from_key_file(cls, path: Path) -> Sealer:
        """The key in `path` (made there, 0600, the first time); a key readable by others is refused."""
        key = private_key_file(path, Fernet.generate_key, "data key")
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
        try:
            return self._fernet.decrypt(token)
        except InvalidToken:
            raise BackendError("a sealed value does not open with this data key (wrong key, or altered)") from None


UNSEALED = Sealer(None)  # for stores built without a key (tests of one part): values stay as they are
