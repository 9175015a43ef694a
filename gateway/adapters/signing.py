"""The audit trail's signing key: Ed25519 (the `cryptography` package), kept in a file outside the database."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.adapters.keyfiles import private_key_file
from gateway.domain.errors import ConfigError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

# `cryptography` is imported where a key is loaded or a signature checked, not with this module: every command
# wires the signer, few sign or verify a checkpoint.


class SigningKey:
    def __init__(self, key: Ed25519PrivateKey):
        from cryptography.hazmat.primitives import serialization

        self._key = key
        raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.public_key = base64.b64encode(raw).decode()

    @classmethod
    def load_or_create(cls, path: Path) -> SigningKey:
        """The key in `path` (PEM), made there with mode 0600 the first time; a readable-by-others key is refused."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        pem = private_key_file(path, lambda: Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
            "audit signing key")
        try:
            key = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{path} is not a PEM private key: {exc}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigError(f"{path} is not an Ed25519 key")
        return cls(key)

    def sign(self, message: bytes) -> str:
        return base64.b64encode(self._key.sign(message)).decode()


def signature_valid(public_key: str, message: bytes, signature: str) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key)).verify(base64.b64decode(signature), message)
    except (InvalidSignature, ValueError):
        return False
    return True


class FileSigner:
    """The Signer port over the key file: read (or made) the first time a checkpoint is signed or checked."""

    def __init__(self, path: Path):
        self.path = path
        self._key: SigningKey | None = None

    def _loaded(self) -> SigningKey:
        if self._key is None:
            self._key = SigningKey.load_or_create(self.path)
        return self._key

    def public_key(self) -> str:
        return self._loaded().public_key

    def sign(self, message: bytes) -> str:
        return self._loaded().sign(message)

    def valid(self, public_key: str, message: bytes, signature: str) -> bool:
        return signature_valid(public_key, message, signature)
