"""What one OpenID Connect sign-in costs the gateway: the whole round trip on loopback (sign-in page, start,
the provider's authorize, the callback: code exchange, ID token verified against the JWKS, session and event
written), against the test provider in tests/identity_providers.py. The first includes discovery and the JWKS.

It is not a test. Usage: python benchmarks/sign_in.py [N]
"""

from __future__ import annotations

import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from pydantic import SecretStr  # noqa: E402

from gateway.api.app import create_app  # noqa: E402
from gateway.services.admin.sign_in import link_identity  # noqa: E402
from tests.conftest import add_people, make_workspace  # noqa: E402
from tests.identity_providers import FakeOidcProvider, Person  # noqa: E402

BASE = "http://testserver"


def sign_in_once(client: TestClient, browser: httpx.Client) -> float:
    started = time.perf_counter()
    csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/login").text).group(1)  # type: ignore[union-attr]
    url = client.post("/login/oidc", data={"csrf": csrf}, follow_redirects=False).headers["location"]
    callback = browser.get(url, follow_redirects=False).headers["location"].removeprefix(BASE)
    assert client.get(callback, follow_redirects=False).status_code == 303
    return time.perf_counter() - started


def main(n: int) -> None:
    ws = make_workspace(Path(tempfile.mkdtemp()) / "home")
    people = add_people(ws)
    with FakeOidcProvider("gateway", "secret", f"{BASE}/auth/oidc/callback") as idp:
        s = ws.settings
        s.public_url, s.oidc_issuer, s.oidc_client_id, s.oidc_client_secret = BASE, idp.issuer, "gateway", SecretStr(
            "secret")
        link_identity(ws, people.admin, "bob", idp.issuer, "bob-sub")
        idp.sign_in_as(Person("bob-sub"))
        with TestClient(create_app(s, workers=0)) as client, httpx.Client() as browser:
            first = sign_in_once(client, browser)
            times = [sign_in_once(client, browser) for _ in range(n)]
    print(f"first sign-in (with discovery and JWKS): {first * 1000:.0f} ms; next {n}: "
          f"p50 {statistics.median(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
