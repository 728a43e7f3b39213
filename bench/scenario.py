"""The scripted model's benchmark script: every workload's conversation, each picked by its message.

- `STEPS_MESSAGE`: `steps` sequential `search_leads` calls (one per model reply), then a text reply.
- `PARALLEL_MESSAGE`: PARALLEL_REPLIES model replies that each ask for PARALLEL_CALLS `search_leads`
  calls at once (OpenAI-style parallel tool calls), then a text reply.
- `approval_message(status)`: one `update_lead_status` of Jane Doe to `status` (needs approval).
- `WAIT_MESSAGE`: one `update_lead_status` of John Smith that nobody decides (the RSS workload).
"""

from __future__ import annotations

from typing import Any

from countersign.scripted_model.scenario import Scenario

STEPS_MESSAGE = "bench steps: look Jane Doe up"
PARALLEL_MESSAGE = "bench parallel: look Jane Doe up"
PARALLEL_CALLS = 5
PARALLEL_REPLIES = 2  # 10 calls: within the default max_tool_calls (20) per turn
WAIT_MESSAGE = "bench wait: qualify John Smith"
JANE = "jane.doe@example.com"
JOHN = "john.smith@initech.example"
APPROVAL_STATUSES = ("contacted", "new")  # alternated, so every approved call changes the lead


def approval_message(status: str) -> str:
    return f"bench approve: set jane to {status}"


def _status_change(lead: str, status: str) -> dict[str, Any]:
    arguments = {"lead": lead, "new_status": status, "reason": "benchmark"}
    return {"tool_calls": [{"name": "update_lead_status", "arguments": arguments}]}


def _search(calls: int = 1) -> dict[str, Any]:
    return {"tool_calls": [{"name": "search_leads", "arguments": {"query": "Jane Doe"}}] * calls}


def _parallel_rules(replies: int) -> list[dict[str, Any]]:
    """Listed before the step rules: they match on the (latest) user message too."""
    search = _search(PARALLEL_CALLS)
    rules: list[dict[str, Any]] = [
        {"when": {"user_contains": PARALLEL_MESSAGE, "after_tool": "search_leads", "turn_calls": done},
         "reply": search}
        for done in range(PARALLEL_CALLS, replies * PARALLEL_CALLS, PARALLEL_CALLS)
    ]  # fmt: skip
    rules.append(
        {"when": {"user_contains": PARALLEL_MESSAGE, "after_tool": "search_leads"},
         "reply": {"content": f"{replies * PARALLEL_CALLS} lookups done."}}
    )  # fmt: skip
    return [{"when": {"user_contains": PARALLEL_MESSAGE}, "reply": search}, *rules]


def _step_rules(steps: int) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = [{"when": {"user_contains": STEPS_MESSAGE}, "reply": _search()}]
    rules += [
        {"when": {"after_tool": "search_leads", "turn_calls": done}, "reply": _search()}
        for done in range(1, steps)
    ]
    rules.append({"when": {"after_tool": "search_leads"}, "reply": {"content": f"{steps} lookups done."}})
    return rules


def bench_scenario(steps: int) -> Scenario:
    rules = [*_parallel_rules(PARALLEL_REPLIES), *_step_rules(steps)]
    rules += [
        {"when": {"user_contains": approval_message(s)}, "reply": _status_change(JANE, s)}
        for s in APPROVAL_STATUSES
    ]
    rules.append({"when": {"user_contains": WAIT_MESSAGE}, "reply": _status_change(JOHN, "qualified")})
    rules.append({"when": {"after_tool": "update_lead_status"}, "reply": {"content": "Status updated."}})
    return Scenario.model_validate({"name": "benchmark", "rules": rules})
