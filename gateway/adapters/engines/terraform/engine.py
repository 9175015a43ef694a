"""The terraform engine: the Terraform (or OpenTofu: the same CLI) binary behind the Engine port.

A plan runs `init`, `plan -out` and `show -json` in a scratch copy of the stack at the commit (when a
committed lock file decides what `init` makes, what an earlier `init` made is laid out instead: see
`terraform_data_dir`), and keeps Terraform's binary plan file with the JSON: the approval binds to both, and the
apply runs exactly that file, never a fresh plan. A stack's state lives where its files declare (`terraform {
backend ... }`, as main has it: planning refuses a branch that changes it; that storage is the user's, and the
gateway neither seals nor moves it), else in a local backend under the workspace, sealed at rest and in clear only
while a plan or apply runs (layout and locking in `terraform_state`); the state serial is read from that backend
without waiting for a run. Values the gateway
supplies are secret by origin: wherever one appears in the JSON plan it is marked sensitive, whatever
the configuration declares, and it is cut out of every message Terraform writes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.adapters.engines.terraform.data_dir import KEPT_DATA_DIRS, KeptDataDirs, clear_laid_out
from gateway.adapters.engines.terraform.schemas import KEPT_DIR, LOCK_FILE, KeptSchemas, sensitive_by_type
from gateway.adapters.engines.terraform.state import SealedLocalState
from gateway.adapters.hcl.backend import CLOUD, declared_backend

# The HCL reader (python-hcl2, lark) is imported by the functions that parse, when they first run: reads that
# import this module for its state serial or `declared_backend` never parse.
from gateway.adapters.sealing import UNSEALED, Sealer
from gateway.domain.errors import ApplyError, BackendError, ConfigError, PlanError
from gateway.logs import get_logger
from gateway.ports import ApplyOutcome, EnginePlan, StackInputs

log = get_logger(__name__)

PLAN_FILE = "gateway.tfplan"
INPUTS_FILE = "gateway-inputs.tfvars.json"
BACKEND_FILE = "gateway_backend_override.tf"
SENSITIVE_FILE = "gateway_sensitive_override.tf"
BACKEND_JSON = "backend.tf.json"  # a stack's own backend, alone in a directory where its state is read
SERIAL_TTL_SECONDS = 2.0  # reads of a declared backend's serial are reused this long (an apply reads afresh)
CANCEL_GRACE_SECONDS = 30.0
PROGRESS_SECONDS = 0.2  # how often an apply's new output lines are passed on
STATE_WAIT_SECONDS = 60.0  # how long a run waits for another plan or apply of its stack (Terraform's -lock-timeout)
MASK = "(sensitive)"
UNKNOWN_SCHEMA = frozenset({"(schema unknown: every attribute may be sensitive)"})
# never handed to Terraform (a configuration could read its own environment): the gateway's settings,
# including its database URL and token, and the model's key; provider credentials do pass
_WITHHELD_ENV = ("GATEWAY_", "OPENAI_", "TF_CLI_CONFIG_FILE", "TF_LOG")
# If the worker dies mid-run, Terraform gets SIGINT (Linux parent-death signal): it stops cleanly, writes the
# state it reached and releases its state lock, so the next worker records the apply interrupted and can plan.
_INTERRUPT_IF_ORPHANED = ["setpriv", "--pdeathsig", "INT", "--"] if shutil.which("setpriv") else []


@dataclass(frozen=True)
class TerraformSetup:
    """Where the binary and its CLI config are, and how long one run may take."""

    binary: Path
    cli_config: Path | None
    state_dir: Path
    timeout_seconds: float = 1800.0
    default_env: Mapping[str, str] = field(default_factory=dict)  # provider settings the environment may override


class TerraformEngine:
    """Plans and applies stacks with the Terraform CLI; every plan is Terraform's own JSON."""

    name = "terraform"

    def __init__(self, setup: TerraformSetup, sealer: Sealer = UNSEALED):
        self.setup = setup
        self._sealer = sealer  # seals the gateway-owned local state at rest
        self._held: dict[Path, int] = {}  # run directory -> its stack's state lock, inherited by Terraform
        self._schemas: dict[str, frozenset[str]] = {}  # resource type -> its sensitive attributes
        self._schema_keys: set[str] = set()  # the sets of providers those were learned from
        self._kept_schemas = KeptSchemas(setup.state_dir / KEPT_DIR, setup.binary, setup.cli_config)
        self._data_dirs = KeptDataDirs(setup.state_dir / KEPT_DATA_DIRS, setup.binary, setup.cli_config)
        self._serials: dict[str, tuple[float, dict[str, Any]]] = {}  # stack -> (when read, state) of declared backends

    # --- the Engine port -----------------------------------------------------------------------

    def state_serial(self, stack: str) -> int:
        return state_version(self._state(stack))

    def masks_by_origin(self, stack: str) -> bool:
        return False  # Terraform's nonsensitive() unmasks whatever we declare

    def sensitive_attributes(self, stack: str, resource_type: str) -> frozenset[str]:
        # a type whose schema could not be read counts as holding secrets (fail closed)
        return self._schemas.get(resource_type, UNKNOWN_SCHEMA)

    def plan(self, stack: str, directory: Path, inputs: StackInputs) -> EnginePlan:
        with _scratch_copy(directory) as work:
            return self._plan(stack, work, inputs)

    def _plan(self, stack: str, directory: Path, inputs: StackInputs) -> EnginePlan:
        self._prepare(stack, directory, inputs)
        plan = ["plan", "-input=false", "-no-color", "-lock-timeout=60s", f"-out={PLAN_FILE}", f"-var-file={INPUTS_FILE}"]
        with self._state_in_use(stack, directory) as read_state:
            state = read_state(False)
            reused = self._initialise(directory, inputs)
            out, code = self._run_raw(directory, plan, inputs)
            if code != 0 and reused is not None and "terraform init" in out:
                # what an earlier init made does not do for this configuration (a provider its lock file does not
                # pin, a package that no longer matches): forgotten, and the plan made as without it
                self._data_dirs.drop(reused)
                clear_laid_out(directory)
                self._initialise(directory, inputs, reuse=False)
                out, code = self._run_raw(directory, plan, inputs)
            if code != 0:
                raise PlanError(f"terraform plan failed: {_scrub(out.strip(), inputs)[-2000:]}")
            shown = self._run(directory, ["show", "-json", "-no-color", PLAN_FILE], PlanError, inputs)
            self._learn_schemas(directory, inputs)
        try:
            document = json.loads(shown)
        except json.JSONDecodeError as exc:
            raise PlanError(f"stack {stack}: `terraform show -json` did not write JSON ({exc})") from None
        mask_secret_values(document, [v for v in inputs.values.values() if isinstance(v, str) and v])
        artifact = (directory / PLAN_FILE).read_bytes()
        log.info("terraform.plan", stack=stack, changes=len(document.get("resource_changes", [])))
        return EnginePlan(document, state_version(state), str(state.get("lineage", "")), artifact)

    def apply(self, stack: str, directory: Path, document: Mapping[str, Any], expected_serial: int,
              inputs: StackInputs, artifact: bytes | None = None,
              progress: Callable[[str], None] | None = None) -> ApplyOutcome:
        if artifact is None:
            raise ApplyError(f"stack {stack}: no saved Terraform plan file to apply; re-plan")
        with _scratch_copy(directory) as work:
            return self._apply(stack, work, inputs, artifact, expected_serial, progress)

    def _apply(self, stack: str, directory: Path, inputs: StackInputs, artifact: bytes, expected_serial: int,
               progress: Callable[[str], None] | None) -> ApplyOutcome:
        self._prepare(stack, directory, inputs)
        with self._state_in_use(stack, directory) as read_state:
            serial = state_version(read_state(True))
            if serial != expected_serial:  # Terraform itself re-applies a plan made against an empty state
                raise ApplyError(f"state of stack {stack} moved since the plan (serial {expected_serial} -> {serial})")
            (directory / PLAN_FILE).write_bytes(artifact)
            self._run(directory, _init_args(directory), ApplyError, inputs)
            out, code = self._run_raw(directory, ["apply", "-input=false", "-no-color", "-json", "-lock-timeout=60s",
                                                  PLAN_FILE], inputs, progress)
            reached = state_version(read_state(True))
        applied, failed, errors = _apply_events(out)
        error = None
        if code != 0:
            error = _scrub("; ".join(errors) or "terraform apply failed", inputs)
        log.info("terraform.apply", stack=stack, applied=len(applied), failed=failed, code=code)
        return ApplyOutcome(code == 0, tuple(applied), failed, error, reached)

    # --- working directory, state and runs -----------------------------------------------------

    def _initialise(self, directory: Path, inputs: StackInputs, reuse: bool = True) -> str | None:
        """`terraform init` in the stack's copy, kept when a committed lock file decides it; or, when an earlier
        init was kept under the same key, that laid out instead (its key is returned). See terraform_data_dir."""
        key = None
        if (directory / BACKEND_FILE).exists():  # the gateway's local backend (a declared one is the user's)
            key = self._data_dirs.key(directory, directory / BACKEND_FILE, self._environment())
        if key is not None and reuse and self._data_dirs.lay_out(key, directory):
            return key
        committed = (directory / LOCK_FILE).read_bytes() if key is not None else b""
        self._run(directory, _init_args(directory), PlanError, inputs)
        if key is not None and self._data_dirs.keep(key, directory, committed):
            log.info("terraform.data_dir_kept", key=key[:12])
        return None

    def _local_state(self, stack: str) -> SealedLocalState:
        return SealedLocalState(self.setup.state_dir / stack, self._sealer, stack)

    @contextmanager
    def _state_in_use(self, stack: str, directory: Path) -> Iterator[Callable[[bool], dict[str, Any]]]:
        """For one run in `directory`: the gateway's local state in clear for its length (under the stack's lock),
        or the stack's own backend as it is; yields how to read the state (`fresh`: bypass the serial cache)."""
        if not (directory / BACKEND_FILE).exists():
            yield lambda fresh: self._state(stack, fresh)
            return
        local = self._local_state(stack)
        with local.in_use(STATE_WAIT_SECONDS) as lock:
            self._held[directory] = lock
            try:
                yield lambda fresh: local.read_live()
            finally:
                self._held.pop(directory, None)

    def _backend_dir(self, stack: str) -> Path:
        return self.setup.state_dir / stack / "backend"

    def _state(self, stack: str, fresh: bool = False) -> dict[str, Any]:
        """The stack's state (serial and lineage are what the gateway checks), from whichever backend holds it."""
        if (self._backend_dir(stack) / BACKEND_JSON).exists():
            cached = self._serials.get(stack)
            if fresh or cached is None or time.monotonic() - cached[0] > SERIAL_TTL_SECONDS:
                cached = self._serials[stack] = (time.monotonic(), self._pull_state(stack))
            return cached[1]
        try:
            return self._local_state(stack).read()
        except OSError as exc:
            raise BackendError(f"the Terraform state of stack {stack} cannot be read: {exc}") from None

    def _pull_state(self, stack: str) -> dict[str, Any]:
        directory = self._backend_dir(stack)
        inputs = StackInputs()
        if not (directory / ".terraform").exists():
            self._run(directory, ["init", "-input=false", "-no-color"], BackendError, inputs)
        pulled = self._run(directory, ["state", "pull"], BackendError, inputs)
        try:
            return dict(json.loads(pulled)) if pulled.strip() else {}
        except json.JSONDecodeError as exc:
            raise BackendError(f"the Terraform state of stack {stack} cannot be read from its backend: {exc}") from None

    def _prepare(self, stack: str, directory: Path, inputs: StackInputs) -> None:
        """The stack's backend (its own, or the gateway's local one) and the values the gateway supplies."""
        from gateway.adapters.hcl.sensitivity import declared_variables

        files = {p.name: p.read_text(encoding="utf-8") for p in sorted(directory.glob("*.tf"))
                 if not p.is_symlink() and p.name not in (BACKEND_FILE, SENSITIVE_FILE)}
        backend = declared_backend(files)
        refuse_cloud(stack, backend)
        if backend is not None:
            self._remember_backend(stack, backend)
        else:
            if self._backend_dir(stack).exists():  # main no longer declares one: the local backend again
                shutil.rmtree(self._backend_dir(stack), ignore_errors=True)
                self._serials.pop(stack, None)
            live = self._local_state(stack).live  # the one path every plan and apply of the stack names
            (directory / BACKEND_FILE).write_text(
                f'terraform {{\n  backend "local" {{\n    path = {json.dumps(str(live))}\n  }}\n}}\n')
        values = directory / INPUTS_FILE
        values.write_text(json.dumps(dict(inputs.values)))
        values.chmod(0o600)
        # a variable secret by origin is sensitive to Terraform too, whatever the branch declares
        forced = sorted(inputs.secret & declared_variables(files))
        (directory / SENSITIVE_FILE).write_text("".join(f'variable "{name}" {{\n  sensitive = true\n}}\n'
                                                        for name in forced))

    def _remember_backend(self, stack: str, backend: Mapping[str, Any]) -> None:
        """Keep the stack's backend, alone, where its state serial is read between runs (re-initialised on change)."""
        directory = self._backend_dir(stack)
        text = json.dumps({"terraform": {"backend": backend}}, sort_keys=True, indent=2)
        path = directory / BACKEND_JSON
        if path.exists() and path.read_text() == text:
            return
        directory.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(directory / ".terraform", ignore_errors=True)
        path.write_text(text)
        path.chmod(0o600)
        self._serials.pop(stack, None)

    def _environment(self) -> dict[str, str]:
        env = {**self.setup.default_env,
               **{k: v for k, v in os.environ.items() if not k.startswith(_WITHHELD_ENV)}}
        env.update({"TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1", "TF_INPUT": "0"})
        if self.setup.cli_config:
            env["TF_CLI_CONFIG_FILE"] = str(self.setup.cli_config)
        return env

    def _run(self, directory: Path, args: Sequence[str], error: type[Exception], inputs: StackInputs) -> str:
        out, code = self._run_raw(directory, args, inputs)
        if code != 0:
            raise error(f"terraform {args[0]} failed: {_scrub(out.strip(), inputs)[-2000:]}")
        return out

    def _run_raw(self, directory: Path, args: Sequence[str], inputs: StackInputs,
                 on_line: Callable[[str], None] | None = None) -> tuple[str, int]:
        """Run terraform; past the timeout it gets SIGINT (so it releases its state lock), then SIGKILL.

        Output goes to a file, not a pipe: if this worker dies, Terraform must still be able to write
        while it shuts down cleanly (a broken pipe would kill it holding its state lock). `on_line`
        gets each line as it is written (read every PROGRESS_SECONDS), secrets masked. Its end is noticed
        the moment it exits: a thread waits on it, and this one waits on that thread's signal.
        """
        log_file = directory / f".gateway-{args[0]}.log"
        deadline = time.monotonic() + self.setup.timeout_seconds
        with log_file.open("w+") as sink, log_file.open() as tail:
            try:
                held = self._held.get(directory)  # Terraform keeps the stack's state lock if this worker dies
                process = subprocess.Popen([*_INTERRUPT_IF_ORPHANED, str(self.setup.binary), *args], cwd=directory,
                                           env=self._environment(), stdout=sink, stderr=subprocess.STDOUT,
                                           pass_fds=() if held is None else (held,))
            except OSError as exc:
                raise BackendError(f"the terraform binary {self.setup.binary} cannot run: {exc}; "
                                   "run `make terraform` or set GATEWAY_TERRAFORM_BIN") from None
            ended = threading.Event()
            threading.Thread(target=lambda: (process.wait(), ended.set()), daemon=True).start()
            pending = ""
            try:
                while True:
                    finished = ended.wait(PROGRESS_SECONDS if on_line else max(0.0, deadline - time.monotonic()))
                    if on_line:
                        pending += tail.read()
                        *lines, pending = pending.split("\n")
                        for line in lines:
                            _report(on_line, _scrub(_readable(line), inputs))
                    if finished:
                        break
                    if time.monotonic() >= deadline:
                        raise BackendError(f"terraform {args[0]} took longer than {self.setup.timeout_seconds:g} s "
                                           "and was stopped")
            finally:
                if process.poll() is None:  # any way out of here but its own end stops Terraform cleanly first
                    _interrupt(process)
            sink.seek(0)
            out = sink.read()
        log.debug("terraform.run", command=args[0], code=process.returncode, output=_scrub(out, inputs)[-4000:])
        return out, process.returncode

    def _learn_schemas(self, directory: Path, inputs: StackInputs) -> None:
        """Which attributes each resource type's provider marks sensitive: asked of Terraform once per set of
        providers, then read from where the workspace keeps it (see terraform_schemas)."""
        key = self._kept_schemas.key(directory)
        if key is not None and key in self._schema_keys:
            return
        learned = self._kept_schemas.read(key) if key is not None else None
        if learned is None:
            out, code = self._run_raw(directory, ["providers", "schema", "-json"], inputs)
            if code != 0:
                return
            try:
                learned = sensitive_by_type(json.loads(out))
            except (json.JSONDecodeError, AttributeError):
                return
            if key is not None:
                try:
                    self._kept_schemas.write(key, learned)
                except OSError:
                    log.warning("terraform.schema_not_kept", exc_info=True)  # still used by this process
        self._schemas.update(learned)
        if key is not None:
            self._schema_keys.add(key)


def _init_args(work: Path) -> list[str]:
    """`terraform init`, told not to fetch modules when the gateway laid them out (its manifest is in the copy):
    Terraform then reads exactly the packages the plan pinned, and needs no registry of its own."""
    laid_out = (work / ".terraform" / "modules" / "modules.json").is_file()
    return ["init", "-input=false", "-no-color", *(["-get=false"] if laid_out else [])]


@contextmanager
def _scratch_copy(directory: Path) -> Iterator[Path]:
    """A private copy of the stack (and the local modules it calls, laid out as in the repo) to run Terraform in:
    what it writes (the supplied values, its plan file, .terraform/) never lands in the caller's directory,
    which may be the agent's working copy."""
    from gateway.adapters.modules.sources import local_module_directories, read_directory_on_disk, repository_root

    root = repository_root(directory)
    stack_path = directory.resolve().relative_to(root).as_posix()
    modules = local_module_directories(stack_path, read_directory_on_disk(root)) if stack_path != "." else ()
    with tempfile.TemporaryDirectory(prefix="gw-terraform-") as tmp:
        top = Path(tmp) / "repo"
        work = top / stack_path if stack_path != "." else top / directory.name
        for source, target in [(directory, work), *((root / m, top / m) for m in modules)]:
            if source.is_dir():  # a module may hold the stack (`../..`): copied over it
                shutil.copytree(source, target, symlinks=True, ignore=shutil.ignore_patterns(".terraform", ".git"),
                                dirs_exist_ok=True)
        installed = directory / ".terraform" / "modules"  # remote modules the gateway laid out (module_installer.py)
        if (installed / "modules.json").is_file() and not installed.is_symlink():
            shutil.copytree(installed, work / ".terraform" / "modules", symlinks=True)
        yield work


def _interrupt(process: subprocess.Popen[bytes]) -> None:
    """SIGINT (Terraform stops cleanly and releases its state lock), then SIGKILL after a grace period."""
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=CANCEL_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _report(on_line: Callable[[str], None], line: str) -> None:
    """Progress is for people; failing to record a line never disturbs the run."""
    try:
        on_line(line)
    except Exception:
        log.warning("terraform.progress_lost", exc_info=True)


def _readable(line: str) -> str:
    """A `-json` UI message as its human text; other lines as they are."""
    if line.startswith("{"):
        try:
            return str(json.loads(line).get("@message", line))
        except json.JSONDecodeError:
            return line
    return line


def state_version(state: Mapping[str, Any]) -> int:
    """What the gateway compares to tell whether a stack's state moved: 0 for no state, serial + 1 for a state.

    Serial alone does not tell an empty state from a new one (some backends write a first state with serial
    0), and Terraform re-applies a plan made against an empty state: that must never pass as unmoved.
    """
    return int(state.get("serial", 0)) + 1 if state.get("lineage") else 0


def refuse_cloud(stack: str, backend: Mapping[str, Any] | None) -> None:
    """The terraform engine does not run a stack with a `cloud` block: Terraform would hand its plans and applies
    to HCP Terraform (Terraform Cloud), out of the gateway's reach, and the approved plan could not be the one run."""
    if backend is not None and CLOUD in backend:
        raise ConfigError(f"stack {stack}: the terraform engine does not plan a stack with a `cloud` block: Terraform "
                          "would run its plans and applies in HCP Terraform (Terraform Cloud), out of the gateway's "
                          "reach; declare a `backend` instead (the sandbox engine plans such a stack against its "
                          "own simulated state)")


def mask_secret_values(document: dict[str, Any], secrets: Sequence[str]) -> None:
    """Mark sensitive, in place, every planned value that holds a secret the gateway supplied.

    Terraform masks only what the configuration declares sensitive; a branch can remove that
    declaration or call nonsensitive(). The gateway's own secrets stay masked regardless.
    """
    if not secrets:
        return
    for section in ("resource_changes", "resource_drift"):
        for rc in document.get(section, []):
            change = rc.get("change", {})
            for side in ("before", "after"):
                mask = _secret_mask(change.get(side), secrets)
                if mask is not None:
                    change[f"{side}_sensitive"] = _merge_masks(change.get(f"{side}_sensitive", False), mask)
    for change in document.get("output_changes", {}).values():
        for side in ("before", "after"):
            if _secret_mask(change.get(side), secrets) is not None:
                change[f"{side}_sensitive"] = True
    for variable in document.get("variables", {}).values():  # the plan's own record of input values
        if _secret_mask(variable.get("value"), secrets) is not None:
            variable["value"] = MASK


def _secret_mask(value: Any, secrets: Sequence[str]) -> Any:
    """A Terraform-shaped mask of the leaves holding a secret, or None when none does."""
    if isinstance(value, str):
        return True if any(s in value for s in secrets) else None
    if isinstance(value, dict):
        masks = {k: m for k, v in value.items() if (m := _secret_mask(v, secrets)) is not None}
        return masks or None
    if isinstance(value, list):
        items = [_secret_mask(v, secrets) for v in value]
        return [m if m is not None else False for m in items] if any(m is not None for m in items) else None
    return None


def _merge_masks(existing: Any, extra: Any) -> Any:
    if existing is True or extra is True:
        return True
    if isinstance(extra, dict):
        base = dict(existing) if isinstance(existing, dict) else {}
        for key, mask in extra.items():
            base[key] = _merge_masks(base.get(key, False), mask)
        return base
    if isinstance(extra, list):
        base_list = list(existing) if isinstance(existing, list) else [False] * len(extra)
        base_list += [False] * (len(extra) - len(base_list))
        return [_merge_masks(a, b) for a, b in zip(base_list, extra, strict=False)]
    return existing


def _apply_events(output: str) -> tuple[list[str], str | None, list[str]]:
    """From `apply -json`: the addresses applied in order, the one that failed, and the error summaries."""
    applied: list[str] = []
    failed: str | None = None
    errors: list[str] = []
    for message in _json_lines(output):
        kind = message.get("type")
        address = message.get("hook", {}).get("resource", {}).get("addr")
        if kind == "apply_complete" and address:
            applied.append(address)
        elif kind == "apply_errored" and address:
            failed = failed or address
        elif kind == "diagnostic" and message.get("@level") == "error":
            diagnostic = message.get("diagnostic", {})
            errors.append(f"{diagnostic.get('summary', '')}: {diagnostic.get('detail', '')}".strip(": "))
    return applied, failed, errors


def _json_lines(output: str) -> Iterator[dict[str, Any]]:
    for line in output.splitlines():
        if line.startswith("{"):
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def _scrub(text: str, inputs: StackInputs) -> str:
    for value in inputs.values.values():
        if isinstance(value, str) and value:
            text = text.replace(value, MASK)
    return text
