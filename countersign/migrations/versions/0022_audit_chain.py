"""A hash chain per tenant over the audit's facts: the audit as evidence (issue 38).

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-27

One row per fact Countersign wrote to a table of the audit, appended in the same transaction
(countersign.db.chain); rows written before this revision are not chained.

Written by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "audit_chain",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("source_id", sa.Text(), nullable=False),
        sa.Column("fact_sha256", sa.Text(), nullable=False),
        sa.Column("record", sa.Text(), nullable=False),
        sa.Column("prev_hash", sa.Text(), nullable=False),
        sa.Column("hash", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_audit_chain_tenant_id_tenants"),
        sa.PrimaryKeyConstraint("tenant_id", "seq", name="pk_audit_chain"),
        sa.UniqueConstraint(
            "tenant_id",
            "source",
            "source_id",
            "fact_sha256",
            name="uq_audit_chain_tenant_id_source_source_id_fact_sha256",
        ),
    )


def downgrade() -> None:
    op.drop_table("audit_chain")
