"""The request state a waiting MCP call carries through its client: only this server's, unaltered,
unexpired state for exactly this caller, agent, conversation, tool and arguments opens; nothing a
client sends makes `opened` raise."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from countersign.core.continuation import (
    CallBinding,
    Continuation,
    Principal,
    TaskHandle,
    arguments_digest,
    opened,
    sealed,
    task_id,
    task_opened,
)

KEY = b"k" * 32
NOW = datetime(2026, 11, 27, 12, tzinfo=UTC)
BINDING = CallBinding(
    principal=Principal(tenant_id="acme", token_id=7, user_id="alice"),
    agent="lead-qualifier",
    workflow_id="conv-acme-key-mcp:7:alice:lead-qualifier",
    tool="update_lead_status",
    args_sha256=arguments_digest('{"lead": "jane", "new_status": "qualified"}'),
)
STATE = Continuation(
    **BINDING.model_dump(), call_id="mcp-1", nonce="n1", expires_at=NOW + timedelta(minutes=10)
)


def test_the_servers_own_state_opens_for_its_binding() -> None:
    continuation = opened(KEY, sealed(KEY, STATE), BINDING, NOW)
    assert isinstance(continuation, Continuation) and continuation.call_id == "mcp-1"


def test_the_arguments_digest_ignores_key_order_and_spacing_only() -> None:
    assert arguments_digest('{"a":1,"b":2}') == arguments_digest('{ "b": 2, "a": 1 }')
    assert arguments_digest('{"a":1}') != arguments_digest('{"a":2}')


def test_forged_altered_expired_and_misbound_states_are_refused() -> None:
    state = sealed(KEY, STATE)
    tag = state.split(".")[1]
    assert "forged" in str(opened(b"another key" * 3, state, BINDING, NOW))
    other_body = sealed(KEY, STATE.model_copy(update={"call_id": "mcp-2"})).split(".")[0]
    assert "forged" in str(opened(KEY, f"{other_body}.{tag}", BINDING, NOW))
    assert "expired" in str(opened(KEY, state, BINDING, NOW + timedelta(minutes=10)))
    for change in (
        {"tool": "send_email"},
        {"args_sha256": arguments_digest('{"lead": "jane", "new_status": "lost"}')},
        {"principal": Principal(tenant_id="globex", token_id=7, user_id="alice")},
        {"principal": Principal(tenant_id="acme", token_id=8, user_id="alice")},
        {"agent": "scheduler"},
    ):
        assert "another caller" in str(opened(KEY, state, BINDING.model_copy(update=change), NOW)), change


@given(st.text(max_size=300))
def test_nothing_a_client_sends_opens_or_raises(state: str) -> None:
    assert isinstance(opened(KEY, state, BINDING, NOW), str)


TASK = TaskHandle(
    principal=BINDING.principal,
    agent=BINDING.agent,
    workflow_id=BINDING.workflow_id,
    call_id="mcp-1",
    tool="update_lead_status",
    created_at=NOW,
    expires_at=NOW + timedelta(hours=24),
)


def test_a_task_id_opens_for_its_caller_only_unaltered_and_unexpired() -> None:
    sealed_id = task_id(KEY, TASK)
    assert task_opened(KEY, sealed_id, BINDING.principal, BINDING.agent, NOW) == TASK
    bob = BINDING.principal.model_copy(update={"user_id": "bob"})
    assert task_opened(KEY, sealed_id, bob, BINDING.agent, NOW) == "no such task"
    assert task_opened(KEY, sealed_id, BINDING.principal, "other-agent", NOW) == "no such task"
    assert task_opened(b"x" * 32, sealed_id, BINDING.principal, BINDING.agent, NOW) == "no such task"
    assert task_opened(KEY, sealed_id[:-2] + "AA", BINDING.principal, BINDING.agent, NOW) == "no such task"
    later = NOW + timedelta(hours=25)
    assert "expired" in str(task_opened(KEY, sealed_id, BINDING.principal, BINDING.agent, later))


def test_a_task_id_and_a_request_state_never_pass_as_each_other() -> None:
    """Both are sealed with the same key, under different labels."""
    state = sealed(KEY, STATE)
    assert task_opened(KEY, state, BINDING.principal, BINDING.agent, NOW) == "no such task"
    body, tag = task_id(KEY, TASK).split(".")
    assert opened(KEY, f"{body}.{tag}", BINDING, NOW) == "the request state was altered or forged"


@given(st.text(max_size=300))
def test_nothing_a_client_sends_as_a_task_id_raises(sent: str) -> None:
    assert task_opened(KEY, sent, BINDING.principal, BINDING.agent, NOW) == "no such task"
