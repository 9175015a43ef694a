"""Who may do what: one table, and one function that reads it into sentences a person can act on.

    action                   roles that allow it          agents        the change's own people
    request                  requester, approver, admin   never         -
    propose                  requester, approver, admin   always        -
    plan                     requester, approver, admin   by role       -
    check_drift              requester, approver, admin   never         -
    decide                   approver                     never         refused (requester, proposer)
    override                 any                          never         refused (requester, proposer)
    apply                    requester, approver, admin   never         -
    merge                    approver, admin              never         -
    acknowledge_push         approver, admin              never         -
    abandon                  approver, admin              never         enough (the requester)
    open_break_glass         any                          never         -
    confirm_break_glass      any                          never         -
    acknowledge_break_glass  requester, approver, admin   never         -
    reset_breaker            any                          never         -
    open_breaker             admin                        never         -
    add_users                admin                        never         -
    manage_repositories      admin                        never         -
    change_users             admin                        never         -
    link_accounts            admin                        never         -
    edit_simulator           admin                        never         -
    read_trail               auditor, admin               by role       -
    sign_in                  any                          never         -

A disabled principal may do nothing. What depends on a repository's settings (approver groups of a stack,
policy owners, the break-glass and resetter groups) is checked after this, by the rule that reads them
(`approvals.py`, `break_glass.py`): the table says who may ask at all, whatever the repository. In which
repositories a person may request changes is `request_refusals` (today: every one the gateway still serves); in
which they may follow the changes they requested is `follow_refusals` (those, and the ones removed since).
Each refusal is a sentence, in the wording people and the tests already know (Atlantis' readable
requirement values, not exceptions): `refusals` returns them, empty meaning allowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from gateway.domain.errors import Refused
from gateway.domain.principals import Principal, Role
from gateway.domain.repositories import Repository


class Action(StrEnum):
    REQUEST = "request"  # be the requester of a change: the person it is made for
    PROPOSE = "propose"  # open a proposal (a person for themselves, an agent for its person)
    PLAN = "plan"  # queue a plan of a proposal
    CHECK_DRIFT = "check_drift"  # refresh main against reality, and open a revert of what drifted
    DECIDE = "decide"  # approve or reject a change
    OVERRIDE = "override"  # override a policy finding (policy owners, by group)
    APPLY = "apply"  # queue or run the apply of a change
    MERGE = "merge"  # merge an unmerged change, or acknowledge that main was made right by hand
    ACKNOWLEDGE_PUSH = "acknowledge_push"  # acknowledge a push to main made outside the gateway
    ABANDON = "abandon"  # withdraw a proposal
    OPEN_BREAK_GLASS = "open_break_glass"  # ask for a break-glass window (the break-glass group, by group)
    CONFIRM_BREAK_GLASS = "confirm_break_glass"  # be the second person who opens it
    ACKNOWLEDGE_BREAK_GLASS = "acknowledge_break_glass"  # acknowledge or close a window for the group
    RESET_BREAKER = "reset_breaker"  # close a tripped circuit breaker (resetters, by group)
    OPEN_BREAKER = "open_breaker"  # the kill switch, by hand
    ADD_USERS = "add_users"
    MANAGE_REPOSITORIES = "manage_repositories"  # add or remove a declaration repository of the gateway
    CHANGE_USERS = "change_users"  # disable, enable, rotate or revoke a token, change roles and groups
    LINK_ACCOUNTS = "link_accounts"  # link a person to a GitHub account
    EDIT_SIMULATOR = "edit_simulator"  # change the simulated cloud directly
    READ_TRAIL = "read_trail"  # query, export and verify the audit trail
    SIGN_IN = "sign_in"  # sign in to the review pages


class Agents(StrEnum):
    """What an agent principal may do of an action."""

    NEVER = "never"
    BY_ROLE = "by role"  # as a person would, by its roles
    ALWAYS = "always"  # whatever its roles: it acts for a person, who is checked as the requester


class OwnChange(StrEnum):
    """What being the change's requester (or proposer) does to an action."""

    ANY = "-"  # nothing
    REFUSED = "refused"  # segregation of duties: the requester and the proposer may not
    ENOUGH = "enough"  # the requester may, whatever their roles


@dataclass(frozen=True)
class Rule:
    """One row of the table, with the sentences it refuses with (`{name}` and `{proposal}` filled in)."""

    roles: frozenset[Role]  # holding any one of these allows the action
    agents: Agents
    own_change: OwnChange
    no_role: str
    no_agent: str = ""  # the refusal of an agent, when agents never may
    requester: str = ""  # the refusal of the change's requester, when its own people may not
    proposer: str = ""  # the refusal of its proposer (who is not its requester)


class Change(Protocol):
    """What a rule needs to know of a change: its number and its people (a `Proposal` is one)."""

    @property
    def id(self) -> int: ...

    @property
    def requester(self) -> Principal: ...

    @property
    def proposer(self) -> Principal: ...


CHANGERS = frozenset({Role.REQUESTER, Role.APPROVER, Role.ADMIN})  # whoever may start a change
DECIDERS = frozenset({Role.APPROVER, Role.ADMIN})  # approvers and admins
ANYONE = frozenset(Role)
ADMINS = frozenset({Role.ADMIN})


def _admin_only(what: str) -> Rule:
    sentence = "{name} is not an admin; only admins " + what
    return Rule(ADMINS, Agents.NEVER, OwnChange.ANY, sentence, sentence)


def _decider_only(sentence: str) -> Rule:
    return Rule(DECIDERS, Agents.NEVER, OwnChange.ANY, sentence, sentence)


NO_ROLE = "{name} has no role"  # unreachable through the gateway (a principal needs a role), kept for the type

A = Action
RULES: dict[Action, Rule] = {
    A.REQUEST: Rule(CHANGERS, Agents.NEVER, OwnChange.ANY, "{name} has no role that may request changes",
                    "{name} is an agent; the requester of a change must be a person"),
    A.PROPOSE: Rule(CHANGERS, Agents.ALWAYS, OwnChange.ANY, "{name} has no role that may propose changes"),
    A.PLAN: Rule(CHANGERS, Agents.BY_ROLE, OwnChange.ANY, "{name} has no role that may start a plan"),
    A.CHECK_DRIFT: Rule(CHANGERS, Agents.NEVER, OwnChange.ANY, "{name} may not start a drift check",
                        "{name} may not start a drift check"),
    A.DECIDE: Rule(frozenset({Role.APPROVER}), Agents.NEVER, OwnChange.REFUSED,
                   "{name} does not have the approver role",
                   "{name} is an agent; agents can never approve or reject a change",
                   "{name} requested this change and cannot approve or reject it",
                   "{name} proposed this change and cannot approve or reject it"),
    A.OVERRIDE: Rule(ANYONE, Agents.NEVER, OwnChange.REFUSED, NO_ROLE,
                     "{name} is an agent; agents can never override a policy finding",
                     "{name} requested or proposed this change and cannot override its findings",
                     "{name} requested or proposed this change and cannot override its findings"),
    A.APPLY: Rule(CHANGERS, Agents.NEVER, OwnChange.ANY, "{name} has no role that may start an apply",
                  "{name} is an agent; agents can never apply a change"),
    A.MERGE: Rule(DECIDERS, Agents.NEVER, OwnChange.ANY,
                  "{name} may not merge or acknowledge: only approvers and admins may",
                  "{name} is an agent; agents can never merge or acknowledge a change"),
    A.ACKNOWLEDGE_PUSH: _decider_only("{name} may not acknowledge a push to main: only approvers and admins may"),
    A.ABANDON: Rule(DECIDERS, Agents.NEVER, OwnChange.ENOUGH,
                    "{name} may not abandon proposal {proposal}: only its requester, an approver or an admin may",
                    "{name} may not abandon proposal {proposal}: only its requester, an approver or an admin may"),
    A.OPEN_BREAK_GLASS: Rule(ANYONE, Agents.NEVER, OwnChange.ANY, NO_ROLE,
                             "{name} is an agent; only people may break the glass"),
    A.CONFIRM_BREAK_GLASS: Rule(ANYONE, Agents.NEVER, OwnChange.ANY, NO_ROLE,
                                "{name} is an agent; only people may confirm a break-glass window"),
    A.ACKNOWLEDGE_BREAK_GLASS: Rule(CHANGERS, Agents.NEVER, OwnChange.ANY,
                                    "{name} has no role that may act for the break-glass group",
                                    "{name} is an agent; only people may acknowledge"),
    A.RESET_BREAKER: Rule(ANYONE, Agents.NEVER, OwnChange.ANY, NO_ROLE,
                          "{name} is an agent; agents never reset the breaker"),
    A.OPEN_BREAKER: _admin_only("open the breaker by hand"),
    A.ADD_USERS: _admin_only("add users"),
    A.MANAGE_REPOSITORIES: _admin_only("add or remove repositories"),
    A.CHANGE_USERS: _admin_only("change users"),
    A.LINK_ACCOUNTS: _admin_only("link accounts"),
    A.EDIT_SIMULATOR: _admin_only("act on the simulated cloud directly"),
    A.READ_TRAIL: Rule(frozenset({Role.AUDITOR, Role.ADMIN}), Agents.BY_ROLE, OwnChange.ANY,
                       "{name} is not an auditor; the audit trail is for auditors and admins"),
    A.SIGN_IN: Rule(ANYONE, Agents.NEVER, OwnChange.ANY, NO_ROLE,
                    "{name} is an agent; agents cannot sign in to the review pages"),
}
del A


def refusals(principal: Principal, action: Action, change: Change | None = None) -> list[str]:
    """Why `principal` may not take `action` (on `change`, for the rules that look at its people); empty: they may.

    An agent that never may is told only that: saying more would suggest something else could help.
    """
    rule = RULES[action]
    if rule.own_change is not OwnChange.ANY and change is None:
        raise ValueError(f"the {action.value} rule looks at the change's people; pass the change")

    def say(sentence: str) -> str:
        return sentence.format(name=principal.name, proposal=change.id if change is not None else "")

    if principal.is_agent and rule.agents is Agents.NEVER:
        return [say(rule.no_agent)]
    reasons = [f"{principal.name} is disabled"] if principal.disabled else []
    own = change is not None and principal.id == change.requester.id
    if rule.own_change is OwnChange.REFUSED and change is not None:
        if own:
            reasons.append(say(rule.requester))
        elif principal.id == change.proposer.id:
            reasons.append(say(rule.proposer))
    role_exempt = (principal.is_agent and rule.agents is Agents.ALWAYS) or (own and rule.own_change is OwnChange.ENOUGH)
    if not role_exempt and not principal.roles & rule.roles:
        reasons.append(say(rule.no_role))
    return reasons


def may(principal: Principal, action: Action, change: Change | None = None) -> bool:
    """Whether the table lets `principal` take `action` (for what to show; a write calls `require`)."""
    return not refusals(principal, action, change)


def require(principal: Principal, action: Action, change: Change | None = None) -> None:
    """Refuse (with the table's sentences) unless `principal` may take `action`."""
    reasons = refusals(principal, action, change)
    if reasons:
        raise Refused(reasons)


def request_refusals(person: Principal, repository: Repository) -> list[str]:
    """Why `person` may not request changes in `repository`; empty: they may. People are the gateway's, so whoever
    may request at all may in every repository it still serves; everything that asks "may they request there?"
    (a proposal opened by any way in, an agent's tools) follows it."""
    reasons = follow_refusals(person, repository)
    if not repository.active:
        reasons.append(f"repository {repository.name} was removed from the gateway by {repository.removed_by}")
    return reasons


def follow_refusals(person: Principal, repository: Repository) -> list[str]:
    """Why `person` (or an agent for them) may not read how the changes they requested in `repository` stand; empty:
    they may. Whoever may request there may, and in a repository removed since too: how a change ended is read after
    the repository stopped taking new ones. A repository's own rule on who may request in it joins here."""
    return refusals(person, Action.REQUEST)
