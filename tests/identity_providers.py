"""Identity providers for tests: real HTTP servers on 127.0.0.1, each in a thread.

    with FakeOidcProvider(client_id="gateway", client_secret="s3cret", redirect_uri=...) as idp:
        idp.sign_in_as(Person("alice-sub", "alice@example.com", groups=["platform"]))
        ...  # the gateway's settings name idp.issuer

`FakeOidcProvider` serves discovery, a JWKS (an RSA key made in the test), the authorization endpoint (it signs
in whoever `sign_in_as` named, at once, as a provider with a live session would) and the token endpoint, which
checks the client's secret, the redirect URI and the PKCE verifier (S256) and redeems each code once. Its ID
tokens can be spoiled on purpose: `spoil(nonce=..., aud=..., exp_offset=..., foreign_key=True)` applies to the
next token only. With `tls=True` it serves HTTPS with a certificate from its own CA (`ca_file`).

`FakeGitHubOAuth` serves GitHub's OAuth app flow (`/login/oauth/authorize`, `/login/oauth/access_token`, PKCE)
and `GET /user` for the token it issued.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import ipaddress
import json
import secrets
import ssl
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey


@dataclass
class Person:
    """Who the provider says signs in."""

    sub: str
    email: str | None = None
    email_verified: bool = True
    username: str | None = None
    groups: list[str] | None = None


@dataclass
class _Code:
    client_id: str
    redirect_uri: str
    nonce: str | None
    challenge: str
    person: Person


def s256(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


class _Server:
    """A ThreadingHTTPServer on a free loopback port, whose handler calls `route`."""

    def __init__(self, tls: bool = False, tmp: Path | None = None):
        self.requests: list[str] = []  # "METHOD path" of every request, in order
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                owner._dispatch(self, "GET")

            def do_POST(self) -> None:  # noqa: N802
                owner._dispatch(self, "POST")

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.ca_file: Path | None = None
        if tls:
            assert tmp is not None, "TLS needs a folder for the CA and certificate files"
            self.ca_file, context = _tls_context(tmp)
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> _Server:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _dispatch(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        parts = urlsplit(handler.path)
        self.requests.append(f"{method} {parts.path}")
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length).decode() if length else ""
        form = {k: v[0] for k, v in parse_qs(body).items()}
        status, headers, payload = self.route(method, parts.path, query, form, dict(handler.headers.items()))
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        handler.send_response(status)
        for name, value in headers.items():
            handler.send_header(name, value)
        if "Content-Type" not in headers:
            handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def route(self, method: str, path: str, query: dict[str, str], form: dict[str, str],
              headers: dict[str, str]) -> tuple[int, dict[str, str], Any]:
        raise NotImplementedError


def _client_credentials(form: dict[str, str], headers: dict[str, str]) -> tuple[str, str]:
    """client_secret_basic or client_secret_post, as RFC 6749 allows."""
    auth = headers.get("Authorization", "")
    if auth.startswith("Basic "):
        user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
        return user, password
    return form.get("client_id", ""), form.get("client_secret", "")


def _redirect(uri: str, params: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    return 302, {"Location": f"{uri}{'&' if '?' in uri else '?'}{urlencode(params)}"}, b""


def _code_refusal(code: _Code | None, form: dict[str, str], client_id: str) -> str | None:
    if code is None:
        return "unknown or used code"
    if code.client_id != client_id or code.redirect_uri != form.get("redirect_uri"):
        return "the code was issued to another client or redirect URI"
    if s256(form.get("code_verifier", "")) != code.challenge:
        return "PKCE verification failed"
    return None


class FakeOidcProvider(_Server):
    """A small OpenID Connect provider: discovery, JWKS, authorize, token."""

    def __init__(self, client_id: str, client_secret: str, redirect_uri: str, tls: bool = False,
                 tmp: Path | None = None):
        super().__init__(tls, tmp)
        self.client_id, self.client_secret, self.redirect_uri = client_id, client_secret, redirect_uri
        self.issuer = self.url
        self.key = RSAKey.generate_key(2048, parameters={"kid": "test-key-1", "use": "sig"})
        self._foreign = RSAKey.generate_key(2048, parameters={"kid": "test-key-1", "use": "sig"})
        self.person = Person("subject-0")
        self._codes: dict[str, _Code] = {}
        self._spoil: dict[str, Any] = {}
        self.refused: list[str] = []  # why the token endpoint said no
        self.discovery_overrides: dict[str, Any] = {}  # what the discovery document says instead

    def sign_in_as(self, person: Person) -> None:
        self.person = person

    def spoil(self, **how: Any) -> None:
        """Spoil the next ID token: nonce=..., aud=..., exp_offset=seconds, foreign_key=True."""
        self._spoil = how

    def route(self, method: str, path: str, query: dict[str, str], form: dict[str, str],
              headers: dict[str, str]) -> tuple[int, dict[str, str], Any]:
        if method == "GET" and path == "/.well-known/openid-configuration":
            return 200, {}, {
                "issuer": self.issuer, "authorization_endpoint": f"{self.url}/authorize",
                "token_endpoint": f"{self.url}/token", "jwks_uri": f"{self.url}/jwks",
                "response_types_supported": ["code"], "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["RS256"], "code_challenge_methods_supported": ["S256"],
                "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
                **self.discovery_overrides}
        if method == "GET" and path == "/jwks":
            return 200, {}, KeySet([self.key]).as_dict(private=False)
        if method == "GET" and path == "/authorize":
            return self._authorize(query)
        if method == "POST" and path == "/token":
            return self._token(form, headers)
        return 404, {}, {"error": "not_found"}

    def _authorize(self, query: dict[str, str]) -> tuple[int, dict[str, str], Any]:
        if query.get("client_id") != self.client_id or query.get("redirect_uri") != self.redirect_uri:
            return 400, {}, {"error": "invalid_request", "error_description": "unknown client or redirect URI"}
        if query.get("response_type") != "code" or query.get("code_challenge_method") != "S256":
            return _redirect(self.redirect_uri, {"error": "invalid_request", "state": query.get("state", "")})
        code = secrets.token_urlsafe(24)
        self._codes[code] = _Code(self.client_id, query["redirect_uri"], query.get("nonce"),
                                  query.get("code_challenge", ""), self.person)
        return _redirect(self.redirect_uri, {"code": code, "state": query.get("state", "")})

    def _token(self, form: dict[str, str], headers: dict[str, str]) -> tuple[int, dict[str, str], Any]:
        client_id, secret = _client_credentials(form, headers)
        if client_id != self.client_id or not secrets.compare_digest(secret, self.client_secret):
            self.refused.append("client authentication failed")
            return 401, {}, {"error": "invalid_client"}
        code = self._codes.pop(form.get("code", ""), None)
        refusal = _code_refusal(code, form, client_id)
        if refusal or code is None:
            self.refused.append(refusal or "no code")
            return 400, {}, {"error": "invalid_grant", "error_description": refusal}
        spoil, self._spoil = self._spoil, {}
        now = int(time.time())
        p = code.person
        claims: dict[str, Any] = {"iss": self.issuer, "sub": p.sub, "aud": spoil.get("aud", self.client_id),
                                  "iat": now, "exp": now + 300 + int(spoil.get("exp_offset", 0)),
                                  "nonce": spoil.get("nonce", code.nonce)}
        if p.email:
            claims |= {"email": p.email, "email_verified": p.email_verified}
        if p.username:
            claims["preferred_username"] = p.username
        if p.groups is not None:
            claims["groups"] = p.groups
        if spoil.get("exp_offset"):
            claims["iat"] = claims["exp"] - 300
        key = self._foreign if spoil.get("foreign_key") else self.key
        id_token = jwt.encode({"alg": "RS256", "kid": "test-key-1"}, claims, key)
        return 200, {"Cache-Control": "no-store"}, {"access_token": secrets.token_urlsafe(24), "token_type": "Bearer",
                                                   "expires_in": 300, "id_token": id_token}


class FakeGitHubOAuth(_Server):
    """GitHub's OAuth app flow and `GET /user`."""

    def __init__(self, client_id: str, client_secret: str, redirect_uri: str):
        super().__init__()
        self.client_id, self.client_secret, self.redirect_uri = client_id, client_secret, redirect_uri
        self.user: dict[str, Any] = {"id": 1, "login": "octocat"}
        self._codes: dict[str, _Code] = {}
        self._tokens: dict[str, dict[str, Any]] = {}

    def sign_in_as(self, github_id: int, login: str) -> None:
        self.user = {"id": github_id, "login": login}

    def route(self, method: str, path: str, query: dict[str, str], form: dict[str, str],
              headers: dict[str, str]) -> tuple[int, dict[str, str], Any]:
        if method == "GET" and path == "/login/oauth/authorize":
            if query.get("client_id") != self.client_id or query.get("redirect_uri") != self.redirect_uri:
                return 400, {"Content-Type": "text/plain"}, b"The redirect_uri is not associated with this application."
            code = secrets.token_urlsafe(10)
            self._codes[code] = _Code(self.client_id, query["redirect_uri"], None, query.get("code_challenge", ""),
                                      Person(str(self.user["id"]), username=str(self.user["login"])))
            return _redirect(self.redirect_uri, {"code": code, "state": query.get("state", "")})
        if method == "POST" and path == "/login/oauth/access_token":
            client_id, secret = _client_credentials(form, headers)
            if client_id != self.client_id or secret != self.client_secret:
                return 200, {}, {"error": "incorrect_client_credentials"}  # GitHub answers errors with 200
            code = self._codes.pop(form.get("code", ""), None)
            if _code_refusal(code, form, client_id) or code is None:
                return 200, {}, {"error": "bad_verification_code"}
            token = "gho_" + secrets.token_urlsafe(20)
            self._tokens[token] = {"id": int(code.person.sub), "login": code.person.username}
            return 200, {}, {"access_token": token, "token_type": "bearer", "scope": "read:user"}
        if method == "GET" and path == "/user":
            token = headers.get("Authorization", "").removeprefix("Bearer ").removeprefix("token ")
            if token not in self._tokens:
                return 401, {}, {"message": "Bad credentials"}
            return 200, {}, self._tokens[token]
        return 404, {}, {"message": "Not Found"}


def _tls_context(folder: Path) -> tuple[Path, ssl.SSLContext]:
    """A CA of the test's own and a certificate for 127.0.0.1 it signed: (the CA's file, the server's context)."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    start = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    end = start + dt.timedelta(days=1)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test identity provider CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    ca_file, cert_file, key_file = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    return ca_file, context

