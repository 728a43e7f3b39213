"""A hash chain per tenant over the audit's facts: the audit as evidence (issue 38).

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-27

One row per fact Countersign wrote to a table of the audit, appended in the same transaction
(countersign.db.chain); rows written before this revision are not chained.

Written by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
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

    # One round trip per fact: lock the tenant's chain until the transaction ends, read its head
    # (a new snapshot: what committed while this waited), hash as countersign.core.evidence.link
    # does, insert. A retried write (same row, same content) inserts nothing.
    op.execute(
        """
        CREATE FUNCTION audit_chain_append(
            p_tenant text, p_source text, p_source_id text, p_fact_sha256 text, p_record text
        ) RETURNS void LANGUAGE plpgsql VOLATILE AS $$
        DECLARE
            head_seq bigint;
            head_hash text;
        BEGIN
            PERFORM pg_advisory_xact_lock(hashtextextended('audit_chain:' || p_tenant, 0));
            SELECT seq, hash INTO head_seq, head_hash FROM audit_chain
                WHERE tenant_id = p_tenant ORDER BY seq DESC LIMIT 1;
            IF NOT FOUND THEN
                head_seq := 0;
                head_hash := repeat('0', 64);
            END IF;
            INSERT INTO audit_chain (tenant_id, seq, source, source_id, fact_sha256, record, prev_hash, hash)
            VALUES (
                p_tenant, head_seq + 1, p_source, p_source_id, p_fact_sha256, p_record, head_hash,
                encode(sha256(convert_to(head_hash || E'\\n' || p_record, 'UTF8')), 'hex')
            )
            ON CONFLICT (tenant_id, source, source_id, fact_sha256) DO NOTHING;
        END
        $$
        """
    )


def downgrade() -> None:
    op.execute("DROP FUNCTION audit_chain_append(text, text, text, text, text)")
    op.drop_table("audit_chain")
