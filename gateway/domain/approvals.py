"""The approval rules. Each check returns the unmet rules as sentences; empty means allowed.

These are the controls that make the gateway worth having: the proposer never approves, an
approval is bound to one commit and one set of plans, and protected resources need more people.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from gateway.domain.lifecycle import DECIDABLE, Transition, next_status
from gateway.domain.permissions import Action, refusals
from gateway.domain.policy import Severity
from gateway.domain.principals import Principal
from gateway.domain.proposal import Decision, Proposal, ProposalKind
from gateway.domain.repo_settings import RepoSettings

PROTECTED_PATHS = "the protected paths"  # the part of a proposal that config approvers approve, in words


@dataclass(frozen=True)
class ApproverGroups:
    """Whose approval a proposal needs: each of its stacks' approver groups, and the config approvers' groups when it
    changes a protected path (gateway.yaml, policies/...). The one answer for the rules, the pages, the notices and
    the forge (the teams a pull request asks for review)."""

    stacks: Mapping[str, frozenset[str]]  # each of the proposal's stacks -> its approver groups (none: not in settings)
    protected_paths: tuple[str, ...]  # the protected paths the proposal changes
    config: frozenset[str]  # the groups that approve changes to protected paths (they count only when some change)

    def groups(self) -> frozenset[str]:
        """Every group whose approval counts for some part of the proposal."""
        groups: frozenset[str] = frozenset().union(*self.stacks.values())
        return groups | self.config if self.protected_paths else groups

    def parts(self) -> dict[str, frozenset[str]]:
        """What needs an approver, in words (`stack network`, `the protected paths`) -> the groups that may give it."""
        out = {f"stack {stack}": groups for stack, groups in self.stacks.items()}
        if self.protected_paths:
            out[PROTECTED_PATHS] = self.config
        return out

    def unmet(self, groups: frozenset[str]) -> list[str]:
        """The parts that someone in `groups` may not approve (empty: they approve every part)."""
        return [part for part, allowed in self.parts().items() if not groups & allowed]

    def approved_by(self, group: str) -> list[str]:
        """The parts `group` approves: stacks by name, and the protected paths changed."""
        names = [stack for stack, groups in self.stacks.items() if group in groups]
        return names + ([f"protected paths {', '.join(self.protected_paths)}"]
                        if self.protected_paths and group in self.config else [])


def approver_groups(proposal: Proposal, settings: RepoSettings) -> ApproverGroups:
    """Whose approval `proposal` needs, by main's gateway.yaml (see `ApproverGroups`)."""
    return ApproverGroups(
        stacks={s: settings.stacks[s].approver_groups if s in settings.stacks else frozenset()
                for s in proposal.stacks},
        protected_paths=tuple(p for p in proposal.changed_paths if settings.is_protected_path(p)),
        config=settings.config_approver_groups)


def required_approvals(proposal: Proposal, settings: RepoSettings) -> int:
    """How many different approvers this proposal needs: from its risk and what its plans destroy."""
    needed = max(settings.required_approvals, settings.risk_approvals.get(proposal.risk.value, 0))
    if protected_destroys(proposal, settings):
        needed = max(needed, settings.protected_required_approvals)
    return needed


def protected_destroys(proposal: Proposal, settings: RepoSettings) -> list[str]:
    out = []
    for stack, addresses in proposal.destructive.items():
        protected = settings.stacks[stack].protected if stack in settings.stacks else frozenset()
        out += [f"{stack}:{a}" for a in addresses if _base_address(a) in protected or a in protected]
    return out


def decision_refusals(principal: Principal, proposal: Proposal, settings: RepoSettings, now: datetime,
                      decision: Decision = Decision.APPROVE, seen_sha: str | None = None,
                      seen_digests: Mapping[str, str] | None = None,
                      pushed: Mapping[str, str] | None = None) -> list[str]:
    """Why `principal` may not approve or reject `proposal` now (empty: they may). `pushed`: who pushed commits of
    the proposal through the gateway's git endpoint (name -> the last commit they pushed)."""
    who = refusals(principal, Action.DECIDE, proposal)
    if principal.is_agent:  # the table's one sentence: nothing else could make an agent's decision count
        return who
    reasons = []
    if proposal.status not in DECIDABLE:
        reasons.append(f"proposal {proposal.id} is {proposal.status.value}; it takes no more decisions")
    reasons += who
    if pushed and principal.name in pushed:  # they wrote part of the change, as a requester or proposer did
        reasons.append(f"{principal.name} pushed commit {pushed[principal.name][:12]} of this change through the "
                       "gateway's git endpoint and cannot approve or reject it")
    approvers = approver_groups(proposal, settings)
    for stack, allowed in approvers.stacks.items():
        if not principal.groups & allowed:
            reasons.append(
                f"{principal.name} is not in an approver group of stack {stack} "
                f"(allowed: {', '.join(sorted(allowed)) or 'none'})"
            )
    if approvers.protected_paths and not principal.groups & approvers.config:
        reasons.append(
            f"{principal.name} is not in a group allowed to approve changes to protected paths "
            f"({', '.join(approvers.protected_paths)}; allowed: {', '.join(sorted(approvers.config)) or 'none'})")
    if seen_sha is not None and seen_sha != proposal.head_sha:
        reasons.append(
            f"the branch moved to {proposal.head_sha[:12]} since you looked at {seen_sha[:12]}; review the new plan"
        )
    if seen_digests is not None and dict(seen_digests) != proposal.current_digests:
        reasons.append("the plan changed since you looked at it (re-planned at the same commit); review the new plan")
    if any(d.principal.id == principal.id for d in proposal.current_approvals):
        reasons.append(f"{principal.name} already approved this commit and plan")
    if decision == Decision.APPROVE:
        reasons += policy_blocks(proposal, now)
    return reasons


def policy_blocks(proposal: Proposal, now: datetime) -> list[str]:
    return [f"policy denies {f.key}: {f.message} (a policy owner may override it)"
            for f in proposal.blocking_findings(now)]


def override_refusals(principal: Principal, proposal: Proposal, settings: RepoSettings, finding_key: str,
                      reason: str, expires_at: datetime, now: datetime) -> list[str]:
    """Why `principal` may not override this finding (empty: they may)."""
    reasons = refusals(principal, Action.OVERRIDE, proposal)
    if principal.is_agent:
        return reasons
    if not principal.groups & settings.policy.owner_groups:
        reasons.append(f"{principal.name} is not a policy owner "
                       f"(groups: {', '.join(sorted(settings.policy.owner_groups)) or 'none configured'})")
    denies = {f.key for f in proposal.findings if f.severity == Severity.DENY}
    if finding_key not in denies:
        known = ", ".join(sorted(denies)) or "none"
        reasons.append(f"no deny finding {finding_key!r} on the current plans (deny findings: {known})")
    if not reason.strip():
        reasons.append("an override needs a reason")
    if expires_at <= now:
        reasons.append("an override's expiry must be in the future")
    return reasons


def apply_refusals(principal: Principal, proposal: Proposal, settings: RepoSettings, now: datetime) -> list[str]:
    """Why the proposal may not be applied now, by this principal (empty: go)."""
    who = refusals(principal, Action.APPLY)
    if principal.is_agent:
        return who
    reasons = []
    if next_status(proposal.status, Transition.START_APPLY) is None:
        reasons.append(f"proposal {proposal.id} is {proposal.status.value}")
    reasons += who
    rejection = proposal.current_rejection
    if rejection is not None:
        reasons.append(f"rejected by {rejection.principal.name}: {rejection.comment}")
    return reasons + approval_blockers(proposal, settings, now)


def approval_blockers(proposal: Proposal, settings: RepoSettings, now: datetime) -> list[str]:
    """What still stands between the proposal and an apply: policy denies, then missing approvals."""
    return policy_blocks(proposal, now) + approval_shortfall(proposal, settings)


def approval_shortfall(proposal: Proposal, settings: RepoSettings) -> list[str]:
    if proposal.kind == ProposalKind.DRIFT_REVERT and not auto_revert_refusals(proposal, settings):
        return []  # main as it is, on stacks that opted in, updated in place only: the switch's commit decided
    needed = required_approvals(proposal, settings)
    approvers = {d.principal.id for d in proposal.current_approvals}
    if len(approvers) >= needed:
        return []
    protected = protected_destroys(proposal, settings)
    why = f" (the plan deletes or replaces protected {', '.join(protected)})" if protected else \
        (f" (risk {proposal.risk.value})" if needed > settings.required_approvals else "")
    stale = len(proposal.stale_decisions)
    note = f"; {stale} earlier decision(s) are stale after a new commit or plan" if stale else ""
    return [f"needs {needed} approval(s) of the current commit and plan from different approvers, "
            f"has {len(approvers)}{why}{note}"]


def auto_revert_refusals(proposal: Proposal, settings: RepoSettings) -> list[str]:
    """Why this revert of drift needs a person's approval (empty: the gateway may apply it alone).

    Only main exactly as the revert was opened on (its branch took no commit), on stacks whose gateway.yaml
    on main sets `drift.auto_revert`, when every change undoes drift found at planning (never a commit on
    main nobody applied), is an in-place update of a resource that is not protected, and no policy denies.
    """
    if proposal.kind != ProposalKind.DRIFT_REVERT:
        return ["only a revert of drift is ever applied without approval"]
    reasons = []
    if proposal.head_sha != proposal.base_sha or proposal.changed_paths:
        reasons.append("the revert's branch took commits: it is a change, not a revert")
    if not proposal.stacks or set(proposal.plans) != set(proposal.stacks):
        reasons.append("the revert has no current plan for each of its stacks")
    for stack, plan in proposal.plans.items():
        stack_settings = settings.stacks.get(stack)
        if stack_settings is None or not stack_settings.auto_revert_drift:
            reasons.append(f"stack {stack} does not set drift.auto_revert")
            continue
        other = sorted(kind for kind, n in plan.counts.items() if n and kind not in ("update", "no-op", "read"))
        if other:
            reasons.append(f"stack {stack}: the revert would {', '.join(other)}, not only update in place")
        beyond = sorted(set(plan.changed) - set(plan.drift))
        if beyond:
            reasons.append(f"stack {stack}: the plan also changes {', '.join(beyond)}, which did not drift "
                           f"(main describes something never applied there)")
        protected = [a for a in plan.changed if a in stack_settings.protected or _base_address(a) in stack_settings.protected]
        if protected:
            reasons.append(f"stack {stack}: the revert changes protected {', '.join(protected)}")
    if any(f.severity == Severity.DENY for f in proposal.findings):
        reasons.append("a policy finding denies it")
    return reasons


def _base_address(address: str) -> str:
    """`aws_instance.web[0]` -> `aws_instance.web`, so protecting a resource covers its instances."""
    return address.split("[", 1)[0]
