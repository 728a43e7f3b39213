"""The requester's roles at each call: `tool_executions.roles` (issue 50: `policy test` replayed
recorded calls with the roles people have today).

Revision ID: 0033
Revises: 0032
Create Date: 2026-12-02

The roles of the call's requester as the rules in force read them when the call was checked and
run (or, for a call that never ran, when its row was written), sorted. NULL on rows written before
this migration: nothing recorded their roles then, and `policy test` replays those with the roles
their requester has today, and says how many it replayed so. A chained row's fact leaves the column
out while it is NULL (countersign.db.chain ADDED_LATER), so rows chained before it still match.

Written by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0033"
down_revision: str | None = "0032"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "tool_executions", sa.Column("roles", postgresql.JSONB(astext_type=sa.Text()), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("tool_executions", "roles")
