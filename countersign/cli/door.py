"""Signed mode: the CLI through the front door. Every command that acts on a conversation (and
`status`, `transcript`, `audit --workflow`) calls the server with the session `login` keeps, and
never Temporal: the server knows who the person is and mints the proof the worker asks for.
`Door` is the signed-mode `ConversationClient` (countersign.cli.conversation_client)."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import click
from pydantic import ValidationError

from countersign.cli.session import InboxSession, inbox_request, load_session, session_file
from countersign.cli.waiting import Sent, Started, unless_interrupted
from countersign.core.approvals import Approval, Decision
from countersign.core.contract import Limits, Reply, StartConversation, StatusView, SubmitMessage, TurnResult
from countersign.core.messages import ChatMessage
from countersign.core.saga import RollbackRequest, SagaEntry

REPLY_WAIT_S = 30  # each `GET …/reply` holds this long; the CLI asks again while the turn runs
WAITING_POLL_S = 1.0  # the chat's wait for a turn through approvals: how often it asks again
END_POLL_S = 0.2  # how often an ended conversation is looked for


class Door:
    """The conversation API of the server `session` was opened on, as `session`'s person."""

    scripted = False  # the server does not say where replies come from
    proven = True  # the server mints each decision's proof for the person it authenticated

    def __init__(self, session: InboxSession) -> None:
        self.session = session
        self.person: str | None = session.user_id

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
        return await inbox_request(self.session, method, path, body)

    @staticmethod
    def _at(workflow_id: str, rest: str = "") -> str:
        return f"/api/conversations/{quote(workflow_id, safe='')}{rest}"

    async def _start(
        self,
        agent: str,
        message: str | None,
        limits: Limits | None = None,
        single_turn: bool = False,
        key: str | None = None,
    ) -> tuple[str, str | None]:
        """The new (or keyed) conversation's workflow id, and the keyed message's id."""
        body: dict[str, Any] = {"agent": agent, "message": message, "single_turn": single_turn}
        if limits is not None:
            body["limits"] = limits.model_dump(mode="json")
        if key is not None:
            body["key"] = key
        started = await self._call("POST", "/api/conversations", body)
        return str(started["workflow_id"]), started.get("message_id")

    async def start(self, start: StartConversation) -> Started:
        """The person is the session's; the server checks the tenant and the agent."""
        workflow_id, _ = await self._start(start.agent, start.message, start.limits, start.single_turn)
        return Started(workflow_id, {"workflow_id": workflow_id})

    async def send(self, workflow_id: str, message: SubmitMessage) -> Sent:
        sent = await self._call(
            "POST",
            self._at(workflow_id, "/messages"),
            {"text": message.text, "message_id": message.message_id},
        )
        return Sent(workflow_id, str(sent["message_id"]))

    async def send_keyed(self, start: StartConversation, key: str, message: SubmitMessage) -> Sent:
        workflow_id, message_id = await self._start(start.agent, message.text, key=key)
        return Sent(workflow_id, message_id)

    async def _reply(
        self, workflow_id: str, message_id: str | None = None, turn: int | None = None
    ) -> TurnResult | StatusView | None:
        """The turn's result (None: the conversation ended first), or its status once it waits
        for a person: asked again and again while the turn runs."""
        what = f"message_id={quote(message_id)}" if message_id else f"turn={turn or 1}"
        while True:
            answer = Reply.model_validate(
                await self._call("GET", self._at(workflow_id, f"/reply?{what}&wait={REPLY_WAIT_S}"))
            )
            if answer.state == "replied":
                return answer.turn
            if answer.state == "waiting" and answer.status is not None:
                return answer.status
            if answer.state == "ended":
                return None
            await asyncio.sleep(0)

    async def follow(
        self, turn: Started | Sent, interrupted: asyncio.Event
    ) -> TurnResult | StatusView | None:
        """The server streams nothing here: the turn's result, or its status once it waits for a person."""
        message_id = turn.message_id if isinstance(turn, Sent) else None
        return await unless_interrupted(
            turn.workflow_id, self._reply(turn.workflow_id, message_id), interrupted
        )

    async def reply(self, workflow_id: str, message_id: str | None, turn: int | None) -> TurnResult | None:
        """The turn's result: through approvals and questions (the chat shows them meanwhile)."""
        while True:
            answer = await self._reply(workflow_id, message_id, turn)
            if not isinstance(answer, StatusView):
                return answer
            await asyncio.sleep(WAITING_POLL_S)

    async def status(self, workflow_id: str) -> StatusView:
        return StatusView.model_validate(await self._call("GET", self._at(workflow_id)))

    async def tokens_today(self, tenant_id: str) -> tuple[int, int | None]:
        return 0, None  # the server does not say

    async def transcript(self, workflow_id: str) -> list[ChatMessage]:
        return [
            ChatMessage.model_validate(m)
            for m in await self._call("GET", self._at(workflow_id, "/transcript"))
        ]

    async def live_transcript(self, workflow_id: str) -> list[ChatMessage]:
        return await self.transcript(workflow_id)

    async def audit(self, workflow_id: str, tenant_id: str | None, limit: int) -> list[dict[str, Any]]:
        """All of the conversation's calls, as the server answers them (for the session's tenant)."""
        rows: list[dict[str, Any]] = await self._call("GET", self._at(workflow_id, "/audit"))
        return rows

    async def deciders(self, status: StatusView) -> dict[str, list[str]]:
        return {}  # who holds a role is the server's to know: the roles say who may decide

    async def approvable(self, workflow_id: str, approver: str) -> list[str]:
        pending = await self._call("GET", "/api/approvals")
        ids = [p["call_id"] for p in pending if p["workflow_id"] == workflow_id]
        if not ids:
            raise click.ClickException(f"{workflow_id} has nothing {self.session.user_id} may approve")
        return ids

    async def decide(self, workflow_id: str, decision: Decision) -> Approval:
        """Decided by the session's person, whatever `decision.approver` says: the server proves it."""
        body = {
            "decision": decision.decision,
            "reason": decision.reason,
            "args": decision.args,
            "grant": decision.grant.model_dump() if decision.grant else None,
        }
        return Approval.model_validate(
            await self._call("POST", f"/api/approvals/{workflow_id}/{decision.call_id}", body)
        )

    async def revoke_grant(self, grant_id: int, revoker: str) -> dict[str, Any]:
        """Revoked by the session's person: the server checks who may."""
        revoked: dict[str, Any] = await self._call("POST", f"/api/grants/{grant_id}/revoke", {})
        return revoked

    async def answer(self, workflow_id: str, user: str, call_id: str, text: str) -> None:
        await self._call("POST", self._at(workflow_id, f"/answers/{quote(call_id, safe='')}"), {"text": text})

    async def rollback(self, workflow_id: str, request: RollbackRequest) -> list[SagaEntry] | None:
        """The entries undone when the conversation had ended (the server runs it); None when a
        running conversation was sent the rollback (it runs between turns)."""
        body = {"scope": request.scope, "call_id": request.call_id, "reason": request.reason}
        sent = await self._call("POST", self._at(workflow_id, "/rollback"), body)
        entries = sent.get("entries")
        return None if entries is None else [SagaEntry.model_validate(e) for e in entries]

    async def end(self, workflow_id: str, user: str) -> None:
        await self._call("POST", self._at(workflow_id, "/end"), {})

    async def ended(self, workflow_id: str, within_s: float) -> bool:
        for _ in range(int(within_s / END_POLL_S)):
            if (await self.status(workflow_id)).state == "ended":
                return True
            await asyncio.sleep(END_POLL_S)
        return False

    def ui_url(self, workflow_id: str) -> str | None:
        return None


def door_as(user: str, tenant: str | None = None, workflow_id: str | None = None) -> Door:
    """The door for `user`'s session (`login` first; the hint names the tenant `workflow_id` does);
    a session of another tenant is refused."""
    session = load_session(user, workflow_id)
    if tenant is not None and session.tenant_id != tenant:
        raise click.ClickException(
            f"logged in to {session.tenant_id}, not {tenant}: "
            f"python starter.py login --tenant {tenant} --as {user}"
        )
    return Door(session)


def logged_in_door() -> Door:
    """The door of whoever is logged in: reading a conversation needs no particular person."""
    try:
        return Door(InboxSession.model_validate_json(session_file().read_text()))
    except (FileNotFoundError, ValidationError):
        raise click.ClickException(
            "signed mode: reading a conversation goes through the server: "
            "python starter.py login --tenant T --as U"
        ) from None
