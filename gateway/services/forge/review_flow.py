"""What happens on a pull (merge) request, once for every forge: opened, pushed to, closed or merged, decided on,
commanded with `/gateway`, and main pushed to outside the gateway.

The forge modules (`github_webhooks`, `gitlab_webhooks`) verify a delivery, parse it and say which of these it is, as
a forge-neutral record; they keep what only their forge knows (who an account is, whether the forge still shows a
review or an approval as delivered). Everything here runs against the `Forge` port, worded by `ForgeTerms`, so what a
person reads and what the trail records is the same sentence on either forge but for the forge's own words.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, NoReturn

from gateway.domain.errors import GatewayError, Refused
from gateway.domain.github import MIN_FINGERPRINT, Command, CommandKind, plan_fingerprint
from gateway.domain.github_rules import ForgeAccount, Push, bot_refusals, pusher_refusals
from gateway.domain.jobs import JobKind
from gateway.domain.lifecycle import ACTIVE, DECIDABLE
from gateway.domain.principals import Principal, SystemActor, not_linked
from gateway.domain.proposal import Decision, Proposal, ProposalKind, ProposalStatus, Transition
from gateway.domain.repo_settings import ForgeSettings, RepoSettings
from gateway.logs import get_logger
from gateway.ports import Forge, UnitOfWork
from gateway.services.change.code_host import verified_groups
from gateway.services.change.jobs import enqueue_job
from gateway.services.change.proposals import decide, get_proposal, open_proposal, sync_proposal, withdraw_decisions
from gateway.services.workspace import MainRules, Records, Workspace

log = get_logger(__name__)

Result = dict[str, Any]


@dataclass(frozen=True)
class ForgeTerms:
    """A forge's settings, own words and the few rules only it has, for the one flow."""

    name: str  # GitHub
    settings: Callable[[RepoSettings], ForgeSettings | None]  # its settings, when main's gateway.yaml names it
    home: str  # what the forge calls what a proposal's branch lives in: repository
    prefix: str  # github: of the trail's event kinds and of the actor a forge account acts as
    request: str  # pull request
    sign: str  # what stands before a request's number: #
    note: str  # what a `/gateway` command is written in: comment
    membership_check: str  # the trail's record of a person's team (group) membership: github.team_check
    members_by_id: bool  # membership is asked (and recorded) by the account's numeric id, not only its login
    names_branch_pushers: bool  # a push hook to a proposal's branch names its pusher (GitLab); else only `synchronize`
    person: Callable[[UnitOfWork, int], Principal | None]  # the gateway person linked to a forge account id
    commit_refusals: Callable[[str | None, str], list[str]]  # why a decision not of the planned commit is none
    note_replay_refusals: Callable[[int, tuple[str, int], tuple[str, int]], list[str]]  # an edited command is none

    @property
    def account_key(self) -> str:
        return f"{self.prefix}_id"

    def ref(self, number: int) -> str:
        """`pull request #7`, `merge request !7`."""
        return f"{self.request} {self.sign}{number}"

    def actor(self, login: str) -> SystemActor:
        return SystemActor(f"{self.prefix}:{login}")


@dataclass(frozen=True)
class Opened:
    """A pull (merge) request opened or reopened."""

    number: int
    branch: str
    target: str
    fork: str | None  # where the branch comes from when not from this repository: "the fork o/r"; None: from it
    author_id: int
    unlinked_author: str  # why the author counts for nothing while nobody linked their account
    title: str
    body: str
    head_sha: str | None
    by: str  # who opened it


@dataclass(frozen=True)
class BranchPushed:
    """Commits pushed to a proposal's branch: whoever pushed them shares in proposing it."""

    number: int | None  # None: a push the forge told of without its request (GitLab's push hook)
    branch: str
    pusher_id: int
    pusher: str
    before: str | None
    head_sha: str | None


@dataclass(frozen=True)
class Closed:
    """A pull (merge) request closed, merged or not."""

    number: int
    merged: bool
    head_sha: str | None
    merge_commit_sha: str | None
    by: str


@dataclass(frozen=True)
class Pushed:
    """A push to any branch of the repository, as the forge's push event tells it."""

    ref: str
    before: str
    after: str
    pusher_id: int
    pusher: str


@dataclass(frozen=True)
class Decided:
    """An approval or a rejection made on the forge: a GitHub review, a GitLab approval."""

    number: int
    decision: Decision
    commit: str | None  # the commit it is of (None: the forge no longer says)
    head: str | None  # the request's head when the forge sent the delivery
    comment: str
    made_by: str  # how it was authenticated, as the trail names it


@dataclass(frozen=True)
class Withdrawn:
    """A decision taken back on the forge: a dismissed review, a withdrawn approval."""

    account_id: int  # whose decision
    login: str
    by: str  # who took it back
    reason: str
    made_by: Callable[[Proposal], str]  # the decision taken back, as the trail names it


@dataclass(frozen=True)
class Commented:
    """A `/gateway` command in a new comment (note) on a pull (merge) request."""

    number: int
    command: Command
    comment_id: int
    body: str
    made_by: str


@dataclass(frozen=True)
class _Asked:
    """A person who made a decision or a command on the forge, and the proposal it is about."""

    ws: Workspace
    forge: Forge
    terms: ForgeTerms
    person: Principal
    account: ForgeAccount
    proposal: Proposal
    made_by: str


def proposal_of(ws: Records, forge: Forge, number: int) -> int | None:
    """The proposal of the forge's pull (merge) request `number`, if it has one."""
    with ws.store.session(readonly=True) as session:
        return session.github.proposal_for_pull_request(forge.settings.repository, number)


# --- opened and closed ------------------------------------------------------------------------------------


def on_opened(ws: Workspace, forge: Forge, terms: ForgeTerms, proposal_id: int | None, opened: Opened) -> Result:
    """A request opened: link the proposal the gateway opened it for, or open one for its author, or say why not."""
    number, branch = opened.number, opened.branch
    if proposal_id is not None and get_proposal(ws, proposal_id).status in ACTIVE:
        return {"ignored": f"{terms.ref(number)} is proposal {proposal_id} already"}
    reasons = []
    if opened.fork is not None:  # checked first: a fork's branch may share a proposal's name
        reasons.append(f"{terms.ref(number)} comes from {opened.fork}: the gateway plans only branches of "
                       f"{forge.settings.repository}, whose code it may run")
    if opened.target != ws.main_branch():
        reasons.append(f"{terms.ref(number)} targets {opened.target}; the gateway plans changes to "
                       f"{ws.main_branch()} only")
    with ws.store.session() as session:
        ours = session.proposals.open_for_branch(branch) if not reasons else None
        if ours is not None and session.proposals.get(ours).kind == ProposalKind.DRIFT_REVERT:
            ours = None  # a revert of drift is never a pull request's proposal
        if ours is not None and session.github.pull_request_of(ours) is None:  # the gateway opened it a moment ago
            session.github.link_pull_request(ours, forge.settings.repository, number)
        author = terms.person(session, opened.author_id)
    if ours is not None:
        return {"linked": ours}
    if author is None and not reasons:
        reasons.append(opened.unlinked_author)
    if not reasons:
        assert author is not None
        forge.fetch_main(ws.main_branch())
        forge.sync_branch(branch)
        reason = "\n\n".join(p for p in (opened.title, opened.body) if p.strip())[:4000]
        try:
            proposal = open_proposal(ws, author, branch, reason or terms.ref(number))
        except GatewayError as exc:
            reasons = exc.reasons if isinstance(exc, Refused) else [str(exc)]
        else:
            with ws.store.session() as session:
                session.github.link_pull_request(proposal.id, forge.settings.repository, number)
            return {"opened": proposal.id}
    with ws.store.session() as session:
        session.audit.append(terms.actor(opened.by), f"{terms.prefix}.{terms.request.replace(' ', '_')}.refused", {
            "number": number, "reasons": reasons, "head_sha": opened.head_sha})
    forge.reply(number, f"The change gateway does not plan this {terms.request}:\n\n"
                + "\n".join(f"- {r}" for r in reasons))
    return {"refused": reasons}


def on_closed(ws: Records, terms: ForgeTerms, proposal_id: int, closed: Closed) -> Result:
    """A request closed: its proposal is abandoned; merged without the gateway's apply, that is said loudly."""
    number, who = closed.number, closed.by
    actor = terms.actor(who)
    with ws.store.session() as session:
        proposal = session.proposals.get(proposal_id, lock=True)
        if closed.merged:
            if proposal.status == ProposalStatus.APPLIED:
                return {"merged": closed.merge_commit_sha}
            if proposal.status == ProposalStatus.UNMERGED and closed.head_sha == proposal.head_sha:
                session.audit.append(actor, f"{terms.prefix}.merged_unmerged", {
                    "number": number, "merge_commit_sha": closed.merge_commit_sha,
                    "next": f"{terms.name} merged the applied head; `gateway merge {proposal_id}` records it"},
                    proposal_id, proposal.stacks)
                return {"merged_after_apply": closed.merge_commit_sha}
            # merged on the forge, never applied by the gateway: main now describes what does not run
            warning = (f"{terms.ref(number)} was merged on {terms.name} by {who} while proposal {proposal_id} is "
                       f"{proposal.status.value}: main now describes changes that were never applied")
            session.audit.append(actor, f"{terms.prefix}.merged_without_apply", {
                "number": number, "merge_commit_sha": closed.merge_commit_sha, "warning": warning},
                proposal_id, proposal.stacks)
            log.error(f"{terms.prefix}.merged_without_apply", proposal=proposal_id, number=number)
            if proposal.status in DECIDABLE:
                proposal.move(Transition.ABANDON, actor, {"reason": warning})
                session.proposals.save(proposal)
            return {"merged_without_apply": warning}
        if proposal.status in DECIDABLE:
            proposal.move(Transition.ABANDON, actor, {
                "reason": f"{terms.ref(number)} closed on {terms.name} by {who} without merging"})
            session.proposals.save(proposal)
            return {"abandoned": proposal_id}
    return {"ignored": f"proposal {proposal_id} is {proposal.status.value}"}


# --- pushes -------------------------------------------------------------------------------------------------


def on_branch_pushed(ws: Workspace, forge: Forge, terms: ForgeTerms, proposal_id: int, pushed: BranchPushed) -> Result:
    """Commits pushed to the request's branch: name the pusher, bring the branch in, re-plan."""
    _record_pusher(ws, terms, proposal_id, pushed)
    forge.fetch_main(ws.main_branch())
    forge.sync_branch(pushed.branch)
    _, changes = sync_proposal(ws, proposal_id)
    return {"changes": changes}


def on_push(ws: MainRules, forge: Forge, terms: ForgeTerms, pushed: Pushed) -> Result:
    """Main moved on the forge: fetch it, and say so loudly when the gateway did not merge it; the housekeeping loop
    re-plans the proposals whose plans it touched."""
    main = ws.main_branch()
    if pushed.ref != f"refs/heads/{main}" and terms.names_branch_pushers:
        return _on_branch_push(ws, terms, pushed)
    if pushed.ref != f"refs/heads/{main}":
        return {"ignored": f"push to {pushed.ref}"}
    forge.fetch_main(main)
    before, after = pushed.before, pushed.after
    with ws.store.session() as session:
        if not session.proposals.merged_as(after):  # not the gateway's merge: main moved outside the gateway
            settings = ws.repo_settings()
            paths = ws.repo.changed_paths(before, after) if before.strip("0") else []
            stacks = settings.stacks_touched(paths, lambda path: ws.repo.module_directories(after, path)) \
                if paths else []
            session.audit.append(terms.actor(pushed.pusher), f"{terms.prefix}.main_pushed", {
                "before": before, "after": after, "stacks": stacks, "changed_paths": paths[:200],
                "warning": f"{pushed.pusher} pushed to {main} outside the gateway"
                           + (f": stacks {', '.join(stacks)} now describe what was never applied" if stacks else "")},
                None, stacks)
    return {"fetched": main}


def _on_branch_push(ws: Records, terms: ForgeTerms, pushed: Pushed) -> Result:
    """A push to a proposal's branch names its pusher, who then shares in proposing it (the request's own event
    re-plans)."""
    branch = pushed.ref.removeprefix("refs/heads/")
    with ws.store.session(readonly=True) as session:
        proposal_id = session.proposals.open_for_branch(branch) if pushed.ref.startswith("refs/heads/") else None
    if proposal_id is not None and pushed.after.strip("0"):
        _record_pusher(ws, terms, proposal_id, BranchPushed(None, branch, pushed.pusher_id, pushed.pusher,
                                                            pushed.before, pushed.after))
    return {"recorded_pusher": proposal_id} if proposal_id else {"ignored": f"push to {pushed.ref}"}


def _record_pusher(ws: Records, terms: ForgeTerms, proposal_id: int, pushed: BranchPushed) -> None:
    number = {} if pushed.number is None else {"number": pushed.number}
    with ws.store.session() as session:
        session.audit.append(terms.actor(pushed.pusher), f"{terms.prefix}.pushed", {
            **number, terms.account_key: pushed.pusher_id, "login": pushed.pusher, "before": pushed.before,
            "head_sha": pushed.head_sha}, proposal_id)


def _pushes(ws: Records, terms: ForgeTerms, proposal_id: int) -> list[Push]:
    """Every push to the request's branch the forge told of, from the trail, oldest first."""
    with ws.store.session(readonly=True) as session:
        events = session.audit.events(proposal_id=proposal_id, kind=f"{terms.prefix}.pushed")
    key = terms.account_key
    return [Push(int(e.payload[key]), str(e.payload.get("login")), e.payload.get("head_sha"))
            for e in events if isinstance(e.payload.get(key), int)]


# --- decisions: reviews, approvals ------------------------------------------------------------------------


def on_decided(ws: Workspace, forge: Forge, terms: ForgeTerms, proposal_id: int, decided: Decided,
               account_of: Callable[[], ForgeAccount],
               replay_refusals: Callable[[ForgeAccount], list[str]]) -> Result:
    """A decision made on the forge counts as the person's, if it still stands as delivered and is of the commit the
    current plans were made from (`account_of` says who made it; `replay_refusals`, asked only of a linked person who
    is no bot, whether the forge still shows it so)."""
    seen = get_proposal(ws, proposal_id)  # the plans shown while the person looked
    # A decision of the commit the gateway planned, which the forge said was the head when it sent the delivery, binds
    # to those plans without fetching: a later push reaches the gateway as a delivery of its own, which runs before
    # this one or makes this decision stale, and main moving re-plans (new digests, stale approvals); the apply
    # fetches both again. Any other decision fetches main and the branch first, and is judged against what they are.
    current = seen.status in DECIDABLE and seen.head_sha == decided.commit == decided.head
    proposal = seen if current else catch_up(ws, forge, proposal_id)
    account = account_of()
    with ws.store.session(readonly=True) as session:
        person = terms.person(session, account.id)
    reasons = _identity_refusals(terms, account, person)
    if not reasons:
        reasons = replay_refusals(account)
    if not reasons:
        reasons = terms.commit_refusals(decided.commit, proposal.head_sha)
    if reasons:
        _refuse(ws, terms, account, proposal, decided.decision, reasons, decided.made_by)
    assert person is not None
    _decide_on_forge(_Asked(ws, forge, terms, person, account, proposal, decided.made_by), decided.decision,
                     decided.comment, seen_sha=decided.commit,
                     seen_digests=seen.current_digests if seen.head_sha == decided.commit else None)
    return {decided.decision.value: person.name}


def on_withdrawn(ws: Records, terms: ForgeTerms, proposal_id: int, withdrawn: Withdrawn) -> Result:
    """A decision taken back on the forge no longer counts."""
    with ws.store.session(readonly=True) as session:
        person = terms.person(session, withdrawn.account_id)
    if person is None:
        return {"ignored": f"{withdrawn.login} is not linked"}
    withdraw_decisions(ws, terms.actor(withdrawn.by), person, proposal_id, withdrawn.reason,
                       made_by=withdrawn.made_by(get_proposal(ws, proposal_id)))
    return {"withdrawn": person.name}


def catch_up(ws: Workspace, forge: Forge, proposal_id: int) -> Proposal:
    """Fetch main and the branch from the forge and re-plan if either moved, so decisions bind to what it shows."""
    proposal = get_proposal(ws, proposal_id)
    if proposal.status in DECIDABLE:
        forge.fetch_main(ws.main_branch())
        forge.sync_branch(proposal.branch)
        proposal, _ = sync_proposal(ws, proposal_id)
    return proposal


def _decide_on_forge(asked: _Asked, decision: Decision, comment: str, seen_sha: str | None,
                     seen_digests: Mapping[str, str] | None = None) -> None:
    """Decide as the person, counting only the groups whose team (GitLab group) they are an active member of now."""
    ws, forge, terms, person, account, proposal = (asked.ws, asked.forge, asked.terms, asked.person, asked.account,
                                                   asked.proposal)
    reasons = pusher_refusals(account, _pushes(ws, terms, proposal.id), on=terms.request)
    if reasons:
        _refuse(ws, terms, account, proposal, decision, reasons, asked.made_by)
    account_id = account.id if terms.members_by_id else None
    groups, checked = verified_groups(forge, person, account.login, account_id)
    with ws.store.session() as session:
        session.audit.append(person, terms.membership_check, {
            "login": account.login, **({terms.account_key: account.id} if terms.members_by_id else {}),
            "teams": {g: forge.settings.teams[g] for g in checked}, "active": sorted(groups),
            "not_member": sorted(g for g, ok in checked.items() if not ok), "head_sha": proposal.head_sha},
            proposal.id, proposal.stacks)
    decide(ws, replace(person, groups=groups), proposal.id, decision, comment, seen_sha, asked.made_by, seen_digests)


def _identity_refusals(terms: ForgeTerms, account: ForgeAccount, person: Principal | None) -> list[str]:
    reasons = bot_refusals(account)
    if not reasons and person is None:
        reasons.append(not_linked(terms.name, account.login))
    return reasons


def _refuse(ws: Records, terms: ForgeTerms, account: ForgeAccount, proposal: Proposal,
            what: Decision | CommandKind, reasons: list[str], made_by: str) -> NoReturn:
    with ws.store.session() as session:
        session.audit.append(terms.actor(account.login), f"{what.value}.refused", {
            "reasons": reasons, "head_sha": proposal.head_sha, "authenticated_by": made_by}, proposal.id,
            proposal.stacks)
    raise Refused(reasons)


# --- /gateway commands ----------------------------------------------------------------------------------


def on_commented(ws: Workspace, forge: Forge, terms: ForgeTerms, commented: Commented,
                 account_of: Callable[[], ForgeAccount]) -> Result:
    """A `/gateway` command runs as the person who wrote it, if they are linked and it reads as written."""
    number = commented.number
    proposal_id = proposal_of(ws, forge, number)
    if proposal_id is None:
        forge.reply(number, f"This {terms.request} has no proposal in the change gateway.")
        return {"ignored": "no proposal"}
    account = account_of()
    with ws.store.session(readonly=True) as session:
        person = terms.person(session, account.id)
    proposal = get_proposal(ws, proposal_id)
    command = commented.command
    reasons = _identity_refusals(terms, account, person)
    if not reasons:
        reasons = terms.note_replay_refusals(commented.comment_id, (commented.body, account.id),
                                             forge.comment(number, commented.comment_id))
    if reasons:
        _refuse(ws, terms, account, proposal, command.kind, reasons, commented.made_by)
    assert person is not None
    return COMMANDS[command.kind](_Asked(ws, forge, terms, person, account, proposal, commented.made_by), command)


def _command_plan(asked: _Asked, command: Command) -> Result:
    return {"job": enqueue_job(asked.ws, asked.person, JobKind.PLAN, asked.proposal.id).id}


def _command_apply(asked: _Asked, command: Command) -> Result:
    return {"job": enqueue_job(asked.ws, asked.person, JobKind.APPLY, asked.proposal.id).id}


def _command_decide(asked: _Asked, command: Command) -> Result:
    proposal = asked.proposal
    decision = Decision.APPROVE if command.kind == CommandKind.APPROVE else Decision.REJECT
    seen = None
    if decision == Decision.APPROVE:
        current = plan_fingerprint(proposal.current_digests)
        prefix = command.argument.strip().lower()
        if len(prefix) < MIN_FINGERPRINT or not current.startswith(prefix):
            _refuse(asked.ws, asked.terms, asked.account, proposal, decision, [
                f"`/gateway approve {prefix or '…'}` does not name the current plan {current[:12]} (give at least "
                f"{MIN_FINGERPRINT} characters of the plan id the {asked.terms.note} shows)"], asked.made_by)
        seen = proposal.current_digests
    _decide_on_forge(replace(asked, proposal=catch_up(asked.ws, asked.forge, proposal.id)), decision,
                     command.argument if decision == Decision.REJECT else "approved with /gateway approve",
                     seen_sha=proposal.head_sha, seen_digests=seen)
    return {decision.value: asked.person.name}


def _command_ask(asked: _Asked, command: Command) -> Result:
    from gateway.services.agents.agent_requests import submit_request  # the agent (and its model client) when asked

    ws, person, proposal = asked.ws, asked.person, asked.proposal
    with ws.store.session(readonly=True) as session:
        conversation = session.conversations.of_proposal(proposal.id)
        link = session.github.pull_request_of(proposal.id)
    if conversation is None or conversation.requester_id != person.id:
        _refuse(ws, asked.terms, asked.account, proposal, command.kind, [
            "only the person who asked the agent for this change can ask it to revise the branch"], asked.made_by)
    assert conversation is not None
    outcome = submit_request(ws, person, command.argument, conversation.id)
    if outcome.question:  # the agent waits for an answer: ask it where the person is
        assert link is not None  # the command came from this proposal's pull (merge) request
        asked.forge.reply(link.number, f"The agent asks @{asked.account.login}: {outcome.question}\n\n"
                          "Answer with `/gateway ask <your answer>`.")
    return {"asked": conversation.id, "stopped": outcome.stopped, "changed_files": outcome.changed_files,
            "question": outcome.question}


COMMANDS: dict[CommandKind, Callable[[_Asked, Command], Result]] = {
    CommandKind.PLAN: _command_plan, CommandKind.APPLY: _command_apply, CommandKind.APPROVE: _command_decide,
    CommandKind.REJECT: _command_decide, CommandKind.ASK: _command_ask,
}
