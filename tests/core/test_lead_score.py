"""The lead score's rules, without a server: examples a person can check by hand, and properties
that hold for any facts (hypothesis)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from countersign.core.leadscore import LeadFacts, score_lead
from countersign.db.schema import LEAD_STATUSES

STATUSES = st.sampled_from(LEAD_STATUSES)
FACTS = st.builds(
    LeadFacts,
    status=STATUSES,
    source=st.one_of(st.none(), st.sampled_from(["referral", "Trade Show", "website", "cold call", "fax"])),
    company=st.one_of(st.none(), st.text(min_size=1, max_size=20)),
    emails_delivered=st.integers(0, 20),
    emails_answered=st.integers(0, 20),
    meetings_booked=st.integers(0, 20),
    status_changes=st.lists(st.tuples(STATUSES, STATUSES), max_size=6).map(tuple),
)


def test_a_referred_lead_that_answered_and_met_scores_high_and_says_why() -> None:
    scored = score_lead(
        LeadFacts(
            status="qualified",
            source="referral",
            company="Initech",
            emails_delivered=2,
            emails_answered=1,
            meetings_booked=1,
        )
    )
    parts = {part.name: part.points for part in scored.parts}
    assert parts == {
        "source": 25,
        "company": 10,
        "emails_delivered": 6,
        "emails_answered": 15,
        "meetings_booked": 20,
        "history": 0,
        "status": 15,
    }
    assert scored.score == 91
    assert "source: referral" in [part.why for part in scored.parts]


def test_a_step_back_costs_points_and_a_disqualified_lead_scores_zero() -> None:
    base = LeadFacts(status="contacted", source="website", company="Hooli")
    backed = replace(base, status_changes=(("new", "qualified"), ("qualified", "contacted")))
    assert score_lead(base).score - score_lead(backed).score == 10
    out = score_lead(replace(base, status="disqualified", emails_answered=2))
    assert out.score == 0 and out.parts[-1].why.startswith("disqualified")


@given(FACTS)
def test_the_score_is_within_0_100_and_its_parts_add_up(facts: LeadFacts) -> None:
    scored = score_lead(facts)
    assert 0 <= scored.score <= 100
    assert scored.score == min(max(sum(p.points for p in scored.parts), 0), 100)
    if facts.status == "disqualified":
        assert scored.score == 0


@given(FACTS, st.sampled_from(["emails_delivered", "emails_answered", "meetings_booked"]))
def test_more_engagement_never_lowers_the_score(facts: LeadFacts, kind: str) -> None:
    more = replace(facts, **{kind: getattr(facts, kind) + 1})
    assert score_lead(more).score >= score_lead(facts).score
