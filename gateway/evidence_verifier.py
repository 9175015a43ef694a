#!/usr/bin/env python3
"""Verify a change gateway evidence bundle offline: python3 verify_evidence.py BUNDLE --public-key KEY

It needs the bundle file, the gateway's public key (obtained apart from the bundle: `gateway audit public-key`, or a
checkpoint kept earlier) and Python 3.9 or later: nothing else, no access to the gateway or its database, no package
(Ed25519 signatures are checked here, by RFC 8032 section 5.1.7). It imports nothing from the gateway: copy this one
file anywhere. Exit 0 when the bundle verifies, 1 when it is refused (the reason is printed), 2 on a usage error.

The bundle (format change-gateway-evidence/1) is one JSON object in canonical form (keys sorted, no spaces,
UTF-8, non-ASCII characters as they are), followed by one newline:

    format        "change-gateway-evidence/1"
    change        the change's row of the population (requester, approvals, what ran, flags, ...)
    sample        the sample it was drawn in (seed, size, population), or null
    story         the events in order, each {seq, at, actor, kind, lines}: what a person reads
    decisions     each approval or rejection with how its maker signed in ({event, identity_events, ...})
    plans         per stack and plan digest: the plan as the approver saw it, secrets masked, and its plan event
    diff          the declaration's diff of what was applied {base, head, text}
    apply_log     each stack's apply: what it changed, its error, the worker's progress lines
    events        every event the above rests on, as the trail stores it: {seq, canonical, prev_hash, hash, path}
    checkpoint    the gateway's signed checkpoint covering them: {seq, hash, at, public_key, tree_root, signature}
    generated_at  when the gateway made the bundle
    attestation   {public_key, signature}: the gateway's signature over the rest of the bundle

What is checked, in order; any failure refuses the whole bundle:
 1. the file is the canonical JSON of what it holds, byte for byte (so no byte can change unseen);
 2. the checkpoint and the attestation are signed by the key given (Ed25519, raw key in base64 or a PEM);
    the checkpoint's message is the canonical JSON of {seq, hash, at, public_key, tree_root}, the attestation's the
    bytes b"change-gateway evidence bundle v1\\n" followed by the canonical JSON of the bundle without "attestation";
 3. each event hashes to its hash: SHA-256 of prev_hash (ASCII) followed by its canonical bytes (UTF-8), and its
    canonical bytes name its seq; consecutive events chain (one's prev_hash is the other's hash);
 4. each event is in the trail the checkpoint signed: its audit path (RFC 9162 section 2.1.3.2) leads from its leaf,
    SHA-256(0x00 || hash as ASCII), at index seq - 1 of a tree of checkpoint.seq leaves to the tree_root
    (nodes are SHA-256(0x01 || left || right));
 5. the documents agree with the proven events: each story line and decision names an event of the bundle with the
    same time, actor and kind; each plan's digest is its plan event's; each stack the change says it applied has an
    apply event with that commit and digest.
The events are thus proven by a checkpoint the gateway signed when they were recent, whoever holds the database now;
the documents (diff, rendered plans, apply log) by the gateway's signature when the bundle was made.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

FORMAT = "change-gateway-evidence/1"
ATTESTATION_PREFIX = b"change-gateway evidence bundle v1\n"
SPKI_ED25519 = bytes.fromhex("302a300506032b6570032100")  # the DER prefix of an Ed25519 SubjectPublicKeyInfo


class Refused(Exception):
    """The bundle does not verify; the message says where."""


# --- Ed25519 verification, RFC 8032 section 5.1 (the edwards25519 curve, extended coordinates) ---------------------

_P = 2 ** 255 - 19
_L = 2 ** 252 + 27742317777372353535851937790883648493
_D = -121665 * pow(121666, _P - 2, _P) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)
Point = Tuple[int, int, int, int]


def _add(p: Point, q: Point) -> Point:
    x1, y1, z1, t1 = p
    x2, y2, z2, t2 = q
    a, b = (y1 - x1) * (y2 - x2) % _P, (y1 + x1) * (y2 + x2) % _P
    c, d = 2 * t1 * t2 * _D % _P, 2 * z1 * z2 % _P
    e, f, g, h = b - a, d - c, d + c, b + a
    return e * f % _P, g * h % _P, f * g % _P, e * h % _P


def _multiply(scalar: int, point: Point) -> Point:
    result: Point = (0, 1, 1, 0)  # the neutral element
    while scalar:
        if scalar & 1:
            result = _add(result, point)
        point = _add(point, point)
        scalar >>= 1
    return result


def _same(p: Point, q: Point) -> bool:
    return (p[0] * q[2] - q[0] * p[2]) % _P == 0 and (p[1] * q[2] - q[1] * p[2]) % _P == 0


def _x_of(y: int, sign: int) -> Optional[int]:
    if y >= _P:
        return None
    x2 = (y * y - 1) * pow(_D * y * y + 1, _P - 2, _P) % _P
    if x2 == 0:
        return None if sign else 0
    x = pow(x2, (_P + 3) // 8, _P)
    if (x * x - x2) % _P:
        x = x * _SQRT_M1 % _P
    if (x * x - x2) % _P:
        return None
    return _P - x if (x & 1) != sign else x


def _decode(encoded: bytes) -> Optional[Point]:
    if len(encoded) != 32:
        return None
    y = int.from_bytes(encoded, "little")
    sign, y = y >> 255, y & ((1 << 255) - 1)
    x = _x_of(y, sign)
    return None if x is None else (x, y, 1, x * y % _P)


_BY = 4 * pow(5, _P - 2, _P) % _P
_B: Point = (_x_of(_BY, 0) or 0, _BY, 1, (_x_of(_BY, 0) or 0) * _BY % _P)


def ed25519_valid(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """Whether `signature` is the Ed25519 signature of `message` by `public_key` ([S]B = R + [k]A)."""
    if len(signature) != 64:
        return False
    a, r = _decode(public_key), _decode(signature[:32])
    s = int.from_bytes(signature[32:], "little")
    if a is None or r is None or s >= _L:
        return False
    k = int.from_bytes(hashlib.sha512(signature[:32] + public_key + message).digest(), "little") % _L
    return _same(_multiply(s, _B), _add(r, _multiply(k, a)))


# --- the trail: the hash chain and the Merkle tree (RFC 9162) -------------------------------------------------------


def canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _sha256_text(text: str) -> bytes:
    if not isinstance(text, str) or not text.startswith("sha256:") or len(text) != 71:
        raise Refused(f"{str(text)[:80]!r} is not a sha256: hash")
    try:
        return bytes.fromhex(text[7:])
    except ValueError:
        raise Refused(f"{text[:80]!r} is not a sha256: hash") from None


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def path_leads_to(index: int, size: int, leaf: bytes, path: Sequence[bytes], root: bytes) -> bool:
    """RFC 9162 section 2.1.3.2: the audit path of leaf `index` in a tree of `size` leaves ends in `root`."""
    if not 0 <= index < size:
        return False
    fn, sn, r = index, size - 1, leaf
    for p in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = _node(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn, sn = fn >> 1, sn >> 1
        else:
            r = _node(r, p)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and r == root


# --- the bundle ----------------------------------------------------------------------------------------------------


def read_public_key(text: str) -> bytes:
    """The raw 32-byte key from its base64 (as checkpoints name it) or a PEM SubjectPublicKeyInfo."""
    text = text.strip()
    try:
        if text.startswith("-----BEGIN PUBLIC KEY-----"):
            body = "".join(line for line in text.splitlines() if not line.startswith("-----"))
            der = base64.b64decode(body, validate=True)
            if len(der) != 44 or not der.startswith(SPKI_ED25519):
                raise Refused("the public key file is a PEM public key, but not an Ed25519 one")
            return der[12:]
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise Refused("the public key file holds neither a base64 Ed25519 key nor a PEM public key") from None
    if len(raw) != 32:
        raise Refused(f"the public key is {len(raw)} bytes; an Ed25519 key is 32")
    return raw


def _signed_by(key: bytes, claimed: Any, message: bytes, signature: Any, what: str) -> None:
    if claimed != base64.b64encode(key).decode():
        raise Refused(f"the {what} names another key than the one given ({str(claimed)[:60]})")
    try:
        raw = base64.b64decode(str(signature), validate=True)
    except (binascii.Error, ValueError):
        raise Refused(f"the {what}'s signature is not base64") from None
    if not ed25519_valid(key, message, raw):
        raise Refused(f"the {what}'s signature does not verify with the key given: it is not what was signed")


def read_bundle(data: bytes) -> Dict[str, Any]:
    try:
        bundle = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise Refused(f"the file is not a JSON bundle ({exc})") from None
    if not isinstance(bundle, dict):
        raise Refused("the file is not a JSON object")
    if canonical(bundle) + b"\n" != data:
        raise Refused("the file is not in its canonical form: a byte was changed, added or removed")
    if bundle.get("format") != FORMAT:
        raise Refused(f"the bundle's format is {str(bundle.get('format'))[:60]!r}, not {FORMAT}")
    return bundle


def check_signatures(bundle: Dict[str, Any], key: bytes) -> Dict[str, Any]:
    attestation, checkpoint = bundle.get("attestation"), bundle.get("checkpoint")
    if not isinstance(attestation, dict) or not isinstance(checkpoint, dict):
        raise Refused("the bundle has no attestation or no checkpoint")
    if set(attestation) != {"public_key", "signature"}:
        raise Refused("the attestation holds more than the key and the signature")
    rest = {k: v for k, v in bundle.items() if k != "attestation"}
    _signed_by(key, attestation.get("public_key"), ATTESTATION_PREFIX + canonical(rest), attestation.get("signature"),
               "attestation")
    if not checkpoint.get("tree_root"):
        raise Refused("the checkpoint signs no tree root: its events cannot be proven one by one")
    message = canonical({k: checkpoint.get(k) for k in ("seq", "hash", "at", "public_key", "tree_root")})
    _signed_by(key, checkpoint.get("public_key"), message, checkpoint.get("signature"), "checkpoint")
    return checkpoint


def check_events(events: Any, checkpoint: Dict[str, Any]) -> Dict[int, Dict[str, Any]]:
    """Each event hashed, chained to its neighbour in the bundle, and proven in the checkpoint's tree; their
    contents by seq."""
    size, root = checkpoint.get("seq"), _sha256_text(checkpoint.get("tree_root"))
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise Refused("the checkpoint's seq is not a positive number")
    if not isinstance(events, list) or not events:
        raise Refused("the bundle holds no events")
    proven: Dict[int, Dict[str, Any]] = {}
    previous: Optional[Tuple[int, str]] = None
    for event in events:
        seq, content = _check_event(event)
        if previous is not None and seq <= previous[0]:
            raise Refused(f"event {seq} is out of order in the bundle")
        if previous is not None and seq == previous[0] + 1 and event["prev_hash"] != previous[1]:
            raise Refused(f"event {seq} does not follow event {previous[0]}: the chain is broken")
        if seq > size:
            raise Refused(f"event {seq} is after the checkpoint (event {size}): nothing proves it")
        if seq == size and event["hash"] != checkpoint.get("hash"):
            raise Refused(f"event {seq} is the checkpoint's, but does not end in the hash it signed")
        leaf = hashlib.sha256(b"\x00" + event["hash"].encode()).digest()
        path = event.get("path")
        if not isinstance(path, list):
            raise Refused(f"event {seq} has no audit path")
        if not path_leads_to(seq - 1, size, leaf, [_sha256_text(p) for p in path], root):
            raise Refused(f"event {seq} is not in the trail the checkpoint of event {size} signed: its audit path "
                          "does not lead to the signed tree root")
        proven[seq] = content
        previous = (seq, event["hash"])
    return proven


def _check_event(event: Any) -> Tuple[int, Dict[str, Any]]:
    if not isinstance(event, dict) or not all(isinstance(event.get(k), str) for k in ("canonical", "prev_hash", "hash")):
        raise Refused("an event of the bundle lacks its canonical bytes or hashes")
    seq = event.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise Refused("an event of the bundle has no seq")
    _sha256_text(event["prev_hash"])
    body = event["canonical"].encode("utf-8")
    if "sha256:" + hashlib.sha256(event["prev_hash"].encode() + body).hexdigest() != event["hash"]:
        raise Refused(f"event {seq} does not hash to its hash: its bytes were changed")
    try:
        content = json.loads(body)
    except ValueError:
        raise Refused(f"event {seq}'s bytes are not JSON") from None
    if not isinstance(content, dict) or content.get("seq") != seq:
        raise Refused(f"event {seq}'s bytes name another event")
    return seq, content


def check_documents(bundle: Dict[str, Any], proven: Dict[int, Dict[str, Any]]) -> None:
    """What people read agrees with the proven events it names."""
    def event(seq: Any, where: str) -> Dict[str, Any]:
        if seq not in proven:
            raise Refused(f"{where} names event {seq}, which the bundle does not prove")
        return proven[seq]

    for line in bundle.get("story") or ():
        e = event(line.get("seq"), "the story")
        if (e.get("at"), e.get("actor"), e.get("kind")) != (line.get("at"), line.get("actor"), line.get("kind")):
            raise Refused(f"the story's line for event {line.get('seq')} does not say what the event says")
    for decision in bundle.get("decisions") or ():
        e = event(decision.get("event"), "a decision")
        if (e.get("actor"), e.get("kind")) != (decision.get("by"), decision.get("kind")):
            raise Refused(f"the decision of event {decision.get('event')} does not say what the event says")
        if (e.get("payload") or {}).get("head_sha") != decision.get("head_sha"):
            raise Refused(f"the decision of event {decision.get('event')} names another commit than its event")
        for seq in decision.get("identity_events") or ():
            event(seq, f"the identity of the decision of event {decision.get('event')}")
    for plan in bundle.get("plans") or ():
        e = event(plan.get("event"), f"the plan of stack {plan.get('stack')}")
        if e.get("kind") != "plan" or (e.get("payload") or {}).get("digest") != plan.get("digest"):
            raise Refused(f"the plan of stack {plan.get('stack')} is not the plan its event recorded")
    applied = {(e.get("stacks") or [None])[0]: (e.get("payload") or {}) for e in proven.values()
               if e.get("kind") == "apply.started"}
    for stack, digest in ((bundle.get("change") or {}).get("applied_digests") or {}).items():
        if stack not in applied or not any(
                e.get("kind") == "apply.started" and (e.get("stacks") or [None])[0] == stack
                and (e.get("payload") or {}).get("digest") == digest for e in proven.values()):
            raise Refused(f"the change says stack {stack} applied plan {str(digest)[:19]}, which no proven apply "
                          "event shows")


def verify(data: bytes, key_text: str) -> List[str]:
    """The report of a bundle that verifies, line by line; Refused (with the reason) otherwise."""
    key = read_public_key(key_text)
    bundle = read_bundle(data)
    checkpoint = check_signatures(bundle, key)
    proven = check_events(bundle.get("events"), checkpoint)
    check_documents(bundle, proven)
    change = bundle.get("change") or {}
    return [
        f"evidence of proposal {change.get('proposal')} ({change.get('repository')}): VERIFIED",
        f"  {len(proven)} events proven part of the trail the gateway signed at {checkpoint.get('at')} "
        f"(the checkpoint of event {checkpoint.get('seq')}, tree root {str(checkpoint.get('tree_root'))[:23]}...)",
        f"  the story, decisions, plans, diff and apply log attested by the same key when the bundle was made "
        f"({bundle.get('generated_at')}), and they agree with those events",
        f"  key: {base64.b64encode(key).decode()}",
    ]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Verify a change gateway evidence bundle offline.")
    parser.add_argument("bundle", type=Path, help="the bundle file (evidence-N.json)")
    parser.add_argument("--public-key", required=True, type=Path,
                        help="the gateway's audit public key: base64 (as `gateway audit public-key` prints it) or PEM")
    args = parser.parse_args(argv)
    try:
        data, key_text = args.bundle.read_bytes(), args.public_key.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        print(f"cannot read: {exc}", file=sys.stderr)
        return 2
    try:
        report = verify(data, key_text)
    except (AttributeError, TypeError, KeyError) as exc:  # signed, yet not shaped as the format says
        print(f"{args.bundle}: REFUSED: the bundle is not shaped as {FORMAT} says ({exc})", file=sys.stderr)
        return 1
    except Refused as exc:
        print(f"{args.bundle}: REFUSED: {exc}", file=sys.stderr)
        return 1
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
