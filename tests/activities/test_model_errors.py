"""The model activity's error mapping: what retrying can fix retries (honouring `retry-after`), what it
cannot ends the turn at once with a clear message, and the workflow itself never fails.

End-to-end cases inject faults into the scripted model over HTTP; each retried fault costs about a
second of real time (MODEL_RETRY's initial interval), so there are only a few of them.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta

import httpx2
import openai
import pytest

from activities.model import classify, encodable, retry_after
from countersign.core.calls import ToolSpec
from countersign.core.contract import EndConversation, TurnResult
from countersign.core.messages import (
    KEPT_CHARS,
    MAX_ARGUMENTS_CHARS,
    MAX_REPLY_CHARS,
    MAX_TOOL_NAME_CHARS,
    ToolCall,
    capped_reply,
)
from countersign.core.policy import screen_call
from countersign.scripted_model.server import Fault
from tests.fixtures.agent import AgentHarness
from workflows.agent import AgentWorkflow

GREETING = {"when": {"user_contains": "hello"}, "reply": {"content": "Hi!"}}
REQUEST = httpx2.Request("POST", "http://model.test/v1/chat/completions")


def status_error(status: int, headers: dict[str, str] | None = None) -> openai.APIStatusError:
    response = httpx2.Response(status, headers=headers, request=REQUEST)
    return openai.APIStatusError("injected", response=response, body=None)


# --- classify ------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504])
def test_transient_statuses_retry(status: int) -> None:
    error = classify(status_error(status))
    assert not error.non_retryable and error.type == f"ModelHTTP{status}"
    assert f"HTTP {status}" in error.message


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_request_faults_do_not_retry(status: int) -> None:
    error = classify(status_error(status, {"retry-after": "5"}))
    assert error.non_retryable and error.type == f"ModelHTTP{status}"
    assert f"HTTP {status}" in error.message and error.next_retry_delay is None


@pytest.mark.parametrize(
    ("headers", "delay"),
    [
        ({"retry-after": "2"}, timedelta(seconds=2)),
        ({"retry-after": "0.5"}, timedelta(milliseconds=500)),
        ({"retry-after-ms": "250"}, timedelta(milliseconds=250)),
        ({"retry-after-ms": "250", "retry-after": "9"}, timedelta(milliseconds=250)),
        ({"retry-after-ms": "soon", "retry-after": "9"}, timedelta(seconds=9)),
        ({}, None),
        ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, None),  # Temporal's backoff applies
        ({"retry-after": "-1"}, None),
        ({"retry-after": "inf"}, None),
        ({"retry-after": "nan"}, None),
    ],
)
def test_retry_after(headers: dict[str, str], delay: timedelta | None) -> None:
    assert retry_after(status_error(429, headers)) == delay
    assert classify(status_error(429, headers)).next_retry_delay == delay


def test_unreachable_and_unusable_answers_retry() -> None:
    unreachable = classify(openai.APIConnectionError(request=REQUEST))
    unusable = classify(ValueError("completion has no choices"))
    assert (unreachable.type, unreachable.non_retryable) == ("ModelUnreachable", False)
    assert (unusable.type, unusable.non_retryable) == ("ModelBadResponse", False)


# --- through the workflow ------------------------------------------------------------------------


async def first_turn(agent: AgentHarness) -> TurnResult:
    """Greet the agent, take its first turn, then end the conversation (which must not fail)."""
    agent.script(GREETING)
    handle = await agent.start("hello")
    turn = await handle.execute_update(AgentWorkflow.wait_turn, 1)
    await handle.signal(AgentWorkflow.end, EndConversation(requested_by="alice"))
    assert (await handle.result()).turns == 1
    assert isinstance(turn, TurnResult)
    return turn


@pytest.mark.parametrize(
    "fault",
    [Fault(status=500), Fault(status=503), Fault(raw_body='{"trunc')],
    ids=["500", "503", "truncated-json"],
)
async def test_a_transient_fault_is_retried(agent: AgentHarness, fault: Fault) -> None:
    agent.model.inject(fault)
    turn = await first_turn(agent)
    assert (turn.stop, turn.reply) == ("completed", "[scripted model] Hi!")
    assert len(agent.model.requests) == 2, "exactly one retry"


async def test_a_rate_limit_is_retried_after_retry_after(agent: AgentHarness) -> None:
    agent.model.inject(Fault(status=429, retry_after=2))  # longer than MODEL_RETRY's 1 s first backoff
    started = time.monotonic()
    turn = await first_turn(agent)
    assert turn.stop == "completed" and len(agent.model.requests) == 2
    assert time.monotonic() - started >= 2


@pytest.mark.parametrize("status", [400, 401, 404])
async def test_a_request_fault_ends_the_turn_with_a_clear_message(agent: AgentHarness, status: int) -> None:
    agent.model.inject(Fault(status=status))
    turn = await first_turn(agent)
    assert turn.stop == "error" and turn.reply is not None
    assert turn.reply.startswith("The turn stopped: the model call failed") and f"HTTP {status}" in turn.reply
    assert len(agent.model.requests) == 1, "not retried"


def test_lone_surrogates_from_a_model_are_made_encodable() -> None:
    text = json.loads('"a\\ud800b"')
    assert encodable(text) == "a\ufffdb"  # as NUL: the replacement character
    encodable(text).encode("utf-8")  # what every payload does


def test_a_reply_too_big_for_a_payload_is_cut_where_it_enters() -> None:
    """What a model sends is cut to what a workflow may carry (payloads hold 2 MB): an error the
    model can act on, never a conversation stuck on a payload that cannot be written."""
    call = ToolCall.capped("c1", "n" * 100, '{"q": "' + "x" * MAX_ARGUMENTS_CHARS + '"}')
    assert call.name.startswith("n" * MAX_TOOL_NAME_CHARS + "...(100 characters)")
    assert len(call.arguments) == KEPT_CHARS and call.arguments_chars == MAX_ARGUMENTS_CHARS + 9
    assert ToolCall.capped("c2", "search_leads", '{"q": "x"}').arguments_chars is None
    text = capped_reply("w" * (MAX_REPLY_CHARS + 1))
    assert text.endswith(f"[truncated: the model replied {MAX_REPLY_CHARS + 1} characters]")
    assert capped_reply("short") == "short"


def test_oversized_arguments_are_refused_before_anything_runs_or_waits() -> None:
    spec = ToolSpec(
        name="update_lead_status", description="", parameters={}, risk="high", category="write",
        tier="needs_approval",
    )  # fmt: skip
    call = ToolCall.capped("c1", "update_lead_status", "x" * (MAX_ARGUMENTS_CHARS + 1))
    screening = screen_call(call, {spec.name: spec}, roles=["sales"])
    assert screening.refusal is not None and screening.refusal.error is not None
    assert screening.refusal.error.code == "VALIDATION_ERROR"
    assert f"{MAX_ARGUMENTS_CHARS + 1} characters" in screening.refusal.error.message
