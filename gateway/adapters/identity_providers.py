"""Identity providers through Authlib: OpenID Connect (any provider, by discovery) and GitHub OAuth.

Authlib does the protocol: the authorization URL with state, nonce and a PKCE (S256) challenge, the code
exchange with the verifier, and the ID token's verification (signature against the provider's JWKS, issuer,
audience, expiry, nonce, at_hash). This module checks what Authlib leaves to its caller: that the discovery
document names the configured issuer and sends nothing in clear, the authorization response's `iss` (RFC 9207),
and userinfo's subject, which must be the ID token's. A conformant provider puts `email`, `preferred_username`
and `groups` in userinfo, not the ID token, when it issues an access token: both are read, the signed ID token
first. The callback's state was checked by the caller (the pending sign-in waits server-side, under its state).
Authlib's, joserfc's and httpx2's (Authlib's HTTP client) errors become a `SignInRefused` naming the failed check.
"""

from __future__ import annotations

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
from gateway.domain.sign_in import GITHUB_ISSUER, Identity, combined_claims, insecure_url
from gateway.ports import SignInStart

LEEWAY_SECONDS = 60  # clock skew allowed on exp/iat
TIMEOUT_SECONDS = 10.0
ENDPOINTS = ("authorization_endpoint", "token_endpoint", "userinfo_endpoint", "jwks_uri")  # where secrets go


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


def _checked_answer(callback: Mapping[str, str]) -> None:
    """The provider's answer, for a pending sign-in the caller found by its state: a refusal, or a code."""
    if callback.get("error"):
        detail = callback.get("error_description") or callback["error"]
        raise SignInRefused("provider_error", f"the identity provider refused the sign-in: {detail[:200]}")
    if not callback.get("code"):
        raise SignInRefused("code", "the identity provider sent no authorization code")


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
            self._metadata()
            made = self._client.create_authorization_url(redirect_uri)
        except SignInRefused:
            raise
        except (httpx2.HTTPError, ValueError, RuntimeError) as exc:
            raise _refusal(exc) from exc
        return SignInStart(made["url"], {"state": made["state"], "nonce": made["nonce"],
                                         "code_verifier": made["code_verifier"], "redirect_uri": redirect_uri})

    def finish(self, pending: Mapping[str, str], callback: Mapping[str, str]) -> Identity:
        _checked_answer(callback)
        if callback.get("iss") and callback["iss"] != self.issuer:  # RFC 9207: another provider's answer
            raise SignInRefused("issuer", f"the answer sent back here comes from {callback['iss'][:200]}, not "
                                          f"{self.issuer}; start again from the sign-in page")
        try:
            metadata = self._metadata()  # another API process may have started this sign-in
            token = self._client.fetch_access_token(redirect_uri=pending["redirect_uri"], code=callback["code"],
                                                    code_verifier=pending["code_verifier"])
            if "id_token" not in token:
                raise SignInRefused("id_token", "the identity provider sent no ID token")
            claims = self._client.parse_id_token(token, nonce=pending["nonce"], leeway=LEEWAY_SECONDS,
                                                 claims_options={"iss": {"essential": True, "value": self.issuer},
                                                                 "aud": {"essential": True, "value": self._client_id}})
            userinfo = self._userinfo(metadata.get("userinfo_endpoint"), token, str(claims["sub"]))
        except SignInRefused:
            raise
        except Exception as exc:  # noqa: BLE001 - every library error becomes a refusal naming its check
            raise _refusal(exc) from exc
        return self._identity(dict(claims), userinfo)

    def _metadata(self) -> Mapping[str, Any]:
        """The discovery document, once it is known to name this issuer and to send nothing in clear."""
        metadata = self._client.load_server_metadata()
        if metadata.get("issuer") != self.issuer:
            raise SignInRefused("provider_answer", f"the provider's discovery document names issuer "
                                                   f"{str(metadata.get('issuer'))[:200]}, not {self.issuer} "
                                                   f"(GATEWAY_OIDC_ISSUER)")
        for name in ENDPOINTS:
            reason = insecure_url(str(metadata[name])) if metadata.get(name) else None
            if reason:
                raise SignInRefused("provider_answer", f"the provider's discovery document's {name} {reason[:300]}")
        return metadata

    def _userinfo(self, endpoint: str | None, token: Mapping[str, Any], subject: str) -> dict[str, Any] | None:
        """What the provider's userinfo says of the ID token's subject (None: it has no userinfo endpoint)."""
        if not endpoint or not token.get("access_token"):
            return None
        response = self._client.get(endpoint, token=dict(token), headers={"Accept": "application/json"})
        if response.status_code != 200:
            raise SignInRefused("userinfo", f"the identity provider's userinfo endpoint answered "
                                            f"{response.status_code}; sign in again")
        if not response.headers.get("content-type", "").startswith("application/json"):
            raise SignInRefused("userinfo", "the identity provider's userinfo answer is not JSON (a signed or "
                                            "encrypted userinfo answer is not supported)")
        answer = response.json()
        if not isinstance(answer, dict) or answer.get("sub") != subject:
            named = answer.get("sub") if isinstance(answer, dict) else None
            raise SignInRefused("userinfo", f"the identity provider's userinfo names subject {str(named)[:100]!r}, "
                                            f"not the ID token's {subject!r}: its claims are not used; sign in again")
        return answer

    def _identity(self, id_token: dict[str, Any], userinfo: Mapping[str, Any] | None) -> Identity:
        wanted = [("email", "email_verified"), ("preferred_username",), ("name",)]
        claims, sources = combined_claims(id_token, userinfo, wanted + ([(self.groups_claim,)]
                                                                         if self.groups_claim else []))
        groups = None
        if self.groups_claim:
            raw = claims.get(self.groups_claim, [])
            groups = frozenset(str(g) for g in raw) if isinstance(raw, list) else frozenset({str(raw)})
        email = claims.get("email") if isinstance(claims.get("email"), str) else None
        display = str(claims.get("preferred_username") or email or claims.get("name") or id_token["sub"])
        return Identity("oidc", str(id_token["iss"]), str(id_token["sub"]), display[:200], email,
                        claims.get("email_verified") is True, groups, sources)


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

    def finish(self, pending: Mapping[str, str], callback: Mapping[str, str]) -> Identity:
        _checked_answer(callback)
        try:
            token = self._client.fetch_access_token(redirect_uri=pending["redirect_uri"], code=callback["code"],
                                                    code_verifier=pending["code_verifier"])
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
