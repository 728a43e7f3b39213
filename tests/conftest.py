"""Fixtures come from plugin modules, one per real part: PostgreSQL, Temporal, the scripted model."""

pytest_plugins = [
    "tests.fixtures.postgres",
    "tests.fixtures.temporal",
    "tests.fixtures.scripted_model",
    "tests.fixtures.agent",
    "tests.fixtures.temporal_dev",
    "tests.fixtures.smtp",
    "tests.fixtures.inbox",
    "tests.fixtures.mcp",
    "tests.fixtures.chat",
]
