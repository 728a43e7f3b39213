"""The audit as evidence: the hash chain's records and the signed bundle, as plain functions.

A chained record is the canonical JSON (`canonical`) of one fact of a tenant's audit: the row a
table of the audit holds after Countersign wrote it (`fact`), with who asked, who decided, on what
evidence and when (`attribution`). Its hash is SHA-256 over the previous record's hash and the
record's text, so each record commits to every record before it (`link`). PostgreSQL computes the
same hash when it appends (`audit_chain_append`, migration 0023); this module checks it.

A bundle (`audit export`) is two files in one directory: `records.jsonl`, one canonical line per
record (`{"seq", "hash", "prev_hash", "record"}`), and `manifest.json`, which names the tenant, the first
and last record, the hash before the first (the anchor) and the head, the SHA-256 of the records
file, the signing key's public half, and an Ed25519 signature over the rest of the manifest.
`verify_bundle` needs nothing but those two files: it names the first line that does not verify.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

GENESIS = "0" * 64  # the hash before a tenant's first record
RECORDS_FILE = "records.jsonl"
MANIFEST_FILE = "manifest.json"
BUNDLE_FORMAT = "countersign-audit-bundle/1"


def jsonable(value: Any) -> Any:
    """A column value as JSON: datetimes in ISO 8601 (with their offset), the rest as it is."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    return value


def canonical(value: Any) -> str:
    """The one text of a JSON value: sorted keys, no spaces, ASCII only. A record's hash is over
    this text, and a bundle's lines are exactly this text, so no byte of one can change unseen."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def link(prev_hash: str, record_text: str) -> str:
    """The hash of a record: SHA-256 over the previous record's hash, a newline and its text."""
    return hashlib.sha256(f"{prev_hash}\n{record_text}".encode()).hexdigest()


def fact_digest(fact: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical(fact).encode()).hexdigest()


def _when(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def attribution(source: str, fact: Mapping[str, Any], context: Mapping[str, Any] | None) -> dict[str, Any]:
    """Who asked (a person and the agent acting for them), who decided, on what evidence, and when,
    read from a fact of `source` (a table of the audit) and what its writer knew beside the row
    (`context`: a proof's claims)."""
    f = fact.get
    match source:
        case "tool_executions":
            return {
                "asked_by": {"human": f("user_id"), "agent": f("agent")},
                "decided_by": f("approved_by"),
                "evidence": {"outcome": f("outcome"), "reason": f("decision_reason") or f("error")},
                "at": _when(f("finished_at"), f("created_at")),
            }
        case "approval_requests":
            return {
                "asked_by": {"human": f("requested_by"), "agent": f("agent")},
                "decided_by": f("decided_by"),
                "evidence": {"args_sha256": f("args_sha256"), "effect_sha256": f("effect_sha256")},
                "at": _when(f("closed_at"), f("requested_at")),
            }
        case "approval_decisions":
            return {
                "asked_by": None,
                "decided_by": f("approver"),
                "evidence": {"decision": f("decision"), "accepted": f("accepted"), "proven": f("proven")},
                "at": f("created_at"),
            }
        case "proof_checks":
            return {
                "asked_by": None,
                "decided_by": f("actor"),
                "evidence": {"accepted": f("accepted"), "claims": (context or {}).get("claims")},
                "at": f("created_at"),
            }
        case "rollback_requests":
            return {
                "asked_by": {"human": f("requested_by"), "agent": None},
                "decided_by": None,
                "evidence": {"scope": f("scope"), "accepted": f("accepted"), "proven": f("proven")},
                "at": f("created_at"),
            }
        case "tier_changes":  # a grant ("always allow") or its refusal
            return {
                "asked_by": None,
                "decided_by": f("changed_by"),
                "evidence": {"old_tier": f("old_tier"), "new_tier": f("new_tier"), "accepted": f("accepted")},
                "at": f("created_at"),
            }
        case (
            "input_audit"
        ):  # an input to a conversation (a signal, an update, a start, a webhook), refused or let in
            return {
                "asked_by": {"human": f("actor"), "agent": None},
                "decided_by": None,
                "evidence": {"action": f("action"), "accepted": f("accepted"), "reason": f("reason")},
                "at": f("created_at"),
            }
        case "draft_edits":  # content a call may send, changed: by whom, through which path, before → after
            return {
                "asked_by": {"human": f("edited_by"), "agent": None},
                "decided_by": None,
                "evidence": {"via": f("via"), "changes": f("changes")},
                "at": f("edited_at"),
            }
        case "grants":  # "the same again, for a while": made by its approver, revoked by whoever did
            return {
                "asked_by": {"human": f("requester"), "agent": f("agent")},
                "decided_by": f("revoked_by") or f("approver"),
                "evidence": {
                    "decision_id": f("decision_id"),
                    "args_sha256": f("args_sha256"),
                    "uses_left": f("uses_left"),
                    "expires_at": f("expires_at"),
                    "revoked": f("revoked_at") is not None,
                },
                "at": _when(f("revoked_at"), f("created_at")),
            }
        case "grant_uses":  # a call a grant let run unasked, as approved by the grant's approver
            return {
                "asked_by": None,
                "decided_by": f("approver"),
                "evidence": {
                    "grant_id": f("grant_id"),
                    "decision_id": f("decision_id"),
                    "call_id": f("call_id"),
                },
                "at": f("created_at"),
            }
        case _:  # compensations
            return {
                "asked_by": None,
                "decided_by": None,
                "evidence": {"state": f("state"), "error": f("error")},
                "at": _when(f("finished_at"), f("created_at")),
            }


def record_of(
    tenant: str,
    source: str,
    source_id: str,
    fact: Mapping[str, Any],
    context: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The chained record of a fact (`fact`: the row's columns as JSON). Its place in the chain
    is not in it: the hash before it is, so it can be written before its place is known."""
    return {
        "tenant": tenant,
        "source": source,
        "source_id": source_id,
        "fact": dict(fact),
        "context": dict(context) if context else None,
        **attribution(source, fact, context),
    }


class Broken(Exception):
    """The first record that does not verify: `where` names it (line and record, or table row)."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(where, why)
        self.where, self.why = where, why

    def __str__(self) -> str:
        return f"{self.where} does not verify: {self.why}"


@dataclass(frozen=True)
class Chained:
    """A record as stored: its number, the hash before it, its text and its hash."""

    seq: int
    prev_hash: str
    text: str
    hash: str


def follows(tenant: str, c: Chained, seq: int, prev: str, where: str) -> None:
    """Raises Broken (at `where`) unless `c` is `tenant`'s record `seq`, right after `prev`."""
    if c.seq != seq:
        raise Broken(where, f"record {c.seq} stands in its place (one is missing or moved)")
    if c.prev_hash != prev:
        raise Broken(where, "it does not follow the record before it")
    if link(prev, c.text) != c.hash:
        raise Broken(where, "its hash does not match its content")
    if json.loads(c.text).get("tenant") != tenant:
        raise Broken(where, "it is another tenant's record")


def check_links(tenant: str, chained: Iterable[Chained], first_seq: int, anchor: str) -> str:
    """The head hash when `chained` (in order) is a whole chain of `tenant`'s records from
    `first_seq`, after `anchor`; else raises Broken naming the first record that is not."""
    prev, seq = anchor, first_seq
    for c in chained:
        follows(tenant, c, seq, prev, f"record {seq}")
        prev, seq = c.hash, seq + 1
    return prev


# --- the bundle ----------------------------------------------------------------------------------


def bundle_line(c: Chained) -> str:
    return canonical({"seq": c.seq, "hash": c.hash, "prev_hash": c.prev_hash, "record": json.loads(c.text)})


def public_pem(key: Ed25519PublicKey) -> str:
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()


def manifest_of(
    key: Ed25519PrivateKey,
    tenant: str,
    records: bytes,
    chained: list[Chained],
    anchor: str,
    first_seq: int,
    exported_at: datetime,
    since: datetime | None,
) -> dict[str, Any]:
    """The signed manifest of the records file `records` (the lines of `chained`)."""
    body = {
        "format": BUNDLE_FORMAT,
        "tenant": tenant,
        "exported_at": exported_at.isoformat(),
        "since": since.isoformat() if since else None,
        "first_seq": first_seq,
        "count": len(chained),
        "anchor": anchor,
        "head": chained[-1].hash if chained else anchor,
        "records_sha256": hashlib.sha256(records).hexdigest(),
        "public_key": public_pem(key.public_key()),
    }
    signature = key.sign(canonical(body).encode())
    return body | {"signature": base64.b64encode(signature).decode()}


# What verifying reads of a manifest, with its JSON type (anything else: a one-line refusal).
MANIFEST_FIELDS: dict[str, type] = {
    "tenant": str,
    "first_seq": int,
    "count": int,
    "anchor": str,
    "head": str,
    "records_sha256": str,
}


def _manifest(raw: bytes) -> dict[str, Any]:
    try:
        manifest: dict[str, Any] = json.loads(raw)
        signature = base64.b64decode(manifest.pop("signature"), validate=True)
        key = serialization.load_pem_public_key(manifest["public_key"].encode())
        if not isinstance(key, Ed25519PublicKey):
            raise Broken("the manifest", "its key is not an Ed25519 public key")
        key.verify(signature, canonical(manifest).encode())
    except Broken:
        raise
    except InvalidSignature:
        raise Broken("the manifest", "its signature does not match its content") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise Broken("the manifest", f"it is not a signed manifest ({exc})") from None
    if manifest.get("format") != BUNDLE_FORMAT:
        raise Broken("the manifest", f"unknown format {manifest.get('format')!r}")
    wrong = [name for name, kind in MANIFEST_FIELDS.items() if type(manifest.get(name)) is not kind]
    if wrong:
        raise Broken("the manifest", f"it is not a signed manifest (bad {', '.join(wrong)})")
    return manifest


def _chained_line(where: str, line: bytes) -> Chained:
    try:
        parsed = json.loads(line)
        record = parsed["record"]
        c = Chained(
            seq=parsed["seq"], prev_hash=parsed["prev_hash"], text=canonical(record), hash=parsed["hash"]
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise Broken(where, f"it is not a chained record ({exc})") from None
    if canonical(parsed).encode() != line:
        raise Broken(where, "its bytes are not the record's canonical text")
    return c


def verify_bundle(
    manifest_raw: bytes, records: bytes, origin: Ed25519PublicKey | str | None = None
) -> dict[str, Any]:
    """The manifest when the bundle is whole: the manifest signed by the key it carries, every line
    the canonical text of a record that follows the one before it, from the manifest's first
    record after its anchor to its head. Else raises Broken naming the first line that is not.

    A bundle anyone made with a key of their own is whole too: only `origin` (the deployment's
    public key, or its fingerprint) says who signed it, and a bundle signed by any other is refused."""
    manifest = _manifest(manifest_raw)
    if origin is not None:
        carried = manifest_key(manifest)
        pinned = fingerprint(origin) if isinstance(origin, Ed25519PublicKey) else origin
        if not same_fingerprint(pinned, carried):
            raise Broken(
                "the manifest",
                f"it is signed by the key {fingerprint(carried)}, not by the pinned {pinned}",
            )
    first = manifest["first_seq"]
    lines = records.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    prev, count = manifest["anchor"], 0
    for number, line in enumerate(lines, start=1):
        seq, count = first + number - 1, number
        where = f"record {seq} (line {number})"
        c = _chained_line(where, line)
        follows(manifest["tenant"], c, seq, prev, where)
        prev = c.hash
    if count < manifest["count"]:
        raise Broken(f"record {first + count}", "it is missing (the manifest counts more)")
    if count > manifest["count"] or prev != manifest["head"]:
        raise Broken(f"record {first + manifest['count']}", "the records go past the manifest's head")
    if hashlib.sha256(records).hexdigest() != manifest["records_sha256"]:
        raise Broken("the records file", "its digest is not the manifest's")
    return manifest


def bundle_tar(records: bytes, manifest: bytes) -> bytes:
    """The bundle as one tar archive of its two files (a download; `audit verify` reads it)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for name, data in ((MANIFEST_FILE, manifest), (RECORDS_FILE, records)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


# --- what never changes after the fact ---------------------------------------------------------------

# The columns a writer may change after a row's first record (a call undone, a request closed, a
# decision voided by a changed effect, a grant spent or revoked, a compensation run): every other
# column of a chained row is fixed once recorded. A row changed in SQL and re-appended with `chain()`
# links up like any record, so verifying compares each record's fixed columns with its row's first
# record, not only the row with its last record: a decision's approver rewritten bob -> eve fails.
MUTABLE: dict[str, frozenset[str]] = {
    "tool_executions": frozenset({"rolled_back", "rolled_back_at"}),
    "approval_decisions": frozenset({"voided_at", "voided"}),
    "approval_requests": frozenset({"state", "decided_by", "closed_at"}),
    "grants": frozenset({"uses_left", "revoked_at", "revoked_by"}),
    "compensations": frozenset({"state", "error", "finished_at"}),
    # a reply rated again: the new rating replaces the old one (both are in the chain)
    "reply_ratings": frozenset({"rating", "comment", "rated_via", "updated_at"}),
}
# A request asked again (its approved effect changed before the call ran) is the same row opened
# anew under a new nonce: its fixed columns start again, and the new one keeps the effect it replaced
# (`voided_effect`), which must be the effect recorded before.
EPOCH: dict[str, str] = {"approval_requests": "nonce"}


def fixed_columns(source: str, fact: Mapping[str, Any]) -> dict[str, Any]:
    """The columns of a fact of `source` that never change once recorded (see MUTABLE, EPOCH)."""
    mutable = MUTABLE.get(source, frozenset())
    return {name: value for name, value in fact.items() if name not in mutable}


def new_epoch(source: str, first: Mapping[str, Any], now: Mapping[str, Any]) -> bool:
    """Whether `now` opens a new epoch of the row whose epoch began with `first` (EPOCH)."""
    epoch = EPOCH.get(source)
    return epoch is not None and first.get(epoch) != now.get(epoch)


def fixed_change(source: str, first: Mapping[str, Any], now: Mapping[str, Any]) -> str | None:
    """Why the fact `now` cannot follow `first` (the same row's first record, or the first of its
    epoch), or None: the first fixed column whose value differs, named with both values."""
    if new_epoch(source, first, now):
        return None  # compared from its own first record on (see `reopened`)
    was, is_ = fixed_columns(source, first), fixed_columns(source, now)
    for name in sorted(was.keys() | is_.keys()):
        if was.get(name) != is_.get(name):
            first_value, now_value = canonical(was.get(name)), canonical(is_.get(name))
            return f"its {name} is not the one first recorded ({first_value} -> {now_value})"
    return None


def reopened(source: str, before: Mapping[str, Any], now: Mapping[str, Any]) -> str | None:
    """Why `now`, a new epoch of the row whose latest fact was `before`, is not an honest re-ask, or
    None: a reopened request keeps the effect it replaces as `voided_effect`."""
    epoch = EPOCH.get(source)
    if epoch is None or before.get(epoch) == now.get(epoch):
        return None
    if now.get("voided_effect") != before.get("effect"):
        return "it reopens the request without keeping the effect it replaces"
    return None


# --- keys and checkpoints --------------------------------------------------------------------------


def fingerprint(key: Ed25519PublicKey) -> str:
    """The key's fingerprint: `SHA256:` and the hex SHA-256 of its 32 raw bytes (what `audit key`
    prints and `audit verify --fingerprint` pins)."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return f"SHA256:{hashlib.sha256(raw).hexdigest()}"


def same_fingerprint(given: str, key: Ed25519PublicKey) -> bool:
    """Whether `given` (as printed, or its hex alone, in either case, colons and spaces allowed)
    names `key`."""
    digits = "".join(c for c in given.lower().removeprefix("sha256:") if c not in ": ")
    return digits == fingerprint(key).removeprefix("SHA256:")


def manifest_key(manifest: Mapping[str, Any]) -> Ed25519PublicKey:
    """The public key a verified manifest carries."""
    key = serialization.load_pem_public_key(manifest["public_key"].encode())
    assert isinstance(key, Ed25519PublicKey)  # _manifest refused any other
    return key


CHECKPOINT_FORMAT = "countersign-audit-checkpoint/1"


@dataclass(frozen=True)
class Checkpoint:
    """A tenant's chain head as the deployment signed it, kept outside the database: records
    removed from the end of the chain (with or without their rows), or rewritten from a point
    before it, no longer reach this head."""

    tenant: str
    seq: int  # 0: the chain was empty
    hash: str
    at: str  # when it was taken (ISO 8601)


def checkpoint_text(key: Ed25519PrivateKey, checkpoint: Checkpoint) -> str:
    """The checkpoint as signed JSON (one file)."""
    body = {
        "format": CHECKPOINT_FORMAT,
        "tenant": checkpoint.tenant,
        "seq": checkpoint.seq,
        "hash": checkpoint.hash,
        "at": checkpoint.at,
    }
    signature = base64.b64encode(key.sign(canonical(body).encode())).decode()
    return canonical(body | {"signature": signature}) + "\n"


def read_checkpoint(raw: bytes, key: Ed25519PublicKey) -> Checkpoint:
    """The checkpoint in `raw` when the deployment's `key` signed it; else raises Broken."""
    try:
        body: dict[str, Any] = json.loads(raw)
        signature = base64.b64decode(body.pop("signature"), validate=True)
        key.verify(signature, canonical(body).encode())
        if body.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"unknown format {body.get('format')!r}")
        return Checkpoint(tenant=body["tenant"], seq=int(body["seq"]), hash=body["hash"], at=body["at"])
    except InvalidSignature:
        raise Broken("the checkpoint", "it is not signed by the deployment's key") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise Broken("the checkpoint", f"it is not a checkpoint ({exc})") from None


def reaches(checkpoint: Checkpoint, hash_at: str | None, head_seq: int) -> None:
    """Raises Broken unless a chain whose head is record `head_seq`, and whose record numbered as the
    checkpoint's head has the hash `hash_at`, still holds that head."""
    if checkpoint.seq == 0:
        return
    if head_seq < checkpoint.seq:
        raise Broken(
            f"record {head_seq + 1}",
            f"it is missing: the checkpoint of {checkpoint.at} saw the chain reach record "
            f"{checkpoint.seq}, so records were removed from its end",
        )
    if hash_at != checkpoint.hash:
        raise Broken(
            f"record {checkpoint.seq}",
            f"it is not the record the checkpoint of {checkpoint.at} saw: the chain was rewritten up to it",
        )
