"""A certified OpenID Provider for tests: oidc-provider (npm, pinned in tests/oidc_provider/package-lock.json), run
by Node on a free loopback port.

    with CertifiedOidcProvider(tmp, client_id, client_secret, redirect_uri, accounts) as op:
        callback = op.sign_in(authorization_url, "bob")  # the login and consent forms, posted as a browser would

Each account is what the provider knows of a person (`sub`, `email`, `groups`...); the provider, not the test,
decides which claims reach the ID token and which only its userinfo endpoint. `install()` runs
tests/oidc_provider/install.sh (npm ci from the lock file, skipped when already done); without Node the tests that
need it are skipped, saying so.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import httpx
import pytest

FOLDER = Path(__file__).parent / "oidc_provider"
START_SECONDS = 30.0


def install() -> str:
    """The node binary, with oidc-provider installed beside provider.mjs; skips the test when Node is absent."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the sign-in tests against a certified OpenID Provider (oidc-provider "
                    "from npm) need Node 20 or later")
    done = subprocess.run(["bash", str(FOLDER / "install.sh")], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        pytest.fail(f"tests/oidc_provider/install.sh failed:\n{done.stdout}\n{done.stderr}")
    return node


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class CertifiedOidcProvider:
    """oidc-provider in a Node process of its own, configured with one client and the given accounts."""

    def __init__(self, folder: Path, client_id: str, client_secret: str, redirect_uri: str,
                 accounts: dict[str, dict[str, Any]], userinfo_sub: dict[str, str] | None = None):
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.redirect_uri = redirect_uri
        folder.mkdir(parents=True, exist_ok=True)
        self._config = folder / "provider.json"
        self._config.write_text(json.dumps({
            "port": self.port, "accounts": accounts, "userinfo_sub": userinfo_sub or {},
            "client": {"client_id": client_id, "client_secret": client_secret, "redirect_uris": [redirect_uri]}}))
        self._log = folder / "provider.log"
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> CertifiedOidcProvider:
        node = install()
        with self._log.open("wb") as log:
            self._process = subprocess.Popen([node, str(FOLDER / "provider.mjs"), str(self._config)],
                                             stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"oidc-provider exited at start:\n{self._log.read_text()}")
            try:
                if httpx.get(f"{self.issuer}/.well-known/openid-configuration", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.__exit__()
        raise RuntimeError(f"oidc-provider did not serve its discovery document in {START_SECONDS:.0f}s:\n"
                           f"{self._log.read_text()}")

    def __exit__(self, *exc: object) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def sign_in(self, url: str, login: str, browser: httpx.Client | None = None, abort: bool = False) -> str:
        """Follow the provider from the gateway's authorization URL to the redirect back: sign in as `login`
        (any password), consent, and return the callback (path and query) the provider sends the browser to.
        `abort`: the person cancels at the login form instead. `browser`: the person's cookies at the provider."""
        own = browser is None
        browser = browser or httpx.Client()
        try:
            answer = browser.get(url)
            for _ in range(10):
                if answer.is_redirect:
                    location = urljoin(str(answer.url), answer.headers["location"])
                    if location.startswith(self.redirect_uri):
                        return location.removeprefix(self.redirect_uri.removesuffix("/auth/oidc/callback"))
                    answer = browser.get(location)
                    continue
                assert answer.status_code == 200, answer.text
                action = urljoin(str(answer.url), _field(r'<form[^>]*action="([^"]+)"', answer.text))
                if abort:
                    answer = browser.get(f"{action}/abort")
                    continue
                prompt = _field(r'name="prompt" value="([^"]+)"', answer.text)
                answer = browser.post(action, data={"prompt": prompt, "login": login, "password": "any"})
            raise AssertionError(f"the provider never sent the browser back: {answer.status_code} {answer.text[:500]}")
        finally:
            if own:
                browser.close()


def _field(pattern: str, html: str) -> str:
    found = re.search(pattern, html)
    assert found, f"no {pattern} in the provider's page:\n{html[:1000]}"
    return found.group(1)
