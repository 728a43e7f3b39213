"""The inbox's export of the tenant's audit (issue 38): an admin downloads the decisions as CSV or
the signed bundle of the chain, which verifies offline; anyone else is refused."""

from __future__ import annotations

import csv
import io
import tarfile
import uuid

import aiohttp
from sqlalchemy import delete
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.core.evidence import MANIFEST_FILE, RECORDS_FILE, verify_bundle
from countersign.db.chain import chain
from countersign.db.engine import session_factory
from countersign.db.schema import ApprovalDecision, AuditChainRecord
from tests.fixtures.inbox import AuthInbox

PATH = "/api/audit/export"


async def download(inbox: AuthInbox, token: str, form: str) -> tuple[int, bytes, str]:
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{inbox.url}{PATH}?format={form}", headers=headers) as r,
    ):
        return r.status, await r.read(), r.headers.get("Content-Disposition", "")


async def test_an_admin_exports_the_decisions_and_the_bundle(
    auth_inbox: AuthInbox, db_engine: AsyncEngine
) -> None:
    call = f"c-{uuid.uuid4().hex[:8]}"
    async with session_factory(db_engine).begin() as session:
        decision = ApprovalDecision(
            tenant_id="acme", workflow_id="wf-export", call_id=call, tool="create_task",
            approver="bob", decision="reject", accepted=True, reason="not this week",
        )  # fmt: skip
        session.add(decision)
        await session.flush()
        await session.refresh(decision)
        await chain(session, decision)
    try:
        status, body, _ = await auth_inbox.login("carol", "carol-dev")
        assert status == 200, body
        token = body["token"]

        status, data, disposition = await download(auth_inbox, token, "csv")
        assert status == 200 and disposition == 'attachment; filename="acme-decisions.csv"'
        rows = list(csv.DictReader(io.StringIO(data.decode())))
        mine = [r for r in rows if r["call_id"] == call]
        assert mine and mine[0]["approver"] == "bob" and mine[0]["reason"] == "not this week"

        status, data, _ = await download(auth_inbox, token, "bundle")
        assert status == 200
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            files = {n: archive.extractfile(n) for n in (MANIFEST_FILE, RECORDS_FILE)}
            manifest, records = (f.read() if f else b"" for f in files.values())
        assert verify_bundle(manifest, records)["tenant"] == "acme"
        assert f'"call_id":"{call}"'.encode() in records

        status, _, _ = await download(auth_inbox, token, "pdf")
        assert status == 400
        _, bob, _ = await auth_inbox.login("bob", "bob-dev")
        status, _, _ = await download(auth_inbox, bob["token"], "csv")
        assert status == 403  # a reviewer decides; only an admin exports
    finally:
        async with db_engine.begin() as conn:
            await conn.execute(delete(ApprovalDecision).where(ApprovalDecision.call_id == call))
            await conn.execute(
                delete(AuditChainRecord).where(
                    AuditChainRecord.tenant_id == "acme",
                    AuditChainRecord.record.contains(f'"call_id":"{call}"'),
                )
            )


async def test_the_inbox_offers_the_export_to_admins_only(auth_inbox: AuthInbox) -> None:
    """The inbox page links both exports for an admin of the tenant, and for nobody else."""
    _, carol, _ = await auth_inbox.login("carol", "carol-dev")
    _, bob, _ = await auth_inbox.login("bob", "bob-dev")
    status, page, _ = await auth_inbox.call("GET", "/", carol["token"])
    assert status == 200
    assert f'href="{PATH}?format=csv"' in page and f'href="{PATH}?format=bundle"' in page
    status, page, _ = await auth_inbox.call("GET", "/", bob["token"])
    assert status == 200 and PATH not in page
