"""Who may do what to a conversation (countersign.core.authority), as plain functions.

`action_refusal` is what the authority activity decides with the actor's roles from the database;
`action_state_refusal` is what the workflow decides alone, from its own state. The table of the module's
docstring is checked row by row, then as properties over any actor and any roles.
"""

from __future__ import annotations

from typing import get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st

from countersign.core.authority import (
    OWNER_ONLY,
    OWNER_OR_ADMIN,
    Action,
    action_refusal,
    action_state_refusal,
)

ACTIONS: tuple[Action, ...] = get_args(Action)
# Roles as the database holds them, and names no rule knows (which must grant nothing).
ROLES = st.lists(st.sampled_from(["sales", "reviewer", "admin", "owner", "Admin", ""]), max_size=4)
NAMES = st.sampled_from(["alice", "bob", "carol", "Alice", "alice "])


@pytest.mark.parametrize(
    ("action", "actor", "roles", "allowed"),
    [
        ("submit_message", "alice", ["sales"], True),
        ("submit_message", "carol", ["admin"], False),  # an admin may not speak for the user
        ("answer", "alice", [], True),  # the user needs no role to answer their own question
        ("answer", "carol", ["admin", "reviewer"], False),
        ("end", "alice", ["sales"], True),
        ("end", "carol", ["admin"], True),
        ("end", "bob", ["reviewer"], False),
        ("rollback", "carol", ["admin"], True),
        ("rollback", "bob", ["reviewer", "sales"], False),
    ],
)
def test_the_table_of_who_may(action: Action, actor: str, roles: list[str], allowed: bool) -> None:
    refusal = action_refusal(action, actor, "alice", roles)
    assert (refusal is None) == allowed, refusal


def test_someone_who_is_not_a_user_of_the_tenant_may_do_nothing_not_even_to_their_own() -> None:
    for action in ACTIONS:
        assert action_refusal(action, "alice", "alice", None) == "'alice' is not a user of this tenant"


def test_a_refusal_names_who_may_and_what_was_refused() -> None:
    assert action_refusal("submit_message", "bob", "alice", ["admin"]) == (
        "bob may not send messages to alice's conversation (only its user may)"
    )
    assert action_refusal("rollback", "bob", "alice", ["sales"]) == (
        "bob may not roll back alice's conversation (its user or a tenant admin may)"
    )
    assert action_refusal("end", "bob", "alice", []) == (
        "bob may not end alice's conversation (its user or a tenant admin may)"
    )


@given(action=st.sampled_from(ACTIONS), actor=NAMES, user=NAMES, roles=st.none() | ROLES)
def test_only_the_user_or_for_end_and_rollback_an_admin_is_ever_allowed(
    action: Action, actor: str, user: str, roles: list[str] | None
) -> None:
    """Fail closed: an exact name match (no case folding, no trimming) or the exact role "admin"."""
    allowed = action_refusal(action, actor, user, roles) is None
    expected = roles is not None and (actor == user or (action in OWNER_OR_ADMIN and "admin" in roles))
    assert allowed == expected


@given(action=st.sampled_from(ACTIONS), actor=NAMES, user=NAMES, roles=ROLES)
def test_what_the_workflow_refuses_alone_the_database_check_refuses_too(
    action: Action, actor: str, user: str, roles: list[str]
) -> None:
    """The workflow's own refusal is never stricter than the activity's (it would refuse the user),
    and it says the same words, so the audit reads alike wherever the refusal was decided."""
    refused = action_state_refusal(action, actor, user)
    if refused is not None:
        assert action_refusal(action, actor, user, roles) == refused


def test_the_workflow_refuses_alone_only_what_only_the_user_may_do() -> None:
    for action in ACTIONS:
        refused = action_state_refusal(action, "bob", "alice") is not None
        assert refused == (action in OWNER_ONLY)
        assert action_state_refusal(action, "alice", "alice") is None
    assert OWNER_ONLY == {"submit_message", "answer", "serve_call"} and OWNER_OR_ADMIN == {"end", "rollback"}
