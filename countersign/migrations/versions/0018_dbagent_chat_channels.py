"""A tenant's chat channel and the posts of send_chat_message (issue 24).

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-25

`chat_channels` holds one Telegram-bot-API-compatible endpoint or Slack-compatible incoming webhook
per tenant (its secrets stay in this row); `chat_posts` holds each post, claimed before it is sent
and keyed by the call's idempotency key, so a retried activity never posts twice.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "chat_channels",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("endpoint", sa.Text(), nullable=False),
        sa.Column("bot_token", sa.Text(), nullable=True),
        sa.Column("chat_id", sa.Text(), nullable=True),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("kind IN ('telegram', 'slack')", name="ck_chat_channels_kind"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_chat_channels_tenant_id_tenants"),
        sa.PrimaryKeyConstraint("tenant_id", name="pk_chat_channels"),
    )
    op.create_table(
        "chat_posts",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), server_default="sending", nullable=False),
        sa.Column("remote_id", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("status IN ('sending', 'sent', 'failed')", name="ck_chat_posts_status"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_chat_posts_tenant_id_tenants"),
        sa.PrimaryKeyConstraint("id", name="pk_chat_posts"),
        sa.UniqueConstraint("idempotency_key", name="uq_chat_posts_idempotency_key"),
    )
    op.create_index("ix_chat_posts_tenant_id", "chat_posts", ["tenant_id"])


def downgrade() -> None:
    op.drop_table("chat_posts")
    op.drop_table("chat_channels")
