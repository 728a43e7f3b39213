"""Conversation store: messages by sequence number, context policies, token budgets, saga entries.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23

Message bodies leave workflow history for `conversation_messages`; `context_policies` bound what
the model sees and spends per agent; `tenant_token_budgets` bound a tenant's tokens per day;
`saga_entries` keep what a rollback after the end of a conversation undoes.

Written by hand and frozen, like 0001.
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def created_at() -> sa.Column[Any]:
    return sa.Column(
        "created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
    )


def upgrade() -> None:
    op.create_table(
        "conversation_messages",
        sa.Column("workflow_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("content", sa.Text(), nullable=True),
        sa.Column("tool_calls", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("tool_call_id", sa.Text(), nullable=True),
        sa.Column("name", sa.Text(), nullable=True),
        sa.Column("message_id", sa.Text(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), server_default=sa.text("0"), nullable=False),
        created_at(),
        sa.PrimaryKeyConstraint("workflow_id", "seq", name="pk_conversation_messages"),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_conversation_messages_tenant_id_tenants"
        ),
        sa.UniqueConstraint(
            "workflow_id", "message_id", name="uq_conversation_messages_workflow_id_message_id"
        ),
        sa.CheckConstraint(
            "role IN ('system', 'user', 'assistant', 'tool')", name="ck_conversation_messages_role"
        ),
    )
    op.create_index(
        "ix_conversation_messages_tenant_id_created_at", "conversation_messages", ["tenant_id", "created_at"]
    )
    op.create_table(
        "context_policies",
        sa.Column("agent", sa.Text(), nullable=False),
        sa.Column("window_messages", sa.Integer(), nullable=True),
        sa.Column("window_tokens", sa.Integer(), nullable=True),
        sa.Column("summarize", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("conversation_tokens", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("agent", name="pk_context_policies"),
        sa.ForeignKeyConstraint(
            ["agent"],
            ["agent_profiles.name"],
            name="fk_context_policies_agent_agent_profiles",
            ondelete="CASCADE",
        ),
    )
    op.create_table(
        "tenant_token_budgets",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("tokens_per_day", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", name="pk_tenant_token_budgets"),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_tenant_token_budgets_tenant_id_tenants"
        ),
    )
    op.create_table(
        "saga_entries",
        sa.Column("workflow_id", sa.Text(), nullable=False),
        sa.Column("call_id", sa.Text(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("caller", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("tool", sa.Text(), nullable=False),
        sa.Column("turn", sa.Integer(), nullable=False),
        sa.Column("arguments", sa.Text(), nullable=False),
        created_at(),
        sa.PrimaryKeyConstraint("workflow_id", "call_id", name="pk_saga_entries"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_saga_entries_tenant_id_tenants"),
    )
    op.create_index("ix_saga_entries_tenant_id", "saga_entries", ["tenant_id"])


def downgrade() -> None:
    op.drop_table("saga_entries")
    op.drop_table("tenant_token_budgets")
    op.drop_table("context_policies")
    op.drop_index("ix_conversation_messages_tenant_id_created_at", "conversation_messages")
    op.drop_table("conversation_messages")
