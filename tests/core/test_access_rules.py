"""The per-call access gate's pure rules (countersign.core.access): which scopes a user lacks, and
the refusals the model and the audit read (whose budget, which grants, what to tell the user)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from countersign.core.access import (
    SCOPES,
    Scope,
    inactive_refusal,
    missing_scopes,
    rate_refusal,
    scopes_refusal,
)


@given(
    required=st.lists(st.sampled_from(SCOPES), unique=True),
    granted=st.sets(st.sampled_from([*SCOPES, "calendar"])),
)
def test_the_missing_scopes_are_the_required_not_granted_in_order(
    required: list[Scope], granted: set[str]
) -> None:
    missing = missing_scopes(required, granted)
    assert missing == [s for s in required if s not in granted]


def test_a_scope_is_granted_by_its_exact_name_only() -> None:
    assert missing_scopes(["calendar:book"], {"calendar:*", "calendar", "Calendar:Book"}) == ["calendar:book"]
    assert missing_scopes(["calendar:book"], {"calendar:book"}) == []


def test_the_refusal_names_the_missing_scopes_and_who_grants_them() -> None:
    assert scopes_refusal("confirm_meeting", "alice", ["calendar:book"]) == (
        "confirm_meeting needs the scope calendar:book, which alice has not been granted; a tenant admin "
        "grants it (`users grant`). Tell the user; do not retry"
    )
    both = scopes_refusal("schedule_meeting", "alice", ["calendar:availability", "calendar:propose"])
    assert both.startswith("schedule_meeting needs the scopes calendar:availability, calendar:propose, which")


def test_a_conversation_whose_user_is_gone_says_which_way() -> None:
    assert inactive_refusal("alice", "acme", deactivated=True).startswith("alice is deactivated in acme:")
    assert inactive_refusal("alice", "acme", deactivated=False).startswith(
        "alice is no longer a user in acme:"
    )


def test_rate_limited_says_whose_budget_and_when_to_retry_rounded_up() -> None:
    assert rate_refusal("search_leads", "user", "alice", 0.5, 1.2) == (
        "search_leads is called too often (alice's own limit: 0.5/s); retry in 2 s"
    )
    assert rate_refusal("search_leads", "tenant", "alice", 10.0, 0.01) == (
        "search_leads is called too often (the workspace's limit, shared by all its users: 10/s); "
        "retry in 1 s"
    )
