"""Decision attempt keys: one `approval_decisions` row per decision attempt, however often it runs.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29

`record_decision` runs as a local activity, which runs again for the same attempt when its
completion is lost or a worker dies before the workflow task completes. `attempt_key` (workflow id,
run id and activity id of the invocation) makes the insert once-only: a re-run finds the row and
answers from it. Rows written before this revision have none (NULLs do not collide).

Written by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("approval_decisions", sa.Column("attempt_key", sa.Text(), nullable=True))
    op.create_unique_constraint("uq_approval_decisions_attempt_key", "approval_decisions", ["attempt_key"])


def downgrade() -> None:
    op.drop_constraint("uq_approval_decisions_attempt_key", "approval_decisions", type_="unique")
    op.drop_column("approval_decisions", "attempt_key")
