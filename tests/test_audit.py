"""The audit trail: complete, queryable, exportable, and any edit, removal or reorder is found."""

from __future__ import annotations

import gc
import json
from dataclasses import replace
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete, select, update

from gateway.adapters.store.rows import as_event
from gateway.adapters.store.schema import audit_events, audit_head
from gateway.api.app import create_app
from gateway.domain.audit import GENESIS, EventQuery, event_bytes, event_hash
from gateway.domain.errors import Refused
from gateway.domain.principals import GATEWAY
from gateway.domain.proposal import Decision
from gateway.services.admin import audit as audit_service
from gateway.services.change.proposals import decide, open_proposal
from gateway.services.change.runner import apply_proposal
from gateway.services.workspace import Workspace, stack_secrets

from .conftest import Clone, People, add_people, run_cli, sign_in_client


def run_one_change(ws: Workspace, people: People, tmp_path: Path) -> int:
    Clone(ws, tmp_path / "clone").branch("pg").edit("stacks/data/main.tf", '"16.3"', '"17.2"').push()
    proposal = open_proposal(ws, people.alice, "pg", "PostgreSQL 17")
    with pytest.raises(Refused):
        decide(ws, people.alice, proposal.id, Decision.APPROVE, "")
    decide(ws, people.erin, proposal.id, Decision.APPROVE, "tested on staging")
    assert apply_proposal(ws, people.alice, proposal.id).succeeded
    return proposal.id


@pytest.fixture
def audited(any_workspace: Workspace, tmp_path: Path) -> tuple[Workspace, People, int]:
    people = add_people(any_workspace)
    return any_workspace, people, run_one_change(any_workspace, people, tmp_path)


def test_the_story_of_a_change_names_who_did_what_to_which_plan(audited: tuple[Workspace, People, int]) -> None:
    ws, people, pid = audited
    story = audit_service.proposal_story(ws, people.dana, pid)
    kinds = [e.kind for e in story]
    assert kinds == ["change.requested", "proposal.opened", "commit", "plan", "approve.refused", "approval",
                     "proposal.start_apply", "apply.started", "apply.succeeded", "proposal.finish", "merged"]
    plan_event = story[3]
    approval = story[5]
    assert approval.actor == "erin"
    assert approval.payload["digests"] == {"data": plan_event.payload["digest"]}
    assert approval.payload["head_sha"] == story[2].payload["sha"]
    assert approval.payload["authenticated_by"] == "api-token"
    assert "alice requested this change" in story[4].payload["reasons"][0]
    assert story[-1].payload["applied_commit"] == {"data": approval.payload["head_sha"]}


def test_no_secret_reaches_the_trail(audited: tuple[Workspace, People, int]) -> None:
    ws, people, _ = audited
    password = stack_secrets(ws.settings, "data")["db_password"]
    exported = audit_service.export_events(audit_service.list_events(ws, people.dana), "jsonl")
    assert password not in exported


def test_filters_by_actor_stack_and_time(audited: tuple[Workspace, People, int]) -> None:
    ws, people, pid = audited
    assert {e.actor for e in audit_service.list_events(ws, people.dana, actor_name="erin")} == {"erin"}
    assert all("data" in e.stacks for e in audit_service.list_events(ws, people.dana, stack="data"))
    assert audit_service.list_events(ws, people.dana, since="2999-01-01T00:00") == []
    with pytest.raises(Exception, match="not an ISO 8601 time"):
        audit_service.list_events(ws, people.dana, since="yesterday")


def test_intact_chain_verifies(audited: tuple[Workspace, People, int]) -> None:
    ws, people, _ = audited
    count, broken = audit_service.verify_trail(ws, people.dana)
    assert broken is None and count > 20


def test_edited_event_is_found(audited: tuple[Workspace, People, int]) -> None:
    ws, people, pid = audited
    with ws.store.session() as session:
        seq = session.conn.scalar(select(audit_events.c.seq).where(audit_events.c.kind == "approval"))
        session.conn.execute(update(audit_events).where(audit_events.c.seq == seq)
                             .values(actor="alice"))
    _, broken = audit_service.verify_trail(ws, people.dana)
    assert broken is not None and broken.seq == seq and "edited" in broken.reason


def test_an_event_edited_into_json_nested_too_deep_to_read_is_named_and_leaves_the_collector_on(
        audited: tuple[Workspace, People, int]) -> None:
    """Bytes no JSON reader takes (nested past its depth) are an edit verify names, on the API as in the service, and
    the cycle collector it pauses while streaming is on again afterwards (a long-running server keeps collecting)."""
    ws, people, _ = audited
    with ws.store.session() as session:
        seq = session.conn.scalar(select(audit_events.c.seq).where(audit_events.c.kind == "approval"))
        session.conn.execute(update(audit_events).where(audit_events.c.seq == seq)
                             .values(canonical="[" * 200_000 + "]" * 200_000))
    _, broken = audit_service.verify_trail(ws, people.dana)
    assert broken is not None and broken.seq == seq and "edited" in broken.reason
    with TestClient(create_app(ws.settings, workers=0)) as client:
        answer = client.get("/api/v1/audit/verify", headers={"Authorization": f"Bearer {people.tokens['dana']}"})
    assert answer.status_code == 200 and answer.json()["intact"] is False
    assert gc.isenabled()


def test_deleted_event_is_found(audited: tuple[Workspace, People, int]) -> None:
    ws, people, _ = audited
    with ws.store.session() as session:
        seq = session.conn.scalar(select(audit_events.c.seq).where(audit_events.c.kind == "approve.refused"))
        session.conn.execute(delete(audit_events).where(audit_events.c.seq == seq))
    _, broken = audit_service.verify_trail(ws, people.dana)
    assert broken is not None and f"event {seq} is missing" in broken.reason


def test_deleting_the_newest_events_is_found(audited: tuple[Workspace, People, int]) -> None:
    ws, people, _ = audited
    with ws.store.session() as session:
        last = session.conn.scalar(select(audit_events.c.seq).order_by(audit_events.c.seq.desc()).limit(1))
        session.conn.execute(delete(audit_events).where(audit_events.c.seq == last))
    _, broken = audit_service.verify_trail(ws, people.dana)
    assert broken is not None and "newest events are missing" in broken.reason


def test_reordered_events_are_found(audited: tuple[Workspace, People, int]) -> None:
    ws, people, _ = audited
    with ws.store.session() as session:
        rows = session.conn.execute(select(audit_events).where(audit_events.c.seq.in_([5, 6]))).mappings().all()
        a, b = rows
        fields = ("canonical", "at", "actor", "actor_kind", "kind", "proposal_id", "outcome", "prev_hash", "hash")
        session.conn.execute(update(audit_events).where(audit_events.c.seq == a["seq"]).values(id="moving"))
        for row, other in ((b, a), (a, b)):  # swap two events' contents, keeping their positions
            session.conn.execute(update(audit_events).where(audit_events.c.seq == row["seq"])
                                 .values(id=other["id"], **{k: other[k] for k in fields}))
    _, broken = audit_service.verify_trail(ws, people.dana)
    assert broken is not None and broken.seq == 5


def test_a_consistent_rewrite_of_events_and_head_is_caught_by_a_kept_checkpoint(
        audited: tuple[Workspace, People, int], tmp_path: Path) -> None:
    ws, people, _ = audited
    kept = tmp_path / "checkpoint.json"
    signed = run_cli(["audit", "checkpoint"], ws.settings.home, token=people.tokens["dana"],
                     database_url=ws.settings.database_url)
    assert signed.returncode == 0, signed.stderr
    kept.write_text(signed.stdout)
    assert oct(ws.settings.signing_key_path.stat().st_mode)[-3:] == "600"  # the key is outside the database
    clean = run_cli(["audit", "verify", "--against", str(kept)], ws.settings.home, token=people.tokens["dana"],
                    database_url=ws.settings.database_url)
    assert clean.returncode == 0 and "as signed" in clean.stdout, clean.stderr

    # whoever can write the database rewrites the approval's actor and re-chains every event and the head after it
    with ws.store.session() as session:
        rows = session.conn.execute(select(audit_events).order_by(audit_events.c.seq)).mappings().all()
        prev = GENESIS
        for row in rows:
            event = as_event(row)
            if event.kind == "approval":
                event = replace(event, actor="mallory")
            event = replace(event, prev_hash=prev, hash=event_hash(prev, event.content()))
            session.conn.execute(update(audit_events).where(audit_events.c.seq == event.seq).values(
                actor=event.actor, canonical=event_bytes(event.content()).decode(), prev_hash=event.prev_hash,
                hash=event.hash))
            prev = event.hash
        session.conn.execute(update(audit_head).values(hash=prev))
    assert audit_service.verify_trail(ws, people.dana)[1] is None  # the chain alone cannot tell
    caught = run_cli(["audit", "verify", "--against", str(kept)], ws.settings.home, token=people.tokens["dana"],
                     database_url=ws.settings.database_url)
    assert caught.returncode == 1 and "was rewritten" in caught.stderr

    forged = json.loads(kept.read_text()) | {"hash": prev}  # and a checkpoint cannot be made to agree
    kept.write_text(json.dumps(forged))
    refused = run_cli(["audit", "verify", "--against", str(kept)], ws.settings.home, token=people.tokens["dana"],
                      database_url=ws.settings.database_url)
    assert refused.returncode == 1 and "signature does not verify" in refused.stderr
    exported = run_cli(["audit", "export"], ws.settings.home, token=people.tokens["dana"],
                       database_url=ws.settings.database_url)
    assert json.loads(exported.stdout.strip().splitlines()[-1])["checkpoint"]["signature"]


def test_filters_run_on_exact_addresses_prefixes_stacks_and_outcomes_and_pages_follow_on(workspace: Workspace,
                                                                                         people: People) -> None:
    with workspace.store.session() as session:
        session.audit.append(GATEWAY, "apply.succeeded", {"applied": ["aws_instance.web[0]"]}, 101, ["app"])
        session.audit.append(GATEWAY, "apply.failed", {"applied": ["aws_instance.web2"]}, 102, ["app"])
        session.audit.append(GATEWAY, "plan", {"changed": ["module.db.aws_db_instance.main"]}, 103, ["data"])
    def proposals(**filters: str) -> list[int | None]:  # the bootstrap's events name the sample's resources too
        return [e.proposal_id for e in audit_service.list_events(workspace, people.dana, **filters)
                if e.proposal_id in (101, 102, 103)]

    assert proposals(address="aws_instance.web2") == [102]  # `web2`, not `web` too
    assert proposals(address="aws_instance.web[0]") == [101]
    assert proposals(address="aws_instance.web*") == [101, 102]
    assert proposals(address="module.db.*") == [103]
    assert proposals(stack="data") == [103] and proposals(outcome="failed") == [102]
    with workspace.store.session(readonly=True) as session:  # one at a time from `after`: the same events, in order
        for query in (EventQuery(address="aws_instance.web*"), EventQuery(stack="app"), EventQuery(address="module.db.*")):
            whole = [e.seq for e in session.audit.query(query)]
            paged, after = [], 0
            while page := session.audit.query(query, after=after, limit=1):
                paged.append(page[0].seq)
                after = page[0].seq
            assert paged == whole and whole, query
    applies = audit_service.list_events(workspace, people.dana, action="apply")
    assert [e.proposal_id for e in applies if e.proposal_id] == [101, 102]
    assert all(e.kind.startswith("apply.") for e in applies)

    with TestClient(create_app(workspace.settings, workers=0)) as client:
        auth = {"Authorization": f"Bearer {people.tokens['dana']}"}
        seen, after = [], 0
        while True:
            page = client.get("/api/v1/audit/events", params={"after": after, "limit": 3}, headers=auth)
            assert page.status_code == 200
            seen += [e["seq"] for e in page.json()]
            if "X-Next-After" not in page.headers:
                break
            after = int(page.headers["X-Next-After"])
        with workspace.store.session(readonly=True) as session:
            assert seen == [e.seq for e in session.audit.events()]  # every event once, in order


def test_verify_resumes_after_the_newest_checkpoint_and_still_sees_a_rewrite_before_it(
        audited: tuple[Workspace, People, int]) -> None:
    ws, people, _ = audited
    checkpoint = audit_service.sign_checkpoint(ws, people.dana)
    with ws.store.session() as session:
        session.audit.append(GATEWAY, "note", {"text": "after the checkpoint"})
    count, broken, since = audit_service.verify_from_checkpoint(ws, people.dana)
    assert broken is None and since == checkpoint and count == 1  # only what follows it was read
    with TestClient(create_app(ws.settings, workers=0)) as client:  # the audit page does the same on every view
        sign_in_client(client, people.tokens["dana"])  # signing in is one more event after the checkpoint
        page = client.get("/audit")
    assert page.status_code == 200, page.text
    assert f"the 2 events since the checkpoint signed at {checkpoint.at} (event {checkpoint.seq}) are intact" in page.text
    with ws.store.session() as session:
        session.conn.execute(update(audit_events).where(audit_events.c.seq == checkpoint.seq)
                             .values(hash="sha256:" + "1" * 64))
    _, broken, _ = audit_service.verify_from_checkpoint(ws, people.dana)
    assert broken is not None and "no longer ends in the hash its checkpoint signed" in broken.reason
    with TestClient(create_app(ws.settings, workers=0)) as client:
        sign_in_client(client, people.tokens["dana"])
        page = client.get("/audit")
    assert f"Chain BROKEN at event {checkpoint.seq}" in page.text


def test_verify_from_a_checkpoint_sees_a_filter_column_edited_after_it(audited: tuple[Workspace, People, int]) -> None:
    ws, people, _ = audited
    audit_service.sign_checkpoint(ws, people.dana)
    with ws.store.session() as session:
        seq = session.audit.append(GATEWAY, "approval", {"by": "erin"}, 7).seq
    with ws.store.session() as session:  # moved to another proposal: the proposal's story would no longer show it
        session.conn.execute(update(audit_events).where(audit_events.c.seq == seq).values(proposal_id=8))
    count, broken, _ = audit_service.verify_from_checkpoint(ws, people.dana)
    assert broken is not None and broken.seq == seq and "edited" in broken.reason
