"""The conversation's pure rules (workflows/rules.py), without a server: the Web UI's labels and
details of a call and a conversation, how an activity that failed for good ends a turn, and which
write of a batch failed. None of them may raise on what the model sent."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError, TimeoutType

from countersign.core.approvals import Approval
from countersign.core.calls import Category, StoredResult, ToolSpec
from countersign.core.contract import AgentSnapshot, ConversationContext, PendingQuestion
from countersign.core.messages import ToolCall, Usage
from workflows.rules import (
    call_details,
    call_summary,
    execution_failure,
    failed_write,
    status_details,
    turn_failure,
    turn_wait_refusal,
)


def failed(cause: BaseException | None) -> ActivityError:
    """An activity error as the SDK raises it in workflow code, with `cause` as its cause."""
    err = ActivityError(
        "Activity task failed",
        scheduled_event_id=5,
        started_event_id=6,
        identity="worker-1",
        activity_type="call_model",
        activity_id="7",
        retry_state=None,
    )
    err.__cause__ = cause
    return err


# --- how an activity that failed for good ends a turn ---------------------------------------------


def test_a_timeout_ends_the_turn_at_its_limit() -> None:
    cause = TimeoutError("timed out", type=TimeoutType.START_TO_CLOSE, last_heartbeat_details=[])
    assert turn_failure("model call", failed(cause)) == (
        "limit_reached",
        "LIMIT_REACHED: the model call did not finish within turn_timeout_s.",
    )
    assert execution_failure(failed(cause)) == "timed out"


def test_a_spent_budget_ends_the_turn_at_its_limit_in_its_own_words() -> None:
    cause = ApplicationError("LIMIT_REACHED: acme used its 200000 tokens today", type="LimitReached")
    assert turn_failure("model call", failed(cause)) == (
        "limit_reached",
        "LIMIT_REACHED: acme used its 200000 tokens today.",
    )


def test_any_other_failure_is_an_error_naming_what_failed_and_why() -> None:
    cause = ApplicationError("the model endpoint answered 401", type="ModelRefused", non_retryable=True)
    assert turn_failure("model call", failed(cause)) == (
        "error",
        "The turn stopped: the model call failed (the model endpoint answered 401).",
    )
    assert turn_failure("summary", failed(None))[1].startswith("The turn stopped: the summary failed (")


def test_a_tool_calls_failure_is_told_without_internals() -> None:
    refused = ApplicationError("duplicate key value violates unique constraint", type="DatabaseRefused")
    assert execution_failure(failed(refused)) == "was refused by the database"
    assert execution_failure(failed(ApplicationError("connection refused", type="OSError"))) == (
        "could not reach the database"
    )


# --- which write of a batch failed -----------------------------------------------------------------


def spec(name: str, category: Category) -> ToolSpec:
    return ToolSpec(
        name=name, description=name, parameters={}, risk="low", category=category, tier="always_allow"
    )


TOOLS = {
    s.name: s
    for s in [spec("get_lead", "read"), spec("create_task", "write"), spec("send_email", "external")]
}


def result(call_id: str, tool: str, code: str | None) -> StoredResult:
    return StoredResult(seq=1, call_id=call_id, tool=tool, ok=code is None, code=code)


@pytest.mark.parametrize(
    ("batch", "failure"),
    [
        ([("c1", "get_lead", "INTERNAL_ERROR")], None),  # a read failing undoes nothing
        ([("c1", "create_task", None), ("c2", "create_task", "CONFLICT")], "c2 create_task"),
        ([("c1", "send_email", "NOT_FOUND"), ("c2", "create_task", "INTERNAL_ERROR")], "c1 send_email"),
        ([("c1", "create_task", "VALIDATION_ERROR"), ("c2", "create_task", "REJECTED")], None),  # refusals
        (
            [("c1", "create_task", "LIMIT_REACHED"), ("c2", "mcp__x__y", "INTERNAL_ERROR")],
            None,
        ),  # unknown tool
    ],
)
def test_the_first_write_that_failed_for_good(
    batch: list[tuple[str, str, str | None]], failure: str | None
) -> None:
    calls = [ToolCall(id=call_id, name=tool) for call_id, tool, _ in batch]
    results = [result(*entry) for entry in batch]
    assert failed_write(TOOLS, calls, results) == failure


# --- the Web UI's labels and details ---------------------------------------------------------------


def test_a_calls_label_names_its_values() -> None:
    assert (
        call_summary("get_lead", '{"lead": "jane.doe@example.com", "x": null}')
        == "get_lead jane.doe@example.com"
    )
    assert call_summary("get_lead", "{not json") == "get_lead (invalid JSON arguments)"
    assert call_summary("list_tasks", "[1, 2]") == "list_tasks"
    assert call_summary("get_lead", '{"lead": "*bold* [link](x)"}') == r"get_lead \*bold\* \[link\](x)"


def test_a_label_holds_nothing_a_workflow_task_could_not_encode() -> None:
    """A lone surrogate the model wrote as `"\\ud800"` would fail every workflow task."""
    assert call_summary("get_lead", '{"lead": "a\\u0000b\\ud800"}') == "get_lead a\ufffdb\ufffd"


def test_a_pending_calls_details_name_each_argument() -> None:
    assert call_details("update_lead_status", '{"lead": "jane", "new_status": "qualified"}') == (
        "`update_lead_status` · lead: jane · new\\_status: qualified"  # markdown escaped, keys too
    )
    assert call_details("x", '"text"') == "`x` (arguments not a JSON object)"
    assert call_details("x", '{"a": 1, "a": 2}') == "`x` (arguments not a JSON object)"  # a key twice
    many = call_details("x", json.dumps({f"k{i}": i for i in range(20)}))
    assert many.count(" · ") == 12  # the tool and twelve arguments


@given(tool=st.text(max_size=80), arguments=st.text(max_size=2_000))
def test_labels_and_details_never_raise_and_stay_bounded(tool: str, arguments: str) -> None:
    summary = call_summary(tool, arguments)
    assert len(summary) <= 400 and "\x00" not in summary
    assert not any(0xD800 <= ord(c) <= 0xDFFF for c in summary)  # every workflow task could encode it
    assert len(call_details(tool, arguments)) <= 800


def test_a_conversations_details_say_who_and_what_waits_for_people() -> None:
    context = ConversationContext(
        tenant_id="acme",
        user_id="alice",
        roles=["sales"],
        agent=AgentSnapshot(name="lead-qualifier", system_prompt="-"),
        tools=[],
    )
    at = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
    approvals = [
        Approval(
            call_id=call_id,
            tool="update_lead_status",
            args='{"lead": "jane"}',
            risk="high",
            requested_by="alice",
            requested_at=at,
            expires_at=at,
            state=state,
        )
        for call_id, state in (("c1", "pending"), ("c2", "approved"))
    ]
    question = PendingQuestion(call_id="c3", question="Which *Jane*?", asked_at="", expires_at="")
    usage = Usage(prompt_tokens=500, completion_tokens=31, model_calls=2, tool_calls=1)
    details = status_details("awaiting_approval", 4, context, usage, approvals, [question])
    assert details == (
        "**awaiting_approval** · turn 4 · acme/alice · agent lead-qualifier\n\n"
        "usage: 2 model calls, 1 tool call, 531 tokens\n\n"
        "- awaiting approval: `c1` `update_lead_status` · lead: jane "
        "(risk high, expires 2026-12-01 09:30 UTC)\n"
        "- awaiting answer: `c3` Which \\*Jane\\*?"
    )
    assert status_details("idle", 0, None, Usage(), [], []) == (
        "**idle** · turn 0 · \n\nusage: 0 model calls, 0 tool calls, 0 tokens"
    )


def test_a_wait_is_for_a_turn_asked_for_or_the_next() -> None:
    assert turn_wait_refusal(1, started=0, queued=1) is None
    assert turn_wait_refusal(2, started=1, queued=0) is None  # the next turn
    assert turn_wait_refusal(3, started=1, queued=1) is None
    assert turn_wait_refusal(3, started=1, queued=0) == "turn 3 has not been asked for (1 begun, 0 waiting)"
    assert turn_wait_refusal(2**31 - 1, started=5, queued=8) is not None
    assert turn_wait_refusal(0, started=5, queued=0) == "turns count from 1, not 0"
