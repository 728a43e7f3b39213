"""Where a chat may decide, Slack threads, and Reject presses waiting for a reason (issue 51).

Revision ID: 0032
Revises: 0031
Create Date: 2026-12-02

`chat_channels.decides_up_to`: the tenant admin's setting of the highest risk a press in the chat
decides ("none", "low", "medium", "high"; "high" by default, as before: every risk there is).
`chat_turns.thread`: the Slack thread a turn's outcome goes to.
`chat_reason_asks`: a Reject press asks the presser for a reason; their reply rejects with it.

Written by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0032"
down_revision: str | None = "0031"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "chat_channels", sa.Column("decides_up_to", sa.Text(), server_default="high", nullable=False)
    )
    op.create_check_constraint(
        "ck_chat_channels_decides_up_to",
        "chat_channels",
        "decides_up_to IN ('none', 'low', 'medium', 'high')",
    )
    op.add_column("chat_turns", sa.Column("thread", sa.Text(), nullable=True))
    op.create_table(
        "chat_reason_asks",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("sender", sa.Text(), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("card_id", sa.BigInteger(), nullable=False),
        sa.Column("answered_by", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_chat_reason_asks_tenant_id_tenants"),
        sa.ForeignKeyConstraint(
            ["card_id"], ["chat_cards.id"], name="fk_chat_reason_asks_card_id_chat_cards", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("tenant_id", "sender", "prompt", name="pk_chat_reason_asks"),
    )


def downgrade() -> None:
    op.drop_table("chat_reason_asks")
    op.drop_column("chat_turns", "thread")
    op.drop_constraint("ck_chat_channels_decides_up_to", "chat_channels", type_="check")
    op.drop_column("chat_channels", "decides_up_to")
