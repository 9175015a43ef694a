"""The gateway's database: SQLite by default, PostgreSQL by URL, one schema for both.

Tables are SQLAlchemy Core; each numbered migration runs once and is recorded in
`schema_version`. Every write happens in one transaction, so a failed command leaves nothing
half-written. On SQLite every transaction starts with BEGIN IMMEDIATE (one writer at a time across
processes); on PostgreSQL the audit chain and stack locks take row locks.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    and_,
    create_engine,
    event,
    inspect,
    or_,
    select,
    text,
)
from sqlalchemy.engine import Connection, Engine, RootTransaction
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError, SQLAlchemyError

from gateway.domain.audit import GENESIS, event_addresses, event_bytes, event_outcome
from gateway.domain.errors import BackendError, ConfigError, DatabaseUnavailable
from gateway.domain.notifications import OUTBOX_MARKER
from gateway.domain.repositories import DEFAULT_REPOSITORY

metadata = MetaData()

schema_version = Table(
    "schema_version", metadata,
    Column("version", Integer, primary_key=True),
    Column("applied_at", DateTime(timezone=True), nullable=False),
)

principals = Table(
    "principals", metadata,
    Column("id", String(36), primary_key=True),
    Column("name", String(100), nullable=False, unique=True),
    Column("kind", String(10), nullable=False),
    Column("roles", JSON, nullable=False),
    Column("groups", JSON, nullable=False),
    Column("token_hash", String(64), nullable=False, unique=True),
    Column("acting_for", String(36), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("disabled_at", DateTime(timezone=True), nullable=True),  # migration 10: credentials with a lifecycle
    Column("token_expires_at", DateTime(timezone=True), nullable=True),
    Column("last_used_at", DateTime(timezone=True), nullable=True),
)

proposals = Table(
    "proposals", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("branch", String(200), nullable=False),
    Column("base_sha", String(40), nullable=False),
    Column("head_sha", String(40), nullable=False),
    Column("requester_id", String(36), nullable=False),
    Column("proposer_id", String(36), nullable=False),
    Column("reason", Text, nullable=False),
    Column("status", String(20), nullable=False),
    Column("stacks", JSON, nullable=False),
    Column("changed_paths", JSON, nullable=False),
    Column("agent_claim", Text, nullable=True),
    Column("prompt_version", String(100), nullable=True),
    Column("model", String(100), nullable=True),
    Column("merge_sha", String(40), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("applied_sha", String(40), nullable=True),  # migration 5: the merged commit an apply ran
    Column("kind", String(20), nullable=True),  # migration 8: change | drift_revert (NULL: change)
    # migration 32: the declaration repository it changes (the workspace's first one for older proposals)
    Column("repository", String(63), nullable=False, server_default=DEFAULT_REPOSITORY),
    Index("proposals_by_repository", "repository", "status"),
)

plans = Table(
    "plans", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("proposal_id", Integer, nullable=False, index=True),
    Column("stack", String(100), nullable=False),
    Column("head_sha", String(40), nullable=False),
    Column("digest", String(80), nullable=False),
    Column("document", Text, nullable=False),
    Column("state_serial", BigInteger, nullable=False),  # migration 23: 64-bit (CloudFormation's is in microseconds)
    Column("state_lineage", String(300), nullable=False),  # migration 23: CloudFormation's is the stack's ARN
    Column("summary", JSON, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("main_sha", String(40), nullable=True),  # migration 2: the main commit the branch was merged onto
    Column("preview", Text, nullable=True),  # migration 3: the masked preview, so reads never decode the plan
    Column("artifact", LargeBinary, nullable=True),  # migration 4: the engine's own plan file (Terraform's)
)

decisions = Table(
    "decisions", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("proposal_id", Integer, nullable=False, index=True),
    Column("principal_id", String(36), nullable=False),
    Column("decision", String(10), nullable=False),
    Column("head_sha", String(40), nullable=False),
    Column("digests", JSON, nullable=False),
    Column("comment", Text, nullable=False),
    Column("auth", String(40), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

applies = Table(
    "applies", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("proposal_id", Integer, nullable=False, index=True),
    Column("stack", String(100), nullable=False),
    Column("plan_id", Integer, nullable=False),
    Column("status", String(20), nullable=False),
    Column("runner", String(100), nullable=False),
    Column("applied", JSON, nullable=False),
    Column("error", Text, nullable=True),
    Column("commit_sha", String(40), nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=True),
)

overrides = Table(
    "overrides", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("proposal_id", Integer, nullable=False, index=True),
    Column("finding_key", String(500), nullable=False),
    Column("principal_id", String(36), nullable=False),
    Column("reason", Text, nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

conversations = Table(
    "conversations", metadata,
    Column("id", String(36), primary_key=True),
    Column("requester_id", String(36), nullable=False),
    Column("branch", String(200), nullable=False),
    Column("proposal_id", Integer, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("running_until", DateTime(timezone=True), nullable=True),  # a turn holds the conversation until then
    Column("running_turn", String(36), nullable=True),  # the turn that holds it: only it renews or lets go
)

agent_runs = Table(
    "agent_runs", metadata,
    Column("id", String(36), primary_key=True),
    Column("requester_id", String(36), nullable=False),
    Column("request", Text, nullable=False),
    Column("conversation_id", String(36), nullable=True),
    Column("status", String(20), nullable=False),  # domain.agent_runs.AgentRunStatus
    Column("progress", JSON, nullable=False),
    Column("proposal_id", Integer, nullable=True),
    Column("message", Text, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("job_id", Integer, nullable=True),  # migration 17: the agent_turn job that runs it
)

stack_locks = Table(
    "stack_locks", metadata,
    Column("stack", String(100), primary_key=True),
    Column("holder", String(100), nullable=False),
    Column("apply_id", Integer, nullable=True),
    Column("acquired_at", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("proposal_id", Integer, nullable=True),  # migration 15: whose apply the lock serves (crash recovery)
)

workers = Table(  # migration 29: the worker registry (which `gateway worker` processes run, by their beats)
    "workers", metadata,
    Column("name", String(200), primary_key=True),  # host:pid
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("beat_at", DateTime(timezone=True), nullable=False),
    Column("live_until", DateTime(timezone=True), nullable=False, index=True),  # the last beat + LIVE_BEATS of them
    Column("stopped_at", DateTime(timezone=True), nullable=True),  # a clean stop
)

# A proposal's stacks planned as jobs of their own (migration 30): the round, and each stack's outcome, its plan held
# here (sealed, as saved plans are) until the round's last stack is done and the proposal's plans are written together.
plan_rounds = Table(
    "plan_rounds", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("proposal_id", Integer, nullable=True, index=True),  # None: the stacks of a proposal being opened
    Column("head_sha", String(40), nullable=False),
    Column("main_sha", String(40), nullable=False),
    Column("merged_sha", String(40), nullable=False),  # the commit planned: the head merged onto main
    Column("spec", JSON, nullable=False),  # changed paths, what moved (a re-plan's reason), who the plans are for
    Column("state", String(20), nullable=False),  # planning | planned | assembled | failed | superseded
    Column("remaining", Integer, nullable=False),  # stacks not finished: the job that takes it to 0 finishes the round
    Column("result", JSON, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=True),
)

plan_round_stacks = Table(
    "plan_round_stacks", metadata,
    Column("round_id", Integer, primary_key=True),
    Column("stack", String(100), primary_key=True),
    Column("position", Integer, nullable=False),
    Column("job_id", Integer, nullable=True),
    Column("status", String(20), nullable=False),  # queued | running | planned | failed
    Column("error", Text, nullable=True),
    Column("error_kind", String(40), nullable=True),
    Column("staged", JSON, nullable=True),  # digest, serial, lineage, findings, risk, when read
    Column("document", Text, nullable=True),  # sealed
    Column("artifact", LargeBinary, nullable=True),  # sealed
    Column("finished_at", DateTime(timezone=True), nullable=True),
)

stack_serials = Table(  # migration 23: each stack's state serial as a worker last read it (reads show it)
    "stack_serials", metadata,
    Column("stack", String(100), primary_key=True),
    Column("serial", BigInteger, nullable=False),
    Column("observed_at", DateTime(timezone=True), nullable=False),  # when it was read: a newer reading wins
)

stack_states = Table(
    "stack_states", metadata,
    Column("stack", String(100), primary_key=True),
    Column("serial", Integer, nullable=False),
    Column("body", Text, nullable=False),
)

state_resources = Table(
    "state_resources", metadata,
    Column("stack", String(100), primary_key=True),
    Column("address", String(300), primary_key=True),
    Column("body", Text, nullable=False),
)

sandbox_objects = Table(
    "sandbox_objects", metadata,
    Column("type", String(100), primary_key=True),
    Column("id", String(200), primary_key=True),
    Column("attributes", Text, nullable=False),
)

sandbox_faults = Table(
    "sandbox_faults", metadata,
    Column("stack", String(100), primary_key=True),
    Column("address", String(300), primary_key=True),
    Column("message", Text, nullable=False),
)

audit_events = Table(
    "audit_events", metadata,
    Column("seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    # The event is its canonical bytes (migration 18): what the chain hashes, what every read decodes. The columns
    # beside them are an index the filters use; `verify` checks they agree with the bytes.
    Column("canonical", Text, nullable=False),
    Column("id", String(36), nullable=False, unique=True),
    Column("at", String(40), nullable=False),
    Column("actor", String(100), nullable=False),
    Column("actor_kind", String(10), nullable=False),
    Column("kind", String(40), nullable=False),
    Column("proposal_id", Integer, nullable=True),
    Column("prev_hash", String(71), nullable=False),
    Column("hash", String(71), nullable=False),
    Column("outcome", String(20), nullable=True),  # migration 11: refused | failed | succeeded | ... (from kind)
    # migration 33: the declaration repository the event is of (domain.audit.event_repository), for the repository
    # filter. Not in the canonical bytes, so not covered by the chain: see `_audit_by_repository`.
    Column("repository", String(63), nullable=False, server_default=DEFAULT_REPOSITORY),
)

# What the trail is searched by (migration 11): each event's stacks and resource addresses, one row each.
audit_event_stacks = Table(
    "audit_event_stacks", metadata,
    Column("seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=False),
    Column("stack", String(100), primary_key=True),
    Index("audit_event_stacks_by_stack", "stack", "seq"),
)

audit_event_addresses = Table(
    "audit_event_addresses", metadata,
    Column("seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=False),
    Column("address", String(300), primary_key=True),
    Index("audit_event_addresses_by_address", "address", "seq"),
)

# Which proposals' events name each address (migration 18): the address filter brings a proposal's whole story.
audit_proposal_addresses = Table(
    "audit_proposal_addresses", metadata,
    Column("proposal_id", Integer, primary_key=True, autoincrement=False),
    Column("address", String(300), primary_key=True),
)


@functools.cache
def _prefix_indexes() -> tuple[Index, Index]:
    """The indexes that serve prefix searches (LIKE 'aws_s3_bucket.%') on PostgreSQL, whatever the database's
    collation: made by the migrations that create their tables (see `_one_running_job`), not with the tables."""
    return (Index("audit_event_addresses_by_prefix", audit_event_addresses.c.address,
                  postgresql_ops={"address": "text_pattern_ops"}),
            Index("audit_proposal_addresses_by_address", audit_proposal_addresses.c.address,
                  audit_proposal_addresses.c.proposal_id, postgresql_ops={"address": "text_pattern_ops"}))

# The chain's head, kept apart so that deleting the newest events is found too.
audit_head = Table(
    "audit_head", metadata,
    Column("id", Integer, primary_key=True),
    Column("seq", BigInteger().with_variant(Integer, "sqlite"), nullable=False),
    Column("hash", String(71), nullable=False),
    UniqueConstraint("id"),
)

# Plan and apply work, claimed by workers; a running job's heartbeat says its worker is alive.
jobs = Table(
    "jobs", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("kind", String(20), nullable=False),  # plan | apply
    Column("proposal_id", Integer, nullable=True, index=True),
    Column("requested_by", String(100), nullable=False),
    Column("status", String(20), nullable=False, index=True),  # queued | running | succeeded | failed | refused | interrupted
    Column("runner", String(100), nullable=True),
    Column("progress", JSON, nullable=False),
    Column("result", JSON, nullable=True),
    Column("error", Text, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=True),
    Column("heartbeat_at", DateTime(timezone=True), nullable=True),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    Column("args", JSON, nullable=True),  # migration 6: what the job works on besides its proposal (a delivery)
    # migration 16: how many times a worker has started it, and the time before which a retry waits
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("run_after", DateTime(timezone=True), nullable=True),
)

# GitHub (migration 6): linked accounts, the pull request of each proposal, and every webhook delivery.
github_accounts = Table(
    "github_accounts", metadata,
    Column("github_id", BigInteger, primary_key=True, autoincrement=False),  # GitHub's numeric user id: logins change
    Column("login", String(100), nullable=False),
    Column("principal_id", String(36), nullable=False, unique=True),
    Column("linked_at", DateTime(timezone=True), nullable=False),
)

# GitLab (migration 28): accounts linked by GitLab's numeric user id (usernames change); merge requests share
# pull_requests (repository: the project's path, number: the merge request's iid) and webhook_deliveries.
gitlab_accounts = Table(
    "gitlab_accounts", metadata,
    Column("gitlab_id", BigInteger, primary_key=True, autoincrement=False),
    Column("username", String(255), nullable=False),
    Column("principal_id", String(36), nullable=False, unique=True),
    Column("linked_at", DateTime(timezone=True), nullable=False),
)

pull_requests = Table(
    "pull_requests", metadata,
    Column("proposal_id", Integer, primary_key=True, autoincrement=False),
    Column("repository", String(200), nullable=False),
    Column("number", Integer, nullable=False),
    Column("comment_id", BigInteger, nullable=True),  # the sticky comment, edited in place
    Column("published_seq", BigInteger, nullable=False),  # the newest trail event the comment and checks show
    Column("published_digest", String(64), nullable=True),  # of what was last written: the same is not rewritten
    Column("publish_error", Text, nullable=True),
    Column("attempted_at", DateTime(timezone=True), nullable=True),  # the last publish; a failed one waits to retry
    Column("created_at", DateTime(timezone=True), nullable=False),
    Index("pull_requests_by_number", "repository", "number"),
)

webhook_deliveries = Table(
    "webhook_deliveries", metadata,
    Column("delivery_id", String(100), primary_key=True),  # X-GitHub-Delivery: the same on a redelivery
    Column("event", String(60), nullable=False),
    Column("action", String(60), nullable=True),
    Column("payload", Text, nullable=False),
    Column("job_id", Integer, nullable=True),
    Column("received_at", DateTime(timezone=True), nullable=False),
)

# The circuit breaker (migration 7): each agent change's capacity figures, and each breaker's state.
breaker_changes = Table(
    "breaker_changes", metadata,
    Column("proposal_id", Integer, primary_key=True, autoincrement=False),  # a proposal counts once: its latest plans
    Column("principal_id", String(36), nullable=False, index=True),
    Column("before", JSON, nullable=False),  # stack -> capacity its resources held before the change
    Column("added", Float, nullable=False),
    Column("destroyed", Integer, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False, index=True),
)

breaker_states = Table(
    "breaker_states", metadata,
    # an agent principal's id, or "*" for every agent; in an added repository `repo:` before it (migration 32: wider)
    Column("scope", String(100), primary_key=True),
    Column("open", Boolean, nullable=False),
    Column("reason", Text, nullable=False),
    Column("changed_by", String(100), nullable=False),
    Column("changed_at", DateTime(timezone=True), nullable=False),
)

# Signed checkpoints of the chain's head (migration 9): the key that signs them is not in the database.
audit_checkpoints = Table(
    "audit_checkpoints", metadata,
    Column("seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=False),
    Column("hash", String(71), nullable=False),
    Column("at", String(40), nullable=False),
    Column("public_key", String(64), nullable=False),
    Column("signature", String(120), nullable=False),
    Column("tree_root", String(71), nullable=True),  # migration 27: the root of the trail's Merkle tree it signed
)

# The roots of the trail's Merkle tree, one per complete block of 256 events (migration 27; domain/trail_tree.py):
# written when a checkpoint is signed, so a root or an event's audit path never reads the whole trail.
audit_tree_blocks = Table(
    "audit_tree_blocks", metadata,
    Column("block", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=False),
    Column("root", String(71), nullable=False),
)

# Commits on main the gateway did not make (migration 12): applies on their stacks wait for an acknowledgement.
main_pushes = Table(
    "main_pushes", metadata,
    Column("sha", String(40), primary_key=True),
    Column("stacks", JSON, nullable=False),
    Column("paths", JSON, nullable=False),
    Column("author", String(200), nullable=False),
    Column("detected_at", DateTime(timezone=True), nullable=False),
    Column("acknowledged_by", String(100), nullable=True),
    Column("acknowledged_at", DateTime(timezone=True), nullable=True),
    Column("reason", Text, nullable=True),
    Column("repository", String(63), nullable=False, server_default=DEFAULT_REPOSITORY),  # migration 32
)

# Day two (migration 14): drift records per stack, and break-glass windows.
drift_records = Table(
    "drift_records", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("stack", String(100), nullable=False, index=True),
    Column("status", String(10), nullable=False),  # open | closed
    Column("resources", JSON, nullable=False),  # the latest report: masked drift entries, attribute by attribute
    Column("expected", Boolean, nullable=False),  # found while a break-glass window was open on the stack
    Column("break_glass_id", Integer, nullable=True),
    Column("opened_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("closed_at", DateTime(timezone=True), nullable=True),
    Column("closed_by", String(100), nullable=True),
    Column("closed_reason", Text, nullable=True),
    Column("closed_by_proposal", Integer, nullable=True),
)

break_glass_windows = Table(
    "break_glass_windows", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("stack", String(100), nullable=False, index=True),
    Column("reason", Text, nullable=False),
    Column("opened_by", String(100), nullable=False),
    Column("confirmed_by", String(100), nullable=True),  # a second person, on a protected stack
    Column("requested_at", DateTime(timezone=True), nullable=False),
    Column("duration_seconds", Integer, nullable=False),
    Column("opened_at", DateTime(timezone=True), nullable=True),  # null until confirmed (protected stacks)
    Column("ends_at", DateTime(timezone=True), nullable=True),
    Column("closed_at", DateTime(timezone=True), nullable=True),  # closed early by a person
    Column("codify_by", DateTime(timezone=True), nullable=True),
    Column("codified_at", DateTime(timezone=True), nullable=True),
    Column("flagged_at", DateTime(timezone=True), nullable=True),  # past the deadline, recorded once in the trail
    Column("acknowledged_by", String(100), nullable=True),
    Column("acknowledged_at", DateTime(timezone=True), nullable=True),
    Column("acknowledgement", Text, nullable=True),
)

# Signing in (migration 19): identities linked to principals by issuer and subject, and server-side page sessions.
oidc_identities = Table(
    "oidc_identities", metadata,
    Column("issuer", String(500), primary_key=True),  # the OIDC `iss`; GitHub identities live in github_accounts
    Column("subject", String(255), primary_key=True),  # the `sub`: stable, unlike an e-mail address
    Column("principal_id", String(36), nullable=False, index=True),
    Column("display", String(200), nullable=False),  # shown to admins; never what the identity maps by
    Column("linked_at", DateTime(timezone=True), nullable=False),
)

web_sessions = Table(
    "web_sessions", metadata,
    Column("id_hash", String(64), primary_key=True),  # SHA-256 of the random session id the cookie carries
    Column("principal_id", String(36), nullable=False, index=True),
    Column("auth_method", String(600), nullable=False),  # token, github, oidc:<issuer>
    Column("claimed_groups", JSON, nullable=True),  # the provider's groups claim at sign-in (null: none sent)
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("ended_at", DateTime(timezone=True), nullable=True),
)

# Signing in (migration 22): sign-ins in progress, kept server-side under their state and used once, and how many
# refusals of each kind the trail recorded in the current window (anyone can cause one).
sign_in_flows = Table(
    "sign_in_flows", metadata,
    Column("state_hash", String(64), primary_key=True),  # SHA-256 of the state the provider sends back
    Column("provider", String(40), nullable=False),
    Column("browser_hash", String(64), nullable=False),  # SHA-256 of the key in the starting browser's cookie
    Column("secrets", JSON, nullable=True),  # nonce, code_verifier, redirect_uri; emptied once used
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False, index=True),
    Column("used_at", DateTime(timezone=True), nullable=True),
)

sign_in_refusal_tallies = Table(
    "sign_in_refusal_tallies", metadata,
    Column("kind", String(100), primary_key=True),  # provider:check
    Column("window_started_at", DateTime(timezone=True), nullable=False),
    Column("recorded", Integer, nullable=False),
    Column("unrecorded", Integer, nullable=False),
    Column("unrecorded_since", DateTime(timezone=True), nullable=True),
)

markers = Table(  # small facts the gateway keeps: the last main commit it has looked at
    "markers", metadata,
    Column("name", String(200), primary_key=True),  # in an added repository, `repo/` before it (migration 32: wider)
    Column("value", String(200), nullable=False),
)

# The declaration repositories the gateway serves (migration 32); a removed one keeps its row, proposals and trail.
repositories = Table(
    "repositories", metadata,
    Column("name", String(63), primary_key=True),
    Column("added_at", DateTime(timezone=True), nullable=False),
    Column("added_by", String(100), nullable=False),
    Column("removed_at", DateTime(timezone=True), nullable=True),
    Column("removed_by", String(100), nullable=True),
)

# Notifications (migration 20): one row per (event, subject, channel), delivered once by a notify job.
notifications = Table(
    "notifications", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("dedupe_key", String(200), nullable=False, unique=True),  # event:subject:channel, never two
    Column("event", String(40), nullable=False),
    Column("channel", String(20), nullable=False),  # slack | email | webhook
    Column("target", String(100), nullable=False),  # the channel's name in gateway.yaml
    Column("spec", JSON, nullable=False),  # the channel as main named it when the notice was queued
    Column("notice", JSON, nullable=False),  # the masked message
    Column("proposal_id", Integer, nullable=True),
    Column("audit_seq", BigInteger, nullable=True),  # the trail event it tells of
    Column("status", String(20), nullable=False, index=True),  # queued | delivered | failed
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("error", Text, nullable=True),
    Column("receipt", Text, nullable=True),  # what the channel answered
    Column("job_id", Integer, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("delivered_at", DateTime(timezone=True), nullable=True),
)

_LATER_TABLES = ("workers", "audit_tree_blocks", "stack_serials", "sign_in_flows", "sign_in_refusal_tallies", "notifications", "oidc_identities", "web_sessions", "drift_records", "break_glass_windows", "main_pushes", "markers", "audit_event_stacks", "audit_event_addresses", "audit_proposal_addresses", "audit_checkpoints", "jobs", "github_accounts", "gitlab_accounts", "pull_requests", "webhook_deliveries", "breaker_changes", "breaker_states")
_FIRST_TABLES = [t for t in metadata.sorted_tables if t.name not in _LATER_TABLES]


def _initial_schema(conn: Connection) -> None:
    metadata.create_all(conn, tables=_FIRST_TABLES)
    conn.execute(audit_head.insert().values(id=1, seq=0, hash=GENESIS))


def _jobs_and_merge_previews(conn: Connection) -> None:
    """Jobs for workers; each plan records the main commit it was merged onto."""
    jobs.create(conn)
    if "main_sha" not in {c["name"] for c in inspect(conn).get_columns("plans")}:  # a schema made before it
        conn.execute(text("ALTER TABLE plans ADD COLUMN main_sha VARCHAR(40)"))


def _stored_previews(conn: Connection) -> None:
    """Each plan keeps its rendered, masked preview."""
    if "preview" not in {c["name"] for c in inspect(conn).get_columns("plans")}:
        conn.execute(text("ALTER TABLE plans ADD COLUMN preview TEXT"))


def _plan_artifacts(conn: Connection) -> None:
    """Each plan keeps the engine's own plan file, which the apply runs."""
    if "artifact" not in {c["name"] for c in inspect(conn).get_columns("plans")}:
        kind = "BYTEA" if conn.dialect.name == "postgresql" else "BLOB"
        conn.execute(text(f"ALTER TABLE plans ADD COLUMN artifact {kind}"))


# Indexes with a dialect's options are made by the migration that creates them, never at import: an option of
# `postgresql_` loads SQLAlchemy's PostgreSQL dialect and all its drivers' modules, which a read on SQLite never needs.
@functools.cache
def _one_running_job() -> Index:
    return Index("jobs_one_running_per_proposal", jobs.c.proposal_id, unique=True,
                 sqlite_where=jobs.c.status == "running", postgresql_where=jobs.c.status == "running")


def _applied_commits_and_one_running_job(conn: Connection) -> None:
    """Each proposal records the commit its apply ran; never two running jobs for one proposal."""
    if "applied_sha" not in {c["name"] for c in inspect(conn).get_columns("proposals")}:
        conn.execute(text("ALTER TABLE proposals ADD COLUMN applied_sha VARCHAR(40)"))
    _one_running_job().create(conn, checkfirst=True)


def _github(conn: Connection) -> None:
    """Pull requests on GitHub: linked accounts, each proposal's pull request, webhook deliveries, job arguments."""
    metadata.create_all(conn, tables=[github_accounts, pull_requests, webhook_deliveries])
    if "args" not in {c["name"] for c in inspect(conn).get_columns("jobs")}:
        conn.execute(text("ALTER TABLE jobs ADD COLUMN args JSON"))


def _breaker(conn: Connection) -> None:
    """The circuit breaker on runaway automation."""
    metadata.create_all(conn, tables=[breaker_changes, breaker_states])


def _proposal_kinds(conn: Connection) -> None:
    """A proposal is a change, or an automatic revert of drift."""
    if "kind" not in {c["name"] for c in inspect(conn).get_columns("proposals")}:
        conn.execute(text("ALTER TABLE proposals ADD COLUMN kind VARCHAR(20)"))


def _audit_checkpoints(conn: Connection) -> None:
    """Signed checkpoints of the audit chain."""
    audit_checkpoints.create(conn, checkfirst=True)


def _credential_lifecycle(conn: Connection) -> None:
    """Principals can be disabled; tokens expire; last use is kept."""
    present = {c["name"] for c in inspect(conn).get_columns("principals")}
    kind = "TIMESTAMP WITH TIME ZONE" if conn.dialect.name == "postgresql" else "DATETIME"
    for column in ("disabled_at", "token_expires_at", "last_used_at"):
        if column not in present:
            conn.execute(text(f"ALTER TABLE principals ADD COLUMN {column} {kind}"))


AUDIT_INDEXES = (Index("audit_events_by_outcome", audit_events.c.outcome, audit_events.c.seq),
                 Index("audit_events_by_actor", audit_events.c.actor, audit_events.c.seq),
                 Index("audit_events_by_at", audit_events.c.at))
AUDIT_BY_REPOSITORY = Index("audit_events_by_repository", audit_events.c.repository, audit_events.c.seq)
# migration 34: a repository's events of one kind in order, so a repository with a kind, an action or an outcome reads
# only the events that match (with the repository index alone, every event of the repository is read to check its kind)
AUDIT_BY_REPOSITORY_AND_KIND = Index("audit_events_by_repository_kind", audit_events.c.repository, audit_events.c.kind,
                                     audit_events.c.seq)


def _audit_search(conn: Connection) -> None:
    """Filters that run in SQL on indexed columns: stacks, addresses, outcome, actor, time; existing events indexed."""
    if "outcome" not in {c["name"] for c in inspect(conn).get_columns("audit_events")}:
        conn.execute(text("ALTER TABLE audit_events ADD COLUMN outcome VARCHAR(20)"))
    metadata.create_all(conn, tables=[audit_event_stacks, audit_event_addresses])
    _prefix_indexes()[0].create(conn, checkfirst=True)
    for index in AUDIT_INDEXES:
        index.create(conn, checkfirst=True)
    if "payload" not in {c["name"] for c in inspect(conn).get_columns("audit_events")}:
        return  # a trail made since migration 18 indexes its events as they are appended
    for row in conn.execute(text("SELECT seq, kind, stacks, payload FROM audit_events")).mappings().all():
        conn.execute(audit_events.update().where(audit_events.c.seq == row["seq"]).values(
            outcome=event_outcome(row["kind"])))
        for stack in set(_json_column(row["stacks"]) or []):
            conn.execute(audit_event_stacks.insert().values(seq=row["seq"], stack=stack))
        for address in event_addresses(json.loads(row["payload"])):
            conn.execute(audit_event_addresses.insert().values(seq=row["seq"], address=address))


def _json_column(value: Any) -> Any:
    """A JSON column read by plain SQL: psycopg decodes it, sqlite3 leaves the text."""
    return json.loads(value) if isinstance(value, str) else value


def _main_pushes(conn: Connection) -> None:
    """Commits pushed to main outside the gateway, and what the gateway last saw of main."""
    metadata.create_all(conn, tables=[main_pushes, markers])


@functools.cache
def _one_open_drift_record() -> Index:
    return Index("drift_records_one_open_per_stack", drift_records.c.stack, unique=True,
                 sqlite_where=drift_records.c.status == "open", postgresql_where=drift_records.c.status == "open")


def _day_two(conn: Connection) -> None:
    """Drift records per stack (one open at a time, whatever workers race) and break-glass windows."""
    metadata.create_all(conn, tables=[drift_records, break_glass_windows])
    _one_open_drift_record().create(conn, checkfirst=True)


def _one_turn_per_conversation(conn: Connection) -> None:
    """A conversation runs one agent turn at a time: the running turn holds it, with a lease, under its own id."""
    present = {c["name"] for c in inspect(conn).get_columns("conversations")}
    if "running_until" not in present:
        kind = "TIMESTAMP WITH TIME ZONE" if conn.dialect.name == "postgresql" else "DATETIME"
        conn.execute(text(f"ALTER TABLE conversations ADD COLUMN running_until {kind}"))
    if "running_turn" not in present:
        conn.execute(text("ALTER TABLE conversations ADD COLUMN running_turn VARCHAR(36)"))


def _lock_owners(conn: Connection) -> None:
    """A stack lock names the proposal whose apply holds it, so a dead runner's apply is found from its lock."""
    if "proposal_id" not in {c["name"] for c in inspect(conn).get_columns("stack_locks")}:
        conn.execute(text("ALTER TABLE stack_locks ADD COLUMN proposal_id INTEGER"))


def _agent_turns_as_jobs(conn: Connection) -> None:
    """Agent turns run as jobs (heartbeat, recovery); a turn that ran as a thread of an API process before has no
    job to recover it, and its process is gone with the upgrade: it is recorded interrupted, not left running."""
    if "job_id" not in {c["name"] for c in inspect(conn).get_columns("agent_runs")}:
        conn.execute(text("ALTER TABLE agent_runs ADD COLUMN job_id INTEGER"))
    conn.execute(agent_runs.update().where(agent_runs.c.status == "running", agent_runs.c.job_id.is_(None)).values(
        status="interrupted", message="the gateway was upgraded while this request ran; ask again", updated_at=_now()))


def _job_retries(conn: Connection) -> None:
    """A job that failed on GitHub's bad moment is tried again later: its attempts, and when it may run next."""
    present = {c["name"] for c in inspect(conn).get_columns("jobs")}
    if "attempts" not in present:
        conn.execute(text("ALTER TABLE jobs ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0"))
    if "run_after" not in present:
        kind = "TIMESTAMP WITH TIME ZONE" if conn.dialect.name == "postgresql" else "DATETIME"
        conn.execute(text(f"ALTER TABLE jobs ADD COLUMN run_after {kind}"))


AUDIT_FILTER_INDEXES = (Index("audit_events_by_kind", audit_events.c.kind, audit_events.c.seq),
                        Index("audit_events_by_proposal", audit_events.c.proposal_id, audit_events.c.seq))


def _canonical_events(conn: Connection) -> None:
    """Each event keeps the canonical bytes its hash covers: verify hashes what is stored, a read decodes one column,
    and the payload and stacks columns they repeat go. Which proposals name each address is indexed, and the kind
    and proposal filters read their index in event order. No hash changes: a signed checkpoint still holds."""
    if "canonical" not in {c["name"] for c in inspect(conn).get_columns("audit_events")}:
        conn.execute(text("ALTER TABLE audit_events ADD COLUMN canonical TEXT"))
        _backfill_canonical(conn)
        for column in ("payload", "stacks"):
            conn.execute(text(f"ALTER TABLE audit_events DROP COLUMN {column}"))
    metadata.create_all(conn, tables=[audit_proposal_addresses])
    _prefix_indexes()[1].create(conn, checkfirst=True)
    conn.execute(text(
        "INSERT INTO audit_proposal_addresses (proposal_id, address) SELECT DISTINCT e.proposal_id, a.address "
        "FROM audit_event_addresses a JOIN audit_events e ON e.seq = a.seq WHERE e.proposal_id IS NOT NULL"))
    present = {i["name"] for i in inspect(conn).get_indexes("audit_events")}
    for old in ("ix_audit_events_kind", "ix_audit_events_proposal_id"):  # their composite successors serve both
        if old in present:
            conn.execute(text(f"DROP INDEX {old}"))
    for index in AUDIT_FILTER_INDEXES:
        index.create(conn, checkfirst=True)


def _backfill_canonical(conn: Connection, batch: int = 5000) -> None:
    """The canonical bytes of every existing event, from its columns: exactly what its hash was computed over, so an
    event edited before the upgrade still fails verify after it."""
    after = 0
    while rows := conn.execute(text(
            "SELECT seq, id, at, actor, actor_kind, kind, proposal_id, stacks, payload FROM audit_events "
            "WHERE seq > :after ORDER BY seq LIMIT :batch"), {"after": after, "batch": batch}).mappings().all():
        conn.execute(text("UPDATE audit_events SET canonical = :canonical WHERE seq = :seq"), [
            {"seq": r["seq"], "canonical": event_bytes(
                {"seq": r["seq"], "id": r["id"], "at": r["at"], "actor": r["actor"], "actor_kind": r["actor_kind"],
                 "kind": r["kind"], "proposal_id": r["proposal_id"], "stacks": list(_json_column(r["stacks"])),
                 "payload": json.loads(r["payload"])}).decode()} for r in rows])
        after = rows[-1]["seq"]


def _sign_in(conn: Connection) -> None:
    """Signing in with OpenID Connect and GitHub: linked identities, and page sessions kept server-side."""
    metadata.create_all(conn, tables=[oidc_identities, web_sessions])
def _notifications(conn: Connection) -> None:
    """Notifications and the outbox's place in the trail: it starts at the trail's head as it is now, so an upgraded
    gateway tells of what happens from now on, not of its whole history."""
    metadata.create_all(conn, tables=[notifications])
    head = conn.scalar(select(audit_head.c.seq).where(audit_head.c.id == 1)) or 0
    if conn.scalar(select(markers.c.value).where(markers.c.name == OUTBOX_MARKER)) is None:
        conn.execute(markers.insert().values(name=OUTBOX_MARKER, value=str(head)))


def _audit_at_scale(conn: Connection) -> None:
    """Fewer index rows per event appended: on PostgreSQL the prefix index of addresses (text_pattern_ops) serves an
    exact address too, so the plain one beside it goes (SQLite keeps it: its prefix search is a range on it)."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("DROP INDEX IF EXISTS audit_event_addresses_by_address"))


def _sign_in_flows(conn: Connection) -> None:
    """Sign-ins in progress kept server-side under their state, used once; the trail's count of refusals."""
    metadata.create_all(conn, tables=[sign_in_flows, sign_in_refusal_tallies])


def _gitlab_accounts(conn: Connection) -> None:
    """People linked to GitLab accounts by numeric user id, so their approvals and commands on GitLab count."""
    gitlab_accounts.create(conn, checkfirst=True)


def _plan_rounds(conn: Connection) -> None:
    """A proposal's stacks are planned as jobs any worker may claim, gathered in a round until the last one is done."""
    metadata.create_all(conn, tables=[plan_rounds, plan_round_stacks])


def _stack_serials(conn: Connection) -> None:
    """What a worker last read of each stack's state serial, which reads compare with a plan's instead of asking an
    engine or a cloud; a plan's serial is 64-bit and its lineage an ARN long (CloudFormation's serial, a moment in
    microseconds, overflowed 32 bits, and its lineage, the stack's ARN, 36 characters: no plan of it was kept)."""
    stack_serials.create(conn, checkfirst=True)
    if conn.dialect.name == "postgresql":  # SQLite's INTEGER is 64-bit already, and it keeps a VARCHAR whole
        conn.execute(text("ALTER TABLE plans ALTER COLUMN state_serial TYPE BIGINT"))
        conn.execute(text("ALTER TABLE plans ALTER COLUMN state_lineage TYPE VARCHAR(300)"))


def _trail_tree(conn: Connection) -> None:
    """Checkpoints sign the root of the trail's Merkle tree too, and its complete blocks' roots are kept: an evidence
    bundle proves a change's events against a checkpoint with a few hashes each. Checkpoints signed before keep none."""
    if "tree_root" not in {c["name"] for c in inspect(conn).get_columns("audit_checkpoints")}:
        conn.execute(text("ALTER TABLE audit_checkpoints ADD COLUMN tree_root VARCHAR(71)"))
    audit_tree_blocks.create(conn, checkfirst=True)


def _workers(conn: Connection) -> None:
    """The worker registry: each running worker's name, start and last beat, so metrics (and the CLI) can tell
    whether any worker is alive."""
    workers.create(conn, checkfirst=True)


def _repositories(conn: Connection) -> None:
    """Many declaration repositories under one gateway: the registry (the workspace's first one in it), and the
    repository of each proposal and each push to main (the first one for those made before)."""
    repositories.create(conn, checkfirst=True)
    if conn.scalar(select(repositories.c.name).where(repositories.c.name == DEFAULT_REPOSITORY)) is None:
        conn.execute(repositories.insert().values(name=DEFAULT_REPOSITORY, added_at=_now(), added_by="gateway"))
    for table in ("proposals", "main_pushes"):
        if "repository" not in {c["name"] for c in inspect(conn).get_columns(table)}:
            conn.execute(text(f"ALTER TABLE {table} ADD COLUMN repository VARCHAR(63) NOT NULL "
                              f"DEFAULT '{DEFAULT_REPOSITORY}'"))
    next(i for i in proposals.indexes if i.name == "proposals_by_repository").create(conn, checkfirst=True)
    if conn.dialect.name == "postgresql":  # SQLite keeps any length
        conn.execute(text("ALTER TABLE breaker_states ALTER COLUMN scope TYPE VARCHAR(100)"))
        conn.execute(text("ALTER TABLE markers ALTER COLUMN name TYPE VARCHAR(200)"))


def _audit_by_repository(conn: Connection) -> None:
    """Each event's declaration repository beside its bytes, indexed with seq, so the trail filters by repository in
    one index read in order. The column is outside the canonical bytes the chain hashes: no event's bytes or hash
    changes, so every hash, checkpoint and Merkle root signed before still holds and `gateway audit verify` passes on
    an old trail. Putting it in the bytes would cover it for new events only, and would change the event format every
    export, evidence bundle and offline verifier reads. Like the stack and address tables, it is an index: verify
    does not check it, and an edit of it can hide an event from this filter (never from the chain, nor from the
    proposal, person, kind, outcome or time filters, whose columns verify checks against the bytes). Existing events are the default repository's, except
    those an added repository's stacks or proposals, or its repository.added/removed events, say are its."""
    if "repository" not in {c["name"] for c in inspect(conn).get_columns("audit_events")}:
        conn.execute(text(f"ALTER TABLE audit_events ADD COLUMN repository VARCHAR(63) NOT NULL "
                          f"DEFAULT '{DEFAULT_REPOSITORY}'"))
    added = [name for name in conn.scalars(select(repositories.c.name)) if name != DEFAULT_REPOSITORY]
    for name in added:  # a trail kept since migration 32 may hold added repositories' events already
        e, s, p = audit_events.c, audit_event_stacks.c, proposals.c
        # LIKE, not a range: a collation other than C may not order `/` before `0` (a one-time scan, in a migration)
        theirs = or_(e.seq.in_(select(s.seq).where(s.stack.startswith(f"{name}/", autoescape=True))),
                     e.proposal_id.in_(select(p.id).where(p.repository == name)),
                     and_(e.kind.in_(["repository.added", "repository.removed"]),
                          e.canonical.contains(f'"repository":"{name}"', autoescape=True)))
        conn.execute(audit_events.update().where(theirs).values(repository=name))
    AUDIT_BY_REPOSITORY.create(conn, checkfirst=True)


def _audit_by_repository_and_kind(conn: Connection) -> None:
    """A repository's events of each kind indexed in order: the `repo` filter with an action, a kind or an outcome
    (an outcome is a few kinds) reads the events that match, however rare the combination, not every event of the
    repository. Built once over the trail (some seconds at a million events, appends waiting meanwhile)."""
    AUDIT_BY_REPOSITORY_AND_KIND.create(conn, checkfirst=True)


MIGRATIONS: list[tuple[int, Callable[[Connection], None]]] = [
    (1, _initial_schema),
    (2, _jobs_and_merge_previews),
    (3, _stored_previews),
    (4, _plan_artifacts),
    (5, _applied_commits_and_one_running_job),
    (6, _github),
    (7, _breaker),
    (8, _proposal_kinds),
    (9, _audit_checkpoints),
    (10, _credential_lifecycle),
    (11, _audit_search),
    (12, _main_pushes),
    (13, _one_turn_per_conversation),
    (14, _day_two),
    (15, _lock_owners),
    (16, _job_retries),  # a webhook job's retries
    (17, _agent_turns_as_jobs),
    (18, _canonical_events),  # the trail stores each event's canonical bytes
    (19, _sign_in),  # OIDC identities and server-side web sessions
    (20, _notifications),  # notifications, delivered once each, and the outbox's place in the trail
    (21, _audit_at_scale),  # the audit trail's indexes for appends and filters at a million events
    (22, _sign_in_flows),  # sign-ins in progress, server-side and used once; refusals recorded a few per window
    (23, _stack_serials),  # each stack's serial as a worker read it; plans' serials 64-bit
    (27, _trail_tree),  # checkpoints sign the trail's Merkle root; its blocks' roots kept (evidence bundles)
    (28, _gitlab_accounts),  # GitLab accounts linked to people
    (29, _workers),  # the worker registry: who runs, by their beats
    (30, _plan_rounds),  # a proposal's stacks planned as jobs of their own, gathered in rounds
    (32, _repositories),  # many declaration repositories: the registry, and each proposal's and push's repository
    (33, _audit_by_repository),  # each event's repository beside it (outside the hashed bytes), indexed with seq
    (34, _audit_by_repository_and_kind),  # a repository's events of a kind, in order (the repo filter with a kind)
]


SCHEMA_VERSION = MIGRATIONS[-1][0]  # the schema this code reads and writes
_MIGRATION_LOCK = 0x6761746577617901  # PostgreSQL advisory lock key: one migrating process at a time


class Database:
    """One SQLAlchemy engine and the transaction discipline every adapter shares."""

    def __init__(self, url: str):
        try:
            self.engine: Engine = create_engine(url, future=True, **_engine_options(url))
        except (ArgumentError, ImportError) as exc:
            raise ConfigError(f"database URL {url!r} is not usable: {exc}") from None
        self.is_sqlite = self.engine.dialect.name == "sqlite"
        # our own BEGIN, sent by `_begun` (read, write): a listener on the engine's "begin" would do it too, but any
        # listener there makes every statement run SQLAlchemy's event dispatch (a fifth of a small query's cost)
        self._begin: tuple[str, str] | None = None
        if self.is_sqlite:
            _serialize_sqlite(self.engine)
            self._begin = ("BEGIN IMMEDIATE", "BEGIN")
        elif self.engine.dialect.name == "postgresql":
            _begin_postgres_ourselves(self.engine)
            self._begin = (_BEGIN_POSTGRES_WRITE, _BEGIN_POSTGRES_READ)

    def migrate(self) -> list[int]:
        """Run the migrations the database has not run, in one transaction; the versions it ran. Processes that
        start together (an API and its workers, the database back after an outage) take turns: on PostgreSQL an
        advisory lock held to the commit, on SQLite the write lock itself."""
        ran = []
        with self.transaction() as conn:
            if not self.is_sqlite:
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
            if not self.engine.dialect.has_table(conn, "schema_version"):
                schema_version.create(conn)
            done = set(conn.scalars(select(schema_version.c.version)))
            for version, migration in MIGRATIONS:
                if version not in done:
                    migration(conn)
                    conn.execute(schema_version.insert().values(version=version, applied_at=_now()))
                    ran.append(version)
        return ran

    def pending_migrations(self) -> list[int]:
        """The migrations this code knows that the database has not run (all of them on an empty database)."""
        with self.transaction(readonly=True) as conn:
            if not self.engine.dialect.has_table(conn, "schema_version"):
                return [version for version, _ in MIGRATIONS]
            done = set(conn.scalars(select(schema_version.c.version)))
        return [version for version, _ in MIGRATIONS if version not in done]

    @contextmanager
    def transaction(self, readonly: bool = False) -> Iterator[Connection]:
        """One transaction; a `readonly` one takes no write lock (SQLite: a deferred BEGIN), so readers
        never queue behind a writer.

        A read opened inside another read of this database (same thread or task) joins it: an adapter's read
        inside a view's read unit of work (the sandbox's state serial) is the same snapshot, not one more
        BEGIN .. COMMIT on another connection. A write always has a transaction of its own."""
        outer = _OPEN_READ.get()
        if readonly and outer is not None and outer[0] is self:
            yield outer[1]
            return
        try:
            conn, began = self._begun(readonly)
            with conn, began:
                joined = _OPEN_READ.set((self, conn)) if readonly else None
                try:
                    yield conn
                finally:
                    if joined is not None:
                        _OPEN_READ.reset(joined)
        except OperationalError as exc:
            raise DatabaseUnavailable(f"database unavailable or busy: {str(exc.orig).strip()}") from exc
        except SQLAlchemyError as exc:
            raise BackendError(f"database error: {exc.__class__.__name__}: {str(exc).splitlines()[0]}") from exc

    def _begun(self, readonly: bool) -> tuple[Connection, RootTransaction]:
        """A pooled connection with its transaction begun. No ping on checkout: the BEGIN is the first thing sent,
        so a connection the server dropped (a restart) fails there, before any of the work ran, and the work gets
        a fresh connection once (SQLAlchemy has by then invalidated every connection of the pool that predates it)."""
        for retry in (False, True):
            conn = self.engine.connect()
            try:
                began = conn.begin()  # the driver sends nothing (autocommit; SQLite: no implicit BEGIN) ...
                if self.is_sqlite:
                    _sqlite_query_only(conn, readonly)
                if self._begin is not None:
                    conn.exec_driver_sql(self._begin[readonly])  # ... so this is the first thing sent
                return conn, began
            except DBAPIError as exc:
                conn.close()
                if retry or not exc.connection_invalidated:
                    raise
        raise AssertionError("unreachable")

    def dispose(self) -> None:
        self.engine.dispose()


# the read transaction open in this context (thread or task), which nested reads of the same database join
_OPEN_READ: ContextVar[tuple[Database, Connection] | None] = ContextVar("gateway_open_read", default=None)


def _engine_options(url: str) -> dict[str, Any]:
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": 60, "check_same_thread": False}}
    return {}


def _serialize_sqlite(engine: Engine) -> None:
    """SQLAlchemy's documented recipe: let us issue BEGIN ourselves (`Database._begun`), IMMEDIATE for a write."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        dbapi_connection.execute("PRAGMA journal_mode=WAL")
        dbapi_connection.execute("PRAGMA busy_timeout=60000")


def _sqlite_query_only(conn: Connection, readonly: bool) -> None:
    """SQLite's READ ONLY (see `_BEGIN_POSTGRES_READ`): a read that writes is refused. Set on the connection, so only
    when a pooled connection goes from writes to reads or back."""
    kept = conn.connection.info  # the DBAPI connection's own, across checkouts
    if kept.get("query_only") != readonly:
        conn.exec_driver_sql(f"PRAGMA query_only = {int(readonly)}")
        kept["query_only"] = readonly


# A statement waiting on a lock fails after this instead of waiting forever; set per transaction (SET LOCAL), so it
# holds behind a pooler that hands each transaction a different server session.
_BEGIN_POSTGRES_WRITE = "BEGIN; SET LOCAL lock_timeout = '30s'"
# A read is one snapshot, as on SQLite (WAL): under READ COMMITTED each statement would see its own moment, so a view
# could show a decision beside the plans it was not given on, and `audit verify` could read the chain's head, then
# stream events appended after it and call the chain broken. READ ONLY: a read that writes is refused, never
# committed ("reads never write"). A REPEATABLE READ transaction that only reads never fails to serialize.
_BEGIN_POSTGRES_READ = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET LOCAL lock_timeout = '30s'"


def _begin_postgres_ourselves(engine: Engine) -> None:
    """The same recipe on PostgreSQL: the driver in autocommit, and our BEGIN (`Database._begun`) carries the lock
    timeout in the same round trip (psycopg would send its own BEGIN, then the SET, each a round trip)."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.autocommit = True


def _now() -> datetime:
    return datetime.now(UTC)


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
