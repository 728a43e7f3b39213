"""Proofs: who decided, shown by a signature instead of claimed by a name.

In signed mode (COUNTERSIGN_AUTH, or APPROVER_AUTH) a decision (approve, reject), a start, a
message, an answer, a rollback and an end count only with a proof: an Ed25519-signed JWT that the
server issues to the person it authenticated (or to the user an API token acts for), for exactly
one action. Its claims bind it to the tenant, the person (`sub`), the conversation (`wf`),
the action (`act`), what it acts on (`tgt`: a call id, `conversation`, a rollback scope) and the
SHA-256 of the canonical JSON of the exact arguments (`args`: edited ones included). A decision's
proof also names the conversation instance (`conv`: a workflow id started again is another
conversation), the tool, its risk and the nonce the conversation drew for that approval (`tool`,
`risk`, `nonce`), as the worker recorded them in `approval_requests`: the reviewer approved exactly
that call, and the workflow checks them against its own pending call. It lives
PROOF_TTL and is spent once: its id (`jti`) is recorded in PostgreSQL (`proof_checks`) where it is
accepted, and a second use is refused as a replay.

The worker holds only the public key, so nothing it runs can mint a proof. Keys come from
COUNTERSIGN_PROOF_PUBLIC_KEY / COUNTERSIGN_PROOF_PRIVATE_KEY (PEM text or a file path), else from the
key pair the embedded stack keeps in `.data/proof-keys/` (created on first use).

Verification is a pure function of the token, the public key, the clock and the binding the
verifier expects; `check_proof` adds the database: it records every check (accepted or refused,
with the reason) and spends the id.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import BaseModel, ValidationError
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.core.approvals import PendingCall
from countersign.core.bounds import loads_strict
from countersign.core.conversation_ref import ConversationRef
from countersign.core.grants import GrantTerms, grant_claim
from countersign.db.chain import chain
from countersign.db.schema import ProofCheck
from countersign.runtime.config import DATA_DIR

ApproverAuth = Literal["signed", "names"]
# Decisions (reviewers) and requesters' actions: a start and a message too (the front door).
ProofAction = Literal["approve", "reject", "answer", "rollback", "end", "start", "message", "call"]

PROOF_TTL = timedelta(minutes=2)
PROOF_AUDIENCE = "countersign-proof"
ISSUER = "countersign-inbox"
ALGORITHM = "EdDSA"
# Accepted clock skew between the inbox that issued a proof and the worker that verifies it.
LEEWAY_S = 5
MAX_TOKEN_CHARS = 4096
KEY_DIR_NAME = "proof-keys"


# --- what a proof is bound to --------------------------------------------------------------------


def canonical_json(value: Any) -> str:
    """One spelling per JSON value: sorted keys, no spaces, UTF-8 kept as is."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def args_digest(arguments: str | Mapping[str, Any] | None) -> str:
    """SHA-256 (hex) of the canonical JSON of arguments given as JSON text or as a mapping.
    Text that is not strict JSON (not JSON, a key twice, nested past the parser) is hashed as it
    is: it can then only match itself. Never raises: a lone surrogate is hashed as its code point
    (`surrogatepass`), so an approval of such arguments can still be decided, or refused."""
    if isinstance(arguments, str):
        try:
            value: Any = loads_strict(arguments)
        except (ValueError, RecursionError):
            return hashlib.sha256(arguments.encode("utf-8", "surrogatepass")).hexdigest()
    else:
        value = dict(arguments) if arguments is not None else {}
    return hashlib.sha256(canonical_json(value).encode("utf-8", "surrogatepass")).hexdigest()


class Binding(ConversationRef):
    """What one proof is for. The verifier builds the binding it expects from the conversation's own
    state (the pending call's arguments, the conversation's tenant), never from the client.

    The conversation instance is bound for a decision (with the pending call's tool, its risk and
    the approval's nonce, as the worker recorded them), an answer, a rollback and an end. A start
    and a message bind the workflow id only (`conversation_id` ""): no instance exists before a
    start, and a keyed message may start the next one."""

    action: ProofAction
    # the call id (a decision, an answer, a client's call); `conversation` for end;
    # `<scope>:<call id>` for a rollback; the agent for a start; the message id for a message
    target: str
    args_sha256: str
    tool: str = ""
    risk: str = ""
    nonce: str = ""
    # a decision: the digest of the effect the approval request recorded (countersign.core.effects),
    # what the reviewer was shown and decides; "" for a request recorded before effects
    effect_sha256: str = ""
    # a decision: the grant it makes (countersign.core.grants.grant_claim), "" for none: a grant
    # nobody's proof names cannot be added to their approval
    grant: str = ""

    @classmethod
    def decision(
        cls,
        call: PendingCall,
        decision: Literal["approve", "reject"],
        arguments: str | Mapping[str, Any] | None,
        effect_sha256: str,
        grant: GrantTerms | None = None,
    ) -> Binding:
        """A decision on a pending call, bound to the call as the worker recorded it, to the
        arguments the tool will run with (the call's own, or the approver's edit), to the effect
        the request recorded (what the reviewer saw) and to the grant the reviewer makes with it.
        Both sides take `effect_sha256` from the `approval_requests` row, never from the client."""
        return cls.at(
            call,
            action=decision,
            target=call.call_id,
            args_sha256=args_digest(arguments),
            tool=call.tool,
            risk=call.risk,
            nonce=call.nonce,
            effect_sha256=effect_sha256,
            grant=grant_claim(grant),
        )

    @classmethod
    def answer(
        cls, tenant_id: str, workflow_id: str, conversation_id: str, call_id: str, text: str
    ) -> Binding:
        return cls(
            tenant_id=tenant_id,
            workflow_id=workflow_id,
            conversation_id=conversation_id,
            action="answer",
            target=call_id,
            args_sha256=args_digest({"text": text}),
        )

    @classmethod
    def rollback(
        cls, tenant_id: str, workflow_id: str, conversation_id: str, scope: str, call_id: str | None
    ) -> Binding:
        return cls(
            tenant_id=tenant_id,
            workflow_id=workflow_id,
            conversation_id=conversation_id,
            action="rollback",
            target=f"{scope}:{call_id or ''}",
            args_sha256=args_digest({}),
        )

    @classmethod
    def start(cls, tenant_id: str, workflow_id: str, agent: str, content: Mapping[str, Any]) -> Binding:
        """A conversation's start, by the person the proof is issued to (its user): bound to the
        agent and to what the start carries (first message, limits), so none of it can be swapped."""
        return cls(
            tenant_id=tenant_id,
            workflow_id=workflow_id,
            action="start",
            target=agent,
            args_sha256=args_digest(content),
        )

    @classmethod
    def message(cls, tenant_id: str, workflow_id: str, message_id: str, text: str) -> Binding:
        """One message (by its id) with exactly this text."""
        return cls(
            tenant_id=tenant_id,
            workflow_id=workflow_id,
            action="message",
            target=message_id,
            args_sha256=args_digest({"text": text}),
        )

    @classmethod
    def call(cls, tenant_id: str, workflow_id: str, call_id: str, tool: str, arguments: str) -> Binding:
        """A client's own tool call (Countersign as an MCP server): this tool with exactly these
        arguments (their JSON text), by its id. Like a message, bound to the workflow id only."""
        return cls(
            tenant_id=tenant_id,
            workflow_id=workflow_id,
            action="call",
            target=call_id,
            tool=tool,
            args_sha256=args_digest({"arguments": arguments}),
        )

    @classmethod
    def end(cls, tenant_id: str, workflow_id: str, conversation_id: str) -> Binding:
        return cls(
            tenant_id=tenant_id,
            workflow_id=workflow_id,
            conversation_id=conversation_id,
            action="end",
            target="conversation",
            args_sha256=args_digest({}),
        )


class ProofClaims(BaseModel):
    iss: str
    aud: str
    sub: str
    tenant: str
    wf: str
    conv: str = ""
    act: ProofAction
    tgt: str
    args: str
    tool: str = ""
    risk: str = ""
    nonce: str = ""
    effect: str = ""
    grant: str = ""
    iat: int
    exp: int
    jti: str


class ProofRefused(Exception):
    """A proof that does not count; the message is the reason the audit records."""


# --- minting and verifying (pure: keys and clock are arguments) ---------------------------------


def mint_proof(
    key: Ed25519PrivateKey, user_id: str, binding: Binding, now: datetime, ttl: timedelta = PROOF_TTL
) -> str:
    claims = ProofClaims(
        iss=ISSUER,
        aud=PROOF_AUDIENCE,
        sub=user_id,
        tenant=binding.tenant_id,
        wf=binding.workflow_id,
        conv=binding.conversation_id,
        act=binding.action,
        tgt=binding.target,
        args=binding.args_sha256,
        tool=binding.tool,
        risk=binding.risk,
        nonce=binding.nonce,
        effect=binding.effect_sha256,
        grant=binding.grant,
        iat=int(now.timestamp()),
        exp=int((now + ttl).timestamp()),
        jti=uuid.uuid4().hex,
    )
    return jwt.encode(claims.model_dump(), key, algorithm=ALGORITHM)


def verify_proof(key: Ed25519PublicKey, token: str | None, expected: Binding, now: datetime) -> ProofClaims:
    """The proof's claims when it is a valid, unexpired proof for exactly `expected`; else raises
    ProofRefused with the reason. (Replays are the database's part: see `check_proof`.)"""
    if not token:
        raise ProofRefused("no proof: in signed mode a bare name does not count")
    if len(token) > MAX_TOKEN_CHARS:
        raise ProofRefused(f"proof longer than {MAX_TOKEN_CHARS} characters")
    try:
        raw = jwt.decode(
            token,
            key,
            algorithms=[ALGORITHM],
            audience=PROOF_AUDIENCE,
            issuer=ISSUER,
            leeway=LEEWAY_S,
            options={"verify_exp": False, "require": ["exp", "iat", "jti", "sub"]},
        )
        claims = ProofClaims.model_validate(raw)
    except jwt.InvalidTokenError as err:
        raise ProofRefused(f"invalid proof: {err}") from None
    except ValidationError as err:
        raise ProofRefused(f"invalid proof claims: {err.error_count()} error(s)") from None
    if now.timestamp() > claims.exp + LEEWAY_S:
        raise ProofRefused(f"proof expired at {datetime.fromtimestamp(claims.exp, now.tzinfo).isoformat()}")
    mismatches = [
        f"{what} {got!r} (expected {want!r})"
        for what, got, want in (
            ("tenant", claims.tenant, expected.tenant_id),
            ("conversation", claims.wf, expected.workflow_id),
            ("conversation instance", claims.conv, expected.conversation_id),
            ("action", claims.act, expected.action),
            ("target", claims.tgt, expected.target),
            ("tool", claims.tool, expected.tool),
            ("risk", claims.risk, expected.risk),
            ("approval nonce", claims.nonce, expected.nonce),
            ("grant", claims.grant, expected.grant),
        )
        if got != want
    ]
    if claims.args != expected.args_sha256:
        mismatches.append("arguments (their SHA-256 differs from what this proof was issued for)")
    if claims.effect != expected.effect_sha256:
        mismatches.append("effect (its SHA-256 differs from the effect this proof was issued for)")
    if mismatches:
        raise ProofRefused("proof issued for another " + "; another ".join(mismatches))
    return claims


# --- keys ------------------------------------------------------------------------------------------


def _pem(value: str) -> bytes:
    """PEM text itself, or the path of a file holding it."""
    return value.encode() if value.lstrip().startswith("-----BEGIN") else Path(value).read_bytes()


def _key_dir(data_dir: Path) -> Path:
    return data_dir / KEY_DIR_NAME


def ensure_key_pair(private: Path, public: Path) -> None:
    """Create an Ed25519 key pair at these paths unless the private key exists (the public key is
    then derived from it when missing); the private key is readable by its owner only. Two
    processes creating it at once each write a whole file and rename it into place."""
    if not private.exists():
        private.parent.mkdir(parents=True, exist_ok=True)
        tmp = private.parent / f".private-{uuid.uuid4().hex}.pem"
        tmp.write_bytes(
            Ed25519PrivateKey.generate().private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        tmp.chmod(0o600)
        os.replace(tmp, private)
    if not public.exists():
        key = serialization.load_pem_private_key(private.read_bytes(), password=None)
        public.parent.mkdir(parents=True, exist_ok=True)
        tmp = public.parent / f".public-{uuid.uuid4().hex}.pem"
        tmp.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        os.replace(tmp, public)


def _ensure_dev_keys(data_dir: Path) -> Path:
    """The embedded stack's key pair in `.data/proof-keys/`, created on first use."""
    keys = _key_dir(data_dir)
    ensure_key_pair(keys / "private.pem", keys / "public.pem")
    return keys


def load_private_key(configured: str | None, data_dir: Path = DATA_DIR) -> Ed25519PrivateKey:
    """The signing key (the inbox only): `configured` (COUNTERSIGN_PROOF_PRIVATE_KEY: PEM or a path),
    else the embedded stack's."""
    pem = _pem(configured) if configured else (_ensure_dev_keys(data_dir) / "private.pem").read_bytes()
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError("the proof signing key must be an Ed25519 private key")
    return key


def load_public_key(configured: str | None, data_dir: Path = DATA_DIR) -> Ed25519PublicKey:
    """The verifying key (the worker): `configured` (COUNTERSIGN_PROOF_PUBLIC_KEY: PEM or a path),
    else the embedded stack's."""
    pem = _pem(configured) if configured else (_ensure_dev_keys(data_dir) / "public.pem").read_bytes()
    key = serialization.load_pem_public_key(pem)
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError("the proof verifying key must be an Ed25519 public key")
    return key


def pem_pair() -> tuple[str, str]:
    """A fresh (private, public) Ed25519 key pair as PEM text."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private.decode(), public.decode()


# --- the database part: every check recorded, each proof spent once ------------------------------


class ProofVerifier(BaseModel, arbitrary_types_allowed=True):
    """What an activity needs to check proofs: the mode and, in signed mode, the public key."""

    mode: ApproverAuth
    key: Ed25519PublicKey | None = None

    @classmethod
    def for_mode(cls, mode: ApproverAuth, public_key: str | None, data_dir: Path = DATA_DIR) -> ProofVerifier:
        return cls(mode=mode, key=load_public_key(public_key, data_dir) if mode == "signed" else None)


async def check_proof(
    session: AsyncSession,
    verifier: ProofVerifier,
    token: str | None,
    expected: Binding,
    actor: str,
    now: datetime,
    attempt: str,
) -> str | None:
    """Why the action does not count (None: it does), recorded in `proof_checks` within the
    caller's transaction. In `names` mode nothing is checked or recorded (the decision is claimed).

    `actor` is the name the payload gives; the proof must have been issued to that person. An
    accepted proof's id is inserted under a unique constraint: a replay, even a concurrent one,
    finds it there and is refused.
    """
    if verifier.mode == "names":
        return None
    assert verifier.key is not None
    refusal: str | None = None
    jti: str | None = None
    subject: str | None = None
    claims_read: ProofClaims | None = None
    try:
        claims = claims_read = verify_proof(verifier.key, token, expected, now)
        subject = claims.sub
        if claims.sub != actor:
            raise ProofRefused(f"proof was issued to {claims.sub!r}, not {actor!r}")
        jti = claims.jti
    except ProofRefused as refused:
        refusal = str(refused)
    values = {
        "tenant_id": expected.tenant_id,
        "workflow_id": expected.workflow_id,
        "action": expected.action,
        "target": expected.target,
        "actor": actor,
        "subject": subject,
        "attempt_key": attempt,
    }
    evidence = {"claims": claims_read.model_dump(mode="json")} if claims_read else None
    if jti is not None:
        spent = await session.scalar(
            insert(ProofCheck)
            .values(**values, jti=jti, accepted=True)
            .on_conflict_do_nothing(index_elements=[ProofCheck.jti])
            .returning(ProofCheck)
        )
        if spent is not None:
            await chain(session, spent, evidence)
            return None
        refusal = f"proof {jti} was already used (replay)"
    check = await session.scalar(
        insert(ProofCheck).values(**values, jti=None, accepted=False, reason=refusal).returning(ProofCheck)
    )
    assert check is not None  # a plain insert returns its row
    await chain(session, check, evidence)
    return refusal
