"""Rollback attempt keys: one `rollback_requests` row per rollback request, however often it runs.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22

`authorize_rollback` retries without an attempt cap; a retry after its commit (a lost completion,
a worker killed after the commit) recorded the request again. `attempt_key` (workflow id, run id
and activity id of the invocation, as in 0003) makes the insert once-only. Older rows have none.

Written by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("rollback_requests", sa.Column("attempt_key", sa.Text(), nullable=True))
    op.create_unique_constraint("uq_rollback_requests_attempt_key", "rollback_requests", ["attempt_key"])


def downgrade() -> None:
    op.drop_constraint("uq_rollback_requests_attempt_key", "rollback_requests", type_="unique")
    op.drop_column("rollback_requests", "attempt_key")
