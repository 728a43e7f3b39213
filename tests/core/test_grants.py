"""The pure rules of grants (countersign.core.grants): a grant never widens beyond its scope."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from countersign.core.evidence import attribution
from countersign.core.grants import (
    MAX_GRANT_MINUTES,
    MAX_GRANT_USES,
    GrantScope,
    GrantState,
    GrantTerms,
    covers,
    grant_allowed,
    grant_claim,
    grant_refusal,
    revoke_refusal,
    scope_digest,
    standing,
)

T0 = datetime(2026, 11, 27, 12, tzinfo=UTC)

# Few values per field, so that generated grants and calls often share some of their scope and
# differ in the rest: the cases where a wider match would show.
names = st.sampled_from(["acme", "globex"])
tools = st.sampled_from(["update_lead_status", "send_email"])
people = st.sampled_from(["alice", "bob", "dave"])
agents = st.sampled_from(["lead-qualifier", "operations"])
digests = st.sampled_from(["d1", "d2"])
scopes = st.builds(
    GrantScope, tenant_id=names, tool=tools, requester=people, agent=agents, args_sha256=digests
)
moments = st.integers(min_value=-3 * 24 * 60, max_value=10 * 24 * 60).map(lambda m: T0 + timedelta(minutes=m))
grants = st.builds(
    GrantState,
    scope=scopes,
    expires_at=moments,
    uses_left=st.integers(min_value=-1, max_value=MAX_GRANT_USES),
    revoked=st.booleans(),
)


@given(grants, scopes, moments)
def test_a_grant_covers_only_its_own_scope_while_live(
    grant: GrantState, call: GrantScope, now: datetime
) -> None:
    if covers(grant, call, now):
        for field in GrantScope.model_fields:
            assert getattr(call, field) == getattr(grant.scope, field), field
        assert not grant.revoked
        assert now < grant.expires_at
        assert grant.uses_left >= 1
        assert standing(grant, now) == "live"


@given(grants, moments)
def test_a_live_grant_covers_its_own_scope(grant: GrantState, now: datetime) -> None:
    assert covers(grant, grant.scope, now) == (standing(grant, now) == "live")


@given(grants, scopes, moments)
def test_changing_any_part_of_the_scope_loses_the_cover(
    grant: GrantState, other: GrantScope, now: datetime
) -> None:
    for field in GrantScope.model_fields:
        call = grant.scope.model_copy(update={field: getattr(other, field)})
        if getattr(other, field) != getattr(grant.scope, field):
            assert not covers(grant, call, now), field


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
arguments = st.dictionaries(st.sampled_from(["lead", "new_status", "reason", "to"]), json_values, max_size=4)


@given(arguments, json_values)
def test_free_arguments_do_not_count_and_the_others_do(args: dict[str, Any], value: Any) -> None:
    with_reason = {**args, "reason": value}
    assert scope_digest(with_reason, {"reason"}) == scope_digest(args, {"reason"})
    if "reason" not in args or args["reason"] != value:
        assert scope_digest(with_reason, ()) != scope_digest(args, ())
    for name in args.keys() - {"reason"}:
        changed = {**args, name: [args[name]]}  # any other value of a bound argument
        assert scope_digest(changed, {"reason"}) != scope_digest(args, {"reason"})


def test_key_order_does_not_matter() -> None:
    assert scope_digest({"a": 1, "b": 2}, ()) == scope_digest({"b": 2, "a": 1}, ())


@given(
    st.integers(min_value=1, max_value=MAX_GRANT_MINUTES), st.integers(min_value=1, max_value=MAX_GRANT_USES)
)
def test_terms_within_the_bounds_are_accepted(minutes: int, uses: int) -> None:
    terms = GrantTerms(minutes=minutes, uses=uses)
    assert grant_claim(terms) == f"{minutes}m/{uses}u"


@pytest.mark.parametrize(
    "body",
    [
        {"minutes": 0, "uses": 1},
        {"minutes": MAX_GRANT_MINUTES + 1, "uses": 1},
        {"minutes": 60, "uses": 0},
        {"minutes": 60, "uses": MAX_GRANT_USES + 1},
        {"minutes": "60", "uses": 1},
        {"minutes": True, "uses": 1},
        {"minutes": 60.5, "uses": 1},
        {"minutes": 60},
        {"minutes": 60, "uses": 1, "tools": "*"},
    ],
)
def test_terms_outside_the_bounds_are_refused(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        GrantTerms.model_validate(body)


def test_no_grant_binds_nothing_and_terms_bind_both() -> None:
    assert grant_claim(None) == ""
    assert grant_claim(GrantTerms(minutes=60, uses=2)) != grant_claim(GrantTerms(minutes=60, uses=3))


def test_only_a_single_approvers_approval_grants() -> None:
    assert grant_allowed() and grant_allowed(1)
    assert not grant_allowed(2) and not grant_allowed(3)
    assert grant_refusal("approve") is None
    assert grant_refusal("reject") == "a grant comes only with an approval"
    assert "2 approvers" in (grant_refusal("approve", 2) or "")


def test_standing_names_why_a_grant_covers_nothing() -> None:
    scope = GrantScope(tenant_id="acme", tool="t", requester="alice", agent="a", args_sha256="d")
    live = GrantState(scope=scope, expires_at=T0 + timedelta(minutes=1), uses_left=1)
    assert standing(live, T0) == "live"
    assert standing(live, T0 + timedelta(minutes=1)) == "expired"
    assert standing(live.model_copy(update={"uses_left": 0}), T0) == "used up"
    assert standing(live.model_copy(update={"revoked": True}), T0) == "revoked"


def test_admins_and_the_approver_may_revoke() -> None:
    assert revoke_refusal("carol", ["admin"], "bob") is None
    assert revoke_refusal("bob", ["reviewer"], "bob") is None
    assert revoke_refusal("erin", ["reviewer"], "bob") is not None
    assert revoke_refusal("mallory", None, "bob") is not None


def test_the_chain_attributes_a_grant_to_its_approver_then_its_revoker() -> None:
    fact = {"requester": "alice", "agent": "lead-qualifier", "approver": "bob", "revoked_by": None,
            "revoked_at": None, "created_at": "t0", "decision_id": 7, "uses_left": 2}  # fmt: skip
    made = attribution("grants", fact, None)
    assert made["asked_by"] == {"human": "alice", "agent": "lead-qualifier"} and made["decided_by"] == "bob"
    revoked = attribution("grants", {**fact, "revoked_by": "carol", "revoked_at": "t1"}, None)
    assert (revoked["decided_by"], revoked["at"], revoked["evidence"]["revoked"]) == ("carol", "t1", True)
    used = attribution(
        "grant_uses", {"approver": "bob", "grant_id": 3, "decision_id": 7, "call_id": "c1"}, None
    )
    assert used["decided_by"] == "bob" and used["evidence"]["grant_id"] == 3
