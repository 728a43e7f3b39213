"""Content a reviewer is asked to approve a call on stays what they read (issue 34).

A draft that a call waiting for a decision names (`send_draft`, `update_draft`) cannot be edited, by
the agent's `update_draft`, a person's `PATCH /api/drafts/{id}` or the operator's CLI; only its author
or an admin edits a draft; every edit is recorded with its diff; and whoever edited it last may not
approve a call that sends it (four-eyes).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from temporalio.client import WorkflowUpdateFailedError

from countersign.core.approvals import Decision
from countersign.db.engine import session_factory
from countersign.db.schema import ApprovalRequest, DraftEdit, EmailDraft, EmailOutbox
from tests.fixtures.agent import AgentHarness
from tests.fixtures.approvals import pending
from tests.fixtures.inbox import AuthInbox
from tests.fixtures.updates import execute_update
from tests.server.test_agent_tools_api import token
from tests.tools.test_lead_engagement import starter
from tests.tools.test_tools_catalog import context, failure, run
from tools.drafts import DraftEditor, UpdateDraftArgs, draft_of, edit_draft, last_editor
from workflows.agent import AgentWorkflow

PARTNER = "partner@example.org"


def new_draft(created_by: str = "alice") -> EmailDraft:
    return EmailDraft(
        tenant_id="acme",
        idempotency_key=f"test-review-{datetime.now(UTC).timestamp()}-{created_by}",
        created_by=created_by,
        to_address=PARTNER,
        subject="Our offer",
        body="Dear partner, here is our offer.",
    )


def review_request(
    draft_id: int, call_id: str = "c1", tool: str = "send_draft", **row: Any
) -> ApprovalRequest:
    """A call waiting for a decision, as the worker records it (no conversations row: instance "")."""
    now = datetime.now(UTC)
    values: dict[str, Any] = {
        "conversation_id": "",
        "call_id": call_id,
        "workflow_id": f"wf-review-{draft_id}",
        "tenant_id": "acme",
        "agent": "lead-qualifier",
        "tool": tool,
        "risk": "high",
        "args": json.dumps({"draft": draft_id}),
        "args_sha256": "-",
        "nonce": "n",
        "requested_by": "alice",
        "requested_at": now,
        "expires_at": now + timedelta(hours=1),
    }
    return ApprovalRequest(**(values | row))


@pytest_asyncio.fixture
async def draft(db_session: AsyncSession) -> EmailDraft:
    row = new_draft()
    db_session.add(row)
    await db_session.flush()
    return row


async def edits_of(session: AsyncSession, draft_id: int) -> list[tuple[str | None, str, dict[str, Any]]]:
    rows = await session.scalars(
        select(DraftEdit).where(DraftEdit.draft_id == draft_id).order_by(DraftEdit.id)
    )
    return [(r.edited_by, r.via, r.changes) for r in rows]


async def test_update_draft_is_refused_while_a_call_naming_the_draft_waits_for_a_decision(
    db_session: AsyncSession, draft: EmailDraft
) -> None:
    ctx = context(db_session)
    db_session.add(review_request(draft.id))
    db_session.add(review_request(draft.id + 1000, call_id="c2"))  # another draft's: not this one's
    await db_session.flush()
    refused = await failure(ctx, "update_draft", draft=draft.id, to="attacker@evil.example")
    assert refused.code == "CONFLICT" and "send_draft (call c1" in refused.message, refused.message
    assert (await draft_of(db_session, "acme", draft.id)).to_address == PARTNER
    assert await edits_of(db_session, draft.id) == []

    # decided (or expired): the content may change again, and the edit is recorded with its diff
    await db_session.execute(
        update(ApprovalRequest)
        .where(ApprovalRequest.workflow_id == f"wf-review-{draft.id}")
        .values(state="approved")
    )
    db_session.add(
        review_request(draft.id, call_id="c3", expires_at=datetime.now(UTC) - timedelta(seconds=1))
    )
    await db_session.flush()
    edited = await run(ctx, "update_draft", draft=draft.id, subject="Our new offer")
    assert edited["changed"] == {"subject": "Our new offer"}
    assert await edits_of(db_session, draft.id) == [
        ("alice", "tool", {"subject": {"before": "Our offer", "after": "Our new offer"}})
    ]


async def test_a_pending_update_draft_freezes_the_draft_too(
    db_session: AsyncSession, draft: EmailDraft
) -> None:
    """Any call naming the draft is approved on its content, not only a send."""
    db_session.add(
        review_request(draft.id, tool="update_draft", args=json.dumps({"draft": str(draft.id), "body": "x"}))
    )
    await db_session.flush()
    args = UpdateDraftArgs(draft=draft.id, body="changed by hand")
    with pytest.raises(Exception, match="update_draft \\(call c1"):
        await edit_draft(db_session, draft, args, DraftEditor("alice", "inbox"))


async def test_only_the_author_or_an_admin_edits_a_draft(db_session: AsyncSession, draft: EmailDraft) -> None:
    bob = await failure(context(db_session, user="bob"), "update_draft", draft=draft.id, body="bob's words")
    assert bob.code == "FORBIDDEN" and "alice's" in bob.message
    await run(context(db_session, user="carol"), "update_draft", draft=draft.id, body="carol's words")
    await run(context(db_session, user="alice"), "update_draft", draft=draft.id, subject="alice's subject")
    await edit_draft(
        db_session, draft, UpdateDraftArgs(draft=draft.id, body="by the operator"), DraftEditor(None, "cli")
    )
    assert [(who, via) for who, via, _ in await edits_of(db_session, draft.id)] == [
        ("carol", "tool"),
        ("alice", "tool"),
        (None, "cli"),
    ]
    assert await last_editor(db_session, "acme", draft.id) is None


@pytest_asyncio.fixture
async def committed_draft(db_engine: AsyncEngine) -> AsyncIterator[int]:
    async with session_factory(db_engine)() as session, session.begin():
        row = new_draft()
        session.add(row)
        await session.flush()
        draft_id = row.id
    yield draft_id
    async with session_factory(db_engine)() as session, session.begin():
        await session.execute(
            delete(ApprovalRequest).where(ApprovalRequest.workflow_id == f"wf-review-{draft_id}")
        )
        sent = await session.scalar(select(EmailDraft.sent_outbox_id).where(EmailDraft.id == draft_id))
        await session.execute(delete(EmailDraft).where(EmailDraft.id == draft_id))
        if sent is not None:
            await session.execute(delete(EmailOutbox).where(EmailOutbox.id == sent))
        await session.execute(delete(DraftEdit).where(DraftEdit.draft_id == draft_id))


async def test_the_server_and_the_cli_refuse_an_edit_under_review_and_record_who_edited(
    auth_inbox: AuthInbox, db_engine: AsyncEngine, database_url: str, committed_draft: int, tmp_path: Path
) -> None:
    path = f"/api/drafts/{committed_draft}"
    alice, bob, carol = [await token(auth_inbox, u) for u in ("alice", "bob", "carol")]
    status, body, _ = await auth_inbox.call("PATCH", path, bob, {"to": "attacker@evil.example"})
    assert status == 403 and "only they or an admin" in body["error"], body
    status, body, _ = await auth_inbox.call("PATCH", path, carol, {"subject": "Reviewed offer"})
    assert status == 200 and body["subject"] == "Reviewed offer", body

    async with session_factory(db_engine)() as session, session.begin():
        session.add(review_request(committed_draft))
    status, body, _ = await auth_inbox.call("PATCH", path, alice, {"to": "attacker@evil.example"})
    assert status == 409 and "waiting for a reviewer's decision on send_draft" in body["error"], body
    cli = await starter(
        database_url, tmp_path, "drafts", "edit", str(committed_draft), "--tenant", "acme", "--body", "x"
    )
    assert cli.returncode == 1 and "CONFLICT" in cli.stderr, cli.stderr
    async with session_factory(db_engine)() as session:
        assert (await session.get(EmailDraft, committed_draft)).to_address == PARTNER  # type: ignore[union-attr]
        assert await edits_of(session, committed_draft) == [
            ("carol", "inbox", {"subject": {"before": "Our offer", "after": "Reviewed offer"}})
        ]


async def test_whoever_edited_the_draft_last_may_not_approve_its_send(
    agent: AgentHarness, db_engine: AsyncEngine, committed_draft: int
) -> None:
    """carol (an admin, who may approve high-risk calls) changed alice's draft: her approval of its
    send is refused as a requester's would be; bob's counts."""
    async with session_factory(db_engine)() as session, session.begin():
        row = await draft_of(session, "acme", committed_draft, lock=True)
        await edit_draft(
            session,
            row,
            UpdateDraftArgs(draft=committed_draft, body="carol's"),
            DraftEditor("carol", "inbox"),
        )
    send = {"name": "send_draft", "arguments": {"draft": committed_draft}}
    agent.script(
        {"when": {"user_contains": "send"}, "reply": {"tool_calls": [send]}},
        {"when": {"after_tool": "send_draft"}, "reply": {"content": "done"}},
    )
    handle = await agent.start("send the draft", single_turn=True)
    (waiting,) = (await pending(handle)).pending_approvals
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await execute_update(
            handle,
            AgentWorkflow.decide,
            Decision(call_id=waiting.call_id, decision="approve", approver="carol"),
        )
    assert "carol last edited draft" in str(refused.value.cause) and "four-eyes" in str(refused.value.cause)
    await execute_update(
        handle, AgentWorkflow.decide, Decision(call_id=waiting.call_id, decision="approve", approver="bob")
    )
    await handle.result()
    async with session_factory(db_engine)() as session:
        sent = await session.get(EmailDraft, committed_draft)
        assert sent is not None and sent.sent_outbox_id is not None and sent.body == "carol's"
