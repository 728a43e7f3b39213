"""Names mode: the CLI is a client of the stack itself, as the embedded demo runs: Temporal for the
conversation (signals, updates, queries; any client that can send a signal decides, so names count
as given), PostgreSQL for what the conversation's store and the audit keep. `StackClient` is the
names-mode `ConversationClient` (countersign.cli.conversation_client)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import click
from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError

from countersign.cli.session import signed_hint
from countersign.cli.ux import reason, temporal_settings, with_session
from countersign.cli.waiting import Sent, Started, follow
from countersign.client.ended import (
    conversation_status,
    full_transcript,
    has_ended,
    roll_back_ended,
    tokens_today,
    with_stored_results,
)
from countersign.client.handles import roll_back, send_keyed, start_conversation, wait_reply
from countersign.client.temporal_client import connect
from countersign.core.approvals import APPROVER_ROLES, FOUR_EYES, Approval, Decision
from countersign.core.contract import (
    AnswerSignal,
    EndConversation,
    StartConversation,
    StatusView,
    SubmitMessage,
    TurnResult,
)
from countersign.core.messages import ChatMessage
from countersign.core.saga import RollbackRequest, SagaEntry
from countersign.db import events
from countersign.db.audit import audit_rows
from countersign.db.engine import create_engine
from countersign.db.grants import GrantRefused, grant_view, revoke_grant
from countersign.db.schema import UserRole
from countersign.runtime.config import Settings


async def wait_turn(handle: WorkflowHandle[Any, Any], turn: int) -> TurnResult | None:
    """Block until `turn` finishes, through the `wait_turn` update (no polling)."""
    result: TurnResult | None = await handle.execute_update("wait_turn", turn, result_type=TurnResult | None)  # type: ignore[arg-type]
    return result


async def query_status(handle: WorkflowHandle[Any, Any]) -> StatusView:
    status: StatusView = await handle.query("status", result_type=StatusView)
    return status


async def query_transcript(handle: WorkflowHandle[Any, Any]) -> list[ChatMessage]:
    messages: list[ChatMessage] = await handle.query("transcript", result_type=list[ChatMessage])
    return messages


class StackClient:
    """Straight to Temporal (connected at first use: an audit needs only PostgreSQL)."""

    proven = False  # a bare name: the decision is recorded as claimed
    person: str | None = None  # whoever the command names

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.scripted = settings.scripted_model
        self._client: asyncio.Future[Client] | None = None

    async def client(self) -> Client:
        """One connection, however many reads ask for it at once (the chat's attach asks two)."""
        if self._client is None:
            self._client = asyncio.ensure_future(connect(temporal_settings()))
        return await self._client

    async def handle(self, workflow_id: str) -> WorkflowHandle[Any, Any]:
        return (await self.client()).get_workflow_handle(workflow_id)

    async def _events_seen(self, workflow_id: str) -> int:
        """The conversation's latest event id (0 without a database): a reply is followed after it."""
        database_url = self.settings.database_url
        return await events.last_id(database_url, workflow_id) if database_url else 0

    async def start(self, start: StartConversation) -> Started:
        handle = await start_conversation(await self.client(), self.settings, start)
        shown = {"workflow_id": handle.id, "run_id": handle.result_run_id, "ui_url": self.ui_url(handle.id)}
        return Started(handle.id, shown)

    async def send(self, workflow_id: str, message: SubmitMessage) -> Sent:
        """Refused here when the conversation has ended or is another user's (the worker refuses
        it too, but a signal answers nothing)."""
        handle = await self.handle(workflow_id)
        current = await query_status(handle)
        if current.state == "ended":
            raise click.ClickException(f"conversation {workflow_id} has ended")
        if current.user_id and current.user_id != message.user_id:
            raise click.ClickException(
                f"conversation {workflow_id} is {current.user_id}'s: {message.user_id} may not write to it"
            )
        seen = await self._events_seen(workflow_id)
        await handle.signal("submit_message", message)
        return Sent(workflow_id, message.message_id, seen)

    async def send_keyed(self, start: StartConversation, key: str, message: SubmitMessage) -> Sent:
        handle = await send_keyed(await self.client(), self.settings, start, key, message)
        seen = await self._events_seen(handle.id)  # this turn's first text may precede it
        return Sent(handle.id, message.message_id, seen)

    async def follow(
        self, turn: Started | Sent, interrupted: asyncio.Event
    ) -> TurnResult | StatusView | None:
        """The turn's result, or its status once it waits for a person; the model's text is shown
        as it streams (countersign.cli.waiting.follow)."""
        handle = await self.handle(turn.workflow_id)
        database_url = self.settings.database_url
        if isinstance(turn, Started):
            try:
                return await follow(handle, wait_turn(handle, 1), interrupted, database_url)
            except Exception:
                await handle.result()  # a conversation that failed to start says why (unknown user, ...)
                raise
        reply = wait_reply(await self.client(), turn.workflow_id, turn.message_id or "")
        try:
            return await follow(handle, reply, interrupted, database_url, turn.after)
        except WorkflowUpdateFailedError as err:  # refused (another user's conversation, a full inbox)
            raise click.ClickException(reason(err)) from err

    async def reply(self, workflow_id: str, message_id: str | None, turn: int | None) -> TurnResult | None:
        if message_id is not None:
            return await wait_reply(await self.client(), workflow_id, message_id)
        return await wait_turn(await self.handle(workflow_id), turn or 1)

    async def status(self, workflow_id: str) -> StatusView:
        return await conversation_status(await self.client(), self.settings, workflow_id)

    async def tokens_today(self, tenant_id: str) -> tuple[int, int | None]:
        return await tokens_today(self.settings, tenant_id) if self.settings.database_url else (0, None)

    async def transcript(self, workflow_id: str) -> list[ChatMessage]:
        return await full_transcript(await self.client(), self.settings, workflow_id)

    async def live_transcript(self, workflow_id: str) -> list[ChatMessage]:
        messages = await query_transcript(await self.handle(workflow_id))
        return await with_stored_results(self.settings, workflow_id, messages)

    async def audit(self, workflow_id: str, tenant_id: str | None, limit: int) -> list[dict[str, Any]]:
        return await with_session(lambda session: audit_rows(session, workflow_id, tenant_id, limit))

    async def deciders(self, status: StatusView) -> dict[str, list[str]]:
        """Per pending call, the users of the tenant whose decision the workflow would accept (by
        role and the four-eyes rule); empty when the database is not reachable (the roles still say who)."""
        if not self.settings.database_url or not status.pending_approvals:
            return {}
        engine = create_engine(self.settings.database_url)
        try:
            async with engine.connect() as conn:
                rows = (
                    await conn.execute(
                        select(UserRole.user_id, UserRole.role)
                        .where(UserRole.tenant_id == status.tenant_id)
                        .order_by(UserRole.user_id)
                    )
                ).all()
        except (OSError, SQLAlchemyError):
            return {}
        finally:
            await engine.dispose()
        return {
            a.call_id: list(
                dict.fromkeys(
                    user
                    for user, role in rows
                    if role in APPROVER_ROLES[a.risk] and not (a.risk in FOUR_EYES and user == a.requested_by)
                )
            )
            for a in status.pending_approvals
        }

    async def approvable(self, workflow_id: str, approver: str) -> list[str]:
        ids = [p.call_id for p in (await query_status(await self.handle(workflow_id))).pending_approvals]
        if not ids:
            raise click.ClickException(f"{workflow_id} has no pending approvals")
        return ids

    async def decide(self, workflow_id: str, decision: Decision) -> Approval:
        """Through the `decide` update: a refused decision answers with the workflow's reason."""
        try:
            approval: Approval = await (await self.handle(workflow_id)).execute_update(
                "decide", decision, result_type=Approval
            )
        except WorkflowUpdateFailedError as err:
            raise click.ClickException(signed_hint(reason(err), decision.approver, workflow_id)) from err
        return approval

    async def revoke_grant(self, grant_id: int, revoker: str) -> dict[str, Any]:
        """Revoked by `revoker`, checked against the grant's tenant in the database."""

        async def revoke(session: AsyncSession) -> dict[str, Any]:
            try:
                grant = await revoke_grant(session, grant_id, revoker)
            except GrantRefused as refused:
                raise click.ClickException(str(refused)) from None
            return grant_view(grant, datetime.now(UTC))

        return await with_session(revoke)

    async def answer(self, workflow_id: str, user: str, call_id: str, text: str) -> None:
        signal = AnswerSignal(call_id=call_id, user_id=user, text=text)
        await (await self.handle(workflow_id)).signal("answer", signal)

    async def rollback(self, workflow_id: str, request: RollbackRequest) -> list[SagaEntry] | None:
        """The entries undone, once the rollback has run (TimeoutError: it was not, in time)."""
        client = await self.client()
        if await has_ended(client, workflow_id):  # takes no signal: a short workflow undoes it
            outcome = await roll_back_ended(client, self.settings, workflow_id, request)
            if outcome.refused:
                raise click.ClickException(f"rollback refused: {outcome.refused}")
            return outcome.entries
        return await roll_back(client.get_workflow_handle(workflow_id), request)

    async def end(self, workflow_id: str, user: str) -> None:
        handle = await self.handle(workflow_id)
        if (await query_status(handle)).state == "ended":
            raise click.ClickException(f"conversation {workflow_id} has already ended")
        await handle.signal("end", EndConversation(requested_by=user))

    async def ended(self, workflow_id: str, within_s: float) -> bool:
        try:
            await asyncio.wait_for((await self.handle(workflow_id)).result(), within_s)
        except TimeoutError:
            return False
        return True

    def ui_url(self, workflow_id: str) -> str | None:
        return self.settings.workflow_url(workflow_id)
