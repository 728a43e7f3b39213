"""Who may act: deactivated users, per-user scopes, per-user and per-tenant rate limits (issue 24).

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-25

- `users.deactivated_at`: a deactivated user can no longer have a conversation act for them
  (checked at each tool call), log in, decide or send messages.
- `user_scopes`: the calendar grants a tool may need. Users who exist when this runs are granted
  every scope, so that what worked before the upgrade still works; users added later start with none.
- `rate_limit_buckets.user_id`: a bucket per user beside the tenant's ("" is the tenant's own).
- `tenant_rate_limits`: a tenant's limits, shared and per user, per tool or for every tool (`*`).

Written by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCOPES = ("calendar:availability", "calendar:propose", "calendar:book")


def upgrade() -> None:
    op.add_column("users", sa.Column("deactivated_at", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "user_scopes",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("granted_by", sa.Text(), nullable=False),
        sa.Column("granted_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(
            "scope IN ({})".format(", ".join(f"'{s}'" for s in SCOPES)), name="ck_user_scopes_scope"
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id", "user_id"],
            ["users.tenant_id", "users.id"],
            name="fk_user_scopes_tenant_id_user_id_users",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "user_id", "scope", name="pk_user_scopes"),
    )
    scopes = ", ".join(f"('{s}')" for s in SCOPES)
    op.execute(
        "INSERT INTO user_scopes (tenant_id, user_id, scope, granted_by) "
        "SELECT u.tenant_id, u.id, s.scope, 'migration 0016' "
        f"FROM users u CROSS JOIN (VALUES {scopes}) AS s(scope)"
    )
    op.add_column("rate_limit_buckets", sa.Column("user_id", sa.Text(), server_default="", nullable=False))
    op.drop_constraint("pk_rate_limit_buckets", "rate_limit_buckets", type_="primary")
    op.create_primary_key("pk_rate_limit_buckets", "rate_limit_buckets", ["tenant_id", "tool", "user_id"])
    op.create_table(
        "tenant_rate_limits",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("tool", sa.Text(), nullable=False),
        sa.Column("per_s", sa.Double(), nullable=False),
        sa.Column("burst", sa.Double(), nullable=False),
        sa.Column("user_per_s", sa.Double(), nullable=False),
        sa.Column("user_burst", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("per_s > 0 AND burst >= 1", name="ck_tenant_rate_limits_tenant_limit"),
        sa.CheckConstraint("user_per_s > 0 AND user_burst >= 1", name="ck_tenant_rate_limits_user_limit"),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_tenant_rate_limits_tenant_id_tenants"
        ),
        sa.PrimaryKeyConstraint("tenant_id", "tool", name="pk_tenant_rate_limits"),
    )


def downgrade() -> None:
    op.drop_table("tenant_rate_limits")
    op.execute("DELETE FROM rate_limit_buckets WHERE user_id <> ''")
    op.drop_constraint("pk_rate_limit_buckets", "rate_limit_buckets", type_="primary")
    op.create_primary_key("pk_rate_limit_buckets", "rate_limit_buckets", ["tenant_id", "tool"])
    op.drop_column("rate_limit_buckets", "user_id")
    op.drop_table("user_scopes")
    op.drop_column("users", "deactivated_at")
