"""Inbox sessions and login attempts: revocable sessions, throttled and recorded logins.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-23

`inbox_sessions` holds every session the inbox issued (its id is the session token's `jti`): a
token counts only while its row exists, is not revoked and has not expired, and while the user's
password is the one it was issued under (`credential_tag`). Removing a user removes their sessions
(ON DELETE CASCADE). `login_attempts` records every login, password or OIDC, accepted or refused
with the reason; the inbox's rate limit counts its recent failures. `tenant_id` has no foreign key
there: a refused login may name a tenant that does not exist.

Written by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "inbox_sessions",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("method", sa.Text(), nullable=False),
        sa.Column("credential_tag", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("method IN ('password', 'oidc')", name="ck_inbox_sessions_method"),
        sa.ForeignKeyConstraint(
            ["tenant_id", "user_id"],
            ["users.tenant_id", "users.id"],
            name="fk_inbox_sessions_tenant_id_user_id_users",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_inbox_sessions"),
    )
    op.create_index("ix_inbox_sessions_tenant_id_user_id", "inbox_sessions", ["tenant_id", "user_id"])
    op.create_table(
        "login_attempts",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("client", sa.Text(), nullable=False),
        sa.Column("method", sa.Text(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint("method IN ('password', 'oidc')", name="ck_login_attempts_method"),
        sa.CheckConstraint(
            "outcome IN ('accepted', 'bad_credentials', 'throttled', 'refused')",
            name="ck_login_attempts_outcome",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_login_attempts"),
    )
    op.create_index(
        "ix_login_attempts_tenant_id_user_id_created_at",
        "login_attempts",
        ["tenant_id", "user_id", "created_at"],
    )
    op.create_index("ix_login_attempts_client_created_at", "login_attempts", ["client", "created_at"])


def downgrade() -> None:
    op.drop_table("login_attempts")
    op.drop_table("inbox_sessions")
