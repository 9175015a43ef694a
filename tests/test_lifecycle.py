"""The proposal lifecycle: one table of transitions, and every way out of an apply recorded.

The table tests are pure; the runner tests use real git repositories and real databases.
"""

from __future__ import annotations

import ast
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from gateway.adapters.store.schema import audit_events, plans
from gateway.api.app import create_app
from gateway.domain.errors import LockTimeout, Refused
from gateway.domain.lifecycle import FINAL, TRANSITIONS, ProposalStatus, Transition, next_status, ways_out
from gateway.domain.principals import Principal, PrincipalKind
from gateway.domain.proposal import Decision, Proposal
from gateway.ports import ApplyOutcome, Engine
from gateway.services.change.main_watch import acknowledge_push, watch_main
from gateway.services.change.proposals import abandon_proposal, decide, get_proposal, open_proposal
from gateway.services.change.runner import _acquire, apply_proposal, merge_unmerged
from gateway.services.change.views import view_proposal
from gateway.services.workspace import Workspace

from .conftest import Clone, People, add_people, run_cli
from .fakes import FakeClone

STAGING = "stacks/app-staging/main.tf"
QUEUE = 'resource "aws_sqs_queue" "orders" {\n  name = "orders-staging"\n  tags = local.tags\n}\n'
NETWORK = "stacks/network/main.tf"
GATEWAY = Path(__file__).parent.parent / "gateway"


# --- the table -------------------------------------------------------------------------------


def _proposal(status: ProposalStatus) -> Proposal:
    person = Principal("p", "p", PrincipalKind.PERSON, frozenset(), frozenset())
    return Proposal(1, "b", "0" * 40, "1" * 40, person, person, "why", ("s",), status)


@pytest.mark.parametrize("status", list(ProposalStatus))
@pytest.mark.parametrize("transition", list(Transition))
def test_every_transition_is_taken_or_refused_as_the_table_says(status: ProposalStatus,
                                                                 transition: Transition) -> None:
    proposal = _proposal(status)
    expected = TRANSITIONS.get((status, transition))
    if expected is None:
        with pytest.raises(Refused, match=f"is {status.value}; `{transition.value}` is not possible"):
            proposal.take(transition)
        assert proposal.status == status
    else:
        assert proposal.take(transition) == expected == proposal.status


def test_no_state_is_a_dead_end() -> None:
    for status in ProposalStatus:
        assert (status in FINAL) == (not ways_out(status)), status
    assert next_status(ProposalStatus.APPLYING, Transition.INTERRUPT) == ProposalStatus.FAILED
    assert ProposalStatus.OPEN in {next_status(ProposalStatus.FAILED, t) for t in Transition}


def test_the_table_is_the_only_place_statuses_change() -> None:
    """In memory, only `Proposal.take` assigns a status; in the database, only `Proposals.save` writes it.

    The second half reads the SQL the code builds (SQLAlchemy `update(proposals)...values(...)`, a values dict
    with a "status" key, raw SQL text), so a second writer anywhere in the package fails here, naming itself.
    """
    offenders = []
    for path in GATEWAY.rglob("*.py"):
        text = path.read_text()
        for match in re.finditer(r"(status\s*=\s*ProposalStatus\.|\.status\s*=(?!=)|update_proposal)", text):
            line = text[: match.start()].count("\n") + 1
            offenders.append(f"{path.relative_to(GATEWAY)}:{line}")
    assert sorted(offenders) == ["domain/proposal.py:" + str(_line_of("self.status = target"))]

    writes = [f"{path.relative_to(GATEWAY)}:{write}" for path in sorted(GATEWAY.rglob("*.py"))
              for write in status_writes(path.read_text())]
    # a proposal is born in its initial state; after that, the transition method is the one writer
    assert writes == ["adapters/store/proposals.py:insert in add: INITIAL.value",
                      "adapters/store/proposals.py:update in save"]


def _line_of(snippet: str) -> int:
    text = (GATEWAY / "domain" / "proposal.py").read_text()
    return text[: text.index(snippet)].count("\n") + 1


RAW_STATUS_SQL = re.compile(r"\b(update\s+proposals\b.*\bstatus\b|insert\s+into\s+proposals\b)", re.I | re.S)


def status_writes(source: str) -> list[str]:
    """Each statement in `source` that writes the proposals table's status column: "update in FUNCTION",
    "insert in FUNCTION: VALUE", or "raw SQL in FUNCTION"."""
    tree = ast.parse(source)
    tables = {"proposals"} | {alias.asname for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                              for alias in node.names if alias.name == "proposals" and alias.asname}
    found = []
    for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
        for node in ast.walk(function):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and RAW_STATUS_SQL.search(node.value):
                found.append((node.lineno, f"raw SQL in {function.name}"))
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "values"):
                continue
            statement = _statement_on(node.func.value, tables)
            status = _written_columns(node, function).get("status")
            if statement is not None and status is not None:
                detail = f": {ast.unparse(status)}" if statement == "insert" else ""
                found.append((node.lineno, f"{statement} in {function.name}{detail}"))
    return [what for _, what in sorted(set(found))]  # a nested function is walked twice: count each write once


def _statement_on(receiver: ast.expr, tables: set[str]) -> str | None:
    """"update" or "insert" when the chain under `.values(...)` starts from `update(proposals)`,
    `insert(proposals)` or `proposals.update()`/`.insert()`; None for any other table or statement."""
    node: ast.expr = receiver
    while isinstance(node, ast.Call | ast.Attribute):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id in ("update", "insert") and node.args \
                    and isinstance(node.args[0], ast.Name) and node.args[0].id in tables:
                return node.func.id
            if isinstance(node.func, ast.Attribute) and node.func.attr in ("update", "insert") \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id in tables:
                return node.func.attr
            node = node.func
        else:
            node = node.value
    return None


def _written_columns(values_call: ast.Call, function: ast.AST) -> dict[str, ast.expr]:
    """Column -> value expression of a `.values(...)` call: keywords, a dict argument, and `**name` where
    `name` is a dict built in the same function (its literal keys and `name["key"] = ...` assignments)."""
    columns: dict[str, ast.expr] = {}
    dicts = [a for a in values_call.args if isinstance(a, ast.Dict)]
    for keyword in values_call.keywords:
        if keyword.arg is not None:
            columns[keyword.arg] = keyword.value
        elif isinstance(keyword.value, ast.Dict):
            dicts.append(keyword.value)
        elif isinstance(keyword.value, ast.Name):
            dicts += _dicts_named(keyword.value.id, function)
            columns |= _keys_assigned(keyword.value.id, function)
    for literal in dicts:
        columns |= {k.value: v for k, v in zip(literal.keys, literal.values, strict=True)
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return columns


def _dicts_named(name: str, function: ast.AST) -> list[ast.Dict]:
    out = []
    for node in ast.walk(function):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        value = getattr(node, "value", None)
        if isinstance(value, ast.Dict) and any(isinstance(t, ast.Name) and t.id == name for t in targets):
            out.append(value)
    return out


def _keys_assigned(name: str, function: ast.AST) -> dict[str, ast.expr]:
    return {t.slice.value: node.value for node in ast.walk(function) if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name)
            and t.value.id == name and isinstance(t.slice, ast.Constant) and isinstance(t.slice.value, str)}


@pytest.mark.parametrize(("case", "source", "expected"), [
    ("a keyword", "def close(c):\n    c.execute(update(proposals).where(proposals.c.id == 1).values(status='applied'))\n",
     ["update in close"]),
    ("a key of a values dict", "def close(c):\n    v = {'status': 'applied'}\n"
                               "    c.execute(update(proposals).values(**v))\n", ["update in close"]),
    ("a key set later", "def close(c):\n    v: dict = {}\n    v['status'] = 'applied'\n"
                        "    c.execute(update(proposals).values(**v).where(proposals.c.id == 1))\n", ["update in close"]),
    ("a dict argument", "def close(c):\n    c.execute(update(proposals).values({'status': 'x'}))\n", ["update in close"]),
    ("the table's own method", "def close(c):\n    c.execute(proposals.update().values(status='x'))\n",
     ["update in close"]),
    ("the table under another name", "from gateway.adapters.store.schema import proposals as p\n"
                                     "def close(c):\n    c.execute(update(p).values(status='x'))\n", ["update in close"]),
    ("raw SQL", "def close(c):\n    c.execute(text('UPDATE proposals SET status = :s WHERE id = :i'))\n",
     ["raw SQL in close"]),
    ("an insert in another state", "def add(c):\n    c.execute(insert(proposals).values(status='applied'))\n",
     ["insert in add: 'applied'"]),
    ("another column of proposals", "def move(c):\n    c.execute(update(proposals).values(head_sha='b'))\n", []),
    ("another table's status", "def finish(c):\n    c.execute(update(jobs).values(status='done'))\n", []),
])
def test_the_status_scan_finds_every_way_to_write_the_column(case: str, source: str, expected: list[str]) -> None:
    """A second writer, however it is spelt, would be found: the assertion above cannot pass by finding nothing."""
    assert status_writes(source) == expected, case


# --- every way out of an apply ---------------------------------------------------------------


class EngineWithHook:
    """A fake at the engine port: the real sandbox engine, with a hook before or after each apply."""

    def __init__(self, inner: Engine, before_apply: Callable[[], None] = lambda: None,
                 after_apply: Callable[[], None] = lambda: None):
        self.inner, self.before_apply, self.after_apply = inner, before_apply, after_apply
        self.name = inner.name

    def apply(self, *args: Any, **kwargs: Any) -> ApplyOutcome:
        self.before_apply()
        outcome = self.inner.apply(*args, **kwargs)
        self.after_apply()
        return outcome

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


# `ws` is the sample repo in memory (conftest's, over tests/fakes.py's sandbox_workspace): the real engine and runner
# over a fake store and a fake repo (whose merge is file by file). What needs git, the databases, threads racing or
# HTTP stays on a real workspace.


def _approved(ws: Workspace, people: People, clone: Clone | FakeClone, branch: str,
              edits: list[tuple[str, str, str]],
              extra: dict[str, str] | None = None) -> int:
    clone.branch(branch)
    for path, old, new in edits:
        clone.edit(path, old, new)
    for path, text in (extra or {}).items():
        clone.write(path, text)
    clone.push(branch)
    proposal = open_proposal(ws, people.alice, branch, f"change {branch}")
    decide(ws, people.bob, proposal.id, Decision.APPROVE, "ok")
    return proposal.id


def test_a_merge_conflict_is_found_before_anything_is_applied(
        ws: Workspace, team: People, checkout: FakeClone) -> None:
    first = _approved(ws, team, checkout, "a", [(STAGING, '"t3.small"', '"t3.medium"')], {"README.md": "first\n"})
    second = _approved(ws, team, checkout, "b", [], {"README.md": "second\n", "stacks/network/extra.tf": "# extra\n"})
    serial_before = ws.engine.state_serial("network")
    assert view_proposal(ws, team.alice, second).can_apply
    assert apply_proposal(ws, team.alice, first).succeeded
    # every view says so before an apply is tried, in the runner's words, and offers no apply
    row = "the branch does not merge cleanly into main (conflicts in README.md); rebase it on main and push again"
    shown = view_proposal(ws, team.alice, second)
    assert not shown.can_apply and shown.apply_blockers == shown.blocked_by == [row]
    with pytest.raises(Refused) as refused:
        apply_proposal(ws, team.alice, second)
    assert refused.value.reasons == [row]
    assert ws.engine.state_serial("network") == serial_before  # nothing of the second was applied
    assert get_proposal(ws, second).status == ProposalStatus.OPEN  # it can be rebased, re-proposed or abandoned
    assert abandon_proposal(ws, team.alice, second, "rebasing instead").status == ProposalStatus.ABANDONED


def test_main_moving_on_another_stack_keeps_the_plan_and_the_apply_proceeds(
        ws: Workspace, team: People, checkout: FakeClone) -> None:
    staging = _approved(ws, team, checkout, "staging", [(STAGING, '"t3.small"', '"t3.medium"')])
    network = _approved(ws, team, checkout, "network", [], {"stacks/network/note.tf": "# a comment\n"})
    digests = get_proposal(ws, staging).current_digests
    assert apply_proposal(ws, team.alice, network).succeeded  # main moves, on another stack
    report = apply_proposal(ws, team.alice, staging)
    assert report.succeeded, report
    after = get_proposal(ws, staging)
    assert after.status == ProposalStatus.APPLIED and after.current_digests == digests
    assert len(after.current_approvals) == 1  # the approval of the identical plan still counted


def test_an_engine_exception_mid_apply_is_recorded_and_retryable(
        ws: Workspace, team: People, checkout: FakeClone) -> None:
    proposal_id = _approved(ws, team, checkout, "bigger", [(STAGING, '"t3.small"', '"t3.medium"')])
    real = ws.engine

    def explode() -> None:
        raise RuntimeError("provider crashed")

    ws.engine = EngineWithHook(real, before_apply=explode)
    report = apply_proposal(ws, team.alice, proposal_id)
    assert not report.succeeded and "provider crashed" in (report.outcomes[-1].error or "")
    failed = get_proposal(ws, proposal_id)
    assert failed.status == ProposalStatus.FAILED
    assert ws.store.locks.holder("app-staging") is None
    with ws.store.session() as session:
        assert [a.status for a in session.proposals.applies_of(proposal_id)] == ["failed"]
        assert "proposal.fail" in [e.kind for e in session.audit.events(proposal_id=proposal_id)]
    ws.engine = real
    assert apply_proposal(ws, team.alice, proposal_id).succeeded  # retry: same plan, same approval
    assert get_proposal(ws, proposal_id).status == ProposalStatus.APPLIED


def test_an_apply_outliving_the_lock_ttl_keeps_its_lock_by_heartbeat(any_workspace: Workspace,
                                                                    tmp_path: Path) -> None:
    ws, people = any_workspace, add_people(any_workspace)
    clone = Clone(ws, tmp_path / "c")
    ws.settings = ws.settings.model_copy(update={"lock_ttl_seconds": 0.6, "lock_wait_seconds": 0.2})
    proposal_id = _approved(ws, people, clone, "bigger", [(STAGING, '"t3.small"', '"t3.medium"')])
    inside = threading.Event()

    def slow() -> None:
        inside.set()
        time.sleep(2.0)  # more than three TTLs

    ws.engine = EngineWithHook(ws.engine, before_apply=slow)
    result: dict[str, object] = {}
    runner = threading.Thread(target=lambda: result.update(report=apply_proposal(ws.for_request(), people.alice,
                                                                                 proposal_id, runner="slow")))
    runner.start()
    assert inside.wait(30)
    time.sleep(1.0)
    with pytest.raises(LockTimeout, match="locked by runner slow"):
        _acquire(ws, "app-staging", "intruder", get_proposal(ws, proposal_id))
    runner.join(60)
    assert result["report"].succeeded  # type: ignore[attr-defined]
    with ws.store.session() as session:
        assert "apply.interrupted" not in [e.kind for e in session.audit.events()]


def test_a_direct_push_during_the_apply_leaves_it_unmerged_locked_and_explained(
        ws: Workspace, team: People, checkout: FakeClone) -> None:
    proposal_id = _approved(ws, team, checkout, "bigger", [(STAGING, '"t3.small"', '"t3.medium"')])
    pusher = FakeClone(ws.repo)  # type: ignore[arg-type]

    def someone_pushes() -> None:
        pusher.branch("main").edit(STAGING, '"cc-3003"', '"cc-9999"').push("hotfix outside the gateway", "mallory")

    ws.engine = EngineWithHook(ws.engine, after_apply=someone_pushes)
    report = apply_proposal(ws, team.alice, proposal_id)
    assert report.unmerged and "gateway merge" in report.unmerged and "app-staging" in report.unmerged
    assert get_proposal(ws, proposal_id).status == ProposalStatus.UNMERGED
    with pytest.raises(LockTimeout, match=f"held by proposal {proposal_id}, which was applied but could not be merged"):
        _acquire(ws, "app-staging", "next-runner", get_proposal(ws, proposal_id))
    # a person reverts the push, then merges: main describes what runs, and the stack is free again
    pusher.branch("main").edit(STAGING, '"cc-9999"', '"cc-3003"').push("revert the hotfix", "mallory")
    merged = merge_unmerged(ws, team.bob, proposal_id)
    assert merged.status == ProposalStatus.APPLIED and merged.merge_sha
    assert ws.store.locks.holder("app-staging") is None
    assert '"t3.medium"' in ws.repo.read_file(ws.repo.resolve("main"), STAGING)


def test_two_approvals_racing_a_new_commit(ws: Workspace, team: People, checkout: FakeClone) -> None:
    checkout.branch("bigger").edit(STAGING, '"t3.small"', '"t3.medium"').push()
    proposal = open_proposal(ws, team.alice, "bigger", "more memory")
    seen = proposal.head_sha
    checkout.edit(STAGING, '"t3.medium"', '"t3.large"').push()
    with pytest.raises(Refused):  # carol's call re-plans the new commit; she had not seen it
        decide(ws, team.carol, proposal.id, Decision.APPROVE, "")
    with pytest.raises(Refused, match="the branch moved to .* since you looked at"):
        decide(ws, team.bob, proposal.id, Decision.APPROVE, "", seen_sha=seen)
    current = get_proposal(ws, proposal.id)
    assert current.head_sha != seen and not current.current_approvals
    decide(ws, team.bob, proposal.id, Decision.APPROVE, "", seen_sha=current.head_sha)
    assert len(get_proposal(ws, proposal.id).current_approvals) == 1


def test_a_burst_of_reads_writes_nothing(any_workspace: Workspace, tmp_path: Path) -> None:
    ws, people = any_workspace, add_people(any_workspace)
    clone = Clone(ws, tmp_path / "c")
    clone.branch("bigger").edit(STAGING, '"t3.small"', '"t3.medium"').push()
    proposal = open_proposal(ws, people.alice, "bigger", "more memory")
    clone.edit(STAGING, '"t3.medium"', '"t3.large"').push()  # the branch moved: a read must not re-plan it

    def counts() -> tuple[int, int]:
        with ws.store.db.transaction() as conn:
            return (conn.scalar(select(func.count()).select_from(audit_events)) or 0,
                    conn.scalar(select(func.count()).select_from(plans)) or 0)

    before = counts()
    auth = {"Authorization": f"Bearer {people.tokens['bob']}"}
    with TestClient(create_app(ws.settings, workers=0)) as client:  # the API alone: no worker re-plans meanwhile
        results: list[int] = []

        def read() -> None:
            for _ in range(5):
                shown = client.get(f"/api/v1/proposals/{proposal.id}", headers=auth)
                results.append(shown.status_code)
                assert any("new commit" in p for p in shown.json()["pending"])
                results.append(client.get(f"/api/v1/proposals/{proposal.id}/preview", headers=auth).status_code)

        threads = [threading.Thread(target=read) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert set(results) == {200} and len(results) == 80
    assert counts() == before
    assert get_proposal(ws, proposal.id).head_sha == proposal.head_sha


def test_cli_show_only_reads_sync_replans_and_abandon_frees_the_branch(workspace: Workspace, people: People,
                                                                       clone: Clone) -> None:
    home, t = workspace.settings.home, people.tokens
    clone.branch("bigger").edit(STAGING, '"t3.small"', '"t3.medium"').push()
    assert run_cli(["propose", "--branch", "bigger", "-m", "more memory"], home, t["alice"]).returncode == 0
    clone.edit(STAGING, '"t3.medium"', '"t3.large"').push()
    shown = run_cli(["show", "1"], home, t["bob"])
    assert shown.returncode == 0 and "note: new commit" in shown.stdout and "t3.medium" in shown.stdout
    assert get_proposal(workspace, 1).head_sha != workspace.repo.resolve("bigger")  # the read changed nothing
    refused = run_cli(["sync", "1"], home, t["dana"])
    assert refused.returncode == 1 and "dana has no role that may start a plan" in refused.stderr
    synced = run_cli(["sync", "1"], home, t["bob"])
    assert synced.returncode == 0 and "new commit" in synced.stdout
    assert "t3.large" in run_cli(["show", "1"], home, t["bob"]).stdout
    abandoned = run_cli(["abandon", "1", "-m", "too big"], home, t["alice"])
    assert abandoned.returncode == 0 and "abandoned" in abandoned.stdout
    again = run_cli(["propose", "--branch", "bigger", "-m", "smaller this time"], home, t["alice"])
    assert again.returncode == 0, again.stderr
    assert run_cli(["abandon", "1", "-m", "twice"], home, t["alice"]).returncode == 1


def test_an_approval_names_the_plan_it_saw_not_just_the_commit(ws: Workspace, team: People,
                                                               checkout: FakeClone) -> None:
    checkout.branch("bigger").edit(STAGING, '"t3.small"', '"t3.medium"').push()
    proposal = open_proposal(ws, team.alice, "bigger", "more memory")
    seen = proposal.current_digests
    other = _approved(ws, team, checkout, "queue", [], {"stacks/app-staging/queue.tf": QUEUE})
    assert apply_proposal(ws, team.alice, other).succeeded  # the state moves: same commit, a different plan
    from gateway.services.change.proposals import sync_proposal

    replanned, _ = sync_proposal(ws, proposal.id)
    assert replanned.head_sha == proposal.head_sha and replanned.current_digests != seen
    with pytest.raises(Refused, match="the plan changed since you looked at it"):
        decide(ws, team.bob, proposal.id, Decision.APPROVE, "", seen_sha=proposal.head_sha, seen_digests=seen)
    decide(ws, team.bob, proposal.id, Decision.APPROVE, "", seen_sha=proposal.head_sha,
           seen_digests=replanned.current_digests)
    assert get_proposal(ws, proposal.id).current_approvals


def test_the_api_refuses_an_approval_of_a_plan_that_changed_since_it_was_seen(workspace: Workspace, people: People,
                                                                            clone: Clone) -> None:
    ws = workspace
    clone.branch("bigger").edit(STAGING, '"t3.small"', '"t3.medium"').push()
    proposal = open_proposal(ws, people.alice, "bigger", "more memory")
    seen = proposal.current_digests
    other = _approved(ws, people, clone, "cost", [(STAGING, '"cc-3003"', '"cc-3004"')])
    assert apply_proposal(ws, people.alice, other).succeeded  # the state moves: same commit, a different plan
    from gateway.services.change.proposals import sync_proposal

    replanned, _ = sync_proposal(ws, proposal.id)
    with TestClient(create_app(ws.settings, workers=0)) as client:
        stale = client.post(f"/api/v1/proposals/{proposal.id}/approve", json={"digests": seen},
                            headers={"Authorization": f"Bearer {people.tokens['bob']}"})
        assert stale.status_code == 403 and "plan changed" in stale.text
        fresh = client.post(f"/api/v1/proposals/{proposal.id}/approve", json={"digests": replanned.current_digests},
                            headers={"Authorization": f"Bearer {people.tokens['bob']}"})
        assert fresh.status_code == 200


def test_a_push_to_main_outside_the_gateway_holds_applies_on_its_stacks_until_acknowledged(
        ws: Workspace, team: People, checkout: FakeClone) -> None:
    first = _approved(ws, team, checkout, "bigger", [(STAGING, '"t3.small"', '"t3.medium"')])
    assert apply_proposal(ws, team.alice, first).succeeded
    assert watch_main(ws) == []  # the gateway's own merge is not a push
    pusher = FakeClone(ws.repo)  # type: ignore[arg-type]
    pushed = pusher.edit(STAGING, '"cc-3003"', '"cc-7777"').push("hotfix", "mallory")

    second = _approved(ws, team, checkout, "later", [(STAGING, '"t3.medium"', '"t3.large"')])
    with pytest.raises(Refused, match=f"commit {pushed[:12]} by mallory <mallory@example.com> was pushed to main outside"):
        apply_proposal(ws, team.alice, second)
    with pytest.raises(Refused, match="only approvers and admins may"):
        acknowledge_push(ws, team.alice, pushed[:12], "it was a hotfix")
    acknowledge_push(ws, team.bob, pushed[:12], "the hotfix is what runs; kept")
    assert apply_proposal(ws, team.alice, second).succeeded
    with ws.store.session(readonly=True) as session:
        kinds = [e.kind for e in session.audit.events() if e.kind.startswith("main.")]
    assert kinds == ["main.pushed_outside", "main.push_acknowledged"]
