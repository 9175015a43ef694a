"""How much of the public corpus (tests/fixtures/corpus) the sandbox plans as Terraform would.

Prints, per entry: planned (the plan creates what Terraform creates), wrong (it plans, but not
that), or failed (the first error), and the time the plan took; then the totals. Not a test.

--gateway  plan each entry the way a proposal is planned: the corpus committed to a declaration repo,
           one stack per entry, each planned by plan_stack (the stack folder's export, the checks
           before the engine, policy); without it, each entry's files are planned by the engine.
--known-gaps  also print tests/test_sandbox_corpus.py's KNOWN_GAPS as measured now, ready to paste.
--census   also print what each entry uses beyond its first error: data source types, module calls,
           dynamic and provisioner blocks, Terraform functions the sandbox's evaluator lacks, tfvars.

Usage (from the project root): python benchmarks/corpus_coverage.py [--gateway] [--known-gaps] [--census] [NAME ...]
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

# The corpus and its expectations live with the tests; import this tree's gateway, not an installed one.
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.adapters.engines.sandbox.engine import SandboxEngine  # noqa: E402
from gateway.adapters.engines.sandbox.functions import FUNCTIONS  # noqa: E402
from gateway.adapters.engines.sandbox.store import SqlSandboxStore  # noqa: E402
from gateway.adapters.store.schema import Database  # noqa: E402
from gateway.domain.plan import Plan  # noqa: E402
from gateway.logs import configure_logging  # noqa: E402
from gateway.services.change.planning import plan_stack  # noqa: E402
from tests.conftest import Clone, make_workspace  # noqa: E402
from tests.corpus import CorpusEntry, created_addresses, load_corpus, plan_entry  # noqa: E402

# Terraform's built-in functions (its documented list, 1.x), to tell a call from other words followed by "(".
TERRAFORM_FUNCTIONS = frozenset("""
    abs ceil floor log max min parseint pow signum chomp endswith format formatlist indent join lower regex
    regexall replace split startswith strcontains strrev substr templatestring title trim trimprefix trimspace
    trimsuffix upper alltrue anytrue chunklist coalesce coalescelist compact concat contains distinct element
    flatten index keys length lookup matchkeys merge one range reverse setintersection setproduct setsubtract
    setunion slice sort sum transpose values zipmap base64decode base64encode base64gzip csvdecode jsondecode
    jsonencode textdecodebase64 textencodebase64 urlencode yamldecode yamlencode abspath dirname pathexpand
    basename file fileexists fileset filebase64 templatefile formatdate plantimestamp timeadd timecmp timestamp
    base64sha256 base64sha512 bcrypt filebase64sha256 filebase64sha512 filemd5 filesha1 filesha256 filesha512
    md5 rsadecrypt sha1 sha256 sha512 uuid uuidv5 cidrhost cidrnetmask cidrsubnet cidrsubnets can issensitive
    nonsensitive sensitive tobool tolist tomap tonumber toset tostring try
""".split())


def census(entry: CorpusEntry) -> str:
    """What the entry's *.tf files (its modules' included) use that a plain resource file does not."""
    text = "\n".join(re.sub(r"(?m)^\s*(#|//).*$", "", f.read_text()) for f in sorted(entry.directory.rglob("*.tf")))
    data = sorted(set(re.findall(r'(?m)^data\s+"([\w-]+)"', text)))
    missing = sorted({f for f in re.findall(r"\b([a-z][a-z0-9]*)\(", text) if f in TERRAFORM_FUNCTIONS} - set(FUNCTIONS))
    counts = {label: len(re.findall(pattern, text)) for label, pattern in (
        ("module calls", r'(?m)^module\s+"'), ("dynamic blocks", r'dynamic\s+"'), ("provisioners", r'provisioner\s+"'))}
    parts = [f"data: {', '.join(data)}" if data else "",
             *(f"{n} {label}" for label, n in counts.items() if n),
             f"functions missing: {', '.join(missing)}" if missing else "",
             "registry modules in .terraform/modules" if (entry.directory / entry.root / ".terraform").is_dir() else "",
             *(f.name for f in sorted((entry.directory / entry.root).glob("*.tfvars")))]
    return "; ".join(p for p in parts if p) or "-"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def judge(entry: CorpusEntry, plan_of: Callable[[CorpusEntry], Plan]) -> tuple[str, str]:
    """(outcome, detail) of planning one entry."""
    try:
        plan = plan_of(entry)
    except Exception as exc:  # every failure is a finding here, whatever its class
        return "failed", first_line(exc)
    created = created_addresses(plan)
    missing = [a for a in entry.addresses if a not in created]
    others = len(plan.changes) - len(created)
    if len(created) != entry.creates or missing or others:
        return "wrong", (f"creates {len(created)} (Terraform {entry.creates}), {others} other changes"
                         + (f", missing {missing[0]}" if missing else ""))
    return "planned", f"{len(created)} creates"


def engine_planner(tmp: Path) -> Callable[[CorpusEntry], Plan]:
    """Each entry's files, copied, planned by the sandbox engine: what tests/test_sandbox_corpus.py does."""
    db = Database(f"sqlite:///{tmp}/corpus.db")
    db.migrate()
    engine = SandboxEngine(SqlSandboxStore(db))
    return lambda entry: plan_entry(engine, entry, Path(tempfile.mkdtemp(dir=tmp)))


def gateway_planner(tmp: Path, entries: list[CorpusEntry]) -> Callable[[CorpusEntry], Plan]:
    """The whole corpus committed to a workspace's declaration repo, one stack per entry (at its root
    folder), each planned by plan_stack: the stack's export, the gateway's checks before the engine, policy."""
    ws = make_workspace(tmp / "home")
    clone = Clone(ws, tmp / "clone").branch("main")
    settings = yaml.safe_load(clone.read("gateway.yaml"))
    for entry in entries:
        shutil.copytree(entry.directory, clone.path / "corpus" / entry.name)
        path = (Path("corpus") / entry.name / entry.root).as_posix()
        settings["stacks"][entry.name] = {"path": path, "approvers": ["platform"]}
    clone.write("gateway.yaml", yaml.safe_dump(settings, sort_keys=False)).push("the corpus, one stack per entry")
    return lambda entry: plan_stack(ws, entry.name, "main").plan


def main() -> None:
    configure_logging("warning")
    args = sys.argv[1:]
    wanted = {a for a in args if not a.startswith("--")}
    entries = [e for e in load_corpus() if not wanted or e.name in wanted]
    tally: dict[str, int] = {}
    gaps: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        via_gateway = "--gateway" in args
        plan_of = gateway_planner(Path(tmp), entries) if via_gateway else engine_planner(Path(tmp))
        print("through the gateway's plan_stack" if via_gateway else "through the sandbox engine's plan")
        for entry in entries:
            start = time.perf_counter()
            outcome, detail = judge(entry, plan_of)
            elapsed = time.perf_counter() - start
            tally[outcome] = tally.get(outcome, 0) + 1
            if outcome != "planned":
                gaps[entry.name] = detail
            print(f"{entry.name:34} {outcome:8} {elapsed:6.2f} s  {detail}")
    print(f"\n{tally.get('planned', 0)} of {len(entries)} planned as Terraform would; "
          f"{tally.get('wrong', 0)} planned differently; {tally.get('failed', 0)} failed")
    if "--known-gaps" in args:
        print("\nKNOWN_GAPS: dict[str, str] = {")
        print("".join(f"    {json.dumps(name)}: {json.dumps(detail)},\n" for name, detail in gaps.items()) + "}")
    if "--census" in args:
        print("\nwhat each entry uses (its modules included):")
        for entry in entries:
            print(f"{entry.name:34} {census(entry)}")


if __name__ == "__main__":
    main()
