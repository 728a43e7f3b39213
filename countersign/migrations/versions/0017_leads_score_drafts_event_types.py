"""Lead scores from engagement, drafts kept for later, and calendar event types (issue 24).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-25

`lead_events` keeps what happened to a lead that no other table keeps (its status changes and the
replies it sent); with the emails delivered (`email_outbox`) and meetings booked (`calendar_events`)
it is what `leads.score` is computed from. `email_drafts` gains `updated_at` (a draft can be edited)
and `sent_outbox_id` (the email `send_draft` queued from it). `calendar_events.type` is one of a fixed
list; existing events are meetings.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

EVENT_TYPES = ("meeting", "call", "demo", "deadline", "reminder", "other")


def upgrade() -> None:
    op.create_table(
        "lead_events",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("lead_id", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("previous_status", sa.Text(), nullable=True),
        sa.Column("status", sa.Text(), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("created_by", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint("kind IN ('status_changed', 'email_answered')", name="ck_lead_events_kind"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_lead_events_tenant_id_tenants"),
        sa.ForeignKeyConstraint(
            ["lead_id"], ["leads.id"], name="fk_lead_events_lead_id_leads", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_lead_events"),
    )
    op.create_index("ix_lead_events_tenant_id_lead_id", "lead_events", ["tenant_id", "lead_id"])
    op.add_column(
        "email_drafts",
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )
    op.add_column("email_drafts", sa.Column("sent_outbox_id", sa.BigInteger(), nullable=True))
    op.add_column("calendar_events", sa.Column("type", sa.Text(), server_default="meeting", nullable=False))
    allowed = ", ".join(f"'{t}'" for t in EVENT_TYPES)
    op.create_check_constraint("ck_calendar_events_type", "calendar_events", f"type IN ({allowed})")


def downgrade() -> None:
    op.drop_constraint("ck_calendar_events_type", "calendar_events")
    op.drop_column("calendar_events", "type")
    op.drop_column("email_drafts", "sent_outbox_id")
    op.drop_column("email_drafts", "updated_at")
    op.drop_index("ix_lead_events_tenant_id_lead_id", "lead_events")
    op.drop_table("lead_events")
