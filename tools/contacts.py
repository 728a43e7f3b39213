"""Contact tools: find the people behind leads and meetings, within the caller's tenant."""

from __future__ import annotations

from pydantic import BaseModel, Field
from sqlalchemy import or_, select

from countersign.db.schema import Contact
from tools.registry import ToolArgs, ToolContext, tool
from tools.resolve import RowView, containing


class ContactView(RowView):
    id: int
    name: str
    email: str | None
    phone: str | None
    company: str | None
    notes: str | None


class ContactList(BaseModel):
    contacts: list[ContactView]
    count: int


class SearchContactsArgs(ToolArgs):
    query: str = Field(min_length=1, max_length=200, description="Part of a name, email or company")
    limit: int = Field(10, ge=1, le=50, description="Most rows to return")


@tool(risk="low", category="read")
async def search_contacts(ctx: ToolContext, args: SearchContactsArgs) -> ContactList:
    """Search the workspace's contacts by name, email or company (case-insensitive substring).

    Several people can share a name: use the email to tell them apart.
    """
    rows = await ctx.session.scalars(
        select(Contact)
        .where(Contact.tenant_id == ctx.tenant_id)
        .where(
            or_(
                containing(Contact.name, args.query),
                containing(Contact.email, args.query),
                containing(Contact.company, args.query),
            )
        )
        .order_by(Contact.name, Contact.id)
        .limit(args.limit)
    )
    contacts = [ContactView.model_validate(contact) for contact in rows]
    return ContactList(contacts=contacts, count=len(contacts))
