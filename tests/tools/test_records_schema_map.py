"""The admin assistant reads and filters every column of the business records it may see, and its
schema map names each one: what a person asks of a lead (its score, its last engagement) or of the
calendar (a meeting or a deadline) is a question the model can put to `query_records`."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncSession

from countersign.core.calls import CallerContext
from tools import REGISTRY
from tools.arguments import validate
from tools.records import COLLECTIONS, WRITABLE_COLLECTIONS, CollectionName, schema_map
from tools.registry import ToolContext

# Columns of read-only collections that stay internal: links into the conversation machinery,
# idempotency keys, delivery bookkeeping, the HTML twin of a text body, scheduling internals.
INTERNAL = {
    "notifications": {"call_id", "conversation_id", "workflow_id"},
    "email_drafts": {"html_body", "idempotency_key", "sent_outbox_id", "updated_at"},
    "email_outbox": {"attempts", "error", "html_body", "idempotency_key"},
    "meeting_sessions": {"counterpart_tz", "counterpart_user_id", "idempotency_key", "notification_id",
                         "proposals", "window_end", "window_start"},
}  # fmt: skip


def map_line(collection: str) -> str:
    (line,) = [line for line in schema_map().splitlines() if line.startswith(f"- {collection} (")]
    return line


@pytest.mark.parametrize("collection", sorted(COLLECTIONS))
def test_the_map_names_every_column_the_tools_filter_on(collection: CollectionName) -> None:
    c = COLLECTIONS[collection]
    hidden = set(c.table.c.keys()) - set(c.fields) - {"tenant_id"}
    assert hidden == INTERNAL.get(collection, set())  # a writable collection hides nothing
    assert not (collection in WRITABLE_COLLECTIONS and hidden)
    line = map_line(collection)
    for field in c.fields:  # every field the map names, the tools accept in a filter
        assert f" {field}:" in line
        listed = c.kind(field) == "string_list"
        where = {"field": field, "op": "contains" if listed else "ne", "value": "x" if listed else None}
        validate(REGISTRY["count_records"], json.dumps({"collection": collection, "filters": [where]}))


def test_lead_score_engagement_and_event_type_are_in_the_map() -> None:
    assert " score:int^ " in map_line("leads") and " last_engaged_at:time^ " in map_line("leads")
    assert " type:text=meeting|call|demo|deadline|reminder|other " in map_line("calendar_events")


async def query(session: AsyncSession, **raw: Any) -> list[dict[str, Any]]:
    caller = CallerContext(tenant_id="acme", user_id="carol", roles=["admin"], agent="admin-assistant")
    ctx = ToolContext(
        caller=caller, session=session, workflow_id=f"wf-{uuid.uuid4()}", call_id="c", now=datetime.now(UTC)
    )
    result = await REGISTRY["query_records"].run(ctx, validate(REGISTRY["query_records"], json.dumps(raw)))
    return list(result.model_dump(mode="json")["records"])


async def test_the_assistant_filters_and_orders_by_score_engagement_and_type(
    db_session: AsyncSession,
) -> None:
    ranked = await query(
        db_session,
        collection="leads",
        filters=[{"field": "score", "op": "gte", "value": 1}],
        order_by=[{"field": "score", "direction": "desc"}],
    )
    scores = [lead["score"] for lead in ranked]
    assert scores and scores == sorted(scores, reverse=True) and min(scores) >= 1
    assert "li.wei@hooli.example" not in {lead["email"] for lead in ranked}  # disqualified: 0
    engaged = await query(
        db_session, collection="leads", filters=[{"field": "last_engaged_at", "op": "ne", "value": None}]
    )
    assert engaged and all(lead["last_engaged_at"] for lead in engaged)
    meetings = await query(
        db_session, collection="calendar_events", filters=[{"field": "type", "op": "eq", "value": "meeting"}]
    )
    assert meetings and {event["type"] for event in meetings} == {"meeting"}
