"""The ports the use cases talk through. Adapters implement them; one composition root wires them.

    Store            units of work (`session()`), plus the stack locks, job queue and worker registry that commit on
                     their own
    UnitOfWork       one transaction, one repository per aggregate: principals, proposals, conversations,
                     jobs, github, main, day_two, breaker, sign_in, notifications, audit
    Clock            the time
    DeclarationRepo  the declaration repo: trees read at exact commits, merges, branches the gateway writes
    SimulatedCloud   the sandbox engine's cloud, acted on behind the gateway's back (drift, faults, imports)
    DeclarationReader  what a stack's HCL declares, read without planning (secrets, backend, local modules, remote
                     state reads)
    PolicyScanner    an external plan scanner (checkov) beside the built-in rules
    PolicyEvaluator  main's Rego policies, loaded and evaluated
    WorkingCopies    clones of the declaration repo on disk, where agents edit files
    Engine           plans and applies one stack (every engine emits Terraform's JSON plan)
    Forge            the code host (GitHub, GitLab): pull/merge requests, reviews or approvals, checks, teams, merges
    Metrics          what operators count (job run times, lock waits, deliveries...); `NO_METRICS` counts nothing
    IdentityProvider an OpenID Connect provider or GitHub OAuth, for signing in to the pages
    NotificationSender  delivers one notice to one channel (Slack, e-mail, a signed webhook)

Services name these Protocols, never an adapter: a test can hand them a fake that implements one. Each lives in the
module of what it serves (engines, operations, records, repository, policy, forge, people); all are named here.
"""

from __future__ import annotations

from gateway.ports.engines import (
    ApplyOutcome,
    DeclarationReader,
    Engine,
    EnginePlan,
    RemoteModules,
    SimulatedCloud,
    StackInputs,
)
from gateway.ports.forge import (
    ApprovalForge,
    Forge,
    ReviewForge,
)
from gateway.ports.operations import (
    NO_METRICS,
    Clock,
    Metrics,
    NoMetrics,
    Signer,
)
from gateway.ports.people import (
    IdentityProvider,
    NotificationSender,
    SignInStart,
)
from gateway.ports.policy import (
    PolicyEvaluation,
    PolicyEvaluator,
    PolicyScanner,
)
from gateway.ports.records import (
    AuditLog,
    BreakerRecords,
    Conversations,
    DayTwoRecords,
    GitHubRecords,
    JobQueue,
    Jobs,
    MainRecords,
    Notifications,
    PlanRounds,
    Principals,
    Proposals,
    Repositories,
    SignInRecords,
    StackLocks,
    StackRecords,
    Store,
    UnitOfWork,
    WorkerRegistry,
)
from gateway.ports.repository import (
    CommitInfo,
    DeclarationRepo,
    WorkingCopies,
    WorkingCopy,
)

__all__ = [
    "ApplyOutcome",
    "ApprovalForge",
    "AuditLog",
    "BreakerRecords",
    "Clock",
    "CommitInfo",
    "Conversations",
    "DayTwoRecords",
    "DeclarationReader",
    "DeclarationRepo",
    "Engine",
    "EnginePlan",
    "Forge",
    "GitHubRecords",
    "IdentityProvider",
    "JobQueue",
    "Repositories",
    "Jobs",
    "MainRecords",
    "Metrics",
    "NO_METRICS",
    "NoMetrics",
    "NotificationSender",
    "Notifications",
    "PlanRounds",
    "PolicyEvaluation",
    "PolicyEvaluator",
    "PolicyScanner",
    "Principals",
    "Proposals",
    "RemoteModules",
    "ReviewForge",
    "SignInRecords",
    "SignInStart",
    "Signer",
    "SimulatedCloud",
    "StackInputs",
    "StackLocks",
    "StackRecords",
    "Store",
    "UnitOfWork",
    "WorkerRegistry",
    "WorkingCopies",
    "WorkingCopy",
]
