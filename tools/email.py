"""send_email: queue one email in the outbox, in the call's transaction. Delivery happens afterwards.

The tool never talks SMTP: it inserts an `email_outbox` row keyed by the call's idempotency key, so the
queued email commits (or not) together with the audit row, and a retried call finds the row it
already queued instead of queueing a second one. `deliver_email` (activities/email.py) sends it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import nh3
from pydantic import BaseModel, Field
from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert

from countersign.core.effects import Effect, OutgoingMessage, one_line
from countersign.db.schema import EmailOutbox, Lead
from tools.leads import find_lead, lead_label, lead_named
from tools.registry import Plan, ToolArgs, ToolContext, ToolFailure, UndoOutcome, compensates, tool
from tools.resolve import Address


class EmailContent(ToolArgs):
    """What an email says: shared by send_email, draft_email and send_email_to_contact."""

    # One line: a CR or LF in a header would let the text add headers of its own.
    subject: str = Field(min_length=1, max_length=200, pattern=r"^[^\r\n]*$", description="One line")
    body: str = Field(min_length=1, max_length=20_000, description="Plain text")
    html_body: str | None = Field(
        None,
        max_length=100_000,
        description="An HTML version of the body (optional); scripts, event handlers and unsafe links "
        "are removed before it is stored",
    )


class SendEmailArgs(EmailContent):
    to: Address = Field(description="The recipient's email address (one address, no display name)")
    lead: str | None = Field(
        None,
        min_length=1,
        max_length=320,
        description="The lead the email is about (its email or id); `to` must then be the lead's address",
    )


class QueuedEmail(BaseModel):
    outbox_id: int
    status: str


def sanitized_html(html: str | None) -> str | None:
    """The HTML with only Ammonia's allow-listed tags and attributes left (nh3's defaults: no script,
    style, event handler or javascript: URL; links get rel="noopener noreferrer")."""
    return None if html is None else nh3.clean(html)


def addressed_to(lead: Lead, to: str) -> Lead:
    """`lead`, when `to` is its address; an email about a lead goes to that lead."""
    if lead.email.lower() != to.lower():
        raise ToolFailure("VALIDATION_ERROR", f"`to` must be the lead's own address ({lead.email})")
    return lead


async def queue(
    ctx: ToolContext, to: str, content: EmailContent, lead_id: int | None = None, key: str | None = None
) -> QueuedEmail | None:
    """Insert the outbox row, or None when its idempotency key (default: the call's) already has one."""
    statement = (
        insert(EmailOutbox)
        .values(
            tenant_id=ctx.tenant_id,
            idempotency_key=key or ctx.idempotency_key,
            to_address=to,
            subject=content.subject,
            body=content.body,
            html_body=sanitized_html(content.html_body),
            lead_id=lead_id,
            status="queued",
        )
        .on_conflict_do_nothing(index_elements=[EmailOutbox.idempotency_key])
        .returning(EmailOutbox.id, EmailOutbox.status)
    )
    row = (await ctx.session.execute(statement)).one_or_none()
    return None if row is None else QueuedEmail(outbox_id=row.id, status=row.status)


def email_effect(to: str, content: EmailContent, about: str | None = None) -> Effect:
    """An email as it will leave: recipient, subject, body and the HTML as sanitized for sending."""
    message = OutgoingMessage(
        channel="email",
        to=[to],
        subject=content.subject,
        body=content.body,
        html=sanitized_html(content.html_body),
    )
    regarding = f" about {about}" if about else ""
    return Effect(summary=one_line(f"Email to {to}{regarding}: “{content.subject}”"), messages=[message])


@dataclass(kw_only=True)
class EmailPlan(Plan):
    """One email as it will leave: to `args.to`, about `lead` when the call names one."""

    args: SendEmailArgs
    lead: Lead | None

    def effect(self) -> Effect:
        return email_effect(self.args.to, self.args, lead_label(self.lead) if self.lead else None)


async def plan_send_email(ctx: ToolContext, args: SendEmailArgs) -> EmailPlan:
    """The email, and the lead it is about (its address must be `to`: an email about a lead is
    never sent to someone else)."""
    if args.lead is None:
        return EmailPlan(args=args, lead=None)
    lead = addressed_to(await find_lead(ctx, args.lead, lock=ctx.lock_reads), args.to)
    return EmailPlan(args=args, lead=lead, named={"lead": lead_named(lead)})


@tool(risk="high", category="external", plan=plan_send_email)
async def send_email(ctx: ToolContext, plan: EmailPlan) -> QueuedEmail:
    """Send an email to one address: plain text, optionally with an HTML version, optionally about
    one of the workspace's leads. The email is queued and delivered after the turn; the result's
    status says where it stands ("queued" until delivered)."""
    return await queued_once(ctx, plan.args.to, plan.args, plan.lead.id if plan.lead else None)


async def queued_once(
    ctx: ToolContext, to: str, content: EmailContent, lead_id: int | None = None, key: str | None = None
) -> QueuedEmail:
    """Queue the email, or find the one this call already queued (several emails of one call each
    pass their own `key`, derived from the call's)."""
    key = key or ctx.idempotency_key
    queued = await queue(ctx, to, content, lead_id, key)
    if queued is not None:
        return queued
    # The key's row exists: the same call already ran (ON CONFLICT waited for it to commit).
    existing = (
        await ctx.session.execute(
            select(EmailOutbox.id, EmailOutbox.status).where(
                EmailOutbox.idempotency_key == key, EmailOutbox.tenant_id == ctx.tenant_id
            )
        )
    ).one_or_none()
    if existing is None:
        raise ToolFailure("CONFLICT", "this call's email key is taken outside this workspace")
    return QueuedEmail(outbox_id=existing.id, status=existing.status)


# What the compensation reports for an email it could not cancel, by the row's status.
NOT_CANCELLABLE: dict[str | None, UndoOutcome] = {
    None: "never_happened",  # no row
    "cancelled": "already_undone",
    "sent": "irreversible",
    "failed": "never_happened",  # refused by the server for good: nothing left the building
}


@compensates(send_email)
async def cancel_email(ctx: ToolContext, args: SendEmailArgs, result: dict[str, Any] | None) -> UndoOutcome:
    return await cancel_queued_email(ctx, result)


async def cancel_queued_email(ctx: ToolContext, result: dict[str, Any] | None) -> UndoOutcome:
    """Cancel the email while it is still queued; one already sent cannot be taken back."""
    if result is None:
        return "never_happened"
    owned = (EmailOutbox.id == int(result["outbox_id"]), EmailOutbox.tenant_id == ctx.tenant_id)
    cancelled = await ctx.session.scalar(
        update(EmailOutbox)
        .where(*owned, EmailOutbox.status == "queued")
        .values(status="cancelled")
        .returning(EmailOutbox.id)
    )
    if cancelled is not None:
        return "undone"
    status = await ctx.session.scalar(select(EmailOutbox.status).where(*owned))
    if status not in NOT_CANCELLABLE:  # "sending": its fate is being decided right now
        raise ToolFailure("CONFLICT", "the email is being delivered right now; try again shortly")
    return NOT_CANCELLABLE[status]
