"""The shipped scripted-model scenarios (one per agent) and how a request finds its agent's script;
the markdown escaping of Web UI text. All pure: no server."""

from __future__ import annotations

from pathlib import Path

import pytest

from countersign.core.markdown import escape_markdown
from countersign.db.seed import AGENTS
from countersign.runtime.config import PROJECT_ROOT
from countersign.scripted_model.scenario import ScenarioError, load_scenarios, scenario_for
from tests.fixtures.scripted_model import rules
from tools import REGISTRY
from tools.arguments import parse_arguments
from workflows.rules import call_summary

SHIPPED = load_scenarios(PROJECT_ROOT / "countersign" / "scenarios")


# The MCP tools a shipped scenario calls, per agent (the README registers their server for it).
MCP_TOOLS = {"lead-qualifier": {"mcp__time__get_current_time"}}


def test_every_seeded_agent_has_its_own_scenario() -> None:
    assert {s.agent for s in SHIPPED} == set(AGENTS)


@pytest.mark.parametrize("scenario", SHIPPED, ids=lambda s: s.agent)
def test_a_scenario_calls_only_its_agents_tools_with_valid_arguments(scenario) -> None:
    """MCP tools (`mcp__time__…`) are a registered server's, not the catalog's: the README's MCP
    section registers `mcp-server-time` and `tests/e2e/test_walkthrough.py` runs that call."""
    _, _, native = AGENTS[scenario.agent]
    tools = {*native, *MCP_TOOLS.get(scenario.agent, ())}
    for rule in scenario.rules:
        for call in rule.reply.tool_calls:
            assert call.name in tools, f"{scenario.agent} has no tool {call.name}"
            if call.name in REGISTRY:
                parse_arguments(REGISTRY[call.name], call.arguments)  # raises when invalid
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
