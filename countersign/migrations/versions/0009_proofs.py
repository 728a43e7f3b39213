"""Proofs: who decided, shown rather than claimed; reviewers' passwords.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23

`users.password_hash` (argon2id) lets reviewers log in to the inbox; `proof_checks` records every
proof a worker checked, accepted (its unique `jti`: spent once) or refused with the reason;
`approval_decisions.proven` / `rollback_requests.proven` tell a decision shown by a proof
(APPROVER_AUTH=signed) from one whose name was only claimed (names mode, and every older row).
`tenants.webhook_url` and `notification_outbox`: reviewers' notifications by email and to a
Slack-compatible webhook, queued once per (call, kind, recipient) and delivered at least once.

Written by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("users", sa.Column("password_hash", sa.Text(), nullable=True))
    for table in ("approval_decisions", "rollback_requests"):
        op.add_column(table, sa.Column("proven", sa.Boolean(), server_default=sa.false(), nullable=False))
    op.create_table(
        "proof_checks",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("workflow_id", sa.Text(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("subject", sa.Text(), nullable=True),
        sa.Column("jti", sa.Text(), nullable=True),
        sa.Column("accepted", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("attempt_key", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_proof_checks_tenant_id_tenants"),
        sa.PrimaryKeyConstraint("id", name="pk_proof_checks"),
        sa.UniqueConstraint("jti", name="uq_proof_checks_jti"),
    )
    op.create_index("ix_proof_checks_tenant_id", "proof_checks", ["tenant_id"])
    op.create_index("ix_proof_checks_workflow_id_target", "proof_checks", ["workflow_id", "target"])
    op.add_column("tenants", sa.Column("webhook_url", sa.Text(), nullable=True))
    op.create_table(
        "notification_outbox",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=False),
        sa.Column("channel", sa.Text(), nullable=False),
        sa.Column("recipient", sa.Text(), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("payload", JSONB(), nullable=True),
        sa.Column("status", sa.Text(), server_default="queued", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("status IN ('queued', 'sent')", name="ck_notification_outbox_status"),
        sa.CheckConstraint("channel IN ('email', 'webhook')", name="ck_notification_outbox_channel"),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_notification_outbox_tenant_id_tenants"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_notification_outbox"),
        sa.UniqueConstraint("idempotency_key", name="uq_notification_outbox_idempotency_key"),
    )
    op.create_index("ix_notification_outbox_tenant_id", "notification_outbox", ["tenant_id"])


def downgrade() -> None:
    op.drop_table("notification_outbox")
    op.drop_column("tenants", "webhook_url")
    op.drop_table("proof_checks")
    for table in ("approval_decisions", "rollback_requests"):
        op.drop_column(table, "proven")
    op.drop_column("users", "password_hash")
