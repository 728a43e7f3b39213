"""Input audit: every authority check of a client action and every refused client input.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-23

A refused `end`, `answer` or `submit_message`, a signal whose payload cannot be read, and carried
state whose seal does not verify each leave a row here (decisions and rollbacks keep theirs in
`approval_decisions` and `rollback_requests`). `tenant_id` has no foreign key: a refused input may
name a tenant that does not exist. `attempt_key` makes the insert once-only, as in 0003.

Written by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "input_audit",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("workflow_id", sa.Text(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=True),
        sa.Column("accepted", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("excerpt", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("attempt_key", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_input_audit"),
        sa.UniqueConstraint("attempt_key", name="uq_input_audit_attempt_key"),
    )
    op.create_index("ix_input_audit_tenant_id", "input_audit", ["tenant_id"])
    op.create_index("ix_input_audit_workflow_id", "input_audit", ["workflow_id"])


def downgrade() -> None:
    op.drop_table("input_audit")
