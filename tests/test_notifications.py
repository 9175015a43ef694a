"""Notifications, end to end on loopback: a change that needs someone is told to a Slack-like webhook, Slack's
chat.postMessage, an SMTP server that requires STARTTLS (aiosmtpd, with a certificate made here and trusted through
the settings' CA file) and a webhook receiver that checks the HMAC signature, the timestamp and the delivery id.
Each event reaches each channel once; a delivery the receiver refuses or cannot take is retried with backoff and
then reported; no secret value is ever in a message."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from fastapi.testclient import TestClient
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.adapters.gateway_yaml import parse_repo_settings
from gateway.adapters.git.repo import committer_env
from gateway.adapters.metrics import PrometheusMetrics
from gateway.api.app import create_app
from gateway.composition import create_workspace
from gateway.config import Settings
from gateway.domain.errors import ConfigError, Refused
from gateway.domain.jobs import JobKind
from gateway.domain.notifications import (
    OUTBOX_MARKER,
    Channel,
    ChannelKind,
    Notice,
    NotificationEvent,
    NotificationSettings,
    NotificationStatus,
    Route,
    slack_body,
    summary_counts,
)
from gateway.domain.principals import GATEWAY, Role
from gateway.domain.proposal import Decision
from gateway.services.admin.bootstrap import bootstrap_simulator
from gateway.services.admin.users import add_principal
from gateway.services.change.jobs import recover_abandoned_work, run_job
from gateway.services.change.proposals import decide, open_proposal
from gateway.services.change.runner import apply_proposal
from gateway.services.day_two.break_glass import close_break_glass, open_break_glass, sweep_break_glass
from gateway.services.day_two.drift_records import check_drift
from gateway.services.notifications.outbox import queue_notifications
from gateway.services.workspace import Workspace
from gateway.worker import Worker

from .conftest import Clone, People, add_people, run_cli
from .test_lifecycle import EngineWithHook

HOOK_KEY = "hook-hmac-key-5f2c9d"
SLACK_TOKEN = "xoxb-test-token-77"
SMTP_PASSWORD = "smtp-pass-0a9b8c"
STAGING = "stacks/app-staging/main.tf"
E = NotificationEvent

NOTIFICATIONS = """
notifications:
  channels:
    ops-slack: {slack: {}}
    ops-chat: {slack: {channel: "#ops"}}
    platform-mail: {email: {to: [platform@example.com, oncall@example.com]}}
    audit-hook: {webhook: {}}
    app-hook: {webhook: {}}
  routes:
    - groups: [platform]
      channels: [ops-slack, ops-chat, platform-mail, audit-hook]
    - groups: [app]
      events: [applied]
      channels: [app-hook, audit-hook]
break_glass:
  groups: [oncall]
  codify_within: 1s
breaker:
  max_destroy_count: 0
  resetters: [platform]
"""


# --- the receivers ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Receivers:
    """One HTTP server for the Slack webhook, Slack's API and the signed webhooks; it checks what a real receiver
    would, and answers 500 to the next `failing[path]` requests of a path."""

    def __init__(self) -> None:
        self.received: dict[str, list[dict[str, Any]]] = {}
        self.refused: list[str] = []
        self.failing: Counter[str] = Counter()
        self.attempts: dict[str, list[tuple[str | None, str | None]]] = {}  # path: (delivery id, timestamp) tried
        self.seen_deliveries: set[str] = set()
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status, answer = outer.handle(self.path, dict(self.headers), body)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(answer.encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def handle(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, str]:
        with self.lock:
            self.attempts.setdefault(path, []).append((headers.get("X-Gateway-Delivery"),
                                                       headers.get("X-Gateway-Timestamp")))
            if self.failing[path] > 0:
                self.failing[path] -= 1
                return 500, '{"error": "down for a moment"}'
            if path.startswith("/hooks/"):
                why = self._check_signature(headers, body)
                if why:
                    self.refused.append(why)
                    return 401, json.dumps({"error": why})
            if path == "/api/chat.postMessage" and headers.get("Authorization") != f"Bearer {SLACK_TOKEN}":
                return 200, '{"ok": false, "error": "invalid_auth"}'
            self.received.setdefault(path, []).append(json.loads(body))
            return 200, '{"ok": true, "ts": "1700000000.0001"}' if path.startswith("/api/") else '"ok"'

    def _check_signature(self, headers: dict[str, str], body: bytes) -> str | None:
        """As a receiver of the gateway's webhooks checks one: the signature over the raw body, the body's own
        delivery id and time (which the signature covers) matching the headers, its age, and a replay."""
        expected = "sha256=" + hmac.new(HOOK_KEY.encode(), body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(headers.get("X-Gateway-Signature-256", ""), expected):
            return "bad signature"
        payload = json.loads(body)
        if (payload["delivery"], payload["sent_at"]) != (headers["X-Gateway-Delivery"], headers["X-Gateway-Timestamp"]):
            return "headers disagree with the signed body"
        if abs(datetime.now(UTC) - datetime.fromisoformat(payload["sent_at"])) > timedelta(minutes=5):
            return "too old"
        if payload["delivery"] in self.seen_deliveries:
            return f"replayed delivery {payload['delivery']}"
        self.seen_deliveries.add(payload["delivery"])
        return None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Mailbox:
    """aiosmtpd's handler: every message the SMTP server accepted, with whether it came over TLS."""

    def __init__(self) -> None:
        self.messages: list[tuple[Message, bool, list[str]]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 (aiosmtpd's name)
        self.messages.append((message_from_bytes(envelope.content), session.ssl is not None,
                              list(envelope.rcpt_tos)))
        return "250 OK"


def _certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA made here, and the SMTP server's certificate for 127.0.0.1 signed by it."""
    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("test CA")).issuer_name(name("test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    import ipaddress

    cert = (x509.CertificateBuilder().subject_name(name("127.0.0.1")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=1))
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


@pytest.fixture
def receivers() -> Iterator[Receivers]:
    server = Receivers()
    yield server
    server.close()


@pytest.fixture
def smtp(tmp_path: Path) -> Iterator[tuple[Mailbox, int, Path]]:
    """An SMTP server that offers STARTTLS, requires it, and takes a login only over it."""
    ca, cert, key = _certificates(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    mailbox = Mailbox()

    def authenticate(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
        ok = isinstance(data, LoginPassword) and (data.login, data.password) == (b"gateway", SMTP_PASSWORD.encode())
        return AuthResult(success=ok, handled=False)  # not handled: the server answers 535 itself

    port = _free_port()
    controller = Controller(mailbox, hostname="127.0.0.1", port=port, tls_context=context, require_starttls=True,
                            authenticator=authenticate, auth_require_tls=True)
    controller.start()
    yield mailbox, port, ca
    controller.stop()


def notifying_settings(home: Path, receivers: Receivers, smtp_port: int, ca: Path, hook_url: str | None = None,
                       without: str | None = None, **overrides: Any) -> Settings:
    channels = {
        "ops-slack": {"url": f"{receivers.url}/slack/T000/B000/XXXX"},
        "ops-chat": {"token": SLACK_TOKEN},
        "audit-hook": {"url": hook_url or f"{receivers.url}/hooks/audit", "key": HOOK_KEY},
        "app-hook": {"url": f"{receivers.url}/hooks/app", "key": HOOK_KEY},
    }
    channels.pop(without or "", None)
    values: dict[str, Any] = dict(
        home=home, token=None, lock_wait_seconds=2, public_url="https://gateway.example.com",
        notification_channels=channels, slack_api_url=f"{receivers.url}/api", smtp_host="127.0.0.1",
        smtp_port=smtp_port, smtp_username="gateway", smtp_password=SMTP_PASSWORD, smtp_ca_file=ca,
        notify_retry_seconds=0.05, notify_retry_max_seconds=0.2, notify_attempts=3, notify_timeout_seconds=5)
    return Settings(**{**values, **overrides})


@pytest.fixture
def ws(tmp_path: Path, receivers: Receivers, smtp: tuple[Mailbox, int, Path]) -> Iterator[Workspace]:
    _, port, ca = smtp
    workspace = create_workspace(notifying_settings(tmp_path / "home", receivers, port, ca))
    bootstrap_simulator(workspace)
    yield workspace
    workspace.close()


@pytest.fixture
def any_ws(tmp_path: Path, receivers: Receivers, smtp: tuple[Mailbox, int, Path],
           database_url: str) -> Iterator[Workspace]:
    """The same, once on SQLite and once on PostgreSQL."""
    _, port, ca = smtp
    workspace = create_workspace(notifying_settings(tmp_path / "home", receivers, port, ca,
                                                    database_url=database_url))
    bootstrap_simulator(workspace)
    yield workspace
    workspace.close()


@pytest.fixture
def team(ws: Workspace, tmp_path: Path) -> tuple[People, Clone]:
    people = add_people(ws)
    clone = Clone(ws, tmp_path / "clone")
    return people, notify_from_main(clone)


def notify_from_main(clone: Clone) -> Clone:
    clone.write("gateway.yaml", clone.read("gateway.yaml") + NOTIFICATIONS).push("notify the platform team",
                                                                                 author="admin")
    return clone


def deliver(ws: Workspace, timeout: float = 30) -> None:
    """What workers do: an outbox pass, then every notify job until none is queued (retries included)."""
    queue_notifications(ws)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = ws.store.queue.claim("test-worker")
        if job is not None:
            assert job.kind == JobKind.NOTIFY, job
            run_job(ws, job, "test-worker")
            continue
        with ws.store.session(readonly=True) as session:
            if not session.notifications.list(NotificationStatus.QUEUED):
                return
        time.sleep(0.05)
    raise AssertionError("notifications still queued")


def events_seen(receivers: Receivers, mailbox: Mailbox) -> dict[str, Counter[str]]:
    """Which events each channel received, by the titles a person reads (Slack, e-mail) or the event field."""
    prefixes = {"Approval wanted": E.APPROVAL_WANTED, "Rejected by": E.REJECTED, "Applied and": E.APPLIED,
                "Apply failed": E.APPLY_FAILED, "Applied but not merged": E.UNMERGED, "Drift found": E.DRIFT_FOUND,
                "Break-glass window": E.BREAK_GLASS_OVERDUE, "Circuit breaker tripped": E.BREAKER_TRIPPED}

    def by_title(title: str) -> str:
        return next(event.value for prefix, event in prefixes.items() if title.startswith(prefix))

    seen = {
        "ops-slack": Counter(by_title(m["text"]) for m in receivers.received.get("/slack/T000/B000/XXXX", [])),
        "ops-chat": Counter(by_title(m["text"]) for m in receivers.received.get("/api/chat.postMessage", [])),
        "platform-mail": Counter(by_title(" ".join(str(m["Subject"]).split()).removeprefix("[change gateway] "))
                                 for m, _, _ in mailbox.messages),
        "audit-hook": Counter(m["event"] for m in receivers.received.get("/hooks/audit", [])),
        "app-hook": Counter(m["event"] for m in receivers.received.get("/hooks/app", [])),
    }
    return seen


def propose(ws: Workspace, people: People, clone: Clone, branch: str, old: str, new: str, path: str = STAGING,
            reason: str | None = None) -> int:
    clone.branch(branch).edit(path, old, new).push(branch)
    return open_proposal(ws, people.alice, branch, reason or f"change {branch}").id


# --- the tests -------------------------------------------------------------------------------


def test_each_event_reaches_each_channel_once(ws: Workspace, team: tuple[People, Clone],
                                              receivers: Receivers, smtp: tuple[Mailbox, int, Path],
                                              tmp_path: Path) -> None:
    people, clone = team
    mailbox = smtp[0]
    rejected = propose(ws, people, clone, "bigger", '"t3.small"', '"t3.medium"')  # approval wanted
    deliver(ws)
    decide(ws, people.bob, rejected, Decision.REJECT, "not in the freeze")  # rejected

    applied = propose(ws, people, clone, "tags", '"cc-3003"', '"cc-3004"')  # approval wanted
    deliver(ws)  # workers pass every few seconds: the approval is wanted before anyone gives it
    decide(ws, people.bob, applied, Decision.APPROVE, "ok")
    assert apply_proposal(ws, people.alice, applied).succeeded  # applied

    ws.simulator.inject_fault("app-prod", "aws_lb.web", "AccessDenied: elasticloadbalancing:ModifyLoadBalancer")
    failing = propose(ws, people, clone, "prod-tags", '"cc-3003"', '"cc-3009"', "stacks/app-prod/main.tf")
    deliver(ws)
    decide(ws, people.bob, failing, Decision.APPROVE, "ok")
    assert not apply_proposal(ws, people.alice, failing).succeeded  # apply failed

    unmerged = propose(ws, people, clone, "bigger-2", '"t3.small"', '"t3.large"')
    deliver(ws)
    decide(ws, people.bob, unmerged, Decision.APPROVE, "ok")
    pusher = Clone(ws, tmp_path / "pusher")

    def someone_pushes() -> None:
        pusher.branch("main").edit(STAGING, "ttl     = 300", "ttl     = 60")
        pusher.repo.git.add("-A")
        pusher.repo.git.execute(["git", "commit", "-qm", "hotfix"], env=committer_env("mallory", "m@example.com"))
        pusher.repo.git.push("-q", "origin", "HEAD:main")

    engine, ws.engine = ws.engine, EngineWithHook(ws.engine, after_apply=someone_pushes)
    assert apply_proposal(ws, people.alice, unmerged).unmerged  # unmerged
    ws.engine = engine

    ws.simulator.edit_object("network", "aws_vpc.main", {"enable_dns_hostnames": False})
    assert check_drift(ws, people.admin, "network").outcome == "opened"  # drift found

    olga, _ = add_principal(ws, people.admin, "olga", frozenset({Role.REQUESTER}), frozenset({"oncall"}))
    window = open_break_glass(ws, olga, "app-staging", "incident 9", timedelta(hours=1))
    ws.simulator.edit_object("app-staging", "aws_instance.web[0]", {"instance_type": "t3.xlarge"})
    close_break_glass(ws, olga, window.id, "over")  # its check finds the drift: drift found (expected)
    time.sleep(1.2)
    assert sweep_break_glass(ws) == [f"window {window.id} overdue"]  # break-glass overdue

    clone.repo.git.fetch("-q", "origin")  # main has the hotfix now
    clone.branch("drop-dns")
    clone.write(STAGING, clone.read(STAGING).split('resource "aws_route53_record"')[0]).push("drop-dns")
    with pytest.raises(Refused, match="circuit breaker"):
        open_proposal(ws, people.agent, "drop-dns", "tidy the DNS", requester=people.alice)  # breaker tripped

    deliver(ws)
    expected = Counter({E.APPROVAL_WANTED.value: 4, E.REJECTED.value: 1, E.APPLIED.value: 1,
                        E.APPLY_FAILED.value: 1, E.UNMERGED.value: 1, E.DRIFT_FOUND.value: 2,
                        E.BREAK_GLASS_OVERDUE.value: 1, E.BREAKER_TRIPPED.value: 1})
    seen = events_seen(receivers, mailbox)
    for channel in ("ops-slack", "ops-chat", "platform-mail", "audit-hook"):  # audit-hook: two routes, once
        assert seen[channel] == expected, (channel, seen[channel])
    # app-staging's approvers include the app group, whose route takes only `applied`
    assert seen["app-hook"] == Counter({E.APPLIED.value: 1})
    assert receivers.refused == []

    # e-mail went over STARTTLS, after a login, to both recipients, with the masked summary and the link
    assert all(over_tls for _, over_tls, _ in mailbox.messages)
    assert all(sorted(rcpt) == ["oncall@example.com", "platform@example.com"] for _, _, rcpt in mailbox.messages)
    wanted = next(m for m, _, _ in mailbox.messages if "Approval wanted: proposal " + str(rejected) in m["Subject"])
    text = wanted.get_payload(decode=True).decode()
    assert "Stack app-staging: 0 to add, 1 to change, 0 to destroy; risk" in text
    assert "Needs: needs 1 approval(s)" in text and "Approvers: groups app, platform" in text
    assert f"Review: https://gateway.example.com/proposals/{rejected}" in text
    hook = next(m for m in receivers.received["/hooks/audit"] if m["event"] == "apply_failed")
    assert hook["proposal_id"] == failing and "AccessDenied" in hook["text"]

    # once: another pass over the whole trail (a worker that read it again) queues nothing new
    with ws.store.session() as session:
        session.main.set_marker(OUTBOX_MARKER, "0")
    assert queue_notifications(ws) == []
    deliver(ws)
    assert events_seen(receivers, mailbox) == seen
    with ws.store.session(readonly=True) as session:
        delivered = session.notifications.list(NotificationStatus.DELIVERED, limit=1000)
        trail = Counter(e.kind for e in session.audit.events() if e.kind.startswith("notification."))
    assert len(delivered) == sum(sum(c.values()) for c in seen.values()) == trail["notification.delivered"]
    assert "notification.failed" not in trail

    listing = run_cli(["notifications", "--status", "delivered"], ws.settings.home, people.tokens["dana"])
    assert listing.returncode == 0, listing.stderr
    assert f"delivered approval_wanted     email:platform-mail proposal {rejected} attempts 1" in listing.stdout


def test_a_failing_delivery_is_retried_with_backoff_then_reported(any_ws: Workspace, receivers: Receivers,
                                                                 tmp_path: Path) -> None:
    ws, people = any_ws, add_people(any_ws)
    clone = notify_from_main(Clone(ws, tmp_path / "clone"))
    receivers.failing["/slack/T000/B000/XXXX"] = 2  # down for a moment: the third attempt gets through
    receivers.failing["/hooks/audit"] = 100  # down for good
    proposal = propose(ws, people, clone, "bigger", '"t3.small"', '"t3.medium"')
    ws.metrics = metrics = PrometheusMetrics()  # what an operator alerts on: deliveries by channel and outcome
    started = time.monotonic()
    deliver(ws)
    took = time.monotonic() - started
    with ws.store.session(readonly=True) as session:
        by_target = {n.channel.name: n for n in session.notifications.list()}
        trail = [e for e in session.audit.events() if e.kind.startswith(("notification.", "job.retrying"))]
    slack, hook = by_target["ops-slack"], by_target["audit-hook"]
    assert (slack.status, slack.attempts) == (NotificationStatus.DELIVERED, 3)
    assert len(receivers.received["/slack/T000/B000/XXXX"]) == 1
    assert (hook.status, hook.attempts) == (NotificationStatus.FAILED, 3)
    assert hook.error is not None and "gave up after 3 attempt(s)" in hook.error and "HTTP 500" in hook.error
    assert "/hooks/audit" not in receivers.received
    tried = receivers.attempts["/hooks/audit"]
    assert len(tried) == 3 and len({delivery for delivery, _ in tried}) == 1  # a receiver can tell a retry
    assert took >= 0.05 + 0.1  # waited the backoff: 0.05 s, then 0.1 s
    failed = [e for e in trail if e.kind == "notification.failed"]
    assert [(e.payload["target"], e.payload["attempts"], e.payload["proposal"]) for e in failed] == \
        [("audit-hook", 3, proposal)]
    assert sum(1 for e in trail if e.kind == "job.retrying") == 4  # two for Slack, two for the hook
    counted = {(s.labels["channel"], s.labels["outcome"]): s.value
               for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
               if family.name == "gateway_notifications" for s in family.samples if s.name.endswith("_total")}
    delivered = Counter(n.channel.kind.value for n in by_target.values() if n.status == NotificationStatus.DELIVERED)
    assert {k: v for k, v in counted.items() if k[1] == "delivered" and v} == \
        {(k, "delivered"): v for k, v in delivered.items()}  # every series is there from the start, at 0
    assert counted[("slack", "retried")] == 2 and counted[("webhook", "retried")] == 2
    assert counted[("webhook", "failed")] == 1

    job = run_cli(["job", str(hook.job_id)], ws.settings.home, people.tokens["dana"], ws.settings.database_url)
    assert f"notify of notification {hook.id} [failed]" in job.stdout and "gave up after 3" in job.stderr
    listing = run_cli(["notifications", "--status", "failed"], ws.settings.home, people.tokens["dana"],
                      ws.settings.database_url)
    assert listing.returncode == 0, listing.stderr
    assert "failed    approval_wanted     webhook:audit-hook" in listing.stdout and "HTTP 500" in listing.stdout
    with TestClient(create_app(ws.settings, workers=0)) as client:
        answer = client.get("/api/v1/notifications", params={"status": "failed"},
                            headers={"Authorization": f"Bearer {people.tokens['dana']}"})
        assert answer.status_code == 200, answer.text
        [listed] = answer.json()
        assert (listed["target"], listed["attempts"], listed["proposal_id"]) == ("audit-hook", 3, proposal)
        assert listed["title"].startswith(f"Approval wanted: proposal {proposal}")
        refused = client.get("/api/v1/notifications", headers={"Authorization": f"Bearer {people.tokens['alice']}"})
        assert refused.status_code == 403, refused.text


def test_a_receiver_that_is_down_and_a_refusal_are_reported(tmp_path: Path, receivers: Receivers,
                                                            smtp: tuple[Mailbox, int, Path]) -> None:
    _, port, ca = smtp
    down = f"http://127.0.0.1:{_free_port()}/hooks/audit"  # nothing listens there
    settings = notifying_settings(tmp_path / "home", receivers, port, ca, hook_url=down, smtp_password="wrong-password")
    ws = create_workspace(settings)
    bootstrap_simulator(ws)
    try:
        people = add_people(ws)
        clone = Clone(ws, tmp_path / "clone")
        notify_from_main(clone)
        propose(ws, people, clone, "bigger", '"t3.small"', '"t3.medium"')
        deliver(ws)
        with ws.store.session(readonly=True) as session:
            by_target = {n.channel.name: n for n in session.notifications.list()}
        hook, mail = by_target["audit-hook"], by_target["platform-mail"]
        assert (hook.status, hook.attempts) == (NotificationStatus.FAILED, 3)
        assert "cannot connect" in (hook.error or "") and down not in (hook.error or "")  # the URL is the secret
        assert (mail.status, mail.attempts) == (NotificationStatus.FAILED, 1)  # a refused login: never better later
        assert "535" in (mail.error or "") and "wrong-password" not in (mail.error or "")
        assert by_target["ops-slack"].status == NotificationStatus.DELIVERED
    finally:
        ws.close()


def test_no_secret_value_is_ever_in_a_notification(ws: Workspace, team: tuple[People, Clone],
                                                   receivers: Receivers, smtp: tuple[Mailbox, int, Path]) -> None:
    people, clone = team
    mailbox = smtp[0]
    secret = json.loads((ws.settings.secrets_path / "data.tfvars.json").read_text())["db_password"]
    clone.branch("rotate").write("stacks/data/param.tf", 'resource "aws_ssm_parameter" "db" {\n'
                                 '  name  = "/orders/db"\n  type  = "SecureString"\n  value = var.db_password\n  tags  = local.tags\n}\n')
    clone.push("rotate")
    # a person pastes the value into the reason; the engine's error repeats it
    proposal = open_proposal(ws, people.alice, "rotate", f"publish the db password {secret} to SSM").id
    deliver(ws)
    for approver in (people.bob, people.carol):  # as many as its risk asks for
        decide(ws, approver, proposal, Decision.APPROVE, f"ok, {secret} is fine")
    ws.simulator.inject_fault("data", "aws_ssm_parameter.db", f"ValidationException: value {secret} rejected")
    assert not apply_proposal(ws, people.alice, proposal).succeeded
    deliver(ws)
    bodies = [json.dumps(m) for path in receivers.received.values() for m in path]
    bodies += [m.as_string() for m, _, _ in mailbox.messages]
    with ws.store.session(readonly=True) as session:
        bodies += [json.dumps(n.notice.to_json()) for n in session.notifications.list()]
    seen = events_seen(receivers, mailbox)
    assert seen["audit-hook"] == Counter({E.APPROVAL_WANTED.value: 1, E.APPLY_FAILED.value: 1})
    assert len(bodies) == 4 * 2 + 8  # four channels, two events, and the rows
    assert all(secret not in body for body in bodies)
    assert any("(redacted)" in body for body in bodies)
    assert all("SecureString" not in body and "/orders/db" not in body for body in bodies)  # no plan body either


def test_the_worker_tells_what_the_trail_recorded(ws: Workspace, team: tuple[People, Clone],
                                                  receivers: Receivers) -> None:
    people, clone = team
    worker = Worker(ws, loops=1, poll_seconds=0.05).start()
    try:
        proposal = propose(ws, people, clone, "bigger", '"t3.small"', '"t3.medium"')
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(receivers.received.get("/hooks/audit", [])) < 1:
            time.sleep(0.1)
    finally:
        worker.stop()
    [hook] = receivers.received["/hooks/audit"]
    assert (hook["event"], hook["proposal_id"]) == ("approval_wanted", proposal)
    assert hook["link"] == f"https://gateway.example.com/proposals/{proposal}"


def test_channels_without_the_gateways_secret_are_reported_not_retried(tmp_path: Path, receivers: Receivers,
                                                                       smtp: tuple[Mailbox, int, Path]) -> None:
    _, port, ca = smtp
    settings = notifying_settings(tmp_path / "home", receivers, port, ca, without="ops-chat")
    ws = create_workspace(settings)
    bootstrap_simulator(ws)
    try:
        people = add_people(ws)
        clone = Clone(ws, tmp_path / "clone")
        notify_from_main(clone)
        propose(ws, people, clone, "bigger", '"t3.small"', '"t3.medium"')
        deliver(ws)
        with ws.store.session(readonly=True) as session:
            chat = next(n for n in session.notifications.list() if n.channel.name == "ops-chat")
        assert (chat.status, chat.attempts) == (NotificationStatus.FAILED, 1)
        assert "the gateway has no settings for it" in (chat.error or "")
    finally:
        ws.close()


# --- the rules, with no server ---------------------------------------------------------------


@pytest.mark.parametrize(("event", "groups", "expected"), [
    (E.APPROVAL_WANTED, {"platform"}, ["ops", "mail"]),
    (E.APPLIED, {"app"}, ["app", "mail"]),
    (E.APPLIED, {"platform", "app"}, ["ops", "mail", "app"]),
    (E.APPROVAL_WANTED, {"app"}, []),
    (E.DRIFT_FOUND, {"app"}, ["all"]),
    (E.BREAKER_TRIPPED, set(), ["all"]),
    (E.DRIFT_FOUND, {"data"}, ["all"]),  # two routes name it: once
])
def test_routes_pick_each_channel_once(event: NotificationEvent, groups: set[str], expected: list[str]) -> None:
    channels = {n: Channel(n, ChannelKind.WEBHOOK) for n in ("ops", "mail", "app", "all")}
    settings = NotificationSettings(channels, (
        Route(("ops", "mail"), frozenset({"platform"})),
        Route(("app", "mail"), frozenset({"app"}), frozenset({E.APPLIED})),
        Route(("all",), frozenset(), frozenset({E.BREAKER_TRIPPED, E.DRIFT_FOUND})),
        Route(("all",), frozenset({"data"})),
    ))
    assert [c.name for c in settings.channels_for(event, frozenset(groups))] == expected


def test_a_title_cannot_mention_everyone_or_hide_a_link_in_slack() -> None:
    notice = Notice(E.APPROVAL_WANTED, "Approval wanted: <!channel> <https://evil.example|click>",
                    (("Proposal", "#1 a & b"),), "https://gateway.example.com/proposals/1")
    body = json.dumps(slack_body(notice))
    assert "<!channel>" not in body and "<https://evil" not in body and "&lt;!channel&gt;" in body
    assert "<https://gateway.example.com/proposals/1|Review>" in body and "a &amp; b" in body


def test_the_sample_repos_notifications_example_parses() -> None:
    sample = (Path(__file__).parents[1] / "gateway" / "sample_repo" / "gateway.yaml").read_text()
    example = "\n".join(line.removeprefix("# ").split("  #")[0] for line in sample.splitlines()
                        if line.startswith(("# notifications:", "#   ", "#     ")) and "max_window" not in line
                        and "codify_within" not in line and "groups: [oncall]" not in line)
    settings = parse_repo_settings(sample + "\n" + example)
    assert sorted(settings.notifications.channels) == ["ops-slack", "platform-mail"]
    assert [c.name for c in settings.notifications.channels_for(E.DRIFT_FOUND, frozenset({"platform"}))] == \
        ["ops-slack", "platform-mail"]


def test_summary_counts_read_as_terraforms() -> None:
    assert summary_counts({"create": 2, "update": 1, "replace": 1, "no-op": 5}) == "3 to add, 1 to change, 1 to destroy"


@pytest.mark.parametrize(("yaml_text", "error"), [
    ("notifications: {channels: {x: {slack: {}, webhook: {}}}}", "notifications.channels.x: say one of"),
    ("notifications: {channels: {x: {}}}", "notifications.channels.x: say one of"),
    ("notifications: {routes: [{channels: [nope]}]}", "notifications.routes.0.channels: no channel nope"),
    ("notifications: {channels: {x: {webhook: {}}}, routes: [{events: [approved], channels: [x]}]}",
     "notifications.routes.0.events.0"),
    ("notifications: {channels: {x: {webhook: {url: 'https://evil.example'}}}}", "notifications.channels.x.webhook.url"),
    ("notifications: {channels: {x: {email: {to: []}}}}", "notifications.channels.x.email.to"),
])
def test_a_bad_notifications_section_is_a_clear_error(yaml_text: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error.replace(".", r"\.")):
        parse_repo_settings("stacks: {a: {path: stacks/a, approvers: [p]}}\n" + yaml_text)


def test_a_notification_whose_worker_died_while_sending_it_is_sent_again(ws: Workspace, team: tuple[People, Clone],
                                                                         receivers: Receivers) -> None:
    people, clone = team
    propose(ws, people, clone, "bigger", '"t3.small"', '"t3.medium"')
    queue_notifications(ws)
    with ws.store.session(readonly=True) as session:
        hook = next(n for n in session.notifications.list() if n.channel.name == "audit-hook")
    assert hook.job_id is not None
    dead = ws.store.queue.claim("dead-host:1", job_id=hook.job_id)  # claimed, then its worker was killed
    assert dead is not None
    ws.settings = ws.settings.model_copy(update={"lock_ttl_seconds": 0.2})
    time.sleep(0.3)  # its heartbeat lapses
    assert f"job {hook.job_id} of worker dead-host:1, queued again" in recover_abandoned_work(ws)
    deliver(ws)
    assert [m["event"] for m in receivers.received["/hooks/audit"]] == ["approval_wanted"]
    with ws.store.session(readonly=True) as session:
        assert session.notifications.get(hook.id).status == NotificationStatus.DELIVERED


def test_an_event_that_cannot_be_told_is_recorded_as_skipped_once_per_channel(
        ws: Workspace, team: tuple[People, Clone], receivers: Receivers) -> None:
    people, clone = team
    with ws.store.session() as session:  # a trail event the notices cannot read: it names a proposal that is not
        unreadable = session.audit.append(GATEWAY, "breaker.tripped", {"agent": "agent-x", "reason": "too many",
                                                                       "proposal": 999})
    proposal = propose(ws, people, clone, "bigger", '"t3.small"', '"t3.medium"')
    deliver(ws)

    def skipped_in_trail() -> list[Any]:
        with ws.store.session(readonly=True) as session:
            return [e for e in session.audit.events() if e.kind == "notification.skipped"]

    skipped = skipped_in_trail()
    # the channels a route sends breaker_tripped to (whom it concerns could not be read): each once
    assert sorted(e.payload["target"] for e in skipped) == ["audit-hook", "ops-chat", "ops-slack", "platform-mail"]
    assert all(e.payload["trail_event"] == unreadable.seq and e.payload["trail_kind"] == "breaker.tripped"
               and e.payload["event"] == "breaker_tripped" and "no proposal 999" in e.payload["reason"]
               for e in skipped)
    trail_text = json.dumps([e.payload for e in skipped])
    assert receivers.url not in trail_text and HOOK_KEY not in trail_text and SLACK_TOKEN not in trail_text
    with ws.store.session(readonly=True) as session:
        rows = session.notifications.list(NotificationStatus.SKIPPED)
    assert sorted(n.channel.name for n in rows) == sorted(e.payload["target"] for e in skipped)
    assert all(n.job_id is None and n.attempts == 0 for n in rows)
    # the events after it are still told; nothing of the unreadable one was sent
    assert [m["proposal_id"] for m in receivers.received["/hooks/audit"]] == [proposal]
    assert not any(m.get("event") == "breaker_tripped" for m in receivers.received["/hooks/audit"])

    # its own notification.skipped events tell nothing, and a pass over the whole trail again records no new skip
    assert queue_notifications(ws) == []
    with ws.store.session() as session:
        session.main.set_marker(OUTBOX_MARKER, "0")
    assert queue_notifications(ws) == []
    assert len(skipped_in_trail()) == 4

    listing = run_cli(["notifications", "--status", "skipped"], ws.settings.home, people.tokens["dana"])
    assert listing.returncode == 0, listing.stderr
    assert "skipped   breaker_tripped     webhook:audit-hook" in listing.stdout and "no proposal 999" in listing.stdout
    with TestClient(create_app(ws.settings, workers=0)) as client:
        answer = client.get("/api/v1/notifications", params={"status": "skipped"},
                            headers={"Authorization": f"Bearer {people.tokens['dana']}"})
        assert answer.status_code == 200, answer.text
        assert sorted(n["target"] for n in answer.json()) == ["audit-hook", "ops-chat", "ops-slack", "platform-mail"]
        assert all("no proposal 999" in (n["error"] or "") for n in answer.json())
    verified = run_cli(["audit", "verify"], ws.settings.home, people.tokens["dana"])
    assert verified.returncode == 0, verified.stdout + verified.stderr
