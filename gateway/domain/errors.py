"""The gateway's exceptions, one tree.

GatewayError                      anything the gateway reports to a person
├── InputError                    the request itself is wrong; nothing was written
│   ├── PlanFormatError           a plan file is not a Terraform JSON plan we can read
│   ├── ConfigError               a declaration (HCL) or gateway.yaml is malformed
│   ├── NotFound                  an unknown proposal, stack, user, ref or event
│   ├── Conflict                  the thing exists already, or moved under us
│   │   └── RefMoved              a branch moved between reading it and updating it (retry on the new one)
│   ├── MalformedDelivery         a webhook payload lacks a field the gateway reads, or has it mistyped
│   └── ToolRefused               an agent's tool call the rules do not allow (the model reads why)
├── AuthError                     missing or unknown token
│   └── SignInRefused             a sign-in with a provider failed a check (state, nonce, audience, expiry, link)
├── Refused                       a rule is not met; `reasons` says which, in words
├── PlanError                     the engine could not produce a plan (e.g. prevent_destroy)
├── ApplyError                    the engine failed part way through an apply
├── LockTimeout                   another runner holds the stack lock
├── LockLost                      a runner's stack locks lapsed while it held them: another may have written since
├── NotConfigured                 an optional part (the model) has no settings
└── BackendError                  git, the database, the model or an engine binary failed underneath
    ├── Unavailable               a dependency answered that it cannot serve now (5xx, rate limit, no
    │   │                         connection); the same request later may well succeed
    │   ├── DatabaseUnavailable   the database does not answer (down, restarting, unreachable) or is busy
    │   └── RetryLater            a job's handler asks to run again after `retry_after` seconds (it
    │                             decided this was not its last attempt)
    ├── CloudRefused              a cloud's API turned one request down; `code` is its error code (AWS's
    │                             ValidationError, ChangeSetNotFound...), what the adapter decides by
    ├── ModuleUnreachable         a remote module source cannot be fetched (refused, too big, too slow, gone)
    ├── ModelReplyError           a model endpoint's answer the gateway cannot use (no choices, a field
    │                             missing or mistyped, not JSON)
    └── ContextTooLong            a model endpoint refused a request longer than its context (`limit`:
                                  the context it said, if it did)
"""

from __future__ import annotations

from collections.abc import Sequence


class GatewayError(Exception):
    """Base class: the message is meant for a person."""


class InputError(GatewayError):
    pass


class PlanFormatError(InputError):
    pass


class ConfigError(InputError):
    pass


class NotFound(InputError):
    pass


class InAnotherRepository(NotFound):
    """What was asked for is there, in another declaration repository of the gateway (`repository`)."""

    def __init__(self, message: str, repository: str):
        super().__init__(message)
        self.repository = repository


class Conflict(InputError):
    pass


class RefMoved(Conflict):
    pass


class MalformedDelivery(InputError):
    """A webhook delivery of an event the gateway handles, lacking a field it reads or with the wrong type."""

    def __init__(self, event: str, reasons: Sequence[str]):
        self.event = event
        self.reasons = list(reasons)
        super().__init__(f"the {event} delivery is malformed: " + "; ".join(self.reasons))


class ToolRefused(InputError):
    """A tool call of an agent that its rules do not allow; the message goes back to the model."""


class AuthError(GatewayError):
    pass


class SignInRefused(AuthError):
    """A sign-in with an identity provider was refused: `check` names what failed (state, nonce, unlinked...)."""

    def __init__(self, check: str, message: str):
        super().__init__(message)
        self.check = check


class Refused(GatewayError):
    """A rule is not met. Each reason is a sentence a person can act on."""

    def __init__(self, reasons: Sequence[str]):
        self.reasons = list(reasons)
        super().__init__("; ".join(self.reasons))


class PlanError(GatewayError):
    pass


class ApplyError(GatewayError):
    pass


class LockTimeout(GatewayError):
    pass


class LockLost(GatewayError):
    """The heartbeat could not keep a lock: another runner may have written to the stack since."""


class NotConfigured(GatewayError):
    pass


class BackendError(GatewayError):
    pass


class Unavailable(BackendError):
    """A dependency (GitHub) cannot serve now; try again later. `retry_after` is the wait it asked for, if any."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class DatabaseUnavailable(Unavailable):
    """The database does not answer, or is too busy to: nothing that reads or writes records can run until it does
    (a worker's loops wait it out, the API answers 503 and its readiness says so)."""


class RetryLater(Unavailable):
    """A job's handler asks the queue to run it again after `retry_after` seconds; it has decided this attempt was
    not its last (its own retry policy), so the queue does not judge again."""

    def __init__(self, message: str, retry_after: float):
        super().__init__(message, retry_after)


class ModuleUnreachable(BackendError):
    """A module source that cannot be fetched; the message is one line, with no secret in it."""


class CloudRefused(BackendError):
    """A cloud's API answered a request with a refusal: `code` is the API's own error code, `detail` its message."""

    def __init__(self, message: str, code: str, detail: str = ""):
        super().__init__(message)
        self.code = code
        self.detail = detail


class ModelReplyError(BackendError):
    """A model endpoint answered with something the gateway cannot use; the message says what was wrong."""


class ContextTooLong(BackendError):
    """A model endpoint refused a request as longer than its context; `limit` is that context in tokens, when the
    endpoint said it."""

    def __init__(self, message: str, limit: int | None = None):
        super().__init__(message)
        self.limit = limit
