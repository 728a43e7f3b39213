"""Conversation events: what the chat page and the CLI are told as a conversation happens.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-25

`conversation_events` holds the user's messages, the model's text as it streams (`delta`), tool
calls and results, approvals, questions, rollbacks and turns, written by the activities outside
workflow history; the bigserial `id` is the events stream's `Last-Event-ID`. Readers are woken
by NOTIFY on channel `conversation_events`.

Written by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "conversation_events",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("workflow_id", sa.Text(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("data", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("key", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(
            "kind IN ('message', 'delta', 'tool_call', 'tool_result', 'approval', 'question', 'rollback', "
            "'turn', 'ended')",
            name="ck_conversation_events_kind",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_conversation_events_tenant_id_tenants"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_conversation_events"),
        sa.UniqueConstraint("workflow_id", "key", name="uq_conversation_events_workflow_id_key"),
    )
    op.create_index("ix_conversation_events_workflow_id_id", "conversation_events", ["workflow_id", "id"])


def downgrade() -> None:
    op.drop_table("conversation_events")
