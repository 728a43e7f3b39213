"""Case tools for the case-researcher agent: find, read and update the tenant's client cases.

A case names its client by a contact's email; the contact is looked up in the same tenant (the join
carries `tenant_id`), so a case can never show another workspace's person. `update_case` is a
high-risk write: it waits for a reviewer by default, and its compensation puts the previous values
back unless someone changed them since.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field
from sqlalchemy import and_, func, or_, select
from sqlalchemy.sql import Select

from countersign.core.guards import MAX_ROWS
from countersign.db.schema import Case, Contact
from tools.effects import RowUpdate
from tools.registry import ToolArgs, ToolContext, UndoOutcome, compensates, tool
from tools.resolve import (
    ChangeArgs,
    RowView,
    Updated,
    answers_needs,
    containing,
    find_record,
    saved,
    undo_update,
)

CaseStatus = Literal["open", "in_progress", "on_hold", "closed"]
CASE_HELP = "The case's exact title, or its id"


class ClientView(RowView):
    name: str
    email: str | None
    company: str | None
    phone: str | None


class CaseView(RowView):
    id: int
    title: str
    status: str
    client_email: str | None = Field(validation_alias="contact_email")
    client: ClientView | None = None  # None when no contact of the workspace has that email
    notes: str | None
    updated_at: datetime

    @classmethod
    def of(cls, case: Case, contact: Contact | None) -> CaseView:
        """The case with its client: the workspace's contact of its email, if there is one."""
        client = ClientView.model_validate(contact) if contact is not None else None
        return cls.model_validate(case).model_copy(update={"client": client})


class CaseList(BaseModel):
    cases: list[CaseView]
    count: int


class SearchCasesArgs(ToolArgs):
    query: str | None = Field(
        None, min_length=1, max_length=200, description="Part of the title, notes, or client's name or email"
    )
    status: CaseStatus | None = Field(None, description="Only cases with this status")
    limit: int = Field(10, ge=1, le=MAX_ROWS, description="Most rows to return")


class GetCaseArgs(ToolArgs):
    case: str = Field(min_length=1, max_length=200, description=CASE_HELP)


class UpdateCaseArgs(ChangeArgs):
    target: ClassVar[str] = "case"
    case: str = Field(min_length=1, max_length=200, description=CASE_HELP)
    status: CaseStatus | None = Field(None, description="New status")
    notes: str | None = Field(None, max_length=4000, description='New notes (replace the old; "" clears)')


def with_client() -> Select[Case, Contact]:
    """Cases with their client contact, joined within the case's own tenant."""
    same_client = and_(
        Contact.tenant_id == Case.tenant_id, func.lower(Contact.email) == func.lower(Case.contact_email)
    )
    return select(Case, Contact).outerjoin(Contact, same_client)


async def client_of(ctx: ToolContext, case: Case) -> Contact | None:
    if case.contact_email is None:
        return None
    return await ctx.session.scalar(
        select(Contact).where(
            Contact.tenant_id == ctx.tenant_id, func.lower(Contact.email) == case.contact_email.lower()
        )
    )


async def find_case(ctx: ToolContext, ref: str, *, lock: bool = False) -> Case:
    return await find_record(
        ctx,
        Case,
        ref,
        field="case",
        label=Case.title,
        lock=lock,
        describe=lambda c: {"id": c.id, "title": c.title, "status": c.status},
    )


@tool(risk="low", category="read")
async def search_cases(ctx: ToolContext, args: SearchCasesArgs) -> CaseList:
    """Search the workspace's client cases by title, notes, or the client's name or email
    (case-insensitive substring), optionally by status; most recently updated first."""
    query = with_client().where(Case.tenant_id == ctx.tenant_id)
    if args.query is not None:
        query = query.where(
            or_(
                containing(Case.title, args.query),
                containing(Case.notes, args.query),
                containing(Case.contact_email, args.query),
                containing(Contact.name, args.query),
            )
        )
    if args.status is not None:
        query = query.where(Case.status == args.status)
    rows = await ctx.session.execute(query.order_by(Case.updated_at.desc(), Case.id).limit(args.limit))
    cases = [CaseView.of(row.Case, row.Contact) for row in rows]
    return CaseList(cases=cases, count=len(cases))


@tool(risk="low", category="read")
@answers_needs
async def get_case(ctx: ToolContext, args: GetCaseArgs) -> CaseView:
    """Get one case by its exact title or id, with its status, notes and client contact."""
    case = await find_case(ctx, args.case)
    return CaseView.of(case, await client_of(ctx, case))


async def plan_update_case(ctx: ToolContext, args: UpdateCaseArgs) -> RowUpdate[Case]:
    case = await find_case(ctx, args.case, lock=ctx.lock_reads)
    client = f", client {case.contact_email}" if case.contact_email else ""
    label = f"case {case.id} “{case.title}”{client}"
    wanted = args.provided("status", "notes")
    return RowUpdate(args=args, kind="case", row=case, label=label, wanted=wanted, ref="case")


@tool(risk="high", category="write", plan=plan_update_case)
async def update_case(ctx: ToolContext, plan: RowUpdate[Case]) -> Updated[CaseView]:
    """Change a case's status (open, in_progress, on_hold, closed) or replace its notes. Only the
    fields given change; the result lists their previous and new values. Waits for a reviewer's
    approval unless the agent is allowed more."""
    previous, changed = plan.write()
    case = await saved(ctx, plan.row)
    return Updated[CaseView](
        record=CaseView.of(case, await client_of(ctx, case)), previous=previous, changed=changed
    )


@compensates(update_case)
async def restore_updated_case(
    ctx: ToolContext, args: UpdateCaseArgs, result: dict[str, Any] | None
) -> UndoOutcome:
    """Put the previous status and notes back, only where they still hold what this call set."""
    return await undo_update(ctx, Case, result)
