"""MCP servers: the servers whose tools join some agents' catalogs as `mcp__NAME__TOOL`.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23

Secrets are not columns: `env` and `headers` hold the names of the worker's environment variables
that carry them. Written by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "mcp_servers",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("transport", sa.Text(), nullable=False),
        sa.Column("command", JSONB(), nullable=True),
        sa.Column("url", sa.Text(), nullable=True),
        sa.Column("env", JSONB(), server_default=sa.text("'{}'::jsonb"), nullable=False),
        sa.Column("headers", JSONB(), server_default=sa.text("'{}'::jsonb"), nullable=False),
        sa.Column("agents", JSONB(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=True),
        sa.Column("tools", JSONB(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_mcp_servers"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_mcp_servers_tenant_id_tenants"),
        sa.CheckConstraint("transport IN ('stdio', 'http')", name=op.f("ck_mcp_servers_transport")),
        sa.CheckConstraint(
            "(transport = 'stdio' AND command IS NOT NULL AND url IS NULL)"
            " OR (transport = 'http' AND url IS NOT NULL AND command IS NULL)",
            name=op.f("ck_mcp_servers_target"),
        ),
    )


def downgrade() -> None:
    op.drop_table("mcp_servers")
