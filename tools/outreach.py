"""draft_email (stores a draft, nothing leaves) and send_email_to_contact (a contact named by name,
through send_email's outbox, approval and undo window)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert

from countersign.core.effects import Creation, Effect, one_line
from countersign.db.schema import EmailDraft
from tools.email import (
    EmailContent,
    EmailPlan,
    QueuedEmail,
    SendEmailArgs,
    cancel_queued_email,
    email_effect,
    plan_send_email,
    queued_once,
    sanitized_html,
)
from tools.registry import Plan, ToolContext, ToolFailure, UndoOutcome, compensates, tool
from tools.resolve import resolve_contact


class DraftView(BaseModel):
    draft_id: int
    to: str
    subject: str
    lead_id: int | None
    has_html: bool


@dataclass(kw_only=True)
class DraftPlan(EmailPlan):
    """send_email's plan, kept as a draft: nothing is sent."""

    def effect(self) -> Effect:
        """The draft as it will exist."""
        email = super().effect()
        message = email.messages[0]
        draft = Creation(
            kind="draft", label=f"draft to {message.to[0]}", fields=message.model_dump(exclude={"channel"})
        )
        return Effect(summary=one_line(f"Saves a draft (nothing is sent): {email.summary}"), creates=[draft])


async def plan_draft_email(ctx: ToolContext, args: SendEmailArgs) -> DraftPlan:
    email = await plan_send_email(ctx, args)
    return DraftPlan(args=email.args, lead=email.lead, named=email.named)


@tool(risk="low", category="write", plan=plan_draft_email)
async def draft_email(ctx: ToolContext, plan: DraftPlan) -> DraftView:
    """Save an email as a draft for a person to review and send: nothing is sent. Same fields as
    send_email (`lead`: the lead it is about, whose address `to` must be)."""
    args, lead_id = plan.args, plan.lead.id if plan.lead else None
    statement = (
        insert(EmailDraft)
        .values(
            tenant_id=ctx.tenant_id,
            idempotency_key=ctx.idempotency_key,
            created_by=ctx.caller.user_id,
            to_address=args.to,
            subject=args.subject,
            body=args.body,
            html_body=sanitized_html(args.html_body),
            lead_id=lead_id,
        )
        .on_conflict_do_nothing(index_elements=[EmailDraft.idempotency_key])
    )
    await ctx.session.execute(statement)
    draft = await ctx.session.scalar(
        select(EmailDraft).where(
            EmailDraft.idempotency_key == ctx.idempotency_key, EmailDraft.tenant_id == ctx.tenant_id
        )
    )
    if draft is None:
        raise ToolFailure("CONFLICT", "this call's draft key is taken outside this workspace")
    return DraftView(
        draft_id=draft.id,
        to=draft.to_address,
        subject=draft.subject,
        lead_id=draft.lead_id,
        has_html=draft.html_body is not None,
    )


@compensates(draft_email)
async def discard_draft(ctx: ToolContext, args: SendEmailArgs, result: dict[str, Any] | None) -> UndoOutcome:
    """Delete the draft (a draft has no effect outside, so deleting it undoes the call)."""
    if result is None:
        return "never_happened"
    deleted = await ctx.session.scalar(
        delete(EmailDraft)
        .where(EmailDraft.id == int(result["draft_id"]), EmailDraft.tenant_id == ctx.tenant_id)
        .returning(EmailDraft.id)
    )
    return "undone" if deleted is not None else "already_undone"


class SendToContactArgs(EmailContent):
    contact: str = Field(min_length=1, max_length=320, description="The contact's name or email address")


class QueuedContactEmail(QueuedEmail):
    to: str
    contact: str


@dataclass(kw_only=True)
class ContactEmailPlan(Plan):
    """An email to the contact the call names, at the address the plan read."""

    args: SendToContactArgs
    address: str
    name: str

    def effect(self) -> Effect:
        return email_effect(self.address, self.args, self.name)


async def plan_contact_email(ctx: ToolContext, args: SendToContactArgs) -> ContactEmailPlan:
    """The contact `args.contact` names, by its address (lowercased in the arguments policies read)."""
    contact = await resolve_contact(ctx, args.contact, field="contact")
    if not contact.email:
        raise ToolFailure("VALIDATION_ERROR", f"the contact {contact.name!r} has no email address")
    named = {"contact": contact.email.strip().lower()}
    return ContactEmailPlan(args=args, address=contact.email, name=contact.name, named=named)


@tool(risk="high", category="external", plan=plan_contact_email)
async def send_email_to_contact(ctx: ToolContext, plan: ContactEmailPlan) -> QueuedContactEmail:
    """Email one of the workspace's contacts, named by name or email (several matches: you are asked
    which). Queued and delivered after the turn, like send_email; plain text, optional HTML."""
    queued = await queued_once(ctx, plan.address, plan.args)
    return QueuedContactEmail(**queued.model_dump(), to=plan.address, contact=plan.name)


@compensates(send_email_to_contact)
async def cancel_contact_email(
    ctx: ToolContext, args: SendToContactArgs, result: dict[str, Any] | None
) -> UndoOutcome:
    """Cancel the email while it is still queued, as send_email's undo does."""
    return await cancel_queued_email(ctx, result)
