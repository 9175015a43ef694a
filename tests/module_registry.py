"""A Terraform module registry on loopback over HTTPS, for tests that must not reach the network.

It speaks the module registry protocol as registry.terraform.io does: service discovery at
`/.well-known/terraform.json` (`modules.v1`), `GET /v1/modules/<ns>/<name>/<provider>/versions`, and
`GET …/<version>/download` answering 204 with a relative `X-Terraform-Get`, from which the package is
served as a .tar.gz. Packages are the module files vendored in tests/fixtures/registry/<ns>/<name>/<provider>/
<version>/ (see its SOURCES.md) and those the sandbox corpus vendors (FROM_CORPUS), packed when first asked for. Its certificate is signed by a CA made here,
which the gateway trusts through GATEWAY_MODULE_CA_BUNDLE.
"""

from __future__ import annotations

import datetime
import io
import ipaddress
import json
import ssl
import tarfile
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

FIXTURES = Path(__file__).parent / "fixtures" / "registry"
# Packages already vendored for the sandbox corpus, as `terraform init` left them (tests/fixtures/corpus/SOURCES.md)
_VENDORED = Path(__file__).parent / "fixtures" / "corpus"
FROM_CORPUS = {
    ("terraform-aws-modules/vpc/aws", "3.14.2"): _VENDORED / "learn-count/.terraform/modules/vpc",
    ("terraform-aws-modules/security-group/aws", "4.9.0"): _VENDORED / "learn-count/.terraform/modules/app_security_group",
    ("terraform-aws-modules/elb/aws", "3.0.1"): _VENDORED / "learn-count/.terraform/modules/elb_http",
    ("terraform-aws-modules/vpc/aws", "5.1.2"): _VENDORED / "learn-modules-create/.terraform/modules/vpc",
    ("terraform-aws-modules/ec2-instance/aws", "5.5.0"): _VENDORED / "learn-modules-create/.terraform/modules/ec2_instances",
}


def make_tls_files(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a certificate for 127.0.0.1 signed by it: (ca.pem, server.pem, server.key)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gateway tests CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


def pack(directory: Path) -> bytes:
    """The folder as a .tar.gz, as a registry's package would be."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                archive.add(path, arcname=path.relative_to(directory).as_posix())
    return buffer.getvalue()


@dataclass
class Registry:
    """The running registry: its URL, its CA, what it was asked, and knobs a test may turn."""

    url: str
    ca_bundle: Path
    requests: list[str] = field(default_factory=list)
    token: str | None = None  # when set, every request must carry it as a bearer token
    extra_versions: dict[str, list[str]] = field(default_factory=dict)  # "ns/name/provider" -> listed, not served
    packages: dict[tuple[str, str], Path] = field(default_factory=lambda: dict(FROM_CORPUS))  # (module, version) -> files
    locations: dict[tuple[str, str], str] = field(default_factory=dict)  # (module, version) -> its X-Terraform-Get
    redirects: dict[str, str] = field(default_factory=dict)  # path -> where a 302 sends the client
    _archives: dict[tuple[str, str], bytes] = field(default_factory=dict)

    def versions(self, module: str) -> list[str]:
        served = [v for (m, v) in self.packages if m == module]
        folder = FIXTURES / module
        if folder.is_dir():
            served += [p.name for p in folder.iterdir() if p.is_dir()]
        return sorted(set(served)) + self.extra_versions.get(module, [])

    def archive(self, module: str, version: str) -> bytes | None:
        folder = self.packages.get((module, version)) or FIXTURES / module / version
        if not folder.is_dir():
            return None
        if (module, version) not in self._archives:
            self._archives[(module, version)] = pack(folder)
        return self._archives[(module, version)]

    def downloads(self) -> list[str]:
        return [r for r in self.requests if r.startswith("/archives/")]


def serve_registry(directory: Path) -> tuple[Registry, ThreadingHTTPServer]:
    """Start the registry in a thread; stop it with `server.shutdown()`."""
    ca, cert, key = make_tls_files(directory)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    registry = Registry(f"https://127.0.0.1:{server.server_address[1]}", ca)
    server.registry = registry  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return registry, server


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # quiet
        return

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        registry: Registry = self.server.registry  # type: ignore[attr-defined]
        registry.requests.append(self.path)
        if registry.token and self.headers.get("Authorization") != f"Bearer {registry.token}":
            return self._send(401, b'{"errors":["not authorized"]}')
        parts = self.path.strip("/").split("/")
        if self.path in registry.redirects:
            self.send_response(302)
            self.send_header("Location", registry.redirects[self.path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        if self.path == "/.well-known/terraform.json":
            return self._send(200, json.dumps({"modules.v1": "/v1/modules/"}).encode())
        if parts[:2] == ["v1", "modules"] and len(parts) == 6 and parts[5] == "versions":
            module = "/".join(parts[2:5])
            versions = registry.versions(module)
            if not versions:
                return self._send(404, b'{"errors":["not found"]}')
            body = {"modules": [{"source": module, "versions": [{"version": v} for v in versions]}]}
            return self._send(200, json.dumps(body).encode())
        if parts[:2] == ["v1", "modules"] and len(parts) == 7 and parts[6] == "download":
            self.send_response(204)
            where = registry.locations.get(("/".join(parts[2:5]), parts[5]))
            self.send_header("X-Terraform-Get", where or f"/archives/{'/'.join(parts[2:5])}/{parts[5]}.tar.gz")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        if parts[0] == "archives" and len(parts) == 5 and parts[4].endswith(".tar.gz"):
            data = registry.archive("/".join(parts[1:4]), parts[4].removesuffix(".tar.gz"))
            if data is not None:
                return self._send(200, data, "application/gzip")
        return self._send(404, b'{"errors":["not found"]}')

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
