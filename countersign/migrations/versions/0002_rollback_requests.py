"""Rollback requests: who asked to undo what, accepted or refused.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22

Written by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "rollback_requests",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("workflow_id", sa.Text(), nullable=False),
        sa.Column("requested_by", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("call_id", sa.Text(), nullable=True),
        sa.Column("accepted", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_rollback_requests"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_rollback_requests_tenant_id_tenants"),
        sa.CheckConstraint("scope IN ('turn', 'conversation', 'call')", name="ck_rollback_requests_scope"),
    )
    op.create_index("ix_rollback_requests_tenant_id", "rollback_requests", ["tenant_id"])
    op.create_index("ix_rollback_requests_workflow_id", "rollback_requests", ["workflow_id"])


def downgrade() -> None:
    op.drop_table("rollback_requests")
