"""The order an apply takes a proposal's stacks: main's `after:`, and the stacks whose state another reads.

The reads are those of what will be applied (main with the proposal merged; the runner reads that merge), not
main's alone: a change that makes an app read an output its network stack gains in the same change must apply the
network first, and only the branch says so. A view, which writes no merge, reads the branch's head: the same files
unless main changed the stack since. A branch can add an order this way, never lift one main declares (`after:` is
main's gateway.yaml); where the stacks' state lives is main's too, since planning refuses a branch that moves a
backend. The reads in the local modules a stack calls are the stack's own: Terraform runs them in its directory.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from dataclasses import replace

from gateway.domain.errors import ConfigError, NotFound
from gateway.domain.proposal import Proposal
from gateway.domain.repo_settings import RepoSettings
from gateway.domain.stack_order import RemoteStateRead, StackDeclarations, state_reads
from gateway.services.workspace import Workspace


def apply_order(ws: Workspace, stacks: Iterable[str], sha: str) -> list[str]:
    """`stacks` in the order an apply of commit `sha` takes them; a circle of orders is a ConfigError naming it."""
    settings = ws.repo_settings()
    return settings.apply_order(stacks, state_reads_at(ws, settings, stacks, sha))


def state_reads_at(ws: Workspace, settings: RepoSettings, stacks: Iterable[str], sha: str) -> dict[str, dict[str, str]]:
    """Each of `stacks` -> those of `stacks` whose state it reads at commit `sha`, each with why (`settings`: main's,
    which say where each stack is)."""
    names = sorted(set(stacks))
    if len(names) < 2:  # no other stack to read among them: nothing is parsed (a one-stack view stays light)
        return {}
    declared = {}
    for name in names:
        if name in settings.stacks:
            path = settings.stacks[name].path
            files = ws.repo.read_files(sha, path, ".tf")
            declared[name] = StackDeclarations(path, ws.declarations.backend(files),
                                               ws.declarations.remote_state_reads(files) + _module_reads(ws, sha, path))
    return state_reads(declared)


def _module_reads(ws: Workspace, sha: str, stack_path: str) -> tuple[RemoteStateRead, ...]:
    """The remote-state reads of the local modules the stack calls: Terraform runs them in the stack's directory."""
    found: list[RemoteStateRead] = []
    for module in ws.repo.module_directories(sha, stack_path):
        files = ws.repo.read_files(sha, module, ".tf")
        found += [replace(read, address=f"{read.address} in {module}") for read in
                  ws.declarations.remote_state_reads(files, posixpath.relpath(module, stack_path))]
    return tuple(found)


def proposal_state_reads(ws: Workspace, settings: RepoSettings, proposal: Proposal) -> dict[str, dict[str, str]] | None:
    """The reads between the proposal's stacks on its branch's head, for the views (None: its files cannot be read;
    the plans say why, and the runner reads them again before it applies)."""
    try:
        return state_reads_at(ws, settings, proposal.stacks, proposal.head_sha)
    except (ConfigError, NotFound):
        return None
