"""Issue 26, class 1: a workflow id is not a conversation.

Temporal starts a closed workflow's id again. Every stored row (messages, tool executions, saga
entries, approval requests, reminders) belongs to one conversation instance (the first run's id),
and every read names it: a conversation started under an ended one's id, by another user, another
tenant or through the same key, inherits nothing. A seal binds tenant, user, agent, workflow id and
instance, and counts for one run. Generated on the real parts: the time-skipping Temporal server,
embedded PostgreSQL, the scripted model over HTTP, the real activities.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.authority import AuthorityActivities
from countersign.client.handles import keyed_workflow_id, send_keyed
from countersign.core.contract import EndConversation, Limits, StartConversation, SubmitMessage
from countersign.core.seal import SealCheck, SealRequest
from countersign.db.engine import session_factory
from countersign.db.events import EventLog
from countersign.db.messages import ConversationStore
from countersign.db.schema import Conversation, ConversationEvent, ModelCall, ProofCheck, ToolExecution
from countersign.identity.proofs import Binding, load_private_key, mint_proof
from tests.fixtures.agent import AgentHarness
from tests.fixtures.inbox import SignedStack
from tests.fixtures.updates import execute_update
from workflows.agent import AgentWorkflow

PROPERTY = settings(
    max_examples=6,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
PARTIES = [("acme", "alice"), ("acme", "bob"), ("acme", "carol"), ("globex", "dave"), ("globex", "erin")]
LOOK_UP_JANE = {
    "when": {"user_contains": "jane"},
    "reply": {"tool_calls": [{"name": "get_lead", "arguments": {"lead": "jane.doe@example.com"}}]},
}
FOUND = {"when": {"after_tool": "get_lead"}, "reply": {"content": "found her"}}


async def model_calls(engine: AsyncEngine, workflow_id: str) -> int:
    async with engine.connect() as conn:
        count = await conn.scalar(
            select(func.count()).select_from(ModelCall).where(ModelCall.workflow_id == workflow_id)
        )
    return int(count or 0)


async def executions(engine: AsyncEngine, workflow_id: str) -> list[Any]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(ToolExecution).where(ToolExecution.workflow_id == workflow_id).order_by(ToolExecution.id)
        )
        return list(rows)


async def converse_under(agent: AgentHarness, workflow_id: str, tenant: str, user: str, text: str) -> str:
    """One single-turn conversation of `tenant`/`user` under `workflow_id`; its instance id."""
    start = StartConversation(
        tenant_id=tenant, user_id=user, agent="lead-qualifier", message=text, single_turn=True
    )
    handle = await agent.client.start_workflow(
        AgentWorkflow.run, start, id=workflow_id, task_queue=agent.settings.task_queue
    )
    agent.track(workflow_id)
    await handle.result()
    assert handle.first_execution_run_id is not None
    return handle.first_execution_run_id


@pytest.mark.security
@PROPERTY
@given(
    parties=st.lists(st.sampled_from(PARTIES), min_size=2, max_size=3),
    key=st.text("abcdefghijklmnopqrstuvwxyz0123456789_.:@-", min_size=1, max_size=12),
)
async def test_a_workflow_id_started_again_inherits_nothing(
    agent: AgentHarness, db_engine: AsyncEngine, parties: list[tuple[str, str]], key: str
) -> None:
    """The same id (a key's) reused across users, tenants and keys: each conversation calls the
    model itself, runs its own tool for its own tenant and user, and stores only its own messages."""
    agent.script(LOOK_UP_JANE, FOUND)
    workflow_id = keyed_workflow_id("acme", f"{key}-{uuid.uuid4().hex[:6]}")
    store = ConversationStore(session_factory(db_engine))
    instances: list[str] = []
    for n, (tenant, user) in enumerate(parties):
        calls_before = await model_calls(db_engine, workflow_id)
        text = f"{user} of {tenant} asks about jane ({n})"
        instance = await converse_under(agent, workflow_id, tenant, user, text)
        assert instance not in instances
        instances.append(instance)
        # the model was asked, twice (the tool call, then the answer): nothing was served from before
        assert await model_calls(db_engine, workflow_id) == calls_before + 2
        messages = await store.load(workflow_id, instance)
        said = [(m.name, m.content) for m in messages if m.role == "user"]
        assert said == [(user, text)], said
        assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
        assert f"in the workspace {tenant!r}" in (messages[0].content or "")
        assert await store.latest(workflow_id) == messages  # what clients read by the id: this one
        async with db_engine.connect() as conn:  # the id's row names this instance, and its owner
            row = (
                await conn.execute(select(Conversation).where(Conversation.workflow_id == workflow_id))
            ).one()
            events = await conn.execute(
                select(ConversationEvent.conversation_id, ConversationEvent.data).where(
                    ConversationEvent.workflow_id == workflow_id, ConversationEvent.kind == "message"
                )
            )
        assert (row.conversation_id, row.tenant_id, row.user_id) == (instance, tenant, user)
        # every instance's events are its own (the readers by workflow id read the row's instance)
        assert [d["user"] for c, d in events if c == instance] == [user]
        # and a reader by workflow id (the chat page, the CLI) is told only this instance's events
        told = await EventLog(session_factory(db_engine)).after(workflow_id, 0)
        assert [e.data["user"] for e in told if e.kind == "message"] == [user]
    rows = await executions(db_engine, workflow_id)
    assert [(r.conversation_id, r.call_id, r.tenant_id, r.user_id, r.outcome) for r in rows] == [
        (instance, "c1", tenant, user, "executed")
        for instance, (tenant, user) in zip(instances, parties, strict=True)
    ]
    for row in rows:  # each saw its own tenant's Jane
        found = json.loads(json.dumps(row.result))
        assert found["ok"] and found["data"]["email"] == "jane.doe@example.com", found
    lead_ids = {tenant: row.result["data"]["id"] for row, (tenant, _) in zip(rows, parties, strict=True)}
    assert len(set(lead_ids.values())) == len(lead_ids)  # acme's and globex's Jane are two records


@pytest.mark.security
async def test_a_key_whose_conversation_ended_starts_a_fresh_one(
    agent: AgentHarness, db_engine: AsyncEngine
) -> None:
    """`send --conversation KEY` after alice's keyed conversation ended: bob's question is his own
    conversation's first message, answered by the model, with none of alice's."""
    agent.script(LOOK_UP_JANE, FOUND, {"reply": {"content": "hello bob"}})
    key = f"telegram_{uuid.uuid4().hex[:8]}"
    store = ConversationStore(session_factory(db_engine))
    for user, text in (("alice", "tell me about jane"), ("bob", "hello, who am I talking to?")):
        start = StartConversation(tenant_id="acme", user_id=user, agent="lead-qualifier", single_turn=True)
        message = SubmitMessage(user_id=user, text=text, message_id=uuid.uuid4().hex)
        handle = await send_keyed(agent.client, agent.settings, start, key, message)
        agent.track(handle.id)
        await agent.client.get_workflow_handle(handle.id).result()
    said = [(m.role, m.name, m.content) for m in await store.latest(handle.id) if m.role != "system"]
    assert said == [
        ("user", "bob", "hello, who am I talking to?"),
        ("assistant", None, "[scripted model] hello bob"),
    ]


# --- seals: bound to whose conversation it is, spent once ------------------------------------

INSTANCE = {
    "tenant_id": "acme",
    "user_id": "alice",
    "agent": "lead-qualifier",
    "workflow_id": "conv-acme-key-k",
    "conversation_id": "run-a",
}
OTHER = {
    "tenant_id": st.sampled_from(["globex", "acme2"]),
    "user_id": st.sampled_from(["bob", "dave", "alice2"]),
    "agent": st.sampled_from(["operations", "scheduler"]),
    "workflow_id": st.sampled_from(["conv-globex-key-k", "conv-acme-key-k2"]),
    "conversation_id": st.sampled_from(["run-b", ""]),
    "digest": st.sampled_from(["0" * 64, "f" * 64]),
}


@pytest.mark.security
@PROPERTY
@given(
    changed=st.dictionaries(st.sampled_from(sorted(OTHER)), st.none(), min_size=1).flatmap(
        lambda keys: st.fixed_dictionaries({k: OTHER[k] for k in keys})
    )
)
async def test_a_seal_counts_only_for_its_own_conversation_and_only_once(
    db_engine: AsyncEngine, changed: dict[str, str]
) -> None:
    """A real seal presented with any of tenant, user, agent, workflow id, instance, state or the
    run it was sealed by changed is refused; presented as made, it counts for the first run only
    (spent_seals)."""
    authority = AuthorityActivities(session_factory(db_engine), key=b"test-key")
    digest = uuid.uuid4().hex * 2
    made = SealRequest(**INSTANCE, digest=digest)

    def run(run_id: str) -> ActivityEnvironment:
        other = ActivityEnvironment()
        other.info = dataclasses.replace(other.info, workflow_run_id=run_id, workflow_id=made.workflow_id)
        return other

    sealer = f"r0-{digest[:8]}"
    seal = await run(sealer).run(authority.seal_carried, made)

    def check(**fields: str) -> SealCheck:
        values = {**made.model_dump(), **fields}
        return SealCheck(**values, seal=seal, run_instance=values["conversation_id"], continued_from=sealer)

    first, second = run(f"r1-{digest[:8]}"), run(f"r2-{digest[:8]}")
    # the run it says it continued from is not the one that sealed it
    assert "does not verify" in await first.run(
        authority.verify_carried, check().model_copy(update={"continued_from": f"rx-{digest[:8]}"})
    )
    assert "does not verify" in await first.run(authority.verify_carried, check(**changed))
    transplanted = check(**{k: v for k, v in changed.items() if k != "conversation_id"})
    if "conversation_id" in changed:  # the state of instance run-a, presented to another instance
        mismatch = transplanted.model_copy(update={"run_instance": changed["conversation_id"]})
        assert "presented to instance" in await first.run(authority.verify_carried, mismatch)
    assert await first.run(authority.verify_carried, check()) == ""
    assert await first.run(authority.verify_carried, check()) == ""  # a retry of the same run
    assert "already used (a replay)" in await second.run(authority.verify_carried, check())


@pytest.mark.security
@PROPERTY
@given(party=st.sampled_from(PARTIES))
async def test_a_real_carried_state_replayed_under_its_workflow_id_is_refused(
    agent: AgentHarness, db_engine: AsyncEngine, party: tuple[str, str]
) -> None:
    """The sealed state an ended conversation carried across continue-as-new, replayed under the
    same workflow id as the same or another user or tenant: the new instance refuses it."""
    agent.script({"reply": {"content": "ok"}})
    handle = await agent.start("first", limits=Limits(max_turns_per_run=1))
    await agent.client.get_workflow_handle(handle.id).signal(
        AgentWorkflow.submit_message, SubmitMessage(user_id="alice", text="second")
    )
    carried: StartConversation | None = None
    first_run = agent.client.get_workflow_handle(handle.id, run_id=handle.result_run_id)
    for _ in range(200):  # the first run's continue-as-new input: the state and its real seal
        async for event in first_run.fetch_history_events():
            if not event.HasField("workflow_execution_continued_as_new_event_attributes"):
                continue
            attrs = event.workflow_execution_continued_as_new_event_attributes
            if attrs.input.payloads:
                [carried] = await agent.client.data_converter.decode(
                    attrs.input.payloads, [StartConversation]
                )
        if carried is not None:
            break
        await asyncio.sleep(0.05)
    assert carried is not None and carried.seal
    latest = agent.client.get_workflow_handle(handle.id)
    await latest.signal("end", {"requested_by": "alice"})
    await latest.result()
    tenant, user = party
    replay = carried.model_copy(update={"tenant_id": tenant, "user_id": user})
    again = await agent.client.start_workflow(
        AgentWorkflow.run, replay, id=handle.id, task_queue=agent.settings.task_queue
    )
    with pytest.raises(WorkflowFailureError) as failed:
        await again.result()
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "ForgedCarriedState", cause
    assert "presented to instance" in cause.message or "does not verify" in cause.message


@pytest.mark.security
async def test_through_the_server_a_key_whose_conversation_ended_starts_afresh(
    signed_agent: SignedStack,
) -> None:
    """The front door: alice's keyed conversation ended; her next message on the key starts a new
    conversation (the same workflow id, a new instance) that shows and answers none of the old one;
    another user of the tenant is refused the key (409)."""
    stack = signed_agent
    stack.agent.script(LOOK_UP_JANE, FOUND, {"reply": {"content": "hello alice"}})
    alice, bob = await stack.login("alice"), await stack.login("bob")
    key = f"support-{uuid.uuid4().hex[:8]}"
    said: list[Any] = []
    for text in ("tell me about jane", "hello, who am I talking to?"):
        body = {"agent": "lead-qualifier", "message": text, "key": key, "single_turn": True}
        code, started = await stack.call("POST", "/api/conversations", alice, body)
        assert code == 201, started
        workflow_id = started["workflow_id"]
        stack.agent.track(workflow_id)
        await stack.agent.client.get_workflow_handle(workflow_id).result()
        code, said = await stack.call("GET", f"/api/conversations/{workflow_id}/transcript", alice)
        assert code == 200, said
    assert [(m["role"], m["content"]) for m in said if m["role"] != "system"] == [
        ("user", "hello, who am I talking to?"),
        ("assistant", "[scripted model] hello alice"),
    ]
    code, audit = await stack.call("GET", f"/api/conversations/{workflow_id}/audit", alice)
    assert code == 200 and audit == [], audit  # the first conversation's get_lead is not this one's
    body = {"agent": "lead-qualifier", "message": "hello", "key": key}
    assert (await stack.call("POST", "/api/conversations", bob, body))[0] == 409


async def test_an_end_proof_of_a_keys_ended_conversation_is_refused_by_the_next(
    signed_agent: SignedStack, db_engine: AsyncEngine
) -> None:
    """Issue 26, class 2 for requesters: an end's proof names the instance it was issued for. One
    issued for alice's first conversation on a key and never spent (harvested) is refused by the
    next conversation under the same workflow id, on the record; the server's own end counts."""
    stack = signed_agent
    stack.agent.script({"reply": {"content": "hello alice"}})
    alice = await stack.login("alice")
    key = f"support-{uuid.uuid4().hex[:8]}"
    instances: list[str] = []
    for single_turn in (True, False):
        body = {"agent": "lead-qualifier", "message": "hello", "key": key, "single_turn": single_turn}
        code, started = await stack.call("POST", "/api/conversations", alice, body)
        assert code == 201, started
        workflow_id = started["workflow_id"]
        stack.agent.track(workflow_id)
        handle = stack.agent.client.get_workflow_handle(workflow_id)
        if single_turn:
            await handle.result()
        else:
            await execute_update(handle, AgentWorkflow.wait_turn, 1)
        async with db_engine.connect() as conn:
            row = await conn.scalar(
                select(Conversation.conversation_id).where(Conversation.workflow_id == workflow_id)
            )
        instances.append(row or "")
    first, second = instances
    assert first and second and first != second
    harvested = mint_proof(
        load_private_key(stack.keys.private),
        "alice",
        Binding.end("acme", workflow_id, first),
        datetime.now(UTC),
    )
    await handle.signal("end", EndConversation(requested_by="alice", proof=harvested))
    async with db_engine.connect() as conn:
        for _ in range(100):
            reason = await conn.scalar(
                select(ProofCheck.reason).where(
                    ProofCheck.workflow_id == workflow_id, ProofCheck.action == "end", ~ProofCheck.accepted
                )
            )
            if reason:
                break
            await asyncio.sleep(0.1)
    assert reason and "conversation instance" in reason, reason
    assert (await handle.query(AgentWorkflow.status)).state != "ended"
    assert (await stack.call("POST", f"/api/conversations/{workflow_id}/end", alice))[0] == 202
    assert (await handle.result())["ended_by"] == "end by alice"
