"""The shipped scripted-model scenarios (one per agent) and how a request finds its agent's script;
the markdown escaping of Web UI text. All pure: no server."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from countersign.core.calls import ToolResult
from countersign.core.markdown import escape_markdown
from countersign.db.seed import AGENTS
from countersign.runtime.config import PROJECT_ROOT
from countersign.scripted_model.scenario import (
    ScenarioError,
    choose_reply,
    filled,
    load_scenarios,
    scenario_for,
)
from tests.fixtures.scripted_model import rules
from tools import REGISTRY
from tools.arguments import parse_arguments
from workflows.rules import call_summary

SHIPPED = load_scenarios(PROJECT_ROOT / "countersign" / "scenarios")


# The MCP tools a shipped scenario calls, per agent (docs/how-to/mcp-servers.md registers their
# server for it).
MCP_TOOLS = {"lead-qualifier": {"mcp__time__get_current_time"}}


def test_every_seeded_agent_has_its_own_scenario() -> None:
    assert {s.agent for s in SHIPPED} == set(AGENTS)


@pytest.mark.parametrize("scenario", SHIPPED, ids=lambda s: s.agent)
def test_a_scenario_calls_only_its_agents_tools_with_valid_arguments(scenario) -> None:
    """MCP tools (`mcp__time__…`) are a registered server's, not the catalog's: the documentation's MCP
    section registers `mcp-server-time` and `tests/e2e/test_walkthrough.py` runs that call."""
    _, _, native = AGENTS[scenario.agent]
    tools = {*native, *MCP_TOOLS.get(scenario.agent, ())}
    for rule in scenario.rules:
        for call in rule.reply.tool_calls:
            assert call.name in tools, f"{scenario.agent} has no tool {call.name}"
            if call.name in REGISTRY:  # a "{group}" of `user_matches` as a number the user typed
                groups = re.compile(rule.when.user_matches or "").groupindex
                args = filled(call.arguments, dict.fromkeys(groups, "1"))
                parse_arguments(REGISTRY[call.name], args)  # raises when invalid
        if rule.when.after_tool is not None:
            assert rule.when.after_tool in tools


def test_a_request_gets_its_agents_script_else_the_one_for_any_agent() -> None:
    ops = rules({"reply": {"content": "ops"}}, name="ops").model_copy(update={"agent": "operations"})
    anyone = rules({"reply": {"content": "any"}}, name="any")
    assert scenario_for([ops, anyone], "operations") is ops
    assert scenario_for([ops, anyone], "scheduler") is anyone
    assert scenario_for([ops, anyone], None) is anyone
    assert scenario_for([ops], "scheduler") is None


def test_a_directory_with_two_scripts_for_one_agent_is_refused(tmp_path: Path) -> None:
    for name in ("a.yaml", "b.yaml"):
        (tmp_path / name).write_text("name: x\nagent: operations\nrules: []\n")
    with pytest.raises(ScenarioError, match="more than one scenario for operations"):
        load_scenarios(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ScenarioError, match="no scenario files"):
        load_scenarios(empty)


def test_markdown_in_arguments_shows_as_typed() -> None:
    assert escape_markdown("see [docs](http://x) *now* `x` <b>") == (
        r"see \[docs\](http://x) \*now\* \`x\` \<b\>"
    )
    # The risk and expiry that follow a summary can no longer become a link's target.
    summary = call_summary("update_lead_status", '{"lead": "jane", "reason": "per [ticket]"}')
    assert summary == r"update_lead_status jane per \[ticket\]"


def test_the_scheduler_says_why_nothing_was_proposed() -> None:
    """A refused proposal is not "nobody is free" (issue 41): the scheduler's script answers a
    failure by pointing at it, an open session asked again with its times, an empty week as such."""
    (scheduler,) = [s for s in SHIPPED if s.agent == "scheduler"]
    slot = {
        "index": 1,
        "starts_at": "2026-12-07T09:30:00Z",
        "counterpart_local": "Mon 2026-12-07 09:30-10:00 UTC",
    }

    def after(result: ToolResult) -> str | None:
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": "Find a slot with John Smith"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "schedule_meeting"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": result.to_content()},
        ]
        reply = choose_reply(scheduler, messages)
        return reply.content if reply else None

    refused = after(ToolResult.failure("CONFLICT", "session 1 with John Smith is still open until …"))
    assert refused == "Nothing was proposed: see the tool result."
    again = after(ToolResult(ok=True, data={"session": 1, "status": "still_open", "slots": [slot]}))
    assert again is not None and again.startswith("You and John Smith have free 30-minute slots")
    empty = after(ToolResult(ok=True, data={"session": None, "status": "no_slots", "slots": []}))
    assert empty == "Nobody is free long enough in that window."


def test_the_drafts_pages_send_it_sends_that_draft_through_send_draft() -> None:
    """Issue 50 item 3: the message the Drafts page's "Send it" puts in the chat (drafts.js) asks the
    shipped lead-qualifier for send_draft of that draft, even when its subject says "draft" or
    "qualify"; it used to save another draft."""
    script = scenario_for(SHIPPED, "lead-qualifier")
    assert script is not None
    asked = 'Please send draft 42 ("Qualify: our draft" to jane.doe@example.com).'
    reply = choose_reply(script, [{"role": "user", "content": asked}])
    assert reply is not None and [c.name for c in reply.tool_calls] == ["send_draft"]
    assert parse_arguments(REGISTRY["send_draft"], reply.tool_calls[0].arguments).model_dump() == {
        "draft": 42
    }
