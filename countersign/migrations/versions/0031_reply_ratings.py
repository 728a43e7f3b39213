"""People rate replies: `reply_ratings` (issue 53, the Perin design's "user satisfaction, measured
through feedback").

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-02

One row per rated reply (a conversation instance's turn): helpful or not, an optional comment, who
rated (the conversation's user) and how (`session`, `token`, `chat`), and the tools the turn called.
Rating again replaces the row's rating; every rating is chained in the tenant's audit
(countersign/db/chain.py CHAINED).

Written by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0031"
down_revision: str | None = "0030"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "reply_ratings",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("workflow_id", sa.Text(), nullable=False),
        sa.Column("conversation_id", sa.Text(), nullable=False),
        sa.Column("turn", sa.Integer(), nullable=False),
        sa.Column("reply_seq", sa.Integer(), nullable=False),
        sa.Column("agent", sa.Text(), nullable=False),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("rating", sa.Text(), nullable=False),
        sa.Column("comment", sa.Text(), nullable=True),
        sa.Column("rated_via", sa.Text(), nullable=False),
        sa.Column("tools", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint("rating IN ('helpful', 'not_helpful')", name="ck_reply_ratings_rating"),
        sa.CheckConstraint("rated_via IN ('session', 'token', 'chat')", name="ck_reply_ratings_rated_via"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_reply_ratings_tenant_id_tenants"),
        sa.ForeignKeyConstraint(
            ["tenant_id", "user_id"],
            ["users.tenant_id", "users.id"],
            name="fk_reply_ratings_tenant_id_user_id_users",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_reply_ratings"),
        sa.UniqueConstraint(
            "workflow_id", "conversation_id", "turn", name="uq_reply_ratings_workflow_id_conversation_id_turn"
        ),
    )
    op.create_index("ix_reply_ratings_tenant_id_updated_at", "reply_ratings", ["tenant_id", "updated_at"])


def downgrade() -> None:
    op.drop_index("ix_reply_ratings_tenant_id_updated_at", table_name="reply_ratings")
    op.drop_table("reply_ratings")
