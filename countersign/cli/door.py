"""The CLI through the front door: in signed mode every command that acts on a conversation (and
`status`, `transcript`, `audit --workflow`) calls the server with the session `login` keeps, and
never Temporal: the server knows who the person is and mints the proof the worker asks for."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import click
from pydantic import ValidationError

from countersign.cli.session import InboxSession, inbox_request, load_session, session_file, signed_mode
from countersign.core.contract import Limits, Reply, StatusView, TurnResult
from countersign.core.messages import ChatMessage
from countersign.core.saga import SagaEntry

REPLY_WAIT_S = 30  # each `GET …/reply` holds this long; the CLI asks again while the turn runs


class Door:
    """The conversation API of the server `session` was opened on, as `session`'s person."""

    def __init__(self, session: InboxSession) -> None:
        self.session = session

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
        return await inbox_request(self.session, method, path, body)

    @staticmethod
    def _at(workflow_id: str, rest: str = "") -> str:
        return f"/api/conversations/{quote(workflow_id, safe='')}{rest}"

    async def start(
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

    async def send(self, workflow_id: str, text: str, message_id: str | None = None) -> str:
        sent = await self._call(
            "POST", self._at(workflow_id, "/messages"), {"text": text, "message_id": message_id}
        )
        return str(sent["message_id"])

    async def status(self, workflow_id: str) -> StatusView:
        return StatusView.model_validate(await self._call("GET", self._at(workflow_id)))

    async def transcript(self, workflow_id: str) -> list[ChatMessage]:
        return [
            ChatMessage.model_validate(m)
            for m in await self._call("GET", self._at(workflow_id, "/transcript"))
        ]

    async def reply(
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

    async def answer(self, workflow_id: str, call_id: str, text: str) -> None:
        await self._call("POST", self._at(workflow_id, f"/answers/{quote(call_id, safe='')}"), {"text": text})

    async def rollback(
        self, workflow_id: str, scope: str, call_id: str | None, reason: str | None
    ) -> list[SagaEntry] | None:
        """The entries undone when the conversation had ended (the server runs it); None when a
        running conversation was sent the rollback (it runs between turns)."""
        body = {"scope": scope, "call_id": call_id, "reason": reason}
        sent = await self._call("POST", self._at(workflow_id, "/rollback"), body)
        entries = sent.get("entries")
        return None if entries is None else [SagaEntry.model_validate(e) for e in entries]

    async def end(self, workflow_id: str) -> None:
        await self._call("POST", self._at(workflow_id, "/end"), {})

    async def audit(self, workflow_id: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = await self._call("GET", self._at(workflow_id, "/audit"))
        return rows


def door_as(user: str, tenant: str | None = None) -> Door:
    """The door for `user`'s session (`login` first); a session of another tenant is refused."""
    session = load_session(user)
    if tenant is not None and session.tenant_id != tenant:
        raise click.ClickException(
            f"logged in to {session.tenant_id}, not {tenant}: "
            f"python starter.py login --tenant {tenant} --as {user}"
        )
    return Door(session)


def reading_door() -> Door | None:
    """In signed mode, the door of whoever is logged in (reads need no particular person); else None."""
    if not signed_mode():
        return None
    try:
        return Door(InboxSession.model_validate_json(session_file().read_text()))
    except (FileNotFoundError, ValidationError):
        raise click.ClickException(
            "signed mode: reading a conversation goes through the server: "
            "python starter.py login --tenant T --as U"
        ) from None
