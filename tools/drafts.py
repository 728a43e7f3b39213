"""Drafts kept for later: list, read, edit and send what `draft_email` stored.

A person reaches the same functions through `countersign drafts` (list, show, edit); sending a draft is
`send_draft`, which queues it through send_email's outbox, so it waits for approval and the undo
window like any email the agent sends: there is no second way out.

A call that names a draft (`NamesDraft`) is approved on the draft's content, so every edit goes
through `edit_draft`, which the tool, the server and the CLI share: an edit is refused while a
decision on a call naming the draft is pending (the reviewer would approve content other than what
they read), only the draft's author (the user of the conversation that wrote it) or an admin may
edit it, and each edit is recorded with its diff (`draft_edits`). Whoever edited it last counts as
a requester of a call that sends it (`last_editor`, checked by `record_decision`): four-eyes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, ValidationError
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.core.authority import ADMIN
from countersign.core.effects import Effect, one_line
from countersign.core.guards import MAX_ROWS
from countersign.db.chain import chain
from countersign.db.instances import current_instance
from countersign.db.people import roles_of
from countersign.db.schema import ApprovalRequest, DraftEdit, EmailDraft, EmailOutbox, Lead
from tools.arguments import parse_arguments
from tools.effects import RowUpdate
from tools.email import (
    EmailContent,
    QueuedEmail,
    cancel_queued_email,
    email_effect,
    queued_once,
    sanitized_html,
)
from tools.registry import (
    REGISTRY,
    Plan,
    ToolArgs,
    ToolContext,
    ToolFailure,
    UndoOutcome,
    compensates,
    tool,
)
from tools.resolve import (
    Address,
    ChangeArgs,
    RowView,
    Updated,
    apply_changes,
    locked_row,
    restore_fields,
    saved,
)

DraftState = Literal["unsent", "sent", "all"]
DraftEditVia = Literal["inbox", "tool", "cli"]  # schema.DRAFT_EDIT_VIAS


class DraftDetail(RowView):
    draft_id: int = Field(validation_alias="id")
    to: str = Field(validation_alias="to_address")
    subject: str
    body: str
    html_body: str | None
    lead_id: int | None
    created_by: str
    created_at: datetime
    updated_at: datetime
    sent_outbox_id: int | None  # the email send_draft queued from it; None: not sent


class DraftSummary(BaseModel):
    draft_id: int
    to: str
    subject: str
    lead_id: int | None
    created_by: str
    updated_at: datetime
    sent_outbox_id: int | None


class DraftList(BaseModel):
    drafts: list[DraftSummary]
    count: int


class ListDraftsArgs(ToolArgs):
    state: DraftState = Field("unsent", description="unsent (default), sent or all")
    limit: int = Field(20, ge=1, le=MAX_ROWS, description="Most rows to return")


class NamesDraft(ToolArgs):
    """Arguments that name a saved draft: a call of such a tool is approved on the draft's content,
    which is frozen while the call waits for a decision (`pending_on`)."""

    draft: int = Field(ge=1, description="The draft's id (draft_id)")


class DraftArgs(NamesDraft):
    pass


class DraftChanges(ToolArgs):
    """What an edit may change (the tool's arguments; the server's `PATCH /api/drafts/{id}` body)."""

    to: Address | None = Field(None, description="New recipient (a draft about a lead stays the lead's)")
    subject: str | None = Field(
        None, min_length=1, max_length=200, pattern=r"^[^\r\n]*$", description="One line"
    )
    body: str | None = Field(None, min_length=1, max_length=20_000, description="Plain text")
    html_body: str | None = Field(
        None, max_length=100_000, description="HTML version; an empty string clears it"
    )


class UpdateDraftArgs(ChangeArgs, DraftChanges, NamesDraft):
    target: ClassVar[str] = "draft"


@dataclass(frozen=True)
class DraftEditor:
    """Who edits a draft, and through what: a user of the tenant (a person's session, or the user of
    the conversation whose agent calls `update_draft`), or the operator's CLI (`user_id` None, which
    has the database's own authority)."""

    user_id: str | None
    via: DraftEditVia


def drafts_named(tool_name: str, arguments: str) -> list[int]:
    """The draft a call of `tool_name` with `arguments` (JSON text) names, if any: the content it is
    approved on. Parsed by the tool's own arguments model, as the call itself will be."""
    declared = REGISTRY.get(tool_name)
    if declared is None or not issubclass(declared.args_model, NamesDraft):
        return []
    try:
        raw = json.loads(arguments)
        parsed = parse_arguments(declared, raw) if isinstance(raw, dict) else None
    except (ValueError, ValidationError):  # never checked, so never approved: it names nothing
        return []
    return [parsed.draft] if isinstance(parsed, NamesDraft) else []


async def pending_on(session: AsyncSession, tenant_id: str, draft_id: int) -> list[ApprovalRequest]:
    """The calls waiting for a decision (recorded, open, not expired, of a conversation instance
    still under its workflow id) that name the draft."""
    naming = [t.name for t in REGISTRY.values() if issubclass(t.args_model, NamesDraft)]
    rows = await session.scalars(
        select(ApprovalRequest).where(
            ApprovalRequest.tenant_id == tenant_id,
            ApprovalRequest.tool.in_(naming),
            ApprovalRequest.state == "pending",
            ApprovalRequest.expires_at > func.now(),
            ApprovalRequest.conversation_id == current_instance(ApprovalRequest.workflow_id),
        )
    )
    return [row for row in rows if draft_id in drafts_named(row.tool, row.args)]


async def last_editor(session: AsyncSession, tenant_id: str, draft_id: int) -> str | None:
    """The user who edited the draft last (None: nobody since it was written, or the CLI)."""
    return await session.scalar(
        select(DraftEdit.edited_by)
        .where(DraftEdit.tenant_id == tenant_id, DraftEdit.draft_id == draft_id)
        .order_by(DraftEdit.id.desc())
        .limit(1)
    )


async def check_editor(session: AsyncSession, draft: EmailDraft, editor: DraftEditor) -> None:
    """Only the draft's author (the user of the conversation that wrote it) or an admin edits it."""
    if editor.user_id is None or editor.user_id == draft.created_by:
        return
    roles = await roles_of(session, draft.tenant_id, editor.user_id)
    if roles is None or ADMIN not in roles:
        raise ToolFailure(
            "FORBIDDEN", f"draft {draft.id} is {draft.created_by}'s: only they or an admin may edit it"
        )


async def drafts_of(session: AsyncSession, tenant_id: str, state: DraftState, limit: int) -> DraftList:
    """The tenant's drafts, newest first (the CLI's `drafts list` and the tool)."""
    query = select(EmailDraft).where(EmailDraft.tenant_id == tenant_id)
    if state != "all":
        sent = EmailDraft.sent_outbox_id.is_not(None)
        query = query.where(sent if state == "sent" else ~sent)
    rows = await session.scalars(
        query.order_by(EmailDraft.updated_at.desc(), EmailDraft.id.desc()).limit(limit)
    )
    drafts = [
        DraftSummary(**DraftDetail.model_validate(d).model_dump(exclude={"body", "html_body", "created_at"}))
        for d in rows
    ]
    return DraftList(drafts=drafts, count=len(drafts))


async def draft_of(session: AsyncSession, tenant_id: str, draft_id: int, *, lock: bool = False) -> EmailDraft:
    query = select(EmailDraft).where(EmailDraft.tenant_id == tenant_id, EmailDraft.id == draft_id)
    draft = (await session.execute(query.with_for_update() if lock else query)).scalar_one_or_none()
    if draft is None:
        raise ToolFailure("NOT_FOUND", f"no draft {draft_id} in this workspace")
    return draft


async def recorded_edit(
    session: AsyncSession,
    draft: EmailDraft,
    editor: DraftEditor,
    previous: dict[str, Any],
    changed: dict[str, Any],
) -> None:
    """Add the `draft_edits` row of a change (nothing when nothing changed), chained like every
    fact of the audit (it decides who last edited content under review: four-eyes)."""
    if changed:
        diff = {name: {"before": previous.get(name), "after": changed[name]} for name in changed}
        edit = DraftEdit(
            tenant_id=draft.tenant_id,
            draft_id=draft.id,
            edited_by=editor.user_id,
            via=editor.via,
            changes=diff,
        )
        session.add(edit)
        await session.flush()
        await session.refresh(edit)  # its edited_at, for the chain
        await chain(session, edit)


async def edit_draft(
    session: AsyncSession, draft: EmailDraft, args: UpdateDraftArgs, editor: DraftEditor
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Apply the changes to an unsent draft (locked by the caller: `draft_of(lock=True)`), for the
    tool, the server and the CLI alike; an email about a lead must stay addressed to that lead.
    Refused while a call naming the draft waits for a decision, and to anyone but its author or an
    admin; recorded with its diff. Returns (previous, changed) values."""
    return await edited(session, draft, await draft_changes(session, draft, args), editor)


async def edited(
    session: AsyncSession, draft: EmailDraft, wanted: dict[str, Any], editor: DraftEditor
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Set `wanted` (`draft_changes`) on the locked draft, as `edit_draft` says."""
    await check_editor(session, draft, editor)
    reviewed = await pending_on(session, draft.tenant_id, draft.id)
    if reviewed:
        calls = ", ".join(
            f"{r.tool} (call {r.call_id}, expires {r.expires_at.isoformat()})" for r in reviewed
        )
        raise ToolFailure(
            "CONFLICT",
            f"draft {draft.id} is waiting for a reviewer's decision on {calls}: it cannot change under "
            "review; edit it once that call is decided (reject it to edit now)",
        )
    previous, changed = apply_changes(draft, wanted)
    await recorded_edit(session, draft, editor, previous, changed)
    await session.flush()
    await session.refresh(draft)
    return previous, changed


async def draft_changes(session: AsyncSession, draft: EmailDraft, args: UpdateDraftArgs) -> dict[str, Any]:
    """The columns an edit sets and their new values (HTML sanitized), or the refusal it meets: a
    sent draft is not edited, a draft about a lead stays addressed to that lead."""
    wanted = args.provided("subject", "body", "html_body")
    if args.to is not None:
        wanted["to_address"] = str(args.to)
    if draft.sent_outbox_id is not None:
        raise ToolFailure("CONFLICT", f"draft {draft.id} was already sent (email {draft.sent_outbox_id})")
    if "html_body" in wanted:
        wanted["html_body"] = sanitized_html(wanted["html_body"])
    to = wanted.get("to_address", draft.to_address)
    if draft.lead_id is not None:
        lead = await session.get(Lead, draft.lead_id)
        if lead is not None and lead.email.lower() != to.lower():
            raise ToolFailure("VALIDATION_ERROR", f"`to` must be the lead's own address ({lead.email})")
    return wanted


@tool(risk="low", category="read")
async def list_drafts(ctx: ToolContext, args: ListDraftsArgs) -> DraftList:
    """List the workspace's email drafts, newest first: unsent ones by default (state: sent, all)."""
    return await drafts_of(ctx.session, ctx.tenant_id, args.state, args.limit)


@tool(risk="low", category="read")
async def get_draft(ctx: ToolContext, args: DraftArgs) -> DraftDetail:
    """Read one draft by id: recipient, subject, body, HTML, lead, and whether it was sent."""
    return DraftDetail.model_validate(await draft_of(ctx.session, ctx.tenant_id, args.draft))


def draft_label(draft: EmailDraft) -> str:
    return f"draft {draft.id} to {draft.to_address} (“{draft.subject}”)"


async def plan_update_draft(ctx: ToolContext, args: UpdateDraftArgs) -> RowUpdate[EmailDraft]:
    draft = await draft_of(ctx.session, ctx.tenant_id, args.draft, lock=ctx.lock_reads)
    wanted = await draft_changes(ctx.session, draft, args)
    return RowUpdate(args=args, kind="draft", row=draft, label=draft_label(draft), wanted=wanted)


@tool(risk="low", category="write", plan=plan_update_draft)
async def update_draft(ctx: ToolContext, plan: RowUpdate[EmailDraft]) -> Updated[DraftDetail]:
    """Edit an unsent draft: recipient, subject, body or HTML. Nothing is sent; the result lists the
    previous and new values."""
    draft, editor = plan.row, DraftEditor(ctx.caller.user_id, "tool")
    previous, changed = await edited(ctx.session, draft, plan.wanted, editor)
    return Updated[DraftDetail](record=DraftDetail.model_validate(draft), previous=previous, changed=changed)


@compensates(update_draft)
async def restore_draft(
    ctx: ToolContext, args: UpdateDraftArgs, result: dict[str, Any] | None
) -> UndoOutcome:
    """Put the fields back, unless the draft was edited again or sent since; recorded as an edit."""
    if result is None or not result.get("changed"):
        return "never_happened"
    draft = await locked_row(ctx, EmailDraft, result["record"]["draft_id"])
    if draft is None or draft.sent_outbox_id is not None:
        return "irreversible"
    before = {name: getattr(draft, name) for name in result["changed"]}
    outcome = restore_fields(draft, result.get("previous", {}), result["changed"])
    after = {name: getattr(draft, name) for name in before if getattr(draft, name) != before[name]}
    await recorded_edit(ctx.session, draft, DraftEditor(ctx.caller.user_id, "tool"), before, after)
    return outcome


class SentDraft(QueuedEmail):
    draft_id: int
    to: str


async def unsent_draft(ctx: ToolContext, draft_id: int, *, lock: bool) -> EmailDraft:
    """The draft to send; one already sent is refused, unless this very call sent it (a retry finds
    its own email: queued_once)."""
    draft = await draft_of(ctx.session, ctx.tenant_id, draft_id, lock=lock)
    if draft.sent_outbox_id is not None:
        key = await ctx.session.scalar(
            select(EmailOutbox.idempotency_key).where(EmailOutbox.id == draft.sent_outbox_id)
        )
        if key != ctx.idempotency_key:
            raise ToolFailure("CONFLICT", f"draft {draft.id} was already sent (email {draft.sent_outbox_id})")
    return draft


def draft_content(draft: EmailDraft) -> EmailContent:
    return EmailContent(subject=draft.subject, body=draft.body, html_body=draft.html_body)


@dataclass(kw_only=True)
class SendDraftPlan(Plan):
    """The draft to send, read (and locked, when it runs) by the plan: what it holds is what leaves."""

    draft: EmailDraft

    def effect(self) -> Effect:
        """The draft's recipient, subject and body as the plan read them: what will be sent."""
        draft = self.draft
        email = email_effect(draft.to_address, draft_content(draft))
        return email.model_copy(update={"summary": one_line(f"Sends draft {draft.id}: {email.summary}")})


async def plan_send_draft(ctx: ToolContext, args: DraftArgs) -> SendDraftPlan:
    return SendDraftPlan(args=args, draft=await unsent_draft(ctx, args.draft, lock=ctx.lock_reads))


@tool(risk="high", category="external", plan=plan_send_draft)
async def send_draft(ctx: ToolContext, plan: SendDraftPlan) -> SentDraft:
    """Send a saved draft by id, as send_email would: it waits for approval, is queued and delivered
    after the turn, and can be cancelled until then. A draft is sent once."""
    draft = plan.draft
    queued = await queued_once(ctx, draft.to_address, draft_content(draft), draft.lead_id)
    draft.sent_outbox_id = queued.outbox_id
    await saved(ctx, draft)
    return SentDraft(**queued.model_dump(), draft_id=draft.id, to=draft.to_address)


@compensates(send_draft)
async def cancel_sent_draft(ctx: ToolContext, args: DraftArgs, result: dict[str, Any] | None) -> UndoOutcome:
    """Cancel the queued email, as send_email's undo does; a cancelled one leaves the draft unsent."""
    outcome = await cancel_queued_email(ctx, result)
    if result is not None and outcome == "undone":
        draft = await locked_row(ctx, EmailDraft, result["draft_id"])
        if draft is not None and draft.sent_outbox_id == result["outbox_id"]:
            draft.sent_outbox_id = None
    return outcome
