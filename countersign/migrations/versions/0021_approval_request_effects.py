"""Approval requests record the call's effect: what a reviewer decides and a proof binds.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-27

`effect` is what the call will do as the tool resolved it when the request was recorded
(countersign.core.effects.Effect as JSON), `effect_sha256` its digest. Both are NULL on requests
recorded before: a proof for one of those binds no effect.

Written by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "approval_requests", sa.Column("effect", postgresql.JSONB(astext_type=sa.Text()), nullable=True)
    )
    op.add_column("approval_requests", sa.Column("effect_sha256", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("approval_requests", "effect_sha256")
    op.drop_column("approval_requests", "effect")
