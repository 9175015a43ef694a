"""Import: bring an existing object under management with an `import` block plus its configuration, as a
proposal. It is acceptable only when the plan shows the import and no other change for that address (zero diff);
an import whose plan would change the object is refused, naming the attributes that differ.

The sandbox engine only: Terraform 1.0.3 (the terraform engine's contract version) has no import blocks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from gateway.domain.declaration_edit import import_declaration
from gateway.domain.errors import Conflict, InputError, NotFound, Refused
from gateway.domain.plan import ChangeKind
from gateway.domain.preview import build_preview
from gateway.domain.principals import Principal
from gateway.domain.proposal import Proposal
from gateway.services.change.branches import free_branch_name
from gateway.services.change.planning import ChangeOrigin, plan_stack
from gateway.services.change.proposals import get_proposal, open_proposal
from gateway.services.workspace import Workspace

_ADDRESS = re.compile(r"^[a-z][a-z0-9_]*\.[A-Za-z_][A-Za-z0-9_-]*$")


def import_resource(ws: Workspace, actor: Principal, stack: str, address: str, rid: str,
                    overrides: Mapping[str, Any] | None = None) -> Proposal:
    """Write `import { to = ADDRESS, id = ID }` and ADDRESS's configuration on `import/...`, prove it, propose it.

    `overrides` are attribute values the person wants declared instead of what the object holds.
    """
    settings = ws.repo_settings()
    settings.require_stack(stack)
    if settings.stacks[stack].engine == "terraform":
        raise InputError(f"stack {stack} runs on the terraform engine: Terraform 1.0.3 has no import blocks "
                         "(they came in Terraform 1.5), so the gateway cannot prove an import there; "
                         "gateway import works on the sandbox engine only")
    if not _ADDRESS.match(address):
        raise InputError(f"{address!r} is not a resource address of the form TYPE.NAME")
    rtype, name = address.split(".", 1)
    live = ws.simulator.get_object(rtype, rid)
    if live is None:
        raise NotFound(f"no {rtype} with id {rid!r} exists in the simulated cloud to import")
    manager = _managed_by(ws, rtype, rid)
    if manager is not None:  # its stack's approvers and protections would no longer apply to it
        raise Refused([f"{rtype} {rid} is already managed by stack {manager[0]} as {manager[1]}; an import would "
                       f"take it over from that stack: change it there, or move it with a proposal on "
                       f"{manager[0]}"])
    main_sha = ws.repo.resolve(ws.main_branch())
    path = settings.stacks[stack].path
    declared = ws.repo.read_files(main_sha, path, ".tf")
    if any(re.search(rf'resource\s+"{re.escape(rtype)}"\s+"{re.escape(name)}"', t) for t in declared.values()):
        raise Conflict(f"{address} is already declared in stack {stack}; choose another name")
    attributes = dict(ws.simulator.declarable_attributes(rtype, live))
    attributes.update(overrides or {})
    secret = sorted(k for k, v in attributes.items() if ws.scrubber.scrub(json.dumps(v)) != json.dumps(v))
    if secret:  # a workspace secret is secret by origin: it never goes into git in clear
        raise Refused([f"{address}: {', '.join(secret)} hold(s) a secret of the workspace; the gateway does not "
                       "write secrets into the declaration: import it by hand with a sensitive variable"])
    text, _ = import_declaration(address, rid, attributes)
    branch = free_branch_name(ws, f"import/{stack}-{name}")
    head = ws.repo.commit_to_new_branch(main_sha, branch, {f"{path}/import_{name}.tf": text},
                                        f"Import {address} (id {rid}) into stack {stack}", actor.name)
    try:
        _prove_zero_diff(ws, stack, head, address, actor)
        proposal = open_proposal(ws, actor, branch, f"import {address} (id {rid}) into stack {stack}: brought under "
                                                    "management as it is (the plan shows the import and no change)")
    except BaseException:
        ws.repo.delete_branch(branch)
        raise
    with ws.store.session() as session:
        session.audit.append(actor, "import.proposed", {"address": address, "id": rid, "branch": branch,
                                                        "zero_diff": True}, proposal.id, [stack])
    return get_proposal(ws, proposal.id)


def _managed_by(ws: Workspace, rtype: str, rid: str) -> tuple[str, str] | None:
    """The (stack, address) whose state already holds the object, if any stack's does."""
    sandbox_stacks = [name for name, stack in ws.repo_settings().stacks.items() if stack.engine != "terraform"]
    return ws.simulator.managed_by(rtype, rid, sandbox_stacks)


def _prove_zero_diff(ws: Workspace, stack: str, head: str, address: str, actor: Principal) -> None:
    """Refuse unless the plan imports `address` and changes nothing of it (and nothing else)."""
    result = plan_stack(ws, stack, head, ChangeOrigin(requester=actor.name))
    change = result.plan.find(address)
    if change is None or not change.change.importing:
        raise Refused([f"the plan does not import {address}"])
    if change.kind != ChangeKind.NO_OP:
        entry = next(e for e in build_preview(result.plan).changes if e.address == address)
        differing = ", ".join(f"{a.path} ({a.before} -> {a.after})" for a in entry.attributes)
        with ws.store.session() as session:
            session.audit.append(actor, "import.refused", {"address": address, "differs": [
                a.path for a in entry.attributes]}, None, [stack])
        raise Refused([f"the import of {address} is not zero-diff: the plan would also {change.kind.value} it, "
                       f"changing {differing}; the declaration must match the object as it is"])
    others = [rc.address for rc in result.plan.changes if rc.address != address and rc.kind != ChangeKind.NO_OP]
    if others:
        raise Refused([f"the import's plan also changes {', '.join(others)} (main holds what was never applied); "
                       "apply or settle that first"])


def parse_overrides(items: tuple[str, ...]) -> dict[str, Any]:
    """`ATTR=JSON_OR_TEXT` pairs from a command line."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise InputError(f"expected ATTR=VALUE, got {item!r}")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out
