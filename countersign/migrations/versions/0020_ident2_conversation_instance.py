"""Conversation instances: stored rows belong to one instance, seals are spent once, approvals are
recorded by the worker.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-25

A workflow id names a conversation only while it runs: Temporal starts a closed one's id again, and
rows keyed by workflow id alone were then served to the new conversation. The front door's
`conversations` row of a workflow id names the instance now under it (`conversation_id`, the first
run's id; "" for conversations from before, None until the first run registers), and may be written
by a worker for a start that bypassed the server (`started_via` "worker"); the stored rows carry
the instance (`conversation_id`, "" on rows written before) and their keys include it.
`spent_seals` makes a carried-state seal count once. `approval_requests` is what the inbox lists
and binds proofs to: what the real worker recorded.

Written by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INSTANCE_TABLES = (
    "conversation_messages",
    "tool_executions",
    "saga_entries",
    "compensations",
    "notifications",
    "approval_decisions",
    "conversation_events",
)
VIAS_BEFORE = "started_via IN ('session', 'token')"
VIAS = "started_via IN ('session', 'token', 'worker')"


def upgrade() -> None:
    for table in INSTANCE_TABLES:
        op.add_column(table, sa.Column("conversation_id", sa.Text(), server_default="", nullable=False))
    op.drop_constraint("pk_conversation_messages", "conversation_messages", type_="primary")
    op.create_primary_key(
        "pk_conversation_messages", "conversation_messages", ["workflow_id", "conversation_id", "seq"]
    )
    op.drop_constraint(
        "uq_conversation_messages_workflow_id_message_id", "conversation_messages", type_="unique"
    )
    op.create_unique_constraint(
        "uq_conversation_messages_workflow_id_conversation_id_message_id",
        "conversation_messages",
        ["workflow_id", "conversation_id", "message_id"],
    )
    op.drop_constraint("pk_saga_entries", "saga_entries", type_="primary")
    op.create_primary_key("pk_saga_entries", "saga_entries", ["workflow_id", "conversation_id", "call_id"])
    for table in ("tool_executions", "compensations"):
        op.drop_constraint(f"uq_{table}_workflow_id_call_id", table, type_="unique")
        op.create_unique_constraint(
            f"uq_{table}_workflow_id_conversation_id_call_id",
            table,
            ["workflow_id", "conversation_id", "call_id"],
        )

    op.drop_constraint("uq_conversation_events_workflow_id_key", "conversation_events", type_="unique")
    op.create_unique_constraint(
        "uq_conversation_events_workflow_id_conversation_id_key",
        "conversation_events",
        ["workflow_id", "conversation_id", "key"],
    )

    op.add_column("conversations", sa.Column("conversation_id", sa.Text(), nullable=True))
    op.execute("UPDATE conversations SET conversation_id = ''")  # theirs are the rows of before
    op.drop_constraint("ck_conversations_started_via", "conversations", type_="check")
    op.create_check_constraint("ck_conversations_started_via", "conversations", VIAS)

    op.create_table(
        "spent_seals",
        sa.Column("seal", sa.Text(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("workflow_id", sa.Text(), nullable=False),
        sa.Column("conversation_id", sa.Text(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("seal", name="pk_spent_seals"),
    )

    op.create_table(
        "approval_requests",
        sa.Column("conversation_id", sa.Text(), nullable=False),
        sa.Column("call_id", sa.Text(), nullable=False),
        sa.Column("workflow_id", sa.Text(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("agent", sa.Text(), nullable=False),
        sa.Column("tool", sa.Text(), nullable=False),
        sa.Column("risk", sa.Text(), nullable=False),
        sa.Column("args", sa.Text(), nullable=False),
        sa.Column("args_sha256", sa.Text(), nullable=False),
        sa.Column("nonce", sa.Text(), nullable=False),
        sa.Column("requested_by", sa.Text(), nullable=False),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("hints", sa.Text(), nullable=True),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("parameters", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("state", sa.Text(), server_default="pending", nullable=False),
        sa.Column("decided_by", sa.Text(), nullable=True),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("conversation_id", "call_id", name="pk_approval_requests"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_approval_requests_tenant_id_tenants"),
        sa.CheckConstraint(
            "state IN ('pending', 'approved', 'rejected', 'expired')", name="ck_approval_requests_state"
        ),
        sa.CheckConstraint("risk IN ('low', 'medium', 'high')", name="ck_approval_requests_risk"),
    )
    op.create_index(
        "ix_approval_requests_tenant_id_state_expires_at",
        "approval_requests",
        ["tenant_id", "state", "expires_at"],
    )
    op.create_index(
        "ix_approval_requests_workflow_id_call_id", "approval_requests", ["workflow_id", "call_id"]
    )


def downgrade() -> None:
    op.drop_table("approval_requests")
    op.drop_table("spent_seals")
    op.execute("DELETE FROM conversations WHERE started_via = 'worker'")
    op.drop_constraint("ck_conversations_started_via", "conversations", type_="check")
    op.create_check_constraint("ck_conversations_started_via", "conversations", VIAS_BEFORE)
    op.drop_column("conversations", "conversation_id")
    op.drop_constraint(
        "uq_conversation_events_workflow_id_conversation_id_key", "conversation_events", type_="unique"
    )
    op.create_unique_constraint(
        "uq_conversation_events_workflow_id_key", "conversation_events", ["workflow_id", "key"]
    )
    for table in ("tool_executions", "compensations"):
        op.drop_constraint(f"uq_{table}_workflow_id_conversation_id_call_id", table, type_="unique")
        op.create_unique_constraint(f"uq_{table}_workflow_id_call_id", table, ["workflow_id", "call_id"])
    op.drop_constraint("pk_saga_entries", "saga_entries", type_="primary")
    op.create_primary_key("pk_saga_entries", "saga_entries", ["workflow_id", "call_id"])
    op.drop_constraint(
        "uq_conversation_messages_workflow_id_conversation_id_message_id",
        "conversation_messages",
        type_="unique",
    )
    op.create_unique_constraint(
        "uq_conversation_messages_workflow_id_message_id",
        "conversation_messages",
        ["workflow_id", "message_id"],
    )
    op.drop_constraint("pk_conversation_messages", "conversation_messages", type_="primary")
    op.create_primary_key("pk_conversation_messages", "conversation_messages", ["workflow_id", "seq"])
    for table in INSTANCE_TABLES:
        op.drop_column(table, "conversation_id")
