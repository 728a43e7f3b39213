"""What crosses between the workflow and the tool activities (countersign.core.calls), as plain
functions: the envelope the model reads, the keys a call is known by, the emails a result queued,
the stub that stands for a stored result, and the audit outcome of a refusal."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from countersign.core.calls import (
    OUTCOME_OF,
    QUEUES_EMAIL,
    CallerContext,
    McpTool,
    StoredResult,
    ToolInvocation,
    ToolResult,
    ToolSpec,
    call_key,
    lock_key,
    outcome_of,
    queued_emails,
    result_for_model,
    stored_at,
)

CALLER = CallerContext(tenant_id="acme", user_id="alice", roles=["sales"], agent="lead-qualifier")


def invocation(arguments: str = '{"lead": "jane"}', model_arguments: str | None = None) -> ToolInvocation:
    return ToolInvocation(
        caller=CALLER,
        workflow_id="conv-1",
        conversation_id="run-1",
        run_id="run-2",
        call_id="c3",
        tool="update_lead_status",
        arguments=arguments,
        model_arguments=model_arguments,
    )


# --- the envelope ----------------------------------------------------------------------------------


def test_the_three_envelopes_the_model_reads() -> None:
    assert ToolResult.success({"id": 1}).to_content() == '{"ok":true,"data":{"id":1}}'
    assert ToolResult.failure("NOT_FOUND", "no lead jane").envelope() == {
        "ok": False,
        "error": {"code": "NOT_FOUND", "message": "no lead jane"},
    }
    assert ToolResult.needing(contact=True).envelope() == {"ok": False, "needs": {"contact": True}}


def test_a_needs_answer_carries_the_candidates_to_choose_from() -> None:
    result = ToolResult(ok=False, needs={"contact": True}, data=[{"name": "Sam Lee"}, {"name": "Sam Li"}])
    assert result.envelope() == {
        "ok": False,
        "needs": {"contact": True},
        "candidates": [{"name": "Sam Lee"}, {"name": "Sam Li"}],
    }


def test_the_error_code_is_the_failures_only() -> None:
    assert ToolResult.failure("RATE_LIMITED", "slow down").code == "RATE_LIMITED"
    assert ToolResult.success(None).code is None
    assert ToolResult.needing(x=True).code is None


def test_data_json_cannot_write_is_written_as_text() -> None:
    from datetime import date

    assert json.loads(ToolResult.success({"due": date(2026, 12, 4)}).to_content())["data"] == {
        "due": "2026-12-04"
    }


# --- keys ------------------------------------------------------------------------------------------


def test_a_calls_key_names_its_instance_and_a_conversation_from_before_instances_keeps_its_old_key() -> None:
    assert call_key("conv-1", "run-1", "c1") == "conv-1:run-1:c1"
    assert call_key("conv-1", "", "c1") == "conv-1:c1"
    assert invocation().key == "conv-1:run-1:c3"


@given(first=st.text(min_size=1, max_size=5), second=st.text(min_size=1, max_size=5))
def test_two_instances_of_one_workflow_id_never_share_a_call_key_but_share_its_lock(
    first: str, second: str
) -> None:
    """Call ids restart at c1 in every instance: only the instance keeps their results apart."""
    assert (call_key("conv-1", first, "c1") == call_key("conv-1", second, "c1")) == (first == second)
    assert lock_key("conv-1", "c1") == "conv-1:c1"


# --- approvers' edits ------------------------------------------------------------------------------


def test_a_call_run_with_an_approvers_edit_tells_the_model_so() -> None:
    edited = invocation(
        arguments='{"lead": "jane", "new_status": "contacted"}', model_arguments='{"lead": "jane"}'
    )
    assert edited.arguments_edited
    told = result_for_model(edited, ToolResult.success({"id": 7}))
    assert told.data == {
        "result": {"id": 7},
        "arguments_edited_by_approver": {"lead": "jane", "new_status": "contacted"},
    }


def test_an_unedited_call_or_a_failed_one_reads_as_it_came() -> None:
    ok = ToolResult.success({"id": 7})
    assert result_for_model(invocation(), ok) is ok
    failed = ToolResult.failure("CONFLICT", "changed meanwhile")
    assert result_for_model(invocation(model_arguments="{}"), failed) is failed


# --- emails a result queued ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "data", "queued"),
    [
        ("send_email", {"status": "queued", "outbox_id": 4}, [4]),
        ("send_email", {"status": "sent", "outbox_id": 4}, []),
        ("send_email", {"status": "queued", "outbox_id": "4"}, []),
        ("schedule_meeting", {"outbox_ids": [1, "2", None, 3]}, [1, 3]),
        ("schedule_meeting", {"outbox_ids": "1,2"}, []),
        ("mcp__web__send_email", {"status": "queued", "outbox_id": 4}, []),  # an MCP result may say anything
        ("update_lead_status", {"outbox_ids": [1]}, []),
    ],
)
def test_only_the_named_tools_queue_emails_and_only_integer_ids_count(
    tool: str, data: dict[str, Any], queued: list[int]
) -> None:
    assert queued_emails(tool, data) == queued


def test_the_tools_that_queue_emails() -> None:
    assert QUEUES_EMAIL == {
        "send_email",
        "send_email_to_contact",
        "send_draft",
        "schedule_meeting",
        "confirm_meeting",
        "accept_meeting",
    }


# --- stored results --------------------------------------------------------------------------------


@given(
    seq=st.integers(0, 10**9),
    ok=st.booleans(),
    code=st.none() | st.sampled_from(["NOT_FOUND", "REJECTED"]),
    needs=st.none() | st.lists(st.sampled_from(["contact", "date"]), max_size=2),
)
def test_a_stub_is_json_and_names_where_its_body_is(
    seq: int, ok: bool, code: Any, needs: list[str] | None
) -> None:
    stub = StoredResult(seq=seq, call_id="c1", tool="get_lead", ok=ok, code=code, needs=needs).stub()
    shown = json.loads(stub)
    assert shown["ok"] is ok and shown["stored_at"] == seq
    assert shown.get("error") == ({"code": code} if code else None)
    assert shown.get("needs") == needs
    assert stored_at(stub) == seq


@pytest.mark.parametrize(
    "content",
    [
        None,
        "",
        ToolResult.success({"stored": 3}).to_content(),  # a real envelope never names it
        "the text stored_at 3",
        '{"stored_at": "3"}',
        '["stored_at", 3]',
        '{"stored_at": 3',
    ],
)
def test_any_other_content_names_no_stored_result(content: str | None) -> None:
    assert stored_at(content) is None


# --- the audit's outcome ---------------------------------------------------------------------------


def test_each_refusal_has_its_outcome_and_anything_else_failed() -> None:
    # stopped before the tool: the refusal's own outcome
    assert outcome_of("VALIDATION_ERROR", ran=False) == "invalid"
    assert outcome_of("FORBIDDEN", ran=False) == "blocked"
    assert outcome_of("CONNECTION_INACTIVE", ran=False) == "refused"
    assert outcome_of("INTERNAL_ERROR", ran=False) == "failed"
    assert outcome_of(None, ran=False) == "failed"
    # ran: only the checks made before the tool keep their outcome; the tool's own answer failed
    assert outcome_of(None, ran=True) == "executed"
    assert outcome_of("VALIDATION_ERROR", ran=True) == "invalid"
    assert outcome_of("CONNECTION_INACTIVE", ran=True) == "refused"
    assert outcome_of("FORBIDDEN", ran=True) == "failed"
    assert outcome_of("NOT_FOUND", ran=True) == "failed"
    assert set(OUTCOME_OF.values()) == {
        "invalid",
        "blocked",
        "limit_reached",
        "rejected",
        "expired",
        "refused",
    }


# --- MCP tools ---------------------------------------------------------------------------------------


def test_an_mcp_servers_hints_are_worded_as_its_claims() -> None:
    tool = McpTool(
        server="git",
        tool="commit",
        fingerprint="f",
        annotations={
            "readOnlyHint": False,
            "destructiveHint": True,
            "title": "Commit",
            "openWorldHint": "yes",
        },
    )
    assert tool.hints() == "MCP server git says (unverified): not read-only, destructive"
    assert (
        McpTool(server="web", tool="x", fingerprint="f").hints()
        == "MCP server web says (unverified): no hints"
    )


def test_strict_schemas_for_native_tools_only() -> None:
    native = ToolSpec(
        name="get_lead",
        description="Get a lead",
        parameters={"type": "object"},
        risk="low",
        category="read",
        tier="always_allow",
    )
    mcp = native.model_copy(
        update={"name": "mcp__web__fetch", "mcp": McpTool(server="web", tool="fetch", fingerprint="f")}
    )
    assert native.openai_tool() == {
        "type": "function",
        "function": {
            "name": "get_lead",
            "description": "Get a lead",
            "parameters": {"type": "object"},
            "strict": True,
        },
    }
    assert mcp.openai_tool()["function"]["strict"] is False
