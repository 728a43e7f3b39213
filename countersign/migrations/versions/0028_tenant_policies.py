"""Tenants' Cedar policy sets, their changes, shadow differences, and quorum on approval requests (issue 35).

Revision ID: 0028
Revises: 0027
Create Date: 2026-11-27

`tenant_policies`: a tenant's policy set as applied, one row per mode (`enforced` decides beside the
tiers; `shadow` is evaluated beside it and changes nothing), with its version and who applied it.
`policy_changes`: every attempt to apply one, accepted or refused with why, chained in the tenant's
audit like `tier_changes` (countersign/db/chain.py CHAINED).
`shadow_differences`: each call whose outcome under the shadow set differs from the enforced one's,
for admins to read before they enforce it (once per call).
`approval_requests.approvals_required`: how many distinct approvers the call needs (a policy's
`@approvals`; 1 on every request before it), and `.policy` / `tool_executions.policy`: the policy
decision on the call (which policy, what outcome), on the card and in the audit row.

Written by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MODES = "mode IN ('enforced', 'shadow')"


def upgrade() -> None:
    op.create_table(
        "tenant_policies",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("mode", sa.Text(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("sha256", sa.Text(), nullable=False),
        sa.Column("applied_by", sa.Text(), nullable=False),
        sa.Column("applied_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint(MODES, name="ck_tenant_policies_mode"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_tenant_policies_tenant_id_tenants"),
        sa.PrimaryKeyConstraint("tenant_id", "mode", name="pk_tenant_policies"),
    )
    op.create_table(
        "policy_changes",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("mode", sa.Text(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=True),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("sha256", sa.Text(), nullable=False),
        sa.Column("changed_by", sa.Text(), nullable=False),
        sa.Column("via", sa.Text(), nullable=False),
        sa.Column("accepted", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint(MODES, name="ck_policy_changes_mode"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_policy_changes_tenant_id_tenants"),
        sa.PrimaryKeyConstraint("id", name="pk_policy_changes"),
    )
    op.create_index("ix_policy_changes_tenant_id_created_at", "policy_changes", ["tenant_id", "created_at"])
    op.create_table(
        "shadow_differences",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("shadow_version", sa.Integer(), nullable=False),
        sa.Column("workflow_id", sa.Text(), nullable=False),
        sa.Column("conversation_id", sa.Text(), server_default="", nullable=False),
        sa.Column("call_id", sa.Text(), nullable=False),
        sa.Column("tool", sa.Text(), nullable=False),
        sa.Column("requested_by", sa.Text(), nullable=False),
        sa.Column("enforced", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("shadow", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_shadow_differences_tenant_id_tenants"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_shadow_differences"),
        sa.UniqueConstraint(
            "workflow_id",
            "conversation_id",
            "call_id",
            name="uq_shadow_differences_workflow_id_conversation_id_call_id",
        ),
    )
    op.create_index(
        "ix_shadow_differences_tenant_id_created_at", "shadow_differences", ["tenant_id", "created_at"]
    )
    op.add_column(
        "approval_requests",
        sa.Column("approvals_required", sa.Integer(), server_default=sa.text("1"), nullable=False),
    )
    op.add_column(
        "approval_requests", sa.Column("policy", postgresql.JSONB(astext_type=sa.Text()), nullable=True)
    )
    op.add_column(
        "tool_executions", sa.Column("policy", postgresql.JSONB(astext_type=sa.Text()), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("tool_executions", "policy")
    op.drop_column("approval_requests", "policy")
    op.drop_column("approval_requests", "approvals_required")
    op.drop_index("ix_shadow_differences_tenant_id_created_at", table_name="shadow_differences")
    op.drop_table("shadow_differences")
    op.drop_index("ix_policy_changes_tenant_id_created_at", table_name="policy_changes")
    op.drop_table("policy_changes")
    op.drop_table("tenant_policies")
