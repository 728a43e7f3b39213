"""The database schema as SQLAlchemy 2 declarative models.

Conventions, so that every query a tool writes is tenant-scoped by construction:

- Every business row carries `tenant_id` (a slug such as ``acme``) and is indexed on it, either by its
  own index or by a primary key / unique constraint that starts with it.
- References to users are composite foreign keys `(tenant_id, user_id) -> users(tenant_id, id)`, and
  a task's project is `(tenant_id, project_id) -> projects(tenant_id, id)`: the database itself refuses
  a row that points into another tenant.
- Business rows have BIGINT identity ids; people and models never type them (tools resolve emails and
  names), so they are surrogate keys only.
- Enumerations are TEXT with CHECK constraints: readable in operators' SQL, and adding a value is a
  one-line migration.

The migration in `countersign/migrations/versions/` is hand-written; `tests/test_db.py` checks that it
and these models describe the same schema.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Double,
    ForeignKey,
    ForeignKeyConstraint,
    Identity,
    Index,
    MetaData,
    Text,
    UniqueConstraint,
    false,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, MappedColumn, mapped_column

LEAD_STATUSES = ("new", "contacted", "qualified", "disqualified", "converted")
PROJECT_STATUSES = ("planned", "active", "on_hold", "done", "cancelled")
TASK_STATUSES = ("open", "in_progress", "done", "cancelled")
EVENT_STATUSES = ("tentative", "confirmed", "cancelled")
EMAIL_STATUSES = ("queued", "sending", "sent", "cancelled", "failed")
NOTIFICATION_STATUSES = ("open", "resolved")
TIERS = ("always_allow", "needs_approval", "blocked")
RISKS = ("low", "medium", "high")
CATEGORIES = ("read", "write", "external")
OUTCOMES = ("executed", "failed", "rejected", "expired", "refused", "blocked", "invalid", "limit_reached")
DECISIONS = ("approve", "reject")
COMPENSATION_STATES = ("pending", "done", "failed", "irreversible", "skipped")
ROLLBACK_SCOPES = ("turn", "conversation", "call")

# Deterministic constraint names: the migration spells the same names, and later migrations can drop them.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def one_of(column: str, values: tuple[str, ...]) -> CheckConstraint:
    """A CHECK that `column` holds one of `values`, named `ck_<table>_<column>`."""
    allowed = ", ".join(f"'{v}'" for v in values)
    return CheckConstraint(f"{column} IN ({allowed})", name=column)


def user_fk(column: str) -> ForeignKeyConstraint:
    """`(tenant_id, column)` references a user of the same tenant."""
    return ForeignKeyConstraint(["tenant_id", column], ["users.tenant_id", "users.id"])


def identity_pk() -> MappedColumn[int]:
    return mapped_column(BigInteger, Identity(), primary_key=True)


def tenant_column(*, indexed: bool = True) -> MappedColumn[str]:
    """`tenant_id`; `indexed=False` where a composite key or index already starts with it."""
    return mapped_column(ForeignKey("tenants.id"), index=indexed)


def created_at() -> MappedColumn[datetime]:
    return mapped_column(server_default=func.now())


def updated_at() -> MappedColumn[datetime]:
    return mapped_column(server_default=func.now(), onupdate=func.now())


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {
        str: Text(),
        datetime: DateTime(timezone=True),
        float: Double(),
        dict[str, Any]: JSONB(),
        list[str]: JSONB(),
    }


# --- tenants and people ----------------------------------------------------------------------------


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(primary_key=True)
    name: Mapped[str]
    created_at: Mapped[datetime] = created_at()


class User(Base):
    __tablename__ = "users"
    __table_args__ = (UniqueConstraint("tenant_id", "email"),)

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), primary_key=True)
    id: Mapped[str] = mapped_column(primary_key=True)
    display_name: Mapped[str]
    email: Mapped[str]
    created_at: Mapped[datetime] = created_at()


class UserRole(Base):
    __tablename__ = "user_roles"
    __table_args__ = (
        ForeignKeyConstraint(["tenant_id", "user_id"], ["users.tenant_id", "users.id"], ondelete="CASCADE"),
    )

    tenant_id: Mapped[str] = mapped_column(primary_key=True)
    user_id: Mapped[str] = mapped_column(primary_key=True)
    role: Mapped[str] = mapped_column(primary_key=True)


# --- business data the tools act on ----------------------------------------------------------------


class Contact(Base):
    __tablename__ = "contacts"
    __table_args__ = (UniqueConstraint("tenant_id", "email"),)

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column(indexed=False)
    name: Mapped[str]
    email: Mapped[str | None]
    phone: Mapped[str | None]
    company: Mapped[str | None]
    notes: Mapped[str | None]
    created_at: Mapped[datetime] = created_at()
    updated_at: Mapped[datetime] = updated_at()


class Lead(Base):
    __tablename__ = "leads"
    __table_args__ = (
        UniqueConstraint("tenant_id", "email"),
        one_of("status", LEAD_STATUSES),
        user_fk("owner_user_id"),
    )

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column(indexed=False)
    email: Mapped[str]
    name: Mapped[str]
    company: Mapped[str | None]
    status: Mapped[str] = mapped_column(server_default="new")
    source: Mapped[str | None]
    notes: Mapped[str | None]
    owner_user_id: Mapped[str | None]
    created_at: Mapped[datetime] = created_at()
    updated_at: Mapped[datetime] = updated_at()


class Project(Base):
    __tablename__ = "projects"
    __table_args__ = (
        UniqueConstraint("tenant_id", "name"),
        UniqueConstraint("tenant_id", "id"),  # the target of tasks' same-tenant foreign key
        one_of("status", PROJECT_STATUSES),
        user_fk("owner_user_id"),
    )

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column(indexed=False)
    name: Mapped[str]
    description: Mapped[str | None]
    status: Mapped[str] = mapped_column(server_default="planned")
    owner_user_id: Mapped[str | None]
    due_date: Mapped[date | None]
    created_at: Mapped[datetime] = created_at()
    updated_at: Mapped[datetime] = updated_at()


class Task(Base):
    __tablename__ = "tasks"
    __table_args__ = (
        one_of("status", TASK_STATUSES),
        user_fk("assignee_user_id"),
        ForeignKeyConstraint(["tenant_id", "project_id"], ["projects.tenant_id", "projects.id"]),
    )

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column()
    title: Mapped[str]
    description: Mapped[str | None]
    status: Mapped[str] = mapped_column(server_default="open")
    due_date: Mapped[date | None]
    assignee_user_id: Mapped[str | None]
    project_id: Mapped[int | None] = mapped_column(BigInteger)
    created_by: Mapped[str]  # the requesting user's id; free text so "system" jobs can create tasks too
    created_at: Mapped[datetime] = created_at()
    updated_at: Mapped[datetime] = updated_at()


class CalendarEvent(Base):
    __tablename__ = "calendar_events"
    __table_args__ = (
        one_of("status", EVENT_STATUSES),
        CheckConstraint("ends_at >= starts_at", name="ends_after_start"),
        user_fk("owner_user_id"),
    )

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column()
    title: Mapped[str]
    description: Mapped[str | None]
    starts_at: Mapped[datetime]
    ends_at: Mapped[datetime]
    attendees: Mapped[list[str]] = mapped_column(server_default=text("'[]'::jsonb"))  # emails or user ids
    location: Mapped[str | None]
    owner_user_id: Mapped[str | None]
    status: Mapped[str] = mapped_column(server_default="confirmed")
    created_at: Mapped[datetime] = created_at()
    updated_at: Mapped[datetime] = updated_at()


class EmailOutbox(Base):
    """Emails are queued here in the tool's transaction and sent afterwards; the key makes sends once-only."""

    __tablename__ = "email_outbox"
    __table_args__ = (one_of("status", EMAIL_STATUSES),)

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column()
    idempotency_key: Mapped[str] = mapped_column(unique=True)
    to_address: Mapped[str]
    subject: Mapped[str]
    body: Mapped[str]
    status: Mapped[str] = mapped_column(server_default="queued")
    attempts: Mapped[int] = mapped_column(server_default=text("0"))
    error: Mapped[str | None]
    created_at: Mapped[datetime] = created_at()
    sent_at: Mapped[datetime | None]


class Notification(Base):
    __tablename__ = "notifications"
    __table_args__ = (one_of("status", NOTIFICATION_STATUSES), user_fk("user_id"))

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column()
    user_id: Mapped[str | None]  # None: for anyone in the tenant
    kind: Mapped[str]
    message: Mapped[str]
    status: Mapped[str] = mapped_column(server_default="open")
    workflow_id: Mapped[str | None]
    call_id: Mapped[str | None]
    created_at: Mapped[datetime] = created_at()
    resolved_at: Mapped[datetime | None]
    resolved_by: Mapped[str | None]


# --- agents and their permissions (global: `permissions set AGENT TOOL tier` names no tenant) ------


class AgentProfile(Base):
    __tablename__ = "agent_profiles"

    name: Mapped[str] = mapped_column(primary_key=True)
    description: Mapped[str] = mapped_column(server_default="")
    system_prompt: Mapped[str]
    atomic_turns: Mapped[bool] = mapped_column(server_default=false())


class AgentToolPermission(Base):
    """A row means the agent has the tool; `tier` None means the tool's declared default tier."""

    __tablename__ = "agent_tool_permissions"
    __table_args__ = (one_of("tier", TIERS),)

    agent: Mapped[str] = mapped_column(
        ForeignKey("agent_profiles.name", ondelete="CASCADE"), primary_key=True
    )
    tool: Mapped[str] = mapped_column(primary_key=True)
    tier: Mapped[str | None]


# --- what happened: audit, approvals, compensations, rate limits -----------------------------------


class ToolExecution(Base):
    """The audit: one row per tool call, whatever its outcome (executed, rejected, blocked, ...).

    `risk` and `category` are None when the model named a tool that does not exist.
    """

    __tablename__ = "tool_executions"
    __table_args__ = (
        UniqueConstraint("workflow_id", "call_id"),  # also serves lookups by workflow_id
        Index(None, "tenant_id", "created_at"),
        one_of("outcome", OUTCOMES),
        one_of("risk", RISKS),
        one_of("category", CATEGORIES),
    )

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column(indexed=False)
    agent: Mapped[str]
    user_id: Mapped[str]
    workflow_id: Mapped[str]
    run_id: Mapped[str]
    call_id: Mapped[str]
    turn: Mapped[int] = mapped_column(server_default=text("0"))
    tool: Mapped[str]
    risk: Mapped[str | None]
    category: Mapped[str | None]
    args: Mapped[dict[str, Any]]  # redacted
    edited_args: Mapped[dict[str, Any] | None]  # what an approver changed them to
    result: Mapped[dict[str, Any] | None]  # the envelope the model saw, truncated and redacted
    outcome: Mapped[str]
    error: Mapped[str | None]
    approved_by: Mapped[str | None]
    decision_reason: Mapped[str | None]
    idempotency_key: Mapped[str | None]
    started_at: Mapped[datetime | None]  # None for calls that never ran (rejected, blocked, ...)
    finished_at: Mapped[datetime | None]
    duration_ms: Mapped[int | None]
    rolled_back: Mapped[bool] = mapped_column(server_default=false())
    rolled_back_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = created_at()


class ApprovalDecision(Base):
    """Every decision attempt, including refused ones (late, duplicate, approver not allowed).

    `attempt_key` identifies the activity invocation that recorded the attempt, so a re-run of it
    (retry, replay after a worker crash) finds its row instead of adding one; None on older rows.
    """

    __tablename__ = "approval_decisions"
    __table_args__ = (Index(None, "workflow_id", "call_id"), one_of("decision", DECISIONS))

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column()
    workflow_id: Mapped[str]
    call_id: Mapped[str]
    tool: Mapped[str]
    approver: Mapped[str]
    decision: Mapped[str]
    accepted: Mapped[bool]
    reason: Mapped[str | None]  # why it was refused, or the reviewer's reason
    args: Mapped[dict[str, Any] | None]  # edited arguments
    created_at: Mapped[datetime] = created_at()
    attempt_key: Mapped[str | None] = mapped_column(unique=True)  # workflow id:run id:activity id


class Compensation(Base):
    """One compensation run per tool call: undoing it happens at most once."""

    __tablename__ = "compensations"
    __table_args__ = (UniqueConstraint("workflow_id", "call_id"), one_of("state", COMPENSATION_STATES))

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column()
    workflow_id: Mapped[str]
    call_id: Mapped[str]
    tool: Mapped[str]
    compensation: Mapped[str]  # the compensating activity's name
    state: Mapped[str] = mapped_column(server_default="pending")
    error: Mapped[str | None]
    created_at: Mapped[datetime] = created_at()
    finished_at: Mapped[datetime | None]


class RateLimitBucket(Base):
    """A token bucket per tenant and tool, refilled lazily from `updated_at` under a row lock."""

    __tablename__ = "rate_limit_buckets"

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), primary_key=True)
    tool: Mapped[str] = mapped_column(primary_key=True)
    tokens: Mapped[float]
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())


class RollbackRecord(Base):
    """Every rollback request, accepted or refused (who asked, what scope, and why refused);
    `attempt_key` as in ApprovalDecision: one row per request however often it is authorized."""

    __tablename__ = "rollback_requests"
    __table_args__ = (one_of("scope", ROLLBACK_SCOPES),)

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column()
    workflow_id: Mapped[str] = mapped_column(index=True)
    requested_by: Mapped[str]
    scope: Mapped[str]
    call_id: Mapped[str | None]
    accepted: Mapped[bool]
    reason: Mapped[str | None]  # why it was refused, or the requester's reason
    created_at: Mapped[datetime] = created_at()
    attempt_key: Mapped[str | None] = mapped_column(unique=True)  # workflow id:run id:activity id


class InputAudit(Base):
    """Every authority check of a client action (`end` by an admin, accepted or refused) and every
    refused client input (an unreadable signal, a message from another user, forged carried state).
    `tenant_id` has no foreign key: a refused input may name a tenant that does not exist.
    `attempt_key` as in ApprovalDecision: one row per check however often it runs."""

    __tablename__ = "input_audit"

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = mapped_column(index=True)
    workflow_id: Mapped[str] = mapped_column(index=True)
    action: Mapped[str]  # the signal or update name, or "start"
    actor: Mapped[str | None]  # who the payload says sent it (None: unreadable)
    accepted: Mapped[bool]
    reason: Mapped[str | None]  # why it was refused
    excerpt: Mapped[str | None]  # the start of an unreadable payload
    created_at: Mapped[datetime] = created_at()
    attempt_key: Mapped[str | None] = mapped_column(unique=True)
