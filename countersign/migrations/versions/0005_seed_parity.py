"""Seed parity: per-agent limits, cases, lead engagement, email drafts and HTML, audit index by tool.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23

- `agent_profiles.limits`: the agent's bounds on a turn (`max_iterations`, `turn_timeout_s`, ...);
  a conversation may ask for less, never more (countersign/core/limits.py `within_agent_bounds`).
- `cases`: the case-researcher agent's records, one tenant's each, the client contact by email.
- `leads.score` (0-100) and `leads.last_engaged_at`, shown by the lead tools.
- `email_drafts`: what `draft_email` stores (nothing leaves); `email_outbox.html_body` (sanitised
  before it is stored) and `email_outbox.lead_id` (the lead an email was about).
- `ix_tool_executions_tool_created_at`: `stats` and operators' per-tool queries over a time range.
- `users.tz` (IANA name) and `meeting_sessions`: schedule_meeting's negotiation (proposals, a
  30-minute expiry, the counterpart's zone, the booked event once confirm_meeting picks one).

Written by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = sa.DateTime(timezone=True)
NOW = sa.text("now()")


def upgrade() -> None:
    op.add_column(
        "agent_profiles",
        sa.Column("limits", JSONB(), server_default=sa.text("'{}'::jsonb"), nullable=False),
    )
    op.create_index("ix_tool_executions_tool_created_at", "tool_executions", ["tool", "created_at"])

    op.add_column("leads", sa.Column("score", sa.Integer(), nullable=True))
    op.add_column("leads", sa.Column("last_engaged_at", TZ, nullable=True))
    op.create_check_constraint("ck_leads_score_range", "leads", "score BETWEEN 0 AND 100")

    op.create_table(
        "cases",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), server_default="open", nullable=False),
        sa.Column("contact_email", sa.Text(), nullable=True),
        sa.Column("notes", sa.Text(), nullable=True),
        sa.Column("created_at", TZ, server_default=NOW, nullable=False),
        sa.Column("updated_at", TZ, server_default=NOW, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_cases"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_cases_tenant_id_tenants"),
        sa.UniqueConstraint("tenant_id", "title", name="uq_cases_tenant_id_title"),
        sa.CheckConstraint("status IN ('open', 'in_progress', 'on_hold', 'closed')", name="ck_cases_status"),
    )

    op.add_column("email_outbox", sa.Column("html_body", sa.Text(), nullable=True))
    op.add_column("email_outbox", sa.Column("lead_id", sa.BigInteger(), nullable=True))
    op.create_table(
        "email_drafts",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=False),
        sa.Column("created_by", sa.Text(), nullable=False),
        sa.Column("to_address", sa.Text(), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("html_body", sa.Text(), nullable=True),
        sa.Column("lead_id", sa.BigInteger(), nullable=True),
        sa.Column("created_at", TZ, server_default=NOW, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_email_drafts"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_email_drafts_tenant_id_tenants"),
        sa.UniqueConstraint("idempotency_key", name="uq_email_drafts_idempotency_key"),
    )
    op.create_index("ix_email_drafts_tenant_id", "email_drafts", ["tenant_id"])

    op.add_column("users", sa.Column("tz", sa.Text(), server_default="UTC", nullable=False))
    op.create_table(
        "meeting_sessions",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=False),
        sa.Column("requested_by", sa.Text(), nullable=False),
        sa.Column("counterpart_name", sa.Text(), nullable=False),
        sa.Column("counterpart_email", sa.Text(), nullable=False),
        sa.Column("counterpart_user_id", sa.Text(), nullable=True),
        sa.Column("counterpart_tz", sa.Text(), nullable=False),
        sa.Column("title", sa.Text(), nullable=True),
        sa.Column("duration_minutes", sa.Integer(), nullable=False),
        sa.Column("proposals", JSONB(), nullable=False),
        sa.Column("status", sa.Text(), server_default="open", nullable=False),
        sa.Column("expires_at", TZ, nullable=False),
        sa.Column("event_id", sa.BigInteger(), nullable=True),
        sa.Column("notification_id", sa.BigInteger(), nullable=True),
        sa.Column("created_at", TZ, server_default=NOW, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_meeting_sessions"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_meeting_sessions_tenant_id_tenants"),
        sa.ForeignKeyConstraint(
            ["tenant_id", "requested_by"],
            ["users.tenant_id", "users.id"],
            name="fk_meeting_sessions_tenant_id_requested_by_users",
        ),
        sa.UniqueConstraint("idempotency_key", name="uq_meeting_sessions_idempotency_key"),
        sa.CheckConstraint("status IN ('open', 'confirmed', 'cancelled')", name="ck_meeting_sessions_status"),
    )
    op.create_index("ix_meeting_sessions_tenant_id", "meeting_sessions", ["tenant_id"])


def downgrade() -> None:
    op.drop_index("ix_meeting_sessions_tenant_id", table_name="meeting_sessions")
    op.drop_table("meeting_sessions")
    op.drop_column("users", "tz")
    op.drop_index("ix_email_drafts_tenant_id", table_name="email_drafts")
    op.drop_table("email_drafts")
    op.drop_column("email_outbox", "lead_id")
    op.drop_column("email_outbox", "html_body")
    op.drop_table("cases")
    op.drop_constraint("ck_leads_score_range", "leads", type_="check")
    op.drop_column("leads", "last_engaged_at")
    op.drop_column("leads", "score")
    op.drop_index("ix_tool_executions_tool_created_at", table_name="tool_executions")
    op.drop_column("agent_profiles", "limits")
