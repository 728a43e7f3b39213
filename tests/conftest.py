"""Fixtures come from plugin modules, one per real part: PostgreSQL, Temporal, the scripted model."""

import pytest

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
    "tests.fixtures.policies",
    "tests.fixtures.grants",
    "tests.fixtures.approvals",
]

# The files that take longest on two cores, roughly slowest first (per-file sums of `--durations`),
# by file name (test file names are unique across the folders of tests/).
# `make test` hands whole files to pytest-xdist workers in collection order (--no-loadscope-reorder;
# xdist's own order puts files with many tests first, so a long one-test file like the walk-through
# started last and was the run's tail). Started first, they overlap with everything else.
SLOW_FILES = (
    "test_walkthrough.py",
    "test_faults.py",
    "test_input_attempts.py",  # its own dev server, and an update the server gives up after ~20 s
    "test_floods.py",
    "test_devstack.py",
    "test_cli_door.py",
    "test_door_findings.py",
    "test_continued_runs.py",
    "test_mcp_face.py",
    "test_openapi.py",  # schemathesis over every route as three people, on a database of its own
    "test_inbox_sessions.py",
    "test_mcp.py",
    "test_chat.py",
    "test_chat_told_browser.py",
    "test_effects_browser.py",
    "test_what_runs.py",
    "test_hostile_input.py",
    "test_store_cli.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FILES)))  # stable: files stay whole
