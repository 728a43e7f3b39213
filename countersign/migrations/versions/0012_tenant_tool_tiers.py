"""Tenant tiers: a tenant's own permission tier for one of an agent's tools, and their audit.

Revision ID: 0012
Revises: 0010
Create Date: 2026-11-23

Agents are shared by tenants, so "always allow this tool for this agent" (a tenant admin, from the
inbox) cannot change `agent_tool_permissions`: `tenant_tool_tiers` holds the tenant's tier, applied
when a conversation's snapshot is built; `tier_changes` records every attempt (accepted or refused).

Written by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tenant_tool_tiers",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("agent", sa.Text(), nullable=False),
        sa.Column("tool", sa.Text(), nullable=False),
        sa.Column("tier", sa.Text(), nullable=False),
        sa.Column("set_by", sa.Text(), nullable=False),
        sa.Column("set_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(
            "tier IN ('always_allow', 'needs_approval', 'blocked')", name="ck_tenant_tool_tiers_tier"
        ),
        sa.ForeignKeyConstraint(
            ["agent"],
            ["agent_profiles.name"],
            name="fk_tenant_tool_tiers_agent_agent_profiles",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_tenant_tool_tiers_tenant_id_tenants"),
        sa.PrimaryKeyConstraint("tenant_id", "agent", "tool", name="pk_tenant_tool_tiers"),
    )
    op.create_table(
        "tier_changes",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("agent", sa.Text(), nullable=False),
        sa.Column("tool", sa.Text(), nullable=False),
        sa.Column("old_tier", sa.Text(), nullable=True),
        sa.Column("new_tier", sa.Text(), nullable=False),
        sa.Column("changed_by", sa.Text(), nullable=False),
        sa.Column("via", sa.Text(), nullable=False),
        sa.Column("accepted", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("workflow_id", sa.Text(), nullable=True),
        sa.Column("call_id", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_tier_changes_tenant_id_tenants"),
        sa.PrimaryKeyConstraint("id", name="pk_tier_changes"),
    )
    op.create_index("ix_tier_changes_tenant_id_created_at", "tier_changes", ["tenant_id", "created_at"])


def downgrade() -> None:
    op.drop_table("tier_changes")
    op.drop_table("tenant_tool_tiers")
