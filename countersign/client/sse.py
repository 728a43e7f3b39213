"""Reading server-sent events (the conversation events stream) with aiohttp: the CLI and the tests."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp


@dataclass(frozen=True)
class ServerEvent:
    id: int | None
    kind: str
    data: dict[str, Any]


async def server_events(response: aiohttp.ClientResponse) -> AsyncIterator[ServerEvent]:
    """The events of a `text/event-stream` response, until it closes (comments are skipped)."""
    fields: dict[str, str] = {}
    async for raw in response.content:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if line:
            name, _, value = line.partition(":")
            if name:  # a line starting with ":" is a comment (keep-alive)
                fields[name] = (
                    fields.get(name, "") + value.removeprefix(" ") if name == "data" else value.strip()
                )
            continue
        if "data" in fields or "event" in fields:
            try:
                data = json.loads(fields.get("data") or "{}")
            except ValueError:
                data = {"text": fields.get("data", "")}
            event_id = fields.get("id")
            yield ServerEvent(
                id=int(event_id) if event_id and event_id.isdigit() else None,
                kind=fields.get("event", "message"),
                data=data if isinstance(data, dict) else {"value": data},
            )
        fields = {}
