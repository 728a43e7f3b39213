"""Chat channels' secrets encrypted at rest, and chat channels that write to us (issue 39).

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-27

`chat_channels.endpoint` and `bot_token` were plain text: every value is encrypted now with the
deployment's key (COUNTERSIGN_SECRETS_KEY, countersign/db/sealed.py), so `migrate` must hold the key
the worker and server hold. `webhook_secret` (encrypted too) is what an inbound webhook proves it
knows; `chat_senders` maps a channel's user to one of the tenant's users and their conversation.
The downgrade decrypts.

Written by hand and frozen, like 0001.
"""

from collections.abc import Callable, Sequence

import sqlalchemy as sa
from alembic import op

from countersign.db.sealed import seal, unseal

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SECRETS = ("endpoint", "bot_token")


def convert(change: Callable[[str], str]) -> None:
    channels = sa.table("chat_channels", sa.column("tenant_id"), *(sa.column(c) for c in SECRETS))
    conn = op.get_bind()
    for row in conn.execute(sa.select(channels)).mappings().all():
        values = {c: None if row[c] is None else change(row[c]) for c in SECRETS}
        conn.execute(channels.update().where(channels.c.tenant_id == row["tenant_id"]).values(**values))


def upgrade() -> None:
    convert(seal)
    op.add_column("chat_channels", sa.Column("webhook_secret", sa.Text(), nullable=True))
    op.create_table(
        "chat_senders",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("sender", sa.Text(), nullable=False),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("agent", sa.Text(), nullable=False),
        sa.Column("workflow_id", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_chat_senders_tenant_id_tenants"),
        sa.ForeignKeyConstraint(
            ["tenant_id", "user_id"],
            ["users.tenant_id", "users.id"],
            name="fk_chat_senders_tenant_id_user_id_users",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "sender", name="pk_chat_senders"),
    )


def downgrade() -> None:
    op.drop_table("chat_senders")
    op.drop_column("chat_channels", "webhook_secret")
    convert(lambda token: unseal(token, "chat_channels"))
