"""Identity providers through Authlib: OpenID Connect (any provider, by discovery) and GitHub OAuth.

Authlib does the protocol: the authorization URL with state, nonce and a PKCE (S256) challenge, the code
exchange with the verifier, and the ID token's verification (signature against the provider's JWKS, issuer,
audience, expiry, nonce, at_hash). This module only checks that the callback's state is the one the person's
own cookie kept, and turns Authlib's, joserfc's and httpx2's (Authlib's HTTP client) errors into a
`SignInRefused` that names the failed check.
"""

from __future__ import annotations

import secrets
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx2
from authlib.integrations.base_client import BaseApp, FrameworkIntegration, OAuthError
from authlib.integrations.base_client.sync_app import OAuth2Mixin
from authlib.integrations.base_client.sync_openid import OpenIDMixin
from authlib.integrations.httpx_client import OAuth2Client
from authlib.oauth2.rfc6749.errors import OAuth2Error
from joserfc.errors import ExpiredTokenError, InvalidClaimError, JoseError, MissingClaimError

from gateway.domain.errors import SignInRefused
from gateway.domain.sign_in import GITHUB_ISSUER, Identity
from gateway.ports import SignInStart

LEEWAY_SECONDS = 60  # clock skew allowed on exp/iat
TIMEOUT_SECONDS = 10.0


class _AuthlibClient(OAuth2Mixin, OpenIDMixin, BaseApp):
    """Authlib's framework-free OAuth 2 / OIDC client over httpx2 (the flow state is kept by the caller)."""

    client_cls = OAuth2Client


def _client(name: str, client_id: str, client_secret: str, verify: Path | bool, scope: str,
            **endpoints: Any) -> _AuthlibClient:
    return _AuthlibClient(FrameworkIntegration(name), name=name, client_id=client_id, client_secret=client_secret,
                          client_kwargs={"scope": scope, "code_challenge_method": "S256", "verify": _tls(verify),
                                         "timeout": TIMEOUT_SECONDS},
                          **endpoints)


def _tls(verify: Path | bool) -> ssl.SSLContext | bool:
    """One TLS context per provider, made once: each sign-in makes new HTTP clients, and loading the CA store
    for each would cost more than the rest of the sign-in."""
    if verify is False:
        return False
    return ssl.create_default_context(cafile=str(verify) if isinstance(verify, Path) else None)


def _checked_state(pending: Mapping[str, str] | None, callback: Mapping[str, str]) -> Mapping[str, str]:
    """The pending flow the callback belongs to: its state must be the one this browser's cookie kept."""
    if callback.get("error"):
        detail = callback.get("error_description") or callback["error"]
        raise SignInRefused("provider_error", f"the identity provider refused the sign-in: {detail[:200]}")
    state = callback.get("state") or ""
    if not state:
        raise SignInRefused("state", "the answer sent back here carries no state; start again from the sign-in page")
    if not pending:
        raise SignInRefused("state", "this sign-in was not started here, or was already used (no pending state); "
                                     "start again from the sign-in page")
    if not secrets.compare_digest(state, pending.get("state", "")):
        raise SignInRefused("state", "the sign-in's state does not match the one this browser started with "
                                     "(forged or replayed); start again from the sign-in page")
    if not callback.get("code"):
        raise SignInRefused("code", "the identity provider sent no authorization code")
    return pending


def _refusal(exc: Exception) -> SignInRefused:
    """Authlib's, joserfc's and httpx2's errors, as the check that failed."""
    if isinstance(exc, ExpiredTokenError):
        return SignInRefused("expired", "the ID token has expired; sign in again")
    if isinstance(exc, InvalidClaimError | MissingClaimError):
        claim = getattr(exc, "claim", None) or str(exc)
        checks = {"nonce": "nonce", "aud": "audience", "azp": "audience", "iss": "issuer"}
        check = next((v for k, v in checks.items() if k in str(claim)), "claims")
        return SignInRefused(check, f"the ID token's {check} is not valid ({exc}); sign in again")
    if isinstance(exc, JoseError):
        return SignInRefused("signature", f"the ID token could not be verified against the provider's keys ({exc})")
    if isinstance(exc, OAuthError | OAuth2Error):
        return SignInRefused("token", f"the identity provider did not redeem the code ({exc})")
    if isinstance(exc, httpx2.HTTPError):
        return SignInRefused("provider_unreachable", f"the identity provider could not be reached ({exc})")
    return SignInRefused("provider_answer", f"the identity provider's answer is not usable ({exc})")


class OidcProvider:
    """Any OpenID Connect provider, found by its discovery document; the ID token says who signed in."""

    def __init__(self, issuer: str, client_id: str, client_secret: str, label: str = "OpenID Connect",
                 scopes: str = "openid email profile", groups_claim: str | None = None, verify: Path | bool = True):
        self.name, self.label, self.issuer, self.groups_claim = "oidc", label, issuer, groups_claim
        self._client_id = client_id
        self._client = _client("oidc", client_id, client_secret, verify, scopes,
                               server_metadata_url=f"{issuer.rstrip('/')}/.well-known/openid-configuration")

    def start(self, redirect_uri: str) -> SignInStart:
        try:
            made = self._client.create_authorization_url(redirect_uri)
        except (httpx2.HTTPError, ValueError, RuntimeError) as exc:
            raise _refusal(exc) from exc
        return SignInStart(made["url"], {"state": made["state"], "nonce": made["nonce"],
                                         "code_verifier": made["code_verifier"], "redirect_uri": redirect_uri})

    def finish(self, pending: Mapping[str, str] | None, callback: Mapping[str, str]) -> Identity:
        flow = _checked_state(pending, callback)
        try:
            token = self._client.fetch_access_token(redirect_uri=flow["redirect_uri"], code=callback["code"],
                                                    code_verifier=flow["code_verifier"])
            if "id_token" not in token:
                raise SignInRefused("id_token", "the identity provider sent no ID token")
            claims = self._client.parse_id_token(token, nonce=flow["nonce"], leeway=LEEWAY_SECONDS, claims_options={
                "iss": {"essential": True, "value": self.issuer},
                "aud": {"essential": True, "value": self._client_id}})
        except SignInRefused:
            raise
        except Exception as exc:  # noqa: BLE001 - every library error becomes a refusal naming its check
            raise _refusal(exc) from exc
        return self._identity(dict(claims))

    def _identity(self, claims: dict[str, Any]) -> Identity:
        groups = None
        if self.groups_claim:
            raw = claims.get(self.groups_claim, [])
            groups = frozenset(str(g) for g in raw) if isinstance(raw, list) else frozenset({str(raw)})
        email = claims.get("email") if isinstance(claims.get("email"), str) else None
        display = str(claims.get("preferred_username") or email or claims.get("name") or claims["sub"])
        return Identity("oidc", str(claims["iss"]), str(claims["sub"]), display[:200], email,
                        claims.get("email_verified") is True, groups)


class GitHubOAuthProvider:
    """GitHub's OAuth app flow (with PKCE); the person is GitHub's numeric user id, read from /user."""

    def __init__(self, client_id: str, client_secret: str, web_url: str = "https://github.com",
                 api_url: str = "https://api.github.com", verify: Path | bool = True):
        self.name, self.label = "github", "GitHub"
        web, self._api = web_url.rstrip("/"), api_url.rstrip("/")
        self._client = _client("github", client_id, client_secret, verify, "read:user",
                               authorize_url=f"{web}/login/oauth/authorize",
                               access_token_url=f"{web}/login/oauth/access_token", api_base_url=f"{self._api}/")

    def start(self, redirect_uri: str) -> SignInStart:
        made = self._client.create_authorization_url(redirect_uri)
        return SignInStart(made["url"], {"state": made["state"], "code_verifier": made["code_verifier"],
                                         "redirect_uri": redirect_uri})

    def finish(self, pending: Mapping[str, str] | None, callback: Mapping[str, str]) -> Identity:
        flow = _checked_state(pending, callback)
        try:
            token = self._client.fetch_access_token(redirect_uri=flow["redirect_uri"], code=callback["code"],
                                                    code_verifier=flow["code_verifier"])
            if "error" in token:
                raise SignInRefused("token", f"GitHub did not redeem the code ({token.get('error')})")
            response = self._client.get("user", token=token, headers={"Accept": "application/vnd.github+json"})
            response.raise_for_status()
            user = response.json()
        except SignInRefused:
            raise
        except Exception as exc:  # noqa: BLE001 - every library error becomes a refusal naming its check
            raise _refusal(exc) from exc
        if not isinstance(user, dict) or not isinstance(user.get("id"), int) or not isinstance(user.get("login"), str):
            raise SignInRefused("provider_answer", "GitHub's /user answer names no numeric id and login")
        return Identity("github", GITHUB_ISSUER, str(user["id"]), user["login"])
