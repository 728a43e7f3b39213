"""A command sent to an ended conversation (cancelled, ended, timed out) says so (issue 41, item 2:
`send` answered "not found: workflow execution already completed")."""

from __future__ import annotations

from temporalio.service import RPCError, RPCStatusCode

from countersign.cli.ux import reason


def test_a_message_to_an_ended_conversation_says_it_has_ended() -> None:
    closed = RPCError("workflow execution already completed", RPCStatusCode.NOT_FOUND, b"")
    said = reason(closed)
    assert said.startswith("the conversation has ended") and "`status` says which" in said
    assert "already completed" not in said


def test_another_not_found_keeps_the_servers_words() -> None:
    unknown = RPCError("workflow not found for ID: conv-acme-000000000000", RPCStatusCode.NOT_FOUND, b"")
    assert reason(unknown) == "not found: workflow not found for ID: conv-acme-000000000000"
