"""Who may still act, with what grants, and how often: the pure rules of the per-call access gate.

A conversation's user is checked again at each tool call (activities/access.py), not only when the
conversation starts: a user removed or deactivated mid-conversation can no longer act through it
(`CONNECTION_INACTIVE`). A tool may need scopes the user was granted (`user_scopes`): the calendar
tools need `calendar:availability` to read people's free time, `calendar:propose` to send proposals
and `calendar:book` to book (`SCOPES_MISSING`, naming the missing ones). Every call then takes a
token from the user's bucket and from the tenant's (`RATE_LIMITED`, saying whose).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from typing import Literal

Scope = Literal["calendar:availability", "calendar:propose", "calendar:book"]
SCOPES: tuple[Scope, ...] = ("calendar:availability", "calendar:propose", "calendar:book")
SCOPE_MEANING: dict[Scope, str] = {
    "calendar:availability": "read people's free and busy times",
    "calendar:propose": "propose meeting times to a counterpart",
    "calendar:book": "book a meeting in both calendars",
}


def missing_scopes(required: Iterable[Scope], granted: Collection[str]) -> list[Scope]:
    """The scopes of `required` not in `granted`, in `required`'s order."""
    return [scope for scope in required if scope not in granted]


def scopes_refusal(tool: str, user_id: str, missing: list[Scope]) -> str:
    """What the model (and the audit) is told: which scopes, and who can grant them."""
    named = ", ".join(missing)
    return (
        f"{tool} needs the scope{'s' if len(missing) > 1 else ''} {named}, which {user_id} has not been "
        "granted; a tenant admin grants it (`users grant`). Tell the user; do not retry"
    )


def inactive_refusal(user_id: str, tenant_id: str, deactivated: bool) -> str:
    """Why a conversation may no longer act for its user."""
    state = "deactivated" if deactivated else "no longer a user"
    return (
        f"{user_id} is {state} in {tenant_id}: this conversation can no longer act for them, "
        "and no tool will run. Tell the user; do not retry"
    )


Whose = Literal["user", "tenant"]


def rate_refusal(tool: str, whose: Whose, user_id: str, per_s: float, wait_s: float) -> str:
    """RATE_LIMITED's message, saying whose budget is spent and when to try again."""
    budget = f"{user_id}'s own limit" if whose == "user" else "the workspace's limit, shared by all its users"
    return f"{tool} is called too often ({budget}: {per_s:g}/s); retry in {math.ceil(wait_s)} s"
