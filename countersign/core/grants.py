"""Grants: a reviewer's "the same again, for a while", and the pure rules of what one covers.

A reviewer approving a call may grant later calls the same approval for `minutes` or `uses`,
whichever ends first (at most 7 days and 100 uses). The grant is minted only by the accepted,
approving decision it comes with (activities/approvals.py, `record_decision`; in signed mode that
decision's proof binds its terms, `grant_claim`, so nobody can add a grant to another's approval),
and it covers only what that decision approved: the same tenant, tool, requester and agent, and
a call whose resolved effect has the approved content (`content_digest`: the effect without the
record ids and the summary that names them, and without the arguments the tool declares free,
`@tool(free_args=…)`, a `reason` say). The arguments are not what is bound: `send_draft {"draft": 3}`
after draft 3 was rewritten to another recipient is another effect, and is asked. A revoked grant
covers nothing. A call that needs two or more approvers is never granted (`grant_allowed`).

A grant also stands on its approver: when it is spent (countersign/db/grants.py), the approver must
still be an active user whose roles let them approve the call (`approver_refusal`), and must not be
the last editor of what the call sends (the four-eyes rule decisions apply).

These rules are plain functions; `countersign/db/grants.py` finds, locks and spends grants in
PostgreSQL, and applies `covers` to the row it locked.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, StrictInt

from countersign.core.authority import ADMIN
from countersign.core.effects import Effect, canonical_json

MAX_GRANT_MINUTES = 7 * 24 * 60
MAX_GRANT_USES = 100


class GrantTerms(BaseModel, extra="forbid"):
    """How long a grant lasts: `minutes` from the decision, or `uses` calls, whichever ends first."""

    minutes: StrictInt = Field(ge=1, le=MAX_GRANT_MINUTES)
    uses: StrictInt = Field(ge=1, le=MAX_GRANT_USES)


def grant_claim(terms: GrantTerms | None) -> str:
    """What a decision's proof binds of its grant: "" for none, else both terms."""
    return "" if terms is None else f"{terms.minutes}m/{terms.uses}u"


def grant_allowed(approvals_required: int = 1) -> bool:
    """Whether a call that needs `approvals_required` approvers may be granted: one approver's
    grant must not stand in for a quorum."""
    return approvals_required == 1


def grant_refusal(decision: str, approvals_required: int = 1) -> str | None:
    """Why a decision may not carry a grant, or None."""
    if decision != "approve":
        return "a grant comes only with an approval"
    if not grant_allowed(approvals_required):
        return f"this call needs {approvals_required} approvers: it cannot be granted"
    return None


class GrantScope(BaseModel, frozen=True):
    """What a grant is for, and what a call is: equal scopes are the only match."""

    tenant_id: str
    tool: str
    requester: str
    agent: str
    content_sha256: str  # `content_digest` of the call's resolved effect


class GrantState(BaseModel):
    """What `covers` reads of a stored grant."""

    scope: GrantScope
    expires_at: datetime
    uses_left: int
    revoked: bool = False


def content_digest(effect: Effect, free_args: Collection[str] = ()) -> str:
    """SHA-256 (hex) of what a call does, as a grant binds it: the resolved effect without its
    `summary` (a rendering of the rest, which names record ids) and the `id` of each record it
    changes, and, for an effect that is its arguments (an MCP tool's), without the tool's free ones.
    Every field's old and new value, every recipient and word of a message, every creation, and a
    `problem` stay: two calls differing in any of them have different digests. The effect holds no
    clock reading (a time in it is content, a meeting's start say)."""
    content: dict[str, Any] = effect.model_dump(mode="json", exclude={"summary"})
    for change in content["changes"]:
        del change["id"]
    if content["arguments"] is not None:
        content["arguments"] = {k: v for k, v in content["arguments"].items() if k not in free_args}
    return hashlib.sha256(canonical_json(content).encode()).hexdigest()


def covers(grant: GrantState, call: GrantScope, now: datetime) -> bool:
    """Whether `grant` lets `call` run unasked at `now`: the same scope, not revoked, not expired,
    a use left."""
    return grant.scope == call and not grant.revoked and now < grant.expires_at and grant.uses_left > 0


Standing = Literal["live", "expired", "used up", "revoked"]


def standing(grant: GrantState, now: datetime) -> Standing:
    """What a grant is now, as a list shows it: revoked first, then expired, then used up."""
    if grant.revoked:
        return "revoked"
    if now >= grant.expires_at:
        return "expired"
    return "used up" if grant.uses_left <= 0 else "live"


def revoke_refusal(revoker: str, roles: list[str] | None, approver: str) -> str | None:
    """Why `revoker` (with `roles` in the grant's tenant, None: not a user of it) may not revoke a
    grant `approver` made, or None: the tenant's admins and the approver who granted it may."""
    if roles is None:
        return f"{revoker!r} is not a user of this tenant"
    if ADMIN in roles or revoker == approver:
        return None
    return f"{revoker} may not revoke a grant {approver} made (admins and its approver may)"


class Granted(BaseModel):
    """A grant spent on one call (`record_approval_request`'s answer): the call runs unasked, as
    approved by the grant's approver, and its audit row names the grant."""

    grant_id: int
    decision_id: int  # the approval that minted the grant
    approver: str
    uses_left: int
