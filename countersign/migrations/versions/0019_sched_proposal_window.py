"""A scheduling session keeps the window its proposals were picked in (issue 24).

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-25

schedule_meeting refuses a second proposal to the same counterpart while a session of the same
requester is open for an overlapping window (CONFLICT naming it). Existing sessions get the span of
their own proposals as their window.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("window_start", "window_end")


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column("meeting_sessions", sa.Column(name, sa.DateTime(timezone=True), nullable=True))
    op.execute(
        """
        UPDATE meeting_sessions SET
          window_start = coalesce(
            (SELECT min((p->>'starts_at')::timestamptz) FROM jsonb_array_elements(proposals) p), created_at),
          window_end = coalesce(
            (SELECT max((p->>'ends_at')::timestamptz) FROM jsonb_array_elements(proposals) p), expires_at)
        """
    )
    for name in COLUMNS:
        op.alter_column("meeting_sessions", name, nullable=False)


def downgrade() -> None:
    for name in COLUMNS:
        op.drop_column("meeting_sessions", name)
