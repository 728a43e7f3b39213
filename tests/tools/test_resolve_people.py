"""`match_people` (one round trip for all of a call's people) finds exactly what `match_users`
and `match_contacts` find.

`resolve_person` reads people through it, in the tools' previews and runs alike, so the people, the
`Needs` candidates and their order (and therefore every effect's digest) must not depend on which
of the two is used: exact matches before loose ones, key order, at most one more than shown, the
tenant's rows only, active users only, LIKE wildcards taken literally.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.core.calls import CallerContext
from countersign.db.engine import session_factory
from countersign.db.schema import Contact
from tools.registry import ToolContext
from tools.resolve import MAX_CANDIDATES, match_contacts, match_people, match_users

REFS = [
    "bob",
    "BOB",
    "Bob Brennan",
    "b",
    "a",
    "e",
    "Sam Lee",
    "sam",
    "samuel.lee@umbrella.example",
    "jane.doe@example.com",
    "Priya Nair",
    "Tom Becker",  # globex's contact: nobody in acme
    "nobody at all",
    "%",
    "_",
    "\\",
    "zed",
    "Zed Exemplar 1",
    "Zed Exemplar 1x",
]


async def test_match_people_finds_what_users_and_contacts_do(db_engine: AsyncEngine) -> None:
    async with session_factory(db_engine)() as session:
        # more loose matches than a resolver shows, one of them also an exact match for another ref
        for n in range(MAX_CANDIDATES + 3):
            session.add(Contact(tenant_id="acme", name=f"Zed Exemplar {n}x", email=f"zed{n}@example.org"))
        session.add(Contact(tenant_id="acme", name="Zed Exemplar 1", email=None, company="Zed & Co"))
        await session.flush()
        ctx = ToolContext(
            caller=CallerContext(tenant_id="acme", user_id="alice", roles=["sales"], agent="scheduler"),
            session=session,
            workflow_id="wf",
            call_id="c1",
            now=datetime.now(UTC),
        )
        answers = await match_people(ctx, REFS)  # all at once, as create_event's attendees
        for ref, (users, contacts) in zip(REFS, answers, strict=True):
            assert [(u.id, u.display_name, u.email, u.tz) for u in users] == [
                (u.id, u.display_name, u.email, u.tz) for u in await match_users(ctx, ref)
            ], ref
            assert [(c.name, c.email, c.company) for c in contacts] == [
                (c.name, c.email, c.company) for c in await match_contacts(ctx, ref)
            ], ref
        [(_, many)] = await match_people(ctx, ["zed"])
        assert len(many) == MAX_CANDIDATES + 1  # the limit holds, and was reached above
        await session.rollback()
