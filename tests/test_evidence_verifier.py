"""An evidence bundle verifies offline with the standalone verifier and nothing else, and is refused with any byte
changed; its events are proven one by one against a signed checkpoint's Merkle root (RFC 9162), its signatures are
Ed25519 checked by the verifier's own code (RFC 8032), and no secret of the change's plan is in it."""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient
from sqlalchemy import update

from gateway import evidence_verifier
from gateway.adapters.store.schema import audit_events
from gateway.api.app import create_app
from gateway.domain.audit import event_bytes, event_hash
from gateway.domain.errors import Conflict, Refused
from gateway.domain.evidence import attestation_message, bundle_bytes
from gateway.domain.principals import GATEWAY
from gateway.domain.trail_tree import BLOCK, RootBuilder, TrailTree, leaf_hash, leaves_wanted, subtree_root, verify_path
from gateway.services.admin import audit as audit_service
from gateway.services.admin.evidence import evidence_bundle, public_key
from gateway.services.admin.sign_in import link_identity
from gateway.services.change.proposals import open_proposal
from gateway.services.workspace import Workspace, stack_secrets

from .conftest import Clone, People, add_people, make_workspace, run_cli
from .test_audit import run_one_change
from .test_audit_evidence import VERIFIER, verify_offline

# RFC 8032 section 7.1, tests 1 to 3: (public key, message, signature)
RFC8032 = [
    ("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a", "",
     "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe2465"
     "5141438e7a100b"),
    ("3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c", "72",
     "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aee"
     "b00d291612bb0c00"),
    ("fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025", "af82",
     "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28d"
     "c027beceea1ec40a"),
]


@pytest.mark.parametrize("public, message, signature", RFC8032)
def test_the_verifier_checks_ed25519_as_rfc_8032_says(public: str, message: str, signature: str) -> None:
    key, text, signed = bytes.fromhex(public), bytes.fromhex(message), bytes.fromhex(signature)
    assert evidence_verifier.ed25519_valid(key, text, signed)
    assert not evidence_verifier.ed25519_valid(key, text + b"\x00", signed)
    s = int.from_bytes(signed[32:], "little") + 2 ** 252 + 27742317777372353535851937790883648493  # S + L: malleable
    assert not evidence_verifier.ed25519_valid(key, text, signed[:32] + s.to_bytes(32, "little"))
    for i in (0, 31, 32, 63):  # R's and S's bytes
        flipped = bytearray(signed)
        flipped[i] ^= 0x01
        assert not evidence_verifier.ed25519_valid(key, text, bytes(flipped))


def test_the_verifier_agrees_with_the_cryptography_package_that_signs() -> None:
    for size in (0, 1, 64, 1000, 70_000):
        key = Ed25519PrivateKey.generate()
        raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        message = os.urandom(size)
        assert evidence_verifier.ed25519_valid(raw, message, key.sign(message))
        assert not evidence_verifier.ed25519_valid(raw, message, Ed25519PrivateKey.generate().sign(message))


def test_every_leaf_of_every_tree_size_has_a_path_to_its_root() -> None:
    for size in [*range(1, 70), 255, 256, 257, 511, 512, 513, 700]:
        leaves = [leaf_hash("sha256:" + hashlib.sha256(str(i).encode()).hexdigest()) for i in range(size)]
        whole = subtree_root(leaves)
        streamed = RootBuilder()
        for leaf in leaves:
            streamed.add(leaf)
        assert streamed.root() == whole
        blocks = [subtree_root(leaves[b * BLOCK:(b + 1) * BLOCK]) for b in range(size // BLOCK)]
        for index in sorted({0, size // 2, size - 1, min(size - 1, 300)}):
            known = {i: leaves[i] for lo, hi in leaves_wanted(size, [index]) for i in range(lo, hi)}
            tree = TrailTree(size, blocks, known)  # the blocks kept, and only the leaves the path needs
            assert tree.root() == whole
            path = tree.path(index)
            assert verify_path(index, size, leaves[index], path, whole)
            assert evidence_verifier.path_leads_to(index, size, leaves[index], path, whole)  # the verifier's own
            if size > 1:
                assert not evidence_verifier.path_leads_to((index + 1) % size, size, leaves[index], path, whole)
                assert not evidence_verifier.path_leads_to(index, size, leaves[(index + 1) % size], path, whole)


def test_the_verifier_imports_the_standard_library_alone() -> None:
    tree = ast.parse(VERIFIER.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


@pytest.fixture
def bundled(tmp_path: Path) -> tuple[Workspace, People, int, bytes, str]:
    """A change to the data stack, whose plan has a secret (the database password), applied and checkpointed."""
    ws = make_workspace(tmp_path / "home")
    people = add_people(ws)
    pid = run_one_change(ws, people, tmp_path)
    audit_service.sign_checkpoint(ws, people.dana)
    yield ws, people, pid, bundle_bytes(evidence_bundle(ws, people.dana, pid)), public_key(ws)[1]
    ws.close()


# (section, a byte of it to change): every part of the bundle, its signatures, its events and their paths
def _positions(data: bytes) -> dict[str, int]:
    text = data.decode()
    bundle = json.loads(text)
    event = bundle["events"][len(bundle["events"]) // 2]

    def inside(marker: str, skip: int = 0) -> int:
        at = text.index(marker)
        return at + len(marker) + skip

    return {
        "the change's requester": inside('"requester":"', 1),
        "the story": inside('"story":[{"actor":"', 1),
        "a decision": inside('"decisions":[{"at":"', 3),
        "a plan as approved": inside('"preview":"', 2),
        "the diff": inside('"text":"diff --git', 5),
        "the apply log": inside('"apply_log":[{"applied":["', 2),
        "an event's bytes": text.index(json.dumps(event["canonical"])[1:-1]) + 30,
        "an event's hash": text.index(event["hash"]) + 20,
        "an audit path": text.index(event["path"][0]) + 12,
        "the checkpoint's root": inside('"tree_root":"sha256:', 3),
        "the checkpoint's signature": text.index(bundle["checkpoint"]["signature"]) + 4,
        "the attestation's signature": text.index(bundle["attestation"]["signature"]) + 4,
        "the time it was made": inside('"generated_at":"', 3),
        "the layout": text.index('","') + 2,
    }


def test_a_bundle_verifies_offline_and_any_changed_byte_is_refused(
        bundled: tuple[Workspace, People, int, bytes, str], tmp_path: Path) -> None:
    ws, people, pid, data, key = bundled
    checked = verify_offline(tmp_path / "as-made", data, key)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith(f"evidence of proposal {pid} (") and "VERIFIED" in checked.stdout
    for section, at in _positions(data).items():
        changed = bytearray(data)
        changed[at] = ord("#") if changed[at] != ord("#") else ord("%")
        refused = verify_offline(tmp_path / "tampered", bytes(changed), key)
        assert refused.returncode == 1, (section, refused.stdout)
        assert "REFUSED" in refused.stderr and "Traceback" not in refused.stderr, (section, refused.stderr)
    spaced = verify_offline(tmp_path / "spaced", data.replace(b'","', b'", "', 1), key)  # the same JSON, respelled
    assert spaced.returncode == 1 and "not in its canonical form" in spaced.stderr
    other = Ed25519PrivateKey.generate().public_key().public_bytes(serialization.Encoding.PEM,
                                                                   serialization.PublicFormat.SubjectPublicKeyInfo)
    stranger = verify_offline(tmp_path / "another-key", data, other.decode())
    assert stranger.returncode == 1 and "names another key than the one given" in stranger.stderr


def test_a_bundle_signed_again_by_the_gateway_key_still_cannot_change_what_the_checkpoint_proves(
        bundled: tuple[Workspace, People, int, bytes, str], tmp_path: Path) -> None:
    """Whoever holds the gateway's key today can sign any bundle, but not the checkpoint the workers signed when the
    events were written: an event changed, a plan, a decision or a story line that disagrees with its event, are
    each refused though the bundle's own signature is good."""
    ws, _, _, data, key = bundled

    def forged(change: Callable[[dict[str, Any]], None]) -> bytes:
        bundle = json.loads(data)
        change(bundle)
        unsigned = {k: v for k, v in bundle.items() if k != "attestation"}
        return bundle_bytes({**unsigned, "attestation": {"public_key": ws.signer.public_key(),
                                                         "signature": ws.signer.sign(attestation_message(unsigned))}})

    def rewritten_approval(bundle: dict[str, Any]) -> None:  # the approval's bytes, and its hash made to match
        event = next(e for e in bundle["events"] if '"kind":"approval"' in e["canonical"])
        event["canonical"] = event["canonical"].replace('"comment":"tested on staging"', '"comment":"ok"')
        event["hash"] = "sha256:" + hashlib.sha256((event["prev_hash"] + event["canonical"]).encode()).hexdigest()

    def edited_approval(bundle: dict[str, Any]) -> None:
        event = next(e for e in bundle["events"] if '"kind":"approval"' in e["canonical"])
        event["canonical"] = event["canonical"].replace('"comment":"tested on staging"', '"comment":"ok"')

    def other_plan(bundle: dict[str, Any]) -> None:
        bundle["plans"][0]["digest"] = "sha256:" + "0" * 64

    def other_approver(bundle: dict[str, Any]) -> None:
        bundle["decisions"][0]["by"] = "bob"

    def other_story(bundle: dict[str, Any]) -> None:
        bundle["story"][0]["actor"] = "mallory"

    def other_root(bundle: dict[str, Any]) -> None:
        bundle["checkpoint"]["tree_root"] = "sha256:" + "1" * 64

    for change, reason in ((rewritten_approval, "is not in the trail the checkpoint of event"),
                           (edited_approval, "does not hash to its hash"),
                           (other_plan, "is not the plan its event recorded"),
                           (other_approver, "does not say what the event says"),
                           (other_story, "the story's line for event"),
                           (other_root, "the checkpoint's signature does not verify")):
        refused = verify_offline(tmp_path / change.__name__, forged(change), key)
        assert refused.returncode == 1 and reason in refused.stderr, (change.__name__, refused.stderr)
    assert verify_offline(tmp_path / "as-signed", forged(lambda bundle: None), key).returncode == 0


def test_no_secret_of_the_plan_is_in_its_evidence(bundled: tuple[Workspace, People, int, bytes, str]) -> None:
    ws, _, _, data, _ = bundled
    password = stack_secrets(ws.settings, "data")["db_password"]
    assert password and password.encode() not in data
    plans = json.loads(data)["plans"]
    assert plans and plans[0]["stack"] == "data" and "engine_version" in plans[0]["preview"]


def test_the_same_bundle_from_the_cli_the_api_and_the_page_each_verifies(
        bundled: tuple[Workspace, People, int, bytes, str], tmp_path: Path) -> None:
    ws, people, pid, _, key = bundled
    cli = run_cli(["audit", "evidence", str(pid)], ws.settings.home, token=people.tokens["dana"])
    printed_key = run_cli(["audit", "public-key"], ws.settings.home, token=people.tokens["dana"]).stdout
    verifier = run_cli(["audit", "verifier"], ws.settings.home, token=people.tokens["dana"]).stdout
    assert verifier == VERIFIER.read_text()
    with TestClient(create_app(ws.settings, workers=0)) as client:
        api = client.get(f"/api/v1/audit/evidence/{pid}", headers={"Authorization": f"Bearer {people.tokens['dana']}"})
        unknown = client.get("/api/v1/audit/evidence/999", headers={"Authorization": f"Bearer {people.tokens['dana']}"})
        refused = client.get(f"/api/v1/audit/evidence/{pid}", headers={"Authorization": f"Bearer {people.tokens['bob']}"})
    assert unknown.status_code == 404 and "no proposal 999" in unknown.json()["detail"]
    assert refused.status_code == 403 and "bob is not an auditor" in refused.text
    for name, data, with_key in (("cli", cli.stdout.encode(), printed_key), ("api", api.content, key)):
        checked = verify_offline(tmp_path / name, data, with_key)
        assert checked.returncode == 0, (name, checked.stderr)
    assert base64.b64decode(printed_key) == serialization.load_pem_public_key(key.encode()).public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def test_a_change_newer_than_every_checkpoint_has_no_bundle_until_one_covers_it(
        bundled: tuple[Workspace, People, int, bytes, str]) -> None:
    ws, people, pid, _, _ = bundled
    with ws.store.session() as session:
        session.audit.append(GATEWAY, "note", {"text": "after the checkpoint"}, pid)
    with pytest.raises(Conflict, match=rf"the events of proposal {pid} \(up to event \d+\) are not yet covered by a "
                                       "signed checkpoint.*`gateway audit checkpoint` signs one now"):
        evidence_bundle(ws, people.dana, pid)
    audit_service.sign_checkpoint(ws, people.dana)
    assert evidence_bundle(ws, people.dana, pid)["checkpoint"]["seq"] > 0


def test_a_trail_rewritten_after_its_checkpoint_gives_no_bundle(
        bundled: tuple[Workspace, People, int, bytes, str]) -> None:
    """Whoever can write the database rewrites the approval and re-chains every event after it: the chain alone
    cannot tell, but the tree root the checkpoint signed can, and no bundle is made of the rewritten trail."""
    ws, people, pid, _, _ = bundled
    with ws.store.session() as session:
        rows = session.conn.execute(audit_events.select().order_by(audit_events.c.seq)).mappings().all()
        prev = None
        for row in rows:
            content = json.loads(row["canonical"])
            if row["kind"] == "approval":
                content["payload"]["comment"] = "rewritten"
            prev = prev or row["prev_hash"]
            digest = event_hash(prev, content)
            session.conn.execute(update(audit_events).where(audit_events.c.seq == row["seq"]).values(
                canonical=event_bytes(content).decode(), prev_hash=prev, hash=digest))
            prev = digest
    with pytest.raises(Refused, match="no longer have the tree root the checkpoint signed: the trail was rewritten"):
        evidence_bundle(ws, people.dana, pid)


def test_the_population_and_the_evidence_read_the_same_on_both_databases(any_workspace: Workspace,
                                                                        tmp_path: Path) -> None:
    """SQLite and PostgreSQL: the trail's tree blocks kept when a checkpoint is signed (here 300 events: one block),
    a population read and caught up, a bundle that verifies."""
    from gateway.services.admin.evidence import change_population, resolve_period

    ws = any_workspace
    people = add_people(ws)
    pid = run_one_change(ws, people, tmp_path)
    period = resolve_period(ws, "2000..2999")
    assert [r.proposal_id for r in change_population(ws, people.dana, period).rows] == [pid]
    with ws.store.session() as session:
        session.audit.append_many([(GATEWAY, "note", {"n": n}, None, ()) for n in range(300)])
    checkpoint = audit_service.sign_checkpoint(ws, people.dana)
    with ws.store.session(readonly=True) as session:
        assert len(session.audit.tree_blocks(10)) == checkpoint.seq // BLOCK == 1
    assert change_population(ws, people.dana, period).rows[0].outcome == "applied"  # caught up past 300 events
    checked = verify_offline(tmp_path / "offline", bundle_bytes(evidence_bundle(ws, people.dana, pid)),
                             public_key(ws)[0])
    assert checked.returncode == 0, checked.stderr
    verified = run_cli(["audit", "verify", "--against", str(_kept(tmp_path, checkpoint.to_json()))], ws.settings.home,
                       token=people.tokens["dana"], database_url=ws.settings.database_url)
    assert verified.returncode == 0 and "as signed" in verified.stdout, verified.stderr


def _kept(tmp_path: Path, checkpoint: dict[str, Any]) -> Path:
    kept = tmp_path / "checkpoint.json"
    kept.write_text(json.dumps(checkpoint))
    return kept


def test_a_decision_made_after_an_oidc_sign_in_carries_its_identity_proof(
        workspace: Workspace, people: People, clone: Clone, tmp_path: Path) -> None:
    """Bob signs in at the identity provider, which names his groups, and approves from the page: the bundle names
    how (the issuer and subject, who linked them to bob and when, the session, the groups counted), each a proven
    event."""
    from .identity_providers import FakeOidcProvider, Person
    from .test_sign_in import CLIENT_ID, CLIENT_SECRET, configure_oidc, csrf_of, sign_in

    with FakeOidcProvider(CLIENT_ID, CLIENT_SECRET, "http://testserver/auth/oidc/callback") as idp:
        configure_oidc(workspace, idp, oidc_groups_claim="groups")
        link_identity(workspace, people.admin, "bob", idp.issuer, "bob-sub")
        clone.branch("bigger").edit("stacks/app-staging/main.tf", '"t3.small"', '"t3.medium"').push()
        proposal = open_proposal(workspace, people.alice, "bigger", "more memory")
        with TestClient(create_app(workspace.settings, workers=0)) as client:
            idp.sign_in_as(Person("bob-sub", groups=["platform"]))
            assert sign_in(client)[0].status_code == 303
            form = client.get(f"/proposals/{proposal.id}").text
            head = re.search(r'id="head-sha"[^>]*>([0-9a-f]+)<', form).group(1)  # type: ignore[union-attr]
            approved = client.post(f"/proposals/{proposal.id}/decide", data={
                "csrf": csrf_of(form), "decision": "approve", "sha": head}, follow_redirects=False)
            assert approved.status_code == 303, approved.text
    applied = run_cli(["apply", str(proposal.id)], workspace.settings.home, token=people.tokens["admin"])
    assert applied.returncode == 0, applied.stderr  # as a job, whose progress is the apply log
    audit_service.sign_checkpoint(workspace, people.dana)
    bundle = evidence_bundle(workspace, people.dana, proposal.id)
    [record, job] = bundle["apply_log"]
    assert record["stack"] == "app-staging" and record["applied"] == ["aws_instance.web[0]"]
    assert job["status"] == "succeeded" and "applying stack app-staging" in job["lines"]
    [decision] = bundle["decisions"]
    assert decision["by"] == "bob" and decision["authenticated_by"] == f"oidc:{idp.issuer}"
    assert f"identity {idp.issuer} subject bob-sub linked to bob by admin" in decision["identity"]
    assert "signed in at" in decision["identity"] and "subject bob-sub" in decision["identity"]
    assert "groups counted for this decision: platform" in decision["identity"]
    kinds = {json.loads(e["canonical"])["seq"]: json.loads(e["canonical"])["kind"] for e in bundle["events"]}
    assert sorted(kinds[seq] for seq in decision["identity_events"]) == [
        "identity.linked", "principal.added", "sign_in", "sign_in.group_check"]
    checked = verify_offline(tmp_path / "offline", bundle_bytes(bundle), public_key(workspace)[0])
    assert checked.returncode == 0, checked.stderr
