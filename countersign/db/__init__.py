"""The database layer: models (`schema`), engine and sessions, migrations (`migrate`), seed data."""
