"""Spent request states of MCP tool calls that waited for a reviewer (issue 37).

Revision ID: 0027
Revises: 0026
Create Date: 2026-11-27

Countersign as an MCP server answers a call that waits for a reviewer `input_required` with a
request state the client echoes (countersign/core/continuation.py). The state is MACed and
short-lived, but a client could still present it twice: `mcp_continuations` records each state's
nonce when it is spent, so a replay is refused. No foreign key on the tenant, like `spent_seals`:
the row is written before anything else is trusted.

Written by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "mcp_continuations",
        sa.Column("nonce", sa.Text(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("workflow_id", sa.Text(), nullable=False),
        sa.Column("call_id", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("nonce", name="pk_mcp_continuations"),
    )


def downgrade() -> None:
    op.drop_table("mcp_continuations")
