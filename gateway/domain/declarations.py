"""What a stack's declaration says about secrets, found by reading it (never by planning it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Unmasking:
    """A place a declaration tries to show a secret in clear, or to read a file outside its stack."""

    address: str  # var.db_password, output.c, local.x, aws_s3_bucket.b
    message: str  # names addresses, never a value
    by_function: bool = False  # nonsensitive() itself: an engine that cannot keep the mark would show the value


@dataclass(frozen=True)
class LiteralSecret:
    """A secret-like attribute set from a string literal: a secret in git."""

    address: str  # aws_db_instance.orders, provider.aws, module.db
    attribute: str  # the attribute's path, e.g. password or rule.secret_key; never its value
