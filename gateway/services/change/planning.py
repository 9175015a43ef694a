"""Planning stacks at exact commits: the engine's truth, saved with its digest."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from gateway.domain.declarations import Unmasking
from gateway.domain.errors import ConfigError
from gateway.domain.plan import Plan, canonical_json, canonical_plan_digest, load_plan
from gateway.domain.policy import Finding, PolicyContext, Severity, evaluate_plan
from gateway.domain.preview import Preview, build_preview
from gateway.domain.proposal import PlanSummary
from gateway.domain.repo_settings import RepoSettings
from gateway.domain.risk import Risk, RiskLevel, assess_risk
from gateway.ports import DeclarationReader, EnginePlan, StackInputs
from gateway.services.change.policies import rego_findings
from gateway.services.workspace import Workspace


@dataclass(frozen=True)
class StackPlanResult:
    stack: str
    sha: str
    engine_plan: EnginePlan
    plan: Plan
    digest: str
    document_text: str  # the plan in its canonical JSON, as stored (the digest is of these bytes)
    findings: tuple[Finding, ...] = ()
    risk: Risk = Risk(RiskLevel.LOW, ())
    read_at: datetime | None = None  # when the engine was asked: its state serial is of that moment or later

    def summary(self) -> PlanSummary:
        return PlanSummary(
            counts={**{k.value: n for k, n in self.plan.counts().items()}, **self.plan.moves_and_imports()},
            destructive=tuple(rc.address for rc in self.plan.destructive),
            changed=tuple(rc.address for rc in self.plan.changes),
            drift=tuple(rc.address for rc in self.plan.resource_drift),
            risk=self.risk,
            findings=self.findings,
        )

    def preview(self) -> Preview:
        return build_preview(self.plan, findings=self.findings, risk=self.risk)


@dataclass(frozen=True)
class ChangeOrigin:
    """Who a plan is for, as policies see it: proposed by an agent or a person, for whom, touching what."""

    by_agent: bool = False
    requester: str = ""
    changed_paths: tuple[str, ...] = ()


def plan_stack(ws: Workspace, stack: str, ref: str, origin: ChangeOrigin = ChangeOrigin()) -> StackPlanResult:
    """Plan one stack of the declaration repo as of `ref`, then judge it: policy findings and risk.

    The rules come from main's gateway.yaml, never from the branch being judged.
    """
    sha = ws.repo.resolve(ref)
    settings = ws.repo_settings()
    settings.require_stack(stack)
    with tempfile.TemporaryDirectory(prefix=f"gw-{stack.replace('/', '-')}-") as tmp:
        directory = ws.repo.export_stack(sha, settings.stacks[stack].path, Path(tmp) / "repo")
        return plan_directory(ws, settings, stack, directory, sha, origin)


def plan_directory(ws: Workspace, settings: RepoSettings, stack: str, directory: Path, sha: str,
                   origin: ChangeOrigin) -> StackPlanResult:
    """Plan one stack from files on disk (a commit's export or the agent's working copy) and judge it."""
    inputs = ws.stack_inputs(stack)
    refuse_unreadable_configuration(ws.declarations, stack, directory,
                                    local_modules_on_disk(ws.declarations, directory, settings.stacks[stack].path))
    refuse_backend_change(ws, settings, stack, directory)
    unmaskings = stack_unmaskings(ws, stack, directory, inputs)
    by_function = [u.address for u in unmaskings if u.by_function]
    if by_function and not ws.engine.masks_by_origin(stack):  # the plan itself would show the value
        raise ConfigError(f"stack {stack}: {', '.join(by_function)}: nonsensitive() over a secret is refused before "
                          "planning; this stack's engine would show the value in the plan")
    # before the engine: a file the literal-secret check cannot read is refused, not planned unchecked
    literal = [Finding("literal-secret", Severity.DENY, f.address,
                       f"{f.attribute} is set from a literal in the configuration: a secret in git; take it from a "
                       f"variable the gateway supplies or a secret store", stack)
               for f in ws.declarations.literal_secrets(stack_files(directory))]
    read_at = ws.clock.now()
    engine_plan = ws.engine.plan(stack, directory, inputs)
    plan = load_plan(engine_plan.document)
    context = PolicyContext(stack, settings.policy, settings.stacks[stack].protected, origin.by_agent,
                            origin.requester, origin.changed_paths)
    risk = assess_risk(plan)
    findings = (literal + [Finding("secret-unmasked", Severity.DENY, u.address, u.message, stack) for u in unmaskings]
                + evaluate_plan(plan, context) + ws.scanner.scan(engine_plan.document, context)
                + rego_findings(ws, settings, engine_plan.document, context, inputs, risk))
    canonical = canonical_json(engine_plan.document)
    return StackPlanResult(stack, sha, engine_plan, plan, canonical_plan_digest(canonical, engine_plan.artifact),
                           canonical.decode(), tuple(findings), risk, read_at)


UNCHECKABLE = ("*.tf.json", "override.tf", "*_override.tf", "override.tf.json", "*_override.tf.json")


def refuse_unreadable_configuration(declarations: DeclarationReader, stack: str, directory: Path,
                                    modules: Sequence[Path] = ()) -> None:
    """Refuse, before any engine runs, what could show a secret or a local file in the plan itself.

    Files the gateway's secret checks cannot read (JSON configuration, override files), `nonsensitive()`
    inside a module directory (one under the stack, or a local module it calls elsewhere in the repo), and
    file functions reading outside their directory are refused, not judged later: by then the plan would
    already hold what they read.
    """
    folders = (directory, *modules)

    top = Path(os.path.commonpath(folders))

    def shown(path: Path) -> str:  # the stack's files as before; a module elsewhere by its place in the repo
        return str(path.relative_to(directory if path.is_relative_to(directory) else top))

    tf_files = list(dict.fromkeys(p for folder in folders for p in sorted(folder.rglob("*.tf"))
                                  if ".terraform" not in p.parts and not p.is_symlink()))
    uncheckable = sorted({shown(p) for folder in folders for pattern in UNCHECKABLE for p in folder.rglob(pattern)
                          if ".terraform" not in p.parts})
    if uncheckable:
        raise ConfigError(f"stack {stack}: {', '.join(uncheckable)}: JSON configuration and override files are not "
                          "planned by the gateway (its secret checks read HCL); write them as .tf files")
    nested = sorted(shown(p) for p in tf_files if p.parent != directory and "nonsensitive" in p.read_text(encoding="utf-8"))
    if nested:
        raise ConfigError(f"stack {stack}: {', '.join(nested)}: nonsensitive() in a module is refused; a module "
                          "cannot be checked for what it unmasks")
    outside = declarations.outside_reads({shown(p): p.read_text(encoding="utf-8") for p in tf_files})
    if outside:
        raise ConfigError(f"stack {stack}: " + "; ".join(u.message for u in outside))


def local_modules_on_disk(declarations: DeclarationReader, directory: Path, stack_path: str) -> list[Path]:
    """The local module directories a stack on disk calls (`directory` is the stack's, at `stack_path` in a
    checkout or an export), wherever in the repository they are."""
    root = directory
    for _ in Path(stack_path).parts:
        root = root.parent
    return [root / module for module in declarations.local_modules(stack_path, root)]


def refuse_backend_change(ws: Workspace, settings: RepoSettings, stack: str, directory: Path) -> None:
    """A stack's state lives where main says: a branch that moves it (another stack's state, an empty one), or
    gives a new stack one, is refused. A backend is an operator's change on main, with its state migrated."""
    on_main = ws.repo.read_files(ws.repo.resolve(ws.main_branch()), settings.stacks[stack].path, ".tf")
    here = {p.name: p.read_text(encoding="utf-8") for p in sorted(directory.glob("*.tf")) if not p.is_symlink()}
    if ws.declarations.backend(here) != ws.declarations.backend(on_main):
        raise ConfigError(f"stack {stack}: the change moves where the stack's state lives (its backend block differs "
                          f"from main's); a backend is changed on main, with its state migrated, not in a proposal")


def stack_files(directory: Path) -> dict[str, str]:
    return {f"{directory.name}/{p.name}": p.read_text(encoding="utf-8")
            for p in sorted(directory.glob("*.tf")) if not p.is_symlink()}


def stack_unmaskings(ws: Workspace, stack: str, directory: Path, inputs: StackInputs) -> list[Unmasking]:
    """Every place the stack's files try to show a secret in clear (by address, never value)."""
    known: dict[str, frozenset[str]] = {}  # asked once per resource type: the engine's answer may cost a lookup

    def sensitive(rtype: str) -> frozenset[str]:
        if rtype not in known:
            known[rtype] = ws.engine.sensitive_attributes(stack, rtype)
        return known[rtype]

    return ws.declarations.unmaskings(stack_files(directory), inputs.secret, inputs.sensitive_on_main, sensitive)
