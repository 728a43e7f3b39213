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


def verify_bundle(manifest_raw: bytes, records: bytes) -> dict[str, Any]:
    """The manifest when the bundle is whole: the manifest signed by the key it carries, every line
    the canonical text of a record that follows the one before it, from the manifest's first
    record after its anchor to its head. Else raises Broken naming the first line that is not."""
    manifest = _manifest(manifest_raw)
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
