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

The migration in `countersign/migrations/versions/` is hand-written; `tests/db/test_db.py` checks that it
and these models describe the same schema.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Any, Literal

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

from countersign.core.access import SCOPES
from countersign.db.sealed import SealedText

LEAD_STATUSES = ("new", "contacted", "qualified", "disqualified", "converted")
PROJECT_STATUSES = ("planned", "active", "on_hold", "done", "cancelled")
TASK_STATUSES = ("open", "in_progress", "done", "cancelled")
EVENT_STATUSES = ("tentative", "confirmed", "cancelled")
EMAIL_STATUSES = ("queued", "sending", "sent", "cancelled", "failed")
NOTIFICATION_STATUSES = ("open", "resolved")
NOTICE_STATUSES = ("queued", "sent")
NOTICE_CHANNELS = ("email", "webhook")
TIERS = ("always_allow", "needs_approval", "blocked")
RISKS = ("low", "medium", "high")
CATEGORIES = ("read", "write", "external")
# "unknown": an MCP call was sent and no usable answer came; the server may have run it.
OUTCOMES = (
    "executed",
    "failed",
    "rejected",
    "expired",
    "refused",
    "blocked",
    "invalid",
    "limit_reached",
    "unknown",
)
DECISIONS = ("approve", "reject")
COMPENSATION_STATES = ("pending", "done", "failed", "irreversible", "skipped")
ROLLBACK_SCOPES = ("turn", "conversation", "call")
CASE_STATUSES = ("open", "in_progress", "on_hold", "closed")
MEETING_SESSION_STATUSES = ("open", "confirmed", "cancelled")
EVENT_TYPES = ("meeting", "call", "demo", "deadline", "reminder", "other")
# What a lead_events row records; emails delivered and meetings booked are read from their own tables.
LEAD_EVENT_KINDS = ("status_changed", "email_answered")
# Where a draft was edited: a person's inbox session, the agent's `update_draft`, the operator's CLI.
DRAFT_EDIT_VIAS = ("inbox", "tool", "cli")
Via = Literal["inbox", "cli"]  # where a tier or a policy change was made (TierChange.via, PolicyChange.via)

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


def conversation_column(*, primary_key: bool = False) -> MappedColumn[str]:
    """The conversation instance a row belongs to (`conversations.conversation_id`: its first run's
    id, the same across continue-as-new); "" on rows written before instances existed (migration
    0020). A workflow id names a conversation only while it runs: a closed one's id can be started
    again, and the new conversation is another instance that reads none of these rows."""
    return mapped_column(server_default="", primary_key=primary_key)


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
    # Slack-compatible incoming webhook for reviewers' notifications: its URL is the secret, so it is
    # stored encrypted like the chat channels' (countersign/db/sealed.py) and never printed back
    webhook_url: Mapped[str | None] = mapped_column(SealedText("tenants"))


class User(Base):
    __tablename__ = "users"
    __table_args__ = (UniqueConstraint("tenant_id", "email"),)

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), primary_key=True)
    id: Mapped[str] = mapped_column(primary_key=True)
    display_name: Mapped[str]
    email: Mapped[str]
    created_at: Mapped[datetime] = created_at()
    tz: Mapped[str] = mapped_column(server_default="UTC")  # IANA zone: the user's business hours
    password_hash: Mapped[str | None]  # argon2id; None: cannot log in to the inbox with a password
    # Set: the user can no longer log in, decide, send messages, or have a conversation act for them
    # (checked at each tool call: countersign/core/access.py). Kept, not deleted: the audit names them.
    deactivated_at: Mapped[datetime | None]


class UserRole(Base):
    __tablename__ = "user_roles"
    __table_args__ = (
        ForeignKeyConstraint(["tenant_id", "user_id"], ["users.tenant_id", "users.id"], ondelete="CASCADE"),
    )

    tenant_id: Mapped[str] = mapped_column(primary_key=True)
    user_id: Mapped[str] = mapped_column(primary_key=True)
    role: Mapped[str] = mapped_column(primary_key=True)


class UserScope(Base):
    """A grant to a user (countersign/core/access.py `SCOPES`): a tool that needs a scope runs
    only for a user who holds it (`SCOPES_MISSING` otherwise). Granted and revoked with `users grant`."""

    __tablename__ = "user_scopes"
    __table_args__ = (
        ForeignKeyConstraint(["tenant_id", "user_id"], ["users.tenant_id", "users.id"], ondelete="CASCADE"),
        one_of("scope", SCOPES),
    )

    tenant_id: Mapped[str] = mapped_column(primary_key=True)
    user_id: Mapped[str] = mapped_column(primary_key=True)
    scope: Mapped[str] = mapped_column(primary_key=True)
    granted_by: Mapped[str]
    granted_at: Mapped[datetime] = created_at()


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
        CheckConstraint("score BETWEEN 0 AND 100", name="score_range"),
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
    score: Mapped[int | None]  # 0-100, computed by countersign/db/leads.py `rescore`
    last_engaged_at: Mapped[datetime | None]  # the latest contact either way (an email, a call)


class LeadEvent(Base):
    """What happened to a lead that no other table keeps: its status changes and its replies."""

    __tablename__ = "lead_events"
    __table_args__ = (
        one_of("kind", LEAD_EVENT_KINDS),
        Index("ix_lead_events_tenant_id_lead_id", "tenant_id", "lead_id"),
    )

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column(indexed=False)
    lead_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("leads.id", ondelete="CASCADE"))
    kind: Mapped[str]
    previous_status: Mapped[str | None]  # status_changed: from
    status: Mapped[str | None]  # status_changed: to
    note: Mapped[str | None]  # the reason, or what the reply said
    created_by: Mapped[str]
    created_at: Mapped[datetime] = created_at()


class Case(Base):
    """A client case the case-researcher agent reads and updates; the client is a contact's email."""

    __tablename__ = "cases"
    __table_args__ = (UniqueConstraint("tenant_id", "title"), one_of("status", CASE_STATUSES))

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column(indexed=False)
    title: Mapped[str]
    status: Mapped[str] = mapped_column(server_default="open")
    contact_email: Mapped[str | None]
    notes: Mapped[str | None]
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
        one_of("type", EVENT_TYPES),
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
    type: Mapped[str] = mapped_column(server_default="meeting")


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
    html_body: Mapped[str | None]  # sanitised before it is stored
    lead_id: Mapped[int | None] = mapped_column(BigInteger)  # the lead the email is about


class EmailDraft(Base):
    """What `draft_email` stores: nothing leaves; a person (or `send_email`) takes it from here."""

    __tablename__ = "email_drafts"

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column()
    idempotency_key: Mapped[str] = mapped_column(unique=True)
    created_by: Mapped[str]
    to_address: Mapped[str]
    subject: Mapped[str]
    body: Mapped[str]
    html_body: Mapped[str | None]
    lead_id: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = created_at()
    updated_at: Mapped[datetime] = updated_at()
    sent_outbox_id: Mapped[int | None] = mapped_column(BigInteger)  # the outbox row `send_draft` queued


class DraftEdit(Base):
    """Every edit of a saved draft, with its diff (`changes`: each changed field's `before` and
    `after`). `edited_by` is the user who edited it (None: the operator's CLI); the last one counts as
    a requester of any call that sends the draft (four-eyes). No foreign key to the draft: the audit
    outlives a draft that an undo of `draft_email` deletes."""

    __tablename__ = "draft_edits"
    __table_args__ = (Index(None, "tenant_id", "draft_id"), one_of("via", DRAFT_EDIT_VIAS))

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column(indexed=False)
    draft_id: Mapped[int] = mapped_column(BigInteger)
    edited_by: Mapped[str | None]
    via: Mapped[str]
    changes: Mapped[dict[str, Any]]
    edited_at: Mapped[datetime] = created_at()


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
    conversation_id: Mapped[str] = conversation_column()
    call_id: Mapped[str | None]
    created_at: Mapped[datetime] = created_at()
    resolved_at: Mapped[datetime | None]
    resolved_by: Mapped[str | None]


class MeetingSession(Base):
    """A scheduling negotiation: schedule_meeting's proposals, open until `expires_at`, until
    confirm_meeting books one (`event_id`) or a rollback cancels it."""

    __tablename__ = "meeting_sessions"
    __table_args__ = (one_of("status", MEETING_SESSION_STATUSES), user_fk("requested_by"))

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column()
    idempotency_key: Mapped[str] = mapped_column(unique=True)
    requested_by: Mapped[str]
    counterpart_name: Mapped[str]
    counterpart_email: Mapped[str]
    counterpart_user_id: Mapped[str | None]  # None: a contact
    counterpart_tz: Mapped[str]
    title: Mapped[str | None]
    duration_minutes: Mapped[int]
    # the window the proposals were picked in: a second proposal to the same counterpart whose window
    # overlaps it while this session is open is refused (CONFLICT)
    window_start: Mapped[datetime]
    window_end: Mapped[datetime]
    proposals: Mapped[list[dict[str, Any]]] = mapped_column(JSONB())
    status: Mapped[str] = mapped_column(server_default="open")
    expires_at: Mapped[datetime]
    event_id: Mapped[int | None] = mapped_column(BigInteger)
    notification_id: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = created_at()


# --- agents and their permissions (global: `permissions set AGENT TOOL tier` names no tenant) ------


class AgentProfile(Base):
    __tablename__ = "agent_profiles"

    name: Mapped[str] = mapped_column(primary_key=True)
    description: Mapped[str] = mapped_column(server_default="")
    system_prompt: Mapped[str]
    atomic_turns: Mapped[bool] = mapped_column(server_default=false())
    # The agent's bounds on a turn (Limits keys); a conversation may ask for less, never more.
    limits: Mapped[dict[str, Any]] = mapped_column(server_default=text("'{}'::jsonb"))


class AgentToolPermission(Base):
    """A row means the agent has the tool; `tier` None means the tool's declared default tier."""

    __tablename__ = "agent_tool_permissions"
    __table_args__ = (one_of("tier", TIERS),)

    agent: Mapped[str] = mapped_column(
        ForeignKey("agent_profiles.name", ondelete="CASCADE"), primary_key=True
    )
    tool: Mapped[str] = mapped_column(primary_key=True)
    tier: Mapped[str | None]


class TenantToolTier(Base):
    """A tenant's own tier for one of an agent's tools (agents are shared by tenants): it replaces
    the agent's tier in that tenant's conversation snapshots (tools/tiers.py). Set by a tenant
    admin (inbox) or an operator (`permissions set --tenant`); every attempt is in `tier_changes`."""

    __tablename__ = "tenant_tool_tiers"
    __table_args__ = (one_of("tier", TIERS),)

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), primary_key=True)
    agent: Mapped[str] = mapped_column(
        ForeignKey("agent_profiles.name", ondelete="CASCADE"), primary_key=True
    )
    tool: Mapped[str] = mapped_column(primary_key=True)
    tier: Mapped[str]
    set_by: Mapped[str]
    set_at: Mapped[datetime] = created_at()


class TierChange(Base):
    """Every attempt to change a tenant's tier (accepted or refused, with the reason): who, when,
    the tier before (the tenant's effective one) and the tier asked for."""

    __tablename__ = "tier_changes"
    __table_args__ = (Index(None, "tenant_id", "created_at"),)

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column(indexed=False)
    agent: Mapped[str]
    tool: Mapped[str]
    old_tier: Mapped[str | None]  # None: the agent does not have the tool
    new_tier: Mapped[str]
    changed_by: Mapped[str]
    via: Mapped[str]  # "inbox" or "cli"
    accepted: Mapped[bool]
    reason: Mapped[str | None]  # why it was refused
    workflow_id: Mapped[str | None]  # the conversation whose pending call the admin acted from
    call_id: Mapped[str | None]
    created_at: Mapped[datetime] = created_at()


POLICY_MODES = ("enforced", "shadow")


class TenantPolicy(Base):
    """A tenant's Cedar policy set (countersign/core/cedar_policy.py), as applied: the enforced one
    decides beside the tiers; a shadow one is evaluated beside it and changes nothing, each call
    whose outcome would differ recorded in `shadow_differences`. Every attempt is in `policy_changes`.
    `version` counts the tenant's accepted applies of that mode."""

    __tablename__ = "tenant_policies"
    __table_args__ = (one_of("mode", POLICY_MODES),)

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), primary_key=True)
    mode: Mapped[str] = mapped_column(primary_key=True)
    version: Mapped[int]
    text: Mapped[str]  # the policy file as applied ("" : no policies)
    sha256: Mapped[str]
    applied_by: Mapped[str]
    applied_at: Mapped[datetime] = created_at()


class PolicyChange(Base):
    """Every attempt to apply a tenant's policy set (accepted or refused, with why), chained like
    tier changes: who, when, which mode, the text and the version it became."""

    __tablename__ = "policy_changes"
    __table_args__ = (Index(None, "tenant_id", "created_at"), one_of("mode", POLICY_MODES))

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column(indexed=False)
    mode: Mapped[str]
    version: Mapped[int | None]  # None: refused
    text: Mapped[str]
    sha256: Mapped[str]
    changed_by: Mapped[str]
    via: Mapped[str]  # "inbox" or "cli"
    accepted: Mapped[bool]
    reason: Mapped[str | None]  # why it was refused
    created_at: Mapped[datetime] = created_at()


class ShadowDifference(Base):
    """A call whose outcome under the tenant's shadow policy set differs from the enforced one's
    (each a PolicyDecision as JSON; `enforced` no_match: the tiers decided)."""

    __tablename__ = "shadow_differences"
    __table_args__ = (
        UniqueConstraint("workflow_id", "conversation_id", "call_id"),
        Index(None, "tenant_id", "created_at"),
    )

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column(indexed=False)
    shadow_version: Mapped[int]
    workflow_id: Mapped[str]
    conversation_id: Mapped[str] = conversation_column()
    call_id: Mapped[str]
    tool: Mapped[str]
    requested_by: Mapped[str]
    enforced: Mapped[dict[str, Any]]
    shadow: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = created_at()


# --- what happened: audit, approvals, compensations, rate limits -----------------------------------


class ToolExecution(Base):
    """The audit: one row per tool call, whatever its outcome (executed, rejected, blocked, ...).

    `risk` and `category` are None when the model named a tool that does not exist.
    """

    __tablename__ = "tool_executions"
    __table_args__ = (
        # also serves lookups by workflow_id
        UniqueConstraint("workflow_id", "conversation_id", "call_id"),
        Index(None, "tenant_id", "created_at"),
        Index(None, "tool", "created_at"),  # per-tool statistics over a time range
        one_of("outcome", OUTCOMES),
        one_of("risk", RISKS),
        one_of("category", CATEGORIES),
    )

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column(indexed=False)
    agent: Mapped[str]
    user_id: Mapped[str]
    workflow_id: Mapped[str]
    conversation_id: Mapped[str] = conversation_column()
    run_id: Mapped[str]
    call_id: Mapped[str]
    turn: Mapped[int] = mapped_column(server_default=text("0"))
    tool: Mapped[str]
    risk: Mapped[str | None]
    category: Mapped[str | None]
    args: Mapped[dict[str, Any]]  # redacted
    edited_args: Mapped[dict[str, Any] | None]  # what an approver changed them to
    # an approved call's effect as its tool resolved it again when it ran (the approved one's digest)
    effect: Mapped[dict[str, Any] | None]
    result: Mapped[dict[str, Any] | None]  # the envelope the model saw, truncated and redacted
    outcome: Mapped[str]
    error: Mapped[str | None]
    approved_by: Mapped[str | None]
    # approved unasked, by this grant (grants.id) of `approved_by`
    grant_id: Mapped[int | None] = mapped_column(BigInteger)
    decision_reason: Mapped[str | None]
    policy: Mapped[dict[str, Any] | None]  # the tenant's policy decision (None: no policies)
    # the requester's roles at the call, sorted, as the rules in force read them (what `policy test`
    # replays it with); None on rows from before migration 0033
    roles: Mapped[list[str] | None] = mapped_column(JSONB(none_as_null=True))
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
    conversation_id: Mapped[str] = conversation_column()
    call_id: Mapped[str]
    tool: Mapped[str]
    approver: Mapped[str]
    decision: Mapped[str]
    accepted: Mapped[bool]
    reason: Mapped[str | None]  # why it was refused, or the reviewer's reason
    args: Mapped[dict[str, Any] | None]  # edited arguments
    # with `args`: each argument the approver changed, {name: {before (as asked), after (as approved)}}
    changes: Mapped[dict[str, Any] | None]
    # with `args`: the effect of the edited arguments, resolved when the decision was recorded (the
    # request's `effect` is the model's arguments'), and its digest: what the call must still do
    effect: Mapped[dict[str, Any] | None]
    effect_sha256: Mapped[str | None]
    # An accepted approval whose call, when it ran, resolved another effect than the one approved:
    # nothing ran, the call was asked again; `voided` is that new effect, when it was found.
    voided_at: Mapped[datetime | None]
    voided: Mapped[dict[str, Any] | None]
    created_at: Mapped[datetime] = created_at()
    attempt_key: Mapped[str | None] = mapped_column(unique=True)  # workflow id:run id:activity id
    # True: the approver was shown by a proof (APPROVER_AUTH=signed); False: the name was claimed
    proven: Mapped[bool] = mapped_column(server_default=false())
    # A quorum's accepted approval: the approvals that count after it, in order (earlier approvers
    # no longer active or entitled dropped, this one added); None otherwise, and before 0029
    counted: Mapped[list[str] | None] = mapped_column(JSONB(none_as_null=True))


class Grant(Base):
    """A reviewer's "the same again, for a while" (countersign.core.grants): minted by the accepted
    approval `decision_id`, covering later calls of `tool` by `requester` in `agent` whose resolved
    effect has the approved content (`content_sha256`, countersign.core.grants.content_digest), until
    `expires_at` or its uses run out, unless revoked, while its approver stands. Every change (a use
    spent, a revocation) is chained again (countersign.db.chain)."""

    __tablename__ = "grants"
    __table_args__ = (
        Index(None, "tenant_id", "tool", "requester", "agent", "content_sha256"),
        CheckConstraint("minutes BETWEEN 1 AND 10080", name="minutes"),
        CheckConstraint("uses BETWEEN 1 AND 100", name="uses"),
        CheckConstraint("uses_left BETWEEN 0 AND uses", name="uses_left"),
    )

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column(indexed=False)
    tool: Mapped[str]
    requester: Mapped[str]
    agent: Mapped[str]
    # grants minted before migration 0029 bound the arguments' digest, and cover nothing since
    args_sha256: Mapped[str | None]
    content_sha256: Mapped[str | None]  # None: minted before 0029
    args: Mapped[str]  # the approved arguments (JSON text), shown when the grant is listed
    decision_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("approval_decisions.id"), unique=True)
    approver: Mapped[str]
    workflow_id: Mapped[str]  # the conversation and call of the approval that minted it
    call_id: Mapped[str]
    minutes: Mapped[int]
    uses: Mapped[int]
    uses_left: Mapped[int]
    expires_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]
    revoked_by: Mapped[str | None]
    created_at: Mapped[datetime] = created_at()


class GrantUse(Base):
    """One call a grant let run unasked: keyed by the call's idempotency key, so a retried activity
    finds its use instead of spending another."""

    __tablename__ = "grant_uses"

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column(indexed=False)
    grant_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("grants.id"), index=True)
    # the grant's approval, and its approver: what the use stands on
    decision_id: Mapped[int] = mapped_column(BigInteger)
    approver: Mapped[str]
    workflow_id: Mapped[str]
    conversation_id: Mapped[str] = conversation_column()
    call_id: Mapped[str]
    idempotency_key: Mapped[str] = mapped_column(unique=True)
    created_at: Mapped[datetime] = created_at()


class Compensation(Base):
    """One compensation run per tool call: undoing it happens at most once."""

    __tablename__ = "compensations"
    __table_args__ = (
        UniqueConstraint("workflow_id", "conversation_id", "call_id"),
        one_of("state", COMPENSATION_STATES),
    )

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column()
    workflow_id: Mapped[str]
    conversation_id: Mapped[str] = conversation_column()
    call_id: Mapped[str]
    tool: Mapped[str]
    compensation: Mapped[str]  # the compensating activity's name
    state: Mapped[str] = mapped_column(server_default="pending")
    error: Mapped[str | None]
    created_at: Mapped[datetime] = created_at()
    finished_at: Mapped[datetime | None]


class AuditChainRecord(Base):
    """A tenant's audit as a hash chain: one record per fact Countersign wrote to a table of the
    audit (`source`: tool_executions, approval_requests, approval_decisions, proof_checks,
    compensations, rollback_requests, tier_changes; `source_id`: the row's primary key as a JSON
    list), appended in the transaction that wrote it (countersign.db.chain). `record` is the
    canonical JSON text hashed into `hash` after `prev_hash` (countersign.core.evidence);
    `fact_sha256` is the digest of the row as it was written, unique per row so a retried write
    appends nothing."""

    __tablename__ = "audit_chain"
    __table_args__ = (UniqueConstraint("tenant_id", "source", "source_id", "fact_sha256"),)

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    source: Mapped[str]
    source_id: Mapped[str]
    fact_sha256: Mapped[str]
    record: Mapped[str]
    prev_hash: Mapped[str]
    hash: Mapped[str]
    created_at: Mapped[datetime] = created_at()


class RateLimitBucket(Base):
    """A token bucket per tenant and tool, and per user of it (`user_id`; "" is the tenant's own
    bucket), refilled lazily from `updated_at` under a row lock."""

    __tablename__ = "rate_limit_buckets"

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), primary_key=True)
    tool: Mapped[str] = mapped_column(primary_key=True)
    user_id: Mapped[str] = mapped_column(primary_key=True, server_default="")
    tokens: Mapped[float]
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())


class TenantRateLimit(Base):
    """A tenant's tool-call rate limits (countersign/db/ratelimit.py): for one tool, or `*` for
    every tool without its own row; the tenant's shared bucket and each user's own. No row: the
    worker's limits (`RATE_LIMIT_*`). Seeded for the demo tenants; set with `users rate-limit`."""

    __tablename__ = "tenant_rate_limits"
    __table_args__ = (
        CheckConstraint("per_s > 0 AND burst >= 1", name="tenant_limit"),
        CheckConstraint("user_per_s > 0 AND user_burst >= 1", name="user_limit"),
    )

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), primary_key=True)
    tool: Mapped[str] = mapped_column(primary_key=True)
    per_s: Mapped[float]
    burst: Mapped[float]
    user_per_s: Mapped[float]
    user_burst: Mapped[float]
    updated_at: Mapped[datetime] = updated_at()


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
    proven: Mapped[bool] = mapped_column(server_default=false())  # as in ApprovalDecision


class ModelCall(Base):
    """The usage audit: one row per model call a turn made (tokens, time, how the reply ended).

    Keyed by `attempt_key` (workflow id:run id:activity id, see activities/attempts.py): a retried
    model call keeps its first row.
    """

    __tablename__ = "model_calls"
    __table_args__ = (Index(None, "tenant_id", "created_at"),)

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column(indexed=False)
    agent: Mapped[str]
    workflow_id: Mapped[str]
    turn: Mapped[int]
    model: Mapped[str]
    prompt_tokens: Mapped[int]
    completion_tokens: Mapped[int]
    tool_calls: Mapped[int]  # how many tool calls the reply asked for
    finish_reason: Mapped[str | None]
    duration_ms: Mapped[int]
    created_at: Mapped[datetime] = created_at()
    attempt_key: Mapped[str] = mapped_column(unique=True)


# --- MCP servers (countersign/mcp/): tools of other processes, under the same gates -----------------

MCP_TRANSPORTS = ("stdio", "http")


class McpServer(Base):
    """An MCP server some agents use. Secrets are never stored: `env` and `headers` map a name to
    the *name* of a variable in the worker's environment, read when the worker connects."""

    __tablename__ = "mcp_servers"
    __table_args__ = (
        one_of("transport", MCP_TRANSPORTS),
        CheckConstraint(
            "(transport = 'stdio' AND command IS NOT NULL AND url IS NULL)"
            " OR (transport = 'http' AND url IS NOT NULL AND command IS NULL)",
            name="target",
        ),
    )

    name: Mapped[str] = mapped_column(primary_key=True)
    transport: Mapped[str]
    command: Mapped[list[str] | None] = mapped_column(JSONB(none_as_null=True))  # argv of a stdio server
    url: Mapped[str | None]  # endpoint of a streamable HTTP server
    env: Mapped[dict[str, Any]] = mapped_column(server_default=text("'{}'::jsonb"))  # KEY -> env var name
    headers: Mapped[dict[str, Any]] = mapped_column(server_default=text("'{}'::jsonb"))  # header -> env var
    agents: Mapped[list[str]]
    tenant_id: Mapped[str | None] = mapped_column(ForeignKey("tenants.id"))  # None: every tenant
    # The tools as last listed (name, description, annotations, inputSchema): what `permissions show`
    # prints and what policies naming them are checked against (a row kept before inputSchema was
    # has none: its tools are nameable once a worker lists them again, at a conversation's start).
    tools: Mapped[list[Any] | None] = mapped_column(JSONB(none_as_null=True))
    created_at: Mapped[datetime] = created_at()


# --- conversations: the message store, context policies, token budgets, saga entries (0008) -------

MESSAGE_ROLES = ("system", "user", "assistant", "tool")


class ConversationMessage(Base):
    """The conversation store: every message of a conversation, append-only, by sequence number.

    The workflow allocates `seq`; a retried write of the same (workflow_id, seq) changes nothing. A
    user message's `message_id` is unique per conversation: a redelivered message is refused.
    Usage columns are set on model replies and summaries: a tenant's tokens per day sum them.
    """

    __tablename__ = "conversation_messages"
    __table_args__ = (
        UniqueConstraint("workflow_id", "conversation_id", "message_id"),
        Index(None, "tenant_id", "created_at"),
        one_of("role", MESSAGE_ROLES),
    )

    workflow_id: Mapped[str] = mapped_column(primary_key=True)
    conversation_id: Mapped[str] = conversation_column(primary_key=True)
    seq: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[str] = tenant_column(indexed=False)
    role: Mapped[str]
    content: Mapped[str | None]
    tool_calls: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB)
    tool_call_id: Mapped[str | None]
    name: Mapped[str | None]
    message_id: Mapped[str | None]
    prompt_tokens: Mapped[int] = mapped_column(server_default=text("0"))
    completion_tokens: Mapped[int] = mapped_column(server_default=text("0"))
    created_at: Mapped[datetime] = created_at()


EVENT_KINDS = (
    "message",
    "delta",
    "tool_call",
    "tool_result",
    "approval",
    "question",
    "rollback",
    "turn",
    "ended",
)


class ConversationEvent(Base):
    """What a conversation's readers are told as it happens (the chat page, the CLI): the model's
    text as it streams, tool calls and results, approvals, questions, rollbacks, turns. Written by
    the activities that make these things happen, outside workflow history; `id` orders them and is
    the events stream's `Last-Event-ID`. `key` makes an event written by a retried activity land
    once (deltas have none: a new attempt announces itself instead). A NOTIFY on channel
    `conversation_events` (payload: the workflow id) wakes the readers.
    """

    __tablename__ = "conversation_events"
    __table_args__ = (
        UniqueConstraint("workflow_id", "conversation_id", "key"),
        Index(None, "workflow_id", "id"),
        one_of("kind", EVENT_KINDS),
    )

    id: Mapped[int] = identity_pk()
    workflow_id: Mapped[str]
    conversation_id: Mapped[str] = conversation_column()
    tenant_id: Mapped[str] = tenant_column(indexed=False)
    kind: Mapped[str]
    data: Mapped[dict[str, Any]] = mapped_column(JSONB)
    key: Mapped[str | None]
    created_at: Mapped[datetime] = created_at()


class ContextPolicy(Base):
    """What of a conversation the agent's model sees and may spend: a window by messages and by
    (estimated) tokens, a running summary of what falls out, a token budget per conversation.
    None: no bound. No row: no bounds at all."""

    __tablename__ = "context_policies"

    agent: Mapped[str] = mapped_column(
        ForeignKey("agent_profiles.name", ondelete="CASCADE"), primary_key=True
    )
    window_messages: Mapped[int | None]
    window_tokens: Mapped[int | None]
    summarize: Mapped[bool] = mapped_column(server_default=false())
    conversation_tokens: Mapped[int | None] = mapped_column(BigInteger)


class TenantTokenBudget(Base):
    """Model tokens (prompt + completion) a tenant may spend per UTC day, all conversations together."""

    __tablename__ = "tenant_token_budgets"

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), primary_key=True)
    tokens_per_day: Mapped[int] = mapped_column(BigInteger)


class SagaRecord(Base):
    """A compensable call that executed, written in the transaction of its effect: what a rollback
    after the conversation ended undoes (with `compensations` saying what was undone already)."""

    __tablename__ = "saga_entries"

    workflow_id: Mapped[str] = mapped_column(primary_key=True)
    conversation_id: Mapped[str] = conversation_column(primary_key=True)
    call_id: Mapped[str] = mapped_column(primary_key=True)
    tenant_id: Mapped[str] = tenant_column()
    caller: Mapped[dict[str, Any]]
    tool: Mapped[str]
    turn: Mapped[int]
    arguments: Mapped[str]  # as executed, not redacted: the compensation validates them again
    created_at: Mapped[datetime] = created_at()


class ProofCheck(Base):
    """Every proof a worker checked (APPROVER_AUTH=signed), accepted or refused with the reason.
    `jti` is set on accepted checks only and is unique: a proof counts once, a replay is refused."""

    __tablename__ = "proof_checks"
    __table_args__ = (Index(None, "workflow_id", "target"),)

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column()
    workflow_id: Mapped[str]
    action: Mapped[str]  # approve, reject, answer, rollback, end
    target: Mapped[str]  # a call id, `conversation`, `<scope>:<call id>`
    actor: Mapped[str]  # the name the payload gave
    subject: Mapped[str | None]  # whom the proof was issued to, when it could be read
    jti: Mapped[str | None] = mapped_column(unique=True)
    accepted: Mapped[bool]
    reason: Mapped[str | None]
    attempt_key: Mapped[str | None]  # the checking activity invocation
    created_at: Mapped[datetime] = created_at()


class NotificationOutbox(Base):
    """Reviewers' notifications (approval requested, reminder, escalation) by email or webhook,
    queued once per key and delivered at least once: `sent` only after the SMTP server or the
    webhook receiver accepted it. Apart from `email_outbox`, which holds what agents send."""

    __tablename__ = "notification_outbox"
    __table_args__ = (one_of("status", NOTICE_STATUSES), one_of("channel", NOTICE_CHANNELS))

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column()
    idempotency_key: Mapped[str] = mapped_column(unique=True)  # notice:workflow:call:kind:channel[:user]
    channel: Mapped[str]
    recipient: Mapped[str]  # an email address, or WEBHOOK_RECIPIENT (the tenant's URL, read when sent)
    subject: Mapped[str]
    body: Mapped[str]
    payload: Mapped[dict[str, Any] | None]  # the webhook's JSON
    status: Mapped[str] = mapped_column(server_default="queued")
    attempts: Mapped[int] = mapped_column(server_default=text("0"))
    error: Mapped[str | None]
    created_at: Mapped[datetime] = created_at()
    sent_at: Mapped[datetime | None]


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


LOGIN_METHODS = ("password", "oidc")
LOGIN_OUTCOMES = ("accepted", "bad_credentials", "throttled", "refused")


class InboxSession(Base):
    """A session the inbox issued; its id is the session token's `jti`. The token counts only while
    this row exists (removing the user removes it), is not revoked and has not expired, and while
    the user's password hash still matches `credential_tag` (a password change ends it)."""

    __tablename__ = "inbox_sessions"
    __table_args__ = (
        ForeignKeyConstraint(["tenant_id", "user_id"], ["users.tenant_id", "users.id"], ondelete="CASCADE"),
        Index(None, "tenant_id", "user_id"),
        one_of("method", LOGIN_METHODS),
    )

    id: Mapped[str] = mapped_column(primary_key=True)
    tenant_id: Mapped[str]
    user_id: Mapped[str]
    method: Mapped[str]
    credential_tag: Mapped[str]
    created_at: Mapped[datetime] = created_at()
    expires_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]


class LoginAttempt(Base):
    """Every inbox login, by password or OIDC, accepted or refused with the reason. The rate limit
    counts recent `bad_credentials` rows. `tenant_id` has no foreign key: a refused login may name a
    tenant that does not exist."""

    __tablename__ = "login_attempts"
    __table_args__ = (
        Index(None, "tenant_id", "user_id", "created_at"),
        Index(None, "client", "created_at"),
        one_of("method", LOGIN_METHODS),
        one_of("outcome", LOGIN_OUTCOMES),
    )

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str]
    user_id: Mapped[str]
    client: Mapped[str]  # the client's address
    method: Mapped[str]
    outcome: Mapped[str]
    reason: Mapped[str | None]
    created_at: Mapped[datetime] = created_at()


# --- the front door: conversations the server started, API tokens, requesters' actions -----------

REQUEST_VIAS = ("session", "token", "worker")
AUTH_MODES = ("signed", "names")


class Conversation(Base):
    """Whose conversation a workflow id is: written by the server when it starts one (before
    Temporal sees the start), so that every later request is checked against this row, never against
    what a query of the workflow claims. `proven`: the start carried a proof the server minted
    (signed mode). `auth_mode` is the deployment's mode when it started.

    `conversation_id` is the conversation instance now under the workflow id: its first run's id
    (given by Temporal, the same across continue-as-new), written by that run before it stores or
    reads anything (`register_conversation`; a start that bypassed the server gets its row there,
    `started_via` "worker"). Every stored row of the conversation carries it and every read names it:
    a keyed conversation that ended is followed by a new instance under the same workflow id, and
    this row then names the new one, with its owner. "" for a conversation from before instances;
    None until the first run registers."""

    __tablename__ = "conversations"
    __table_args__ = (
        user_fk("user_id"),
        Index(None, "tenant_id", "user_id", "created_at"),
        one_of("started_via", REQUEST_VIAS),
        one_of("auth_mode", AUTH_MODES),
    )

    workflow_id: Mapped[str] = mapped_column(primary_key=True)
    tenant_id: Mapped[str] = tenant_column(indexed=False)
    user_id: Mapped[str]
    agent: Mapped[str]
    key: Mapped[str | None]  # a keyed conversation's key (`send --conversation KEY`)
    started_via: Mapped[str]
    token_name: Mapped[str | None]  # the API token that started it, if one did
    auth_mode: Mapped[str]
    created_at: Mapped[datetime] = created_at()
    conversation_id: Mapped[str | None]


class ApiToken(Base):
    """A machine client's credential: scoped to one tenant and the users it may act for (`act_as`).
    Only the SHA-256 of its 32-byte random secret is kept; the secret is shown once, at creation."""

    __tablename__ = "api_tokens"
    __table_args__ = (UniqueConstraint("tenant_id", "name"),)

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column(indexed=False)
    name: Mapped[str]
    secret_sha256: Mapped[str] = mapped_column(unique=True)
    act_as: Mapped[list[str]]
    created_at: Mapped[datetime] = created_at()
    revoked_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]


class RequesterAction(Base):
    """Every request to the conversation API, accepted or refused: who asked (the person, or the
    token and the user it acted for), what, on which conversation, and the answer's status.
    `tenant_id` has no foreign key: a refused request may name anything."""

    __tablename__ = "requester_actions"
    __table_args__ = (Index(None, "tenant_id", "created_at"), Index(None, "token_id", "created_at"))

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str]
    user_id: Mapped[str]
    via: Mapped[str]
    token_id: Mapped[int | None] = mapped_column(BigInteger)
    action: Mapped[str]  # start, message, answer, rollback, end, status, transcript, audit, mcp, agui
    workflow_id: Mapped[str | None]
    status: Mapped[int]
    reason: Mapped[str | None]
    created_at: Mapped[datetime] = created_at()


class DeploymentSetting(Base):
    """Settings that belong to the deployment, not to one process: `auth_mode` (signed or names),
    which every worker reads at start and refuses to run against (countersign.identity.mode)."""

    __tablename__ = "deployment_settings"

    name: Mapped[str] = mapped_column(primary_key=True)
    value: Mapped[str]
    set_at: Mapped[datetime] = updated_at()


# --- spent seals, recorded approval requests (0020) ----------------------------------------------

APPROVAL_REQUEST_STATES = ("pending", "approved", "rejected", "expired")


class SpentSeal(Base):
    """A carried-state seal a run was started with: a seal counts for the one run that used it
    first (`run_id`); any other run presenting it is refused as a replay."""

    __tablename__ = "spent_seals"

    seal: Mapped[str] = mapped_column(primary_key=True)
    tenant_id: Mapped[str]  # no foreign key: a refused start may name a tenant that does not exist
    workflow_id: Mapped[str]
    conversation_id: Mapped[str]
    run_id: Mapped[str]
    created_at: Mapped[datetime] = created_at()


class McpContinuation(Base):
    """A waiting MCP tool call's request state (countersign/core/continuation.py), spent: a state
    counts once; presenting it again is refused as a replay."""

    __tablename__ = "mcp_continuations"

    nonce: Mapped[str] = mapped_column(primary_key=True)
    tenant_id: Mapped[str]  # no foreign key, like spent_seals
    workflow_id: Mapped[str]
    call_id: Mapped[str]
    created_at: Mapped[datetime] = created_at()


class ApprovalRequest(Base):
    """An approval the real worker recorded: what reviewers are shown, and what their proofs bind.

    Written by an activity when the conversation asks for the approval (never from a query's
    answer, which any worker polling the task queue could give), closed when it is decided or
    expires. `nonce` is the conversation's own (workflow.uuid4()) for this approval: a proof names
    it, with the tool, the risk, the instance, the arguments' digest and the effect's: what the
    call will do, resolved by the tool when the request was recorded (countersign.core.effects;
    None on requests recorded before effects).
    """

    __tablename__ = "approval_requests"
    __table_args__ = (
        Index(None, "tenant_id", "state", "expires_at"),
        Index(None, "workflow_id", "call_id"),
        one_of("state", APPROVAL_REQUEST_STATES),
        one_of("risk", RISKS),
    )

    conversation_id: Mapped[str] = mapped_column(primary_key=True)
    call_id: Mapped[str] = mapped_column(primary_key=True)
    workflow_id: Mapped[str]
    tenant_id: Mapped[str] = tenant_column(indexed=False)
    agent: Mapped[str]
    tool: Mapped[str]
    risk: Mapped[str]
    args: Mapped[str]  # the exact JSON text the tool would receive
    args_sha256: Mapped[str]
    nonce: Mapped[str]
    requested_by: Mapped[str]
    requested_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    hints: Mapped[str | None]
    description: Mapped[str | None]  # an MCP tool's, from the conversation's snapshot
    parameters: Mapped[dict[str, Any] | None]  # an MCP tool's input schema, from the snapshot
    effect: Mapped[dict[str, Any] | None]  # countersign.core.effects.Effect as JSON
    effect_sha256: Mapped[str | None]  # Effect.digest
    state: Mapped[str] = mapped_column(server_default="pending")
    decided_by: Mapped[str | None]
    closed_at: Mapped[datetime | None]
    # Asked again: who approved this call's earlier request, voided because what the call would do
    # changed between that decision and its execution (approval_decisions.voided_at), and the effect
    # that request showed (what changed since is it against `effect`).
    voided_by: Mapped[str | None]
    voided_effect: Mapped[dict[str, Any] | None]
    # How many distinct approvers the call needs (a policy's @approvals; 1 otherwise), and the
    # tenant's policy decision on it (countersign.core.cedar_policy.PolicyDecision; None: no policies).
    approvals_required: Mapped[int] = mapped_column(server_default=text("1"))
    policy: Mapped[dict[str, Any] | None]


# --- the tenant's chat channel (send_chat_message) --------------------------------------------------

CHAT_KINDS = ("telegram", "slack")
CHAT_POST_STATUSES = ("sending", "sent", "failed")
CHAT_TURN_STATES = ("open", "waiting", "done")
# The highest risk a press in the chat may decide (0032): "none", or a risk and every lower one.
CHAT_DECIDES = ("none", *RISKS)


class ChatChannel(Base):
    """A tenant's chat channel for `send_chat_message`: a Telegram-bot-API-compatible endpoint
    (`endpoint` is the API's base URL, `bot_token` and `chat_id` say which bot posts where), a
    Slack-Web-API-compatible one (the same, `bot_token` the app's bot token) or a Slack-compatible
    incoming webhook (`endpoint` is the webhook URL, itself the secret). Set by an
    operator (`countersign channels set`, or the admin API); no tool reads this row back to the
    model, and no log, audit row or API answer carries the endpoint, the token or the webhook secret.
    They are stored encrypted with the deployment's key (countersign/db/sealed.py).

    `webhook_secret` lets the channel write to us (countersign/server/channels.py): Telegram's
    `secret_token` (sent back as X-Telegram-Bot-Api-Secret-Token), or Slack's signing secret."""

    __tablename__ = "chat_channels"
    __table_args__ = (one_of("kind", CHAT_KINDS), one_of("decides_up_to", CHAT_DECIDES))

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), primary_key=True)
    kind: Mapped[str]
    endpoint: Mapped[str] = mapped_column(SealedText("chat_channels"))
    bot_token: Mapped[str | None] = mapped_column(SealedText("chat_channels"))  # none: a Slack webhook
    chat_id: Mapped[str | None]  # the review chat, where cards go (none: a Slack webhook)
    name: Mapped[str]  # what the model and reviewers are told ("#sales", "Sales group")
    created_at: Mapped[datetime] = created_at()
    webhook_secret: Mapped[str | None] = mapped_column(SealedText("chat_channels"))  # inbound only
    # The tenant admin's setting (0032): a card of a call up to this risk gets Approve and Reject in
    # the chat; a riskier one only "Open in inbox" ("none": every call is decided in the inbox).
    decides_up_to: Mapped[str] = mapped_column(server_default="high")


class ChatSender(Base):
    """Who a chat channel's sender is here: a Telegram user id or a Slack user id, mapped by an
    operator to one of the tenant's users, and the conversation their messages go to (started on
    their first message, started again once it ended)."""

    __tablename__ = "chat_senders"
    __table_args__ = (user_fk("user_id"),)

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), primary_key=True)
    sender: Mapped[str] = mapped_column(primary_key=True)  # the channel's own user id
    user_id: Mapped[str]
    agent: Mapped[str]  # the agent their conversation is with
    workflow_id: Mapped[str | None]  # their current conversation
    created_at: Mapped[datetime] = created_at()


class ChatTurn(Base):
    """A message a chat channel delivered, whose outcome is owed to the chat it came from
    (countersign/server/channels.py): `open` until its turn replied or said it waits, `waiting`
    once "waiting for a person" was posted, `done` once the outcome was claimed for posting. A
    server that starts again follows every turn not `done`: nothing is lost to a restart."""

    __tablename__ = "chat_turns"

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), primary_key=True)
    message_id: Mapped[str] = mapped_column(primary_key=True)  # the channel's ("telegram-<update_id>")
    workflow_id: Mapped[str] = mapped_column(index=True)
    user_id: Mapped[str]  # who the mapped sender is: the conversation is theirs
    chat: Mapped[str]  # where the outcome goes (Telegram's chat id; Slack's channel)
    thread: Mapped[str | None]  # Slack: the thread the outcome goes to (the message's own ts) (0032)
    state: Mapped[str] = mapped_column(server_default="open")
    created_at: Mapped[datetime] = created_at()
    updated_at: Mapped[datetime] = updated_at()

    __table_args__ = (one_of("state", CHAT_TURN_STATES),)


class ChatCard(Base):
    """A pending approval posted to a channel's review chat with its buttons (Telegram's inline
    keyboard, Slack's Block Kit): a press names the card by `id` (a button's data is short), and
    decides as the sender's linked user through the inbox's decision path
    (countersign/server/channels.py)."""

    __tablename__ = "chat_cards"
    __table_args__ = (UniqueConstraint("tenant_id", "nonce"),)

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column(indexed=False)
    workflow_id: Mapped[str]
    call_id: Mapped[str]
    nonce: Mapped[str]  # the approval request's own: a call asked again gets a card of its own
    chat: Mapped[str]  # the review chat it was posted to
    remote_id: Mapped[str | None]  # the channel's message id, to edit it once decided
    created_at: Mapped[datetime] = created_at()


class ChatReasonAsk(Base):
    """A Reject press waiting for its reason (0032): the presser was asked to reply with it, to the
    message `prompt` (Telegram: the force_reply prompt's message id; Slack: the card's thread ts);
    their reply there rejects the card's call with that reason, through the inbox's decision path."""

    __tablename__ = "chat_reason_asks"

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), primary_key=True)
    sender: Mapped[str] = mapped_column(primary_key=True)  # the presser's chat id
    prompt: Mapped[str] = mapped_column(primary_key=True)
    card_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("chat_cards.id", ondelete="CASCADE"))
    answered_by: Mapped[str | None]  # the reply that gave the reason (a redelivered one decides once)
    created_at: Mapped[datetime] = created_at()


class WebhookRefusal(Base):
    """Webhook requests refused for a wrong secret or signature, counted per tenant, channel kind,
    source address and minute (issue 53, item 5): the first of a window is a chained `input_audit`
    record, the rest only raise `count` here (no chain lock), and past a limit they answer 429."""

    __tablename__ = "webhook_refusals"

    tenant_id: Mapped[str] = mapped_column(primary_key=True)  # no foreign key, like input_audit
    kind: Mapped[str] = mapped_column(primary_key=True)
    source: Mapped[str] = mapped_column(primary_key=True)  # the client's address
    window_start: Mapped[datetime] = mapped_column(primary_key=True)
    count: Mapped[int]
    reason: Mapped[str]  # the latest refusal's


class ChatPost(Base):
    """One post of `send_chat_message`, claimed (`sending`) and committed before the request goes
    out, keyed by the call's idempotency key: a retried attempt finds the claim and never posts a
    second time (a claim still `sending` is an outcome it cannot know, and says so)."""

    __tablename__ = "chat_posts"
    __table_args__ = (one_of("status", CHAT_POST_STATUSES),)

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column()
    idempotency_key: Mapped[str] = mapped_column(unique=True)
    kind: Mapped[str]
    text: Mapped[str]
    status: Mapped[str] = mapped_column(server_default="sending")
    remote_id: Mapped[str | None]  # the channel's message id, when it gives one
    error: Mapped[str | None]
    created_at: Mapped[datetime] = created_at()
    sent_at: Mapped[datetime | None]


# --- what people say of the replies they get (0029) ----------------------------------------------

RATINGS = ("helpful", "not_helpful")
RATED_VIAS = ("session", "token", "chat")


class ReplyRating(Base):
    """A requester's rating of an agent's reply (the turn's closing message, `reply_seq` in the
    conversation store): helpful or not, with an optional comment. One per reply: rating it again
    replaces the rating, and both are in the tenant's chain (countersign/db/chain.py CHAINED).
    `tools`: the tools the turn called, so that ratings sum per tool as well as per agent."""

    __tablename__ = "reply_ratings"
    __table_args__ = (
        UniqueConstraint("workflow_id", "conversation_id", "turn"),
        Index(None, "tenant_id", "updated_at"),
        user_fk("user_id"),
        one_of("rating", RATINGS),
        one_of("rated_via", RATED_VIAS),
    )

    id: Mapped[int] = identity_pk()
    tenant_id: Mapped[str] = tenant_column(indexed=False)
    workflow_id: Mapped[str]
    conversation_id: Mapped[str]
    turn: Mapped[int]
    reply_seq: Mapped[int]
    agent: Mapped[str]
    user_id: Mapped[str]  # the conversation's user: only they rate its replies
    rating: Mapped[str]
    comment: Mapped[str | None]
    rated_via: Mapped[str]
    tools: Mapped[list[str]]
    created_at: Mapped[datetime] = created_at()
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())  # when the rating held was given
