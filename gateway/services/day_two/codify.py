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
from gateway.domain.plan import ChangeKind, Plan
from gateway.domain.preview import SENSITIVE, DriftEntry
from gateway.domain.principals import Principal
from gateway.domain.proposal import Proposal
from gateway.domain.scrubbing import Scrubber
from gateway.domain.template_edit import TEMPLATE_NAMES, set_template_property
from gateway.services.change.branches import free_branch_name
from gateway.services.change.planning import ChangeOrigin, plan_stack
from gateway.services.change.proposals import open_proposal
from gateway.services.workspace import MainRules, Workspace

_ADDRESS = re.compile(r"^([A-Za-z0-9_-]+)\.([A-Za-z0-9_-]+)(\[[^\]]+\])?$")


def codify_drift(ws: Workspace, actor: Principal, stack: str) -> Proposal:
    """Open a proposal whose branch makes main's declaration of `stack` match reality (its open drift record)."""
    settings = ws.repo_settings()
    settings.require_stack(stack)
    with ws.store.session(readonly=True) as session:
        record = session.day_two.open_drift_record(stack)
    if record is None:
        raise InputError(f"stack {stack} has no open drift record (`gateway drift check --stack {stack}` looks)")
    main_sha = ws.repo.resolve(ws.main_branch())
    template = settings.stacks[stack].engine == "cloudformation"
    files = (_template_files(ws, main_sha, settings.stacks[stack].path) if template
             else ws.repo.read_files(main_sha, settings.stacks[stack].path, ".tf"))
    changed: dict[str, str] = {}
    problems: list[str] = []
    for entry in record.resources:
        try:
            if template:
                _codify_template_entry(entry, {**files, **changed}, changed, ws.scrubber)
            else:
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
        differing = (_template_differences(proof.plan, record.resources) if template
                     else [rc.address for rc in proof.plan.changes])
        if differing:
            raise Refused([f"the codified declaration still differs from reality: the plan would change "
                           f"{', '.join(differing)}; codify it by hand"])
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


# --- CloudFormation: the drifted properties written into the template -------------------------------------------


def _template_files(ws: MainRules, sha: str, path: str) -> dict[str, str]:
    files = {**ws.repo.read_files(sha, path, ".yaml"), **ws.repo.read_files(sha, path, ".yml"),
             **ws.repo.read_files(sha, path, ".json")}
    return {name: text for name, text in files.items() if name.rsplit("/", 1)[-1] in TEMPLATE_NAMES}


def _codify_template_entry(entry: DriftEntry, files: dict[str, str], changed: dict[str, str],
                           scrubber: Scrubber) -> None:
    logical = entry.address.rsplit(".", 1)[-1]
    if not entry.attributes:
        raise NotCodifiable(f"{entry.address}: {entry.summary}; a deleted resource is removed from the template by hand")
    if len(files) != 1:
        raise NotCodifiable(f"{entry.address}: the stack has {len(files)} templates; codify it by hand")
    [where] = files
    for attribute in entry.attributes:
        if "." in attribute.path or "[" in attribute.path:
            raise NotCodifiable(f"{entry.address}.{attribute.path}: not a top-level property of a simple type")
        if attribute.after is None or attribute.after == SENSITIVE:
            raise NotCodifiable(f"{entry.address}.{attribute.path}: its value is sensitive or was removed")
        if scrubber.scrub(attribute.after) != attribute.after:
            raise NotCodifiable(f"{entry.address}.{attribute.path}: its value holds a secret; codify it by hand "
                                "with a NoEcho parameter")
        changed[where] = set_template_property(changed.get(where, files[where]), where, logical, attribute.path,
                                               json.loads(attribute.after))


def _template_differences(plan: Plan, drifted: tuple[DriftEntry, ...]) -> list[str]:
    """A codified template is proven when its change set only updates the drifted resources, to what they are.

    CloudFormation compares templates, not reality: the codified template is a Modify of each drifted resource,
    whose execution leaves the resources as they are."""
    wanted = {e.address: {a.path: a.after for a in e.attributes} for e in drifted}
    out = []
    for rc in plan.changes:
        after = rc.change.after if isinstance(rc.change.after, dict) else {}
        if rc.kind != ChangeKind.UPDATE or rc.address not in wanted or any(
                json.dumps(after.get(path)) != value for path, value in wanted[rc.address].items()):
            out.append(rc.address)
    return out
