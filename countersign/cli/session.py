"""The CLI's session with the server (`login` keeps it) and the one way commands call the server
with it. Kept apart from the `server`/`login` commands (countersign.cli.inbox) so that every command
that only asks "signed mode?" does not import the server's and the database's dependencies."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import click
from pydantic import BaseModel, ValidationError

from countersign.cli.ux import command
from countersign.runtime.config import DATA_DIR, load_settings

REQUEST_TIMEOUT_S = 60


class InboxSession(BaseModel):
    inbox_url: str
    tenant_id: str
    user_id: str
    token: str


def session_file() -> Path:
    """COUNTERSIGN_SESSION_FILE; else `.data/inbox-session.json` where this user may write the data
    directory (a checkout, COUNTERSIGN_DATA_DIR); else `~/.countersign/inbox-session.json`. Installed
    as a package (the compose image's worker), the data directory is under site-packages, which
    belongs to root: `docker compose exec worker countersign login …` must still keep its session."""
    if os.environ.get("COUNTERSIGN_SESSION_FILE"):
        return Path(os.environ["COUNTERSIGN_SESSION_FILE"])
    if writable(DATA_DIR):
        return DATA_DIR / "inbox-session.json"
    return Path.home() / ".countersign" / "inbox-session.json"


def writable(directory: Path) -> bool:
    """Whether this user may create `directory`'s files: it, or its nearest existing parent."""
    existing = next(p for p in (directory, *directory.parents) if p.exists())
    return os.access(existing, os.W_OK)


def tenant_of(workflow_id: str | None) -> str:
    """The tenant a conversation id names (`conv-acme-…`), for the hints below; else `TENANT`."""
    found = re.fullmatch(r"conv-(.+)-[0-9a-f]{12}", workflow_id or "")
    return found.group(1) if found else "TENANT"


def login_hint(tenant: str, user: str) -> str:
    prompted = f"password prompted; a seeded user's is {user}-dev"
    return f"`{command()} login --tenant {tenant} --as {user}` ({prompted})"


def load_session(acting_as: str, workflow_id: str | None = None) -> InboxSession:
    """The CLI's inbox session, which must be `acting_as`'s (the conversation names the tenant
    the hint logs in to)."""
    path = session_file()
    tenant = tenant_of(workflow_id)
    try:
        session = InboxSession.model_validate_json(path.read_text())
    except (FileNotFoundError, ValidationError):
        raise click.ClickException(
            "this stack runs APPROVER_AUTH=signed: a decision counts only with a proof the inbox issues "
            f"to the person it authenticated; log in first: {login_hint(tenant, acting_as)}"
        ) from None
    if session.user_id != acting_as:
        raise click.ClickException(
            f"logged in as {session.user_id} ({session.tenant_id}), not {acting_as}: "
            f"{login_hint(session.tenant_id if tenant == 'TENANT' else tenant, acting_as)}"
        )
    return session


def signed_hint(refusal: str, user: str, workflow_id: str) -> str:
    """A refusal for want of a proof, with how to get one: the worker runs APPROVER_AUTH=signed
    while this shell does not (it set APPROVER_AUTH=names, or the worker is not the embedded one)."""
    if "no proof" not in refusal:
        return refusal
    return (
        f"{refusal}. The worker runs APPROVER_AUTH=signed: log in with "
        f"{login_hint(tenant_of(workflow_id), user)}, then run the command again with "
        "APPROVER_AUTH=signed (or unset, on the embedded stack)"
    )


def signed_mode() -> bool:
    return load_settings().approver_auth == "signed"


async def inbox_request(session: InboxSession, method: str, path: str, body: Any = None) -> Any:
    """One inbox API call with the session; its `{"error"}` becomes the CLI's one-line reason."""
    import aiohttp  # here: commands in names mode import this module but never call the server

    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    headers = {"Authorization": f"Bearer {session.token}"}
    async with (
        aiohttp.ClientSession(timeout=timeout) as http,
        http.request(method, session.inbox_url + path, json=body, headers=headers) as response,
    ):
        data = await response.json(content_type=None)
        if response.status == 401 and session.token:
            raise SessionEnded(
                f"inbox: the session of {session.user_id} ({session.tenant_id}) has ended (logged out, "
                f"password changed or expired): {login_hint(session.tenant_id, session.user_id)}"
            )
        if response.status >= 400:
            reason = data.get("error") if isinstance(data, dict) else None
            raise click.ClickException(f"inbox: {reason or f'HTTP {response.status}'}")
        return data


class SessionEnded(click.ClickException):
    """The inbox no longer takes the CLI's session."""
