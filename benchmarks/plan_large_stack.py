"""Plans (and applies, then re-plans) a generated stack of N resources with the sandbox engine.

Prints figures (wall time, and this process's CPU time, which a busy machine disturbs less) and the
machine's load, each beside a floor measured in the same run: for the plan, python-hcl2's parse of the
same text (what no plan of it avoids); for the apply, one transaction writing the same state and objects
to the same database (what no apply of it avoids). It is not a test. Goals (issue 25), for 2,001
resources: plan <= 2 s, apply <= 10 s.
Usage: python benchmarks/plan_large_stack.py [N] [DATABASE_URL]
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout this script is in, not an installed copy

from gateway.adapters.engines.sandbox.engine import SandboxEngine
from gateway.adapters.engines.sandbox.store import SqlSandboxStore
from gateway.adapters.hcl.reading import _parser
from gateway.adapters.store.schema import Database
from gateway.domain.plan import load_plan
from gateway.domain.preview import build_preview, render_text
from gateway.ports import StackInputs


def generate_stack(directory: Path, count: int) -> None:
    """A VPC, then groups of subnet + security group + rule + instance + bucket referring to each other."""
    parts = ['locals {\n  tags = { owner = "bench", "cost-centre" = "cc-0" }\n}\n',
             'resource "aws_vpc" "main" {\n  cidr_block = "10.0.0.0/8"\n  tags = local.tags\n}\n']
    groups = (count - 1) // 5
    for i in range(groups):
        parts.append(f'''
resource "aws_subnet" "s{i}" {{
  vpc_id     = aws_vpc.main.id
  cidr_block = cidrsubnet(aws_vpc.main.cidr_block, 16, {i})
  tags       = merge(local.tags, {{ Name = "s{i}" }})
}}
resource "aws_security_group" "g{i}" {{
  name   = "g{i}"
  vpc_id = aws_vpc.main.id
  tags   = local.tags
}}
resource "aws_security_group_rule" "r{i}" {{
  type              = "ingress"
  from_port         = 443
  to_port           = 443
  protocol          = "tcp"
  cidr_blocks       = [aws_subnet.s{i}.cidr_block]
  security_group_id = aws_security_group.g{i}.id
}}
resource "aws_instance" "i{i}" {{
  ami                    = "ami-0c1c30571d2dae5c9"
  instance_type          = "t3.micro"
  subnet_id              = aws_subnet.s{i}.id
  vpc_security_group_ids = [aws_security_group.g{i}.id]
  tags                   = merge(local.tags, {{ Name = "web-${{aws_subnet.s{i}.cidr_block}}" }})
}}
resource "aws_s3_bucket" "b{i}" {{
  bucket = "bench-bucket-{i}"
  tags   = local.tags
}}
''')
    (directory / "main.tf").write_text("".join(parts))


def _write_once(store: SqlSandboxStore, stack: str) -> None:
    """The apply's state and objects written again, under another stack's name, in one transaction."""
    state = store.read_state(stack)
    assert state is not None
    objects = store.get_objects([(r.type, r.id) for r in state.resources.values()])
    copied = {(f"floor.{rtype}", rid): attributes for (rtype, rid), attributes in objects.items()}
    store.write_apply(f"{stack}-floor", state, 0, list(state.resources), copied)


def timed(label: str, fn):  # type: ignore[no-untyped-def]
    start, cpu = time.perf_counter(), time.process_time()
    result = fn()
    print(f"{label:40} {time.perf_counter() - start:8.2f} s  (cpu {time.process_time() - cpu:.2f} s)")
    return result


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 2001
    with tempfile.TemporaryDirectory() as tmp:
        url = sys.argv[2] if len(sys.argv) > 2 else f"sqlite:///{tmp}/bench.db"
        stack_dir = Path(tmp) / "bench"
        stack_dir.mkdir()
        generate_stack(stack_dir, count)
        db = Database(url)
        db.migrate()
        store = SqlSandboxStore(db)
        engine = SandboxEngine(store)
        print(f"stack: {count} resources, database: {url.split(':')[0]}")
        print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
        text = (stack_dir / "main.tf").read_text() + "# the floor's own copy: not in the parse cache\n"
        timed("floor: parse of the same text", lambda: _parser().parse(text))
        first = timed("plan (empty state, all creates)", lambda: engine.plan("bench", stack_dir, StackInputs()))
        plan = load_plan(first.document)
        print(f"{'':40} {len(plan.changes)} changes")
        timed("render preview (text)", lambda: render_text(build_preview(plan)))
        outcome = timed("apply", lambda: engine.apply("bench", stack_dir, first.document, first.state_serial, StackInputs()))
        print(f"{'':40} {len(outcome.applied)} applied, succeeded={outcome.succeeded}")
        timed("floor: one write of that state", lambda: _write_once(store, "bench"))
        second = timed("re-plan (full state, refresh, no changes)", lambda: engine.plan("bench", stack_dir, StackInputs()))
        print(f"{'':40} {len(load_plan(second.document).changes)} changes")
        print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
