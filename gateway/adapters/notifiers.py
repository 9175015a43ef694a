"""Delivers notices: Slack (an incoming webhook, or chat.postMessage), e-mail (SMTP with STARTTLS, smtplib) and
webhooks signed with HMAC-SHA256 as GitHub signs its own (httpx).

Each channel's secret is the gateway's setting under the channel's name (`GATEWAY_NOTIFICATION_CHANNELS`), the
SMTP server's too: the declaration repo only names the channel. Failures are sorted at this boundary: what a later
attempt may get through (no connection, a timeout, a 5xx or 429, an SMTP 4xx) is `Unavailable`; what never will
(another 4xx, a certificate that does not verify, a server without STARTTLS) is a `BackendError`.
"""

from __future__ import annotations

import json
import smtplib
import ssl
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import formatdate
from typing import TYPE_CHECKING

from gateway.config import ChannelSecret, Settings
from gateway.domain.errors import BackendError, ConfigError, Unavailable
from gateway.domain.notifications import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Channel,
    ChannelKind,
    Notice,
    email_subject,
    slack_body,
    webhook_body,
    webhook_signature,
)

if TYPE_CHECKING:
    import httpx

RETRIED_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})


class ChannelSenders:
    """The `NotificationSender` port over the gateway's settings."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self._tls: ssl.SSLContext | None = None  # loading the CA bundle takes ~50 ms: once, shared by threads

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    def send(self, channel: Channel, notice: Notice, delivery_id: str) -> str:
        if channel.kind == ChannelKind.EMAIL:
            return self._email(channel, notice, delivery_id)
        secret = self.settings.notification_channels.get(channel.name)
        if secret is None:
            raise ConfigError(f"notification channel {channel.name}: the gateway has no settings for it "
                              "(GATEWAY_NOTIFICATION_CHANNELS names each channel's URL and key)")
        if channel.kind == ChannelKind.SLACK:
            return self._slack(channel, secret, notice)
        return self._webhook(channel, secret, notice, delivery_id)

    def _slack(self, channel: Channel, secret: ChannelSecret, notice: Notice) -> str:
        if channel.slack_channel:  # chat.postMessage: answers 200 with ok false on most errors
            token = _required(secret.token, channel, "token")
            response = self._post(channel, f"{self.settings.slack_api_url.rstrip('/')}/chat.postMessage",
                                  json.dumps(slack_body(notice, channel.slack_channel)).encode(),
                                  {"Authorization": f"Bearer {token}", "Content-Type": "application/json; charset=utf-8"})
            try:
                answer = response.json()
            except ValueError:
                answer = {}
            if not answer.get("ok"):
                error = str(answer.get("error") or "no ok in the answer")
                if error in ("ratelimited", "service_unavailable", "internal_error", "fatal_error"):
                    raise Unavailable(f"Slack: {error}", _retry_after(response))
                raise BackendError(f"Slack refused the message: {error}")
            return f"Slack: ok, ts {answer.get('ts')}"
        url = _required(secret.url, channel, "url")
        response = self._post(channel, url, json.dumps(slack_body(notice)).encode(),
                              {"Content-Type": "application/json"})
        return f"Slack: HTTP {response.status_code} {response.text[:60]}"

    def _webhook(self, channel: Channel, secret: ChannelSecret, notice: Notice, delivery_id: str) -> str:
        url = _required(secret.url, channel, "url")
        key = _required(secret.key, channel, "key")
        sent_at = datetime.now(UTC).isoformat(timespec="seconds")
        body = json.dumps(webhook_body(notice, delivery_id, sent_at), sort_keys=True).encode()
        response = self._post(channel, url, body, {
            "Content-Type": "application/json", SIGNATURE_HEADER: webhook_signature(key.encode(), body),
            DELIVERY_HEADER: delivery_id, TIMESTAMP_HEADER: sent_at, EVENT_HEADER: notice.event.value,
            "User-Agent": "change-gateway"})
        return f"HTTP {response.status_code}"

    def _post(self, channel: Channel, url: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
        """POST; a 2xx answer, or the error it means (the URL never in a message: it is the secret)."""
        import httpx  # only when a notification is sent (a read sends none)

        try:
            with httpx.Client(timeout=self.settings.notify_timeout_seconds, follow_redirects=False,
                              verify=self._tls_context()) as client:
                response = client.post(url, content=body, headers=headers)
        except httpx.TimeoutException as exc:
            raise Unavailable(f"channel {channel.name}: no answer in {self.settings.notify_timeout_seconds:g} s") from exc
        except httpx.TransportError as exc:
            raise Unavailable(f"channel {channel.name}: cannot connect ({type(exc).__name__})") from exc
        except httpx.HTTPError as exc:
            raise BackendError(f"channel {channel.name}: {type(exc).__name__}") from exc
        if response.status_code in RETRIED_STATUSES:
            raise Unavailable(f"channel {channel.name} answered HTTP {response.status_code}", _retry_after(response))
        if not 200 <= response.status_code < 300:
            raise BackendError(f"channel {channel.name} refused the delivery: HTTP {response.status_code} "
                               f"{response.text[:200]}")
        return response

    def _email(self, channel: Channel, notice: Notice, delivery_id: str) -> str:
        s = self.settings
        if not s.smtp_host:
            raise ConfigError(f"notification channel {channel.name}: e-mail needs the gateway's SMTP server "
                              "(GATEWAY_SMTP_HOST)")
        message = EmailMessage()
        message["Subject"] = email_subject(notice)
        message["From"] = s.smtp_from
        message["To"] = ", ".join(channel.to)
        message["Date"] = formatdate(usegmt=True)
        message["Message-ID"] = f"<{delivery_id}@change-gateway>"  # the same on a retry: a receiver can dedupe
        message[DELIVERY_HEADER] = delivery_id
        message.set_content(notice.text())
        context = ssl.create_default_context(cafile=str(s.smtp_ca_file) if s.smtp_ca_file else None)
        try:
            with smtplib.SMTP(s.smtp_host, s.smtp_port, timeout=s.notify_timeout_seconds) as smtp:
                smtp.ehlo()
                if smtp.has_extn("starttls"):
                    smtp.starttls(context=context)
                    smtp.ehlo()
                elif s.smtp_starttls:
                    raise BackendError(f"the SMTP server {s.smtp_host}:{s.smtp_port} offers no STARTTLS: nothing is "
                                       "sent in clear (GATEWAY_SMTP_STARTTLS=false allows it)")
                if s.smtp_username:
                    smtp.login(s.smtp_username, s.smtp_password.get_secret_value() if s.smtp_password else "")
                refused = smtp.send_message(message)
        except smtplib.SMTPRecipientsRefused as exc:
            codes = [code for code, _ in exc.recipients.values()]
            if all(400 <= code < 500 for code in codes):
                raise Unavailable(f"SMTP: every recipient deferred ({codes})") from exc
            raise BackendError(f"SMTP refused every recipient: {sorted(exc.recipients)}") from exc
        except smtplib.SMTPResponseException as exc:
            error = exc.smtp_error.decode(errors="replace") if isinstance(exc.smtp_error, bytes) else str(exc.smtp_error)
            if 400 <= exc.smtp_code < 500:
                raise Unavailable(f"SMTP {exc.smtp_code}: {error}") from exc
            raise BackendError(f"SMTP refused the message: {exc.smtp_code} {error}") from exc
        except ssl.SSLError as exc:  # before OSError: a certificate that does not verify is not a bad moment
            raise BackendError(f"SMTP: TLS with {s.smtp_host}:{s.smtp_port} failed: {exc}") from exc
        except (smtplib.SMTPException, OSError) as exc:
            raise Unavailable(f"SMTP {s.smtp_host}:{s.smtp_port}: {type(exc).__name__}: {exc}") from exc
        return f"SMTP: sent to {len(channel.to) - len(refused)} of {len(channel.to)}"


def _required(value: object, channel: Channel, what: str) -> str:
    secret = getattr(value, "get_secret_value", None)
    if secret is None:
        raise ConfigError(f"notification channel {channel.name}: the gateway's settings give it no {what} "
                          "(GATEWAY_NOTIFICATION_CHANNELS)")
    return str(secret())


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return float(response.headers.get("Retry-After", ""))
    except ValueError:
        return None
