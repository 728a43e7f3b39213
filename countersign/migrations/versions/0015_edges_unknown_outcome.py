"""A tool call whose outcome is unknown: an MCP call sent, with no usable answer (issue 26).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-25

`tool_executions.outcome` may be `unknown`: the server was sent the call and its answer could not
be read, flooded out or never came, so it may have run. "failed" said it had not.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BEFORE = ("executed", "failed", "rejected", "expired", "refused", "blocked", "invalid", "limit_reached")


def _outcomes(values: tuple[str, ...]) -> None:
    allowed = ", ".join(f"'{v}'" for v in values)
    # the CHECK on outcome, whatever an earlier revision or create_all named it
    op.execute(
        """
        DO $$ DECLARE c text; BEGIN
          FOR c IN SELECT conname FROM pg_constraint
                   WHERE conrelid = 'tool_executions'::regclass AND contype = 'c'
                     AND pg_get_constraintdef(oid) LIKE '%outcome%'
          LOOP EXECUTE format('ALTER TABLE tool_executions DROP CONSTRAINT %I', c); END LOOP;
        END $$
        """
    )
    check = f"CHECK (outcome IN ({allowed}))"
    op.execute(f"ALTER TABLE tool_executions ADD CONSTRAINT ck_tool_executions_outcome {check}")


def upgrade() -> None:
    _outcomes((*BEFORE, "unknown"))


def downgrade() -> None:
    op.execute("UPDATE tool_executions SET outcome = 'failed' WHERE outcome = 'unknown'")
    _outcomes(BEFORE)
