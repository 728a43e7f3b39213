"""Approval I/O: verify and audit every decision attempt, and remind reviewers before expiry.

A decision attempt is audited once however often its activity runs: `record_decision` is a local
activity, which Temporal runs again after a lost completion or a worker crash before the workflow
task completed; the row's attempt key (see `attempt_key`) turns a re-run into a read of the first
run's row.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.failures import is_connection_error
from countersign.core.activity_refs import RECORD_APPROVAL_REQUEST, RECORD_DECISION, SEND_APPROVAL_REMINDER
from countersign.core.approvals import (
    FOUR_EYES,
    ApprovalReminder,
    DecisionRecord,
    RecordedApproval,
    Verdict,
    approvals_required,
    approver_refusal,
    decision_note,
    quorum_refusal,
)
from countersign.core.bounds import load_arguments_or_raw, loads_strict
from countersign.core.calls import CallerContext, argument_changes, call_key
from countersign.core.effects import Effect, FieldChange, arguments_effect, one_line
from countersign.core.grants import Granted, GrantScope, grant_allowed, grant_refusal, scope_digest
from countersign.db.attempts import attempt_key, record_once
from countersign.db.chain import chain
from countersign.db.events import publish
from countersign.db.grants import mint_grant, spend_grant
from countersign.db.people import roles_of
from countersign.db.schema import ApprovalDecision, ApprovalRequest, Notification
from countersign.identity.proofs import Binding, ProofVerifier, args_digest, check_proof
from countersign.mcp.catalog import argument_errors, normalized
from tools.arguments import validate
from tools.drafts import drafts_named, last_editor
from tools.registry import REGISTRY, ToolContext, ToolFailure


def grant_scope(
    tenant_id: str, tool: str, requester: str, agent: str, args: str, mcp: bool
) -> GrantScope | None:
    """What a grant for this call is scoped to, and what a grant must be scoped to to cover it:
    a native tool's arguments as its model reads them (a default left out is the default), without
    its free ones; an MCP tool's as sent. None when they do not read as an object (nothing granted)."""
    registered = None if mcp else REGISTRY.get(tool)
    try:
        values = validate(registered, args).model_dump(mode="json") if registered else loads_strict(args)
    except (ToolFailure, ValueError, RecursionError):
        return None
    if not isinstance(values, dict):
        return None
    free = registered.free_args if registered else ()
    return GrantScope(
        tenant_id=tenant_id,
        tool=tool,
        requester=requester,
        agent=agent,
        args_sha256=scope_digest(values, free),
    )


def unresolved(request: RecordedApproval, problem: str) -> Effect:
    """The arguments as the effect of a call whose effect could not be resolved, and why."""
    summary = one_line(
        f"{request.tool}: the effect could not be resolved ({problem}); decide on the arguments"
    )
    effect = arguments_effect(request.tool, load_arguments_or_raw(request.args))
    return effect.model_copy(update={"summary": summary, "problem": problem})


def pending(record: DecisionRecord) -> bool:
    """An accepted approval that leaves its quorum short: the request stays open for the next."""
    return (
        record.quorum is not None
        and record.decision.decision == "approve"
        and len(record.approved_by) + 1 < record.quorum.approvals
    )


class ApprovalActivities:
    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], proofs: ProofVerifier | None = None
    ) -> None:
        self._sessions = sessions
        self._proofs = proofs or ProofVerifier(mode="names")

    @activity.defn(name=RECORD_DECISION.name)
    async def record_decision(self, record: DecisionRecord) -> Verdict:
        """Verify the approver against the database, re-validate edited arguments, audit the attempt.

        Exactly once per attempt: the row's `attempt_key` names this activity invocation, which a
        retry or a replayed local activity shares. A re-run (or a concurrent twin) inserts nothing
        and answers from the recorded row, so it returns the verdict the first run returned even if
        the approver's roles changed in between.
        """
        decision = record.decision
        key = attempt_key()
        granting: list[tuple[GrantScope, str]] = []  # an accepted grant's scope and arguments

        async with self._sessions() as session, session.begin():

            async def attempt() -> dict[str, Any]:
                refusal = record.refusal
                if refusal is None:  # who it is first (the proof), then what they may do
                    refusal = await check_proof(
                        session,
                        self._proofs,
                        decision.proof,
                        Binding.decision(
                            record.pending_call(),
                            decision.decision,
                            decision.args if decision.args is not None else record.args,
                            await self._recorded_effect(session, record),
                            decision.grant,
                        ),
                        decision.approver,
                        datetime.now(UTC),
                        key,
                    )
                if refusal is None:
                    roles = await roles_of(session, record.tenant_id, decision.approver)
                    refusal = approver_refusal(
                        decision.decision, record.risk, record.requested_by, decision.approver, roles
                    )
                    if refusal is None and record.quorum is not None:
                        refusal = quorum_refusal(
                            record.quorum, decision, record.requested_by, record.approved_by, roles or []
                        )
                if refusal is None and decision.grant is not None:
                    refusal = grant_refusal(decision.decision, approvals_required(record.quorum))
                if refusal is None and decision.decision == "approve" and record.risk in FOUR_EYES:
                    refusal = await self._editor_refusal(session, record)
                edited, changes, effect = None, None, None
                if refusal is None and decision.args is not None:
                    edited, refusal = self._edited(record, decision.args)
                if edited is not None:
                    changes = self._changes(record, edited)
                    effect = await self._edited_effect(session, record, edited)
                if refusal is None and decision.grant is not None:
                    refusal = await self._grant_refusal(session, record, edited, granting)
                if refusal is None and not pending(record):
                    await self._close(
                        session, record, "approved" if decision.decision == "approve" else "rejected"
                    )
                return {
                    "tenant_id": record.tenant_id,
                    "workflow_id": record.workflow_id,
                    "conversation_id": record.conversation_id,
                    "call_id": decision.call_id,
                    "tool": record.tool,
                    "approver": decision.approver,
                    "decision": decision.decision,
                    "accepted": refusal is None,
                    "reason": refusal or decision.reason,
                    "args": decision.args,
                    "changes": changes and {k: c.model_dump(mode="json") for k, c in changes.items()},
                    "effect": effect.model_dump(mode="json") if effect is not None else None,
                    "effect_sha256": effect.digest if effect is not None else None,
                    "proven": refusal is None and self._proofs.mode == "signed",
                }

            row = await record_once(session, ApprovalDecision, ApprovalDecision.attempt_key, key, attempt)
            await chain(session, row)  # a re-run finds it chained: nothing is appended twice
            if row.accepted and decision.grant is not None and granting:  # a re-run finds it minted
                scope, granted_args = granting[0]
                await mint_grant(session, row, scope, granted_args, decision.grant)
            if row.accepted:
                state = "approved" if row.decision == "approve" else "rejected"
                state = "pending" if pending(record) else state  # a quorum's approval short of N
                decided = {
                    "call_id": row.call_id,
                    "tool": row.tool,
                    "state": state,
                    "decided_by": row.approver,
                    "reason": row.reason,
                    "note": decision_note(row.approver, row.decision, row.reason, row.changes),
                    "edited": bool(row.changes),
                }
                await publish(
                    session,
                    record.workflow_id,
                    record.conversation_id,
                    record.tenant_id,
                    "approval",
                    decided,
                    f"approval:{row.call_id}:decided",
                )
            return self._verdict(row, record)

    @staticmethod
    async def _grant_refusal(
        session: AsyncSession,
        record: DecisionRecord,
        edited: str | None,
        granting: list[tuple[GrantScope, str]],
    ) -> str | None:
        """Why the decision's grant cannot be scoped (None: its scope and arguments are added to
        `granting`): the agent is the recorded request's, the arguments the ones approved."""
        agent = await session.scalar(
            select(ApprovalRequest.agent).where(
                ApprovalRequest.conversation_id == record.conversation_id,
                ApprovalRequest.call_id == record.decision.call_id,
            )
        )
        args = edited or record.args
        mcp = record.mcp_spec is not None and record.mcp_spec.name == record.tool
        scope = (
            grant_scope(record.tenant_id, record.tool, record.requested_by, agent, args, mcp)
            if agent is not None and args is not None
            else None
        )
        if scope is None or args is None:
            return "this call cannot be granted: its request or its arguments are not on record"
        granting.append((scope, args))
        return None

    @staticmethod
    async def _editor_refusal(session: AsyncSession, record: DecisionRecord) -> str | None:
        """Four-eyes for content: whoever last edited a draft the call sends (as asked, or as the
        approver's edit would have it) counts as its requester and may not approve it."""
        approver, named = record.decision.approver, drafts_named(record.tool, record.args or "{}")
        if record.decision.args is not None:
            named += drafts_named(record.tool, json.dumps(record.decision.args))
        for draft_id in sorted(set(named)):
            if await last_editor(session, record.tenant_id, draft_id) == approver:
                return (
                    f"{approver} last edited draft {draft_id} and may not approve a call that sends it "
                    "(four-eyes rule)"
                )
        return None

    @classmethod
    async def _edited_effect(
        cls, session: AsyncSession, record: DecisionRecord, edited: str
    ) -> Effect | None:
        """What the call does with the approver's edited arguments, resolved now as its request's
        effect was: what the approver approves, and what the call must still resolve to when it
        runs (activities/tools.py). None when the request was never recorded. A plan that breaks
        rolls back its savepoint, not the decision: the edit's effect is then its arguments,
        unresolved (the call, resolving it when it runs, is asked again)."""
        request = await session.scalar(
            select(ApprovalRequest).where(
                ApprovalRequest.conversation_id == record.conversation_id,
                ApprovalRequest.call_id == record.decision.call_id,
            )
        )
        if request is None:
            return None
        # the request as recorded, with the edit's arguments (its quorum is in `policy`: not needed here)
        fields = {
            name: getattr(request, name)
            for name in RecordedApproval.model_fields
            if name not in ("args", "quorum")
        }
        recorded = RecordedApproval(**fields, args=edited)
        try:
            async with session.begin_nested():
                return await cls.resolve_effect(session, recorded)
        except Exception as exc:
            if is_connection_error(exc):
                raise  # the database is out of reach: Temporal retries the activity
            activity.logger.exception("resolving the edited effect of %s failed", record.decision.call_id)
            return unresolved(recorded, "INTERNAL_ERROR: the effect could not be resolved")

    @staticmethod
    async def _recorded_effect(session: AsyncSession, record: DecisionRecord) -> str:
        """The digest of the effect the request recorded: what the reviewer was shown, and what
        their proof must bind ("" for a request recorded before effects, or never recorded)."""
        digest = await session.scalar(
            select(ApprovalRequest.effect_sha256).where(
                ApprovalRequest.conversation_id == record.conversation_id,
                ApprovalRequest.call_id == record.decision.call_id,
            )
        )
        return digest or ""

    @staticmethod
    async def _close(session: AsyncSession, record: DecisionRecord, state: str) -> None:
        """The recorded request is decided: reviewers no longer see it."""
        closed = await session.scalars(
            update(ApprovalRequest)
            .where(
                ApprovalRequest.conversation_id == record.conversation_id,
                ApprovalRequest.call_id == record.decision.call_id,
            )
            .values(state=state, decided_by=record.decision.approver, closed_at=func.now())
            .returning(ApprovalRequest)
            .execution_options(populate_existing=True)
        )
        for request in closed:
            await chain(session, request)

    @activity.defn(name=RECORD_APPROVAL_REQUEST.name)
    async def record_approval_request(self, request: RecordedApproval) -> Granted | None:
        """Write what reviewers are shown and what their proofs will bind: the call as this worker's
        conversation holds it, and its effect as the tool resolves it now (once: a retry changes
        nothing, the first resolution stays what reviewers decide).

        A live grant covering the call (countersign.core.grants) is spent on it first, once per call
        (its idempotency key), and the request is written as approved by the grant's approver: the
        answer says so, and nobody is asked. A call asked again (`voided_by`) is never granted.

        The plan reads in the transaction that writes the request (no savepoint: it changes
        nothing). One that breaks (a bug, a statement PostgreSQL refuses) takes that transaction
        with it, a grant's use too; the request is then written in another, with the arguments as its
        effect, marked unresolved, and asked, rather than not at all."""
        try:
            async with self._sessions() as session, session.begin():
                granted = await self._granted(session, request)
                await self._record(session, request, await self.resolve_effect(session, request), granted)
                if granted is not None:  # the conversation's readers see it approved, by the grant
                    decided = {
                        "call_id": request.call_id,
                        "tool": request.tool,
                        "state": "approved",
                        "decided_by": granted.approver,
                        "grant_id": granted.grant_id,
                    }
                    instance = request.workflow_id, request.conversation_id
                    key = f"approval:{request.call_id}:decided"
                    await publish(session, *instance, request.tenant_id, "approval", decided, key)
                return granted
        except Exception as exc:
            if is_connection_error(exc):
                raise  # the database is out of reach: Temporal retries the activity
            activity.logger.exception("resolving the effect of %s failed (%s)", request.tool, request.call_id)
            problem = "INTERNAL_ERROR: the effect could not be resolved; the operators' log has details"
            async with self._sessions() as session, session.begin():
                await self._record(session, request, unresolved(request, problem))
            return None

    @staticmethod
    async def _granted(session: AsyncSession, request: RecordedApproval) -> Granted | None:
        """A use of a live grant covering the call, spent now (or the one spent on it before)."""
        if request.voided_by is not None or not grant_allowed(request.approvals_required):
            return None  # asked again, or a quorum: one approver's grant never stands in for it
        scope = grant_scope(
            request.tenant_id,
            request.tool,
            request.requested_by,
            request.agent,
            request.args,
            mcp=request.parameters is not None,
        )
        if scope is None:
            return None
        return await spend_grant(
            session,
            scope,
            key=call_key(request.workflow_id, request.conversation_id, request.call_id),
            workflow_id=request.workflow_id,
            conversation_id=request.conversation_id,
            call_id=request.call_id,
            now=datetime.now(UTC),
        )

    @staticmethod
    async def _record(
        session: AsyncSession, request: RecordedApproval, effect: Effect, granted: Granted | None = None
    ) -> None:
        """`granted`: the request is written decided, by the grant's approver."""
        values = request.model_dump(exclude={"parameters", "quorum"}) | {
            "parameters": request.parameters,
            "approvals_required": request.approvals_required,
            "policy": request.quorum.model_dump(mode="json", exclude_defaults=True)
            if request.quorum
            else None,
            "args_sha256": args_digest(request.args),
            "effect": effect.model_dump(mode="json"),
            "effect_sha256": effect.digest,
        }
        if granted is not None:
            values |= {"state": "approved", "decided_by": granted.approver, "closed_at": func.now()}
        statement = insert(ApprovalRequest).values(**values)
        # a call asked again (its approved effect changed before it ran) reopens its row as a new
        # request, keeping the effect approved before (`voided_effect`: what changed since); a retry
        # of the same request (the same nonce) changes nothing
        reopened = values | {
            "state": "pending",
            "decided_by": None,
            "closed_at": None,
            "voided_effect": ApprovalRequest.effect,
        }
        recorded = await session.scalar(
            statement.on_conflict_do_update(
                index_elements=[ApprovalRequest.conversation_id, ApprovalRequest.call_id],
                set_=reopened,
                where=ApprovalRequest.nonce != statement.excluded.nonce,
            )
            .returning(ApprovalRequest)
            .execution_options(populate_existing=True)
        )
        if recorded is not None:
            await chain(session, recorded)

    @staticmethod
    async def resolve_effect(session: AsyncSession, request: RecordedApproval) -> Effect:
        """What the call will do, as its tool plans it (read-only) for the requester (roles
        from the database) in `session`; an MCP tool's (`parameters` from the snapshot) is its
        arguments, not resolved."""
        tool = REGISTRY.get(request.tool)
        if tool is None or request.parameters is not None:  # an MCP tool's plan: its call, normalized
            arguments = normalized(request.parameters, load_arguments_or_raw(request.args))
            return arguments_effect(request.tool, arguments)
        try:
            args = validate(tool, request.args)
        except ToolFailure as invalid:  # validated before the request: only if validation changed since
            return unresolved(request, f"{invalid.code}: {invalid.message}")
        roles = await roles_of(session, request.tenant_id, request.requested_by)
        caller = CallerContext(
            tenant_id=request.tenant_id, user_id=request.requested_by, roles=roles or [], agent=request.agent
        )
        context = ToolContext(
            caller=caller,
            session=session,
            workflow_id=request.workflow_id,
            call_id=request.call_id,
            now=datetime.now(UTC),
            conversation_id=request.conversation_id,
            asked_at=request.requested_at,
        )
        return (await tool.plan(context, args)).effect()

    def _verdict(self, row: ApprovalDecision, record: DecisionRecord) -> Verdict:
        """The verdict a recorded attempt stands for; the same on every run of the attempt.

        Edited arguments are re-derived from the activity's input (identical on every run of the
        same invocation) with the same validation that accepted them, not from the JSONB copy.
        """
        decision = record.decision
        if (row.workflow_id, row.call_id, row.approver, row.decision) != (
            record.workflow_id,
            decision.call_id,
            decision.approver,
            decision.decision,
        ):
            raise ApplicationError(
                f"decision attempt {row.attempt_key} is recorded for another decision "
                f"({row.decision} {row.call_id} by {row.approver})",
                type="DecisionAttemptConflict",
                non_retryable=True,
            )
        if not row.accepted:
            return Verdict(accepted=False, reason=row.reason)
        if decision.args is None:
            return Verdict(accepted=True)
        edited, invalid = self._edited(record, decision.args)
        if edited is None:  # only if validation changed between the runs: fail, never drop the edit
            raise ApplicationError(
                f"decision attempt {row.attempt_key} was accepted but its edited arguments no "
                f"longer validate: {invalid}",
                type="DecisionAttemptConflict",
                non_retryable=True,
            )
        return Verdict(accepted=True, args=edited, changes=self._changes(record, edited))

    @staticmethod
    def _changes(record: DecisionRecord, edited: str) -> dict[str, FieldChange]:
        """Each argument the approver changed, as the model asked it and as approved: a native tool's
        both read through its arguments model, so a default the model left out is no change."""
        asked: dict[str, Any] = json.loads(record.args or "{}")
        tool = REGISTRY.get(record.tool)
        if tool is not None and not (record.mcp_spec is not None and record.mcp_spec.name == record.tool):
            try:
                asked = validate(tool, record.args or "{}").model_dump(mode="json")
            except ToolFailure:  # checked before it was asked: only a changed validator gets here
                pass
        return argument_changes(asked, json.loads(edited))

    @staticmethod
    def _edited(record: DecisionRecord, args: dict[str, object]) -> tuple[str | None, str | None]:
        """(validated arguments as JSON, None) or (None, why they are invalid).

        A native tool's are parsed by its arguments model; an MCP tool's are checked, unknown keys
        refused, against the input schema the conversation snapshotted (`record.mcp_spec`), the
        same check its call passes before approval and again before the server is called. They
        are passed on unchanged, so the server receives exactly what the approver's proof binds.
        """
        spec = record.mcp_spec
        if spec is not None and spec.name == record.tool:
            errors = argument_errors(spec, args)
            if errors is not None:
                return None, f"edited arguments are invalid: {errors}"
            return json.dumps(args, ensure_ascii=False), None
        tool = REGISTRY.get(record.tool)
        if tool is None:
            return None, f"no tool named {record.tool!r}"
        try:
            return validate(tool, json.dumps(args)).model_dump_json(), None
        except ToolFailure as failure:
            return None, f"edited arguments are invalid: {failure.message}"

    @activity.defn(name=SEND_APPROVAL_REMINDER.name)
    async def send_approval_reminder(self, reminder: ApprovalReminder) -> None:
        """A tenant-wide notification that a call still waits for a decision (once per call), saying
        first what it will do (the effect its request recorded)."""
        async with self._sessions() as session, session.begin():
            sent = await session.scalar(
                select(Notification.id).where(
                    Notification.workflow_id == reminder.workflow_id,
                    Notification.conversation_id == reminder.conversation_id,
                    Notification.call_id == reminder.call_id,
                    Notification.kind == "approval_reminder",
                )
            )
            if sent is None:
                summary = await session.scalar(
                    select(ApprovalRequest.effect["summary"].astext).where(
                        ApprovalRequest.conversation_id == reminder.conversation_id,
                        ApprovalRequest.call_id == reminder.call_id,
                    )
                )
                does = f"{summary}: " if summary else ""
                session.add(
                    Notification(
                        tenant_id=reminder.tenant_id,
                        user_id=None,
                        kind="approval_reminder",
                        message=(
                            f"{does}{reminder.tool} {reminder.args} waits for approval in "
                            f"{reminder.workflow_id} "
                            f"(call {reminder.call_id}); it expires at {reminder.expires_at.isoformat()}"
                        ),
                        workflow_id=reminder.workflow_id,
                        conversation_id=reminder.conversation_id,
                        call_id=reminder.call_id,
                    )
                )
