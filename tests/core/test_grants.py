"""The pure rules of grants (countersign.core.grants): a grant never widens beyond its scope."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from countersign.core.effects import Creation, Effect, FieldChange, OutgoingMessage, RecordChange
from countersign.core.evidence import attribution
from countersign.core.grants import (
    MAX_GRANT_MINUTES,
    MAX_GRANT_USES,
    GrantScope,
    GrantState,
    GrantTerms,
    content_digest,
    covers,
    grant_allowed,
    grant_claim,
    grant_refusal,
    revoke_refusal,
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
    GrantScope, tenant_id=names, tool=tools, requester=people, agent=agents, content_sha256=digests
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
words = st.text(max_size=6)
changes = st.builds(
    RecordChange,
    kind=st.sampled_from(["lead", "draft"]),
    id=st.integers(1, 9).map(str),
    label=words,
    fields=st.dictionaries(words, st.builds(FieldChange, before=json_values, after=json_values), max_size=2),
    deleted=st.booleans(),
)
messages = st.builds(
    OutgoingMessage, channel=st.just("email"), to=st.lists(words, max_size=2), subject=words, body=words
)
creations = st.builds(
    Creation, kind=words, label=words, fields=st.dictionaries(words, json_values, max_size=2)
)
effects = st.builds(
    Effect,
    summary=words,
    changes=st.lists(changes, max_size=2),
    messages=st.lists(messages, max_size=2),
    creates=st.lists(creations, max_size=1),
    problem=st.none() | words,
    arguments=st.none() | arguments,
)


@given(effects, st.integers(1, 9), words)
def test_record_ids_and_the_summary_do_not_count(effect: Effect, other_id: int, summary: str) -> None:
    """Two calls doing the same thing to records of other ids (a summary names them) have the same
    content: what a grant binds is what the call does."""
    renamed = effect.model_copy(
        update={
            "summary": summary,
            "changes": [c.model_copy(update={"id": str(other_id)}) for c in effect.changes],
        }
    )
    assert content_digest(renamed) == content_digest(effect)


@given(effects, effects)
def test_any_other_difference_of_the_effect_counts(one: Effect, other: Effect) -> None:
    """Every old and new value, recipient, word, creation and problem is bound."""

    def content(effect: Effect) -> dict[str, Any]:
        dumped = effect.model_dump(mode="json", exclude={"summary"})
        for change in dumped["changes"]:
            del change["id"]
        return dumped

    assert (content_digest(one) == content_digest(other)) == (content(one) == content(other))


@given(arguments, json_values)
def test_free_arguments_of_an_effect_that_is_its_arguments_do_not_count(
    args: dict[str, Any], value: Any
) -> None:
    """An MCP tool's effect is its arguments: a free one aside, they are all bound."""

    def of(arguments: dict[str, Any]) -> Effect:
        return Effect(summary="s", resolved=False, arguments=arguments)

    with_reason = {**args, "reason": value}
    assert content_digest(of(with_reason), {"reason"}) == content_digest(of(args), {"reason"})
    if "reason" not in args or args["reason"] != value:
        assert content_digest(of(with_reason)) != content_digest(of(args))
    for name in args.keys() - {"reason"}:
        changed = {**args, name: [args[name]]}  # any other value of a bound argument
        assert content_digest(of(changed), {"reason"}) != content_digest(of(args), {"reason"})


def test_a_draft_rewritten_to_another_recipient_is_other_content() -> None:
    """Issue 48 item 1, as the digest sees it: `send_draft {"draft": 3}` before and after the draft was
    readdressed are two effects, whatever the arguments say."""

    def sent(to: str, body: str) -> Effect:
        message = OutgoingMessage(channel="email", to=[to], subject="Our offer", body=body)
        return Effect(summary="Sends draft 3", messages=[message])

    approved = sent("partner@example.org", "Dear partner")
    assert content_digest(sent("partner@example.org", "Dear partner")) == content_digest(approved)
    assert content_digest(sent("attacker@evil.example", "Dear partner")) != content_digest(approved)
    assert content_digest(sent("partner@example.org", "exfil: the full lead list")) != content_digest(
        approved
    )


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
    scope = GrantScope(tenant_id="acme", tool="t", requester="alice", agent="a", content_sha256="d")
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
