"""Grants bind the approved effect's content, not the call's arguments (issue 48 item 1).

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-02

`grants.content_sha256`: the digest of the approved call's resolved effect without record ids
(countersign.core.grants.content_digest); a later call is covered only when its own resolved effect
has it. `grants.args_sha256` becomes nullable: grants minted from now on bind no arguments, and those
minted before (which bound only the arguments, so a draft rewritten to another recipient stayed
covered) have no content digest and cover nothing. Their rows are left as they were: they are chained.
`approval_decisions.counted`: a quorum's accepted approval records the approvals that count after it
(those of people still active and entitled), so a re-run of the decision answers what the first did.

Written by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0029"
down_revision: str | None = "0028"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "approval_decisions",
        sa.Column("counted", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )
    op.add_column("grants", sa.Column("content_sha256", sa.Text(), nullable=True))
    op.alter_column("grants", "args_sha256", existing_type=sa.Text(), nullable=True)
    op.drop_index("ix_grants_tenant_id_tool_requester_agent_args_sha256", table_name="grants")
    op.create_index(
        "ix_grants_tenant_id_tool_requester_agent_content_sha256",
        "grants",
        ["tenant_id", "tool", "requester", "agent", "content_sha256"],
    )


def downgrade() -> None:
    op.drop_index("ix_grants_tenant_id_tool_requester_agent_content_sha256", table_name="grants")
    op.create_index(
        "ix_grants_tenant_id_tool_requester_agent_args_sha256",
        "grants",
        ["tenant_id", "tool", "requester", "agent", "args_sha256"],
    )
    op.execute("UPDATE grants SET args_sha256 = '' WHERE args_sha256 IS NULL")
    op.alter_column("grants", "args_sha256", existing_type=sa.Text(), nullable=False)
    op.drop_column("grants", "content_sha256")
    op.drop_column("approval_decisions", "counted")
