"""What the inbox does, apart from HTTP: find the approvals a reviewer may decide, and turn a
reviewer's decision (or answer, rollback, end) into a proof-carrying update or signal.

Pending approvals are what the real worker recorded (`approval_requests`, written by an activity
when a conversation asks, closed when it is decided or expires), never what a `status` query
answers: any worker that polls a conversation's task queue could answer a query. A decision's proof
binds the call as recorded (tenant, conversation instance, tool, risk, the approval's nonce, the
arguments), and the workflow checks it against its own pending call. Who may decide is the
workflow's rule (countersign.core.approvals) on the reviewer's roles from PostgreSQL; the worker
checks it again, with the proof, where it records the decision.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import csv
import io
import json
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import BaseModel, Field
from sqlalchemy import ColumnElement, Select, and_, func, or_, select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from countersign.client.handles import refused_because
from countersign.core.approvals import Approval, Decision, PendingCall, approver_refusal
from countersign.core.authority import ADMIN
from countersign.core.bounds import MAX_REASON_CHARS, Identifier, WorkflowId, unstorable_refusal
from countersign.core.calls import Risk
from countersign.core.effects import Effect, effect_shown, effect_warnings
from countersign.core.evidence import Broken, bundle_tar
from countersign.core.grants import GrantTerms, grant_refusal
from countersign.core.messages import ChatMessage
from countersign.core.shown import Fold, Folded, argument_text, argument_warnings, folded
from countersign.db.chain import export_bundle
from countersign.db.grants import GrantRefused, grant_view, grants_of, revoke_grant
from countersign.db.instances import current_instance
from countersign.db.messages import ConversationStore
from countersign.db.people import roles_of
from countersign.db.quorum import Approvals, approvals_of
from countersign.db.schema import ApprovalDecision, ApprovalRequest, ToolExecution, User
from countersign.identity.checkpoints import write_checkpoint
from countersign.identity.proofs import Binding, mint_proof
from countersign.server.auth import Reviewer
from countersign.server.http import HttpRefusal
from tools.registry import REGISTRY
from tools.tiers import change_tenant_tier

MAX_ARGS_CHARS = 100_000
LAST_MESSAGES = 4
LIVE_FOR_S = 5.0  # a conversation Temporal said runs is taken to run this long before it is asked again
DESCRIBES_AT_ONCE = 20  # conversations asked of Temporal at a time when a listing finds many unknown
MAX_PAGE = 500  # the most calls one page lists (`?limit=` of GET /api/approvals and /api/events)
FIRST_PAGE = 50  # the inbox page shows this many cards, and this many more at each "Show more"
MAX_CURSOR_CHARS = 2000

log = logging.getLogger(__name__)


# --- what clients send (validated at the edge) -------------------------------------------------


class DecisionRequest(BaseModel, extra="forbid"):
    decision: Literal["approve", "reject"]
    reason: str | None = Field(None, max_length=MAX_REASON_CHARS)
    args: dict[str, Any] | None = None
    grant: GrantTerms | None = None  # approve only: later identical calls run unasked, for a while


class BatchItem(BaseModel, extra="forbid"):
    workflow_id: WorkflowId  # no NUL, newline or lone surrogate: names, which SQL is asked about
    call_id: Annotated[Identifier, Field(max_length=100)]


class BatchRequest(BaseModel, extra="forbid"):
    decision: Literal["approve", "reject"]
    reason: str | None = Field(None, max_length=MAX_REASON_CHARS)
    items: list[BatchItem] = Field(min_length=1, max_length=100)


class AlwaysAllowRequest(BaseModel, extra="forbid"):
    """A standing change of the tenant's tier: the client confirms it explicitly (the page asks)."""

    confirm: Literal[True]


# --- what the inbox shows ------------------------------------------------------------------------


class PendingItem(BaseModel):
    """One pending approval (the contract's fields first), with what a reviewer needs to decide,
    and what the worker recorded of it that a proof binds (tenant, instance, nonce)."""

    workflow_id: str
    call_id: str
    tool: str
    args: str  # the model's JSON text (a key twice was refused before anyone was asked)
    risk: Risk
    requested_by: str
    requested_at: str
    expires_at: str
    tenant_id: str = ""
    conversation_id: str = ""
    nonce: str = ""
    agent: str = ""
    description: str = ""
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    hints: str | None = None  # an MCP server's claims about the tool: shown, never trusted
    last_messages: list[dict[str, str]] = Field(default_factory=list)
    # What the card shows: the parsed arguments one key per line, hidden characters made visible,
    # and what could deceive a reader (look-alikes, bidi) flagged (countersign.core.shown). A long
    # line is folded (its first 2,000 characters and ` … N more characters: show all`); the rest of
    # each folded line is in `arg_folds` (`{"line": index, "rest": text}`), as for `effect_lines`.
    arg_lines: list[str] = Field(default_factory=list)
    arg_folds: list[Fold] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    # What the call will do, as the tool resolved it when the request was recorded: shown first
    # (`effect_lines`, hidden characters visible; what could deceive in it is in `warnings`), and
    # its digest is what a reviewer's proof binds (None and "" for a request from before).
    effect: Effect | None = None
    effect_digest: str = ""
    effect_lines: list[str] = Field(default_factory=list)
    effect_folds: list[Fold] = Field(default_factory=list)
    # Asked again: who approved this call before, and what it would have done then; that approval
    # was voided because what the call would do changed between the decision and its execution.
    voided_by: str | None = None
    voided_effect: Effect | None = None
    # A policy's quorum (`@approvals("N")`): how many distinct approvers, the policy, who approved
    # so far, and the card's line ("1 of 2: bob approved"; "" for a single approval).
    approvals_required: int = 1
    policy: str | None = None
    approved_by: list[str] = Field(default_factory=list)
    quorum: str = ""

    @property
    def key(self) -> str:
        return f"{self.workflow_id}/{self.call_id}"

    def as_json(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True)

    def pending_call(self) -> PendingCall:
        return PendingCall.model_validate(self.model_dump())


def item_of(
    row: ApprovalRequest, said: list[dict[str, str]], approvals: Approvals | None = None
) -> PendingItem:
    """A recorded approval request as reviewers see it (a native tool's description and schema
    from this registry, an MCP tool's from the conversation's snapshot, as recorded);
    `approvals`: a quorum's approvers so far, with their reasons (countersign.db.quorum)."""
    approvals = approvals or Approvals()
    tool = REGISTRY.get(row.tool)
    effect = Effect.model_validate(row.effect) if row.effect is not None else None
    args = folded(argument_text(row.args))
    does = effect_shown(effect) if effect else Folded(lines=[])
    return PendingItem(
        workflow_id=row.workflow_id,
        call_id=row.call_id,
        tool=row.tool,
        args=row.args,
        risk=row.risk,  # a CHECK constraint holds it to the Risk values
        requested_by=row.requested_by,
        requested_at=row.requested_at.isoformat(),
        expires_at=row.expires_at.isoformat(),
        tenant_id=row.tenant_id,
        conversation_id=row.conversation_id,
        nonce=row.nonce,
        agent=row.agent,
        description=tool.description if tool else row.description or "",
        schema=tool.spec().parameters if tool else row.parameters or {},
        hints=row.hints,
        last_messages=said,
        arg_lines=args.lines,
        arg_folds=args.folds,
        warnings=(effect_warnings(effect) if effect else []) + argument_warnings(row.args),
        effect=effect,
        effect_digest=row.effect_sha256 or "",
        effect_lines=does.lines,
        effect_folds=does.folds,
        voided_by=row.voided_by,
        voided_effect=Effect.model_validate(row.voided_effect) if row.voided_effect is not None else None,
        approvals_required=row.approvals_required,
        policy=(row.policy or {}).get("policy"),
        approved_by=approvals.approved_by,
        quorum=approvals.line(row.approvals_required),
    )


# --- which calls, in which order (a page of them) ---------------------------------------------------


@dataclass(frozen=True)
class Decidable:
    """Which pending calls a reviewer may approve, as a filter the database applies: the risks
    they may approve whoever asked, and those they may approve only when someone else asked
    (four-eyes; `user_id` is None when there are none). Derived from `approver_refusal`, which
    depends on the requester only through whether it is the approver, so the rule stays there.
    Reviewers with the same roles and no four-eyes risk share one (and one events poll)."""

    risks: frozenset[Risk]
    others_risks: frozenset[Risk]
    user_id: str | None

    @classmethod
    def of(cls, user_id: str, roles: list[str]) -> Decidable:
        someone_else = f"not {user_id}"

        def may(risk: Risk, requester: str) -> bool:
            return approver_refusal("approve", risk, requester, user_id, roles) is None

        risks = frozenset(r for r in get_args(Risk) if may(r, user_id))
        others = frozenset(r for r in get_args(Risk) if r not in risks and may(r, someone_else))
        return cls(risks=risks, others_risks=others, user_id=user_id if others else None)

    def clause(self) -> ColumnElement[bool]:
        return or_(
            ApprovalRequest.risk.in_(self.risks),
            and_(ApprovalRequest.risk.in_(self.others_risks), ApprovalRequest.requested_by != self.user_id),
        )


# The inbox's order: the soonest to expire first; ties by the call's key, so pages never overlap.
ORDER = (ApprovalRequest.expires_at, ApprovalRequest.workflow_id, ApprovalRequest.call_id)


@dataclass(frozen=True)
class Cursor:
    """Where a page ended: the last listed request's place in the inbox's ORDER. Its token (the
    `after` of the next page's URL) is opaque to clients: ids may hold any character."""

    expires_at: datetime
    workflow_id: str
    call_id: str

    @classmethod
    def of(cls, row: ApprovalRequest) -> Cursor:
        return cls(expires_at=row.expires_at, workflow_id=row.workflow_id, call_id=row.call_id)

    def token(self) -> str:
        text = json.dumps([self.expires_at.isoformat(), self.workflow_id, self.call_id])
        return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")

    @classmethod
    def parse(cls, token: str) -> Cursor:
        """The cursor a token names; ValueError for anything this server did not give."""
        if len(token) > MAX_CURSOR_CHARS:
            raise ValueError("too long")
        try:
            fields = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        except binascii.Error as err:
            raise ValueError(str(err)) from None
        if not (isinstance(fields, list) and len(fields) == 3 and all(isinstance(f, str) for f in fields)):
            raise ValueError("not a cursor")
        if unstorable_refusal(fields) is not None:  # no id PostgreSQL holds; a NUL would fail the query
            raise ValueError("not a cursor")
        expires_at = datetime.fromisoformat(fields[0])
        if expires_at.tzinfo is None:
            raise ValueError("not a cursor")
        return cls(expires_at=expires_at, workflow_id=fields[1], call_id=fields[2])


def after_cursor(statement: Select[ApprovalRequest], after: Cursor | None) -> Select[ApprovalRequest]:
    """`statement`'s requests that come after `after` in the inbox's ORDER (all when None)."""
    if after is None:
        return statement
    return statement.where(tuple_(*ORDER) > tuple_(after.expires_at, after.workflow_id, after.call_id))


@dataclass(frozen=True)
class Page:
    """The first pending calls a reviewer may decide, and how many more wait after them (a count
    of requests: one whose conversation ended unseen is counted until a page reaches it)."""

    items: list[PendingItem]
    more: int
    next: Cursor | None = None  # where the next page starts (None: nothing more waits)


def last_messages(messages: list[ChatMessage]) -> list[dict[str, str]]:
    """The conversation's latest user and assistant messages with text, newest last."""
    shown = [
        {"role": m.role, "name": m.name or m.role, "content": (m.content or "")[:500]}
        for m in messages
        if m.role in ("user", "assistant") and m.content
    ]
    return shown[-LAST_MESSAGES:]


DECISION_COLUMNS = (
    "at",
    "workflow_id",
    "call_id",
    "tool",
    "approver",
    "decision",
    "accepted",
    "proven",
    "reason",
    "model_args",
    "edited_args",
)


def decisions_csv(decisions: list[dict[str, Any]]) -> bytes:
    """`history`'s decisions as CSV, oldest first; arguments as JSON text."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(DECISION_COLUMNS)
    for d in reversed(decisions):
        writer.writerow(
            json.dumps(d[c]) if c.endswith("_args") and d[c] is not None else d[c] for c in DECISION_COLUMNS
        )
    return out.getvalue().encode()


class Inbox:
    def __init__(
        self,
        client: Client,
        sessions: async_sessionmaker[AsyncSession],
        signing_key: Ed25519PrivateKey,
        checkpoints: Path | None = None,
    ) -> None:
        self.client = client
        self._sessions = sessions
        self._checkpoints = checkpoints  # where an export also checkpoints the chain's head
        self._store = ConversationStore(sessions)
        self._key = signing_key
        # conversations (workflow id, instance) Temporal said run, when; and those it said have
        # closed, until their requests expire (a closed run never runs again)
        self._running: dict[tuple[str, str], float] = {}
        self._closed: dict[tuple[str, str], datetime] = {}

    async def roles(self, reviewer: Reviewer) -> list[str]:
        async with self._sessions() as session:
            return await roles_of(session, reviewer.tenant_id, reviewer.user_id) or []

    # --- pending approvals ---------------------------------------------------------------------

    async def page(
        self,
        tenant_id: str,
        decidable: Decidable,
        limit: int | None,
        after: Cursor | None = None,
        known: dict[str, PendingItem] | None = None,
    ) -> Page:
        """The first `limit` (None: all) pending, unexpired approvals of the tenant's conversations
        (the instance each workflow id names now) that `decidable` lets its reviewer approve and
        whose requester is still an active user (a call that can no longer run is not offered; a
        decision on it is refused with the reason), after `after`, soonest to expire first; as the
        real worker recorded them in
        `approval_requests` (never a `status` query's answer: any worker polling the task queue
        could give one); and how many more wait.

        Only the page's rows are read, asked of Temporal and given their conversation's last
        messages: a chunk of the rows still missing at a time, again after a chunk whose
        conversations had closed, so a page has no gap. Items in `known` (by key) are reused as
        they are: only a new request is asked for its conversation's latest messages."""
        known = known or {}
        pending = select(ApprovalRequest).where(
            ApprovalRequest.tenant_id == tenant_id,
            ApprovalRequest.conversation_id == current_instance(ApprovalRequest.workflow_id),
            ApprovalRequest.state == "pending",
            ApprovalRequest.expires_at > func.now(),
            decidable.clause(),
            select(User.id)
            .where(
                User.tenant_id == ApprovalRequest.tenant_id,
                User.id == ApprovalRequest.requested_by,
                User.deactivated_at.is_(None),
            )
            .exists(),
        )
        rows: list[ApprovalRequest] = []
        approvals: dict[tuple[str, str], Approvals] = {}
        while True:
            wanted = None if limit is None else limit - len(rows)
            async with self._sessions() as session, session.begin():
                chunk = list(
                    await session.scalars(after_cursor(pending, after).order_by(*ORDER).limit(wanted))
                )
                approvals |= await approvals_of(
                    session, [(r.conversation_id, r.call_id) for r in chunk if r.approvals_required > 1]
                )
                after = Cursor.of(chunk[-1]) if chunk else after
                more = 0
                if wanted is not None and len(chunk) == wanted:  # the rest, counted in the same transaction
                    rest = select(func.count()).select_from(after_cursor(pending, after).subquery())
                    more = await session.scalar(rest) or 0
            rows += await self._of_running(chunk)
            if not more or len(rows) == limit:
                break

        def approved(row: ApprovalRequest) -> Approvals:
            return approvals.get((row.conversation_id, row.call_id), Approvals())

        def listed(row: ApprovalRequest) -> PendingItem | None:
            """The item listed before for `row`, when nothing it shows has changed since."""
            item = known.get(f"{row.workflow_id}/{row.call_id}")
            now = (row.nonce, approved(row).approved_by)
            same = item is not None and (item.nonce, item.approved_by) == now
            return item if same else None

        fresh = [r for r in rows if listed(r) is None]
        said = await self._store.last_said(
            list(dict.fromkeys((r.workflow_id, r.conversation_id) for r in fresh)), LAST_MESSAGES
        )

        def new_item(row: ApprovalRequest) -> PendingItem:
            words = said.get((row.workflow_id, row.conversation_id), [])
            return item_of(row, last_messages(words), approved(row))

        return Page(
            items=[listed(row) or new_item(row) for row in rows],
            more=more,
            next=Cursor.of(rows[-1]) if more and rows else None,
        )

    async def _of_running(self, rows: list[ApprovalRequest]) -> list[ApprovalRequest]:
        """The requests whose conversation still runs. One terminated, failed or timed out while
        it waited for a reviewer never closes its requests itself (no workflow code runs then):
        Temporal's own record says which have closed (a describe, answered by the server, not by
        any worker), asked at most every LIVE_FOR_S per conversation."""
        now, clock = datetime.now(UTC), time.monotonic()
        self._closed = {k: until for k, until in self._closed.items() if until > now}
        unsure = {
            (row.workflow_id, row.conversation_id): row.expires_at
            for row in rows
            if (key := (row.workflow_id, row.conversation_id)) not in self._closed
            and clock - self._running.get(key, -LIVE_FOR_S) >= LIVE_FOR_S
        }
        at_once = asyncio.Semaphore(DESCRIBES_AT_ONCE)

        async def runs(workflow_id: str) -> bool:
            async with at_once:
                return await self._runs(workflow_id)

        answers = await asyncio.gather(*(runs(workflow_id) for workflow_id, _ in unsure))
        for (key, expires_at), running in zip(unsure.items(), answers, strict=True):
            if running:
                self._running[key] = clock
            else:
                self._running.pop(key, None)
                self._closed[key] = expires_at
        self._running = {k: at for k, at in self._running.items() if clock - at < LIVE_FOR_S}
        return [r for r in rows if (r.workflow_id, r.conversation_id) not in self._closed]

    async def _runs(self, workflow_id: str) -> bool:
        """Whether the latest run under `workflow_id` runs; when Temporal cannot say, it is listed
        (a decision on it then fails and says why)."""
        try:
            described = await self.client.get_workflow_handle(workflow_id).describe()
        except RPCError as err:
            return err.status != RPCStatusCode.NOT_FOUND
        return described.status == WorkflowExecutionStatus.RUNNING

    async def decidable(self, reviewer: Reviewer) -> Decidable:
        return Decidable.of(reviewer.user_id, await self.roles(reviewer))

    async def pending_for(
        self, reviewer: Reviewer, limit: int | None = None, after: Cursor | None = None
    ) -> Page:
        """The pending approvals `reviewer` may approve (role and four-eyes rules): the first
        `limit` after `after` (None: all of them)."""
        return await self.page(reviewer.tenant_id, await self.decidable(reviewer), limit, after)

    async def history(self, reviewer: Reviewer, limit: int | None = 50) -> list[dict[str, Any]]:
        """The tenant's latest decisions (None: all of them), refused attempts included, newest first."""
        async with self._sessions() as session:
            # an accepted edit shows next to the model's arguments (the call's audit row, once it ran)
            rows = await session.execute(
                select(ApprovalDecision, ToolExecution.args)
                .outerjoin(
                    ToolExecution,
                    (ToolExecution.workflow_id == ApprovalDecision.workflow_id)
                    & (ToolExecution.conversation_id == ApprovalDecision.conversation_id)
                    & (ToolExecution.call_id == ApprovalDecision.call_id)
                    & ApprovalDecision.accepted,
                )
                .where(ApprovalDecision.tenant_id == reviewer.tenant_id)
                .order_by(ApprovalDecision.id.desc())
                .limit(limit)
            )
            return [
                {
                    "workflow_id": r.workflow_id,
                    "call_id": r.call_id,
                    "tool": r.tool,
                    "approver": r.approver,
                    "decision": r.decision,
                    "accepted": r.accepted,
                    "proven": r.proven,
                    "reason": r.reason,
                    "edited_args": r.args,
                    "model_args": model_args if r.args is not None else None,  # JSON null reads as None
                    # an approval voided because the call's effect changed before it ran: asked again
                    "voided": r.voided_at is not None,
                    "at": r.created_at.isoformat(),
                }
                for r, model_args in rows
            ]

    # --- the audit as evidence (an admin's export) -----------------------------------------------

    async def export_audit(self, reviewer: Reviewer, form: Literal["csv", "bundle"]) -> bytes:
        """An admin's export of the tenant's audit: every decision as CSV (what `history` shows), or
        the signed bundle of its hash chain as a tar archive (countersign.core.evidence), signed with
        this server's key, which `audit verify` checks offline."""
        if ADMIN not in await self.roles(reviewer):
            raise HttpRefusal(403, "only an admin of the tenant exports its audit")
        if form == "csv":
            return decisions_csv(await self.history(reviewer, limit=None))
        async with self._sessions() as session:
            now = datetime.now(UTC)
            records, manifest = await export_bundle(session, self._key, reviewer.tenant_id, now)
            if self._checkpoints is not None:
                try:
                    await write_checkpoint(session, self._key, self._checkpoints, reviewer.tenant_id, now)
                except Broken as broken:  # the bundle is still what the chain holds; the operator is told
                    log.error("audit chain of %s: %s", reviewer.tenant_id, broken)
        return bundle_tar(records, manifest)

    # --- deciding ------------------------------------------------------------------------------

    async def recorded(self, tenant_id: str, workflow_id: str, call_id: str) -> PendingItem | None:
        """The pending call as recorded, for a card posted outside the inbox (a chat's)."""
        return await self._recorded(Reviewer(tenant_id=tenant_id, user_id=""), workflow_id, call_id)

    async def _recorded(self, reviewer: Reviewer, workflow_id: str, call_id: str) -> PendingItem | None:
        """The pending call as the worker recorded it (`approval_requests`) in the conversation its
        workflow id names now, in the reviewer's tenant; None when no such request waits."""
        async with self._sessions() as session:
            row = await session.scalar(
                select(ApprovalRequest).where(
                    ApprovalRequest.tenant_id == reviewer.tenant_id,
                    ApprovalRequest.workflow_id == workflow_id,
                    ApprovalRequest.conversation_id == current_instance(workflow_id),
                    ApprovalRequest.call_id == call_id,
                    ApprovalRequest.state == "pending",
                    ApprovalRequest.expires_at > func.now(),
                )
            )
            if row is None:
                return None
            approvals = await approvals_of(session, [(row.conversation_id, row.call_id)])
        return item_of(row, [], approvals.get((row.conversation_id, row.call_id)))

    async def _not_pending(self, workflow_id: str, call_id: str) -> HttpRefusal:
        """404, or 409 when the call of the conversation its workflow id names now was decided or ran."""
        instance = current_instance(workflow_id)
        async with self._sessions() as session:
            decided = await session.scalar(
                select(ApprovalDecision.id).where(
                    ApprovalDecision.workflow_id == workflow_id,
                    ApprovalDecision.conversation_id == instance,
                    ApprovalDecision.call_id == call_id,
                    ApprovalDecision.accepted,
                )
            )
            executed = await session.scalar(
                select(ToolExecution.outcome).where(
                    ToolExecution.workflow_id == workflow_id,
                    ToolExecution.conversation_id == instance,
                    ToolExecution.call_id == call_id,
                )
            )
        if decided is not None or executed is not None:
            return HttpRefusal(409, f"call {call_id} is no longer pending ({executed or 'decided'})")
        return HttpRefusal(404, f"no pending call {call_id} in {workflow_id}")

    async def decide(
        self,
        reviewer: Reviewer,
        workflow_id: str,
        call_id: str,
        request: DecisionRequest,
        known: PendingItem | None = None,
    ) -> Approval:
        """Check what the inbox can (tenant, pending, role, four-eyes), mint a proof bound to exactly
        this decision and these arguments, and send it through the `decide` update.

        The call is the one the real worker recorded (`approval_requests`): tool, risk, instance,
        nonce and arguments, all of which the proof binds, and which the workflow checks against
        its own pending call. `known`: that record as the tenant's open events stream last listed
        it (app.Watcher); a recorded request never changes, so it is not read again. Whether it is
        still pending is the workflow's to say where it records the decision, as it always is (a
        stale item gets 409 from there)."""
        if request.args is not None and request.decision != "approve":
            raise HttpRefusal(400, "edited arguments come only with an approval")
        if request.grant is not None and (refusal := grant_refusal(request.decision)) is not None:
            raise HttpRefusal(400, refusal)
        if request.args is not None and len(json.dumps(request.args)) > MAX_ARGS_CHARS:
            raise HttpRefusal(400, f"edited arguments longer than {MAX_ARGS_CHARS} characters")
        pending: PendingItem | None
        if known is not None and (known.workflow_id, known.call_id) == (workflow_id, call_id):
            pending, roles = known, await self.roles(reviewer)
        else:
            pending, roles = await asyncio.gather(
                self._recorded(reviewer, workflow_id, call_id), self.roles(reviewer)
            )
        if pending is None or pending.tenant_id != reviewer.tenant_id:
            raise await self._not_pending(workflow_id, call_id)
        refusal = approver_refusal(
            request.decision,
            pending.risk,
            pending.requested_by,
            reviewer.user_id,
            roles,
        )
        if refusal is not None:
            raise HttpRefusal(403, refusal)
        binding = Binding.decision(
            pending.pending_call(),
            request.decision,
            request.args if request.args is not None else pending.args,
            pending.effect_digest,  # as recorded in approval_requests: never the client's
            request.grant,
        )
        decision = Decision(
            call_id=call_id,
            decision=request.decision,
            approver=reviewer.user_id,
            reason=request.reason,
            args=request.args,
            proof=mint_proof(self._key, reviewer.user_id, binding, datetime.now(UTC)),
            grant=request.grant,
        )
        try:
            approval: Approval = await self.client.get_workflow_handle(workflow_id).execute_update(
                "decide", decision, result_type=Approval
            )
        except WorkflowUpdateFailedError as err:
            raise refused(refused_because(err)) from None
        except RPCError as err:  # a listed conversation that has ended since
            if known is None or err.status not in (
                RPCStatusCode.NOT_FOUND,
                RPCStatusCode.FAILED_PRECONDITION,
            ):
                raise
            raise await self._not_pending(workflow_id, call_id) from None
        return approval

    # --- grants ---------------------------------------------------------------------------------

    async def grants(self, reviewer: Reviewer) -> list[dict[str, Any]]:
        """The tenant's grants the reviewer may see: all of them for an admin, else those they
        made or that let their own calls run (countersign.db.grants.grants_of)."""
        async with self._sessions() as session:
            found = await grants_of(session, reviewer.tenant_id, seen_by=reviewer.user_id)
        now = datetime.now(UTC)
        return [grant_view(g, now) for g in found]

    async def revoke_grant(self, reviewer: Reviewer, grant_id: int) -> dict[str, Any]:
        """Revoke a grant of the reviewer's tenant (an admin, or the approver who made it), chained."""
        try:
            async with self._sessions() as session, session.begin():
                grant = await revoke_grant(session, grant_id, reviewer.user_id, reviewer.tenant_id)
                return grant_view(grant, datetime.now(UTC))
        except GrantRefused as refused:
            raise HttpRefusal(refused.status, str(refused)) from None

    async def always_allow(self, reviewer: Reviewer, workflow_id: str, call_id: str) -> dict[str, Any]:
        """An admin's standing "always allow this tool for this agent" from a pending call: the
        tenant's own tier (tools.tiers), for conversations started afterwards. The agent and
        tool come from the conversation, the admin role and the risk rule from the database and the
        tool's declaration; the attempt is recorded either way. The pending call is not decided."""
        pending = await self._recorded(reviewer, workflow_id, call_id)
        if pending is None:
            raise await self._not_pending(workflow_id, call_id)
        async with self._sessions() as session, session.begin():
            change = await change_tenant_tier(
                session,
                tenant_id=reviewer.tenant_id,
                agent=pending.agent,
                tool=pending.tool,
                tier="always_allow",
                changed_by=reviewer.user_id,
                via="inbox",
                workflow_id=workflow_id,
                call_id=call_id,
            )
        if not change.accepted:
            raise HttpRefusal(403, change.reason or "refused")
        return {
            "tenant_id": change.tenant_id,
            "agent": change.agent,
            "tool": change.tool,
            "old_tier": change.old_tier,
            "new_tier": change.new_tier,
            "changed_by": change.changed_by,
            "at": change.created_at.isoformat(),
            "applies_to": "conversations started from now on; this call still needs its decision",
        }


def refused(reason: str) -> HttpRefusal:
    """The HTTP status of a decision the workflow refused, from its reason."""
    if "unknown call" in reason:
        return HttpRefusal(404, reason)
    if "already" in reason or "expired" in reason:
        return HttpRefusal(409, reason)
    if "invalid" in reason or "edited arguments" in reason:
        return HttpRefusal(400, reason)
    return HttpRefusal(403, reason)
