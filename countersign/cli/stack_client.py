"""How `chat` reaches a conversation: Temporal directly (names mode: the demo), or the server with
the `login` session (signed mode: the server authenticates the person and mints the proofs).
The chat itself (countersign.cli.chat) is the same either way."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable
from typing import Protocol

from temporalio.client import Client

from countersign.cli.approvals import decide
from countersign.cli.conversations import query_status, query_transcript, wait_turn
from countersign.cli.door import Door
from countersign.cli.session import inbox_request
from countersign.client.ended import full_transcript, with_stored_results
from countersign.client.handles import roll_back, start_conversation, wait_reply
from countersign.core.approvals import Approval, Decision
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
from countersign.runtime.config import Settings

WAITING_POLL_S = 1.0  # through the server: how often a turn that waits for a person is asked again


class ConversationPort(Protocol):
    scripted: bool

    async def start(self, start: StartConversation, text: str) -> str: ...
    async def send(self, workflow_id: str, user: str, text: str) -> str: ...
    def reply(
        self, workflow_id: str, message_id: str | None, turn: int | None
    ) -> Awaitable[TurnResult | None]: ...
    async def status(self, workflow_id: str) -> StatusView: ...
    async def live_transcript(self, workflow_id: str) -> list[ChatMessage]: ...
    async def full_transcript(self, workflow_id: str) -> list[ChatMessage]: ...
    async def answer(self, workflow_id: str, user: str, call_id: str, text: str) -> None: ...
    async def decide(self, workflow_id: str, decision: Decision) -> Approval: ...
    async def rollback(self, workflow_id: str, request: RollbackRequest) -> list[SagaEntry] | None: ...
    async def end(self, workflow_id: str, user: str) -> None: ...
    def ui_url(self, workflow_id: str) -> str | None: ...


class TemporalPort:
    """Names mode: the CLI is a Temporal client, as the embedded demo runs."""

    def __init__(self, client: Client, settings: Settings) -> None:
        self.client, self.settings = client, settings
        self.scripted = settings.scripted_model

    async def start(self, start: StartConversation, text: str) -> str:
        handle = await start_conversation(
            self.client, self.settings, start.model_copy(update={"message": text})
        )
        return handle.id

    async def send(self, workflow_id: str, user: str, text: str) -> str:
        message = SubmitMessage(user_id=user, text=text, message_id=uuid.uuid4().hex)
        await self.client.get_workflow_handle(workflow_id).signal("submit_message", message)
        return message.message_id or ""

    def reply(
        self, workflow_id: str, message_id: str | None, turn: int | None
    ) -> Awaitable[TurnResult | None]:
        if message_id is not None:
            return wait_reply(self.client, workflow_id, message_id)
        return wait_turn(self.client.get_workflow_handle(workflow_id), turn or 1)

    async def status(self, workflow_id: str) -> StatusView:
        return await query_status(self.client.get_workflow_handle(workflow_id))

    async def live_transcript(self, workflow_id: str) -> list[ChatMessage]:
        messages = await query_transcript(self.client.get_workflow_handle(workflow_id))
        return await with_stored_results(self.settings, workflow_id, messages)

    async def full_transcript(self, workflow_id: str) -> list[ChatMessage]:
        return await full_transcript(self.client, self.settings, workflow_id)

    async def answer(self, workflow_id: str, user: str, call_id: str, text: str) -> None:
        signal = AnswerSignal(call_id=call_id, user_id=user, text=text)
        await self.client.get_workflow_handle(workflow_id).signal("answer", signal)

    async def decide(self, workflow_id: str, decision: Decision) -> Approval:
        return await decide(self.client, workflow_id, decision)

    async def rollback(self, workflow_id: str, request: RollbackRequest) -> list[SagaEntry] | None:
        return await roll_back(self.client.get_workflow_handle(workflow_id), request)

    async def end(self, workflow_id: str, user: str) -> None:
        await self.client.get_workflow_handle(workflow_id).signal("end", EndConversation(requested_by=user))

    def ui_url(self, workflow_id: str) -> str | None:
        return self.settings.workflow_url(workflow_id)


class DoorPort:
    """Signed mode: every action through the server, as the person logged in."""

    def __init__(self, door: Door) -> None:
        self.door = door
        self.scripted = False

    async def start(self, start: StartConversation, text: str) -> str:
        workflow_id, _ = await self.door.start(start.agent, text, start.limits, start.single_turn)
        return workflow_id

    async def send(self, workflow_id: str, user: str, text: str) -> str:
        return await self.door.send(workflow_id, text)

    async def reply(self, workflow_id: str, message_id: str | None, turn: int | None) -> TurnResult | None:
        """The turn's result: through approvals and questions (the chat shows them meanwhile)."""
        while True:
            answer = await self.door.reply(workflow_id, message_id, turn)
            if not isinstance(answer, StatusView):
                return answer
            await asyncio.sleep(WAITING_POLL_S)

    async def status(self, workflow_id: str) -> StatusView:
        return await self.door.status(workflow_id)

    async def live_transcript(self, workflow_id: str) -> list[ChatMessage]:
        return await self.door.transcript(workflow_id)

    async def full_transcript(self, workflow_id: str) -> list[ChatMessage]:
        return await self.door.transcript(workflow_id)

    async def answer(self, workflow_id: str, user: str, call_id: str, text: str) -> None:
        await self.door.answer(workflow_id, call_id, text)

    async def decide(self, workflow_id: str, decision: Decision) -> Approval:
        body = {"decision": decision.decision, "reason": decision.reason}
        path = f"/api/approvals/{workflow_id}/{decision.call_id}"
        return Approval.model_validate(await inbox_request(self.door.session, "POST", path, body))

    async def rollback(self, workflow_id: str, request: RollbackRequest) -> list[SagaEntry] | None:
        return await self.door.rollback(workflow_id, request.scope, request.call_id, request.reason)

    async def end(self, workflow_id: str, user: str) -> None:
        await self.door.end(workflow_id)

    def ui_url(self, workflow_id: str) -> str | None:
        return None
