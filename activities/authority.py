"""Authority I/O: check a client action against the database and record every check.

`authorize_action` answers "" when the actor may take the action, else why not, and records the
check once (attempt key, as activities/attempts.py explains) in `input_audit`. It is the one place
where a client action's authority is decided; proof verification (issue 13) belongs here too.

`seal_carried` / `verify_carried` MAC the state a conversation carries across continue-as-new, so
that a client cannot start a conversation with state it invented (countersign/core/seal.py).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity

from countersign.core.authority import ActionCheck, action_refusal
from countersign.core.bounds import storable
from countersign.core.seal import SealCheck, SealRequest, mac, verify
from countersign.db.attempts import attempt_key, record_once
from countersign.db.people import roles_of
from countersign.db.schema import InputAudit
from countersign.runtime.config import DATA_DIR

KEY_ENV = "CARRIED_STATE_KEY"
KEY_FILE = DATA_DIR / "carried-state.key"


def load_key(env: dict[str, str] | None = None, path: Path = KEY_FILE) -> bytes:
    """The worker's secret for carried state: `CARRIED_STATE_KEY`, else the key file the embedded
    stack keeps in `.data/` (created on first use, readable by its owner only). Every worker of a
    deployment must share it: a run may continue on another worker."""
    configured = (os.environ if env is None else env).get(KEY_ENV)
    if configured:
        return configured.encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_bytes().strip()
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(32))
    return path.read_bytes().strip()


class AuthorityActivities:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], key: bytes | None = None) -> None:
        self._sessions = sessions
        self._key = key or load_key()

    @activity.defn(name="authorize_action")
    async def authorize_action(self, check: ActionCheck) -> str:
        """ "" when `check.actor` may take the action, else why not; recorded once either way."""
        async with self._sessions() as session, session.begin():

            async def attempt() -> dict[str, Any]:
                refusal = check.refusal
                if refusal is None and check.actor is not None:
                    roles = await roles_of(session, check.tenant_id, check.actor)
                    refusal = action_refusal(check.action, check.actor, check.conversation_user, roles)
                return {
                    "tenant_id": storable(check.tenant_id),
                    "workflow_id": storable(check.workflow_id),
                    "action": check.action,
                    "actor": storable(check.actor) if check.actor is not None else None,
                    "accepted": refusal is None,
                    "reason": storable(refusal) if refusal is not None else None,
                    "excerpt": storable(check.excerpt) or None,
                }

            row = await record_once(session, InputAudit, InputAudit.attempt_key, attempt_key(), attempt)
            return "" if row.accepted else row.reason or "refused"

    @activity.defn(name="seal_carried")
    async def seal_carried(self, request: SealRequest) -> str:
        return mac(self._key, request.workflow_id, request.digest)

    @activity.defn(name="verify_carried")
    async def verify_carried(self, check: SealCheck) -> str:
        """ "" when the seal is the one this deployment made for this workflow id and state, else
        why not (recorded: a forged start is refused on the record)."""
        refusal = verify(self._key, check)
        if refusal:
            await self.authorize_action(
                ActionCheck(
                    tenant_id=check.tenant_id,
                    workflow_id=check.workflow_id,
                    action="start",
                    actor=check.user_id,
                    conversation_user=check.user_id,
                    refusal=refusal,
                )
            )
        return refusal
