"""A tool result as one line a person reads (countersign.core.summaries), generic over every tool:
the shapes the CLI's own examples (tests/cli/test_cli_text.py) do not show, and the bounds of a line."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from countersign.core.calls import (
    ApproverEdit,
    CallerContext,
    ToolInvocation,
    ToolResult,
    result_for_model,
)
from countersign.core.effects import FieldChange
from countersign.core.summaries import SHOWN_ITEMS, WIDTH, counted, summarize_result, usage_line


def ok(data: object) -> str:
    return json.dumps({"ok": True, "data": data})


@pytest.mark.parametrize(
    ("content", "line"),
    [
        (ok([{"name": f"L{i}"} for i in range(SHOWN_ITEMS + 2)]), "ok: L0; L1; L2; L3; L4, +2 more"),
        (ok(["a", 1, None]), "ok: a; 1; None"),
        (
            ok({"tasks": [{"title": "Call", "status": "open", "due_date": "2026-12-04"}], "ids": [1]}),
            "ok: 1 tasks: Call (open, 2026-12-04)",
        ),
        (
            ok(
                {
                    "lead": {"name": "Jane", "status": "qualified"},
                    "previous_status": "qualified",
                    "new_status": "qualified",
                }
            ),
            "ok: Jane (qualified)",  # nothing changed: no "was"
        ),
        (ok({"name": "Jane", "email": "jane@x", "status": "new"}), "ok: Jane (jane@x, new)"),
        (ok({"email": "jane@x", "status": "new"}), "ok: jane@x (new)"),  # the label is not repeated
        (ok({"text": "12:00 in Tokyo"}), "ok: 12:00 in Tokyo"),  # an MCP server's text content
        (  # a search hit is the record it found, not its id (it read "2 hits: 3; 1")
            ok(
                {
                    "hits": [
                        {"collection": "contacts", "id": 3, "record": {"id": 3, "name": "Sam Lee"}},
                        {"collection": "cases", "id": 1, "record": {"title": "Review", "status": "open"}},
                    ]
                }
            ),
            "ok: 2 hits: contacts: Sam Lee; cases: Review (open)",
        ),
        (  # a notification reads as its message (it read "1 notifications: 4 (open)")
            ok({"notifications": [{"id": 4, "kind": "reminder", "message": "Review due", "status": "open"}]}),
            "ok: 1 notifications: Review due (open, reminder)",
        ),
        (ok({}), "ok: {}"),
        (ok(42), "ok: 42"),
        (ok(None), "ok: null"),
        (json.dumps({"ok": False, "error": "plain words"}), "error: plain words"),
        (json.dumps({"ok": False, "needs": "a date"}), "needs a date"),
        (json.dumps({"ok": False, "needs": {"contact": True, "date": True}}), "needs contact, date"),
        (json.dumps({"ok": False, "needs": {"contact": True}, "candidates": "Sam"}), "needs contact"),
        ('["not", "an", "envelope"]', '["not", "an", "envelope"]'),
        ('{"data": 1}', '{"data": 1}'),
        ("two\n\n  lines\tof text", "two lines of text"),
    ],
)
def test_every_shape_reads_as_one_line(content: str, line: str) -> None:
    assert summarize_result(content) == line


def test_a_result_of_an_edited_call_says_what_the_reviewer_changed_and_why() -> None:
    """Issue 41: the requester reads, in the transcript, that bob changed the call and why (the
    note is the one the model reads: core.calls.result_for_model), after what the call did."""
    edit = ApproverEdit(
        approver="bob",
        changes={"new_status": FieldChange(before="qualified", after="contacted")},
        reason="she is only\ncontacted",
    )
    invocation = ToolInvocation(
        caller=CallerContext(tenant_id="acme", user_id="alice", roles=[], agent="a"),
        workflow_id="w", run_id="r", call_id="c1", tool="update_lead_status",
        arguments='{"new_status": "contacted"}', model_arguments='{"new_status": "qualified"}',
        approver_edit=edit,
    )  # fmt: skip
    told = result_for_model(invocation, ToolResult.success({"name": "Jane Doe", "status": "contacted"}))
    assert summarize_result(told.to_content()) == (
        'ok: Jane Doe (contacted) · bob changed new_status from "qualified" to "contacted" '
        "before approving (reason: she is only contacted)"
    )


def test_a_numbered_item_keeps_its_number() -> None:
    assert summarize_result(ok([{"index": 2, "user_local": "Mon 10:00"}])) == "ok: 2. Mon 10:00"


@given(st.builds(ok, st.lists(st.dictionaries(st.sampled_from(["name", "x"]), st.text()))))
def test_a_summary_is_one_line_within_the_width(content: str) -> None:
    line = summarize_result(content)
    assert len(line) <= WIDTH and "\n" not in line
    assert line == " ".join(line.split())  # no run of whitespace a terminal would show


@given(st.text(max_size=500).filter(lambda text: not text.lstrip().startswith("{")))
def test_text_that_is_no_envelope_is_shown_as_it_is_cut_at_the_width(text: str) -> None:
    words = " ".join(text.split())
    assert summarize_result(text) == (words if len(words) <= WIDTH else words[: WIDTH - 1] + "…")


@pytest.mark.parametrize(("n", "text"), [(0, "0 tokens"), (1, "1 token"), (2, "2 tokens")])
def test_a_count_is_singular_for_one_only(n: int, text: str) -> None:
    assert counted(n, "token") == text


def test_usage_reads_as_one_line() -> None:
    assert usage_line(1, 0, 1) == "1 model call, 0 tool calls, 1 token"
