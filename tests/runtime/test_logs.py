"""JSON logs carry the activity's identity: the worker interceptor binds it for every activity."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from countersign.runtime.logs import configure
from tests.fixtures.agent import AgentHarness


@pytest.fixture
def json_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """The worker's logging set-up in JSON at DEBUG, written to a buffer; restored afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    monkeypatch.setenv("COUNTERSIGN_LOG_FORMAT", "json")
    configure("DEBUG")
    buffer = io.StringIO()
    handler = root.handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(buffer)
    try:
        yield buffer
    finally:
        root.handlers[:], root.level = handlers, level
        structlog.reset_defaults()


def records(buffer: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in buffer.getvalue().splitlines() if line.startswith("{")]


async def test_activity_lines_carry_workflow_activity_and_call(
    agent: AgentHarness, json_log: io.StringIO
) -> None:
    agent.script(
        {
            "when": {"user_contains": "jane"},
            "reply": {"tool_calls": [{"name": "search_leads", "arguments": {"query": "Jane Doe"}}]},
        },
        {"when": {"after_tool": "search_leads"}, "reply": {"content": "Found her."}},
    )
    handle = await agent.start("Find Jane", single_turn=True)
    await handle.result()

    finished = [
        r
        for r in records(json_log)
        if r.get("event") == "activity finished" and r.get("workflow_id") == handle.id
    ]
    by_type = {r["activity_type"]: r for r in finished}
    assert {"load_conversation_context", "call_model", "execute_tool"} <= set(by_type)
    tool_line = by_type["execute_tool"]
    assert tool_line["tool"] == "search_leads" and tool_line["call_id"] == "c1"
    assert tool_line["outcome"] == "completed" and tool_line["run_id"] and tool_line["attempt"] == 1
    assert "tool" not in by_type["call_model"]  # bound per activity, cleared after each
