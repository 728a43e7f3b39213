"""Issue 40: a conversation survives any number of continue-as-new runs with nothing changed.

Refused inputs change nothing in the state a conversation carries, so an idle (or waiting)
conversation whose history fills twice between turns carries the same state twice. Its seals must
still differ (each names the run that made it, countersign/core/seal.py): the next run spends the
seal it was started with, and a repeated one would be refused as a replay (`ForgedCarriedState`),
ending the conversation. Generated on the time-skipping server with the history budget lowered (as
in tests/workflows/test_floods.py), so a few refused signals fill a run.
"""

from __future__ import annotations

import pytest
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.client import WorkflowExecutionStatus

from tests.e2e.test_hostile_input import PROPERTY, records
from tests.fixtures.agent import AgentHarness
from tests.fixtures.approvals import ECHO_RESULT, lead_status, qualify
from tests.fixtures.inbox import SignedStack
from tests.fixtures.postgres import reset_jane
from tests.server.test_front_door import HELLO, HI
from tests.workflows.test_floods import flood_until_continued, goes_on, latest, waiting, waiting_in
from tests.workflows.test_floods import small_history_budget as small_history_budget


@pytest.mark.security
@settings(PROPERTY, max_examples=4, phases=[Phase.explicit, Phase.generate])  # a conversation each
@example(state="idle", runs=2, size=20_000)
@example(state="idle", runs=10, size=0)
@example(state="approval", runs=2, size=20_000)
@example(state="question", runs=2, size=1_000)
@given(
    state=st.sampled_from(["idle", "approval", "question"]),
    runs=st.integers(2, 10),
    size=st.integers(0, 40_000),
)
async def test_continuing_as_new_again_and_again_with_nothing_changed_keeps_the_conversation(
    agent: AgentHarness,
    db_engine: AsyncEngine,
    small_history_budget: None,
    state: str,
    runs: int,
    size: int,
) -> None:
    """`runs` continue-as-new runs in a row, each forced by refused messages of `size` characters
    and nothing else: no turn, no decision, no answer between them. Afterwards alice's next
    message is answered, or her pending approval decides, or her question takes its answer; every
    refusal is on the record once, and no workflow task failed."""
    handle, before = await waiting_in(agent, db_engine, state)
    audited = await records(db_engine, handle.id)
    refused = ("submit_message", {"user_id": "mallory", "text": "m" * size})
    sent = 0
    for _ in range(runs):
        sent += await flood_until_continued(agent, handle, [refused], paced=db_engine)
    assert await records(db_engine, handle.id) == audited + sent
    assert (await latest(agent, handle).describe()).status == WorkflowExecutionStatus.RUNNING
    await goes_on(agent, db_engine, handle, state, before)


@pytest.mark.security
@pytest.mark.parametrize("state", ["idle", "approval"])
async def test_through_the_server_a_conversation_continued_twice_with_nothing_changed_still_answers(
    signed_agent: SignedStack, db_engine: AsyncEngine, small_history_budget: None, state: str
) -> None:
    """The issue's case end to end: alice's conversation, started through the server, continues as
    new twice under refused messages sent straight to Temporal; the server still says it runs,
    alice's next message is answered (idle: before, 409 "has ended"), bob's decision through the
    inbox is taken (waiting for a reviewer, whose carried state also holds the time waited, so its
    runs' states differ anyway)."""
    stack, agent = signed_agent, signed_agent.agent
    await reset_jane(db_engine)
    agent.script(qualify(), ECHO_RESULT, HELLO)
    alice = await stack.login("alice")
    first = "hello" if state == "idle" else "qualify jane"
    code, body = await stack.call(
        "POST", "/api/conversations", alice, {"agent": "lead-qualifier", "message": first}
    )
    assert code == 201, body
    wf = body["workflow_id"]
    agent.track(wf)
    handle = agent.client.get_workflow_handle(wf)
    if state == "idle":
        code, reply = await stack.call("GET", f"/api/conversations/{wf}/reply?turn=1&wait=10", alice)
        assert code == 200 and reply["turn"]["reply"] == HI, reply
    else:
        await waiting(handle, "pending_approvals")
    refused = ("submit_message", {"user_id": "mallory", "text": "m" * 20_000})
    for _ in range(2):
        await flood_until_continued(agent, handle, [refused], paced=db_engine)
    code, status = await stack.call("GET", f"/api/conversations/{wf}", alice)
    assert code == 200 and status["state"] != "ended", status
    if state == "idle":
        code, body = await stack.call("POST", f"/api/conversations/{wf}/messages", alice, {"text": "hello"})
        assert code == 202, body
        code, reply = await stack.call(
            "GET", f"/api/conversations/{wf}/reply?message_id={body['message_id']}&wait=10", alice
        )
        assert (code, reply["state"], reply["turn"]["reply"]) == (200, "replied", HI), reply
    else:
        bob = await stack.login("bob")
        code, body = await stack.call("POST", f"/api/approvals/{wf}/c1", bob, {"decision": "approve"})
        assert code == 200, body
        code, reply = await stack.call("GET", f"/api/conversations/{wf}/reply?turn=1&wait=10", alice)
        assert code == 200 and reply["turn"]["reply"] == "[scripted model] done", reply
        assert await lead_status(db_engine, "acme") == "qualified"
