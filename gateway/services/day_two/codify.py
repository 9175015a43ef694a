"""Codify drift: change the declaration to match reality, proven by a plan with no changes, as a proposal.

`gateway drift codify --stack S` writes the change for drifted top-level attributes of simple types (string,
number, bool) on a new branch `codify/S-N`; anything else is refused with the file, line and attribute, and a
person pushes a branch and proposes it (that proposal closes the record too, once applied).
"""

from __future__ import annotations

import json
import re

from gateway.domain.declaration_edit import NotCodifiable, set_attribute
from gateway.domain.errors import InputError, Refused
from gateway.domain.preview import SENSITIVE, DriftEntry
from gateway.domain.principals import Principal
from gateway.domain.proposal import Proposal
from gateway.domain.scrubbing import Scrubber
from gateway.services.change.branches import free_branch_name
from gateway.services.change.planning import ChangeOrigin, plan_stack
from gateway.services.change.proposals import open_proposal
from gateway.services.workspace import Workspace

_ADDRESS = re.compile(r"^([A-Za-z0-9_-]+)\.([A-Za-z0-9_-]+)(\[[^\]]+\])?$")


def codify_drift(ws: Workspace, actor: Principal, stack: str) -> Proposal:
    """Open a proposal whose branch makes main's declaration of `stack` match reality (its open drift record)."""
    settings = ws.repo_settings()
    settings.require_stack(stack)
    if settings.stacks[stack].engine == "cloudformation":
        raise Refused([f"stack {stack} runs on CloudFormation: the gateway does not codify its templates yet; "
                       "change the template to the actual properties its drift record lists and propose it"])
    with ws.store.session(readonly=True) as session:
        record = session.day_two.open_drift_record(stack)
    if record is None:
        raise InputError(f"stack {stack} has no open drift record (`gateway drift check --stack {stack}` looks)")
    main_sha = ws.repo.resolve(ws.main_branch())
    files = ws.repo.read_files(main_sha, settings.stacks[stack].path, ".tf")
    changed: dict[str, str] = {}
    problems: list[str] = []
    for entry in record.resources:
        try:
            _codify_entry(entry, {**files, **changed}, changed, ws.scrubber)
        except NotCodifiable as exc:
            problems.append(str(exc))
    if problems:
        raise Refused([f"drift record {record.id} cannot be codified by the gateway: {p}" for p in problems]
                      + ["push a branch that makes the declaration match and `gateway propose` it; applied, it "
                         "closes the record too"])
    branch = free_branch_name(ws, f"codify/{stack}-{record.id}")
    what = record.describe()
    head = ws.repo.commit_to_new_branch(main_sha, branch, changed,
                                        f"Codify drift record {record.id} on stack {stack}\n\n{what}", actor.name)
    try:  # a refused attempt (no role, still a diff) leaves no branch behind
        proof = plan_stack(ws, stack, head, ChangeOrigin(requester=actor.name))
        if proof.plan.changes:
            raise Refused([f"the codified declaration still differs from reality: the plan would change "
                           f"{', '.join(rc.address for rc in proof.plan.changes)}; codify it by hand"])
        return open_proposal(ws, actor, branch, f"codify drift record {record.id} on stack {stack}: the declaration "
                                                f"takes what changed outside the gateway ({what[:300]}); "
                                                f"a plan with no changes proves it")
    except BaseException:
        ws.repo.delete_branch(branch)
        raise


def _codify_entry(entry: DriftEntry, files: dict[str, str], changed: dict[str, str], scrubber: Scrubber) -> None:
    match = _ADDRESS.match(entry.address)
    if match is None:
        raise NotCodifiable(f"{entry.address}: only resources at the top of a stack are codified (not modules)")
    rtype, name = match.group(1), match.group(2)
    if not entry.attributes:
        raise NotCodifiable(f"{entry.address}: {entry.summary}; a deleted resource is removed from the declaration "
                            "by hand")
    where = next((path for path, text in files.items()
                  if re.search(rf'resource\s+"{re.escape(rtype)}"\s+"{re.escape(name)}"', text)), None)
    if where is None:
        raise NotCodifiable(f"{entry.address}: no resource block for it in the stack's files")
    for attribute in entry.attributes:
        if "." in attribute.path or "[" in attribute.path:
            raise NotCodifiable(f"{entry.address}.{attribute.path}: not a top-level attribute of a simple type")
        if attribute.after is None or attribute.after == SENSITIVE:
            raise NotCodifiable(f"{entry.address}.{attribute.path}: its value is sensitive or was removed")
        if scrubber.scrub(attribute.after) != attribute.after:  # never write a workspace secret into git
            raise NotCodifiable(f"{entry.address}.{attribute.path}: its value holds a secret; codify it by hand "
                                "with a sensitive variable")
        text = changed.get(where, files[where])
        changed[where] = set_attribute(text, where, rtype, name, attribute.path, json.loads(attribute.after))
