"""Pull requests on GitHub, as the core sees them: signed deliveries, `/gateway` commands, the sticky
comment and the checks. No I/O here: the adapter talks to GitHub, the service decides.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from gateway.domain.approvals import ApproverGroups
from gateway.domain.audit import AuditEvent
from gateway.domain.lifecycle import ProposalStatus
from gateway.domain.policy import Severity
from gateway.domain.preview import Preview, render_markdown, render_text
from gateway.domain.proposal import Proposal
from gateway.domain.repositories import DEFAULT_REPOSITORY

COMMENT_LIMIT = 65_536  # GitHub refuses a longer comment body
COMMENT_BUDGET = 60_000  # the sticky comment stays under the limit by design, with room to spare
CHECK_TEXT_LIMIT = 65_535  # a check run's output.text
MIN_FINGERPRINT = 7  # `/gateway approve` needs at least this many characters of the plan's fingerprint
MARKER = "<!-- change-gateway:proposal:{id} -->"
CHANGES_HEADING = "#### Changes"  # where render_markdown starts listing each resource
NOT_COUNTED_SHOWN = 20  # people's refused decisions the comment lists; the rest are in the trail and on the page
# the trail's refusals of a decision or a command someone made (`job.refused` only mirrors one of these)
DECISION_REFUSALS = frozenset({"approve.refused", "reject.refused", "plan.refused", "apply.refused", "ask.refused",
                               "override.refused"})


def signature_valid(secret: str, body: bytes, header: str | None) -> bool:
    """Whether `X-Hub-Signature-256` is the HMAC-SHA256 of the raw body under the secret (constant time)."""
    if not secret or not header or not header.startswith("sha256="):
        return False
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest().encode()
    return hmac.compare_digest(expected, header.removeprefix("sha256=").strip().lower().encode("utf-8", "replace"))


def repository_allowed(patterns: Sequence[str], full_name: str) -> bool:
    """Whether `owner/name` matches one of the `owner/name` patterns (GitHub's names ignore case; `*` does not cross
    the slash)."""
    owner, _, name = full_name.casefold().partition("/")
    for pattern in patterns:
        want_owner, _, want_name = pattern.casefold().partition("/")
        if fnmatch.fnmatchcase(owner, want_owner) and fnmatch.fnmatchcase(name, want_name):
            return True
    return False


def plan_fingerprint(digests: Mapping[str, str]) -> str:
    """One hex id for the exact set of plans an approval binds to (every stack's digest)."""
    text = "\n".join(f"{stack}={digest}" for stack, digest in sorted(digests.items()))
    return hashlib.sha256(text.encode()).hexdigest()


class CommandKind(StrEnum):
    PLAN = "plan"
    APPLY = "apply"
    APPROVE = "approve"
    REJECT = "reject"
    ASK = "ask"  # plain words: the agent revises the branch (a follow-up turn of its conversation)


@dataclass(frozen=True)
class Command:
    kind: CommandKind
    argument: str = ""


def parse_command(body: str) -> Command | None:
    """`/gateway plan|apply|approve <fingerprint>|reject <reason>|<plain words>` on the first line; None if not one."""
    text = body.strip()
    first, _, rest = text.partition("\n")
    words = first.split(None, 2)
    if not words or words[0] != "/gateway":
        return None
    if len(words) == 1:
        return Command(CommandKind.ASK, rest.strip())
    verb = words[1].lower()
    argument = " ".join(words[2:]).strip()
    if verb in ("plan", "apply") and not argument:
        return Command(CommandKind(verb))
    if verb == "approve":
        return Command(CommandKind.APPROVE, argument)
    if verb == "reject":
        return Command(CommandKind.REJECT, "\n".join(p for p in (argument, rest.strip()) if p))
    return Command(CommandKind.ASK, text.removeprefix("/gateway").strip())


@dataclass(frozen=True)
class NotCounted:
    """A decision or command someone made that did not count: who, what it was, and why not."""

    who: str  # a gateway person's name, or a GitHub login that is not linked to one
    what: str  # approve, reject, plan, apply, ask, override
    reasons: tuple[str, ...]

    def line(self) -> str:
        return f"**{self.who}** ({self.what}): {'; '.join(self.reasons)}"


def not_counted(events: Sequence[AuditEvent], head_sha: str) -> list[NotCounted]:
    """Each person's refused decision of each kind, once (the latest), for the current commit; oldest first."""
    latest: dict[tuple[str, str], NotCounted] = {}
    for event in events:
        reasons = tuple(str(r) for r in event.payload.get("reasons") or () if str(r).strip())
        if event.kind not in DECISION_REFUSALS or not reasons or event.payload.get("head_sha") not in (head_sha, None):
            continue
        what = event.kind.removesuffix(".refused")
        latest.pop((event.actor, what), None)  # re-inserted: the order is that of each one's latest refusal
        who = event.actor.removeprefix("github:").removeprefix("gitlab:")
        latest[(event.actor, what)] = NotCounted(who, what, reasons)
    return list(latest.values())


@dataclass(frozen=True)
class Delivery:
    """A webhook delivery as it was received (GitHub's or GitLab's), recorded once by its id."""

    id: str
    event: str
    action: str | None
    payload: str  # the body, as received
    job_id: int | None
    received_at: datetime


@dataclass(frozen=True)
class PullRequestLink:
    """A proposal's pull request (or merge request) and what was last published to it."""

    proposal_id: int
    repository: str
    number: int
    comment_id: int | None  # the sticky comment, edited in place
    published_seq: int  # the newest trail event the comment and checks show
    published_digest: str | None  # of what was last written: the same is not rewritten
    publish_error: str | None
    attempted_at: datetime | None


@dataclass(frozen=True)
class PullInfo:
    """A pull request as the code host has it now."""

    number: int
    head_ref: str
    head_sha: str
    state: str
    merged: bool
    url: str
    merge_commit_sha: str | None = None


class CheckState(StrEnum):
    PENDING = "pending"
    SUCCESS = "success"
    FAILURE = "failure"
    NEUTRAL = "neutral"


@dataclass(frozen=True)
class Check:
    name: str
    state: CheckState
    title: str
    summary: str
    text: str | None = None


@dataclass(frozen=True)
class PullRequestView:
    """What the pull request shows of a proposal: everything the gateway's review page knows, in short."""

    proposal: Proposal
    previews: Mapping[str, Preview]
    required_approvals: int
    blocked_by: Sequence[str]
    claim_issues: Sequence[str]
    pending: Sequence[str]
    approvers: ApproverGroups  # whose approval counts, for each stack and for the protected paths it changes
    teams: Mapping[str, str]  # group -> GitHub team slug
    not_counted: Sequence[NotCounted]  # decisions and commands that did not count, each once, with who and why
    page_url: str
    at: datetime  # when it is shown: overrides that lapsed by then no longer lift a deny
    outcome: str | None = None  # the last apply's result, in words
    notices: Sequence[str] = ()  # what went wrong besides: failed jobs, a merge by hand on GitHub, a stopped agent
    forge: str = "GitHub"  # or GitLab: its words (a review of the commit / an approval of the merge request)


def render_comment(view: PullRequestView, budget: int = COMMENT_BUDGET) -> str:
    """The sticky comment: what is asked, by whom, what it does (destroys and drift first), what it still needs.

    Under GitHub's limit by design: when the per-resource changes do not fit, they are left out and the
    comment says so and where the whole plan is (the check run and the review page), never cut silently.
    """
    head = _comment_head(view)
    full = head + _stack_sections(view, detailed=True) + _comment_foot(view)
    if len(full) <= budget:
        return full
    short = head + _stack_sections(view, detailed=False) + _comment_foot(view)
    if len(short) <= budget:
        return short
    cut = short[:budget - 400].rsplit("\n", 1)[0]
    return (cut + f"\n\n**This summary is cut at {budget:,} characters.** The whole plan is in the "
            f"`gateway/plan` check and on the [review page]({view.page_url}).\n" + MARKER.format(id=view.proposal.id))


def _comment_head(view: PullRequestView) -> str:
    p = view.proposal
    fingerprint = plan_fingerprint(p.current_digests)[:12]
    where = "" if p.repository == DEFAULT_REPOSITORY else f" in repository `{p.repository}`"
    lines = [f"## Change gateway · proposal [{p.id}]({view.page_url}){where}: {p.status.value}", ""]
    lines += [f"> {line}" for line in p.reason.strip().splitlines()[:12]] + [""]
    agent = " (agent)" if p.proposer.is_agent else ""
    lines.append(f"Requested by **{p.requester.name}**, proposed by **{p.proposer.name}**{agent}; "
                 f"stacks {', '.join(f'`{s}`' for s in p.stacks)}; risk **{p.risk.value}**.")
    if view.outcome:
        lines += ["", f"**{view.outcome}**"]
    if p.agent_claim:
        lines += ["", f"**The agent says:** {p.agent_claim.strip()[:1000]}"]
        lines += ([f"- :warning: the plan disagrees: {issue}" for issue in view.claim_issues]
                  or ["- :white_check_mark: the plan agrees with what the agent says"])
    lines += ["", "### Approval", ""]
    if p.status in (ProposalStatus.OPEN, ProposalStatus.FAILED):
        how = ("approve the merge request while that commit is its head" if view.forge == "GitLab"
               else "a review on that commit")
        lines.append(f"Plan `{fingerprint}` of commit `{p.head_sha[:12]}`. Approve exactly this plan with {how}, or "
                     f"comment `/gateway approve {fingerprint}`.")
    approvers = sorted({d.principal.name for d in p.current_approvals})
    lines.append(f"- needs **{view.required_approvals}** approval(s) from different people; has {len(approvers)}"
                 + (f" ({', '.join(approvers)})" if approvers else ""))
    for stack in p.stacks:
        lines.append(f"- `{stack}`: from " + _groups(view.approvers.stacks.get(stack, frozenset()), view))
    if view.approvers.protected_paths:
        paths = ", ".join(f"`{path}`" for path in view.approvers.protected_paths)
        lines.append(f"- protected paths {paths}: from " + _groups(view.approvers.config, view))
    rejection = p.current_rejection
    if rejection is not None:
        lines.append(f"- :x: rejected by **{rejection.principal.name}**: {rejection.comment}")
    lines += [f"- :no_entry: {reason}" for reason in view.blocked_by]
    lines += [f"- :hourglass: {change} (a re-plan is queued)" for change in view.pending]
    if view.not_counted:
        shown = view.not_counted[-NOT_COUNTED_SHOWN:]
        lines += ["", "**Not counted:**"] + [f"- {n.line()}" for n in shown]
        if len(view.not_counted) > len(shown):
            lines.append(f"- … and {len(view.not_counted) - len(shown)} earlier one(s), in the trail and on the "
                         f"[review page]({view.page_url})")
    if view.notices:
        lines += ["", "**Needs attention:**"] + [f"- {n}" for n in view.notices]
    denies = [f for f in p.findings if f.severity == Severity.DENY]
    if p.findings:
        lines += ["", "### Policy", ""]
        lines += [f"- {'⛔ deny' if f in denies else '⚠️ warn'} `{f.rule}` `{f.address}`: {f.message}"
                  for f in p.findings]
    return "\n".join(lines) + "\n"


def _groups(groups: frozenset[str], view: PullRequestView) -> str:
    return ", ".join(_group(g, view.teams, view.forge) for g in sorted(groups)) or "nobody"


def _group(group: str, teams: Mapping[str, str], forge: str = "GitHub") -> str:
    team = "group" if forge == "GitLab" else "team"
    return (f"{group} ({team} `{teams[group]}`)" if group in teams
            else f"{group} (no {forge} {team} mapped: not via {forge})")


def _stack_sections(view: PullRequestView, detailed: bool) -> str:
    out = []
    for stack, preview in view.previews.items():
        out.append(f"\n### Stack `{stack}`\n")
        if detailed:
            out.append(render_markdown(preview))
            continue
        # everything before the per-resource changes: counts, risk, destroys and replacements, policy, drift
        out.append(render_markdown(preview).split(CHANGES_HEADING, 1)[0].rstrip() + "\n")
        out.append(f"\n_{len(preview.changes)} resource change(s) and the outputs are not listed here, to stay "
                   f"under {view.forge}'s comment limit: see the `gateway/plan` check or the [review page]"
                   f"({view.page_url})._\n")
    return "".join(out)


def _comment_foot(view: PullRequestView) -> str:
    return (f"\n---\n[Review page]({view.page_url}) · commands: `/gateway plan`, `/gateway apply`, "
            f"`/gateway approve <plan>`, `/gateway reject <reason>`, `/gateway <what to change>`\n"
            + MARKER.format(id=view.proposal.id))


def pull_request_checks(view: PullRequestView) -> list[Check]:
    """`gateway/plan`, `gateway/policy`, `gateway/approval`, `gateway/apply`: where the proposal stands."""
    p = view.proposal
    counts = "; ".join(f"{s}: {_counts(pv)}" for s, pv in view.previews.items())
    plan_text = _plan_text(view)
    plan = (Check("gateway/plan", CheckState.PENDING, "Re-planning", "; ".join(view.pending), plan_text)
            if view.pending else Check("gateway/plan", CheckState.SUCCESS, "Planned", counts or "no stacks", plan_text))
    blocking = p.blocking_findings(view.at)
    warnings = [f for f in p.findings if f.severity != Severity.DENY]
    policy = (Check("gateway/policy", CheckState.FAILURE, f"{len(blocking)} deny finding(s)",
                    "\n".join(f"{f.rule} {f.address}: {f.message}" for f in blocking))
              if blocking else Check("gateway/policy", CheckState.SUCCESS, "No deny findings",
                                     f"{len(warnings)} warning(s)"))
    rejection = p.current_rejection
    if p.status in (ProposalStatus.APPLIED, ProposalStatus.APPLYING, ProposalStatus.UNMERGED):
        approval = Check("gateway/approval", CheckState.SUCCESS, "Approved", "approved before the apply")
    elif rejection is not None:
        approval = Check("gateway/approval", CheckState.FAILURE, f"Rejected by {rejection.principal.name}",
                         rejection.comment)
    elif view.blocked_by:
        approval = Check("gateway/approval", CheckState.PENDING, "Approval needed", "\n".join(view.blocked_by))
    else:
        approval = Check("gateway/approval", CheckState.SUCCESS, "Approved",
                         ", ".join(sorted({d.principal.name for d in p.current_approvals})))
    apply = {
        ProposalStatus.APPLIED: Check("gateway/apply", CheckState.SUCCESS, "Applied and merged", view.outcome or ""),
        ProposalStatus.FAILED: Check("gateway/apply", CheckState.FAILURE, "Apply failed", view.outcome or ""),
        ProposalStatus.UNMERGED: Check("gateway/apply", CheckState.FAILURE, "Applied, not merged", view.outcome or ""),
        ProposalStatus.ABANDONED: Check("gateway/apply", CheckState.NEUTRAL, "Abandoned", view.outcome or ""),
        ProposalStatus.APPLYING: Check("gateway/apply", CheckState.PENDING, "Applying", "the apply is running"),
    }.get(p.status, Check("gateway/apply", CheckState.PENDING, "Not applied yet",
                          "green only once the approved plan is applied"))
    return [plan, policy, approval, apply]


def _counts(preview: Preview) -> str:
    c = preview.counts
    return (f"+{c.get('create', 0)} ~{c.get('update', 0)} "
            f"±{c.get('replace', 0) + c.get('replace-create-first', 0)} -{c.get('delete', 0)}")


def _plan_text(view: PullRequestView) -> str:
    """The whole plan for the check run; when it is longer than GitHub keeps, it says so and where the rest is."""
    text = "\n".join(f"Stack {s}\n\n```\n{render_text(pv)}```\n" for s, pv in view.previews.items())
    if len(text) <= CHECK_TEXT_LIMIT:
        return text
    note = f"\n\n(The plan is longer than a check run holds; the whole plan is on the review page: {view.page_url})"
    return text[:CHECK_TEXT_LIMIT - len(note) - 10].rsplit("\n", 1)[0] + "\n```" + note
