"""What runs is what was approved: draft edits with their diff, an approver's changes, voided approvals.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-27

A draft is content a reviewer approves a `send_draft` on: who changed it, when and how, is part of
the decision's evidence, and the last editor counts as a requester for four-eyes (tools/drafts.py).
`approval_decisions.changes`: each argument an approver changed on approving, as the model asked it
and as approved, a fact of its own beside the request's arguments and the decision's;
`.effect`, `.effect_sha256`: the effect of the edited arguments (the request's is the model's).
`approval_decisions.voided_at`, `.voided`: an approval whose call resolved another effect when it
ran (nothing ran; it was asked again) stays, marked voided, with the effect found instead.
`tool_executions.effect`: what an approved call did, as its tool resolved it in the transaction.
`approval_requests.voided_by`, `.voided_effect`: a call asked again names who approved the voided
request and what it showed then, so a reviewer sees what changed since.

Written by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "draft_edits",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("draft_id", sa.BigInteger(), nullable=False),
        sa.Column("edited_by", sa.Text(), nullable=True),
        sa.Column("via", sa.Text(), nullable=False),
        sa.Column("changes", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("edited_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint("via IN ('inbox', 'tool', 'cli')", name="ck_draft_edits_via"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_draft_edits_tenant_id_tenants"),
        sa.PrimaryKeyConstraint("id", name="pk_draft_edits"),
    )
    op.create_index("ix_draft_edits_tenant_id_draft_id", "draft_edits", ["tenant_id", "draft_id"])
    op.add_column(
        "approval_decisions", sa.Column("changes", postgresql.JSONB(astext_type=sa.Text()), nullable=True)
    )
    op.add_column(
        "approval_decisions", sa.Column("effect", postgresql.JSONB(astext_type=sa.Text()), nullable=True)
    )
    op.add_column("approval_decisions", sa.Column("effect_sha256", sa.Text(), nullable=True))
    op.add_column("approval_decisions", sa.Column("voided_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "approval_decisions", sa.Column("voided", postgresql.JSONB(astext_type=sa.Text()), nullable=True)
    )
    op.add_column(
        "tool_executions", sa.Column("effect", postgresql.JSONB(astext_type=sa.Text()), nullable=True)
    )
    op.add_column("approval_requests", sa.Column("voided_by", sa.Text(), nullable=True))
    op.add_column(
        "approval_requests",
        sa.Column("voided_effect", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )


def downgrade() -> None:
    op.drop_column("approval_requests", "voided_effect")
    op.drop_column("approval_requests", "voided_by")
    op.drop_column("tool_executions", "effect")
    op.drop_column("approval_decisions", "voided")
    op.drop_column("approval_decisions", "voided_at")
    op.drop_column("approval_decisions", "effect_sha256")
    op.drop_column("approval_decisions", "effect")
    op.drop_column("approval_decisions", "changes")
    op.drop_table("draft_edits")
