"""Terraform's hash and crypto functions: md5, sha*, base64sha*, file hashes, bcrypt, rsadecrypt, uuid, uuidv5."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import uuid as uuidlib

from gateway.adapters.engines.sandbox.functions.registry import (
    CallContext,
    FunctionError,
    Num,
    function,
    read_bytes,
    whole,
)


@function()
def _md5(str_: str) -> str:
    return hashlib.md5(str_.encode(), usedforsecurity=False).hexdigest()


@function()
def _sha1(str_: str) -> str:
    return hashlib.sha1(str_.encode(), usedforsecurity=False).hexdigest()


@function()
def _sha256(str_: str) -> str:
    return hashlib.sha256(str_.encode()).hexdigest()


@function()
def _sha512(str_: str) -> str:
    return hashlib.sha512(str_.encode()).hexdigest()


@function()
def _base64sha256(str_: str) -> str:
    return base64.b64encode(hashlib.sha256(str_.encode()).digest()).decode()


@function()
def _base64sha512(str_: str) -> str:
    return base64.b64encode(hashlib.sha512(str_.encode()).digest()).decode()


@function()
def _filemd5(context: CallContext, path: str) -> str:
    return hashlib.md5(read_bytes(context, path), usedforsecurity=False).hexdigest()


@function()
def _filesha1(context: CallContext, path: str) -> str:
    return hashlib.sha1(read_bytes(context, path), usedforsecurity=False).hexdigest()


@function()
def _filesha256(context: CallContext, path: str) -> str:
    return hashlib.sha256(read_bytes(context, path)).hexdigest()


@function()
def _filesha512(context: CallContext, path: str) -> str:
    return hashlib.sha512(read_bytes(context, path)).hexdigest()


@function()
def _filebase64sha256(context: CallContext, path: str) -> str:
    return base64.b64encode(hashlib.sha256(read_bytes(context, path)).digest()).decode()


@function()
def _filebase64sha512(context: CallContext, path: str) -> str:
    return base64.b64encode(hashlib.sha512(read_bytes(context, path)).digest()).decode()


@function(until_apply=True)
def _bcrypt(context: CallContext, str_: str, *cost: Num) -> str:
    # a new salt every run: Terraform's value changes on every plan; the sandbox shows it as known after apply
    # and writes a random placeholder of bcrypt's shape (nothing of the password: the simulated cloud checks none)
    rounds = whole(cost[0]) if cost else 10
    if not 4 <= rounds <= 31:
        raise FunctionError("cost must be between 4 and 31", 1)
    return f"$2a${rounds:02d}${base64.b64encode(secrets.token_bytes(40)).decode()[:53]}"


@function()
def _rsadecrypt(ciphertext: str, privatekey: str) -> str:
    from cryptography.hazmat.primitives.asymmetric import padding, rsa
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        key = load_pem_private_key(privatekey.encode(), password=None)
    except (ValueError, TypeError):
        raise FunctionError("invalid private key: not an unencrypted PEM RSA key", 1) from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise FunctionError("invalid private key: not an RSA key", 1)
    try:
        data = base64.b64decode(ciphertext, validate=True)
    except ValueError:
        raise FunctionError("failed to decode input: not valid base64", 0) from None
    try:
        return key.decrypt(data, padding.PKCS1v15()).decode()
    except ValueError:
        raise FunctionError("failed to decrypt: the ciphertext does not match the key", 0) from None


@function(until_apply=True)
def _uuid(context: CallContext) -> str:
    return str(uuidlib.uuid4())


_UUID_NAMESPACES = {"dns": uuidlib.NAMESPACE_DNS, "url": uuidlib.NAMESPACE_URL, "oid": uuidlib.NAMESPACE_OID,
                    "x500": uuidlib.NAMESPACE_X500}


@function()
def _uuidv5(namespace: str, name: str) -> str:
    space = _UUID_NAMESPACES.get(namespace)
    if space is None:
        try:
            space = uuidlib.UUID(namespace)
        except ValueError:
            raise FunctionError(f"uuidv5() doesn't support namespace prefix {json.dumps(namespace)}", 0) from None
    return str(uuidlib.uuid5(space, name))
