"""Grants that expire: a reviewer's "the same again, for a while", and each call it let run (issue 35).

Revision ID: 0026
Revises: 0024
Create Date: 2026-11-27

`grants`: minted by the accepted approval it names (one per decision), scoped to tenant, tool,
requester, agent and the digest of the arguments without the tool's free ones; bounded to 7 days
and 100 uses by CHECKs as well as by the code, so no writer can store a wider one.
`grant_uses`: one row per call a grant let run unasked, unique by the call's idempotency key, so a
retried activity never spends a second use.
`tool_executions.grant_id`: the audit row of such a call names its grant beside `approved_by`.

(0025 is another branch's; the revisions are chained again when the branches are merged.)

Written by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "grants",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("tool", sa.Text(), nullable=False),
        sa.Column("requester", sa.Text(), nullable=False),
        sa.Column("agent", sa.Text(), nullable=False),
        sa.Column("args_sha256", sa.Text(), nullable=False),
        sa.Column("args", sa.Text(), nullable=False),
        sa.Column("decision_id", sa.BigInteger(), nullable=False),
        sa.Column("approver", sa.Text(), nullable=False),
        sa.Column("workflow_id", sa.Text(), nullable=False),
        sa.Column("call_id", sa.Text(), nullable=False),
        sa.Column("minutes", sa.Integer(), nullable=False),
        sa.Column("uses", sa.Integer(), nullable=False),
        sa.Column("uses_left", sa.Integer(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_by", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint("minutes BETWEEN 1 AND 10080", name="ck_grants_minutes"),
        sa.CheckConstraint("uses BETWEEN 1 AND 100", name="ck_grants_uses"),
        sa.CheckConstraint("uses_left BETWEEN 0 AND uses", name="ck_grants_uses_left"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_grants_tenant_id_tenants"),
        sa.ForeignKeyConstraint(
            ["decision_id"], ["approval_decisions.id"], name="fk_grants_decision_id_approval_decisions"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_grants"),
        sa.UniqueConstraint("decision_id", name="uq_grants_decision_id"),
    )
    op.create_index(
        "ix_grants_tenant_id_tool_requester_agent_args_sha256",
        "grants",
        ["tenant_id", "tool", "requester", "agent", "args_sha256"],
    )
    op.create_table(
        "grant_uses",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("grant_id", sa.BigInteger(), nullable=False),
        sa.Column("decision_id", sa.BigInteger(), nullable=False),
        sa.Column("approver", sa.Text(), nullable=False),
        sa.Column("workflow_id", sa.Text(), nullable=False),
        sa.Column("conversation_id", sa.Text(), server_default="", nullable=False),
        sa.Column("call_id", sa.Text(), nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_grant_uses_tenant_id_tenants"),
        sa.ForeignKeyConstraint(["grant_id"], ["grants.id"], name="fk_grant_uses_grant_id_grants"),
        sa.PrimaryKeyConstraint("id", name="pk_grant_uses"),
        sa.UniqueConstraint("idempotency_key", name="uq_grant_uses_idempotency_key"),
    )
    op.create_index("ix_grant_uses_grant_id", "grant_uses", ["grant_id"])
    op.add_column("tool_executions", sa.Column("grant_id", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("tool_executions", "grant_id")
    op.drop_index("ix_grant_uses_grant_id", table_name="grant_uses")
    op.drop_table("grant_uses")
    op.drop_index("ix_grants_tenant_id_tool_requester_agent_args_sha256", table_name="grants")
    op.drop_table("grants")
