"""How the CLI reaches a conversation, said once. A command (and the chat) says what it does
through a `ConversationClient`; where the deployment's two modes differ, the difference is in the
client, chosen here, once:
- signed (countersign.cli.door.Door): through the server, with the session `login` keeps; the
  server authenticates the person and mints the proof the worker asks for;
- names (countersign.cli.stack_client.StackClient): straight to Temporal and PostgreSQL, as the
  embedded demo runs; a decision is a signal or an update with a bare name.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from countersign.cli.door import door_as, logged_in_door
from countersign.cli.session import signed_mode
from countersign.cli.stack_client import StackClient
from countersign.cli.waiting import Sent, Started
from countersign.core.approvals import Approval, Decision
from countersign.core.contract import StartConversation, StatusView, SubmitMessage, TurnResult
from countersign.core.messages import ChatMessage
from countersign.core.saga import RollbackRequest, SagaEntry
from countersign.runtime.config import load_settings


class ConversationClient(Protocol):
    scripted: bool  # replies come from a scenario file (the transcript says so)
    proven: bool  # a decision carries a proof the server minted for the person
    person: str | None  # who the client acts as, when that is fixed (signed: the person logged in)

    async def start(self, start: StartConversation) -> Started: ...
    async def send(self, workflow_id: str, message: SubmitMessage) -> Sent: ...
    async def send_keyed(self, start: StartConversation, key: str, message: SubmitMessage) -> Sent: ...
    async def follow(
        self, turn: Started | Sent, interrupted: asyncio.Event
    ) -> TurnResult | StatusView | None: ...
    async def reply(
        self, workflow_id: str, message_id: str | None, turn: int | None
    ) -> TurnResult | None: ...
    async def status(self, workflow_id: str) -> StatusView: ...
    async def tokens_today(self, tenant_id: str) -> tuple[int, int | None]: ...
    async def transcript(self, workflow_id: str) -> list[ChatMessage]: ...
    async def live_transcript(self, workflow_id: str) -> list[ChatMessage]: ...
    async def audit(self, workflow_id: str, tenant_id: str | None, limit: int) -> list[dict[str, Any]]: ...
    async def deciders(self, status: StatusView) -> dict[str, list[str]]: ...
    async def approvable(self, workflow_id: str, approver: str) -> list[str]: ...
    async def decide(self, workflow_id: str, decision: Decision) -> Approval: ...
    async def revoke_grant(self, grant_id: int, revoker: str) -> dict[str, Any]: ...
    async def answer(self, workflow_id: str, user: str, call_id: str, text: str) -> None: ...
    async def rollback(self, workflow_id: str, request: RollbackRequest) -> list[SagaEntry] | None: ...
    async def end(self, workflow_id: str, user: str) -> None: ...
    async def ended(self, workflow_id: str, within_s: float) -> bool: ...
    def ui_url(self, workflow_id: str) -> str | None: ...


def conversation_client(
    acting_as: str | None = None, tenant: str | None = None, workflow_id: str | None = None
) -> ConversationClient:
    """The client for this deployment's mode, acting as `acting_as` (None: to read, as whoever is
    logged in). Signed: `acting_as` must be the person logged in (to `tenant`, when given; a hint to
    log in names the tenant `workflow_id` does)."""
    if signed_mode():
        return door_as(acting_as, tenant, workflow_id) if acting_as else logged_in_door()
    return StackClient(load_settings())
