"""Chat turns owed an outcome, and refused webhooks counted per window (issues 51 and 53).

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-02

`chat_turns`: each message a chat channel delivered, until its outcome (the reply, also after a
wait for a person) was posted back to its chat; a server that starts again follows those not done.
`chat_cards`: pending approvals posted to a channel's review chat with buttons, by a short id.
`webhook_refusals`: webhook requests refused for a wrong secret or signature, counted per tenant,
channel kind, source and minute, instead of one chained record each.
`tenants.webhook_url` is sealed like the channels' secrets (countersign/db/sealed.py): each stored
URL is encrypted with the deployment's key here, and a queued webhook notice no longer holds the
URL as its recipient (it is read from the tenant when sent).

Written by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from countersign.db.sealed import seal, unseal

revision: str = "0030"
down_revision: str | None = "0029"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    connection = op.get_bind()
    urls = connection.execute(sa.text("SELECT id, webhook_url FROM tenants WHERE webhook_url IS NOT NULL"))
    for tenant, url in urls.all():
        connection.execute(
            sa.text("UPDATE tenants SET webhook_url = :sealed WHERE id = :id"),
            {"sealed": seal(url), "id": tenant},
        )
    connection.execute(
        sa.text("UPDATE notification_outbox SET recipient = 'tenant webhook' WHERE channel = 'webhook'")
    )
    op.create_table(
        "chat_turns",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column("workflow_id", sa.Text(), nullable=False),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("chat", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), server_default="open", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("state IN ('open', 'waiting', 'done')", name="ck_chat_turns_state"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_chat_turns_tenant_id_tenants"),
        sa.PrimaryKeyConstraint("tenant_id", "message_id", name="pk_chat_turns"),
    )
    op.create_index("ix_chat_turns_workflow_id", "chat_turns", ["workflow_id"])
    op.create_table(
        "chat_cards",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("workflow_id", sa.Text(), nullable=False),
        sa.Column("call_id", sa.Text(), nullable=False),
        sa.Column("nonce", sa.Text(), nullable=False),
        sa.Column("chat", sa.Text(), nullable=False),
        sa.Column("remote_id", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_chat_cards_tenant_id_tenants"),
        sa.PrimaryKeyConstraint("id", name="pk_chat_cards"),
        sa.UniqueConstraint("tenant_id", "nonce", name="uq_chat_cards_tenant_id_nonce"),
    )
    op.create_table(
        "webhook_refusals",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "kind", "source", "window_start", name="pk_webhook_refusals"),
    )


def downgrade() -> None:
    connection = op.get_bind()
    urls = connection.execute(sa.text("SELECT id, webhook_url FROM tenants WHERE webhook_url IS NOT NULL"))
    for tenant, sealed in urls.all():
        connection.execute(
            sa.text("UPDATE tenants SET webhook_url = :url WHERE id = :id"),
            {"url": unseal(sealed, "tenants"), "id": tenant},
        )
    op.drop_table("webhook_refusals")
    op.drop_table("chat_cards")
    op.drop_index("ix_chat_turns_workflow_id", table_name="chat_turns")
    op.drop_table("chat_turns")
