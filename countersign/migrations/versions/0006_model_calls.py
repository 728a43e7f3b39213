"""The usage audit: one `model_calls` row per model call (tokens, duration), for `starter.py stats`.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23

Tool calls already carry their duration in `tool_executions`; model calls had no row at all, so
tokens and turns per agent could not be summarised from the database.

Written by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "model_calls",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("agent", sa.Text(), nullable=False),
        sa.Column("workflow_id", sa.Text(), nullable=False),
        sa.Column("turn", sa.Integer(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("tool_calls", sa.Integer(), nullable=False),
        sa.Column("finish_reason", sa.Text(), nullable=True),
        sa.Column("duration_ms", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("attempt_key", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_model_calls"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_model_calls_tenant_id_tenants"),
        sa.UniqueConstraint("attempt_key", name="uq_model_calls_attempt_key"),
    )
    op.create_index("ix_model_calls_tenant_id_created_at", "model_calls", ["tenant_id", "created_at"])


def downgrade() -> None:
    op.drop_table("model_calls")
