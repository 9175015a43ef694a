"""How much of the public corpus (tests/fixtures/corpus) the sandbox plans as Terraform would.

Prints, per entry: planned (the plan creates what Terraform creates), wrong (it plans, but not
that), or failed (the first error), and the time the plan took; then the totals. Not a test.
Usage: python benchmarks/corpus_coverage.py [NAME ...]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

# The corpus and its expectations live with the tests; import this tree's gateway, not an installed one.
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.adapters.sandbox.engine import SandboxEngine  # noqa: E402
from gateway.adapters.sandbox.store import SqlSandboxStore  # noqa: E402
from gateway.adapters.sql_store import Database  # noqa: E402
from gateway.logs import configure_logging  # noqa: E402
from tests.corpus import CorpusEntry, created_addresses, load_corpus, plan_entry  # noqa: E402


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def check(engine: SandboxEngine, entry: CorpusEntry, workdir: Path) -> tuple[str, str]:
    """(outcome, detail) of planning one entry."""
    try:
        plan = plan_entry(engine, entry, workdir)
    except Exception as exc:  # every failure is a finding here, whatever its class
        return "failed", first_line(exc)
    created = created_addresses(plan)
    missing = [a for a in entry.addresses if a not in created]
    others = len(plan.changes) - len(created)
    if len(created) != entry.creates or missing or others:
        return "wrong", (f"creates {len(created)} (Terraform {entry.creates}), {others} other changes"
                         + (f", missing {missing[0]}" if missing else ""))
    return "planned", f"{len(created)} creates"


def main() -> None:
    configure_logging("warning")
    wanted = set(sys.argv[1:])
    entries = [e for e in load_corpus() if not wanted or e.name in wanted]
    tally: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        db = Database(f"sqlite:///{tmp}/corpus.db")
        db.migrate()
        engine = SandboxEngine(SqlSandboxStore(db))
        for number, entry in enumerate(entries):
            workdir = Path(tmp) / str(number)
            workdir.mkdir()
            start = time.perf_counter()
            outcome, detail = check(engine, entry, workdir)
            elapsed = time.perf_counter() - start
            tally[outcome] = tally.get(outcome, 0) + 1
            print(f"{entry.name:34} {outcome:8} {elapsed:6.2f} s  {detail}")
    print(f"\n{tally.get('planned', 0)} of {len(entries)} planned as Terraform would; "
          f"{tally.get('wrong', 0)} planned differently; {tally.get('failed', 0)} failed")


if __name__ == "__main__":
    main()
