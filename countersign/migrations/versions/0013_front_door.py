"""The front door: conversations the server started, API tokens, requesters' actions, the
deployment's authentication mode.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-25

`conversations` says whose a workflow id is (the server writes it before Temporal sees the start);
`api_tokens` holds machine clients' hashed secrets and whom they may act for; `requester_actions`
records every request to the conversation API; `deployment_settings` holds `auth_mode`, which every
worker reads at start.

Written by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def now() -> sa.TextClause:
    return sa.text("now()")


def upgrade() -> None:
    op.create_table(
        "conversations",
        sa.Column("workflow_id", sa.Text(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("agent", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=True),
        sa.Column("started_via", sa.Text(), nullable=False),
        sa.Column("token_name", sa.Text(), nullable=True),
        sa.Column("auth_mode", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=now(), nullable=False),
        sa.CheckConstraint("started_via IN ('session', 'token')", name="ck_conversations_started_via"),
        sa.CheckConstraint("auth_mode IN ('signed', 'names')", name="ck_conversations_auth_mode"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_conversations_tenant_id_tenants"),
        sa.ForeignKeyConstraint(
            ["tenant_id", "user_id"],
            ["users.tenant_id", "users.id"],
            name="fk_conversations_tenant_id_user_id_users",
        ),
        sa.PrimaryKeyConstraint("workflow_id", name="pk_conversations"),
    )
    op.create_index(
        "ix_conversations_tenant_id_user_id_created_at",
        "conversations",
        ["tenant_id", "user_id", "created_at"],
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("secret_sha256", sa.Text(), nullable=False),
        sa.Column("act_as", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=now(), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_api_tokens_tenant_id_tenants"),
        sa.PrimaryKeyConstraint("id", name="pk_api_tokens"),
        sa.UniqueConstraint("secret_sha256", name="uq_api_tokens_secret_sha256"),
        sa.UniqueConstraint("tenant_id", "name", name="uq_api_tokens_tenant_id_name"),
    )
    op.create_table(
        "requester_actions",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("via", sa.Text(), nullable=False),
        sa.Column("token_id", sa.BigInteger(), nullable=True),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("workflow_id", sa.Text(), nullable=True),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_requester_actions"),
    )
    op.create_index(
        "ix_requester_actions_tenant_id_created_at", "requester_actions", ["tenant_id", "created_at"]
    )
    op.create_index(
        "ix_requester_actions_token_id_created_at", "requester_actions", ["token_id", "created_at"]
    )
    op.create_table(
        "deployment_settings",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("set_at", sa.DateTime(timezone=True), server_default=now(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_deployment_settings"),
    )


def downgrade() -> None:
    op.drop_table("deployment_settings")
    op.drop_table("requester_actions")
    op.drop_table("api_tokens")
    op.drop_table("conversations")
