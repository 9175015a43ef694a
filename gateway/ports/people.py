"""Reaching people: signing in at an identity provider, and notices sent to their channels."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from gateway.domain.notifications import Channel, Notice
from gateway.domain.sign_in import Identity


@dataclass(frozen=True)
class SignInStart:
    """Where to send the person, and what the callback must match (kept server-side, under the state, until then)."""

    url: str
    pending: dict[str, str]  # state, nonce, code_verifier, redirect_uri


class IdentityProvider(Protocol):
    """An identity provider the pages offer (OpenID Connect, GitHub OAuth): authorization code flow with PKCE."""

    name: str  # in URLs: /login/NAME
    label: str  # on the sign-in page

    def start(self, redirect_uri: str) -> SignInStart:
        """The authorization URL with a fresh state (and nonce), and the PKCE verifier kept for the callback."""
        ...

    def finish(self, pending: Mapping[str, str], callback: Mapping[str, str]) -> Identity:
        """Redeem the callback's code with what `start` kept for its state (the caller found the pending sign-in by
        the callback's state, in the browser that started it, and used it) and verify the answer; `SignInRefused`
        (naming the check that failed) otherwise."""
        ...


class NotificationSender(Protocol):
    """Delivers one notice to one channel, with the channel's secret from the gateway's settings."""

    def send(self, channel: Channel, notice: Notice, delivery_id: str) -> str:
        """Deliver it; what the channel answered. `Unavailable` when a later attempt may succeed (no connection, a
        5xx, a rate limit, an SMTP 4xx), `BackendError` when it never will (refused), `ConfigError` when the gateway
        has no secret for the channel."""
        ...
