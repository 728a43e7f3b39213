"""Approval I/O: verify and audit every decision attempt, and remind reviewers before expiry.

A decision attempt is audited once however often its activity runs: `record_decision` is a local
activity, which Temporal runs again after a lost completion or a worker crash before the workflow
task completed; the row's attempt key (see `attempt_key`) turns a re-run into a read of the first
run's row.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.failures import is_connection_error
from activities.policy_gate import judge
from countersign.core.access import missing_scopes
from countersign.core.activity_refs import RECORD_APPROVAL_REQUEST, RECORD_DECISION, SEND_APPROVAL_REMINDER
from countersign.core.approvals import (
    FOUR_EYES,
    ApprovalReminder,
    Decision,
    DecisionRecord,
    RecordedApproval,
    Verdict,
    approvals_required,
    approver_refusal,
    decision_note,
    edit_policy_refusal,
    quorum_refusal,
)
from countersign.core.bounds import load_arguments_or_raw
from countersign.core.calls import CallerContext, ToolInvocation, argument_changes, call_key
from countersign.core.effects import Effect, FieldChange, arguments_effect, one_line
from countersign.core.grants import Granted, GrantScope, content_digest, grant_allowed, grant_refusal
from countersign.core.policy import PolicyCheck
from countersign.db.access import standing
from countersign.db.attempts import attempt_key, record_once
from countersign.db.chain import chain
from countersign.db.events import publish
from countersign.db.grants import mint_grant, spend_grant
from countersign.db.people import roles_of
from countersign.db.quorum import Approvals, approvals_of
from countersign.db.schema import ApprovalDecision, ApprovalRequest, Notification
from countersign.identity.proofs import Binding, ProofVerifier, args_digest, check_proof
from countersign.mcp.catalog import argument_errors, normalized
from tools.arguments import validate
from tools.drafts import drafts_named, last_editor
from tools.registry import REGISTRY, ToolContext, ToolFailure


def unresolved(request: RecordedApproval, problem: str) -> Effect:
    """The arguments as the effect of a call whose effect could not be resolved, and why."""
    summary = one_line(
        f"{request.tool}: the effect could not be resolved ({problem}); decide on the arguments"
    )
    effect = arguments_effect(request.tool, load_arguments_or_raw(request.args))
    return effect.model_copy(update={"summary": summary, "problem": problem})


def is_mcp(record: DecisionRecord) -> bool:
    """Whether the decided call is an MCP tool's (its spec snapshotted by the conversation)."""
    return record.mcp_spec is not None and record.mcp_spec.name == record.tool


def free_args(tool: str, mcp: bool) -> tuple[str, ...]:
    """The arguments a grant of `tool` does not bind (`@tool(free_args=…)`; an MCP tool's: none)."""
    registered = None if mcp else REGISTRY.get(tool)
    return registered.free_args if registered else ()


async def last_editors(session: AsyncSession, tenant_id: str, tool: str, *args: str) -> dict[int, str]:
    """Who last edited each draft a call of `tool` with any of `args` (JSON texts) sends, by draft
    id: for the four-eyes rule, each counts as a requester of the call."""
    named = sorted({draft_id for text in args for draft_id in drafts_named(tool, text)})
    found = {draft_id: await last_editor(session, tenant_id, draft_id) for draft_id in named}
    return {draft_id: editor for draft_id, editor in found.items() if editor is not None}


@dataclass(frozen=True)
class EditedCall:
    """A reviewer's edit, computed once: the validated arguments (JSON text), each argument changed
    (as asked → as approved), and what the call does with them (None: the request was never
    recorded). What the row records, the policies judge, a grant binds and the verdict carries."""

    args: str
    changes: dict[str, FieldChange]
    effect: Effect | None


@dataclass
class Attempt:
    """One decision attempt as DECISION_CHECKS read it; a check may note what a later one needs."""

    record: DecisionRecord
    proofs: ProofVerifier
    key: str  # the attempt key (countersign.db.attempts): what a proof is spent under
    request: ApprovalRequest | None  # the request as recorded (None: never recorded)
    roles: list[str] | None = None  # the approver's (None: not an active user of the tenant)
    edited: EditedCall | None = None
    granting: tuple[GrantScope, str] | None = None  # an accepted grant's scope and arguments

    @property
    def decision(self) -> Decision:
        return self.record.decision

    @property
    def approves(self) -> bool:
        return self.record.decision.decision == "approve"


DecisionCheck = Callable[[AsyncSession, Attempt], Awaitable[str | None]]


async def conversation_state(session: AsyncSession, attempt: Attempt) -> str | None:
    """The conversation's own refusal (unknown call, already decided, expired)."""
    return attempt.record.refusal


async def proven(session: AsyncSession, attempt: Attempt) -> str | None:
    """Who it is first: the proof binds this call's request, decision, arguments, effect and grant."""
    record, decision, request = attempt.record, attempt.decision, attempt.request
    return await check_proof(
        session,
        attempt.proofs,
        decision.proof,
        Binding.decision(
            record.pending_call(),
            decision.decision,
            decision.args if decision.args is not None else record.args,
            (request.effect_sha256 if request is not None else None) or "",
            decision.grant,
        ),
        decision.approver,
        datetime.now(UTC),
        attempt.key,
    )


async def approver_may_decide(session: AsyncSession, attempt: Attempt) -> str | None:
    """The approver's roles now allow deciding a call of this risk (four-eyes on the requester)."""
    record, decision = attempt.record, attempt.decision
    attempt.roles = await roles_of(session, record.tenant_id, decision.approver)
    return approver_refusal(
        decision.decision, record.risk, record.requested_by, decision.approver, attempt.roles
    )


async def counts_toward_quorum(session: AsyncSession, attempt: Attempt) -> str | None:
    """A policy's quorum: distinct approvers, never the requester, `@approvers`, no edits."""
    record = attempt.record
    if record.quorum is None:
        return None
    return quorum_refusal(
        record.quorum, attempt.decision, record.requested_by, record.approved_by, attempt.roles or []
    )


async def may_carry_grant(session: AsyncSession, attempt: Attempt) -> str | None:
    """Only an approval of a call one approver decides carries a grant."""
    if attempt.decision.grant is None:
        return None
    return grant_refusal(attempt.decision.decision, approvals_required(attempt.record.quorum))


async def not_last_editor(session: AsyncSession, attempt: Attempt) -> str | None:
    """Four-eyes for content: whoever last edited a draft the call sends (as asked, or as the
    approver's edit would have it) counts as its requester and may not approve it."""
    record, approver = attempt.record, attempt.decision.approver
    if not attempt.approves or record.risk not in FOUR_EYES:
        return None
    sent = [record.args or "{}"]
    if attempt.decision.args is not None:
        sent.append(json.dumps(attempt.decision.args))
    for draft_id, editor in (await last_editors(session, record.tenant_id, record.tool, *sent)).items():
        if editor == approver:
            return (
                f"{approver} last edited draft {draft_id} and may not approve a call that sends it "
                "(four-eyes rule)"
            )
    return None


async def requester_stands(session: AsyncSession, attempt: Attempt) -> str | None:
    """An approval of a call that can no longer run is refused, saying why: its requester was
    deactivated, or lost a scope the tool needs, since it was asked (read now, as the access gate
    reads it when the call runs). A rejection still ends the call."""
    record = attempt.record
    if not attempt.approves:
        return None
    requester = await standing(session, record.tenant_id, record.requested_by)
    if not requester.active:
        state = "deactivated" if requester.exists else "no longer a user"
        return f"{record.requested_by} is {state} in {record.tenant_id}: this call can no longer run"
    registered = None if is_mcp(record) else REGISTRY.get(record.tool)
    missing = missing_scopes(registered.scopes if registered else (), requester.scopes)
    if missing:
        return (
            f"{record.requested_by} no longer has the scope {', '.join(missing)} that {record.tool} "
            "needs: this call can no longer run"
        )
    return None


async def valid_edit(session: AsyncSession, attempt: Attempt) -> str | None:
    """Edited arguments validate as the call's did; the edit (`EditedCall`) is then computed once."""
    record, args = attempt.record, attempt.decision.args
    if args is None:
        return None
    edited, invalid = edited_arguments(record, args)
    if edited is None:
        return invalid
    effect = await edited_effect(session, attempt.request, edited)
    attempt.edited = EditedCall(args=edited, changes=argument_changes_of(record, edited), effect=effect)
    return None


async def edit_permitted(session: AsyncSession, attempt: Attempt) -> str | None:
    """An edit is a new call, judged again by the tenant's current policies (`judge`, as the model's
    call was): a forbid refuses it naming the policy, and so does a policy that would want more
    approvers, or other roles, than this decision has."""
    record, edited = attempt.record, attempt.edited
    if edited is None:
        return None
    # judged for the conversation's agent as its request recorded it (a call from before requests were
    # recorded: without one, so a condition on the agent does not match)
    agent = attempt.request.agent if attempt.request is not None else ""
    spec = record.mcp_spec if record.mcp_spec is not None and is_mcp(record) else REGISTRY[record.tool].spec()
    invocation = ToolInvocation(
        caller=CallerContext(tenant_id=record.tenant_id, user_id=record.requested_by, roles=[], agent=agent),
        workflow_id=record.workflow_id,
        conversation_id=record.conversation_id,
        run_id="",
        call_id=attempt.decision.call_id,
        tool=record.tool,
        arguments=edited.args,
    )
    judged = await judge(session, PolicyCheck(invocation=invocation, spec=spec), json.loads(edited.args))
    return edit_policy_refusal(judged, record.tool, approvals_required(record.quorum), attempt.roles or [])


async def grant_bound(session: AsyncSession, attempt: Attempt) -> str | None:
    """A grant binds the approved effect's content (the edit's, if edited): noted in
    `attempt.granting` with the approved arguments; refused when there is no such effect on record."""
    record, request, edited = attempt.record, attempt.request, attempt.edited
    if attempt.decision.grant is None:
        return None
    args = edited.args if edited is not None else record.args
    effect = edited.effect if edited is not None else None
    if edited is None and request is not None and request.effect is not None:
        effect = Effect.model_validate(request.effect)
    if request is None or args is None or effect is None:
        return "this call cannot be granted: its request or its effect is not on record"
    if effect.problem is not None:
        return f"this call cannot be granted: its effect could not be resolved ({effect.problem})"
    scope = GrantScope(
        tenant_id=record.tenant_id,
        tool=record.tool,
        requester=record.requested_by,
        agent=request.agent,
        content_sha256=content_digest(effect, free_args(record.tool, is_mcp(record))),
    )
    attempt.granting = scope, args
    return None


# In order, until the first refusal: the conversation's state, who it is (the proof), what they may
# decide, then what the decision carries (a grant, an edit) and whether the call can still run.
DECISION_CHECKS: tuple[DecisionCheck, ...] = (
    conversation_state,
    proven,
    approver_may_decide,
    counts_toward_quorum,
    may_carry_grant,
    not_last_editor,
    requester_stands,
    valid_edit,
    edit_permitted,
    grant_bound,
)


async def counted(session: AsyncSession, record: DecisionRecord) -> list[str]:
    """A quorum's approvals that count with this accepted approval: the earlier ones of people still
    active and entitled now (read from the database as the last one completes it), then this one."""
    quorum, still = record.quorum, list[str]()
    assert quorum is not None
    for person in record.approved_by:
        roles = await roles_of(session, record.tenant_id, person)
        again = Decision(call_id=record.decision.call_id, decision="approve", approver=person)
        if approver_refusal("approve", record.risk, record.requested_by, person, roles) is None and (
            quorum_refusal(quorum, again, record.requested_by, still, roles or []) is None
        ):
            still.append(person)
    return [*still, record.decision.approver]


def still_short(record: DecisionRecord, approvals: list[str] | None) -> bool:
    """An accepted approval that leaves its quorum short (`approvals`: those that count with it):
    the request stays open for the next."""
    return record.quorum is not None and approvals is not None and len(approvals) < record.quorum.approvals


async def edited_effect(session: AsyncSession, request: ApprovalRequest | None, edited: str) -> Effect | None:
    """What the call does with the approver's edited arguments, resolved now as its request's
    effect was: what the approver approves, and what the call must still resolve to when it runs
    (activities/tools.py). None when the request was never recorded. A plan that breaks rolls
    back its savepoint, not the decision: the edit's effect is then its arguments, unresolved (the
    call, resolving it when it runs, is asked again)."""
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
            return await ApprovalActivities.resolve_effect(session, recorded)
    except Exception as exc:
        if is_connection_error(exc):
            raise  # the database is out of reach: Temporal retries the activity
        activity.logger.exception("resolving the edited effect of %s failed", request.call_id)
        return unresolved(recorded, "INTERNAL_ERROR: the effect could not be resolved")


def argument_changes_of(record: DecisionRecord, edited: str) -> dict[str, FieldChange]:
    """Each argument the approver changed, as the model asked it and as approved: a native tool's
    both read through its arguments model, so a default the model left out is no change."""
    asked: dict[str, Any] = json.loads(record.args or "{}")
    tool = REGISTRY.get(record.tool)
    if tool is not None and not is_mcp(record):
        try:
            asked = validate(tool, record.args or "{}").model_dump(mode="json")
        except ToolFailure:  # checked before it was asked: only a changed validator gets here
            pass
    return argument_changes(asked, json.loads(edited))


def edited_arguments(record: DecisionRecord, args: dict[str, object]) -> tuple[str | None, str | None]:
    """(validated arguments as JSON, None) or (None, why they are invalid).

    A native tool's are parsed by its arguments model; an MCP tool's are checked, unknown keys
    refused, against the input schema the conversation snapshotted (`record.mcp_spec`), the
    same check its call passes before approval and again before the server is called. They
    are passed on unchanged, so the server receives exactly what the approver's proof binds.
    """
    spec = record.mcp_spec
    if spec is not None and is_mcp(record):
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


def decision_row(attempt: Attempt, refusal: str | None, approvals: list[str] | None) -> dict[str, Any]:
    """The `approval_decisions` row of an attempt (`refusal`: the first check's, or None)."""
    record, decision, edited = attempt.record, attempt.decision, attempt.edited
    effect = edited.effect if edited is not None else None
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
        "changes": edited and {k: c.model_dump(mode="json") for k, c in edited.changes.items()},
        "effect": effect.model_dump(mode="json") if effect is not None else None,
        "effect_sha256": effect.digest if effect is not None else None,
        "proven": refusal is None and attempt.proofs.mode == "signed",
        "counted": approvals,
    }


def decided_event(
    row: ApprovalDecision, record: DecisionRecord, approvals: Approvals | None
) -> dict[str, Any]:
    """What the conversation's readers are told of an accepted decision. A quorum's approval (with
    `approvals`, the call's standing approvals: countersign.db.quorum) names every approver so far
    and each one's reason; short of N it is pending, with `quorum`: how far it is and how many more
    are needed."""
    state = "approved" if row.decision == "approve" else "rejected"
    short = still_short(record, row.counted)
    event: dict[str, Any] = {
        "call_id": row.call_id,
        "tool": row.tool,
        "state": "pending" if short else state,
        "decided_by": row.approver,
        "reason": row.reason,
        "note": decision_note(row.approver, row.decision, row.reason, row.changes),
        "edited": bool(row.changes),
    }
    if row.counted is None or approvals is None:
        return event
    if short:
        return event | {"quorum": approvals.outcome(approvals_required(record.quorum))}
    every = [decision_note(a, "approve", approvals.reasons.get(a), None) for a in approvals.approved_by]
    return event | {"decided_by": ", ".join(approvals.approved_by), "note": "; ".join(every)}


class ApprovalActivities:
    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], proofs: ProofVerifier | None = None
    ) -> None:
        self._sessions = sessions
        self._proofs = proofs or ProofVerifier(mode="names")

    @activity.defn(name=RECORD_DECISION.name)
    async def record_decision(self, record: DecisionRecord) -> Verdict:
        """Verify the decision (DECISION_CHECKS, against the database), audit the attempt, mint its
        grant, close the request once decided, and tell the conversation's readers.

        Exactly once per attempt: the row's `attempt_key` names this activity invocation, which a
        retry or a replayed local activity shares. A re-run (or a concurrent twin) inserts nothing
        and answers from the recorded row, so it returns the verdict the first run returned even if
        the approver's roles changed in between.
        """
        key = attempt_key()
        async with self._sessions() as session, session.begin():
            request = await session.scalar(
                select(ApprovalRequest).where(
                    ApprovalRequest.conversation_id == record.conversation_id,
                    ApprovalRequest.call_id == record.decision.call_id,
                )
            )
            attempt = Attempt(record=record, proofs=self._proofs, key=key, request=request)

            async def checked() -> dict[str, Any]:
                refusal = None
                for check in DECISION_CHECKS:
                    refusal = await check(session, attempt)
                    if refusal is not None:
                        break
                approvals = None
                if refusal is None and record.quorum is not None and attempt.approves:
                    approvals = await counted(session, record)
                if refusal is None and not still_short(record, approvals):
                    await self._close(session, record, "approved" if attempt.approves else "rejected")
                return decision_row(attempt, refusal, approvals)

            row = await record_once(session, ApprovalDecision, ApprovalDecision.attempt_key, key, checked)
            await chain(session, row)  # a re-run finds it chained: nothing is appended twice
            if row.accepted and attempt.granting is not None and record.decision.grant is not None:
                await mint_grant(session, row, *attempt.granting, record.decision.grant)  # once
            if row.accepted:
                instance = record.workflow_id, record.conversation_id
                call = (record.conversation_id, row.call_id)
                event = decided_event(row, record, (await approvals_of(session, [call])).get(call))
                # a quorum's approvals short of N each have their own event (distinct approvers), so
                # the one that decides it is not taken for a retry of the first and dropped
                said = f"approved by {row.approver}" if event["state"] == "pending" else "decided"
                told = f"approval:{row.call_id}:{said}"
                await publish(session, *instance, record.tenant_id, "approval", event, told)
            return self._verdict(row, record)

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

        A live grant covering the call (countersign.core.grants: the same content as the effect just
        resolved, an approver who still stands) is spent on it, once per call (its idempotency key),
        and the request is written as approved by the grant's approver: the answer says so, and
        nobody is asked. A call asked again (`voided_by`) is never granted.

        The plan reads in the transaction that writes the request (no savepoint: it changes
        nothing). One that breaks (a bug, a statement PostgreSQL refuses) takes that transaction
        with it, a grant's use too; the request is then written in another, with the arguments as its
        effect, marked unresolved, and asked, rather than not at all."""
        try:
            async with self._sessions() as session, session.begin():
                effect = await self.resolve_effect(session, request)
                granted = await self._granted(session, request, effect)
                await self._record(session, request, effect, granted)
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
    async def _granted(session: AsyncSession, request: RecordedApproval, effect: Effect) -> Granted | None:
        """A use of a live grant covering the call, spent now (or the one spent on it before): one
        whose approved content is this call's `effect`, whose approver still stands and did not last
        edit what the call sends."""
        if request.voided_by is not None or not grant_allowed(request.approvals_required):
            return None  # asked again, or a quorum: one approver's grant never stands in for it
        if effect.problem is not None:
            return None  # what would fail now was never what a grant approved
        scope = GrantScope(
            tenant_id=request.tenant_id,
            tool=request.tool,
            requester=request.requested_by,
            agent=request.agent,
            content_sha256=content_digest(effect, free_args(request.tool, request.parameters is not None)),
        )
        return await spend_grant(
            session,
            scope,
            key=call_key(request.workflow_id, request.conversation_id, request.call_id),
            workflow_id=request.workflow_id,
            conversation_id=request.conversation_id,
            call_id=request.call_id,
            now=datetime.now(UTC),
            risk=request.risk,
            editors=(await last_editors(session, request.tenant_id, request.tool, request.args)).values(),
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

    @staticmethod
    def _verdict(row: ApprovalDecision, record: DecisionRecord) -> Verdict:
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
            return Verdict(accepted=True, approvals=row.counted)
        edited, invalid = edited_arguments(record, decision.args)
        if edited is None:  # only if validation changed between the runs: fail, never drop the edit
            raise ApplicationError(
                f"decision attempt {row.attempt_key} was accepted but its edited arguments no "
                f"longer validate: {invalid}",
                type="DecisionAttemptConflict",
                non_retryable=True,
            )
        return Verdict(accepted=True, args=edited, changes=argument_changes_of(record, edited))

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
