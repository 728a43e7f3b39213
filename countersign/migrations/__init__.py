"""Alembic migrations, configured in code by `countersign.db.migrate` (there is no alembic.ini)."""
